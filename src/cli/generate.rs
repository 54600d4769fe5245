//! `suffixd generate`: one request through the verifier, for scripts and tests.

use std::ops::RangeInclusive;
use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use clap::Args;

use crate::chat::{ChatMessage, PromptPiece};
use crate::drafting::CacheDrafter;
use crate::engine::cost::CostCurve;
use crate::engine::{
    ADDITIVE_PENALTY_RANGE, Drafter, Engine, GenerateOptions, NoDrafts, Penalties,
    REPETITION_PENALTY_RANGE, Sampling,
};
use crate::model::forward::WeightFormat;
use crate::speculate::SpecParams;
use crate::store::{Layered, Snapshot};
use crate::tree::GlobalTree;

use super::store::resolve_snapshot;
use super::{SpecArgs, cost_cache};

/// The default model's file name, as `tools/setup.sh` installs it.
pub const DEFAULT_MODEL: &str = "models/SmolLM2-135M-Instruct.Q4_1.gguf";

/// The model path to use: the flag, else `$SUFFIXD_MODEL`, else the default model under
/// the working directory or the source checkout.
pub fn model_path(flag: Option<&Path>) -> anyhow::Result<PathBuf> {
    if let Some(p) = flag {
        return Ok(p.to_path_buf());
    }
    if let Some(p) = std::env::var_os("SUFFIXD_MODEL") {
        return Ok(p.into());
    }
    let candidates = [
        PathBuf::from(DEFAULT_MODEL),
        Path::new(env!("CARGO_MANIFEST_DIR")).join(DEFAULT_MODEL),
    ];
    match candidates.iter().find(|p| p.exists()) {
        Some(p) => Ok(p.clone()),
        None => bail!(
            "no model given and the default model {DEFAULT_MODEL} is not installed; run tools/setup.sh or pass --model PATH"
        ),
    }
}

/// Flags that choose and load the model.
#[derive(Args, Debug, Clone)]
pub struct ModelArgs {
    /// A GGUF file (llama, qwen2, qwen3, gemma3), or a Hugging Face directory with config.json,
    /// tokenizer.json and safetensors weights (default: the model tools/setup.sh installs).
    /// `synthetic:NAME[:SEED]` makes random weights of a real shape (llama-3.2-1b,
    /// llama-3.1-8b, qwen2.5-7b, qwen3-8b, gemma-3-4b, mistral-7b) with the default
    /// model's tokenizer, for speed and exactness checks only.
    #[arg(long)]
    pub model: Option<PathBuf>,
    /// How weights are held: native (as in the file), q8-0, f32 or bf16. All are exact
    /// on the CPU (speculative greedy output is plain greedy output). The default is
    /// native, and bf16 in a CUDA build, where bf16 and f32 run on suffixd's own exact
    /// kernels and native and q8-0 on candle's, which are not exact.
    #[arg(long, value_enum, default_value_t = WeightFormat::default_for_build())]
    pub weights: WeightFormat,
    /// KV cache capacity in tokens (capped by the model's context length).
    #[arg(long, default_value_t = 4096)]
    pub max_context: usize,
    /// `measure`: size drafts by t(K)/t(1) as timed on this machine, once per binary,
    /// model and settings: on a CPU kept in the cache folder ($SUFFIXD_CACHE_DIR, else
    /// $XDG_CACHE_HOME/suffixd or ~/.cache/suffixd) and reused by later runs (a GPU
    /// times it at start), each run correcting it from its own steps; `remeasure`: time
    /// it again at start (and keep it); `flat`: verify every draft whole (as on a GPU).
    #[arg(long, value_enum, default_value_t = CostMode::Measure)]
    pub cost: CostMode,
    /// Take t(K)/t(1) from this file instead of --cost, fixed for the run: the last JSON
    /// line of it with a curve, as `examples/shape_cost` and `e2e-bench --json` print
    /// them. Drafts are then sized, and `e2e-bench` projects the speed-up, as on the
    /// model or card that curve was measured on (docs/gpu.md).
    #[arg(long, conflicts_with = "cost")]
    pub cost_curve: Option<PathBuf>,
    /// Bytes of earlier prompts' keys and values kept for reuse by later requests that
    /// start the same way (in the same namespace); 0 turns the prefix cache off. On a
    /// GPU (`--weights bf16` or `f32`) the blocks are device memory [default: four full
    /// contexts of --max-context, at most an eighth of the memory (the cgroup's limit in
    /// a container; the GPU's free memory at start)].
    #[arg(long, env = "SUFFIXD_PREFIX_CACHE_BYTES")]
    pub prefix_cache_bytes: Option<u64>,
    /// Percent of the prefix cache's budget each namespace keeps whatever other
    /// namespaces send: their inserts evict its blocks only past that share. A floor,
    /// not a cap [default: 0, least recently used over all namespaces].
    #[arg(long, env = "SUFFIXD_PREFIX_CACHE_SHARE", value_parser = clap::value_parser!(u8).range(0..=100))]
    pub prefix_cache_share: Option<u8>,
    /// Hybrid mode: a smaller model with the target's tokenizer (a GGUF file or a Hugging
    /// Face directory) drafts where the suffix trees have nothing likely. The target's
    /// own file with --draft-weights q8-0 or native is the cheapest pair.
    #[arg(long, env = "SUFFIXD_DRAFT_MODEL")]
    pub draft_model: Option<PathBuf>,
    /// How the draft model's weights are held (see --weights) [default: native].
    #[arg(long, value_enum)]
    pub draft_weights: Option<WeightFormat>,
    /// With --draft-model: the draft model drafts when the suffix draft's expected
    /// accepted tokens (its calibrated score) are below this [default: 1; see
    /// docs/hybrid.md].
    #[arg(long)]
    pub hybrid_tau: Option<f64>,
}

/// How the engine learns its cost curve.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum CostMode {
    /// Measured on this machine: kept from an earlier run of this binary with this model
    /// and these settings, else measured at start and kept.
    Measure,
    /// Measured at start, and kept for later runs.
    Remeasure,
    /// Assume verification is free.
    Flat,
}

impl ModelArgs {
    /// Give `engine` its measured cost curve: on a CPU the one kept in the cache folder
    /// for this binary, model and settings ([`cost_cache`]) unless `mode` is
    /// `Remeasure`, else timed now and kept; on a GPU timed now.
    fn measured_cost_curve(
        &self,
        engine: &mut Engine,
        device: &candle_core::Device,
        mode: CostMode,
    ) -> anyhow::Result<()> {
        let (context, repeats) = (256, 3);
        if device.is_cuda() {
            // A GPU's rows are nearly free well past 64 (docs/gpu.md), so its curve goes
            // on to 128, where a busy server's passes are. Its passes take milliseconds:
            // timing them costs little, and the cache's key would have to name the card.
            engine.measure_cost_curve(128, context, repeats)?;
            return Ok(());
        }
        // A CPU's cost grows from the first rows, and 64 is past any draft it verifies.
        let max_rows = 64;
        let dir = cost_cache::cache_dir();
        let model = model_path(self.model.as_deref())?;
        let device_name = format!("cpu {}", crate::model::kernels::Simd::detect().name());
        let measurement = serde_json::json!({
            "max_rows": max_rows, "context": context, "repeats": repeats,
            "max_context": self.max_context,
        });
        let key = cost_cache::key(
            &model,
            &format!("{:?}", self.weights),
            &device_name,
            measurement,
        );
        let kept = dir
            .as_deref()
            .filter(|_| mode == CostMode::Measure)
            .and_then(|dir| cost_cache::load(dir, &key));
        if let Some((curve, path)) = kept {
            tracing::info!(
                "cost curve kept from an earlier run ({}; --cost remeasure times it again)",
                path.display()
            );
            engine.set_cost_curve(curve);
            return Ok(());
        }
        engine.measure_cost_curve(max_rows, context, repeats)?;
        match dir.map(|dir| cost_cache::store(&dir, &key, engine.cost_curve())) {
            Some(Ok(path)) => tracing::info!("cost curve measured and kept in {}", path.display()),
            Some(Err(e)) => tracing::warn!("cost curve measured but not kept: {e}"),
            None => tracing::info!(
                "cost curve measured; no cache folder (set SUFFIXD_CACHE_DIR or HOME) to keep it in"
            ),
        }
        Ok(())
    }

    /// Load the engine these flags describe.
    pub fn load(&self) -> anyhow::Result<Engine> {
        let device = crate::model::device()?;
        let synthetic = self
            .model
            .as_deref()
            .and_then(|p| p.to_str()?.strip_prefix("synthetic:"));
        let mut engine = match synthetic {
            Some(spec) => {
                // `synthetic:NAME` or `synthetic:NAME:SEED`, with the default model's
                // tokenizer.
                let (name, seed) = match spec.rsplit_once(':') {
                    Some((name, seed)) => (
                        name,
                        seed.parse()
                            .with_context(|| format!("synthetic seed {seed:?} is not a number"))?,
                    ),
                    None => (spec, 0),
                };
                let vocabulary = model_path(None)?;
                Engine::synthetic(
                    name,
                    seed,
                    &vocabulary,
                    self.weights,
                    self.max_context,
                    &device,
                )
                .with_context(|| format!("cannot make synthetic model {spec}"))?
            }
            None => {
                let path = model_path(self.model.as_deref())?;
                Engine::load(&path, self.weights, self.max_context, &device)
                    .with_context(|| format!("cannot load model {}", path.display()))?
            }
        };
        match (&self.cost_curve, self.cost) {
            (Some(path), _) => {
                let text = std::fs::read_to_string(path)
                    .with_context(|| format!("cannot read the cost curve {}", path.display()))?;
                let curve = CostCurve::from_json_lines(&text)
                    .with_context(|| format!("cost curve {}", path.display()))?;
                engine.set_cost_curve(curve);
            }
            (None, mode @ (CostMode::Measure | CostMode::Remeasure)) => {
                self.measured_cost_curve(&mut engine, &device, mode)?
            }
            (None, CostMode::Flat) => engine.set_cost_curve(CostCurve::flat()),
        }
        // The host's memory, or the GPU's where the blocks live there.
        let memory = engine
            .prefix_cache_device_memory_bytes()
            .or_else(crate::store::live::usable_memory_bytes);
        let prefix_bytes = match (self.prefix_cache_bytes, memory) {
            // A budget past memory would be no budget: the cache would grow until the
            // process is killed for memory (or the device's allocations fail).
            (Some(asked), Some(memory)) if asked > memory / 2 => {
                tracing::warn!(
                    "--prefix-cache-bytes {asked} is more than half the usable memory ({memory} bytes): capped at {}",
                    memory / 2
                );
                memory / 2
            }
            (Some(asked), _) => asked,
            (None, memory) => default_prefix_cache_bytes(
                engine.kv_bytes_per_token(),
                engine.context_len(),
                memory,
            ),
        };
        engine.set_prefix_cache_bytes(prefix_bytes);
        engine.set_prefix_cache_share(f64::from(self.prefix_cache_share.unwrap_or(0)) / 100.0);
        if let Some(draft_path) = &self.draft_model {
            let weights = self.draft_weights.unwrap_or(WeightFormat::Native);
            let draft = Engine::load(draft_path, weights, self.max_context, &device)
                .with_context(|| format!("cannot load draft model {}", draft_path.display()))?;
            let tau = self.hybrid_tau.unwrap_or(crate::engine::DEFAULT_TAU);
            engine
                .set_draft_model(draft, tau)
                .with_context(|| format!("cannot draft with {}", draft_path.display()))?;
        } else if self.hybrid_tau.is_some() || self.draft_weights.is_some() {
            bail!("--hybrid-tau and --draft-weights need --draft-model");
        }
        Ok(engine)
    }
}

/// The prefix cache's budget when none is given: the keys and values of four full
/// contexts, at most an eighth of `memory` (when known).
pub fn default_prefix_cache_bytes(
    kv_bytes_per_token: u64,
    context: usize,
    memory: Option<u64>,
) -> u64 {
    let contexts = 4 * context as u64 * kv_bytes_per_token;
    memory.map_or(contexts, |m| contexts.min(m / 8))
}

#[derive(Args, Debug)]
pub(super) struct GenerateArgs {
    #[command(flatten)]
    model: ModelArgs,
    /// Raw prompt text.
    #[arg(long, conflicts_with = "chat", required_unless_present = "chat")]
    prompt: Option<String>,
    /// A user message, wrapped in the model's chat template.
    #[arg(long)]
    chat: Option<String>,
    /// Most new tokens.
    #[arg(long, default_value_t = 256)]
    max_tokens: usize,
    /// Plain decoding, no speculation.
    #[arg(long)]
    no_spec: bool,
    /// Sampling temperature; 0 is greedy.
    #[arg(long, default_value_t = 0.0)]
    temperature: f32,
    /// Nucleus sampling mass.
    #[arg(long, default_value_t = 1.0)]
    top_p: f32,
    /// Keep only the k most likely tokens (0: all).
    #[arg(long, default_value_t = 0)]
    top_k: usize,
    /// Random seed for sampling.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Stop before this string (repeatable).
    #[arg(long)]
    stop: Vec<String>,
    /// Subtract this from the logit of every token the answer already holds (−2 to 2;
    /// OpenAI's `presence_penalty`).
    #[arg(long, default_value_t = 0.0, value_parser = additive_penalty)]
    presence_penalty: f32,
    /// Subtract this from a token's logit once for each time the answer holds it (−2 to
    /// 2; OpenAI's `frequency_penalty`).
    #[arg(long, default_value_t = 0.0, value_parser = additive_penalty)]
    frequency_penalty: f32,
    /// Divide the positive logits (multiply the negative) of the prompt's and the
    /// answer's tokens by this (0.01 to 10; 1: none; vLLM's `repetition_penalty`).
    #[arg(long, default_value_t = 1.0, value_parser = repetition_penalty)]
    repetition_penalty: f32,
    /// Draft from this snapshot (a store directory or file) as well as the prompt.
    #[arg(long)]
    snapshot: Option<PathBuf>,
    /// Namespace of the snapshot to draft from.
    #[arg(long, default_value = "default")]
    namespace: String,
    #[command(flatten)]
    spec: SpecArgs,
    /// Print one JSON object as the last line of stdout.
    #[arg(long)]
    json: bool,
}

/// A presence or frequency penalty from the command line, inside its range.
fn additive_penalty(text: &str) -> Result<f32, String> {
    number_within(text, ADDITIVE_PENALTY_RANGE)
}

/// A repetition penalty from the command line, inside its range.
fn repetition_penalty(text: &str) -> Result<f32, String> {
    number_within(text, REPETITION_PENALTY_RANGE)
}

fn number_within(text: &str, range: RangeInclusive<f32>) -> Result<f32, String> {
    match text.parse::<f32>() {
        Ok(v) if range.contains(&v) => Ok(v),
        _ => Err(format!(
            "give a number from {} to {}",
            range.start(),
            range.end()
        )),
    }
}

pub(super) fn run_generate(a: GenerateArgs) -> anyhow::Result<()> {
    let params: SpecParams = a.spec.params()?;
    let mut engine = a.model.load()?;
    // A raw --prompt is the caller's own markup; a --chat message is content, tokenized
    // as the server tokenizes it.
    let pieces = match (&a.prompt, &a.chat) {
        (Some(p), _) => vec![PromptPiece::Markup(p.clone())],
        (None, Some(c)) => {
            let template = engine
                .template()
                .context("the model has no chat template; use --prompt")?;
            template
                .render_pieces(&[ChatMessage {
                    role: "user".into(),
                    content: c.clone(),
                    ..Default::default()
                }])
                .map_err(anyhow::Error::msg)?
        }
        (None, None) => bail!("give --prompt or --chat"),
    };
    let prompt = engine.tokenizer().encode_pieces(&pieces)?;
    let opts = GenerateOptions {
        max_tokens: a.max_tokens,
        sampling: Sampling {
            temperature: a.temperature,
            top_p: a.top_p,
            top_k: a.top_k,
            seed: a.seed,
        },
        stop: a.stop.clone(),
        speculate: !a.no_spec,
        namespace: a.namespace.clone(),
        penalties: Penalties {
            presence: a.presence_penalty,
            frequency: a.frequency_penalty,
            repetition: a.repetition_penalty,
            bias: Vec::new(),
        },
        ..GenerateOptions::default()
    };
    let empty = GlobalTree::new(params.max_depth)?;
    let snapshot = match &a.snapshot {
        Some(p) => {
            let file = resolve_snapshot(p)?;
            Some(Snapshot::open(&file, Some(engine.tokenizer_identity()))?)
        }
        None => None,
    };
    let base = match &snapshot {
        Some(s) => s
            .namespaces()?
            .into_iter()
            .find(|n| n.name == a.namespace)
            .map(|n| n.tree),
        None => None,
    };
    let view = Layered::new(base.as_ref(), &empty, &empty);
    let mut drafter: Box<dyn Drafter> = if a.no_spec {
        Box::new(NoDrafts)
    } else {
        Box::new(CacheDrafter::new(view, params, &prompt))
    };
    let g = engine.generate(&prompt, &opts, drafter.as_mut(), &mut |_| true)?;
    if a.json {
        let mut v = serde_json::to_value(&g)?;
        v["cost_curve"] = serde_json::to_value(engine.cost_curve())?;
        v["simd"] = serde_json::to_value(crate::model::kernels::Simd::detect())?;
        println!("{v}");
    } else {
        println!("{}", g.text);
        eprintln!(
            "{} tokens in {} steps ({} drafted, {} accepted), {:.1} tokens/s",
            g.tokens.len(),
            g.steps,
            g.drafted_tokens,
            g.accepted_tokens,
            g.tokens_per_s
        );
        if engine.hybrid_tau().is_some() {
            let s = &g.sources;
            eprintln!(
                "drafts: the suffix trees {} steps ({} of {} accepted), the draft model {} steps ({} of {} accepted, {:.2} s), none {} steps",
                s.suffix.steps,
                s.suffix.accepted,
                s.suffix.drafted,
                s.model.steps,
                s.model.accepted,
                s.model.drafted,
                s.model_draft_s,
                s.none
            );
        }
    }
    Ok(())
}
