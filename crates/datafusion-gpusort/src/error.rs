//! The one error type of the operator crate, converted to `DataFusionError` at the operator's
//! boundary.

use datafusion::error::DataFusionError;

/// Errors of `GpuSortExec`.
#[derive(Debug, thiserror::Error)]
pub enum GpuSortExecError {
    /// The sort itself failed (a type without key encoding, too many rows...).
    #[error(transparent)]
    Sort(#[from] gpusort::GpusortError),
    /// `gpusort.device` names a GPU that cannot be used.
    #[error("gpusort.device = {device}, but that GPU cannot be used: {reason}")]
    DeviceUnavailable {
        /// The configured device.
        device: usize,
        /// Why it cannot be used.
        reason: String,
    },
    /// `gpusort.devices` names a GPU that cannot be used (with `gpusort.device` not `auto`).
    #[error("gpusort.devices = {devices}, but a GPU of them cannot be used: {reason}")]
    DevicesUnavailable {
        /// The configured devices.
        devices: String,
        /// Why one cannot be used.
        reason: String,
    },
    /// The GPU failed to sort rows whose host copy was already released
    /// (`gpusort.release_uploaded_input`): they cannot sort on the CPU instead.
    #[error(
        "{reason}; the rows' columns on the GPU were released from host memory \
         (gpusort.release_uploaded_input = true), so they cannot sort on the CPU instead: \
         run again, with that setting false (GPUSORT_RELEASE_INPUT=0 for the gpusort tool) \
         to keep the CPU fallback, or on the CPU"
    )]
    Released {
        /// Why the GPU did not sort them.
        reason: String,
    },
    /// The blocking task that ran the sort panicked or was cancelled.
    #[error("the sort task failed: {0}")]
    Task(String),
}

impl From<GpuSortExecError> for DataFusionError {
    fn from(e: GpuSortExecError) -> Self {
        match e {
            GpuSortExecError::Sort(gpusort::GpusortError::Arrow(a)) => DataFusionError::ArrowError(Box::new(a), None),
            other => DataFusionError::External(Box::new(other)),
        }
    }
}

/// The error for a memory pool too small to make progress: what was needed, for what (the
/// pool's refusal names the operator's memory consumer).
pub(crate) fn too_small(needed: usize, what: &str, refused: DataFusionError) -> DataFusionError {
    DataFusionError::ResourcesExhausted(format!(
        "gpusort needs at least {} more {what} and cannot spill its way below that \
         (raise the memory limit): {refused}",
        datafusion::common::human_readable_size(needed)
    ))
}
