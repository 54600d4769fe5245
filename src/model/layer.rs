//! The weights of one transformer block and the rotary tables its attention reads: what
//! the CPU pass and the GPU's kernels both run from.

use candle_core::{DType, Device, Tensor};

use super::arch::RopeSpec;
use super::error::ModelError;
use super::linear::{Linear, NormWeights};

/// One transformer block's weights, with what its family adds to llama's.
pub(super) struct Layer {
    pub(super) attn_norm: NormWeights,
    /// q, k and v side by side.
    pub(super) qkv: Linear,
    /// Their biases side by side (Qwen 2).
    pub(super) qkv_bias: Option<Vec<f32>>,
    /// RMS norm weights of each head of q and of k (Qwen 3, Gemma 3).
    pub(super) q_norm: Option<NormWeights>,
    pub(super) k_norm: Option<NormWeights>,
    pub(super) wo: Linear,
    /// The norm of attention's output before the residual (Gemma 3).
    pub(super) post_attn_norm: Option<NormWeights>,
    pub(super) ffn_norm: NormWeights,
    /// Gate and up side by side.
    pub(super) gate_up: Linear,
    pub(super) down: Linear,
    /// The norm of the feed-forward's output before the residual (Gemma 3).
    pub(super) post_ffn_norm: Option<NormWeights>,
    /// This layer's sliding window, if it has one.
    pub(super) window: Option<usize>,
    /// Which of the model's RoPE tables this layer uses.
    pub(super) rope: usize,
}

impl Layer {
    /// Whether the layer is llama's block and nothing more: what candle's operations run
    /// on a GPU.
    pub(super) fn is_plain(&self) -> bool {
        self.qkv_bias.is_none()
            && self.q_norm.is_none()
            && self.k_norm.is_none()
            && self.post_attn_norm.is_none()
            && self.post_ffn_norm.is_none()
            && self.window.is_none()
            && self.rope == 0
    }
}

/// One table of rotary angles, `head_dim / 2` per position for the whole context, on the
/// device and on the host.
pub(super) struct RopeTable {
    pub(super) cos: Tensor,
    pub(super) sin: Tensor,
    pub(super) cos_host: Vec<f32>,
    pub(super) sin_host: Vec<f32>,
}

impl RopeTable {
    pub(super) fn new(
        spec: &RopeSpec,
        head_dim: usize,
        context: usize,
        device: &Device,
    ) -> Result<Self, ModelError> {
        let inv = spec.inverse_frequencies(head_dim);
        let inv = Tensor::new(inv, device)?.reshape((1, head_dim / 2))?;
        let pos = Tensor::arange(0u32, context as u32, device)?
            .to_dtype(DType::F32)?
            .reshape((context, 1))?;
        let freqs = pos.broadcast_mul(&inv)?;
        let (mut cos, mut sin) = (freqs.cos()?, freqs.sin()?);
        if spec.scale != 1.0 {
            let scale = f64::from(spec.scale);
            (cos, sin) = ((cos * scale)?, (sin * scale)?);
        }
        Ok(RopeTable {
            cos_host: cos.flatten_all()?.to_vec1()?,
            sin_host: sin.flatten_all()?.to_vec1()?,
            cos,
            sin,
        })
    }
}
