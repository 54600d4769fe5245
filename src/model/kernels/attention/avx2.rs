//! The AVX2 path of [`super::attend`]: eight lanes of fused multiply-adds, the
//! operations [`super::attend_one_portable`] does lane by lane.

use super::*;
use crate::model::kernels::prefetch_row;
use crate::model::kernels::reduce_lanes_m256;
use std::arch::x86_64::*;

/// `exp_portable` on eight lanes.
#[target_feature(enable = "avx2,fma")]
pub(in crate::model::kernels) fn exp8(x: __m256) -> __m256 {
    let x = _mm256_max_ps(x, _mm256_set1_ps(EXP_FLOOR));
    let magic = _mm256_set1_ps(ROUNDING);
    let n = _mm256_sub_ps(
        _mm256_add_ps(_mm256_mul_ps(x, _mm256_set1_ps(LOG2E)), magic),
        magic,
    );
    let r = _mm256_fmadd_ps(n, _mm256_set1_ps(-LN2_HI), x);
    let r = _mm256_fmadd_ps(n, _mm256_set1_ps(-LN2_LO), r);
    let mut p = _mm256_set1_ps(EXP_POLY[0]);
    for &c in &EXP_POLY[1..] {
        p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(c));
    }
    let p = _mm256_add_ps(
        _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), r),
        _mm256_set1_ps(1.0),
    );
    let bits = _mm256_slli_epi32(
        _mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)),
        23,
    );
    _mm256_mul_ps(p, _mm256_castsi256_ps(bits))
}

/// `attend_one_portable` for each of the `G` query heads that share one key/value
/// head, with the same operations per head, but reading each key and value row once
/// for all of them. `q` and `o` hold the heads one after another (`G × hd`);
/// returns each head's `(max, Σ e)`, `o` holding its unnormalized sums;
/// `scores` is scratch. `G` is a constant so that every loop over the heads unrolls
/// and the accumulators stay in the 16 registers.
///
/// SAFETY: the CPU has AVX2 and FMA; `hd` is a multiple of 8; `q` and `o` hold
/// `G × hd` floats; every row's `stride`-spaced slice of `hd` floats is inside
/// `keys` and `values`.
#[target_feature(enable = "avx2,fma")]
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn attend_group<const G: usize>(
    q: &[f32],
    hd: usize,
    keys: &[f32],
    values: &[f32],
    rows: &[usize],
    stride: usize,
    scale: f32,
    scores: &mut Vec<f32>,
    o: &mut [f32],
) -> [(f32, f32); G] {
    let n = rows.len();
    assert!(q.len() == G * hd && o.len() == q.len() && hd.is_multiple_of(8));
    scores.clear();
    scores.resize(G * n, 0.0);
    // SAFETY: the caller's, and the assert above.
    unsafe {
        key_scores::<G>(q, hd, keys, rows, 0, stride, scale, scores);
        let stats = softmax::<G>(scores, n);
        weighted_sums_from::<G>(scores, values, rows, stride, hd, 0, o);
        stats
    }
}

/// Each head's scores of rows `from..` (`scores[h · n + at]`, `n` = `rows.len()`): two
/// keys at a time so that each load of q serves both; each (key, head) dot is its own
/// 8-lane FMA chain, reduced by [`reduce_lanes_m256`] and scaled, as alone.
///
/// SAFETY: as [`attend_group`]; `scores` holds `G × n` floats.
#[target_feature(enable = "avx2,fma")]
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn key_scores<const G: usize>(
    q: &[f32],
    hd: usize,
    keys: &[f32],
    rows: &[usize],
    from: usize,
    stride: usize,
    scale: f32,
    scores: &mut [f32],
) {
    let n = rows.len();
    assert!(q.len() == G * hd && scores.len() == G * n && hd.is_multiple_of(8));
    let key = |at: usize| &keys[rows[at] * stride..][..hd];
    let mut at = from;
    while at < n {
        let pair = if at + 1 < n { 2 } else { 1 };
        for ahead in at + PREFETCH_ROWS..(at + PREFETCH_ROWS + pair).min(n) {
            prefetch_row(key(ahead));
        }
        let (k0, k1) = (key(at), key(at + pair - 1));
        // Per head, the chains of the two keys.
        let mut acc = [[_mm256_setzero_ps(); 2]; G];
        for i in (0..hd).step_by(8) {
            // SAFETY: i + 8 <= hd = len of `k0`, `k1` and of each head's part of `q`.
            let kv = unsafe {
                [
                    _mm256_loadu_ps(k0.as_ptr().add(i)),
                    _mm256_loadu_ps(k1.as_ptr().add(i)),
                ]
            };
            for (h, acc) in acc.iter_mut().enumerate() {
                // SAFETY: h·hd + i + 8 <= G·hd = len of `q`.
                let qv = unsafe { _mm256_loadu_ps(q.as_ptr().add(h * hd + i)) };
                for (acc, &kv) in acc.iter_mut().zip(&kv) {
                    *acc = _mm256_fmadd_ps(qv, kv, *acc);
                }
            }
        }
        for (h, acc) in acc.iter().enumerate() {
            for (p, acc) in acc.iter().enumerate().take(pair) {
                scores[h * n + at + p] = reduce_lanes_m256!(*acc) * scale;
            }
        }
        at += pair;
    }
}

/// Each head's scores (`[head][n]`) to `exp(score − max)`, returning its `(max, Σ e)`:
/// the max in any order (it is the same value), the sum in eight lanes, `e` in key order.
///
/// SAFETY: the CPU has AVX2 and FMA; `scores` holds `G × n` floats.
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn softmax<const G: usize>(scores: &mut [f32], n: usize) -> [(f32, f32); G] {
    assert!(scores.len() >= G * n);
    let mut stats = [(0f32, 0f32); G];
    for (h, (max, sum)) in stats.iter_mut().enumerate() {
        let sc = &mut scores[h * n..(h + 1) * n];
        *max = max_of(sc);
        let max = *max;
        let maxv = _mm256_set1_ps(max);
        let full = n / 8 * 8;
        let mut acc = _mm256_setzero_ps();
        for i in (0..full).step_by(8) {
            // SAFETY: i + 8 <= full <= len of `sc`.
            unsafe {
                let p = sc.as_mut_ptr().add(i);
                let e = exp8(_mm256_sub_ps(_mm256_loadu_ps(p), maxv));
                _mm256_storeu_ps(p, e);
                acc = _mm256_add_ps(acc, e);
            }
        }
        let mut lanes = [0f32; 8];
        // SAFETY: `lanes` holds eight f32.
        unsafe { _mm256_storeu_ps(lanes.as_mut_ptr(), acc) };
        for (i, x) in sc.iter_mut().enumerate().skip(full) {
            *x = exp_portable(*x - max);
            lanes[i % 8] += *x;
        }
        *sum = reduce_lanes(&lanes);
    }
    stats
}

/// The largest of `scores` (not NaN), eight lanes at a time: the maximum is one value
/// whatever the order (up to the sign of a zero, which `exp(score − max)` does not see),
/// so this agrees with the portable path's fold, without its one-compare-at-a-time chain.
#[target_feature(enable = "avx2,fma")]
fn max_of(scores: &[f32]) -> f32 {
    let chunks = scores.chunks_exact(8);
    let tail = chunks
        .remainder()
        .iter()
        .fold(f32::NEG_INFINITY, |m, &x| m.max(x));
    let mut acc = _mm256_set1_ps(f32::NEG_INFINITY);
    for chunk in chunks {
        // SAFETY: `chunk` holds eight f32.
        acc = _mm256_max_ps(acc, unsafe { _mm256_loadu_ps(chunk.as_ptr()) });
    }
    let mut lanes = [0f32; 8];
    // SAFETY: `lanes` holds eight f32.
    unsafe { _mm256_storeu_ps(lanes.as_mut_ptr(), acc) };
    lanes.iter().fold(tail, |m, &x| m.max(x))
}

/// Every head's weighted sums from output float `d` on (the values' floats before `d`
/// done already), up to 8·W output floats of every head at a time in registers across
/// all values (W as wide as G heads' accumulators allow): each float gets one fused
/// multiply-add per key, in key order.
///
/// SAFETY: as [`weighted_sums`], for every width; `d` is a multiple of 8.
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn weighted_sums_from<const G: usize>(
    weights: &[f32],
    values: &[f32],
    rows: &[usize],
    stride: usize,
    hd: usize,
    mut d: usize,
    o: &mut [f32],
) {
    let widest = match G {
        1 | 2 => 4,
        3 => 3,
        _ => 2,
    };
    while d < hd {
        let width = ((hd - d) / 8).min(widest);
        // SAFETY: the caller's; d + 8·width <= hd.
        unsafe {
            match width {
                4 => weighted_sums::<G, 4>(weights, values, rows, stride, hd, d, o),
                3 => weighted_sums::<G, 3>(weights, values, rows, stride, hd, d, o),
                2 => weighted_sums::<G, 2>(weights, values, rows, stride, hd, d, o),
                _ => weighted_sums::<G, 1>(weights, values, rows, stride, hd, d, o),
            }
        }
        d += 8 * width;
    }
}

/// Output floats `d..d + 8·W` of each of the `G` heads: the weights
/// (`[head][key]`) times the value rows, one FMA per key in key order, held in
/// registers.
///
/// SAFETY: the CPU has AVX2 and FMA; `d + 8·W <= hd`; `o` holds `G × hd` floats
/// and `weights` `G × rows.len()`; every row's slice is inside `values`.
#[target_feature(enable = "avx2,fma")]
unsafe fn weighted_sums<const G: usize, const W: usize>(
    weights: &[f32],
    values: &[f32],
    rows: &[usize],
    stride: usize,
    hd: usize,
    d: usize,
    o: &mut [f32],
) {
    let n = rows.len();
    assert!(weights.len() >= G * n && o.len() >= G * hd);
    let mut acc = [[_mm256_setzero_ps(); W]; G];
    for (at, &r) in rows.iter().enumerate() {
        if let Some(&ahead) = rows.get(at + PREFETCH_ROWS) {
            prefetch_row(&values[ahead * stride + d..][..8 * W]);
        }
        let v = &values[r * stride + d..][..8 * W];
        // SAFETY: 8j + 8 <= 8·W = len of `v`.
        let vv: [__m256; W] =
            std::array::from_fn(|j| unsafe { _mm256_loadu_ps(v.as_ptr().add(8 * j)) });
        for (h, acc) in acc.iter_mut().enumerate() {
            let w = _mm256_set1_ps(weights[h * n + at]);
            for j in 0..W {
                acc[j] = _mm256_fmadd_ps(w, vv[j], acc[j]);
            }
        }
    }
    for (h, acc) in acc.iter().enumerate() {
        for (j, acc) in acc.iter().enumerate() {
            let out = &mut o[h * hd + d + 8 * j..][..8];
            // SAFETY: `out` holds eight f32.
            unsafe { _mm256_storeu_ps(out.as_mut_ptr(), *acc) };
        }
    }
}
