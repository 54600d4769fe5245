//! A model from a Hugging Face directory: `config.json` and safetensors weights, for
//! every family in [`Family`].
//!
//! Hugging Face pairs each head's values i and i + head_dim/2 for RoPE; the rows of q and
//! k (with their biases and head norms) are reordered into adjacent pairs, as llama.cpp's
//! converter does for llama, so that every directory runs like a llama GGUF.

use std::collections::HashSet;
use std::path::Path;
use std::sync::Mutex;

use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{DType, Device, Tensor};

use super::{
    HfConfig, HfLayout, finite, rope_rows_interleaved, safetensors_files, unread_refusal,
    without_positions,
};
use crate::model::arch::{Family, RopeSpec};
use crate::model::forward::{Model, ModelConfig, ModelError, WeightFormat};
use crate::model::kernels::norm::RopePairs;
use crate::model::layer::Layer;
use crate::model::linear::{
    Embedding, Linear, NormWeights, Weights, bf16_dense_of, dense_of, weights_of,
};

/// Where a Hugging Face model's tensors come from, by their checkpoint names: the
/// safetensors files, or seeded random weights of a named shape ([`super::synthetic`]).
pub(super) trait HfTensors {
    /// Whether the checkpoint has tensor `name`.
    fn has(&self, name: &str) -> bool;
    /// Tensor `name` in f32 on `device`; an error says what is wrong with it.
    fn tensor(&self, name: &str, device: &Device) -> Result<Tensor, String>;
}

/// The tensors of safetensors files, mapped, and the names read so far.
struct Mapped {
    st: candle_core::safetensors::MmapedSafetensors,
    names: HashSet<String>,
    read: Mutex<HashSet<String>>,
}

impl Mapped {
    /// The checkpoint's tensors that nothing read, sorted, apart from RoPE tables that
    /// older checkpoints saved beside the weights (suffixd computes its own).
    fn unread(&self) -> Vec<String> {
        let read = self.read.lock().unwrap_or_else(|e| e.into_inner());
        let mut unread: Vec<String> = (self.names.iter())
            .filter(|n| !read.contains(*n) && !n.ends_with("rotary_emb.inv_freq"))
            .cloned()
            .collect();
        unread.sort();
        unread
    }
}

impl HfTensors for Mapped {
    fn has(&self, name: &str) -> bool {
        self.names.contains(name)
    }

    fn tensor(&self, name: &str, device: &Device) -> Result<Tensor, String> {
        (self.read.lock().unwrap_or_else(|e| e.into_inner())).insert(name.to_string());
        // A NaN or infinite weight would turn every logit it reaches into NaN.
        if let Ok(view) = self.st.get(name) {
            let dtype = match view.dtype() {
                safetensors::Dtype::F32 => Some(GgmlDType::F32),
                safetensors::Dtype::F16 => Some(GgmlDType::F16),
                safetensors::Dtype::BF16 => Some(GgmlDType::BF16),
                _ => None,
            };
            if let Some(at) = dtype.and_then(|d| finite::first_non_finite(d, view.data())) {
                return Err(format!(
                    "has a NaN or infinite value at {at}: the file is damaged or was written wrong; use another copy"
                ));
            }
        }
        self.st
            .load(name, device)
            .and_then(|t| t.to_dtype(DType::F32))
            .map_err(|e| e.to_string())
    }
}

impl Model {
    /// Load a Hugging Face directory: `config.json` and `model.safetensors` (or the
    /// shards that `model.safetensors.index.json` names). Weights in f16, bf16 or f32;
    /// `Native` keeps them as f32. `max_context` caps the KV cache.
    pub fn load_safetensors(
        dir: &Path,
        format: WeightFormat,
        max_context: usize,
        device: &Device,
    ) -> Result<Self, ModelError> {
        let fmt = |message: String| ModelError::Format {
            path: dir.into(),
            message,
        };
        let (hf, family) = HfConfig::read(dir)?;
        // The config's own faults first: they name what to fix whatever the weights.
        hf.layout(family).map_err(fmt)?;
        let files = safetensors_files(dir)?;
        for file in &files {
            crate::files::check_regular(file, "safetensors file").map_err(|source| {
                ModelError::Io {
                    path: file.clone(),
                    source,
                }
            })?;
        }
        // SAFETY: the files are mapped read-only; candle checks every tensor's extent
        // against the file before it reads it.
        let st = unsafe { candle_core::safetensors::MmapedSafetensors::multi(&files) }
            .map_err(|e| fmt(format!("cannot map the safetensors files: {e}")))?;
        let names = st.tensors().into_iter().map(|(name, _)| name).collect();
        let mapped = Mapped {
            st,
            names,
            read: Mutex::default(),
        };
        let model = Self::from_hf(dir, &hf, family, &mapped, format, max_context, device)?;
        match unread_refusal(&mapped.unread(), family, "the checkpoint's") {
            Some(refusal) => Err(fmt(refusal)),
            None => Ok(model),
        }
    }

    /// The model a Hugging Face config describes, its tensors from `source` (`origin`
    /// names where they come from, for errors).
    pub(super) fn from_hf(
        origin: &Path,
        hf: &HfConfig,
        family: Family,
        source: &dyn HfTensors,
        format: WeightFormat,
        max_context: usize,
        device: &Device,
    ) -> Result<Self, ModelError> {
        let (heads, width) = (hf.num_attention_heads, hf.hidden_size);
        let HfLayout {
            kv_heads,
            head_dim,
            context,
            rope: global_rope,
            sliding_rope,
            windows,
            positionless,
        } = hf.layout(family).map_err(|message| ModelError::Format {
            path: origin.into(),
            message,
        })?;
        let r = HfReader {
            origin,
            source,
            format,
            device,
            family,
            heads,
            kv_heads,
            head_dim,
        };
        let embed = r.tensor("model.embed_tokens.weight")?;
        let vocab = embed.dim(0)?;
        // Tied when the checkpoint has no head of its own.
        let head = Linear::new(vec![if source.has("lm_head.weight") {
            r.matrix(r.tensor("lm_head.weight")?)?
        } else {
            r.matrix(embed.clone())?
        }]);
        let mut layers = windows
            .into_iter()
            .enumerate()
            .map(|(i, window)| r.layer(i, window))
            .collect::<Result<Vec<_>, _>>()?;
        let final_norm = r.norm("model.norm.weight")?;
        let rope_base = global_rope.base;
        let mut ropes: Vec<RopeSpec> = std::iter::once(global_rope).chain(sliding_rope).collect();
        without_positions(&mut ropes, &mut layers, &positionless, head_dim);
        let block = family.block();
        let cfg = ModelConfig {
            family,
            layers: hf.num_hidden_layers,
            heads,
            kv_heads,
            head_dim,
            width,
            vocab,
            context: max_context.min(context).max(1),
            rope_base,
            rms_eps: hf.rms_norm_eps as f32,
            attn_scale: 1.0 / hf.query_pre_attn_scalar.unwrap_or(head_dim as f32).sqrt(),
            activation: block.activation,
            embed_scale: block.embed_scale.then(|| (width as f32).sqrt()),
            rope_pairs: RopePairs::Adjacent,
            sliding_window: layers.iter().find_map(|l| l.window),
        };
        Self::assemble(
            cfg,
            Embedding::Dense(embed),
            layers,
            final_norm,
            head,
            &ropes,
            device,
            format,
        )
    }
}

/// Reading one checkpoint's tensors into the model's layout: q and k rows (and their
/// biases and head norms) reordered into adjacent RoPE pairs, norms with the family's
/// offset, matrices in the weight format asked for.
struct HfReader<'a> {
    origin: &'a Path,
    source: &'a dyn HfTensors,
    format: WeightFormat,
    device: &'a Device,
    family: Family,
    heads: usize,
    kv_heads: usize,
    head_dim: usize,
}

impl HfReader<'_> {
    fn error(&self, message: String) -> ModelError {
        ModelError::Format {
            path: self.origin.into(),
            message,
        }
    }

    fn tensor(&self, name: &str) -> Result<Tensor, ModelError> {
        self.source
            .tensor(name, self.device)
            .map_err(|e| self.error(format!("tensor {name}: {e}")))
    }

    fn matrix(&self, t: Tensor) -> Result<Weights, ModelError> {
        let device = self.device;
        match self.format {
            // On the CPU a bf16 checkpoint stays bf16 natively, and `--weights f32`
            // widens it (devices take the tensor as it comes, as before).
            WeightFormat::F32 if device.is_cpu() => Ok(dense_of(t.to_dtype(DType::F32)?, device)?),
            WeightFormat::Native | WeightFormat::F32 => Ok(dense_of(t, device)?),
            WeightFormat::Bf16 => Ok(bf16_dense_of(&t, device)?),
            WeightFormat::Q8_0 => weights_of(QTensor::quantize(&t, GgmlDType::Q8_0)?, device)
                .map_err(|e| self.error(e.to_string())),
        }
    }

    fn norm(&self, name: &str) -> Result<NormWeights, ModelError> {
        let offset = self.family.block().hf_norm_offset as f64;
        Ok(NormWeights::new(self.tensor(name)?.affine(1.0, offset)?)?)
    }

    /// A head norm's weights in the adjacent-pairs order of its heads' values.
    fn head_norm(&self, name: &str) -> Result<NormWeights, ModelError> {
        let offset = self.family.block().hf_norm_offset as f64;
        let w = self.tensor(name)?.affine(1.0, offset)?;
        Ok(NormWeights::new(
            rope_rows_interleaved(&w.reshape((self.head_dim, 1))?, 1)?.flatten_all()?,
        )?)
    }

    /// Whether the checkpoint has `name`; an error when the family `needed` it.
    fn part(&self, needed: bool, name: &str) -> Result<bool, ModelError> {
        match (needed, self.source.has(name)) {
            (true, false) => Err(self.error(format!("{:?} needs tensor {name}", self.family))),
            (_, here) => Ok(here),
        }
    }

    /// A bias of `n` heads' rows, reordered as its projection's rows are.
    fn bias_rows(&self, name: &str, n: usize) -> Result<Vec<f32>, ModelError> {
        let b = self.tensor(name)?;
        let len = b.dim(0)?;
        Ok(rope_rows_interleaved(&b.reshape((len, 1))?, n)?
            .flatten_all()?
            .to_vec1()?)
    }

    /// Layer `i`, sliding over `window` if it has one.
    fn layer(&self, i: usize, window: Option<usize>) -> Result<Layer, ModelError> {
        let block = self.family.block();
        let p = |s: &str| format!("model.layers.{i}.{s}");
        let qkv_bias = if self.part(block.qkv_bias, &p("self_attn.q_proj.bias"))? {
            let mut bias = self.bias_rows(&p("self_attn.q_proj.bias"), self.heads)?;
            bias.extend(self.bias_rows(&p("self_attn.k_proj.bias"), self.kv_heads)?);
            bias.extend(self.tensor(&p("self_attn.v_proj.bias"))?.to_vec1::<f32>()?);
            Some(bias)
        } else {
            None
        };
        // Norms by the family, not by presence: Gemma's post-attention norm has the
        // name llama gives its feed-forward norm.
        let optional = |wanted: bool,
                        name: &str,
                        read: &dyn Fn(&str) -> Result<NormWeights, ModelError>|
         -> Result<Option<NormWeights>, ModelError> {
            if wanted && self.part(true, &p(name))? {
                Ok(Some(read(&p(name))?))
            } else {
                Ok(None)
            }
        };
        let head_norm = |name: &str| self.head_norm(name);
        let norm = |name: &str| self.norm(name);
        // Gemma 3 norms the feed-forward's input as `pre_feedforward_layernorm`, and
        // calls its post-attention norm what llama calls its feed-forward norm.
        let ffn_norm_name = if block.sandwich_norms {
            "pre_feedforward_layernorm"
        } else {
            "post_attention_layernorm"
        };
        let projection = |name: &str, heads: usize| -> Result<Weights, ModelError> {
            self.matrix(rope_rows_interleaved(&self.tensor(&p(name))?, heads)?)
        };
        Ok(Layer {
            attn_norm: self.norm(&p("input_layernorm.weight"))?,
            qkv: Linear::new(vec![
                projection("self_attn.q_proj.weight", self.heads)?,
                projection("self_attn.k_proj.weight", self.kv_heads)?,
                self.matrix(self.tensor(&p("self_attn.v_proj.weight"))?)?,
            ]),
            qkv_bias,
            q_norm: optional(block.qk_norm, "self_attn.q_norm.weight", &head_norm)?,
            k_norm: optional(block.qk_norm, "self_attn.k_norm.weight", &head_norm)?,
            wo: Linear::new(vec![
                self.matrix(self.tensor(&p("self_attn.o_proj.weight"))?)?,
            ]),
            post_attn_norm: optional(
                block.sandwich_norms,
                "post_attention_layernorm.weight",
                &norm,
            )?,
            ffn_norm: self.norm(&p(&format!("{ffn_norm_name}.weight")))?,
            gate_up: Linear::new(vec![
                self.matrix(self.tensor(&p("mlp.gate_proj.weight"))?)?,
                self.matrix(self.tensor(&p("mlp.up_proj.weight"))?)?,
            ]),
            down: Linear::new(vec![self.matrix(self.tensor(&p("mlp.down_proj.weight"))?)?]),
            post_ffn_norm: optional(
                block.sandwich_norms,
                "post_feedforward_layernorm.weight",
                &norm,
            )?,
            // Gemma's sliding layers have their own RoPE table; Mistral's one.
            rope: usize::from(window.is_some() && self.family == Family::Gemma3),
            window,
        })
    }
}
