//! What can go wrong compiling or running the device kernels.

/// Why the device pass cannot be set up or run.
#[derive(Debug, thiserror::Error)]
pub enum CudaError {
    /// NVRTC refused the kernels (a toolkit or driver mismatch).
    #[error("cannot compile the device kernels with NVRTC: {0}")]
    Compile(String),
    /// A driver call failed.
    #[error("CUDA driver call failed: {0}")]
    Driver(String),
    /// The model's shape is outside what the kernels handle.
    #[error("the device kernels cannot run this model: {0}")]
    Shape(String),
    /// A candle operation on the weights failed.
    #[error("{0}")]
    Candle(#[from] candle_core::Error),
}

impl From<candle_core::cuda_backend::cudarc::driver::DriverError> for CudaError {
    fn from(e: candle_core::cuda_backend::cudarc::driver::DriverError) -> Self {
        CudaError::Driver(e.to_string())
    }
}
