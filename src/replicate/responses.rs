//! Stored responses shared between replicas through a JetStream stream, so that a
//! client behind a load balancer continues (`previous_response_id`), reads and deletes
//! a response on whichever replica its next request reaches.
//!
//! - The stream `<cluster>_responses` keeps one message per response, on the subject
//!   `<cluster>.responses.<id>`: what the serving layer gives as bytes (one response, its
//!   own input, and the id of the response it continued). Made when missing with
//!   [`STREAM_BYTES`] and [`STREAM_AGE`], the oldest out first; an operator changes both
//!   with `nats stream edit`, and a replica leaves a stream that exists as it is.
//! - A response is published when it is kept and acknowledged before its client reads
//!   that it is done, so the client's next request finds it on every replica.
//! - A delete purges its subject and says so on `<cluster>.deleted-responses`, where
//!   every replica drops its own copy.
//! - Everything runs on a thread of its own; callers wait at most [`SHARED_WAIT`] for an
//!   answer. While NATS is unreachable, reads and deletes fail with [`SharedError`] (the
//!   caller keeps serving from its own memory), and responses to publish wait in an
//!   outbox in memory, bounded in bytes, published in order once NATS is back.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use async_nats::jetstream::{self, stream};
use bytes::Bytes;
use futures_util::StreamExt;

use super::RETRY;

/// The most a caller waits for NATS in one operation.
pub const SHARED_WAIT: Duration = Duration::from_secs(3);

/// The bytes a new responses stream keeps (the oldest responses go first beyond it).
pub const STREAM_BYTES: i64 = 1 << 30;

/// How long a new responses stream keeps a response: 30 days, as OpenAI keeps them.
pub const STREAM_AGE: Duration = Duration::from_secs(30 * 24 * 3600);

/// How often the outbox is tried while it holds responses.
const OUTBOX_RETRY: Duration = super::RETRY;

/// Why a shared operation failed; the caller serves from its own memory meanwhile.
#[derive(Clone, Debug, thiserror::Error)]
pub enum SharedError {
    /// NATS is not reachable yet, or refused the operation.
    #[error("the replicas' shared responses (NATS {url}) are unavailable: {reason}")]
    Unavailable {
        /// The NATS server.
        url: String,
        /// Why.
        reason: String,
    },
    /// NATS did not answer within [`SHARED_WAIT`].
    #[error("the replicas' shared responses (NATS {url}) did not answer within {} s", SHARED_WAIT.as_secs())]
    TimedOut {
        /// The NATS server.
        url: String,
    },
    /// The response is larger than the NATS server takes in one message.
    #[error(
        "a stored response of {bytes} bytes is over the NATS server's max_payload ({max_payload} bytes): kept on this replica only; raise max_payload in nats-server's configuration to share such responses"
    )]
    TooLarge {
        /// The response's size.
        bytes: usize,
        /// The server's limit.
        max_payload: usize,
    },
}

/// Counts of shared operations since start, for `/metrics`.
#[derive(Debug, Default)]
pub struct SharedCounts {
    /// Responses published.
    pub published: AtomicU64,
    /// Responses kept while NATS was away, put in the outbox to publish once it is back.
    pub queued: AtomicU64,
    /// Responses fetched from the stream (another replica's, or this one's evicted).
    pub fetched: AtomicU64,
    /// Lookups the stream did not hold either.
    pub missing: AtomicU64,
    /// Deletes sent.
    pub deleted: AtomicU64,
    /// Other replicas' deletes that dropped a copy here.
    pub dropped: AtomicU64,
    /// Operations that failed (NATS unreachable, too slow, a response too large).
    pub failed: AtomicU64,
}

impl SharedCounts {
    /// The counts in Prometheus's text format.
    pub fn prometheus(&self) -> String {
        let mut text = String::from(
            "# HELP suffixd_shared_responses_total Stored responses shared with the other replicas through NATS, by what happened: published, queued (kept while NATS was away, published when it is back), fetched (not in memory here), missing (held by no one), deleted, dropped (another replica's delete), failed (NATS unreachable, too slow, a response over its max_payload, or one the full outbox let go).\n# TYPE suffixd_shared_responses_total counter\n",
        );
        for (event, count) in [
            ("published", &self.published),
            ("queued", &self.queued),
            ("fetched", &self.fetched),
            ("missing", &self.missing),
            ("deleted", &self.deleted),
            ("dropped", &self.dropped),
            ("failed", &self.failed),
        ] {
            let count = count.load(Ordering::Relaxed);
            text.push_str(&format!(
                "suffixd_shared_responses_total{{event=\"{event}\"}} {count}\n"
            ));
        }
        text
    }
}

/// A request to the sharing thread, and where it answers.
enum Request {
    Put {
        id: String,
        bytes: Vec<u8>,
        done: tokio::sync::oneshot::Sender<Result<(), SharedError>>,
    },
    Get {
        id: String,
        done: tokio::sync::oneshot::Sender<Result<Option<Vec<u8>>, SharedError>>,
    },
    Delete {
        id: String,
        done: tokio::sync::oneshot::Sender<Result<bool, SharedError>>,
    },
}

/// The replicas' shared responses, as one replica reaches them.
pub struct SharedResponses {
    url: String,
    requests: tokio::sync::mpsc::UnboundedSender<Request>,
    counts: Arc<SharedCounts>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl SharedResponses {
    /// Start sharing through the NATS server at `url` with the replicas of `cluster`;
    /// `dropped(id)` is called when another replica deletes response `id`. Responses
    /// kept while NATS is away wait in an outbox of at most `outbox_bytes`. Never waits
    /// for NATS: an unreachable server is retried in the background.
    pub fn start(
        url: &str,
        cluster: &str,
        outbox_bytes: usize,
        dropped: impl Fn(&str) + Send + 'static,
    ) -> std::io::Result<Self> {
        let (requests, queue) = tokio::sync::mpsc::unbounded_channel();
        let counts = Arc::new(SharedCounts::default());
        let stop = Arc::new(AtomicBool::new(false));
        let worker = Worker {
            url: url.to_string(),
            cluster: cluster.to_string(),
            counts: counts.clone(),
            stop: stop.clone(),
            outbox: Arc::new(std::sync::Mutex::new(Outbox::new(outbox_bytes))),
            publishing: Arc::default(),
        };
        let thread =
            super::on_a_thread_of_its_own("shared-responses", move || worker.run(queue, dropped))?;
        Ok(SharedResponses {
            url: url.to_string(),
            requests,
            counts,
            stop,
            thread: Some(thread),
        })
    }

    /// What it has done since start.
    pub fn counts(&self) -> &SharedCounts {
        &self.counts
    }

    /// Publish response `id` as `bytes`; returns once JetStream acknowledged it, or,
    /// while NATS is away, once it is in the outbox (published when NATS is back).
    pub async fn put(&self, id: &str, bytes: Vec<u8>) -> Result<(), SharedError> {
        let id = id.to_string();
        self.ask(|done| Request::Put { id, bytes, done }).await
    }

    /// Response `id`'s bytes, None when the stream does not hold it.
    pub async fn get(&self, id: &str) -> Result<Option<Vec<u8>>, SharedError> {
        let id = id.to_string();
        self.ask(|done| Request::Get { id, done }).await
    }

    /// Forget response `id` on every replica; whether the stream held it.
    pub async fn delete(&self, id: &str) -> Result<bool, SharedError> {
        let id = id.to_string();
        self.ask(|done| Request::Delete { id, done }).await
    }

    async fn ask<T>(
        &self,
        request: impl FnOnce(tokio::sync::oneshot::Sender<Result<T, SharedError>>) -> Request,
    ) -> Result<T, SharedError> {
        let (done, answer) = tokio::sync::oneshot::channel();
        let gone = || SharedError::Unavailable {
            url: self.url.clone(),
            reason: "the sharing thread has stopped".into(),
        };
        self.requests.send(request(done)).map_err(|_| gone())?;
        let answer = match tokio::time::timeout(SHARED_WAIT, answer).await {
            Ok(Ok(answer)) => answer,
            Ok(Err(_)) => Err(gone()),
            Err(_) => Err(SharedError::TimedOut {
                url: self.url.clone(),
            }),
        };
        if answer.is_err() {
            self.counts.failed.fetch_add(1, Ordering::Relaxed);
        }
        answer
    }
}

impl Drop for SharedResponses {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Whether `id` is a response id this server makes (`resp_` and 32 hex digits): only
/// those are looked up on NATS, so a client's id never becomes a subject of its own
/// choosing (`*`, `>`, dots).
pub fn is_shareable_id(id: &str) -> bool {
    id.strip_prefix("resp_")
        .is_some_and(|hex| hex.len() == 32 && hex.bytes().all(|b| b.is_ascii_hexdigit()))
}

/// Responses kept while NATS was away, oldest first, to publish once it is back.
struct Outbox {
    waiting: std::collections::VecDeque<(String, Bytes)>,
    bytes: usize,
    budget: usize,
}

impl Outbox {
    fn new(budget: usize) -> Self {
        Outbox {
            waiting: Default::default(),
            bytes: 0,
            budget,
        }
    }

    /// Queue response `id`; the oldest go when the outbox is over its budget (how many
    /// went is returned).
    fn push(&mut self, id: String, bytes: Bytes) -> usize {
        self.bytes += bytes.len();
        self.waiting.push_back((id, bytes));
        let mut gone = 0;
        while self.bytes > self.budget
            && let Some((_, oldest)) = self.waiting.pop_front()
        {
            self.bytes -= oldest.len();
            gone += 1;
        }
        gone
    }

    /// The oldest response waiting.
    fn front(&self) -> Option<(String, Bytes)> {
        self.waiting.front().cloned()
    }

    /// Take response `id` out when it is the oldest (it went out; a full outbox may
    /// have let it go meanwhile).
    fn sent(&mut self, id: &str) {
        if self.waiting.front().is_some_and(|(front, _)| front == id) {
            self.pop_front();
        }
    }

    fn pop_front(&mut self) {
        if let Some((_, bytes)) = self.waiting.pop_front() {
            self.bytes -= bytes.len();
        }
    }

    /// Take response `id` out (it was deleted before it went out).
    fn remove(&mut self, id: &str) {
        self.waiting.retain(|(waiting, _)| waiting != id);
        self.bytes = self.waiting.iter().map(|(_, b)| b.len()).sum();
    }
}

/// The sharing thread's state.
#[derive(Clone)]
struct Worker {
    url: String,
    cluster: String,
    counts: Arc<SharedCounts>,
    stop: Arc<AtomicBool>,
    /// Responses kept while NATS was away (never locked across an await).
    outbox: Arc<std::sync::Mutex<Outbox>>,
    /// Held across each publish from the outbox, and by a delete before it takes its id
    /// out: a delete waits for a publish under way (else the purge could come first and
    /// the response outlive its delete), while queuing never waits on NATS.
    publishing: Arc<tokio::sync::Mutex<()>>,
}

/// What the operations need once NATS answered.
#[derive(Clone)]
struct Connected {
    client: async_nats::Client,
    js: jetstream::Context,
    stream: stream::Stream,
}

impl Worker {
    async fn run(
        self,
        mut queue: tokio::sync::mpsc::UnboundedReceiver<Request>,
        dropped: impl Fn(&str) + Send + 'static,
    ) {
        let options = async_nats::ConnectOptions::new()
            .retry_on_initial_connect()
            .name(format!("suffixd-responses-{}", self.cluster));
        let client = match options.connect(self.url.as_str()).await {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!("shared responses: cannot connect to {}: {e}", self.url);
                return;
            }
        };
        let started = std::time::Instant::now();
        let (ready, connected) = tokio::sync::watch::channel(None::<Connected>);
        let setup = self.set_up(client, ready, dropped);
        let serve = async {
            while let Some(request) = queue.recv().await {
                let (worker, mut connected) = (self.clone(), connected.clone());
                tokio::spawn(async move {
                    // A replica's first requests may come before NATS answered its first
                    // call (milliseconds when it is up): they wait for it, up to
                    // SHARED_WAIT after the start. Later, a NATS away fails at once.
                    let grace = SHARED_WAIT.saturating_sub(started.elapsed());
                    let just_up = tokio::time::timeout(grace, connected.wait_for(Option::is_some));
                    let current = match just_up.await {
                        Ok(Ok(current)) => current.clone(),
                        _ => None,
                    };
                    worker.answer(current, request).await;
                });
            }
        };
        let publish_queued = async {
            loop {
                tokio::time::sleep(OUTBOX_RETRY).await;
                let current = connected.borrow().clone();
                if let Some(c) = current {
                    self.publish_queued(&c).await;
                }
            }
        };
        tokio::select! {
            () = setup => {}
            () = serve => {}
            () = publish_queued => {}
            () = self.stopped() => {}
        }
    }

    /// Publish the outbox's responses, oldest first, while NATS takes them.
    async fn publish_queued(&self, c: &Connected) {
        let mut published = 0;
        while is_connected(c) {
            let _publishing = self.publishing.lock().await;
            let Some((id, bytes)) = self.outbox().front() else {
                break;
            };
            let put = || self.put(c, &id, bytes.clone());
            match self.again_on_a_new_stream(c, put).await {
                Ok(()) => published += 1,
                Err(e @ SharedError::TooLarge { .. }) => {
                    self.counts.failed.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!("response {id} kept on this replica only: {e}");
                }
                // Tried again later.
                Err(_) => break,
            }
            self.outbox().sent(&id);
        }
        if published > 0 {
            tracing::info!("shared responses: published {published} kept while NATS was away");
        }
    }

    /// Put response `id` in the outbox: NATS is away.
    fn queue(&self, id: String, bytes: Bytes) {
        let gone = self.outbox().push(id, bytes);
        self.counts.queued.fetch_add(1, Ordering::Relaxed);
        if gone > 0 {
            self.counts.failed.fetch_add(gone as u64, Ordering::Relaxed);
            tracing::warn!(
                "shared responses: the outbox is full (NATS away): {gone} of the oldest responses in it stay on this replica only"
            );
        }
    }

    /// The outbox, locked. A panic elsewhere while holding it leaves it whole (every
    /// change is one call on it).
    fn outbox(&self) -> std::sync::MutexGuard<'_, Outbox> {
        self.outbox
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    async fn stopped(&self) {
        while !self.stop.load(Ordering::Relaxed) {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Find or make the stream (retried until NATS answers), then apply the other
    /// replicas' deletes for as long as the thread runs.
    async fn set_up(
        &self,
        client: async_nats::Client,
        ready: tokio::sync::watch::Sender<Option<Connected>>,
        dropped: impl Fn(&str),
    ) {
        let js = jetstream::new(client.clone());
        let (stream, mut deletes) = loop {
            match self.open(&client, &js).await {
                Ok(opened) => break opened,
                Err(e) => {
                    tracing::warn!("shared responses: {e}; retrying");
                    tokio::time::sleep(RETRY).await;
                }
            }
        };
        ready.send_replace(Some(Connected { client, js, stream }));
        while let Some(message) = deletes.next().await {
            if let Ok(id) = std::str::from_utf8(&message.payload) {
                dropped(id);
                self.counts.dropped.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    async fn open(
        &self,
        client: &async_nats::Client,
        js: &jetstream::Context,
    ) -> Result<(stream::Stream, async_nats::Subscriber), String> {
        let stream = self.make_stream(js).await?;
        let deletes = client
            .subscribe(self.deletes_subject())
            .await
            .map_err(|e| format!("subscribing to deletes: {e}"))?;
        Ok((stream, deletes))
    }

    /// The responses stream, made if missing (an existing one keeps its settings).
    async fn make_stream(&self, js: &jetstream::Context) -> Result<stream::Stream, String> {
        js.get_or_create_stream(stream::Config {
            name: format!("{}_responses", self.cluster),
            subjects: vec![format!("{}.responses.*", self.cluster)],
            storage: stream::StorageType::File,
            max_messages_per_subject: 1,
            max_bytes: STREAM_BYTES,
            max_age: STREAM_AGE,
            discard: stream::DiscardPolicy::Old,
            allow_direct: true,
            ..Default::default()
        })
        .await
        .map_err(|e| format!("looking up the responses stream: {e}"))
    }

    fn subject(&self, id: &str) -> String {
        format!("{}.responses.{id}", self.cluster)
    }

    fn deletes_subject(&self) -> String {
        format!("{}.deleted-responses", self.cluster)
    }

    fn unavailable(&self, reason: impl std::fmt::Display) -> SharedError {
        SharedError::Unavailable {
            url: self.url.clone(),
            reason: reason.to_string(),
        }
    }

    /// Answer one request on `connected` (None: NATS has not answered yet).
    async fn answer(self, connected: Option<Connected>, request: Request) {
        // While NATS is away, fail at once rather than after SHARED_WAIT: every stored
        // response would wait that long otherwise.
        let connected = connected
            .ok_or("not connected yet")
            .and_then(|c| match is_connected(&c) {
                true => Ok(c),
                false => Err("disconnected, reconnecting"),
            });
        if let Request::Delete { id, .. } = &request {
            // Deleted before it went out: it never will.
            let _publishing = self.publishing.lock().await;
            self.outbox().remove(id);
        }
        let c = match connected {
            Ok(c) => c,
            Err(why) => {
                let not_yet = self.unavailable(why);
                match request {
                    Request::Put { id, bytes, done } => {
                        self.queue(id, Bytes::from(bytes));
                        drop(done.send(Ok(())));
                    }
                    Request::Get { done, .. } => drop(done.send(Err(not_yet))),
                    Request::Delete { done, .. } => drop(done.send(Err(not_yet))),
                }
                return;
            }
        };
        match request {
            Request::Put { id, bytes, done } => {
                let bytes = Bytes::from(bytes);
                let put = || self.put(&c, &id, bytes.clone());
                let answer = match self.again_on_a_new_stream(&c, put).await {
                    // The connection went while publishing: out when NATS is back.
                    Err(SharedError::Unavailable { .. }) if !is_connected(&c) => {
                        self.queue(id, bytes);
                        Ok(())
                    }
                    answer => answer,
                };
                let _ = done.send(answer);
            }
            Request::Get { id, done } => {
                let get = || self.get(&c, &id);
                let _ = done.send(self.again_on_a_new_stream(&c, get).await);
            }
            Request::Delete { id, done } => {
                let delete = || self.delete(&c, &id);
                let _ = done.send(self.again_on_a_new_stream(&c, delete).await);
            }
        }
    }

    /// `op`, and when NATS refused it, `op` once more after making the stream again: a
    /// NATS restarted without its storage (or an operator) may have removed it, and
    /// nothing else would make it again while this replica runs.
    async fn again_on_a_new_stream<T, F: Future<Output = Result<T, SharedError>>>(
        &self,
        c: &Connected,
        op: impl Fn() -> F,
    ) -> Result<T, SharedError> {
        match op().await {
            Err(SharedError::Unavailable { .. }) if self.make_stream(&c.js).await.is_ok() => {
                op().await
            }
            result => result,
        }
    }

    /// Publish response `id` and wait for JetStream's acknowledgement.
    async fn put(&self, c: &Connected, id: &str, bytes: Bytes) -> Result<(), SharedError> {
        let max_payload = c.client.server_info().max_payload;
        if max_payload > 0 && bytes.len() > max_payload {
            return Err(SharedError::TooLarge {
                bytes: bytes.len(),
                max_payload,
            });
        }
        let published = async { c.js.publish(self.subject(id), bytes).await?.await };
        published.await.map_err(|e| self.unavailable(e))?;
        self.counts.published.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// Response `id`'s bytes, if the stream holds it.
    async fn get(&self, c: &Connected, id: &str) -> Result<Option<Vec<u8>>, SharedError> {
        match c.stream.direct_get_last_for_subject(self.subject(id)).await {
            Ok(message) => {
                self.counts.fetched.fetch_add(1, Ordering::Relaxed);
                Ok(Some(message.payload.to_vec()))
            }
            Err(e) if e.kind() == stream::DirectGetErrorKind::NotFound => {
                self.counts.missing.fetch_add(1, Ordering::Relaxed);
                Ok(None)
            }
            Err(e) => Err(self.unavailable(e)),
        }
    }

    /// Purge response `id` from the stream and tell every replica (this one too) to
    /// drop its copy; whether the stream held it.
    async fn delete(&self, c: &Connected, id: &str) -> Result<bool, SharedError> {
        let purged = c
            .stream
            .purge()
            .filter(self.subject(id))
            .await
            .map_err(|e| self.unavailable(e))?;
        c.client
            .publish(
                self.deletes_subject(),
                Bytes::copy_from_slice(id.as_bytes()),
            )
            .await
            .map_err(|e| self.unavailable(e))?;
        // Published is only queued: flushed, the notice has left before the answer.
        c.client.flush().await.map_err(|e| self.unavailable(e))?;
        self.counts.deleted.fetch_add(1, Ordering::Relaxed);
        Ok(purged.purged > 0)
    }
}

/// Whether `c`'s client is connected now.
fn is_connected(c: &Connected) -> bool {
    c.client.connection_state() == async_nats::connection::State::Connected
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_outbox_keeps_the_newest_within_its_budget_in_order() {
        let bytes = |n: usize| Bytes::from(vec![b'x'; n]);
        let mut outbox = Outbox::new(10);
        assert_eq!(outbox.push("a".into(), bytes(4)), 0);
        assert_eq!(outbox.push("b".into(), bytes(4)), 0);
        assert_eq!(outbox.push("c".into(), bytes(4)), 1, "a goes");
        assert_eq!(outbox.front().map(|(id, _)| id), Some("b".into()));
        outbox.remove("c");
        assert_eq!((outbox.waiting.len(), outbox.bytes), (1, 4));
        outbox.sent("c");
        assert_eq!(outbox.waiting.len(), 1, "only the oldest is taken as sent");
        outbox.sent("b");
        assert_eq!((outbox.front(), outbox.bytes), (None, 0));
        assert_eq!(
            outbox.push("huge".into(), bytes(11)),
            1,
            "over the budget alone"
        );
        assert_eq!(outbox.bytes, 0);
    }

    #[test]
    fn only_ids_of_this_server_s_form_are_looked_up() {
        assert!(is_shareable_id(&format!("resp_{}", "0a".repeat(16))));
        for id in [
            "resp_",
            "resp_*",
            "resp_>",
            "resp_0a.0a",
            "msg_0123456789abcdef0123456789abcdef",
            &format!("resp_{}", "0a".repeat(17)),
            &format!("resp_{}zz", "0a".repeat(15)),
        ] {
            assert!(!is_shareable_id(id), "{id}");
        }
    }
}
