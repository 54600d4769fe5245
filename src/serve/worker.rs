//! The model thread: it owns the engine and runs every request in flight together
//! (continuous batching). Each step is one forward pass over all of them: prefill
//! chunks for new requests, pending token + draft for the others, drafts cut to what the
//! cost curve says the whole batch gains. Requests join and leave between steps; a
//! client that goes away frees its slot at the next step. Each request drafts from the
//! store's view of its namespace. tokio handles the I/O; the model never runs on tokio's
//! workers (the quantized matmul spins its own thread pool).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use tokio::sync::{mpsc, oneshot};

use crate::speculate::SpecParams;
use crate::store::live::Store;
use crate::tree::GlobalTree;
use crate::verify::engine::{Drafter, Engine, GenerateOptions, Generation, Sequence};
use crate::verify::model::ModelError;

use super::drafter::{CacheDrafter, NamespaceSource};
use super::metrics::Metrics;

/// One request for the model thread.
pub struct Job {
    /// Prompt token ids.
    pub prompt: Vec<u32>,
    /// Generation options.
    pub opts: GenerateOptions,
    /// The namespace to draft from and to learn into.
    pub namespace: String,
    /// New tokens as they are accepted.
    pub tokens: mpsc::UnboundedSender<Vec<u32>>,
    /// The result.
    pub done: oneshot::Sender<Result<Generation, JobError>>,
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

/// Run jobs until the channel closes and the last request in flight is done, at most
/// `max_batch` at a time. Completed responses go to the store.
pub fn run(
    mut engine: Engine,
    store: Arc<Store>,
    params: SpecParams,
    metrics: Arc<Metrics>,
    jobs: crossbeam::channel::Receiver<Job>,
    max_batch: usize,
) {
    let empty = GlobalTree::new(params.max_depth).expect("valid depth");
    let mut slots: Vec<Slot<'_>> = Vec::new();
    let mut open = true;
    loop {
        // Admit: wait for work when idle, otherwise take what is queued.
        while open && slots.len() < max_batch.max(1) {
            let next = if slots.is_empty() {
                jobs.recv()
                    .map_err(|_| crossbeam::channel::TryRecvError::Disconnected)
            } else {
                jobs.try_recv()
            };
            match next {
                Ok(job) => match engine.start(&job.prompt, &job.opts) {
                    Ok(seq) => {
                        let source = NamespaceSource {
                            store: &store,
                            namespace: job.namespace.clone(),
                            empty: &empty,
                        };
                        slots.push(Slot {
                            seq,
                            drafter: CacheDrafter::new(source, params, &job.prompt),
                            job,
                        });
                    }
                    Err(e @ (ModelError::BadPrompt(_) | ModelError::ContextFull { .. })) => {
                        let _ = job.done.send(Err(JobError::Rejected(e.to_string())));
                    }
                    Err(e) => {
                        let _ = job.done.send(Err(JobError::failed("start", &e)));
                    }
                },
                Err(crossbeam::channel::TryRecvError::Empty) => break,
                Err(crossbeam::channel::TryRecvError::Disconnected) => open = false,
            }
        }
        if slots.is_empty() {
            if open {
                continue;
            }
            return;
        }
        for slot in &mut slots {
            if slot.job.tokens.is_closed() {
                slot.seq.cancel();
            }
        }
        let result = {
            let mut batch: Vec<(&mut Sequence, &mut dyn Drafter)> = slots
                .iter_mut()
                .map(|s| (&mut s.seq, &mut s.drafter as &mut dyn Drafter))
                .collect();
            engine.step(&mut batch)
        };
        match result {
            Ok(report) => {
                metrics.record_step(&report);
                metrics.publish_cost_curve(engine.cost_curve());
            }
            Err(e) => {
                // The pass as a whole failed: find which requests fail alone, answer
                // those, and let the others go on. A failed pass commits nothing to a
                // cache, so stepping each again is safe.
                tracing::warn!(
                    "a batched step of {} requests failed ({e}); stepping each alone",
                    slots.len()
                );
                let mut i = 0;
                while i < slots.len() {
                    let slot = &mut slots[i];
                    let alone =
                        engine.step(&mut [(&mut slot.seq, &mut slot.drafter as &mut dyn Drafter)]);
                    match alone {
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
        }
        for slot in &mut slots {
            let new = slot.seq.take_new_tokens();
            if !new.is_empty() && slot.job.tokens.send(new.to_vec()).is_err() {
                slot.seq.cancel();
            }
        }
        let mut i = 0;
        while i < slots.len() {
            if !slots[i].seq.is_finished() {
                i += 1;
                continue;
            }
            let slot = slots.swap_remove(i);
            let g = engine.finish(slot.seq);
            finish(&store, &metrics, &slot.job.namespace, &g);
            let _ = slot.job.done.send(Ok(g));
        }
    }
}

/// Record a finished generation and cache its response (unless it was cut short by a
/// client that went away: half an answer would teach the cache a wrong ending).
fn finish(store: &Store, metrics: &Metrics, namespace: &str, g: &Generation) {
    metrics.record_generation(g);
    if !g.tokens.is_empty()
        && g.finish_reason != crate::verify::engine::FinishReason::Cancelled
        && let Err(e) = store.append(namespace, &g.tokens)
    {
        tracing::error!("cannot cache a completed response: {e}");
    }
}
