//! Copies between host and device: one asynchronous copy per buffer, counted.
//!
//! Host memory comes from the pinned pool ([`crate::pinned`]), so a copy runs at full PCIe
//! speed (on the H100 machine: 48 GB/s to the device, 53 GB/s back, against about 6 GB/s for
//! pageable memory) straight between the device and the buffer the data lives in: no staging
//! copy on the host. When the pool hands out heap memory instead (over its limit), the same
//! calls still work — the driver copies pageable memory synchronously, at pageable speed.

use std::sync::Arc;

use cudarc::driver::sys::CUdeviceptr;
use cudarc::driver::{CudaSlice, CudaStream, DevicePtr, result};

use crate::engine::Gpu;
use crate::error::Result;
use crate::pinned::HostBuffer;

/// Copies on one stream, and the bytes they moved.
#[derive(Debug)]
pub struct Transfers {
    stream: Arc<CudaStream>,
    /// Bytes copied to the device.
    pub to_device: u64,
    /// Bytes copied from the device.
    pub from_device: u64,
}

impl Transfers {
    /// Copies on `stream`.
    pub fn new(stream: &Arc<CudaStream>) -> Self {
        Self {
            stream: Arc::clone(stream),
            to_device: 0,
            from_device: 0,
        }
    }

    /// The stream the copies run on.
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    /// Starts copying `src` to device memory at `dst`.
    ///
    /// # Safety
    /// `dst` has room for `src`, and `src` stays alive and unchanged until the stream has
    /// passed this copy.
    pub unsafe fn upload_to(&mut self, src: &[u8], dst: CUdeviceptr) -> Result<()> {
        if !src.is_empty() {
            // SAFETY: the caller's contract.
            unsafe { result::memcpy_htod_async(dst, src, self.stream.cu_stream()) }?;
        }
        self.to_device += src.len() as u64;
        Ok(())
    }

    /// Starts copying `src` into a new device buffer of `gpu`.
    ///
    /// # Safety
    /// `src` stays alive and unchanged until the stream has passed this copy.
    pub unsafe fn upload(&mut self, gpu: &Gpu, src: &[u8]) -> Result<CudaSlice<u8>> {
        let dst = gpu.alloc_bytes(src.len())?;
        let ptr = dst.device_ptr(&self.stream).0;
        // SAFETY: `dst` holds `src.len()` bytes; the rest is the caller's contract.
        unsafe { self.upload_to(src, ptr) }?;
        Ok(dst)
    }

    /// Starts copying `src` words into a new device buffer of `gpu`.
    ///
    /// # Safety
    /// As [`Self::upload`].
    pub unsafe fn upload_words(&mut self, gpu: &Gpu, src: &[u32]) -> Result<CudaSlice<u32>> {
        let dst = gpu.alloc_words(src.len())?;
        // SAFETY: the byte view of initialized words.
        let bytes = unsafe { std::slice::from_raw_parts(src.as_ptr() as *const u8, std::mem::size_of_val(src)) };
        let ptr = dst.device_ptr(&self.stream).0;
        // SAFETY: `dst` holds `src.len()` words; the rest is the caller's contract.
        unsafe { self.upload_to(bytes, ptr) }?;
        Ok(dst)
    }

    /// Starts copying the first `dst.len()` bytes of `src` into `dst`.
    ///
    /// # Safety
    /// `dst` is neither read nor dropped until the stream has passed this copy (it is
    /// complete when the call returns if `dst` is not pinned).
    pub unsafe fn download(&mut self, src: &CudaSlice<u8>, dst: &mut HostBuffer) -> Result<()> {
        assert!(
            dst.len() <= src.len(),
            "download of {} bytes from {}",
            dst.len(),
            src.len()
        );
        let ptr = src.device_ptr(&self.stream).0;
        // SAFETY: `src` holds at least `dst.len()` bytes; the rest is the caller's contract.
        unsafe { self.download_from(ptr, dst.as_mut_slice()) }
    }

    /// Starts copying the first `dst.len() / 4` words of `src` into `dst`.
    ///
    /// # Safety
    /// As [`Self::download`].
    pub unsafe fn download_words(&mut self, src: &CudaSlice<u32>, dst: &mut HostBuffer) -> Result<()> {
        let words = dst.len() / 4;
        assert!(words <= src.len(), "download of {words} words from {}", src.len());
        let ptr = src.device_ptr(&self.stream).0;
        // SAFETY: `src` holds at least `words` words; the rest is the caller's contract.
        unsafe { self.download_from(ptr, &mut dst.as_mut_slice()[..words * 4]) }
    }

    /// # Safety
    /// `src` holds `dst.len()` bytes; `dst` outlives the copy.
    unsafe fn download_from(&mut self, src: CUdeviceptr, dst: &mut [u8]) -> Result<()> {
        if !dst.is_empty() {
            // SAFETY: the caller's contract.
            unsafe { result::memcpy_dtoh_async(dst, src, self.stream.cu_stream()) }?;
        }
        self.from_device += dst.len() as u64;
        Ok(())
    }
}
