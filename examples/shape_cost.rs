//! What a step costs for a model of a real architecture, without its weights: a model
//! of a named shape with seeded random weights made on the device
//! (`suffixd::model::synthetic`), its verifier cost curve t(K)/t(1), and how close one
//! plain decoding step comes to the device's memory bandwidth, measured in the same run
//! as a copy of a buffer as large as the weights (a copy reads and writes each byte; a
//! decoding step reads each weight once).
//!
//! ```text
//! cargo run --release --example shape_cost -- SHAPE [--weights bf16] [--contexts 64,1024]
//!   [--max-k 32] [--repeats 5] [--seed 0]
//! ```
//! SHAPE is one of `suffixd::model::synthetic::shapes()` (llama-3.2-1b, llama-3.1-8b,
//! ...). Prints one JSON object per context. The tokenizer, chat template and end tokens
//! are a GGUF file's (`--vocabulary`, default: the model `tools/setup.sh` installs); its
//! vocabulary is padded to the shape's. A machine that cannot take the whole default
//! model gets its vocabulary alone, a few MB:
//!
//! ```text
//! shape_cost --write-vocabulary models/SmolLM2-135M-Instruct.Q4_1.gguf vocab.gguf
//! ```
//!
//! For the peer on the same card (`tools/peer-shapes.py`), a shape's whole `config.json`
//! (the published checkpoint's, with its widths, vocabulary and tying):
//!
//! ```text
//! shape_cost --write-config llama-3.1-8b config.json
//! ```

use std::path::Path;
use std::time::Instant;

use candle_core::{DType, Device, Tensor};
use suffixd::engine::Engine;
use suffixd::model::forward::WeightFormat;
use suffixd::model::synthetic;

/// Seconds a copy of `bytes` bytes on `device` takes, the median of `repeats`. The copy
/// goes into a buffer made beforehand, so neither allocation nor first-touch page faults
/// are timed.
fn copy_seconds(bytes: usize, device: &Device, repeats: usize) -> anyhow::Result<f64> {
    let source = Tensor::zeros(bytes / 2, DType::BF16, device)?;
    let target = Tensor::ones(bytes / 2, DType::BF16, device)?;
    let mut times = Vec::new();
    for _ in 0..repeats.max(1) + 1 {
        device.synchronize()?;
        let t = Instant::now();
        target.slice_set(&source, 0, 0)?;
        device.synchronize()?;
        times.push(t.elapsed().as_secs_f64());
    }
    // The first copy warms caches and the copy kernel: left out.
    times.remove(0);
    times.sort_by(f64::total_cmp);
    Ok(times[times.len() / 2])
}

/// Write the tokenizer's metadata of the GGUF file `from` (its `tokenizer.*` and
/// `general.*` keys, no tensors) to `to`.
fn write_vocabulary(from: &str, to: &str) -> anyhow::Result<()> {
    use candle_core::quantized::gguf_file;
    let content = gguf_file::Content::read(&mut std::fs::File::open(from)?)?;
    let kept: Vec<(&str, &gguf_file::Value)> = content
        .metadata
        .iter()
        .filter(|(k, _)| k.starts_with("tokenizer.") || k.starts_with("general."))
        .map(|(k, v)| (k.as_str(), v))
        .collect();
    let mut out = std::fs::File::create(to)?;
    gguf_file::write(&mut out, &kept, &[])?;
    Ok(())
}

/// Write shape `name`'s `config.json` as transformers reads it to `to`.
fn write_config(name: &str, to: &str) -> anyhow::Result<()> {
    let shape = synthetic::shape(name)?;
    let mut config = shape.config.clone();
    config["intermediate_size"] = shape.ffn.into();
    config["vocab_size"] = shape.vocab.into();
    config["tie_word_embeddings"] = shape.tied.into();
    config["torch_dtype"] = "bfloat16".into();
    std::fs::write(to, serde_json::to_string_pretty(&config)?)?;
    Ok(())
}

fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let name = args
        .next()
        .ok_or_else(|| anyhow::anyhow!("usage: shape_cost SHAPE [flags]"))?;
    if name == "--write-vocabulary" {
        let (from, to) = (args.next(), args.next());
        let (Some(from), Some(to)) = (from, to) else {
            anyhow::bail!("usage: shape_cost --write-vocabulary FROM.gguf TO.gguf");
        };
        return write_vocabulary(&from, &to);
    }
    if name == "--write-config" {
        let (Some(shape), Some(to)) = (args.next(), args.next()) else {
            anyhow::bail!("usage: shape_cost --write-config SHAPE config.json");
        };
        return write_config(&shape, &to);
    }
    let (mut weights, mut contexts, mut max_k, mut repeats, mut seed) = (
        "bf16".to_string(),
        "64,1024".to_string(),
        32usize,
        5usize,
        0u64,
    );
    let mut vocabulary =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("models/SmolLM2-135M-Instruct.Q4_1.gguf");
    while let Some(flag) = args.next() {
        let value = args
            .next()
            .ok_or_else(|| anyhow::anyhow!("{flag} needs a value"))?;
        match flag.as_str() {
            "--weights" => weights = value,
            "--contexts" => contexts = value,
            "--max-k" => max_k = value.parse()?,
            "--repeats" => repeats = value.parse()?,
            "--seed" => seed = value.parse()?,
            "--vocabulary" => vocabulary = value.into(),
            _ => anyhow::bail!("unknown flag {flag}"),
        }
    }
    let (format, bytes_per_weight) = match weights.as_str() {
        "bf16" => (WeightFormat::Bf16, 2),
        "f32" => (WeightFormat::F32, 4),
        other => anyhow::bail!("weights {other}: bf16 or f32"),
    };
    let shape = synthetic::shape(&name)?;
    let parameters = shape.parameters()?;
    let device = suffixd::model::device()?;
    let t = Instant::now();
    let mut engine = Engine::synthetic(&name, seed, &vocabulary, format, 8192, &device)?;
    let made_s = t.elapsed().as_secs_f64();
    let weight_bytes = parameters as usize * bytes_per_weight;
    let copy_s = copy_seconds(weight_bytes, &device, repeats)?;
    // A copy moves each byte twice (read, write).
    let copy_bandwidth = 2.0 * weight_bytes as f64 / copy_s;
    for context in contexts.split(',').filter_map(|c| c.parse::<usize>().ok()) {
        let curve = engine.measure_cost_curve(max_k, context, repeats)?.clone();
        let step_s = curve.t1_ms / 1e3;
        let line = serde_json::json!({
            "shape": name,
            "weights": weights,
            "parameters": parameters,
            "made_s": made_s,
            "context": context,
            "t1_ms": curve.t1_ms,
            "curve": curve.points,
            "plain_tokens_per_s": 1.0 / step_s,
            "weights_read_gb_per_s": weight_bytes as f64 / step_s / 1e9,
            "copy_gb_per_s": copy_bandwidth / 1e9,
            "share_of_copy_bandwidth": weight_bytes as f64 / step_s / copy_bandwidth,
            "device": format!("{device:?}"),
        });
        println!("{line}");
    }
    Ok(())
}
