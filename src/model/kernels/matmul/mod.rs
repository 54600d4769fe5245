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
use super::{
    FEW_ROWS_ITEM_COLUMNS, Out, Simd, as_uninit, for_each_column_group, reduce_lanes,
    round_to_integer,
};
use std::mem::MaybeUninit;

#[cfg(target_arch = "x86_64")]
mod x86;

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
            // Block b's offset, and the row's scaled sum over it (the affine formats).
            let offset = |b: usize| w.offsets.get(c * blocks + b);
            let sum = |b: usize| a.sums[r * blocks + b];
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
                    *lane = offset(b).mul_add(sum(b), *lane);
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
                            (offset(b), sum(b))
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
        Simd::Avx2 => unsafe { x86::avx2::column_group(w, a, c0, width, out) },
        #[cfg(target_arch = "x86_64")]
        Simd::Avx512Vnni => unsafe { x86::avx512vnni::column_group(w, a, c0, width, out) },
        #[cfg(target_arch = "x86_64")]
        Simd::AvxVnni => unsafe { x86::avxvnni::column_group(w, a, c0, width, out) },
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
    // Decoding: items of several tiles, so that the pool's claim and an item's dispatch
    // are paid once per 16 columns, not per pair (the stream a thread reads is the same).
    let width = if a.rows <= 2 {
        FEW_ROWS_ITEM_COLUMNS
    } else {
        COLS
    };
    for_each_column_group(&outputs, width, out, |part, c0, cols, out| {
        for c in (c0..c0 + cols).step_by(COLS) {
            column_group(simd, &parts[part], a, c, COLS.min(c0 + cols - c), out)
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::quantized::{GgmlDType, QTensor};
    use candle_core::{Device, Tensor};

    use crate::model::kernels::{same_bits, test_values as values};

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
        // A row alone takes work items of several tiles: two whole ones and a part.
        let n = 2 * FEW_ROWS_ITEM_COLUMNS + 5;
        for ((dtype, k), &simd) in
            shapes().flat_map(|shape| Simd::available().iter().map(move |s| (shape, s)))
        {
            let w = packed(dtype, n, k);
            let many = values(13 * k, 5, 3.0);
            let together = run(simd, &w, &many, 13);
            for r in 0..13 {
                let alone = run(simd, &w, &many[r * k..(r + 1) * k], 1);
                let same = same_bits(&alone, &together[r * n..(r + 1) * n]);
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
                        same_bits(&fast, &slow),
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
