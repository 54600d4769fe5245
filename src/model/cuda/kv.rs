//! Each sequence's KV cache on the device, and the kernel that keeps a pass's accepted
//! rows.

use std::sync::Arc;

use candle_core::cuda_backend::cudarc::driver::{
    CudaFunction, CudaSlice, CudaStream, DevicePtr, LaunchConfig, PushKernelArg,
};

use super::error::CudaError;

/// What moves a sequence's accepted rows into place (shared by every [`DeviceKv`]).
pub(super) struct KvKeeper {
    pub(super) stream: Arc<CudaStream>,
    pub(super) keep: CudaFunction,
    pub(super) layers: usize,
    pub(super) row: usize,
    pub(super) context: usize,
}

/// One sequence's KV cache on the device: `[layer][key|value][capacity][row]` floats.
pub struct DeviceKv {
    buf: CudaSlice<f32>,
    pub(super) cap: usize,
    keeper: Arc<KvKeeper>,
}

impl DeviceKv {
    /// An empty cache with room for `need` rows.
    pub(super) fn new(keeper: Arc<KvKeeper>, need: usize) -> Result<Self, CudaError> {
        let cap = need
            .max(256)
            .next_multiple_of(256)
            .min(keeper.context.max(need));
        let buf = keeper
            .stream
            .alloc_zeros::<f32>(keeper.layers * 2 * cap * keeper.row)?;
        Ok(DeviceKv { buf, cap, keeper })
    }

    pub(super) fn base(&self) -> u64 {
        self.buf.device_ptr(&self.keeper.stream).0
    }

    /// Make room for `need` rows, keeping the first `len`.
    pub(super) fn reserve(&mut self, need: usize, len: usize) -> Result<(), CudaError> {
        if need <= self.cap {
            return Ok(());
        }
        let k = &self.keeper;
        let cap = need
            .max(2 * self.cap)
            .max(256)
            .next_multiple_of(256)
            .min(k.context.max(need));
        let mut buf = k.stream.alloc_zeros::<f32>(k.layers * 2 * cap * k.row)?;
        for region in (0..k.layers * 2).filter(|_| len > 0) {
            let from = self
                .buf
                .slice(region * self.cap * k.row..(region * self.cap + len) * k.row);
            let mut to = buf.slice_mut(region * cap * k.row..(region * cap + len) * k.row);
            k.stream.memcpy_dtod(&from, &mut to)?;
        }
        self.buf = buf;
        self.cap = cap;
        Ok(())
    }

    /// Keep rows `accepted` of the last pass (after `len` committed) at `len..`.
    pub fn keep(&self, len: usize, accepted: &[usize]) -> Result<(), CudaError> {
        if accepted.iter().enumerate().all(|(j, &i)| i == j) {
            return Ok(());
        }
        let k = &self.keeper;
        let ids: Vec<i32> = accepted.iter().map(|&i| i as i32).collect();
        let ids = k.stream.clone_htod(&ids)?;
        let (base, cap, row, len, n) = (
            self.base(),
            self.cap as i32,
            k.row as i32,
            len as i32,
            ids.len() as i32,
        );
        let cfg = LaunchConfig {
            grid_dim: ((k.layers * 2) as u32, 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut b = k.stream.launch_builder(&k.keep);
        b.arg(&base).arg(&cap).arg(&row).arg(&len).arg(&ids).arg(&n);
        // SAFETY: the arguments match kv_keep's signature; every row index is below
        // len + pending <= cap (the engine accepts only computed rows).
        unsafe { b.launch(cfg) }?;
        Ok(())
    }
}
