//! What a model is: its architecture's sizes and switches, and how its weights are held.

use super::arch::Family;
use super::kernels::activation::Activation;
use super::kernels::norm::RopePairs;

/// How the matrices are held in memory. On the CPU every choice runs on the row-invariant
/// kernels ([`super::kernels`]), so a token's logits do not depend on what else is in the
/// forward pass, and speculative greedy output is plain greedy output.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "snake_case")]
pub enum WeightFormat {
    /// As stored in the file (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K and Q6_K have
    /// kernels, F32 and F16 run on the f32 kernel and BF16 on the bf16 one; other formats
    /// fall back to candle's matmul, which is not row-invariant).
    Native,
    /// Requantized to Q8_0.
    Q8_0,
    /// Dequantized to f32: four times the memory traffic of Q8_0 per decoding step.
    F32,
    /// Rounded to bf16: half the bytes of f32. On a GPU through the same exact kernels
    /// (the CUDA build's default); on the CPU through the bf16 kernel, which rounds the
    /// activations to bf16 too (AVX-512 BF16's arithmetic, as llama.cpp does).
    Bf16,
}

impl WeightFormat {
    /// The default of this build. On the CPU, native: the file's own weights, and with
    /// the default model (Q4_1 layers, a Q8_0 head) the fastest to decode, since its
    /// 4-bit quants halve the bytes a step reads, while a verified row costs what it
    /// costs with Q8_0 (`tools/verify-cost.sh`). With the `cuda` feature, f32: candle's
    /// CUDA kernels for quantized weights also quantize the activations and pick another
    /// kernel by row count, so a token verified in a draft does not get the logits plain
    /// decoding gives it. On an H100, `e2e-bench` on tools/workloads/agentic.jsonl gave
    /// 15 of 36 outputs identical with q8-0, 3 of 36 with native and 36 of 36 with f32.
    /// The GPU's own kernels (`model::cuda`) run f32 and bf16 exactly; bf16 reads half
    /// the bytes.
    pub const fn default_for_build() -> Self {
        if cfg!(feature = "cuda") {
            WeightFormat::Bf16
        } else {
            WeightFormat::Native
        }
    }
}

/// The architecture: its family, sizes and the switches its block reads.
#[derive(Clone, Debug, serde::Serialize)]
pub struct ModelConfig {
    /// The model family.
    pub family: Family,
    /// Transformer blocks.
    pub layers: usize,
    /// Query heads.
    pub heads: usize,
    /// Key/value heads.
    pub kv_heads: usize,
    /// Width of one head.
    pub head_dim: usize,
    /// Model width.
    pub width: usize,
    /// Vocabulary size.
    pub vocab: usize,
    /// Context length (KV cache capacity).
    pub context: usize,
    /// RoPE base frequency of the global layers.
    pub rope_base: f32,
    /// RMS norm epsilon.
    pub rms_eps: f32,
    /// What attention scores are multiplied by.
    pub attn_scale: f32,
    /// The feed-forward's gate.
    pub activation: Activation,
    /// What embeddings are multiplied by (Gemma: √width).
    pub embed_scale: Option<f32>,
    /// How each head of q and k is paired for RoPE.
    pub rope_pairs: RopePairs,
    /// The sliding window of the layers that have one.
    pub sliding_window: Option<usize>,
}
