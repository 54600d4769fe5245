//! The model families suffixd runs, and what each adds to the llama block.
//!
//! Every family is the same decoder block over the same row-invariant kernels: a norm,
//! attention, a residual, a norm, a gated feed-forward, a residual. A family only turns
//! on parts of it (biases on q, k and v; per-head norms on q and k; norms after attention
//! and after the feed-forward; GELU instead of SiLU; scaled embeddings; sliding-window
//! layers) and names its metadata and tensors. [`super::load`] reads them; the forward
//! pass ([`super::forward`]) runs whatever parts a layer has.

use super::kernels::activation::Activation;
use super::kernels::norm::RopePairs;

/// A model family (architecture).
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Family {
    /// Llama 2 and 3 (with Llama 3's RoPE scaling), SmolLM, TinyLlama, and Mistral models
    /// converted to GGUF as llama.
    Llama,
    /// Mistral: llama with sliding-window attention (Hugging Face `model_type` mistral).
    Mistral,
    /// Qwen 2 and 2.5: biases on q, k and v.
    Qwen2,
    /// Qwen 3: RMS norms on each head of q and k.
    Qwen3,
    /// Gemma 3 (text): q and k norms, norms after attention and after the feed-forward,
    /// GELU, embeddings scaled by √width, and sliding-window layers between global ones.
    Gemma3,
    /// SmolLM3: llama's block, with some layers that rotate nothing (NoPE; every fourth).
    SmolLM3,
}

/// The GGUF architectures (`general.architecture`) that load, for error messages.
pub const SUPPORTED_GGUF: &str = "llama, qwen2, qwen3, gemma3, smollm3";
/// The Hugging Face `model_type`s that load, for error messages.
pub const SUPPORTED_HF: &str = "llama, mistral, qwen2, qwen3, gemma3_text, smollm3";

impl Family {
    /// The family of a GGUF file's `general.architecture`.
    pub fn from_gguf(arch: &str) -> Option<Self> {
        Some(match arch {
            "llama" => Family::Llama,
            "qwen2" => Family::Qwen2,
            "qwen3" => Family::Qwen3,
            "gemma3" => Family::Gemma3,
            "smollm3" => Family::SmolLM3,
            _ => return None,
        })
    }

    /// The family of a Hugging Face `config.json`'s `model_type`.
    pub fn from_hf(model_type: &str) -> Option<Self> {
        Some(match model_type {
            "llama" => Family::Llama,
            "mistral" => Family::Mistral,
            "qwen2" => Family::Qwen2,
            "qwen3" => Family::Qwen3,
            "gemma3_text" => Family::Gemma3,
            "smollm3" => Family::SmolLM3,
            _ => return None,
        })
    }

    /// The parts of the block this family has.
    pub fn block(self) -> Block {
        let llama = Block {
            qkv_bias: false,
            qk_norm: false,
            sandwich_norms: false,
            activation: Activation::Silu,
            embed_scale: false,
            hf_norm_offset: 0.0,
            gguf_rope_pairs: RopePairs::Adjacent,
        };
        match self {
            Family::Llama | Family::Mistral | Family::SmolLM3 => llama,
            Family::Qwen2 => Block {
                qkv_bias: true,
                gguf_rope_pairs: RopePairs::Halves,
                ..llama
            },
            Family::Qwen3 => Block {
                qk_norm: true,
                gguf_rope_pairs: RopePairs::Halves,
                ..llama
            },
            Family::Gemma3 => Block {
                qk_norm: true,
                sandwich_norms: true,
                activation: Activation::GeluTanh,
                embed_scale: true,
                hf_norm_offset: 1.0,
                gguf_rope_pairs: RopePairs::Halves,
                ..llama
            },
        }
    }
}

/// What a family's block has beyond llama's.
#[derive(Clone, Copy, Debug)]
pub struct Block {
    /// Biases on the q, k and v projections.
    pub qkv_bias: bool,
    /// An RMS norm on each head of q and of k, before RoPE.
    pub qk_norm: bool,
    /// An RMS norm on the attention's output and on the feed-forward's, before each is
    /// added to the residual.
    pub sandwich_norms: bool,
    /// The feed-forward's gate.
    pub activation: Activation,
    /// Embeddings are multiplied by √width.
    pub embed_scale: bool,
    /// Hugging Face checkpoints store Gemma's norm weights as `w` and apply `1 + w`;
    /// GGUF files store `1 + w`.
    pub hf_norm_offset: f32,
    /// How GGUF lays out each head of q and k for RoPE (llama.cpp permutes llama's rows
    /// into adjacent pairs and keeps the others' halves).
    pub gguf_rope_pairs: RopePairs,
}

/// Llama 3's RoPE scaling (`rope_type: "llama3"`): per frequency, what its inverse
/// frequency is divided by. Long wavelengths are slowed by `factor`, short ones kept, and
/// the band between blended; the same values llama.cpp's converter writes as the GGUF
/// tensor `rope_freqs.weight`.
pub fn llama3_rope_divisors(
    head_dim: usize,
    base: f32,
    factor: f32,
    low_freq_factor: f32,
    high_freq_factor: f32,
    original_context: f32,
) -> Vec<f32> {
    let low_wavelen = original_context / low_freq_factor;
    let high_wavelen = original_context / high_freq_factor;
    (0..head_dim / 2)
        .map(|i| {
            let freq = 1.0 / base.powf(2.0 * i as f32 / head_dim as f32);
            let wavelen = 2.0 * std::f32::consts::PI / freq;
            if wavelen < high_wavelen {
                1.0
            } else if wavelen > low_wavelen {
                factor
            } else {
                let smooth = (original_context / wavelen - low_freq_factor)
                    / (high_freq_factor - low_freq_factor);
                freq / ((1.0 - smooth) * freq / factor + smooth * freq)
            }
        })
        .collect()
}

/// YaRN's RoPE scaling (`rope_type: "yarn"`; Peng et al. 2023): what a config says of it.
/// Frequencies that turn fewer than `beta_slow` times over the trained context are slowed
/// by `factor` (interpolated), those that turn more than `beta_fast` times are kept
/// (extrapolated), and the band between is blended linearly by frequency index.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Yarn {
    /// How many times longer the context is than the one trained on.
    pub factor: f32,
    /// The context the model was trained on (`original_max_position_embeddings`).
    pub original_context: f32,
    /// Turns over the trained context from which a frequency is kept (default 32).
    pub beta_fast: f32,
    /// Turns below which a frequency is slowed by `factor` (default 1).
    pub beta_slow: f32,
    /// Whether the band's ends are rounded out to whole indices (transformers'
    /// `truncate`, true by default; llama.cpp always rounds).
    pub truncate: bool,
    /// How much of the kept frequency the blend takes (llama.cpp's `ext_factor`; 1 in
    /// transformers).
    pub ext_factor: f32,
}

/// YaRN's per-frequency divisors for a head of `head_dim` values at `base`, computed as
/// transformers' `_compute_yarn_parameters` and llama.cpp's `rope_yarn` do: index i's
/// inverse frequency is w·f + (1 − w)·f / factor, with w the share of the kept
/// frequency (1 below the band, 0 above it, linear across it).
pub fn yarn_rope_divisors(head_dim: usize, base: f32, yarn: &Yarn) -> Vec<f32> {
    // The index at which a frequency turns `turns` times over the trained context (in f64,
    // as both references compute it).
    let index_of = |turns: f32| {
        let (dim, base) = (head_dim as f64, base as f64);
        dim * (yarn.original_context as f64 / (turns as f64 * 2.0 * std::f64::consts::PI)).ln()
            / (2.0 * base.ln())
    };
    let (mut low, mut high) = (index_of(yarn.beta_fast), index_of(yarn.beta_slow));
    if yarn.truncate {
        (low, high) = (low.floor(), high.ceil());
    }
    let (low, high) = (low.max(0.0) as f32, high.min(head_dim as f64 - 1.0) as f32);
    let span = if low == high { 0.001 } else { high - low };
    (0..head_dim / 2)
        .map(|i| {
            let ramp = ((i as f32 - low) / span).clamp(0.0, 1.0);
            let kept = (1.0 - ramp) * yarn.ext_factor;
            1.0 / (kept + (1.0 - kept) / yarn.factor)
        })
        .collect()
}

/// YaRN's attention factor for a context `factor` times the trained one, 1 + 0.1·m·ln(factor),
/// and 1 where nothing is stretched (transformers' and llama.cpp's `get_mscale`), in f64 as
/// transformers computes it.
pub fn yarn_mscale(factor: f64, m: f64) -> f64 {
    if factor <= 1.0 {
        1.0
    } else {
        0.1 * m * factor.ln() + 1.0
    }
}

/// One table of rotary angles: its base frequency, per frequency a divisor (RoPE
/// scaling; empty for none), and what cos and sin are multiplied by.
#[derive(Clone, Debug, PartialEq)]
pub struct RopeSpec {
    /// The base (`rope_theta`).
    pub base: f32,
    /// Per frequency, what its inverse frequency is divided by; empty for plain RoPE.
    pub divisors: Vec<f32>,
    /// What the table's cos and sin are multiplied by: YaRN's attention factor (it scales
    /// every attention score by its square); 1 for the other scalings.
    pub scale: f32,
}

impl RopeSpec {
    /// A table that rotates nothing (SmolLM3's NoPE layers): every angle is 0, so cos 1
    /// and sin 0 leave q and k as they are, on every path and device, with no kernel of
    /// its own.
    pub fn none(head_dim: usize) -> Self {
        RopeSpec {
            base: 1.0,
            divisors: vec![f32::INFINITY; head_dim / 2],
            scale: 1.0,
        }
    }

    /// Plain RoPE at `base`.
    pub fn plain(base: f32) -> Self {
        RopeSpec {
            base,
            divisors: Vec::new(),
            scale: 1.0,
        }
    }

    /// The inverse frequencies of a head of `head_dim` values.
    pub fn inverse_frequencies(&self, head_dim: usize) -> Vec<f32> {
        (0..head_dim / 2)
            .map(|i| {
                let inv = 1.0 / self.base.powf(2.0 * i as f32 / head_dim as f32);
                self.divisors.get(i).map_or(inv, |d| inv / d)
            })
            .collect()
    }
}

/// Gemma 3's layer pattern: every `pattern`-th layer is global, the others slide.
pub fn gemma_layer_slides(layer: usize, pattern: usize) -> bool {
    pattern == 0 || !(layer + 1).is_multiple_of(pattern)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn llama3_divisors_keep_short_wavelengths_and_slow_long_ones() {
        // Llama 3.1's own values: base 500000, factor 8, 1 and 4, 8192.
        let d = llama3_rope_divisors(64, 500_000.0, 8.0, 1.0, 4.0, 8192.0);
        assert_eq!(d.len(), 32);
        assert_eq!(d[0], 1.0, "the fastest frequency is kept");
        assert_eq!(d[31], 8.0, "the slowest is divided by the factor");
        assert!(d.windows(2).all(|w| w[0] <= w[1]), "{d:?}");
        assert!(d.iter().any(|&x| x > 1.0 && x < 8.0), "a blended band");
    }

    #[test]
    fn every_family_s_name_round_trips() {
        for f in [
            Family::Llama,
            Family::Qwen2,
            Family::Qwen3,
            Family::Gemma3,
            Family::SmolLM3,
        ] {
            let name = serde_json::to_value(f).unwrap();
            assert_eq!(Family::from_gguf(name.as_str().unwrap()), Some(f));
        }
        assert_eq!(Family::from_hf("gemma3_text"), Some(Family::Gemma3));
        assert_eq!(Family::from_hf("mistral"), Some(Family::Mistral));
        assert_eq!(Family::from_gguf("phi3"), None);
    }

    #[test]
    fn gemma_s_sixth_layers_are_global() {
        let slides: Vec<bool> = (0..12).map(|l| gemma_layer_slides(l, 6)).collect();
        assert_eq!(slides.iter().filter(|s| !**s).count(), 2);
        assert!(!slides[5] && !slides[11]);
    }
}
