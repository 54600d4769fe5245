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

use super::arch::{
    Family, RopeSpec, SUPPORTED_HF, Yarn, gemma_layer_slides, llama3_rope_divisors, yarn_mscale,
    yarn_rope_divisors,
};
use super::forward::ModelError;
use super::kernels::activation::Activation;
use super::layer::Layer;

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

/// The refusal of a model holding tensors (`unread`, sorted) that its family's block does
/// not read, if there are any. Such a tensor is a part the block lacks (an output or MLP
/// bias, layers past the stated count, another architecture's weights): running without
/// it would give another model's answers, so it is named. `held_by`: "the file's", "the
/// checkpoint's".
pub(super) fn unread_refusal(unread: &[String], family: Family, held_by: &str) -> Option<String> {
    let first = unread.first()?;
    Some(format!(
        "{} of {held_by} tensors are not part of suffixd's {family:?} block (first: \
         {first}): this is a variant of the family suffixd cannot run",
        unread.len()
    ))
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
    /// transformers 4's RoPE scaling (`rope_type` and its numbers).
    #[serde(default)]
    pub(super) rope_scaling: Option<serde_json::Value>,
    /// transformers 5's RoPE settings, base included: one table, or (Gemma 3) one per
    /// layer kind, `full_attention` and `sliding_attention`.
    #[serde(default)]
    pub(super) rope_parameters: Option<serde_json::Value>,
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
    /// SmolLM3: per layer, 1 where it rotates q and k and 0 where it does not (NoPE).
    #[serde(default)]
    pub(super) no_rope_layers: Option<Vec<u8>>,
    /// SmolLM3 without `no_rope_layers`: every n-th layer rotates nothing (4 by default).
    #[serde(default)]
    pub(super) no_rope_layer_interval: Option<usize>,
    /// Gemma 3: the sliding layers' RoPE base.
    #[serde(default)]
    pub(super) rope_local_base_freq: Option<f32>,
    /// Gemma 3: attention scores are scaled by its inverse square root.
    #[serde(default)]
    pub(super) query_pre_attn_scalar: Option<f32>,
    /// Gemma 2's caps on logits and attention scores (null in Gemma 3): refused if set.
    #[serde(default)]
    pub(super) final_logit_softcapping: Option<f64>,
    #[serde(default)]
    pub(super) attn_logit_softcapping: Option<f64>,
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
        if matches!(family, Family::Qwen2 | Family::SmolLM3) && cfg.use_sliding_window == Some(true)
        {
            return Err(fmt(format!(
                "{model_type}'s use_sliding_window is not supported"
            )));
        }
        if cfg.final_logit_softcapping.is_some() || cfg.attn_logit_softcapping.is_some() {
            return Err(fmt("logit softcapping (Gemma 2's) is not supported".into()));
        }
        Ok((cfg, family))
    }

    /// The RoPE tables of the global layers and (Gemma 3) of the sliding ones, read as
    /// transformers reads them: `rope_scaling` (transformers 4) if set, else
    /// `rope_parameters` (transformers 5, which writes no `rope_theta` or
    /// `rope_local_base_freq`: the bases are inside it); a table without a base takes
    /// `rope_theta` (global) or `rope_local_base_freq` (sliding). Gemma 3's
    /// `rope_scaling` is its global layers' alone.
    pub(super) fn ropes(
        &self,
        family: Family,
        head_dim: usize,
    ) -> Result<(ConfigRope, Option<ConfigRope>), String> {
        fn set(v: &Option<serde_json::Value>) -> Option<&serde_json::Value> {
            v.as_ref().filter(|v| !v.is_null())
        }
        let (key, params) = match set(&self.rope_scaling) {
            Some(p) => ("rope_scaling", Some(p)),
            None => ("rope_parameters", set(&self.rope_parameters)),
        };
        let by_kind = params.is_some_and(|p| {
            p.get("full_attention").is_some() || p.get("sliding_attention").is_some()
        });
        let (global, sliding) = match params {
            Some(p) if by_kind => (p.get("full_attention"), p.get("sliding_attention")),
            p => (p, None),
        };
        let trained = self.max_position_embeddings;
        let global = rope_table(key, global, self.rope_theta, head_dim, trained)?;
        let sliding = (family == Family::Gemma3)
            .then(|| {
                let base = self.rope_local_base_freq.unwrap_or(10_000.0);
                rope_table(key, sliding, base, head_dim, trained)
            })
            .transpose()?;
        Ok((global, sliding))
    }

    /// Per layer, whether it rotates nothing: SmolLM3's NoPE layers, from
    /// `no_rope_layers` (0 where not), else every `no_rope_layer_interval`-th (4), as
    /// transformers reads them.
    pub(super) fn positionless(&self, family: Family) -> Result<Vec<bool>, String> {
        let n = self.num_hidden_layers;
        if family != Family::SmolLM3 {
            return Ok(vec![false; n]);
        }
        match (
            &self.no_rope_layers,
            self.no_rope_layer_interval.unwrap_or(4),
        ) {
            (Some(flags), _) if flags.len() == n => Ok(flags.iter().map(|&f| f == 0).collect()),
            (Some(flags), _) => Err(format!(
                "no_rope_layers has {} entries for {n} layers",
                flags.len()
            )),
            (None, 0) => Err("no_rope_layer_interval is 0".into()),
            (None, every) => Ok((0..n).map(|l| (l + 1).is_multiple_of(every)).collect()),
        }
    }

    /// Each layer's sliding window: Mistral's on every layer, Gemma's on all but every
    /// n-th.
    /// What the config's sizes make of the block: key/value heads, head width, the
    /// global RoPE and each layer's window. Its faults are the config's, named.
    pub(super) fn layout(&self, family: Family) -> Result<HfLayout, String> {
        let heads = self.num_attention_heads;
        let kv_heads = self.num_key_value_heads.unwrap_or(heads);
        let head_dim = head_width(heads, kv_heads, self.hidden_size, self.head_dim)?;
        let (rope, sliding_rope) = self.ropes(family, head_dim)?;
        Ok(HfLayout {
            kv_heads,
            head_dim,
            context: rope.context,
            rope: rope.spec,
            sliding_rope: sliding_rope.map(|r| r.spec),
            windows: self.windows(family)?,
            positionless: self.positionless(family)?,
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
    /// The longest context the positions are made for: `max_position_embeddings`, or the
    /// trained context times YaRN's factor (as vLLM derives it).
    pub(super) context: usize,
    pub(super) rope: RopeSpec,
    /// Gemma 3's sliding layers' table.
    pub(super) sliding_rope: Option<RopeSpec>,
    pub(super) windows: Vec<Option<usize>>,
    /// Per layer, whether it rotates nothing (SmolLM3's NoPE layers).
    pub(super) positionless: Vec<bool>,
}

/// Gives the layers that rotate nothing (`positionless`) a table of their own that
/// rotates by nothing ([`RopeSpec::none`]), after the others' tables.
pub(super) fn without_positions(
    ropes: &mut Vec<RopeSpec>,
    layers: &mut [Layer],
    positionless: &[bool],
    head_dim: usize,
) {
    if !positionless.contains(&true) {
        return;
    }
    ropes.push(RopeSpec::none(head_dim));
    for (layer, _) in layers
        .iter_mut()
        .zip(positionless)
        .filter(|(_, none)| **none)
    {
        layer.rope = ropes.len() - 1;
    }
}

/// One RoPE table of a config, and the context its positions are made for.
pub(super) struct ConfigRope {
    pub(super) spec: RopeSpec,
    /// `max_position_embeddings`, or (YaRN) the trained context times the factor.
    pub(super) context: usize,
}

/// One RoPE table of a config: `params`, from its `key` (`rope_type` or `type`, its
/// numbers, and `rope_theta`, else `base`); none is plain RoPE at `base`. `trained`:
/// `max_position_embeddings`.
fn rope_table(
    key: &str,
    params: Option<&serde_json::Value>,
    base: f32,
    head_dim: usize,
    trained: usize,
) -> Result<ConfigRope, String> {
    let Some(p) = params.filter(|p| !p.is_null()) else {
        return Ok(ConfigRope {
            spec: RopeSpec::plain(base),
            context: trained,
        });
    };
    let kind = p["rope_type"]
        .as_str()
        .or(p["type"].as_str())
        .unwrap_or("default");
    let optional = |k: &str| -> Result<Option<f32>, String> {
        match &p[k] {
            serde_json::Value::Null => Ok(None),
            v => v
                .as_f64()
                .map(|v| Some(v as f32))
                .ok_or_else(|| format!("{key} {kind:?} needs a number {k}")),
        }
    };
    let number = |k: &str| optional(k)?.ok_or_else(|| format!("{key} {kind:?} needs a number {k}"));
    let base = optional("rope_theta")?.unwrap_or(base);
    // A rotation of part of each head (Phi's, GLM's): every family here rotates all of it.
    if optional("partial_rotary_factor")?.is_some_and(|f| f != 1.0) {
        return Err(format!(
            "{key}: partial_rotary_factor is not supported (whole heads are rotated)"
        ));
    }
    let (mut spec, mut context) = (RopeSpec::plain(base), trained);
    match kind {
        "default" => {}
        "linear" => spec.divisors = vec![number("factor")?; head_dim / 2],
        "llama3" => {
            spec.divisors = llama3_rope_divisors(
                head_dim,
                base,
                number("factor")?,
                number("low_freq_factor")?,
                number("high_freq_factor")?,
                number("original_max_position_embeddings")?,
            )
        }
        "yarn" => {
            let original = optional("original_max_position_embeddings")?.unwrap_or(trained as f32);
            // transformers: a missing factor is the stretch from the trained context.
            let factor = optional("factor")?.unwrap_or(trained as f32 / original);
            if !(factor.is_finite() && factor > 0.0 && original >= 1.0) {
                return Err(format!(
                    "{key} \"yarn\" needs a positive factor and original_max_position_embeddings"
                ));
            }
            // transformers reads `beta_fast or 32`: a 0 is the default too.
            let or = |k: &str, default: f32| -> Result<f32, String> {
                Ok(optional(k)?.filter(|v| *v != 0.0).unwrap_or(default))
            };
            let yarn = Yarn {
                factor,
                original_context: original,
                beta_fast: or("beta_fast", 32.0)?,
                beta_slow: or("beta_slow", 1.0)?,
                truncate: p["truncate"].as_bool().unwrap_or(true),
                ext_factor: 1.0,
            };
            spec.divisors = yarn_rope_divisors(head_dim, base, &yarn);
            let (f, m, all) = (
                f64::from(factor),
                optional("mscale")?.filter(|v| *v != 0.0),
                optional("mscale_all_dim")?.filter(|v| *v != 0.0),
            );
            spec.scale = match (optional("attention_factor")?, m.zip(all)) {
                (Some(a), _) => a,
                (None, Some((m, all))) => {
                    (yarn_mscale(f, f64::from(m)) / yarn_mscale(f, f64::from(all))) as f32
                }
                (None, None) => yarn_mscale(f, 1.0) as f32,
            };
            context = context.max((original * factor) as usize);
        }
        other => {
            return Err(format!(
                "{key} {other:?} is not supported (default, linear, llama3 and yarn are)"
            ));
        }
    }
    Ok(ConfigRope { spec, context })
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

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use super::*;

    fn layout(config: Value) -> Result<HfLayout, String> {
        let (cfg, family) = HfConfig::parse(&config.to_string(), Path::new("config.json"))
            .map_err(|e| e.to_string())?;
        cfg.layout(family)
    }

    fn config(model_type: &str, rope: Value) -> Value {
        let mut c = json!({"model_type": model_type, "hidden_size": 256,
            "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64,
            "num_hidden_layers": 7, "rms_norm_eps": 1e-6, "max_position_embeddings": 131072,
            "sliding_window": 64});
        c.as_object_mut()
            .unwrap()
            .extend(rope.as_object().unwrap().clone());
        c
    }

    #[test]
    fn transformers_5_rope_parameters_give_the_tables_transformers_4_keys_do() {
        let scaling = json!({"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": 8192});
        let mut inside = scaling.clone();
        inside["rope_theta"] = json!(500000.0);
        let old = layout(config(
            "llama",
            json!({"rope_theta": 500000.0, "rope_scaling": scaling}),
        ))
        .unwrap();
        let new = layout(config("llama", json!({"rope_parameters": inside}))).unwrap();
        assert_eq!(new.rope, old.rope);
        assert_eq!(new.rope.base, 500000.0);
        assert!(new.rope.divisors.iter().any(|&d| d > 1.0), "scaled");
        assert_eq!(new.sliding_rope, None, "llama has one table");

        // A plain table: the base is the point (Qwen's 1e6, where the default is 1e4).
        let plain = json!({"rope_parameters": {"rope_type": "default", "rope_theta": 1e6}});
        let qwen = layout(config("qwen2", plain)).unwrap();
        assert_eq!(qwen.rope.base, 1e6);
        assert!(qwen.rope.divisors.is_empty());

        // Gemma 3: global layers scaled, sliding ones on their own base; transformers 5
        // writes one table per layer kind.
        let old = layout(config(
            "gemma3_text",
            json!({"rope_theta": 1e6, "rope_local_base_freq": 1e4,
                "rope_scaling": {"rope_type": "linear", "factor": 8.0}}),
        ))
        .unwrap();
        let new = layout(config(
            "gemma3_text",
            json!({"rope_parameters": {
                "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6},
                "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}}}),
        ))
        .unwrap();
        assert_eq!(
            (&new.rope, &new.sliding_rope),
            (&old.rope, &old.sliding_rope)
        );
        assert_eq!(new.rope.base, 1e6);
        assert_eq!(new.rope.divisors, vec![8.0; 32]);
        let sliding = new.sliding_rope.unwrap();
        assert_eq!((sliding.base, sliding.divisors.len()), (1e4, 0));
    }

    #[test]
    fn yarn_as_qwen_s_model_cards_set_it_stretches_the_context_and_scales_attention() {
        // Qwen2.5-7B-Instruct's config, with its card's addition for texts past 32,768.
        let mut qwen = config(
            "qwen2",
            json!({"rope_theta": 1e6,
            "rope_scaling": {"factor": 4.0, "original_max_position_embeddings": 32768,
                "type": "yarn"}}),
        );
        qwen["max_position_embeddings"] = json!(32768);
        let yarn = layout(qwen.clone()).unwrap();
        assert_eq!(yarn.context, 131072, "as vLLM derives it: 32,768 × 4");
        assert!((yarn.rope.scale - (0.1 * 4f32.ln() + 1.0)).abs() < 1e-6);
        let d = &yarn.rope.divisors;
        assert_eq!((d[0], d[31]), (1.0, 4.0), "fast kept, slow stretched");
        assert!(
            d.iter().any(|&x| x > 1.0 && x < 4.0),
            "a blended band: {d:?}"
        );
        qwen.as_object_mut().unwrap().remove("rope_scaling");
        let plain = layout(qwen).unwrap();
        assert_eq!((plain.context, plain.rope.scale), (32768, 1.0));
        // A stated attention factor wins; a factor of 1 changes nothing.
        let stated = layout(config(
            "qwen2",
            json!({"rope_scaling": {"rope_type": "yarn",
            "factor": 4.0, "attention_factor": 1.5, "mscale": 2.0, "mscale_all_dim": 1.0}}),
        ));
        assert_eq!(stated.unwrap().rope.scale, 1.5);
        let one = layout(config(
            "qwen2",
            json!({"rope_scaling": {"rope_type": "yarn",
            "factor": 1.0}}),
        ))
        .unwrap();
        assert_eq!(one.rope.scale, 1.0);
        assert!(one.rope.divisors.iter().all(|&d| d == 1.0));
    }

    #[test]
    fn rope_scaling_wins_over_rope_parameters_as_in_transformers() {
        let both = layout(config(
            "llama",
            json!({"rope_theta": 5e5, "rope_scaling": {"rope_type": "linear", "factor": 2.0},
                "rope_parameters": {"rope_type": "default", "rope_theta": 1e4}}),
        ))
        .unwrap();
        assert_eq!(both.rope.base, 5e5);
        assert_eq!(both.rope.divisors, vec![2.0; 32]);
    }

    #[test]
    fn settings_suffixd_cannot_run_are_refused_by_name() {
        for (rope, says) in [
            (
                json!({"rope_parameters": {"rope_type": "longrope", "factor": 4.0}}),
                "rope_parameters \"longrope\" is not supported (default, linear, llama3 and yarn are)",
            ),
            (
                json!({"rope_scaling": {"type": "yarn", "factor": "4"}}),
                "rope_scaling \"yarn\" needs a number factor",
            ),
            (
                json!({"rope_scaling": {"type": "yarn", "factor": -4.0}}),
                "needs a positive factor",
            ),
            (
                json!({"rope_parameters": {"rope_type": "default", "partial_rotary_factor": 0.5}}),
                "partial_rotary_factor",
            ),
            (
                json!({"rope_scaling": {"rope_type": "linear"}}),
                "rope_scaling \"linear\" needs a number factor",
            ),
            (
                json!({"rope_parameters": {"rope_theta": "big"}}),
                "needs a number rope_theta",
            ),
        ] {
            let err = layout(config("llama", rope)).err().unwrap();
            assert!(err.contains(says), "{err}");
        }
    }
}
