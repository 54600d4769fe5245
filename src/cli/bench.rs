//! `suffixd e2e-bench` (run by `tools/e2e-bench`): a workload of text prompts through
//! plain and speculative decoding, same weights, one process, one run.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::Context;
use clap::Args;
use serde::Deserialize;

use crate::chat::{ChatMessage, PromptPiece};
use crate::corpus::open_lines;
use crate::drafting::CacheDrafter;
use crate::engine::{DraftSources, Engine, GenerateOptions, NoDrafts};
use crate::store::Layered;
use crate::tree::GlobalTree;

use super::SpecArgs;
use super::generate::ModelArgs;

/// One workload line: a prompt, a chat, or a pipeline of chat turns where `{prev}` is
/// replaced by the previous stage's output.
#[derive(Deserialize)]
#[serde(untagged)]
enum Item {
    Prompt { prompt_text: String },
    Chat { messages: Vec<ChatMessage> },
    Pipeline { stages: Vec<String> },
}

#[derive(Args, Debug)]
pub(super) struct BenchArgs {
    #[command(flatten)]
    model: ModelArgs,
    #[command(flatten)]
    spec: SpecArgs,
    /// Workload (.jsonl or .zst): `{"prompt_text"}`, `{"messages"}` or `{"stages"}`.
    #[arg(long)]
    workload: PathBuf,
    /// Use only the first N items.
    #[arg(long)]
    limit: Option<usize>,
    /// Most new tokens per generation.
    #[arg(long, default_value_t = 128)]
    max_tokens: usize,
    /// Print one JSON object as the last line.
    #[arg(long)]
    json: bool,
}

/// The prompt of one user turn, tokenized as the server tokenizes chat requests. A
/// base model without a chat template (Gemma 3 270M) gets the turn as a raw completion
/// prompt, as `/v1/completions` would send it.
fn chat_prompt(engine: &Engine, content: &str) -> anyhow::Result<Vec<u32>> {
    let pieces = match engine.template() {
        Some(template) => template
            .render_pieces(&[ChatMessage {
                role: "user".into(),
                content: content.into(),
                ..Default::default()
            }])
            .map_err(anyhow::Error::msg)?,
        None => vec![PromptPiece::Content(format!("{content}\n"))],
    };
    Ok(engine.tokenizer().encode_pieces(&pieces)?)
}

#[derive(Default, Debug, serde::Serialize)]
struct Pass {
    /// Per item: generated tokens and decoding seconds.
    items: Vec<(usize, f64)>,
    steps: usize,
    accepted: usize,
    drafted: usize,
    /// The steps' cost in single-token steps by the engine's cost curve
    /// ([`crate::engine::Generation::verify_cost`]).
    verify_cost: f64,
    outputs: Vec<Vec<u32>>,
    /// Seconds of prefill, prompt tokens, and those restored from the prefix cache.
    prefill_s: f64,
    prompt_tokens: usize,
    cached_prompt_tokens: usize,
    /// Where the drafts came from (suffix trees, draft model), per step.
    sources: DraftSources,
}

impl Pass {
    fn tokens(&self) -> usize {
        self.items.iter().map(|i| i.0).sum()
    }

    fn tokens_per_s(&self) -> f64 {
        let seconds: f64 = self.items.iter().map(|i| i.1).sum();
        self.tokens() as f64 / seconds.max(1e-9)
    }

    /// Tokens per single-token step's cost, as the engine's cost curve prices the steps.
    fn tokens_per_unit_cost(&self) -> f64 {
        self.tokens() as f64 / self.verify_cost.max(1e-9)
    }
}

/// One side of the comparison: plain or speculative decoding, with its own global tree
/// (the speculative side learns from its finished generations; the plain side has none).
struct Side {
    speculate: bool,
    /// Let the draft model draft (hybrid mode), when the engine has one.
    draft_model: bool,
    global: GlobalTree,
    /// Nothing evicted: the third layer of the view the drafter reads.
    evicted: GlobalTree,
    next_id: u64,
    pass: Pass,
}

impl Side {
    fn new(speculate: bool, draft_model: bool, max_depth: usize) -> anyhow::Result<Side> {
        Ok(Side {
            speculate,
            draft_model,
            global: GlobalTree::new(max_depth)?,
            evicted: GlobalTree::new(max_depth)?,
            next_id: 0,
            pass: Pass::default(),
        })
    }

    /// Run one workload item (every stage of a pipeline) on this side.
    fn run_item(
        &mut self,
        engine: &mut Engine,
        item: &Item,
        max_tokens: usize,
        params: crate::speculate::SpecParams,
    ) -> anyhow::Result<()> {
        let opts = GenerateOptions {
            max_tokens,
            speculate: self.speculate,
            draft_model: self.draft_model,
            // Each side reuses only its own prompts' prefixes.
            namespace: match (self.speculate, self.draft_model) {
                (false, _) => "plain",
                (true, false) => "speculative",
                (true, true) => "hybrid",
            }
            .into(),
            ..GenerateOptions::default()
        };
        let texts: Vec<String> = match item {
            Item::Prompt { prompt_text } => vec![prompt_text.clone()],
            Item::Chat { messages } => match engine.template() {
                Some(template) => vec![template.render(messages).map_err(anyhow::Error::msg)?],
                // A base model: the conversation's text as a raw completion prompt.
                None => vec![
                    messages
                        .iter()
                        .map(|m| m.content.as_str())
                        .collect::<Vec<_>>()
                        .join("\n"),
                ],
            },
            Item::Pipeline { stages } => stages.clone(),
        };
        let (mut tokens, mut seconds) = (0, 0.0);
        let mut prev = String::new();
        for t in &texts {
            let prompt = match item {
                Item::Pipeline { .. } => chat_prompt(engine, &t.replace("{prev}", &prev))?,
                Item::Chat { .. } if engine.template().is_none() => chat_prompt(engine, t)?,
                _ => engine.tokenizer().encode_text(t)?,
            };
            let t0 = Instant::now();
            let g = if self.speculate {
                let view = Layered::new(None, &self.global, &self.evicted);
                let mut d = CacheDrafter::new(view, params, &prompt);
                engine.generate(&prompt, &opts, &mut d, &mut |_| true)?
            } else {
                engine.generate(&prompt, &opts, &mut NoDrafts, &mut |_| true)?
            };
            let decode_s = t0.elapsed().as_secs_f64() - g.prefill_s;
            seconds += decode_s;
            tokens += g.tokens.len();
            self.pass.steps += g.steps;
            self.pass.accepted += g.accepted_tokens;
            self.pass.drafted += g.drafted_tokens;
            self.pass.verify_cost += g.verify_cost;
            self.pass.prefill_s += g.prefill_s;
            self.pass.prompt_tokens += g.prompt_tokens;
            self.pass.cached_prompt_tokens += g.cached_prompt_tokens;
            self.pass.sources.add(&g.sources);
            if self.speculate {
                self.global.insert(self.next_id, &g.tokens)?;
                self.next_id += 1;
            }
            prev = g.text.clone();
            self.pass.outputs.push(g.tokens);
        }
        self.pass.items.push((tokens, seconds));
        Ok(())
    }
}

/// The median of the per-item speedups (speculative ÷ plain tokens/s).
fn median_item_speedup(plain: &Pass, spec: &Pass) -> f64 {
    let mut ratios: Vec<f64> = plain
        .items
        .iter()
        .zip(&spec.items)
        .filter(|(p, s)| p.1 > 0.0 && s.1 > 0.0 && p.0 > 0 && s.0 > 0)
        .map(|(p, s)| (s.0 as f64 / s.1) / (p.0 as f64 / p.1))
        .collect();
    if ratios.is_empty() {
        return f64::NAN;
    }
    ratios.sort_by(f64::total_cmp);
    let n = ratios.len();
    if n % 2 == 1 {
        ratios[n / 2]
    } else {
        (ratios[n / 2 - 1] + ratios[n / 2]) / 2.0
    }
}

pub(super) fn run_bench(a: BenchArgs) -> anyhow::Result<()> {
    let params = a.spec.params()?;
    let mut engine = a.model.load()?;
    let mut items = Vec::new();
    for (i, line) in std::io::BufRead::lines(open_lines(&a.workload)?).enumerate() {
        let line = line?;
        if line.trim().is_empty() {
            continue;
        }
        items.push(
            serde_json::from_str::<Item>(&line)
                .with_context(|| format!("{}:{}", a.workload.display(), i + 1))?,
        );
        if a.limit.is_some_and(|l| items.len() >= l) {
            break;
        }
    }
    // The two sides take turns item by item, in alternating order, so that a change in
    // the machine's load during the run falls on both alike.
    // With a draft model a third side runs hybrid mode, beside suffix-only speculation.
    let hybrid = engine.hybrid_tau().is_some();
    let mut sides = vec![
        Side::new(false, false, params.max_depth)?,
        Side::new(true, false, params.max_depth)?,
    ];
    if hybrid {
        sides.push(Side::new(true, true, params.max_depth)?);
    }
    for (i, item) in items.iter().enumerate() {
        // Each item starts with a different side, in turn.
        let n = sides.len();
        for k in 0..n {
            sides[(i + k) % n].run_item(&mut engine, item, a.max_tokens, params)?;
        }
    }
    let mut passes = sides.into_iter().map(|s| s.pass);
    let plain = passes.next().expect("plain side");
    let suffix = passes.next().expect("suffix side");
    let hybrid_pass = passes.next();
    let spec = hybrid_pass.as_ref().unwrap_or(&suffix);
    let median_speedup = median_item_speedup(&plain, spec);
    let same = plain
        .outputs
        .iter()
        .zip(&spec.outputs)
        .filter(|(x, y)| x == y)
        .count();
    let tps = Pass::tokens_per_s;
    // What the cost curve predicts: plain decoding prices each token at one step.
    let curve_speedup = spec.tokens_per_unit_cost() / plain.tokens_per_unit_cost();
    let report = serde_json::json!({
        "generations": plain.outputs.len(),
        "identical_outputs": same,
        "plain_tokens_per_s": tps(&plain),
        "spec_tokens_per_s": tps(spec),
        "speedup": tps(spec) / tps(&plain),
        "median_item_speedup": median_speedup,
        "spec_tokens_per_step": spec.tokens() as f64 / spec.steps.max(1) as f64,
        "mean_accepted_per_step": spec.accepted as f64 / spec.steps.max(1) as f64,
        "acceptance_rate": spec.accepted as f64 / spec.drafted.max(1) as f64,
        "prompt_tokens": spec.prompt_tokens,
        "plain_prefill_s": plain.prefill_s,
        "spec_prefill_s": spec.prefill_s,
        "plain_cached_prompt_tokens": plain.cached_prompt_tokens,
        "spec_cached_prompt_tokens": spec.cached_prompt_tokens,
        "prefix_cache": engine.prefix_cache_stats(),
        "cost_curve": engine.cost_curve(),
        "curve_speedup": curve_speedup,
        "draft_sources": spec.sources,
        "hybrid_tau": engine.hybrid_tau(),
        "draft_cost_ratio": engine.draft_cost_ratio(),
        "suffix_tokens_per_s": tps(&suffix),
        "suffix_identical_outputs": plain.outputs.iter().zip(&suffix.outputs).filter(|(x, y)| x == y).count(),
        "hybrid_vs_suffix_median_item": hybrid_pass.as_ref().map(|h| median_item_speedup(&suffix, h)),
    });
    println!(
        "plain {:.1} tok/s, speculative {:.1} tok/s: {:.3}x (median per item {:.3}x); {:.2} tokens/step; {}/{} outputs identical",
        tps(&plain),
        tps(spec),
        tps(spec) / tps(&plain),
        median_speedup,
        spec.tokens() as f64 / spec.steps.max(1) as f64,
        same,
        plain.outputs.len()
    );
    println!(
        "prefill: plain {:.2} s, speculative {:.2} s; {} prompt tokens, {} (plain) and {} (speculative) from the prefix cache",
        plain.prefill_s,
        spec.prefill_s,
        spec.prompt_tokens,
        plain.cached_prompt_tokens,
        spec.cached_prompt_tokens
    );
    println!(
        "through the cost curve in use: {curve_speedup:.3}x (its t(K)/t(1) pricing each step, drafting's time left out; with --cost-curve, a projection to where that curve was measured)"
    );
    if let Some(h) = &hybrid_pass {
        let s = &h.sources;
        let rate = |c: &crate::engine::SourceCounts| c.accepted as f64 / c.drafted.max(1) as f64;
        let steps = (s.none + s.suffix.steps + s.model.steps).max(1) as f64;
        println!(
            "hybrid (τ {}): suffix-only {:.1} tok/s, hybrid {:.1} tok/s: {:.3}x of suffix-only (median per item {:.3}x); steps drafted by the suffix trees {:.0}%, the draft model {:.0}%, none {:.0}% ({} model drafts cut before verification); acceptance suffix {:.2}, model {:.2}; draft model {:.2} s",
            engine.hybrid_tau().unwrap_or_default(),
            tps(&suffix),
            tps(h),
            tps(h) / tps(&suffix),
            median_item_speedup(&suffix, h),
            100.0 * s.suffix.steps as f64 / steps,
            100.0 * s.model.steps as f64 / steps,
            100.0 * s.none as f64 / steps,
            s.model_unverified,
            rate(&s.suffix),
            rate(&s.model),
            s.model_draft_s
        );
    }
    if a.json {
        println!("{report}");
    }
    Ok(())
}
