//! Hybrid drafting: a draft model takes over where the suffix trees have nothing likely.
//!
//! Each decoding step asks the request's [`super::Drafter`] first. When that draft's
//! calibrated expected accepted tokens fall below τ (`--hybrid-tau`), the engine has a
//! draft model, and the draft model's expected tokens per unit of cost beat the suffix
//! draft's ([`DraftModel::pays`]), the draft model proposes a linear draft instead, as
//! its own sequence with its own KV cache:
//!
//! - The cache lags the request's context and catches up when it is next needed: the
//!   tokens accepted since (usually a few). More than [`MAX_CATCH_UP`] behind (a new
//!   prompt), it starts again from the context's first and last tokens. Steps the
//!   suffix draft covers cost the draft model nothing.
//! - A draft of k tokens takes k passes of the draft model: the catch-up pass gives the
//!   first token, each later pass one more. The passes of every sequence drafting in a
//!   step are batched.
//! - Drafting stops when one more token no longer pays: the next token's worth is
//!   predicted from how often the draft model's tokens are lately accepted, and weighed
//!   against one more draft pass (its measured time relative to a target step) and one more verified row
//!   (the verifier's cost curve). The usual cut ([`super::Engine::allocate_drafts`]) then
//!   decides what is verified.
//! - After verification the cache keeps the accepted tokens it holds; the rest is
//!   dropped before the next draft.
//!
//! Greedy output is plain greedy output, as with any draft: the verifier decides every
//! token. With sampling the draft's token for a position is drawn from the draft
//! model's distribution q (with the request's temperature, top-k and top-p) with the
//! same uniform number ([`super::sampling::Draws`]) the verifier draws that position's
//! token from the target's p with: where q is close to p the two draws agree and the
//! token is accepted, and the answer is plain sampling's for the seed either way. (This
//! accepts somewhat less often than the min(1, p/q) rule, which agrees with probability
//! Σ min(p, q) but whose answer depends on what was drafted, so a seed would not
//! reproduce.)

use std::time::Instant;

use candle_core::Tensor;

use crate::speculate::{Draft, DraftSource};

use super::calibration::Calibration;
use super::cost::CostCurve;
use super::penalties::Seen;
use super::sampling::{TokenLogprob, sample};
use super::{Engine, Plan, Sequence, StepReport, chain_parents};
use crate::model::forward::{BatchEntry, KvCache, LogitRows, Model, ModelError, argmax};

/// The longest draft the draft model writes in one step.
const MAX_MODEL_DRAFT: usize = 16;

/// The most tokens a draft model's cache catches up in one step. Further behind (a new
/// prompt; a long run of steps the suffix trees drafted), the cache starts again from
/// the context's first [`ATTENTION_SINK`] tokens and its last ones, as StreamingLLM
/// keeps a model's attention sink and recent window: the draft model then reads
/// `MAX_CATCH_UP` tokens, not the whole prompt. That bounds a draft's cost (on the
/// agentic workload the prompts' catch-up was a third of the draft model's time), at
/// the price of drafts that do not see the middle of a long prompt; the target still
/// decides every token.
pub const MAX_CATCH_UP: usize = 64;

/// The context's first tokens a restarted draft cache keeps (see [`MAX_CATCH_UP`]).
pub const ATTENTION_SINK: usize = 4;

/// τ when none is given: the suffix draft is kept when its calibrated expected accepted
/// tokens reach it. Derived in docs/hybrid.md from `e2e-bench` runs over τ on the chat
/// and agentic workloads (the default model in f32, drafted by itself in Q8_0).
pub const DEFAULT_TAU: f64 = 1.0;

/// A draft model and what the engine has measured of it.
pub(super) struct DraftModel {
    model: Model,
    /// The threshold on the suffix draft's calibrated expected accepted tokens.
    tau: f64,
    /// Seconds of one single-row pass of the draft model, a moving average.
    draft_t1_s: f64,
    /// Seconds of one single-row step of the target, a moving average of the
    /// verifier's steps divided by what the cost curve says their rows cost.
    target_t1_s: f64,
    /// Seconds each more row adds to a draft model pass (catching up costs this per
    /// token behind).
    draft_row_s: f64,
    /// Tokens in the draft model's drafts, a moving average: the length a draft is
    /// expected to have before it is written.
    mean_len: f64,
    /// Weigh the draft model's cost against the suffix draft's before drafting (off:
    /// it drafts wherever the suffix draft is below τ).
    check_cost: bool,
    /// The share of decoding steps whose suffix draft is below τ, a moving average over
    /// every request: how much of a request the draft model can expect to draft.
    weak_share: f64,
}

/// Weight of the newest observation in [`DraftModel`]'s moving averages.
const RATE: f64 = 0.1;
/// Weight of the newest decoding step in [`DraftModel::weak_share`].
const WEAK_RATE: f64 = 0.02;

impl DraftModel {
    /// A draft pass's cost in target steps.
    fn cost_ratio(&self) -> f64 {
        self.draft_t1_s / self.target_t1_s.max(1e-9)
    }

    /// A decoding step's suffix draft was below τ (`weak`) or not.
    pub(super) fn observe_suffix(&mut self, weak: bool) {
        self.weak_share += WEAK_RATE * (f64::from(u8::from(weak)) - self.weak_share);
    }

    /// Whether the draft model should draft for a sequence whose cache is `behind`
    /// tokens behind its context and which may generate `remaining` more tokens, when
    /// the suffix draft would give `suffix_rate` tokens per target step: the model's
    /// expected tokens per unit of cost (its draft passes and the verified rows) must be
    /// higher.
    ///
    /// Catching up is an investment, not a step's cost: a cache that reads a 64-token
    /// prompt costs three target steps here, and charged to one step it never pays, so
    /// the cache would never catch up. It is spread over the steps the draft model can
    /// expect to draft for the rest of the request: the remaining tokens, at the tokens
    /// a model step yields, times the share of steps whose suffix drafts are weak. Where
    /// the trees draft most steps (agentic work) that share is small and a long catch-up
    /// does not pay; on open chat it is large and it does.
    pub(super) fn pays(
        &self,
        behind: usize,
        remaining: usize,
        suffix_rate: f64,
        cost: &CostCurve,
        calibration: &Calibration,
    ) -> bool {
        if !self.check_cost {
            return true;
        }
        let k = self.mean_len.round().max(1.0) as usize;
        let rate = calibration.model_mean_rate();
        let expected: f64 = (1..=k as i32).map(|j| rate.powi(j)).sum();
        let future_steps = self.weak_share * remaining as f64 / (1.0 + expected);
        let behind = behind.min(MAX_CATCH_UP) as f64;
        let catch_up = (behind - 1.0).max(0.0) * self.draft_row_s / future_steps.max(1.0);
        let passes = k as f64 * self.draft_t1_s + catch_up;
        let model_rate =
            (1.0 + expected) / (cost.cost(1 + k) + passes / self.target_t1_s.max(1e-9));
        model_rate > suffix_rate
    }

    /// A target step of `rows` rows took `seconds`.
    pub(super) fn observe_target(&mut self, seconds: f64, cost: &CostCurve, rows: usize) {
        let t1 = seconds / cost.cost(rows).max(1e-9);
        if t1.is_finite() && t1 > 0.0 {
            self.target_t1_s += RATE * (t1 - self.target_t1_s);
        }
    }
}

/// One sequence's draft-model state: its own KV cache, which lags the sequence's context.
#[derive(Default)]
pub(super) struct DraftState {
    cache: KvCache,
    /// The context's first `synced` tokens are in the cache (less `skipped`); rows after
    /// them are dropped before the next draft.
    synced: usize,
    /// Context tokens the cache left out when it restarted from the context's first and
    /// last tokens ([`MAX_CATCH_UP`]): cache row r holds context token r + `skipped`
    /// past the first [`ATTENTION_SINK`].
    skipped: usize,
    /// The context's length when the last model draft was written, and how many of its
    /// tokens the cache holds (all but the last).
    base: usize,
    in_cache: usize,
}

impl DraftState {
    /// The cache's rows that hold context tokens: the ones to keep before a draft.
    fn cache_rows(&self) -> usize {
        self.synced - self.skipped
    }

    /// The target accepted `accepted` tokens of the last model draft: the cache keeps
    /// those it holds.
    pub(super) fn accepted(&mut self, accepted: usize) {
        self.synced = self.base + accepted.min(self.in_cache);
    }
}

/// Steps, drafted tokens and accepted tokens of one draft source.
#[derive(Clone, Copy, Debug, Default, PartialEq, serde::Serialize)]
pub struct SourceCounts {
    /// Verified steps whose draft came from this source.
    pub steps: usize,
    /// Draft tokens verified.
    pub drafted: usize,
    /// Draft tokens accepted.
    pub accepted: usize,
}

impl SourceCounts {
    fn add(&mut self, other: &SourceCounts) {
        self.steps += other.steps;
        self.drafted += other.drafted;
        self.accepted += other.accepted;
    }
}

/// Where the drafts of a generation (or a step) came from.
#[derive(Clone, Copy, Debug, Default, PartialEq, serde::Serialize)]
pub struct DraftSources {
    /// Steps verified with no draft (plain decoding steps).
    pub none: usize,
    /// The suffix trees (the request's own and the shared cache).
    pub suffix: SourceCounts,
    /// The draft model (hybrid mode).
    pub model: SourceCounts,
    /// The client's prediction of the answer (`prediction`).
    pub prediction: SourceCounts,
    /// Seconds spent running the draft model.
    pub model_draft_s: f64,
    /// Steps whose model draft was cut to nothing before verification (not worth its
    /// rows: every token of it unlikely); counted in `none` too.
    pub model_unverified: usize,
}

impl DraftSources {
    /// One verified step's draft of `drafted` tokens from `source`, `accepted` accepted.
    pub(super) fn record(&mut self, source: DraftSource, drafted: usize, accepted: usize) {
        let counts = SourceCounts {
            steps: 1,
            drafted,
            accepted,
        };
        match source {
            DraftSource::Model if drafted == 0 => {
                self.none += 1;
                self.model_unverified += 1;
            }
            _ if drafted == 0 => self.none += 1,
            DraftSource::Model => self.model.add(&counts),
            DraftSource::Prediction => self.prediction.add(&counts),
            _ => self.suffix.add(&counts),
        }
    }

    /// Add another's counts.
    pub fn add(&mut self, other: &DraftSources) {
        self.none += other.none;
        self.suffix.add(&other.suffix);
        self.model.add(&other.model);
        self.prediction.add(&other.prediction);
        self.model_draft_s += other.model_draft_s;
        self.model_unverified += other.model_unverified;
    }
}

impl Engine {
    /// Hybrid mode's part of planning a step: the sequences whose suffix draft is weak
    /// (below τ) and for which the draft model pays get its draft instead
    /// ([`DraftModel::pays`]). Nothing without a draft model.
    pub(super) fn offer_draft_model(
        &mut self,
        batch: &mut [(&mut Sequence, &mut dyn super::Drafter)],
        plans: &mut [Plan],
        report: &mut StepReport,
    ) {
        let Some(dm) = self.draft.as_mut() else {
            return;
        };
        let (calibration, cost) = (&self.calibration, &self.cost);
        let mut skipped = false;
        let mut wanting: Vec<(&mut Sequence, &mut Draft)> = Vec::new();
        for ((seq, _), plan) in batch.iter_mut().zip(plans.iter_mut()) {
            let Plan::Verify { draft, .. } = plan else {
                continue;
            };
            if !seq.opts.speculate || !seq.opts.draft_model || seq.constraint.is_some() {
                continue;
            }
            // The suffix draft is kept when it is likely enough (τ), or when the draft
            // model would not do better for what it costs.
            let values = calibration.values(draft);
            let weak = values.iter().sum::<f64>() < dm.tau;
            dm.observe_suffix(weak);
            if !weak {
                continue;
            }
            let kept = cost.best_cut(1, std::slice::from_ref(&values))[0];
            let suffix_rate = (1.0 + values[..kept].iter().sum::<f64>()) / cost.cost(1 + kept);
            let behind = seq.context.len() - seq.draft.as_ref().map_or(0, |s| s.synced);
            let remaining = seq.opts.max_tokens.saturating_sub(seq.out.len());
            if dm.pays(behind, remaining, suffix_rate, cost, calibration) {
                wanting.push((&mut **seq, draft));
            } else {
                skipped = true;
            }
        }
        if skipped {
            // No new evidence: the draft model's acceptance drifts back towards trust,
            // so that one bad stretch does not stop it for good.
            self.calibration.model_refused();
        }
        if !wanting.is_empty() {
            report.sources.model_draft_s += self.draft_with_model(wanting);
        }
    }

    /// Draft with `draft` (an engine loaded from the draft model's file) where the suffix
    /// draft's calibrated expected accepted tokens fall below `tau`. Refused when its
    /// tokenizer is not the target's, or its context is shorter.
    pub fn set_draft_model(&mut self, draft: Engine, tau: f64) -> Result<(), ModelError> {
        let mismatch = |why: String| {
            Err(ModelError::DraftModel(format!(
                "{why}: a draft model must use the target's tokenizer (the same family and vocabulary)"
            )))
        };
        if draft.tokenizer_identity() != self.tokenizer_identity() {
            return mismatch(format!(
                "its tokenizer is {:?}, the target's {:?}",
                draft.tokenizer_identity(),
                self.tokenizer_identity()
            ));
        }
        let (dv, tv) = (draft.model.config().vocab, self.model.config().vocab);
        if dv != tv {
            return mismatch(format!("its vocabulary has {dv} tokens, the target's {tv}"));
        }
        if draft.context_len() < self.context_len() {
            return Err(ModelError::DraftModel(format!(
                "its context holds {} tokens, the target's {}; give both the same --max-context",
                draft.context_len(),
                self.context_len()
            )));
        }
        if !(tau.is_finite() && tau >= 0.0) {
            return Err(ModelError::DraftModel(format!(
                "τ must be a number of tokens, 0 or more, not {tau}"
            )));
        }
        let draft_t1_s = pass_seconds(&draft.model, 1)?;
        let draft_row_s = ((pass_seconds(&draft.model, 33)? - draft_t1_s) / 32.0).max(0.0);
        // The target's single-row step, as the cost curve measured it at start; timed
        // here only when the curve was given (`--cost flat`).
        let target_t1_s = if self.cost.t1_ms > 0.0 {
            self.cost.t1_ms / 1e3
        } else {
            pass_seconds(&self.model, 1)?
        };
        self.draft = Some(DraftModel {
            model: draft.model,
            tau,
            draft_t1_s,
            draft_row_s,
            target_t1_s,
            mean_len: 4.0,
            check_cost: true,
            weak_share: 0.5,
        });
        Ok(())
    }

    /// Whether the draft model's expected cost is weighed against the suffix draft's
    /// before it drafts (the default). Off, it drafts at every step whose suffix draft
    /// is below τ, whatever that costs: for tests of its exactness, and comparisons.
    pub fn set_draft_cost_check(&mut self, on: bool) {
        if let Some(dm) = self.draft.as_mut() {
            dm.check_cost = on;
        }
    }

    /// Whether the engine has a draft model, and its τ.
    pub fn hybrid_tau(&self) -> Option<f64> {
        self.draft.as_ref().map(|dm| dm.tau)
    }

    /// A draft pass's measured cost in target steps (hybrid mode only).
    pub fn draft_cost_ratio(&self) -> Option<f64> {
        self.draft.as_ref().map(DraftModel::cost_ratio)
    }

    /// Replace the drafts of `wanting` (their suffix drafts were weak) with the draft
    /// model's. A failure of the draft model is logged and leaves the suffix drafts.
    fn draft_with_model(&mut self, mut wanting: Vec<(&mut Sequence, &mut Draft)>) -> f64 {
        let Some(dm) = self.draft.as_mut() else {
            return 0.0;
        };
        let t = Instant::now();
        if let Err(e) = run_draft_model(dm, &self.cost, &self.calibration, &self.eos, &mut wanting)
        {
            tracing::warn!("the draft model failed ({e}); this step keeps the suffix drafts");
        }
        // Each sequence that asked is charged its share of the step's drafting time.
        let seconds = t.elapsed().as_secs_f64();
        let share = seconds / wanting.len() as f64;
        for (seq, _) in &mut wanting {
            seq.sources.model_draft_s += share;
        }
        seconds
    }
}

/// Seconds of a `rows`-row pass of `model` after a 32-token context: the median of 5.
fn pass_seconds(model: &Model, rows: u32) -> Result<f64, ModelError> {
    let mut cache = KvCache::default();
    let prefix: Vec<u32> = (100..132).collect();
    model.forward(&mut cache, &prefix, &chain_parents(prefix.len()))?;
    cache.commit(&(0..prefix.len()).collect::<Vec<_>>())?;
    let tokens: Vec<u32> = (200..200 + rows).collect();
    let mut times = Vec::new();
    for _ in 0..5 {
        let t = Instant::now();
        model.forward(&mut cache, &tokens, &chain_parents(tokens.len()))?;
        cache.commit(&[])?;
        times.push(t.elapsed().as_secs_f64());
    }
    times.sort_by(f64::total_cmp);
    Ok(times[times.len() / 2])
}

/// One sequence drafting in this step.
struct Drafting<'a> {
    seq: &'a mut Sequence,
    draft: Draft,
    /// Where the draft goes when written.
    out: &'a mut Draft,
    /// The calibrated worth of the draft's tokens so far, summed, plus 1 (the bonus).
    worth: f64,
    /// The calibrated worth of its last token.
    last: f64,
    /// The most tokens it may draft.
    limit: usize,
    /// The tokens its cache runs to catch up with the context.
    catch_up: Vec<u32>,
    /// With penalties: what the answer and the draft so far hold, so that each draft
    /// token is chosen from the row the target will adjust the same way (a draft from
    /// the unadjusted row is still exact, but rejected wherever a penalty moves the
    /// choice).
    seen: Option<Seen>,
}

impl<'a> Drafting<'a> {
    /// `seq`'s drafting for this step, its draft cache cut back to what it holds of the
    /// context; `None` when it has no room to draft (the model's `capacity`, its
    /// `max_tokens`).
    fn start(seq: &'a mut Sequence, out: &'a mut Draft, capacity: usize) -> Option<Self> {
        let room = capacity.saturating_sub(seq.context.len());
        let left = seq.opts.max_tokens.saturating_sub(seq.out.len() + 1);
        let limit = MAX_MODEL_DRAFT.min(room.saturating_sub(1)).min(left);
        if limit == 0 {
            return None;
        }
        let state = seq.draft.get_or_insert_with(DraftState::default);
        // What the cache holds of the context; at least the newest token is run again,
        // for the logits that give the first draft token.
        state.synced = state.synced.min(seq.context.len() - 1);
        state.cache.truncate(state.cache_rows());
        let gap = seq.context.len() - state.synced;
        let catch_up = if gap > MAX_CATCH_UP {
            // Too far behind (a new prompt, or a long run of suffix drafts): start again
            // from the context's first tokens and its last ones.
            state.cache.reset();
            state.skipped = seq.context.len() - MAX_CATCH_UP;
            let sink = &seq.context[..ATTENTION_SINK];
            let tail = &seq.context[seq.context.len() - (MAX_CATCH_UP - ATTENTION_SINK)..];
            [sink, tail].concat()
        } else {
            seq.context[state.synced..].to_vec()
        };
        let seen = seq.seen.clone();
        Some(Drafting {
            seq,
            draft: Draft {
                source: DraftSource::Model,
                ..Draft::default()
            },
            out,
            worth: 1.0,
            last: 1.0,
            limit,
            catch_up,
            seen,
        })
    }

    /// The draft cache of the sequence.
    fn cache(&mut self) -> &mut KvCache {
        &mut self.seq.draft.as_mut().expect("set by start").cache
    }

    /// Take the next draft token from the draft model's `row` of logits, as the
    /// sequence's sampling would (its penalties applied; greedy: the argmax; else drawn
    /// from q with the position's uniform number), and add its calibrated worth. Returns
    /// the token.
    fn take_next(&mut self, row: &[f32], calibration: &Calibration) -> u32 {
        let adjusted;
        let row = match &self.seen {
            Some(seen) => {
                let mut copy = row.to_vec();
                self.seq.opts.penalties.apply(&mut copy, seen);
                adjusted = copy;
                &adjusted[..]
            }
            None => row,
        };
        let sampling = self.seq.opts.sampling;
        let (token, p) = if sampling.temperature <= 0.0 {
            let token = argmax(row);
            (
                token,
                TokenLogprob::from_logits(row, token, 0).logprob.exp(),
            )
        } else {
            let q = sampling.distribution(row);
            let position = self.seq.out.len() + self.draft.len();
            let token = sample(&q, self.seq.draws.at(position));
            (token, q[token as usize])
        };
        let k = self.draft.len();
        let cumulative = self.draft.probs.last().copied().unwrap_or(1.0) * p;
        if let Some(seen) = self.seen.as_mut() {
            seen.add(token);
        }
        self.draft.tokens.push(token);
        self.draft.parents.push(k as i32 - 1);
        self.draft.probs.push(cumulative);
        self.draft.score += cumulative;
        self.last *= calibration.model_rate(f64::from(p));
        self.worth += self.last;
        token
    }
}

/// Draft with the draft model for every sequence `wanting` one: a catch-up pass over
/// each one's tokens since its cache's end, then one batched single-row pass per
/// further token, while one more token pays for each sequence.
fn run_draft_model(
    dm: &mut DraftModel,
    cost: &CostCurve,
    calibration: &Calibration,
    eos: &[u32],
    wanting: &mut [(&mut Sequence, &mut Draft)],
) -> Result<(), ModelError> {
    let capacity = dm.model.config().context;
    let mut active: Vec<Drafting<'_>> = wanting
        .iter_mut()
        .filter_map(|(seq, out)| Drafting::start(seq, out, capacity))
        .collect();
    if active.is_empty() {
        return Ok(());
    }
    let mut logits = catch_up(dm, &mut active)?;
    let c = dm.cost_ratio();
    loop {
        // Each active sequence takes its next token from its row of `logits`.
        let mut going: Vec<Drafting<'_>> = Vec::with_capacity(active.len());
        for (r, mut d) in active.into_iter().enumerate() {
            let row: Vec<f32> = logits.get(r)?.to_vec1()?;
            let token = d.take_next(&row, calibration);
            // One more token, accepted as often as the draft model's tokens lately are,
            // against one more draft pass and one more verified row.
            let k = d.draft.len();
            let now = d.worth / (cost.cost(1 + k) + c * k as f64);
            let next = (d.worth + d.last * calibration.model_mean_rate())
                / (cost.cost(2 + k) + c * (k + 1) as f64);
            if k < d.limit && !eos.contains(&token) && next > now {
                going.push(d);
            } else {
                dm.mean_len += RATE * (k as f64 - dm.mean_len);
                *d.out = std::mem::take(&mut d.draft);
            }
        }
        if going.is_empty() {
            return Ok(());
        }
        logits = draft_pass(dm, &mut going)?;
        active = going;
    }
}

/// The catch-up pass: every sequence's tokens since its cache's end, kept in its cache;
/// the last row's logits of each give its first draft token.
fn catch_up(dm: &mut DraftModel, active: &mut [Drafting<'_>]) -> Result<Tensor, ModelError> {
    let chains: Vec<Vec<u32>> = active
        .iter_mut()
        .map(|d| std::mem::take(&mut d.catch_up))
        .collect();
    let logits = forward_chains(dm, active, &chains)?;
    for d in active {
        let context_len = d.seq.context.len();
        let state = d.seq.draft.as_mut().expect("set by start");
        state.synced = context_len;
        state.base = context_len;
        state.in_cache = 0;
    }
    Ok(logits)
}

/// One batched single-row pass of the draft model over each going sequence's last draft
/// token, kept in its cache; a pass of one sequence times the model's step.
fn draft_pass(dm: &mut DraftModel, going: &mut [Drafting<'_>]) -> Result<Tensor, ModelError> {
    let t = Instant::now();
    let last: Vec<Vec<u32>> = going
        .iter()
        .map(|d| vec![*d.draft.tokens.last().expect("drafted one")])
        .collect();
    let logits = forward_chains(dm, going, &last)?;
    if going.len() == 1 {
        let seconds = t.elapsed().as_secs_f64();
        dm.draft_t1_s += RATE * (seconds - dm.draft_t1_s);
    }
    for d in going {
        d.seq.draft.as_mut().expect("set by start").in_cache += 1;
    }
    Ok(logits)
}

/// One batched pass of the draft model: `chains[i]` after sequence i's draft cache,
/// kept there whole; returns each chain's last row of logits.
fn forward_chains(
    dm: &mut DraftModel,
    drafting: &mut [Drafting<'_>],
    chains: &[Vec<u32>],
) -> Result<Tensor, ModelError> {
    let parents: Vec<Vec<i32>> = chains.iter().map(|c| chain_parents(c.len())).collect();
    let logits = {
        let mut entries: Vec<BatchEntry<'_>> = drafting
            .iter_mut()
            .zip(chains.iter().zip(&parents))
            .map(|(d, (tokens, parents))| BatchEntry {
                cache: d.cache(),
                tokens,
                parents,
                logits: LogitRows::Last,
            })
            .collect();
        dm.model.forward_batch(&mut entries)?
    };
    for (d, chain) in drafting.iter_mut().zip(chains) {
        d.cache().commit(&(0..chain.len()).collect::<Vec<_>>())?;
    }
    Ok(logits)
}

#[cfg(test)]
mod tests {
    use super::super::sampling::{Draws, Sampling, walk_sampled};
    use super::*;
    use candle_core::{Device, Tensor};

    /// A model draft drawn from q with the position's uniform number, verified by the
    /// sampled walk: over many seeds the first output token follows p whatever q is
    /// (here far from p, and missing one of p's tokens), and the draft is accepted when
    /// the two draws agree, with probability the overlap of the two distributions'
    /// cumulative intervals.
    #[test]
    fn model_drafts_drawn_with_the_verifiers_numbers_keep_the_targets_distribution() {
        let sampling = Sampling {
            temperature: 1.0,
            ..Sampling::default()
        };
        let target_logits = [2.0f32, 1.0, 0.5, -1.0];
        let p = sampling.distribution(&target_logits);
        let q = [0.1f32, 0.2, 0.7, 0.0];
        // Row 0 (the pending token's) decides the first token; row 1 the bonus.
        let logits = Tensor::new(&[target_logits, [0.0, 0.0, 0.0, 0.0]], &Device::Cpu).unwrap();
        let trials = 200_000u64;
        let mut counts = [0usize; 4];
        let mut accepted = 0;
        for seed in 0..trials {
            let draws = Draws::new(seed);
            let x = sample(&q, draws.at(0));
            let (path, bonus) =
                walk_sampled(&[9, x], &[-1, 0], &logits, &sampling, &draws, 0).unwrap();
            let first = if path.len() == 2 { x } else { bonus };
            counts[first as usize] += 1;
            accepted += path.len() - 1;
        }
        for (i, &n) in counts.iter().enumerate() {
            let seen = n as f64 / trials as f64;
            // Four standard deviations of a binomial proportion.
            let sd = (f64::from(p[i]) * (1.0 - f64::from(p[i])) / trials as f64).sqrt();
            assert!(
                (seen - f64::from(p[i])).abs() < 4.0 * sd + 1e-4,
                "token {i}: {seen} where p is {}",
                p[i]
            );
        }
        let (mut fp, mut fq, mut overlap) = (0.0f32, 0.0f32, 0.0f32);
        for (a, b) in p.iter().zip(&q) {
            overlap += ((fp + a).min(fq + b) - fp.max(fq)).max(0.0);
            fp += a;
            fq += b;
        }
        let rate = accepted as f64 / trials as f64;
        assert!(
            (rate - f64::from(overlap)).abs() < 0.01,
            "{rate} vs {overlap}"
        );
    }

    #[test]
    fn a_draft_models_cache_keeps_only_the_accepted_tokens_it_holds() {
        let mut state = DraftState {
            synced: 10,
            base: 10,
            in_cache: 3,
            ..DraftState::default()
        };
        state.accepted(2);
        assert_eq!(state.synced, 12);
        assert_eq!(state.cache_rows(), 12);
        state.base = 20;
        state.accepted(4);
        assert_eq!(state.synced, 23, "the draft's last token was never run");
        // After a restart that left 100 context tokens out, the rows kept are the
        // context's less those: a rejected draft token's row is dropped, not kept.
        let mut restarted = DraftState {
            synced: 164,
            skipped: 100,
            base: 164,
            in_cache: 5,
            ..DraftState::default()
        };
        restarted.accepted(1);
        assert_eq!(restarted.synced, 165);
        assert_eq!(restarted.cache_rows(), 65, "64 caught up, 1 accepted");
    }

    #[test]
    fn sources_count_steps_drafts_and_acceptances_apart() {
        let mut s = DraftSources::default();
        s.record(DraftSource::Model, 4, 3);
        s.record(DraftSource::Request, 6, 6);
        s.record(DraftSource::Model, 0, 0);
        s.record(DraftSource::Global, 2, 0);
        assert_eq!(s.none, 1);
        assert_eq!(
            s.model,
            SourceCounts {
                steps: 1,
                drafted: 4,
                accepted: 3
            }
        );
        assert_eq!(
            s.suffix,
            SourceCounts {
                steps: 2,
                drafted: 8,
                accepted: 6
            }
        );
    }
}
