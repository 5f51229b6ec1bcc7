//! Copies between host and device: one asynchronous copy per buffer, counted.
//!
//! Host memory mostly comes from the pinned pool ([`crate::pinned`]), so a copy runs at full
//! PCIe speed (on the H100 machine: 48 GB/s to the device, 53 GB/s back, against about 6 GB/s
//! for pageable memory) straight between the device and the buffer the data lives in: no
//! staging copy on the host.
//!
//! A [`HostBuffer`] of heap memory (a one-off copy of gigabytes, see
//! [`PinnedPool::transfer_buffer`], or a pool over its limit) crosses through a **ring** of
//! [`RING_SLOTS`] pinned chunks of [`RING_CHUNK`] bytes instead: the device copies chunk `i`
//! while all cores copy chunk `i - 1` between the ring and the heap buffer. Such a copy has
//! finished with the heap buffer when the call returns.

use std::collections::VecDeque;
use std::sync::Arc;

use cudarc::driver::sys::CUdeviceptr;
use cudarc::driver::{CudaEvent, CudaSlice, CudaStream, DevicePtr, result};
use rayon::prelude::*;

use crate::error::Result;
use crate::gpu::Gpu;
use crate::pinned::{HostBuffer, PinnedPool};

/// Pinned chunks of the ring for heap memory.
pub const RING_SLOTS: usize = 4;
/// Bytes of a ring chunk.
pub const RING_CHUNK: usize = 32 << 20;
/// Bytes of one host copy task between the ring and a heap buffer.
const HOST_COPY_TASK: usize = 1 << 20;

/// A ring chunk and the event after the device copy that last used it.
struct Slot {
    buf: HostBuffer,
    done: Option<CudaEvent>,
}

/// Copies on one stream, and the bytes they moved.
pub struct Transfers {
    stream: Arc<CudaStream>,
    /// Bytes copied to the device.
    pub to_device: u64,
    /// Bytes copied from the device.
    pub from_device: u64,
    /// The ring for heap memory, made on first use.
    ring: Vec<Slot>,
}

impl std::fmt::Debug for Transfers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Transfers")
            .field("to_device", &self.to_device)
            .field("from_device", &self.from_device)
            .field("ring_slots", &self.ring.len())
            .finish()
    }
}

impl Drop for Transfers {
    fn drop(&mut self) {
        // The ring's chunks go back to the pool only once no copy uses them.
        for slot in &mut self.ring {
            if let Some(e) = slot.done.take() {
                let _ = e.synchronize();
            }
        }
    }
}

/// Whether `bytes` lie in page-locked host memory that the driver knows (the pinned pool's
/// blocks, allocated or registered through CUDA), which a copy reads in place at full PCIe
/// speed. Asked of the driver for the first and the last byte (a buffer is one allocation)
/// with `cuPointerGetAttributes`, which answers "unknown" for pageable memory where the single
/// attribute's call fails (an error the sanitizers report); a thread with no context current
/// also says no.
pub(crate) fn is_pinned(bytes: &[u8]) -> bool {
    use cudarc::driver::sys;
    if bytes.is_empty() {
        return false;
    }
    let ends = [bytes.as_ptr(), bytes.as_ptr().wrapping_add(bytes.len() - 1)];
    ends.iter().all(|&p| {
        let mut kind: u32 = 0;
        let mut attributes = [sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_MEMORY_TYPE];
        let mut data = [(&mut kind as *mut u32).cast::<std::ffi::c_void>()];
        // SAFETY: one attribute, an unsigned int written into `kind`; the driver only looks
        // the address up.
        let r = unsafe { sys::cuPointerGetAttributes(1, attributes.as_mut_ptr(), data.as_mut_ptr(), p as CUdeviceptr) };
        r == sys::CUresult::CUDA_SUCCESS && kind == sys::CUmemorytype::CU_MEMORYTYPE_HOST as u32
    })
}

/// `src` into `dst` on all cores.
fn host_copy(src: &[u8], dst: &mut [u8]) {
    dst.par_chunks_mut(HOST_COPY_TASK)
        .zip(src.par_chunks(HOST_COPY_TASK))
        .for_each(|(d, s)| d.copy_from_slice(s));
}

impl Transfers {
    /// Copies on `stream`.
    pub fn new(stream: &Arc<CudaStream>) -> Self {
        Self {
            stream: Arc::clone(stream),
            to_device: 0,
            from_device: 0,
            ring: vec![],
        }
    }

    /// The ring's slot `i`, free of earlier copies.
    fn slot(&mut self, i: usize) -> Result<&mut Slot> {
        while self.ring.len() <= i {
            self.ring.push(Slot {
                buf: PinnedPool::global().alloc(RING_CHUNK),
                done: None,
            });
        }
        let slot = &mut self.ring[i];
        if let Some(e) = slot.done.take() {
            e.synchronize()?;
        }
        Ok(slot)
    }

    /// Copies heap memory `src` to the device at `dst` through the ring; returns once `src`
    /// is no longer needed (the last chunks may still be crossing).
    ///
    /// # Safety
    /// `dst` has room for `src`.
    unsafe fn upload_through_ring(&mut self, src: &[u8], dst: CUdeviceptr) -> Result<()> {
        self.bind()?;
        for (i, chunk) in src.chunks(RING_CHUNK).enumerate() {
            let stream = Arc::clone(&self.stream);
            let slot = self.slot(i % RING_SLOTS)?;
            let staged = &mut slot.buf.as_mut_slice()[..chunk.len()];
            host_copy(chunk, staged);
            // SAFETY: the slot stays untouched until its event passes; `dst` has room.
            unsafe { result::memcpy_htod_async(dst + (i * RING_CHUNK) as u64, &*staged, stream.cu_stream()) }?;
            slot.done = Some(stream.record_event(None)?);
        }
        self.to_device += src.len() as u64;
        Ok(())
    }

    /// The heap buffers `parts` copied one after another into one new device buffer of `gpu`
    /// through the ring (each ring chunk filled from as many parts as it holds, on all cores,
    /// then crossing in one copy: many small buffers cost what one large one does), and where
    /// each part starts in it. The parts are no longer needed when this returns.
    pub(crate) fn upload_packed(&mut self, gpu: &Gpu, parts: &[&[u8]]) -> Result<(CudaSlice<u8>, Vec<usize>)> {
        let mut starts = Vec::with_capacity(parts.len());
        let mut total = 0usize;
        for p in parts {
            starts.push(total);
            total += p.len();
        }
        let dst = gpu.alloc_bytes(total.max(1))?;
        let base = dst.device_ptr(&self.stream).0;
        self.bind()?;
        let mut first = 0; // the first part that reaches into the chunk
        for (i, lo) in (0..total).step_by(RING_CHUNK).enumerate() {
            let hi = (lo + RING_CHUNK).min(total);
            while starts[first] + parts[first].len() <= lo {
                first += 1;
            }
            let last = first + starts[first..].partition_point(|&s| s < hi);
            let stream = Arc::clone(&self.stream);
            let slot = self.slot(i % RING_SLOTS)?;
            let staged = &mut slot.buf.as_mut_slice()[..hi - lo];
            // Each part's bytes within [lo, hi) into the chunk, the parts on all cores.
            let mut pieces: Vec<(&[u8], &mut [u8])> = Vec::with_capacity(last - first);
            let mut rest = staged;
            for (p, &start) in parts[first..last].iter().zip(&starts[first..last]) {
                let (from, to) = (start.max(lo), (start + p.len()).min(hi));
                let (piece, tail) = std::mem::take(&mut rest).split_at_mut(to - from);
                pieces.push((&p[from - start..to - start], piece));
                rest = tail;
            }
            pieces.into_par_iter().for_each(|(s, d)| host_copy(s, d));
            // SAFETY: the slot stays untouched until its event passes; `dst` holds `total` bytes.
            unsafe {
                result::memcpy_htod_async(base + lo as u64, &slot.buf.as_slice()[..hi - lo], stream.cu_stream())
            }?;
            slot.done = Some(stream.record_event(None)?);
        }
        self.to_device += total as u64;
        Ok((dst, starts))
    }

    /// Heap memory `src` copied into a new device buffer of `gpu` through the ring; `src` is no
    /// longer needed when this returns.
    pub(crate) fn upload_heap(&mut self, gpu: &Gpu, src: &[u8]) -> Result<CudaSlice<u8>> {
        let dst = gpu.alloc_bytes(src.len())?;
        let ptr = dst.device_ptr(&self.stream).0;
        // SAFETY: `dst` holds `src.len()` bytes.
        unsafe { self.upload_through_ring(src, ptr) }?;
        Ok(dst)
    }

    /// Copies `src` on the device into heap memory `dst` through the ring, after the work
    /// queued on the stream so far; returns once `dst` holds every byte.
    ///
    /// # Safety
    /// `src` holds `dst.len()` bytes.
    unsafe fn download_through_ring(&mut self, src: CUdeviceptr, dst: &mut [u8]) -> Result<()> {
        self.bind()?;
        let total = dst.len();
        // Chunks in flight: (chunk, slot), oldest first.
        let mut flight: VecDeque<(usize, usize)> = VecDeque::new();
        let land = |this: &mut Self, (i, s): (usize, usize), dst: &mut [u8]| -> Result<()> {
            let len = RING_CHUNK.min(total - i * RING_CHUNK);
            let slot = this.slot(s)?;
            host_copy(
                &slot.buf.as_slice()[..len],
                &mut dst[i * RING_CHUNK..i * RING_CHUNK + len],
            );
            Ok(())
        };
        for i in 0..total.div_ceil(RING_CHUNK) {
            if flight.len() == RING_SLOTS {
                let oldest = flight.pop_front().expect("a full ring");
                land(self, oldest, dst)?;
            }
            let len = RING_CHUNK.min(total - i * RING_CHUNK);
            let stream = Arc::clone(&self.stream);
            let slot = self.slot(i % RING_SLOTS)?;
            // SAFETY: the slot is read only after its event passes; `src` holds the bytes.
            unsafe {
                result::memcpy_dtoh_async(
                    &mut slot.buf.as_mut_slice()[..len],
                    src + (i * RING_CHUNK) as u64,
                    stream.cu_stream(),
                )
            }?;
            slot.done = Some(stream.record_event(None)?);
            flight.push_back((i, i % RING_SLOTS));
        }
        while let Some(oldest) = flight.pop_front() {
            land(self, oldest, dst)?;
        }
        self.from_device += total as u64;
        Ok(())
    }

    /// Makes the stream's context current on this thread: the raw copies below run on the
    /// stream, whose device need not be the one a pinned allocation or another device's sort
    /// last made current here.
    fn bind(&self) -> Result<()> {
        Ok(self.stream.context().bind_to_thread()?)
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
            self.bind()?;
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

    /// Starts copying `src` words into a new device buffer of `gpu` (a heap buffer goes
    /// through the ring, see the module docs).
    ///
    /// # Safety
    /// A pinned `src` stays alive and unchanged until the stream has passed this copy.
    pub unsafe fn upload_buffer_words(&mut self, gpu: &Gpu, src: &HostBuffer, words: usize) -> Result<CudaSlice<u32>> {
        if src.is_pinned() {
            // SAFETY: the caller's contract.
            return unsafe { self.upload_words(gpu, &src.as_words()[..words]) };
        }
        let dst = gpu.alloc_words(words)?;
        let ptr = dst.device_ptr(&self.stream).0;
        // SAFETY: `dst` holds the words.
        unsafe { self.upload_through_ring(&src.as_slice()[..words * 4], ptr) }?;
        Ok(dst)
    }

    /// Starts copying the first `dst.len()` bytes of `src` into `dst`.
    ///
    /// # Safety
    /// `dst` is neither read nor dropped until the stream has passed this copy (it is
    /// complete when the call returns if `dst` is not pinned).
    pub unsafe fn download(&mut self, src: &CudaSlice<u8>, dst: &mut HostBuffer) -> Result<()> {
        // SAFETY: the caller's contract.
        unsafe { self.download_at(src, 0, dst) }
    }

    /// Starts copying the `dst.len()` bytes of `src` from byte `offset` on into `dst`.
    ///
    /// # Safety
    /// As [`Self::download`].
    pub unsafe fn download_at(&mut self, src: &CudaSlice<u8>, offset: usize, dst: &mut HostBuffer) -> Result<()> {
        assert!(
            offset + dst.len() <= src.len(),
            "download of {} bytes from byte {offset} of {}",
            dst.len(),
            src.len()
        );
        let ptr = src.device_ptr(&self.stream).0 + offset as u64;
        let len = dst.len();
        // SAFETY: `src` holds the bytes from `offset` on; the rest is the caller's contract.
        unsafe { self.download_into(ptr, dst, len) }
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
        unsafe { self.download_into(ptr, dst, words * 4) }
    }

    /// The first `len` bytes of `dst` from `src`: an asynchronous copy into pinned memory,
    /// through the ring into heap memory.
    ///
    /// # Safety
    /// `src` holds `len` bytes; a pinned `dst` outlives the copy.
    unsafe fn download_into(&mut self, src: CUdeviceptr, dst: &mut HostBuffer, len: usize) -> Result<()> {
        let pinned = dst.is_pinned();
        let dst = &mut dst.as_mut_slice()[..len];
        if dst.is_empty() {
            return Ok(());
        }
        if !pinned {
            // SAFETY: the caller's contract.
            return unsafe { self.download_through_ring(src, dst) };
        }
        self.bind()?;
        // SAFETY: the caller's contract.
        unsafe { result::memcpy_dtoh_async(dst, src, self.stream.cu_stream()) }?;
        self.from_device += len as u64;
        Ok(())
    }
}
