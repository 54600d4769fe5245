//! The verifier's cost curve: t(K)/t(1) for one forward pass of K new tokens after a
//! context of C tokens, for each weight format, and prefill tokens/s. Run by
//! `tools/verify-cost.sh`, which builds this file against an older commit too and runs
//! the two alternately, so that the comparison is made in one run on one machine.
//!
//! Uses only `Engine::load`, `Engine::measure_cost_curve` and `Simd::detect`, which every
//! commit since the row-invariant kernels has (`tools/verify-cost.sh --base`).
//!
//! ```text
//! cargo run --release --example verify_cost -- MODEL [--weights q8-0,native,f32]
//!   [--contexts 64,1024,4096] [--repeats 3] [--prefill 512]
//! ```
//! Prints one JSON object per (weights, context), then one per weights for prefill.

use std::path::PathBuf;
use std::time::Instant;

use suffixd::engine::{Engine, GenerateOptions, NoDrafts};
use suffixd::model::forward::WeightFormat;

fn list<T>(arg: &str, parse: impl Fn(&str) -> T) -> Vec<T> {
    arg.split(',')
        .filter(|s| !s.is_empty())
        .map(parse)
        .collect()
}

fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let model = PathBuf::from(
        args.next()
            .ok_or_else(|| anyhow::anyhow!("usage: verify_cost MODEL [flags]"))?,
    );
    let (mut weights, mut contexts, mut repeats, mut prefill) = (
        "q8-0".to_string(),
        "64,1024,4096".to_string(),
        3usize,
        512usize,
    );
    while let Some(flag) = args.next() {
        let value = args
            .next()
            .ok_or_else(|| anyhow::anyhow!("{flag} needs a value"))?;
        match flag.as_str() {
            "--weights" => weights = value,
            "--contexts" => contexts = value,
            "--repeats" => repeats = value.parse()?,
            "--prefill" => prefill = value.parse()?,
            _ => anyhow::bail!("unknown flag {flag}"),
        }
    }
    let device = suffixd::model::device()?;
    for name in list(&weights, str::to_string) {
        let format = match name.as_str() {
            "q8-0" => WeightFormat::Q8_0,
            "native" => WeightFormat::Native,
            "f32" => WeightFormat::F32,
            other => anyhow::bail!("unknown weights {other}"),
        };
        let mut engine = Engine::load(&model, format, 8192, &device)?;
        for context in list(&contexts, |s| s.parse::<usize>().unwrap_or(64)) {
            let curve = engine.measure_cost_curve(64, context, repeats)?.clone();
            let line = serde_json::json!({
                "weights": name,
                "context": context,
                "t1_ms": curve.t1_ms,
                "curve": curve.points,
                "simd": suffixd::model::kernels::Simd::detect(),
            });
            println!("{line}");
        }
        if prefill > 0 {
            let prompt: Vec<u32> = (0..prefill as u32).map(|i| 100 + i % 1000).collect();
            let opts = GenerateOptions {
                max_tokens: 1,
                speculate: false,
                // Engine::load leaves the prefix cache off: every repeat prefills.
                namespace: "default".into(),
                ..GenerateOptions::default()
            };
            let mut times = Vec::new();
            for _ in 0..repeats.max(1) {
                let t = Instant::now();
                engine.generate(&prompt, &opts, &mut NoDrafts, &mut |_| true)?;
                times.push(t.elapsed().as_secs_f64());
            }
            times.sort_by(f64::total_cmp);
            let median = times[times.len() / 2];
            let line = serde_json::json!({
                "weights": name,
                "prefill_tokens": prefill,
                "prefill_tokens_per_s": prefill as f64 / median,
            });
            println!("{line}");
        }
    }
    Ok(())
}
