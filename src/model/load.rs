//! Reading a model's files: GGUF metadata, a Hugging Face directory's `config.json` and
//! safetensors shards, and the row order llama.cpp's converter gives q and k.

use std::path::{Path, PathBuf};

use candle_core::Tensor;
use candle_core::quantized::gguf_file;

use super::forward::ModelError;

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

/// The keys of a Hugging Face llama `config.json` that the forward pass needs.
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
    pub(super) tie_word_embeddings: bool,
    #[serde(default)]
    pub(super) rope_scaling: Option<serde_json::Value>,
    #[serde(default)]
    pub(super) hidden_act: Option<String>,
}

pub(super) fn default_rope_theta() -> f32 {
    10000.0
}

impl HfConfig {
    /// Read and check `dir/config.json`: a llama with plain RoPE and SiLU.
    pub(super) fn read(dir: &Path) -> Result<Self, ModelError> {
        let path = dir.join("config.json");
        let text = std::fs::read_to_string(&path).map_err(|source| ModelError::Io {
            path: path.clone(),
            source,
        })?;
        let fmt = |message: String| ModelError::Format {
            path: path.clone(),
            message,
        };
        let cfg: HfConfig = serde_json::from_str(&text)
            .map_err(|e| fmt(format!("not a llama config.json: {e}")))?;
        if let Some(t) = cfg.model_type.as_deref().filter(|t| *t != "llama") {
            return Err(fmt(format!("model_type {t:?} is not llama")));
        }
        if cfg.rope_scaling.as_ref().is_some_and(|v| !v.is_null()) {
            return Err(fmt(
                "rope_scaling is not supported; use a model with plain RoPE".into(),
            ));
        }
        if let Some(a) = cfg.hidden_act.as_deref().filter(|a| *a != "silu") {
            return Err(fmt(format!(
                "hidden_act {a:?} is not supported (silu only)"
            )));
        }
        Ok(cfg)
    }
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
    let text = std::fs::read_to_string(&index).map_err(|source| ModelError::Io {
        path: index.clone(),
        source,
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
