//! The kernels as this GPU runs them: compiled by NVRTC for its architecture and the
//! tuning, loaded, and looked up by name once (the projections by weight type and row
//! tile; the tensor-core ones by shape).

use std::sync::Arc;

use candle_core::cuda_backend::cudarc::driver::{CudaFunction, CudaModule, CudaStream};

use super::dependent;
use super::persistent::Persistent;
use super::tuning::arch_of;
use super::{CudaError, Tuning, compile};
use crate::model::config::ModelConfig;

/// The row tiles the projections come in: a pass uses the smallest that holds all its
/// rows, else the largest. A row's arithmetic is the same in each (kernels.cu), so the
/// choice changes speed, not bits; a one-row step does an eighth of an 8-row tile's work.
pub(super) const TILES: [usize; 3] = [1, 4, 8];

/// One projection kernel per weight type (f32, bf16) and row tile ([`TILES`]).
pub(super) type Projection = [[CudaFunction; TILES.len()]; 2];

/// The tensor-core projections' tiles of 16 rows a block carries: a pass uses the fewest
/// that hold all its rows, else the most, in blocks of one output tile; then the same
/// with [`Tuning::mma_wide`] output tiles (kernels.cu's matmul_mma_block).
pub(super) const MMA_TILES: [(usize, bool); 5] =
    [(1, false), (2, false), (4, false), (1, true), (2, true)];

/// One tensor-core projection kernel per shape ([`MMA_TILES`]), bf16 weights only.
pub(super) type MmaProjection = [CudaFunction; MMA_TILES.len()];

/// The launchable kernels.
pub(super) struct Kernels {
    pub(super) plain: Projection,
    pub(super) residual: Projection,
    pub(super) silu: Projection,
    pub(super) qkv: Projection,
    /// The tensor-core projections, by mode (see [`Mode`]), for bf16 weights, unless
    /// `SUFFIXD_CUDA_MMA=off` or they cannot run (see [`CudaForward::new`]).
    pub(super) mma: Option<[MmaProjection; 4]>,
    pub(super) embed: CudaFunction,
    pub(super) attention: CudaFunction,
    /// Attention for heads of 256 values.
    pub(super) attention_wide: CudaFunction,
    /// Qwen's and Gemma's bias, head norms and RoPE after a plain q|k|v projection.
    pub(super) heads: CudaFunction,
    /// Gemma's embedding scale, post-norms and GELU gate.
    pub(super) scale_rows: CudaFunction,
    pub(super) norm_add: CudaFunction,
    pub(super) gelu_mul: CudaFunction,
    pub(super) argmax: CudaFunction,
    pub(super) tuning: Tuning,
    /// A pass's kernels are launched dependently (dependent.rs): the tuning asks for it,
    /// the GPU is sm_90 or later (below, the kernels do not wait) and the probe passed.
    pub(super) dependent: bool,
    /// The persistent pass (persistent.rs): the tuning asks for it, the projections run
    /// on the tensor cores and the GPU launched it cooperatively.
    pub(super) persistent: Option<Persistent>,
    pub(super) _module: Arc<CudaModule>,
}

impl Kernels {
    /// Compile the kernels for this GPU with `tuning` and load every one a model of
    /// `cfg`'s shape (feed-forward width `ffn`) uses; the tensor-core projections when
    /// the weights are `bf16` and the GPU and the widths allow them.
    pub(super) fn load(
        stream: &Arc<CudaStream>,
        cfg: &ModelConfig,
        ffn: usize,
        bf16: bool,
    ) -> Result<(Self, Arc<CudaModule>), CudaError> {
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
        let (w, qw) = (cfg.width, cfg.heads * cfg.head_dim);
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
        let mut kernels = Kernels {
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
            dependent: false,
            persistent: None,
            _module: module.clone(),
        };
        kernels.dependent = tuning.dependent_launch
            && major >= 9
            && dependent::probe(stream, &kernels.scale_rows)
                .inspect_err(|e| {
                    tracing::warn!(
                        "this GPU or driver refused a dependent launch ({e}): each kernel waits for the one before it"
                    )
                })
                .is_ok();
        if tuning.persistent_pass {
            if kernels.mma.is_some() {
                let dependent = kernels.dependent.then_some(&kernels.scale_rows);
                kernels.persistent = Persistent::load(stream, &module, &tuning, dependent)
                    .unwrap_or_else(|e| {
                        tracing::warn!(
                            "the persistent pass could not be set up ({e}): passes launch kernel by kernel"
                        );
                        None
                    });
            } else {
                tracing::warn!(
                    "SUFFIXD_CUDA_PERSISTENT=on runs the tensor-core projections only: passes launch kernel by kernel"
                );
            }
        }
        Ok((kernels, module))
    }
}
