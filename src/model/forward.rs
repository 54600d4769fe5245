//! A llama-family transformer over candle that verifies draft trees: it takes the tree
//! flattened in topological order, each token's position (base + depth) and its
//! ancestors, and returns logits for every token. Its KV cache is preallocated, keeps a
//! logical length, and keeps only the accepted path after each step.
//!
//! The library's `quantized_llama` cannot do this: it builds its own causal mask, uses
//! contiguous positions, returns the last row only and grows a cache it cannot cut.

use std::path::PathBuf;

use candle_core::{D, DType, Device, Tensor};

use super::arch::{Family, RopeSpec};
use super::kernels::Simd;
use super::kernels::activation::{Activation, gate_mul};
use super::kernels::attention::{AttnShape, SequenceCache, attend};
use super::kernels::norm::{RopePairs, Rotary, add_assign, add_bias, gather_heads, rms_norm};
pub use super::kv_cache::KvCache;
use super::linear::{Embedding, Linear, NormWeights};

/// Errors from loading or running the model.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    /// The model file could not be read.
    #[error("cannot read model {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// The file is not a usable llama GGUF.
    #[error("model {path}: {message}")]
    Format {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },
    /// The context would pass the KV cache's capacity.
    #[error(
        "context too long: {needed} tokens, the model's context is {capacity}; shorten the prompt or lower max_tokens"
    )]
    ContextFull {
        /// Tokens needed.
        needed: usize,
        /// Capacity.
        capacity: usize,
    },
    /// The prompt cannot run (empty, or holding ids the model does not have).
    #[error("bad prompt: {0}")]
    BadPrompt(String),
    /// A pass's rows do not form a tree (a parent missing, or after its child): a bug
    /// in the caller, refused before it can index out of bounds.
    #[error("bad pass: {0}")]
    BadPass(String),
    /// The model cannot run on this device in this weight format.
    #[error(
        "this {0:?} model cannot run on this GPU in this weight format: the GPU's own kernels run every family in f32 or bf16 (--weights bf16), candle's GPU operations llama's plain block alone; or use a build without the cuda feature"
    )]
    NotOnDevice(Family),
    /// The draft model cannot draft for this target (hybrid mode).
    #[error("draft model: {0}")]
    DraftModel(String),
    /// A tensor operation failed.
    #[error("model computation failed: {0}")]
    Candle(#[from] candle_core::Error),
    /// A pass's accepted rows could not be kept in the KV cache.
    #[error(transparent)]
    Commit(#[from] super::kv_cache::CommitError),
    /// The GPU's own kernels could not be set up or run.
    #[cfg(feature = "cuda")]
    #[error(transparent)]
    Cuda(#[from] super::cuda::CudaError),
}

/// How the matrices are held in memory. On the CPU every choice runs on the row-invariant
/// kernels ([`super::kernels`]), so a token's logits do not depend on what else is in the
/// forward pass, and speculative greedy output is plain greedy output.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "snake_case")]
pub enum WeightFormat {
    /// As stored in the file (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K and Q6_K have
    /// kernels; other formats fall back to candle's matmul, which is not row-invariant).
    Native,
    /// Requantized to Q8_0.
    Q8_0,
    /// Dequantized to f32: four times the memory traffic of Q8_0 per decoding step.
    F32,
    /// Rounded to bf16: on a GPU, half the bytes of f32 through the same exact kernels
    /// (the CUDA build's default); on the CPU, bf16 values held as f32.
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
    fn new(
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
        let (cos, sin) = (freqs.cos()?, freqs.sin()?);
        Ok(RopeTable {
            cos_host: cos.flatten_all()?.to_vec1()?,
            sin_host: sin.flatten_all()?.to_vec1()?,
            cos,
            sin,
        })
    }
}

/// One sequence's part of a batched forward pass: its cache, its new tokens and their
/// parents (see [`Model::forward`]).
pub struct BatchEntry<'a> {
    /// The sequence's KV cache.
    pub cache: &'a mut KvCache,
    /// New tokens, in topological order.
    pub tokens: &'a [u32],
    /// Each token's parent index in `tokens`, or -1.
    pub parents: &'a [i32],
    /// Which of this entry's rows get logits: prefill chunks need none, which saves
    /// the head, and a draft model catching up needs only its last row's.
    pub logits: LogitRows,
}

/// The rows of a [`BatchEntry`] whose logits a pass returns.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogitRows {
    /// None (a prefill chunk).
    None,
    /// Every row (a verified draft).
    All,
    /// The last row only (the next token after a chunk).
    Last,
}

/// The layout of one batched forward pass: where each sequence's rows start and what
/// each of its tokens attends to, every row's position and token, and the rows whose
/// logits are wanted.
pub(super) struct BatchPlan {
    /// Per sequence: its first row, and per token the indices (after the committed
    /// context) it attends to: its ancestors from the root down, then itself.
    pub(super) parts: Vec<(usize, Vec<Vec<usize>>)>,
    /// Each row's position in its sequence: committed length + depth in the tree.
    pub(super) positions: Vec<u32>,
    /// Each row's token.
    pub(super) ids: Vec<u32>,
    /// Rows in the pass.
    pub(super) total: usize,
    /// The rows whose logits are returned, ascending.
    pub(super) wanted: Vec<u32>,
}

impl BatchPlan {
    /// The plan of `batch`, whose caches are made ready for its rows (`layers` layers of
    /// `row` floats per position). A token attends to the committed context, then its
    /// ancestors from the root down, then itself: in plain decoding it attends to exactly
    /// these keys in this order, which is what makes the result bit-identical.
    fn new(batch: &mut [BatchEntry<'_>], layers: usize, row: usize, host_cache: bool) -> Self {
        let total: usize = batch.iter().map(|e| e.tokens.len()).sum();
        let mut parts = Vec::with_capacity(batch.len());
        let mut positions = Vec::with_capacity(total);
        let mut ids = Vec::with_capacity(total);
        let mut wanted = Vec::new();
        let mut offset = 0;
        for e in batch.iter_mut() {
            let t = e.tokens.len();
            let mut sets: Vec<Vec<usize>> = Vec::with_capacity(t);
            for (i, &p) in e.parents.iter().enumerate() {
                debug_assert!(p < i as i32, "forward_batch checked the parents");
                let mut chain = if p < 0 {
                    Vec::new()
                } else {
                    sets[p as usize].clone()
                };
                chain.push(i);
                positions.push((e.cache.len + chain.len() - 1) as u32);
                sets.push(chain);
            }
            ids.extend_from_slice(e.tokens);
            if host_cache {
                e.cache.prepare(layers, row, t);
            }
            match e.logits {
                LogitRows::None => {}
                LogitRows::All => wanted.extend(offset as u32..(offset + t) as u32),
                LogitRows::Last if t > 0 => wanted.push((offset + t - 1) as u32),
                LogitRows::Last => {}
            }
            parts.push((offset, sets));
            offset += t;
        }
        BatchPlan {
            parts,
            positions,
            ids,
            total,
            wanted,
        }
    }
}

/// The model's weights; sequences bring their own [`KvCache`].
pub struct Model {
    cfg: ModelConfig,
    embed: Embedding,
    layers: Vec<Layer>,
    norm: NormWeights,
    head: Linear,
    /// RoPE's tables: one, or Gemma's global and local ones (`Layer::rope` picks).
    ropes: Vec<RopeTable>,
    device: Device,
    /// The pass through suffixd's own GPU kernels, for f32 and bf16 weights on CUDA.
    #[cfg(feature = "cuda")]
    cuda: Option<super::cuda::CudaForward>,
}

impl Model {
    /// The model from its weights, with RoPE tables for its whole context (`ropes`: the
    /// tables the layers name).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn assemble(
        mut cfg: ModelConfig,
        embed: Embedding,
        mut layers: Vec<Layer>,
        norm: NormWeights,
        head: Linear,
        ropes: &[RopeSpec],
        device: &Device,
        format: WeightFormat,
    ) -> Result<Self, ModelError> {
        // A window as long as the context never binds: such a layer is a plain one
        // (Mistral 7B v0.1's 4,096 at a context of 4,096 or less runs on the GPU).
        for layer in &mut layers {
            if layer.rope == 0 && layer.window.is_some_and(|w| w >= cfg.context) {
                layer.window = None;
            }
        }
        cfg.sliding_window = layers.iter().find_map(|l| l.window);
        let ropes = ropes
            .iter()
            .map(|spec| RopeTable::new(spec, cfg.head_dim, cfg.context, device))
            .collect::<Result<Vec<_>, _>>()?;
        // What candle's GPU operations run (the GPU's own kernels run every family):
        // llama's block alone, with heads as wide as width / heads.
        let plain = cfg.embed_scale.is_none()
            && cfg.activation == Activation::Silu
            && cfg.rope_pairs == RopePairs::Adjacent
            && cfg.attn_scale == 1.0 / (cfg.head_dim as f32).sqrt()
            && cfg.heads * cfg.head_dim == cfg.width
            && layers.iter().all(Layer::is_plain);
        // A quantized table is kept on the CPU only, where there are no device kernels.
        #[cfg(feature = "cuda")]
        let cuda = match &embed {
            Embedding::Dense(embed) => {
                super::cuda::build(&cfg, embed, &layers, &norm, &head, &ropes, device, format)?
            }
            Embedding::Quantized { .. } => None,
        };
        #[cfg(feature = "cuda")]
        if cuda.is_none() && !plain && !device.is_cpu() {
            return Err(ModelError::NotOnDevice(cfg.family));
        }
        #[cfg(not(feature = "cuda"))]
        let _ = format;
        #[cfg(not(feature = "cuda"))]
        if !plain && !device.is_cpu() {
            return Err(ModelError::NotOnDevice(cfg.family));
        }
        Ok(Model {
            #[cfg(feature = "cuda")]
            cuda,
            cfg,
            embed,
            layers,
            norm,
            head,
            ropes,
            device: device.clone(),
        })
    }

    /// The architecture's sizes.
    pub fn config(&self) -> &ModelConfig {
        &self.cfg
    }

    /// Run `tokens` after the committed context in `cache`. `parents[i]` is the index in
    /// `tokens` of token i's parent (parent < i), or -1 for a token that follows the
    /// context directly. Token i sits at position `len + depth(i)` and attends to the
    /// context, its ancestors and itself. Returns logits, one row per token, `(T, vocab)`.
    /// Nothing is committed until [`KvCache::commit`].
    pub fn forward(
        &self,
        cache: &mut KvCache,
        tokens: &[u32],
        parents: &[i32],
    ) -> Result<Tensor, ModelError> {
        self.forward_batch(&mut [BatchEntry {
            cache,
            tokens,
            parents,
            logits: LogitRows::All,
        }])
    }

    /// Index of the largest value of each row of `logits` (this model's output); ties go
    /// to the lowest index. On the device kernels' GPU it runs there, and only the ids
    /// come back; elsewhere it is [`argmax_rows`].
    pub fn argmax_rows(&self, logits: &Tensor) -> Result<Vec<u32>, ModelError> {
        #[cfg(feature = "cuda")]
        if let Some(cuda) = &self.cuda
            && !logits.device().is_cpu()
        {
            return Ok(cuda.argmax_rows(logits)?);
        }
        argmax_rows(logits)
    }

    /// One forward pass over several sequences at once: their rows share every matrix
    /// product, and each attends only within its own sequence (a block-diagonal mask).
    /// Returns the logits of the rows of every entry that wants them, entry after
    /// entry, `(ΣT, vocab)`.
    ///
    /// Every row gets bit-for-bit the logits it would get alone: the products treat rows
    /// independently and attention runs per query (see [`attend`]).
    pub fn forward_batch(&self, batch: &mut [BatchEntry<'_>]) -> Result<Tensor, ModelError> {
        for (n, e) in batch.iter().enumerate() {
            if e.parents.len() != e.tokens.len() {
                return Err(ModelError::BadPass(format!(
                    "entry {n} has {} tokens and {} parents",
                    e.tokens.len(),
                    e.parents.len()
                )));
            }
            if let Some(i) = (0..e.parents.len()).find(|&i| !(-1..i as i32).contains(&e.parents[i]))
            {
                return Err(ModelError::BadPass(format!(
                    "entry {n}: row {i}'s parent {} is not an earlier row",
                    e.parents[i]
                )));
            }
            if e.cache.len + e.tokens.len() > self.cfg.context {
                return Err(ModelError::ContextFull {
                    needed: e.cache.len + e.tokens.len(),
                    capacity: self.cfg.context,
                });
            }
        }
        #[cfg(feature = "cuda")]
        let host_cache = self.cuda.is_none();
        #[cfg(not(feature = "cuda"))]
        let host_cache = true;
        let plan = BatchPlan::new(
            batch,
            self.layers.len(),
            self.cfg.kv_heads * self.cfg.head_dim,
            host_cache,
        );
        if plan.total == 0 {
            return Ok(Tensor::zeros(
                (0, self.cfg.vocab),
                DType::F32,
                &self.device,
            )?);
        }
        #[cfg(feature = "cuda")]
        if let Some(cuda) = &self.cuda {
            return Ok(cuda.forward(batch, &plan)?);
        }
        if self.device.is_cpu() {
            self.forward_host(batch, &plan)
        } else {
            self.forward_device(batch, &plan)
        }
    }

    /// The pass on the CPU: every step on host vectors, through the row-invariant
    /// kernels, with no tensor between them (a tensor operation per step costs more
    /// than the step at a few rows, and runs on one thread while the pool waits).
    fn forward_host(
        &self,
        batch: &mut [BatchEntry<'_>],
        plan: &BatchPlan,
    ) -> Result<Tensor, ModelError> {
        let ModelConfig {
            heads: h,
            kv_heads: kvh,
            head_dim: hd,
            rms_eps: eps,
            ..
        } = self.cfg;
        let total = plan.total;
        let simd = Simd::detect();
        let mut x = self.embed.lookup(&plan.ids)?;
        if let Some(scale) = self.cfg.embed_scale {
            x.iter_mut().for_each(|v| *v *= scale);
        }
        let (mut normed, mut product) = (Vec::new(), Vec::new());
        let (mut q, mut k, mut v) = (Vec::new(), Vec::new(), Vec::new());
        let qkv_width = (h + 2 * kvh) * hd;
        // A sublayer's output into the residual, through the layer's post-norm if any.
        let add_residual =
            |x: &mut Vec<f32>, out: &[f32], post: Option<&NormWeights>, scratch: &mut Vec<f32>| {
                match post {
                    Some(norm) => {
                        rms_norm(out, &norm.host, eps, scratch);
                        add_assign(x, scratch);
                    }
                    None => add_assign(x, out),
                }
            };
        for (l, layer) in self.layers.iter().enumerate() {
            rms_norm(&x, &layer.attn_norm.host, eps, &mut normed);
            layer.qkv.forward_host(&normed, total, &mut product)?;
            if let Some(bias) = &layer.qkv_bias {
                add_bias(&mut product, bias);
            }
            let table = &self.ropes[layer.rope];
            let rotary = Some(Rotary {
                positions: &plan.positions,
                cos: &table.cos_host,
                sin: &table.sin_host,
                pairs: self.cfg.rope_pairs,
            });
            let q_norm = layer.q_norm.as_ref().map(|n| (n.host.as_slice(), eps));
            let k_norm = layer.k_norm.as_ref().map(|n| (n.host.as_slice(), eps));
            gather_heads(&product, qkv_width, 0, h, hd, q_norm, rotary, &mut q);
            gather_heads(&product, qkv_width, h * hd, kvh, hd, k_norm, rotary, &mut k);
            gather_heads(
                &product,
                qkv_width,
                (h + kvh) * hd,
                kvh,
                hd,
                None,
                None,
                &mut v,
            );
            let attended = self.attention(l, batch, plan, &q, &k, &v);
            layer.wo.forward_host(&attended, total, &mut product)?;
            add_residual(&mut x, &product, layer.post_attn_norm.as_ref(), &mut normed);
            rms_norm(&x, &layer.ffn_norm.host, eps, &mut normed);
            layer.gate_up.forward_host(&normed, total, &mut product)?;
            let gated = gate_mul(
                simd,
                self.cfg.activation,
                &product,
                total,
                product.len() / (2 * total),
            );
            layer.down.forward_host(&gated, total, &mut product)?;
            add_residual(&mut x, &product, layer.post_ffn_norm.as_ref(), &mut normed);
        }
        let width = self.cfg.width;
        let rows = plan.wanted.len();
        if rows < total {
            x = plan
                .wanted
                .iter()
                .flat_map(|&r| {
                    x[r as usize * width..(r as usize + 1) * width]
                        .iter()
                        .copied()
                })
                .collect();
        }
        rms_norm(&x, &self.norm.host, eps, &mut normed);
        self.head.forward_host(&normed, rows, &mut product)?;
        Ok(Tensor::from_vec(
            product,
            (rows, self.cfg.vocab),
            &self.device,
        )?)
    }

    /// The pass on a device: candle's operations, with attention on the host.
    fn forward_device(
        &self,
        batch: &mut [BatchEntry<'_>],
        plan: &BatchPlan,
    ) -> Result<Tensor, ModelError> {
        let (h, kvh, hd) = (self.cfg.heads, self.cfg.kv_heads, self.cfg.head_dim);
        let total = plan.total;
        let positions = Tensor::new(plan.positions.as_slice(), &self.device)?;
        // Only plain llama blocks reach a device (`assemble`): one table, adjacent pairs.
        let cos = self.ropes[0]
            .cos
            .index_select(&positions, 0)?
            .contiguous()?;
        let sin = self.ropes[0]
            .sin
            .index_select(&positions, 0)?
            .contiguous()?;
        let ids = Tensor::new(plan.ids.as_slice(), &self.device)?;
        let mut x = self.embed.dense()?.index_select(&ids, 0)?;
        // Columns `from..from + n·hd` of the fused q|k|v product as `(1, n, total, hd)`.
        let heads = |qkv: &Tensor, from: usize, n: usize| -> Result<Tensor, candle_core::Error> {
            qkv.narrow(1, from, n * hd)?
                .contiguous()?
                .reshape((1, total, n, hd))?
                .transpose(1, 2)?
                .contiguous()
        };
        for (l, layer) in self.layers.iter().enumerate() {
            let a = candle_nn::ops::rms_norm(&x, &layer.attn_norm.device, self.cfg.rms_eps)?;
            let qkv = layer.qkv.forward(&a)?;
            let q = candle_nn::rotary_emb::rope_i(&heads(&qkv, 0, h)?, &cos, &sin)?;
            let k = candle_nn::rotary_emb::rope_i(&heads(&qkv, h * hd, kvh)?, &cos, &sin)?;
            let v = heads(&qkv, (h + kvh) * hd, kvh)?;
            let q: Vec<f32> = q.flatten_all()?.to_vec1()?;
            let k: Vec<f32> = k.flatten_all()?.to_vec1()?;
            let v: Vec<f32> = v.flatten_all()?.to_vec1()?;
            let out = self.attention(l, batch, plan, &q, &k, &v);
            let out = Tensor::from_vec(out, (total, h * hd), &self.device)?;
            x = (x + layer.wo.forward(&out)?)?;
            let f = candle_nn::ops::rms_norm(&x, &layer.ffn_norm.device, self.cfg.rms_eps)?;
            let gate_up = layer.gate_up.forward(&f)?;
            let ffn = gate_up.dim(1)? / 2;
            let g = candle_nn::ops::silu(&gate_up.narrow(1, 0, ffn)?)?;
            x = (x + layer.down.forward(&(g * gate_up.narrow(1, ffn, ffn)?)?)?)?;
        }
        if plan.wanted.is_empty() {
            return Ok(Tensor::zeros(
                (0, self.cfg.vocab),
                DType::F32,
                &self.device,
            )?);
        }
        if plan.wanted.len() < total {
            x = x.index_select(&Tensor::new(plan.wanted.as_slice(), &self.device)?, 0)?;
        }
        let x = candle_nn::ops::rms_norm(&x, &self.norm.device, self.cfg.rms_eps)?;
        Ok(self.head.forward(&x)?.to_dtype(DType::F32)?)
    }

    /// Layer `l`'s attention for every sequence of the batch: their new keys and values
    /// (`k`, `v`: `[kv_head][row][head_dim]`) into their caches, then every query (`q`:
    /// `[head][row][head_dim]`) over its attention set. Returns `[row][head][head_dim]`.
    fn attention(
        &self,
        l: usize,
        batch: &mut [BatchEntry<'_>],
        plan: &BatchPlan,
        q: &[f32],
        k: &[f32],
        v: &[f32],
    ) -> Vec<f32> {
        let (h, kvh, hd) = (self.cfg.heads, self.cfg.kv_heads, self.cfg.head_dim);
        let total = plan.total;
        for (e, (offset, _)) in batch.iter_mut().zip(&plan.parts) {
            let (base, t) = (e.cache.len, e.tokens.len());
            let (keys, values) = (&mut e.cache.keys[l], &mut e.cache.values[l]);
            for i in 0..t {
                for g in 0..kvh {
                    let src = (g * total + offset + i) * hd;
                    let dst = ((base + i) * kvh + g) * hd;
                    keys[dst..dst + hd].copy_from_slice(&k[src..src + hd]);
                    values[dst..dst + hd].copy_from_slice(&v[src..src + hd]);
                }
            }
        }
        // Every sequence in one call: one meeting of the threads per layer, and the
        // work of all of them to share between the threads.
        let sequences: Vec<SequenceCache<'_>> = batch
            .iter()
            .zip(&plan.parts)
            .map(|(e, (offset, sets))| SequenceCache {
                keys: &e.cache.keys[l],
                values: &e.cache.values[l],
                sets,
                base: e.cache.len,
                offset: *offset,
            })
            .collect();
        let shape = AttnShape {
            scale: self.cfg.attn_scale,
            window: self.layers[l].window,
            ..AttnShape::full(total, h, kvh, hd)
        };
        let mut out = vec![0f32; total * h * hd];
        attend(Simd::detect(), q, &sequences, shape, &mut out);
        out
    }

    /// The device the model runs on.
    pub fn device(&self) -> &Device {
        &self.device
    }
}

/// Index of the largest value of each row of `logits` `(T, vocab)`; ties go to the
/// lowest index, as plain greedy decoding does.
/// On the CPU it reads the rows in place (candle's reduction took 1.4% of a 16-row
/// pass); elsewhere it is candle's.
pub fn argmax_rows(logits: &Tensor) -> Result<Vec<u32>, ModelError> {
    if logits.device().is_cpu() && logits.dtype() == DType::F32 && logits.is_contiguous() {
        let (rows, vocab) = logits.dims2()?;
        let (storage, layout) = logits.storage_and_layout();
        if let candle_core::Storage::Cpu(cpu) = &*storage {
            let data = &cpu.as_slice::<f32>()?[layout.start_offset()..][..rows * vocab];
            return Ok(data.chunks_exact(vocab.max(1)).map(argmax).collect());
        }
    }
    Ok(logits.argmax(D::Minus1)?.to_vec1::<u32>()?)
}

/// The index of the largest value, the lowest of equal ones; NaN is never the largest
/// (0 if every value is NaN). The maximum is taken in eight lanes, which the compiler
/// turns into vector instructions, and then found.
pub(crate) fn argmax(row: &[f32]) -> u32 {
    let mut lanes = [f32::NEG_INFINITY; 8];
    let chunks = row.chunks_exact(8);
    let rest = chunks.remainder();
    for chunk in chunks {
        for (lane, &x) in lanes.iter_mut().zip(chunk) {
            *lane = if x > *lane { x } else { *lane };
        }
    }
    let max = lanes
        .iter()
        .chain(rest)
        .fold(f32::NEG_INFINITY, |m, &x| if x > m { x } else { m });
    row.iter().position(|&x| x == max).unwrap_or(0) as u32
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::linear::weights_of;
    use candle_core::quantized::{GgmlDType, QTensor};

    /// `n × k` weights quantized to `dtype`, from a seed.
    fn weights(dtype: GgmlDType, n: usize, k: usize, seed: u64) -> QTensor {
        let w = crate::model::kernels::test_values(n * k, seed, 1.0);
        let t = Tensor::from_vec(w, (n, k), &Device::Cpu).unwrap();
        QTensor::quantize(&t, dtype).unwrap()
    }

    #[test]
    fn argmax_rows_agrees_with_candle_s_and_takes_the_first_of_ties() {
        let mut data = crate::model::kernels::test_values(3 * 1003, 5, 10.0);
        // Row 1: a tie between 17 and 900; row 2: the largest value in the tail.
        data[1003 + 17] = 50.0;
        data[1003 + 900] = 50.0;
        data[2 * 1003 + 1001] = 60.0;
        let logits = Tensor::from_vec(data, (3, 1003), &Device::Cpu).unwrap();
        let got = argmax_rows(&logits).unwrap();
        assert_eq!(
            got,
            logits.argmax(D::Minus1).unwrap().to_vec1::<u32>().unwrap()
        );
        assert_eq!(&got[1..], &[17, 1001]);
        let nan = Tensor::from_vec(
            vec![f32::NAN, 1.0, f32::NAN, 3.0, 2.0],
            (1, 5),
            &Device::Cpu,
        );
        assert_eq!(argmax_rows(&nan.unwrap()).unwrap(), [3]);
    }

    #[test]
    fn a_mixed_projection_puts_each_part_s_columns_side_by_side() {
        let (rows, k) = (3, 64);
        let x = crate::model::kernels::test_values(rows * k, 9, 2.0);
        // F16 has no row-invariant kernel: candle multiplies it.
        let packed = || weights(GgmlDType::Q8_0, 40, k, 1);
        let candle = || weights(GgmlDType::F16, 24, k, 2);
        let alone = |qt: QTensor| {
            let mut out = Vec::new();
            Linear::new(vec![weights_of(qt, &Device::Cpu).unwrap()])
                .forward_host(&x, rows, &mut out)
                .unwrap();
            out
        };
        let (a, b) = (alone(packed()), alone(candle()));
        let mixed = Linear::new(vec![
            weights_of(packed(), &Device::Cpu).unwrap(),
            weights_of(candle(), &Device::Cpu).unwrap(),
        ]);
        assert!(matches!(mixed, Linear::Mixed(_)));
        let mut out = Vec::new();
        mixed.forward_host(&x, rows, &mut out).unwrap();
        for r in 0..rows {
            assert_eq!(out[r * 64..r * 64 + 40], a[r * 40..(r + 1) * 40]);
            assert_eq!(out[r * 64 + 40..(r + 1) * 64], b[r * 24..(r + 1) * 24]);
        }
        // Through a tensor, the same values.
        let t = Tensor::from_slice(&x, (rows, k), &Device::Cpu).unwrap();
        let y: Vec<f32> = mixed
            .forward(&t)
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1()
            .unwrap();
        assert_eq!(y, out);
    }
}
