//! Row-invariant CPU kernels for the forward pass: each output element is computed by
//! the same instructions whether the pass holds one row or sixty-four, so a token
//! verified inside a draft gets bit for bit the logits plain decoding gives it, and the
//! weights are read once per pass for all rows, so verifying K tokens costs far less than
//! K decoding steps.
//!
//! - [`pack`]: GGML weights (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K) repacked
//!   exactly into 8-bit blocks with f32 scales, once at load.
//! - [`matmul`]: the quantized matmul (AVX2 with runtime detection, and a portable path
//!   that gives the same bits), threaded over output columns.
//! - [`dense`]: the same for f32 weights (`--weights f32`).
//! - [`attention`]: host attention, threaded over (head, query), in a fixed order.

pub mod attention;
pub mod dense;
pub mod matmul;
pub mod pack;

pub use matmul::Simd;
