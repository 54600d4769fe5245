//! The persistent pass (persistent.cu; `SUFFIXD_CUDA_PERSISTENT=on`): the launches a
//! pass's layers would make, recorded once per pass shape as [`Stage`]s in device memory,
//! then run by one cooperative kernel of one block per SM, each stage's virtual blocks as
//! the kernel's own blocks would have run, in the same order. The same bodies give the
//! same bits; what goes is the launch, ramp and first-load latency between some 150
//! kernels of a one-row step (docs/gpu.md). Passes of up to 16 rows on the tensor cores
//! qualify, every family's (the bodies persistent.cu runs); any other launch in the
//! layers (the CUDA-core projections, the wide tensor-core blocks of longer passes)
//! leaves the pass to the kernels one by one.

use std::cell::RefCell;
use std::ffi::c_void;
use std::sync::Arc;

use candle_core::cuda_backend::cudarc::driver::{
    CudaFunction, CudaModule, CudaStream, DevicePtr, LaunchConfig, sys,
};

use super::args::{AttentionArgs, HeadsArgs, MatmulArgs};
use super::dependent::{self, param};
use super::error::CudaError;
use super::{ATTENTION_THREADS, NORM_ADD_THREADS, Tuning};

/// The kernels whose bodies a stage may run, in persistent.cu's OP_* order: a launch of
/// one of them becomes the stage of that op.
pub(super) const PERSISTENT_OPS: [&str; 9] = [
    "mma_plain_t1",
    "mma_residual_t1",
    "mma_silu_t1",
    "mma_qkv_t1",
    "attention",
    "attention_wide",
    "qkv_heads",
    "norm_add",
    "gelu_mul",
];

/// The sizes of each op's kernel parameters, in order: one argument struct, or
/// persistent.cu's NormAddArgs and GeluMulArgs fields.
fn param_sizes(op: usize) -> &'static [usize] {
    const MATMUL: usize = size_of::<MatmulArgs>();
    const ATTENTION: usize = size_of::<AttentionArgs>();
    const HEADS: usize = size_of::<HeadsArgs>();
    match op {
        0..=3 => &[MATMUL],
        4 | 5 => &[ATTENTION],
        6 => &[HEADS],
        7 => &[8, 8, 8, 4, 4],
        _ => &[8, 8, 4, 4],
    }
}

/// `params` (values of `sizes` bytes) laid out as a C struct of those fields: each at
/// the next multiple of its size (at most 8). None when they do not fit.
///
/// # Safety
/// Each `params[i]` points to `sizes[i]` readable bytes.
unsafe fn pack(params: &[*mut c_void], sizes: &[usize]) -> Option<[u64; STAGE_ARGS_BYTES / 8]> {
    if params.len() != sizes.len() {
        return None;
    }
    let mut args = [0u64; STAGE_ARGS_BYTES / 8];
    let bytes = args.as_mut_ptr().cast::<u8>();
    let mut at: usize = 0;
    for (&value, &size) in params.iter().zip(sizes) {
        at = at.next_multiple_of(size.min(8));
        if at + size > STAGE_ARGS_BYTES {
            return None;
        }
        // SAFETY: value holds `size` bytes (the caller's promise); args has room.
        unsafe { std::ptr::copy_nonoverlapping(value.cast::<u8>(), bytes.add(at), size) };
        at += size;
    }
    Some(args)
}

/// The most stages a layer records, a counter each: Gemma's q|k|v and its heads,
/// attention, and each of its three other projections followed by a post-norm or the
/// GELU gate.
pub(super) const STAGES_PER_LAYER: usize = 9;

/// Bytes a stage keeps for its kernel's argument struct (persistent.cu's
/// STAGE_ARGS_BYTES).
const STAGE_ARGS_BYTES: usize = 128;

/// One recorded launch: `#[repr(C)]` twin of `struct Stage` in persistent.cu.
#[repr(C)]
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(super) struct Stage {
    op: i32,
    grid: [u32; 3],
    args: [u64; STAGE_ARGS_BYTES / 8],
}

/// Where a pass's launches go: to the stream (dependently where the GPU allows it), to
/// the stream each after the one before has finished, or into a list of stages (None
/// once a launch had no stage: that pass runs kernel by kernel).
pub(super) enum Sink {
    Stream,
    InTurn,
    Record(RefCell<Option<Vec<Stage>>>),
}

/// A pass's stages on the device, and the counters they finish into.
#[derive(Clone, Copy)]
pub(super) struct DeviceStages {
    pub(super) stages: u64,
    pub(super) count: i32,
    pub(super) finished: u64,
}

/// The persistent kernel and how to recognise the launches it can run.
/// `SUFFIXD_CUDA_PERSISTENT_PER_SM` sets its blocks per SM (default 1).
pub(super) struct Persistent {
    function: CudaFunction,
    /// One block per SM (or `SUFFIXD_CUDA_PERSISTENT_PER_SM`, where they fit).
    blocks: u32,
    threads: u32,
    /// Each op's kernel and the block it is launched with, in [`PERSISTENT_OPS`] order.
    ops: Vec<(CudaFunction, u32)>,
    /// The kernel after it (the head) may launch dependently: the driver took a
    /// dependent launch after a cooperative one, on a stream and in a graph.
    pub(super) dependent_after: bool,
}

impl Persistent {
    /// The persistent kernel from `module` (compiled with it: `tuning.persistent_pass`),
    /// sized for this GPU, once a launch of it on a stream and inside a captured graph
    /// has passed; None with a warning where the GPU or its driver refuses. `scale_rows`
    /// (kernels.cu) is given where a pass's kernels launch dependently: a second probe
    /// launches it so after the persistent kernel, as the head would be.
    pub(super) fn load(
        stream: &Arc<CudaStream>,
        module: &Arc<CudaModule>,
        tuning: &Tuning,
        scale_rows: Option<&CudaFunction>,
    ) -> Result<Option<Self>, CudaError> {
        let function = module.load_function("pass_persistent")?;
        let mma = tuning.mma_ksplit * 32;
        let threads = mma
            .max(tuning.mma_head_ksplit * 32)
            .max(ATTENTION_THREADS)
            .max(NORM_ADD_THREADS);
        // The block each op's kernel is launched with (0: any; gelu_mul is element-wise).
        let block_of = |op: usize| match op {
            0 => tuning.mma_head_ksplit * 32,
            1..=3 => mma,
            4 | 5 => ATTENTION_THREADS,
            6 => 32,
            7 => NORM_ADD_THREADS,
            _ => 0,
        };
        let mut ops = Vec::new();
        for (op, name) in PERSISTENT_OPS.iter().enumerate() {
            ops.push((module.load_function(name)?, block_of(op)));
        }
        let sms = stream
            .context()
            .attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?;
        let resident = function.occupancy_max_active_blocks_per_multiprocessor(threads, 0, None)?;
        // Blocks per SM: one unless SUFFIXD_CUDA_PERSISTENT_PER_SM asks for more (at most
        // what fits: a cooperative launch needs every block resident).
        let per_sm = super::env_u32("SUFFIXD_CUDA_PERSISTENT_PER_SM", &|n| (1..=8).contains(&n))
            .unwrap_or(1)
            .min(resident.max(1));
        let mut persistent = Persistent {
            function,
            blocks: sms.max(1) as u32 * per_sm,
            threads,
            ops,
            dependent_after: false,
        };
        if resident == 0 {
            tracing::warn!(
                "the persistent pass's block does not fit on an SM: passes launch kernel by kernel"
            );
            return Ok(None);
        }
        match persistent.probe(stream, None) {
            Ok(()) => {
                if let Some(next) = scale_rows {
                    persistent.dependent_after = persistent
                        .probe(stream, Some(next))
                        .inspect_err(|e| {
                            tracing::warn!(
                                "this driver refused a dependent launch after the persistent pass ({e}): the head waits for it to finish before it launches"
                            )
                        })
                        .is_ok();
                }
                Ok(Some(persistent))
            }
            Err(e) => {
                tracing::warn!(
                    "this GPU or driver refused the persistent pass's cooperative launch ({e}): passes launch kernel by kernel"
                );
                Ok(None)
            }
        }
    }

    /// A launch of no stages (then `next`, `scale_rows`, dependently on one float), on
    /// the stream and then captured into a graph and replayed.
    fn probe(
        &self,
        stream: &Arc<CudaStream>,
        next: Option<&CudaFunction>,
    ) -> Result<(), CudaError> {
        let counter = stream.alloc_zeros::<u32>(1)?;
        let none = DeviceStages {
            stages: 0,
            count: 0,
            finished: counter.device_ptr(stream).0,
        };
        let x = counter.device_ptr(stream).0;
        let run = || -> Result<(), CudaError> {
            // SAFETY: no stages: the kernel reads nothing.
            unsafe { self.launch(stream, none) }?;
            if let Some(next) = next {
                // SAFETY: x is the counter, one 4-byte word (scaled by one as a float).
                unsafe { dependent::scale_one(stream, next, x, true) }?;
            }
            Ok(())
        };
        dependent::on_a_stream_and_in_a_graph(stream, &run)
    }

    /// The stage a launch of `f` with `cfg` and `params` makes, if its body is one of
    /// [`PERSISTENT_OPS`] launched as persistent.cu runs it.
    ///
    /// # Safety
    /// `params` are `f`'s parameters, as for a launch of it.
    pub(super) unsafe fn stage(
        &self,
        f: &CudaFunction,
        cfg: &LaunchConfig,
        params: &[*mut c_void],
    ) -> Option<Stage> {
        let op = self.ops.iter().position(|(function, block)| {
            function.cu_function() == f.cu_function()
                && (*block == 0 || cfg.block_dim == (*block, 1, 1))
        })?;
        if cfg.shared_mem_bytes != 0 {
            return None;
        }
        // SAFETY: params are the op's kernel's, of param_sizes(op) (the caller's promise).
        let args = unsafe { pack(params, param_sizes(op)) }?;
        Some(Stage {
            op: op as i32,
            grid: [cfg.grid_dim.0, cfg.grid_dim.1, cfg.grid_dim.2],
            args,
        })
    }

    /// Zero the counters and run the stages, cooperatively.
    ///
    /// # Safety
    /// `stages` holds `count` stages recorded from launches whose buffers are live, and
    /// `finished` holds `count` counters.
    pub(super) unsafe fn launch(
        &self,
        stream: &CudaStream,
        stages: DeviceStages,
    ) -> Result<(), CudaError> {
        stream.context().bind_to_thread()?;
        if stages.count > 0 {
            // SAFETY: `finished` holds `count` u32 counters (the caller's promise).
            unsafe {
                sys::cuMemsetD32Async(
                    stages.finished,
                    0,
                    stages.count as usize,
                    stream.cu_stream(),
                )
            }
            .result()?;
        }
        // SAFETY: an all-zero attribute is a valid C value; its id and value are set below.
        let mut attribute: sys::CUlaunchAttribute = unsafe { std::mem::zeroed() };
        attribute.id = sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_COOPERATIVE;
        attribute.value.cooperative = 1;
        let cfg = LaunchConfig {
            grid_dim: (self.blocks, 1, 1),
            block_dim: (self.threads, 1, 1),
            shared_mem_bytes: 0,
        };
        let (ptr, count, finished) = (stages.stages, stages.count, stages.finished);
        // SAFETY: pass_persistent(stages, count, finished), as the caller promises.
        unsafe {
            dependent::launch_with(
                stream,
                &self.function,
                cfg,
                &mut attribute,
                &mut [param(&ptr), param(&count), param(&finished)],
            )
        }
    }
}

/// A stage's words as uploaded (persistent.cu reads them as `Stage`).
pub(super) fn stage_words(stages: &[Stage]) -> Vec<u64> {
    let mut words = Vec::with_capacity(stages.len() * (2 + STAGE_ARGS_BYTES / 8));
    for s in stages {
        words.push(u64::from(s.op as u32) | (u64::from(s.grid[0]) << 32));
        words.push(u64::from(s.grid[1]) | (u64::from(s.grid[2]) << 32));
        words.extend_from_slice(&s.args);
    }
    words
}

#[cfg(test)]
mod tests {
    use super::{PERSISTENT_OPS, STAGE_ARGS_BYTES, Stage, pack, param, param_sizes, stage_words};

    /// The host's op list is persistent.cu's OP_* list, in order, and its stage layout is
    /// the kernel's: 16 bytes of op and grid, then the argument bytes.
    #[test]
    fn the_host_and_the_kernel_agree_on_the_stages() {
        let source = include_str!("persistent.cu");
        for (op, name) in PERSISTENT_OPS.iter().enumerate() {
            let define = format!("#define OP_{} {op}\n", name.to_uppercase());
            assert!(source.contains(&define), "persistent.cu has `{define}`");
        }
        assert!(source.contains(&format!("#define STAGE_ARGS_BYTES {STAGE_ARGS_BYTES}\n")));
        assert_eq!(size_of::<Stage>(), 16 + STAGE_ARGS_BYTES);
        let mut args = [0u64; STAGE_ARGS_BYTES / 8];
        args[0] = 0x1122_3344_5566_7788;
        let stage = Stage {
            op: 5,
            grid: [7, 9, 16],
            args,
        };
        let words = stage_words(&[stage, stage]);
        assert_eq!(words.len(), 2 * size_of::<Stage>() / 8);
        // SAFETY: Stage is #[repr(C)] plain data of size_of::<Stage>() bytes.
        let bytes = unsafe {
            std::slice::from_raw_parts((&raw const stage).cast::<u8>(), size_of::<Stage>())
        };
        let uploaded: Vec<u8> = words[..size_of::<Stage>() / 8]
            .iter()
            .flat_map(|w| w.to_le_bytes())
            .collect();
        assert_eq!(bytes, uploaded.as_slice());
    }

    /// Parameters one by one pack as a C struct of them: norm_add's three pointers, then
    /// its width and epsilon side by side in the fourth word.
    #[test]
    fn parameters_pack_as_a_struct_of_them() {
        let (x, y, w, width, eps) = (0x10u64, 0x20u64, 0x30u64, 576i32, 1e-6f32);
        let params = [param(&x), param(&y), param(&w), param(&width), param(&eps)];
        // SAFETY: each param points to a value of its size.
        let args = unsafe { pack(&params, param_sizes(7)) }.expect("fits");
        assert_eq!(&args[..3], &[x, y, w]);
        assert_eq!(args[3], 576 | (u64::from(eps.to_bits()) << 32));
        // SAFETY: as above; the count differs, so nothing is read.
        assert!(unsafe { pack(&params[..4], param_sizes(7)) }.is_none());
        let big = [0u8; 16];
        let many = [param(&big); 9];
        // SAFETY: each points to 16 bytes; 9 of 16 do not fit in 128.
        assert!(unsafe { pack(&many, &[16; 9]) }.is_none());
    }
}
