//! Copies between host and device through pinned staging memory.
//!
//! Pageable host memory crosses PCIe at a fraction of the speed of pinned memory (on the H100
//! machine: about 6 against 48 GB/s), so host data goes through two pinned buffers in chunks:
//! while the device copies one chunk over PCIe, the host copies the next into the other buffer
//! (on all cores), so a transfer costs about the slower of the two copies, not their sum.

use cudarc::driver::sys::CUdeviceptr;
use cudarc::driver::{CudaEvent, CudaSlice, CudaStream, DevicePtr, DevicePtrMut, PinnedHostSlice, result};
use rayon::prelude::*;

use crate::engine::Gpu;
use crate::error::Result;

/// Bytes per staging chunk.
const CHUNK: usize = 32 << 20;

/// Two pinned staging buffers, the events that say when each is free again, and the counters
/// of what went through them.
pub struct Staging {
    pinned: [PinnedHostSlice<u8>; 2],
    free: [CudaEvent; 2],
    /// Bytes copied to the device.
    pub to_device: u64,
    /// Bytes copied from the device.
    pub from_device: u64,
}

impl std::fmt::Debug for Staging {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Staging")
            .field("to_device", &self.to_device)
            .field("from_device", &self.from_device)
            .finish()
    }
}

/// Copies `src` into `dst` on all cores.
fn par_copy(dst: &mut [u8], src: &[u8]) {
    const PART: usize = 1 << 20;
    dst.par_chunks_mut(PART)
        .zip(src.par_chunks(PART))
        .for_each(|(d, s)| d.copy_from_slice(s));
}

impl Staging {
    /// Staging buffers on `gpu`.
    pub fn new(gpu: &Gpu) -> Result<Self> {
        // SAFETY: the buffers are written before anything reads them.
        let pinned = unsafe {
            [
                gpu.context().alloc_pinned_with_flags::<u8>(CHUNK, 0)?,
                gpu.context().alloc_pinned_with_flags::<u8>(CHUNK, 0)?,
            ]
        };
        Ok(Self {
            pinned,
            free: [gpu.event()?, gpu.event()?],
            to_device: 0,
            from_device: 0,
        })
    }

    /// Staging buffer `b`, once the copy that last used it is done.
    fn buffer(&mut self, b: usize, len: usize) -> Result<&mut [u8]> {
        self.free[b].synchronize()?;
        Ok(&mut self.pinned[b].as_mut_slice()?[..len])
    }

    /// Copies `src` to device memory at `dst`, chunk by chunk through alternating buffers.
    fn copy_up(&mut self, stream: &CudaStream, src: &[u8], dst: CUdeviceptr) -> Result<()> {
        for (k, part) in src.chunks(CHUNK).enumerate() {
            let b = k % 2;
            let staged = self.buffer(b, part.len())?;
            par_copy(staged, part);
            // SAFETY: `dst` has room for `src` (the callers' views), and the staging buffer is
            // not touched again before its event says the copy is done.
            unsafe { result::memcpy_htod_async(dst + (k * CHUNK) as u64, &*staged, stream.cu_stream()) }?;
            self.free[b].record(stream)?;
        }
        self.to_device += src.len() as u64;
        Ok(())
    }

    /// Copies device memory at `src` into `dst`: chunk k+1 crosses PCIe while chunk k is copied
    /// out of its staging buffer.
    fn copy_down(&mut self, stream: &CudaStream, src: CUdeviceptr, dst: &mut [u8]) -> Result<()> {
        let chunks = dst.len().div_ceil(CHUNK);
        let mut pending: Option<(usize, usize)> = None;
        for k in 0..=chunks {
            if k < chunks {
                let b = k % 2;
                let len = CHUNK.min(dst.len() - k * CHUNK);
                let staged = self.buffer(b, len)?;
                // SAFETY: `src` holds `dst.len()` bytes; the buffer is read only after its
                // event says the copy is done.
                unsafe { result::memcpy_dtoh_async(staged, src + (k * CHUNK) as u64, stream.cu_stream()) }?;
                self.free[b].record(stream)?;
            }
            if let Some((prev, len)) = pending.take() {
                let staged = self.buffer(prev % 2, len)?;
                par_copy(&mut dst[prev * CHUNK..prev * CHUNK + len], staged);
            }
            if k < chunks {
                pending = Some((k, CHUNK.min(dst.len() - k * CHUNK)));
            }
        }
        self.from_device += dst.len() as u64;
        Ok(())
    }

    /// Copies `src` into a new device buffer.
    pub fn upload(&mut self, gpu: &Gpu, src: &[u8]) -> Result<CudaSlice<u8>> {
        let mut dst = gpu.alloc_bytes(src.len())?;
        self.upload_into(gpu.stream(), src, &mut dst)?;
        Ok(dst)
    }

    /// Copies `src` into the start of `dst`.
    pub fn upload_into(
        &mut self,
        stream: &std::sync::Arc<CudaStream>,
        src: &[u8],
        dst: &mut CudaSlice<u8>,
    ) -> Result<()> {
        assert!(
            src.len() <= dst.len(),
            "upload of {} bytes into {}",
            src.len(),
            dst.len()
        );
        let (ptr, _written) = dst.device_ptr_mut(stream);
        self.copy_up(stream, src, ptr)
    }

    /// Copies the first `dst.len()` bytes of `src` to `dst`.
    pub fn download(&mut self, stream: &std::sync::Arc<CudaStream>, src: &CudaSlice<u8>, dst: &mut [u8]) -> Result<()> {
        assert!(
            dst.len() <= src.len(),
            "download of {} bytes from {}",
            dst.len(),
            src.len()
        );
        let (ptr, _read) = src.device_ptr(stream);
        self.copy_down(stream, ptr, dst)
    }

    /// Copies the first `dst.len()` words of `src` to `dst`.
    pub fn download_words(
        &mut self,
        stream: &std::sync::Arc<CudaStream>,
        src: &CudaSlice<u32>,
        dst: &mut [u32],
    ) -> Result<()> {
        assert!(
            dst.len() <= src.len(),
            "download of {} words from {}",
            dst.len(),
            src.len()
        );
        // SAFETY: the byte view of the words.
        let bytes = unsafe { std::slice::from_raw_parts_mut(dst.as_mut_ptr() as *mut u8, dst.len() * 4) };
        let (ptr, _read) = src.device_ptr(stream);
        self.copy_down(stream, ptr, bytes)
    }

    /// Copies `src` words into a new device buffer.
    pub fn upload_words(&mut self, gpu: &Gpu, src: &[u32]) -> Result<CudaSlice<u32>> {
        let mut dst = gpu.alloc_words(src.len())?;
        // SAFETY: the byte view of initialized words.
        let bytes = unsafe { std::slice::from_raw_parts(src.as_ptr() as *const u8, src.len() * 4) };
        let stream = gpu.stream();
        let (ptr, written) = dst.device_ptr_mut(stream);
        self.copy_up(stream, bytes, ptr)?;
        drop(written);
        Ok(dst)
    }
}
