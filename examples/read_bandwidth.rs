//! The memory-read bandwidth a decoding step can reach on this machine: threads sum a
//! buffer the size of a model's weights, each its own contiguous share, as the matmul
//! kernels stream theirs (issue 67: a step reads every weight once, so the weights'
//! bytes over this rate is the floor of a step, whatever the format).
//!
//!   cargo run --release --example read_bandwidth -- BYTES [THREADS] [ROUNDS]
//!
//! BYTES may be a file (its size is used: pass the GGUF file to compare against).
//! THREADS defaults to `CANDLE_NUM_THREADS`, else every core. Prints each round's GB/s
//! and their median, as JSON on the last line (`{"bytes":…,"threads":…,"gb_per_s":…}`).

use std::time::Instant;

/// Sums `values` in eight independent lanes of eight (64 floats a step), so the loop is
/// bound by loads, not by an addition's latency.
fn sum(values: &[f32]) -> f32 {
    let mut lanes = [0f32; 64];
    let chunks = values.chunks_exact(64);
    let rest: f32 = chunks.remainder().iter().sum();
    for chunk in chunks {
        for (l, v) in lanes.iter_mut().zip(chunk) {
            *l += v;
        }
    }
    lanes.iter().sum::<f32>() + rest
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some(what) = args.first() else {
        eprintln!("usage: read_bandwidth BYTES|FILE [THREADS] [ROUNDS]");
        std::process::exit(2);
    };
    let bytes: usize = match what.parse() {
        Ok(n) => n,
        Err(_) => match std::fs::metadata(what) {
            Ok(m) => m.len() as usize,
            Err(e) => {
                eprintln!("{what}: neither a byte count nor a readable file ({e})");
                std::process::exit(2);
            }
        },
    };
    let threads: usize = args
        .get(1)
        .and_then(|t| t.parse().ok())
        .or_else(|| std::env::var("CANDLE_NUM_THREADS").ok()?.parse().ok())
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
        .max(1);
    let rounds: usize = args.get(2).and_then(|r| r.parse().ok()).unwrap_or(15);
    // Written once, so every page is resident before the first timed round.
    let buffer: Vec<f32> = (0..bytes / 4).map(|i| (i % 7) as f32).collect();
    let share = buffer.len().div_ceil(threads);
    let mut rates = Vec::with_capacity(rounds);
    let mut checksum = 0f32;
    for round in 0..rounds {
        let start = Instant::now();
        let sums: Vec<f32> = std::thread::scope(|s| {
            let handles: Vec<_> = buffer
                .chunks(share)
                .map(|part| s.spawn(move || sum(part)))
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let seconds = start.elapsed().as_secs_f64();
        checksum += sums.iter().sum::<f32>();
        let rate = buffer.len() as f64 * 4.0 / seconds / 1e9;
        println!("round {round}: {rate:.1} GB/s");
        rates.push(rate);
    }
    rates.sort_by(f64::total_cmp);
    let median = rates[rates.len() / 2];
    eprintln!("(checksum {checksum})");
    println!(
        "{{\"bytes\":{},\"threads\":{threads},\"gb_per_s\":{median:.2},\"best_gb_per_s\":{:.2}}}",
        buffer.len() * 4,
        rates.last().copied().unwrap_or(0.0)
    );
}
