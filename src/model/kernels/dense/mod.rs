//! The row-invariant dense matmul, for f32 and bf16 weights (`--weights f32`, `--weights
//! bf16`, and unquantized files): `out[r][c] = Σ_k x[r][k] · w[c][k]`, each element
//! summed by the same operations in the same order whatever the number of rows, the tile
//! or the thread. The weights stay in place (two columns at a time through every row,
//! as in [`super::matmul`]; one at a time when decoding, so that each thread reads one
//! sequential stream: `FEW_ROWS_COLUMNS`, `FEW_ROWS_ITEM_COLUMNS`).
//!
//! f32 weights: each element summed in eight lanes of fused multiply-adds over k in order,
//! then reduced in a fixed order. Passes of many rows (prefill) on a CPU with AVX-512
//! take a second path: two rows' eight lanes side by side in one 512-bit register, so
//! each multiply-add does the AVX2 path's arithmetic for two elements at once, and a tile
//! of 8 rows × 6 columns reads each row of the input once per six columns instead of once
//! per two. The lanes, their order and the reduction are the AVX2 path's, so the bits are
//! too.
//!
//! bf16 weights stay bf16 in memory, half the bytes a decoding step reads, and meet
//! inputs rounded to bf16: [`bf16`] (AVX-512 BF16's arithmetic, on every path).

use super::hugepages::HugeSlice;
#[cfg(target_arch = "x86_64")]
use super::reduce_lanes_m256;
use std::mem::MaybeUninit;

use super::{FEW_ROWS_ITEM_COLUMNS, Out, Simd, as_uninit, for_each_column_group, reduce_lanes};

mod bf16;

/// A dense weight matrix `(n outputs, k inputs)`, each column's weights contiguous.
#[derive(Clone, Debug)]
pub struct DenseMatrix {
    n: usize,
    k: usize,
    weights: DenseWeights,
}

/// How a [`DenseMatrix`] holds its weights.
#[derive(Clone, Debug)]
enum DenseWeights {
    F32(HugeSlice<f32>),
    /// Each weight's bf16 bits: the upper 16 bits of its f32.
    Bf16(HugeSlice<u16>),
}

impl DenseMatrix {
    /// A matrix from its `n × k` weights, row-major (one output per row, as GGUF and
    /// safetensors store them).
    pub fn new(n: usize, k: usize, weights: Vec<f32>) -> Self {
        assert_eq!(weights.len(), n * k, "weights are n × k");
        // Read at every step: into huge pages (see `hugepages`).
        DenseMatrix {
            n,
            k,
            weights: DenseWeights::F32(weights.into()),
        }
    }

    /// A matrix from its `n × k` weights' bf16 bits, row-major. Subnormal weights (below
    /// 1.18 · 10⁻³⁸) become zeros: AVX-512 BF16 reads them so, and every path multiplies
    /// by the same values.
    pub fn bf16(n: usize, k: usize, mut bits: Vec<u16>) -> Self {
        assert_eq!(bits.len(), n * k, "weights are n × k");
        bf16::flush_subnormals(&mut bits);
        DenseMatrix {
            n,
            k,
            weights: DenseWeights::Bf16(bits.into()),
        }
    }

    /// Output features.
    pub fn outputs(&self) -> usize {
        self.n
    }

    /// Input features.
    pub fn inputs(&self) -> usize {
        self.k
    }

    /// True when the weights are held as bf16.
    pub fn is_bf16(&self) -> bool {
        matches!(self.weights, DenseWeights::Bf16(_))
    }

    /// Weight `index` (row-major), as the kernels multiply by it.
    fn weight(&self, index: usize) -> f32 {
        match &self.weights {
            DenseWeights::F32(w) => w[index],
            DenseWeights::Bf16(w) => f32::from_bits((w[index] as u32) << 16),
        }
    }

    /// The first weight's address, and the number of weights.
    #[cfg(target_arch = "x86_64")]
    fn raw(&self) -> (*const u8, usize) {
        match &self.weights {
            DenseWeights::F32(w) => (w.as_ptr().cast(), w.len()),
            DenseWeights::Bf16(w) => (w.as_ptr().cast(), w.len()),
        }
    }
}

/// One element on the portable path: the AVX2 path's operations, lane by lane.
fn element_portable(w: &DenseMatrix, c: usize, x: &[f32]) -> f32 {
    let mut acc = [0f32; 8];
    for (i, &x) in x.iter().enumerate() {
        acc[i % 8] = w.weight(c * w.k + i).mul_add(x, acc[i % 8]);
    }
    reduce_lanes(&acc)
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use super::*;
    use std::arch::x86_64::*;

    /// `R` rows × `C` columns from `(r0, c0)` of an f32 matrix; `k` is a multiple of 8.
    ///
    /// SAFETY: AVX2 and FMA are present; the tile lies inside `w`, `x` and the output.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn tile<const R: usize, const C: usize>(
        w: &DenseMatrix,
        x: &[f32],
        r0: usize,
        c0: usize,
        out: Out,
    ) {
        let k = w.k;
        let (weights, len) = w.raw();
        assert!(
            !w.is_bf16() && k.is_multiple_of(8) && (c0 + C) * k <= len && (r0 + R) * k <= x.len()
        );
        let mut acc = [[_mm256_setzero_ps(); C]; R];
        for i in (0..k).step_by(8) {
            // SAFETY: the assert above keeps every load inside its slice.
            unsafe {
                let wv: [__m256; C] = std::array::from_fn(|j| {
                    _mm256_loadu_ps(weights.cast::<f32>().add((c0 + j) * k + i))
                });
                for (r, acc) in acc.iter_mut().enumerate() {
                    let xv = _mm256_loadu_ps(x.as_ptr().add((r0 + r) * k + i));
                    for j in 0..C {
                        acc[j] = _mm256_fmadd_ps(wv[j], xv, acc[j]);
                    }
                }
            }
        }
        for (r, acc) in acc.iter().enumerate() {
            for (j, acc) in acc.iter().enumerate() {
                // SAFETY: (r0 + r, c0 + j) is this tile's.
                unsafe { out.write(r0 + r, c0 + j, reduce_lanes_m256!(*acc)) };
            }
        }
    }

    /// Columns `c0..c0 + C` for all `rows`, four rows at a time.
    ///
    /// SAFETY: as [`tile`].
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn columns<const C: usize>(
        w: &DenseMatrix,
        x: &[f32],
        rows: usize,
        c0: usize,
        out: Out,
    ) {
        // One column at a time is one sequential stream, which the hardware prefetcher
        // follows best alone (see FEW_ROWS_COLUMNS), on some CPUs with a little help.
        prefetch_next(w, c0, C);
        let mut r = 0;
        unsafe {
            while r + 4 <= rows {
                tile::<4, C>(w, x, r, c0, out);
                r += 4;
            }
            match rows - r {
                0 => {}
                1 => tile::<1, C>(w, x, r, c0, out),
                2 => tile::<2, C>(w, x, r, c0, out),
                3 => tile::<3, C>(w, x, r, c0, out),
                _ => unreachable!("fewer than four rows remain"),
            }
        }
    }
}

/// Many rows at once on AVX-512 ([`matmul_dense`]): the input's rows packed in pairs, and
/// tiles of up to four pairs by `C` columns, each accumulator two rows' eight lanes.
#[cfg(target_arch = "x86_64")]
mod avx512 {
    use super::*;
    use std::arch::x86_64::*;

    /// `x` (`rows × k`) with rows `2p` and `2p + 1` interleaved eight floats at a time:
    /// pair `p`'s step `i` (a multiple of 8) is the 16 floats at `p · 2k + 2i`. An odd
    /// last row is paired with zeros, whose products the tiles compute and never write:
    /// a row's lanes are its own whichever half of a register holds it, and a second pass
    /// over the weights for that row alone cost more than the wasted half (a 5-row pass
    /// of the default model's F32 file, session 63). Into `packed`, whose old contents go.
    pub(super) fn pack_row_pairs(x: &[f32], rows: usize, k: usize, packed: &mut Vec<f32>) {
        packed.clear();
        let zeros = [0.0f32; 8];
        for pair in x[..rows * k].chunks(2 * k) {
            let (a, b) = pair.split_at(k);
            for (i, a) in a.chunks_exact(8).enumerate() {
                packed.extend_from_slice(a);
                packed.extend_from_slice(b.get(8 * i..8 * i + 8).unwrap_or(&zeros));
            }
        }
    }

    /// Pairs `p0..p0 + P` × columns `c0..c0 + C` of an f32 matrix; `k` is a multiple of 8.
    /// Writes rows below `rows` only (an odd last row's partner is padding).
    ///
    /// SAFETY: AVX-512F, AVX2 and FMA are present; the tile lies inside `w`, `packed`
    /// and the output.
    #[target_feature(enable = "avx512f,avx2,fma")]
    unsafe fn tile<const P: usize, const C: usize>(
        w: &DenseMatrix,
        packed: &[f32],
        rows: usize,
        p0: usize,
        c0: usize,
        out: Out,
    ) {
        let k = w.k;
        let (weights, len) = w.raw();
        assert!(
            !w.is_bf16()
                && k.is_multiple_of(8)
                && (c0 + C) * k <= len
                && (p0 + P) * 2 * k <= packed.len()
        );
        let mut acc = [[_mm512_setzero_ps(); C]; P];
        let packed = packed.as_ptr();
        for i in (0..k).step_by(8) {
            // SAFETY: the assert above keeps every load inside its slice.
            unsafe {
                // A column's eight weights in both halves, for the pair's two rows.
                let wv: [__m512; C] = std::array::from_fn(|j| {
                    let eight = _mm256_loadu_ps(weights.cast::<f32>().add((c0 + j) * k + i));
                    _mm512_castpd_ps(_mm512_broadcast_f64x4(_mm256_castps_pd(eight)))
                });
                for (p, acc) in acc.iter_mut().enumerate() {
                    let xv = _mm512_loadu_ps(packed.add((p0 + p) * 2 * k + 2 * i));
                    for j in 0..C {
                        acc[j] = _mm512_fmadd_ps(wv[j], xv, acc[j]);
                    }
                }
            }
        }
        for (p, acc) in acc.iter().enumerate() {
            for (j, &acc) in acc.iter().enumerate() {
                let low = _mm512_castps512_ps256(acc);
                let high = _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(acc)));
                let row = 2 * (p0 + p);
                // SAFETY: rows `row`, `row + 1` (if below `rows`) and column `c0 + j`
                // are this tile's.
                unsafe {
                    out.write(row, c0 + j, reduce_lanes_m256!(low));
                    if row + 1 < rows {
                        out.write(row + 1, c0 + j, reduce_lanes_m256!(high));
                    }
                }
            }
        }
    }

    /// Columns `c0..c0 + C` for all `rows`, in pairs, four pairs at a time.
    ///
    /// SAFETY: as [`tile`].
    #[target_feature(enable = "avx512f,avx2,fma")]
    pub(super) unsafe fn columns<const C: usize>(
        w: &DenseMatrix,
        packed: &[f32],
        rows: usize,
        c0: usize,
        out: Out,
    ) {
        prefetch_columns(w, c0 + PAIRED_COLUMNS, C);
        let pairs = rows.div_ceil(2);
        let mut p = 0;
        unsafe {
            while p + 4 <= pairs {
                tile::<4, C>(w, packed, rows, p, c0, out);
                p += 4;
            }
            match pairs - p {
                0 => {}
                1 => tile::<1, C>(w, packed, rows, p, c0, out),
                2 => tile::<2, C>(w, packed, rows, p, c0, out),
                3 => tile::<3, C>(w, packed, rows, p, c0, out),
                _ => unreachable!("fewer than four pairs remain"),
            }
        }
    }
}

/// Rows from which a pass takes the AVX-512 path where [`paired_from_rows`] does not say
/// otherwise, and always for bf16 weights: fewer reuse each packed row too little to pay
/// for packing (verification's passes of a few rows stay on AVX2).
const PAIRED_FROM_ROWS: usize = 16;

/// Rows from which a pass of f32 weights takes the AVX-512 path (rows in pairs):
/// `SUFFIXD_DENSE_PAIRED_FROM=N` (at least 3: passes of one or two rows are decoding's
/// own path), else by the CPU's maker. On an Intel Xeon (Emerald Rapids, two 512-bit FMA
/// units a core) verification's passes of a few rows are bound by their multiply-adds
/// on AVX2 once the weights stream: passes of the default model's F32 file at 64
/// positions (`forward_rows`, 8 alternated pairs, the median ratio, session 63) took
/// 0.98× the time of AVX2's for 5 rows, 0.92× for 6, 0.91× for 8, 0.84× for 12, and
/// 1.02× for 4 (noise: 3 rows, the same path both ways, read 1.06×), so from 5 rows
/// there (docs/cpu-kernels.md). Elsewhere 16, as tuned on AMD Zen 4, whose 512-bit
/// multiply-adds take two passes through its 256-bit units.
#[cfg(target_arch = "x86_64")]
fn paired_from_rows() -> usize {
    static FROM: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *FROM.get_or_init(|| {
        let by_maker = if is_intel() { 5 } else { PAIRED_FROM_ROWS };
        let setting = std::env::var("SUFFIXD_DENSE_PAIRED_FROM").ok();
        number_setting("SUFFIXD_DENSE_PAIRED_FROM", setting.as_deref(), by_maker).max(3)
    })
}

#[cfg(not(target_arch = "x86_64"))]
fn paired_from_rows() -> usize {
    PAIRED_FROM_ROWS
}

/// Columns per work item on the AVX-512 path: 4 pairs × 6 columns of accumulators, 6
/// weight registers and one input register fill 31 of the 32.
const PAIRED_COLUMNS: usize = 6;

/// How many columns ahead of the ones being multiplied a thread asks for the weights.
const PREFETCH_AHEAD: usize = 4;

/// Columns multiplied at a time when a pass has one or two rows (decoding), without
/// software prefetches on AMD ([`few_rows_prefetch`]). Columns are contiguous and a
/// thread takes a run of them, so one column at a time makes its reads one sequential
/// stream, which the hardware prefetcher follows well; two columns side by side are two
/// streams a column apart, which it follows worse, with or without the prefetch hints.
/// F32 decoding of the default model, 2 threads, alternated, medians of 5: one column,
/// no hints 64.6 tok/s; one column, hints 4 ahead 59.6; two columns, no hints 48.4; two
/// columns, hints (before) 54.5. BF16 105.2 → 107.7. Four columns: F32 50.4, BF16 80.7.
const FEW_ROWS_COLUMNS: usize = 1;

/// How many columns ahead a one-column multiply (a pass of one or two rows) asks L2 for
/// the weights, if at all: `SUFFIXD_DENSE_PREFETCH=N` (0: never), else by the CPU's
/// maker. The measurements disagree by maker (2 threads, the default model, alternated,
/// medians): on AMD Zen 4 hints 4 columns ahead made F32 decoding slower (59.6 against
/// 64.6 tok/s, session 55), so none; on an Intel Xeon (Emerald Rapids) hints 2 ahead
/// made a one-row pass faster, F32 30.3 → 26.5 ms and BF16 20.7 → 14.8 ms
/// (`forward_rows`, 4 rounds, session 61): its L2 streamer stops at every 4 KiB page,
/// and a column of the default model is 1.1–6 KiB.
#[cfg(target_arch = "x86_64")]
fn few_rows_prefetch() -> Option<usize> {
    static AHEAD: std::sync::OnceLock<Option<usize>> = std::sync::OnceLock::new();
    *AHEAD.get_or_init(|| {
        let setting = std::env::var("SUFFIXD_DENSE_PREFETCH").ok();
        few_rows_prefetch_for(is_intel(), setting.as_deref())
    })
}

/// [`few_rows_prefetch`] for a CPU (`intel`) and a `SUFFIXD_DENSE_PREFETCH` setting.
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
fn few_rows_prefetch_for(intel: bool, setting: Option<&str>) -> Option<usize> {
    let by_maker = if intel { 2 } else { 0 };
    let ahead = number_setting("SUFFIXD_DENSE_PREFETCH", setting, by_maker);
    (ahead > 0).then_some(ahead)
}

/// The number an environment variable `name` holds (`setting`), else `by_maker`; a
/// setting that is not a number is warned about and left out.
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
fn number_setting(name: &str, setting: Option<&str>, by_maker: usize) -> usize {
    match setting.map(|s| s.trim().parse::<usize>()) {
        None => by_maker,
        Some(Ok(n)) => n,
        Some(Err(_)) => {
            tracing::warn!(
                "{name}={} is not a whole number; using {by_maker}",
                setting.unwrap_or_default()
            );
            by_maker
        }
    }
}

/// Whether the CPU is Intel's (its CPUID vendor string).
#[cfg(target_arch = "x86_64")]
fn is_intel() -> bool {
    let leaf = std::arch::x86_64::__cpuid(0);
    let vendor: Vec<u8> = [leaf.ebx, leaf.edx, leaf.ecx]
        .iter()
        .flat_map(|r| r.to_le_bytes())
        .collect();
    vendor == b"GenuineIntel"
}

/// Ask L2 for the columns after `c0..c0 + count` that this thread will multiply next:
/// [`PREFETCH_AHEAD`] (at least `count`) ahead for a tile of several columns; for one
/// column, [`few_rows_prefetch`]'s distance, if any.
#[cfg(target_arch = "x86_64")]
fn prefetch_next(w: &DenseMatrix, c0: usize, count: usize) {
    let ahead = if count > 1 {
        PREFETCH_AHEAD.max(count)
    } else if let Some(ahead) = few_rows_prefetch() {
        ahead
    } else {
        return;
    };
    prefetch_columns(w, c0 + ahead, count);
}

/// Ask the level-2 cache for columns `c0..c0 + count` of `w`, if they exist: the
/// hardware's stream prefetcher stops at every 4 KiB page, and a column of the default
/// model is 2.3–6 KiB, so each tile's first loads would wait on memory (as in
/// [`super::matmul`]'s quantized columns). Into L2, not L1: a burst of some 70–200
/// level-1 prefetches a column pair holds the core's level-1 miss buffers that the
/// tile's own loads need. With the level-1 hint the kernel streamed 11.6 GB/s on one
/// thread and 21.9 on two (the default model's 30 layers at 1 row, F32); with none
/// 14.2 and 26.9; with this one 19.0 and 29.1 (read bandwidth there: 26.8 and 33.8).
#[cfg(target_arch = "x86_64")]
fn prefetch_columns(w: &DenseMatrix, c0: usize, count: usize) {
    use std::arch::x86_64::_MM_HINT_T1;
    if c0 + count > w.n {
        return;
    }
    let columns = c0 * w.k..(c0 + count) * w.k;
    match &w.weights {
        DenseWeights::F32(v) => super::prefetch_lines::<_MM_HINT_T1, f32>(&v[columns]),
        DenseWeights::Bf16(v) => super::prefetch_lines::<_MM_HINT_T1, u16>(&v[columns]),
    }
}

/// `out[r][c0 + c] = x[r] · w[c]` for every part of a fused projection, outputs side by
/// side in `out` (`rows × Σ n`); `x` is `rows × k`. Threads over columns.
pub fn matmul_dense(simd: Simd, parts: &[DenseMatrix], x: &[f32], rows: usize, out: &mut [f32]) {
    matmul_dense_into(simd, parts, x, rows, as_uninit(out));
}

/// [`matmul_dense`] into storage that need not hold values yet: it writes every element
/// of `out`, so a caller can hand it a vector's spare capacity instead of zeroing it
/// first (a prefill's projections are megabytes each: zeroing them was 1% of a pass).
pub fn matmul_dense_into(
    simd: Simd,
    parts: &[DenseMatrix],
    x: &[f32],
    rows: usize,
    out: &mut [MaybeUninit<f32>],
) {
    multiply(simd, parts, x, rows, out, paired_from_rows());
}

/// [`matmul_dense_into`] with f32 weights taking the AVX-512 path from `paired_from`
/// rows (the tests run both paths on any CPU).
fn multiply(
    simd: Simd,
    parts: &[DenseMatrix],
    x: &[f32],
    rows: usize,
    out: &mut [MaybeUninit<f32>],
    paired_from: usize,
) {
    assert!(simd.is_available(), "{simd:?} is not available on this CPU");
    let width: usize = parts.iter().map(|p| p.n).sum();
    assert_eq!(out.len(), rows * width, "out is rows × Σ n");
    for p in parts {
        assert_eq!(p.k * rows, x.len(), "x is rows × k");
    }
    if rows == 0 {
        return;
    }
    let outputs: Vec<usize> = parts.iter().map(|p| p.n).collect();
    let paired = simd.has_avx512f() && rows >= paired_from;
    let few_rows = rows <= 2;
    let all_bf16 = parts.iter().all(|p| p.is_bf16());
    let width = if few_rows {
        FEW_ROWS_ITEM_COLUMNS
    } else if all_bf16 && simd.has_avx512f() && rows >= PAIRED_FROM_ROWS {
        bf16::TILE_COLUMNS
    } else if paired && !all_bf16 {
        PAIRED_COLUMNS
    } else {
        2
    };
    thread_local! {
        // Reused: a prefill's input is megabytes, which a fresh allocation would have
        // the kernel map and zero for every matrix.
        static INPUTS: std::cell::RefCell<Inputs> = std::cell::RefCell::default();
    }
    INPUTS.with_borrow_mut(|inputs| {
        inputs.prepare(parts, x, rows, paired);
        let inputs = &*inputs;
        for_each_column_group(&outputs, width, out, |part, c0, cols, out| {
            let w = &parts[part];
            let step = if few_rows { FEW_ROWS_COLUMNS } else { cols };
            let path = bf16::Path::of(simd, w.k);
            for c in (c0..c0 + cols).step_by(step) {
                let count = step.min(c0 + cols - c);
                // SAFETY: `simd` is available (asserted), the paths are chosen for it and
                // `k`; the columns `c..c + count` and the rows exist and are this
                // group's alone.
                unsafe {
                    if w.is_bf16() {
                        bf16::columns(path, w, &inputs.rounded, rows, c, count, out);
                    } else {
                        f32_columns(simd, paired, w, x, &inputs.packed, rows, c, count, out);
                    }
                }
            }
        });
    });
}

/// A pass's input as the kernels read it, made once per pass for all its parts.
#[derive(Default)]
struct Inputs {
    /// For bf16 parts: the rows rounded to bf16.
    rounded: Vec<u16>,
    /// For f32 parts on the AVX-512 path: the rows in pairs (`avx512::pack_row_pairs`).
    packed: Vec<f32>,
}

impl Inputs {
    /// What `parts` need of `x` (`rows × k`); `paired` says the f32 parts take the
    /// AVX-512 path.
    fn prepare(&mut self, parts: &[DenseMatrix], x: &[f32], rows: usize, paired: bool) {
        if parts.iter().any(|p| p.is_bf16()) {
            bf16::round_rows(x, &mut self.rounded);
        }
        #[cfg(target_arch = "x86_64")]
        if let Some(p) = parts.iter().find(|p| !p.is_bf16())
            && paired
            && p.k.is_multiple_of(8)
        {
            avx512::pack_row_pairs(x, rows, p.k, &mut self.packed);
        }
        #[cfg(not(target_arch = "x86_64"))]
        let _ = (rows, paired);
    }
}

/// Columns `c0..c0 + cols` of the f32 matrix `w` for every row: on the AVX-512 path
/// (`paired`) rows in pairs from `packed`, otherwise AVX2 tiles of up to four rows, or
/// the portable path.
///
/// SAFETY: `simd` is available; `paired` only with AVX-512F, and then `packed` holds `x`
/// packed if `k` is a multiple of 8; the columns exist and are the caller's alone.
#[allow(clippy::too_many_arguments)]
unsafe fn f32_columns(
    simd: Simd,
    paired: bool,
    w: &DenseMatrix,
    x: &[f32],
    packed: &[f32],
    rows: usize,
    c0: usize,
    cols: usize,
    out: Out,
) {
    match simd {
        #[cfg(target_arch = "x86_64")]
        _ if paired && w.k.is_multiple_of(8) => unsafe {
            match cols {
                1 => avx512::columns::<1>(w, packed, rows, c0, out),
                2 => avx512::columns::<2>(w, packed, rows, c0, out),
                3 => avx512::columns::<3>(w, packed, rows, c0, out),
                4 => avx512::columns::<4>(w, packed, rows, c0, out),
                5 => avx512::columns::<5>(w, packed, rows, c0, out),
                6 => avx512::columns::<6>(w, packed, rows, c0, out),
                _ => unreachable!("groups are at most {PAIRED_COLUMNS} columns"),
            }
        },
        #[cfg(target_arch = "x86_64")]
        s if s.has_avx2_fma() && w.k.is_multiple_of(8) => unsafe {
            if cols == 2 {
                avx2::columns::<2>(w, x, rows, c0, out)
            } else {
                avx2::columns::<1>(w, x, rows, c0, out)
            }
        },
        _ => {
            for r in 0..rows {
                for c in c0..c0 + cols {
                    let v = element_portable(w, c, &x[r * w.k..][..w.k]);
                    // SAFETY: (r, c) is inside the output and this group's alone.
                    unsafe { out.write(r, c, v) };
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn values(len: usize, seed: u64) -> Vec<f32> {
        crate::model::kernels::test_values(len, seed, 1.0)
    }

    #[test]
    fn decoding_prefetches_by_maker_unless_the_setting_says_otherwise() {
        assert_eq!(few_rows_prefetch_for(true, None), Some(2));
        assert_eq!(few_rows_prefetch_for(false, None), None);
        assert_eq!(few_rows_prefetch_for(false, Some("3")), Some(3));
        assert_eq!(few_rows_prefetch_for(true, Some(" 0 ")), None);
        assert_eq!(few_rows_prefetch_for(true, Some("far")), Some(2));
        assert_eq!(few_rows_prefetch_for(false, Some("-1")), None);
    }

    fn run(simd: Simd, w: &DenseMatrix, x: &[f32], rows: usize) -> Vec<f32> {
        let mut out = vec![f32::NAN; rows * w.n];
        matmul_dense(simd, std::slice::from_ref(w), x, rows, &mut out);
        out
    }

    /// [`run`] with f32 weights on the AVX-512 path from `paired_from` rows.
    fn run_from(
        simd: Simd,
        w: &DenseMatrix,
        x: &[f32],
        rows: usize,
        paired_from: usize,
    ) -> Vec<f32> {
        let mut out = vec![f32::NAN; rows * w.n];
        multiply(
            simd,
            std::slice::from_ref(w),
            x,
            rows,
            as_uninit(&mut out),
            paired_from,
        );
        out
    }

    /// Every path this CPU has, and the portable one, give each row the same bits, alone
    /// or among 3, 4, 5 or 11 rows (AVX2 tiles, or AVX-512 pairs with an odd last row
    /// paired with padding) or 37, over 13
    /// columns (groups of 2 and of 6 with remainders), for f32 weights and for bf16 ones
    /// (whose inputs are rounded to bf16: on a CPU with AVX-512 BF16 this compares the
    /// instruction with the FMA paths); `k` a multiple of 32 and not.
    #[test]
    fn rows_get_the_same_bits_alone_and_together_on_every_path_in_both_formats() {
        let (n, rows) = (13, 37);
        for k in [96, 1024, 40] {
            let weights = values(n * k, 1);
            let bits: Vec<u16> = weights.iter().map(|&v| bf16::to_bf16(v)).collect();
            let x = values(rows * k, 2);
            let rounded: Vec<f32> = x
                .iter()
                .map(|&v| f32::from_bits((bf16::to_bf16(v) as u32) << 16))
                .collect();
            let f32_matrix = DenseMatrix::new(n, k, weights);
            let bf16_matrix = DenseMatrix::bf16(n, k, bits);
            for w in [&f32_matrix, &bf16_matrix] {
                let bf16 = w.is_bf16();
                let together = run(Simd::Portable, w, &x, rows);
                for &simd in Simd::available() {
                    let what = format!("{simd:?}, bf16 {bf16}, k {k}");
                    assert_eq!(run(simd, w, &x, rows), together, "{what}, {rows} rows");
                    // Both sides of every row count's choice of path, odd and even.
                    for part in [3, 4, 5, 11] {
                        for from in [3, PAIRED_FROM_ROWS] {
                            assert_eq!(
                                run_from(simd, w, &x[..part * k], part, from),
                                together[..part * n],
                                "{what}, {part} rows, paired from {from}"
                            );
                        }
                    }
                }
                let multiplied = if bf16 { &rounded } else { &x };
                for r in 0..rows {
                    let alone = run(Simd::detect(), w, &x[r * k..(r + 1) * k], 1);
                    assert_eq!(alone, together[r * n..(r + 1) * n], "row {r}");
                    for (c, &got) in alone.iter().enumerate() {
                        let exact: f64 = (0..k)
                            .map(|i| multiplied[r * k + i] as f64 * w.weight(c * k + i) as f64)
                            .sum();
                        assert!((got as f64 - exact).abs() < 1e-4, "({r},{c}) bf16 {bf16}");
                    }
                }
            }
            assert_ne!(
                run(Simd::Portable, &f32_matrix, &x[..k], 1),
                run(Simd::Portable, &bf16_matrix, &x[..k], 1),
                "the bf16 matrix holds rounded weights"
            );
        }
    }

    /// A fused projection may mix formats: each part's columns are what it gives alone.
    #[test]
    fn a_fused_projection_of_f32_and_bf16_parts_gives_each_part_s_columns() {
        let (k, rows) = (64, 20);
        let f32_part = DenseMatrix::new(5, k, values(5 * k, 3));
        let bf16_part = DenseMatrix::bf16(
            7,
            k,
            values(7 * k, 4).iter().map(|&v| bf16::to_bf16(v)).collect(),
        );
        let x = values(rows * k, 5);
        for &simd in Simd::available() {
            for rows in [1, 3, rows] {
                let x = &x[..rows * k];
                let mut fused = vec![f32::NAN; rows * 12];
                matmul_dense(
                    simd,
                    &[f32_part.clone(), bf16_part.clone()],
                    x,
                    rows,
                    &mut fused,
                );
                let (a, b) = (
                    run(simd, &f32_part, x, rows),
                    run(simd, &bf16_part, x, rows),
                );
                for r in 0..rows {
                    assert_eq!(fused[r * 12..][..5], a[r * 5..][..5], "{simd:?} {rows}");
                    assert_eq!(fused[r * 12 + 5..][..7], b[r * 7..][..7], "{simd:?} {rows}");
                }
            }
        }
    }
}
