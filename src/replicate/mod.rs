//! Replication through NATS JetStream: replicas behind one load balancer share what they
//! learn. The stage after the store: it reads a store's own appends and writes other
//! replicas' into it.
//!
//! - Every sequence is known by the same id on every replica: a replica's own appends
//!   carry its tag in their ids ([`crate::store::live::own_ids`]), drawn once and kept
//!   in the store directory ([`ReplicaIdentity`]).
//! - The publisher sends the store's own cached sequences, in id order, to the stream
//!   `<cluster>` (subject `<cluster>.records`), and records the last id JetStream
//!   acknowledged. The store itself (log and snapshot) is the outbox: while NATS is down
//!   nothing is sent and nothing waits; afterwards, or after a restart, publishing
//!   resumes after the last acknowledged id.
//! - The consumer reads the stream in order from the position after the last one applied,
//!   which it keeps durably, and applies other replicas' records to the store under
//!   their ids: a record delivered twice is cached once.
//! - An operator's evictions (`POST /admin/evict`) go out as records too, from an
//!   outbox file of their own (`outbox`), since the store no longer holds what they
//!   removed.
//! - Snapshots are uploaded to the Object Store, tagged with the stream position they
//!   cover, and an empty replica starts from the newest one ([`bootstrap`],
//!   `snapshots`).
//! - Both run on one thread of their own, so neither the model thread nor HTTP handlers
//!   ever wait on NATS.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

mod outbox;
pub mod responses;
mod snapshots;
mod state;
mod stats;
mod worker;

pub use snapshots::Bootstrap;
pub use stats::ReplicationStats;

use async_nats::jetstream;

use crate::store::live::{Store, own_ids};
use crate::store::{Change, EvictScope, TokenizerId};

use outbox::EvictionOutbox;
use state::{Positions, ReplicaFiles};
use worker::Worker;

/// Most sequences published in one batch, between two position writes.
const PUBLISH_BATCH: usize = 256;

/// How often the publisher looks for new appends when idle.
const PUBLISH_POLL: Duration = Duration::from_millis(50);

/// How often the applied position is written while records arrive.
const POSITION_EVERY: Duration = Duration::from_millis(200);

/// How long the consumer may deliver nothing while the stream holds records this replica
/// has not applied, before it is recreated from the applied position. A JetStream
/// consumer can stall without an error (a lost pull request, a server restart between
/// heartbeats); replication must not wait on it forever.
const CONSUMER_STALL: Duration = Duration::from_secs(3);

/// How many recent applied appends the lag percentiles cover.
pub const LAG_WINDOW: usize = 1024;

/// JetStream's window for dropping a record published twice (`Nats-Msg-Id`); the
/// stream's retention must be longer.
pub const DUPLICATE_WINDOW: Duration = Duration::from_secs(120);

/// Waits between attempts while NATS is unreachable.
const RETRY: Duration = Duration::from_millis(500);

/// Errors from starting replication.
#[derive(Debug, thiserror::Error)]
pub enum ReplicateError {
    /// The replica's state files could not be read or written.
    #[error(
        "replication state in {path}: {source}. Check the store directory's permissions and free space"
    )]
    State {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// A state file does not parse.
    #[error(
        "replication state {path} is damaged ({reason}). Move it aside to draw a new replica identity (this replica's earlier appends keep their ids)"
    )]
    BadState {
        /// The file.
        path: PathBuf,
        /// Why.
        reason: String,
    },
    /// A snapshot could not be published.
    #[error("snapshot {path} not published: {source}")]
    Publish {
        /// The local snapshot.
        path: PathBuf,
        /// Why.
        source: SyncError,
    },

    /// The replication thread could not start.
    #[error("cannot start the replication thread: {0}")]
    Thread(#[from] std::io::Error),
}

/// Why one step of replication failed: a step is retried after [`RETRY`], and its
/// error is the stats' `last_error` until one succeeds.
#[derive(Debug, thiserror::Error)]
pub enum SyncError {
    /// A call to NATS, JetStream or its Object Store failed.
    #[error("NATS, {during}: {source}")]
    Nats {
        /// What was being done.
        during: &'static str,
        /// NATS's error.
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// NATS did not answer in time.
    #[error("NATS, {during}: no answer within {} s", .after.as_secs())]
    TimedOut {
        /// What was being done.
        during: &'static str,
        /// How long it waited.
        after: Duration,
    },
    /// The stream's state could not be read.
    #[error("cannot read stream {0}")]
    StreamUnreadable(String),
    /// The consumer delivered nothing while records waited: it is recreated.
    #[error(
        "the consumer delivered nothing for {} s while {unread} records wait: recreating it",
        .quiet.as_secs()
    )]
    ConsumerStalled {
        /// How long it was quiet.
        quiet: Duration,
        /// Records waiting.
        unread: u64,
    },
    /// The stream was made anew (NATS lost its storage, or it was deleted): the replica
    /// starts over on it.
    #[error("the stream was made anew: starting over on it")]
    StreamReset,
    /// The consumer's message stream ended.
    #[error("the consumer ended")]
    ConsumerEnded,
    /// A local file could not be read or written.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// A fetched snapshot does not open or verify.
    #[error(transparent)]
    Snapshot(#[from] crate::store::OpenError),
    /// The store directory's manifest could not be read or written.
    #[error(transparent)]
    Dir(#[from] crate::store::manifest::DirError),
    /// The store refused a change.
    #[error(transparent)]
    Change(#[from] crate::store::live::ChangeError),
    /// The replication thread has stopped.
    #[error("replication has stopped")]
    Stopped,
}

impl SyncError {
    /// `map_err` for a NATS call made `during` something.
    fn nats<E: Into<Box<dyn std::error::Error + Send + Sync>>>(
        during: &'static str,
    ) -> impl FnOnce(E) -> SyncError {
        move |e| SyncError::Nats {
            during,
            source: e.into(),
        }
    }

    /// `map_err` for a local file's I/O.
    fn io(path: &Path) -> impl FnOnce(std::io::Error) -> SyncError + '_ {
        move |source| SyncError::Io {
            path: path.into(),
            source,
        }
    }
}

/// How to replicate.
#[derive(Clone, Debug, serde::Serialize)]
pub struct ReplicationConfig {
    /// The NATS server, `nats://HOST:PORT`.
    pub url: String,
    /// Names the JetStream stream and its subject: replicas with the same cluster share.
    pub cluster: String,
    /// How many published snapshots the bucket keeps (the newest).
    pub keep_snapshots: usize,
    /// How long the stream keeps records, set on the stream at start (None: as it is;
    /// a new stream keeps them forever). At least [`DUPLICATE_WINDOW`]. A replica away
    /// longer catches up from a published snapshot.
    pub stream_max_age: Option<Duration>,
}

/// Who this replica is: a name for logs and stats, and the tag its ids carry. Drawn at
/// random on first start and kept in the store directory, so a restart is the same
/// replica.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ReplicaIdentity {
    /// Unique name (random hex).
    pub name: String,
    /// The tag in this replica's ids, 1..=4095.
    pub tag: u16,
}

impl ReplicaIdentity {
    /// The identity kept in `store_dir`, or a new one written there.
    pub fn load_or_create(store_dir: &Path) -> Result<Self, ReplicateError> {
        ReplicaFiles::on_disk(store_dir).identity_or_new()
    }

    /// The identity kept in `store_dir`, if it has served as a replica. `suffixd ingest`
    /// appends under it, so what it adds is published when the replica next serves.
    pub fn load(store_dir: &Path) -> Result<Option<Self>, ReplicateError> {
        ReplicaFiles::on_disk(store_dir).identity()
    }
}

/// One record on the stream: what a replica did, and who it is. Budget and age
/// evictions a store makes on its own are not records: each replica has its own budget
/// and its own last-use times. On the stream it is [`WireRecord`]'s JSON.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(into = "WireRecord", from = "WireRecord")]
pub struct Record {
    /// The replica that did it ([`ReplicaIdentity::name`]).
    pub origin: String,
    /// The tokenizer of its token ids: other tokenizers' records are refused.
    pub vocab_size: u32,
    /// See [`TokenizerId::vocab_hash`].
    pub vocab_hash: u64,
    /// What it did: an append of its own, or an operator's eviction.
    pub change: Change,
}

/// A record's JSON on the stream, fixed so that replicas of other versions read it:
/// the [`Record`]'s fields and the change's, tagged by `"op"`.
#[derive(serde::Serialize, serde::Deserialize)]
struct WireRecord {
    origin: String,
    vocab_size: u32,
    vocab_hash: u64,
    #[serde(flatten)]
    op: WireOp,
}

/// A [`Change`] as JSON, tagged by `"op"`: also the eviction outbox's lines.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
enum WireOp {
    Append {
        namespace: String,
        id: u64,
        time_ms: u64,
        tokens: Vec<u32>,
    },
    Evict {
        namespace: String,
        id: u64,
    },
    EvictNamespace {
        namespace: String,
    },
    EvictUnusedSince {
        cutoff_ms: u64,
    },
}

impl From<Change> for WireOp {
    fn from(change: Change) -> Self {
        match change {
            Change::Append {
                namespace,
                id,
                time_ms,
                tokens,
            } => WireOp::Append {
                namespace,
                id,
                time_ms,
                tokens,
            },
            Change::Evict(EvictScope::Id { namespace, id }) => WireOp::Evict { namespace, id },
            Change::Evict(EvictScope::Namespace { namespace }) => {
                WireOp::EvictNamespace { namespace }
            }
            Change::Evict(EvictScope::UnusedSince { cutoff_ms }) => {
                WireOp::EvictUnusedSince { cutoff_ms }
            }
        }
    }
}

impl From<WireOp> for Change {
    fn from(op: WireOp) -> Self {
        match op {
            WireOp::Append {
                namespace,
                id,
                time_ms,
                tokens,
            } => Change::Append {
                namespace,
                id,
                time_ms,
                tokens,
            },
            WireOp::Evict { namespace, id } => Change::evict(namespace, id),
            WireOp::EvictNamespace { namespace } => {
                Change::Evict(EvictScope::Namespace { namespace })
            }
            WireOp::EvictUnusedSince { cutoff_ms } => {
                Change::Evict(EvictScope::UnusedSince { cutoff_ms })
            }
        }
    }
}

impl From<Record> for WireRecord {
    fn from(r: Record) -> Self {
        WireRecord {
            origin: r.origin,
            vocab_size: r.vocab_size,
            vocab_hash: r.vocab_hash,
            op: r.change.into(),
        }
    }
}

impl From<WireRecord> for Record {
    fn from(r: WireRecord) -> Self {
        Record {
            origin: r.origin,
            vocab_size: r.vocab_size,
            vocab_hash: r.vocab_hash,
            change: r.op.into(),
        }
    }
}

/// A running replication: its thread and what it reports.
pub struct Replication {
    stats: Arc<Mutex<ReplicationStats>>,
    positions: Arc<Mutex<Positions>>,
    uploads: tokio::sync::mpsc::UnboundedSender<Upload>,
    outbox: Arc<Mutex<EvictionOutbox>>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Replication {
    /// Start publishing `store`'s own appends and applying the other replicas'. Never
    /// waits for NATS: an unreachable server is retried in the background.
    pub fn start(
        cfg: ReplicationConfig,
        identity: ReplicaIdentity,
        store: Arc<Store>,
        tokenizer: TokenizerId,
    ) -> Result<Self, ReplicateError> {
        let files = ReplicaFiles::new(store.directory(), store.dir());
        let positions = files.positions()?;
        let stats = Arc::new(Mutex::new(ReplicationStats {
            replica: identity.name.clone(),
            tag: identity.tag,
            url: cfg.url.clone(),
            cluster: cfg.cluster.clone(),
            published_id: positions.published_id,
            applied_seq: positions.applied_seq,
            ..Default::default()
        }));
        let stop = Arc::new(AtomicBool::new(false));
        let positions = Arc::new(Mutex::new(positions));
        let (uploads, upload_queue) = tokio::sync::mpsc::unbounded_channel();
        let outbox = Arc::new(Mutex::new(
            files.outbox(positions.lock().expect("positions").evictions_published)?,
        ));
        let worker = Worker {
            outbox: outbox.clone(),
            cfg,
            identity,
            store,
            tokenizer,
            positions: positions.clone(),
            files,
            upload_queue: Mutex::new(Some(upload_queue)),
            stats: stats.clone(),
            stop: stop.clone(),
        };
        let thread = on_a_thread_of_its_own("replicate", move || worker.run())?;
        Ok(Replication {
            stats,
            positions,
            uploads,
            outbox,
            stop,
            thread: Some(thread),
        })
    }

    /// What it has done so far.
    pub fn stats(&self, store: &Store) -> ReplicationStats {
        let mut s = self.stats.lock().expect("replication stats").clone();
        s.unpublished = store
            .last_own_id()
            .saturating_sub(s.published_id.max(own_ids(s.tag).start));
        s.evictions_unpublished = self.outbox.lock().expect("outbox").len() as u64;
        s.update_lag_percentiles();
        s
    }

    /// Send an operator's eviction, done on this replica's store, to the others. Returns
    /// once it is written down (fsynced): it goes out when NATS can take it.
    pub fn evicted(&self, scope: EvictScope) -> Result<(), ReplicateError> {
        self.outbox.lock().expect("outbox").push(scope)
    }

    /// The stream position a snapshot taken now covers: every record up to it is
    /// applied. Read it before the snapshot starts.
    pub fn snapshot_position(&self) -> u64 {
        self.positions.lock().expect("positions").applied_seq
    }

    /// Upload the snapshot at `path`, taken after [`Replication::snapshot_position`]
    /// gave `position`, to the cluster's Object Store bucket, and prune the bucket to the
    /// newest `keep_snapshots`. Waits for the upload (up to 15 minutes).
    pub fn publish_snapshot(
        &self,
        path: &Path,
        position: u64,
    ) -> Result<PublishedSnapshot, ReplicateError> {
        let error = |source: SyncError| ReplicateError::Publish {
            path: path.into(),
            source,
        };
        // Opened now: a newer snapshot may replace the file, and the open file keeps it.
        let file = std::fs::File::open(path).map_err(|e| error(SyncError::io(path)(e)))?;
        let (done, answer) = std::sync::mpsc::channel();
        self.uploads
            .send(Upload {
                file,
                position,
                done,
            })
            .map_err(|_| error(SyncError::Stopped))?;
        let waited = Duration::from_secs(900);
        answer
            .recv_timeout(waited)
            .map_err(|_| {
                error(SyncError::TimedOut {
                    during: "uploading the snapshot",
                    after: waited,
                })
            })?
            .map_err(error)
    }

    /// Record in the stats that this replica started from a published snapshot.
    pub fn set_bootstrap(&self, bootstrap: &Bootstrap) {
        self.stats
            .lock()
            .expect("replication stats")
            .snapshot_fetched = Some(bootstrap.object.clone());
    }
}

/// Run the future `work` makes on a new thread `name`, on a runtime of that thread's own,
/// so that neither the model thread nor HTTP handlers ever run NATS's I/O.
fn on_a_thread_of_its_own<F: Future<Output = ()>>(
    name: &str,
    work: impl FnOnce() -> F + Send + 'static,
) -> std::io::Result<std::thread::JoinHandle<()>> {
    let thread_name = name.to_string();
    std::thread::Builder::new()
        .name(name.into())
        .spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build();
            match runtime {
                Ok(rt) => rt.block_on(work()),
                Err(e) => tracing::error!("{thread_name} cannot start its runtime: {e}"),
            }
        })
}

/// A snapshot this replica published.
#[derive(Clone, Debug, serde::Serialize)]
pub struct PublishedSnapshot {
    /// Its object name in the bucket.
    pub object: String,
    /// The stream position it covers.
    pub position: u64,
    /// Its size in bytes.
    pub bytes: u64,
}

/// A snapshot to upload, and where to answer.
struct Upload {
    file: std::fs::File,
    position: u64,
    done: std::sync::mpsc::Sender<Result<PublishedSnapshot, SyncError>>,
}

/// Start a store directory that holds nothing yet (no snapshot, no log) from the newest
/// snapshot its cluster published, so that the stream is replayed only after the
/// position it covers. None when the directory is not empty, NATS cannot be reached in
/// 10 s, or nothing usable is published: the replica then replays the stream from its
/// start (or from where it was). Call it before the store is opened.
pub fn bootstrap(
    cfg: &ReplicationConfig,
    dir: &Path,
    tokenizer: TokenizerId,
) -> Result<Option<Bootstrap>, ReplicateError> {
    std::fs::create_dir_all(dir).map_err(|source| ReplicateError::State {
        path: dir.into(),
        source,
    })?;
    if !snapshots::is_empty_store(dir) {
        return Ok(None);
    }
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let fetched = runtime.block_on(async {
        let connect = async_nats::ConnectOptions::new()
            .connection_timeout(Duration::from_secs(10))
            .connect(cfg.url.as_str());
        let waited = Duration::from_secs(10);
        let client = match tokio::time::timeout(waited, connect).await {
            Ok(Ok(c)) => c,
            Ok(Err(e)) => return Err(SyncError::nats("connecting")(e)),
            Err(_) => {
                return Err(SyncError::TimedOut {
                    during: "connecting",
                    after: waited,
                });
            }
        };
        let js = jetstream::new(client);
        snapshots::download_newest(&js, &cfg.cluster, dir, tokenizer).await
    });
    match fetched {
        Ok(Some(b)) => {
            let files = ReplicaFiles::on_disk(dir);
            // Damaged positions are replaced: the snapshot says where to start.
            let mut positions = files.positions().unwrap_or_default();
            positions.applied_seq = b.position;
            files.save_positions(&positions)?;
            Ok(Some(b))
        }
        Ok(None) => Ok(None),
        Err(e) => {
            tracing::warn!(
                "replication: no published snapshot fetched from {} ({e}): replaying the stream instead",
                cfg.url
            );
            Ok(None)
        }
    }
}

impl Drop for Replication {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The stream's JSON is what replicas of earlier versions wrote and read: each
    /// change as its own `"op"`, beside the record's fields.
    #[test]
    fn records_keep_their_json_on_the_stream() {
        let record = |change| Record {
            origin: "r1".into(),
            vocab_size: 49152,
            vocab_hash: 7,
            change,
        };
        let cases = [
            (
                Change::Append {
                    namespace: "n".into(),
                    id: 3,
                    time_ms: 9,
                    tokens: vec![1, 2],
                },
                r#"{"origin":"r1","vocab_size":49152,"vocab_hash":7,"op":"append","namespace":"n","id":3,"time_ms":9,"tokens":[1,2]}"#,
            ),
            (
                Change::evict("n", 3),
                r#"{"origin":"r1","vocab_size":49152,"vocab_hash":7,"op":"evict","namespace":"n","id":3}"#,
            ),
            (
                Change::Evict(EvictScope::Namespace {
                    namespace: "n".into(),
                }),
                r#"{"origin":"r1","vocab_size":49152,"vocab_hash":7,"op":"evict_namespace","namespace":"n"}"#,
            ),
            (
                Change::Evict(EvictScope::UnusedSince { cutoff_ms: 5 }),
                r#"{"origin":"r1","vocab_size":49152,"vocab_hash":7,"op":"evict_unused_since","cutoff_ms":5}"#,
            ),
        ];
        for (change, json) in cases {
            let r = record(change);
            assert_eq!(serde_json::to_string(&r).unwrap(), json);
            assert_eq!(serde_json::from_str::<Record>(json).unwrap(), r);
        }
        assert!(
            serde_json::from_str::<Record>(
                r#"{"origin":"r1","vocab_size":1,"vocab_hash":7,"op":"drop"}"#
            )
            .is_err()
        );
    }
}
