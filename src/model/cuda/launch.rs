//! One pass's launches, in order: the projections (on the CUDA cores or the tensor
//! cores, by weight type and row count), attention, and the families' extra steps (Qwen's
//! and Gemma's heads, Gemma's post-norms and GELU gate), launched on the stream or
//! recorded as the persistent pass's stages (persistent.rs).

use std::cell::RefCell;
use std::ffi::c_void;

use candle_core::cuda_backend::cudarc::driver::{
    CudaFunction, CudaSlice, LaunchConfig, PushKernelArg,
};

use super::args::{AttentionArgs, HeadsArgs, MatmulArgs};
use super::dependent::{self, param};
use super::persistent::{DeviceStages, Sink, Stage};
use super::{
    ATTENTION_THREADS, CudaError, CudaForward, DeviceLayer, HeadParts, MMA_TILES, Matrix,
    NORM_ADD_THREADS, TILES, Tuning,
};
use crate::model::kernels::activation::Activation;
use crate::model::kernels::norm::RopePairs;

/// The tensor-core kernel for a pass of `rows` rows: its index in [`MMA_TILES`], the row
/// tiles of 16 a block carries and the output tiles of 8. Many rows take blocks of
/// several output tiles, which read each activation once for all of them; either way a
/// pass uses the fewest row tiles that hold its rows, else the most of its kind, and its
/// row groups spread along the grid's y.
pub(super) fn mma_shape(rows: usize, tuning: &Tuning) -> (usize, usize, u32) {
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
pub(super) enum Mode {
    /// Written as they are (the head).
    Plain,
    /// Added to the residual stream (the output and down projections).
    Residual,
    /// silu(gate) · up (the feed-forward's gate|up).
    Silu,
    /// RoPE, then queries out and keys and values into the cache.
    Qkv,
}

impl CudaForward {
    /// Launch a projection of `m`: `args.groups` counts groups of four outputs (two in
    /// [`Mode::Silu`]), as the CUDA-core kernels take them; the tensor-core kernels take
    /// tiles of eight (four gate|up pairs), half as many.
    fn launch_matmul(
        &self,
        sink: &Sink,
        mode: Mode,
        m: &Matrix,
        mut args: MatmulArgs,
    ) -> Result<(), CudaError> {
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
        // SAFETY: args matches MatmulArgs in kernels.cu; every pointer addresses a live
        // buffer sized for `rows` rows of its width (checked by the caller's layout).
        unsafe { self.launch_in_pass(sink, function, cfg, &mut [param(&args)]) }
    }

    /// Launch one of a pass's kernels after the first (`params`: one [`param`] per kernel
    /// parameter): dependently where the GPU allows it (dependent.rs), else in turn; or,
    /// into a [`Sink::Record`], its stage of the persistent pass.
    ///
    /// # Safety
    /// As [`dependent::launch`]: `params` matches `f`'s parameters, and every buffer they
    /// address is live and as large as `cfg`'s grid reads and writes (when the stage
    /// runs, for a recorded one).
    unsafe fn launch_in_pass(
        &self,
        sink: &Sink,
        f: &CudaFunction,
        cfg: LaunchConfig,
        params: &mut [*mut c_void],
    ) -> Result<(), CudaError> {
        let stages = match sink {
            Sink::Record(stages) => stages,
            Sink::Stream | Sink::InTurn => {
                let dependent = self.kernels.dependent && matches!(sink, Sink::Stream);
                // SAFETY: the caller's promise.
                return unsafe { dependent::launch(&self.stream, f, cfg, dependent, params) };
            }
        };
        let mut stages = stages.borrow_mut();
        // SAFETY: the caller's promise: params are f's.
        let stage = self
            .kernels
            .persistent
            .as_ref()
            .and_then(|persistent| unsafe { persistent.stage(f, &cfg, params) });
        match (stages.as_mut(), stage) {
            (Some(list), Some(stage)) => list.push(stage),
            _ => *stages = None,
        }
        Ok(())
    }

    /// The stages of `p`'s layers for the persistent pass, or None where one of its
    /// launches has none (persistent.rs).
    pub(super) fn record_layers(&self, p: &Pass) -> Result<Option<Vec<Stage>>, CudaError> {
        let sink = Sink::Record(RefCell::new(Some(Vec::new())));
        self.launch_layers(p, &sink)?;
        Ok(match sink {
            Sink::Record(stages) => stages.into_inner(),
            Sink::Stream | Sink::InTurn => None,
        })
    }

    /// Every launch of one pass, in order, on the pass's buffers: all a pass's launches
    /// read from device memory what changes between passes of the same shape, so a CUDA
    /// graph of them replays any such pass.
    pub(super) fn launch_pass(&self, p: &Pass) -> Result<(), CudaError> {
        let cfg = &self.cfg;
        let (width, rows) = (cfg.width, p.rows);
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
            // SAFETY: scale_rows(x, n, s): x holds rows × width floats.
            unsafe {
                self.launch_in_pass(
                    &Sink::Stream,
                    &self.kernels.scale_rows,
                    LaunchConfig::for_num_elems(n as u32),
                    &mut [param(&p.x), param(&n), param(&scale)],
                )
            }?;
        }

        let head = match (p.persistent, &self.kernels.persistent) {
            (Some(stages), Some(persistent)) => {
                // SAFETY: the stages were recorded from this pass's launches (forward),
                // on buffers that live as long as the pass's shape.
                unsafe { persistent.launch(&self.stream, stages) }?;
                if persistent.dependent_after {
                    Sink::Stream
                } else {
                    Sink::InTurn
                }
            }
            _ => {
                self.launch_layers(p, &Sink::Stream)?;
                Sink::Stream
            }
        };
        if p.wanted > 0 {
            self.launch_matmul(
                &head,
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
                    ..self.base_args(p)
                },
            )?;
        }
        Ok(())
    }

    /// Every layer's launches, in order, into `sink`.
    fn launch_layers(&self, p: &Pass, sink: &Sink) -> Result<(), CudaError> {
        let cfg = &self.cfg;
        let (width, hd) = (cfg.width, cfg.head_dim);
        let (qw, kvw) = (cfg.heads * hd, cfg.kv_heads * hd);
        let rows = p.rows;
        let base = self.base_args(p);
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
                    sink,
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
                Some(parts) => self.launch_heads(sink, p, l, layer, parts, &base)?,
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
            let grid = LaunchConfig {
                grid_dim: (
                    rows as u32,
                    cfg.heads as u32,
                    self.kernels.tuning.attention_splits,
                ),
                block_dim: (ATTENTION_THREADS, 1, 1),
                shared_mem_bytes: 0,
            };
            // SAFETY: args matches AttentionArgs; every row's keys were written by this
            // pass or committed before it, within its sequence's capacity; partials and
            // tickets hold rows × heads × splits parts and rows × heads tickets.
            unsafe { self.launch_in_pass(sink, kernel, grid, &mut [param(&args)]) }?;
            self.launch_into_residual(
                sink,
                p,
                &layer.wo,
                layer.post_attn_norm.as_ref(),
                MatmulArgs {
                    x: p.attended,
                    k: qw as i32,
                    ..base
                },
            )?;
            self.launch_feed_forward(sink, p, layer, &base)?;
            self.launch_into_residual(
                sink,
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
        Ok(())
    }

    /// What every projection of a pass shares.
    fn base_args(&self, p: &Pass) -> MatmulArgs {
        let cfg = &self.cfg;
        MatmulArgs {
            rows: p.rows as i32,
            eps: cfg.rms_eps,
            q_width: (cfg.heads * cfg.head_dim) as i32,
            kv_width: (cfg.kv_heads * cfg.head_dim) as i32,
            head_dim: cfg.head_dim as i32,
            meta: p.fields,
            meta_rows: p.rows as i32,
            ..Default::default()
        }
    }

    /// A sublayer's output projection `m` (input and `k` in `args`) added to the residual
    /// stream `p.x`: fused, or with a post-norm, written as it is to `p.post` and then
    /// normed into the residual (Gemma's sandwich).
    fn launch_into_residual(
        &self,
        sink: &Sink,
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
                sink,
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
            sink,
            Mode::Plain,
            m,
            MatmulArgs {
                out: p.post,
                ..args
            },
        )?;
        let (w, width, eps) = (self.ptr(norm), width as i32, self.cfg.rms_eps);
        let grid = LaunchConfig {
            grid_dim: (p.rows as u32, 1, 1),
            block_dim: (NORM_ADD_THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut params = [
            param(&p.x),
            param(&p.post),
            param(&w),
            param(&width),
            param(&eps),
        ];
        // SAFETY: norm_add(x, y, w, width, eps): x and post hold rows × width floats,
        // the norm width weights.
        unsafe { self.launch_in_pass(sink, &self.kernels.norm_add, grid, &mut params) }
    }

    /// The feed-forward's gate|up into `p.hidden`: SiLU fused into the projection, or
    /// GELU (Gemma) over the products written as they are to `p.gate_up`.
    fn launch_feed_forward(
        &self,
        sink: &Sink,
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
                sink,
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
            sink,
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
        let grid = LaunchConfig::for_num_elems((p.rows * self.ffn) as u32);
        let mut params = [
            param(&p.gate_up),
            param(&p.hidden),
            param(&rows),
            param(&ffn),
        ];
        // SAFETY: gelu_mul(gate_up, out, rows, ffn): gate_up holds rows × 2·ffn floats,
        // hidden rows × ffn.
        unsafe { self.launch_in_pass(sink, &self.kernels.gelu_mul, grid, &mut params) }
    }

    /// Layer `l`'s q|k|v for a layer with [`HeadParts`]: the products as they are into
    /// `p.raw`, then one warp per (row, head) adds the bias, norms the head and applies
    /// RoPE, writing queries to `p.q` and keys and values to the cache.
    fn launch_heads(
        &self,
        sink: &Sink,
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
            sink,
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
        let grid = LaunchConfig {
            grid_dim: (p.rows as u32, (cfg.heads + 2 * cfg.kv_heads) as u32, 1),
            block_dim: (32, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: args matches HeadsArgs; raw holds rows × (q_width + 2 kv_width)
        // products, the bias that many floats and each norm head_dim; every row's KV slot
        // lies within its sequence's capacity (reserved by the pass).
        unsafe { self.launch_in_pass(sink, &self.kernels.heads, grid, &mut [param(&args)]) }
    }
}

/// The device addresses one pass reads and writes.
pub(super) struct Pass {
    pub(super) rows: usize,
    pub(super) wanted: usize,
    pub(super) x: u64,
    pub(super) q: u64,
    /// The q|k|v products of layers with [`HeadParts`] (0 when no layer has any).
    pub(super) raw: u64,
    /// A sublayer's output before its post-norm (0 when no layer has one).
    pub(super) post: u64,
    /// The gate|up products before a GELU gate (0 with SiLU).
    pub(super) gate_up: u64,
    pub(super) attended: u64,
    pub(super) hidden: u64,
    pub(super) logits: u64,
    /// Attention's per-split parts and tickets.
    pub(super) partials: u64,
    pub(super) tickets: u64,
    /// The rows' fields (kernels.cu's ROW_*).
    pub(super) fields: u64,
    pub(super) ids: u64,
    /// The rows the head reads.
    pub(super) head_rows: u64,
    pub(super) ancestors: u64,
    /// The layers' stages, where the pass runs them as the persistent pass.
    pub(super) persistent: Option<DeviceStages>,
}
