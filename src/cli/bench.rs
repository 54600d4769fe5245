//! `suffixd e2e-bench` (run by `tools/e2e-bench`): a workload of text prompts through
//! plain and speculative decoding, same weights, one process, one run.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::Context;
use clap::Args;
use serde::Deserialize;

use crate::corpus::logs::ChatMessage;
use crate::corpus::open_lines;
use crate::tree::GlobalTree;
use crate::verify::engine::{Engine, GenerateOptions, IndexDrafter, NoDrafts, Sampling};

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

fn chat_text(engine: &Engine, content: &str) -> anyhow::Result<String> {
    engine
        .template()
        .context("the model has no chat template")?
        .render(&[ChatMessage {
            role: "user".into(),
            content: content.into(),
        }])
        .map_err(anyhow::Error::msg)
}

#[derive(Default, Debug, serde::Serialize)]
struct Pass {
    tokens: usize,
    seconds: f64,
    steps: usize,
    accepted: usize,
    drafted: usize,
    outputs: Vec<Vec<u32>>,
}

fn run_pass(
    engine: &mut Engine,
    items: &[Item],
    max_tokens: usize,
    speculate: bool,
    params: crate::speculate::SpecParams,
) -> anyhow::Result<Pass> {
    let mut global = GlobalTree::new(params.max_depth)?;
    let mut pass = Pass::default();
    let opts = GenerateOptions {
        max_tokens,
        sampling: Sampling::default(),
        stop: vec![],
        speculate,
    };
    let mut next_id = 0u64;
    for item in items {
        let texts: Vec<String> = match item {
            Item::Prompt { prompt_text } => vec![prompt_text.clone()],
            Item::Chat { messages } => vec![
                engine
                    .template()
                    .context("the model has no chat template")?
                    .render(messages)
                    .map_err(anyhow::Error::msg)?,
            ],
            Item::Pipeline { stages } => stages.clone(),
        };
        let mut prev = String::new();
        for (k, t) in texts.iter().enumerate() {
            let text = match item {
                Item::Pipeline { .. } => chat_text(engine, &t.replace("{prev}", &prev))?,
                _ => t.clone(),
            };
            let prompt = engine
                .tokenizer()
                .encode_text(&text)
                .map_err(anyhow::Error::msg)?;
            let t0 = Instant::now();
            let g = if speculate {
                let mut d = IndexDrafter::new(&global, params);
                engine.generate(&prompt, &opts, &mut d, &mut |_| true)?
            } else {
                engine.generate(&prompt, &opts, &mut NoDrafts, &mut |_| true)?
            };
            pass.seconds += t0.elapsed().as_secs_f64() - g.prefill_s;
            pass.tokens += g.tokens.len();
            pass.steps += g.steps;
            pass.accepted += g.accepted_tokens;
            pass.drafted += g.drafted_tokens;
            if speculate {
                global.insert(next_id, &g.tokens)?;
                next_id += 1;
            }
            prev = g.text.clone();
            pass.outputs.push(g.tokens);
            let _ = k;
        }
    }
    Ok(pass)
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
    let plain = run_pass(&mut engine, &items, a.max_tokens, false, params)?;
    let spec = run_pass(&mut engine, &items, a.max_tokens, true, params)?;
    let same = plain
        .outputs
        .iter()
        .zip(&spec.outputs)
        .filter(|(x, y)| x == y)
        .count();
    let tps = |p: &Pass| p.tokens as f64 / p.seconds.max(1e-9);
    let report = serde_json::json!({
        "generations": plain.outputs.len(),
        "identical_outputs": same,
        "plain_tokens_per_s": tps(&plain),
        "spec_tokens_per_s": tps(&spec),
        "speedup": tps(&spec) / tps(&plain),
        "spec_tokens_per_step": spec.tokens as f64 / spec.steps.max(1) as f64,
        "mean_accepted_per_step": spec.accepted as f64 / spec.steps.max(1) as f64,
        "acceptance_rate": spec.accepted as f64 / spec.drafted.max(1) as f64,
        "cost_curve": engine.cost_curve(),
    });
    println!(
        "plain {:.1} tok/s, speculative {:.1} tok/s: {:.3}x; {:.2} tokens/step; {}/{} outputs identical",
        tps(&plain),
        tps(&spec),
        tps(&spec) / tps(&plain),
        spec.tokens as f64 / spec.steps.max(1) as f64,
        same,
        plain.outputs.len()
    );
    if a.json {
        println!("{report}");
    }
    Ok(())
}
