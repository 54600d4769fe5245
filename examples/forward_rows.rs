//! One forward pass of K chained tokens after a short context, repeated: a steady loop
//! to profile (`perf record`) the verifier at one row count. With SEQUENCES > 1, that
//! many sequences (each its own context) share every pass, as a server's batch does.
//!
//! ```text
//! cargo run --release --example forward_rows -- MODEL [K] [PASSES] [CONTEXT] [SEQUENCES]
//! ```
//! Prints the median milliseconds per pass. `LOGITS=none` skips the output head (what a
//! prefill chunk runs), so that the head's share of a pass is the difference.

use std::path::PathBuf;
use std::time::Instant;

use candle_core::quantized::gguf_file;
use suffixd::model::forward::{BatchEntry, KvCache, LogitRows, Model, WeightFormat, argmax_rows};

fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let path = PathBuf::from(args.next().ok_or_else(|| anyhow::anyhow!("MODEL"))?);
    let k: usize = args.next().map_or(Ok(16), |s| s.parse())?;
    let passes: usize = args.next().map_or(Ok(200), |s| s.parse())?;
    let context: usize = args.next().map_or(Ok(64), |s| s.parse())?;
    let sequences: usize = args.next().map_or(Ok(1), |s| s.parse())?;
    let device = suffixd::model::device()?;
    let mut file = std::fs::File::open(&path)?;
    let content = gguf_file::Content::read(&mut file)?;
    let model = Model::load_gguf(&path, &content, WeightFormat::Native, 8192, &device)?;
    let chain = |n: usize| (0..n as i32).map(|i| i - 1).collect::<Vec<i32>>();
    let mut caches: Vec<KvCache> = (0..sequences).map(|_| KvCache::default()).collect();
    for (s, cache) in caches.iter_mut().enumerate() {
        let prefix: Vec<u32> = (0..context as u32)
            .map(|i| 100 + (i + 7 * s as u32) % 1000)
            .collect();
        model.forward(cache, &prefix, &chain(prefix.len()))?;
        cache.commit(&(0..prefix.len()).collect::<Vec<_>>())?;
    }
    let logit_rows = match std::env::var("LOGITS").as_deref() {
        Ok("none") => LogitRows::None,
        _ => LogitRows::All,
    };
    let tokens: Vec<u32> = (0..k as u32).map(|i| 200 + i).collect();
    let parents = chain(k);
    let mut times = Vec::with_capacity(passes);
    for _ in 0..passes {
        let t = Instant::now();
        let mut batch: Vec<BatchEntry<'_>> = caches
            .iter_mut()
            .map(|cache| BatchEntry {
                cache,
                tokens: &tokens,
                parents: &parents,
                logits: logit_rows,
            })
            .collect();
        let logits = model.forward_batch(&mut batch)?;
        argmax_rows(&logits)?;
        times.push(t.elapsed().as_secs_f64() * 1e3);
        for cache in &mut caches {
            cache.commit(&[])?;
        }
    }
    times.sort_by(f64::total_cmp);
    println!("k {k} median {:.2} ms", times[times.len() / 2]);
    Ok(())
}
