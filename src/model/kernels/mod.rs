//! Row-invariant CPU kernels for the forward pass: each output element is computed by
//! the same instructions whether the pass holds one row or sixty-four, so a token
//! verified inside a draft gets bit for bit the logits plain decoding gives it, and the
//! weights are read once per pass for all rows, so verifying K tokens costs far less than
//! K decoding steps.
//!
//! - [`pack`]: GGML weights (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K) repacked
//!   exactly into 8-bit (or 4-bit) blocks with the file's scales, once at load.
//! - [`matmul`]: the quantized matmul (AVX-512 VNNI, AVX-VNNI or AVX2, chosen at run
//!   time, and a portable path that gives the same bits), threaded over output columns.
//! - [`dense`]: the same for f32 weights (`--weights f32`).
//! - [`attention`]: host attention, threaded over (head, query), in a fixed order.
//! - [`activation`]: the feed-forward gate, `silu(gate) · up`, element by element.
//! - [`norm`]: RMS normalization, the residual addition and rotary embeddings, row by row.
//! - [`pool`]: the threads they run on, which keep going when a core is taken away.
//! - [`hugepages`]: the memory the weights live in, on 2 MiB pages where the OS has them.
//!
//! This module holds what they share: the fixed lane reduction, rounding, the output
//! handle threads write through, and the split of a fused projection's columns.

pub mod activation;
pub mod attention;
pub mod dense;
pub mod hugepages;
pub mod matmul;
pub mod norm;
pub mod pack;
pub mod pool;
pub mod simd;

pub use simd::Simd;

use std::mem::MaybeUninit;

/// Eight lanes summed in one fixed order, on every path and for every row count.
#[inline(always)]
fn reduce_lanes(l: &[f32; 8]) -> f32 {
    ((l[0] + l[4]) + (l[2] + l[6])) + ((l[1] + l[5]) + (l[3] + l[7]))
}

/// [`reduce_lanes`] on a `__m256` in registers, the same additions in the same order:
/// the high half added to the low one gives `(l0 + l4, l1 + l5, l2 + l6, l3 + l7)`, then
/// lanes 2 and 3 are added to 0 and 1, then lane 1 to lane 0. (Storing the lanes and
/// reading them back one by one stalls on store forwarding, once per output element.)
/// A macro because `#[target_feature]` functions cannot be forced inline.
#[cfg(target_arch = "x86_64")]
macro_rules! reduce_lanes_m256 {
    ($v:expr) => {{
        let v: __m256 = $v;
        let t = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
        let u = _mm_add_ps(t, _mm_movehl_ps(t, t));
        _mm_cvtss_f32(_mm_add_ss(u, _mm_movehdup_ps(u)))
    }};
}
#[cfg(target_arch = "x86_64")]
use reduce_lanes_m256;

/// Ask the cache level `HINT` names (`_MM_HINT_T0`: L1, `_MM_HINT_T1`: L2) for every
/// 64-byte line of `values`: attention's next keys and values (L1), the matmul kernels'
/// next columns (L2, see `dense::prefetch_columns`).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn prefetch_lines<const HINT: i32, T>(values: &[T]) {
    let start = values.as_ptr() as *const i8;
    for at in (0..std::mem::size_of_val(values)).step_by(64) {
        // SAFETY: `at` is inside `values`' bytes.
        unsafe { std::arch::x86_64::_mm_prefetch::<HINT>(start.add(at)) };
    }
}

/// Ask L1 for the lines of `row` (attention's keys and values).
#[cfg(target_arch = "x86_64")]
fn prefetch_row(row: &[f32]) {
    prefetch_lines::<{ std::arch::x86_64::_MM_HINT_T0 }, f32>(row);
}

/// `x` rounded to the nearest integer, ties to even, for |x| ≤ 2^22: adding and removing
/// 1.5 · 2^23 leaves no fraction bits. Plain arithmetic, so it vectorizes and the AVX2
/// paths can repeat it, where `f32::round` is a libm call per value.
#[inline(always)]
fn round_to_integer(x: f32) -> f32 {
    (x + ROUNDING) - ROUNDING
}

/// 1.5 · 2^23, see [`round_to_integer`].
const ROUNDING: f32 = 12_582_912.0;

/// An output buffer that the pool's threads write through: rows of `stride` floats. Each
/// element (or slice) is written by exactly one work item, so threads never write the
/// same place.
#[derive(Clone, Copy)]
struct Out {
    ptr: *mut f32,
    stride: usize,
}
// SAFETY: work items write disjoint elements (see above) of a buffer that outlives the
// pool call that hands them out.
unsafe impl Send for Out {}
unsafe impl Sync for Out {}

impl Out {
    /// Rows of `stride` floats in `buffer`.
    fn new(buffer: &mut [f32], stride: usize) -> Out {
        Out::uninit(as_uninit(buffer), stride)
    }

    /// Rows of `stride` floats in storage that need not hold values yet: the threads
    /// only write through it.
    fn uninit(buffer: &mut [MaybeUninit<f32>], stride: usize) -> Out {
        Out {
            ptr: buffer.as_mut_ptr().cast(),
            stride,
        }
    }

    /// SAFETY: `row * stride + col` is inside the buffer, and no other thread writes it.
    unsafe fn write(self, row: usize, col: usize, v: f32) {
        unsafe { *self.ptr.add(row * self.stride + col) = v };
    }

    /// The same rows, from column `by` on.
    ///
    /// SAFETY: `by` < the row stride.
    unsafe fn shifted(self, by: usize) -> Out {
        Out {
            ptr: unsafe { self.ptr.add(by) },
            stride: self.stride,
        }
    }

    /// `len` floats from `at`, counted from the start of the buffer.
    ///
    /// SAFETY: `at..at + len` is inside the buffer and no other thread touches it.
    #[allow(clippy::mut_from_ref)]
    unsafe fn slice(&self, at: usize, len: usize) -> &mut [f32] {
        unsafe { std::slice::from_raw_parts_mut(self.ptr.add(at), len) }
    }
}

/// `out` as storage that the kernels write every element of: old values are simply
/// overwritten.
fn as_uninit(out: &mut [f32]) -> &mut [MaybeUninit<f32>] {
    // SAFETY: `MaybeUninit<f32>` has the layout of `f32`, and whoever holds the view can
    // only write initialised floats through it, so `out` stays initialised.
    unsafe { &mut *(out as *mut [f32] as *mut [MaybeUninit<f32>]) }
}

/// Output columns per work item when a pass has one or two rows (decoding), in both the
/// dense and the quantized kernels, which still multiply them a tile at a time: a
/// thread's reads stay one sequential stream, and the pool's claim and the item's
/// dispatch (some 200,000 one-column items a step of the default model in the dense
/// kernel, 100,000 two-column ones in the quantized) are paid once per 16 columns.
/// Intel Xeon, `forward_rows FILE 1 60 64` (150 for Q8_0), alternated rounds, medians:
/// BF16 16.3 → 14.3 ms, F32 26.5 → 24.1 (session 61); Q8_0 items of 2 → 16 columns,
/// 4.65 → 4.30 ms and 5.42 → 4.93, Q4_1 4.94 → 4.51 (session 62).
const FEW_ROWS_ITEM_COLUMNS: usize = 16;

/// Run `group(part, c0, cols, out)` for every group of `width` output columns (the last of
/// a part may be narrower) of a fused projection whose parts have `outputs` columns each,
/// side by side in `out` (`Σ outputs` floats per row); `out` is shifted to the part's
/// first column. Groups are spread over the kernels' pool ([`pool`], `CANDLE_NUM_THREADS`).
fn for_each_column_group(
    outputs: &[usize],
    width: usize,
    out: &mut [MaybeUninit<f32>],
    group: impl Fn(usize, usize, usize, Out) + Sync,
) {
    let total: usize = outputs.iter().sum();
    // Per part: its first work item and its first output column.
    let mut starts = Vec::with_capacity(outputs.len());
    let (mut items, mut column) = (0, 0);
    for &n in outputs {
        starts.push((items, column));
        items += n.div_ceil(width);
        column += n;
    }
    let out = Out::uninit(out, total);
    execute_guided(items, |range| {
        for item in range {
            let part = starts.partition_point(|&(s, _)| s <= item) - 1;
            let (first, offset) = starts[part];
            let c0 = (item - first) * width;
            // SAFETY: `offset` < total: this part's columns start there in each row.
            let shifted = unsafe { out.shifted(offset) };
            group(part, c0, width.min(outputs[part] - c0), shifted);
        }
    });
}

/// Run `f` over `0..items` on the kernels' pool ([`pool`]), every thread that takes
/// part claiming shrinking ranges from a shared cursor.
fn execute_guided(items: usize, f: impl Fn(std::ops::Range<usize>) + Sync) {
    pool::pool().run(items, f)
}

/// Whether two results are the same floats bit for bit, and as many: what row
/// invariance and the paths' agreement promise (a `==` would take -0 for 0 and fail
/// on NaN).
#[cfg(test)]
pub(crate) fn same_bits(a: &[f32], b: &[f32]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(a, b)| a.to_bits() == b.to_bits())
}

/// Pseudo-random values in ±scale/2, the same for the same seed: test inputs.
#[cfg(test)]
pub(crate) fn test_values(len: usize, seed: u64, scale: f32) -> Vec<f32> {
    let mut x = seed;
    (0..len)
        .map(|_| {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((x >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * scale
        })
        .collect()
}
