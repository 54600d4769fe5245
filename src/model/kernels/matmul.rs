//! The row-invariant quantized matmul: `out[r][c] = Σ_k x[r][k] · w[c][k]` for packed
//! weights ([`PackedMatrix`]) and f32 activations quantized per 32-value block to 8 bits,
//! as GGML's Q8_0 does.
//!
//! **Row invariance.** Every output element is computed by the same operations in the
//! same order, whatever the number of rows in the pass and whichever tile or thread
//! computes it: per block, the exact integer dot product (per half, for Q6_K), converted
//! to f32 and accumulated by one fused multiply-add with the product of the two scales
//! into lane `block mod 8` of eight lanes (a tail block after the last whole group of
//! eight: per four values, into lane `value / 4 mod 8`); then a fixed reduction of the lanes, then (affine formats) the
//! offsets' contributions the same way. The register tiles only decide which elements are
//! computed side by side. The x86 paths and the portable one perform the same IEEE
//! operations, so they agree bit for bit too (tested).
//!
//! **Whole blocks per lane.** The grouped layout ([`super::pack`]) puts one block in each
//! 32-bit lane, so the integer instructions run over a group's eight blocks at once and
//! the float work is one convert, one multiply and one FMA per block, not per four values.
//!
//! **Weight-stationary.** The columns are split among threads; a thread takes two
//! columns at a time (a few KiB, which stay in L1) through every row of the pass, so each
//! weight is read from memory once per pass whatever the number of rows.

use super::pack::{BLOCK, GROUP, PackedMatrix, grouped_index, place_block, whole_blocks};
#[cfg(target_arch = "x86_64")]
use super::reduce_lanes_m256;
use super::{Out, Simd, as_uninit, for_each_column_group, reduce_lanes, round_to_integer};
use std::mem::MaybeUninit;

/// Activations quantized for the kernels: per row, `k` signed bytes in the grouped
/// layout, and per 32-value block a scale, the exact sums of its quants (whole, and its
/// first half), and its scaled sum (used by the affine formats).
#[derive(Default)]
pub struct QuantizedRows {
    rows: usize,
    k: usize,
    quants: Vec<i8>,
    scales: Vec<f32>,
    block_sums: Vec<i32>,
    first_half_sums: Vec<i32>,
    sums: Vec<f32>,
}

impl QuantizedRows {
    /// Quantize `x` (`rows × k`, row-major): each block's scale is its largest magnitude
    /// over 127, each value rounded to the nearest multiple of it, as GGML's Q8_0.
    pub fn quantize(&mut self, x: &[f32], rows: usize, k: usize) {
        assert_eq!(x.len(), rows * k, "x is rows × k");
        assert_eq!(k % BLOCK, 0, "k is whole blocks");
        let blocks = k / BLOCK;
        self.rows = rows;
        self.k = k;
        self.quants.clear();
        self.quants.resize(rows * k, 0);
        self.scales.clear();
        self.block_sums.clear();
        self.first_half_sums.clear();
        self.sums.clear();
        #[cfg(target_arch = "x86_64")]
        let avx2 = Simd::detect().has_avx2_fma();
        for (b, block) in x.chunks_exact(BLOCK).enumerate() {
            let (row, at) = (b / blocks, b % blocks);
            let block: &[f32; BLOCK] = block.try_into().expect("chunks of BLOCK");
            #[cfg(target_arch = "x86_64")]
            // SAFETY: the CPU has AVX2 and FMA (`Simd::detect` picks only what it has).
            let quantized = if avx2 {
                unsafe { quantize_block_avx2(block) }
            } else {
                quantize_block(block)
            };
            #[cfg(not(target_arch = "x86_64"))]
            let quantized = quantize_block(block);
            let QuantizedBlock {
                quants,
                scale,
                sum,
                first_half,
            } = quantized;
            place_block(
                &mut self.quants[row * k..(row + 1) * k],
                blocks,
                at,
                &quants,
            );
            self.scales.push(scale);
            self.block_sums.push(sum);
            self.first_half_sums.push(first_half);
            self.sums.push(scale * sum as f32);
        }
    }

    /// The quant of input `at` of row `row`.
    fn quant(&self, row: usize, at: usize) -> i32 {
        self.quants[row * self.k + grouped_index(self.k / BLOCK, at)] as i32
    }
}

/// One block of activations quantized: GGML's Q8_0 arithmetic.
struct QuantizedBlock {
    quants: [i8; BLOCK],
    scale: f32,
    /// Σ quants.
    sum: i32,
    /// Σ of the first 16 quants.
    first_half: i32,
}

/// The scale is the largest magnitude over 127, and each value is rounded to the nearest
/// multiple of it.
fn quantize_block(block: &[f32; BLOCK]) -> QuantizedBlock {
    let amax = block.iter().fold(0f32, |m, v| m.max(v.abs()));
    let scale = amax / 127.0;
    let id = if scale != 0.0 { 1.0 / scale } else { 0.0 };
    let quants: [i8; BLOCK] = std::array::from_fn(|j| round_to_integer(block[j] * id) as i8);
    QuantizedBlock {
        quants,
        scale,
        sum: quants.iter().map(|&q| q as i32).sum(),
        first_half: quants[..BLOCK / 2].iter().map(|&q| q as i32).sum(),
    }
}

/// [`quantize_block`] with AVX2, as GGML's `quantize_row_q8_0` does it: the same
/// multiply, the same rounding (an integral float converts exactly), the same integers.
///
/// SAFETY: the CPU has AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn quantize_block_avx2(block: &[f32; BLOCK]) -> QuantizedBlock {
    use std::arch::x86_64::*;
    // SAFETY: `block` holds 32 floats, `quants` 32 bytes.
    unsafe {
        let v: [__m256; 4] = std::array::from_fn(|i| _mm256_loadu_ps(block.as_ptr().add(8 * i)));
        // Magnitudes compared as bits: for non-negative floats the orders agree, and a
        // maximum is exact in any order.
        let magnitude = _mm256_set1_epi32(0x7fff_ffff);
        let bits = v.map(|v| _mm256_and_si256(_mm256_castps_si256(v), magnitude));
        let m = _mm256_max_epu32(
            _mm256_max_epu32(bits[0], bits[1]),
            _mm256_max_epu32(bits[2], bits[3]),
        );
        let m = _mm_max_epu32(_mm256_castsi256_si128(m), _mm256_extracti128_si256(m, 1));
        let m = _mm_max_epu32(m, _mm_shuffle_epi32(m, 0b01_00_11_10));
        let m = _mm_max_epu32(m, _mm_shuffle_epi32(m, 0b10_11_00_01));
        let amax = f32::from_bits(_mm_cvtsi128_si32(m) as u32);
        let scale = amax / 127.0;
        let id = _mm256_set1_ps(if scale != 0.0 { 1.0 / scale } else { 0.0 });
        let rounding = _mm256_set1_ps(super::ROUNDING);
        let ints = v.map(|v| {
            let r = _mm256_sub_ps(_mm256_add_ps(_mm256_mul_ps(v, id), rounding), rounding);
            _mm256_cvtps_epi32(r)
        });
        let lanes_sum = |x: __m256i| {
            let x = _mm_add_epi32(_mm256_castsi256_si128(x), _mm256_extracti128_si256(x, 1));
            let x = _mm_add_epi32(x, _mm_shuffle_epi32(x, 0b01_00_11_10));
            let x = _mm_add_epi32(x, _mm_shuffle_epi32(x, 0b10_11_00_01));
            _mm_cvtsi128_si32(x)
        };
        let first_half = lanes_sum(_mm256_add_epi32(ints[0], ints[1]));
        let sum = first_half + lanes_sum(_mm256_add_epi32(ints[2], ints[3]));
        let low = _mm256_packs_epi32(ints[0], ints[1]);
        let high = _mm256_packs_epi32(ints[2], ints[3]);
        let packed = _mm256_permutevar8x32_epi32(
            _mm256_packs_epi16(low, high),
            _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7),
        );
        let mut quants = [0i8; BLOCK];
        _mm256_storeu_si256(quants.as_mut_ptr() as *mut __m256i, packed);
        QuantizedBlock {
            quants,
            scale,
            sum,
            first_half,
        }
    }
}

/// Columns per tile.
const COLS: usize = 2;

/// The portable tile: the x86 tiles' arithmetic, one block at a time.
fn tile_portable(
    w: &PackedMatrix,
    a: &QuantizedRows,
    rows: std::ops::Range<usize>,
    cols: std::ops::Range<usize>,
    out: Out,
) {
    let blocks = w.k / BLOCK;
    let whole = whole_blocks(blocks);
    assert!(
        !w.kind.halves || whole == blocks,
        "K-quants come in whole groups"
    );
    for r in rows {
        for c in cols.clone() {
            let mut lanes = [0f32; 8];
            let dot = |values: std::ops::Range<usize>| -> i32 {
                values.map(|at| w.quant(c, at) * a.quant(r, at)).sum()
            };
            let (offsets, sums) = (
                &w.offsets[if w.kind.affine {
                    c * blocks..(c + 1) * blocks
                } else {
                    0..0
                }],
                &a.sums[r * blocks..(r + 1) * blocks],
            );
            for b in 0..whole {
                let lane = &mut lanes[b % GROUP];
                let ad = a.scales[r * blocks + b];
                let at = b * BLOCK;
                if w.kind.halves {
                    for half in [at..at + BLOCK / 2, at + BLOCK / 2..at + BLOCK] {
                        let scale = ad * w.scale(c, half.start);
                        *lane = (dot(half) as f32).mul_add(scale, *lane);
                    }
                } else {
                    let scale = ad * w.scale(c, at);
                    *lane = (dot(at..at + BLOCK) as f32).mul_add(scale, *lane);
                }
                if w.kind.affine {
                    *lane = offsets[b].mul_add(sums[b], *lane);
                }
            }
            // The tail: a block at a time, lane l taking values 4l..4l + 4, and the
            // block's offset term in lane 0 (the other lanes add 0 · 0, as the x86
            // paths' vector FMA does).
            for b in whole..blocks {
                let scale = a.scales[r * blocks + b] * w.scale(c, b * BLOCK);
                for (l, lane) in lanes.iter_mut().enumerate() {
                    let at = b * BLOCK + 4 * l;
                    *lane = (dot(at..at + 4) as f32).mul_add(scale, *lane);
                }
                if w.kind.affine {
                    for (l, lane) in lanes.iter_mut().enumerate() {
                        let (o, s) = if l == 0 {
                            (offsets[b], sums[b])
                        } else {
                            (0.0, 0.0)
                        };
                        *lane = o.mul_add(s, *lane);
                    }
                }
            }
            let v = reduce_lanes(&lanes);
            // SAFETY: r < rows of the pass, c < n; this tile alone owns (r, c).
            unsafe { out.write(r, c, v) };
        }
    }
}

/// The x86 tiles, written once and compiled per instruction set. A group's integer dot
/// products accumulate in i32 lanes, one block per lane, exactly; each set supplies the
/// integer steps:
/// - `column(w, signed)`: one step of a column's weights (4 values of each block) made
///   into the operand the dot takes, once per column and step;
/// - `start(sum, first, signed, nibbles, halves)`: the lanes a row's dots start from (per
///   half with `halves`), from the row's block sums and first-half sums, once per row
///   and group;
/// - `dot(acc, operand, w, a, signed)`: `acc` plus the step's products, once per (row,
///   column) and step.
///
/// `signed` there means signed bytes; 4-bit weights are always multiplied as unsigned
/// nibbles, and Q4_0's `−8 · Σ a` comes from `start`. Whatever the set, the lanes end as
/// the same integers, and the float code after them is the same, so every set gives the
/// same bits.
#[cfg(target_arch = "x86_64")]
macro_rules! x86_tiles {
    (
        $(#[$doc:meta])*
        $module:ident, $features:literal, rows: $rows:literal,
        column: |$cw:ident, $cs:ident| $column:expr,
        start: |$ss:ident, $sf:ident, $ssg:ident, $sn:ident, $sh:ident| $start:expr,
        tail_start: |$ta:ident, $ts:ident| $tail_start:expr,
        dot: |$dacc:ident, $dop:ident, $dw:ident, $da:ident, $ds:ident| $dot:expr $(,)?
    ) => {
        $(#[$doc])*
        mod $module {
            use super::*;
            use std::arch::x86_64::*;

            /// Most rows per tile: as many as keep `ROWS × COLS` accumulators and the
            /// operands in this set's vector registers.
            const ROWS: usize = $rows;

            /// `R` rows × `C` columns, starting at `(r0, c0)`.
            ///
            /// One long function on purpose: split into stage functions, even inlined
            /// ones, the 1-row tile that decodes the default model measured 2–4% slower
            /// (docs/design/model.md).
            ///
            /// SAFETY: the CPU has this module's features; the rows and columns exist in
            /// `a` and `w`.
            #[target_feature(enable = $features)]
            pub(super) unsafe fn tile<
                const R: usize,
                const C: usize,
                const SIGNED: bool,
                const HALVES: bool,
                const NIBBLES: bool,
            >(
                w: &PackedMatrix,
                a: &QuantizedRows,
                r0: usize,
                c0: usize,
                out: Out,
            ) {
                let blocks = w.k / BLOCK;
                assert!(
                    r0 + R <= a.rows && c0 + C <= w.n && a.k == w.k,
                    "the tile is inside the pass"
                );
                let column = w.column_bytes();
                assert!(w.quants.len() >= w.n * column && a.quants.len() >= a.rows * a.k);
                assert!(w.scales.len() >= w.n * blocks && a.scales.len() >= a.rows * blocks);
                assert!(!HALVES || w.second_scales.len() >= w.n * blocks);
                assert!(
                    a.block_sums.len() >= a.rows * blocks
                        && a.first_half_sums.len() >= a.rows * blocks
                );
                let signed_bytes = SIGNED && !NIBBLES;
                let zero = _mm256_setzero_si256();
                let mut acc = [[_mm256_setzero_ps(); C]; R];
                // SAFETY (every pointer below): the asserts above put columns c0..c0 + C
                // and rows r0..r0 + R, with all their blocks, scales and sums, inside the
                // slices; the loads below read a whole group's or a tail block's bytes,
                // which lie inside its column or row.
                let wq: [*const u8; C] =
                    std::array::from_fn(|j| unsafe { w.quants.as_ptr().add((c0 + j) * column) });
                // Each column's first per-block value; null for a table the format lacks
                // (empty: no second scales without halves, no offsets unless affine).
                let per_column = |table: &[f32]| -> [*const f32; C] {
                    std::array::from_fn(|j| {
                        if table.is_empty() {
                            std::ptr::null()
                        } else {
                            unsafe { table.as_ptr().add((c0 + j) * blocks) }
                        }
                    })
                };
                let wsc = per_column(&w.scales);
                let wsc2 = per_column(&w.second_scales);
                let aq: [*const i8; R] =
                    std::array::from_fn(|i| unsafe { a.quants.as_ptr().add((r0 + i) * a.k) });
                let asc: [*const f32; R] =
                    std::array::from_fn(|i| unsafe { a.scales.as_ptr().add((r0 + i) * blocks) });
                let asum: [*const i32; R] = std::array::from_fn(|i| unsafe {
                    a.block_sums.as_ptr().add((r0 + i) * blocks)
                });
                let afirst: [*const i32; R] = std::array::from_fn(|i| unsafe {
                    a.first_half_sums.as_ptr().add((r0 + i) * blocks)
                });
                let affine = w.kind.affine;
                assert!(!affine || (w.offsets.len() >= w.n * blocks && a.sums.len() >= a.rows * blocks));
                let wof = per_column(&w.offsets);
                let asums: [*const f32; R] =
                    std::array::from_fn(|i| unsafe { a.sums.as_ptr().add((r0 + i) * blocks) });
                let whole = whole_blocks(blocks);
                assert!(!HALVES || whole == blocks, "K-quants come in whole groups");
                // Eight 32-bit lanes (or 32 bytes) from `p`.
                macro_rules! lanes {
                    ($p:expr) => {
                        _mm256_loadu_si256($p as *const __m256i)
                    };
                }
                for g in 0..whole / GROUP {
                    let bytes = g * GROUP * BLOCK; // where the group starts, 8-bit layout
                    let step = 4 * GROUP; // bytes per step
                    unsafe {
                        let mut starts = [(zero, zero); R];
                        for i in 0..R {
                            let ($ss, $sf, $ssg, $sn, $sh) = (
                                lanes!(asum[i].add(g * GROUP)),
                                if HALVES { lanes!(afirst[i].add(g * GROUP)) } else { zero },
                                SIGNED,
                                NIBBLES,
                                HALVES,
                            );
                            starts[i] = $start;
                        }
                        let mut dots = [[zero; C]; R];
                        let mut first_halves = [[zero; C]; R];
                        for i in 0..R {
                            for j in 0..C {
                                dots[i][j] = starts[i].0;
                            }
                        }
                        if NIBBLES {
                            for pair in 0..4 {
                                let mut low = [zero; C];
                                let mut high = [zero; C];
                                for j in 0..C {
                                    let packed = lanes!(wq[j].add(bytes / 2 + pair * step));
                                    let nibble = _mm256_set1_epi8(15);
                                    low[j] = _mm256_and_si256(packed, nibble);
                                    high[j] = _mm256_and_si256(_mm256_srli_epi16(packed, 4), nibble);
                                }
                                for i in 0..R {
                                    let a_low = lanes!(aq[i].add(bytes + pair * step));
                                    let a_high = lanes!(aq[i].add(bytes + (pair + 4) * step));
                                    for j in 0..C {
                                        for (wv, av) in [(low[j], a_low), (high[j], a_high)] {
                                            let operand = {
                                                let ($cw, $cs) = (wv, false);
                                                $column
                                            };
                                            let ($dacc, $dop, $dw, $da, $ds) =
                                                (dots[i][j], operand, wv, av, false);
                                            dots[i][j] = $dot;
                                        }
                                    }
                                }
                            }
                        } else {
                            for s in 0..8 {
                                if HALVES && s == 4 {
                                    for i in 0..R {
                                        for j in 0..C {
                                            first_halves[i][j] = dots[i][j];
                                            dots[i][j] = starts[i].1;
                                        }
                                    }
                                }
                                let mut wv = [zero; C];
                                let mut operand = [zero; C];
                                for j in 0..C {
                                    wv[j] = lanes!(wq[j].add(bytes + s * step));
                                    operand[j] = {
                                        let ($cw, $cs) = (wv[j], signed_bytes);
                                        $column
                                    };
                                }
                                for i in 0..R {
                                    let av = lanes!(aq[i].add(bytes + s * step));
                                    for j in 0..C {
                                        let ($dacc, $dop, $dw, $da, $ds) =
                                            (dots[i][j], operand[j], wv[j], av, signed_bytes);
                                        dots[i][j] = $dot;
                                    }
                                }
                            }
                        }
                        let ws: [__m256; C] =
                            std::array::from_fn(|j| _mm256_loadu_ps(wsc[j].add(g * GROUP)));
                        let ws2: [__m256; C] = std::array::from_fn(|j| {
                            if HALVES {
                                _mm256_loadu_ps(wsc2[j].add(g * GROUP))
                            } else {
                                _mm256_setzero_ps()
                            }
                        });
                        for i in 0..R {
                            let ad = _mm256_loadu_ps(asc[i].add(g * GROUP));
                            for j in 0..C {
                                if HALVES {
                                    acc[i][j] = _mm256_fmadd_ps(
                                        _mm256_cvtepi32_ps(first_halves[i][j]),
                                        _mm256_mul_ps(ad, ws[j]),
                                        acc[i][j],
                                    );
                                    acc[i][j] = _mm256_fmadd_ps(
                                        _mm256_cvtepi32_ps(dots[i][j]),
                                        _mm256_mul_ps(ad, ws2[j]),
                                        acc[i][j],
                                    );
                                } else {
                                    acc[i][j] = _mm256_fmadd_ps(
                                        _mm256_cvtepi32_ps(dots[i][j]),
                                        _mm256_mul_ps(ad, ws[j]),
                                        acc[i][j],
                                    );
                                }
                            }
                        }
                        if affine {
                            let wo: [__m256; C] =
                                std::array::from_fn(|j| _mm256_loadu_ps(wof[j].add(g * GROUP)));
                            for i in 0..R {
                                let sums = _mm256_loadu_ps(asums[i].add(g * GROUP));
                                for j in 0..C {
                                    acc[i][j] = _mm256_fmadd_ps(wo[j], sums, acc[i][j]);
                                }
                            }
                        }
                    }
                }
                // The tail, a block at a time: lane l takes values 4l..4l + 4, and a
                // signed nibble is made a signed byte first.
                for b in whole..blocks {
                    unsafe {
                        let mut wv = [zero; C];
                        let mut operand = [zero; C];
                        let mut ws = [_mm256_setzero_ps(); C];
                        for j in 0..C {
                            wv[j] = if NIBBLES {
                                let packed =
                                    _mm_loadu_si128(wq[j].add(b * BLOCK / 2) as *const __m128i);
                                let nibble = _mm_set1_epi8(15);
                                let low = _mm_and_si128(packed, nibble);
                                let high = _mm_and_si128(_mm_srli_epi16(packed, 4), nibble);
                                let v = _mm256_set_m128i(high, low);
                                if SIGNED { _mm256_sub_epi8(v, _mm256_set1_epi8(8)) } else { v }
                            } else {
                                _mm256_loadu_si256(wq[j].add(b * BLOCK) as *const __m256i)
                            };
                            operand[j] = {
                                let ($cw, $cs) = (wv[j], SIGNED);
                                $column
                            };
                            ws[j] = _mm256_broadcast_ss(&*wsc[j].add(b));
                        }
                        for i in 0..R {
                            let av = _mm256_loadu_si256(aq[i].add(b * BLOCK) as *const __m256i);
                            let ad = _mm256_broadcast_ss(&*asc[i].add(b));
                            let start = {
                                let ($ta, $ts) = (av, SIGNED);
                                $tail_start
                            };
                            for j in 0..C {
                                let quads = {
                                    let ($dacc, $dop, $dw, $da, $ds) =
                                        (start, operand[j], wv[j], av, SIGNED);
                                    $dot
                                };
                                acc[i][j] = _mm256_fmadd_ps(
                                    _mm256_cvtepi32_ps(quads),
                                    _mm256_mul_ps(ad, ws[j]),
                                    acc[i][j],
                                );
                            }
                        }
                        if affine {
                            // The block's offset term in lane 0, 0 · 0 in the others.
                            let lane0 = |p: *const f32| _mm256_zextps128_ps256(_mm_load_ss(p));
                            let wo: [__m256; C] = std::array::from_fn(|j| lane0(wof[j].add(b)));
                            for i in 0..R {
                                let sums = lane0(asums[i].add(b));
                                for j in 0..C {
                                    acc[i][j] = _mm256_fmadd_ps(wo[j], sums, acc[i][j]);
                                }
                            }
                        }
                    }
                }
                for i in 0..R {
                    for j in 0..C {
                        // SAFETY: (r0 + i, c0 + j) is in the pass and owned by this tile.
                        unsafe { out.write(r0 + i, c0 + j, reduce_lanes_m256!(acc[i][j])) };
                    }
                }
            }

            /// Columns `c0..c0 + C` for every row of the pass, `ROWS` rows at a time.
            ///
            /// SAFETY: as [`tile`].
            #[target_feature(enable = $features)]
            pub(super) unsafe fn columns<
                const C: usize,
                const SIGNED: bool,
                const HALVES: bool,
                const NIBBLES: bool,
            >(
                w: &PackedMatrix,
                a: &QuantizedRows,
                c0: usize,
                out: Out,
            ) {
                prefetch_columns(w, c0 + PREFETCH_AHEAD, C);
                let mut r = 0;
                unsafe {
                    while r + ROWS <= a.rows {
                        tile::<ROWS, C, SIGNED, HALVES, NIBBLES>(w, a, r, c0, out);
                        r += ROWS;
                    }
                    if ROWS > 4 && a.rows - r >= 4 {
                        tile::<4, C, SIGNED, HALVES, NIBBLES>(w, a, r, c0, out);
                        r += 4;
                    }
                    match a.rows - r {
                        0 => {}
                        1 => tile::<1, C, SIGNED, HALVES, NIBBLES>(w, a, r, c0, out),
                        2 => tile::<2, C, SIGNED, HALVES, NIBBLES>(w, a, r, c0, out),
                        3 => tile::<3, C, SIGNED, HALVES, NIBBLES>(w, a, r, c0, out),
                        _ => unreachable!("fewer than four rows remain"),
                    }
                }
            }

            /// Columns `c0..c0 + width` (`width` ≤ [`COLS`]) for every row of the pass,
            /// with the tile specialised for `w`'s format.
            ///
            /// SAFETY: as [`tile`].
            pub(super) unsafe fn column_group(
                w: &PackedMatrix,
                a: &QuantizedRows,
                c0: usize,
                width: usize,
                out: Out,
            ) {
                macro_rules! go {
                    ($c:literal) => {
                        // SAFETY: the caller's.
                        unsafe {
                            let k = w.kind;
                            match (k.signed, k.halves, k.nibbles) {
                                (true, false, false) => {
                                    columns::<$c, true, false, false>(w, a, c0, out)
                                }
                                (true, true, false) => {
                                    columns::<$c, true, true, false>(w, a, c0, out)
                                }
                                (false, false, false) => {
                                    columns::<$c, false, false, false>(w, a, c0, out)
                                }
                                (true, false, true) => {
                                    columns::<$c, true, false, true>(w, a, c0, out)
                                }
                                (false, false, true) => {
                                    columns::<$c, false, false, true>(w, a, c0, out)
                                }
                                _ => unreachable!(
                                    "no format has halves with nibbles or unsigned"
                                ),
                            }
                        }
                    };
                }
                match width {
                    2 => go!(2),
                    1 => go!(1),
                    _ => unreachable!("COLS is 2"),
                }
            }
        }
    };
}

/// How many columns ahead of the ones being multiplied a thread asks for the weights:
/// about 10 KB of Q8_0 (5 KB of Q4_1) for the default model. 16 against 8: Q8_0 decoding
/// 188 → 197 tok/s, Q4_1 228 → 240 (alternated, medians of 4).
const PREFETCH_AHEAD: usize = 16;

/// Ask the level-2 cache for columns `c0..c0 + count` of `w` (quants and per-block
/// tables), if they exist. A column pair is a few hundred bytes, so the hardware's stream
/// prefetcher, which stops at every 4 KiB page, leaves each tile's first loads waiting on
/// memory. Into L2, not L1, as the f32 kernel's (`dense::prefetch_columns`): Q4_1
/// decoding went from 202.6 to 225.7 tok/s with this hint (alternated, medians of 6).
#[cfg(target_arch = "x86_64")]
fn prefetch_columns(w: &PackedMatrix, c0: usize, count: usize) {
    use super::prefetch_lines;
    use std::arch::x86_64::_MM_HINT_T1;
    if c0 + count > w.n {
        return;
    }
    let column = w.column_bytes();
    prefetch_lines::<_MM_HINT_T1, u8>(&w.quants[c0 * column..(c0 + count) * column]);
    let blocks = w.k / BLOCK;
    for table in [&w.scales, &w.second_scales, &w.offsets] {
        if !table.is_empty() {
            prefetch_lines::<_MM_HINT_T1, f32>(&table[c0 * blocks..(c0 + count) * blocks]);
        }
    }
}

/// `−(sum · 2^shift)` per lane: the start that takes `2^shift · Σ a` back out.
#[cfg(target_arch = "x86_64")]
macro_rules! minus_shifted {
    ($sum:expr, $shift:literal) => {
        _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_slli_epi32($sum, $shift))
    };
}

#[cfg(target_arch = "x86_64")]
x86_tiles! {
    /// AVX2: `maddubs` multiplies unsigned by signed bytes, so a signed byte's sign
    /// moves onto the activation (`sign`) and its magnitude is the unsigned operand;
    /// `madd` with ones then sums the pairs into fours. Pairs stay exact: at most
    /// 2 · 128 · 127 < 2^15. Q4_0's nibbles are multiplied as they are, less `8 · Σ a`.
    avx2, "avx2,fma", rows: 4,
    column: |w, signed| if signed { _mm256_abs_epi8(w) } else { w },
    start: |sum, _first, signed, nibbles, _halves| {
        let zero = _mm256_setzero_si256();
        if signed && nibbles { (minus_shifted!(sum, 3), zero) } else { (zero, zero) }
    },
    tail_start: |_a, _signed| _mm256_setzero_si256(),
    dot: |acc, operand, w, a, signed| {
        let a = if signed { _mm256_sign_epi8(a, w) } else { a };
        _mm256_add_epi32(
            acc,
            _mm256_madd_epi16(_mm256_maddubs_epi16(operand, a), _mm256_set1_epi16(1)),
        )
    },
}

/// The VNNI dot: `vpdpbusd` adds four unsigned-by-signed byte products to each i32 lane
/// in one instruction. A signed byte `w` is made unsigned as `w + 128` (flip the top
/// bit), and the row's start takes the `128 · Σ a` that adds back out first (per half
/// for Q6_K), as Q4_0's start takes out `8 · Σ a`; so the lanes are exactly `Σ w · a`.
#[cfg(target_arch = "x86_64")]
macro_rules! vnni_tiles {
    ($(#[$doc:meta])* $module:ident, $features:literal, rows: $rows:literal, $dpbusd:ident) => {
        x86_tiles! {
            $(#[$doc])*
            $module, $features, rows: $rows,
            column: |w, signed| {
                if signed { _mm256_xor_si256(w, _mm256_set1_epi8(-128)) } else { w }
            },
            start: |sum, first, signed, nibbles, halves| {
                let zero = _mm256_setzero_si256();
                if !signed {
                    (zero, zero)
                } else if nibbles {
                    (minus_shifted!(sum, 3), zero)
                } else if halves {
                    (
                        minus_shifted!(first, 7),
                        minus_shifted!(_mm256_sub_epi32(sum, first), 7),
                    )
                } else {
                    (minus_shifted!(sum, 7), zero)
                }
            },
            tail_start: |a, signed| {
                let zero = _mm256_setzero_si256();
                if signed {
                    _mm256_sub_epi32(zero, $dpbusd(zero, _mm256_set1_epi8(-128), a))
                } else {
                    zero
                }
            },
            dot: |acc, operand, _w, a, _signed| $dpbusd(acc, operand, a),
        }
    };
}

#[cfg(target_arch = "x86_64")]
vnni_tiles! {
    /// AVX-512 VNNI's 256-bit `vpdpbusd` (it needs AVX512VL for that width); AVX-512's
    /// 32 vector registers hold eight rows' accumulators.
    avx512vnni, "avx2,fma,avx512vnni,avx512vl", rows: 8, _mm256_dpbusd_epi32
}

#[cfg(target_arch = "x86_64")]
vnni_tiles! {
    /// AVX-VNNI's `vpdpbusd`, the VEX-encoded twin for CPUs without AVX-512.
    avxvnni, "avx2,fma,avxvnni", rows: 4, _mm256_dpbusd_avx_epi32
}

/// Columns `c0..c0 + width` (`width` ≤ [`COLS`]) of `w`, for every row of `a`.
fn column_group(
    simd: Simd,
    w: &PackedMatrix,
    a: &QuantizedRows,
    c0: usize,
    width: usize,
    out: Out,
) {
    // SAFETY (each x86 arm): `simd` is one of `Simd::available()`, so the CPU has that
    // module's features; the caller passes columns inside `w` and rows inside `a`.
    match simd {
        #[cfg(target_arch = "x86_64")]
        Simd::Avx2 => unsafe { avx2::column_group(w, a, c0, width, out) },
        #[cfg(target_arch = "x86_64")]
        Simd::Avx512Vnni => unsafe { avx512vnni::column_group(w, a, c0, width, out) },
        #[cfg(target_arch = "x86_64")]
        Simd::AvxVnni => unsafe { avxvnni::column_group(w, a, c0, width, out) },
        _ => tile_portable(w, a, 0..a.rows, c0..c0 + width, out),
    }
}

/// `out[r][c0 + c] = x[r] · w[c]` for every part of a fused projection: `parts` share
/// their inputs, and their outputs lie side by side in `out` (`rows × Σ n`).
/// Columns are spread over candle's CPU thread pool (`CANDLE_NUM_THREADS`).
pub fn matmul(simd: Simd, parts: &[PackedMatrix], a: &QuantizedRows, out: &mut [f32]) {
    matmul_into(simd, parts, a, as_uninit(out));
}

/// [`matmul`] into storage that need not hold values yet: it writes every element of
/// `out`, so a caller can hand it a vector's spare capacity instead of zeroing it first
/// (the output head's 49,152 columns: 3 MB at 16 rows, per pass).
pub fn matmul_into(
    simd: Simd,
    parts: &[PackedMatrix],
    a: &QuantizedRows,
    out: &mut [MaybeUninit<f32>],
) {
    assert!(simd.is_available(), "{simd:?} is not available on this CPU");
    let width: usize = parts.iter().map(|p| p.n).sum();
    assert_eq!(out.len(), a.rows * width, "out is rows × Σ n");
    for p in parts {
        assert_eq!(p.k, a.k, "inputs match");
    }
    if a.rows == 0 {
        return;
    }
    let outputs: Vec<usize> = parts.iter().map(|p| p.n).collect();
    for_each_column_group(&outputs, COLS, out, |part, c0, cols, out| {
        column_group(simd, &parts[part], a, c0, cols, out)
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::quantized::{GgmlDType, QTensor};
    use candle_core::{Device, Tensor};

    use crate::model::kernels::test_values as values;

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn activations_quantize_to_the_same_block_with_avx2() {
        if !Simd::Avx2.is_available() {
            return;
        }
        let mut blocks: Vec<[f32; BLOCK]> = (0..200)
            .map(|seed| {
                values(BLOCK, seed, 10f32.powi(seed as i32 % 9 - 4))
                    .try_into()
                    .unwrap()
            })
            .collect();
        blocks.push([0.0; BLOCK]);
        blocks.push([-0.0; BLOCK]);
        // Ties: values that land on a half step, and the largest value exactly ±127.
        blocks.push(std::array::from_fn(|j| {
            (j as f32 - 15.5) * if j % 2 == 0 { 1.0 } else { -4.1 }
        }));
        blocks.push(std::array::from_fn(|j| {
            if j == 7 { -127.0 } else { j as f32 + 0.5 }
        }));
        for block in &blocks {
            let want = quantize_block(block);
            // SAFETY: AVX2 and FMA are available (checked above).
            let got = unsafe { quantize_block_avx2(block) };
            assert_eq!(got.quants, want.quants, "{block:?}");
            assert_eq!(got.scale.to_bits(), want.scale.to_bits());
            assert_eq!((got.sum, got.first_half), (want.sum, want.first_half));
        }
    }

    const FORMATS: [GgmlDType; 8] = [
        GgmlDType::Q8_0,
        GgmlDType::Q4_0,
        GgmlDType::Q4_1,
        GgmlDType::Q5_0,
        GgmlDType::Q5_1,
        GgmlDType::Q4K,
        GgmlDType::Q5K,
        GgmlDType::Q6K,
    ];

    /// Every format with 512 inputs (whole groups), and the 32-value ones with 96 (a tail
    /// alone), 288 and 576 too (groups and a tail); K-quants need multiples of 256.
    fn shapes() -> impl Iterator<Item = (GgmlDType, usize)> {
        FORMATS
            .into_iter()
            .flat_map(|d| [(d, 96), (d, 288), (d, 512), (d, 576)])
            .filter(|(d, k)| k % d.block_size() == 0)
    }

    fn packed(dtype: GgmlDType, n: usize, k: usize) -> PackedMatrix {
        let w =
            Tensor::from_vec(values(n * k, 7 + dtype as u64, 0.2), (n, k), &Device::Cpu).unwrap();
        PackedMatrix::from_qtensor(&QTensor::quantize(&w, dtype).unwrap()).unwrap()
    }

    fn run(simd: Simd, w: &PackedMatrix, x: &[f32], rows: usize) -> Vec<f32> {
        let mut a = QuantizedRows::default();
        a.quantize(x, rows, w.k);
        let mut out = vec![f32::NAN; rows * w.n];
        matmul(simd, std::slice::from_ref(w), &a, &mut out);
        out
    }

    #[test]
    fn products_match_the_dequantized_weights() {
        for (dtype, k) in shapes() {
            let (n, rows) = (5, 3);
            let x = values(rows * k, 99, 2.0);
            let w = packed(dtype, n, k);
            let dense = w.dequantize();
            let got = run(Simd::detect(), &w, &x, rows);
            for r in 0..rows {
                for c in 0..n {
                    let exact: f32 = (0..k).map(|i| x[r * k + i] * dense[c * k + i]).sum();
                    let scale: f32 = (0..k)
                        .map(|i| (x[r * k + i] * dense[c * k + i]).abs())
                        .sum();
                    let err = (got[r * n + c] - exact).abs();
                    // Only the activations' 8-bit rounding separates them.
                    assert!(
                        err <= 0.01 * scale,
                        "{dtype:?} ({r},{c}): {} vs {exact}",
                        got[r * n + c]
                    );
                }
            }
        }
    }

    #[test]
    fn a_row_gets_the_same_bits_alone_and_among_others() {
        let n = 7;
        for ((dtype, k), &simd) in
            shapes().flat_map(|shape| Simd::available().iter().map(move |s| (shape, s)))
        {
            let w = packed(dtype, n, k);
            let many = values(13 * k, 5, 3.0);
            let together = run(simd, &w, &many, 13);
            for r in 0..13 {
                let alone = run(simd, &w, &many[r * k..(r + 1) * k], 1);
                let same = alone
                    .iter()
                    .zip(&together[r * n..(r + 1) * n])
                    .all(|(a, b)| a.to_bits() == b.to_bits());
                assert!(
                    same,
                    "{dtype:?} {simd:?}: row {r} differs alone and among 13 rows"
                );
            }
        }
    }

    #[test]
    fn every_simd_path_gives_the_portable_bits() {
        // 13, 14 and 15 rows and 9 columns reach every tile shape (8 or 4 rows, then 4,
        // then 1-3; 1-2 columns); 96 inputs are a tail alone, 288 a group and one block,
        // 576 (the model's width) two groups and two blocks.
        for (dtype, k) in shapes() {
            let w = packed(dtype, 9, k);
            for rows in [13, 14, 15] {
                let x = values(rows * k, 11, 4.0);
                let slow = run(Simd::Portable, &w, &x, rows);
                for &simd in Simd::available() {
                    let fast = run(simd, &w, &x, rows);
                    assert!(
                        fast.iter()
                            .zip(&slow)
                            .all(|(a, b)| a.to_bits() == b.to_bits()),
                        "{dtype:?}, k {k}, {rows} rows: {simd:?} and portable differ"
                    );
                }
            }
        }
    }

    #[test]
    fn the_cpu_s_paths_are_listed_best_first_and_portable_last() {
        let available = Simd::available();
        assert_eq!(available.last(), Some(&Simd::Portable));
        assert!(available.contains(&Simd::detect()));
        if std::env::var_os("SUFFIXD_SIMD").is_none() {
            assert_eq!(Simd::detect(), available[0]);
        }
    }

    #[test]
    fn fused_parts_write_their_own_columns() {
        let k = 64;
        let parts = [packed(GgmlDType::Q8_0, 3, k), packed(GgmlDType::Q4_1, 5, k)];
        let x = values(2 * k, 3, 1.0);
        let mut a = QuantizedRows::default();
        a.quantize(&x, 2, k);
        let mut fused = vec![0f32; 2 * 8];
        matmul(Simd::detect(), &parts, &a, &mut fused);
        let first = run(Simd::detect(), &parts[0], &x, 2);
        let second = run(Simd::detect(), &parts[1], &x, 2);
        for r in 0..2 {
            assert_eq!(&fused[r * 8..r * 8 + 3], &first[r * 3..r * 3 + 3]);
            assert_eq!(&fused[r * 8 + 3..r * 8 + 8], &second[r * 5..r * 5 + 5]);
        }
    }
}
