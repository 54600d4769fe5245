//! Weight matrices repacked at load for the row-invariant matmul ([`super::matmul`]).
//!
//! Every GGML format the kernels take is rewritten, exactly, into one shape: per output
//! column, 32-value blocks of 8-bit integers, each block with a scale (two, one per
//! 16-value half, for Q6_K) and, for the formats with a minimum, an offset. A weight is
//! then `scale · q (+ offset)`, the value the GGML dequantizer gives, so the repacked
//! matrix is the file's matrix, not an approximation of it.
//!
//! **Scales as the file has them.** The 32-value formats (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1)
//! keep their f16 scales and offsets ([`BlockTable::Half`]), which the kernels widen to
//! f32 exactly as they load them: a decoding step reads every table once, and f32 copies
//! made Q8_0's step read 36 bytes per block where the file has 34, and Q4_1's 24 where it
//! has 20. The K-quants' scales are products (a super-block's f16 scale times a 6- or
//! 8-bit sub-scale) that f16 cannot always hold, so they stay f32 ([`BlockTable::Full`]).
//!
//! **Grouped layout.** The kernels take the dot products of eight blocks side by side,
//! one 32-bit lane per block, so that a lane ends holding its block's whole integer dot
//! product and the float work (convert, scale, accumulate) is done once per block, not
//! once per four values. So each whole run of eight blocks (a group) is stored step by
//! step: step `s` holds values `4s..4s + 4` of every block of the group, block after
//! block ([`grouped_index`]). The blocks after the last whole group (the tail: 576
//! inputs are 18 blocks, two groups and two blocks) keep GGML's order, one block after
//! another, and are multiplied one block at a time. Activations use the same layout.
//!
//! Q4_0 and Q4_1 keep 4-bit quants (the unsigned nibble; Q4_0's weight is the nibble − 8),
//! so a decoding step reads about a third fewer bytes than with Q8_0: in a group, byte
//! `4l + e` of step pair `p` (0..4) holds value `4p + e` of the group's block `l` in its
//! low nibble and value `4p + 16 + e` in its high one ([`grouped_nibble`]); a tail block
//! is GGML's 16 bytes, byte `j` holding value `j` low and `j + 16` high. The 5- and 6-bit formats
//! and the K-quants take 8 bits per weight: one layout for the kernels, and the products
//! stay exact, at the price of Q8_0's memory traffic.

use super::hugepages::HugeSlice;
use candle_core::quantized::{GgmlDType, QTensor};
use half::f16;

/// Values per block: the activation block and the weight block of every format.
pub const BLOCK: usize = 32;

/// Blocks per group: one 32-bit lane of a 256-bit vector per block (see the module docs).
pub const GROUP: usize = 8;

/// Where value `at` of a row of activations, or of a column of 8-bit weights, of `blocks`
/// blocks lies: in a whole group `g`, step `s` (4 values of each block), then the block's
/// 4 bytes; a tail block's values in order. Group `g` starts at `g · GROUP · BLOCK` and
/// a tail block `b` at `b · BLOCK`.
pub(super) fn grouped_index(blocks: usize, at: usize) -> usize {
    let (block, j) = (at / BLOCK, at % BLOCK);
    if block >= whole_blocks(blocks) {
        return at;
    }
    let (group, lane) = (block / GROUP, block % GROUP);
    group * GROUP * BLOCK + (j / 4) * 4 * GROUP + 4 * lane + j % 4
}

/// Where value `at` of a column of 4-bit weights lies: the byte, and whether it is the
/// high nibble. In a group, steps `p` and `p + 4` share bytes, low and high; a tail
/// block's byte `j` holds values `j` and `j + 16`.
pub(super) fn grouped_nibble(blocks: usize, at: usize) -> (usize, bool) {
    let (block, j) = (at / BLOCK, at % BLOCK);
    if block >= whole_blocks(blocks) {
        return (block * BLOCK / 2 + j % 16, j >= 16);
    }
    let (group, lane) = (block / GROUP, block % GROUP);
    let step = j / 4;
    (
        group * GROUP * BLOCK / 2 + (step % 4) * 4 * GROUP + 4 * lane + j % 4,
        step >= 4,
    )
}

/// Writes block `block`'s 32 values into a row (activations) or column (8-bit weights) of
/// `blocks` blocks, where [`grouped_index`] puts them: four values per step in a group,
/// all 32 in order in the tail.
pub(super) fn place_block<T: Copy>(line: &mut [T], blocks: usize, block: usize, values: &[T]) {
    assert_eq!(values.len(), BLOCK, "one block");
    if block >= whole_blocks(blocks) {
        line[block * BLOCK..][..BLOCK].copy_from_slice(values);
        return;
    }
    let start = (block / GROUP) * GROUP * BLOCK + 4 * (block % GROUP);
    for (step, four) in values.chunks_exact(4).enumerate() {
        line[start + step * 4 * GROUP..][..4].copy_from_slice(four);
    }
}

/// The blocks in whole groups; the rest are the tail.
pub(super) fn whole_blocks(blocks: usize) -> usize {
    blocks / GROUP * GROUP
}

/// How the integers of a packed matrix turn into weights.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QuantKind {
    /// Quants may be negative (Q8_0, Q4_0, Q5_0, Q6_K); otherwise they lie in 0..=31 and
    /// the kernel multiplies them unsigned, without the sign trick.
    pub signed: bool,
    /// Two scales per block, one per 16-value half (Q6_K).
    pub halves: bool,
    /// Each block has an offset added to every weight (Q4_1, Q5_1, Q4_K, Q5_K).
    pub affine: bool,
    /// Two 4-bit quants per byte (Q4_0, Q4_1); a signed format stores q + 8, and the
    /// kernels multiply the nibble and take `8 · Σ a` back out.
    pub nibbles: bool,
    /// The scales and offsets are f16, as in the file (the 32-value formats; see the
    /// module docs).
    pub half: bool,
}

/// One value per block (a scale or an offset), `[n][k / BLOCK]`, in the width the
/// format allows exactly (see the module docs). Empty where the format has no such table.
#[derive(Clone, Debug)]
pub enum BlockTable {
    /// f16 bits, widened to f32 (exactly) where they are read.
    Half(HugeSlice<u16>),
    /// f32.
    Full(HugeSlice<f32>),
}

impl BlockTable {
    /// The table of `values`, as f16 if `half` (each value must then be an f16's, as the
    /// 32-value formats' are: they were widened from the file's f16).
    fn new(values: &[f32], half: bool) -> Self {
        if half {
            BlockTable::Half(
                values
                    .iter()
                    .map(|&v| f16::from_f32(v).to_bits())
                    .collect::<Vec<_>>()
                    .into(),
            )
        } else {
            BlockTable::Full(HugeSlice::copy_of(values))
        }
    }

    /// Entries.
    pub(super) fn len(&self) -> usize {
        match self {
            BlockTable::Half(t) => t.len(),
            BlockTable::Full(t) => t.len(),
        }
    }

    /// True for a format without this table.
    pub(super) fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Entry `i` as f32.
    pub(super) fn get(&self, i: usize) -> f32 {
        match self {
            BlockTable::Half(t) => f16::from_bits(t[i]).to_f32(),
            BlockTable::Full(t) => t[i],
        }
    }

    /// Bytes per entry: 2 or 4.
    pub(super) fn entry_bytes(&self) -> usize {
        match self {
            BlockTable::Half(_) => 2,
            BlockTable::Full(_) => 4,
        }
    }

    /// The entries' bytes, for the kernels' loads and prefetches.
    pub(super) fn bytes(&self) -> &[u8] {
        let (start, len) = match self {
            BlockTable::Half(t) => (t.as_ptr().cast::<u8>(), std::mem::size_of_val(&t[..])),
            BlockTable::Full(t) => (t.as_ptr().cast::<u8>(), std::mem::size_of_val(&t[..])),
        };
        // SAFETY: the entries' own bytes, plain numbers with no padding, borrowed as long
        // as `self`.
        unsafe { std::slice::from_raw_parts(start, len) }
    }
}

/// Why a tensor cannot be packed.
#[derive(Debug, thiserror::Error)]
pub enum PackError {
    /// The format has no row-invariant kernel.
    #[error("weights in {0:?} have no row-invariant kernel; use --weights q8-0")]
    Unsupported(GgmlDType),
    /// The tensor is not a matrix whose rows are whole blocks.
    #[error("a {dims:?} {dtype:?} tensor is not a matrix of whole {block}-value blocks")]
    Shape {
        /// The tensor's dimensions.
        dims: Vec<usize>,
        /// Its format.
        dtype: GgmlDType,
        /// The format's block size.
        block: usize,
    },
    /// The tensor's bytes are not as many as its shape says.
    #[error("{dtype:?} tensor data is {got} bytes, its shape needs {want}")]
    Size {
        /// Its format.
        dtype: GgmlDType,
        /// Bytes present.
        got: usize,
        /// Bytes needed.
        want: usize,
    },
    /// Reading the tensor failed.
    #[error("cannot read tensor data: {0}")]
    Candle(#[from] candle_core::Error),
}

/// A weight matrix `(n outputs, k inputs)` in the kernels' layout. See the module docs.
#[derive(Clone, Debug)]
pub struct PackedMatrix {
    pub(super) n: usize,
    pub(super) k: usize,
    pub(super) kind: QuantKind,
    /// Each output column's quants, contiguous, in the grouped layout: `k` bytes (one
    /// `i8` each, or `u8` for the unsigned formats), or `k / 2` with `kind.nibbles`.
    pub(super) quants: HugeSlice<u8>,
    /// Each block's scale, or its first half's with `kind.halves`.
    pub(super) scales: BlockTable,
    /// The second halves' scales, empty unless `kind.halves`.
    pub(super) second_scales: BlockTable,
    /// Each block's offset, empty unless `kind.affine`.
    pub(super) offsets: BlockTable,
}

/// The formats that can be packed, and their block size and bytes per block.
fn layout(dtype: GgmlDType) -> Option<(usize, usize)> {
    Some(match dtype {
        GgmlDType::Q8_0 => (32, 34),
        GgmlDType::Q4_0 => (32, 18),
        GgmlDType::Q4_1 => (32, 20),
        GgmlDType::Q5_0 => (32, 22),
        GgmlDType::Q5_1 => (32, 24),
        GgmlDType::Q4K => (256, 144),
        GgmlDType::Q5K => (256, 176),
        GgmlDType::Q6K => (256, 210),
        _ => return None,
    })
}

fn kind_of(dtype: GgmlDType) -> QuantKind {
    let affine = matches!(
        dtype,
        GgmlDType::Q4_1 | GgmlDType::Q5_1 | GgmlDType::Q4K | GgmlDType::Q5K
    );
    QuantKind {
        signed: !affine,
        halves: dtype == GgmlDType::Q6K,
        affine,
        nibbles: matches!(dtype, GgmlDType::Q4_0 | GgmlDType::Q4_1),
        half: dtype.block_size() == BLOCK,
    }
}

fn half_at(b: &[u8], at: usize) -> f32 {
    f16::from_le_bytes([b[at], b[at + 1]]).to_f32()
}

/// The 6-bit scale and minimum of sub-block `j` of a Q4_K or Q5_K super-block.
fn scale_min_k4(j: usize, s: &[u8]) -> (u8, u8) {
    if j < 4 {
        (s[j] & 63, s[j + 4] & 63)
    } else {
        (
            (s[j + 4] & 0x0F) | ((s[j - 4] >> 6) << 4),
            (s[j + 4] >> 4) | ((s[j] >> 6) << 4),
        )
    }
}

/// Where one GGML block's values go: one byte per value (a nibble's value for the 4-bit
/// formats), in order; the grouped layout is made afterwards.
struct Sink<'a> {
    quants: &'a mut Vec<u8>,
    scales: &'a mut Vec<f32>,
    offsets: &'a mut Vec<f32>,
}

/// Unpack one GGML block (of 32 or 256 values) into the sink, as GGML dequantizes it.
fn unpack_block(dtype: GgmlDType, b: &[u8], out: &mut Sink<'_>) {
    match dtype {
        GgmlDType::Q8_0 => {
            out.scales.push(half_at(b, 0));
            out.quants.extend_from_slice(&b[2..34]);
        }
        GgmlDType::Q4_0 | GgmlDType::Q4_1 => {
            let affine = dtype == GgmlDType::Q4_1;
            let at = if affine { 4 } else { 2 };
            out.scales.push(half_at(b, 0));
            if affine {
                out.offsets.push(half_at(b, 2));
            }
            // GGML's byte j holds value j (low nibble) and value j + 16 (high).
            let packed = &b[at..at + 16];
            out.quants.extend(packed.iter().map(|q| q & 15));
            out.quants.extend(packed.iter().map(|q| q >> 4));
        }
        GgmlDType::Q5_0 | GgmlDType::Q5_1 => {
            let affine = dtype == GgmlDType::Q5_1;
            let at = if affine { 4 } else { 2 };
            let qh = u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]]);
            let qs = &b[at + 4..at + 20];
            let bias = if affine { 0 } else { 16 };
            out.scales.push(half_at(b, 0));
            if affine {
                out.offsets.push(half_at(b, 2));
            }
            for (j, &q) in qs.iter().enumerate() {
                let high = (((qh >> j) << 4) & 0x10) as u8;
                out.quants.push((((q & 15) | high) as i8 - bias) as u8);
            }
            for (j, &q) in qs.iter().enumerate() {
                let high = ((qh >> (j + 12)) & 0x10) as u8;
                out.quants.push((((q >> 4) | high) as i8 - bias) as u8);
            }
        }
        GgmlDType::Q4K | GgmlDType::Q5K => {
            let (d, dmin, scales) = (half_at(b, 0), half_at(b, 2), &b[4..16]);
            let five = dtype == GgmlDType::Q5K;
            let (qh, qs) = if five {
                (&b[16..48], &b[48..176])
            } else {
                (&b[0..0], &b[16..144])
            };
            for j in 0..4 {
                let q = &qs[32 * j..32 * j + 32];
                for (half, shift) in [(0usize, 0u8), (1, 4)] {
                    let (sc, m) = scale_min_k4(2 * j + half, scales);
                    out.scales.push(d * sc as f32);
                    out.offsets.push(-(dmin * m as f32));
                    let bit = 1u8 << (2 * j + half);
                    for (l, &v) in q.iter().enumerate() {
                        let high = if five && qh[l] & bit != 0 { 16 } else { 0 };
                        out.quants.push(((v >> shift) & 15) + high);
                    }
                }
            }
        }
        GgmlDType::Q6K => {
            let (ql, qh, sc, d) = (&b[0..128], &b[128..192], &b[192..208], half_at(b, 208));
            let mut values = [0u8; 256];
            for n in 0..2 {
                let (ql, qh) = (&ql[64 * n..64 * n + 64], &qh[32 * n..32 * n + 32]);
                let y = &mut values[128 * n..128 * n + 128];
                for l in 0..32 {
                    y[l] = ((ql[l] & 15) | ((qh[l] & 3) << 4)).wrapping_sub(32);
                    y[l + 32] = ((ql[l + 32] & 15) | (((qh[l] >> 2) & 3) << 4)).wrapping_sub(32);
                    y[l + 64] = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)).wrapping_sub(32);
                    y[l + 96] = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)).wrapping_sub(32);
                }
            }
            out.quants.extend_from_slice(&values);
            out.scales.extend(sc.iter().map(|&s| d * (s as i8) as f32));
        }
        other => unreachable!("layout() admits {other:?}"),
    }
}

impl PackedMatrix {
    /// Repack a GGML matrix `(n, k)`; see the module docs for which formats.
    pub fn from_qtensor(qt: &QTensor) -> Result<Self, PackError> {
        let dtype = qt.dtype();
        let (block, bytes) = layout(dtype).ok_or(PackError::Unsupported(dtype))?;
        let dims = qt.shape().dims().to_vec();
        let &[n, k] = dims.as_slice() else {
            return Err(PackError::Shape { dims, dtype, block });
        };
        if k % block != 0 || n == 0 {
            return Err(PackError::Shape { dims, dtype, block });
        }
        let data = qt.data()?;
        let want = n * (k / block) * bytes;
        if data.len() != want {
            return Err(PackError::Size {
                dtype,
                got: data.len(),
                want,
            });
        }
        let kind = kind_of(dtype);
        let blocks = k / BLOCK;
        let mut values = Vec::with_capacity(n * k);
        let mut scales = Vec::with_capacity(n * blocks * if kind.halves { 2 } else { 1 });
        let mut offsets = Vec::with_capacity(if kind.affine { n * blocks } else { 0 });
        let mut sink = Sink {
            quants: &mut values,
            scales: &mut scales,
            offsets: &mut offsets,
        };
        for b in data.chunks_exact(bytes) {
            unpack_block(dtype, b, &mut sink);
        }
        let quants = if kind.nibbles {
            let mut quants = vec![0u8; n * k / 2];
            for (column, out) in values.chunks_exact(k).zip(quants.chunks_exact_mut(k / 2)) {
                for (at, &v) in column.iter().enumerate() {
                    let (byte, high) = grouped_nibble(blocks, at);
                    out[byte] |= if high { v << 4 } else { v };
                }
            }
            quants
        } else {
            let mut quants = vec![0u8; n * k];
            for (column, out) in values.chunks_exact(k).zip(quants.chunks_exact_mut(k)) {
                for (block, block_values) in column.chunks_exact(BLOCK).enumerate() {
                    place_block(out, blocks, block, block_values);
                }
            }
            quants
        };
        let (scales, second_scales) = if kind.halves {
            (
                scales.iter().step_by(2).copied().collect(),
                scales.iter().skip(1).step_by(2).copied().collect(),
            )
        } else {
            (scales, Vec::new())
        };
        // Read at every step: into huge pages (see `hugepages`).
        Ok(PackedMatrix {
            n,
            k,
            kind,
            quants: quants.into(),
            scales: BlockTable::new(&scales, kind.half),
            second_scales: BlockTable::new(&second_scales, kind.half),
            offsets: BlockTable::new(&offsets, kind.half),
        })
    }

    /// Output features.
    pub fn outputs(&self) -> usize {
        self.n
    }

    /// Input features.
    pub fn inputs(&self) -> usize {
        self.k
    }

    /// Bytes of quants per output column.
    pub(super) fn column_bytes(&self) -> usize {
        if self.kind.nibbles {
            self.k / 2
        } else {
            self.k
        }
    }

    /// The quant of input `at` in column `col`: the integer the block's scale multiplies.
    pub(super) fn quant(&self, col: usize, at: usize) -> i32 {
        let blocks = self.k / BLOCK;
        let column = &self.quants[col * self.column_bytes()..];
        if !self.kind.nibbles {
            let q = column[grouped_index(blocks, at)];
            return if self.kind.signed {
                q as i8 as i32
            } else {
                q as i32
            };
        }
        let (byte, high) = grouped_nibble(blocks, at);
        let q = (if high {
            column[byte] >> 4
        } else {
            column[byte] & 15
        }) as i32;
        if self.kind.signed { q - 8 } else { q }
    }

    /// The scale of input `at` in column `col`.
    pub(super) fn scale(&self, col: usize, at: usize) -> f32 {
        let b = col * (self.k / BLOCK) + at / BLOCK;
        if self.kind.halves && at % BLOCK >= BLOCK / 2 {
            self.second_scales.get(b)
        } else {
            self.scales.get(b)
        }
    }

    /// The weights as f32, `[n][k]`: what GGML's dequantizer gives for the source tensor.
    pub fn dequantize(&self) -> Vec<f32> {
        let blocks = self.k / BLOCK;
        let mut out = Vec::with_capacity(self.n * self.k);
        for i in 0..self.n * self.k {
            let (col, at) = (i / self.k, i % self.k);
            let w = self.scale(col, at) * self.quant(col, at) as f32;
            out.push(if self.kind.affine {
                w + self.offsets.get(col * blocks + at / BLOCK)
            } else {
                w
            });
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{Device, Tensor};

    fn weights(n: usize, k: usize, seed: u64) -> Tensor {
        let v = crate::model::kernels::test_values(n * k, seed, 0.2);
        Tensor::from_vec(v, (n, k), &Device::Cpu).unwrap()
    }

    #[test]
    fn every_format_unpacks_to_what_ggml_dequantizes() {
        // 512 inputs are whole groups; 576 (the model's width) two groups and a tail of
        // two blocks, 96 a tail alone (the 32-value formats only: K-quants come in 256s).
        for dtype in [
            GgmlDType::Q8_0,
            GgmlDType::Q4_0,
            GgmlDType::Q4_1,
            GgmlDType::Q5_0,
            GgmlDType::Q5_1,
            GgmlDType::Q4K,
            GgmlDType::Q5K,
            GgmlDType::Q6K,
        ] {
            for k in [512, 576, 96]
                .into_iter()
                .filter(|k| k % dtype.block_size() == 0)
            {
                let qt = QTensor::quantize(&weights(8, k, dtype as u64 + 1), dtype).unwrap();
                let want: Vec<f32> = qt
                    .dequantize(&Device::Cpu)
                    .unwrap()
                    .flatten_all()
                    .unwrap()
                    .to_vec1()
                    .unwrap();
                let got = PackedMatrix::from_qtensor(&qt).unwrap().dequantize();
                assert_eq!(got.len(), want.len());
                let bad = got.iter().zip(&want).filter(|(a, b)| a != b).count();
                assert_eq!(
                    bad, 0,
                    "{dtype:?}, {k} inputs: {bad} weights differ from GGML's dequantizer"
                );
            }
        }
    }

    /// Bytes the kernels read for one pass over the matrix: quants and tables.
    fn stored_bytes(packed: &PackedMatrix) -> usize {
        packed.quants.len()
            + [&packed.scales, &packed.second_scales, &packed.offsets]
                .iter()
                .map(|t| t.bytes().len())
                .sum::<usize>()
    }

    #[test]
    fn the_32_value_formats_take_no_more_bytes_than_the_file() {
        // A decoding step reads every byte once: Q8_0 and the 4-bit formats keep the
        // file's f16 tables; the 5-bit ones spend a byte per weight (one layout for
        // the kernels); the K-quants' tables are f32 products.
        let (n, k) = (8, 576);
        for (dtype, stored_per_block) in [
            (GgmlDType::Q8_0, 34),
            (GgmlDType::Q4_0, 18),
            (GgmlDType::Q4_1, 20),
            (GgmlDType::Q5_0, 34),
            (GgmlDType::Q5_1, 36),
        ] {
            let qt = QTensor::quantize(&weights(n, k, 5), dtype).unwrap();
            let packed = PackedMatrix::from_qtensor(&qt).unwrap();
            assert_eq!(
                stored_bytes(&packed),
                n * (k / BLOCK) * stored_per_block,
                "{dtype:?}"
            );
        }
        let qt = QTensor::quantize(&weights(n, 512, 5), GgmlDType::Q4K).unwrap();
        let packed = PackedMatrix::from_qtensor(&qt).unwrap();
        assert!(matches!(packed.scales, BlockTable::Full(_)));
        assert!(matches!(packed.offsets, BlockTable::Full(_)));
    }

    #[test]
    fn the_grouped_layout_places_every_value_once() {
        for blocks in [1, 2, 7, 8, 9, 18, 48] {
            let k = blocks * BLOCK;
            let mut placed = vec![usize::MAX; k];
            let order: Vec<usize> = (0..k).collect();
            for (block, values) in order.chunks_exact(BLOCK).enumerate() {
                place_block(&mut placed, blocks, block, values);
            }
            for (at, &i) in order.iter().enumerate() {
                assert_eq!(
                    placed[grouped_index(blocks, at)],
                    i,
                    "{blocks} blocks, value {at}"
                );
            }
            let mut seen = vec![false; k];
            for at in 0..k {
                let i = grouped_index(blocks, at);
                assert!(!seen[i], "{blocks} blocks: byte {i} taken twice");
                seen[i] = true;
            }
            let mut nibbles = vec![[false; 2]; k / 2];
            for at in 0..k {
                let (byte, high) = grouped_nibble(blocks, at);
                assert!(
                    !nibbles[byte][high as usize],
                    "{blocks} blocks: nibble taken twice"
                );
                nibbles[byte][high as usize] = true;
            }
        }
    }

    #[test]
    fn formats_without_a_kernel_and_ragged_rows_are_refused() {
        let qt = QTensor::quantize(&weights(4, 256, 3), GgmlDType::Q2K).unwrap();
        assert!(matches!(
            PackedMatrix::from_qtensor(&qt),
            Err(PackError::Unsupported(GgmlDType::Q2K))
        ));
        let f = QTensor::quantize(&weights(4, 48, 3), GgmlDType::F32).unwrap();
        assert!(PackedMatrix::from_qtensor(&f).is_err());
    }
}
