//! The model onto the device: the loader's tensors checked against what the kernels
//! take, converted to the kernels' layout (f32, or bf16 weight matrices) and copied, and
//! the kernels loaded for it.

use std::sync::{Arc, Mutex};

use candle_core::cuda_backend::cudarc::driver::{CudaSlice, CudaStream, DeviceRepr};
use candle_core::{CudaDevice, DType, Storage, Tensor};

use super::kv::KvKeeper;
use super::module::Kernels;
use super::{
    ATTENTION_THREADS, CudaError, CudaForward, DeviceLayer, HEADS_MAX_HEAD_DIM, HeadParts, Matrix,
};
use crate::model::config::{ModelConfig, WeightFormat};
use crate::model::error::ModelError;
use crate::model::kernels::activation::Activation;
use crate::model::kernels::norm::RopePairs;
use crate::model::layer::{Layer, RopeTable};
use crate::model::linear::{Linear, NormWeights};

/// A layer's tensors, as the loader has them on the device (f32, `n × k`).
struct LayerTensors {
    attn_norm: Tensor,
    /// q, k and v stacked.
    qkv: Tensor,
    /// Their biases, side by side (Qwen 2).
    qkv_bias: Option<Vec<f32>>,
    /// The norms of each head of q and of k (Qwen 3, Gemma 3).
    q_norm: Option<Tensor>,
    k_norm: Option<Tensor>,
    wo: Tensor,
    post_attn_norm: Option<Tensor>,
    ffn_norm: Tensor,
    /// Gate and up stacked.
    gate_up: Tensor,
    down: Tensor,
    post_ffn_norm: Option<Tensor>,
    window: Option<usize>,
    rope: usize,
}

/// The device pass for a model loaded on `device`, when it can run there: a CUDA GPU,
/// f32 or bf16 weights, a shape the kernels take, and `SUFFIXD_DEVICE_KERNELS` not
/// `off` (which keeps candle's operations, with attention on the host: the path before
/// these kernels, kept to compare against). None otherwise.
#[allow(clippy::too_many_arguments)]
pub(in crate::model) fn build(
    cfg: &ModelConfig,
    embed: &Tensor,
    layers: &[Layer],
    norm: &NormWeights,
    head: &Linear,
    ropes: &[RopeTable],
    device: &candle_core::Device,
    format: WeightFormat,
) -> Result<Option<CudaForward>, ModelError> {
    let candle_core::Device::Cuda(gpu) = device else {
        return Ok(None);
    };
    let bf16 = match format {
        WeightFormat::F32 => false,
        WeightFormat::Bf16 => true,
        WeightFormat::Native | WeightFormat::Q8_0 => return Ok(None),
    };
    if std::env::var("SUFFIXD_DEVICE_KERNELS").is_ok_and(|v| v == "off") {
        tracing::warn!("SUFFIXD_DEVICE_KERNELS=off: candle's operations, attention on the host");
        return Ok(None);
    }
    let tensors = layers
        .iter()
        .map(|l| {
            Some(LayerTensors {
                attn_norm: l.attn_norm.device.clone(),
                qkv: l.qkv.device_matrix()?,
                qkv_bias: l.qkv_bias.clone(),
                q_norm: l.q_norm.as_ref().map(|n| n.device.clone()),
                k_norm: l.k_norm.as_ref().map(|n| n.device.clone()),
                wo: l.wo.device_matrix()?,
                post_attn_norm: l.post_attn_norm.as_ref().map(|n| n.device.clone()),
                ffn_norm: l.ffn_norm.device.clone(),
                gate_up: l.gate_up.device_matrix()?,
                down: l.down.device_matrix()?,
                post_ffn_norm: l.post_ffn_norm.as_ref().map(|n| n.device.clone()),
                window: l.window,
                rope: l.rope,
            })
        })
        .collect::<Option<Vec<_>>>();
    let (Some(tensors), Some(head)) = (tensors, head.device_matrix()) else {
        return Ok(None);
    };
    match CudaForward::new(gpu, cfg, embed, &tensors, &norm.device, &head, ropes, bf16) {
        Ok(forward) => Ok(Some(forward)),
        Err(CudaError::Shape(why)) => {
            tracing::warn!("{why}: candle's operations run this model, with attention on the host");
            Ok(None)
        }
        Err(e) => Err(e.into()),
    }
}

/// `t`'s elements, contiguous, as a fresh device buffer of `T`.
fn buffer_of<T: candle_core::cuda_backend::CudaDType + DeviceRepr>(
    stream: &Arc<CudaStream>,
    t: &Tensor,
) -> Result<CudaSlice<T>, CudaError> {
    let t = t.contiguous()?;
    let (storage, layout) = t.storage_and_layout();
    let Storage::Cuda(c) = &*storage else {
        return Err(CudaError::Shape("a weight is not on the GPU".into()));
    };
    let s = c.as_cuda_slice::<T>()?;
    let start = layout.start_offset();
    let view = s.slice(start..start + t.elem_count());
    Ok(stream.clone_dtod(&view)?)
}

impl CudaForward {
    /// Upload the model to the kernels' layout: f32 weights, or bf16 when `bf16`.
    #[allow(clippy::too_many_arguments)]
    fn new(
        device: &CudaDevice,
        cfg: &ModelConfig,
        embed: &Tensor,
        layers: &[LayerTensors],
        norm: &Tensor,
        head: &Tensor,
        ropes: &[RopeTable],
        bf16: bool,
    ) -> Result<Self, CudaError> {
        let (ffn, halves) = check_shape(cfg, layers, ropes)?;
        let stream = device.cuda_stream();
        let (kernels, module) = Kernels::load(&stream, cfg, ffn, bf16)?;
        let f = |name: &str| module.load_function(name);
        let keeper = Arc::new(KvKeeper {
            stream: stream.clone(),
            keep: f("kv_keep")?,
            blocks: f("kv_blocks")?,
            layers: cfg.layers,
            row: cfg.kv_heads * cfg.head_dim,
            context: cfg.context,
        });
        let f32s = |t: &Tensor| f32s(&stream, t);
        let layers = layers
            .iter()
            .map(|l| upload_layer(&stream, l, halves, bf16))
            .collect::<Result<Vec<_>, CudaError>>()?;
        let (embed, norm, head) = (f32s(embed)?, f32s(norm)?, matrix_of(&stream, head, bf16)?);
        let ropes = ropes
            .iter()
            .map(|t| Ok((f32s(&t.cos)?, f32s(&t.sin)?)))
            .collect::<Result<Vec<_>, CudaError>>()?;
        // The copies ran on this thread's stream; the passes may run on another's.
        stream.synchronize()?;
        Ok(CudaForward {
            cfg: cfg.clone(),
            device: device.clone(),
            embed,
            norm,
            head,
            ropes,
            layers,
            ffn,
            kernels,
            keeper,
            stream,
            scratch: Mutex::default(),
        })
    }
}

/// Whether the kernels take a model of `cfg`'s shape with these layers; its
/// feed-forward width, and whether RoPE rotates halves, when they do.
fn check_shape(
    cfg: &ModelConfig,
    layers: &[LayerTensors],
    ropes: &[RopeTable],
) -> Result<(usize, bool), CudaError> {
    let (w, hd) = (cfg.width, cfg.head_dim);
    let qw = cfg.heads * hd;
    let ffn = layers
        .first()
        .map(|l| l.gate_up.dim(0))
        .transpose()?
        .unwrap_or(0)
        / 2;
    let need = |ok: bool, what: &str| {
        if ok {
            Ok(())
        } else {
            Err(CudaError::Shape(what.into()))
        }
    };
    need(
        w.is_multiple_of(8) && qw.is_multiple_of(8) && ffn.is_multiple_of(8),
        "widths must be multiples of 8",
    )?;
    need(
        hd.is_multiple_of(8) && (ATTENTION_THREADS as usize).is_multiple_of(hd)
            || hd == 2 * ATTENTION_THREADS as usize,
        "head_dim must be a multiple of 8 that divides 128, or 256",
    )?;
    need(
        matches!(cfg.activation, Activation::Silu | Activation::GeluTanh),
        "the feed-forward's gate must be SiLU or GELU (tanh)",
    )?;
    need(
        layers.iter().all(|l| l.rope < ropes.len()),
        "a layer names a RoPE table the model does not have",
    )?;
    let halves = cfg.rope_pairs == RopePairs::Halves;
    let with_heads = halves
        || layers
            .iter()
            .any(|l| l.qkv_bias.is_some() || l.q_norm.is_some() || l.k_norm.is_some());
    need(
        !with_heads || (hd <= HEADS_MAX_HEAD_DIM && hd.is_multiple_of(2)),
        "q|k|v biases and head norms need head_dim even and at most 256",
    )?;
    need(
        cfg.heads.is_multiple_of(cfg.kv_heads),
        "heads must be a multiple of kv_heads",
    )?;
    need(
        cfg.vocab.is_multiple_of(4),
        "the vocabulary must be a multiple of 4",
    )?;
    Ok((ffn, halves))
}

/// `weights`' matrix on the device, in bf16 when `bf16`, else f32.
fn matrix_of(stream: &Arc<CudaStream>, t: &Tensor, bf16: bool) -> Result<Matrix, CudaError> {
    Ok(if bf16 {
        Matrix::Bf16(buffer_of(stream, &t.to_dtype(DType::BF16)?)?)
    } else {
        Matrix::F32(buffer_of(stream, &t.to_dtype(DType::F32)?)?)
    })
}

/// `t` on the device in f32.
fn f32s(stream: &Arc<CudaStream>, t: &Tensor) -> Result<CudaSlice<f32>, CudaError> {
    buffer_of::<f32>(stream, &t.to_dtype(DType::F32)?)
}

/// One layer on the device; with its [`HeadParts`] when it has any, or when RoPE rotates
/// `halves` (which `qkv_heads` applies).
fn upload_layer(
    stream: &Arc<CudaStream>,
    l: &LayerTensors,
    halves: bool,
    bf16: bool,
) -> Result<DeviceLayer, CudaError> {
    let f32s = |t: &Tensor| f32s(stream, t);
    let matrix = |t: &Tensor| matrix_of(stream, t, bf16);
    let heads = if halves || l.qkv_bias.is_some() || l.q_norm.is_some() || l.k_norm.is_some() {
        Some(HeadParts {
            bias: l
                .qkv_bias
                .as_ref()
                .map(|b| stream.clone_htod(b.as_slice()))
                .transpose()?,
            q_norm: l.q_norm.as_ref().map(f32s).transpose()?,
            k_norm: l.k_norm.as_ref().map(f32s).transpose()?,
        })
    } else {
        None
    };
    Ok(DeviceLayer {
        attn_norm: f32s(&l.attn_norm)?,
        qkv: matrix(&l.qkv)?,
        heads,
        wo: matrix(&l.wo)?,
        post_attn_norm: l.post_attn_norm.as_ref().map(f32s).transpose()?,
        ffn_norm: f32s(&l.ffn_norm)?,
        gate_up: matrix(&l.gate_up)?,
        down: matrix(&l.down)?,
        post_ffn_norm: l.post_ffn_norm.as_ref().map(f32s).transpose()?,
        window: l.window.map_or(0, |w| w.min(i32::MAX as usize) as i32),
        rope: l.rope,
    })
}
