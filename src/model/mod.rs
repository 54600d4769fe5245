//! The model: the verifier that checks drafts. The fourth stage of the data flow.
//!
//! - [`tokenizer`]: the model's tokenizer, from GGUF metadata or tokenizer.json.
//! - [`arch`]: the model families (llama, Mistral, Qwen 2 and 3, Gemma 3) and what each
//!   adds to the llama block.
//! - [`forward`]: the forward pass over a draft tree; `kv_cache`: each sequence's keys
//!   and values, of which only the accepted path is kept after a step. What the CPU pass
//!   and the GPU's share, each in its own module so that neither imports the other:
//!   `config` (sizes, switches, weight formats), `layer` (a block's weights, RoPE
//!   tables), `pass` (a batch's rows and layout) and `error` (what loading or running
//!   fails with); [`forward`] hands them on.
//! - [`kernels`]: the row-invariant CPU matmul and attention the model runs on.
//! - `cuda` (with the `cuda` feature): the same guarantee on a GPU, through kernels
//!   compiled at run time, with the KV cache on the device.
//! - [`detokenizer`]: an answer's text, decoded once per token as it grows (stop
//!   strings, streamed deltas, the final text).
//!
//! It reads the chat template from [`crate::chat`] and names tokenizers through
//! [`crate::vocab`]; it does not import the store.

pub mod arch;
mod config;
#[cfg(feature = "cuda")]
pub mod cuda;
pub mod detokenizer;
mod error;
pub mod forward;
pub mod kernels;
mod kv_cache;
mod layer;
mod linear;
mod load;
mod pass;
pub use load::synthetic;
pub mod tokenizer;

/// The device models run on: the first CUDA GPU with the `cuda` feature, else the CPU.
pub fn device() -> candle_core::Result<candle_core::Device> {
    #[cfg(feature = "cuda")]
    {
        candle_core::Device::new_cuda(0)
    }
    #[cfg(not(feature = "cuda"))]
    {
        Ok(candle_core::Device::Cpu)
    }
}
