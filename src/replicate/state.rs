//! Replication's durable files, in `<store>/replication/`: the replica's identity
//! (`replica.json`), its stream positions (`positions.json`) and the eviction outbox
//! (`evictions.jsonl`). They live on the store's own [`Directory`], so the power-cut
//! tests that cover the store's log and snapshots cover them too.
//!
//! Identity and positions are replaced whole ([`Directory::replace`](crate::store::fs::Directory::replace)); the outbox is
//! appended to and fsynced per entry.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::store::faults::DurableFile;
use crate::store::fs::{Directory, DiskDirectory};
use crate::store::live::MAX_ID_ORIGIN;

use super::outbox::EvictionOutbox;
use super::{ReplicaIdentity, ReplicateError};

/// Where a replica keeps its files, inside the store directory.
pub(super) const STATE_DIR: &str = "replication";

/// How far this replica has got, kept durably in the store directory.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub(super) struct Positions {
    /// The last own id JetStream acknowledged.
    pub(super) published_id: u64,
    /// The last stream sequence applied (or skipped as this replica's own).
    pub(super) applied_seq: u64,
    /// The last entry of the eviction outbox JetStream acknowledged.
    #[serde(default)]
    pub(super) evictions_published: u64,
    /// When the stream these positions count in was created (µs since the epoch; None
    /// before this replica first saw it). A stream created at another time is a new
    /// stream: NATS lost its storage, or the stream was deleted, and the positions
    /// count in one that is gone.
    #[serde(default)]
    pub(super) stream_created_us: Option<i64>,
}

/// A replica's files: a directory (the store's) and the folder in it they live in.
/// Names are relative to that folder.
#[derive(Clone, Debug)]
pub(super) struct ReplicaFiles {
    fs: Arc<dyn Directory>,
    store_dir: PathBuf,
    dir: PathBuf,
}

impl ReplicaFiles {
    /// The files of the store at `store_dir` on `fs`.
    pub(super) fn new(fs: Arc<dyn Directory>, store_dir: &Path) -> Self {
        ReplicaFiles {
            fs,
            store_dir: store_dir.into(),
            dir: store_dir.join(STATE_DIR),
        }
    }

    /// The files of the store at `store_dir` on disk (before the store is opened).
    pub(super) fn on_disk(store_dir: &Path) -> Self {
        Self::new(Arc::new(DiskDirectory), store_dir)
    }

    /// The whole path of file `name`, as errors name it.
    pub(super) fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    /// The bytes of file `name`; `None` when there is none.
    fn read(&self, name: &str) -> Result<Option<Vec<u8>>, ReplicateError> {
        let path = self.path(name);
        let error = |source| ReplicateError::State {
            path: path.clone(),
            source,
        };
        self.fs
            .refuse_non_regular(&path, "replication state file")
            .map_err(error)?;
        match self.fs.read(&path) {
            Ok(bytes) => Ok(Some(bytes)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(error(e)),
        }
    }

    /// Make the folder, durably, if it is missing.
    fn make_dir(&self) -> Result<(), ReplicateError> {
        let error = |source| ReplicateError::State {
            path: self.dir.clone(),
            source,
        };
        if self.fs.kind(&self.dir).map_err(error)?.is_none() {
            self.fs.create_dir_all(&self.dir).map_err(error)?;
            self.fs.sync_dir(&self.store_dir).map_err(error)?;
        }
        Ok(())
    }

    /// Replace file `name` whole with `value` as JSON (temporary file, fsync, rename,
    /// directory fsync): a power cut leaves the old file or the new one.
    fn replace(&self, name: &str, value: &impl serde::Serialize) -> Result<(), ReplicateError> {
        let path = self.path(name);
        let error = |source| ReplicateError::State {
            path: path.clone(),
            source,
        };
        self.make_dir()?;
        let bytes = serde_json::to_vec(value).map_err(|e| error(e.into()))?;
        self.fs
            .replace(&path, DurableFile::ReplicationState, |f| {
                f.write_all(&bytes)
            })
            .map_err(error)
    }

    /// The identity kept here, if the store has served as a replica.
    pub(super) fn identity(&self) -> Result<Option<ReplicaIdentity>, ReplicateError> {
        let Some(bytes) = self.read("replica.json")? else {
            return Ok(None);
        };
        let bad = |reason: String| ReplicateError::BadState {
            path: self.path("replica.json"),
            reason,
        };
        let id: ReplicaIdentity = serde_json::from_slice(&bytes).map_err(|e| bad(e.to_string()))?;
        if id.tag == 0 || id.tag > MAX_ID_ORIGIN {
            return Err(bad(format!(
                "tag {} is outside 1..={MAX_ID_ORIGIN}",
                id.tag
            )));
        }
        Ok(Some(id))
    }

    /// The identity kept here, or a new one drawn at random and written down first.
    pub(super) fn identity_or_new(&self) -> Result<ReplicaIdentity, ReplicateError> {
        if let Some(id) = self.identity()? {
            return Ok(id);
        }
        let id = ReplicaIdentity {
            name: format!("{:016x}", rand::random::<u64>()),
            tag: rand::random_range(1..=MAX_ID_ORIGIN),
        };
        self.replace("replica.json", &id)?;
        Ok(id)
    }

    /// The positions kept here; all zero before the first are written.
    pub(super) fn positions(&self) -> Result<Positions, ReplicateError> {
        let Some(bytes) = self.read("positions.json")? else {
            return Ok(Positions::default());
        };
        serde_json::from_slice(&bytes).map_err(|e| ReplicateError::BadState {
            path: self.path("positions.json"),
            reason: e.to_string(),
        })
    }

    /// Write `positions` down.
    pub(super) fn save_positions(&self, positions: &Positions) -> Result<(), ReplicateError> {
        self.replace("positions.json", positions)
    }

    /// The eviction outbox, holding the entries after `published`.
    pub(super) fn outbox(&self, published: u64) -> Result<EvictionOutbox, ReplicateError> {
        self.make_dir()?;
        EvictionOutbox::open(&self.fs, &self.path("evictions.jsonl"), published)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{EvictScope, RamDirectory};

    fn evict(id: u64) -> EvictScope {
        EvictScope::Id {
            namespace: "n".into(),
            id,
        }
    }

    /// What the workload was told had happened, and after how many of the directory's
    /// changing operations.
    #[derive(Clone, Debug)]
    enum Acked {
        Identity(ReplicaIdentity),
        Positions(Positions),
        Pushed(u64),
        Sent(u64),
    }

    /// A replica's life in files: it draws its identity, records positions, pushes
    /// evictions, sends them, and empties the outbox once the positions say they went.
    fn workload(ram: &RamDirectory) -> Vec<(u64, Acked)> {
        let files = ReplicaFiles::new(Arc::new(ram.clone()), Path::new("/store"));
        ram.create_dir_all(Path::new("/store")).unwrap();
        let mut acked = Vec::new();
        let at = |ram: &RamDirectory| ram.operations();
        let id = files.identity_or_new().unwrap();
        acked.push((at(ram), Acked::Identity(id)));
        let mut positions = Positions {
            published_id: 10,
            applied_seq: 5,
            ..Positions::default()
        };
        files.save_positions(&positions).unwrap();
        acked.push((at(ram), Acked::Positions(positions)));
        let mut outbox = files.outbox(positions.evictions_published).unwrap();
        outbox.compact_from = 0;
        for id in 1..=3 {
            outbox.push(evict(id)).unwrap();
            acked.push((at(ram), Acked::Pushed(id)));
        }
        for n in [2, 3] {
            // JetStream acknowledged entry n; the positions say so; the outbox empties
            // once all are sent.
            outbox.sent(n);
            acked.push((at(ram), Acked::Sent(n)));
            positions.evictions_published = n;
            files.save_positions(&positions).unwrap();
            acked.push((at(ram), Acked::Positions(positions)));
            outbox.compact(n);
        }
        outbox.push(evict(4)).unwrap();
        acked.push((at(ram), Acked::Pushed(4)));
        positions.applied_seq = 9;
        files.save_positions(&positions).unwrap();
        acked.push((at(ram), Acked::Positions(positions)));
        acked
    }

    /// Cut the power before each changing operation of a replica's file work in turn
    /// and reopen what the disk would hold: the identity once drawn stays, positions
    /// never go back or come back damaged, every eviction pushed and not sent is in the
    /// outbox, and the next eviction gets a number no sent one had (JetStream drops a
    /// number seen twice as a duplicate).
    #[test]
    fn replication_files_lose_nothing_acknowledged_at_any_power_cut() {
        let _faults = crate::store::faults::one_test_at_a_time();
        let operations = {
            let ram = RamDirectory::new();
            workload(&ram);
            ram.operations()
        };
        assert!(operations > 20, "{operations} operations");
        for cut in 1..=operations + 1 {
            let ram = RamDirectory::new();
            ram.cut_power_before(cut);
            let acked = workload(&ram);
            let image = ram
                .power_cut_image()
                .unwrap_or_else(|| ram.after_power_cut());
            let files = ReplicaFiles::new(Arc::new(image), Path::new("/store"));
            let context = format!("power cut before operation {cut}");
            let done = acked.iter().filter(|(at, _)| *at < cut).map(|(_, a)| a);
            let identity = files.identity().expect(&context);
            let positions = files.positions().expect(&context);
            let mut outbox = files.outbox(positions.evictions_published).expect(&context);
            let pending: Vec<u64> = std::iter::from_fn(|| {
                let (n, _) = outbox.front()?;
                outbox.sent(n);
                Some(n)
            })
            .collect();
            let mut sent = 0;
            let mut pushed = 0;
            for event in done {
                match event {
                    Acked::Identity(id) => assert_eq!(identity.as_ref(), Some(id), "{context}"),
                    Acked::Positions(p) => assert!(
                        positions.published_id >= p.published_id
                            && positions.applied_seq >= p.applied_seq
                            && positions.evictions_published >= p.evictions_published,
                        "{context}: positions went back from {p:?} to {positions:?}"
                    ),
                    Acked::Pushed(n) => pushed = pushed.max(*n),
                    Acked::Sent(n) => sent = sent.max(*n),
                }
            }
            let unsent_durably = positions.evictions_published + 1..=pushed;
            assert!(
                unsent_durably.clone().all(|n| pending.contains(&n)),
                "{context}: pushed up to {pushed}, published {}, the outbox holds {pending:?}",
                positions.evictions_published
            );
            outbox.push(evict(99)).expect(&context);
            let (next, _) = outbox.front().expect("just pushed");
            assert!(
                next > sent.max(pushed),
                "{context}: the next eviction is numbered {next}, after {sent} went out"
            );
        }
    }
}
