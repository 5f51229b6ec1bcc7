//! The one error type of the CUDA backend.

use cudarc::driver::DriverError;

use crate::device::GpuUnavailable;

/// Errors of the CUDA backend.
#[derive(Debug, thiserror::Error)]
pub enum CudaSortError {
    /// No usable GPU (no driver, no NVRTC, no device...): the caller should use the CPU.
    #[error("no GPU: {0}")]
    Unavailable(#[from] GpuUnavailable),
    /// A CUDA driver call failed.
    #[error("CUDA driver error: {0}")]
    Driver(#[from] DriverError),
    /// The device has too little free memory for the sort.
    #[error("the sort needs {needed} bytes of GPU memory, {available} are available under the budget")]
    OutOfMemory {
        /// Bytes needed.
        needed: usize,
        /// Bytes available under the budget.
        available: usize,
    },
    /// Other sorts of the process hold the device memory the sort needs and wait for memory
    /// themselves, or it needs more than the process's budget ([`crate::DeviceBudget`]).
    #[error("device memory budget: {0}")]
    Busy(crate::memory::BudgetRefusal),
    /// Compiling the kernels failed.
    #[error("compiling the CUDA kernels failed: {0}")]
    Compile(String),
    /// A tuning profile cannot be read or written, or the tuning search cannot go on
    /// ([`crate::tune`]).
    #[error("tuning: {0}")]
    Tuning(String),
    /// The request cannot run on the GPU backend.
    #[error("not supported on the GPU: {0}")]
    Unsupported(String),
    /// nvCOMP is absent or refused a compression ([`crate::nvcomp`]).
    #[error("GPU compression: {0}")]
    Compression(String),
    /// A Parquet page the device decoder cannot read: corrupt, or of a kind it does not decode
    /// ([`crate::parquet`]).
    #[error("Parquet decode on the GPU: {0}")]
    Decode(String),
    /// An error of the core crate (key encoding, planning).
    #[error(transparent)]
    Core(#[from] gpusort::GpusortError),
}

/// Result with [`CudaSortError`].
pub type Result<T, E = CudaSortError> = std::result::Result<T, E>;

impl From<CudaSortError> for gpusort::GpusortError {
    fn from(e: CudaSortError) -> Self {
        match e {
            CudaSortError::Core(e) => e,
            other => gpusort::GpusortError::Backend(other.to_string()),
        }
    }
}
