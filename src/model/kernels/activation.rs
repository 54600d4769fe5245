//! The feed-forward block's gate: `silu(g) · u` (or Gemma's `gelu_tanh(g) · u`) for the
//! fused gate|up product, on the host, so the down projection's input is made in one
//! pass over it (no narrowed copies, no separate activation and product tensors, and a
//! vectorized exponential instead of libm's per value), the rows of a long pass spread
//! over the kernels' threads.
//!
//! Element by element, so a row's result never depends on the other rows. The AVX2 paths
//! and the portable ones perform the same IEEE operations (the exponential is
//! attention's, about 2 ulp from libm), so they give the same bits.

#[cfg(target_arch = "x86_64")]
use super::attention::avx2::exp8;
use super::attention::exp_portable;
use super::{Out, Simd, execute_guided};

/// `silu(g) · u` with `e = e^−|g|` (never overflows): `g / (1 + e)` for `g ≥ 0`, and
/// `g · e / (1 + e)` below, which is the same function.
#[inline(always)]
fn gate_portable(g: f32, u: f32) -> f32 {
    let e = exp_portable(-g.abs());
    let numerator = if g >= 0.0 { g } else { g * e };
    numerator / (1.0 + e) * u
}

/// The function the feed-forward block's gate goes through.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Activation {
    /// `x · sigmoid(x)`: llama, Mistral, Qwen.
    Silu,
    /// GELU by its tanh approximation (PyTorch's `gelu(approximate="tanh")`): Gemma.
    GeluTanh,
}

/// `rows` rows of `gate_up` (`[row][gate (ffn) | up (ffn)]`) into `rows × ffn` values
/// `activation(gate) · up`. Rows are spread over the kernels' pool from
/// [`POOLED_FROM_ROWS`]: a prefill's gate is megabytes, which one thread took a fifth of
/// Gemma 3 270M's 512-row pass to go through.
pub fn gate_mul(
    simd: Simd,
    activation: Activation,
    gate_up: &[f32],
    rows: usize,
    ffn: usize,
) -> Vec<f32> {
    assert_eq!(gate_up.len(), rows * 2 * ffn, "gate_up is rows × 2·ffn");
    let mut out = vec![0f32; rows * ffn];
    let row = |r: usize, out: &mut [f32]| {
        let (gate, up) = gate_up[r * 2 * ffn..][..2 * ffn].split_at(ffn);
        gate_row(simd, activation, gate, up, out);
    };
    if rows < POOLED_FROM_ROWS {
        for (r, out) in out.chunks_exact_mut(ffn).enumerate() {
            row(r, out);
        }
    } else {
        let shared = Out::new(&mut out, ffn);
        execute_guided(rows, |range| {
            for r in range {
                // SAFETY: row r's ffn values are inside `out` and this item's alone.
                row(r, unsafe { shared.slice(r * ffn, ffn) });
            }
        });
    }
    out
}

/// Rows from which [`gate_mul`] runs on the pool: below, a row is a few microseconds,
/// less than handing it out.
const POOLED_FROM_ROWS: usize = 4;

/// `√(2/π)`, in Gemma's GELU.
const SQRT_2_OVER_PI: f32 = 0.797_884_6;

/// `gelu_tanh(g) · u = ½·g·(1 + tanh(y)) · u` for `y = √(2/π)·(g + 0.044715·g³)`. With
/// `e = e^−2|y|` (never overflows), `½(1 + tanh y)` is `1/(1 + e)` for `y ≥ 0` and
/// `e/(1 + e)` below, without the cancellation of `1 + tanh y` near −1 (the SiLU gate's
/// form).
#[inline(always)]
fn gelu_tanh_portable(g: f32, u: f32) -> f32 {
    let y = SQRT_2_OVER_PI * (g + 0.044_715 * g * g * g);
    let e = exp_portable(-2.0 * y.abs());
    let numerator = if y >= 0.0 { g } else { g * e };
    numerator / (1.0 + e) * u
}

/// `activation(gate) · up` into `out`: the AVX2 path over whole groups of eight, the
/// portable one for the rest (or all, without AVX2).
fn gate_row(simd: Simd, activation: Activation, gate: &[f32], up: &[f32], out: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    let done = if simd.has_avx2_fma() {
        // SAFETY: an x86 path is chosen only on CPUs with AVX2 and FMA.
        unsafe {
            match activation {
                Activation::Silu => avx2::silu_mul(gate, up, out),
                Activation::GeluTanh => avx2::gelu_tanh_mul(gate, up, out),
            }
        }
    } else {
        0
    };
    #[cfg(not(target_arch = "x86_64"))]
    let done = {
        let _ = simd;
        0
    };
    let portable = match activation {
        Activation::Silu => gate_portable,
        Activation::GeluTanh => gelu_tanh_portable,
    };
    for ((o, &g), &u) in out.iter_mut().zip(gate).zip(up).skip(done) {
        *o = portable(g, u);
    }
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use super::*;
    use std::arch::x86_64::*;

    /// [`gate_portable`] eight lanes at a time over the whole groups of eight; returns
    /// how many values it wrote.
    ///
    /// SAFETY: the CPU has AVX2 and FMA.
    #[target_feature(enable = "avx2,fma")]
    pub(super) fn silu_mul(gate: &[f32], up: &[f32], out: &mut [f32]) -> usize {
        assert!(gate.len() == up.len() && up.len() == out.len());
        let whole = gate.len() / 8 * 8;
        let sign = _mm256_set1_ps(-0.0);
        let one = _mm256_set1_ps(1.0);
        for i in (0..whole).step_by(8) {
            // SAFETY: i + 8 <= whole <= the length of each slice.
            unsafe {
                let g = _mm256_loadu_ps(gate.as_ptr().add(i));
                let u = _mm256_loadu_ps(up.as_ptr().add(i));
                let e = exp8(_mm256_or_ps(g, sign));
                let below = _mm256_cmp_ps(g, _mm256_setzero_ps(), _CMP_LT_OQ);
                let numerator = _mm256_blendv_ps(g, _mm256_mul_ps(g, e), below);
                let h = _mm256_mul_ps(_mm256_div_ps(numerator, _mm256_add_ps(one, e)), u);
                _mm256_storeu_ps(out.as_mut_ptr().add(i), h);
            }
        }
        whole
    }

    /// [`gelu_tanh_portable`] eight lanes at a time over the whole groups of eight, the
    /// same operations in the same order; returns how many values it wrote.
    ///
    /// SAFETY: the CPU has AVX2 and FMA.
    #[target_feature(enable = "avx2,fma")]
    pub(super) fn gelu_tanh_mul(gate: &[f32], up: &[f32], out: &mut [f32]) -> usize {
        assert!(gate.len() == up.len() && up.len() == out.len());
        let whole = gate.len() / 8 * 8;
        let sign = _mm256_set1_ps(-0.0);
        let one = _mm256_set1_ps(1.0);
        let cubic = _mm256_set1_ps(0.044_715);
        let scale = _mm256_set1_ps(SQRT_2_OVER_PI);
        let minus_two = _mm256_set1_ps(-2.0);
        for i in (0..whole).step_by(8) {
            // SAFETY: i + 8 <= whole <= the length of each slice.
            unsafe {
                let g = _mm256_loadu_ps(gate.as_ptr().add(i));
                let u = _mm256_loadu_ps(up.as_ptr().add(i));
                // ((0.044715 · g) · g) · g, as the portable expression associates.
                let g3 = _mm256_mul_ps(_mm256_mul_ps(_mm256_mul_ps(cubic, g), g), g);
                let y = _mm256_mul_ps(scale, _mm256_add_ps(g, g3));
                let e = exp8(_mm256_mul_ps(minus_two, _mm256_andnot_ps(sign, y)));
                // `y >= 0` picks g, as the portable branch does (NaN included).
                let at_least_zero = _mm256_cmp_ps(y, _mm256_setzero_ps(), _CMP_GE_OQ);
                let numerator = _mm256_blendv_ps(_mm256_mul_ps(g, e), g, at_least_zero);
                let h = _mm256_mul_ps(_mm256_div_ps(numerator, _mm256_add_ps(one, e)), u);
                _mm256_storeu_ps(out.as_mut_ptr().add(i), h);
            }
        }
        whole
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::kernels::{same_bits, test_values};

    #[test]
    fn the_gate_is_silu_times_up_on_every_path() {
        let (rows, ffn) = (3, 61);
        let mut gate_up = test_values(rows * 2 * ffn, 5, 40.0);
        // Beyond e^±88, and the signed zeros.
        gate_up[0] = -200.0;
        gate_up[1] = 200.0;
        gate_up[2] = -0.0;
        gate_up[3] = 0.0;
        let portable = gate_mul(Simd::Portable, Activation::Silu, &gate_up, rows, ffn);
        for r in 0..rows {
            for j in 0..ffn {
                let (g, u) = (gate_up[r * 2 * ffn + j], gate_up[r * 2 * ffn + ffn + j]);
                let want = g as f64 / (1.0 + (-g as f64).exp()) * u as f64;
                let got = portable[r * ffn + j] as f64;
                assert!(
                    (got - want).abs() <= 1e-6 * want.abs().max(1e-3),
                    "silu({g}) · {u}: {got} against {want}"
                );
            }
        }
        for &simd in Simd::available() {
            let fast = gate_mul(simd, Activation::Silu, &gate_up, rows, ffn);
            assert!(same_bits(&fast, &portable), "{simd:?} and portable differ");
        }
    }

    /// Both gates give every path's bits, alone and with rows on the pool.
    #[test]
    fn both_gates_give_the_same_bits_on_every_path_and_row_count() {
        let (rows, ffn) = (9, 45);
        let mut gate_up = test_values(rows * 2 * ffn, 7, 30.0);
        gate_up[0] = f32::NAN;
        gate_up[1] = -0.0;
        gate_up[2] = -200.0;
        for activation in [Activation::Silu, Activation::GeluTanh] {
            let one_by_one: Vec<f32> = (0..rows)
                .flat_map(|r| {
                    let row = &gate_up[r * 2 * ffn..][..2 * ffn];
                    gate_mul(Simd::Portable, activation, row, 1, ffn)
                })
                .collect();
            for &simd in Simd::available() {
                let all = gate_mul(simd, activation, &gate_up, rows, ffn);
                assert!(
                    same_bits(&all, &one_by_one),
                    "{activation:?}: {simd:?} with {rows} rows and portable one by one differ"
                );
            }
        }
    }

    #[test]
    fn the_gelu_gate_is_pytorch_s_tanh_approximation() {
        let (rows, ffn) = (2, 37);
        let mut gate_up = test_values(rows * 2 * ffn, 6, 12.0);
        gate_up[0] = -30.0;
        gate_up[1] = 30.0;
        gate_up[2] = 0.0;
        let ours = gate_mul(Simd::Portable, Activation::GeluTanh, &gate_up, rows, ffn);
        for r in 0..rows {
            for j in 0..ffn {
                let (g, u) = (
                    gate_up[r * 2 * ffn + j] as f64,
                    gate_up[r * 2 * ffn + ffn + j] as f64,
                );
                let y = (2.0 / std::f64::consts::PI).sqrt() * (g + 0.044715 * g * g * g);
                let want = 0.5 * g * (1.0 + y.tanh()) * u;
                let got = ours[r * ffn + j] as f64;
                assert!(
                    (got - want).abs() <= 2e-6 * want.abs().max(1e-2),
                    "gelu_tanh({g}) · {u}: {got} against {want}"
                );
            }
        }
    }
}
