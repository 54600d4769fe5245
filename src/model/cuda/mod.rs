//! The forward pass on a CUDA GPU through suffixd's own kernels ([`KERNELS`], compiled at
//! run time by NVRTC), with the KV cache on the device.
//!
//! Every kernel is row-invariant (see the head of `kernels.cu`): a token's logits are the
//! same bits whether it is decoded alone or verified as one row of a draft tree beside
//! other sequences, so speculative greedy output is plain greedy output on the GPU too.
//! cuBLAS cannot promise that (it picks its algorithm by shape), nor can candle's
//! quantized kernels, so neither is on this path.
//!
//! A llama layer is five launches: q|k|v with the RMS norm fused before it and RoPE and the KV
//! write after it; attention over each row's own keys, split across blocks by fixed key
//! ranges; the output projection added to the residual; gate|up with the norm before and
//! SiLU·up after; the down projection added to the residual. Per pass, one upload of the
//! rows' fields and one launch each for the embedding and the head; greedy decoding's
//! argmax runs on the device too ([`CudaForward::argmax_rows`]), so only the chosen ids
//! come back. Qwen's and Gemma's layers (q|k|v biases, per-head norms of q and k, RoPE
//! on halves) take one launch more: the q|k|v products go out as they are and
//! `qkv_heads` (launch.rs) adds the bias, norms each head, applies RoPE and writes the KV
//! cache. Gemma 3 adds a launch for each post-norm (the sublayer's output as it is, then
//! normed into the residual), one for its GELU gate and one to scale the embeddings;
//! its sliding layers read their own RoPE table and attention skips keys before the
//! window.

use std::sync::{Arc, Mutex};

use candle_core::cuda_backend::cudarc::driver::{
    CudaSlice, CudaStream, DevicePtr, DeviceRepr, LaunchConfig, PushKernelArg,
};
use candle_core::op::BackpropOp;
use candle_core::{CudaDevice, CudaStorage, DType, Storage, Tensor};

mod args;
mod dependent;
pub(super) mod error;
mod graphs;
pub(super) mod kv;
mod launch;
mod module;
mod persistent;
mod tuning;
mod upload;

pub use error::CudaError;
use graphs::Graphs;
use kv::KvKeeper;
pub use kv::{DeviceBlock, DeviceKv};
use launch::Pass;
use module::{Kernels, MMA_TILES, TILES};
use tuning::env_u32;
pub use tuning::{Tuning, compile};
pub(super) use upload::build;

use super::config::ModelConfig;
use super::kernels::activation::Activation;
use super::pass::{BatchEntry, BatchPlan};

/// The kernels' source: kernels.cu, then attention.cu (which uses its helpers) and
/// persistent.cu (which runs both files' bodies), compiled as one.
pub const KERNELS: &str = concat!(
    include_str!("kernels.cu"),
    include_str!("attention.cu"),
    include_str!("persistent.cu")
);

/// The widest head kernels.cu's `qkv_heads` takes (HEADS_MAX_PAIRS pairs per lane).
const HEADS_MAX_HEAD_DIM: usize = 256;

/// The per-row fields of a pass, in the order of kernels.cu's ROW_* constants.
const ROW_FIELDS: usize = 8;
/// The most padding rows a pass gets ([`graphs::padded_rows`]): the slots of the KV cache
/// their keys and values go to.
const PADDING_ROWS: usize = graphs::PADDING_MAX;
/// Threads of an attention block (attention.cu's ATTN_THREADS).
const ATTENTION_THREADS: u32 = 128;
/// Threads of an argmax block (kernels.cu's ARGMAX_THREADS).
const ARGMAX_THREADS: u32 = 1024;
/// Threads of a norm_add block (kernels.cu's NORM_ADD_THREADS).
const NORM_ADD_THREADS: u32 = 256;

/// A weight matrix on the device, `n × k` row-major.
enum Matrix {
    F32(CudaSlice<f32>),
    Bf16(CudaSlice<half::bf16>),
}

struct DeviceLayer {
    attn_norm: CudaSlice<f32>,
    qkv: Matrix,
    /// Qwen's and Gemma's parts between the q|k|v projection and attention, if the
    /// layer has any.
    heads: Option<HeadParts>,
    wo: Matrix,
    /// Gemma's norm of attention's output before the residual.
    post_attn_norm: Option<CudaSlice<f32>>,
    ffn_norm: CudaSlice<f32>,
    gate_up: Matrix,
    down: Matrix,
    /// Gemma's norm of the feed-forward's output before the residual.
    post_ffn_norm: Option<CudaSlice<f32>>,
    /// The sliding window (0: none).
    window: i32,
    /// Which of the model's RoPE tables the layer reads.
    rope: usize,
}

/// What a layer does to its q, k and v heads before RoPE besides llama's block: Qwen 2's
/// biases, Qwen 3's RMS norm of each head of q and of k.
struct HeadParts {
    bias: Option<CudaSlice<f32>>,
    q_norm: Option<CudaSlice<f32>>,
    k_norm: Option<CudaSlice<f32>>,
}

/// Buffers a pass reuses, grown as needed.
#[derive(Default)]
struct Scratch {
    x: Option<CudaSlice<f32>>,
    q: Option<CudaSlice<f32>>,
    /// The q|k|v products of layers with [`HeadParts`].
    raw: Option<CudaSlice<f32>>,
    /// A sublayer's output before its post-norm (Gemma).
    post: Option<CudaSlice<f32>>,
    /// The gate|up products before the GELU gate (Gemma).
    gate_up: Option<CudaSlice<f32>>,
    attended: Option<CudaSlice<f32>>,
    hidden: Option<CudaSlice<f32>>,
    logits: Option<CudaSlice<f32>>,
    /// Attention's per-split parts.
    partials: Option<CudaSlice<f32>>,
    /// The keys and values of padding rows (`PADDING_ROWS` slots, never read by
    /// another row).
    padding_kv: Option<CudaSlice<f32>>,
    /// Attention's tickets, one per (row, head); the kernels leave them at zero.
    tickets: Option<CudaSlice<i32>>,
    fields: Option<CudaSlice<i32>>,
    /// The greedy argmax's ids (read by no graph: its moves bump no generation).
    chosen: Option<CudaSlice<i32>>,
    /// The persistent pass's stages by pass shape (None: a shape it cannot run), never
    /// written again once made (graphs hold their addresses), and their counters.
    stages: std::collections::HashMap<graphs::PassShape, Option<(CudaSlice<u64>, i32)>>,
    finished: Option<CudaSlice<u32>>,
    host_fields: Vec<i32>,
    /// Bumped whenever a buffer above moves: graphs hold their addresses.
    generation: u64,
    graphs: Graphs,
}

/// `slot` holding at least `len` elements (zeros when new); `generation` counts the moves.
fn ensure<'a, T: DeviceRepr + candle_core::cuda_backend::cudarc::driver::ValidAsZeroBits>(
    stream: &Arc<CudaStream>,
    slot: &'a mut Option<CudaSlice<T>>,
    len: usize,
    generation: &mut u64,
) -> Result<&'a mut CudaSlice<T>, CudaError> {
    if slot.as_ref().is_none_or(|s| s.len() < len) {
        *slot = Some(stream.alloc_zeros::<T>(len.next_multiple_of(4096))?);
        *generation += 1;
    }
    Ok(slot.as_mut().expect("just set"))
}

/// The device pass: weights, kernels and scratch buffers.
pub struct CudaForward {
    cfg: ModelConfig,
    device: CudaDevice,
    stream: Arc<CudaStream>,
    kernels: Kernels,
    keeper: Arc<KvKeeper>,
    embed: CudaSlice<f32>,
    layers: Vec<DeviceLayer>,
    norm: CudaSlice<f32>,
    head: Matrix,
    /// RoPE's tables (cos, sin): one, or Gemma's global and local ones.
    ropes: Vec<(CudaSlice<f32>, CudaSlice<f32>)>,
    ffn: usize,
    scratch: Mutex<Scratch>,
}

impl CudaForward {
    /// The device's free memory in bytes, as the driver reports it now.
    pub(super) fn memory_free(&self) -> Option<u64> {
        let (free, _total) = self.stream.context().mem_get_info().ok()?;
        Some(free as u64)
    }

    fn ptr<T>(&self, s: &CudaSlice<T>) -> u64 {
        s.device_ptr(&self.stream).0
    }

    fn matrix_ptr(&self, m: &Matrix) -> (u64, usize) {
        match m {
            Matrix::F32(s) => (self.ptr(s), 0),
            Matrix::Bf16(s) => (self.ptr(s), 1),
        }
    }

    /// The pass: see [`super::forward::Model::forward_batch`].
    pub(super) fn forward(
        &self,
        batch: &mut [BatchEntry<'_>],
        plan: &BatchPlan,
    ) -> Result<Tensor, CudaError> {
        let cfg = &self.cfg;
        let (width, hd) = (cfg.width, cfg.head_dim);
        let qw = cfg.heads * hd;
        let mut scratch = self.scratch.lock().unwrap_or_else(|e| e.into_inner());
        let scratch = &mut *scratch;
        // Padded so that under load the shapes recur and replay as graphs (graphs.rs).
        let rows = scratch.graphs.padded(plan.total);
        let wanted = scratch.graphs.padded(plan.wanted.len()).min(rows);
        let padding_kv = if rows > plan.total {
            let floats = cfg.layers * 2 * PADDING_ROWS * cfg.kv_heads * hd;
            self.ptr(ensure(
                &self.stream,
                &mut scratch.padding_kv,
                floats,
                &mut scratch.generation,
            )?)
        } else {
            0
        };
        let layout = self.write_fields(
            batch,
            plan,
            rows,
            wanted,
            padding_kv,
            &mut scratch.host_fields,
        )?;
        let host = &scratch.host_fields;
        if scratch.fields.as_ref().is_none_or(|s| s.len() < host.len()) {
            // Room for deep trees, so that a graph's buffer rarely moves.
            let len = host.len().max(1 << 16).next_multiple_of(1 << 16);
            scratch.fields = Some(self.stream.alloc_zeros::<i32>(len)?);
            scratch.generation += 1;
        }
        let fields = scratch.fields.as_mut().expect("just set");
        self.stream
            .memcpy_htod(host.as_slice(), &mut fields.slice_mut(..host.len()))?;
        let fields = self.ptr(scratch.fields.as_ref().expect("just set"));
        let at = |i: usize| fields + 4 * i as u64;

        let tickets = self.ptr(ensure(
            &self.stream,
            &mut scratch.tickets,
            rows * cfg.heads,
            &mut scratch.generation,
        )?);
        let splits = self.kernels.tuning.attention_splits as usize;
        let finished = if self.kernels.persistent.is_some() {
            self.ptr(ensure(
                &self.stream,
                &mut scratch.finished,
                persistent::STAGES_PER_LAYER * cfg.layers,
                &mut scratch.generation,
            )?)
        } else {
            0
        };
        let generation = &mut scratch.generation;
        let mut buffer =
            |slot: &mut Option<CudaSlice<f32>>, len: usize| -> Result<u64, CudaError> {
                Ok(self.ptr(ensure(&self.stream, slot, len, generation)?))
            };
        let mut pass = Pass {
            rows,
            wanted,
            x: buffer(&mut scratch.x, rows * width)?,
            q: buffer(&mut scratch.q, rows * qw)?,
            raw: if self.layers.iter().any(|l| l.heads.is_some()) {
                buffer(&mut scratch.raw, rows * (qw + 2 * cfg.kv_heads * hd))?
            } else {
                0
            },
            post: if self
                .layers
                .iter()
                .any(|l| l.post_attn_norm.is_some() || l.post_ffn_norm.is_some())
            {
                buffer(&mut scratch.post, rows * width)?
            } else {
                0
            },
            gate_up: if cfg.activation == Activation::GeluTanh {
                buffer(&mut scratch.gate_up, rows * 2 * self.ffn)?
            } else {
                0
            },
            attended: buffer(&mut scratch.attended, rows * qw)?,
            hidden: buffer(&mut scratch.hidden, rows * self.ffn)?,
            logits: buffer(&mut scratch.logits, (wanted * cfg.vocab).max(1))?,
            partials: buffer(&mut scratch.partials, rows * cfg.heads * splits * (2 + hd))?,
            tickets,
            fields,
            ids: at(layout.ids),
            head_rows: at(layout.head_rows),
            ancestors: at(layout.ancestors),
            persistent: None,
        };
        let key = (rows, wanted, scratch.generation);
        if self.kernels.persistent.is_some() {
            pass.persistent = self.persistent_stages(scratch, key, &pass, finished)?;
        }
        scratch
            .graphs
            .run(&self.stream, key, || self.launch_pass(&pass))?;

        // The logits of the wanted rows (not the padding's), out of the scratch buffer
        // into a tensor of their own.
        let wanted = plan.wanted.len();
        let n = wanted * cfg.vocab;
        // SAFETY: the copy below writes the first n elements; the rest is cut off.
        let mut logits = unsafe { self.stream.alloc::<f32>(n.max(1)) }?;
        if n > 0 {
            let from = scratch.logits.as_ref().expect("made above");
            self.stream
                .memcpy_dtod(&from.slice(..n), &mut logits.slice_mut(..n))?;
        }
        let storage = Storage::Cuda(CudaStorage::wrap_cuda_slice(logits, self.device.clone()));
        let t = Tensor::from_storage(storage, n.max(1), BackpropOp::none(), false);
        Ok(t.narrow(0, 0, n)?.reshape((wanted, cfg.vocab))?)
    }
}

impl CudaForward {
    /// The persistent pass's stages for `pass` of shape `key`: recorded and uploaded on
    /// the shape's first sight, then the same buffer (graphs of the shape read it); None
    /// where a launch of its layers has no stage (persistent.rs).
    fn persistent_stages(
        &self,
        scratch: &mut Scratch,
        key: graphs::PassShape,
        pass: &Pass,
        finished: u64,
    ) -> Result<Option<persistent::DeviceStages>, CudaError> {
        if !scratch.stages.contains_key(&key) {
            if scratch.stages.len() >= graphs::GRAPH_CACHE {
                // Graphs hold the stages' addresses: both start over.
                scratch.graphs.clear();
                scratch.stages.clear();
            }
            let uploaded = match self.record_layers(pass)? {
                Some(stages) if stages.len() <= persistent::STAGES_PER_LAYER * self.cfg.layers => {
                    let words = persistent::stage_words(&stages);
                    Some((self.stream.clone_htod(&words)?, stages.len() as i32))
                }
                _ => None,
            };
            scratch.stages.insert(key, uploaded);
        }
        Ok(scratch
            .stages
            .get(&key)
            .and_then(Option::as_ref)
            .map(|(stages, count)| persistent::DeviceStages {
                stages: self.ptr(stages),
                count: *count,
                finished,
            }))
    }
}

/// Where a pass's index lists start in its uploaded fields (after the per-row ones).
struct FieldLayout {
    ids: usize,
    head_rows: usize,
    ancestors: usize,
}

impl CudaForward {
    /// The fields of a pass of `rows` rows with `wanted` rows of logits into `host`:
    /// [`ROW_FIELDS`] arrays of `rows` (kernels.cu's ROW_*), then the token ids, the
    /// head's row map and the in-pass key slots. Each sequence's KV cache gets room for
    /// its rows first. Rows past the plan's are padding (a token 0 at position 0 that
    /// attends to itself, its key and value written to `padding_kv`), and so are head
    /// rows past the plan's (row 0's logits again, never read): row-invariant kernels
    /// give the plan's rows the same bits beside them.
    fn write_fields(
        &self,
        batch: &mut [BatchEntry<'_>],
        plan: &BatchPlan,
        rows: usize,
        wanted: usize,
        padding_kv: u64,
        host: &mut Vec<i32>,
    ) -> Result<FieldLayout, CudaError> {
        host.clear();
        host.resize(ROW_FIELDS * rows, 0);
        let field = |f: usize, r: usize| f * rows + r;
        let mut ancestors: Vec<i32> = Vec::new();
        for (e, (offset, sets)) in batch.iter_mut().zip(&plan.parts) {
            let (len, t) = (e.cache.len(), e.tokens.len());
            match &mut e.cache.device {
                Some(kv) => kv.reserve(len + t, len)?,
                None => e.cache.device = Some(DeviceKv::new(self.keeper.clone(), len + t)?),
            }
            e.cache.set_pending(t);
            let kv = e.cache.device.as_ref().expect("just made");
            let base = kv.base();
            for (i, set) in sets.iter().enumerate() {
                let r = offset + i;
                host[field(0, r)] = plan.positions[r] as i32;
                host[field(1, r)] = (len + i) as i32;
                host[field(2, r)] = kv.cap as i32;
                host[field(3, r)] = base as u32 as i32;
                host[field(4, r)] = (base >> 32) as u32 as i32;
                host[field(5, r)] = len as i32;
                host[field(6, r)] = ancestors.len() as i32;
                host[field(7, r)] = set.len() as i32;
                ancestors.extend(set.iter().map(|&j| (len + j) as i32));
            }
        }
        assert!(rows - plan.total <= PADDING_ROWS, "padding fits its cache");
        for (slot, r) in (plan.total..rows).enumerate() {
            host[field(1, r)] = slot as i32;
            host[field(2, r)] = PADDING_ROWS as i32;
            host[field(3, r)] = padding_kv as u32 as i32;
            host[field(4, r)] = (padding_kv >> 32) as u32 as i32;
            host[field(6, r)] = ancestors.len() as i32;
            host[field(7, r)] = 1;
            ancestors.push(slot as i32);
        }
        let ids = host.len();
        host.extend(plan.ids.iter().map(|&t| t as i32));
        host.resize(ids + rows, 0);
        let head_rows = host.len();
        host.extend(plan.wanted.iter().map(|&r| r as i32));
        host.resize(head_rows + wanted, 0);
        let at = host.len();
        host.extend_from_slice(&ancestors);
        Ok(FieldLayout {
            ids,
            head_rows,
            ancestors: at,
        })
    }

    /// The greedy choice of each row of `logits` `(T, vocab)` (f32, on this GPU): the
    /// index of the largest value, the lowest of equal ones, NaN never the largest, as
    /// [`super::forward::argmax_rows`] on the CPU. One launch, and only the ids come back.
    pub(super) fn argmax_rows(&self, logits: &Tensor) -> Result<Vec<u32>, CudaError> {
        let (rows, vocab) = logits.dims2()?;
        if rows == 0 {
            return Ok(Vec::new());
        }
        let logits = logits.to_dtype(DType::F32)?.contiguous()?;
        let (storage, layout) = logits.storage_and_layout();
        let Storage::Cuda(c) = &*storage else {
            return Err(CudaError::Shape("the logits are not on the GPU".into()));
        };
        let s = c.as_cuda_slice::<f32>()?;
        let start = layout.start_offset();
        let view = s.slice(start..start + rows * vocab);
        let mut scratch = self.scratch.lock().unwrap_or_else(|e| e.into_inner());
        // No pass's graph reads this buffer, so its moves need not retire them.
        let chosen = ensure(&self.stream, &mut scratch.chosen, rows, &mut 0)?;
        let vocab = vocab as i32;
        let mut b = self.stream.launch_builder(&self.kernels.argmax);
        b.arg(&view).arg(&vocab).arg(&*chosen);
        // SAFETY: argmax_rows(logits, vocab, out): the view holds rows × vocab floats
        // and `chosen` at least rows ints.
        unsafe {
            b.launch(LaunchConfig {
                grid_dim: (rows as u32, 1, 1),
                block_dim: (ARGMAX_THREADS, 1, 1),
                shared_mem_bytes: 0,
            })
        }?;
        let ids = self.stream.clone_dtoh(&chosen.slice(..rows))?;
        Ok(ids.into_iter().map(|i| i as u32).collect())
    }
}

#[cfg(test)]
mod tests {
    /// The kernel a pass takes by its row count: one output tile up to 16 rows, four
    /// (two row tiles each) from 17, and without wide blocks 16, 32 or 64 rows a block.
    #[test]
    fn passes_take_the_tensor_core_shape_their_rows_need() {
        let default = super::Tuning::default();
        let narrow = super::Tuning {
            mma_wide: 1,
            ..default
        };
        for (rows, wide_shape, narrow_shape) in [
            (1, (0, 1, 1), (0, 1, 1)),
            (16, (0, 1, 1), (0, 1, 1)),
            (17, (4, 2, 4), (1, 2, 1)),
            (32, (4, 2, 4), (1, 2, 1)),
            (33, (4, 2, 4), (2, 4, 1)),
            (64, (4, 2, 4), (2, 4, 1)),
            (300, (4, 2, 4), (2, 4, 1)),
        ] {
            assert_eq!(
                super::launch::mma_shape(rows, &default),
                wide_shape,
                "{rows} rows"
            );
            assert_eq!(
                super::launch::mma_shape(rows, &narrow),
                narrow_shape,
                "{rows} rows, narrow"
            );
        }
        let from_one = super::Tuning {
            mma_wide_from: 1,
            ..default
        };
        assert_eq!(super::launch::mma_shape(1, &from_one), (3, 1, 4));
    }

    /// NVRTC compiles the kernels (it needs no GPU): the first check of any change to them.
    #[test]
    fn the_kernels_compile_for_hopper() {
        let tunings = [
            super::Tuning::default(),
            super::Tuning {
                warps: 2,
                attention_splits: 16,
                mma_ksplit: 8,
                mma_head_ksplit: 1,
                mma_wide: 2,
                mma_wide_from: 1,
                dependent_launch: false,
                persistent_pass: false,
            },
            super::Tuning {
                persistent_pass: true,
                ..super::Tuning::default()
            },
        ];
        for tuning in tunings {
            let ptx = super::compile("compute_90", tuning).unwrap();
            for name in [
                "matmul_qkv_bf16_r1",
                "matmul_silu_f32_r8",
                "mma_qkv_t1",
                "mma_silu_t4",
                "mma_plain_w1",
                "mma_residual_w2",
                "attention",
                "argmax_rows",
                "kv_keep",
                "kv_blocks",
                "embed_rows",
                "qkv_heads",
                "attention_wide",
                "norm_add",
                "gelu_mul",
                "scale_rows",
            ] {
                assert!(ptx.contains(name), "{name} is in the PTX");
            }
            // The host's twins of the kernels' argument structs have their sizes.
            for (kernel, bytes) in [
                (
                    "matmul_plain_f32_r1",
                    std::mem::size_of::<super::args::MatmulArgs>(),
                ),
                (
                    "attention",
                    std::mem::size_of::<super::args::AttentionArgs>(),
                ),
                ("qkv_heads", std::mem::size_of::<super::args::HeadsArgs>()),
            ] {
                let param = format!("{kernel}_param_0[{bytes}]");
                assert!(ptx.contains(&param), "{param} is in the PTX");
            }
            // Dependent launch: every kernel but the three launched outside a pass
            // (argmax_rows, kv_keep, kv_blocks) and the persistent pass waits for the one
            // before it (sm_90 and the tuning asking for it), and the projections ask L2
            // for their weights.
            let waits = ptx.matches("griddepcontrol.wait").count();
            // The persistent pass (only compiled when asked for) waits on its counters.
            let persistent = ptx.contains(".entry pass_persistent");
            assert_eq!(persistent, tuning.persistent_pass);
            if persistent {
                assert!(ptx.contains("ld.acquire.gpu"));
                assert!(ptx.contains("red.release.gpu"));
                assert!(ptx.contains("bar.sync 1, 128"));
            }
            if tuning.dependent_launch {
                let outside = 3 + usize::from(persistent);
                assert_eq!(waits, ptx.matches(".entry").count() - outside);
                assert!(ptx.contains("prefetch.global.L2"));
            } else {
                assert_eq!(waits, 0);
            }
            // The launch bounds follow the warps the host launches with.
            let bound = format!(".maxntid {}, 1, 1", tuning.warps * 32);
            assert!(ptx.contains(&bound), "{bound} is in the PTX");
            for warps in [tuning.mma_ksplit, tuning.mma_head_ksplit] {
                let bound = format!(".maxntid {}, 1, 1", warps * 32);
                assert!(ptx.contains(&bound), "{bound} is in the PTX");
            }
        }
    }
}
