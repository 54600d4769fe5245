//! A llama-family transformer over candle that verifies draft trees: it takes the tree
//! flattened in topological order, each token's position (base + depth) and its
//! ancestors, and returns logits for every token. Its KV cache is preallocated, keeps a
//! logical length, and keeps only the accepted path after each step.
//!
//! The library's `quantized_llama` cannot do this: it builds its own causal mask, uses
//! contiguous positions, returns the last row only and grows a cache it cannot cut.

use candle_core::{D, DType, Device, Tensor};

use super::arch::RopeSpec;
pub use super::config::{ModelConfig, WeightFormat};
pub use super::error::ModelError;
use super::kernels::Simd;
use super::kernels::activation::{Activation, gate_mul};
use super::kernels::attention::{AttnShape, SequenceCache, attend};
use super::kernels::norm::{RopePairs, Rotary, add_assign, add_bias, gather_heads, rms_norm};
pub use super::kv_cache::{KvBlock, KvBlockError, KvCache};
use super::layer::{Layer, RopeTable};
use super::linear::{Embedding, Linear, NormWeights};
use super::pass::BatchPlan;
pub use super::pass::{BatchEntry, LogitRows};

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

    /// Free memory on the GPU when the model runs on suffixd's GPU kernels; `None`
    /// elsewhere (or when the driver does not say).
    pub fn device_memory_free(&self) -> Option<u64> {
        #[cfg(feature = "cuda")]
        if let Some(cuda) = &self.cuda {
            return cuda.memory_free();
        }
        None
    }

    /// True when a position's keys and values are the same bits however its prompt was
    /// run (alone, in chunks, beside other sequences): on the CPU's kernels and on
    /// suffixd's own GPU kernels, not on candle's GPU operations. A prefix of keys and
    /// values can then be reused exactly.
    pub fn kv_is_row_invariant(&self) -> bool {
        #[cfg(feature = "cuda")]
        if self.cuda.is_some() {
            return true;
        }
        self.device.is_cpu()
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
