//! What can go wrong loading or running a model: one error for the model's whole family
//! of operations, shared by the loaders, the forward pass and its device.

use std::path::PathBuf;

use super::arch::Family;

/// Errors from loading or running the model.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    /// The model file could not be read.
    #[error("cannot read model {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// The file is not a usable llama GGUF.
    #[error("model {path}: {message}")]
    Format {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },
    /// The context would pass the KV cache's capacity.
    #[error(
        "context too long: {needed} tokens, the model's context is {capacity}; shorten the prompt or lower max_tokens"
    )]
    ContextFull {
        /// Tokens needed.
        needed: usize,
        /// Capacity.
        capacity: usize,
    },
    /// The prompt cannot run (empty, or holding ids the model does not have).
    #[error("bad prompt: {0}")]
    BadPrompt(String),
    /// A pass's rows do not form a tree (a parent missing, or after its child): a bug
    /// in the caller, refused before it can index out of bounds.
    #[error("bad pass: {0}")]
    BadPass(String),
    /// The model cannot run on this device in this weight format.
    #[error(
        "this {0:?} model cannot run on this GPU in this weight format: the GPU's own kernels run every family in f32 or bf16 (--weights bf16), candle's GPU operations llama's plain block alone; or use a build without the cuda feature"
    )]
    NotOnDevice(Family),
    /// The draft model cannot draft for this target (hybrid mode).
    #[error("draft model: {0}")]
    DraftModel(String),
    /// A tensor operation failed.
    #[error("model computation failed: {0}")]
    Candle(#[from] candle_core::Error),
    /// A pass's accepted rows could not be kept in the KV cache.
    #[error(transparent)]
    Commit(#[from] super::kv_cache::CommitError),
    /// The GPU's own kernels could not be set up or run.
    #[cfg(feature = "cuda")]
    #[error(transparent)]
    Cuda(#[from] super::cuda::error::CudaError),
}
