//! The feed-forward block's gate: `silu(g) · u` (or Gemma's `gelu_tanh(g) · u`) for the
//! fused gate|up product, on the host, so the down projection's input is made in one pass over it (no narrowed copies,
//! no separate SiLU and product tensors, and a vectorized exponential instead of libm's
//! per value).
//!
//! Element by element, so a row's result never depends on the other rows. The AVX2 path
//! and the portable one perform the same IEEE operations (the exponential is attention's,
//! about 2 ulp from libm), so they give the same bits.

use super::Simd;
#[cfg(target_arch = "x86_64")]
use super::attention::avx2::exp8;
use super::attention::exp_portable;

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
/// `activation(gate) · up`.
pub fn gate_mul(
    simd: Simd,
    activation: Activation,
    gate_up: &[f32],
    rows: usize,
    ffn: usize,
) -> Vec<f32> {
    match activation {
        Activation::Silu => silu_mul(simd, gate_up, rows, ffn),
        Activation::GeluTanh => gelu_tanh_mul(gate_up, rows, ffn),
    }
}

/// `gelu_tanh(g) · u = ½·g·(1 + tanh(y)) · u` for `y = √(2/π)·(g + 0.044715·g³)`. With
/// `e = e^−2|y|` (never overflows), `½(1 + tanh y)` is `1/(1 + e)` for `y ≥ 0` and
/// `e/(1 + e)` below, without the cancellation of `1 + tanh y` near −1 (the SiLU gate's
/// form). Portable only: Gemma's share of a step is small beside its projections.
fn gelu_tanh_mul(gate_up: &[f32], rows: usize, ffn: usize) -> Vec<f32> {
    const SQRT_2_OVER_PI: f32 = 0.797_884_6;
    assert_eq!(gate_up.len(), rows * 2 * ffn, "gate_up is rows × 2·ffn");
    let mut out = vec![0f32; rows * ffn];
    for (row, out) in gate_up.chunks_exact(2 * ffn).zip(out.chunks_exact_mut(ffn)) {
        let (gate, up) = row.split_at(ffn);
        for ((o, &g), &u) in out.iter_mut().zip(gate).zip(up) {
            let y = SQRT_2_OVER_PI * (g + 0.044_715 * g * g * g);
            let e = exp_portable(-2.0 * y.abs());
            let numerator = if y >= 0.0 { g } else { g * e };
            *o = numerator / (1.0 + e) * u;
        }
    }
    out
}

/// `rows` rows of `gate_up` (`[row][gate (ffn) | up (ffn)]`) into `rows × ffn` values
/// `silu(gate) · up`.
pub fn silu_mul(simd: Simd, gate_up: &[f32], rows: usize, ffn: usize) -> Vec<f32> {
    assert_eq!(gate_up.len(), rows * 2 * ffn, "gate_up is rows × 2·ffn");
    let mut out = vec![0f32; rows * ffn];
    for (row, out) in gate_up.chunks_exact(2 * ffn).zip(out.chunks_exact_mut(ffn)) {
        let (gate, up) = row.split_at(ffn);
        #[cfg(target_arch = "x86_64")]
        let done = if simd.has_avx2_fma() {
            // SAFETY: an x86 path is chosen only on CPUs with AVX2 and FMA.
            unsafe { avx2::silu_mul(gate, up, out) }
        } else {
            0
        };
        #[cfg(not(target_arch = "x86_64"))]
        let done = {
            let _ = simd;
            0
        };
        for ((o, &g), &u) in out.iter_mut().zip(gate).zip(up).skip(done) {
            *o = gate_portable(g, u);
        }
    }
    out
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
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::kernels::test_values;

    #[test]
    fn the_gate_is_silu_times_up_on_every_path() {
        let (rows, ffn) = (3, 61);
        let mut gate_up = test_values(rows * 2 * ffn, 5, 40.0);
        // Beyond e^±88, and the signed zeros.
        gate_up[0] = -200.0;
        gate_up[1] = 200.0;
        gate_up[2] = -0.0;
        gate_up[3] = 0.0;
        let portable = silu_mul(Simd::Portable, &gate_up, rows, ffn);
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
            let fast = silu_mul(simd, &gate_up, rows, ffn);
            assert!(
                fast.iter()
                    .zip(&portable)
                    .all(|(a, b)| a.to_bits() == b.to_bits()),
                "{simd:?} and portable differ"
            );
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
