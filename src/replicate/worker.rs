//! The replication thread: it publishes the store's own appends and the operator's
//! evictions, applies the other replicas' records in stream order, catches up from a
//! published snapshot when the stream dropped records it had not read, and uploads
//! snapshots.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_nats::jetstream::{self, consumer::DeliverPolicy, stream};
use futures_util::StreamExt;

use crate::store::live::{Store, now_ms, own_ids};
use crate::store::snapshot::Snapshot;
use crate::store::{Change, TokenizerId};

use super::outbox::EvictionOutbox;
use super::state::{Positions, ReplicaFiles, STATE_DIR};
use super::{
    CONSUMER_STALL, DUPLICATE_WINDOW, POSITION_EVERY, PUBLISH_BATCH, PUBLISH_POLL,
    PublishedSnapshot, RETRY, Record, ReplicaIdentity, ReplicationConfig, ReplicationStats,
    SyncError, Upload, snapshots,
};

/// The replication thread's state.
pub(super) struct Worker {
    pub(super) outbox: Arc<Mutex<EvictionOutbox>>,
    pub(super) cfg: ReplicationConfig,
    pub(super) identity: ReplicaIdentity,
    pub(super) store: Arc<Store>,
    pub(super) tokenizer: TokenizerId,
    pub(super) positions: Arc<Mutex<Positions>>,
    pub(super) files: ReplicaFiles,
    pub(super) upload_queue: Mutex<Option<tokio::sync::mpsc::UnboundedReceiver<Upload>>>,
    pub(super) stats: Arc<Mutex<ReplicationStats>>,
    pub(super) stop: Arc<AtomicBool>,
}

impl Worker {
    pub(super) async fn run(self) {
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
        let uploads = self.upload_queue.lock().expect("uploads").take();
        tokio::join!(
            self.publish_loop(&js),
            self.consume_loop(&js),
            self.upload_loop(&js, uploads)
        );
    }

    fn stopping(&self) -> bool {
        self.stop.load(Ordering::Relaxed)
    }

    fn subject(&self) -> String {
        format!("{}.records", self.cfg.cluster)
    }

    /// The cluster's stream, created if missing; with `stream_max_age`, its retention set
    /// to it (a stream that exists keeps its other settings, and its retention when the
    /// flag is not given).
    async fn stream(&self, js: &jetstream::Context) -> Result<stream::Stream, SyncError> {
        let mut stream = js
            .get_or_create_stream(stream::Config {
                name: self.cfg.cluster.clone(),
                subjects: vec![self.subject()],
                storage: stream::StorageType::File,
                duplicate_window: DUPLICATE_WINDOW,
                max_age: self.cfg.stream_max_age.unwrap_or_default(),
                ..Default::default()
            })
            .await
            .map_err(SyncError::nats("looking up the stream"))?;
        if let Some(age) = self.cfg.stream_max_age {
            let config = stream
                .info()
                .await
                .map_err(SyncError::nats("reading the stream's settings"))?
                .config
                .clone();
            if config.max_age != age {
                tracing::info!(
                    "replication: stream {} now keeps records for {} s (was {} s; 0: forever)",
                    self.cfg.cluster,
                    age.as_secs(),
                    config.max_age.as_secs()
                );
                js.update_stream(stream::Config {
                    max_age: age,
                    ..config
                })
                .await
                .map_err(SyncError::nats("setting the stream's retention"))?;
            }
        }
        Ok(stream)
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
        // Read before the batch: every own id up to it is readable by then (or evicted).
        let last = self.store.last_own_id();
        if last <= after {
            return Ok(0);
        }
        let batch = self.store.own_appends_after(after, PUBLISH_BATCH);
        if batch.is_empty() {
            // Everything in after..=last was evicted before it could go out. Not a
            // second read of last_own_id: an append since the batch is not evicted.
            let mut p = self.positions.lock().expect("positions");
            if p.published_id == after {
                p.published_id = last;
            }
            return Ok(0);
        }
        let mut sent = 0;
        let mut acknowledged = after;
        for seq in batch {
            // Appends only, each naming its sequence.
            let Some((_, id)) = seq.sequence() else {
                continue;
            };
            let msg_id = format!("{}:{id}", self.identity.name);
            if let Err(e) = self.publish(js, &msg_id, seq).await {
                self.failed(format!("publishing id {id}: {e}"));
                tokio::time::sleep(RETRY).await;
                return Err(());
            }
            {
                let mut p = self.positions.lock().expect("positions");
                if p.published_id != acknowledged {
                    // A stream reset moved the position back meanwhile: publish again
                    // from there.
                    return Ok(sent);
                }
                p.published_id = id;
                acknowledged = id;
            }
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
            let Some((n, scope)) = self.outbox.lock().expect("outbox").front() else {
                return sent;
            };
            let msg_id = format!("{}:e{n}", self.identity.name);
            if let Err(e) = self.publish(js, &msg_id, Change::Evict(scope)).await {
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
                (_, None) => Err(SyncError::StreamUnreadable(self.cfg.cluster.clone())),
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
        change: Change,
    ) -> Result<(), SyncError> {
        let record = Record {
            origin: self.identity.name.clone(),
            vocab_size: self.tokenizer.vocab_size,
            vocab_hash: self.tokenizer.vocab_hash,
            change,
        };
        let payload = serde_json::to_vec(&record).expect("a record serializes");
        let mut headers = async_nats::HeaderMap::new();
        // JetStream drops a second copy within its duplicate window (a retry after a lost
        // acknowledgement); the consumer's id check covers the rest.
        headers.insert("Nats-Msg-Id", msg_id);
        let ack = js
            .publish_with_headers(self.subject(), headers, payload.into())
            .await
            .map_err(SyncError::nats("publishing a record"))?;
        let waited = Duration::from_secs(5);
        tokio::time::timeout(waited, ack)
            .await
            .map_err(|_| SyncError::TimedOut {
                during: "waiting for a record's acknowledgement",
                after: waited,
            })?
            .map_err(SyncError::nats("waiting for a record's acknowledgement"))?;
        Ok(())
    }

    /// Applies the stream in order from the position after the last one applied. After
    /// any error the stream is looked up again, and made again if it is gone, so that a
    /// NATS server that lost its storage gets its stream back from the first replica
    /// that notices, with no restart.
    async fn consume_loop(&self, js: &jetstream::Context) {
        while !self.stopping() {
            let consumed = async {
                let stream = self.stream(js).await?;
                self.check_stream(&stream).await?;
                self.consume(js, &stream).await
            };
            if let Err(e) = consumed.await {
                self.failed(format!("reading stream {}: {e}", self.cfg.cluster));
                tokio::time::sleep(RETRY).await;
            }
        }
    }

    /// Whether `stream` is still the stream this replica's positions count in; if it is
    /// not (created at another time, or holding fewer records than were applied from
    /// it), start over on it: republish every own cached sequence and read it from its
    /// start. Records applied twice are cached once (ids are the same everywhere).
    /// Returns the stream's last sequence.
    async fn check_stream(&self, stream: &stream::Stream) -> Result<u64, SyncError> {
        let mut stream = stream.clone();
        let info = stream
            .info()
            .await
            .map_err(SyncError::nats("reading the stream's state"))?;
        let created = (info.created.unix_timestamp_nanos() / 1000) as i64;
        let last = info.state.last_sequence;
        let (reset, changed) = {
            let mut p = self.positions.lock().expect("positions");
            let reset = match p.stream_created_us {
                Some(known) => known != created || last < p.applied_seq,
                None => last < p.applied_seq,
            };
            if reset {
                p.applied_seq = 0;
                p.published_id = 0;
            }
            let changed = p.stream_created_us != Some(created);
            p.stream_created_us = Some(created);
            (reset.then_some(*p), changed)
        };
        if let Some(p) = reset {
            tracing::warn!(
                "replication: stream {} was made anew (NATS lost its storage, or the stream was deleted): it holds {last} records. Republishing this replica's own cached sequences and reading the new stream from its start",
                self.cfg.cluster
            );
            {
                let mut s = self.stats.lock().expect("replication stats");
                s.stream_resets += 1;
                s.last_stream_reset_ms = Some(now_ms());
                s.applied_seq = p.applied_seq;
                s.published_id = p.published_id;
            }
            self.save_positions();
            return Err(SyncError::StreamReset);
        }
        // Only a newly seen stream changes what is on disk (the idle loop saves anyway).
        if changed {
            self.save_positions();
        }
        Ok(last)
    }

    async fn consume(
        &self,
        js: &jetstream::Context,
        stream: &stream::Stream,
    ) -> Result<(), SyncError> {
        let from = self.positions.lock().expect("positions").applied_seq + 1;
        let consumer = stream
            .create_consumer(jetstream::consumer::pull::OrderedConfig {
                deliver_policy: DeliverPolicy::ByStartSequence {
                    start_sequence: from,
                },
                ..Default::default()
            })
            .await
            .map_err(SyncError::nats("creating the consumer"))?;
        let mut messages = consumer
            .messages()
            .await
            .map_err(SyncError::nats("reading the consumer"))?;
        let mut saved = Instant::now();
        let mut delivered = Instant::now();
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
                    let last = self.check_stream(stream).await?;
                    let unread = self.refresh_lag(last);
                    if unread > 0 && delivered.elapsed() >= CONSUMER_STALL {
                        return Err(SyncError::ConsumerStalled {
                            quiet: CONSUMER_STALL,
                            unread,
                        });
                    }
                    continue;
                }
                Ok(None) => return Err(SyncError::ConsumerEnded),
                Ok(Some(m)) => m.map_err(SyncError::nats("reading a record"))?,
            };
            delivered = Instant::now();
            let info = message
                .info()
                .map_err(SyncError::nats("reading a record's position"))?;
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
        // Fetched onto the disk, beside the other files: the snapshot reader maps it.
        let path = self.files.path("catch-up.snapshot");
        let fetched =
            snapshots::fetch_newest(js, &self.cfg.cluster, &path, self.tokenizer, from).await;
        let covered = match fetched {
            Ok(Some(f)) => {
                let merged = Snapshot::open(&path, Some(self.tokenizer))
                    .map_err(SyncError::from)
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
        let applied = match &record.change {
            Change::Append {
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
                s.record_lag(lag);
                applied.map(|_| ())
            }
            Change::Evict(scope) => self.store.evict(scope).map(|_| ()),
        };
        if !matches!(record.change, Change::Append { .. }) {
            self.stats
                .lock()
                .expect("replication stats")
                .evictions_applied += 1;
        }
        if let Err(e) = applied {
            tracing::error!(
                "replication: a record from {} was not applied ({:?}): {e}",
                record.origin,
                record.change
            );
        }
    }

    fn refuse(&self, why: String) {
        tracing::error!("replication: refused {why}");
        self.stats.lock().expect("replication stats").refused += 1;
    }

    /// Updates the lag from the stream's last sequence; how many records wait.
    fn refresh_lag(&self, last: u64) -> u64 {
        let applied = self.positions.lock().expect("positions").applied_seq;
        let unread = last.saturating_sub(applied);
        self.succeeded(|s| s.lag_records = unread);
        unread
    }

    fn save_positions(&self) {
        let positions = *self.positions.lock().expect("positions");
        match self.files.save_positions(&positions) {
            // Only now may the outbox forget what went out (its numbering must not
            // start over below what JetStream has seen).
            Ok(()) => self
                .outbox
                .lock()
                .expect("outbox")
                .compact(positions.evictions_published),
            // The positions only save work: an older one re-sends or re-reads records,
            // which the ids make harmless.
            Err(e) => tracing::error!("{e}"),
        }
    }
}
