//! The AVX-512 path of [`super::attend`]: the AVX2 path's lanes, operations and order
//! (so the same bits), with two keys' eight lanes side by side in one 512-bit register
//! for the scores and sixteen output floats a register for the weighted sums, so each
//! multiply-add does the work of two; the scores' lane reductions run eight keys at a
//! time through shuffles of whole registers instead of one key at a time.

use super::avx2;
use super::*;
use crate::model::kernels::prefetch_row;
use std::arch::x86_64::*;

/// [`avx2::attend_group`] with 512-bit registers where the rows allow (keys eight at a
/// time, output floats sixteen at a time), the AVX2 code for what is left over.
///
/// SAFETY: the CPU has AVX-512F, AVX2 and FMA; otherwise as [`avx2::attend_group`].
#[target_feature(enable = "avx512f,avx2,fma")]
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
        let scored = key_scores_by_eight::<G>(q, hd, keys, rows, stride, scale, scores);
        avx2::key_scores::<G>(q, hd, keys, rows, scored, stride, scale, scores);
        let stats = avx2::softmax::<G>(scores, n);
        let summed = weighted_sums_by_sixteen::<G>(scores, values, rows, stride, hd, o);
        avx2::weighted_sums_from::<G>(scores, values, rows, stride, hd, summed, o);
        stats
    }
}

/// The scores of the first `n / 8 · 8` rows (`scores[h · n + at]`), eight keys at a
/// time: register `j` of a head holds keys `2j` and `2j + 1`'s eight-lane chains, one
/// in each half, each the AVX2 path's chain. Returns the rows scored.
///
/// The reduction is [`crate::model::kernels::reduce_lanes`]'s for every key, with the
/// lanes of several keys moved side by side first: `t = l[0..4] + l[4..8]` (whole
/// 128-bit blocks; per head a register of keys 0–3's `t`, one of keys 4–7's), then
/// `u = (t0 + t2, t1 + t3)` (pairs of lanes within blocks: block `b` holds keys `b` and
/// `b + 4`), then `u0 + u1` for two heads at once; a permutation puts each head's eight
/// scores in key order, and they are scaled as on the AVX2 path.
///
/// SAFETY: as [`attend_group`]; `scores` holds `G × n` floats.
#[target_feature(enable = "avx512f,avx2,fma")]
#[allow(clippy::too_many_arguments)]
unsafe fn key_scores_by_eight<const G: usize>(
    q: &[f32],
    hd: usize,
    keys: &[f32],
    rows: &[usize],
    stride: usize,
    scale: f32,
    scores: &mut [f32],
) -> usize {
    let n = rows.len();
    assert!(q.len() == G * hd && scores.len() == G * n && hd.is_multiple_of(8));
    let scale = _mm512_set1_ps(scale);
    // After the last step, block b holds [head h: key b, key b + 4; head h + 1: the same].
    let key_order = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
    let mut at = 0;
    while at + 8 <= n {
        for &ahead in rows.iter().skip(at + PREFETCH_ROWS).take(8) {
            prefetch_row(&keys[ahead * stride..][..hd]);
        }
        let mut k = [keys.as_ptr(); 8];
        for (k, &row) in k.iter_mut().zip(&rows[at..at + 8]) {
            *k = keys[row * stride..][..hd].as_ptr();
        }
        let mut acc = [[_mm512_setzero_ps(); 4]; G];
        for i in (0..hd).step_by(8) {
            // SAFETY: i + 8 <= hd = len of every key (`k`) and of each head's part of `q`.
            let kv: [__m512; 4] = std::array::from_fn(|j| unsafe {
                let low = _mm256_castps_pd(_mm256_loadu_ps(k[2 * j].add(i)));
                let high = _mm256_castps_pd(_mm256_loadu_ps(k[2 * j + 1].add(i)));
                _mm512_castpd_ps(_mm512_insertf64x4::<1>(_mm512_castpd256_pd512(low), high))
            });
            for (h, acc) in acc.iter_mut().enumerate() {
                // SAFETY: h·hd + i + 8 <= G·hd = len of `q`.
                let eight = unsafe { _mm256_loadu_ps(q.as_ptr().add(h * hd + i)) };
                let qv = _mm512_castpd_ps(_mm512_broadcast_f64x4(_mm256_castps_pd(eight)));
                for (acc, &kv) in acc.iter_mut().zip(&kv) {
                    *acc = _mm512_fmadd_ps(qv, kv, *acc);
                }
            }
        }
        // Per head: block b of `t_low` is key b's t, of `t_high` key b + 4's; then block
        // b of `u` is [key b: u0, u1; key b + 4: u0, u1].
        let u: [__m512; G] = std::array::from_fn(|h| {
            let [a0, a1, a2, a3] = acc[h];
            let t_low = _mm512_add_ps(
                _mm512_shuffle_f32x4::<0x88>(a0, a1),
                _mm512_shuffle_f32x4::<0xDD>(a0, a1),
            );
            let t_high = _mm512_add_ps(
                _mm512_shuffle_f32x4::<0x88>(a2, a3),
                _mm512_shuffle_f32x4::<0xDD>(a2, a3),
            );
            _mm512_add_ps(
                _mm512_shuffle_ps::<0x44>(t_low, t_high),
                _mm512_shuffle_ps::<0xEE>(t_low, t_high),
            )
        });
        for h in (0..G).step_by(2) {
            let next = (h + 1).min(G - 1);
            let sums = _mm512_add_ps(
                _mm512_shuffle_ps::<0x88>(u[h], u[next]),
                _mm512_shuffle_ps::<0xDD>(u[h], u[next]),
            );
            let two = _mm512_mul_ps(_mm512_permutexvar_ps(key_order, sums), scale);
            let high = _mm512_extractf64x4_pd::<1>(_mm512_castps_pd(two));
            // SAFETY: rows at..at + 8 of heads h and next are inside `scores` (asserted).
            unsafe {
                let out = scores.as_mut_ptr();
                _mm256_storeu_ps(out.add(h * n + at), _mm512_castps512_ps256(two));
                if next != h {
                    _mm256_storeu_ps(out.add(next * n + at), _mm256_castpd_ps(high));
                }
            }
        }
        at += 8;
    }
    at
}

/// The weighted sums of the first `hd / 16 · 16` output floats of every head, up to
/// 16·W at a time in registers (W of 4 for any group of up to 4 heads: 16 accumulators,
/// 4 value registers, one weight); each float one fused multiply-add per key in key
/// order, as on the AVX2 path. Returns the output floats done.
///
/// SAFETY: as [`attend_group`]; `weights` holds `G × rows.len()` floats.
#[target_feature(enable = "avx512f,avx2,fma")]
unsafe fn weighted_sums_by_sixteen<const G: usize>(
    weights: &[f32],
    values: &[f32],
    rows: &[usize],
    stride: usize,
    hd: usize,
    o: &mut [f32],
) -> usize {
    let mut d = 0;
    while hd - d >= 16 {
        let width = ((hd - d) / 16).min(4);
        // SAFETY: the caller's; d + 16·width <= hd.
        unsafe {
            match width {
                4 => weighted_sums::<G, 4>(weights, values, rows, stride, hd, d, o),
                3 => weighted_sums::<G, 3>(weights, values, rows, stride, hd, d, o),
                2 => weighted_sums::<G, 2>(weights, values, rows, stride, hd, d, o),
                _ => weighted_sums::<G, 1>(weights, values, rows, stride, hd, d, o),
            }
        }
        d += 16 * width;
    }
    d
}

/// Output floats `d..d + 16·W` of each of the `G` heads ([`avx2`]'s `weighted_sums`
/// sixteen floats a register).
///
/// SAFETY: the CPU has AVX-512F; `d + 16·W <= hd`; `o` holds `G × hd` floats and
/// `weights` `G × rows.len()`; every row's slice is inside `values`.
#[target_feature(enable = "avx512f,avx2,fma")]
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
    assert!(weights.len() >= G * n && o.len() >= G * hd && d + 16 * W <= hd);
    let mut acc = [[_mm512_setzero_ps(); W]; G];
    for (at, &r) in rows.iter().enumerate() {
        if let Some(&ahead) = rows.get(at + PREFETCH_ROWS) {
            prefetch_row(&values[ahead * stride + d..][..16 * W]);
        }
        let v = &values[r * stride + d..][..16 * W];
        // SAFETY: 16j + 16 <= 16·W = len of `v`.
        let vv: [__m512; W] =
            std::array::from_fn(|j| unsafe { _mm512_loadu_ps(v.as_ptr().add(16 * j)) });
        for (h, acc) in acc.iter_mut().enumerate() {
            let w = _mm512_set1_ps(weights[h * n + at]);
            for j in 0..W {
                acc[j] = _mm512_fmadd_ps(w, vv[j], acc[j]);
            }
        }
    }
    for (h, acc) in acc.iter().enumerate() {
        for (j, acc) in acc.iter().enumerate() {
            let out = &mut o[h * hd + d + 16 * j..][..16];
            // SAFETY: `out` holds sixteen f32.
            unsafe { _mm512_storeu_ps(out.as_mut_ptr(), *acc) };
        }
    }
}
