//! Copies between host and device through pinned staging memory.
//!
//! Pageable host memory crosses PCIe at a fraction of the speed of pinned memory (on the H100
//! machine: about 6 against 48 GB/s), so host data goes through a pinned buffer in chunks: the
//! host copies a chunk into it (on all cores), the device copies it over, and so on.

use cudarc::driver::{CudaSlice, CudaStream, PinnedHostSlice};
use rayon::prelude::*;

use crate::engine::Gpu;
use crate::error::Result;

/// Bytes per staging chunk.
const CHUNK: usize = 32 << 20;

/// A pinned staging buffer and the counters of what went through it.
pub struct Staging {
    pinned: PinnedHostSlice<u8>,
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
    /// A staging buffer on `gpu`.
    pub fn new(gpu: &Gpu) -> Result<Self> {
        // SAFETY: the buffer is written before anything reads it.
        let pinned = unsafe { gpu.context().alloc_pinned_with_flags::<u8>(CHUNK, 0) }?;
        Ok(Self {
            pinned,
            to_device: 0,
            from_device: 0,
        })
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
        for (k, part) in src.chunks(CHUNK).enumerate() {
            let staged = &mut self.pinned.as_mut_slice()?[..part.len()];
            par_copy(staged, part);
            let mut view = dst.slice_mut(k * CHUNK..k * CHUNK + part.len());
            stream.memcpy_htod(&*staged, &mut view)?;
            // The staging buffer is reused by the next chunk.
            stream.synchronize()?;
        }
        self.to_device += src.len() as u64;
        Ok(())
    }

    /// Copies the first `dst.len()` bytes of `src` to `dst`.
    pub fn download(&mut self, stream: &std::sync::Arc<CudaStream>, src: &CudaSlice<u8>, dst: &mut [u8]) -> Result<()> {
        for (k, part) in dst.chunks_mut(CHUNK).enumerate() {
            let view = src.slice(k * CHUNK..k * CHUNK + part.len());
            let staged = &mut self.pinned.as_mut_slice()?[..part.len()];
            stream.memcpy_dtoh(&view, staged)?;
            stream.synchronize()?;
            par_copy(part, staged);
        }
        self.from_device += dst.len() as u64;
        Ok(())
    }

    /// Copies the first `dst.len()` words of `src` to `dst`.
    pub fn download_words(
        &mut self,
        stream: &std::sync::Arc<CudaStream>,
        src: &CudaSlice<u32>,
        dst: &mut [u32],
    ) -> Result<()> {
        // SAFETY: u32 and u8 views of the same device memory; the length is in bytes.
        let bytes = unsafe { src.transmute::<u8>(src.len() * 4) }.expect("a u32 buffer is a byte buffer");
        let dst_bytes = unsafe { std::slice::from_raw_parts_mut(dst.as_mut_ptr() as *mut u8, dst.len() * 4) };
        for (k, part) in dst_bytes.chunks_mut(CHUNK).enumerate() {
            let view = bytes.slice(k * CHUNK..k * CHUNK + part.len());
            let staged = &mut self.pinned.as_mut_slice()?[..part.len()];
            stream.memcpy_dtoh(&view, staged)?;
            stream.synchronize()?;
            par_copy(part, staged);
        }
        self.from_device += dst_bytes.len() as u64;
        Ok(())
    }

    /// Copies `src` words into a new device buffer.
    pub fn upload_words(&mut self, gpu: &Gpu, src: &[u32]) -> Result<CudaSlice<u32>> {
        let mut dst = gpu.alloc_words(src.len())?;
        // SAFETY: the byte view of initialized words.
        let bytes = unsafe { std::slice::from_raw_parts(src.as_ptr() as *const u8, src.len() * 4) };
        let mut view = unsafe { dst.transmute_mut::<u8>(src.len() * 4) }.expect("a u32 buffer is a byte buffer");
        for (k, part) in bytes.chunks(CHUNK).enumerate() {
            let staged = &mut self.pinned.as_mut_slice()?[..part.len()];
            par_copy(staged, part);
            let mut sub = view.slice_mut(k * CHUNK..k * CHUNK + part.len());
            gpu.stream().memcpy_htod(&*staged, &mut sub)?;
            gpu.stream().synchronize()?;
        }
        self.to_device += bytes.len() as u64;
        Ok(dst)
    }
}
