//! Attention of the new tokens of a batch's sequences, on the host, one query at a time
//! with fixed summation orders, spread over the CPU threads by (sequence, head, query).
//!
//! A batched matmul and softmax would sum in an order that depends on the batch and the
//! row count; with quantized activations such 1e-6 differences flip a rounding and grow
//! to whole logits. Here every query's scores, softmax and weighted sum are computed by
//! the same operations in the same order whatever else is in the pass, so a token
//! verified in a draft tree, or beside other sequences, gets bit for bit the output plain
//! decoding gives it.

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

/// One query head over one part of its rows on the portable path, in the order the AVX2
/// path uses: the scores, their maximum `m`, `e = exp(score − m)` per row, and into `o`
/// the unnormalized weighted sum `Σ e · value`; returns `(m, Σ e)` for [`join_parts`].
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
) -> (f32, f32) {
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
        for (o, &v) in o.iter_mut().zip(&values[r * stride..][..hd]) {
            *o = e.mul_add(v, *o);
        }
    }
    (max, sum)
}

#[cfg(target_arch = "x86_64")]
pub(super) mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx512;

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
/// `[head][row][head_dim]` for the whole batch.
///
/// **Parts.** A query's rows (after its window) are cut into parts of [`PART`] rows,
/// counted from its first row, so the cut depends on the query alone. Each part gives
/// per head its maximum score `m`, `Σ e` and `Σ e · value` with `e = exp(score − m)`
/// ([`attend_one_portable`]); a query of one part ends as `Σ e · value / Σ e`, one of
/// several through [`join_parts`]. The parts are the work items, with the heads that
/// share a key/value head together, so a query over a long context is spread over the
/// threads and each item reads its rows in position order (one decoding step of the
/// default model was 3 items on 2 threads, each reading a head's 256 bytes of every
/// 768-byte row; docs/cpu-kernels.md). Work is spread over the kernels' pool in one
/// call for the whole batch, plus one for the joins when some query has several parts.
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
    check_inputs(sequences, s, out.len());
    let rep = heads / kv_heads;
    let dst = Out::new(out, heads * hd);
    thread_local! {
        static SCRATCH: std::cell::RefCell<ItemScratch> = const { std::cell::RefCell::new(ItemScratch::new()) };
    }
    let stride = kv_heads * hd;
    // Query heads that share a key/value head go together, so that each key and value
    // row is read once for all of them; a head's arithmetic is the same either way.
    let group = if rep <= MAX_GROUP { rep } else { 1 };
    let groups = heads / group;
    let (queries, items, partials) = plan_queries(sequences, window, groups, heads);
    // Per partial: the head's max, Σ e, then its hd unnormalized sums; in a buffer
    // kept from call to call (a verifying pass at a long context needs megabytes).
    thread_local! {
        static PARTIALS: std::cell::Cell<Vec<f32>> = const { std::cell::Cell::new(Vec::new()) };
    }
    let partial_len = hd + 2;
    let mut partial = PARTIALS.take();
    partial.clear();
    partial.resize(partials * partial_len, 0.0);
    let partial_out = Out::new(&mut partial, partial_len);
    let one = |item: usize| {
        let query = &queries[queries.partition_point(|qr| qr.first_item <= item) - 1];
        let SequenceCache {
            keys,
            values,
            sets,
            base,
            offset,
        } = sequences[query.sequence];
        let (part, g) = (
            (item - query.first_item) / groups,
            (item - query.first_item) % groups,
        );
        let first = g * group;
        let kv = first / rep;
        let row = offset + query.index;
        let (keys, values) = (&keys[kv * hd..], &values[kv * hd..]);
        SCRATCH.with(|cell| {
            let ItemScratch {
                scores,
                rows,
                qs,
                os,
            } = &mut *cell.borrow_mut();
            // The part's rows: positions in order (the context, then the ancestors root
            // first), after the ones the window leaves out.
            let set = &sets[query.index];
            let from = query.skip + part * PART;
            let to = query.skip + ((part + 1) * PART).min(query.rows);
            rows.clear();
            rows.extend((from..to).map(|k| if k < base { k } else { base + set[k - base] }));
            qs.clear();
            for head in first..first + group {
                qs.extend_from_slice(&q[(head * total + row) * hd..][..hd]);
            }
            os.clear();
            os.resize(group * hd, 0.0);
            let mut stats = [(0f32, 0f32); MAX_GROUP];
            match simd {
                #[cfg(target_arch = "x86_64")]
                // SAFETY: an x86 SIMD path is chosen only on CPUs with AVX2 and FMA, and
                // the AVX-512 one with AVX-512F too (`Simd::available`); hd is a multiple of 8 (checked); qs and os hold
                // group × hd floats; every row lies in the caches (asserted above).
                s if s.has_avx2_fma() && hd % 8 == 0 => unsafe {
                    macro_rules! grouped {
                        ($g:literal) => {{
                            let got = if s.has_avx512f() {
                                avx512::attend_group::<$g>(
                                    qs, hd, keys, values, rows, stride, scale, scores, os,
                                )
                            } else {
                                avx2::attend_group::<$g>(
                                    qs, hd, keys, values, rows, stride, scale, scores, os,
                                )
                            };
                            stats[..$g].copy_from_slice(&got);
                        }};
                    }
                    match group {
                        1 => grouped!(1),
                        2 => grouped!(2),
                        3 => grouped!(3),
                        _ => grouped!(4),
                    }
                },
                _ => {
                    for ((qh, oh), stat) in qs
                        .chunks_exact(hd)
                        .zip(os.chunks_exact_mut(hd))
                        .zip(&mut stats)
                    {
                        *stat =
                            attend_one_portable(qh, keys, values, rows, stride, scale, scores, oh);
                    }
                }
            }
            for (h, (oh, &(max, sum))) in os.chunks_exact(hd).zip(&stats).enumerate() {
                let head = first + h;
                if query.parts() == 1 {
                    // SAFETY: head `head` of `row` is this item's alone, inside `out`.
                    let o = unsafe { dst.slice((row * heads + head) * hd, hd) };
                    for (o, &x) in o.iter_mut().zip(oh) {
                        *o = x / sum;
                    }
                } else {
                    let at = query.first_partial + part * heads + head;
                    // SAFETY: partial `at` is this item's alone (its query, part and
                    // head), inside `partial`.
                    let slot = unsafe { partial_out.slice(at * partial_len, partial_len) };
                    slot[0] = max;
                    slot[1] = sum;
                    slot[2..].copy_from_slice(oh);
                }
            }
        });
    };
    super::pool::pool().run(items, |range| {
        for item in range {
            one(item)
        }
    });
    if partials > 0 {
        join_queries(simd, &queries, sequences, heads, hd, &partial, dst);
    }
    PARTIALS.set(partial);
}

/// Panics unless `out` (`out_len` floats) is `[row][head][head_dim]` for the batch and
/// every sequence's rows lie in the batch and in its cache: the work items read and
/// write through unchecked pointers.
fn check_inputs(sequences: &[SequenceCache<'_>], s: AttnShape, out_len: usize) {
    let AttnShape {
        total,
        heads,
        kv_heads,
        head_dim: hd,
        ..
    } = s;
    assert_eq!(out_len, total * heads * hd, "out is [row][head][head_dim]");
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
}

/// Per query, in batch order: its sequence, its index there, its rows' count and first
/// row (after the window), and its first work item and first partial result
/// (for a query of several parts); then the work items and partial results in all.
fn plan_queries(
    sequences: &[SequenceCache<'_>],
    window: Option<usize>,
    groups: usize,
    heads: usize,
) -> (Vec<Query>, usize, usize) {
    let mut queries = Vec::new();
    let (mut items, mut partials) = (0, 0);
    for (at, seq) in sequences.iter().enumerate() {
        for (i, set) in seq.sets.iter().enumerate() {
            let all = seq.base + set.len();
            let n = window.map_or(all, |w| all.min(w));
            let query = Query {
                sequence: at,
                index: i,
                rows: n,
                skip: all - n,
                first_item: items,
                first_partial: partials,
            };
            let parts = query.parts();
            queries.push(query);
            items += parts * groups;
            if parts > 1 {
                partials += parts * heads;
            }
        }
    }
    (queries, items, partials)
}

/// The outputs of the queries of several parts, each head's parts joined
/// ([`join_parts`]); `partial` holds them as [`attend`] left them.
fn join_queries(
    simd: Simd,
    queries: &[Query],
    sequences: &[SequenceCache<'_>],
    heads: usize,
    hd: usize,
    partial: &[f32],
    dst: Out,
) {
    let partial_len = hd + 2;
    let several: Vec<&Query> = queries.iter().filter(|qr| qr.parts() > 1).collect();
    super::pool::pool().run(several.len(), |range| {
        for query in &several[range] {
            let row = sequences[query.sequence].offset + query.index;
            for head in 0..heads {
                let at = |part: usize| {
                    let at = query.first_partial + part * heads + head;
                    &partial[at * partial_len..][..partial_len]
                };
                // SAFETY: head `head` of `row` is this query's alone, inside `out`.
                let o = unsafe { dst.slice((row * heads + head) * hd, hd) };
                join_parts(simd, (0..query.parts()).map(at), o);
            }
        }
    });
}

/// Rows per part of a query's attention (see [`attend`]): few enough that one decoding
/// step at a thousand positions and more has work for every thread (the default model:
/// 3 key/value heads × 2 parts at 1,000), many enough that a prompt's first 512 rows
/// are one part each, so that prefill does not pay for joins (256 cost a 512-row
/// prefill 2–4%; `forward_rows`, alternated).
const PART: usize = 512;

/// A work item's buffers, kept per thread from item to item.
struct ItemScratch {
    /// The part's scores, `[head][row]`, then its `exp(score − max)`.
    scores: Vec<f32>,
    /// The part's cache rows.
    rows: Vec<usize>,
    /// The item's query heads, one after another.
    qs: Vec<f32>,
    /// Their unnormalized weighted sums.
    os: Vec<f32>,
}

impl ItemScratch {
    const fn new() -> Self {
        ItemScratch {
            scores: Vec::new(),
            rows: Vec::new(),
            qs: Vec::new(),
            os: Vec::new(),
        }
    }
}

/// Where one query of an [`attend`] call stands.
struct Query {
    /// Its sequence, and its index among that sequence's new tokens.
    sequence: usize,
    index: usize,
    /// Its rows after the window, and the ones the window leaves out before them.
    rows: usize,
    skip: usize,
    /// Its first work item (parts × head groups follow), and its first partial result
    /// (parts × heads follow; only for a query of several parts).
    first_item: usize,
    first_partial: usize,
}

impl Query {
    /// The parts its rows are cut into.
    fn parts(&self) -> usize {
        self.rows.div_ceil(PART)
    }
}

/// One head's parts (`[max, Σ e, Σ e · value...]` each, in part order) joined into `o`:
/// with `m` the largest max and `c = exp(max − m)` per part, `o = Σ c · sums / Σ c · Σ e`,
/// each sum one fused multiply-add per part in part order, then one division per
/// float; the same operations on every path.
fn join_parts<'p>(simd: Simd, parts: impl Iterator<Item = &'p [f32]> + Clone, o: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if simd.has_avx2_fma() {
        // SAFETY: the CPU has AVX2 and FMA (`simd` is one of `Simd::available()`).
        return unsafe { join_parts_fma(parts, o) };
    }
    let _ = simd;
    join_parts_body(parts, o)
}

/// [`join_parts_body`] compiled with FMA, so that `mul_add` is one instruction rather
/// than a libm call.
///
/// SAFETY: the CPU has AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn join_parts_fma<'p>(parts: impl Iterator<Item = &'p [f32]> + Clone, o: &mut [f32]) {
    join_parts_body(parts, o)
}

/// The join's arithmetic ([`join_parts`]), inlined into both callers.
#[inline(always)]
fn join_parts_body<'p>(parts: impl Iterator<Item = &'p [f32]> + Clone, o: &mut [f32]) {
    let m = parts.clone().fold(f32::NEG_INFINITY, |m, p| m.max(p[0]));
    let mut sum = 0f32;
    o.fill(0.0);
    for p in parts {
        let c = exp_portable(p[0] - m);
        sum = c.mul_add(p[1], sum);
        for (o, &x) in o.iter_mut().zip(&p[2..]) {
            *o = c.mul_add(x, *o);
        }
    }
    for o in o.iter_mut() {
        *o /= sum;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::kernels::same_bits;

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
        // One part, and three (the last query's rows cut at PART and 2 · PART).
        for base in [37, 2 * PART + 37] {
            a_query_alone_and_in_a_pass(base);
        }
    }

    fn a_query_alone_and_in_a_pass(base: usize) {
        let t = 5;
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
        let same = same_bits(&alone, &many[row * heads * hd..(row + 1) * heads * hd]);
        assert!(
            same,
            "after {base} rows, the last token's attention differs alone and in a 9-row pass"
        );
    }

    #[test]
    fn the_simd_and_portable_paths_agree_bit_for_bit() {
        // Queries of one part, and queries whose parts end on both sides of PART.
        for base in [50, PART - 2, 3 * PART + 1] {
            let fast = run(Simd::detect(), base, 4, 4, 0);
            let slow = run(Simd::Portable, base, 4, 4, 0);
            assert!(same_bits(&fast, &slow), "after {base} rows");
        }
    }

    /// Every path this CPU has gives the portable bits for every group size (1–4 query
    /// heads a key/value head, and one head each past 4) and head width (whole and part
    /// 512-bit registers of weighted sums), with rows that fill the AVX-512 path's
    /// eight-key steps and rows left over.
    #[test]
    fn every_path_agrees_for_every_group_and_head_width() {
        let shapes = [
            (3, 3, 8),
            (4, 2, 24),
            (6, 2, 64),
            (8, 2, 40),
            (4, 1, 256),
            (10, 2, 16),
        ];
        for (heads, kv_heads, hd) in shapes {
            for rows in [1, 7, 8, 13, 64] {
                let (t, base) = (3, rows - 1);
                let row = kv_heads * hd;
                let q = values(heads * t * hd, 7);
                let keys = values((base + t) * row, 8);
                let vals = values((base + t) * row, 9);
                let sets: Vec<Vec<usize>> = (0..t).map(|i| (0..=i).collect()).collect();
                let attend_on = |simd| {
                    let mut out = vec![0f32; t * heads * hd];
                    let seq = SequenceCache {
                        keys: &keys,
                        values: &vals,
                        sets: &sets,
                        base,
                        offset: 0,
                    };
                    let shape = AttnShape::full(t, heads, kv_heads, hd);
                    attend(simd, &q, &[seq], shape, &mut out);
                    out
                };
                let portable = attend_on(Simd::Portable);
                for &simd in Simd::available() {
                    let what = format!("{simd:?}, {heads}/{kv_heads} heads of {hd}, {rows}");
                    assert!(same_bits(&attend_on(simd), &portable), "{what}");
                }
            }
        }
    }

    #[test]
    fn parts_joined_give_the_softmax_of_all_the_rows() {
        // Against softmax and weighted sums in f64 over every row at once, for queries
        // of one to four parts.
        let (heads, kv_heads, hd, t) = (6, 2, 16, 3);
        let row = kv_heads * hd;
        for base in [10, PART + 3, 4 * PART - 3] {
            let got = run(Simd::detect(), base, t, t, 0);
            let q = values(heads * t * hd, 1);
            let keys = values((base + t) * row, 2);
            let vals = values((base + t) * row, 3);
            for i in 0..t {
                for h in 0..heads {
                    let kv = h / (heads / kv_heads);
                    let qh = &q[(h * t + i) * hd..][..hd];
                    let rows = base + i + 1;
                    let scores: Vec<f64> = (0..rows)
                        .map(|r| {
                            let k = &keys[r * row + kv * hd..][..hd];
                            let dot: f64 =
                                qh.iter().zip(k).map(|(&a, &b)| a as f64 * b as f64).sum();
                            dot / (hd as f64).sqrt()
                        })
                        .collect();
                    let max = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                    let e: Vec<f64> = scores.iter().map(|s| (s - max).exp()).collect();
                    let sum: f64 = e.iter().sum();
                    for d in 0..hd {
                        let want: f64 = (0..rows)
                            .map(|r| e[r] * vals[r * row + kv * hd + d] as f64)
                            .sum::<f64>()
                            / sum;
                        let have = got[(i * heads + h) * hd + d] as f64;
                        assert!(
                            (have - want).abs() < 1e-5,
                            "after {base} rows, query {i} head {h} float {d}: {have} vs {want}"
                        );
                    }
                }
            }
        }
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
            let same = same_bits(&together[rows.clone()], &alone[rows]);
            assert!(same, "sequence {s} differs in the batched call");
        }
    }

    #[test]
    fn a_window_attends_to_the_last_positions_as_a_cache_of_only_those_would() {
        // A window of one part, and one of two (its first part starts mid-context).
        for (window, base) in [(5, 20), (PART + 5, PART + 40)] {
            a_window_over(window, base);
        }
    }

    fn a_window_over(window: usize, base: usize) {
        let (heads, kv_heads, hd) = (4, 2, 16);
        let row = kv_heads * hd;
        // A tree of 3 (a chain 0 → 1 and a sibling 2) after `base` context rows.
        let total = 3;
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
                same_bits(got, &alone),
                "query {i} differs from attention over its window's rows alone"
            );
        }
    }
}
