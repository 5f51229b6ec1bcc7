//! [`Gpu`]: an opened device — its context, the stream sorts run on, the kernels (compiled or
//! read from the cache in the background, [`crate::kernels`]), the stream-ordered memory pool —
//! and what every family's host module uses: device memory, events, launch grids.
//!
//! It drives no kernel family of its own: each family's host module adds its launches to
//! [`Gpu`] (`grs.rs` for `kernels/grs.cu`, `srts.rs` for `srts.cu`, `onesweep.rs` for
//! `onesweep.cu`, `msd` for `msd.cu`, `gather.rs` for `gather.cu`, `encode.rs` for `keys.cu`).
//! Finding a device and saying why there is none is [`crate::device`].

use std::sync::Arc;

use cudarc::driver::{
    CudaContext, CudaEvent, CudaSlice, CudaStream, LaunchConfig,
    sys::{CUevent_flags, CUmemPool_attribute},
};

use crate::device::{self, DeviceInfo};
use crate::error::{CudaSortError, Result};
use crate::kernels::{BLOCK, CacheOutcome, KernelCache, KernelTuning, Kernels, LoadingKernels};
use crate::options::GpuOptions;
use crate::presorted::ScanBufPool;
use crate::shapes::{KernelShapes, SmLimits};
use crate::table::SortSwitches;

/// `n` as the row count kernels take (a u32): one sort holds at most 2^32 - 1 rows.
pub(crate) fn rows_u32(n: usize) -> Result<u32> {
    u32::try_from(n).map_err(|_| CudaSortError::Unsupported(format!("{n} rows in one sort (at most 2^32 - 1)")))
}

/// An opened GPU: a context, the stream sorts run on, and the compiled kernels.
#[derive(Debug)]
pub struct Gpu {
    ctx: Arc<CudaContext>,
    pub(crate) stream: Arc<CudaStream>,
    /// Compiled and loaded in the background from [`Gpu::open`] on.
    kernels: LoadingKernels,
    pub(crate) info: DeviceInfo,
    pub(crate) tile: usize,
    /// The kernels' compile-time settings: those asked for, with the tiles of `shapes`.
    tuning: KernelTuning,
    /// The kernels' shapes on this device (under `GPUSORT_SMEM_CAP`).
    pub(crate) shapes: KernelShapes,
    /// Threads of a one-sweep block (`ONESWEEP_BLOCK`).
    pub(crate) onesweep_block: u32,
    /// Rows of a one-sweep tile (`ONESWEEP_BLOCK` threads x `ONESWEEP_IPT` rows).
    pub(crate) onesweep_tile: usize,
    /// The device's stream-ordered memory pool (`CUmemoryPool` as an address), which keeps
    /// freed memory for the next allocation; `None` when the driver has none.
    mem_pool: Option<usize>,
    /// What it was opened with (each sort's [`SortSwitches`] start from it).
    options: GpuOptions,
    /// The presorted scan's result buffers, reused from sort to sort (`presorted.rs`).
    pub(crate) scan_bufs: ScanBufPool,
}

impl Gpu {
    /// Opens device `ordinal`: a context, a stream, and the kernels (from `cache`, or
    /// compiled by NVRTC and stored there), with the options of the device's tuning profile (in
    /// `cache`'s directory) and the `GPUSORT_*` variables ([`GpuOptions::for_device`], read now
    /// and only now).
    pub fn open(ordinal: usize, cache: &KernelCache) -> Result<Self> {
        Self::open_for(ordinal, cache, |info| GpuOptions::for_device(info, cache.dir()))
    }

    /// As [`Self::open`], with `options`.
    pub fn open_with(ordinal: usize, cache: &KernelCache, options: GpuOptions) -> Result<Self> {
        Self::open_for(ordinal, cache, |_| Ok(options))
    }

    /// As [`Self::open`], with the options `options` gives the device.
    fn open_for(
        ordinal: usize,
        cache: &KernelCache,
        options: impl FnOnce(&DeviceInfo) -> Result<GpuOptions>,
    ) -> Result<Self> {
        let (ctx, info) = device::open(ordinal)?;
        let options = options(&info)?;
        // Sorts order their work on their own stream; cudarc's per-buffer events are not needed.
        // SAFETY: every buffer of this context is used on `stream` or synchronized explicitly.
        unsafe { ctx.disable_event_tracking() };
        let stream = match options.stream_priority {
            true => {
                ctx.bind_to_thread()?;
                let (_, highest) = cudarc::driver::result::stream::get_priority_range()?;
                ctx.new_stream_with_priority(highest)?
            }
            false => ctx.new_stream()?,
        };
        let shapes = Self::shapes_for(&info, &options);
        let tuning = shapes.tuning(&options.tuning);
        let kernels = LoadingKernels::start(
            Arc::clone(&ctx),
            cache.clone(),
            tuning.programs(),
            info.arch(),
            info.nvrtc_version,
            shapes.limits.per_block,
        );
        // Freed device memory stays in the stream-ordered pool instead of going back to the
        // driver at every synchronization: an allocation that grows the pool maps memory, and
        // the 1.6 GB a packed 20-column gather of 10M rows allocates cost ~1.5 ms a sort on
        // the H100 that way. `free_memory` counts what the pool holds unused.
        // SAFETY: the device is the context's; the attribute is a u64.
        let mem_pool = unsafe { cudarc::driver::result::device::get_default_mem_pool(ctx.cu_device()) }
            .ok()
            .filter(|&pool| {
                let mut keep = u64::MAX;
                unsafe {
                    cudarc::driver::result::mem_pool::set_attribute(
                        pool,
                        CUmemPool_attribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
                        (&mut keep as *mut u64).cast(),
                    )
                }
                .is_ok()
            })
            .map(|pool| pool as usize);
        Ok(Self {
            ctx,
            stream,
            kernels,
            info,
            tile: BLOCK as usize * tuning.ipt,
            onesweep_block: tuning.onesweep_block(),
            onesweep_tile: tuning.onesweep_tile(),
            tuning,
            shapes,
            options,
            mem_pool,
            scan_bufs: ScanBufPool::default(),
        })
    }

    /// The kernels' shapes on device `info` with `options` (their `GPUSORT_SMEM_CAP` and tuning):
    /// what [`Self::open_with`] compiles and plans with (`gpusort info` shows them).
    pub fn shapes_for(info: &DeviceInfo, options: &GpuOptions) -> KernelShapes {
        KernelShapes::new(SmLimits::of(info).capped(options.smem_cap), &options.tuning)
    }

    /// The kernels' shapes on this device.
    pub fn shapes(&self) -> &KernelShapes {
        &self.shapes
    }

    /// The per-sort settings a [`GpuSortPlan`](crate::GpuSortPlan) takes by default: those of
    /// the options it was opened with ([`SortSwitches::new`]).
    pub fn sort_switches(&self) -> SortSwitches {
        SortSwitches::new(&self.options)
    }

    /// Rows per tile of the sort kernels.
    pub fn tile(&self) -> usize {
        self.tile
    }

    /// Rows per tile of the one-sweep pass.
    pub fn onesweep_tile(&self) -> usize {
        self.onesweep_tile
    }

    /// The options it was opened with.
    pub fn options(&self) -> &GpuOptions {
        &self.options
    }

    /// The kernels' compile-time settings (from the `GPUSORT_*` variables when opened, with the
    /// tiles of [`Self::shapes`]).
    pub fn tuning(&self) -> &KernelTuning {
        &self.tuning
    }

    /// The device.
    pub fn info(&self) -> &DeviceInfo {
        &self.info
    }

    /// Whether the kernels came from the cache (waiting for them to load).
    pub fn compile_outcome(&self) -> Result<CacheOutcome> {
        self.kernels.outcome()
    }

    /// The context.
    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }

    /// The stream sorts run on.
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    /// The kernels, waiting for them while they are still compiled or loaded.
    pub fn kernels(&self) -> Result<&Kernels> {
        self.kernels.wait()
    }

    /// Device memory free for a sort now: the driver's free memory and what the memory pool holds unused.
    pub fn free_memory(&self) -> Result<usize> {
        Ok(self.ctx.mem_get_info()?.0 + self.pool_idle_bytes())
    }

    /// Bytes the memory pool holds that no allocation uses (free for this process's sorts).
    fn pool_idle_bytes(&self) -> usize {
        let Some(pool) = self.mem_pool else { return 0 };
        let attr = |a: CUmemPool_attribute| {
            let mut v = 0u64;
            // SAFETY: the pool is the device's default pool; these attributes are u64.
            unsafe { cudarc::driver::result::mem_pool::get_attribute(pool as _, a, (&mut v as *mut u64).cast()) }
                .map_or(0, |_| v)
        };
        let reserved = attr(CUmemPool_attribute::CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT);
        let used = attr(CUmemPool_attribute::CU_MEMPOOL_ATTR_USED_MEM_CURRENT);
        reserved.saturating_sub(used) as usize
    }

    /// A timing event.
    pub fn event(&self) -> Result<CudaEvent> {
        Ok(self.ctx.new_event(Some(CUevent_flags::CU_EVENT_DEFAULT))?)
    }

    /// `n` uninitialized bytes on the device.
    pub fn alloc_bytes(&self, n: usize) -> Result<CudaSlice<u8>> {
        // SAFETY: callers write before they read.
        Ok(unsafe { self.stream.alloc::<u8>(n.max(1)) }?)
    }

    /// `n` uninitialized words on the device.
    pub fn alloc_words(&self, n: usize) -> Result<CudaSlice<u32>> {
        // SAFETY: callers write before they read.
        Ok(unsafe { self.stream.alloc::<u32>(n.max(1)) }?)
    }

    /// A grid-stride launch over `n` items.
    pub(crate) fn grid_for(&self, n: usize) -> LaunchConfig {
        let blocks = n
            .div_ceil(BLOCK as usize)
            .clamp(1, self.info.multiprocessors as usize * 16) as u32;
        LaunchConfig {
            grid_dim: (blocks, 1, 1),
            block_dim: (BLOCK, 1, 1),
            shared_mem_bytes: 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn row_counts_above_u32_are_refused() {
        assert_eq!(rows_u32(0).unwrap(), 0);
        assert_eq!(rows_u32(u32::MAX as usize).unwrap(), u32::MAX);
        let err = rows_u32(u32::MAX as usize + 1).unwrap_err();
        assert!(matches!(err, CudaSortError::Unsupported(_)), "{err:?}");
        assert!(err.to_string().contains("4294967296 rows"), "{err}");
    }
}
