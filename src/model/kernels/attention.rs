//! Attention of the new tokens of a batch's sequences, on the host, one query at a time
//! with fixed summation orders, spread over the CPU threads by (sequence, head, query).
//!
//! A batched matmul and softmax would sum in an order that depends on the batch and the
//! row count; with quantized activations such 1e-6 differences flip a rounding and grow
//! to whole logits. Here every query's scores, softmax and weighted sum are computed by
//! the same operations in the same order whatever else is in the pass, so a token
//! verified in a draft tree, or beside other sequences, gets bit for bit the output plain
//! decoding gives it.

#[cfg(target_arch = "x86_64")]
use super::prefetch_row;
#[cfg(target_arch = "x86_64")]
use super::reduce_lanes_m256;
use super::{Out, ROUNDING, Simd, reduce_lanes, round_to_integer};

/// Sizes of the pass.
#[derive(Clone, Copy, Debug)]
pub struct AttnShape {
    /// Rows in the whole batch.
    pub total: usize,
    /// Query heads.
    pub heads: usize,
    /// Key/value heads.
    pub kv_heads: usize,
    /// Width of one head.
    pub head_dim: usize,
    /// What the scores are multiplied by before the softmax: `1/√head_dim` for most
    /// models (Gemma's is `1/√query_pre_attn_scalar`).
    pub scale: f32,
    /// Sliding-window attention: a query attends only to the last `window` positions,
    /// itself included (Mistral, Gemma 3's local layers). None attends to all.
    pub window: Option<usize>,
}

impl AttnShape {
    /// Full attention scaled by `1/√head_dim`, as llama has it.
    pub fn full(total: usize, heads: usize, kv_heads: usize, head_dim: usize) -> Self {
        AttnShape {
            total,
            heads,
            kv_heads,
            head_dim,
            scale: 1.0 / (head_dim as f32).sqrt(),
            window: None,
        }
    }
}

const LOG2E: f32 = std::f32::consts::LOG2_E;
const LN2_HI: f32 = 0.693_359_4;
const LN2_LO: f32 = -2.121_944_4e-4;
/// Below this, e^x is under f32's normal range; scores are clamped to it.
const EXP_FLOOR: f32 = -87.0;
/// Cephes' polynomial for e^r on |r| ≤ ln 2 / 2, highest degree first.
const EXP_POLY: [f32; 6] = [
    1.987_569_1e-4,
    1.398_199_9e-3,
    8.333_452e-3,
    4.166_579_6e-2,
    1.666_666_5e-1,
    5e-1,
];

/// e^x for x ≤ 0 to about 2 ulp, by operations the AVX2 path repeats lane by lane:
/// x = n·ln 2 + r, e^r by a polynomial, 2^n from the exponent bits.
#[inline(always)]
pub(super) fn exp_portable(x: f32) -> f32 {
    let x = x.max(EXP_FLOOR);
    let n = round_to_integer(x * LOG2E);
    let r = n.mul_add(-LN2_LO, n.mul_add(-LN2_HI, x));
    let mut p = EXP_POLY[0];
    for &c in &EXP_POLY[1..] {
        p = p.mul_add(r, c);
    }
    let p = p.mul_add(r * r, r) + 1.0;
    p * f32::from_bits(((n as i32 + 127) << 23) as u32)
}

/// One query's attention on the portable path: scores, softmax and weighted sum, in the
/// order the AVX2 path uses.
#[allow(clippy::too_many_arguments)]
fn attend_one_portable(
    q: &[f32],
    keys: &[f32],
    values: &[f32],
    rows: &[usize],
    stride: usize,
    scale: f32,
    scores: &mut Vec<f32>,
    o: &mut [f32],
) {
    let hd = q.len();
    scores.clear();
    for &r in rows {
        let k = &keys[r * stride..][..hd];
        let mut acc = [0f32; 8];
        for (i, (&x, &y)) in q.iter().zip(k).enumerate() {
            acc[i % 8] = x.mul_add(y, acc[i % 8]);
        }
        scores.push(reduce_lanes(&acc) * scale);
    }
    let max = scores.iter().fold(f32::NEG_INFINITY, |m, &x| m.max(x));
    let mut lanes = [0f32; 8];
    for (i, x) in scores.iter_mut().enumerate() {
        *x = exp_portable(*x - max);
        lanes[i % 8] += *x;
    }
    let sum = reduce_lanes(&lanes);
    o.fill(0.0);
    for (&e, &r) in scores.iter().zip(rows) {
        let w = e / sum;
        for (o, &v) in o.iter_mut().zip(&values[r * stride..][..hd]) {
            *o = w.mul_add(v, *o);
        }
    }
}

#[cfg(target_arch = "x86_64")]
pub(super) mod avx2 {
    use super::*;
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
    ) {
        let n = rows.len();
        assert!(q.len() == G * hd && o.len() == q.len() && hd.is_multiple_of(8));
        scores.clear();
        scores.resize(G * n, 0.0);
        // Scores: one pass over the keys, two keys at a time so that each load of q
        // serves both; each (key, head) dot is its own 8-lane FMA chain, as alone.
        let key = |at: usize| &keys[rows[at] * stride..][..hd];
        let mut at = 0;
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
        // Softmax of each head's scores.
        let mut sums = [0f32; G];
        for (h, sum) in sums.iter_mut().enumerate() {
            let sc = &mut scores[h * n..(h + 1) * n];
            let max = sc.iter().fold(f32::NEG_INFINITY, |m, &x| m.max(x));
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
        // Each score becomes its weight (the same division the portable path makes per
        // key), then the weighted sums, up to 8·W output floats of every head at a time
        // in registers across all values (W as wide as G heads' accumulators allow):
        // each float gets one fused multiply-add per key, in key order.
        for (h, &sum) in sums.iter().enumerate() {
            for x in &mut scores[h * n..(h + 1) * n] {
                *x /= sum;
            }
        }
        let widest = match G {
            1 | 2 => 4,
            3 => 3,
            _ => 2,
        };
        let mut d = 0;
        while d < hd {
            let width = ((hd - d) / 8).min(widest);
            // SAFETY: the caller's; d + 8·width <= hd.
            unsafe {
                match width {
                    4 => weighted_sums::<G, 4>(scores, values, rows, stride, hd, d, o),
                    3 => weighted_sums::<G, 3>(scores, values, rows, stride, hd, d, o),
                    2 => weighted_sums::<G, 2>(scores, values, rows, stride, hd, d, o),
                    _ => weighted_sums::<G, 1>(scores, values, rows, stride, hd, d, o),
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
}

/// How many cached rows ahead of the one in use attention asks the cache for: the rows
/// of one key/value head are a few hundred bytes apart, and at one query attention is
/// bound by reading them.
#[cfg(target_arch = "x86_64")]
const PREFETCH_ROWS: usize = 8;

/// Most query heads per key/value head that the grouped path takes at once.
const MAX_GROUP: usize = 4;

/// One sequence's part of an [`attend`] call.
#[derive(Clone, Copy, Debug)]
pub struct SequenceCache<'a> {
    /// The sequence's cached keys, `[position][kv_head][head_dim]`, holding its new
    /// tokens' rows after the committed ones.
    pub keys: &'a [f32],
    /// Its cached values, laid out as the keys.
    pub values: &'a [f32],
    /// Per new token, the rows after `base` it attends to: its ancestors, then itself.
    pub sets: &'a [Vec<usize>],
    /// Committed context rows, which every new token attends to first.
    pub base: usize,
    /// The sequence's first row in the batch.
    pub offset: usize,
}

/// Attention of the new tokens of every sequence over their attention sets (committed
/// context rows `0..base`, then the token's ancestors and itself, `sets[i]`, as indices
/// after `base`), into the sequences' rows of `out` (`[row][head][head_dim]`). `q` is
/// `[head][row][head_dim]` for the whole batch. Work is spread over candle's CPU thread
/// pool by (sequence, head, query), in one call for the whole batch.
pub fn attend(
    simd: Simd,
    q: &[f32],
    sequences: &[SequenceCache<'_>],
    s: AttnShape,
    out: &mut [f32],
) {
    let AttnShape {
        total,
        heads,
        kv_heads,
        head_dim: hd,
        scale,
        window,
    } = s;
    assert!(simd.is_available(), "{simd:?} is not available on this CPU");
    assert_eq!(
        out.len(),
        total * heads * hd,
        "out is [row][head][head_dim]"
    );
    for seq in sequences {
        assert!(
            seq.offset + seq.sets.len() <= total,
            "the sequence's rows are in the batch"
        );
        let rows_used = seq.base + seq.sets.iter().flatten().map(|&a| a + 1).max().unwrap_or(0);
        let needed = rows_used * kv_heads * hd;
        assert!(
            seq.keys.len() >= needed && seq.values.len() >= needed,
            "the cache holds every row"
        );
    }
    let rep = heads / kv_heads;
    let dst = Out::new(out, heads * hd);
    thread_local! {
        static SCRATCH: std::cell::RefCell<(Vec<f32>, Vec<usize>, Vec<f32>)> = const { std::cell::RefCell::new((Vec::new(), Vec::new(), Vec::new())) };
    }
    let stride = kv_heads * hd;
    // Query heads that share a key/value head go together, so that each key and value
    // row is read once for all of them; a head's arithmetic is the same either way.
    let group = if rep <= MAX_GROUP { rep } else { 1 };
    let groups = heads / group;
    // Each sequence's first work item.
    let mut starts = Vec::with_capacity(sequences.len());
    let mut items = 0;
    for seq in sequences {
        starts.push(items);
        items += groups * seq.sets.len();
    }
    let one = |item: usize| {
        let at = starts.partition_point(|&s| s <= item) - 1;
        let SequenceCache {
            keys,
            values,
            sets,
            base,
            offset,
        } = sequences[at];
        let item = item - starts[at];
        let (first, i) = ((item / sets.len()) * group, item % sets.len());
        let g = first / rep;
        let row = offset + i;
        // SAFETY: heads first..first + group of `row` are this item's alone, and inside
        // `out` (asserted above).
        let o = unsafe { dst.slice((row * heads + first) * hd, group * hd) };
        let (keys, values) = (&keys[g * hd..], &values[g * hd..]);
        SCRATCH.with(|cell| {
            let (scores, rows, qs) = &mut *cell.borrow_mut();
            rows.clear();
            rows.extend((0..base).chain(sets[i].iter().map(|&a| base + a)));
            // The rows are in position order (the context, then the ancestors root
            // first), one per position up to the query's: a window keeps the last ones.
            if let Some(w) = window {
                rows.drain(..rows.len().saturating_sub(w));
            }
            qs.clear();
            for head in first..first + group {
                qs.extend_from_slice(&q[(head * total + row) * hd..][..hd]);
            }
            match simd {
                #[cfg(target_arch = "x86_64")]
                // SAFETY: an x86 SIMD path is chosen only on CPUs with AVX2 and FMA
                // (`Simd::available`); hd is a multiple of 8 (checked); q and o hold
                // group × hd floats; every row lies in the caches (asserted above).
                s if s.has_avx2_fma() && hd % 8 == 0 => unsafe {
                    match group {
                        1 => avx2::attend_group::<1>(
                            qs, hd, keys, values, rows, stride, scale, scores, o,
                        ),
                        2 => avx2::attend_group::<2>(
                            qs, hd, keys, values, rows, stride, scale, scores, o,
                        ),
                        3 => avx2::attend_group::<3>(
                            qs, hd, keys, values, rows, stride, scale, scores, o,
                        ),
                        _ => avx2::attend_group::<4>(
                            qs, hd, keys, values, rows, stride, scale, scores, o,
                        ),
                    }
                },
                _ => {
                    for (qh, oh) in qs.chunks_exact(hd).zip(o.chunks_exact_mut(hd)) {
                        attend_one_portable(qh, keys, values, rows, stride, scale, scores, oh);
                    }
                }
            }
        });
    };
    super::pool::pool().run(items, |range| {
        for item in range {
            one(item)
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    fn values(len: usize, seed: u64) -> Vec<f32> {
        crate::model::kernels::test_values(len, seed, 1.0)
    }

    /// A chain of `t` new tokens after `base` context rows, in a batch of `total` rows.
    fn run(simd: Simd, base: usize, t: usize, total: usize, offset: usize) -> Vec<f32> {
        let (heads, kv_heads, hd) = (6, 2, 16);
        let q = values(heads * total * hd, 1);
        let keys = values((base + t) * kv_heads * hd, 2);
        let vals = values((base + t) * kv_heads * hd, 3);
        let sets: Vec<Vec<usize>> = (0..t).map(|i| (0..=i).collect()).collect();
        let mut out = vec![0f32; total * heads * hd];
        let shape = AttnShape::full(total, heads, kv_heads, hd);
        let seq = SequenceCache {
            keys: &keys,
            values: &vals,
            sets: &sets,
            base,
            offset,
        };
        attend(simd, &q, &[seq], shape, &mut out);
        out
    }

    #[test]
    fn a_query_gets_the_same_bits_whatever_else_is_in_the_pass() {
        let (base, t) = (37, 5);
        let (heads, hd) = (6, 16);
        let many = run(Simd::detect(), base, t, 9, 2);
        // The last query alone: same q rows? Build it directly from the same inputs.
        let q_all = values(heads * 9 * hd, 1);
        let keys = values((base + t) * 2 * hd, 2);
        let vals = values((base + t) * 2 * hd, 3);
        let mut q_one = vec![0f32; heads * hd];
        for h in 0..heads {
            q_one[h * hd..(h + 1) * hd].copy_from_slice(&q_all[(h * 9 + 2 + t - 1) * hd..][..hd]);
        }
        let mut alone = vec![0f32; heads * hd];
        let shape = AttnShape::full(1, heads, 2, hd);
        let sets = [(0..t).collect()];
        let seq = SequenceCache {
            keys: &keys,
            values: &vals,
            sets: &sets,
            base,
            offset: 0,
        };
        attend(Simd::detect(), &q_one, &[seq], shape, &mut alone);
        let row = 2 + t - 1;
        let same = alone
            .iter()
            .zip(&many[row * heads * hd..(row + 1) * heads * hd])
            .all(|(a, b)| a.to_bits() == b.to_bits());
        assert!(
            same,
            "the last token's attention differs alone and in a 9-row pass"
        );
    }

    #[test]
    fn the_simd_and_portable_paths_agree_bit_for_bit() {
        let fast = run(Simd::detect(), 50, 4, 4, 0);
        let slow = run(Simd::Portable, 50, 4, 4, 0);
        assert!(
            fast.iter()
                .zip(&slow)
                .all(|(a, b)| a.to_bits() == b.to_bits())
        );
    }

    #[test]
    fn exp_is_within_a_few_ulp_of_libm() {
        let mut worst = 0u32;
        for i in 0..200_000 {
            let x = -87.0 * i as f32 / 200_000.0;
            let (got, want) = (exp_portable(x), x.exp());
            worst = worst.max(got.to_bits().abs_diff(want.to_bits()));
        }
        assert!(worst <= 4, "exp is {worst} ulp off");
    }

    #[test]
    fn weights_sum_to_one_so_equal_values_come_back() {
        let (heads, kv_heads, hd, base) = (2, 1, 8, 10);
        let q = values(heads * hd, 4);
        let keys = values((base + 1) * kv_heads * hd, 5);
        let vals: Vec<f32> = (0..(base + 1))
            .flat_map(|_| (0..hd).map(|d| d as f32))
            .collect();
        let mut out = vec![0f32; heads * hd];
        let shape = AttnShape::full(1, heads, kv_heads, hd);
        let sets = [vec![0]];
        let seq = SequenceCache {
            keys: &keys,
            values: &vals,
            sets: &sets,
            base,
            offset: 0,
        };
        attend(Simd::detect(), &q, &[seq], shape, &mut out);
        for (i, o) in out.iter().enumerate() {
            assert!((o - (i % hd) as f32).abs() < 1e-4, "{i}: {o}");
        }
    }

    #[test]
    fn sequences_in_one_call_get_the_bits_each_gets_alone() {
        let (heads, kv_heads, hd, total) = (6, 2, 16, 9);
        let q = values(heads * total * hd, 6);
        let shape = AttnShape::full(total, heads, kv_heads, hd);
        // A chain of 4 after 30 rows at rows 0..4, a branching tree of 3 after 11 rows
        // at rows 4..7, an empty sequence, then one token after 50 rows at row 8.
        let caches: Vec<(Vec<f32>, Vec<f32>)> = [34usize, 14, 0, 51]
            .iter()
            .enumerate()
            .map(|(s, &rows)| {
                let seed = 10 + 2 * s as u64;
                let row = kv_heads * hd;
                (values(rows * row, seed), values(rows * row, seed + 1))
            })
            .collect();
        let sets: [Vec<Vec<usize>>; 4] = [
            (0..4).map(|i| (0..=i).collect()).collect(),
            vec![vec![0], vec![0, 1], vec![0, 2]],
            vec![],
            vec![vec![0]],
        ];
        let (bases, offsets) = ([30, 11, 0, 50], [0, 4, 7, 8]);
        let seq = |s: usize| SequenceCache {
            keys: &caches[s].0,
            values: &caches[s].1,
            sets: &sets[s],
            base: bases[s],
            offset: offsets[s],
        };
        let mut together = vec![0f32; total * heads * hd];
        attend(
            Simd::detect(),
            &q,
            &(0..4).map(seq).collect::<Vec<_>>(),
            shape,
            &mut together,
        );
        for s in 0..4 {
            let mut alone = vec![0f32; total * heads * hd];
            attend(Simd::detect(), &q, &[seq(s)], shape, &mut alone);
            let rows = offsets[s] * heads * hd..(offsets[s] + sets[s].len()) * heads * hd;
            let same = together[rows.clone()]
                .iter()
                .zip(&alone[rows])
                .all(|(a, b)| a.to_bits() == b.to_bits());
            assert!(same, "sequence {s} differs in the batched call");
        }
    }

    #[test]
    fn a_window_attends_to_the_last_positions_as_a_cache_of_only_those_would() {
        let (heads, kv_heads, hd, window) = (4, 2, 16, 5);
        let row = kv_heads * hd;
        // A tree of 3 (a chain 0 → 1 and a sibling 2) after 20 context rows.
        let (base, total) = (20, 3);
        let q = values(heads * total * hd, 30);
        let keys = values((base + total) * row, 31);
        let vals = values((base + total) * row, 32);
        let sets = vec![vec![0], vec![0, 1], vec![0, 2]];
        let mut windowed = vec![0f32; total * heads * hd];
        let shape = AttnShape {
            window: Some(window),
            ..AttnShape::full(total, heads, kv_heads, hd)
        };
        let seq = SequenceCache {
            keys: &keys,
            values: &vals,
            sets: &sets,
            base,
            offset: 0,
        };
        attend(Simd::detect(), &q, &[seq], shape, &mut windowed);
        // Each query alone, over a cache holding only the rows its window covers.
        for (i, set) in sets.iter().enumerate() {
            let mut rows: Vec<usize> = (0..base).chain(set.iter().map(|&a| base + a)).collect();
            rows.drain(..rows.len() - window);
            let gather = |all: &[f32]| -> Vec<f32> {
                rows.iter()
                    .flat_map(|&r| all[r * row..(r + 1) * row].iter().copied())
                    .collect()
            };
            let (k, v) = (gather(&keys), gather(&vals));
            let mut q_one = vec![0f32; heads * hd];
            for h in 0..heads {
                q_one[h * hd..(h + 1) * hd].copy_from_slice(&q[(h * total + i) * hd..][..hd]);
            }
            let chain = vec![(0..window).collect::<Vec<_>>()];
            let mut alone = vec![0f32; heads * hd];
            let one = SequenceCache {
                keys: &k,
                values: &v,
                sets: &chain,
                base: 0,
                offset: 0,
            };
            attend(
                Simd::detect(),
                &q_one,
                &[one],
                AttnShape::full(1, heads, kv_heads, hd),
                &mut alone,
            );
            let got = &windowed[i * heads * hd..(i + 1) * heads * hd];
            assert!(
                got.iter()
                    .zip(&alone)
                    .all(|(a, b)| a.to_bits() == b.to_bits()),
                "query {i} differs from attention over its window's rows alone"
            );
        }
    }
}
