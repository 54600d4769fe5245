//! The drafter every generation path uses (`serve`, `generate`, `bench`): one request's
//! own suffix tree, speculation parameters and reused speculation state, over a view of
//! the shared cache.
//!
//! It builds the request tree from the prompt with the depth the parameters ask for
//! ([`SpecParams::request_depth`]), exactly as `simulate` does, so a mode drafts the same
//! in the server as in the simulator.

use crate::engine::Drafter;
use crate::speculate::{Draft, DraftSource, SpecParams, Speculator};
use crate::store::live::Store;
use crate::store::{Layered, LayeredCursor};
use crate::tree::{GlobalIndex, RequestTree};

/// Lends a drafter the shared cache for the span of one call.
pub trait CacheSource {
    /// Runs `f` over the cache as it stands now.
    fn with_view<R>(&self, f: impl FnOnce(&Layered<'_>) -> R) -> R;

    /// A draft from the cache was (partly) accepted, and `path` is the cache path behind
    /// the accepted tokens ([`Draft::supporting_path`]): a source that evicts by last use
    /// marks a sequence that holds it.
    fn used(&self, _path: &[u32]) {}
}

/// A fixed view: a snapshot's namespace, an in-memory tree, or nothing.
impl CacheSource for Layered<'_> {
    fn with_view<R>(&self, f: impl FnOnce(&Layered<'_>) -> R) -> R {
        f(self)
    }
}

/// One namespace of the live store, read under the store's read lock for one call at a
/// time; a namespace that does not exist (yet) reads as empty.
pub struct NamespaceSource<'a> {
    /// The store.
    pub store: &'a Store,
    /// The namespace to draft from.
    pub namespace: String,
}

impl CacheSource for NamespaceSource<'_> {
    fn with_view<R>(&self, f: impl FnOnce(&Layered<'_>) -> R) -> R {
        self.store.with_view(&self.namespace, f)
    }

    /// Marks a cached sequence that holds `path` (its last tokens up to the trees' depth,
    /// where a draft read on past it) as used, for LRU eviction. A path the cache does not
    /// hold (accepted tokens that came from the request's own tree, or a grammar) marks
    /// nothing.
    fn used(&self, path: &[u32]) {
        let id = self.store.with_namespace(&self.namespace, |ns| {
            let view = ns?.view();
            let path = &path[path.len().saturating_sub(view.max_depth())..];
            view.walk(path).and_then(|c| view.sequence_at(&c))
        });
        if let Some(id) = id {
            self.store.touch(&self.namespace, &[id]);
        }
    }
}

/// Drafts for one request from its own suffix tree and the shared cache, and from the
/// client's prediction of the answer when it sent one.
pub struct CacheDrafter<S> {
    source: S,
    params: SpecParams,
    request: RequestTree,
    speculator: Speculator<LayeredCursor>,
    prediction: Option<Prediction>,
}

/// How many of the prompt's last tokens go before the prediction in its tree: the
/// template's opening of the answer (`<|im_start|>assistant\n` is 3 tokens), so that
/// the first step, whose context ends with them, drafts the prediction from its start.
const PREDICTION_LEAD: usize = 8;

/// The fewest context tokens a prediction's draft must match. A token or two found once
/// in an unrelated prediction would draft a whole budget of it (a context that occurs
/// once is a copy to the trees: [`Speculator`]'s extended mode), in place of the trees'
/// better drafts; three tokens in order rarely occur by chance, and after an edit the
/// answer's next tokens are back in the prediction within as many.
const PREDICTION_MIN_MATCH: usize = 3;

/// The client's guess at the answer (OpenAI's Predicted Outputs): a suffix tree of its
/// own over the prompt's last tokens and the prediction, matched against the context
/// like the request's tree. A prediction is usually the answer with a few edits (a file
/// to be rewritten), so its drafts follow it where the answer agrees, and find their
/// place again a few tokens after an edit, where the answer's last tokens occur in it.
/// Its drafts are [`DraftSource::Prediction`]: calibrated on their own, and counted
/// apart (`accepted_prediction_tokens`).
struct Prediction {
    tree: RequestTree,
    speculator: Speculator<LayeredCursor>,
}

impl<S: CacheSource> CacheDrafter<S> {
    /// A drafter for the request that starts with `prompt`.
    pub fn new(source: S, params: SpecParams, prompt: &[u32]) -> Self {
        CacheDrafter {
            source,
            params,
            request: RequestTree::new(prompt, params.request_depth()),
            speculator: Speculator::default(),
            prediction: None,
        }
    }

    /// Draft from `prediction` too, the client's guess at the answer (its tokens); an
    /// empty one changes nothing. Drafts only: the answer stays the model's.
    pub fn predicting(mut self, prediction: &[u32]) -> Self {
        if prediction.is_empty() {
            return self;
        }
        let prompt = self.request.tokens();
        let lead = &prompt[prompt.len().saturating_sub(PREDICTION_LEAD)..];
        let tokens = [lead, prediction].concat();
        self.prediction = Some(Prediction {
            tree: RequestTree::new(&tokens, self.params.request_depth()),
            speculator: Speculator::default(),
        });
        self
    }

    /// Add the tokens of `context` that the request tree does not hold yet. A context
    /// shorter than what the tree holds, or one whose last held token differs (a caller
    /// that broke the contract), restarts the tree from it, so that drafts stay drafts of
    /// this context. Comparing every held token would cost more than a draft on long
    /// prompts, so only debug builds do.
    fn catch_up(&mut self, context: &[u32]) {
        let held = self.request.tokens();
        let extends = context.len() >= held.len()
            && held.last().is_none_or(|&t| context[held.len() - 1] == t);
        if !extends {
            self.request = RequestTree::new(context, self.params.request_depth());
            return;
        }
        debug_assert_eq!(
            &context[..held.len()],
            held,
            "each context extends the last"
        );
        let new = &context[held.len()..];
        if !new.is_empty() {
            self.request.extend(new);
        }
    }
}

impl Prediction {
    fn draft(&mut self, context: &[u32], params: &SpecParams) -> Draft {
        let mut draft = self
            .speculator
            .speculate_request(&self.tree, context, params);
        if draft.match_len < PREDICTION_MIN_MATCH {
            return Draft::default();
        }
        draft.source = DraftSource::Prediction;
        draft
    }
}

impl<S: CacheSource> Drafter for CacheDrafter<S> {
    fn draft(&mut self, context: &[u32]) -> Draft {
        self.catch_up(context);
        let CacheDrafter {
            source,
            params,
            request,
            speculator,
            prediction,
        } = self;
        let predicted = prediction.as_mut().map(|p| p.draft(context, params));
        let drafted =
            source.with_view(|view| speculator.speculate(Some(request), view, context, params));
        // Both are often whole copies, which score alike (a stretch found once is copied
        // with the full budget). Then the longer match is the better evidence: a stale
        // prediction matches only since its last difference from the answer, a prompt
        // with numbered lines only since the line's start. On a tie the prediction wins.
        match predicted {
            Some(d)
                if !d.is_empty()
                    && (d.score, d.match_len) >= (drafted.score, drafted.match_len) =>
            {
                d
            }
            _ => drafted,
        }
    }

    fn accepted(&mut self, context: &[u32], draft: &Draft, accepted: usize) {
        if accepted > 0 && matches!(draft.source, DraftSource::Global | DraftSource::Both) {
            self.source.used(draft.supporting_path(context, accepted));
        }
    }
}

#[cfg(test)]
mod tests {
    use std::path::{Path, PathBuf};

    use super::*;
    use crate::corpus::read_examples;
    use crate::simulate::{SimulateConfig, simulate};
    use crate::speculate::SpecMode;
    use crate::tree::GlobalTree;

    const TEST_REQUESTS: usize = 80;

    fn example(name: &str) -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("examples/data")
            .join(name)
    }

    /// Steps, drafted and accepted tokens of teacher-forced generation, as `simulate`
    /// runs it: each step drafts, keeps what the draft shares with the true response,
    /// then takes the next true token.
    fn replay(drafter: &mut dyn Drafter, prompt: &[u32], truth: &[u32]) -> [u64; 3] {
        let mut context = prompt.to_vec();
        let mut pos = 0;
        let mut counts = [0u64; 3];
        while pos < truth.len() {
            let draft = drafter.draft(&context);
            let mut new = draft.accept(&truth[pos..]);
            counts[1] += draft.len() as u64;
            counts[2] += new.len() as u64;
            if pos + new.len() < truth.len() {
                new.push(truth[pos + new.len()]);
            }
            pos += new.len();
            context.extend_from_slice(&new);
            counts[0] += 1;
        }
        counts
    }

    /// The server's drafter drafts what the simulator drafts, in both modes and both
    /// shapes: paper mode once built the server's request tree without the paper's depth
    /// limit.
    #[test]
    fn the_drafter_drafts_what_simulate_drafts_in_every_mode() {
        let (warm, test) = (example("warm.jsonl.zst"), example("test.jsonl.zst"));
        for mode in [SpecMode::Paper, SpecMode::Extended] {
            for tree in [false, true] {
                let params = SpecParams {
                    mode,
                    tree,
                    ..SpecParams::default()
                };
                let report = simulate(
                    &SimulateConfig {
                        warm: Some(warm.clone()),
                        warm_limit: None,
                        test: test.clone(),
                        test_limit: Some(TEST_REQUESTS),
                        params,
                        max_cached_requests: usize::MAX,
                        online: false,
                        prompt_tree: true,
                        snapshot: None,
                        replay_timing: false,
                    },
                    |_| {},
                )
                .unwrap();
                let mut global = GlobalTree::new(params.max_depth).unwrap();
                for (id, ex) in read_examples(&warm, None).unwrap().enumerate() {
                    global.insert(id as u64, &ex.unwrap().response).unwrap();
                }
                let evicted = GlobalTree::new(params.max_depth).unwrap();
                let mut counts = [0u64; 3];
                for ex in read_examples(&test, Some(TEST_REQUESTS)).unwrap() {
                    let ex = ex.unwrap();
                    if ex.response.is_empty() {
                        continue;
                    }
                    let view = Layered::new(None, &global, &evicted);
                    let mut drafter = CacheDrafter::new(view, params, &ex.prompt);
                    let c = replay(&mut drafter, &ex.prompt, &ex.response);
                    counts.iter_mut().zip(c).for_each(|(total, c)| *total += c);
                }
                let simulated = [report.steps, report.drafted_tokens, report.accepted_tokens];
                assert_eq!(
                    counts, simulated,
                    "{mode:?}, tree {tree}: steps, drafted, accepted"
                );
                assert!(
                    report.accepted_tokens > 1000,
                    "{mode:?}: drafts were accepted"
                );
            }
        }
    }

    /// An accepted draft from the live store marks the sequence behind it as used, so
    /// that budget eviction takes another first (without the mark the oldest goes).
    #[test]
    fn an_accepted_cache_draft_keeps_the_sequence_behind_it_from_eviction() {
        use std::sync::Arc;
        use std::time::Duration;

        use crate::store::live::StoreConfig;
        use crate::store::{EvictScope, RamDirectory, TokenizerId};

        // Room for two 6-token sequences: a third evicts the least recently used.
        let store = Store::open(StoreConfig {
            budget_tokens: Some(12),
            directory: Arc::new(RamDirectory::new()),
            ..StoreConfig::new("/store", TokenizerId::UNKNOWN)
        })
        .unwrap();
        let behind = store.append("ns", &[10, 11, 12, 13, 14, 15]).unwrap();
        std::thread::sleep(Duration::from_millis(5));
        let other = store.append("ns", &[20, 21, 22, 23, 24, 25]).unwrap();
        std::thread::sleep(Duration::from_millis(5));

        let source = NamespaceSource {
            store: &store,
            namespace: "ns".into(),
        };
        let prompt = [5, 12, 13];
        let mut drafter = CacheDrafter::new(source, SpecParams::default(), &prompt);
        let draft = drafter.draft(&prompt);
        assert_eq!(draft.source, DraftSource::Global);
        assert_eq!((&draft.tokens[..], draft.match_len), (&[14, 15][..], 2));
        let context = [5, 12, 13, 14, 15];
        assert_eq!(draft.supporting_path(&context, 2), [12, 13, 14, 15]);
        drafter.accepted(&context, &draft, 2);

        store.append("ns", &[30, 31, 32, 33, 34, 35]).unwrap();
        assert_eq!(
            store.evict(&EvictScope::id("ns", other)).unwrap(),
            0,
            "the sequence no draft used went first"
        );
        assert_eq!(
            store.evict(&EvictScope::id("ns", behind)).unwrap(),
            1,
            "the sequence behind the accepted draft stayed"
        );
    }

    /// A context that does not extend the last one restarts the request tree rather than
    /// drafting from a tree of another text.
    #[test]
    fn a_context_that_does_not_extend_the_last_restarts_the_request_tree() {
        let empty = GlobalTree::new(24).unwrap();
        let params = SpecParams::default();
        let prompt: Vec<u32> = [1, 2, 3, 4, 5].repeat(4);
        let mut drafter = CacheDrafter::new(Layered::new(None, &empty, &empty), params, &prompt);
        assert_eq!(drafter.draft(&prompt).tokens[..3], [1, 2, 3]);
        let other: Vec<u32> = [7, 8, 9].repeat(4);
        assert_eq!(drafter.draft(&other).tokens[..3], [7, 8, 9]);
        assert_eq!(drafter.request.tokens(), &other[..]);
    }

    /// A prediction is drafted from the first step (the prompt's last tokens lead into
    /// it), and after an edit the drafts find their place in it again: a 200-token
    /// answer that is the prediction with one token changed takes a handful of steps,
    /// where the trees alone (nothing of it in the prompt or the cache) take 200.
    #[test]
    fn a_prediction_drafts_the_answer_and_finds_its_place_after_an_edit() {
        let empty = GlobalTree::new(24).unwrap();
        let params = SpecParams::default();
        let prompt: Vec<u32> = (1..=30).collect();
        let prediction: Vec<u32> = (1000..1200).collect();
        let mut answer = prediction.clone();
        answer[100] = 5000;
        let view = || Layered::new(None, &empty, &empty);

        let mut plain = CacheDrafter::new(view(), params, &prompt);
        let [steps, _, accepted] = replay(&mut plain, &prompt, &answer);
        assert_eq!(
            (steps, accepted),
            (200, 0),
            "nothing to draft from without it"
        );

        let mut predicting = CacheDrafter::new(view(), params, &prompt).predicting(&prediction);
        let first = predicting.draft(&prompt);
        assert_eq!(first.source, DraftSource::Prediction);
        assert_eq!(first.tokens[..], prediction[..params.max_spec]);
        let mut predicting = CacheDrafter::new(view(), params, &prompt).predicting(&prediction);
        let [steps, drafted, accepted] = replay(&mut predicting, &prompt, &answer);
        // Every step accepts a whole draft but the edit's and those after it until
        // three tokens match the prediction again.
        let most_steps = 2 * (200 / (params.max_spec as u64 + 1)) + 2 + PREDICTION_MIN_MATCH as u64;
        assert!(steps <= most_steps, "{steps} steps (at most {most_steps})");
        // Each step's own token is the model's, not a draft's.
        assert!(
            accepted + steps >= 195,
            "{accepted} of 200 accepted in {steps} steps"
        );
        assert!(
            drafted - accepted <= params.max_spec as u64,
            "{drafted} drafted"
        );

        // An empty prediction changes nothing, and one that shares only tokens here and
        // there with the answer is drafted once, at the start (where the prompt leads
        // into it), and never again.
        let mut empty_prediction = CacheDrafter::new(view(), params, &prompt).predicting(&[]);
        assert_eq!(replay(&mut empty_prediction, &prompt, &answer)[2], 0);
        let scattered: Vec<u32> = answer.iter().step_by(2).copied().collect();
        let mut unrelated = CacheDrafter::new(view(), params, &prompt).predicting(&scattered);
        let [_, drafted, accepted] = replay(&mut unrelated, &prompt, &answer);
        assert_eq!(
            (drafted, accepted),
            (params.max_spec as u64, 1),
            "the first step's draft only"
        );
    }

    /// A stale prediction (the file as it was, with a change every 20 tokens) beside a
    /// prompt that holds the file as it is, which the answer copies: past a difference
    /// the prompt's copy matches further back and drafts, so the stale prediction costs
    /// no step (were ties the prediction's, it would draft through each difference).
    #[test]
    fn a_stale_prediction_gives_way_to_the_prompts_longer_match() {
        let empty = GlobalTree::new(24).unwrap();
        let params = SpecParams::default();
        let file: Vec<u32> = (1000..1200).collect();
        let prompt: Vec<u32> = [&(1..=20).collect::<Vec<u32>>()[..], &file, &[21, 22]].concat();
        let stale: Vec<u32> = file
            .iter()
            .enumerate()
            .map(|(i, &t)| if i % 20 == 10 { 7000 + i as u32 } else { t })
            .collect();
        let view = || Layered::new(None, &empty, &empty);
        let mut plain = CacheDrafter::new(view(), params, &prompt);
        let [plain_steps, ..] = replay(&mut plain, &prompt, &file);
        let mut predicting = CacheDrafter::new(view(), params, &prompt).predicting(&stale);
        let [steps, ..] = replay(&mut predicting, &prompt, &file);
        assert!(
            steps <= plain_steps + 1,
            "{steps} steps with the stale prediction, {plain_steps} without"
        );
    }
}
