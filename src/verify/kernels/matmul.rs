//! The row-invariant quantized matmul: `out[r][c] = Σ_k x[r][k] · w[c][k]` for packed
//! weights ([`PackedMatrix`]) and f32 activations quantized per 32-value block to 8 bits,
//! as GGML's Q8_0 does.
//!
//! **Row invariance.** Every output element is computed by the same operations in the
//! same order, whatever the number of rows in the pass and whichever tile or thread
//! computes it: per block, an exact integer dot product in eight lanes, converted to f32
//! and accumulated by one fused multiply-add with the product of the two scales; then a fixed reduction of the lanes, then (affine formats) a
//! sequential sum of the offsets' contributions. The register tiles only decide which
//! elements are computed side by side. The AVX2 and portable paths perform the same IEEE
//! operations, so they agree bit for bit too (tested).
//!
//! **Weight-stationary.** The columns are split among threads; a thread takes two
//! columns at a time (a few KiB, which stay in L1) through every row of the pass, so each
//! weight is read from memory once per pass whatever the number of rows.

use super::pack::{BLOCK, PackedMatrix};
use super::{Out, for_each_column_group, reduce_lanes, round_to_integer};

/// Activations quantized for the kernels: per row, `k` signed bytes, and per 32-value
/// block a scale and the scaled sum of its quants (used by the affine formats).
#[derive(Default)]
pub struct QuantizedRows {
    rows: usize,
    k: usize,
    quants: Vec<i8>,
    scales: Vec<f32>,
    sums: Vec<f32>,
}

impl QuantizedRows {
    /// Quantize `x` (`rows × k`, row-major): each block's scale is its largest magnitude
    /// over 127, each value rounded to the nearest multiple of it, as GGML's Q8_0.
    pub fn quantize(&mut self, x: &[f32], rows: usize, k: usize) {
        assert_eq!(x.len(), rows * k, "x is rows × k");
        assert_eq!(k % BLOCK, 0, "k is whole blocks");
        self.rows = rows;
        self.k = k;
        self.quants.clear();
        self.scales.clear();
        self.sums.clear();
        for block in x.chunks_exact(BLOCK) {
            let amax = block.iter().fold(0f32, |m, v| m.max(v.abs()));
            let d = amax / 127.0;
            let id = if d != 0.0 { 1.0 / d } else { 0.0 };
            let mut sum = 0i32;
            for &v in block {
                let q = round_to_integer(v * id) as i8;
                sum += q as i32;
                self.quants.push(q);
            }
            self.scales.push(d);
            self.sums.push(d * sum as f32);
        }
    }
}

/// Which instruction set the kernels use. Chosen once per process.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Simd {
    /// x86-64 AVX2 and FMA.
    Avx2,
    /// Plain Rust: the same arithmetic, one lane at a time.
    Portable,
}

impl Simd {
    /// The best this CPU supports.
    pub fn detect() -> Simd {
        static DETECTED: std::sync::OnceLock<Simd> = std::sync::OnceLock::new();
        *DETECTED.get_or_init(|| {
            #[cfg(target_arch = "x86_64")]
            {
                if std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma") {
                    return Simd::Avx2;
                }
            }
            Simd::Portable
        })
    }
}

/// The offsets' contribution to one element: block b's into lane b mod 8, then the
/// lanes reduced in the fixed order. The AVX2 path does the whole groups of eight
/// blocks at once, with the same operations.
#[inline(always)]
fn offset_term(offsets: &[f32], sums: &[f32], lanes: [f32; 8], from: usize) -> f32 {
    let mut lanes = lanes;
    for b in from..offsets.len() {
        lanes[b % 8] = offsets[b].mul_add(sums[b], lanes[b % 8]);
    }
    reduce_lanes(&lanes)
}

/// Columns per tile.
const COLS: usize = 2;
/// Most rows per tile.
const ROWS: usize = 4;

/// The portable tile: the AVX2 tile's arithmetic one lane at a time.
fn tile_portable(
    w: &PackedMatrix,
    a: &QuantizedRows,
    rows: std::ops::Range<usize>,
    cols: std::ops::Range<usize>,
    out: Out,
) {
    let blocks = w.k / BLOCK;
    let per = if w.kind.halves { 2 } else { 1 };
    for r in rows {
        for c in cols.clone() {
            let mut acc = [0f32; 8];
            for b in 0..blocks {
                let aq = &a.quants[r * a.k + b * BLOCK..][..BLOCK];
                let ad = a.scales[r * blocks + b];
                for (lane, acc) in acc.iter_mut().enumerate() {
                    let isum: i32 = (0..4)
                        .map(|e| {
                            let at = 4 * lane + e;
                            w.quant(c, b * BLOCK + at) as i32 * aq[at] as i32
                        })
                        .sum();
                    let scale = ad * w.scales[(c * blocks + b) * per + lane * per / 8];
                    *acc = (isum as f32).mul_add(scale, *acc);
                }
            }
            let mut v = reduce_lanes(&acc);
            if w.kind.affine {
                v += offset_term(
                    &w.offsets[c * blocks..(c + 1) * blocks],
                    &a.sums[r * blocks..(r + 1) * blocks],
                    [0.0; 8],
                    0,
                );
            }
            // SAFETY: r < rows of the pass, c < n; this tile alone owns (r, c).
            unsafe { out.write(r, c, v) };
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use super::*;
    use std::arch::x86_64::*;

    /// `R` rows × `C` columns, starting at `(r0, c0)`.
    ///
    /// SAFETY: the CPU has AVX2 and FMA; the rows and columns exist in `a` and `w`.
    #[target_feature(enable = "avx2,fma")]
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
        let per = if HALVES { 2 } else { 1 };
        assert!(
            r0 + R <= a.rows && c0 + C <= w.n,
            "the tile is inside the pass"
        );
        let column = w.column_bytes();
        let block_bytes = if NIBBLES { BLOCK / 2 } else { BLOCK };
        assert!(w.quants.len() >= w.n * column && a.quants.len() >= a.rows * a.k);
        assert!(w.scales.len() >= w.n * blocks * per && a.scales.len() >= a.rows * blocks);
        let ones = _mm256_set1_epi16(1);
        let mut acc = [[_mm256_setzero_ps(); C]; R];
        // SAFETY (every pointer below): the asserts above put columns c0..c0 + C and rows
        // r0..r0 + R, with all their blocks and scales, inside the slices.
        let wq: [*const u8; C] =
            std::array::from_fn(|j| unsafe { w.quants.as_ptr().add((c0 + j) * column) });
        let wsc: [*const f32; C] =
            std::array::from_fn(|j| unsafe { w.scales.as_ptr().add((c0 + j) * blocks * per) });
        let aq: [*const i8; R] =
            std::array::from_fn(|i| unsafe { a.quants.as_ptr().add((r0 + i) * a.k) });
        let asc: [*const f32; R] =
            std::array::from_fn(|i| unsafe { a.scales.as_ptr().add((r0 + i) * blocks) });
        for b in 0..blocks {
            unsafe {
                let mut wv = [_mm256_setzero_si256(); C];
                let mut wabs = [_mm256_setzero_si256(); C];
                let mut ws = [_mm256_setzero_ps(); C];
                for j in 0..C {
                    let at = wq[j].add(b * block_bytes);
                    wv[j] = if NIBBLES {
                        // Byte i holds values i (low nibble) and i + 16 (high).
                        let packed = _mm_loadu_si128(at as *const __m128i);
                        let low = _mm_set1_epi8(15);
                        let lo = _mm_and_si128(packed, low);
                        let hi = _mm_and_si128(_mm_srli_epi16(packed, 4), low);
                        let v = _mm256_set_m128i(hi, lo);
                        if SIGNED {
                            _mm256_sub_epi8(v, _mm256_set1_epi8(8))
                        } else {
                            v
                        }
                    } else {
                        _mm256_loadu_si256(at as *const __m256i)
                    };
                    wabs[j] = if SIGNED {
                        _mm256_abs_epi8(wv[j])
                    } else {
                        wv[j]
                    };
                    ws[j] = if HALVES {
                        let s = wsc[j].add(2 * b);
                        _mm256_set_m128(_mm_broadcast_ss(&*s.add(1)), _mm_broadcast_ss(&*s))
                    } else {
                        _mm256_broadcast_ss(&*wsc[j].add(b))
                    };
                }
                for i in 0..R {
                    let av = _mm256_loadu_si256(aq[i].add(b * BLOCK) as *const __m256i);
                    let ad = _mm256_broadcast_ss(&*asc[i].add(b));
                    for j in 0..C {
                        let signed_a = if SIGNED {
                            _mm256_sign_epi8(av, wv[j])
                        } else {
                            av
                        };
                        let quads =
                            _mm256_madd_epi16(_mm256_maddubs_epi16(wabs[j], signed_a), ones);
                        let scale = _mm256_mul_ps(ad, ws[j]);
                        acc[i][j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(quads), scale, acc[i][j]);
                    }
                }
            }
        }
        for i in 0..R {
            for j in 0..C {
                let mut lanes = [0f32; 8];
                // SAFETY: `lanes` holds eight f32.
                unsafe { _mm256_storeu_ps(lanes.as_mut_ptr(), acc[i][j]) };
                let (r, c) = (r0 + i, c0 + j);
                let mut v = reduce_lanes(&lanes);
                if w.kind.affine {
                    let (offsets, sums) = (
                        &w.offsets[c * blocks..(c + 1) * blocks],
                        &a.sums[r * blocks..(r + 1) * blocks],
                    );
                    let whole = blocks / 8 * 8;
                    let mut acc = _mm256_setzero_ps();
                    for b in (0..whole).step_by(8) {
                        // SAFETY: b + 8 <= whole <= len of both.
                        unsafe {
                            acc = _mm256_fmadd_ps(
                                _mm256_loadu_ps(offsets.as_ptr().add(b)),
                                _mm256_loadu_ps(sums.as_ptr().add(b)),
                                acc,
                            );
                        }
                    }
                    // SAFETY: `lanes` holds eight f32.
                    unsafe { _mm256_storeu_ps(lanes.as_mut_ptr(), acc) };
                    v += offset_term(offsets, sums, lanes, whole);
                }
                // SAFETY: (r, c) is in the pass and owned by this tile.
                unsafe { out.write(r, c, v) };
            }
        }
    }

    /// Columns `c0..c0 + C` for every row of the pass, `ROWS` rows at a time.
    ///
    /// SAFETY: as [`tile`].
    #[target_feature(enable = "avx2,fma")]
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
        let mut r = 0;
        unsafe {
            while r + ROWS <= a.rows {
                tile::<ROWS, C, SIGNED, HALVES, NIBBLES>(w, a, r, c0, out);
                r += ROWS;
            }
            match a.rows - r {
                0 => {}
                1 => tile::<1, C, SIGNED, HALVES, NIBBLES>(w, a, r, c0, out),
                2 => tile::<2, C, SIGNED, HALVES, NIBBLES>(w, a, r, c0, out),
                3 => tile::<3, C, SIGNED, HALVES, NIBBLES>(w, a, r, c0, out),
                _ => unreachable!("fewer than ROWS rows remain"),
            }
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
    match simd {
        #[cfg(target_arch = "x86_64")]
        Simd::Avx2 => {
            macro_rules! go {
                ($c:literal) => {
                    // SAFETY: Avx2 is only chosen when the CPU has AVX2 and FMA; the
                    // caller passes columns inside `w` and rows inside `a`.
                    unsafe {
                        let k = w.kind;
                        match (k.signed, k.halves, k.nibbles) {
                            (true, false, false) => {
                                avx2::columns::<$c, true, false, false>(w, a, c0, out)
                            }
                            (true, true, false) => {
                                avx2::columns::<$c, true, true, false>(w, a, c0, out)
                            }
                            (false, false, false) => {
                                avx2::columns::<$c, false, false, false>(w, a, c0, out)
                            }
                            (true, false, true) => {
                                avx2::columns::<$c, true, false, true>(w, a, c0, out)
                            }
                            (false, false, true) => {
                                avx2::columns::<$c, false, false, true>(w, a, c0, out)
                            }
                            _ => unreachable!("no format has halves with nibbles or unsigned"),
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
        _ => tile_portable(w, a, 0..a.rows, c0..c0 + width, out),
    }
}

/// `out[r][c0 + c] = x[r] · w[c]` for every part of a fused projection: `parts` share
/// their inputs, and their outputs lie side by side in `out` (`rows × Σ n`).
/// Columns are spread over candle's CPU thread pool (`CANDLE_NUM_THREADS`).
pub fn matmul(simd: Simd, parts: &[PackedMatrix], a: &QuantizedRows, out: &mut [f32]) {
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

    use crate::verify::kernels::test_values as values;

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
        let (n, k, rows) = (5, 512, 3);
        let x = values(rows * k, 99, 2.0);
        for dtype in FORMATS {
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
        let (n, k) = (7, 256);
        for dtype in FORMATS {
            let w = packed(dtype, n, k);
            let many = values(13 * k, 5, 3.0);
            let together = run(Simd::detect(), &w, &many, 13);
            for r in 0..13 {
                let alone = run(Simd::detect(), &w, &many[r * k..(r + 1) * k], 1);
                let same = alone
                    .iter()
                    .zip(&together[r * n..(r + 1) * n])
                    .all(|(a, b)| a.to_bits() == b.to_bits());
                assert!(same, "{dtype:?}: row {r} differs alone and among 13 rows");
            }
        }
    }

    #[test]
    fn the_simd_and_portable_paths_agree_bit_for_bit() {
        if Simd::detect() == Simd::Portable {
            return; // Nothing to compare on this CPU; the other tests cover the portable path.
        }
        let (n, k, rows) = (9, 512, 6);
        let x = values(rows * k, 11, 4.0);
        for dtype in FORMATS {
            let w = packed(dtype, n, k);
            let fast = run(Simd::detect(), &w, &x, rows);
            let slow = run(Simd::Portable, &w, &x, rows);
            assert!(
                fast.iter()
                    .zip(&slow)
                    .all(|(a, b)| a.to_bits() == b.to_bits()),
                "{dtype:?}: AVX2 and portable differ"
            );
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
