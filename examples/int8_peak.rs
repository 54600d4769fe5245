//! The ceiling on this CPU for the quantized matmul's arithmetic: how many 8-bit
//! multiply-adds per second the block dot product can do, registers only (no loads, no
//! memory traffic), on one core and on every thread at once. A kernel runs at some
//! fraction of this; the verifier's cost of K rows cannot drop below K · (multiply-adds
//! per row) / this rate. (Issue 19: t(16)/t(1) for the default model needs 16 rows of
//! ~135 M multiply-adds each.)
//!
//! Two instruction mixes, per 32 multiply-adds (AVX2):
//! - `per-block`: what `verify::kernels::matmul` does now: `maddubs` + `madd` give a
//!   block's dot in eight i32 lanes, then convert, scale product and fused multiply-add,
//!   once per block;
//! - `grouped`: eight blocks side by side, each i32 lane accumulating one block's whole
//!   dot (`maddubs` + `madd` + `add`), with convert, scale and FMA once per eight steps
//!   (what the kernels do with AVX2);
//! - `grouped-vnni`: the same with one `vpdpbusd` per step (what they do with AVX-512
//!   VNNI), eight chains, on CPUs that have it.
//!
//!   cargo run --release --example int8_peak [-- THREADS]     (default: all cores)

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::asm;
    use std::arch::x86_64::*;

    /// Independent accumulator chains: enough to hide the latencies, few enough that
    /// every value stays in the 16 vector registers (spills would measure the compiler).
    pub const CHAINS: usize = 4;

    /// Multiply-adds done by a mix of `chains` chains with `steps` steps.
    pub fn macs(steps: u64, chains: usize) -> f64 {
        steps as f64 * chains as f64 * 32.0
    }

    /// Chains of `grouped_vnni`: `vpdpbusd` has a latency of several cycles, and the
    /// kernel's 8 × 2 tile keeps 16 accumulators; eight chains (24 registers with the
    /// float accumulators and the operands) fit AVX-512's 32.
    pub const VNNI_CHAINS: usize = 8;

    /// SAFETY: the CPU has AVX2 and FMA.
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn per_block(steps: u64) -> f32 {
        let a = _mm256_set1_epi8(5);
        let ones = _mm256_set1_epi16(1);
        let mut d = _mm256_set1_ps(1e-9);
        let mut w: [__m256i; CHAINS] = std::array::from_fn(|i| _mm256_set1_epi8(i as i8 + 1));
        let s: [__m256; CHAINS] = std::array::from_fn(|i| _mm256_set1_ps(1e-9 * (i + 1) as f32));
        let mut acc = [_mm256_setzero_ps(); CHAINS];
        for _ in 0..steps {
            // SAFETY: an empty asm block: it hides the value from the optimizer, so that
            // every step multiplies the scales afresh, as a kernel's new block would.
            unsafe { asm!("/* {0} */", inout(ymm_reg) d, options(pure, nomem, nostack)) };
            for i in 0..CHAINS {
                // SAFETY: as above, for a fresh product per step, as a kernel's loads give.
                unsafe { asm!("/* {0} */", inout(ymm_reg) w[i], options(pure, nomem, nostack)) };
                let lanes = _mm256_madd_epi16(_mm256_maddubs_epi16(w[i], a), ones);
                acc[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(lanes), _mm256_mul_ps(s[i], d), acc[i]);
            }
        }
        sum(acc)
    }

    /// SAFETY: the CPU has AVX2 and FMA.
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn grouped(steps: u64) -> f32 {
        let a = _mm256_set1_epi8(5);
        let ones = _mm256_set1_epi16(1);
        let d = _mm256_set1_ps(1e-9);
        let mut w: [__m256i; CHAINS] = std::array::from_fn(|i| _mm256_set1_epi8(i as i8 + 1));
        let mut lanes = [_mm256_setzero_si256(); CHAINS];
        let mut acc = [_mm256_setzero_ps(); CHAINS];
        for step in 0..steps {
            for i in 0..CHAINS {
                // SAFETY: as in `per_block`.
                unsafe { asm!("/* {0} */", inout(ymm_reg) w[i], options(pure, nomem, nostack)) };
                let pairs = _mm256_madd_epi16(_mm256_maddubs_epi16(w[i], a), ones);
                lanes[i] = _mm256_add_epi32(lanes[i], pairs);
            }
            if step % 8 == 7 {
                for i in 0..CHAINS {
                    acc[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(lanes[i]), d, acc[i]);
                    lanes[i] = _mm256_setzero_si256();
                }
            }
        }
        sum(acc)
    }

    /// SAFETY: the CPU has AVX2, FMA, AVX512_VNNI and AVX512VL.
    #[target_feature(enable = "avx2,fma,avx512vnni,avx512vl")]
    pub unsafe fn grouped_vnni(steps: u64) -> f32 {
        const N: usize = VNNI_CHAINS;
        let a = _mm256_set1_epi8(5);
        let mut d = _mm256_set1_ps(1e-9);
        let s = _mm256_set1_ps(1e-9);
        let mut w: [__m256i; N] = std::array::from_fn(|i| _mm256_set1_epi8(i as i8 + 1));
        let mut lanes = [_mm256_setzero_si256(); N];
        let mut acc = [_mm256_setzero_ps(); N];
        for step in 0..steps {
            for i in 0..N {
                // SAFETY: as in `per_block`.
                unsafe { asm!("/* {0} */", inout(ymm_reg) w[i], options(pure, nomem, nostack)) };
                lanes[i] = _mm256_dpbusd_epi32(lanes[i], w[i], a);
            }
            if step % 8 == 7 {
                // SAFETY: as in `per_block`: a fresh scale product per group.
                unsafe { asm!("/* {0} */", inout(ymm_reg) d, options(pure, nomem, nostack)) };
                for i in 0..N {
                    acc[i] =
                        _mm256_fmadd_ps(_mm256_cvtepi32_ps(lanes[i]), _mm256_mul_ps(s, d), acc[i]);
                    lanes[i] = _mm256_setzero_si256();
                }
            }
        }
        sum(acc)
    }

    #[target_feature(enable = "avx2,fma")]
    fn sum<const N: usize>(acc: [__m256; N]) -> f32 {
        let mut total = _mm256_setzero_ps();
        for a in acc {
            total = _mm256_add_ps(total, a);
        }
        let mut out = [0f32; 8];
        // SAFETY: `out` holds eight f32.
        unsafe { _mm256_storeu_ps(out.as_mut_ptr(), total) };
        out.iter().sum()
    }
}

#[cfg(target_arch = "x86_64")]
fn main() {
    use std::time::Instant;
    if !(is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma")) {
        eprintln!("this CPU has no AVX2 and FMA: nothing to measure");
        return;
    }
    let all = std::thread::available_parallelism().map_or(1, |n| n.get());
    let threads: usize = std::env::args()
        .nth(1)
        .and_then(|t| t.parse().ok())
        .unwrap_or(all);
    let steps = 20_000_000u64;
    type Kernel = unsafe fn(u64) -> f32;
    let mut kernels: Vec<(&str, Kernel, usize)> = vec![
        ("per-block", x86::per_block, x86::CHAINS),
        ("grouped", x86::grouped, x86::CHAINS),
    ];
    if is_x86_feature_detected!("avx512vnni") && is_x86_feature_detected!("avx512vl") {
        kernels.push(("grouped-vnni", x86::grouped_vnni, x86::VNNI_CHAINS));
    }
    for (name, kernel, chains) in kernels {
        for n in [1, threads] {
            let start = Instant::now();
            let sink: f32 = std::thread::scope(|s| {
                let handles: Vec<_> = (0..n)
                    // SAFETY: AVX2 and FMA were detected above, and VNNI for its mix.
                    .map(|_| s.spawn(move || unsafe { kernel(steps) }))
                    .collect();
                handles
                    .into_iter()
                    .map(|h| h.join().expect("no panic"))
                    .sum()
            });
            let secs = start.elapsed().as_secs_f64();
            let gmacs = x86::macs(steps, chains) * n as f64 / secs / 1e9;
            println!(
                "{name:<12} {n:>2} thread(s): {gmacs:6.1} G multiply-adds/s \
                 ({:.1} per thread)  [{sink:.3e}]",
                gmacs / n as f64
            );
        }
    }
}

#[cfg(not(target_arch = "x86_64"))]
fn main() {
    eprintln!("int8_peak measures the x86 AVX2 kernels only");
}
