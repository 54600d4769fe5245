//! The `#[repr(C)]` twins of the kernels' argument structs (kernels.cu, attention.cu),
//! which launch.rs fills and persistent.rs records.

/// `#[repr(C)]` twin of `struct MatmulArgs` in kernels.cu.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub(super) struct MatmulArgs {
    pub(super) x: u64,
    pub(super) row_map: u64,
    pub(super) norm_w: u64,
    pub(super) w: u64,
    pub(super) out: u64,
    pub(super) resid: u64,
    pub(super) cos_tab: u64,
    pub(super) sin_tab: u64,
    pub(super) meta: u64,
    pub(super) q_out: u64,
    pub(super) k: i32,
    pub(super) groups: i32,
    pub(super) rows: i32,
    pub(super) out_stride: i32,
    pub(super) eps: f32,
    pub(super) q_width: i32,
    pub(super) kv_width: i32,
    pub(super) head_dim: i32,
    pub(super) layer: i32,
    pub(super) meta_rows: i32,
}

/// `#[repr(C)]` twin of `struct AttentionArgs` in attention.cu.
#[repr(C)]
#[derive(Clone, Copy)]
pub(super) struct AttentionArgs {
    pub(super) q: u64,
    pub(super) out: u64,
    pub(super) meta: u64,
    pub(super) ancestors: u64,
    pub(super) partials: u64,
    pub(super) tickets: u64,
    pub(super) heads: i32,
    pub(super) kv_heads: i32,
    pub(super) head_dim: i32,
    pub(super) layer: i32,
    pub(super) scale: f32,
    pub(super) meta_rows: i32,
    pub(super) window: i32,
}

/// `#[repr(C)]` twin of `struct HeadsArgs` in kernels.cu.
#[repr(C)]
#[derive(Clone, Copy)]
pub(super) struct HeadsArgs {
    pub(super) raw: u64,
    pub(super) bias: u64,
    pub(super) q_norm: u64,
    pub(super) k_norm: u64,
    pub(super) cos_tab: u64,
    pub(super) sin_tab: u64,
    pub(super) meta: u64,
    pub(super) q_out: u64,
    pub(super) q_width: i32,
    pub(super) kv_width: i32,
    pub(super) head_dim: i32,
    pub(super) layer: i32,
    pub(super) meta_rows: i32,
    pub(super) eps: f32,
    pub(super) halves: i32,
}
