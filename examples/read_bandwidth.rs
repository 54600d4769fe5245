//! The memory-read bandwidth a decoding step can reach on this machine: threads sum a
//! buffer the size of a model's weights (issue 67: a step reads every weight once, so
//! the weights' bytes over this rate is the floor of a step, whatever the format). Two
//! ways, both printed:
//! - `halves`: each thread sums its own contiguous share of the whole buffer;
//! - `pool` (the `gb_per_s` reported): the buffer, on 2 MiB pages as the weights are,
//!   read as a decoding step reads its weights: one operation per 2 MiB "matrix" on the
//!   kernels' own thread pool, whose threads claim runs of 4 KiB items from a shared
//!   cursor. On this project's 2-core machine the kernels streamed faster than `halves`
//!   reads (46.7 GB/s of F32 weights against 22–46), which made it no ceiling.
//!
//!   cargo run --release --example read_bandwidth -- BYTES [THREADS] [ROUNDS]
//!
//! BYTES may be a file (its size is used: pass the GGUF file to compare against).
//! THREADS defaults to `CANDLE_NUM_THREADS`, else every core. Prints each round's GB/s
//! and their median, as JSON on the last line (`{"bytes":…,"threads":…,"gb_per_s":…}`).

use std::time::Instant;

/// Sums `values` in eight independent lanes of eight (64 floats a step), so the loop is
/// bound by loads, not by an addition's latency: with AVX2 where the CPU has it (eight
/// 256-bit accumulators; with 128-bit SSE the sixteen spill to the stack and the sum,
/// not the memory, set the pace).
fn sum(values: &[f32]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU has AVX2.
        return unsafe { sum_avx2(values) };
    }
    sum_lanes(values)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn sum_avx2(values: &[f32]) -> f32 {
    sum_lanes(values)
}

#[inline(always)]
fn sum_lanes(values: &[f32]) -> f32 {
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
    let halves = halves_rates(&buffer, threads, rounds);
    // SAFETY: no other thread runs yet; the pool reads this once, when it starts.
    unsafe { std::env::set_var("CANDLE_NUM_THREADS", threads.to_string()) };
    let weights = suffixd::model::kernels::hugepages::HugeSlice::copy_of(&buffer);
    drop(buffer);
    let pool = pool_rates(&weights, rounds);
    let median = |rates: &[f64]| rates[rates.len() / 2];
    println!(
        "{{\"bytes\":{},\"threads\":{threads},\"gb_per_s\":{:.2},\"best_gb_per_s\":{:.2},\
         \"halves_gb_per_s\":{:.2}}}",
        weights.len() * 4,
        median(&pool),
        pool.last().copied().unwrap_or(0.0),
        median(&halves),
    );
}

/// Each round's GB/s, sorted, with each thread summing its own share of `buffer`.
fn halves_rates(buffer: &[f32], threads: usize, rounds: usize) -> Vec<f64> {
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
        println!("halves, round {round}: {rate:.1} GB/s");
        rates.push(rate);
    }
    rates.sort_by(f64::total_cmp);
    eprintln!("(checksum {checksum})");
    rates
}

/// Each round's GB/s, sorted, reading `weights` as a decoding step does: 2 MiB
/// operations on the kernels' pool, 4 KiB items claimed from its cursor.
fn pool_rates(weights: &[f32], rounds: usize) -> Vec<f64> {
    const MATRIX: usize = (2 << 20) / 4;
    const ITEM: usize = 4096 / 4;
    let pool = suffixd::model::kernels::pool::pool();
    let mut rates = Vec::with_capacity(rounds);
    let checksum = std::sync::Mutex::new(0f32);
    for round in 0..rounds {
        let start = Instant::now();
        for matrix in weights.chunks(MATRIX) {
            pool.run(matrix.len().div_ceil(ITEM), |items| {
                let part = &matrix[items.start * ITEM..(items.end * ITEM).min(matrix.len())];
                let total = sum(part);
                *checksum.lock().unwrap() += total;
            });
        }
        let rate = weights.len() as f64 * 4.0 / start.elapsed().as_secs_f64() / 1e9;
        println!("pool, round {round}: {rate:.1} GB/s");
        rates.push(rate);
    }
    rates.sort_by(f64::total_cmp);
    eprintln!("(checksum {})", checksum.into_inner().unwrap());
    rates
}
