//! One forward pass of K chained tokens after a short context, repeated: a steady loop
//! to profile (`perf record`) the verifier at one row count.
//!
//! ```text
//! cargo run --release --example forward_rows -- MODEL [K] [PASSES] [CONTEXT]
//! ```
//! Prints the median milliseconds per pass.

use std::path::PathBuf;
use std::time::Instant;

use candle_core::quantized::gguf_file;
use suffixd::verify::model::{KvCache, Model, WeightFormat, argmax_rows};

fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let path = PathBuf::from(args.next().ok_or_else(|| anyhow::anyhow!("MODEL"))?);
    let k: usize = args.next().map_or(Ok(16), |s| s.parse())?;
    let passes: usize = args.next().map_or(Ok(200), |s| s.parse())?;
    let context: usize = args.next().map_or(Ok(64), |s| s.parse())?;
    let device = suffixd::verify::device()?;
    let mut file = std::fs::File::open(&path)?;
    let content = gguf_file::Content::read(&mut file)?;
    let model = Model::load_gguf(&path, &content, WeightFormat::Native, 8192, &device)?;
    let mut cache = KvCache::default();
    let prefix: Vec<u32> = (0..context as u32).map(|i| 100 + i % 1000).collect();
    let chain = |n: usize| (0..n as i32).map(|i| i - 1).collect::<Vec<i32>>();
    model.forward(&mut cache, &prefix, &chain(prefix.len()))?;
    cache.commit(&(0..prefix.len()).collect::<Vec<_>>());
    let tokens: Vec<u32> = (0..k as u32).map(|i| 200 + i).collect();
    let mut times = Vec::with_capacity(passes);
    for _ in 0..passes {
        let t = Instant::now();
        let logits = model.forward(&mut cache, &tokens, &chain(k))?;
        argmax_rows(&logits)?;
        times.push(t.elapsed().as_secs_f64() * 1e3);
        cache.commit(&[]);
    }
    times.sort_by(f64::total_cmp);
    println!("k {k} median {:.2} ms", times[times.len() / 2]);
    Ok(())
}
