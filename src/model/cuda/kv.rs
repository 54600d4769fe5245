//! Each sequence's KV cache on the device, the kernel that keeps a pass's accepted rows,
//! and the prefix cache's blocks on the device with the kernel that copies them in and
//! out.

use std::sync::Arc;

use candle_core::cuda_backend::cudarc::driver::{
    CudaFunction, CudaSlice, CudaStream, DevicePtr, LaunchConfig, PushKernelArg,
};

use super::error::CudaError;

/// What moves a sequence's accepted rows into place (shared by every [`DeviceKv`]).
pub(super) struct KvKeeper {
    pub(super) stream: Arc<CudaStream>,
    pub(super) keep: CudaFunction,
    /// kernels.cu's `kv_blocks`: copies between a cache and prefix-cache blocks.
    pub(super) blocks: CudaFunction,
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

/// A prefix-cache block on the device: `[layer][key|value][positions][row]` floats.
pub struct DeviceBlock {
    buf: CudaSlice<f32>,
    positions: usize,
    keeper: Arc<KvKeeper>,
}

impl DeviceBlock {
    /// An empty cache of the block's model with room for `need` rows, to restore into.
    pub(crate) fn new_cache(&self, need: usize) -> Result<DeviceKv, CudaError> {
        DeviceKv::new(self.keeper.clone(), need)
    }

    fn ptr(&self) -> u64 {
        self.buf.device_ptr(&self.keeper.stream).0
    }
}

impl DeviceKv {
    /// Layers in the cache.
    pub(crate) fn layers(&self) -> usize {
        self.keeper.layers
    }

    /// Floats per position in one layer's keys (and in its values).
    pub(crate) fn row(&self) -> usize {
        self.keeper.row
    }

    /// Copy positions `from..from + n` (committed: the caller checks) into `reuse` when
    /// it holds that many positions of this model, else into a new block.
    pub(crate) fn save(
        &self,
        from: usize,
        n: usize,
        reuse: Option<DeviceBlock>,
    ) -> Result<DeviceBlock, CudaError> {
        let k = &self.keeper;
        let block = match reuse {
            Some(block) if block.positions == n && Arc::ptr_eq(&block.keeper, k) => block,
            _ => DeviceBlock {
                buf: k.stream.alloc_zeros::<f32>(k.layers * 2 * n * k.row)?,
                positions: n,
                keeper: k.clone(),
            },
        };
        self.copy_blocks(from, &[&block], true)?;
        Ok(block)
    }

    /// Append `blocks` (of this model, one size) after the `len` committed rows.
    pub(crate) fn load(&mut self, len: usize, blocks: &[&DeviceBlock]) -> Result<(), CudaError> {
        let n: usize = blocks.iter().map(|b| b.positions).sum();
        self.reserve(len + n, len)?;
        self.copy_blocks(len, blocks, false)
    }

    /// One launch of `kv_blocks`: `blocks` hold the positions from `first` on, in order.
    fn copy_blocks(
        &self,
        first: usize,
        blocks: &[&DeviceBlock],
        to_blocks: bool,
    ) -> Result<(), CudaError> {
        let Some(head) = blocks.first() else {
            return Ok(());
        };
        let k = &self.keeper;
        assert!(
            blocks
                .iter()
                .all(|b| b.positions == head.positions && Arc::ptr_eq(&b.keeper, k)),
            "blocks of one size, of this model"
        );
        assert!(
            first + blocks.len() * head.positions <= self.cap,
            "the blocks' positions are in the cache"
        );
        let pointers: Vec<u64> = blocks.iter().map(|b| b.ptr()).collect();
        let pointers = k.stream.clone_htod(&pointers)?;
        let (base, cap, row, first, rows, to_blocks) = (
            self.base(),
            self.cap as i32,
            k.row as i32,
            first as i32,
            head.positions as i32,
            i32::from(to_blocks),
        );
        let cfg = LaunchConfig {
            grid_dim: ((k.layers * 2) as u32, blocks.len() as u32, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut b = k.stream.launch_builder(&k.blocks);
        b.arg(&base).arg(&cap).arg(&row).arg(&first);
        b.arg(&pointers).arg(&rows).arg(&to_blocks);
        // SAFETY: the arguments match kv_blocks' signature; every block holds
        // `layers × 2 × rows × row` floats and the cache's positions first..first +
        // blocks × rows are below its capacity (asserted above).
        unsafe { b.launch(cfg) }?;
        Ok(())
    }

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
