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
//! [`HeadsArgs`]'s kernel adds the bias, norms each head, applies RoPE and writes the KV
//! cache. Gemma 3 adds a launch for each post-norm (the sublayer's output as it is, then
//! normed into the residual), one for its GELU gate and one to scale the embeddings;
//! its sliding layers read their own RoPE table and attention skips keys before the
//! window.

use std::sync::{Arc, Mutex};

use candle_core::cuda_backend::cudarc::driver::{
    CudaFunction, CudaModule, CudaSlice, CudaStream, DevicePtr, DeviceRepr, LaunchConfig,
    PushKernelArg,
};
use candle_core::cuda_backend::cudarc::nvrtc::{CompileOptions, compile_ptx_with_opts};
use candle_core::op::BackpropOp;
use candle_core::{CudaDevice, CudaStorage, DType, Storage, Tensor};

mod graphs;
mod kv;

use graphs::Graphs;
pub use kv::DeviceKv;
use kv::KvKeeper;

use super::forward::{
    BatchEntry, BatchPlan, Layer, ModelConfig, ModelError, RopeTable, WeightFormat,
};
use super::kernels::activation::Activation;
use super::kernels::norm::RopePairs;
use super::linear::{Linear, NormWeights};

/// The kernels' source.
pub const KERNELS: &str = include_str!("kernels.cu");

/// Why the device pass cannot be set up or run.
#[derive(Debug, thiserror::Error)]
pub enum CudaError {
    /// NVRTC refused the kernels (a toolkit or driver mismatch).
    #[error("cannot compile the device kernels with NVRTC: {0}")]
    Compile(String),
    /// A driver call failed.
    #[error("CUDA driver call failed: {0}")]
    Driver(String),
    /// The model's shape is outside what the kernels handle.
    #[error("the device kernels cannot run this model: {0}")]
    Shape(String),
    /// A candle operation on the weights failed.
    #[error("{0}")]
    Candle(#[from] candle_core::Error),
}

impl From<candle_core::cuda_backend::cudarc::driver::DriverError> for CudaError {
    fn from(e: candle_core::cuda_backend::cudarc::driver::DriverError) -> Self {
        CudaError::Driver(e.to_string())
    }
}

/// Launch shapes the kernels are compiled for: fixed for a process, so they change speed
/// (and, for `attention_splits`, the order attention's sums take), never row invariance.
/// `SUFFIXD_CUDA_WARPS`, `SUFFIXD_CUDA_ATTN_SPLITS`, `SUFFIXD_CUDA_MMA_KSPLIT`,
/// `SUFFIXD_CUDA_MMA_HEAD_KSPLIT`, `SUFFIXD_CUDA_MMA_WIDE` (`off`, or 2 or 4) and
/// `SUFFIXD_CUDA_MMA_WIDE_FROM` override the defaults, for tuning on a new card
/// (docs/gpu.md).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Tuning {
    /// Warps per block of a projection (each warp computes four outputs).
    pub warps: u32,
    /// Blocks that share one (row, head)'s keys in attention.
    pub attention_splits: u32,
    /// Warps of a tensor-core projection block, each taking every `mma_ksplit`-th chunk of
    /// 32 columns (their sums are added in warp order, so this too fixes an order).
    pub mma_ksplit: u32,
    /// The same for the head's tensor-core projection.
    pub mma_head_ksplit: u32,
    /// Output tiles of eight a tensor-core block computes in a pass of at least
    /// `mma_wide_from` rows, so that each activation is read and split into bf16 halves
    /// once for all of them (1: never). Speed only: an output's arithmetic is the same.
    pub mma_wide: u32,
    /// The row count from which the tensor-core projections take `mma_wide` tiles.
    pub mma_wide_from: u32,
}

impl Default for Tuning {
    fn default() -> Self {
        // The fastest of warps {2, 4, 8} x splits {4, 8, 16}, and of the tensor cores'
        // splits {4, 8} x {1, 4} for the head, on an H100 (docs/gpu.md).
        Tuning {
            warps: 4,
            attention_splits: 16,
            mma_ksplit: 8,
            mma_head_ksplit: 4,
            mma_wide: 4,
            mma_wide_from: 17,
        }
    }
}

impl Tuning {
    /// The defaults, with the environment's overrides where they are valid (a power of two
    /// from 1 to 16 warps, 1 to 64 splits); an invalid one is named in a warning.
    pub fn from_env() -> Self {
        let mut t = Tuning::default();
        let read = env_u32;
        let warps = |n: u32| n.is_power_of_two() && n <= 16;
        if let Some(w) = read("SUFFIXD_CUDA_WARPS", &warps) {
            t.warps = w;
        }
        if let Some(s) = read("SUFFIXD_CUDA_ATTN_SPLITS", &|n| (1..=64).contains(&n)) {
            t.attention_splits = s;
        }
        if let Some(w) = read("SUFFIXD_CUDA_MMA_KSPLIT", &warps) {
            t.mma_ksplit = w;
        }
        if let Some(w) = read("SUFFIXD_CUDA_MMA_HEAD_KSPLIT", &warps) {
            t.mma_head_ksplit = w;
        }
        if std::env::var("SUFFIXD_CUDA_MMA_WIDE").is_ok_and(|v| v == "off") {
            t.mma_wide = 1;
        } else if let Some(n) = read("SUFFIXD_CUDA_MMA_WIDE", &|n| [1, 2, 4].contains(&n)) {
            t.mma_wide = n;
        }
        if let Some(n) = read("SUFFIXD_CUDA_MMA_WIDE_FROM", &|n| n >= 1) {
            t.mma_wide_from = n;
        }
        // A tensor-core block's partial sums must fit in 48 KiB of static shared memory.
        let largest = t.mma_ksplit.max(t.mma_head_ksplit);
        if mma_shared_bytes(largest, t.mma_wide) > 48 * 1024 {
            tracing::warn!(
                "SUFFIXD_CUDA_MMA_KSPLIT / _HEAD_KSPLIT {largest} with SUFFIXD_CUDA_MMA_WIDE {} need more shared memory than a block has: the defaults are used",
                t.mma_wide
            );
            let d = Tuning::default();
            (t.mma_ksplit, t.mma_head_ksplit, t.mma_wide) =
                (d.mma_ksplit, d.mma_head_ksplit, d.mma_wide);
        }
        t
    }
}

/// The number in environment variable `name` when it is set and `ok`; a value that is
/// not is named in a warning, and None leaves the default.
pub(super) fn env_u32(name: &str, ok: &dyn Fn(u32) -> bool) -> Option<u32> {
    let v = std::env::var(name).ok()?;
    match v.parse::<u32>() {
        Ok(n) if ok(n) => Some(n),
        _ => {
            tracing::warn!("{name}={v} is out of range: the default is used");
            None
        }
    }
}

/// Bytes of kernels.cu's `parts` in the largest tensor-core block: `ksplit` warps of
/// four row tiles of one output tile, or two row tiles of `wide` output tiles.
fn mma_shared_bytes(ksplit: u32, wide: u32) -> u32 {
    let floats = (4 * 6).max(2 * (4 * wide + 2));
    ksplit * floats * 32 * 4
}

/// Compile the kernels for the GPU's architecture, to PTX (no GPU needed).
pub fn compile(arch: &'static str, tuning: Tuning) -> Result<String, CudaError> {
    let opts = CompileOptions {
        // No contraction of a*b+c into fma behind our back: the kernels say where
        // they fuse, so the same source gives the same arithmetic in every unrolled copy.
        fmad: Some(false),
        ftz: Some(false),
        prec_div: Some(true),
        prec_sqrt: Some(true),
        arch: Some(arch),
        options: vec![
            "--std=c++17".into(),
            format!("-DWARPS_PER_BLOCK={}", tuning.warps),
            format!("-DATTN_SPLITS={}", tuning.attention_splits),
            format!("-DMMA_KSPLIT={}", tuning.mma_ksplit),
            format!("-DMMA_HEAD_KSPLIT={}", tuning.mma_head_ksplit),
            format!("-DMMA_WIDE_NT={}", tuning.mma_wide.max(1)),
        ],
        ..Default::default()
    };
    let ptx =
        compile_ptx_with_opts(KERNELS, opts).map_err(|e| CudaError::Compile(e.to_string()))?;
    Ok(ptx.to_src())
}

/// The NVRTC target for a GPU of compute capability `(major, minor)`: its own where NVRTC
/// knows it, else the newest below it (the driver JIT-compiles PTX forward).
fn arch_of((major, minor): (i32, i32)) -> &'static str {
    match major * 10 + minor {
        cc if cc >= 120 => "compute_120",
        cc if cc >= 100 => "compute_100",
        cc if cc >= 90 => "compute_90",
        89 => "compute_89",
        cc if cc >= 86 => "compute_86",
        _ => "compute_80",
    }
}

/// `#[repr(C)]` twin of `struct MatmulArgs` in kernels.cu.
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct MatmulArgs {
    x: u64,
    row_map: u64,
    norm_w: u64,
    w: u64,
    out: u64,
    resid: u64,
    cos_tab: u64,
    sin_tab: u64,
    meta: u64,
    q_out: u64,
    k: i32,
    groups: i32,
    rows: i32,
    out_stride: i32,
    eps: f32,
    q_width: i32,
    kv_width: i32,
    head_dim: i32,
    layer: i32,
    meta_rows: i32,
}
// SAFETY: plain old data with the C layout kernels.cu declares.
unsafe impl DeviceRepr for MatmulArgs {}

/// `#[repr(C)]` twin of `struct AttentionArgs` in kernels.cu.
#[repr(C)]
#[derive(Clone, Copy)]
struct AttentionArgs {
    q: u64,
    out: u64,
    meta: u64,
    ancestors: u64,
    partials: u64,
    tickets: u64,
    heads: i32,
    kv_heads: i32,
    head_dim: i32,
    layer: i32,
    scale: f32,
    meta_rows: i32,
    window: i32,
}
// SAFETY: as above.
unsafe impl DeviceRepr for AttentionArgs {}

/// `#[repr(C)]` twin of `struct HeadsArgs` in kernels.cu.
#[repr(C)]
#[derive(Clone, Copy)]
struct HeadsArgs {
    raw: u64,
    bias: u64,
    q_norm: u64,
    k_norm: u64,
    cos_tab: u64,
    sin_tab: u64,
    meta: u64,
    q_out: u64,
    q_width: i32,
    kv_width: i32,
    head_dim: i32,
    layer: i32,
    meta_rows: i32,
    eps: f32,
    halves: i32,
}
// SAFETY: as above.
unsafe impl DeviceRepr for HeadsArgs {}

/// The widest head kernels.cu's `qkv_heads` takes (HEADS_MAX_PAIRS pairs per lane).
const HEADS_MAX_HEAD_DIM: usize = 256;

/// The per-row fields of a pass, in the order of kernels.cu's ROW_* constants.
const ROW_FIELDS: usize = 8;
/// Threads of an attention block (kernels.cu's ATTN_THREADS).
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

/// A layer's tensors, as the loader has them on the device (f32, `n × k`).
struct LayerTensors {
    attn_norm: Tensor,
    /// q, k and v stacked.
    qkv: Tensor,
    /// Their biases, side by side (Qwen 2).
    qkv_bias: Option<Vec<f32>>,
    /// The norms of each head of q and of k (Qwen 3, Gemma 3).
    q_norm: Option<Tensor>,
    k_norm: Option<Tensor>,
    wo: Tensor,
    post_attn_norm: Option<Tensor>,
    ffn_norm: Tensor,
    /// Gate and up stacked.
    gate_up: Tensor,
    down: Tensor,
    post_ffn_norm: Option<Tensor>,
    window: Option<usize>,
    rope: usize,
}

/// The row tiles the projections come in: a pass uses the smallest that holds all its
/// rows, else the largest. A row's arithmetic is the same in each (kernels.cu), so the
/// choice changes speed, not bits; a one-row step does an eighth of an 8-row tile's work.
const TILES: [usize; 3] = [1, 4, 8];

/// One projection kernel per weight type (f32, bf16) and row tile ([`TILES`]).
type Projection = [[CudaFunction; TILES.len()]; 2];

/// The tensor-core projections' tiles of 16 rows a block carries: a pass uses the fewest
/// that hold all its rows, else the most, in blocks of one output tile; then the same
/// with [`Tuning::mma_wide`] output tiles (kernels.cu's matmul_mma_block).
const MMA_TILES: [(usize, bool); 5] = [(1, false), (2, false), (4, false), (1, true), (2, true)];

/// One tensor-core projection kernel per shape ([`MMA_TILES`]), bf16 weights only.
type MmaProjection = [CudaFunction; MMA_TILES.len()];

/// The tensor-core kernel for a pass of `rows` rows: its index in [`MMA_TILES`], the row
/// tiles of 16 a block carries and the output tiles of 8. Many rows take blocks of
/// several output tiles, which read each activation once for all of them; either way a
/// pass uses the fewest row tiles that hold its rows, else the most of its kind, and its
/// row groups spread along the grid's y.
fn mma_shape(rows: usize, tuning: &Tuning) -> (usize, usize, u32) {
    let wide = tuning.mma_wide > 1 && rows >= tuning.mma_wide_from as usize;
    let mut of_kind = MMA_TILES
        .iter()
        .enumerate()
        .filter(|&(_, &(_, w))| w == wide);
    let (shape, &(tiles, _)) = of_kind
        .clone()
        .find(|&(_, &(t, _))| 16 * t >= rows)
        .or_else(|| of_kind.next_back())
        .expect("MMA_TILES has shapes of both kinds");
    (shape, tiles, if wide { tuning.mma_wide } else { 1 })
}

/// What a projection does with its products (kernels.cu's MODE_*).
#[derive(Clone, Copy)]
enum Mode {
    /// Written as they are (the head).
    Plain,
    /// Added to the residual stream (the output and down projections).
    Residual,
    /// silu(gate) · up (the feed-forward's gate|up).
    Silu,
    /// RoPE, then queries out and keys and values into the cache.
    Qkv,
}

/// The launchable kernels.
struct Kernels {
    plain: Projection,
    residual: Projection,
    silu: Projection,
    qkv: Projection,
    /// The tensor-core projections, by mode (see [`Mode`]), for bf16 weights, unless
    /// `SUFFIXD_CUDA_MMA=off` or they cannot run (see [`CudaForward::new`]).
    mma: Option<[MmaProjection; 4]>,
    embed: CudaFunction,
    attention: CudaFunction,
    /// Attention for heads of 256 values.
    attention_wide: CudaFunction,
    /// Qwen's and Gemma's bias, head norms and RoPE after a plain q|k|v projection.
    heads: CudaFunction,
    /// Gemma's embedding scale, post-norms and GELU gate.
    scale_rows: CudaFunction,
    norm_add: CudaFunction,
    gelu_mul: CudaFunction,
    argmax: CudaFunction,
    tuning: Tuning,
    _module: Arc<CudaModule>,
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
    /// Attention's tickets, one per (row, head); the kernels leave them at zero.
    tickets: Option<CudaSlice<i32>>,
    fields: Option<CudaSlice<i32>>,
    /// The greedy argmax's ids (read by no graph: its moves bump no generation).
    chosen: Option<CudaSlice<i32>>,
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

/// The device pass for a model loaded on `device`, when it can run there: a CUDA GPU,
/// f32 or bf16 weights, a shape the kernels take, and `SUFFIXD_DEVICE_KERNELS` not
/// `off` (which keeps candle's operations, with attention on the host: the path before
/// these kernels, kept to compare against). None otherwise.
#[allow(clippy::too_many_arguments)]
pub(super) fn build(
    cfg: &ModelConfig,
    embed: &Tensor,
    layers: &[Layer],
    norm: &NormWeights,
    head: &Linear,
    ropes: &[RopeTable],
    device: &candle_core::Device,
    format: WeightFormat,
) -> Result<Option<CudaForward>, ModelError> {
    let candle_core::Device::Cuda(gpu) = device else {
        return Ok(None);
    };
    let bf16 = match format {
        WeightFormat::F32 => false,
        WeightFormat::Bf16 => true,
        WeightFormat::Native | WeightFormat::Q8_0 => return Ok(None),
    };
    if std::env::var("SUFFIXD_DEVICE_KERNELS").is_ok_and(|v| v == "off") {
        tracing::warn!("SUFFIXD_DEVICE_KERNELS=off: candle's operations, attention on the host");
        return Ok(None);
    }
    let tensors = layers
        .iter()
        .map(|l| {
            Some(LayerTensors {
                attn_norm: l.attn_norm.device.clone(),
                qkv: l.qkv.device_matrix()?,
                qkv_bias: l.qkv_bias.clone(),
                q_norm: l.q_norm.as_ref().map(|n| n.device.clone()),
                k_norm: l.k_norm.as_ref().map(|n| n.device.clone()),
                wo: l.wo.device_matrix()?,
                post_attn_norm: l.post_attn_norm.as_ref().map(|n| n.device.clone()),
                ffn_norm: l.ffn_norm.device.clone(),
                gate_up: l.gate_up.device_matrix()?,
                down: l.down.device_matrix()?,
                post_ffn_norm: l.post_ffn_norm.as_ref().map(|n| n.device.clone()),
                window: l.window,
                rope: l.rope,
            })
        })
        .collect::<Option<Vec<_>>>();
    let (Some(tensors), Some(head)) = (tensors, head.device_matrix()) else {
        return Ok(None);
    };
    match CudaForward::new(gpu, cfg, embed, &tensors, &norm.device, &head, ropes, bf16) {
        Ok(forward) => Ok(Some(forward)),
        Err(CudaError::Shape(why)) => {
            tracing::warn!("{why}: candle's operations run this model, with attention on the host");
            Ok(None)
        }
        Err(e) => Err(e.into()),
    }
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

/// `t`'s elements, contiguous, as a fresh device buffer of `T`.
fn buffer_of<T: candle_core::cuda_backend::CudaDType + DeviceRepr>(
    stream: &Arc<CudaStream>,
    t: &Tensor,
) -> Result<CudaSlice<T>, CudaError> {
    let t = t.contiguous()?;
    let (storage, layout) = t.storage_and_layout();
    let Storage::Cuda(c) = &*storage else {
        return Err(CudaError::Shape("a weight is not on the GPU".into()));
    };
    let s = c.as_cuda_slice::<T>()?;
    let start = layout.start_offset();
    let view = s.slice(start..start + t.elem_count());
    Ok(stream.clone_dtod(&view)?)
}

impl CudaForward {
    /// Upload the model to the kernels' layout: f32 weights, or bf16 when `bf16`.
    #[allow(clippy::too_many_arguments)]
    fn new(
        device: &CudaDevice,
        cfg: &ModelConfig,
        embed: &Tensor,
        layers: &[LayerTensors],
        norm: &Tensor,
        head: &Tensor,
        ropes: &[RopeTable],
        bf16: bool,
    ) -> Result<Self, CudaError> {
        let (w, hd) = (cfg.width, cfg.head_dim);
        let qw = cfg.heads * hd;
        let kvw = cfg.kv_heads * hd;
        let ffn = layers
            .first()
            .map(|l| l.gate_up.dim(0))
            .transpose()?
            .unwrap_or(0)
            / 2;
        let need = |ok: bool, what: &str| {
            if ok {
                Ok(())
            } else {
                Err(CudaError::Shape(what.into()))
            }
        };
        need(
            w.is_multiple_of(8) && qw.is_multiple_of(8) && ffn.is_multiple_of(8),
            "widths must be multiples of 8",
        )?;
        need(
            hd.is_multiple_of(8) && (ATTENTION_THREADS as usize).is_multiple_of(hd)
                || hd == 2 * ATTENTION_THREADS as usize,
            "head_dim must be a multiple of 8 that divides 128, or 256",
        )?;
        need(
            matches!(cfg.activation, Activation::Silu | Activation::GeluTanh),
            "the feed-forward's gate must be SiLU or GELU (tanh)",
        )?;
        need(
            layers.iter().all(|l| l.rope < ropes.len()),
            "a layer names a RoPE table the model does not have",
        )?;
        let halves = cfg.rope_pairs == RopePairs::Halves;
        let with_heads = halves
            || layers
                .iter()
                .any(|l| l.qkv_bias.is_some() || l.q_norm.is_some() || l.k_norm.is_some());
        need(
            !with_heads || (hd <= HEADS_MAX_HEAD_DIM && hd.is_multiple_of(2)),
            "q|k|v biases and head norms need head_dim even and at most 256",
        )?;
        need(
            cfg.heads.is_multiple_of(cfg.kv_heads),
            "heads must be a multiple of kv_heads",
        )?;
        need(
            cfg.vocab.is_multiple_of(4),
            "the vocabulary must be a multiple of 4",
        )?;
        let stream = device.cuda_stream();
        let tuning = Tuning::from_env();
        let capability = stream.context().compute_capability()?;
        let ptx = compile(arch_of(capability), tuning)?;
        let module = stream
            .context()
            .load_module(candle_core::cuda_backend::cudarc::nvrtc::Ptx::from_src(ptx))?;
        let f = |name: &str| module.load_function(name);
        let pair = |name: &str| -> Result<Projection, CudaError> {
            let tiles = |dtype: &str| -> Result<[CudaFunction; TILES.len()], CudaError> {
                let [a, b, c] = TILES.map(|t| f(&format!("{name}_{dtype}_r{t}")));
                Ok([a?, b?, c?])
            };
            Ok([tiles("f32")?, tiles("bf16")?])
        };
        // bf16 projections run on the tensor cores (sm_80 and later, every projection's k
        // a multiple of 32): exact, and a draft of up to 16 rows costs what one row does
        // (docs/gpu.md). SUFFIXD_CUDA_MMA=off puts them on the CUDA cores.
        let major = capability.0;
        let mma_on = std::env::var("SUFFIXD_CUDA_MMA").map_or(true, |v| v != "off");
        // Its tiles are 8 outputs wide: the head's too (the other widths are multiples of
        // head_dim or of 32).
        let fits = [w, qw, ffn].iter().all(|k| k % 32 == 0) && cfg.vocab.is_multiple_of(8);
        let mma = if bf16 && major >= 8 && mma_on && fits {
            let tiles = |name: &str| -> Result<MmaProjection, CudaError> {
                let [a, b, c, d, e] = MMA_TILES
                    .map(|(t, wide)| f(&format!("{name}_{}{t}", if wide { 'w' } else { 't' })));
                Ok([a?, b?, c?, d?, e?])
            };
            Some([
                tiles("mma_plain")?,
                tiles("mma_residual")?,
                tiles("mma_silu")?,
                tiles("mma_qkv")?,
            ])
        } else {
            None
        };
        if bf16 && mma_on && mma.is_none() {
            tracing::warn!(
                "no tensor-core path for this GPU or this model's widths: the CUDA cores run the projections"
            );
        }
        let kernels = Kernels {
            mma,
            plain: pair("matmul_plain")?,
            residual: pair("matmul_residual")?,
            silu: pair("matmul_silu")?,
            qkv: pair("matmul_qkv")?,
            embed: f("embed_rows")?,
            attention: f("attention")?,
            attention_wide: f("attention_wide")?,
            heads: f("qkv_heads")?,
            scale_rows: f("scale_rows")?,
            norm_add: f("norm_add")?,
            gelu_mul: f("gelu_mul")?,
            argmax: f("argmax_rows")?,
            tuning,
            _module: module.clone(),
        };
        let keeper = Arc::new(KvKeeper {
            stream: stream.clone(),
            keep: f("kv_keep")?,
            layers: cfg.layers,
            row: kvw,
            context: cfg.context,
        });
        let matrix = |t: &Tensor| -> Result<Matrix, CudaError> {
            Ok(if bf16 {
                Matrix::Bf16(buffer_of(&stream, &t.to_dtype(DType::BF16)?)?)
            } else {
                Matrix::F32(buffer_of(&stream, &t.to_dtype(DType::F32)?)?)
            })
        };
        let f32s = |t: &Tensor| buffer_of::<f32>(&stream, &t.to_dtype(DType::F32)?);
        let layers = layers
            .iter()
            .map(|l| {
                let heads =
                    if halves || l.qkv_bias.is_some() || l.q_norm.is_some() || l.k_norm.is_some() {
                        Some(HeadParts {
                            bias: l
                                .qkv_bias
                                .as_ref()
                                .map(|b| stream.clone_htod(b.as_slice()))
                                .transpose()?,
                            q_norm: l.q_norm.as_ref().map(&f32s).transpose()?,
                            k_norm: l.k_norm.as_ref().map(&f32s).transpose()?,
                        })
                    } else {
                        None
                    };
                Ok(DeviceLayer {
                    attn_norm: f32s(&l.attn_norm)?,
                    qkv: matrix(&l.qkv)?,
                    heads,
                    wo: matrix(&l.wo)?,
                    post_attn_norm: l.post_attn_norm.as_ref().map(&f32s).transpose()?,
                    ffn_norm: f32s(&l.ffn_norm)?,
                    gate_up: matrix(&l.gate_up)?,
                    down: matrix(&l.down)?,
                    post_ffn_norm: l.post_ffn_norm.as_ref().map(&f32s).transpose()?,
                    window: l.window.map_or(0, |w| w.min(i32::MAX as usize) as i32),
                    rope: l.rope,
                })
            })
            .collect::<Result<Vec<_>, CudaError>>()?;
        let (embed, norm, head) = (f32s(embed)?, f32s(norm)?, matrix(head)?);
        let ropes = ropes
            .iter()
            .map(|t| Ok((f32s(&t.cos)?, f32s(&t.sin)?)))
            .collect::<Result<Vec<_>, CudaError>>()?;
        // The copies ran on this thread's stream; the passes may run on another's.
        stream.synchronize()?;
        Ok(CudaForward {
            cfg: cfg.clone(),
            device: device.clone(),
            embed,
            norm,
            head,
            ropes,
            layers,
            ffn,
            kernels,
            keeper,
            stream,
            scratch: Mutex::default(),
        })
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

    /// Launch a projection of `m`: `args.groups` counts groups of four outputs (two in
    /// [`Mode::Silu`]), as the CUDA-core kernels take them; the tensor-core kernels take
    /// tiles of eight (four gate|up pairs), half as many.
    fn launch_matmul(&self, mode: Mode, m: &Matrix, mut args: MatmulArgs) -> Result<(), CudaError> {
        let (w, which) = self.matrix_ptr(m);
        args.w = w;
        let rows = args.rows as usize;
        let k = &self.kernels;
        let (function, cfg) = match (&k.mma, m) {
            (Some(mma), Matrix::Bf16(_)) => {
                // One block of mma_ksplit warps (the head: mma_head_ksplit) per tile of
                // eight outputs.
                args.groups /= 2;
                let warps = match mode {
                    Mode::Plain => k.tuning.mma_head_ksplit,
                    _ => k.tuning.mma_ksplit,
                };
                let (shape, tiles, nt) = mma_shape(rows, &k.tuning);
                let cfg = LaunchConfig {
                    grid_dim: (
                        (args.groups as u32).div_ceil(nt),
                        rows.div_ceil(16 * tiles).max(1) as u32,
                        1,
                    ),
                    block_dim: (warps * 32, 1, 1),
                    shared_mem_bytes: 0,
                };
                (&mma[mode as usize][shape], cfg)
            }
            _ => {
                let tile = TILES
                    .iter()
                    .position(|&t| t >= rows)
                    .unwrap_or(TILES.len() - 1);
                let projection = match mode {
                    Mode::Plain => &k.plain,
                    Mode::Residual => &k.residual,
                    Mode::Silu => &k.silu,
                    Mode::Qkv => &k.qkv,
                };
                // Each warp computes four outputs (two in Mode::Silu).
                let warps = k.tuning.warps;
                let cfg = LaunchConfig {
                    grid_dim: ((args.groups as u32).div_ceil(warps), 1, 1),
                    block_dim: (warps * 32, 1, 1),
                    shared_mem_bytes: 0,
                };
                (&projection[which][tile], cfg)
            }
        };
        let mut b = self.stream.launch_builder(function);
        b.arg(&args);
        // SAFETY: args matches MatmulArgs in kernels.cu; every pointer addresses a live
        // buffer sized for `rows` rows of its width (checked by the caller's layout).
        unsafe { b.launch(cfg) }?;
        Ok(())
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
        let rows = plan.total;
        let wanted = plan.wanted.len();
        let mut scratch = self.scratch.lock().unwrap_or_else(|e| e.into_inner());
        let scratch = &mut *scratch;

        // The rows' fields: ROW_FIELDS arrays of `rows`, then the ids, the head's row
        // map and the in-pass key slots.
        let host = &mut scratch.host_fields;
        host.clear();
        host.resize(ROW_FIELDS * rows, 0);
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
                let field = |f: usize| f * rows + r;
                host[field(0)] = plan.positions[r] as i32;
                host[field(1)] = (len + i) as i32;
                host[field(2)] = kv.cap as i32;
                host[field(3)] = base as u32 as i32;
                host[field(4)] = (base >> 32) as u32 as i32;
                host[field(5)] = len as i32;
                host[field(6)] = ancestors.len() as i32;
                host[field(7)] = set.len() as i32;
                ancestors.extend(set.iter().map(|&j| (len + j) as i32));
            }
        }
        let ids_at = host.len();
        host.extend(plan.ids.iter().map(|&t| t as i32));
        let map_at = host.len();
        host.extend(plan.wanted.iter().map(|&r| r as i32));
        let anc_at = host.len();
        host.extend_from_slice(&ancestors);
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
        let generation = &mut scratch.generation;
        let mut buffer =
            |slot: &mut Option<CudaSlice<f32>>, len: usize| -> Result<u64, CudaError> {
                Ok(self.ptr(ensure(&self.stream, slot, len, generation)?))
            };
        let pass = Pass {
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
            ids: at(ids_at),
            head_rows: at(map_at),
            ancestors: at(anc_at),
        };
        let key = (rows, wanted, scratch.generation);
        scratch
            .graphs
            .run(&self.stream, key, || self.launch_pass(&pass))?;

        // The logits, out of the scratch buffer into a tensor of their own.
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

    /// Every launch of one pass, in order, on the pass's buffers: all a pass's launches
    /// read from device memory what changes between passes of the same shape, so a CUDA
    /// graph of them replays any such pass.
    fn launch_pass(&self, p: &Pass) -> Result<(), CudaError> {
        let cfg = &self.cfg;
        let (width, hd) = (cfg.width, cfg.head_dim);
        let (qw, kvw) = (cfg.heads * hd, cfg.kv_heads * hd);
        let rows = p.rows;
        let mut b = self.stream.launch_builder(&self.kernels.embed);
        let (embed, w32) = (self.ptr(&self.embed), width as i32);
        b.arg(&embed).arg(&p.ids).arg(&p.x).arg(&w32);
        // SAFETY: embed_rows(table, ids, x, width); ids are below the vocabulary (the
        // engine checks prompts and drafts), x holds rows × width.
        unsafe {
            b.launch(LaunchConfig {
                grid_dim: (rows as u32, 1, 1),
                block_dim: (128, 1, 1),
                shared_mem_bytes: 0,
            })
        }?;
        if let Some(scale) = cfg.embed_scale {
            let n = (rows * width) as i32;
            let mut b = self.stream.launch_builder(&self.kernels.scale_rows);
            b.arg(&p.x).arg(&n).arg(&scale);
            // SAFETY: scale_rows(x, n, s): x holds rows × width floats.
            unsafe { b.launch(LaunchConfig::for_num_elems(n as u32)) }?;
        }

        let base = MatmulArgs {
            rows: rows as i32,
            eps: cfg.rms_eps,
            q_width: qw as i32,
            kv_width: kvw as i32,
            head_dim: hd as i32,
            meta: p.fields,
            meta_rows: rows as i32,
            ..Default::default()
        };
        let attention = AttentionArgs {
            q: p.q,
            out: p.attended,
            meta: p.fields,
            ancestors: p.ancestors,
            partials: p.partials,
            tickets: p.tickets,
            heads: cfg.heads as i32,
            kv_heads: cfg.kv_heads as i32,
            head_dim: hd as i32,
            layer: 0,
            scale: cfg.attn_scale,
            meta_rows: rows as i32,
            window: 0,
        };
        for (l, layer) in self.layers.iter().enumerate() {
            let (cos, sin) = &self.ropes[layer.rope];
            let base = MatmulArgs {
                cos_tab: self.ptr(cos),
                sin_tab: self.ptr(sin),
                ..base
            };
            match &layer.heads {
                None => self.launch_matmul(
                    Mode::Qkv,
                    &layer.qkv,
                    MatmulArgs {
                        x: p.x,
                        norm_w: self.ptr(&layer.attn_norm),
                        q_out: p.q,
                        k: width as i32,
                        groups: ((qw + 2 * kvw) / 4) as i32,
                        layer: l as i32,
                        ..base
                    },
                )?,
                Some(parts) => self.launch_heads(p, l, layer, parts, &base)?,
            }
            let args = AttentionArgs {
                layer: l as i32,
                window: layer.window,
                ..attention
            };
            let kernel = if hd > ATTENTION_THREADS as usize {
                &self.kernels.attention_wide
            } else {
                &self.kernels.attention
            };
            let mut b = self.stream.launch_builder(kernel);
            b.arg(&args);
            // SAFETY: args matches AttentionArgs; every row's keys were written by this
            // pass or committed before it, within its sequence's capacity; partials and
            // tickets hold rows × heads × splits parts and rows × heads tickets.
            unsafe {
                b.launch(LaunchConfig {
                    grid_dim: (
                        rows as u32,
                        cfg.heads as u32,
                        self.kernels.tuning.attention_splits,
                    ),
                    block_dim: (ATTENTION_THREADS, 1, 1),
                    shared_mem_bytes: 0,
                })
            }?;
            self.launch_into_residual(
                p,
                &layer.wo,
                layer.post_attn_norm.as_ref(),
                MatmulArgs {
                    x: p.attended,
                    k: qw as i32,
                    ..base
                },
            )?;
            self.launch_feed_forward(p, layer, &base)?;
            self.launch_into_residual(
                p,
                &layer.down,
                layer.post_ffn_norm.as_ref(),
                MatmulArgs {
                    x: p.hidden,
                    k: self.ffn as i32,
                    ..base
                },
            )?;
        }
        if p.wanted > 0 {
            self.launch_matmul(
                Mode::Plain,
                &self.head,
                MatmulArgs {
                    x: p.x,
                    row_map: p.head_rows,
                    norm_w: self.ptr(&self.norm),
                    out: p.logits,
                    k: width as i32,
                    groups: (cfg.vocab / 4) as i32,
                    rows: p.wanted as i32,
                    out_stride: cfg.vocab as i32,
                    ..base
                },
            )?;
        }
        Ok(())
    }
}

impl CudaForward {
    /// A sublayer's output projection `m` (input and `k` in `args`) added to the residual
    /// stream `p.x`: fused, or with a post-norm, written as it is to `p.post` and then
    /// normed into the residual (Gemma's sandwich).
    fn launch_into_residual(
        &self,
        p: &Pass,
        m: &Matrix,
        post_norm: Option<&CudaSlice<f32>>,
        args: MatmulArgs,
    ) -> Result<(), CudaError> {
        let width = self.cfg.width;
        let args = MatmulArgs {
            groups: (width / 4) as i32,
            out_stride: width as i32,
            ..args
        };
        let Some(norm) = post_norm else {
            return self.launch_matmul(
                Mode::Residual,
                m,
                MatmulArgs {
                    out: p.x,
                    resid: p.x,
                    ..args
                },
            );
        };
        self.launch_matmul(
            Mode::Plain,
            m,
            MatmulArgs {
                out: p.post,
                ..args
            },
        )?;
        let (w, width, eps) = (self.ptr(norm), width as i32, self.cfg.rms_eps);
        let mut b = self.stream.launch_builder(&self.kernels.norm_add);
        b.arg(&p.x).arg(&p.post).arg(&w).arg(&width).arg(&eps);
        // SAFETY: norm_add(x, y, w, width, eps): x and post hold rows × width floats,
        // the norm width weights.
        unsafe {
            b.launch(LaunchConfig {
                grid_dim: (p.rows as u32, 1, 1),
                block_dim: (NORM_ADD_THREADS, 1, 1),
                shared_mem_bytes: 0,
            })
        }?;
        Ok(())
    }

    /// The feed-forward's gate|up into `p.hidden`: SiLU fused into the projection, or
    /// GELU (Gemma) over the products written as they are to `p.gate_up`.
    fn launch_feed_forward(
        &self,
        p: &Pass,
        layer: &DeviceLayer,
        base: &MatmulArgs,
    ) -> Result<(), CudaError> {
        let (width, ffn) = (self.cfg.width, self.ffn);
        let args = MatmulArgs {
            x: p.x,
            norm_w: self.ptr(&layer.ffn_norm),
            k: width as i32,
            ..*base
        };
        if self.cfg.activation == Activation::Silu {
            return self.launch_matmul(
                Mode::Silu,
                &layer.gate_up,
                MatmulArgs {
                    out: p.hidden,
                    groups: (ffn / 2) as i32,
                    out_stride: ffn as i32,
                    kv_width: ffn as i32,
                    ..args
                },
            );
        }
        self.launch_matmul(
            Mode::Plain,
            &layer.gate_up,
            MatmulArgs {
                out: p.gate_up,
                groups: (2 * ffn / 4) as i32,
                out_stride: (2 * ffn) as i32,
                ..args
            },
        )?;
        let (rows, ffn) = (p.rows as i32, ffn as i32);
        let mut b = self.stream.launch_builder(&self.kernels.gelu_mul);
        b.arg(&p.gate_up).arg(&p.hidden).arg(&rows).arg(&ffn);
        // SAFETY: gelu_mul(gate_up, out, rows, ffn): gate_up holds rows × 2·ffn floats,
        // hidden rows × ffn.
        unsafe { b.launch(LaunchConfig::for_num_elems((p.rows * self.ffn) as u32)) }?;
        Ok(())
    }

    /// Layer `l`'s q|k|v for a layer with [`HeadParts`]: the products as they are into
    /// `p.raw`, then one warp per (row, head) adds the bias, norms the head and applies
    /// RoPE, writing queries to `p.q` and keys and values to the cache.
    fn launch_heads(
        &self,
        p: &Pass,
        l: usize,
        layer: &DeviceLayer,
        parts: &HeadParts,
        base: &MatmulArgs,
    ) -> Result<(), CudaError> {
        let cfg = &self.cfg;
        let hd = cfg.head_dim;
        let (qw, kvw) = (cfg.heads * hd, cfg.kv_heads * hd);
        self.launch_matmul(
            Mode::Plain,
            &layer.qkv,
            MatmulArgs {
                x: p.x,
                norm_w: self.ptr(&layer.attn_norm),
                out: p.raw,
                k: cfg.width as i32,
                groups: ((qw + 2 * kvw) / 4) as i32,
                out_stride: (qw + 2 * kvw) as i32,
                ..*base
            },
        )?;
        let optional = |s: &Option<CudaSlice<f32>>| s.as_ref().map_or(0, |s| self.ptr(s));
        let args = HeadsArgs {
            raw: p.raw,
            bias: optional(&parts.bias),
            q_norm: optional(&parts.q_norm),
            k_norm: optional(&parts.k_norm),
            cos_tab: base.cos_tab,
            sin_tab: base.sin_tab,
            meta: p.fields,
            q_out: p.q,
            q_width: qw as i32,
            kv_width: kvw as i32,
            head_dim: hd as i32,
            layer: l as i32,
            meta_rows: p.rows as i32,
            eps: cfg.rms_eps,
            halves: i32::from(cfg.rope_pairs == RopePairs::Halves),
        };
        let mut b = self.stream.launch_builder(&self.kernels.heads);
        b.arg(&args);
        // SAFETY: args matches HeadsArgs; raw holds rows × (q_width + 2 kv_width)
        // products, the bias that many floats and each norm head_dim; every row's KV slot
        // lies within its sequence's capacity (reserved by the pass).
        unsafe {
            b.launch(LaunchConfig {
                grid_dim: (p.rows as u32, (cfg.heads + 2 * cfg.kv_heads) as u32, 1),
                block_dim: (32, 1, 1),
                shared_mem_bytes: 0,
            })
        }?;
        Ok(())
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

/// The device addresses one pass reads and writes.
struct Pass {
    rows: usize,
    wanted: usize,
    x: u64,
    q: u64,
    /// The q|k|v products of layers with [`HeadParts`] (0 when no layer has any).
    raw: u64,
    /// A sublayer's output before its post-norm (0 when no layer has one).
    post: u64,
    /// The gate|up products before a GELU gate (0 with SiLU).
    gate_up: u64,
    attended: u64,
    hidden: u64,
    logits: u64,
    /// Attention's per-split parts and tickets.
    partials: u64,
    tickets: u64,
    /// The rows' fields (kernels.cu's ROW_*).
    fields: u64,
    ids: u64,
    /// The rows the head reads.
    head_rows: u64,
    ancestors: u64,
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
            assert_eq!(super::mma_shape(rows, &default), wide_shape, "{rows} rows");
            assert_eq!(
                super::mma_shape(rows, &narrow),
                narrow_shape,
                "{rows} rows, narrow"
            );
        }
        let from_one = super::Tuning {
            mma_wide_from: 1,
            ..default
        };
        assert_eq!(super::mma_shape(1, &from_one), (3, 1, 4));
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
                    std::mem::size_of::<super::MatmulArgs>(),
                ),
                ("attention", std::mem::size_of::<super::AttentionArgs>()),
                ("qkv_heads", std::mem::size_of::<super::HeadsArgs>()),
            ] {
                let param = format!("{kernel}_param_0[{bytes}]");
                assert!(ptx.contains(&param), "{param} is in the PTX");
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
