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

/// Which instruction set the kernels use. Chosen once per process: the best this CPU
/// has, unless `SUFFIXD_SIMD` names a lower one (`portable`, `avx2`, `avx512vnni`,
/// `avxvnni`), which is how the paths are compared on one machine.
///
/// Every path computes the same exact integer dot products and the same IEEE float
/// operations in the same order, so all of them give the same bits (tested): a machine
/// with VNNI and one without agree, as a 1-row and a 64-row pass do.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(into = "&'static str")]
pub enum Simd {
    /// x86-64 AVX2 and FMA.
    Avx2,
    /// AVX2 and FMA, with the integer dot products by AVX-512 VNNI's 256-bit `vpdpbusd`
    /// (AVX512_VNNI and AVX512VL: Intel Xeon since Ice Lake, AMD since Zen 4).
    Avx512Vnni,
    /// AVX2 and FMA, with the integer dot products by AVX-VNNI's `vpdpbusd` (Intel
    /// since Alder Lake, AMD since Zen 5).
    AvxVnni,
    /// Plain Rust: the same arithmetic, one lane at a time.
    Portable,
}

impl Simd {
    /// What the kernels use: the best this CPU supports, or `SUFFIXD_SIMD`'s choice when
    /// the CPU has it (otherwise the best, with a warning).
    pub fn detect() -> Simd {
        static DETECTED: std::sync::OnceLock<Simd> = std::sync::OnceLock::new();
        *DETECTED.get_or_init(|| {
            let available = Simd::available();
            let Ok(wanted) = std::env::var("SUFFIXD_SIMD") else {
                return available[0];
            };
            match available.iter().find(|s| s.name() == wanted) {
                Some(&chosen) => chosen,
                None => {
                    tracing::warn!(
                        "SUFFIXD_SIMD={wanted} is not available on this CPU (it has {}); using {}",
                        available
                            .iter()
                            .map(|s| s.name())
                            .collect::<Vec<_>>()
                            .join(", "),
                        available[0].name()
                    );
                    available[0]
                }
            }
        })
    }

    /// Every path this CPU can run, best first; the last is always `Portable`.
    pub fn available() -> &'static [Simd] {
        static AVAILABLE: std::sync::OnceLock<Vec<Simd>> = std::sync::OnceLock::new();
        AVAILABLE.get_or_init(Simd::probe)
    }

    /// Whether this CPU can run the path. The kernels refuse one it cannot (a panic, not
    /// an illegal instruction).
    pub fn is_available(self) -> bool {
        Simd::available().contains(&self)
    }

    fn probe() -> Vec<Simd> {
        #[allow(unused_mut)]
        let mut paths = Vec::new();
        #[cfg(target_arch = "x86_64")]
        {
            if std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma") {
                if std::is_x86_feature_detected!("avx512vnni")
                    && std::is_x86_feature_detected!("avx512vl")
                {
                    paths.push(Simd::Avx512Vnni);
                }
                if std::is_x86_feature_detected!("avxvnni") {
                    paths.push(Simd::AvxVnni);
                }
                paths.push(Simd::Avx2);
            }
        }
        paths.push(Simd::Portable);
        paths
    }

    /// The name `SUFFIXD_SIMD` takes.
    pub fn name(self) -> &'static str {
        match self {
            Simd::Avx2 => "avx2",
            Simd::Avx512Vnni => "avx512vnni",
            Simd::AvxVnni => "avxvnni",
            Simd::Portable => "portable",
        }
    }

    /// Whether this is an x86 path, all of which have AVX2 and FMA: the float kernels,
    /// which need nothing more, then use their AVX2 code. Only for an available path.
    pub fn has_avx2_fma(self) -> bool {
        cfg!(target_arch = "x86_64") && self != Simd::Portable
    }
}

/// Serialized by its [`Simd::name`].
impl From<Simd> for &'static str {
    fn from(simd: Simd) -> Self {
        simd.name()
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

/// The x86 tiles, written once and compiled per instruction set. Each set supplies the
/// block's exact integer dot product in eight i32 lanes, lane `l` holding
/// `Σ_{e<4} w[4l + e] · a[4l + e]`, through three steps:
/// - `column(w, signed)`: a column's 32 weights made into the operand the dot takes,
///   once per column and block;
/// - `row(a, signed)`: the accumulator a row's dots start from, once per row and block;
/// - `dot(start, operand, w, a, signed)`: the lanes, once per (row, column) and block.
///
/// Whatever the set, the lanes are the same integers, and everything after them (convert,
/// scale, accumulate, reduce) is the same float code, so every set gives the same bits.
#[cfg(target_arch = "x86_64")]
macro_rules! x86_tiles {
    (
        $(#[$doc:meta])*
        $module:ident, $features:literal,
        column: |$cw:ident, $cs:ident| $column:expr,
        row: |$ra:ident, $rs:ident| $row:expr,
        dot: |$dstart:ident, $dop:ident, $dw:ident, $da:ident, $ds:ident| $dot:expr $(,)?
    ) => {
        $(#[$doc])*
        mod $module {
            use super::*;
            use std::arch::x86_64::*;

            /// `R` rows × `C` columns, starting at `(r0, c0)`.
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
                let per = if HALVES { 2 } else { 1 };
                assert!(
                    r0 + R <= a.rows && c0 + C <= w.n,
                    "the tile is inside the pass"
                );
                let column = w.column_bytes();
                let block_bytes = if NIBBLES { BLOCK / 2 } else { BLOCK };
                assert!(w.quants.len() >= w.n * column && a.quants.len() >= a.rows * a.k);
                assert!(
                    w.scales.len() >= w.n * blocks * per && a.scales.len() >= a.rows * blocks
                );
                let mut acc = [[_mm256_setzero_ps(); C]; R];
                // SAFETY (every pointer below): the asserts above put columns c0..c0 + C
                // and rows r0..r0 + R, with all their blocks and scales, inside the slices.
                let wq: [*const u8; C] =
                    std::array::from_fn(|j| unsafe { w.quants.as_ptr().add((c0 + j) * column) });
                let wsc: [*const f32; C] = std::array::from_fn(|j| unsafe {
                    w.scales.as_ptr().add((c0 + j) * blocks * per)
                });
                let aq: [*const i8; R] =
                    std::array::from_fn(|i| unsafe { a.quants.as_ptr().add((r0 + i) * a.k) });
                let asc: [*const f32; R] =
                    std::array::from_fn(|i| unsafe { a.scales.as_ptr().add((r0 + i) * blocks) });
                for b in 0..blocks {
                    unsafe {
                        let mut wv = [_mm256_setzero_si256(); C];
                        let mut wop = [_mm256_setzero_si256(); C];
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
                            wop[j] = {
                                let ($cw, $cs) = (wv[j], SIGNED);
                                $column
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
                            let start = {
                                let ($ra, $rs) = (av, SIGNED);
                                $row
                            };
                            for j in 0..C {
                                let quads = {
                                    let ($dstart, $dop, $dw, $da, $ds) =
                                        (start, wop[j], wv[j], av, SIGNED);
                                    $dot
                                };
                                let scale = _mm256_mul_ps(ad, ws[j]);
                                acc[i][j] =
                                    _mm256_fmadd_ps(_mm256_cvtepi32_ps(quads), scale, acc[i][j]);
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

#[cfg(target_arch = "x86_64")]
x86_tiles! {
    /// AVX2: `maddubs` multiplies unsigned by signed bytes, so a signed weight's sign
    /// moves onto the activation (`sign`) and its magnitude is the unsigned operand;
    /// `madd` with ones then sums the pairs into fours. Pairs stay exact: at most
    /// 2 · 128 · 127 < 2^15.
    avx2, "avx2,fma",
    column: |w, signed| if signed { _mm256_abs_epi8(w) } else { w },
    row: |_a, _signed| _mm256_setzero_si256(),
    dot: |_start, operand, w, a, signed| {
        let a = if signed { _mm256_sign_epi8(a, w) } else { a };
        _mm256_madd_epi16(_mm256_maddubs_epi16(operand, a), _mm256_set1_epi16(1))
    },
}

/// The VNNI dot: `vpdpbusd` sums four unsigned-by-signed byte products into each i32
/// lane in one instruction. A signed weight `w` is made unsigned as `w + 128` (flip the
/// top bit), and the row's start takes the `128 · Σ a` it adds back out first, so the
/// lanes are exactly `Σ w · a`.
#[cfg(target_arch = "x86_64")]
macro_rules! vnni_tiles {
    ($(#[$doc:meta])* $module:ident, $features:literal, $dpbusd:ident) => {
        x86_tiles! {
            $(#[$doc])*
            $module, $features,
            column: |w, signed| {
                if signed { _mm256_xor_si256(w, _mm256_set1_epi8(-128)) } else { w }
            },
            row: |a, signed| {
                let zero = _mm256_setzero_si256();
                if signed {
                    _mm256_sub_epi32(zero, $dpbusd(zero, _mm256_set1_epi8(-128), a))
                } else {
                    zero
                }
            },
            dot: |start, operand, _w, a, _signed| $dpbusd(start, operand, a),
        }
    };
}

#[cfg(target_arch = "x86_64")]
vnni_tiles! {
    /// AVX-512 VNNI's 256-bit `vpdpbusd` (it needs AVX512VL for that width).
    avx512vnni, "avx2,fma,avx512vnni,avx512vl", _mm256_dpbusd_epi32
}

#[cfg(target_arch = "x86_64")]
vnni_tiles! {
    /// AVX-VNNI's `vpdpbusd`, the VEX-encoded twin for CPUs without AVX-512.
    avxvnni, "avx2,fma,avxvnni", _mm256_dpbusd_avx_epi32
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
        for (dtype, &simd) in FORMATS
            .iter()
            .flat_map(|d| Simd::available().iter().map(move |s| (*d, s)))
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
        // Uneven row and column counts reach every tile shape (1-4 rows, 1-2 columns).
        let (n, k, rows) = (9, 512, 7);
        let x = values(rows * k, 11, 4.0);
        for dtype in FORMATS {
            let w = packed(dtype, n, k);
            let slow = run(Simd::Portable, &w, &x, rows);
            for &simd in Simd::available() {
                let fast = run(simd, &w, &x, rows);
                assert!(
                    fast.iter()
                        .zip(&slow)
                        .all(|(a, b)| a.to_bits() == b.to_bits()),
                    "{dtype:?}: {simd:?} and portable differ"
                );
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
