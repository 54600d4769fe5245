//! The generation engine: prefill, then speculate → verify → accept → extend, until eos,
//! a stop string or `max_tokens`. A room of its own above [`crate::model`] (the forward
//! pass it runs) and below [`crate::drafting`] (the drafters it asks for drafts):
//!
//! - this file: sequences, batching and the step (plan → forward pass → accept), and
//!   draft sizes by the cost curve; `sampling` the acceptance walks; `calibration` the
//!   learned acceptance factors; `hybrid` a draft model beside the trees; `drafter` the
//!   [`Drafter`] trait; `load` loading the model, tokenizer and template together.
//! - [`grammar`]: constrained decoding (structured outputs, tool calls) with llguidance.
//! - [`prefix`]: the keys and values of earlier prompts' prefixes, reused by later
//!   requests in the same namespace instead of prefilled again.
//! - [`cost`]: what a forward pass of K rows costs, measured at start and kept up to date.
//!
//! - Greedy decoding accepts the longest draft path that equals the model's own argmax
//!   choices, plus the model's next token: exactly the output of plain decoding.
//! - Sampling uses speculative sampling for deterministic drafts: at a node, child x is
//!   accepted with probability p(x); on rejection p(x) is set to 0 and p renormalised
//!   before the next child (the recursive rule for several children); when every child
//!   is rejected the token is drawn from what is left. This preserves the model's
//!   distribution exactly.
//! - Draft size follows the device's measured cost curve: a draft is cut to the k nodes
//!   that maximise (1 + expected accepted) / (t(1 + k) / t(1)), and dropped when plain
//!   decoding is better. Expected accepted is SCORE of the kept nodes, scaled by how well
//!   past SCOREs predicted acceptance.

mod accept;
mod calibration;
pub mod cost;
mod drafter;
pub mod grammar;
mod hybrid;
mod load;
mod penalties;
pub mod prefix;
mod prefix_cache;
mod sampling;

use std::time::Instant;

use candle_core::Tensor;

use crate::chat::ChatTemplate;
use crate::model::detokenizer::Detokenizer;
use crate::model::forward::{BatchEntry, KvCache, LogitRows, Model, ModelError};
use crate::model::tokenizer::ModelTokenizer;
use crate::speculate::Draft;
use calibration::Calibration;
use cost::CostCurve;
pub use drafter::{Drafter, NoDrafts};
use grammar::{Constraint, Grammar, GrammarCompiler, GrammarError};
pub use hybrid::{DEFAULT_TAU, DraftSources, SourceCounts};
pub use penalties::{
    ADDITIVE_PENALTY_RANGE, LOGIT_BIAS_RANGE, Penalties, REPETITION_PENALTY_RANGE,
};
use prefix::PrefixCache;
use sampling::Draws;
pub use sampling::{MAX_TOP_LOGPROBS, Sampling, TokenLogprob};

/// What to generate.
#[derive(Clone, Debug)]
pub struct GenerateOptions {
    /// Most new tokens.
    pub max_tokens: usize,
    /// Sampling; greedy by default.
    pub sampling: Sampling,
    /// Stop before any of these strings.
    pub stop: Vec<String>,
    /// Speculate (false: plain decoding).
    pub speculate: bool,
    /// Let the engine's draft model draft where the suffix draft is weak (hybrid mode,
    /// [`Engine::set_draft_model`]); no effect without one.
    pub draft_model: bool,
    /// The namespace the request belongs to: it reuses the cached prompt prefixes of
    /// earlier requests of this namespace only, and adds its own to them.
    pub namespace: String,
    /// Report each generated token's log-probability and this many most likely
    /// alternatives ([`TokenLogprob`]); None: none.
    pub logprobs: Option<usize>,
    /// Hold the answer to this grammar (constrained decoding); None: free text.
    pub grammar: Option<Grammar>,
    /// End the answer before a block between these delimiters that repeats one the
    /// answer already holds, text for text (a small model asked for tool calls repeats
    /// the call it just made until `max_tokens`); None: blocks may repeat.
    pub stop_on_repeat: Option<Delimiters>,
    /// Bias and penalties applied to the logits before each token is chosen; the
    /// default changes nothing.
    pub penalties: Penalties,
}

impl Default for GenerateOptions {
    /// 256 greedy tokens in the `default` namespace, speculating with every draft source,
    /// nothing else set (the server's own defaults); callers change the fields they mean
    /// with `..GenerateOptions::default()`.
    fn default() -> Self {
        GenerateOptions {
            max_tokens: 256,
            sampling: Sampling::default(),
            stop: Vec::new(),
            speculate: true,
            draft_model: true,
            namespace: "default".into(),
            logprobs: None,
            grammar: None,
            stop_on_repeat: None,
            penalties: Penalties::default(),
        }
    }
}

/// Where a block of the answer starts and ends ([`GenerateOptions::stop_on_repeat`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Delimiters {
    /// The text that opens a block.
    pub open: String,
    /// The text that closes it; empty: the block ends with the JSON object that starts
    /// at the first `{` from `open` on (Mistral's calls: an object of its list, which
    /// `open` begins, or a newer call's arguments).
    pub close: String,
}

impl Delimiters {
    /// Where the block that starts at `start` in `text` ends (past its close); None
    /// while it is open.
    fn block_end(&self, text: &str, start: usize) -> Option<usize> {
        if self.close.is_empty() {
            let object = start + text[start..].find('{')?;
            let mut values = serde_json::Deserializer::from_str(&text[object..])
                .into_iter::<serde_json::Value>();
            return matches!(values.next(), Some(Ok(_))).then(|| object + values.byte_offset());
        }
        let body = start + self.open.len();
        Some(body + text[body..].find(&self.close)? + self.close.len())
    }

    /// Where to cut `text` when one of its complete blocks repeats an earlier one: the
    /// start of the first such block, less the whitespace before it. None when no block
    /// repeats. Every block is looked at, since one step may accept several.
    pub fn repeat_at(&self, text: &str) -> Option<usize> {
        let mut from = 0;
        while let Some(start) = text[from..].find(&self.open).map(|i| from + i) {
            let end = self.block_end(text, start)?;
            if text[..start].contains(&text[start..end]) {
                return Some(text[..start].trim_end().len());
            }
            from = end;
        }
        None
    }

    /// Where to cut `text` when it ends in an unclosed block whose text so far begins
    /// an earlier block (the start of that block, less the whitespace before it): an
    /// answer cut by its length while repeating a block. None otherwise.
    pub fn unfinished_repeat_at(&self, text: &str) -> Option<usize> {
        let mut from = 0;
        let mut last = None;
        // The last block: found block by block, since an object's text may hold the
        // opening (a nested object's first key).
        while let Some(start) = text[from..].find(&self.open).map(|i| from + i) {
            match self.block_end(text, start) {
                Some(end) => from = end,
                None => {
                    last = Some(start);
                    break;
                }
            }
        }
        let start = last?;
        text[..start]
            .contains(&text[start..])
            .then(|| text[..start].trim_end().len())
    }
}

/// Why generation ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum FinishReason {
    /// eos or a stop string.
    Stop,
    /// `max_tokens` or the context limit.
    Length,
    /// The caller stopped it (a client went away).
    Cancelled,
}

/// A finished generation.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Generation {
    /// Generated token ids (eos and stop strings excluded).
    pub tokens: Vec<u32>,
    /// Their text.
    pub text: String,
    /// Prompt tokens.
    pub prompt_tokens: usize,
    /// Prompt tokens whose keys and values came from the prefix cache, not prefill.
    pub cached_prompt_tokens: usize,
    /// Verification steps (forward passes after prefill).
    pub steps: usize,
    /// Draft tokens sent to the model.
    pub drafted_tokens: usize,
    /// Draft tokens the model accepted.
    pub accepted_tokens: usize,
    /// Its verification steps' cost in single-token steps as the engine's cost curve
    /// puts it: the sum over steps of t(rows)/t(1), the pending token and the draft
    /// being the rows (a step of one row costs 1). Tokens over this are the speed-up
    /// the curve predicts, drafting's own time left out: a measure of how drafts would
    /// fare at another model's costs (`--cost-curve`).
    pub verify_cost: f64,
    /// Why it ended.
    pub finish_reason: FinishReason,
    /// Seconds spent in prefill.
    pub prefill_s: f64,
    /// Seconds from the end of prefill to the end.
    pub decode_s: f64,
    /// Generated tokens per second of decoding.
    pub tokens_per_s: f64,
    /// Each generated token's log-probability, when [`GenerateOptions::logprobs`] asked.
    pub logprobs: Option<Vec<TokenLogprob>>,
    /// Set when the answer's grammar could not go on ([`GenerateOptions::grammar`]):
    /// the answer is cut there and is no answer to the request.
    pub grammar_failure: Option<String>,
    /// Where its drafts came from: the suffix trees or the draft model, per step.
    pub sources: DraftSources,
}
/// The model, its tokenizer and template, and what the engine has learned of its costs.
pub struct Engine {
    model: Model,
    tokenizer: ModelTokenizer,
    template: Option<ChatTemplate>,
    eos: Vec<u32>,
    cost: CostCurve,
    /// How well SCORE predicted acceptance, per draft source.
    calibration: Calibration,
    /// Earlier requests' prompt prefixes (off until given a budget).
    prefix: PrefixCache,
    /// The draft model of hybrid mode, if any.
    draft: Option<hybrid::DraftModel>,
}

impl Engine {
    /// An engine over a loaded model. `<|endoftext|>` also ends a generation when the
    /// vocabulary has it.
    fn new(
        model: Model,
        tokenizer: ModelTokenizer,
        template: Option<ChatTemplate>,
        mut eos: Vec<u32>,
    ) -> Self {
        eos.extend(tokenizer.token_id("<|endoftext|>"));
        eos.sort_unstable();
        eos.dedup();
        let cfg = model.config();
        let prefix = PrefixCache::new(cfg.layers, cfg.kv_heads * cfg.head_dim, 0);
        Engine {
            prefix,
            model,
            tokenizer,
            template,
            eos,
            cost: CostCurve::flat(),
            calibration: Calibration::default(),
            draft: None,
        }
    }

    /// The tokenizer.
    pub fn tokenizer(&self) -> &ModelTokenizer {
        &self.tokenizer
    }

    /// Which tokenizer the model uses, to check snapshots and logs against.
    pub fn tokenizer_identity(&self) -> crate::vocab::TokenizerId {
        use crate::vocab::TextEncoder;
        self.tokenizer.identity()
    }

    /// A grammar compiler for this model's vocabulary and end-of-sequence tokens.
    pub fn grammar_compiler(&self) -> Result<GrammarCompiler, GrammarError> {
        GrammarCompiler::new(&self.tokenizer, self.model.config().vocab, &self.eos)
    }

    /// The chat template, if the model has one.
    pub fn template(&self) -> Option<&ChatTemplate> {
        self.template.as_ref()
    }

    /// The tokens that end generation.
    pub fn eos(&self) -> &[u32] {
        &self.eos
    }

    /// The model's context length (KV capacity).
    pub fn context_len(&self) -> usize {
        self.model.config().context
    }

    /// The cost curve in use.
    pub fn cost_curve(&self) -> &CostCurve {
        &self.cost
    }

    /// Use `curve` instead of measuring.
    pub fn set_cost_curve(&mut self, curve: CostCurve) {
        self.cost = curve;
    }

    /// Measure t(K)/t(1) on this device for K up to `max_k`, after a `context`-token
    /// prefix: the median of `repeats` runs for each K.
    pub fn measure_cost_curve(
        &mut self,
        max_k: usize,
        context: usize,
        repeats: usize,
    ) -> Result<&CostCurve, ModelError> {
        let mut cache = KvCache::default();
        let ctx = context.min(self.context_len().saturating_sub(max_k + 1));
        let prefix: Vec<u32> = (0..ctx as u32).map(|i| 100 + i % 1000).collect();
        for chunk in prefix.chunks(PREFILL_CHUNK) {
            self.model
                .forward(&mut cache, chunk, &chain_parents(chunk.len()))?;
            cache.commit(&(0..chunk.len()).collect::<Vec<_>>())?;
        }
        let mut ks = vec![1usize, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128];
        ks.retain(|&k| k <= max_k.max(1));
        // Rounds over every K, rather than all repeats of one K in a row, so that a burst
        // of load on a shared machine falls on one run of several K, not on all runs of
        // one K, and the medians shrug it off.
        let mut runs: Vec<Vec<f64>> = vec![Vec::new(); ks.len()];
        for _ in 0..repeats.max(1) {
            for (&k, runs) in ks.iter().zip(&mut runs) {
                let tokens: Vec<u32> = (0..k as u32).map(|i| 200 + i).collect();
                let parents = chain_parents(k);
                let t = Instant::now();
                let logits = self.model.forward(&mut cache, &tokens, &parents)?;
                self.model.argmax_rows(&logits)?;
                runs.push(t.elapsed().as_secs_f64());
                cache.commit(&[])?;
            }
        }
        let times: Vec<f64> = runs
            .iter_mut()
            .map(|r| {
                r.sort_by(f64::total_cmp);
                r[r.len() / 2]
            })
            .collect();
        let t1 = times[0];
        let mut points: Vec<(usize, f64)> =
            ks.iter().zip(&times).map(|(&k, &t)| (k, t / t1)).collect();
        // Costs never fall with K; noise sometimes says otherwise.
        for i in 1..points.len() {
            points[i].1 = points[i].1.max(points[i - 1].1);
        }
        points[0].1 = 1.0;
        self.cost = CostCurve::new(points, t1 * 1e3);
        Ok(&self.cost)
    }

    /// Cut the drafts of one batched step to what pays for its rows
    /// ([`CostCurve::best_cut`]), valuing each node at its path's probabilities, each
    /// corrected by how often tokens of its source have lately been accepted.
    /// `fixed_rows` run whatever is drafted (prefill chunks and each decoding
    /// sequence's pending token).
    pub fn allocate_drafts(&mut self, fixed_rows: usize, drafts: &mut [&mut Draft]) {
        let values: Vec<Vec<f64>> = drafts.iter().map(|d| self.calibration.values(d)).collect();
        let cut = self.cost.best_cut(fixed_rows, &values);
        for (draft, &k) in drafts.iter_mut().zip(&cut) {
            if k == 0 && !draft.is_empty() {
                self.calibration.refused(draft);
            }
            draft.truncate(k);
        }
    }

    /// Where the answer's text holds its earliest stop string, if it holds one.
    fn stop_at(text: &Detokenizer, stops: &[String]) -> Option<usize> {
        stops
            .iter()
            .filter(|s| !s.is_empty())
            .filter_map(|s| text.text().find(s.as_str()))
            .min()
    }

    /// Start a request: check it, and set up its cache (with the longest prefix of its
    /// prompt that its namespace has cached) and its own suffix tree. Run it with
    /// [`Engine::step`] until [`Sequence::is_finished`], then [`Engine::finish`].
    pub fn start(
        &mut self,
        prompt: &[u32],
        opts: &GenerateOptions,
    ) -> Result<Sequence, ModelError> {
        if prompt.is_empty() {
            return Err(ModelError::BadPrompt("the prompt is empty".into()));
        }
        let vocab = self.model.config().vocab;
        if let Some(&bad) = prompt.iter().find(|&&t| t as usize >= vocab) {
            return Err(ModelError::BadPrompt(format!(
                "token id {bad} is outside the model's vocabulary of {vocab}"
            )));
        }
        if prompt.len() >= self.context_len() {
            return Err(ModelError::ContextFull {
                needed: prompt.len() + 1,
                capacity: self.context_len(),
            });
        }
        let mut seq = Sequence {
            opts: opts.clone(),
            cache: KvCache::default(),
            context: prompt.to_vec(),
            prompt_len: prompt.len(),
            prefilled: 0,
            reused: 0,
            pending: prompt[prompt.len() - 1],
            out: Vec::new(),
            text: Detokenizer::new(),
            emitted: 0,
            emitted_text: 0,
            logprobs: Vec::new(),
            draws: Draws::new(opts.sampling.seed),
            constraint: opts.grammar.as_ref().map(Grammar::start),
            seen: (!opts.penalties.is_none()).then(|| opts.penalties.seen_for(prompt)),
            grammar_failure: None,
            draft: None,
            sources: DraftSources::default(),
            steps: 0,
            drafted: 0,
            accepted: 0,
            verify_cost: 0.0,
            finish: if opts.max_tokens == 0 {
                Some(FinishReason::Length)
            } else {
                None
            },
            started: Instant::now(),
            prefill_s: 0.0,
            decode_start: None,
        };
        // Prefill runs all but the prompt's last token (decoding starts from it).
        let reused =
            self.prefix
                .restore(&opts.namespace, &prompt[..prompt.len() - 1], &mut seq.cache);
        seq.prefilled = reused;
        seq.reused = reused;
        if reused > 0 && !seq.in_prefill() {
            seq.prefill_s = seq.started.elapsed().as_secs_f64();
        }
        Ok(seq)
    }

    /// One forward pass for every unfinished sequence in `batch`: a prefill chunk for
    /// those still reading their prompt, and pending token + draft for the others, with
    /// drafts cut to what the cost curve says the whole batch gains from.
    pub fn step(
        &mut self,
        batch: &mut [(&mut Sequence, &mut dyn Drafter)],
    ) -> Result<StepReport, ModelError> {
        let mut report = StepReport::default();
        let plans = self.plan(batch, &mut report);
        let Some(pass) = self.forward(batch, &plans, &mut report)? else {
            return Ok(report);
        };
        self.accept(batch, plans, pass, &mut report)?;
        Ok(report)
    }

    /// What each sequence of `batch` runs in this step. A decoding sequence's draft goes
    /// through the drafting stages in order:
    /// 1. the suffix draft, from the sequence's drafter ([`Engine::suffix_draft`]);
    /// 2. cut to the model's vocabulary ([`cut_to_vocabulary`]);
    /// 3. shaped by its grammar, if constrained ([`Engine::suffix_draft`]);
    /// 4. the draft model's offer where the suffix draft is weak (hybrid mode,
    ///    [`Engine::offer_draft_model`]);
    /// 5. the batch's allocation: each draft cut to what the whole batch gains from
    ///    ([`Engine::allocate_drafts`]), then to the room its sequence has left
    ///    ([`fit_to_room`]), and put after its pending token.
    fn plan(
        &mut self,
        batch: &mut [(&mut Sequence, &mut dyn Drafter)],
        report: &mut StepReport,
    ) -> Vec<Plan> {
        let context_len = self.context_len();
        let mut prefill_rows = 0;
        let mut plans: Vec<Plan> = Vec::with_capacity(batch.len());
        for (seq, drafter) in batch.iter_mut() {
            if seq.finish.is_none() && seq.cache.len() >= context_len {
                seq.finish = Some(FinishReason::Length);
            }
            if seq.finish.is_some() {
                plans.push(Plan::Idle);
            } else if seq.in_prefill() {
                let end = (seq.prefilled + PREFILL_CHUNK).min(seq.prompt_len - 1);
                let tokens = seq.context[seq.prefilled..end].to_vec();
                prefill_rows += tokens.len();
                let parents = chain_parents(tokens.len());
                plans.push(Plan::Prefill { tokens, parents });
            } else {
                plans.push(Plan::Verify {
                    draft: self.suffix_draft(seq, &mut **drafter, report),
                    tokens: Vec::new(),
                    parents: Vec::new(),
                });
            }
        }
        self.offer_draft_model(batch, &mut plans, report);
        let decoding = plans
            .iter()
            .filter(|p| matches!(p, Plan::Verify { .. }))
            .count();
        let mut drafts: Vec<&mut Draft> = plans
            .iter_mut()
            .filter_map(|p| match p {
                Plan::Verify { draft, .. } => Some(draft),
                _ => None,
            })
            .collect();
        self.allocate_drafts(prefill_rows + decoding, &mut drafts);
        for ((seq, _), plan) in batch.iter().zip(plans.iter_mut()) {
            if let Plan::Verify {
                draft,
                tokens,
                parents,
            } = plan
            {
                fit_to_room(seq, draft, context_len);
                tokens.push(seq.pending);
                tokens.extend_from_slice(&draft.tokens);
                parents.push(-1);
                parents.extend(draft.parents.iter().map(|&p| p + 1));
            }
        }
        plans
    }

    /// Stages 1–3 of a decoding sequence's draft: its drafter's suffix draft, cut to the
    /// vocabulary and shaped by its grammar. Empty when the sequence does not speculate,
    /// or when its grammar cannot shape the draft (logged; the step runs without one).
    fn suffix_draft(
        &self,
        seq: &mut Sequence,
        drafter: &mut dyn Drafter,
        report: &mut StepReport,
    ) -> Draft {
        if !seq.opts.speculate {
            return Draft::default();
        }
        let t = Instant::now();
        let mut draft = drafter.draft(&seq.context);
        report.draft_s.push(t.elapsed().as_secs_f64());
        cut_to_vocabulary(&mut draft, self.model.config().vocab);
        if let Some(constraint) = seq.constraint.as_mut()
            && let Err(e) = constraint.shape_draft(&mut draft)
        {
            tracing::error!("{e}; the step runs without a draft");
            return Draft::default();
        }
        draft
    }

    /// The forward pass over every planned row; `None` when nothing runs.
    fn forward(
        &mut self,
        batch: &mut [(&mut Sequence, &mut dyn Drafter)],
        plans: &[Plan],
        report: &mut StepReport,
    ) -> Result<Option<Pass>, ModelError> {
        let mut entries: Vec<BatchEntry<'_>> = Vec::with_capacity(batch.len());
        let mut prefill_rows = 0;
        for ((seq, _), plan) in batch.iter_mut().zip(plans) {
            let (tokens, parents, logits) = match plan {
                Plan::Idle => continue,
                Plan::Prefill { tokens, parents } => {
                    prefill_rows += tokens.len();
                    (tokens, parents, LogitRows::None)
                }
                Plan::Verify {
                    tokens, parents, ..
                } => (tokens, parents, LogitRows::All),
            };
            entries.push(BatchEntry {
                cache: &mut seq.cache,
                tokens,
                parents,
                logits,
            });
        }
        if entries.is_empty() {
            return Ok(None);
        }
        report.sequences = entries.len();
        report.rows = entries.iter().map(|e| e.tokens.len()).sum();
        let started = Instant::now();
        let logits = self.model.forward_batch(&mut entries)?;
        Ok(Some(Pass {
            logits,
            started,
            decoding_only: prefill_rows == 0,
        }))
    }

    /// Time the pass once its logits are ready (a GPU returns from `forward_batch` as
    /// soon as the pass is queued, so the clock stops at the first read of its results,
    /// as it does when the cost curve is measured), and learn what its rows cost.
    fn observe_pass(&mut self, pass: &Pass, report: &mut StepReport) {
        report.verify_s = pass.started.elapsed().as_secs_f64();
        // Prefill rows skip the output head, so only pure decoding steps say what
        // drafting rows cost.
        if pass.decoding_only {
            self.cost.observe(report.rows, report.verify_s);
            if let Some(draft) = self.draft.as_mut() {
                draft.observe_target(report.verify_s, &self.cost, report.rows);
            }
        }
    }

    /// The result of a finished (or abandoned) sequence. Its context (prompt and
    /// answer) is offered to the prefix cache: the next turn of a conversation resends it.
    pub fn finish(&mut self, seq: Sequence) -> Generation {
        let decode_s = seq.decode_start.map_or(0.0, |t| t.elapsed().as_secs_f64());
        // The cache's rows are the context's tokens up to the shorter of the two: an
        // accepted path cut at eos leaves rows past the context's end.
        let rows = seq.cache.len().min(seq.context.len());
        self.prefix
            .insert(&seq.opts.namespace, &seq.context[..rows], &seq.cache);
        let text = seq
            .text
            .finish(&self.tokenizer, &seq.out)
            .unwrap_or_else(|e| {
                tracing::error!("{e} ({} generated ids)", seq.out.len());
                seq.text.text().to_string()
            });
        Generation {
            tokens_per_s: seq.out.len() as f64 / decode_s.max(1e-9),
            tokens: seq.out,
            text,
            prompt_tokens: seq.prompt_len,
            cached_prompt_tokens: seq.reused,
            steps: seq.steps,
            drafted_tokens: seq.drafted,
            accepted_tokens: seq.accepted,
            verify_cost: seq.verify_cost,
            finish_reason: seq.finish.unwrap_or(FinishReason::Cancelled),
            prefill_s: seq.prefill_s,
            decode_s,
            logprobs: seq.opts.logprobs.map(|_| seq.logprobs),
            grammar_failure: seq.grammar_failure,
            sources: seq.sources,
        }
    }

    /// Generate from `prompt` (token ids) alone. `on_tokens` gets each batch of new
    /// tokens as it is accepted and returns false to cancel.
    pub fn generate(
        &mut self,
        prompt: &[u32],
        opts: &GenerateOptions,
        drafter: &mut dyn Drafter,
        on_tokens: &mut dyn FnMut(&[u32]) -> bool,
    ) -> Result<Generation, ModelError> {
        let mut seq = self.start(prompt, opts)?;
        while !seq.is_finished() {
            self.step(&mut [(&mut seq, &mut *drafter)])?;
            let new = seq.take_new().tokens;
            if !new.is_empty() && !on_tokens(new) {
                seq.cancel();
            }
        }
        Ok(self.finish(seq))
    }
}

/// Cut `draft` before its first token outside the vocabulary: a damaged cache may hold
/// ids the model does not have, and they cost a draft, never the pass. Children follow
/// their parents, so a cut at the first bad one keeps a tree.
fn cut_to_vocabulary(draft: &mut Draft, vocab: usize) {
    if let Some(bad) = draft.tokens.iter().position(|&t| t as usize >= vocab) {
        draft.truncate(bad);
    }
}

/// A draft cut to the rows its sequence has room for: the pending token and the draft
/// fit in the context window, and the draft is no longer than the tokens still allowed
/// after the one the pass surely produces.
fn fit_to_room(seq: &Sequence, draft: &mut Draft, context_len: usize) {
    let room = context_len - seq.cache.len();
    draft.truncate(
        draft
            .len()
            .min(room - 1)
            .min(seq.opts.max_tokens - seq.out.len() - 1),
    );
}

/// Where the longest end of `text` that is the start of one of `stops` (and not a
/// whole stop string, which is cut as soon as it appears) begins; `text.len()` when no
/// end of it is.
fn stop_prefix_start(text: &str, stops: &[String]) -> usize {
    let mut start = text.len();
    for stop in stops {
        // The longest proper prefix of `stop` that `text` ends with.
        let longest = (1..stop.len().min(text.len() + 1))
            .rev()
            .find(|&n| stop.is_char_boundary(n) && text.ends_with(&stop[..n]));
        if let Some(n) = longest {
            start = start.min(text.len() - n);
        }
    }
    start
}

/// What one sequence runs in a step.
enum Plan {
    /// Nothing: it is finished.
    Idle,
    /// A chunk of its prompt, into the cache.
    Prefill {
        /// The chunk.
        tokens: Vec<u32>,
        /// A chain: each token follows the one before.
        parents: Vec<i32>,
    },
    /// Its pending token followed by its draft, verified.
    Verify {
        /// The draft, cut to what pays.
        draft: Draft,
        /// The pending token, then the draft's tokens.
        tokens: Vec<u32>,
        /// Their parents: -1 for the pending token, the draft's own shifted by one.
        parents: Vec<i32>,
    },
}

/// A forward pass under way: its logits (maybe still being computed on a GPU), when it
/// started, and whether it ran decoding rows alone.
struct Pass {
    logits: Tensor,
    started: Instant,
    decoding_only: bool,
}

/// What one [`Engine::step`] did, for metrics.
#[derive(Clone, Debug, Default)]
pub struct StepReport {
    /// Seconds each decoding sequence spent drafting.
    pub draft_s: Vec<f64>,
    /// Seconds of the forward pass (verification and prefill chunks), until its results
    /// were ready on the host.
    pub verify_s: f64,
    /// Sequences in the forward pass.
    pub sequences: usize,
    /// Rows (tokens) in the forward pass.
    pub rows: usize,
    /// Draft tokens accepted, per decoding sequence.
    pub accepted: Vec<usize>,
    /// Where this step's drafts came from, and the draft model's time.
    pub sources: DraftSources,
}

/// Prompt tokens per prefill pass.
const PREFILL_CHUNK: usize = 256;

/// Parents of a plain chain of `n` tokens: each follows the one before.
fn chain_parents(n: usize) -> Vec<i32> {
    (0..n as i32).map(|i| i - 1).collect()
}

/// What a sequence generated since it was last asked ([`Sequence::take_new`]).
#[derive(Debug)]
pub struct NewOutput<'a> {
    /// The new tokens.
    pub tokens: &'a [u32],
    /// Their log-probabilities, when the options ask for them (else empty).
    pub logprobs: &'a [TokenLogprob],
    /// The text they add to the answer.
    pub text: &'a str,
}

/// A request in flight: its KV cache and what it has generated. What it drafts from
/// is its [`Drafter`]'s.
pub struct Sequence {
    opts: GenerateOptions,
    cache: KvCache,
    /// Prompt + generated tokens.
    context: Vec<u32>,
    prompt_len: usize,
    /// Prompt tokens (all but the last, which decoding starts from) in the cache.
    prefilled: usize,
    /// Of those, the ones restored from the prefix cache.
    reused: usize,
    /// The newest token, not yet in the cache.
    pending: u32,
    out: Vec<u32>,
    /// The text of `out`, decoded as it grows (stop strings are looked for in it).
    text: Detokenizer,
    /// Tokens of `out` already handed out by [`Sequence::take_new`].
    emitted: usize,
    /// Bytes of `text` already handed out with them.
    emitted_text: usize,
    /// The log-probability of each token of `out`, when the options ask for them.
    logprobs: Vec<TokenLogprob>,
    /// The uniform numbers its sampled tokens are drawn with.
    draws: Draws,
    /// The grammar's state after `out`, when the options constrain the answer.
    constraint: Option<Constraint>,
    /// What the penalties read (the prompt and the answer so far), when the options ask
    /// for any.
    seen: Option<penalties::Seen>,
    /// Why the grammar could not go on, if it could not.
    grammar_failure: Option<String>,
    /// The draft model's cache for this request, once it has drafted (hybrid mode).
    draft: Option<hybrid::DraftState>,
    /// Where its drafts came from.
    sources: DraftSources,
    steps: usize,
    drafted: usize,
    accepted: usize,
    /// See [`Generation::verify_cost`].
    verify_cost: f64,
    finish: Option<FinishReason>,
    started: Instant,
    prefill_s: f64,
    decode_start: Option<Instant>,
}

impl Sequence {
    fn in_prefill(&self) -> bool {
        self.prefilled + 1 < self.prompt_len
    }

    /// True once it hit eos, a stop string, its limits, or was cancelled.
    pub fn is_finished(&self) -> bool {
        self.finish.is_some()
    }

    /// Generated tokens so far.
    pub fn tokens(&self) -> &[u32] {
        &self.out
    }

    /// What was generated since the last call: the tokens, their log-probabilities
    /// when the options ask for them (else empty), and their text, decoded once here so
    /// that no one decodes it again. While the sequence runs, tokens whose text may be
    /// the start of a stop string are held back until it is known whether the stop
    /// string follows (then they are cut from the answer) or not: a stream's tokens are
    /// the finished answer's, never a stop string's first characters. A token that ends
    /// inside a character adds its text with the token that completes it.
    pub fn take_new(&mut self) -> NewOutput<'_> {
        let ready = if self.is_finished() {
            self.out.len()
        } else {
            let held_from = stop_prefix_start(self.text.text(), &self.opts.stop);
            self.text.tokens_before(held_from).min(self.out.len())
        };
        let from = self.emitted.min(ready);
        self.emitted = self.emitted.max(ready);
        let text_end = self.text.text_len_of(ready);
        let text_from = self.emitted_text.min(text_end);
        self.emitted_text = self.emitted_text.max(text_end);
        NewOutput {
            tokens: &self.out[from..ready],
            logprobs: self.logprobs.get(from..ready).unwrap_or_default(),
            text: &self.text.text()[text_from..text_end],
        }
    }

    /// Keep the most tokens whose text ends at or before byte `at` of the answer's
    /// text, with their log-probabilities.
    fn cut_text_at(&mut self, at: usize) {
        let keep = self.text.tokens_before(at);
        self.out.truncate(keep);
        self.logprobs.truncate(keep);
        self.text.truncate(keep);
    }

    /// Stop it: the caller went away.
    pub fn cancel(&mut self) {
        self.finish = Some(FinishReason::Cancelled);
    }
}

#[cfg(test)]
mod tests {
    use super::stop_prefix_start;

    #[test]
    fn a_repeated_block_is_found_where_it_starts() {
        let d = super::Delimiters {
            open: "<c>".into(),
            close: "</c>".into(),
        };
        assert_eq!(d.repeat_at("<c>a</c>"), None);
        assert_eq!(d.repeat_at("<c>a</c>\n<c>b</c>"), None);
        assert_eq!(d.repeat_at("<c>a</c>\n<c>a"), None, "not complete yet");
        assert_eq!(d.repeat_at("x <c>a</c>\n<c>a</c>\n"), Some(10));
        assert_eq!(d.repeat_at("<c>a</c><c>b</c> <c>a</c>"), Some(16));
        // One step may accept several blocks: the first repeat is where to cut.
        assert_eq!(d.repeat_at("<c>a</c>\n<c>a</c>\n<c>a</c>"), Some(8));
        assert_eq!(d.unfinished_repeat_at("<c>ab</c>\n<c>a"), Some(9));
        assert_eq!(d.unfinished_repeat_at("<c>ab</c>\n<c>b"), None);
        assert_eq!(
            d.unfinished_repeat_at("<c>ab</c>\n<c>ab</c>"),
            None,
            "complete"
        );
        assert_eq!(d.unfinished_repeat_at("<c>ab</c>"), None);
    }

    /// Blocks that are JSON objects (an empty close): each ends where its object does,
    /// and an opening inside an object (a nested `{"name": ..}`) is not a block.
    #[test]
    fn a_repeated_object_is_found_where_it_starts() {
        let d = super::Delimiters {
            open: "{\"name\": ".into(),
            close: String::new(),
        };
        let call = r#"{"name": "f", "arguments": {"who": {"name": "Ana"}}}"#;
        assert_eq!(d.repeat_at(&format!("[{call}]")), None);
        let other = r#"{"name": "f", "arguments": {"who": {"name": "Bo"}}}"#;
        assert_eq!(d.repeat_at(&format!("[{call}, {other}]")), None);
        let twice = format!("[{call}, {call}]");
        assert_eq!(d.repeat_at(&twice), Some(call.len() + 2));
        assert_eq!(
            d.unfinished_repeat_at(&format!("[{call}, {}", &call[..30])),
            Some(call.len() + 2)
        );
        assert_eq!(
            d.unfinished_repeat_at(&format!("[{call}, {}", &other[..46])),
            None
        );
        assert_eq!(d.unfinished_repeat_at(&format!("[{call}")), None);

        // Mistral's newer calls: from `[TOOL_CALLS]` to the end of the arguments.
        let d = super::Delimiters {
            open: "[TOOL_CALLS]".into(),
            close: String::new(),
        };
        let call = r#"[TOOL_CALLS]f[ARGS]{"who": {"name": "Ana"}}"#;
        let other = r#"[TOOL_CALLS]g[ARGS]{"who": {"name": "Ana"}}"#;
        assert_eq!(d.repeat_at(&format!("Hi.{call}{other}")), None);
        assert_eq!(
            d.repeat_at(&format!("Hi.{call} {call}")),
            Some(3 + call.len())
        );
        assert_eq!(
            d.unfinished_repeat_at(&format!("{call}{}", &call[..25])),
            Some(call.len())
        );
    }

    #[test]
    fn text_that_may_start_a_stop_string_is_held_back() {
        let stops = |s: &[&str]| s.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(stop_prefix_start("1, 2, 3, 4,", &stops(&["4, 5"])), 9);
        assert_eq!(stop_prefix_start("1, 2, 3, 4", &stops(&["4, 5"])), 9);
        assert_eq!(stop_prefix_start("1, 2, 3, ", &stops(&["4, 5"])), 9);
        // The earliest start over every stop string.
        let two = stops(&["\nObservation:", "3, 4, 9"]);
        assert_eq!(stop_prefix_start("1, 2, 3, 4", &two), 6);
        assert_eq!(stop_prefix_start("Thought: x\nObs", &two), 10);
        assert_eq!(stop_prefix_start("abc", &[]), 3);
        assert_eq!(stop_prefix_start("", &stops(&["x"])), 0);
        // Multi-byte characters: prefixes end on character boundaries.
        assert_eq!(stop_prefix_start("café ", &stops(&["é!"])), 6);
        assert_eq!(stop_prefix_start("caf\u{e9}", &stops(&["\u{e9}!"])), 3);
    }
}
