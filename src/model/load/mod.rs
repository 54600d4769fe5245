//! Reading a model's files: GGUF metadata, a Hugging Face directory's `config.json` and
//! safetensors shards, and the row order llama.cpp's converter gives q and k; the
//! loaders themselves, one per format, in [`gguf`] and [`hf`].

mod finite;
mod gguf;
mod hf;
pub mod synthetic;

use std::path::{Path, PathBuf};

use candle_core::Tensor;
use candle_core::quantized::gguf_file;

use super::arch::{Family, RopeSpec, SUPPORTED_HF, gemma_layer_slides, llama3_rope_divisors};
use super::forward::ModelError;
use super::kernels::activation::Activation;

pub(super) fn md_u32(c: &gguf_file::Content, key: &str) -> Result<u32, String> {
    c.metadata
        .get(key)
        .ok_or_else(|| format!("missing metadata {key}"))?
        .to_u32()
        .map_err(|e| format!("{key}: {e}"))
}

pub(super) fn md_f32(c: &gguf_file::Content, key: &str) -> Option<f32> {
    c.metadata.get(key).and_then(|v| v.to_f32().ok())
}

/// The keys of a Hugging Face `config.json` that the forward pass needs.
#[derive(serde::Deserialize)]
pub(super) struct HfConfig {
    #[serde(default)]
    pub(super) model_type: Option<String>,
    pub(super) hidden_size: usize,
    pub(super) num_attention_heads: usize,
    #[serde(default)]
    pub(super) num_key_value_heads: Option<usize>,
    #[serde(default)]
    pub(super) head_dim: Option<usize>,
    pub(super) num_hidden_layers: usize,
    pub(super) rms_norm_eps: f64,
    #[serde(default = "default_rope_theta")]
    pub(super) rope_theta: f32,
    pub(super) max_position_embeddings: usize,
    #[serde(default)]
    pub(super) rope_scaling: Option<serde_json::Value>,
    #[serde(default)]
    pub(super) hidden_act: Option<String>,
    /// Gemma's name for `hidden_act`.
    #[serde(default)]
    pub(super) hidden_activation: Option<String>,
    #[serde(default)]
    pub(super) sliding_window: Option<usize>,
    /// Qwen 2's switch for its sliding window (off in its released models).
    #[serde(default)]
    pub(super) use_sliding_window: Option<bool>,
    /// Gemma 3: every n-th layer is global.
    #[serde(default)]
    pub(super) sliding_window_pattern: Option<usize>,
    /// Gemma 3 in newer configs: each layer's kind, "sliding_attention" or
    /// "full_attention".
    #[serde(default)]
    pub(super) layer_types: Option<Vec<String>>,
    /// Gemma 3: the sliding layers' RoPE base.
    #[serde(default)]
    pub(super) rope_local_base_freq: Option<f32>,
    /// Gemma 3: attention scores are scaled by its inverse square root.
    #[serde(default)]
    pub(super) query_pre_attn_scalar: Option<f32>,
}

pub(super) fn default_rope_theta() -> f32 {
    10000.0
}

impl HfConfig {
    /// Read `dir/config.json` and name its family.
    pub(super) fn read(dir: &Path) -> Result<(Self, Family), ModelError> {
        let path = dir.join("config.json");
        let text =
            crate::files::read_regular_to_string(&path, "model config.json").map_err(|source| {
                ModelError::Io {
                    path: path.clone(),
                    source,
                }
            })?;
        Self::parse(&text, &path)
    }

    /// A `config.json`'s text (from `path`, for errors), and its family.
    pub(super) fn parse(text: &str, path: &Path) -> Result<(Self, Family), ModelError> {
        let fmt = |message: String| ModelError::Format {
            path: path.into(),
            message,
        };
        let cfg: HfConfig =
            serde_json::from_str(text).map_err(|e| fmt(format!("not a model config.json: {e}")))?;
        let model_type = cfg.model_type.as_deref().unwrap_or("llama");
        let family = Family::from_hf(model_type).ok_or_else(|| {
            fmt(format!(
                "model_type {model_type:?} is not supported; suffixd loads {SUPPORTED_HF}"
            ))
        })?;
        let act = cfg
            .hidden_act
            .as_deref()
            .or(cfg.hidden_activation.as_deref());
        let want = match family.block().activation {
            Activation::Silu => "silu",
            Activation::GeluTanh => "gelu_pytorch_tanh",
        };
        if let Some(a) = act.filter(|a| *a != want) {
            return Err(fmt(format!(
                "hidden activation {a:?} is not supported for {model_type} ({want} only)"
            )));
        }
        if family == Family::Qwen2 && cfg.use_sliding_window == Some(true) {
            return Err(fmt("Qwen 2's use_sliding_window is not supported".into()));
        }
        Ok((cfg, family))
    }

    /// The RoPE table of the global layers, with the config's scaling.
    pub(super) fn rope(&self, head_dim: usize) -> Result<RopeSpec, String> {
        let base = self.rope_theta;
        let Some(scaling) = self.rope_scaling.as_ref().filter(|v| !v.is_null()) else {
            return Ok(RopeSpec {
                base,
                divisors: Vec::new(),
            });
        };
        let kind = scaling["rope_type"]
            .as_str()
            .or(scaling["type"].as_str())
            .unwrap_or("default");
        let number = |k: &str| {
            scaling[k]
                .as_f64()
                .map(|v| v as f32)
                .ok_or_else(|| format!("rope_scaling {kind:?} needs a number {k}"))
        };
        let divisors = match kind {
            "default" => Vec::new(),
            "linear" => vec![number("factor")?; head_dim / 2],
            "llama3" => llama3_rope_divisors(
                head_dim,
                base,
                number("factor")?,
                number("low_freq_factor")?,
                number("high_freq_factor")?,
                number("original_max_position_embeddings")?,
            ),
            other => {
                return Err(format!(
                    "rope_scaling {other:?} is not supported (linear and llama3 are)"
                ));
            }
        };
        Ok(RopeSpec { base, divisors })
    }

    /// Each layer's sliding window: Mistral's on every layer, Gemma's on all but every
    /// n-th.
    /// What the config's sizes make of the block: key/value heads, head width, the
    /// global RoPE and each layer's window. Its faults are the config's, named.
    pub(super) fn layout(&self, family: Family) -> Result<HfLayout, String> {
        let heads = self.num_attention_heads;
        let kv_heads = self.num_key_value_heads.unwrap_or(heads);
        let head_dim = head_width(heads, kv_heads, self.hidden_size, self.head_dim)?;
        Ok(HfLayout {
            kv_heads,
            head_dim,
            rope: self.rope(head_dim)?,
            windows: self.windows(family)?,
        })
    }

    pub(super) fn windows(&self, family: Family) -> Result<Vec<Option<usize>>, String> {
        let n = self.num_hidden_layers;
        Ok(match family {
            Family::Mistral => vec![self.sliding_window; n],
            Family::Gemma3 => {
                let window = self.sliding_window.ok_or("Gemma 3 needs sliding_window")?;
                match &self.layer_types {
                    Some(kinds) if kinds.len() == n => kinds
                        .iter()
                        .map(|k| (k == "sliding_attention").then_some(window))
                        .collect(),
                    Some(kinds) => {
                        return Err(format!(
                            "layer_types has {} entries for {n} layers",
                            kinds.len()
                        ));
                    }
                    None => {
                        let pattern = self.sliding_window_pattern.unwrap_or(6);
                        (0..n)
                            .map(|l| gemma_layer_slides(l, pattern).then_some(window))
                            .collect()
                    }
                }
            }
            _ => vec![None; n],
        })
    }
}

/// A Hugging Face config's block sizes ([`HfConfig::layout`]).
pub(super) struct HfLayout {
    pub(super) kv_heads: usize,
    pub(super) head_dim: usize,
    pub(super) rope: RopeSpec,
    pub(super) windows: Vec<Option<usize>>,
}

/// The width of one attention head: the file's own (`key_length`, `head_dim`), else
/// width / heads. Checks that the heads can be grouped and that RoPE can pair the head.
pub(super) fn head_width(
    heads: usize,
    kv_heads: usize,
    width: usize,
    stated: Option<usize>,
) -> Result<usize, String> {
    if heads == 0 || kv_heads == 0 || !heads.is_multiple_of(kv_heads) {
        return Err(format!("bad head counts {heads}/{kv_heads}"));
    }
    let head_dim = match stated {
        Some(d) => d,
        None if width.is_multiple_of(heads) => width / heads,
        None => return Err(format!("width {width} is not a multiple of {heads} heads")),
    };
    if head_dim == 0 || !head_dim.is_multiple_of(2) {
        return Err(format!("bad head width {head_dim}"));
    }
    Ok(head_dim)
}

/// The weight files of a safetensors directory: the shards its index names, else
/// `model.safetensors`.
pub(super) fn safetensors_files(dir: &Path) -> Result<Vec<PathBuf>, ModelError> {
    let index = dir.join("model.safetensors.index.json");
    if !index.exists() {
        let single = dir.join("model.safetensors");
        if !single.exists() {
            return Err(ModelError::Format {
                path: dir.into(),
                message: "no model.safetensors or model.safetensors.index.json".into(),
            });
        }
        return Ok(vec![single]);
    }
    let text =
        crate::files::read_regular_to_string(&index, "safetensors index").map_err(|source| {
            ModelError::Io {
                path: index.clone(),
                source,
            }
        })?;
    let v: serde_json::Value = serde_json::from_str(&text).map_err(|e| ModelError::Format {
        path: index.clone(),
        message: format!("not JSON: {e}"),
    })?;
    let map = v["weight_map"]
        .as_object()
        .ok_or_else(|| ModelError::Format {
            path: index.clone(),
            message: "no weight_map".into(),
        })?;
    let mut files: Vec<PathBuf> = map
        .values()
        .filter_map(|f| f.as_str())
        .map(|f| dir.join(f))
        .collect();
    files.sort();
    files.dedup();
    Ok(files)
}

/// Reorder the rows of a Hugging Face q or k projection so that each head's rotary pairs
/// are adjacent, as GGUF stores them and as the interleaved RoPE here expects. Hugging
/// Face pairs row i with row i + head_dim/2 (its `rotate_half`); this is the permutation
/// llama.cpp's converter applies.
pub(super) fn rope_rows_interleaved(w: &Tensor, heads: usize) -> Result<Tensor, ModelError> {
    let (rows, cols) = w.dims2()?;
    let head_dim = rows / heads;
    Ok(w.reshape((heads, 2, head_dim / 2, cols))?
        .transpose(1, 2)?
        .contiguous()?
        .reshape((rows, cols))?)
}
