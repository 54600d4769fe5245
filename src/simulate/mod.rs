//! The simulated verifier: replays recorded responses as the model's choices and measures
//! what speculation would have gained, without a model. The protocol is that of the
//! reference benchmark (`shared/peer/run_arctic.py`), so figures compare one to one:
//!
//! - Warm-up: each warm response goes into the global tree (FIFO-evicted beyond
//!   `max_cached_requests`). Prompts go only to per-request trees, which are discarded.
//! - Test: for each example, a request tree over its prompt; then repeatedly speculate,
//!   accept the longest draft path equal to the next true tokens plus one bonus true
//!   token, and feed those back. The finished response enters the global tree and, without
//!   `online`, leaves it again, so every test request sees the same warm cache.
//!
//! One difference of design, not of protocol: the reference adds a response to its global
//! tree token by token while it is generated; suffixd adds completed requests, as its
//! store does, and the request tree covers the response in progress. Both the append and
//! the removal are timed as update cost.

use std::collections::VecDeque;
use std::path::PathBuf;
use std::time::Instant;

use serde::Serialize;

mod cache;

use crate::corpus::{CorpusError, read_examples};
use crate::speculate::{DraftSource, SpecParams, Speculator};
use crate::store::{LayeredCursor, OpenError, Snapshot};
use crate::tree::{GlobalTree, RequestTree, TreeError};

use cache::Cache;

/// What to simulate.
#[derive(Clone, Debug)]
pub struct SimulateConfig {
    /// Token-stream file whose responses warm the global tree (unless `snapshot`).
    pub warm: Option<PathBuf>,
    /// Use only the first N warm examples.
    pub warm_limit: Option<usize>,
    /// Token-stream file of test examples.
    pub test: PathBuf,
    /// Use only the first M test examples.
    pub test_limit: Option<usize>,
    /// Speculation parameters.
    pub params: SpecParams,
    /// Global tree capacity in responses (FIFO); 0 disables the global tree.
    pub max_cached_requests: usize,
    /// Keep finished test responses in the global tree.
    pub online: bool,
    /// Index the prompt in the request tree.
    pub prompt_tree: bool,
    /// Open this snapshot file as the warm cache instead of building from `warm`.
    pub snapshot: Option<PathBuf>,
    /// Also time every speculation a second time, warm: see
    /// [`SimulateReport::spec_replay_us_per_call`].
    pub replay_timing: bool,
}

/// Errors from a simulation run.
#[derive(Debug, thiserror::Error)]
pub enum SimulateError {
    /// A token file could not be read.
    #[error(transparent)]
    Corpus(#[from] CorpusError),
    /// The global tree refused an append.
    #[error(transparent)]
    Tree(#[from] TreeError),
    /// The snapshot could not be opened.
    #[error(transparent)]
    Snapshot(#[from] OpenError),
    /// The snapshot holds more than one namespace, or another depth limit.
    #[error("{0}")]
    SnapshotShape(String),
}

/// Results, with the keys of the fixed `simulate --json` contract first.
#[derive(Clone, Debug, Default, Serialize)]
pub struct SimulateReport {
    /// Generated tokens ÷ verification steps, counting the bonus token.
    pub tokens_per_step: f64,
    /// Accepted ÷ drafted tokens.
    pub acceptance_rate: f64,
    /// Drafted tokens ÷ steps.
    pub mean_draft_size: f64,
    /// Verification steps.
    pub steps: u64,
    /// Tokens produced (accepted plus bonus).
    pub generated_tokens: u64,
    /// Draft tokens accepted.
    pub accepted_tokens: u64,
    /// Draft tokens proposed.
    pub drafted_tokens: u64,
    /// Wall time inside speculation, per call.
    pub spec_us_per_call: f64,
    /// With `replay_timing`: wall time of the same speculation replayed right after it,
    /// on the same context, from a copy of the speculator's state taken before the
    /// first call. The replay does the same work with the caches warm from the first.
    /// The reference's `--native-timing` figure is measured this way (its native calls
    /// run right after the same speculation through its Python API), so this is the
    /// figure to set beside it; `spec_us_per_call` is the cold one that decoding pays.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub spec_replay_us_per_call: Option<f64>,
    /// Median wall time of one speculation call.
    pub spec_us_p50: f64,
    /// 99th percentile of one speculation call: the tail that a mean hides.
    pub spec_us_p99: f64,
    /// The slowest speculation call.
    pub spec_us_max: f64,
    /// Wall time learning generated tokens, per generated token: extending the request
    /// tree at every step plus appending the finished response to the global tree. This
    /// is what the reference times as its update (its `add_active_response` extends both
    /// trees); like the reference, it leaves out the removal that the protocol does
    /// after each test request, which is reported as `evict_us_per_token`.
    pub update_us_per_token: f64,
    /// Of the update: extending the request tree (the part on the decoding path).
    pub step_update_us_per_token: f64,
    /// Of the update: appending finished responses to the global tree.
    pub append_us_per_token: f64,
    /// Removing finished test responses again (without `online`), per generated token.
    pub evict_us_per_token: f64,
    /// Wall time to build the warm global tree (reading the file not included). Only the
    /// responses that FIFO eviction would keep are inserted.
    pub warmup_s: f64,
    /// Tokens in the global tree after warm-up.
    pub cached_tokens: u64,
    /// Resident bytes the global tree added (RSS growth over warm-up) ÷ cached tokens.
    pub store_bytes_per_token: f64,
    /// Heap capacity held by the global tree ÷ cached tokens.
    pub store_heap_bytes_per_token: f64,
    /// Tree sizes after warm-up.
    pub store: crate::tree::TreeStats,
    /// Responses in the global tree after warm-up.
    pub cached_requests: usize,
    /// Warm examples read.
    pub warm_examples: usize,
    /// Test examples run.
    pub test_examples: usize,
    /// Steps with a non-empty draft ÷ steps.
    pub nonempty_draft_frac: f64,
    /// Steps whose draft came from the request tree ÷ steps with a draft.
    pub request_tree_chosen_frac: f64,
    /// Steps whose draft came from the global tree read with the response so far ÷ steps
    /// with a draft.
    pub merged_chosen_frac: f64,
    /// Mean over requests of response tokens ÷ steps.
    pub mean_req_tokens_per_step: f64,
    /// Wall time of the test phase.
    pub test_wall_s: f64,
    /// The speculation parameters used.
    pub params: SpecParams,
    /// Responses kept after each test request.
    pub online: bool,
    /// Prompts indexed in request trees.
    pub prompt_tree: bool,
    /// Compactions run (warm-up and test).
    pub compactions: usize,
    /// Bytes of the snapshot file, when the cache was opened from one.
    pub snapshot_file_bytes: u64,
}

/// Run the simulation. `progress` is called now and then with a line for a human.
pub fn simulate(
    cfg: &SimulateConfig,
    mut progress: impl FnMut(&str),
) -> Result<SimulateReport, SimulateError> {
    let params = cfg.params;
    let mut cache = Cache::new(params.max_depth, cfg.max_cached_requests)?;
    let mut report = SimulateReport {
        params,
        online: cfg.online,
        prompt_tree: cfg.prompt_tree,
        ..Default::default()
    };
    let mut next_id = match &cfg.snapshot {
        Some(path) => open_snapshot(path, &mut cache, &mut report, &mut progress)?,
        None => 0,
    };
    // FIFO eviction during warm-up only decides which responses remain, and nothing
    // speculates in between: build the tree from the responses FIFO would keep, as
    // `suffixd build` does, instead of inserting and evicting the rest.
    let mut kept: VecDeque<(u64, Vec<u32>)> = VecDeque::new();
    let warm = match (&cfg.snapshot, &cfg.warm) {
        (Some(_), _) => None,
        (None, Some(w)) => Some(read_examples(w, cfg.warm_limit)?),
        (None, None) => {
            return Err(SimulateError::SnapshotShape(
                "give --warm FILE or --snapshot DIR".into(),
            ));
        }
    };
    for ex in warm.into_iter().flatten() {
        let ex = ex?;
        if cfg.max_cached_requests > 0 {
            if kept.len() == cfg.max_cached_requests {
                kept.pop_front();
            }
            kept.push_back((next_id, ex.response));
        }
        next_id += 1;
        report.warm_examples += 1;
    }
    if cfg.snapshot.is_none() {
        warm_up(&mut cache, kept, &mut report, &mut progress)?;
    }

    let mut spec = Speculator::<LayeredCursor>::default();
    let mut tally = Tally::default();
    let test_start = Instant::now();
    for ex in read_examples(&cfg.test, cfg.test_limit)? {
        let ex = ex?;
        if ex.response.is_empty() {
            continue;
        }
        let steps = replay_request(
            cfg,
            &cache,
            &mut spec,
            ex.prompt,
            &ex.response,
            &mut report,
            &mut tally,
        );
        let id = next_id;
        next_id += 1;
        let t = Instant::now();
        cache.add(id, &ex.response)?;
        tally.append_ns += t.elapsed().as_nanos();
        if !cfg.online {
            let t = Instant::now();
            cache.remove(id)?;
            tally.evict_ns += t.elapsed().as_nanos();
        }
        report.steps += steps;
        tally.per_request_tokens_per_step += ex.response.len() as f64 / steps as f64;
        report.test_examples += 1;
        if report.test_examples.is_multiple_of(200) {
            progress(&format!(
                "test {}: {:.3} tokens/step",
                report.test_examples,
                report.generated_tokens as f64 / report.steps as f64
            ));
        }
    }
    report.test_wall_s = test_start.elapsed().as_secs_f64();
    report.compactions = cache.compactions;
    tally.summarize(cfg, &mut report);
    Ok(report)
}

/// Open `path` as the warm cache (a single-namespace snapshot of the configured depth)
/// and measure it. Returns the next free sequence id.
fn open_snapshot(
    path: &std::path::Path,
    cache: &mut Cache,
    report: &mut SimulateReport,
    progress: &mut impl FnMut(&str),
) -> Result<u64, SimulateError> {
    crate::memory::trim();
    let rss0 = crate::memory::rss_bytes();
    let t = Instant::now();
    let snap = Snapshot::open(path, None)?;
    let mut namespaces = snap.namespaces()?;
    if namespaces.len() != 1 {
        return Err(SimulateError::SnapshotShape(format!(
            "{} holds {} namespaces; simulate reads single-namespace snapshots",
            path.display(),
            namespaces.len()
        )));
    }
    let base = namespaces.pop().expect("one namespace").tree;
    if base.max_depth() != report.params.max_depth {
        return Err(SimulateError::SnapshotShape(format!(
            "{} was built with max_depth {}; pass --max-depth {}",
            path.display(),
            base.max_depth(),
            base.max_depth()
        )));
    }
    report.warmup_s = t.elapsed().as_secs_f64();
    let next_id = base.ids().max().map_or(0, |m| m + 1);
    report.warm_examples = base.len();
    cache.open(base)?;
    let rss1 = crate::memory::rss_bytes();
    report.cached_tokens = cache.cached_tokens();
    report.cached_requests = cache.order.len();
    report.snapshot_file_bytes = snap.file_len();
    if report.cached_tokens > 0 {
        report.store_bytes_per_token =
            rss1.saturating_sub(rss0) as f64 / report.cached_tokens as f64;
    }
    progress(&format!(
        "snapshot: {} sequences, {} cached tokens, opened in {:.3} ms",
        report.cached_requests,
        report.cached_tokens,
        report.warmup_s * 1e3
    ));
    Ok(next_id)
}

/// Times and counts of the test phase that the report derives its figures from.
#[derive(Default)]
struct Tally {
    spec_ns: u128,
    replay_ns: u128,
    step_ns: u128,
    append_ns: u128,
    evict_ns: u128,
    /// Every call's time, for the distribution: a few bytes per step.
    call_ns: Vec<u64>,
    nonempty: u64,
    from_request: u64,
    from_both: u64,
    /// Σ over requests of each one's tokens per step.
    per_request_tokens_per_step: f64,
}

impl Tally {
    /// Fill in the report's rates, means and latency quantiles.
    fn summarize(mut self, cfg: &SimulateConfig, report: &mut SimulateReport) {
        let steps = report.steps.max(1) as f64;
        report.tokens_per_step = report.generated_tokens as f64 / steps;
        report.acceptance_rate = if report.drafted_tokens > 0 {
            report.accepted_tokens as f64 / report.drafted_tokens as f64
        } else {
            0.0
        };
        report.mean_draft_size = report.drafted_tokens as f64 / steps;
        report.spec_us_per_call = self.spec_ns as f64 / 1e3 / steps;
        report.spec_replay_us_per_call = cfg
            .replay_timing
            .then(|| self.replay_ns as f64 / 1e3 / steps);
        let call_ns = &mut self.call_ns;
        call_ns.sort_unstable();
        let quantile = |q: f64| {
            let i = ((call_ns.len() as f64 * q).ceil() as usize).clamp(1, call_ns.len().max(1)) - 1;
            call_ns.get(i).map_or(0.0, |&ns| ns as f64 / 1e3)
        };
        report.spec_us_p50 = quantile(0.5);
        report.spec_us_p99 = quantile(0.99);
        report.spec_us_max = call_ns.last().map_or(0.0, |&ns| ns as f64 / 1e3);
        let per_token = |ns: u128| ns as f64 / 1e3 / report.generated_tokens.max(1) as f64;
        report.update_us_per_token = per_token(self.step_ns + self.append_ns);
        report.step_update_us_per_token = per_token(self.step_ns);
        report.append_us_per_token = per_token(self.append_ns);
        report.evict_us_per_token = per_token(self.evict_ns);
        report.nonempty_draft_frac = self.nonempty as f64 / steps;
        report.request_tree_chosen_frac = self.from_request as f64 / self.nonempty.max(1) as f64;
        report.merged_chosen_frac = self.from_both as f64 / self.nonempty.max(1) as f64;
        report.mean_req_tokens_per_step =
            self.per_request_tokens_per_step / report.test_examples.max(1) as f64;
    }
}

/// Generate one test response as a perfect verifier would: each step drafts, accepts
/// what the draft shares with the true response, then takes the next true token.
/// Returns the steps it took.
fn replay_request(
    cfg: &SimulateConfig,
    cache: &Cache,
    spec: &mut Speculator<LayeredCursor>,
    prompt: Vec<u32>,
    truth: &[u32],
    report: &mut SimulateReport,
    tally: &mut Tally,
) -> u64 {
    let params = &cfg.params;
    let mut request = RequestTree::new(
        if cfg.prompt_tree { &prompt } else { &[] },
        params.request_depth(),
    );
    let mut context = prompt;
    context.reserve(truth.len());
    let mut pos = 0;
    let mut steps = 0u64;
    while pos < truth.len() {
        let mut replay = cfg.replay_timing.then(|| spec.clone());
        let t = Instant::now();
        let draft = cache.speculate(spec, &request, &context, params);
        let took = t.elapsed().as_nanos();
        tally.spec_ns += took;
        tally.call_ns.push(took as u64);
        if let Some(replay) = &mut replay {
            let t = Instant::now();
            let again = cache.speculate(replay, &request, &context, params);
            tally.replay_ns += t.elapsed().as_nanos();
            debug_assert_eq!(again, draft, "a replay drafts what the call did");
        }
        let mut new = draft.accept(&truth[pos..]);
        report.accepted_tokens += new.len() as u64;
        report.drafted_tokens += draft.len() as u64;
        tally.nonempty += !draft.is_empty() as u64;
        tally.from_request += (draft.source == DraftSource::Request) as u64;
        tally.from_both += (draft.source == DraftSource::Both) as u64;
        if pos + new.len() < truth.len() {
            new.push(truth[pos + new.len()]);
        }
        pos += new.len();
        let t = Instant::now();
        request.extend(&new);
        tally.step_ns += t.elapsed().as_nanos();
        context.extend_from_slice(&new);
        report.generated_tokens += new.len() as u64;
        steps += 1;
    }
    steps
}

/// Build the in-memory tree from the warm responses FIFO keeps, and measure it.
fn warm_up(
    cache: &mut Cache,
    kept: VecDeque<(u64, Vec<u32>)>,
    report: &mut SimulateReport,
    progress: &mut impl FnMut(&str),
) -> Result<(), SimulateError> {
    crate::memory::trim();
    let rss0 = crate::memory::rss_bytes();
    let t = Instant::now();
    let base = GlobalTree::build(
        report.params.max_depth,
        kept.iter().map(|(id, r)| (*id, r.as_slice())),
    )?;
    let warm_ns = t.elapsed().as_nanos();
    let ids: Vec<u64> = kept.iter().map(|(id, _)| *id).collect();
    drop(kept);
    crate::memory::trim();
    let rss1 = crate::memory::rss_bytes();
    report.warmup_s = warm_ns as f64 / 1e9;
    report.cached_tokens = base.cached_tokens();
    report.cached_requests = base.len();
    report.store = base.stats();
    if report.cached_tokens > 0 {
        let cached = report.cached_tokens as f64;
        report.store_bytes_per_token = rss1.saturating_sub(rss0) as f64 / cached;
        report.store_heap_bytes_per_token = base.heap_bytes() as f64 / cached;
    }
    progress(&format!(
        "warm-up: {} examples, {} cached tokens in {:.2}s, {:?}",
        report.warm_examples, report.cached_tokens, report.warmup_s, report.store,
    ));
    cache.warm(base, ids)?;
    Ok(())
}
