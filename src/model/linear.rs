//! The model's weight matrices and how a projection runs: packed for the row-invariant
//! quantized kernels, f32 for the dense ones, or candle's matmul (formats without a
//! kernel, and the GPU's non-exact paths); and the RMS norms' weights.

use candle_core::quantized::{GgmlDType, QMatMul, QStorage, QTensor};
use candle_core::{DType, Device, Module, Tensor};

use super::kernels::Simd;
use super::kernels::dense::{DenseMatrix, matmul_dense_into};
use super::kernels::matmul::{QuantizedRows, matmul_into};
use super::kernels::pack::{PackError, PackedMatrix};

/// `qt` requantized to Q8_0, on `device`. The quantization runs on the CPU and the blocks
/// are then copied to the device with `QStorage::from_data`: candle's own CUDA
/// `quantize` leaves the row padding that its matmul kernels read uninitialised, and on an
/// H100 that gave NaN logits (every generation stopped at its first token).
pub(super) fn requantize_q8_0(qt: &QTensor, device: &Device) -> candle_core::Result<QTensor> {
    let on_cpu = QTensor::quantize(&qt.dequantize(&Device::Cpu)?, GgmlDType::Q8_0)?;
    if device.is_cpu() {
        return Ok(on_cpu);
    }
    let storage = QStorage::from_data(on_cpu.data()?, device, GgmlDType::Q8_0)?;
    QTensor::new(storage, on_cpu.shape().clone())
}

/// `qt` for the forward pass: packed for the row-invariant kernels on the CPU when its
/// format has one, else candle's matmul (which is not row-invariant, so greedy output with
/// speculation may then differ from plain decoding).
pub(super) fn weights_of(qt: QTensor, device: &Device) -> Result<Weights, PackError> {
    if device.is_cpu() {
        if matches!(
            qt.dtype(),
            GgmlDType::F32 | GgmlDType::F16 | GgmlDType::BF16
        ) {
            // Unquantized weights (an F32, F16 or BF16 file) run on the row-invariant
            // dense kernel, as `--weights f32` does: candle's matmul was not exact under
            // speculation, and ran the F32 file at 44 tok/s against 75. BF16 stays BF16
            // (exactly: the dequantized values are its own).
            let t = qt.dequantize(device)?;
            let t = match qt.dtype() {
                GgmlDType::BF16 => t.to_dtype(DType::BF16)?,
                _ => t,
            };
            return Ok(dense_of(t, device)?);
        }
        match PackedMatrix::from_qtensor(&qt) {
            Ok(p) => return Ok(Weights::Packed(p)),
            Err(PackError::Unsupported(dtype)) => {
                static WARNED: std::sync::Once = std::sync::Once::new();
                WARNED.call_once(|| {
                    tracing::warn!(
                        "{dtype:?} weights have no row-invariant kernel: candle's matmul is \
                         used for them, and speculative output may differ from plain \
                         decoding; use --weights q8-0"
                    )
                });
            }
            Err(e) => return Err(e),
        }
    }
    Ok(Weights::Candle(QMatMul::from_qtensor(qt)?))
}

/// One weight matrix: for the row-invariant kernels on the CPU (quantized and packed, or
/// f32), or candle's (formats without a kernel, and GPUs).
pub(super) enum Weights {
    Packed(PackedMatrix),
    Dense(DenseMatrix),
    Candle(QMatMul),
}

/// A projection of one input into one or more outputs side by side (q, k and v; gate
/// and up), so that the activations are quantized once and the threads meet once. How
/// it runs is settled when it is built, not at every call.
pub(super) enum Linear {
    /// Every part packed: one fused quantized call.
    Packed(Vec<PackedMatrix>),
    /// Every part f32 on the CPU: one fused call.
    Dense(Vec<DenseMatrix>),
    /// Some part runs on candle: each part alone, outputs concatenated.
    Mixed(Vec<Weights>),
}

impl Linear {
    /// The parts' f32 matrices on a device, stacked (`Σ n × k`): what the GPU kernels
    /// take. None unless every part is one.
    #[cfg(feature = "cuda")]
    pub(super) fn device_matrix(&self) -> Option<Tensor> {
        let Linear::Mixed(parts) = self else {
            return None;
        };
        let tensors = parts
            .iter()
            .map(|w| match w {
                Weights::Candle(QMatMul::Tensor(t)) if !t.device().is_cpu() => Some(t.clone()),
                _ => None,
            })
            .collect::<Option<Vec<_>>>()?;
        Tensor::cat(&tensors, 0).ok()
    }

    pub(super) fn new(parts: Vec<Weights>) -> Self {
        if parts.iter().all(|w| matches!(w, Weights::Packed(_))) {
            return Linear::Packed(
                parts
                    .into_iter()
                    .filter_map(|w| match w {
                        Weights::Packed(p) => Some(p),
                        _ => None,
                    })
                    .collect(),
            );
        }
        if parts.iter().all(|w| matches!(w, Weights::Dense(_))) {
            return Linear::Dense(
                parts
                    .into_iter()
                    .filter_map(|w| match w {
                        Weights::Dense(d) => Some(d),
                        _ => None,
                    })
                    .collect(),
            );
        }
        Linear::Mixed(parts)
    }

    /// `x (rows, k)` times every part, outputs concatenated: `(rows, Σ n)`. Candle's
    /// matmul for weights on a device; on the CPU, [`Linear::forward_host`].
    pub(super) fn forward(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        if let Linear::Mixed(parts) = self
            && !x.device().is_cpu()
        {
            let outs = parts
                .iter()
                .map(|w| match w {
                    Weights::Candle(m) => m.forward(x),
                    _ => candle_core::bail!("host weights cannot multiply a device tensor"),
                })
                .collect::<candle_core::Result<Vec<_>>>()?;
            return Tensor::cat(&outs, 1);
        }
        let (rows, _) = x.dims2()?;
        let input: Vec<f32> = x.flatten_all()?.to_vec1()?;
        let mut out = Vec::new();
        self.forward_host(&input, rows, &mut out)?;
        let width = out.len().checked_div(rows).unwrap_or(0);
        Tensor::from_vec(out, (rows, width), x.device())
    }

    /// `x` (`rows × k`, on the host) times every part, outputs side by side in `out`
    /// (`rows × Σ n`).
    pub(super) fn forward_host(
        &self,
        x: &[f32],
        rows: usize,
        out: &mut Vec<f32>,
    ) -> candle_core::Result<()> {
        out.clear();
        if rows == 0 {
            return Ok(());
        }
        let k = x.len() / rows;
        if x.len() != rows * k {
            candle_core::bail!("{} inputs are not {rows} whole rows", x.len());
        }
        match self {
            Linear::Packed(parts) => packed_product(parts, x, rows, k, out)?,
            Linear::Dense(parts) => dense_product(parts, x, rows, k, out)?,
            Linear::Mixed(parts) => {
                let mut products = Vec::with_capacity(parts.len());
                for w in parts {
                    let mut product = Vec::new();
                    match w {
                        Weights::Packed(p) => {
                            packed_product(std::slice::from_ref(p), x, rows, k, &mut product)?
                        }
                        Weights::Dense(d) => {
                            dense_product(std::slice::from_ref(d), x, rows, k, &mut product)?
                        }
                        Weights::Candle(m) => {
                            let t = Tensor::from_slice(x, (rows, k), &Device::Cpu)?;
                            product = m.forward(&t)?.flatten_all()?.to_vec1()?;
                        }
                    }
                    products.push(product);
                }
                let widths: Vec<usize> = products.iter().map(|p| p.len() / rows).collect();
                let width: usize = widths.iter().sum();
                resize_for(out, rows, width);
                for r in 0..rows {
                    let mut at = r * width;
                    for (product, &n) in products.iter().zip(&widths) {
                        out[at..at + n].copy_from_slice(&product[r * n..(r + 1) * n]);
                        at += n;
                    }
                }
            }
        }
        Ok(())
    }
}

/// `out` holding `rows × width` floats, every one of which the caller overwrites.
/// Only the part that grows is zeroed: a pass reuses its buffers for projections of
/// different widths, and zeroing all of them cost 2% of a 16-row pass.
pub(super) fn resize_for(out: &mut Vec<f32>, rows: usize, width: usize) {
    out.truncate(rows * width);
    out.resize(rows * width, 0.0);
}

/// An error unless a matrix of `inputs` inputs takes rows of `k` values.
pub(super) fn check_inputs(inputs: usize, k: usize) -> candle_core::Result<()> {
    if inputs != k {
        candle_core::bail!("a weight matrix takes {inputs} inputs, the layer gives {k}");
    }
    Ok(())
}

/// `x (rows × k)` times the packed parts, fused, outputs side by side in `out`, which is
/// filled without being zeroed first: the kernel writes every element, and zeroing the
/// output head's rows cost 1.5–3% of a pass.
pub(super) fn packed_product(
    parts: &[PackedMatrix],
    x: &[f32],
    rows: usize,
    k: usize,
    out: &mut Vec<f32>,
) -> candle_core::Result<()> {
    parts.iter().try_for_each(|p| check_inputs(p.inputs(), k))?;
    let len = rows * parts.iter().map(|p| p.outputs()).sum::<usize>();
    // SAFETY: `matmul_into` writes every element of its output.
    unsafe { fill_unzeroed(out, len, |spare| packed_forward(parts, x, rows, k, spare)) };
    Ok(())
}

/// `x (rows × k)` times the f32 parts, fused, outputs side by side in `out`.
pub(super) fn dense_product(
    parts: &[DenseMatrix],
    x: &[f32],
    rows: usize,
    k: usize,
    out: &mut Vec<f32>,
) -> candle_core::Result<()> {
    parts.iter().try_for_each(|d| check_inputs(d.inputs(), k))?;
    let len = rows * parts.iter().map(|d| d.outputs()).sum::<usize>();
    // SAFETY: `matmul_dense_into` writes every element of its output.
    unsafe {
        fill_unzeroed(out, len, |spare| {
            matmul_dense_into(Simd::detect(), parts, x, rows, spare)
        })
    };
    Ok(())
}

/// `out` made `len` floats long by `write`, into its spare capacity, without zeroing
/// them first (a pass reuses its buffers, and zeroing a projection's output cost 1–3%
/// of a pass).
///
/// SAFETY: `write` writes every element of the slice it is given.
unsafe fn fill_unzeroed(
    out: &mut Vec<f32>,
    len: usize,
    write: impl FnOnce(&mut [std::mem::MaybeUninit<f32>]),
) {
    out.clear();
    out.reserve(len);
    write(&mut out.spare_capacity_mut()[..len]);
    // SAFETY: `write` wrote all `len` elements (the caller's promise).
    unsafe { out.set_len(len) };
}

/// `x (rows × k)` times the packed parts, outputs side by side in `out`; the activations
/// are quantized once, into a buffer this thread keeps.
pub(super) fn packed_forward(
    parts: &[PackedMatrix],
    x: &[f32],
    rows: usize,
    k: usize,
    out: &mut [std::mem::MaybeUninit<f32>],
) {
    thread_local! {
        static ROWS: std::cell::RefCell<QuantizedRows> = std::cell::RefCell::default();
    }
    ROWS.with(|cell| {
        let mut a = cell.borrow_mut();
        a.quantize(x, rows, k);
        matmul_into(Simd::detect(), parts, &a, out);
    });
}

/// `t (n, k)` as f32 weights for the forward pass: the row-invariant f32 kernel on the
/// CPU, candle's matmul elsewhere.
pub(super) fn dense_of(t: Tensor, device: &Device) -> candle_core::Result<Weights> {
    if !device.is_cpu() {
        return Ok(Weights::Candle(QMatMul::Tensor(t)));
    }
    let (n, k) = t.dims2()?;
    if t.dtype() == DType::BF16 {
        // Kept as bf16: half the bytes a step reads, widened exactly by the kernel.
        let bits = t.flatten_all()?.to_vec1::<half::bf16>()?;
        let bits = bits.into_iter().map(half::bf16::to_bits).collect();
        return Ok(Weights::Dense(DenseMatrix::bf16(n, k, bits)));
    }
    let weights: Vec<f32> = t.to_dtype(DType::F32)?.flatten_all()?.to_vec1()?;
    Ok(Weights::Dense(DenseMatrix::new(n, k, weights)))
}

/// `t` rounded to bf16 for the forward pass (`--weights bf16`): held as bf16 on the CPU
/// (the dense kernel's bf16 weights), as f32 of those values elsewhere.
pub(super) fn bf16_dense_of(t: &Tensor, device: &Device) -> candle_core::Result<Weights> {
    if device.is_cpu() {
        dense_of(t.to_dtype(DType::BF16)?, device)
    } else {
        dense_of(rounded_to_bf16(t)?, device)
    }
}

/// `t` rounded to bf16 and held as f32: the values the bf16 format multiplies by.
pub(super) fn rounded_to_bf16(t: &Tensor) -> candle_core::Result<Tensor> {
    t.to_dtype(DType::BF16)?.to_dtype(DType::F32)
}

/// An RMS norm's weights, on the model's device and on the host.
pub(super) struct NormWeights {
    pub(super) device: Tensor,
    pub(super) host: Vec<f32>,
}

impl NormWeights {
    pub(super) fn new(device: Tensor) -> candle_core::Result<Self> {
        let host = device.to_dtype(DType::F32)?.flatten_all()?.to_vec1()?;
        Ok(NormWeights { device, host })
    }
}

/// The token embedding table. On the CPU a quantized table stays as the file stores it,
/// and the rows a pass looks up are dequantized then: in f32, a large vocabulary's table
/// is several times the file's bytes (Gemma 3 270M's 262,144 × 640 is 671 MB, against
/// 138 MB as Q6_K), and a pass reads a few hundred of its rows at most.
pub(super) enum Embedding {
    /// f32 rows on the model's device.
    Dense(Tensor),
    /// GGML blocks on the host, `rows` rows of `width` values.
    Quantized {
        bytes: Vec<u8>,
        dtype: GgmlDType,
        rows: usize,
        width: usize,
    },
}

impl Embedding {
    /// The table of a file's tensor `qt` (vocabulary × width), for `device`.
    pub(super) fn of(qt: &QTensor, device: &Device) -> candle_core::Result<Self> {
        let dtype = qt.dtype();
        let (rows, width) = qt.shape().dims2()?;
        if !device.is_cpu() || dtype.block_size() == 1 || width % dtype.block_size() != 0 {
            return Ok(Embedding::Dense(qt.dequantize(device)?));
        }
        Ok(Embedding::Quantized {
            bytes: qt.data()?.into_owned(),
            dtype,
            rows,
            width,
        })
    }

    /// Vocabulary size.
    pub(super) fn rows(&self) -> candle_core::Result<usize> {
        match self {
            Embedding::Dense(t) => t.dim(0),
            Embedding::Quantized { rows, .. } => Ok(*rows),
        }
    }

    /// The f32 table on the device, for the device paths (which never hold a quantized
    /// one: see [`Embedding::of`]).
    pub(super) fn dense(&self) -> candle_core::Result<&Tensor> {
        match self {
            Embedding::Dense(t) => Ok(t),
            Embedding::Quantized { .. } => {
                candle_core::bail!("a quantized embedding table is looked up on the host only")
            }
        }
    }

    /// The rows of `ids`, `ids.len() × width` f32 values on the host.
    pub(super) fn lookup(&self, ids: &[u32]) -> candle_core::Result<Vec<f32>> {
        let (bytes, dtype, rows, width) = match self {
            Embedding::Dense(t) => {
                let ids = Tensor::new(ids, t.device())?;
                return t.index_select(&ids, 0)?.flatten_all()?.to_vec1();
            }
            Embedding::Quantized {
                bytes,
                dtype,
                rows,
                width,
            } => (bytes, *dtype, *rows, *width),
        };
        let row_bytes = width / dtype.block_size() * dtype.type_size();
        let mut picked = Vec::with_capacity(ids.len() * row_bytes);
        for &id in ids {
            let id = id as usize;
            if id >= rows {
                candle_core::bail!("token id {id} is outside the vocabulary of {rows}");
            }
            picked.extend_from_slice(&bytes[id * row_bytes..(id + 1) * row_bytes]);
        }
        let storage = QStorage::from_data(std::borrow::Cow::Owned(picked), &Device::Cpu, dtype)?;
        QTensor::new(storage, (ids.len(), width))?
            .dequantize(&Device::Cpu)?
            .flatten_all()?
            .to_vec1()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::kernels::dense::matmul_dense;

    /// An unquantized file's matrices (F32, F16, BF16) run on the row-invariant dense
    /// kernel, with the file's values (BF16's with inputs rounded to bf16), and a 1-row
    /// product is the K-row product's row.
    #[test]
    fn unquantized_weights_run_on_the_exact_dense_kernel() {
        let (n, k) = (24, 64);
        let values = crate::model::kernels::test_values(n * k, 67, 1.0);
        let matrix = Tensor::from_vec(values.clone(), (n, k), &Device::Cpu).unwrap();
        let x = crate::model::kernels::test_values(3 * k, 68, 1.0);
        for dtype in [GgmlDType::F32, GgmlDType::F16, GgmlDType::BF16] {
            let qt = QTensor::quantize(&matrix, dtype).unwrap();
            let exact: Vec<f32> = qt
                .dequantize(&Device::Cpu)
                .unwrap()
                .flatten_all()
                .unwrap()
                .to_vec1()
                .unwrap();
            let Weights::Dense(dense) = weights_of(qt, &Device::Cpu).unwrap() else {
                panic!("{dtype:?} weights did not get the dense kernel");
            };
            let simd = Simd::detect();
            let mut three = vec![0f32; 3 * n];
            matmul_dense(simd, std::slice::from_ref(&dense), &x, 3, &mut three);
            for r in 0..3 {
                let mut one = vec![0f32; n];
                matmul_dense(
                    simd,
                    std::slice::from_ref(&dense),
                    &x[r * k..][..k],
                    1,
                    &mut one,
                );
                assert_eq!(one, three[r * n..][..n], "{dtype:?} row {r}");
                for c in 0..n {
                    // A bf16 matrix meets inputs rounded to bf16 (`kernels::dense::bf16`).
                    let input = |v: f32| match dtype {
                        GgmlDType::BF16 => half::bf16::from_f32(v).to_f32(),
                        _ => v,
                    };
                    let want: f64 = (0..k)
                        .map(|i| input(x[r * k + i]) as f64 * exact[c * k + i] as f64)
                        .sum();
                    assert!((one[c] as f64 - want).abs() < 1e-3, "{dtype:?} ({r},{c})");
                }
            }
        }
    }

    #[test]
    fn a_quantized_table_looks_up_the_rows_of_the_dequantized_one() {
        let (vocab, width) = (300, 256);
        let values = crate::model::kernels::test_values(vocab * width, 46, 1.0);
        let table = Tensor::from_vec(values, (vocab, width), &Device::Cpu).unwrap();
        let ids = [0u32, 299, 17, 17, 150];
        for dtype in [GgmlDType::Q6K, GgmlDType::Q8_0, GgmlDType::Q4K] {
            let qt = QTensor::quantize(&table, dtype).unwrap();
            let embedding = Embedding::of(&qt, &Device::Cpu).unwrap();
            assert!(matches!(embedding, Embedding::Quantized { .. }));
            assert_eq!(embedding.rows().unwrap(), vocab);
            let dense = Embedding::Dense(qt.dequantize(&Device::Cpu).unwrap());
            assert_eq!(
                embedding.lookup(&ids).unwrap(),
                dense.lookup(&ids).unwrap(),
                "{dtype:?}"
            );
            let err = embedding.lookup(&[3, 300]).unwrap_err().to_string();
            assert!(err.contains("token id 300"), "{err}");
        }
    }
}
