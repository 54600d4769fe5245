//! The eviction outbox: an operator's evictions, kept durably until JetStream has
//! acknowledged them. Appends need no such file, since the store holds them; an evicted
//! sequence is gone from the store, so the eviction itself must be written down.
//!
//! One JSON object per line, `{"n": N, ...WireOp}` (a record's eviction), numbered
//! from 1. A torn last line (a crash mid-write) is ignored: its eviction was never
//! acknowledged to the operator.

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::{ReplicateError, WireOp};
use crate::store::faults::{self, FaultPoint};
use crate::store::fs::{Directory, LogFile};
use crate::store::{Change, EvictScope};

/// Once everything is sent, durably recorded as sent, and the file is this large, it
/// is emptied.
const COMPACT_FROM_BYTES: u64 = 1 << 20;

#[derive(serde::Serialize, serde::Deserialize)]
struct Entry {
    n: u64,
    #[serde(flatten)]
    op: WireOp,
}

/// Evictions not yet acknowledged, in order.
pub(super) struct EvictionOutbox {
    path: PathBuf,
    file: Box<dyn LogFile>,
    pending: VecDeque<(u64, EvictScope)>,
    last: u64,
    /// Bytes of whole, written entries: where the next entry starts. A failed write is
    /// cut back to here, never further.
    intact: u64,
    /// A failed write may have left bytes after `intact` that are not cut out yet.
    dirty: bool,
    /// [`EvictionOutbox::compact`] empties a file of at least this many bytes.
    pub(super) compact_from: u64,
}

impl EvictionOutbox {
    /// The outbox at `path` on `fs`, holding the entries after `published`.
    pub(super) fn open(
        fs: &Arc<dyn Directory>,
        path: &Path,
        published: u64,
    ) -> Result<Self, ReplicateError> {
        let error = |source| ReplicateError::State {
            path: path.into(),
            source,
        };
        fs.refuse_non_regular(path, "replication outbox")
            .map_err(error)?;
        let bytes = match fs.read(path) {
            Ok(bytes) => bytes,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
            Err(e) => return Err(error(e)),
        };
        let mut last = published;
        let mut pending = VecDeque::new();
        let mut intact = 0;
        // A line that does not read as an eviction ends what is kept, as a torn one does.
        // Read as bytes: `intact` counts the file's own bytes, whatever a damaged line
        // holds.
        for line in bytes.split_inclusive(|&b| b == b'\n') {
            let Some((n, Change::Evict(scope))) = line
                .strip_suffix(b"\n")
                .and_then(|l| serde_json::from_slice::<Entry>(l).ok())
                .map(|entry| (entry.n, Change::from(entry.op)))
            else {
                break;
            };
            intact += line.len() as u64;
            last = last.max(n);
            if n > published {
                pending.push_back((n, scope));
            }
        }
        let mut file = if fs.kind(path).map_err(error)?.is_some() {
            fs.open_write(path).map_err(error)?
        } else {
            // The new name is made durable before any entry is acknowledged in it.
            let file = fs.create(path).map_err(error)?;
            fs.sync_dir(path.parent().unwrap_or(Path::new(".")))
                .map_err(error)?;
            file
        };
        // Drop a torn last line, so the next entry starts on a line of its own.
        file.set_len(intact).map_err(error)?;
        file.seek_to(intact).map_err(error)?;
        Ok(EvictionOutbox {
            path: path.into(),
            file,
            pending,
            last,
            intact,
            dirty: false,
            compact_from: COMPACT_FROM_BYTES,
        })
    }

    /// Cut the file back to its whole entries and write there next.
    fn cut_to_intact(&mut self) -> std::io::Result<()> {
        self.file.set_len(self.intact)?;
        self.file.seek_to(self.intact)
    }

    /// Write `scope` down (fsynced) to be sent. On an error nothing written before is
    /// touched: what this write left is cut back out (now, or before the next write if
    /// the cut fails too), and the entry is not numbered.
    pub(super) fn push(&mut self, scope: EvictScope) -> Result<(), ReplicateError> {
        let error = |path: &Path, source| ReplicateError::State {
            path: path.into(),
            source,
        };
        if self.dirty {
            self.cut_to_intact().map_err(|e| error(&self.path, e))?;
            self.dirty = false;
        }
        let n = self.last + 1;
        let op = Change::Evict(scope.clone()).into();
        let mut line = serde_json::to_vec(&Entry { n, op }).expect("an eviction serializes");
        line.push(b'\n');
        let written = faults::write_all(FaultPoint::OutboxWrite, &mut self.file, &line)
            .and_then(|()| faults::check(FaultPoint::OutboxFsync))
            .and_then(|()| self.file.sync_data());
        if let Err(source) = written {
            // Back to the last whole entry: a partial line must not glue the next entry
            // to it, and a cut by this line's length would eat into acknowledged ones
            // when the write stopped short.
            self.dirty = self.cut_to_intact().is_err();
            return Err(error(&self.path, source));
        }
        self.intact += line.len() as u64;
        self.last = n;
        self.pending.push_back((n, scope));
        Ok(())
    }

    /// The oldest entry not yet acknowledged.
    pub(super) fn front(&self) -> Option<(u64, EvictScope)> {
        self.pending.front().cloned()
    }

    /// Entry `n` was acknowledged.
    pub(super) fn sent(&mut self, n: u64) {
        while self.pending.front().is_some_and(|(m, _)| *m <= n) {
            self.pending.pop_front();
        }
    }

    /// Empty a large file once every entry in it was sent and the positions file says
    /// so durably (`published_durably`, as last written). Not sooner: the numbering
    /// goes on from the larger of the file's last entry and the positions file's, and
    /// a number used twice would be dropped by JetStream as a duplicate.
    pub(super) fn compact(&mut self, published_durably: u64) {
        let all_sent_durably = self.pending.is_empty() && self.last <= published_durably;
        if all_sent_durably && self.intact >= self.compact_from && self.intact > 0 {
            self.intact = 0;
            // A failed cut leaves entries already sent, which a reopen skips.
            self.dirty = self.cut_to_intact().is_err();
        }
    }

    /// Entries not yet acknowledged.
    pub(super) fn len(&self) -> usize {
        self.pending.len()
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use super::*;
    use crate::store::DiskDirectory;

    fn disk() -> Arc<dyn Directory> {
        Arc::new(DiskDirectory)
    }

    fn evict(id: u64) -> EvictScope {
        EvictScope::Id {
            namespace: "n".into(),
            id,
        }
    }

    #[test]
    fn unsent_entries_survive_a_reopen_and_a_torn_line_is_dropped() {
        let _faults = crate::store::faults::one_test_at_a_time();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("evictions.jsonl");
        {
            let mut o = EvictionOutbox::open(&disk(), &path, 0).unwrap();
            for id in 1..=3 {
                o.push(evict(id)).unwrap();
            }
            o.sent(1);
            assert_eq!(o.front(), Some((2, evict(2))));
        }
        // A crash mid-write leaves half a line.
        std::fs::OpenOptions::new()
            .append(true)
            .open(&path)
            .unwrap()
            .write_all(b"{\"n\":4,\"op\":\"ev")
            .unwrap();
        let mut o = EvictionOutbox::open(&disk(), &path, 1).unwrap();
        assert_eq!(o.len(), 2);
        assert_eq!(o.front(), Some((2, evict(2))));
        o.push(evict(9)).unwrap();
        let o = EvictionOutbox::open(&disk(), &path, 3).unwrap();
        assert_eq!(
            o.front(),
            Some((4, evict(9))),
            "numbering goes on after the torn line"
        );
        assert_eq!(o.len(), 1);
    }

    #[test]
    fn a_failed_write_loses_no_entry_written_before_it() {
        let _faults = crate::store::faults::one_test_at_a_time();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("evictions.jsonl");
        let mut o = EvictionOutbox::open(&disk(), &path, 0).unwrap();
        for id in 1..=3 {
            o.push(evict(id)).unwrap();
        }
        // A full disk: the write stops after 10 bytes; then an fsync fails.
        fail::cfg(FaultPoint::OutboxWrite.name(), "1*return(10)").unwrap();
        assert!(o.push(evict(4)).is_err());
        fail::remove(FaultPoint::OutboxWrite.name());
        fail::cfg(FaultPoint::OutboxFsync.name(), "1*return").unwrap();
        assert!(o.push(evict(5)).is_err());
        fail::remove(FaultPoint::OutboxFsync.name());
        assert_eq!(o.len(), 3, "the failed entries were not taken");
        o.push(evict(6)).unwrap();
        drop(o);
        let o = EvictionOutbox::open(&disk(), &path, 0).unwrap();
        let kept: Vec<(u64, EvictScope)> = o.pending.iter().cloned().collect();
        assert_eq!(
            kept,
            [(1, evict(1)), (2, evict(2)), (3, evict(3)), (4, evict(6))],
            "every acknowledged entry, whole, and the next one numbered after them"
        );
    }

    /// The file is emptied only once the positions file durably says every entry went
    /// out: a disk may keep an unsynced truncation through a power cut, and an empty
    /// file beside stale positions would number the next eviction as one JetStream has
    /// seen (and drops as a duplicate).
    #[test]
    fn the_file_empties_only_after_the_positions_say_all_went_out() {
        let _faults = crate::store::faults::one_test_at_a_time();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("evictions.jsonl");
        let mut o = EvictionOutbox::open(&disk(), &path, 0).unwrap();
        o.compact_from = 0;
        for id in 1..=2 {
            o.push(evict(id)).unwrap();
        }
        let full = std::fs::metadata(&path).unwrap().len();
        o.sent(2);
        o.compact(1);
        assert_eq!(
            std::fs::metadata(&path).unwrap().len(),
            full,
            "positions say 1"
        );
        o.compact(2);
        assert_eq!(
            std::fs::metadata(&path).unwrap().len(),
            0,
            "positions say 2"
        );
        o.push(evict(3)).unwrap();
        drop(o);
        let o = EvictionOutbox::open(&disk(), &path, 2).unwrap();
        assert_eq!(o.front(), Some((3, evict(3))), "numbering goes on");
    }

    /// A damaged line (here a byte that is not UTF-8 inside a string) ends what is kept,
    /// and the next entry is written right after the whole ones: the file's bytes are
    /// counted as they are, not as text that replaced the bad byte.
    #[test]
    fn a_line_with_bytes_that_are_not_text_ends_what_is_kept() {
        let _faults = crate::store::faults::one_test_at_a_time();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("evictions.jsonl");
        {
            let mut o = EvictionOutbox::open(&disk(), &path, 0).unwrap();
            o.push(evict(1)).unwrap();
        }
        let whole = std::fs::read(&path).unwrap();
        let mut damaged = whole.clone();
        damaged.extend_from_slice(b"{\"n\":2,\"op\":\"evict\",\"namespace\":\"\xff\",\"id\":2}\n");
        std::fs::write(&path, &damaged).unwrap();
        let mut o = EvictionOutbox::open(&disk(), &path, 0).unwrap();
        assert_eq!(o.len(), 1);
        assert_eq!(
            std::fs::read(&path).unwrap(),
            whole,
            "the damaged line is cut off"
        );
        o.push(evict(3)).unwrap();
        drop(o);
        let o = EvictionOutbox::open(&disk(), &path, 0).unwrap();
        let kept: Vec<(u64, EvictScope)> = o.pending.iter().cloned().collect();
        assert_eq!(kept, [(1, evict(1)), (2, evict(3))]);
    }
}
