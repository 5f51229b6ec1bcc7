//! gpusort-cuda: the CUDA backend of gpusort — device discovery, NVRTC compilation of the
//! kernels in `kernels/` with an on-disk cache, device and pinned memory, streams, and the
//! GRS and SRTS radix sorts (direct and indirect, ByField and Hybrid) behind
//! [`gpusort::SortBackend`]. No DataFusion code lives here.
//!
//! Not built yet: this crate is empty until the GPU engine lands. Until then every sort
//! runs on [`gpusort::CpuBackend`].
