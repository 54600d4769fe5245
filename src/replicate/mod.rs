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
use std::time::{Duration, Instant};

mod outbox;
mod snapshots;

pub use snapshots::Bootstrap;

use async_nats::jetstream::{self, consumer::DeliverPolicy, stream};
use futures_util::StreamExt;

use crate::store::TokenizerId;
use crate::store::live::{MAX_ID_ORIGIN, Store, now_ms, own_ids};
use crate::store::snapshot::{Snapshot, replace_file};

use outbox::EvictionOutbox;

/// Where a replica keeps its identity and stream positions, inside the store directory.
const STATE_DIR: &str = "replication";

/// Most sequences published in one batch, between two position writes.
const PUBLISH_BATCH: usize = 256;

/// How often the publisher looks for new appends when idle.
const PUBLISH_POLL: Duration = Duration::from_millis(50);

/// How often the applied position is written while records arrive.
const POSITION_EVERY: Duration = Duration::from_millis(200);

/// How many recent applied appends the lag percentiles cover.
pub const LAG_WINDOW: usize = 1024;

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
    #[error("snapshot {path} not published: {reason}")]
    Publish {
        /// The local snapshot.
        path: PathBuf,
        /// Why.
        reason: String,
    },
    /// The replication thread could not start.
    #[error("cannot start the replication thread: {0}")]
    Thread(#[from] std::io::Error),
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
        let path = store_dir.join(STATE_DIR).join("replica.json");
        match std::fs::read(&path) {
            Ok(bytes) => {
                let id: ReplicaIdentity =
                    serde_json::from_slice(&bytes).map_err(|e| ReplicateError::BadState {
                        path: path.clone(),
                        reason: e.to_string(),
                    })?;
                if id.tag == 0 || id.tag > MAX_ID_ORIGIN {
                    return Err(ReplicateError::BadState {
                        path,
                        reason: format!("tag {} is outside 1..={MAX_ID_ORIGIN}", id.tag),
                    });
                }
                Ok(id)
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                let id = ReplicaIdentity {
                    name: format!("{:016x}", rand::random::<u64>()),
                    tag: rand::random_range(1..=MAX_ID_ORIGIN),
                };
                write_state(&path, &id)?;
                Ok(id)
            }
            Err(source) => Err(ReplicateError::State { path, source }),
        }
    }
}

/// How far this replica has got, kept durably in the store directory.
#[derive(Clone, Copy, Debug, Default, serde::Serialize, serde::Deserialize)]
struct Positions {
    /// The last own id JetStream acknowledged.
    published_id: u64,
    /// The last stream sequence applied (or skipped as this replica's own).
    applied_seq: u64,
    /// The last entry of the eviction outbox JetStream acknowledged.
    #[serde(default)]
    evictions_published: u64,
}

/// One record on the stream: what a replica did, and who it is.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Record {
    /// The replica that did it ([`ReplicaIdentity::name`]).
    pub origin: String,
    /// The tokenizer of its token ids: other tokenizers' records are refused.
    pub vocab_size: u32,
    /// See [`TokenizerId::vocab_hash`].
    pub vocab_hash: u64,
    /// What it did.
    #[serde(flatten)]
    pub op: RecordOp,
}

/// What a record does. Budget and age evictions a store makes on its own are not
/// records: each replica has its own budget and its own last-use times.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum RecordOp {
    /// A completed request's response, cached under `id` on every replica.
    Append {
        /// The namespace.
        namespace: String,
        /// The sequence id, the same on every replica.
        id: u64,
        /// When it was appended, ms since the epoch.
        time_ms: u64,
        /// The response tokens.
        tokens: Vec<u32>,
    },
    /// An operator's eviction of one sequence (`POST /admin/evict` by id).
    Evict {
        /// The namespace.
        namespace: String,
        /// The sequence id.
        id: u64,
    },
    /// An operator's eviction of a namespace.
    EvictNamespace {
        /// The namespace.
        namespace: String,
    },
    /// An operator's eviction by age: every sequence each replica has not used since.
    EvictUnusedSince {
        /// ms since the epoch.
        cutoff_ms: u64,
    },
}

/// What `/admin/stats` reports under `replication`.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct ReplicationStats {
    /// This replica's name.
    pub replica: String,
    /// The tag in its ids.
    pub tag: u16,
    /// The NATS server.
    pub url: String,
    /// The stream.
    pub cluster: String,
    /// Whether the last exchange with NATS succeeded.
    pub connected: bool,
    /// The last own id JetStream acknowledged.
    pub published_id: u64,
    /// Own sequences published since start.
    pub published: u64,
    /// Own appends not yet acknowledged (the last own id minus the last published).
    pub unpublished: u64,
    /// The last stream sequence applied.
    pub applied_seq: u64,
    /// Other replicas' records applied since start (a record already cached counts).
    pub applied: u64,
    /// Records on the stream not yet applied, at the last look.
    pub lag_records: u64,
    /// Seconds from the newest applied record's append at its origin to its apply here.
    pub lag_seconds: f64,
    /// The median of that lag over the last [`LAG_WINDOW`] applied appends.
    pub lag_seconds_p50: f64,
    /// Its 99th percentile over the same window.
    pub lag_seconds_p99: f64,
    /// The lags of the last applied appends, for the percentiles.
    #[serde(skip)]
    recent_lags: std::collections::VecDeque<f64>,
    /// Operator evictions not yet acknowledged (kept in `replication/evictions.jsonl`).
    pub evictions_unpublished: u64,
    /// Other replicas' operator evictions applied since start.
    pub evictions_applied: u64,
    /// Records refused since start (another tokenizer, an id outside the origin's tag,
    /// undecodable), each logged with the reason.
    pub refused: u64,
    /// Records the stream no longer held when this replica reached them (its retention)
    /// and no published snapshot covered, since start.
    pub missed: u64,
    /// Times this replica found records gone from the stream and caught up from a
    /// published snapshot, since start.
    pub catch_ups: u64,
    /// Snapshots this replica published since start.
    pub snapshots_published: u64,
    /// The last one it published (object name).
    pub last_snapshot_published: Option<String>,
    /// The published snapshot this replica last started or caught up from.
    pub snapshot_fetched: Option<String>,
    /// The last error, if the last exchange failed.
    pub last_error: Option<String>,
}

impl ReplicationStats {
    /// The Prometheus exposition lines (`suffixd_replication_*`).
    pub fn prometheus(&self) -> String {
        let mut out = String::new();
        let mut line = |name: &str, kind: &str, help: &str, v: f64| {
            out.push_str(&format!(
                "# HELP suffixd_replication_{name} {help}\n# TYPE suffixd_replication_{name} {kind}\nsuffixd_replication_{name} {v}\n"
            ));
        };
        line(
            "connected",
            "gauge",
            "1 when the last exchange with NATS succeeded.",
            self.connected as u8 as f64,
        );
        line(
            "published_total",
            "counter",
            "Own appends published since start.",
            self.published as f64,
        );
        line(
            "unpublished",
            "gauge",
            "Own appends not yet acknowledged by JetStream.",
            self.unpublished as f64,
        );
        line(
            "applied_total",
            "counter",
            "Other replicas' records applied since start.",
            self.applied as f64,
        );
        line(
            "applied_position",
            "gauge",
            "The last stream sequence applied.",
            self.applied_seq as f64,
        );
        line(
            "lag_records",
            "gauge",
            "Stream records not yet applied.",
            self.lag_records as f64,
        );
        line(
            "lag_seconds",
            "gauge",
            "Age of the newest applied record when it was applied.",
            self.lag_seconds,
        );
        line(
            "lag_seconds_p50",
            "gauge",
            "Median lag over the last 1024 applied appends.",
            self.lag_seconds_p50,
        );
        line(
            "lag_seconds_p99",
            "gauge",
            "99th percentile lag over the last 1024 applied appends.",
            self.lag_seconds_p99,
        );
        line(
            "refused_total",
            "counter",
            "Records refused (another tokenizer, a foreign tag, undecodable).",
            self.refused as f64,
        );
        line(
            "missed_total",
            "counter",
            "Records gone from the stream (retention) that no published snapshot covered.",
            self.missed as f64,
        );
        line(
            "catch_ups_total",
            "counter",
            "Catch-ups from a published snapshot after records were gone from the stream.",
            self.catch_ups as f64,
        );
        out
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
        let positions_path = store.dir().join(STATE_DIR).join("positions.json");
        let positions = match std::fs::read(&positions_path) {
            Ok(bytes) => serde_json::from_slice(&bytes).map_err(|e| ReplicateError::BadState {
                path: positions_path.clone(),
                reason: e.to_string(),
            })?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Positions::default(),
            Err(source) => {
                return Err(ReplicateError::State {
                    path: positions_path,
                    source,
                });
            }
        };
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
        let outbox = Arc::new(Mutex::new(EvictionOutbox::open(
            &store.dir().join(STATE_DIR).join("evictions.jsonl"),
            positions.lock().expect("positions").evictions_published,
        )?));
        let worker = Worker {
            outbox: outbox.clone(),
            cfg,
            identity,
            store,
            tokenizer,
            positions: positions.clone(),
            positions_path,
            upload_queue: Mutex::new(Some(upload_queue)),
            stats: stats.clone(),
            stop: stop.clone(),
        };
        let thread = std::thread::Builder::new()
            .name("replicate".into())
            .spawn(move || {
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build();
                match runtime {
                    Ok(rt) => rt.block_on(worker.run()),
                    Err(e) => tracing::error!("replication cannot start its runtime: {e}"),
                }
            })?;
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
        let mut lags: Vec<f64> = s.recent_lags.iter().copied().collect();
        lags.sort_unstable_by(f64::total_cmp);
        let at = |q: f64| lags.get(((lags.len() as f64 - 1.0) * q).round() as usize);
        s.lag_seconds_p50 = at(0.5).copied().unwrap_or(0.0);
        s.lag_seconds_p99 = at(0.99).copied().unwrap_or(0.0);
        s
    }

    /// Send an operator's eviction, done on this replica's store, to the others. Returns
    /// once it is written down (fsynced): it goes out when NATS can take it.
    pub fn evicted(&self, op: RecordOp) -> Result<(), ReplicateError> {
        self.outbox.lock().expect("outbox").push(op)
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
        let error = |reason: String| ReplicateError::Publish {
            path: path.into(),
            reason,
        };
        // Opened now: a newer snapshot may replace the file, and the open file keeps it.
        let file = std::fs::File::open(path).map_err(|e| error(e.to_string()))?;
        let (done, answer) = std::sync::mpsc::channel();
        self.uploads
            .send(Upload {
                file,
                position,
                done,
            })
            .map_err(|_| error("replication has stopped".into()))?;
        answer
            .recv_timeout(Duration::from_secs(900))
            .map_err(|_| error("no answer from the replication thread in 15 minutes".into()))?
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
    done: std::sync::mpsc::Sender<Result<PublishedSnapshot, String>>,
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
        let client = match tokio::time::timeout(Duration::from_secs(10), connect).await {
            Ok(Ok(c)) => c,
            Ok(Err(e)) => return Err(e.to_string()),
            Err(_) => return Err("no connection in 10 s".into()),
        };
        let js = jetstream::new(client);
        snapshots::download_newest(&js, &cfg.cluster, dir, tokenizer).await
    });
    match fetched {
        Ok(Some(b)) => {
            let path = dir.join(STATE_DIR).join("positions.json");
            let mut positions: Positions = std::fs::read(&path)
                .ok()
                .and_then(|bytes| serde_json::from_slice(&bytes).ok())
                .unwrap_or_default();
            positions.applied_seq = b.position;
            write_state(&path, &positions)?;
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

/// The replication thread's state.
struct Worker {
    outbox: Arc<Mutex<EvictionOutbox>>,
    cfg: ReplicationConfig,
    identity: ReplicaIdentity,
    store: Arc<Store>,
    tokenizer: TokenizerId,
    positions: Arc<Mutex<Positions>>,
    positions_path: PathBuf,
    upload_queue: Mutex<Option<tokio::sync::mpsc::UnboundedReceiver<Upload>>>,
    stats: Arc<Mutex<ReplicationStats>>,
    stop: Arc<AtomicBool>,
}

impl Worker {
    async fn run(self) {
        // Dropping the work at a stop is safe: positions only move after a record is
        // acknowledged or applied.
        tokio::select! {
            () = self.work() => {}
            () = self.stopped() => {}
        }
        self.save_positions();
    }

    async fn stopped(&self) {
        while !self.stopping() {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    async fn work(&self) {
        let options = async_nats::ConnectOptions::new()
            .retry_on_initial_connect()
            .name(format!("suffixd-{}", self.identity.name));
        let client = match options.connect(self.cfg.url.as_str()).await {
            Ok(c) => c,
            Err(e) => {
                self.failed(format!("cannot connect to {}: {e}", self.cfg.url));
                return;
            }
        };
        let js = jetstream::new(client);
        let stream = loop {
            match self.stream(&js).await {
                Ok(s) => break s,
                Err(e) => {
                    self.failed(format!("stream {}: {e}", self.cfg.cluster));
                    tokio::time::sleep(RETRY).await;
                }
            }
        };
        let uploads = self.upload_queue.lock().expect("uploads").take();
        tokio::join!(
            self.publish_loop(&js),
            self.consume_loop(&js, &stream),
            self.upload_loop(&js, uploads)
        );
    }

    fn stopping(&self) -> bool {
        self.stop.load(Ordering::Relaxed)
    }

    fn subject(&self) -> String {
        format!("{}.records", self.cfg.cluster)
    }

    async fn stream(&self, js: &jetstream::Context) -> Result<stream::Stream, String> {
        js.get_or_create_stream(stream::Config {
            name: self.cfg.cluster.clone(),
            subjects: vec![self.subject()],
            storage: stream::StorageType::File,
            duplicate_window: Duration::from_secs(120),
            ..Default::default()
        })
        .await
        .map_err(|e| e.to_string())
    }

    fn failed(&self, error: String) {
        tracing::warn!("replication: {error}");
        let mut s = self.stats.lock().expect("replication stats");
        s.connected = false;
        s.last_error = Some(error);
    }

    fn succeeded(&self, update: impl FnOnce(&mut ReplicationStats)) {
        let mut s = self.stats.lock().expect("replication stats");
        s.connected = true;
        s.last_error = None;
        update(&mut s);
    }

    /// Publishes own appends in id order, each acknowledged before the next, so the
    /// published position is a prefix; then the operator's evictions, in order.
    async fn publish_loop(&self, js: &jetstream::Context) {
        while !self.stopping() {
            let sent = match self.publish_appends(js).await {
                Ok(n) => n + self.publish_evictions(js).await,
                Err(()) => 0,
            };
            self.save_positions();
            if sent == 0 {
                tokio::time::sleep(PUBLISH_POLL).await;
            }
        }
    }

    /// Publishes up to a batch of own appends; how many went out, or Err when NATS
    /// refused one (retried later from there).
    async fn publish_appends(&self, js: &jetstream::Context) -> Result<usize, ()> {
        let after = self.positions.lock().expect("positions").published_id;
        if self.store.last_own_id() <= after {
            return Ok(0);
        }
        let batch = self.store.own_sequences_after(after, PUBLISH_BATCH);
        if batch.is_empty() {
            // Everything after `after` was evicted before it could go out.
            self.positions.lock().expect("positions").published_id = self.store.last_own_id();
            return Ok(0);
        }
        let mut sent = 0;
        for seq in batch {
            let id = seq.id;
            let op = RecordOp::Append {
                namespace: seq.namespace,
                id,
                time_ms: seq.time_ms,
                tokens: seq.tokens,
            };
            let msg_id = format!("{}:{id}", self.identity.name);
            if let Err(e) = self.publish(js, &msg_id, op).await {
                self.failed(format!("publishing id {id}: {e}"));
                tokio::time::sleep(RETRY).await;
                return Err(());
            }
            self.positions.lock().expect("positions").published_id = id;
            self.succeeded(|s| {
                s.published += 1;
                s.published_id = id;
            });
            sent += 1;
        }
        Ok(sent)
    }

    /// Publishes the eviction outbox in order; how many went out.
    async fn publish_evictions(&self, js: &jetstream::Context) -> usize {
        let mut sent = 0;
        loop {
            let Some((n, op)) = self.outbox.lock().expect("outbox").front() else {
                return sent;
            };
            let msg_id = format!("{}:e{n}", self.identity.name);
            if let Err(e) = self.publish(js, &msg_id, op).await {
                self.failed(format!("publishing eviction {n}: {e}"));
                tokio::time::sleep(RETRY).await;
                return sent;
            }
            self.outbox.lock().expect("outbox").sent(n);
            self.positions
                .lock()
                .expect("positions")
                .evictions_published = n;
            self.succeeded(|_| {});
            sent += 1;
        }
    }

    /// Uploads the snapshots it is handed, one at a time.
    async fn upload_loop(
        &self,
        js: &jetstream::Context,
        queue: Option<tokio::sync::mpsc::UnboundedReceiver<Upload>>,
    ) {
        let Some(mut queue) = queue else { return };
        while let Some(upload) = queue.recv().await {
            let object = snapshots::object_name(upload.position, &self.identity.name);
            let last = snapshots::last_sequence(js, &self.cfg.cluster).await;
            let result = match (snapshots::bucket(js, &self.cfg.cluster).await, last) {
                (Ok(bucket), Some(last)) => {
                    snapshots::upload(
                        &bucket,
                        &object,
                        upload.file,
                        upload.position,
                        last,
                        self.cfg.keep_snapshots,
                    )
                    .await
                }
                (Err(e), _) => Err(e),
                (_, None) => Err(format!("cannot read stream {}", self.cfg.cluster)),
            };
            let result = result.map(|bytes| PublishedSnapshot {
                object: object.clone(),
                position: upload.position,
                bytes,
            });
            match &result {
                Ok(p) => {
                    tracing::info!(
                        "replication: published snapshot {} ({} bytes)",
                        p.object,
                        p.bytes
                    );
                    self.succeeded(|s| {
                        s.snapshots_published += 1;
                        s.last_snapshot_published = Some(object);
                    });
                }
                Err(e) => self.failed(format!("publishing snapshot {object}: {e}")),
            }
            let _ = upload.done.send(result);
        }
    }

    /// Publishes one record and waits for JetStream's acknowledgement. `msg_id` names it
    /// for JetStream's duplicate window.
    async fn publish(
        &self,
        js: &jetstream::Context,
        msg_id: &str,
        op: RecordOp,
    ) -> Result<(), String> {
        let record = Record {
            origin: self.identity.name.clone(),
            vocab_size: self.tokenizer.vocab_size,
            vocab_hash: self.tokenizer.vocab_hash,
            op,
        };
        let payload = serde_json::to_vec(&record).map_err(|e| e.to_string())?;
        let mut headers = async_nats::HeaderMap::new();
        // JetStream drops a second copy within its duplicate window (a retry after a lost
        // acknowledgement); the consumer's id check covers the rest.
        headers.insert("Nats-Msg-Id", msg_id);
        let ack = js
            .publish_with_headers(self.subject(), headers, payload.into())
            .await
            .map_err(|e| e.to_string())?;
        tokio::time::timeout(Duration::from_secs(5), ack)
            .await
            .map_err(|_| "no acknowledgement within 5 s".to_string())?
            .map_err(|e| e.to_string())?;
        Ok(())
    }

    /// Applies the stream in order from the position after the last one applied.
    async fn consume_loop(&self, js: &jetstream::Context, stream: &stream::Stream) {
        while !self.stopping() {
            if let Err(e) = self.consume(js, stream).await {
                self.failed(format!("reading stream {}: {e}", self.cfg.cluster));
                tokio::time::sleep(RETRY).await;
            }
        }
    }

    async fn consume(
        &self,
        js: &jetstream::Context,
        stream: &stream::Stream,
    ) -> Result<(), String> {
        let from = self.positions.lock().expect("positions").applied_seq + 1;
        let consumer = stream
            .create_consumer(jetstream::consumer::pull::OrderedConfig {
                deliver_policy: DeliverPolicy::ByStartSequence {
                    start_sequence: from,
                },
                ..Default::default()
            })
            .await
            .map_err(|e| e.to_string())?;
        let mut messages = consumer.messages().await.map_err(|e| e.to_string())?;
        let mut saved = Instant::now();
        let mut expected = from;
        loop {
            let next = tokio::time::timeout(POSITION_EVERY, messages.next()).await;
            if self.stopping() {
                return Ok(());
            }
            let message = match next {
                Err(_) => {
                    self.save_positions();
                    saved = Instant::now();
                    self.refresh_lag(stream).await;
                    continue;
                }
                Ok(None) => return Err("the consumer ended".into()),
                Ok(Some(m)) => m.map_err(|e| e.to_string())?,
            };
            let info = message.info().map_err(|e| e.to_string())?;
            let (seq, pending) = (info.stream_sequence, info.pending);
            if seq > expected {
                // The stream no longer holds these (its retention).
                self.catch_up(js, expected, seq).await;
            }
            expected = seq + 1;
            self.apply(&message.payload);
            self.positions.lock().expect("positions").applied_seq = seq;
            self.succeeded(|s| {
                s.applied_seq = seq;
                s.lag_records = pending;
            });
            if saved.elapsed() >= POSITION_EVERY {
                self.save_positions();
                saved = Instant::now();
            }
        }
    }

    /// The stream no longer holds records `from..next` (its retention dropped them before
    /// this replica read them): take them from the newest published snapshot that
    /// covers any of them ([`snapshots::merge`]). What no snapshot covers is counted as
    /// missed.
    async fn catch_up(&self, js: &jetstream::Context, from: u64, next: u64) {
        tracing::warn!(
            "replication: stream records {from}..{} are gone from the stream: catching up from a published snapshot",
            next - 1
        );
        let path = self.store.dir().join(STATE_DIR).join("catch-up.snapshot");
        let fetched =
            snapshots::fetch_newest(js, &self.cfg.cluster, &path, self.tokenizer, from).await;
        let covered = match fetched {
            Ok(Some(f)) => {
                let merged = Snapshot::open(&path, Some(self.tokenizer))
                    .map_err(|e| e.to_string())
                    .and_then(|snap| snapshots::merge(&self.store, &snap, self.identity.tag));
                match merged {
                    Ok(m) => {
                        tracing::info!(
                            "replication: caught up from {} (position {}): {} sequences added, {} evicted",
                            f.object,
                            f.position,
                            m.added,
                            m.evicted
                        );
                        let mut s = self.stats.lock().expect("replication stats");
                        s.catch_ups += 1;
                        s.snapshot_fetched = Some(f.object);
                        f.position.min(next - 1)
                    }
                    Err(e) => {
                        self.failed(format!("catching up from {}: {e}", f.object));
                        from - 1
                    }
                }
            }
            Ok(None) => {
                tracing::warn!(
                    "replication: no published snapshot covers stream position {from}: publish snapshots more often than the stream's retention drops records (--publish-snapshots)"
                );
                from - 1
            }
            Err(e) => {
                self.failed(format!("fetching a snapshot to catch up: {e}"));
                from - 1
            }
        };
        let _ = std::fs::remove_file(&path);
        self.stats.lock().expect("replication stats").missed += next - 1 - covered;
    }

    /// Applies one record from the stream, unless it is this replica's own or refused.
    fn apply(&self, payload: &[u8]) {
        let record: Record = match serde_json::from_slice(payload) {
            Ok(r) => r,
            Err(e) => return self.refuse(format!("undecodable record: {e}")),
        };
        if record.origin == self.identity.name {
            return;
        }
        let theirs = TokenizerId {
            vocab_size: record.vocab_size,
            vocab_hash: record.vocab_hash,
        };
        if theirs != self.tokenizer {
            return self.refuse(format!(
                "a record from replica {} that uses another tokenizer ({theirs:?}, this one {:?}): run every replica of cluster {} with the same model",
                record.origin, self.tokenizer, self.cfg.cluster
            ));
        }
        let applied = match &record.op {
            RecordOp::Append {
                namespace,
                id,
                time_ms,
                tokens,
            } => {
                if own_ids(self.identity.tag).contains(id) {
                    return self.refuse(format!(
                        "record {id} from replica {} carries this replica's tag {}: two replicas drew the same tag. Stop one, move its {STATE_DIR}/replica.json aside and start it again",
                        record.origin, self.identity.tag
                    ));
                }
                let applied = self
                    .store
                    .append_replicated(namespace, *id, *time_ms, tokens);
                let lag = now_ms().saturating_sub(*time_ms) as f64 / 1e3;
                let mut s = self.stats.lock().expect("replication stats");
                s.applied += 1;
                s.lag_seconds = lag;
                if s.recent_lags.len() == LAG_WINDOW {
                    s.recent_lags.pop_front();
                }
                s.recent_lags.push_back(lag);
                applied.map(|_| ())
            }
            RecordOp::Evict { namespace, id } => self.store.evict(namespace, *id).map(|_| ()),
            RecordOp::EvictNamespace { namespace } => {
                self.store.evict_namespace(namespace).map(|_| ())
            }
            RecordOp::EvictUnusedSince { cutoff_ms } => {
                self.store.evict_unused_since(*cutoff_ms).map(|_| ())
            }
        };
        if !matches!(record.op, RecordOp::Append { .. }) {
            self.stats
                .lock()
                .expect("replication stats")
                .evictions_applied += 1;
        }
        if let Err(e) = applied {
            tracing::error!(
                "replication: a record from {} was not applied ({:?}): {e}",
                record.origin,
                record.op
            );
        }
    }

    fn refuse(&self, why: String) {
        tracing::error!("replication: refused {why}");
        self.stats.lock().expect("replication stats").refused += 1;
    }

    async fn refresh_lag(&self, stream: &stream::Stream) {
        let mut stream = stream.clone();
        if let Ok(info) = stream.info().await {
            let last = info.state.last_sequence;
            let applied = self.positions.lock().expect("positions").applied_seq;
            self.succeeded(|s| s.lag_records = last.saturating_sub(applied));
        }
    }

    fn save_positions(&self) {
        let positions = *self.positions.lock().expect("positions");
        if let Err(e) = write_state(&self.positions_path, &positions) {
            // The positions only save work: an older one re-sends or re-reads records,
            // which the ids make harmless.
            tracing::error!("{e}");
        }
    }
}

/// Write a state file atomically (temporary file, fsync, rename, directory fsync).
fn write_state(path: &Path, value: &impl serde::Serialize) -> Result<(), ReplicateError> {
    let error = |source| ReplicateError::State {
        path: path.into(),
        source,
    };
    let dir = path.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir).map_err(error)?;
    let bytes = serde_json::to_vec(value).map_err(|e| error(e.into()))?;
    replace_file(&path.with_extension("tmp"), path, "replication", |f| {
        std::io::Write::write_all(f, &bytes)
    })
    .map_err(error)
}
