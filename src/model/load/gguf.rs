//! A model from a GGUF file: every family in [`Family`], by llama.cpp's names.

use std::collections::HashSet;
use std::path::Path;

use candle_core::Device;
use candle_core::quantized::{GgmlDType, QTensor, gguf_file};

use super::{finite, head_width, md_f32, md_u32, unread_refusal, without_positions};
use crate::model::arch::{
    Family, RopeSpec, SUPPORTED_GGUF, Yarn, gemma_layer_slides, yarn_mscale, yarn_rope_divisors,
};
use crate::model::forward::{Model, ModelConfig, ModelError, WeightFormat};
use crate::model::layer::Layer;
use crate::model::linear::{
    Embedding, Linear, NormWeights, Weights, bf16_dense_of, dense_of, requantize_q8_0, weights_of,
};

/// Gemma 3's defaults where its GGUF metadata is silent, as llama.cpp has them.
const GEMMA_GLOBAL_ROPE_BASE: f32 = 1_000_000.0;
const GEMMA_LOCAL_ROPE_BASE: f32 = 10_000.0;
const GEMMA_SLIDING_PATTERN: usize = 6;

impl Model {
    /// Load a GGUF file of a supported architecture ([`SUPPORTED_GGUF`]). `max_context`
    /// caps the KV cache (and its memory).
    pub fn load_gguf(
        path: &Path,
        content: &gguf_file::Content,
        format: WeightFormat,
        max_context: usize,
        device: &Device,
    ) -> Result<Self, ModelError> {
        let fmt = |message: String| ModelError::Format {
            path: path.into(),
            message,
        };
        let arch = content
            .metadata
            .get("general.architecture")
            .and_then(|v| v.to_string().ok().cloned())
            .unwrap_or_default();
        let family = Family::from_gguf(&arch).ok_or_else(|| {
            fmt(format!(
                "architecture {arch:?} is not supported; suffixd loads GGUF architectures {SUPPORTED_GGUF}"
            ))
        })?;
        let block = family.block();
        let key = |k: &str| format!("{arch}.{k}");
        let has = |k: &str| content.metadata.contains_key(&key(k));
        let size = |k: &str| md_u32(content, &key(k)).map(|v| v as usize).map_err(fmt);
        let heads = size("attention.head_count")?;
        let kv_heads = size("attention.head_count_kv")?;
        let width = size("embedding_length")?;
        let layers_n = size("block_count")?;
        let trained_context = size("context_length")?;
        let stated = if has("attention.key_length") {
            Some(size("attention.key_length")?)
        } else {
            None
        };
        let head_dim = head_width(heads, kv_heads, width, stated).map_err(fmt)?;
        if has("attention.value_length") && size("attention.value_length")? != head_dim {
            return Err(fmt("values as wide as keys only".into()));
        }
        if has("rope.dimension_count") && size("rope.dimension_count")? != head_dim {
            return Err(fmt(format!(
                "RoPE over part of a head ({} of {head_dim}) is not supported",
                size("rope.dimension_count")?
            )));
        }
        let experts = if has("expert_count") {
            size("expert_count")?
        } else {
            0
        };
        if experts > 0 {
            return Err(fmt(format!(
                "{} is {experts}: mixture-of-experts models (Mixtral's) are not supported",
                key("expert_count"),
            )));
        }
        for softcap in ["final_logit_softcapping", "attn_logit_softcapping"] {
            if md_f32(content, &key(softcap)).is_some_and(|cap| cap != 0.0) {
                return Err(fmt(format!(
                    "{} is set: logit softcapping (Gemma 2's) is not supported",
                    key(softcap)
                )));
            }
        }
        let file = crate::files::open_regular(path, "GGUF model file").map_err(|source| {
            ModelError::Io {
                path: path.into(),
                source,
            }
        })?;
        // SAFETY: mapped read-only, and only read within its length; a model file is
        // not written while it is served.
        let bytes = unsafe { memmap2::Mmap::map(&file) }.map_err(|source| ModelError::Io {
            path: path.into(),
            source,
        })?;
        let mut t = Tensors {
            path,
            content,
            file,
            bytes,
            device,
            read: HashSet::new(),
        };
        let matrix = |qt: QTensor| -> Result<Weights, ModelError> {
            let qt = match (format, qt.dtype()) {
                (WeightFormat::Native, _) | (WeightFormat::Q8_0, GgmlDType::Q8_0) => qt,
                (WeightFormat::Q8_0, _) => requantize_q8_0(&qt, device)?,
                (WeightFormat::F32, _) => return Ok(dense_of(qt.dequantize(device)?, device)?),
                (WeightFormat::Bf16, _) => {
                    return Ok(bf16_dense_of(&qt.dequantize(device)?, device)?);
                }
            };
            weights_of(qt, device).map_err(|e| fmt(e.to_string()))
        };
        let embed_q = t.get("token_embd.weight")?;
        let embed = Embedding::of(&embed_q, device)?;
        let vocab = embed.rows()?;
        let head = Linear::new(vec![if t.present("output.weight") {
            matrix(t.get("output.weight")?)?
        } else {
            // Tied to the embedding, as in SmolLM2, Qwen 2.5's small models and Gemma.
            matrix(embed_q)?
        }]);
        let norm = t.norm("output_norm.weight")?;
        let Positions {
            mut ropes,
            windows,
            positionless,
            context,
        } = t.positions(family, &arch, head_dim, layers_n, trained_context)?;
        let base = ropes[0].base;
        let mut layers = Vec::with_capacity(layers_n);
        for (i, window) in windows.into_iter().enumerate() {
            layers.push(t.layer(i, window, family, &arch, &matrix)?);
        }
        without_positions(&mut ropes, &mut layers, &positionless, head_dim);
        // llama.cpp's loader refuses such a file too ("wrong number of tensors").
        if let Some(refusal) = unread_refusal(&t.unread(), family, "the file's") {
            return Err(fmt(refusal));
        }
        let cfg = ModelConfig {
            family,
            layers: layers_n,
            heads,
            kv_heads,
            head_dim,
            width,
            vocab,
            context: max_context.min(context).max(1),
            rope_base: base,
            rms_eps: md_f32(content, &key("attention.layer_norm_rms_epsilon")).unwrap_or(1e-5),
            attn_scale: 1.0 / gguf_query_scale(family, layers_n, width, heads, head_dim).sqrt(),
            activation: block.activation,
            embed_scale: block.embed_scale.then(|| (width as f32).sqrt()),
            rope_pairs: block.gguf_rope_pairs,
            sliding_window: layers.iter().find_map(|l| l.window),
        };
        Self::assemble(cfg, embed, layers, norm, head, &ropes, device, format)
    }
}

/// The divisor whose root scales the queries, which the format does not carry: the head
/// width, except for Gemma 3 27B (62 layers), whose `query_pre_attn_scalar` is width /
/// heads, as llama.cpp decides it.
fn gguf_query_scale(
    family: Family,
    layers: usize,
    width: usize,
    heads: usize,
    head_dim: usize,
) -> f32 {
    if family == Family::Gemma3 && layers == 62 {
        (width / heads) as f32
    } else {
        head_dim as f32
    }
}

/// How a GGUF file's layers place tokens ([`Tensors::positions`]).
struct Positions {
    /// The RoPE tables the layers name: the global one first, then (Gemma 3) the sliding
    /// layers'.
    ropes: Vec<RopeSpec>,
    /// Each layer's sliding window.
    windows: Vec<Option<usize>>,
    /// Per layer, whether it rotates nothing (SmolLM3's NoPE layers).
    positionless: Vec<bool>,
    /// The longest context the positions are made for.
    context: usize,
}

/// The tensors of an open GGUF file.
struct Tensors<'a> {
    path: &'a Path,
    content: &'a gguf_file::Content,
    file: std::fs::File,
    /// The file's bytes, where each tensor's scales are checked before it is loaded.
    bytes: memmap2::Mmap,
    device: &'a Device,
    /// The names of the tensors loaded so far.
    read: HashSet<String>,
}

impl Tensors<'_> {
    /// The RoPE tables the layers name (the global one first; Gemma's sliding layers use
    /// a second, with its own base), each layer's sliding window, the layers that rotate
    /// nothing (SmolLM3's every fourth, as llama.cpp fixes it: the file says nothing), and
    /// the longest context the positions are made for.
    fn positions(
        &mut self,
        family: Family,
        arch: &str,
        head_dim: usize,
        layers_n: usize,
        trained_context: usize,
    ) -> Result<Positions, ModelError> {
        let content = self.content;
        let key = |k: &str| format!("{arch}.{k}");
        let (global, context) = self.global_rope(family, arch, head_dim, trained_context)?;
        let mut ropes = vec![global];
        let windows: Vec<Option<usize>> = if family == Family::Gemma3 {
            // The sliding layers' table: its own base, never scaled (as in llama.cpp).
            ropes.push(RopeSpec::plain(
                md_f32(content, &key("rope.freq_base_swa")).unwrap_or(GEMMA_LOCAL_ROPE_BASE),
            ));
            self.gemma_windows(arch, layers_n)?
        } else {
            // llama.cpp runs Mistral's GGUF files (architecture llama) with full
            // attention; so does suffixd, to give the same tokens.
            vec![None; layers_n]
        };
        Ok(Positions {
            ropes,
            windows,
            positionless: (0..layers_n)
                .map(|l| family == Family::SmolLM3 && (l + 1).is_multiple_of(4))
                .collect(),
            context,
        })
    }

    /// The global layers' RoPE table and the context it is made for, read as llama.cpp
    /// reads them for these architectures: the type is linear unless the file says
    /// otherwise; the factor is `rope.scaling.factor` (or the older `rope.scale_linear`; 0
    /// is none); Llama 3's per-frequency factors in `rope_freqs.weight` apply on top of
    /// it; YaRN's band is set by `rope.scaling.original_context_length` (else the trained
    /// context) and its defaults (llama.cpp reads no other YaRN key for them); and
    /// `rope.scaling.attn_factor` multiplies cos and sin.
    fn global_rope(
        &mut self,
        family: Family,
        arch: &str,
        head_dim: usize,
        trained_context: usize,
    ) -> Result<(RopeSpec, usize), ModelError> {
        let (content, path) = (self.content, self.path);
        let fmt = |message: String| ModelError::Format {
            path: path.into(),
            message,
        };
        let key = |k: &str| format!("{arch}.{k}");
        let default_base = match family {
            Family::Gemma3 => GEMMA_GLOBAL_ROPE_BASE,
            _ => 10_000.0,
        };
        let mut spec =
            RopeSpec::plain(md_f32(content, &key("rope.freq_base")).unwrap_or(default_base));
        let scaling = (content.metadata.get(&key("rope.scaling.type")))
            .and_then(|v| v.to_string().ok().cloned())
            .unwrap_or_else(|| "linear".into());
        let factor = md_f32(content, &key("rope.scaling.factor"))
            .or_else(|| md_f32(content, &key("rope.scale_linear")))
            .filter(|f| *f != 0.0)
            .unwrap_or(1.0);
        let mut context = trained_context;
        let mut divisors = match scaling.as_str() {
            "none" => Vec::new(),
            "linear" if factor == 1.0 => Vec::new(),
            "linear" => vec![factor; head_dim / 2],
            "yarn" => {
                let original = md_u32(content, &key("rope.scaling.original_context_length"))
                    .map_or(trained_context, |v| v as usize)
                    .max(1);
                let yarn = Yarn {
                    factor,
                    original_context: original as f32,
                    beta_fast: 32.0,
                    beta_slow: 1.0,
                    truncate: true,
                    ext_factor: 1.0,
                };
                spec.scale = yarn_mscale(f64::from(factor), 1.0) as f32;
                context = context.max((original as f32 * factor) as usize);
                yarn_rope_divisors(head_dim, spec.base, &yarn)
            }
            other => return Err(fmt(format!("RoPE scaling {other:?} is not supported"))),
        };
        if let Some(attn_factor) = md_f32(content, &key("rope.scaling.attn_factor")) {
            spec.scale *= attn_factor;
        }
        if self.present("rope_freqs.weight") {
            let per_frequency = self.host("rope_freqs.weight")?;
            if per_frequency.len() != head_dim / 2 {
                return Err(fmt(format!(
                    "{} RoPE divisors for heads of {head_dim}",
                    per_frequency.len()
                )));
            }
            if divisors.is_empty() {
                divisors = per_frequency;
            } else {
                divisors
                    .iter_mut()
                    .zip(per_frequency)
                    .for_each(|(d, f)| *d *= f);
            }
        }
        spec.divisors = divisors;
        Ok((spec, context))
    }

    /// Gemma 3's window per layer, read as llama.cpp reads it: no sliding layer without a
    /// window (or with 0); else `attention.sliding_window_pattern` as one flag per layer
    /// (true: it slides) or as a number n (every n-th layer global; 6 when absent).
    fn gemma_windows(&self, arch: &str, layers_n: usize) -> Result<Vec<Option<usize>>, ModelError> {
        let metadata = &self.content.metadata;
        let window_key = format!("{arch}.attention.sliding_window");
        let number = |key: &str| md_u32(self.content, key).map_err(|e| self.error(e));
        let window = match metadata.get(&window_key) {
            None => 0,
            Some(_) => number(&window_key)?,
        };
        if window == 0 {
            return Ok(vec![None; layers_n]);
        }
        let pattern_key = format!("{arch}.attention.sliding_window_pattern");
        let slides: Vec<bool> = match metadata.get(&pattern_key) {
            Some(gguf_file::Value::Array(flags)) => {
                let flags = (flags.iter().map(|f| f.to_bool()))
                    .collect::<Result<Vec<bool>, _>>()
                    .map_err(|e| self.error(format!("{pattern_key}: {e}")))?;
                if flags.len() != layers_n {
                    return Err(self.error(format!(
                        "{pattern_key} has {} flags for {layers_n} layers",
                        flags.len()
                    )));
                }
                flags
            }
            found => {
                let pattern = match found {
                    Some(_) => number(&pattern_key)? as usize,
                    None => GEMMA_SLIDING_PATTERN,
                };
                (0..layers_n)
                    .map(|l| gemma_layer_slides(l, pattern))
                    .collect()
            }
        };
        let window = window as usize;
        Ok(slides.into_iter().map(|s| s.then_some(window)).collect())
    }

    /// Layer `i`'s weights, with the parts its family's block has.
    fn layer(
        &mut self,
        i: usize,
        window: Option<usize>,
        family: Family,
        arch: &str,
        matrix: &dyn Fn(QTensor) -> Result<Weights, ModelError>,
    ) -> Result<Layer, ModelError> {
        let block = family.block();
        let p = |s: &str| format!("blk.{i}.{s}");
        let qkv_bias = if self.part(block.qkv_bias, &p("attn_q.bias"), arch)? {
            let mut bias = self.host(&p("attn_q.bias"))?;
            bias.extend(self.host(&p("attn_k.bias"))?);
            bias.extend(self.host(&p("attn_v.bias"))?);
            Some(bias)
        } else {
            None
        };
        let q_norm = self.optional_norm(block.qk_norm, &p("attn_q_norm.weight"), arch)?;
        let k_norm = self.optional_norm(block.qk_norm, &p("attn_k_norm.weight"), arch)?;
        let post_attn_norm =
            self.optional_norm(block.sandwich_norms, &p("post_attention_norm.weight"), arch)?;
        let post_ffn_norm =
            self.optional_norm(block.sandwich_norms, &p("post_ffw_norm.weight"), arch)?;
        Ok(Layer {
            attn_norm: self.norm(&p("attn_norm.weight"))?,
            qkv: Linear::new(vec![
                matrix(self.get(&p("attn_q.weight"))?)?,
                matrix(self.get(&p("attn_k.weight"))?)?,
                matrix(self.get(&p("attn_v.weight"))?)?,
            ]),
            qkv_bias,
            q_norm,
            k_norm,
            wo: Linear::new(vec![matrix(self.get(&p("attn_output.weight"))?)?]),
            post_attn_norm,
            ffn_norm: self.norm(&p("ffn_norm.weight"))?,
            gate_up: Linear::new(vec![
                matrix(self.get(&p("ffn_gate.weight"))?)?,
                matrix(self.get(&p("ffn_up.weight"))?)?,
            ]),
            down: Linear::new(vec![matrix(self.get(&p("ffn_down.weight"))?)?]),
            post_ffn_norm,
            rope: usize::from(window.is_some()),
            window,
        })
    }

    fn error(&self, message: String) -> ModelError {
        ModelError::Format {
            path: self.path.into(),
            message,
        }
    }

    /// The file's tensors that nothing loaded, sorted.
    fn unread(&self) -> Vec<String> {
        let mut unread: Vec<String> = (self.content.tensor_infos.keys())
            .filter(|n| !self.read.contains(*n))
            .cloned()
            .collect();
        unread.sort();
        unread
    }

    fn present(&self, name: &str) -> bool {
        self.content.tensor_infos.contains_key(name)
    }

    fn get(&mut self, name: &str) -> Result<QTensor, ModelError> {
        self.read.insert(name.to_string());
        self.check_finite(name)?;
        self.content
            .tensor(&mut self.file, name, self.device)
            .map_err(|e| self.error(format!("tensor {name}: {e}")))
    }

    /// An error naming tensor `name` if a scale of it (a value, for float formats) is
    /// NaN or infinite. Read from the file, so that a GPU load copies nothing back.
    fn check_finite(&self, name: &str) -> Result<(), ModelError> {
        let Some(info) = self.content.tensor_infos.get(name) else {
            return Ok(()); // Loading it says it is missing.
        };
        let dtype = info.ggml_dtype;
        let len = info.shape.elem_count() / dtype.block_size() * dtype.type_size();
        let start = self.content.tensor_data_offset.saturating_add(info.offset);
        let Some(data) = usize::try_from(start)
            .ok()
            .and_then(|start| self.bytes.get(start..start.checked_add(len)?))
        else {
            return Ok(()); // Past the file's end: loading it says so.
        };
        match finite::first_non_finite(dtype, data) {
            None => Ok(()),
            Some(at) => Err(self.error(format!(
                "tensor {name} ({dtype:?}) has a NaN or infinite {} at {} {at}: the file is damaged or was written wrong; use another copy",
                if dtype.block_size() == 1 { "value" } else { "scale" },
                if dtype.block_size() == 1 { "value" } else { "block" },
            ))),
        }
    }

    /// A vector's values on the host (biases, RoPE divisors).
    fn host(&mut self, name: &str) -> Result<Vec<f32>, ModelError> {
        Ok(self
            .get(name)?
            .dequantize(&Device::Cpu)?
            .flatten_all()?
            .to_vec1()?)
    }

    fn norm(&mut self, name: &str) -> Result<NormWeights, ModelError> {
        Ok(NormWeights::new(self.get(name)?.dequantize(self.device)?)?)
    }

    /// Whether a family-dependent part is in the file: an error if the family needs it
    /// and it is missing.
    fn part(&self, needed: bool, name: &str, arch: &str) -> Result<bool, ModelError> {
        match (needed, self.present(name)) {
            (true, false) => Err(self.error(format!("{arch} needs tensor {name}"))),
            (_, here) => Ok(here),
        }
    }

    fn optional_norm(
        &mut self,
        needed: bool,
        name: &str,
        arch: &str,
    ) -> Result<Option<NormWeights>, ModelError> {
        if self.part(needed, name, arch)? {
            Ok(Some(self.norm(name)?))
        } else {
            Ok(None)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queries_are_scaled_as_llama_cpp_scales_the_published_models() {
        // Gemma 3 27B: 62 layers, width 5,376, 32 heads of 128; query_pre_attn_scalar 168.
        assert_eq!(gguf_query_scale(Family::Gemma3, 62, 5376, 32, 128), 168.0);
        // Gemma 3 4B: 34 layers, width 2,560, 8 heads of 256; query_pre_attn_scalar 256.
        assert_eq!(gguf_query_scale(Family::Gemma3, 34, 2560, 8, 256), 256.0);
        // Other families by the head width, whatever their layer count.
        assert_eq!(gguf_query_scale(Family::Qwen3, 62, 5376, 32, 128), 128.0);
    }
}
