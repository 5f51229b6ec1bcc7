//! gpusort-cuda: the CUDA backend of gpusort — device discovery ([`device`]), NVRTC
//! compilation of the kernels in `kernels/` with an on-disk cache ([`kernels`]), the process's
//! pool of pinned host memory ([`pinned`]) and copies through it ([`transfer`]), the GRS and
//! SRTS record sorts of Bandyopadhyay & Sahni, direct and indirect, ByField and Hybrid
//! ([`engine`]), sort keys encoded on the device ([`encode`]), [`CudaBackend`], which implements [`gpusort::SortBackend`] with them, and its
//! streaming sort, [`GpuSortSession`]. No DataFusion code lives here.
//!
//! Everything builds and links without CUDA: the driver and NVRTC are loaded at run time, and
//! [`device::probe`] says why there is no GPU instead of panicking.

mod backend;
pub mod device;
pub mod encode;
pub mod engine;
mod error;
pub mod kernels;
pub mod msd;
pub mod pinned;
pub mod prebuilt;
mod session;
pub mod transfer;

pub use backend::{CudaBackend, MAX_DIGIT_BITS};
pub use device::{DeviceInfo, GpuUnavailable, probe};
pub use engine::{DeviceColumn, DeviceRecords, DeviceTable, Gpu, GpuSortPlan, GpuSortResult};
pub use error::{CudaSortError, Result};
pub use kernels::{KernelCache, KernelTuning};
pub use pinned::{FRESH_PIN_MAX, HostBuffer, PinnedPool, PinnedPoolStats};
pub use session::{GPU_STRING_PREFIX_BYTES, GpuSortSession};
