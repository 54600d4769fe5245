//! The kernels' launch shapes ([`Tuning`], with the environment's overrides) and their
//! compile by NVRTC for the GPU's architecture.

use std::sync::Mutex;

use candle_core::cuda_backend::cudarc::nvrtc::{CompileOptions, compile_ptx_with_opts};

use super::{CudaError, KERNELS};

/// Launch shapes the kernels are compiled for: fixed for a process, so they change speed
/// (and, for `attention_splits`, the order attention's sums take), never row invariance.
/// `SUFFIXD_CUDA_WARPS`, `SUFFIXD_CUDA_ATTN_SPLITS`, `SUFFIXD_CUDA_MMA_KSPLIT`,
/// `SUFFIXD_CUDA_MMA_HEAD_KSPLIT`, `SUFFIXD_CUDA_MMA_WIDE` (`off`, or 2 or 4) and
/// `SUFFIXD_CUDA_MMA_WIDE_FROM` override the defaults, for tuning on a new card
/// (docs/gpu.md); `SUFFIXD_CUDA_PDL=off` launches every kernel after the one before it
/// has finished; `SUFFIXD_CUDA_PERSISTENT=on` runs short passes' layers as one kernel.
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
    /// Kernels compiled to start while the kernel before them drains, asking L2 for
    /// their weights meanwhile (programmatic dependent launch, sm_90 and later; kernels.cu
    /// and `dependent.rs`). Speed only: no sum changes order.
    pub dependent_launch: bool,
    /// Passes of at most 16 rows run their layers as one persistent kernel
    /// (`SUFFIXD_CUDA_PERSISTENT=on`; persistent.cu): the same bodies in the same order,
    /// without a launch between them. Speed only: no sum changes order. Off by default
    /// until it has been measured on a GPU (docs/gpu.md).
    pub persistent_pass: bool,
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
            dependent_launch: true,
            persistent_pass: false,
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
        t.dependent_launch = !std::env::var("SUFFIXD_CUDA_PDL").is_ok_and(|v| v == "off");
        t.persistent_pass = std::env::var("SUFFIXD_CUDA_PERSISTENT").is_ok_and(|v| v == "on");
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

/// Compile the kernels for the GPU's architecture, to PTX (no GPU needed), once a process
/// for each architecture and tuning: every later model a process loads (hybrid mode's
/// draft model, a test's many) takes the first compile's PTX instead of NVRTC's seconds.
pub fn compile(arch: &'static str, tuning: Tuning) -> Result<String, CudaError> {
    type Compiled = Vec<((&'static str, Tuning), String)>;
    static COMPILED: Mutex<Compiled> = Mutex::new(Vec::new());
    let key = (arch, tuning);
    let lock = || {
        COMPILED
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    };
    if let Some((_, ptx)) = lock().iter().find(|(k, _)| *k == key) {
        return Ok(ptx.clone());
    }
    let ptx = compile_with_nvrtc(arch, tuning)?;
    lock().push((key, ptx.clone()));
    Ok(ptx)
}

/// [`compile`]'s work: NVRTC on the kernels' source with the tuning's constants.
fn compile_with_nvrtc(arch: &'static str, tuning: Tuning) -> Result<String, CudaError> {
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
            format!("-DDEPENDENT_LAUNCH={}", u8::from(tuning.dependent_launch)),
            format!("-DPERSISTENT_PASS={}", u8::from(tuning.persistent_pass)),
        ],
        ..Default::default()
    };
    let ptx =
        compile_ptx_with_opts(KERNELS, opts).map_err(|e| CudaError::Compile(e.to_string()))?;
    Ok(ptx.to_src())
}

/// The NVRTC target for a GPU of compute capability `(major, minor)`: its own where NVRTC
/// knows it, else the newest below it (the driver JIT-compiles PTX forward).
pub(super) fn arch_of((major, minor): (i32, i32)) -> &'static str {
    match major * 10 + minor {
        cc if cc >= 120 => "compute_120",
        cc if cc >= 100 => "compute_100",
        cc if cc >= 90 => "compute_90",
        89 => "compute_89",
        cc if cc >= 86 => "compute_86",
        _ => "compute_80",
    }
}
