//! Models of real architectures with seeded random weights, for speed and exactness
//! checks where the real weights cannot go (a machine without the network, a call that
//! carries 64 MiB): `--model synthetic:llama-3.1-8b`. The shapes are the published
//! checkpoints' (their `config.json`), the weights uniform noise generated where the
//! model runs (on the GPU, by the GPU), scaled so that every layer's activations stay
//! of the order of one: a projection's weights have variance 1/fan-in, norms are one,
//! biases small. Its answers mean nothing: it is never the default, and loading one
//! says so. Real small models (the default, Gemma 3 270M) measure acceptance.

use std::path::Path;

use candle_core::{Device, Tensor};
use serde_json::{Value, json};

use super::HfConfig;
use super::hf::HfTensors;
use crate::model::arch::Family;
use crate::model::forward::{Model, ModelError, WeightFormat};

/// A named architecture: its `config.json`, feed-forward width, vocabulary, and whether
/// the head is the embedding.
#[derive(Clone, Debug)]
pub struct SyntheticShape {
    /// The name after `synthetic:`.
    pub name: &'static str,
    /// What the published checkpoint's `config.json` says that the loader reads.
    pub config: Value,
    /// The feed-forward's inner width (`intermediate_size`).
    pub ffn: usize,
    /// Vocabulary rows.
    pub vocab: usize,
    /// The head shares the embedding's weights.
    pub tied: bool,
}

/// The shapes `synthetic:NAME` knows, as their checkpoints' `config.json` give them.
pub fn shapes() -> Vec<SyntheticShape> {
    let llama3_scaling = |factor: f64| {
        json!({"rope_type": "llama3", "factor": factor, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": 8192})
    };
    vec![
        SyntheticShape {
            name: "llama-3.2-1b",
            config: json!({"model_type": "llama", "hidden_size": 2048, "num_attention_heads": 32,
                "num_key_value_heads": 8, "head_dim": 64, "num_hidden_layers": 16,
                "rms_norm_eps": 1e-5, "rope_theta": 500000.0, "max_position_embeddings": 131072,
                "rope_scaling": llama3_scaling(32.0), "hidden_act": "silu"}),
            ffn: 8192,
            vocab: 128_256,
            tied: true,
        },
        SyntheticShape {
            name: "llama-3.1-8b",
            config: json!({"model_type": "llama", "hidden_size": 4096, "num_attention_heads": 32,
                "num_key_value_heads": 8, "num_hidden_layers": 32, "rms_norm_eps": 1e-5,
                "rope_theta": 500000.0, "max_position_embeddings": 131072,
                "rope_scaling": llama3_scaling(8.0), "hidden_act": "silu"}),
            ffn: 14336,
            vocab: 128_256,
            tied: false,
        },
        SyntheticShape {
            name: "qwen2.5-7b",
            config: json!({"model_type": "qwen2", "hidden_size": 3584, "num_attention_heads": 28,
                "num_key_value_heads": 4, "num_hidden_layers": 28, "rms_norm_eps": 1e-6,
                "rope_theta": 1000000.0, "max_position_embeddings": 32768,
                "use_sliding_window": false, "hidden_act": "silu"}),
            ffn: 18944,
            vocab: 152_064,
            tied: false,
        },
        SyntheticShape {
            name: "qwen3-8b",
            config: json!({"model_type": "qwen3", "hidden_size": 4096, "num_attention_heads": 32,
                "num_key_value_heads": 8, "head_dim": 128, "num_hidden_layers": 36,
                "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "max_position_embeddings": 40960,
                "hidden_act": "silu"}),
            ffn: 12288,
            vocab: 151_936,
            tied: false,
        },
        SyntheticShape {
            name: "gemma-3-4b",
            config: json!({"model_type": "gemma3_text", "hidden_size": 2560,
                "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 256,
                "num_hidden_layers": 34, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0,
                "rope_local_base_freq": 10000.0, "max_position_embeddings": 131072,
                "rope_scaling": {"rope_type": "linear", "factor": 8.0},
                "sliding_window": 1024, "sliding_window_pattern": 6,
                "query_pre_attn_scalar": 256, "hidden_activation": "gelu_pytorch_tanh"}),
            ffn: 10240,
            vocab: 262_208,
            tied: true,
        },
        SyntheticShape {
            name: "mistral-7b",
            config: json!({"model_type": "mistral", "hidden_size": 4096, "num_attention_heads": 32,
                "num_key_value_heads": 8, "head_dim": 128, "num_hidden_layers": 32,
                "rms_norm_eps": 1e-5, "rope_theta": 1000000.0, "max_position_embeddings": 32768,
                "sliding_window": null, "hidden_act": "silu"}),
            ffn: 14336,
            vocab: 32_768,
            tied: false,
        },
    ]
}

/// The shape named `name`, or an error listing those there are.
pub fn shape(name: &str) -> Result<SyntheticShape, ModelError> {
    shapes()
        .into_iter()
        .find(|s| s.name == name)
        .ok_or_else(|| {
            let names: Vec<&str> = shapes().iter().map(|s| s.name).collect();
            ModelError::Format {
                path: format!("synthetic:{name}").into(),
                message: format!("no such synthetic shape; there are {}", names.join(", ")),
            }
        })
}

/// How a tensor's values are drawn.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Init {
    /// Uniform with variance 1 / `fan_in`: a projection keeps its input's scale.
    Projection { fan_in: usize },
    /// Uniform with variance 1: an embedding row is of the order of one.
    Embedding,
    /// Every value this (a norm's weight: one, less the checkpoint's offset).
    Constant(f32),
    /// Uniform and small.
    Bias,
}

/// The tensors of a synthetic model, by their Hugging Face names.
struct SyntheticTensors {
    family: Family,
    layers: usize,
    width: usize,
    heads: usize,
    kv_heads: usize,
    head_dim: usize,
    ffn: usize,
    vocab: usize,
    tied: bool,
    seed: u64,
}

impl SyntheticTensors {
    /// Tensor `name`'s shape and values; None for a tensor the family does not have.
    fn spec(&self, name: &str) -> Option<(Vec<usize>, Init)> {
        let block = self.family.block();
        let (w, hd) = (self.width, self.head_dim);
        let (q, kv) = (self.heads * hd, self.kv_heads * hd);
        let norm = Init::Constant(1.0 - block.hf_norm_offset);
        let projection =
            |rows: usize, cols: usize| Some((vec![rows, cols], Init::Projection { fan_in: cols }));
        match name {
            "model.embed_tokens.weight" => return Some((vec![self.vocab, w], Init::Embedding)),
            "lm_head.weight" if !self.tied => return projection(self.vocab, w),
            "model.norm.weight" => return Some((vec![w], norm)),
            _ => {}
        }
        let rest = name.strip_prefix("model.layers.")?;
        let (layer, part) = rest.split_once('.')?;
        if layer.parse::<usize>().ok()? >= self.layers {
            return None;
        }
        match part {
            "input_layernorm.weight" | "post_attention_layernorm.weight" => Some((vec![w], norm)),
            "pre_feedforward_layernorm.weight" | "post_feedforward_layernorm.weight"
                if block.sandwich_norms =>
            {
                Some((vec![w], norm))
            }
            "self_attn.q_proj.weight" => projection(q, w),
            "self_attn.k_proj.weight" | "self_attn.v_proj.weight" => projection(kv, w),
            "self_attn.o_proj.weight" => projection(w, q),
            "self_attn.q_proj.bias" if block.qkv_bias => Some((vec![q], Init::Bias)),
            "self_attn.k_proj.bias" | "self_attn.v_proj.bias" if block.qkv_bias => {
                Some((vec![kv], Init::Bias))
            }
            "self_attn.q_norm.weight" | "self_attn.k_norm.weight" if block.qk_norm => {
                Some((vec![hd], norm))
            }
            "mlp.gate_proj.weight" | "mlp.up_proj.weight" => projection(self.ffn, w),
            "mlp.down_proj.weight" => projection(w, self.ffn),
            _ => None,
        }
    }

    /// Every tensor the model has, by name.
    fn names(&self) -> Vec<String> {
        let mut names: Vec<String> = [
            "model.embed_tokens.weight",
            "lm_head.weight",
            "model.norm.weight",
        ]
        .into_iter()
        .map(String::from)
        .collect();
        let parts = [
            "input_layernorm.weight",
            "post_attention_layernorm.weight",
            "pre_feedforward_layernorm.weight",
            "post_feedforward_layernorm.weight",
            "self_attn.q_proj.weight",
            "self_attn.k_proj.weight",
            "self_attn.v_proj.weight",
            "self_attn.o_proj.weight",
            "self_attn.q_proj.bias",
            "self_attn.k_proj.bias",
            "self_attn.v_proj.bias",
            "self_attn.q_norm.weight",
            "self_attn.k_norm.weight",
            "mlp.gate_proj.weight",
            "mlp.up_proj.weight",
            "mlp.down_proj.weight",
        ];
        for i in 0..self.layers {
            names.extend(parts.iter().map(|p| format!("model.layers.{i}.{p}")));
        }
        names.retain(|n| self.spec(n).is_some());
        names
    }

    /// The seed of tensor `name`'s values: the model's seed and the name, mixed.
    fn seed_of(&self, name: &str) -> u64 {
        name.bytes()
            .fold(splitmix(self.seed), |h, b| splitmix(h ^ u64::from(b)))
    }
}

impl HfTensors for SyntheticTensors {
    fn has(&self, name: &str) -> bool {
        self.spec(name).is_some()
    }

    fn tensor(&self, name: &str, device: &Device) -> Result<Tensor, String> {
        let (shape, init) = self
            .spec(name)
            .ok_or_else(|| "not in this synthetic model".to_string())?;
        // A uniform draw on [-a, a] has variance a² / 3.
        let half_width: f64 = match init {
            Init::Constant(v) => {
                return Tensor::full(v, shape, device).map_err(|e| e.to_string());
            }
            Init::Projection { fan_in } => (3.0 / fan_in as f64).sqrt(),
            Init::Embedding => 3f64.sqrt(),
            Init::Bias => 0.02 * 3f64.sqrt(),
        };
        let half_width = half_width as f32;
        let seed = self.seed_of(name);
        let drawn = if device.is_cpu() {
            // candle cannot seed its CPU generator: draw here, from the seed.
            let n: usize = shape.iter().product();
            let mut state = seed;
            let values: Vec<f32> = (0..n)
                .map(|_| {
                    state = splitmix(state);
                    // The top 24 bits as a fraction in [0, 1), then onto [-a, a).
                    ((state >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * half_width
                })
                .collect();
            Tensor::from_vec(values, shape, device)
        } else {
            // On the GPU, by the GPU: an 8B model's weights never cross the bus.
            device
                .set_seed(seed)
                .and_then(|()| Tensor::rand(-half_width, half_width, shape, device))
        };
        drawn.map_err(|e| e.to_string())
    }
}

/// splitmix64's step: a well-mixed 64-bit value of `x`.
fn splitmix(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

impl SyntheticShape {
    /// Its tensors, and its config with `seed`; the vocabulary at least `min_vocab`
    /// (so that the tokenizer it is served with has a row for each of its tokens).
    fn tensors(
        &self,
        min_vocab: usize,
        seed: u64,
    ) -> Result<(HfConfig, Family, SyntheticTensors), ModelError> {
        let origin = format!("synthetic:{}", self.name);
        let (hf, family) = HfConfig::parse(&self.config.to_string(), Path::new(&origin))?;
        let heads = hf.num_attention_heads;
        let head_dim = hf.head_dim.unwrap_or(hf.hidden_size / heads.max(1));
        let tensors = SyntheticTensors {
            family,
            layers: hf.num_hidden_layers,
            width: hf.hidden_size,
            heads,
            kv_heads: hf.num_key_value_heads.unwrap_or(heads),
            head_dim,
            ffn: self.ffn,
            vocab: self.vocab.max(min_vocab),
            tied: self.tied,
            seed,
        };
        Ok((hf, family, tensors))
    }

    /// Its parameters, as the published checkpoint counts them (the vocabulary as
    /// published).
    pub fn parameters(&self) -> Result<u64, ModelError> {
        let (_, _, tensors) = self.tensors(0, 0)?;
        Ok(tensors
            .names()
            .iter()
            .filter_map(|n| tensors.spec(n))
            .map(|(shape, _)| shape.iter().product::<usize>() as u64)
            .sum())
    }
}

impl Model {
    /// A model of `shape` with seeded random weights made on `device` (see the module
    /// docs), a vocabulary of at least `min_vocab` rows, held as `format`.
    pub fn synthetic(
        shape: &SyntheticShape,
        min_vocab: usize,
        seed: u64,
        format: WeightFormat,
        max_context: usize,
        device: &Device,
    ) -> Result<Self, ModelError> {
        let (hf, family, tensors) = shape.tensors(min_vocab, seed)?;
        let origin = format!("synthetic:{}", shape.name);
        tracing::warn!(
            "{origin}: random weights of {}'s shape (seed {seed}, {} vocabulary rows), for speed and exactness checks only: its answers mean nothing",
            shape.name,
            tensors.vocab
        );
        Self::from_hf(
            Path::new(&origin),
            &hf,
            family,
            &tensors,
            format,
            max_context,
            device,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::kv_cache::KvCache;

    /// Each shape has the published checkpoint's parameter count, to the parameter: the
    /// counts are those Hugging Face transformers (5.24) gives the model it builds from
    /// the shape's `--write-config` file (`AutoModelForCausalLM.from_config` on the meta
    /// device), which round to the published 1.24B, 8.03B, 7.62B, 8.19B, 3.88B and 7.25B.
    #[test]
    fn the_shapes_are_the_published_checkpoints() {
        let published: [(&str, u64); 6] = [
            ("llama-3.2-1b", 1_235_814_400),
            ("llama-3.1-8b", 8_030_261_248),
            ("qwen2.5-7b", 7_615_616_512),
            ("qwen3-8b", 8_190_735_360),
            ("gemma-3-4b", 3_880_263_168),
            ("mistral-7b", 7_248_023_552),
        ];
        assert_eq!(shapes().len(), published.len());
        for (name, count) in published {
            assert_eq!(shape(name).unwrap().parameters().unwrap(), count, "{name}");
        }
        let e = shape("llama-9").unwrap_err().to_string();
        assert!(e.contains("llama-3.1-8b"), "{e}");
    }

    /// Each family at its real depth, narrowed so that it runs here: the logits of a
    /// prompt stay finite and of the order the scaling promises, the same seed gives
    /// the same bits, and another seed other weights.
    #[test]
    fn every_family_stays_finite_over_all_its_layers() {
        for full in shapes() {
            let mut narrow = full.clone();
            let heads = narrow.config["num_attention_heads"].as_u64().unwrap();
            let kv = narrow.config["num_key_value_heads"].as_u64().unwrap();
            // Keep the head layout (GQA ratio, head width) and the depth; narrow the rest.
            narrow.config["num_attention_heads"] = json!(heads / kv * 2);
            narrow.config["num_key_value_heads"] = json!(2);
            narrow.config["head_dim"] = json!(16);
            narrow.config["hidden_size"] = json!(heads / kv * 2 * 16);
            if narrow.config.get("query_pre_attn_scalar").is_some() {
                narrow.config["query_pre_attn_scalar"] = json!(16);
            }
            narrow.ffn = 128;
            narrow.vocab = 512;
            let run = |seed| -> Vec<f32> {
                let model = Model::synthetic(&narrow, 0, seed, WeightFormat::F32, 64, &Device::Cpu)
                    .unwrap();
                let mut cache = KvCache::default();
                let tokens: Vec<u32> = (0..12).map(|i| (i * 37 + 5) % 512).collect();
                let parents: Vec<i32> = (0..12).map(|i| i - 1).collect();
                let logits = model.forward(&mut cache, &tokens, &parents).unwrap();
                assert_eq!(logits.dims(), [12, 512], "{}", full.name);
                logits.flatten_all().unwrap().to_vec1().unwrap()
            };
            let logits = run(7);
            assert!(logits.iter().all(|v| v.is_finite()), "{}", full.name);
            let rms = (logits.iter().map(|v| v * v).sum::<f32>() / logits.len() as f32).sqrt();
            assert!(rms > 1e-3 && rms < 1e3, "{}: logits' RMS {rms}", full.name);
            assert_eq!(
                run(7),
                logits,
                "{}: the same seed, the same model",
                full.name
            );
            assert_ne!(run(8), logits, "{}: another seed, another model", full.name);
            // A tokenizer with more tokens than the shape has rows: padded to it.
            let padded =
                Model::synthetic(&narrow, 600, 7, WeightFormat::F32, 64, &Device::Cpu).unwrap();
            assert_eq!(padded.config().vocab, 600, "{}", full.name);
        }
    }
}
