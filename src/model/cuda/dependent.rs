//! Programmatic dependent launch (sm_90 and later): a pass's kernels launched so that each
//! one's blocks start while the kernel before it drains, asking L2 for their weights before
//! they wait for it (kernels.cu's `wait_for_previous_kernel`). A one-row step of a small
//! model is some 150 kernels of a few microseconds each, and the gap between two kernels
//! and each kernel's first weight loads are much of that (docs/gpu.md). The kernels' sums
//! are untouched, so the bits are the same either way; `SUFFIXD_CUDA_PDL=off` turns it off.

use std::ffi::c_void;
use std::sync::Arc;

use candle_core::cuda_backend::cudarc::driver::{
    CudaFunction, CudaStream, DevicePtr, LaunchConfig, result, sys,
};

use super::error::CudaError;
use super::graphs::capture;

/// A kernel parameter as the driver takes it: the address of the argument's value.
pub(super) fn param<T>(value: &T) -> *mut c_void {
    std::ptr::from_ref(value).cast_mut().cast()
}

/// Launch `f` on `stream` with `params` (one [`param`] per kernel parameter, in order):
/// after the kernel before it has finished, or when `dependent`, as soon as that kernel's
/// blocks let it (a kernel launched so must wait before it touches what others write,
/// as every kernel of kernels.cu's passes does).
///
/// # Safety
/// `params` matches `f`'s parameters, and every buffer they address is live and as large
/// as `cfg`'s grid reads and writes.
pub(super) unsafe fn launch(
    stream: &CudaStream,
    f: &CudaFunction,
    cfg: LaunchConfig,
    dependent: bool,
    params: &mut [*mut c_void],
) -> Result<(), CudaError> {
    stream.context().bind_to_thread()?;
    if !dependent {
        // SAFETY: the caller's promise.
        unsafe {
            result::launch_kernel(
                f.cu_function(),
                cfg.grid_dim,
                cfg.block_dim,
                cfg.shared_mem_bytes,
                stream.cu_stream(),
                params,
            )
        }?;
        return Ok(());
    }
    // SAFETY: an all-zero attribute is a valid C value; its id and value are set below.
    let mut attribute: sys::CUlaunchAttribute = unsafe { std::mem::zeroed() };
    attribute.id = sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
    attribute.value.programmaticStreamSerializationAllowed = 1;
    // SAFETY: the caller's promise.
    unsafe { launch_with(stream, f, cfg, &mut attribute, params) }
}

/// Launch `f` on `stream` with one launch `attribute` (cuLaunchKernelEx).
///
/// # Safety
/// As [`launch`].
pub(super) unsafe fn launch_with(
    stream: &CudaStream,
    f: &CudaFunction,
    cfg: LaunchConfig,
    attribute: &mut sys::CUlaunchAttribute,
    params: &mut [*mut c_void],
) -> Result<(), CudaError> {
    stream.context().bind_to_thread()?;
    let config = sys::CUlaunchConfig {
        gridDimX: cfg.grid_dim.0,
        gridDimY: cfg.grid_dim.1,
        gridDimZ: cfg.grid_dim.2,
        blockDimX: cfg.block_dim.0,
        blockDimY: cfg.block_dim.1,
        blockDimZ: cfg.block_dim.2,
        sharedMemBytes: cfg.shared_mem_bytes,
        hStream: stream.cu_stream(),
        attrs: attribute,
        numAttrs: 1,
    };
    // SAFETY: the caller's promise; the config and its attribute outlive the call.
    unsafe {
        sys::cuLaunchKernelEx(
            &config,
            f.cu_function(),
            params.as_mut_ptr(),
            std::ptr::null_mut(),
        )
    }
    .result()?;
    Ok(())
}

/// Checks that this GPU and its driver launch kernels dependently, on a stream and inside
/// a captured graph (passes replay as graphs): `scale_rows` (kernels.cu, which begins as
/// every pass kernel does) launched twice on one float, the second dependent, then the
/// same captured and replayed, and waited for. The error is the driver's refusal.
pub(super) fn probe(stream: &Arc<CudaStream>, scale_rows: &CudaFunction) -> Result<(), CudaError> {
    let buffer = stream.alloc_zeros::<f32>(1)?;
    let x = buffer.device_ptr(stream).0;
    let twice = || -> Result<(), CudaError> {
        for dependent in [false, true] {
            // SAFETY: x holds one float.
            unsafe { scale_one(stream, scale_rows, x, dependent) }?;
        }
        Ok(())
    };
    on_a_stream_and_in_a_graph(stream, &twice)
}

/// `scale_rows` (kernels.cu) on the one float at `x`, times one: a probe's launch.
///
/// # Safety
/// `x` addresses a live f32.
pub(super) unsafe fn scale_one(
    stream: &CudaStream,
    scale_rows: &CudaFunction,
    x: u64,
    dependent: bool,
) -> Result<(), CudaError> {
    let (n, s) = (1i32, 1.0f32);
    let cfg = LaunchConfig {
        grid_dim: (1, 1, 1),
        block_dim: (32, 1, 1),
        shared_mem_bytes: 0,
    };
    // SAFETY: scale_rows(x, n, s): x holds n = 1 float (the caller's promise).
    unsafe {
        launch(
            stream,
            scale_rows,
            cfg,
            dependent,
            &mut [param(&x), param(&n), param(&s)],
        )
    }
}

/// A probe of the driver: `launches` on `stream`, waited for, then captured into a graph,
/// replayed and waited for (passes replay as graphs). The error is the driver's refusal.
pub(super) fn on_a_stream_and_in_a_graph(
    stream: &Arc<CudaStream>,
    launches: &impl Fn() -> Result<(), CudaError>,
) -> Result<(), CudaError> {
    launches()?;
    stream.synchronize()?;
    capture(stream, launches)?.launch()?;
    stream.synchronize()?;
    Ok(())
}
