//! The x86 register tiles of the quantized matmul (AVX2, AVX-VNNI, AVX-512 VNNI): one
//! tile body written once ([`x86_tiles!`]) and compiled per instruction set, each set
//! supplying its integer dot. The operations, their order and so the bits are the
//! portable tile's ([`super::tile_portable`]); the module doc of [`super`] says why
//! that matters.

use super::super::pack::{BLOCK, BlockTable, GROUP, PackedMatrix, whole_blocks};
use super::super::{Out, reduce_lanes_m256};
use super::QuantizedRows;

/// Where one x86 tile's columns and rows start in the pass's tables, checked once: the
/// tile reads through these pointers unchecked.
#[derive(Clone, Copy)]
struct TileOperands<const R: usize, const C: usize> {
    /// Each column's quants.
    wq: [*const u8; C],
    /// Where each column's entries start in the block scales, second (half-block)
    /// scales and offsets, as bytes (entries of 2 or 4, [`BlockTable`]); null for a table
    /// the format lacks (empty: no second scales without halves, no offsets unless
    /// affine).
    wsc: [*const u8; C],
    wsc2: [*const u8; C],
    wof: [*const u8; C],
    /// Each row's quants.
    aq: [*const i8; R],
    /// Each row's first block scale, integer block sum, first-half sum and float sum.
    asc: [*const f32; R],
    asum: [*const i32; R],
    afirst: [*const i32; R],
    asums: [*const f32; R],
    /// Blocks per row, and how many of them fill whole groups.
    blocks: usize,
    whole: usize,
    /// Whether the format has offsets (`Σ a · offset` adds to each block).
    affine: bool,
}

impl<const R: usize, const C: usize> TileOperands<R, C> {
    /// Rows `r0..r0 + R` by columns `c0..c0 + C` of `a` times `w`; `halves` when the
    /// format scales half-blocks, `half` when its tables are f16. Panics unless the tile
    /// lies inside the pass and every table the format uses is long enough and as wide
    /// as the tile reads it.
    #[inline(always)]
    fn new(
        w: &PackedMatrix,
        a: &QuantizedRows,
        r0: usize,
        c0: usize,
        halves: bool,
        half: bool,
    ) -> Self {
        let blocks = w.k / BLOCK;
        assert!(
            r0 + R <= a.rows && c0 + C <= w.n && a.k == w.k,
            "the tile is inside the pass"
        );
        let column = w.column_bytes();
        assert!(w.quants.len() >= w.n * column && a.quants.len() >= a.rows * a.k);
        assert!(w.scales.len() >= w.n * blocks && a.scales.len() >= a.rows * blocks);
        assert!(!halves || w.second_scales.len() >= w.n * blocks);
        assert!(
            a.block_sums.len() >= a.rows * blocks && a.first_half_sums.len() >= a.rows * blocks
        );
        // SAFETY (every pointer below): the asserts above put columns c0..c0 + C and rows
        // r0..r0 + R, with all their blocks, scales and sums, inside the slices; the
        // tile's loads read a whole group's or a tail block's bytes, which lie inside its
        // column or row.
        let wq = std::array::from_fn(|j| unsafe { w.quants.as_ptr().add((c0 + j) * column) });
        let per_column = |table: &BlockTable| -> [*const u8; C] {
            assert!(
                table.is_empty() || table.entry_bytes() == if half { 2 } else { 4 },
                "the tile reads the tables as wide as they are"
            );
            let (bytes, entry) = (table.bytes(), table.entry_bytes());
            std::array::from_fn(|j| {
                if table.is_empty() {
                    std::ptr::null()
                } else {
                    unsafe { bytes.as_ptr().add((c0 + j) * blocks * entry) }
                }
            })
        };
        let wsc = per_column(&w.scales);
        let wsc2 = per_column(&w.second_scales);
        let aq = std::array::from_fn(|i| unsafe { a.quants.as_ptr().add((r0 + i) * a.k) });
        let asc = std::array::from_fn(|i| unsafe { a.scales.as_ptr().add((r0 + i) * blocks) });
        let asum = std::array::from_fn(|i| unsafe { a.block_sums.as_ptr().add((r0 + i) * blocks) });
        let afirst =
            std::array::from_fn(|i| unsafe { a.first_half_sums.as_ptr().add((r0 + i) * blocks) });
        let affine = w.kind.affine;
        assert!(!affine || (w.offsets.len() >= w.n * blocks && a.sums.len() >= a.rows * blocks));
        let wof = per_column(&w.offsets);
        let asums = std::array::from_fn(|i| unsafe { a.sums.as_ptr().add((r0 + i) * blocks) });
        let whole = whole_blocks(blocks);
        assert!(!halves || whole == blocks, "K-quants come in whole groups");
        TileOperands {
            wq,
            wsc,
            wsc2,
            wof,
            aq,
            asc,
            asum,
            afirst,
            asums,
            blocks,
            whole,
            affine,
        }
    }
}

/// A match of `kind` (`(signed, halves, nibbles, half)`) over the kinds that
/// `pack::kind_of` makes, each arm calling `columns` with those as its const
/// parameters: Q8_0 and Q5_0, Q6_K, Q5_1, Q5_K, Q4_0, Q4_1, Q4_K.
macro_rules! for_each_kind {
    ($columns:ident::<$c:literal> $args:tt, $kind:expr) => {
        for_each_kind!(@arms $columns, $c, $args, $kind,
            (true, false, false, true), (true, true, false, false),
            (false, false, false, true), (false, false, false, false),
            (true, false, true, true), (false, false, true, true),
            (false, false, true, false))
    };
    (@arms $columns:ident, $c:literal, $args:tt, $kind:expr,
        $(($s:literal, $h:literal, $n:literal, $f:literal)),+) => {
        match $kind {
            $(($s, $h, $n, $f) => $columns::<$c, $s, $h, $n, $f> $args,)+
            _ => unreachable!("only the kinds listed exist (pack::kind_of)"),
        }
    };
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
        pub(super) mod $module {
            use super::*;
            use std::arch::x86_64::*;

            /// Most rows per tile: as many as keep `ROWS × COLS` accumulators and the
            /// operands in this set's vector registers.
            const ROWS: usize = $rows;

            /// Entries `at..at + 8` of a column's [`BlockTable`] (`p`: its first entry),
            /// as f32: f16 entries (`half`) are widened exactly.
            macro_rules! entries {
                ($half:expr, $p:expr, $at:expr) => {
                    if $half {
                        _mm256_cvtph_ps(_mm_loadu_si128($p.add(2 * $at) as *const __m128i))
                    } else {
                        _mm256_loadu_ps($p.add(4 * $at) as *const f32)
                    }
                };
            }

            /// Entry `at` of a column's [`BlockTable`] in lane 0, the other lanes 0.
            macro_rules! entry {
                ($half:expr, $p:expr, $at:expr) => {
                    if $half {
                        let bits = ($p.add(2 * $at) as *const u16).read_unaligned();
                        _mm_cvtph_ps(_mm_cvtsi32_si128(bits as i32))
                    } else {
                        _mm_load_ss($p.add(4 * $at) as *const f32)
                    }
                };
            }

            /// `R` rows × `C` columns, starting at `(r0, c0)`.
            ///
            /// The groups' loop is one body on purpose (docs/design/model.md): split into
            /// stage functions it measured slower. Only the checks and pointers before it
            /// ([`TileOperands::new`]) and the tail and write-out after it ([`finish`])
            /// are their own functions, both always inlined.
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
                const HALF: bool,
            >(
                w: &PackedMatrix,
                a: &QuantizedRows,
                r0: usize,
                c0: usize,
                out: Out,
            ) {
                let ops = TileOperands::<R, C>::new(w, a, r0, c0, HALVES, HALF);
                let TileOperands { wq, wsc, wsc2, wof, aq, asc, asum, afirst, asums, whole, affine, .. } = ops;
                let signed_bytes = SIGNED && !NIBBLES;
                let zero = _mm256_setzero_si256();
                let mut acc = [[_mm256_setzero_ps(); C]; R];
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
                            std::array::from_fn(|j| entries!(HALF, wsc[j], g * GROUP));
                        let ws2: [__m256; C] = std::array::from_fn(|j| {
                            if HALVES {
                                entries!(HALF, wsc2[j], g * GROUP)
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
                                std::array::from_fn(|j| entries!(HALF, wof[j], g * GROUP));
                            for i in 0..R {
                                let sums = _mm256_loadu_ps(asums[i].add(g * GROUP));
                                for j in 0..C {
                                    acc[i][j] = _mm256_fmadd_ps(wo[j], sums, acc[i][j]);
                                }
                            }
                        }
                    }
                }
                // SAFETY: the caller's; `ops` is this tile's.
                unsafe { finish::<R, C, SIGNED, NIBBLES, HALF>(&ops, acc, r0, c0, out) };
            }

            /// The tile's end: the blocks after the last whole group into `acc`, a block
            /// at a time (lane l takes values 4l..4l + 4, and a signed nibble is made a
            /// signed byte first), then each accumulator's lanes summed into `out`. Its
            /// own function, always inlined into [`tile`], whose features it then has (as a
            /// `#[target_feature]` function left to the inliner it was not inlined, and
            /// Q8_0 prefill lost 14%).
            ///
            /// SAFETY: the CPU has this module's features; `ops` is the tile's at
            /// `(r0, c0)`.
            #[inline(always)]
            unsafe fn finish<
                const R: usize,
                const C: usize,
                const SIGNED: bool,
                const NIBBLES: bool,
                const HALF: bool,
            >(
                ops: &TileOperands<R, C>,
                mut acc: [[__m256; C]; R],
                r0: usize,
                c0: usize,
                out: Out,
            ) {
                let TileOperands { wq, wsc, wof, aq, asc, asums, blocks, whole, affine, .. } = *ops;
                // SAFETY: the CPU has the features (the caller's).
                let zero = unsafe { _mm256_setzero_si256() };
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
                            let scale = entry!(HALF, wsc[j], b);
                            ws[j] = _mm256_broadcastss_ps(scale);
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
                            let wo: [__m256; C] = std::array::from_fn(|j| {
                                _mm256_zextps128_ps256(entry!(HALF, wof[j], b))
                            });
                            for i in 0..R {
                                let sums = _mm256_zextps128_ps256(_mm_load_ss(asums[i].add(b)));
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
                const HALF: bool,
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
                        tile::<ROWS, C, SIGNED, HALVES, NIBBLES, HALF>(w, a, r, c0, out);
                        r += ROWS;
                    }
                    if ROWS > 4 && a.rows - r >= 4 {
                        tile::<4, C, SIGNED, HALVES, NIBBLES, HALF>(w, a, r, c0, out);
                        r += 4;
                    }
                    match a.rows - r {
                        0 => {}
                        1 => tile::<1, C, SIGNED, HALVES, NIBBLES, HALF>(w, a, r, c0, out),
                        2 => tile::<2, C, SIGNED, HALVES, NIBBLES, HALF>(w, a, r, c0, out),
                        3 => tile::<3, C, SIGNED, HALVES, NIBBLES, HALF>(w, a, r, c0, out),
                        _ => unreachable!("fewer than four rows remain"),
                    }
                }
            }

            /// Columns `c0..c0 + width` (`width` ≤ [`COLS`]) for every row of the pass,
            /// with the tile specialised for `w`'s format.
            ///
            /// SAFETY: as [`tile`].
            pub(crate) unsafe fn column_group(
                w: &PackedMatrix,
                a: &QuantizedRows,
                c0: usize,
                width: usize,
                out: Out,
            ) {
                let k = w.kind;
                let kind = (k.signed, k.halves, k.nibbles, k.half);
                // SAFETY (each arm): the caller's.
                match width {
                    2 => unsafe { for_each_kind!(columns::<2>(w, a, c0, out), kind) },
                    1 => unsafe { for_each_kind!(columns::<1>(w, a, c0, out), kind) },
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
fn prefetch_columns(w: &PackedMatrix, c0: usize, count: usize) {
    use super::super::prefetch_lines;
    use std::arch::x86_64::_MM_HINT_T1;
    if c0 + count > w.n {
        return;
    }
    let column = w.column_bytes();
    prefetch_lines::<_MM_HINT_T1, u8>(&w.quants[c0 * column..(c0 + count) * column]);
    let blocks = w.k / BLOCK;
    for table in [&w.scales, &w.second_scales, &w.offsets] {
        let entries = blocks * table.entry_bytes();
        if !table.is_empty() {
            prefetch_lines::<_MM_HINT_T1, u8>(&table.bytes()[c0 * entries..(c0 + count) * entries]);
        }
    }
}

/// `−(sum · 2^shift)` per lane: the start that takes `2^shift · Σ a` back out.
macro_rules! minus_shifted {
    ($sum:expr, $shift:literal) => {
        _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_slli_epi32($sum, $shift))
    };
}

x86_tiles! {
    /// AVX2: `maddubs` multiplies unsigned by signed bytes, so a signed byte's sign
    /// moves onto the activation (`sign`) and its magnitude is the unsigned operand;
    /// `madd` with ones then sums the pairs into fours. Pairs stay exact: at most
    /// 2 · 128 · 127 < 2^15. Q4_0's nibbles are multiplied as they are, less `8 · Σ a`.
    avx2, "avx2,fma,f16c", rows: 4,
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

vnni_tiles! {
    /// AVX-512 VNNI's 256-bit `vpdpbusd` (it needs AVX512VL for that width); AVX-512's
    /// 32 vector registers hold eight rows' accumulators.
    avx512vnni, "avx2,fma,f16c,avx512vnni,avx512vl", rows: 8, _mm256_dpbusd_epi32
}

vnni_tiles! {
    /// AVX-VNNI's `vpdpbusd`, the VEX-encoded twin for CPUs without AVX-512.
    avxvnni, "avx2,fma,f16c,avxvnni", rows: 4, _mm256_dpbusd_avx_epi32
}
