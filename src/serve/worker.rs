//! The model thread: it owns the engine and runs every request in flight together
//! (continuous batching). Each step is one forward pass over all of them: prefill
//! chunks for new requests, pending token + draft for the others, drafts cut to what the
//! cost curve says the whole batch gains. Requests join and leave between steps, the
//! waiting ones taking free slots in turn by namespace ([`FairQueue`]); a client that
//! goes away frees its slot at the next step. Each request drafts from the
//! store's view of its namespace. Completed requests go to a store writer thread, so
//! that WAL writes, fsyncs and budget evictions never hold up a step. tokio handles the
//! I/O; the model never runs on tokio's workers (the quantized matmul spins its own
//! thread pool).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use tokio::sync::{mpsc, oneshot};

use crate::engine::grammar::{GRAMMAR_IDLE, GrammarCompiler};
use crate::engine::{Drafter, Engine, GenerateOptions, Generation, Sequence, TokenLogprob};
use crate::model::forward::ModelError;
use crate::speculate::SpecParams;
use crate::store::live::Store;

use super::fair::{FairQueue, WaitingTicket};
use super::metrics::Metrics;
use crate::drafting::{CacheDrafter, NamespaceSource};

/// One request for the model thread.
pub struct Job {
    /// Prompt token ids.
    pub prompt: Vec<u32>,
    /// Generation options, with the namespace to draft from, to learn into, and whose
    /// cached prompt prefixes to reuse.
    pub opts: GenerateOptions,
    /// The client's prediction of the answer, tokenized (empty: none): drafted from,
    /// never forced.
    pub prediction: Arc<[u32]>,
    /// New tokens as they are accepted.
    pub tokens: mpsc::UnboundedSender<Delta>,
    /// The result.
    pub done: oneshot::Sender<Result<Generation, JobError>>,
    /// Its place among its namespace's waiting requests, given back when it gets a
    /// slot in the batch.
    pub waiting: Option<WaitingTicket>,
}

/// What a running job's answer gained in one step: the text of the tokens accepted
/// (decoded once, by the engine), with their log-probabilities when the job's options
/// ask for them (else empty).
pub struct Delta {
    /// The text the new tokens add (empty while a character waits for its last token).
    pub text: String,
    /// The new tokens' log-probabilities.
    pub logprobs: Vec<TokenLogprob>,
}

/// Signs of the model thread's progress, for `/health` and `/ready`: when it last
/// finished a step or an idle wait, and whether it has stopped.
#[derive(Debug)]
pub struct Liveness {
    origin: Instant,
    /// Milliseconds from `origin` to the last sign.
    beat_ms: AtomicU64,
    stopped: AtomicBool,
}

/// Longest idle wait of the model thread between signs of life.
const IDLE_BEAT: Duration = Duration::from_millis(500);

impl Liveness {
    /// A thread that shows a sign of life now.
    pub fn new() -> Self {
        Liveness {
            origin: Instant::now(),
            beat_ms: AtomicU64::new(0),
            stopped: AtomicBool::new(false),
        }
    }

    /// A sign of life.
    pub fn beat(&self) {
        let ms = self.origin.elapsed().as_millis() as u64;
        self.beat_ms.store(ms, Ordering::Relaxed);
    }

    /// The thread has ended.
    pub fn stop(&self) {
        self.stopped.store(true, Ordering::Relaxed);
    }

    /// Time since the last sign of life; None once the thread has ended.
    pub fn since_beat(&self) -> Option<Duration> {
        if self.stopped.load(Ordering::Relaxed) {
            return None;
        }
        let now = self.origin.elapsed().as_millis() as u64;
        Some(Duration::from_millis(
            now.saturating_sub(self.beat_ms.load(Ordering::Relaxed)),
        ))
    }
}

impl Default for Liveness {
    fn default() -> Self {
        Self::new()
    }
}

/// Why a job ended without a generation.
#[derive(Clone, Debug, thiserror::Error)]
pub enum JobError {
    /// The request cannot run as given: the client's to fix (an answer 400).
    #[error("{0}")]
    Rejected(String),
    /// The model failed on this request (an answer 500). The client gets only the
    /// incident number: the error itself, which may carry a backtrace and source paths,
    /// goes to the server log under it.
    #[error("the model failed on this request; the server log has the details under incident {0}")]
    Failed(u64),
}

impl JobError {
    /// Log a model error under a fresh incident number.
    fn failed(what: &str, e: &ModelError) -> Self {
        static INCIDENTS: AtomicU64 = AtomicU64::new(1);
        let incident = INCIDENTS.fetch_add(1, Ordering::Relaxed);
        tracing::error!("incident {incident}: {what}: {e}");
        JobError::Failed(incident)
    }
}

/// A request in the batch.
struct Slot<'a> {
    seq: Sequence,
    drafter: CacheDrafter<NamespaceSource<'a>>,
    job: Job,
}

/// A completed request on its way to the store writer.
struct Completed {
    namespace: String,
    generation: Generation,
    done: oneshot::Sender<Result<Generation, JobError>>,
}

/// Run jobs until the channel closes and the last request in flight is done, at most
/// `intake.max_batch` at a time. Completed requests go to a store writer thread, which appends
/// them (WAL write, fsync, budget evictions) and only then answers: the model thread
/// never waits for the disk, and an answer still means its response is durable. Returns
/// once the writer has written every completed request.
pub fn run(
    engine: Engine,
    store: Arc<Store>,
    params: SpecParams,
    metrics: Arc<Metrics>,
    intake: Intake<'_>,
) {
    let (to_writer, completed) = crossbeam::channel::unbounded::<Completed>();
    std::thread::scope(|scope| {
        let writer = std::thread::Builder::new()
            .name("store-writer".into())
            .spawn_scoped(scope, || {
                for c in completed {
                    store_completed(&store, &metrics, c);
                }
            });
        if let Err(e) = writer {
            // The receiver went with the closure: every handover fails and is written
            // on the model thread instead, as before the writer existed.
            tracing::error!(
                "cannot start the store writer thread ({e}); appending on the model thread"
            );
        }
        step_jobs(engine, &store, params, &metrics, intake, &to_writer);
        drop(to_writer);
    });
}

/// Start `job`: its sequence and its drafter over its namespace. A job the engine
/// refuses is answered here (400 for a bad prompt, 500 otherwise) and gives no slot.
fn admit<'a>(
    engine: &mut Engine,
    store: &'a Store,
    params: SpecParams,
    mut job: Job,
) -> Option<Slot<'a>> {
    job.waiting = None;
    match engine.start(&job.prompt, &job.opts) {
        Ok(seq) => {
            let source = NamespaceSource {
                store,
                namespace: job.opts.namespace.clone(),
            };
            Some(Slot {
                seq,
                drafter: CacheDrafter::new(source, params, &job.prompt).predicting(&job.prediction),
                job,
            })
        }
        Err(e @ (ModelError::BadPrompt(_) | ModelError::ContextFull { .. })) => {
            let _ = job.done.send(Err(JobError::Rejected(e.to_string())));
            None
        }
        Err(e) => {
            let _ = job.done.send(Err(JobError::failed("start", &e)));
            None
        }
    }
}

/// Where the model thread's jobs come from and what it keeps while it waits for them.
pub struct Intake<'a> {
    /// The queue of admitted requests.
    pub jobs: crossbeam::channel::Receiver<Job>,
    /// How many run together at most.
    pub max_batch: usize,
    /// Beaten between steps and while waiting for jobs.
    pub liveness: &'a Liveness,
    /// The requests' grammar cache, whose unused grammars the idle thread forgets.
    pub grammars: Option<GrammarCompiler>,
    /// Kept at the number of jobs taken off the queue that wait for a slot.
    pub waiting: Arc<AtomicUsize>,
}

/// The model thread's loop: admit jobs, step them together, stream what they gained,
/// hand completed ones over.
fn step_jobs(
    mut engine: Engine,
    store: &Store,
    params: SpecParams,
    metrics: &Metrics,
    intake: Intake<'_>,
    to_writer: &crossbeam::channel::Sender<Completed>,
) {
    let Intake {
        jobs,
        max_batch,
        liveness,
        grammars,
        waiting,
    } = intake;
    let mut slots: Vec<Slot<'_>> = Vec::new();
    // Jobs taken off the channel that wait for a slot, by namespace.
    let mut waiting = FairQueue::new(waiting);
    let mut open = true;
    // Whether a job came since the heap was last trimmed.
    let mut served = false;
    let mut published_prefix = engine.prefix_cache_stats();
    metrics.publish_prefix_cache(published_prefix);
    loop {
        liveness.beat();
        // Everything queued joins the waiting (the thread waits for a job only when it
        // has nothing to do), then free slots go to the waiting in turn by namespace.
        while open {
            match next_job(&jobs, slots.is_empty() && waiting.is_empty()) {
                Ok(job) => {
                    served = true;
                    let namespace = job.opts.namespace.clone();
                    waiting.push(&namespace, job);
                }
                Err(crossbeam::channel::TryRecvError::Empty) => break,
                Err(crossbeam::channel::TryRecvError::Disconnected) => open = false,
            }
        }
        while slots.len() < max_batch.max(1)
            && let Some(job) = waiting.pop()
        {
            slots.extend(admit(&mut engine, store, params, job));
        }
        if slots.is_empty() {
            if !open && waiting.is_empty() {
                return;
            }
            // Idle for a beat: forget grammars no one asks for any more, and after work
            // give the heap it freed back (glibc would keep the pages resident, per
            // thread arena).
            let forgotten = grammars
                .as_ref()
                .map_or(0, |g| g.forget_unused(GRAMMAR_IDLE));
            if served || forgotten > 0 {
                crate::memory::trim();
                served = false;
            }
            continue;
        }
        for slot in &mut slots {
            if slot.job.tokens.is_closed() {
                slot.seq.cancel();
            }
        }
        // Tests make the model thread panic here (FAILPOINTS=model-step=panic, in a
        // build with the `fail` crate's failpoints, which the test build turns on).
        fail::fail_point!("model-step");
        step_batch(&mut engine, metrics, &mut slots);
        stream_new_tokens(&mut slots);
        hand_over_finished(&mut engine, store, metrics, to_writer, &mut slots);
        // Its counters change only when requests start, finish prefill or finish.
        let prefix = engine.prefix_cache_stats();
        if prefix != published_prefix {
            metrics.publish_prefix_cache(prefix);
            published_prefix = prefix;
        }
    }
}

/// The next job: when `idle`, waiting up to [`IDLE_BEAT`] for one (so the thread shows
/// signs of life between waits); otherwise only one already queued.
fn next_job(
    jobs: &crossbeam::channel::Receiver<Job>,
    idle: bool,
) -> Result<Job, crossbeam::channel::TryRecvError> {
    use crossbeam::channel::{RecvTimeoutError, TryRecvError};
    if !idle {
        return jobs.try_recv();
    }
    jobs.recv_timeout(IDLE_BEAT).map_err(|e| match e {
        RecvTimeoutError::Timeout => TryRecvError::Empty,
        RecvTimeoutError::Disconnected => TryRecvError::Disconnected,
    })
}

/// One forward pass over every slot. When the pass as a whole fails, each request is
/// stepped alone: those that fail alone are answered and dropped, the others go on. A
/// failed pass commits nothing to a cache, so stepping each again is safe.
fn step_batch(engine: &mut Engine, metrics: &Metrics, slots: &mut Vec<Slot<'_>>) {
    let result = {
        let mut batch: Vec<(&mut Sequence, &mut dyn Drafter)> = slots
            .iter_mut()
            .map(|s| (&mut s.seq, &mut s.drafter as &mut dyn Drafter))
            .collect();
        engine.step(&mut batch)
    };
    let e = match result {
        Ok(report) => {
            metrics.record_step(&report);
            metrics.publish_cost_curve(engine.cost_curve());
            return;
        }
        Err(e) => e,
    };
    tracing::warn!(
        "a batched step of {} requests failed ({e}); stepping each alone",
        slots.len()
    );
    let mut i = 0;
    while i < slots.len() {
        let slot = &mut slots[i];
        match engine.step(&mut [(&mut slot.seq, &mut slot.drafter as &mut dyn Drafter)]) {
            Ok(report) => {
                metrics.record_step(&report);
                i += 1;
            }
            Err(e) => {
                let slot = slots.swap_remove(i);
                let _ = slot.job.done.send(Err(JobError::failed("step", &e)));
            }
        }
    }
}

/// Send each request's client the text its step accepted; a client gone away cancels
/// its request.
fn stream_new_tokens(slots: &mut [Slot<'_>]) {
    for slot in slots {
        let new = slot.seq.take_new();
        if new.tokens.is_empty() {
            continue;
        }
        let delta = Delta {
            text: new.text.to_string(),
            logprobs: new.logprobs.to_vec(),
        };
        if slot.job.tokens.send(delta).is_err() {
            slot.seq.cancel();
        }
    }
}

/// Take the finished requests out of the batch and hand them to the store writer (or,
/// when it is gone, append and answer here). A request whose grammar failed is refused
/// with the reason and not learned from.
fn hand_over_finished(
    engine: &mut Engine,
    store: &Store,
    metrics: &Metrics,
    to_writer: &crossbeam::channel::Sender<Completed>,
    slots: &mut Vec<Slot<'_>>,
) {
    let mut i = 0;
    while i < slots.len() {
        if !slots[i].seq.is_finished() {
            i += 1;
            continue;
        }
        let slot = slots.swap_remove(i);
        let generation = engine.finish(slot.seq);
        if let Some(why) = &generation.grammar_failure {
            tracing::warn!("a request's grammar failed: {why}");
            let _ = slot.job.done.send(Err(JobError::Rejected(format!(
                "the response format or tool schemas are more than the grammar engine can run ({why}); simplify the schema"
            ))));
            continue;
        }
        let t = Instant::now();
        let c = Completed {
            namespace: slot.job.opts.namespace,
            generation,
            done: slot.job.done,
        };
        if let Err(crossbeam::channel::SendError(c)) = to_writer.send(c) {
            store_completed(store, metrics, c);
        }
        let handover = t.elapsed().as_secs_f64();
        metrics.record_store_handover(handover);
        tracing::debug!(
            handover_us = handover * 1e6,
            "completed request handed over"
        );
    }
}

/// Record a completed generation, cache its response (unless it was cut short by a
/// client that went away: half an answer would teach the cache a wrong ending), then
/// answer. A response the store refuses is still answered: the cache is an optimisation,
/// and the refusal is logged and counted (`append_failures`).
fn store_completed(store: &Store, metrics: &Metrics, c: Completed) {
    let Completed {
        namespace,
        generation: g,
        done,
    } = c;
    metrics.record_generation(&namespace, &g);
    if !g.tokens.is_empty() && g.finish_reason != crate::engine::FinishReason::Cancelled {
        let t = Instant::now();
        if let Err(e) = store.append(&namespace, &g.tokens) {
            tracing::error!("cannot cache a completed response: {e}");
        }
        metrics.record_store_append(t.elapsed().as_secs_f64());
    }
    let _ = done.send(Ok(g));
}
