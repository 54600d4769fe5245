//! The model thread: it owns the engine and runs one request at a time, drafting from
//! the store's view of the request's namespace. tokio handles the I/O; the model never
//! runs on tokio's workers (the quantized matmul spins its own thread pool).

use std::sync::Arc;

use tokio::sync::{mpsc, oneshot};

use crate::speculate::{Draft, SpecParams, Speculator};
use crate::store::LayeredCursor;
use crate::store::live::Store;
use crate::tree::{GlobalIndex, GlobalTree, RequestTree};
use crate::verify::engine::{Drafter, Engine, GenerateOptions, Generation};

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
    pub done: oneshot::Sender<Result<Generation, String>>,
}

/// Drafts from the store: the namespace's base + delta − evicted view, read under the
/// store's read lock for the duration of one draft.
struct StoreDrafter<'a> {
    store: &'a Store,
    namespace: &'a str,
    params: SpecParams,
    speculator: Speculator<LayeredCursor>,
    empty: GlobalTree,
}

impl Drafter for StoreDrafter<'_> {
    fn draft(&mut self, request: &RequestTree, context: &[u32]) -> Draft {
        let state = self.store.read();
        match state.namespaces.get(self.namespace) {
            Some(ns) => self
                .speculator
                .speculate(Some(request), &ns.view(), context, &self.params),
            None => {
                let view = crate::store::Layered::new(None, &self.empty, &self.empty);
                self.speculator
                    .speculate(Some(request), &view, context, &self.params)
            }
        }
    }

    /// A draft from the cache was (partly) accepted: mark a sequence that holds the
    /// accepted continuation as used, for LRU eviction.
    fn accepted(&mut self, context: &[u32], draft: &Draft, accepted: usize) {
        use crate::speculate::DraftSource;
        if accepted == 0 || !matches!(draft.source, DraftSource::Global | DraftSource::Both) {
            return;
        }
        let id = {
            let state = self.store.read();
            let Some(ns) = state.namespaces.get(self.namespace) else {
                return;
            };
            let view = ns.view();
            // The longest tail of the context that the cache holds.
            let longest = self.params.max_depth.min(context.len());
            (1..=longest)
                .rev()
                .find_map(|p| view.walk(&context[context.len() - p..]))
                .and_then(|c| view.sequence_at(&c))
        };
        if let Some(id) = id {
            self.store.touch(self.namespace, &[id]);
        }
    }
}

/// Run jobs until the channel closes. Completed responses go to the store.
pub fn run(
    mut engine: Engine,
    store: Arc<Store>,
    params: SpecParams,
    metrics: Arc<Metrics>,
    jobs: crossbeam::channel::Receiver<Job>,
) {
    let empty = GlobalTree::new(params.max_depth).expect("valid depth");
    while let Ok(job) = jobs.recv() {
        let mut drafter = StoreDrafter {
            store: &store,
            namespace: &job.namespace,
            params,
            speculator: Speculator::default(),
            empty: empty.clone(),
        };
        let sender = job.tokens.clone();
        let mut on_tokens = |new: &[u32]| sender.send(new.to_vec()).is_ok();
        let result = engine.generate(&job.prompt, &job.opts, &mut drafter, &mut on_tokens);
        let result = match result {
            Ok(g) => {
                metrics.record_generation(&g);
                if !g.tokens.is_empty()
                    && let Err(e) = store.append(&job.namespace, &g.tokens)
                {
                    tracing::error!("cannot cache a completed response: {e}");
                }
                Ok(g)
            }
            Err(e) => Err(e.to_string()),
        };
        let _ = job.done.send(result);
    }
}
