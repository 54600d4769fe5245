//! The dense matmul for bf16 weights: bf16 × bf16 products summed in f32, the arithmetic
//! of AVX-512 BF16's `vdpbf16ps`, which does twice the multiply-adds of an f32 FMA per
//! instruction. Prefill is bound by multiply-adds, not by memory, so this is what lets a
//! bf16 model prefill as fast as llama.cpp's (which rounds activations to bf16 for bf16
//! weights the same way).
//!
//! The contract, the same on every path and for every number of rows:
//! - each input row is rounded to bf16 once per pass, to nearest, ties to even, a
//!   subnormal to a zero of its sign ([`round_rows`]); the weights' subnormals are zeros
//!   too ([`flush_subnormals`], at load);
//! - `k` is taken in steps of 32; lane `l` of 16 takes elements `2l` and `2l + 1` of
//!   each step, adding first the odd one's product, then the even one's, each with one
//!   rounding (a product of two bf16 is exact in f32, so this is a fused multiply-add);
//! - the 16 lanes are folded to 8 (`l` + `l + 8`), then summed in [`super::reduce_lanes`]'s
//!   order.
//!
//! That is `vdpbf16ps` lane for lane (checked on an AMD Zen 4: 3.2 million random lanes,
//! no bit differs), so the AVX2 and portable paths, which do it with FMAs, give its bits.
//! One exception: the instruction flushes a subnormal partial sum (below 1.18 · 10⁻³⁸) to
//! zero and FMAs keep it. A machine runs one path for every pass, so a token's logits
//! are still the same bits alone and in a draft; two machines agree unless a partial sum
//! falls that low.

use super::super::{Out, Simd, reduce_lanes};
use super::DenseMatrix;
#[cfg(target_arch = "x86_64")]
use super::prefetch_next;
#[cfg(target_arch = "x86_64")]
use crate::model::kernels::reduce_lanes_m256;

/// Elements per step: one 512-bit register of bf16, 16 lanes of pairs.
const STEP: usize = 32;

/// Columns per work item in a pass of many rows, and per AVX-512 tile: 4 rows × 4
/// columns of accumulators, 4 weight registers and one input register (21 of 32). With
/// 4 × 6, as the f32 kernel's, the compiler kept a third of the accumulators on the stack.
pub(super) const TILE_COLUMNS: usize = 4;

/// `v` rounded to bf16: to nearest, ties to even; a subnormal becomes a zero of its sign
/// (as `vdpbf16ps` reads one); a NaN stays a (quiet) NaN.
#[inline(always)]
pub(super) fn to_bf16(v: f32) -> u16 {
    let bits = v.to_bits();
    if v.is_nan() {
        return ((bits >> 16) | 0x40) as u16;
    }
    if bits & 0x7f80_0000 == 0 {
        return ((bits >> 16) & 0x8000) as u16;
    }
    ((bits + 0x7fff + ((bits >> 16) & 1)) >> 16) as u16
}

/// `x`'s values rounded to bf16 ([`to_bf16`]), into `rounded`, whose old contents go.
pub(super) fn round_rows(x: &[f32], rounded: &mut Vec<u16>) {
    rounded.clear();
    rounded.extend(x.iter().map(|&v| to_bf16(v)));
}

/// Subnormal bf16 weights made zeros of their sign, as `vdpbf16ps` reads them, so that
/// every path multiplies by the same values.
pub(super) fn flush_subnormals(bits: &mut [u16]) {
    for b in bits {
        if *b & 0x7f80 == 0 {
            *b &= 0x8000;
        }
    }
}

/// A bf16's value.
#[inline(always)]
fn widen(bits: u16) -> f32 {
    f32::from_bits((bits as u32) << 16)
}

/// One element on the portable path: the contract, lane by lane. Any `k`; an odd last
/// element has no partner.
fn element_portable(w: &DenseMatrix, c: usize, x: &[u16]) -> f32 {
    let k = w.k;
    let mut acc = [0f32; 16];
    for i in (0..k).step_by(2) {
        let lane = (i % STEP) / 2;
        if i + 1 < k {
            acc[lane] = w.weight(c * k + i + 1).mul_add(widen(x[i + 1]), acc[lane]);
        }
        acc[lane] = w.weight(c * k + i).mul_add(widen(x[i]), acc[lane]);
    }
    reduce_lanes(&std::array::from_fn(|l| acc[l] + acc[l + 8]))
}

/// Which code a pass runs: chosen once per pass from the CPU's path and `k`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Path {
    /// Plain Rust (and any `k` that is not a multiple of 32).
    Portable,
    /// The pairs split into odd and even f32 halves, two FMAs each, 8 lanes a register.
    Avx2,
    /// The same in 512-bit registers, all 16 lanes in one (AVX-512F without BF16: Intel
    /// Xeon from Skylake to Ice Lake).
    Avx512F,
    /// `vdpbf16ps`.
    Avx512Bf16,
}

impl Path {
    /// The path for a matrix of `k` inputs on `simd`.
    pub(super) fn of(simd: Simd, k: usize) -> Path {
        if !simd.has_avx2_fma() || !k.is_multiple_of(STEP) {
            Path::Portable
        } else if simd.has_avx512bf16() {
            Path::Avx512Bf16
        } else if simd.has_avx512f() {
            Path::Avx512F
        } else {
            Path::Avx2
        }
    }
}

/// Columns `c0..c0 + cols` in runs of at most [`TILE_COLUMNS`] (a group of the f32
/// kernels' six, in a pass that mixes formats, is two): `run(c, count)` for each.
#[cfg(target_arch = "x86_64")]
fn in_tiles(c0: usize, cols: usize, mut run: impl FnMut(usize, usize)) {
    let mut c = c0;
    while c < c0 + cols {
        let count = (c0 + cols - c).min(TILE_COLUMNS);
        run(c, count);
        c += count;
    }
}

/// Columns `c0..c0 + cols` (at most [`super::PAIRED_COLUMNS`]) of `w` for all `rows` of
/// `x`, the rows rounded to bf16 ([`round_rows`]), on `path`.
///
/// SAFETY: `path` is [`Path::of`] this CPU's available `Simd` and `w`'s `k`; `w` is bf16;
/// the columns exist; `x` holds `rows × k` values; rows `0..rows` and the columns are the
/// caller's alone in `out`.
pub(super) unsafe fn columns(
    path: Path,
    w: &DenseMatrix,
    x: &[u16],
    rows: usize,
    c0: usize,
    cols: usize,
    out: Out,
) {
    assert!(w.is_bf16() && c0 + cols <= w.n && x.len() == rows * w.k);
    match path {
        #[cfg(target_arch = "x86_64")]
        Path::Avx512Bf16 | Path::Avx512F => unsafe {
            prefetch_next(w, c0, cols);
            let instruction = path == Path::Avx512Bf16;
            in_tiles(c0, cols, |c, count| match count {
                1 => avx512::columns::<1>(instruction, w, x, rows, c, out),
                2 => avx512::columns::<2>(instruction, w, x, rows, c, out),
                3 => avx512::columns::<3>(instruction, w, x, rows, c, out),
                4 => avx512::columns::<4>(instruction, w, x, rows, c, out),
                _ => unreachable!("at most {TILE_COLUMNS} columns"),
            });
        },
        #[cfg(target_arch = "x86_64")]
        Path::Avx2 => unsafe {
            prefetch_next(w, c0, cols);
            for c in c0..c0 + cols {
                avx2::column(w, x, rows, c, out);
            }
        },
        _ => {
            for r in 0..rows {
                for c in c0..c0 + cols {
                    let v = element_portable(w, c, &x[r * w.k..][..w.k]);
                    // SAFETY: (r, c) is inside the output and the caller's alone.
                    unsafe { out.write(r, c, v) };
                }
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use super::*;
    use std::arch::x86_64::*;

    /// `R` rows from `r0` × column `c`: each 16 bf16 of a step are 8 lanes' pairs, the
    /// odd element of a pair the upper half of its 32 bits (an f32 once the lower half
    /// is masked off), the even one the lower half (an f32 once shifted up).
    ///
    /// SAFETY: AVX2 and FMA are present; `k` is a multiple of 32; the tile lies inside
    /// `w`, `x` and the output.
    #[target_feature(enable = "avx2,fma")]
    unsafe fn tile<const R: usize>(w: &DenseMatrix, x: &[u16], r0: usize, c: usize, out: Out) {
        let k = w.k;
        let (weights, len) = w.raw();
        assert!(k.is_multiple_of(STEP) && (c + 1) * k <= len && (r0 + R) * k <= x.len());
        let high = _mm256_set1_epi32(0xffff_0000_u32 as i32);
        let split = |v: __m256i| {
            (
                _mm256_castsi256_ps(_mm256_and_si256(v, high)),
                _mm256_castsi256_ps(_mm256_slli_epi32::<16>(v)),
            )
        };
        let mut acc = [[_mm256_setzero_ps(); 2]; R];
        let weights = weights.cast::<u16>();
        for i in (0..k).step_by(STEP) {
            for half in 0..2 {
                let at = i + 16 * half;
                // SAFETY: the assert above keeps every load inside its slice.
                unsafe {
                    let (w_odd, w_even) = split(_mm256_loadu_si256(weights.add(c * k + at).cast()));
                    for (r, acc) in acc.iter_mut().enumerate() {
                        let (x_odd, x_even) =
                            split(_mm256_loadu_si256(x.as_ptr().add((r0 + r) * k + at).cast()));
                        acc[half] = _mm256_fmadd_ps(w_odd, x_odd, acc[half]);
                        acc[half] = _mm256_fmadd_ps(w_even, x_even, acc[half]);
                    }
                }
            }
        }
        for (r, acc) in acc.iter().enumerate() {
            // SAFETY: (r0 + r, c) is this tile's.
            unsafe { out.write(r0 + r, c, reduce_lanes_m256!(_mm256_add_ps(acc[0], acc[1]))) };
        }
    }

    /// Column `c` for all `rows`, four at a time.
    ///
    /// SAFETY: as [`tile`].
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn column(w: &DenseMatrix, x: &[u16], rows: usize, c: usize, out: Out) {
        let mut r = 0;
        unsafe {
            while r + 4 <= rows {
                tile::<4>(w, x, r, c, out);
                r += 4;
            }
            match rows - r {
                0 => {}
                1 => tile::<1>(w, x, r, c, out),
                2 => tile::<2>(w, x, r, c, out),
                3 => tile::<3>(w, x, r, c, out),
                _ => unreachable!("fewer than four rows remain"),
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use super::*;
    use std::arch::x86_64::*;

    /// 32 bf16 from `at`.
    ///
    /// SAFETY: AVX-512F; 32 values from `at` are readable.
    #[inline(always)]
    unsafe fn load(at: *const u16) -> __m512i {
        unsafe { _mm512_loadu_si512(at.cast()) }
    }

    /// `acc + Σ a · b` over each lane's pair, odd element first: with `INSTRUCTION`
    /// `vdpbf16ps`, otherwise its two FMAs on the pairs' odd halves (masked) and even
    /// halves (shifted).
    ///
    /// SAFETY: AVX-512F, and AVX-512 BF16 with `INSTRUCTION`.
    #[inline(always)]
    unsafe fn pairs<const INSTRUCTION: bool>(acc: __m512, a: __m512i, b: __m512i) -> __m512 {
        unsafe {
            if INSTRUCTION {
                // SAFETY: a `__m512i` and a `__m512bh` are the same 64 bytes.
                let (a, b) = (
                    std::mem::transmute::<__m512i, __m512bh>(a),
                    std::mem::transmute::<__m512i, __m512bh>(b),
                );
                _mm512_dpbf16_ps(acc, a, b)
            } else {
                let high = _mm512_set1_epi32(0xffff_0000_u32 as i32);
                let odd = |v| _mm512_castsi512_ps(_mm512_and_si512(v, high));
                let even = |v| _mm512_castsi512_ps(_mm512_slli_epi32::<16>(v));
                let acc = _mm512_fmadd_ps(odd(a), odd(b), acc);
                _mm512_fmadd_ps(even(a), even(b), acc)
            }
        }
    }

    /// `R` rows from `r0` × `C` columns from `c0`, one step of 32 at a time; inlined into
    /// [`columns_bf16`] or [`columns_fma`], which give it their target features.
    ///
    /// SAFETY: AVX-512F, and AVX-512 BF16 with `INSTRUCTION`; `k` is a multiple of 32;
    /// the tile lies inside `w`, `x` and the output.
    #[inline(always)]
    unsafe fn tile<const R: usize, const C: usize, const INSTRUCTION: bool>(
        w: &DenseMatrix,
        x: &[u16],
        r0: usize,
        c0: usize,
        out: Out,
    ) {
        let k = w.k;
        let (weights, len) = w.raw();
        assert!(k.is_multiple_of(STEP) && (c0 + C) * k <= len && (r0 + R) * k <= x.len());
        let weights = weights.cast::<u16>();
        // SAFETY: the caller's target features are the intrinsics' (this function is
        // inlined into theirs); the assert above keeps every load inside its slice, and
        // (r0 + r, c0 + j) is this tile's to write.
        unsafe {
            let mut acc = [[_mm512_setzero_ps(); C]; R];
            for i in (0..k).step_by(STEP) {
                let wv: [__m512i; C] = std::array::from_fn(|j| load(weights.add((c0 + j) * k + i)));
                for (r, acc) in acc.iter_mut().enumerate() {
                    let xv = load(x.as_ptr().add((r0 + r) * k + i));
                    for j in 0..C {
                        acc[j] = pairs::<INSTRUCTION>(acc[j], xv, wv[j]);
                    }
                }
            }
            for (r, acc) in acc.iter().enumerate() {
                for (j, &acc) in acc.iter().enumerate() {
                    // Lanes l and l + 8 are the two 256-bit halves.
                    let low = _mm512_castps512_ps256(acc);
                    let high = _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(acc)));
                    out.write(r0 + r, c0 + j, reduce_lanes_m256!(_mm256_add_ps(low, high)));
                }
            }
        }
    }

    /// Columns `c0..c0 + C` for all `rows`: by `vdpbf16ps` with `instruction`
    /// ([`columns_bf16`]), by FMAs without ([`columns_fma`]).
    ///
    /// SAFETY: as [`columns_bf16`]; AVX-512 BF16 only with `instruction`.
    pub(super) unsafe fn columns<const C: usize>(
        instruction: bool,
        w: &DenseMatrix,
        x: &[u16],
        rows: usize,
        c0: usize,
        out: Out,
    ) {
        unsafe {
            if instruction {
                columns_bf16::<C>(w, x, rows, c0, out)
            } else {
                columns_fma::<C>(w, x, rows, c0, out)
            }
        }
    }

    /// Columns `c0..c0 + C` for all `rows`, four at a time, by `vdpbf16ps`.
    ///
    /// SAFETY: AVX-512F and AVX-512 BF16 are present; `k` is a multiple of 32; the
    /// columns and rows lie inside `w`, `x` and the output.
    #[target_feature(enable = "avx512f,avx512bf16,avx2,fma")]
    unsafe fn columns_bf16<const C: usize>(
        w: &DenseMatrix,
        x: &[u16],
        rows: usize,
        c0: usize,
        out: Out,
    ) {
        unsafe { row_tiles::<C, true>(w, x, rows, c0, out) }
    }

    /// As [`columns_bf16`], by FMAs: the CPU needs AVX-512F only.
    ///
    /// SAFETY: AVX-512F is present; as [`columns_bf16`] otherwise.
    #[target_feature(enable = "avx512f,avx2,fma")]
    unsafe fn columns_fma<const C: usize>(
        w: &DenseMatrix,
        x: &[u16],
        rows: usize,
        c0: usize,
        out: Out,
    ) {
        unsafe { row_tiles::<C, false>(w, x, rows, c0, out) }
    }

    /// The rows of [`columns_bf16`] and [`columns_fma`] in tiles of four.
    ///
    /// SAFETY: as theirs.
    #[inline(always)]
    unsafe fn row_tiles<const C: usize, const INSTRUCTION: bool>(
        w: &DenseMatrix,
        x: &[u16],
        rows: usize,
        c0: usize,
        out: Out,
    ) {
        let mut r = 0;
        unsafe {
            while r + 4 <= rows {
                tile::<4, C, INSTRUCTION>(w, x, r, c0, out);
                r += 4;
            }
            match rows - r {
                0 => {}
                1 => tile::<1, C, INSTRUCTION>(w, x, r, c0, out),
                2 => tile::<2, C, INSTRUCTION>(w, x, r, c0, out),
                3 => tile::<3, C, INSTRUCTION>(w, x, r, c0, out),
                _ => unreachable!("fewer than four rows remain"),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::kernels::{same_bits, test_values};

    /// Every path this CPU can run gives the portable path's bits, for 1–9 rows and
    /// groups of 1–6 columns: `vdpbf16ps` and both FMA paths side by side (through
    /// `Simd`, a CPU with BF16 never takes the AVX-512F FMA path, which is for CPUs
    /// without it).
    #[test]
    fn every_path_this_cpu_runs_gives_the_portable_bits() {
        let (n, k) = (13, 128);
        let bits = test_values(n * k, 11, 1.0)
            .iter()
            .map(|&v| to_bf16(v))
            .collect();
        let w = DenseMatrix::bf16(n, k, bits);
        let x = test_values(9 * k, 12, 4.0);
        #[allow(unused_mut)]
        let mut paths = vec![Path::Portable];
        #[cfg(target_arch = "x86_64")]
        {
            use std::arch::is_x86_feature_detected as has;
            if has!("avx2") && has!("fma") {
                paths.push(Path::Avx2);
                if has!("avx512f") {
                    paths.push(Path::Avx512F);
                    if has!("avx512bf16") {
                        paths.push(Path::Avx512Bf16);
                    }
                }
            }
        }
        for rows in [1, 2, 5, 9] {
            let mut rounded = Vec::new();
            round_rows(&x[..rows * k], &mut rounded);
            let run = |path: Path, width: usize| {
                let mut out = vec![f32::NAN; rows * n];
                let shared = Out::new(&mut out, n);
                for c0 in (0..n).step_by(width) {
                    // SAFETY: the CPU has the path's features (checked above); the
                    // columns and rows exist.
                    unsafe { columns(path, &w, &rounded, rows, c0, width.min(n - c0), shared) };
                }
                out
            };
            let want = run(Path::Portable, 1);
            for &path in &paths {
                for width in [1, 2, 6] {
                    let got = run(path, width);
                    assert!(
                        same_bits(&got, &want),
                        "{path:?}, {rows} rows, {width} columns a group"
                    );
                }
            }
        }
    }

    /// Rounding: to nearest, ties to even, carries into the exponent, subnormals to
    /// signed zeros, NaN stays NaN, the largest floats round to infinity.
    #[test]
    fn rounding_to_bf16_is_to_nearest_even_with_subnormals_flushed() {
        assert_eq!(to_bf16(1.0), 0x3f80);
        // 1 + 2^-8 is halfway between 1 and 1 + 2^-7: ties to the even, 1.
        assert_eq!(to_bf16(f32::from_bits(0x3f80_8000)), 0x3f80);
        // 1 + 3 · 2^-8 is halfway between 1 + 2^-7 (odd) and 1 + 2^-6: up.
        assert_eq!(to_bf16(f32::from_bits(0x3f81_8000)), 0x3f82);
        assert_eq!(to_bf16(f32::from_bits(0x3f80_8001)), 0x3f81);
        assert_eq!(to_bf16(f32::from_bits(0x3fff_ffff)), 0x4000);
        assert_eq!(to_bf16(-1e-39), 0x8000);
        assert_eq!(to_bf16(1e-39), 0x0000);
        assert_eq!(to_bf16(f32::MAX), 0x7f80);
        assert!(widen(to_bf16(f32::NAN)).is_nan());
        assert_eq!(to_bf16(f32::NEG_INFINITY), 0xff80);
        let mut weights = [0x0001, 0x8040, 0x0080, 0x3f80];
        flush_subnormals(&mut weights);
        assert_eq!(weights, [0x0000, 0x8000, 0x0080, 0x3f80]);
    }
}
