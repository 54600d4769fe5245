//! The generation engine: prefill, then speculate → verify → accept → extend, until eos,
//! a stop string or `max_tokens`.
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

use std::path::Path;
use std::time::Instant;

use candle_core::quantized::gguf_file;
use candle_core::{Device, Tensor};
use rand::{Rng, SeedableRng};

use crate::speculate::{Draft, DraftSource, SpecParams, Speculator};
use crate::tree::{GlobalIndex, RequestTree};

use super::chat::ChatTemplate;
use super::cost::CostCurve;
use super::model::{BatchEntry, KvCache, Model, ModelError, WeightFormat, argmax_rows};
use super::tokenizer::ModelTokenizer;

/// Where drafts come from.
pub trait Drafter {
    /// The draft for `context` (prompt + generated), given the request's own tree.
    fn draft(&mut self, request: &RequestTree, context: &[u32]) -> Draft;

    /// Called after a verified step whose draft had `accepted` tokens accepted;
    /// `context` ends with those accepted tokens.
    fn accepted(&mut self, _context: &[u32], _draft: &Draft, _accepted: usize) {}
}

/// Drafts from nothing: plain decoding.
pub struct NoDrafts;

impl Drafter for NoDrafts {
    fn draft(&mut self, _: &RequestTree, _: &[u32]) -> Draft {
        Draft::default()
    }
}

/// Drafts from a global index and the request tree.
pub struct IndexDrafter<'a, G: GlobalIndex> {
    /// The global tree (or layered view).
    pub index: &'a G,
    /// Speculation parameters.
    pub params: SpecParams,
    /// Reused speculation state.
    pub speculator: Speculator<G::Cursor>,
}

impl<'a, G: GlobalIndex> IndexDrafter<'a, G> {
    /// Drafts from `index` with `params`.
    pub fn new(index: &'a G, params: SpecParams) -> Self
    where
        G::Cursor: Clone,
    {
        Self {
            index,
            params,
            speculator: Speculator::default(),
        }
    }
}

impl<G: GlobalIndex> Drafter for IndexDrafter<'_, G> {
    fn draft(&mut self, request: &RequestTree, context: &[u32]) -> Draft {
        self.speculator
            .speculate(Some(request), self.index, context, &self.params)
    }
}

/// Sampling parameters; temperature 0 is greedy.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Sampling {
    /// Temperature; 0 means greedy.
    pub temperature: f32,
    /// Nucleus mass (1 keeps everything).
    pub top_p: f32,
    /// Keep only the k most likely tokens (0 keeps everything).
    pub top_k: usize,
    /// Seed of the random stream.
    pub seed: u64,
}

impl Default for Sampling {
    fn default() -> Self {
        Sampling {
            temperature: 0.0,
            top_p: 1.0,
            top_k: 0,
            seed: 0,
        }
    }
}

impl Sampling {
    /// The sampling distribution from one row of logits: temperature, then top-k, then
    /// top-p, renormalised.
    pub fn distribution(&self, logits: &[f32]) -> Vec<f32> {
        let t = self.temperature.max(1e-6);
        let max = logits.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
        let mut p: Vec<f32> = logits.iter().map(|&l| ((l - max) / t).exp()).collect();
        let keep_k = self.top_k > 0 && self.top_k < p.len();
        if keep_k || self.top_p < 1.0 {
            let mut order: Vec<usize> = (0..p.len()).collect();
            order.sort_by(|&a, &b| p[b].total_cmp(&p[a]).then(a.cmp(&b)));
            let total: f32 = p.iter().sum();
            let mut mass = 0.0;
            let mut cut = order.len();
            for (rank, &i) in order.iter().enumerate() {
                if keep_k && rank >= self.top_k {
                    cut = rank;
                    break;
                }
                mass += p[i] / total;
                if mass >= self.top_p {
                    cut = rank + 1;
                    break;
                }
            }
            for &i in &order[cut..] {
                p[i] = 0.0;
            }
        }
        let total: f32 = p.iter().sum();
        p.iter_mut().for_each(|x| *x /= total);
        p
    }
}

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
    /// Verification steps (forward passes after prefill).
    pub steps: usize,
    /// Draft tokens sent to the model.
    pub drafted_tokens: usize,
    /// Draft tokens the model accepted.
    pub accepted_tokens: usize,
    /// Why it ended.
    pub finish_reason: FinishReason,
    /// Seconds spent in prefill.
    pub prefill_s: f64,
    /// Seconds from the end of prefill to the end.
    pub decode_s: f64,
    /// Generated tokens per second of decoding.
    pub tokens_per_s: f64,
}

/// How far the draft's token probabilities are from the truth, per draft source (the
/// request's own text, the global tree, both): a copy from the prompt and a guess from
/// other requests' answers are right at very different rates, and the recent past
/// predicts the next step best.
///
/// The correction is per token, not per draft. Each node's probability given its parent
/// (a count ratio, often 1 from a single sighting) is scaled by the source's factor q,
/// so a node's worth is the product of the corrected ratios along its path. A scale on
/// the draft's SCORE instead treats the 24th token of a once-seen path like the first:
/// on open chat, 24-token copies of a phrase from the prompt were verified at 3.8 times
/// the cost of a plain step for 0.4 accepted tokens, while SCORE × factor still promised
/// several. With a per-token q of 0.3 the same draft is worth 0.4, as observed.
///
/// q is learned level by level along the accepted path: at each level the model's token
/// was expected among the node's draft children with their summed (uncorrected)
/// probability, and it was or was not there.
#[derive(Clone, Debug)]
struct Calibration {
    /// Per [`DraftSource`]: moving averages of the expected and the realised levels
    /// accepted per verified draft.
    buckets: [(f64, f64); 4],
}

impl Default for Calibration {
    fn default() -> Self {
        // Start by trusting the counts, with the weight of a few steps.
        Calibration {
            buckets: [(1.0, 1.0); 4],
        }
    }
}

impl Calibration {
    /// Weight of the newest verified draft in the moving averages.
    const RATE: f64 = 0.15;
    /// How fast an unused source drifts back to trusting its counts, per refused draft.
    /// Slow: on open chat each drift back to trust buys a failed verification, while a
    /// source that turned good again is found within a few hundred steps.
    const DRIFT: f64 = 0.01;

    fn index(source: DraftSource) -> usize {
        match source {
            DraftSource::None => 0,
            DraftSource::Request => 1,
            DraftSource::Global => 2,
            DraftSource::Both => 3,
        }
    }

    /// The factor q on each token's conditional probability.
    fn factor(&self, source: DraftSource) -> f64 {
        let (expected, observed) = self.buckets[Self::index(source)];
        (observed / expected.max(1e-6)).clamp(0.02, 1.5)
    }

    /// Each node's expected worth: the product of its path's conditional probabilities,
    /// each times q and at most 1.
    fn values(&self, draft: &Draft) -> Vec<f64> {
        let q = self.factor(draft.source);
        let mut values: Vec<f64> = Vec::with_capacity(draft.len());
        for (i, &parent) in draft.parents.iter().enumerate() {
            let parent_value = usize::try_from(parent).map_or(1.0, |p| values[p]);
            values.push(parent_value * (q * given_parent(draft, i)).min(1.0));
        }
        values
    }

    /// A draft of this source was not worth verifying: with no new evidence, drift back
    /// towards trusting the counts, so that one bad stretch does not stop drafting for
    /// good.
    fn refused(&mut self, source: DraftSource) {
        let b = &mut self.buckets[Self::index(source)];
        b.1 += Self::DRIFT * (b.0 - b.1).max(0.0);
    }

    /// Learn from a verified draft and the draft nodes the model accepted, in order.
    fn observe(&mut self, draft: &Draft, accepted: &[usize]) {
        let (expected, observed) = level_trials(draft, accepted);
        if expected <= 0.0 {
            return;
        }
        let b = &mut self.buckets[Self::index(draft.source)];
        b.0 += Self::RATE * (expected - b.0);
        b.1 += Self::RATE * (observed - b.1);
    }
}

/// Draft node `i`'s probability given its parent (the context for a root child), at
/// most 1.
fn given_parent(draft: &Draft, i: usize) -> f64 {
    let parent_prob = usize::try_from(draft.parents[i]).map_or(1.0, |p| f64::from(draft.probs[p]));
    (f64::from(draft.probs[i]) / parent_prob.max(1e-9)).min(1.0)
}

/// The levels of a verified draft, walked along its accepted path: at each level the
/// model's token was expected among the current node's children with the sum of their
/// probabilities given that node, and found there (1) or not (0). Returns the expected
/// and the realised number of levels accepted.
fn level_trials(draft: &Draft, accepted: &[usize]) -> (f64, f64) {
    let mut expected = 0.0;
    let mut node = -1i32;
    let mut level = 0;
    loop {
        let children: f64 = (0..draft.len())
            .filter(|&i| draft.parents[i] == node)
            .map(|i| given_parent(draft, i))
            .sum();
        if children == 0.0 {
            break;
        }
        expected += children.min(1.0);
        match accepted.get(level) {
            Some(&next) => node = next as i32,
            None => break,
        }
        level += 1;
    }
    (expected, accepted.len() as f64)
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
}

impl Engine {
    /// Load a model: a llama GGUF file, or a Hugging Face directory (`config.json`,
    /// `tokenizer.json`, safetensors weights, and `tokenizer_config.json` for the chat
    /// template).
    pub fn load(
        path: &Path,
        format: WeightFormat,
        max_context: usize,
        device: &Device,
    ) -> Result<Self, ModelError> {
        if !device.is_cpu() && format != WeightFormat::F32 {
            tracing::warn!(
                "{format:?} weights on a GPU: candle's quantized kernels give logits that \
                 depend on the batch, so speculative output can differ from plain \
                 decoding; use --weights f32 for exact output"
            );
        }
        if path.is_dir() {
            Self::load_hf_dir(path, format, max_context, device)
        } else {
            Self::load_gguf(path, format, max_context, device)
        }
    }

    fn load_gguf(
        path: &Path,
        format: WeightFormat,
        max_context: usize,
        device: &Device,
    ) -> Result<Self, ModelError> {
        let fmt = |message: String| ModelError::Format {
            path: path.into(),
            message,
        };
        let mut f = std::fs::File::open(path).map_err(|source| ModelError::Io {
            path: path.into(),
            source,
        })?;
        let content = gguf_file::Content::read(&mut f).map_err(|e| {
            fmt(format!(
                "not a readable GGUF file (or a model directory): {e}"
            ))
        })?;
        let tokenizer = ModelTokenizer::from_gguf(&content).map_err(|e| fmt(e.to_string()))?;
        let model = Model::load_gguf(path, &content, format, max_context, device)?;
        let md_tok = |key: &str| content.metadata.get(key).and_then(|v| v.to_u32().ok());
        let name = |id: Option<u32>| {
            id.and_then(|i| tokenizer.decode(&[i], false).ok())
                .unwrap_or_default()
        };
        let template = match content
            .metadata
            .get("tokenizer.chat_template")
            .and_then(|v| v.to_string().ok())
        {
            Some(src) => Some(
                ChatTemplate::new(
                    src,
                    &name(md_tok("tokenizer.ggml.bos_token_id")),
                    &name(md_tok("tokenizer.ggml.eos_token_id")),
                )
                .map_err(fmt)?,
            ),
            None => None,
        };
        let eos = md_tok("tokenizer.ggml.eos_token_id").into_iter().collect();
        Ok(Self::new(model, tokenizer, template, eos))
    }

    fn load_hf_dir(
        dir: &Path,
        format: WeightFormat,
        max_context: usize,
        device: &Device,
    ) -> Result<Self, ModelError> {
        let tokenizer = ModelTokenizer::from_file(&dir.join("tokenizer.json")).map_err(|e| {
            ModelError::Format {
                path: dir.into(),
                message: e.to_string(),
            }
        })?;
        let model = Model::load_safetensors(dir, format, max_context, device)?;
        let json = |name: &str| -> Result<serde_json::Value, ModelError> {
            let path = dir.join(name);
            match std::fs::read_to_string(&path) {
                Ok(text) => serde_json::from_str(&text).map_err(|e| ModelError::Format {
                    path,
                    message: format!("not JSON: {e}"),
                }),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(serde_json::Value::Null),
                Err(source) => Err(ModelError::Io { path, source }),
            }
        };
        let config = json("config.json")?;
        let tok_config = json("tokenizer_config.json")?;
        // A special token is written either as its text or as {"content": text}.
        let token_text = |v: &serde_json::Value| {
            v.as_str()
                .or_else(|| v["content"].as_str())
                .map(str::to_string)
        };
        let bos = token_text(&tok_config["bos_token"]).unwrap_or_default();
        let eos_text = token_text(&tok_config["eos_token"]);
        // The template is a string, or a list of named templates of which "default" is used.
        let source = tok_config["chat_template"]
            .as_str()
            .map(str::to_string)
            .or_else(|| {
                tok_config["chat_template"].as_array().and_then(|list| {
                    list.iter()
                        .find(|t| t["name"] == "default")
                        .and_then(|t| t["template"].as_str())
                        .map(str::to_string)
                })
            });
        let template = match source {
            Some(src) => Some(
                ChatTemplate::new(&src, &bos, eos_text.as_deref().unwrap_or_default()).map_err(
                    |message| ModelError::Format {
                        path: dir.join("tokenizer_config.json"),
                        message,
                    },
                )?,
            ),
            None => None,
        };
        let mut eos: Vec<u32> = match &config["eos_token_id"] {
            serde_json::Value::Array(ids) => ids
                .iter()
                .filter_map(|i| i.as_u64())
                .map(|i| i as u32)
                .collect(),
            v => v.as_u64().map(|i| i as u32).into_iter().collect(),
        };
        eos.extend(eos_text.and_then(|t| tokenizer.token_id(&t)));
        Ok(Self::new(model, tokenizer, template, eos))
    }

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
        Engine {
            model,
            tokenizer,
            template,
            eos,
            cost: CostCurve::flat(),
            calibration: Calibration::default(),
        }
    }

    /// The tokenizer.
    pub fn tokenizer(&self) -> &ModelTokenizer {
        &self.tokenizer
    }

    /// Which tokenizer the model uses, to check snapshots and logs against.
    pub fn tokenizer_identity(&self) -> crate::store::TokenizerId {
        use crate::store::build::TextEncoder;
        self.tokenizer.identity()
    }

    /// The chat template, if the model has one.
    pub fn template(&self) -> Option<&ChatTemplate> {
        self.template.as_ref()
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
            cache.commit(&(0..chunk.len()).collect::<Vec<_>>());
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
                argmax_rows(&logits)?;
                runs.push(t.elapsed().as_secs_f64());
                cache.commit(&[]);
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
                self.calibration.refused(draft.source);
            }
            draft.truncate(k);
        }
    }

    /// Where to cut `out` when its text contains a stop string: the most tokens whose
    /// text ends before the earliest one.
    fn stop_at(&self, out: &[u32], stops: &[String]) -> Option<usize> {
        if stops.is_empty() {
            return None;
        }
        let text = self.tokenizer.decode(out, true).unwrap_or_default();
        let cut = stops
            .iter()
            .filter(|s| !s.is_empty())
            .filter_map(|s| text.find(s.as_str()))
            .min()?;
        let mut n = out.len();
        while n > 0
            && self
                .tokenizer
                .decode(&out[..n], true)
                .unwrap_or_default()
                .len()
                > cut
        {
            n -= 1;
        }
        Some(n)
    }

    /// Start a request: check it, and set up its cache and its own suffix tree. Run it
    /// with [`Engine::step`] until [`Sequence::is_finished`], then [`Engine::finish`].
    pub fn start(&self, prompt: &[u32], opts: &GenerateOptions) -> Result<Sequence, ModelError> {
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
        Ok(Sequence {
            opts: opts.clone(),
            cache: KvCache::default(),
            request: RequestTree::new(prompt, SpecParams::default().request_depth()),
            context: prompt.to_vec(),
            prompt_len: prompt.len(),
            prefilled: 0,
            pending: prompt[prompt.len() - 1],
            out: Vec::new(),
            emitted: 0,
            rng: rand::rngs::StdRng::seed_from_u64(opts.sampling.seed),
            steps: 0,
            drafted: 0,
            accepted: 0,
            finish: if opts.max_tokens == 0 {
                Some(FinishReason::Length)
            } else {
                None
            },
            started: Instant::now(),
            prefill_s: 0.0,
            decode_start: None,
        })
    }

    /// One forward pass for every unfinished sequence in `batch`: a prefill chunk for
    /// those still reading their prompt, and pending token + draft for the others, with
    /// drafts cut to what the cost curve says the whole batch gains from.
    pub fn step(
        &mut self,
        batch: &mut [(&mut Sequence, &mut dyn Drafter)],
    ) -> Result<StepReport, ModelError> {
        let context_len = self.context_len();
        let mut report = StepReport::default();
        // What each sequence runs: its tokens and parents, and its draft when decoding.
        let mut prefill_rows = 0;
        let mut plans: Vec<Option<(Vec<u32>, Vec<i32>, Option<Draft>)>> =
            Vec::with_capacity(batch.len());
        for (seq, drafter) in batch.iter_mut() {
            if seq.finish.is_none() && seq.cache.len() >= context_len {
                seq.finish = Some(FinishReason::Length);
            }
            if seq.finish.is_some() {
                plans.push(None);
            } else if seq.in_prefill() {
                let end = (seq.prefilled + PREFILL_CHUNK).min(seq.prompt_len - 1);
                let chunk = seq.context[seq.prefilled..end].to_vec();
                prefill_rows += chunk.len();
                let parents = chain_parents(chunk.len());
                plans.push(Some((chunk, parents, None)));
            } else {
                let draft = if seq.opts.speculate {
                    let t = Instant::now();
                    let mut d = drafter.draft(&seq.request, &seq.context);
                    report.draft_s.push(t.elapsed().as_secs_f64());
                    // A damaged cache may hold ids the model does not have: they cost
                    // a draft, never the pass (children follow their parents, so a
                    // cut at the first bad one keeps a tree).
                    let vocab = self.model.config().vocab;
                    if let Some(bad) = d.tokens.iter().position(|&t| t as usize >= vocab) {
                        d.truncate(bad);
                    }
                    d
                } else {
                    Draft::default()
                };
                plans.push(Some((Vec::new(), Vec::new(), Some(draft))));
            }
        }
        let decoding = plans.iter().flatten().filter(|p| p.2.is_some()).count();
        {
            let mut drafts: Vec<&mut Draft> = plans
                .iter_mut()
                .flatten()
                .filter_map(|p| p.2.as_mut())
                .collect();
            self.allocate_drafts(prefill_rows + decoding, &mut drafts);
        }
        for ((seq, _), plan) in batch.iter_mut().zip(plans.iter_mut()) {
            let Some((tokens, parents, Some(draft))) = plan else {
                continue;
            };
            let room = context_len - seq.cache.len();
            draft.truncate(
                draft
                    .len()
                    .min(room - 1)
                    .min(seq.opts.max_tokens - seq.out.len() - 1),
            );
            tokens.push(seq.pending);
            tokens.extend_from_slice(&draft.tokens);
            parents.push(-1);
            parents.extend(draft.parents.iter().map(|&p| p + 1));
        }
        let logits = {
            let mut entries: Vec<BatchEntry<'_>> = Vec::with_capacity(batch.len());
            for ((seq, _), plan) in batch.iter_mut().zip(&plans) {
                if let Some((tokens, parents, draft)) = plan {
                    entries.push(BatchEntry {
                        cache: &mut seq.cache,
                        tokens,
                        parents,
                        logits: draft.is_some(),
                    });
                }
            }
            if entries.is_empty() {
                return Ok(report);
            }
            report.sequences = entries.len();
            report.rows = entries.iter().map(|e| e.tokens.len()).sum();
            let t = Instant::now();
            let logits = self.model.forward_batch(&mut entries)?;
            report.verify_s = t.elapsed().as_secs_f64();
            // Prefill rows skip the output head, so only pure decoding steps say what
            // drafting rows cost.
            if prefill_rows == 0 {
                self.cost.observe(report.rows, report.verify_s);
            }
            logits
        };
        let greedy_rows = if batch.iter().zip(&plans).any(|((s, _), p)| {
            matches!(p, Some((_, _, Some(_)))) && s.opts.sampling.temperature <= 0.0
        }) {
            argmax_rows(&logits)?
        } else {
            Vec::new()
        };
        let mut row = 0;
        for ((seq, drafter), plan) in batch.iter_mut().zip(plans) {
            let Some((tokens, parents, draft)) = plan else {
                continue;
            };
            let Some(draft) = draft else {
                seq.cache.commit(&(0..tokens.len()).collect::<Vec<_>>());
                seq.prefilled += tokens.len();
                if !seq.in_prefill() {
                    seq.prefill_s = seq.started.elapsed().as_secs_f64();
                    seq.decode_start = Some(Instant::now());
                }
                continue;
            };
            let rows = row..row + tokens.len();
            row = rows.end;
            if seq.decode_start.is_none() {
                seq.decode_start = Some(Instant::now());
            }
            let (path, bonus) = if seq.opts.sampling.temperature <= 0.0 {
                walk_greedy(&tokens, &parents, &greedy_rows[rows])
            } else {
                let own = logits.narrow(0, rows.start, rows.len())?;
                let sampling = seq.opts.sampling;
                walk_sampled(&tokens, &parents, &own, &sampling, &mut seq.rng)?
            };
            seq.cache.commit(&path);
            let accepted = path.len() - 1;
            report.accepted.push(accepted);
            seq.steps += 1;
            seq.drafted += draft.len();
            seq.accepted += accepted;
            let mut new: Vec<u32> = path[1..].iter().map(|&i| tokens[i]).collect();
            if !draft.is_empty() {
                let accepted_nodes: Vec<usize> = path[1..].iter().map(|&i| i - 1).collect();
                self.calibration.observe(&draft, &accepted_nodes);
                let mut upto = seq.context.clone();
                upto.extend_from_slice(&new);
                drafter.accepted(&upto, &draft, accepted);
            }
            new.push(bonus);
            seq.pending = bonus;
            let mut stop = false;
            if let Some(i) = new.iter().position(|t| self.eos.contains(t)) {
                new.truncate(i);
                stop = true;
            }
            new.truncate(seq.opts.max_tokens - seq.out.len());
            seq.out.extend_from_slice(&new);
            seq.request.extend(&new);
            seq.context.extend_from_slice(&new);
            if let Some(cut) = self.stop_at(&seq.out, &seq.opts.stop) {
                seq.out.truncate(cut);
                stop = true;
            }
            if stop {
                seq.finish = Some(FinishReason::Stop);
            } else if seq.out.len() >= seq.opts.max_tokens {
                seq.finish = Some(FinishReason::Length);
            }
        }
        Ok(report)
    }

    /// The result of a finished (or abandoned) sequence.
    pub fn finish(&self, seq: Sequence) -> Generation {
        let decode_s = seq.decode_start.map_or(0.0, |t| t.elapsed().as_secs_f64());
        let text = self.tokenizer.decode(&seq.out, true).unwrap_or_default();
        Generation {
            tokens_per_s: seq.out.len() as f64 / decode_s.max(1e-9),
            tokens: seq.out,
            text,
            prompt_tokens: seq.prompt_len,
            steps: seq.steps,
            drafted_tokens: seq.drafted,
            accepted_tokens: seq.accepted,
            finish_reason: seq.finish.unwrap_or(FinishReason::Cancelled),
            prefill_s: seq.prefill_s,
            decode_s,
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
            let new = seq.take_new_tokens();
            if !new.is_empty() && !on_tokens(new) {
                seq.cancel();
            }
        }
        Ok(self.finish(seq))
    }
}

/// What one [`Engine::step`] did, for metrics.
#[derive(Clone, Debug, Default)]
pub struct StepReport {
    /// Seconds each decoding sequence spent drafting.
    pub draft_s: Vec<f64>,
    /// Seconds of the forward pass (verification and prefill chunks).
    pub verify_s: f64,
    /// Sequences in the forward pass.
    pub sequences: usize,
    /// Rows (tokens) in the forward pass.
    pub rows: usize,
    /// Draft tokens accepted, per decoding sequence.
    pub accepted: Vec<usize>,
}

/// Prompt tokens per prefill pass.
const PREFILL_CHUNK: usize = 256;

/// Parents of a plain chain of `n` tokens: each follows the one before.
fn chain_parents(n: usize) -> Vec<i32> {
    (0..n as i32).map(|i| i - 1).collect()
}

/// A request in flight: its KV cache, its own suffix tree, what it has generated.
pub struct Sequence {
    opts: GenerateOptions,
    cache: KvCache,
    request: RequestTree,
    /// Prompt + generated tokens.
    context: Vec<u32>,
    prompt_len: usize,
    /// Prompt tokens (all but the last, which decoding starts from) in the cache.
    prefilled: usize,
    /// The newest token, not yet in the cache.
    pending: u32,
    out: Vec<u32>,
    /// Tokens of `out` already handed out by [`Sequence::take_new_tokens`].
    emitted: usize,
    rng: rand::rngs::StdRng,
    steps: usize,
    drafted: usize,
    accepted: usize,
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

    /// Tokens generated since the last call.
    pub fn take_new_tokens(&mut self) -> &[u32] {
        let from = self.emitted.min(self.out.len());
        self.emitted = self.emitted.max(self.out.len());
        &self.out[from..]
    }

    /// Stop it: the caller went away.
    pub fn cancel(&mut self) {
        self.finish = Some(FinishReason::Cancelled);
    }
}

/// Greedy acceptance: from the root, follow the child whose token is the model's argmax
/// at its parent; the model's argmax at the last accepted node is the bonus token.
/// Returns the accepted path (indices, root first) and the bonus.
fn walk_greedy(tokens: &[u32], parents: &[i32], argmax: &[u32]) -> (Vec<usize>, u32) {
    let mut path = vec![0usize];
    let mut cur = 0usize;
    loop {
        let want = argmax[cur];
        match (cur + 1..tokens.len()).find(|&j| parents[j] == cur as i32 && tokens[j] == want) {
            Some(j) => {
                path.push(j);
                cur = j;
            }
            None => return (path, want),
        }
    }
}

/// Sampled acceptance (recursive rejection for deterministic drafts).
fn walk_sampled(
    tokens: &[u32],
    parents: &[i32],
    logits: &Tensor,
    sampling: &Sampling,
    rng: &mut impl Rng,
) -> Result<(Vec<usize>, u32), ModelError> {
    let mut path = vec![0usize];
    let mut cur = 0usize;
    'node: loop {
        let row: Vec<f32> = logits.get(cur)?.to_vec1()?;
        let mut p = sampling.distribution(&row);
        for j in (cur + 1..tokens.len()).filter(|&j| parents[j] == cur as i32) {
            let x = tokens[j] as usize;
            let px = p.get(x).copied().unwrap_or(0.0);
            if px > 0.0 && rng.random::<f32>() < px {
                path.push(j);
                cur = j;
                continue 'node;
            }
            // Rejected: the residual distribution max(p − q, 0) for a point mass q at x
            // is p without x, renormalised.
            if px > 0.0 {
                p[x] = 0.0;
                let total: f32 = p.iter().sum();
                if total <= 0.0 {
                    break;
                }
                p.iter_mut().for_each(|v| *v /= total);
            }
        }
        return Ok((path, sample(&p, rng)));
    }
}

fn sample(p: &[f32], rng: &mut impl Rng) -> u32 {
    let r: f32 = rng.random();
    let mut acc = 0.0;
    for (i, &x) in p.iter().enumerate() {
        acc += x;
        if r < acc {
            return i as u32;
        }
    }
    // Rounding left r above the total: the last token with mass.
    p.iter().rposition(|&x| x > 0.0).unwrap_or(0) as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    fn copy_draft(len: usize) -> Draft {
        Draft {
            tokens: (0..len as u32).collect(),
            parents: (-1..len as i32 - 1).collect(),
            probs: vec![1.0; len],
            score: len as f32,
            match_len: 3,
            source: DraftSource::Request,
        }
    }

    #[test]
    fn levels_count_every_child_tried_along_the_accepted_path() {
        // a (0.6) and b (0.3) under the context; c under a, as likely as a.
        let draft = Draft {
            tokens: vec![1, 2, 3],
            parents: vec![-1, -1, 0],
            probs: vec![0.6, 0.3, 0.6],
            score: 1.5,
            match_len: 1,
            source: DraftSource::Global,
        };
        // a accepted, then c rejected: 0.9 expected at the first level, 1 at the second.
        let (expected, observed) = level_trials(&draft, &[0]);
        assert!((expected - 1.9).abs() < 1e-6, "{expected}");
        assert_eq!(observed, 1.0);
        let (expected, observed) = level_trials(&draft, &[0, 2]);
        assert!((expected - 1.9).abs() < 1e-6 && observed == 2.0);
        let (expected, observed) = level_trials(&draft, &[]);
        assert!((expected - 0.9).abs() < 1e-6 && observed == 0.0);
    }

    #[test]
    fn long_copies_that_fail_stop_being_verified_and_copies_that_hold_go_on() {
        // f32 on this CPU: two rows cost 1.8 single steps, 25 rows 4.55.
        let curve = CostCurve::new(
            vec![(1, 1.0), (2, 1.8), (4, 2.0), (8, 2.4), (16, 3.2), (32, 5.6)],
            0.0,
        );
        let copy = copy_draft(24);
        let mut chat = Calibration::default();
        for step in 0..60 {
            // Open chat: a third of the copies get their first token accepted.
            let accepted: &[usize] = if step % 3 == 0 { &[0] } else { &[] };
            chat.observe(&copy, accepted);
        }
        let q = chat.factor(DraftSource::Request);
        assert!((0.15..0.4).contains(&q), "{q}");
        let values = chat.values(&copy);
        assert!(values.iter().sum::<f64>() < 0.5, "{values:?}");
        assert_eq!(curve.best_cut(1, &[values]), vec![0]);
        let mut agentic = Calibration::default();
        let all: Vec<usize> = (0..24).collect();
        for _ in 0..60 {
            agentic.observe(&copy, &all);
        }
        assert_eq!(curve.best_cut(1, &[agentic.values(&copy)]), vec![24]);
        // Refusals drift back towards trust, slowly.
        let before = chat.factor(DraftSource::Request);
        for _ in 0..10 {
            chat.refused(DraftSource::Request);
        }
        let after = chat.factor(DraftSource::Request);
        assert!(
            after > before && after < before + 0.2,
            "{before} -> {after}"
        );
    }

    #[test]
    fn greedy_walk_follows_the_argmax_and_adds_the_bonus() {
        // root(0) -> a(1) -> b(2); root -> c(3)
        let tokens = [9, 5, 6, 7];
        let parents = [-1, 0, 1, 0];
        let (path, bonus) = walk_greedy(&tokens, &parents, &[5, 6, 8, 0]);
        assert_eq!(path, vec![0, 1, 2]);
        assert_eq!(bonus, 8);
        let (path, bonus) = walk_greedy(&tokens, &parents, &[7, 0, 0, 3]);
        assert_eq!(path, vec![0, 3]);
        assert_eq!(bonus, 3);
    }

    #[test]
    fn top_k_and_top_p_cut_the_tail() {
        let s = Sampling {
            temperature: 1.0,
            top_p: 1.0,
            top_k: 2,
            seed: 0,
        };
        let p = s.distribution(&[0.0, 1.0, 2.0, -5.0]);
        assert_eq!(p[0], 0.0);
        assert_eq!(p[3], 0.0);
        assert!((p[1] + p[2] - 1.0).abs() < 1e-6);
        let s = Sampling {
            top_k: 0,
            top_p: 0.5,
            ..s
        };
        let p = s.distribution(&[0.0, 0.0, 10.0]);
        assert_eq!(p, vec![0.0, 0.0, 1.0]);
    }

    /// Speculative sampling must leave the model's distribution unchanged, whatever the
    /// draft proposes: chi-square of 200k sampled first tokens against p, for a draft
    /// tree whose root has two children (the recursive rule) and one that proposes an
    /// unlikely token.
    #[test]
    fn speculative_sampling_preserves_the_distribution() {
        let logits = [2.0f32, 1.5, 1.0, 0.2, -1.0, 0.0];
        let sampling = Sampling {
            temperature: 0.8,
            top_p: 0.95,
            top_k: 5,
            seed: 0,
        };
        let p = sampling.distribution(&logits);
        // Rows: root, then draft nodes (their rows are never read for the first token).
        let rows: Vec<f32> = logits
            .iter()
            .cycle()
            .take(logits.len() * 4)
            .cloned()
            .collect();
        let t = Tensor::from_vec(rows, (4, logits.len()), &candle_core::Device::Cpu).unwrap();
        for (tokens, parents) in [
            (vec![9u32, 1, 0, 3], vec![-1i32, 0, 0, 1]),
            (vec![9u32, 4, 2, 5], vec![-1i32, 0, 1, 0]),
        ] {
            let mut rng = rand::rngs::StdRng::seed_from_u64(7);
            let n = 200_000;
            let mut hist = vec![0u64; logits.len()];
            for _ in 0..n {
                let (path, bonus) =
                    walk_sampled(&tokens, &parents, &t, &sampling, &mut rng).unwrap();
                let first = if path.len() > 1 {
                    tokens[path[1]]
                } else {
                    bonus
                };
                hist[first as usize] += 1;
            }
            let mut chi2 = 0.0;
            let mut dof = 0;
            for (i, &pi) in p.iter().enumerate() {
                if pi == 0.0 {
                    assert_eq!(hist[i], 0, "token {i} is outside top-k/top-p");
                    continue;
                }
                let e = pi as f64 * n as f64;
                chi2 += (hist[i] as f64 - e).powi(2) / e;
                dof += 1;
            }
            // 99.9th percentile of chi-square with 4 degrees of freedom is 18.47.
            assert_eq!(dof, 5);
            assert!(
                chi2 < 18.47,
                "chi2 {chi2} for {tokens:?}, hist {hist:?}, p {p:?}"
            );
        }
    }
}
