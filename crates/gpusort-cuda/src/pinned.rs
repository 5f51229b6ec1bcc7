//! [`PinnedPool`]: a process-wide pool of page-locked (pinned) host memory, handed out as
//! [`HostBuffer`]s that become Arrow [`Buffer`]s without a copy.
//!
//! Pinned memory crosses PCIe at full speed (48 / 53 GB/s host->device / device->host on the
//! H100 machine, against ~6 GB/s for pageable memory) and never page-faults, but allocating it
//! is slow (the driver locks every page), so it is kept and reused:
//!
//! - **Size classes.** A request is rounded up to its class: 64 KiB at least, then eight
//!   classes per power of two (so at most 12.5% is wasted). A block is allocated whole, with
//!   `cuMemHostAlloc` (portable: usable from every context), for one class; blocks of 2 MiB
//!   and more are mapped with huge pages, faulted in on every core and registered with the
//!   driver instead, 6–10x faster (see `RegisteredHostAllocator`).
//! - **Reuse.** A buffer that is dropped — including the Arrow arrays built on it, however
//!   long they live — returns its block to the free list of its class; the next request of
//!   that class takes it.
//! - **Limit.** The pool holds at most [`PinnedPool::limit`] bytes of pinned memory, in use and
//!   free together. When a new block would pass it, free blocks of other classes are released
//!   (largest first); when that is not enough — or the driver refuses — the request gets
//!   ordinary heap memory instead, which is always correct but copies at pageable speed. The
//!   default limit is a quarter of the host's memory (4 GiB when it is unknown);
//!   `GPUSORT_PINNED_LIMIT` (a size as [`gpusort::size`] reads them: `8g`, `8GiB`, `8GB`,
//!   `1073741824`; `0` or `none` turns pinning off) or
//!   [`PinnedPool::set_limit`] change it.
//!
//! Until a GPU is opened ([`PinnedPool::attach`], done by [`CudaBackend`](crate::CudaBackend))
//! the pool has no driver to pin with and hands out heap memory.
//!
//! The bookkeeping is independent of CUDA ([`HostAllocator`]), so it is tested without a GPU.

use std::collections::BTreeMap;
use std::ptr::NonNull;
use std::sync::{Arc, Mutex, OnceLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use arrow::array::{ArrayData, RecordBatch};
use arrow::buffer::{Buffer, MutableBuffer};
use cudarc::driver::{CudaContext, result, sys};

/// Smallest block: requests below it are rounded up to it.
pub const MIN_BLOCK: usize = 64 << 10;

/// Default limit when the host's memory is unknown.
const FALLBACK_LIMIT: usize = 4 << 30;

/// Largest request [`PinnedPool::transfer_buffer`] pins a new block for (larger ones take a
/// free block or heap memory).
pub const FRESH_PIN_MAX: usize = 256 << 20;

/// Where pinned blocks come from.
pub trait HostAllocator: Send + Sync {
    /// `bytes` of page-locked host memory, aligned to at least 64 bytes.
    fn allocate(&self, bytes: usize) -> Result<NonNull<u8>, String>;

    /// Returns a block.
    ///
    /// # Safety
    /// `ptr` came from [`Self::allocate`] with the same `bytes` and is no longer used.
    unsafe fn free(&self, ptr: NonNull<u8>, bytes: usize);
}

/// Pinned blocks from the CUDA driver (`cuMemHostAlloc`, portable across contexts).
struct CudaHostAllocator {
    ctx: Arc<CudaContext>,
}

impl HostAllocator for CudaHostAllocator {
    fn allocate(&self, bytes: usize) -> Result<NonNull<u8>, String> {
        // SAFETY: a plain allocation; the memory is owned by the pool from here on.
        let ptr = with_context(&self.ctx, || unsafe {
            result::malloc_host(bytes, sys::CU_MEMHOSTALLOC_PORTABLE)
        })?
        .map_err(|e| e.to_string())?;
        NonNull::new(ptr as *mut u8).ok_or_else(|| "cuMemHostAlloc returned null".to_string())
    }

    unsafe fn free(&self, ptr: NonNull<u8>, _bytes: usize) {
        // SAFETY: the caller's contract: `ptr` came from `allocate` and is unused. A failure
        // here leaks the block, which is all that can be done in a drop.
        let _ = with_context(&self.ctx, || unsafe { result::free_host(ptr.as_ptr() as *mut _) });
    }
}

/// Runs `f` with `ctx` current on this thread, then makes current again the context that was
/// (pushed and popped, not set): the pool serves the sorts of every device of the process,
/// and a sort that allocates from it on its own thread goes on with raw copies on its own
/// device's stream, which need that device's context current.
fn with_context<T>(ctx: &CudaContext, f: impl FnOnce() -> T) -> Result<T, String> {
    // SAFETY: the context is alive (held by `ctx`); push and pop are paired on this thread.
    unsafe { sys::cuCtxPushCurrent_v2(ctx.cu_ctx()) }
        .result()
        .map_err(|e| e.to_string())?;
    let out = f();
    let mut popped = std::ptr::null_mut();
    // SAFETY: pops the context pushed above.
    let _ = unsafe { sys::cuCtxPopCurrent_v2(&mut popped) }.result();
    Ok(out)
}

/// Blocks of at least this many bytes are pinned through mmap and `cuMemHostRegister`.
pub const REGISTER_MIN: usize = HUGE_PAGE;

/// A transparent huge page on x86-64 and most aarch64 kernels.
const HUGE_PAGE: usize = 2 << 20;

/// Pinned blocks made fast: large blocks are mapped anonymously, aligned to and advised for
/// transparent huge pages, faulted in by threads of their own in parallel ([`fault_in`]), then
/// registered with the driver (`cuMemHostRegister`, portable); blocks below [`REGISTER_MIN`] come from
/// `cuMemHostAlloc`. A large block whose mapping or registration fails is refused, as a
/// refused `cuMemHostAlloc` is: the pool hands out heap memory and keeps the reason
/// ([`PinnedPool::last_error`]). `free` tells the two kinds apart by size alone, so a large
/// block never comes from `cuMemHostAlloc`.
///
/// Why: `cuMemHostAlloc` faults and locks its pages on one thread, at 1.4–1.5 GB/s on the
/// H100 machine, so an external sort's first runs spent ~0.5 s each pinning their output.
/// Faulting huge pages on 16 threads and registering them ran at 9.8–17 GB/s in all there
/// (`scripts/prototypes/proto_pin.py`,
/// `docs/results/h100-stop12-onesweep-striped-spills/pinning.txt`); the registration alone ran
/// at 33–40 GB/s. `GPUSORT_PIN_REGISTER=0` turns it off.
struct RegisteredHostAllocator {
    plain: CudaHostAllocator,
}

/// A mapping that `free` must undo: registered (mmap) or from `cuMemHostAlloc`.
fn registers(bytes: usize) -> bool {
    bytes >= REGISTER_MIN
}

impl RegisteredHostAllocator {
    /// Whether `GPUSORT_PIN_REGISTER` leaves the mmap path on (the default).
    fn enabled() -> bool {
        !matches!(
            std::env::var("GPUSORT_PIN_REGISTER").as_deref(),
            Ok("0") | Ok("false") | Ok("off")
        )
    }

    /// `bytes` (a multiple of 4 KiB) mapped at a huge-page boundary and faulted in.
    fn map(bytes: usize) -> Result<NonNull<u8>, String> {
        let span = bytes + HUGE_PAGE;
        // SAFETY: an anonymous private mapping; no file, no fixed address.
        let raw = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                span,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if raw == libc::MAP_FAILED {
            return Err(format!("mmap of {bytes} bytes: {}", std::io::Error::last_os_error()));
        }
        let start = raw as usize;
        let aligned = start.next_multiple_of(HUGE_PAGE);
        // SAFETY: both trimmed pieces lie inside the mapping just made and hold nothing.
        unsafe {
            if aligned > start {
                libc::munmap(raw, aligned - start);
            }
            let tail = start + span - (aligned + bytes);
            if tail > 0 {
                libc::munmap((aligned + bytes) as *mut libc::c_void, tail);
            }
            // Advice only: without transparent huge pages the block is still correct.
            libc::madvise(aligned as *mut libc::c_void, bytes, libc::MADV_HUGEPAGE);
        }
        fault_in(aligned, bytes);
        Ok(NonNull::new(aligned as *mut u8).expect("mmap does not return address 0"))
    }

    /// Unmaps a block made by [`Self::map`].
    ///
    /// # Safety
    /// `ptr` and `bytes` are those of a live mapping from [`Self::map`], no longer used.
    unsafe fn unmap(ptr: NonNull<u8>, bytes: usize) {
        // SAFETY: the caller's contract.
        unsafe { libc::munmap(ptr.as_ptr() as *mut libc::c_void, bytes) };
    }
}

/// Bytes of a mapping one faulting thread takes (about 3 ms of work).
const FAULT_SHARE: usize = 16 << 20;

/// Faults in every page of the `bytes` at `base` (a fresh mapping): a write per 4 KiB page (one
/// per huge page would do when the kernel gives huge pages, but it may not), on threads of
/// their own, one per [`FAULT_SHARE`] up to one per core.
///
/// Not on rayon's pool: a block is often pinned by a thread of a busy pool (the Parquet
/// writer's compression runs inside its pool, a sort's staging beside the scans), and faulting
/// tasks queued behind its long tasks. On the H100 machine the writer's first sixteen nvCOMP
/// calls each waited 0.4-0.6 s for their staging blocks that way, and every row group behind
/// them.
fn fault_in(base: usize, bytes: usize) {
    let touch = |from: usize, to: usize| {
        for page in (from..to).step_by(4096) {
            // SAFETY: inside the mapping, which nothing else uses yet.
            unsafe { std::ptr::write_volatile((base + page) as *mut u8, 0) };
        }
    };
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let threads = bytes.div_ceil(FAULT_SHARE).clamp(1, cores);
    // Whole huge pages a thread, so that no two threads fault one huge page.
    let share = bytes.div_ceil(threads).next_multiple_of(HUGE_PAGE);
    on_threads("gpusort-pin", threads, |t| {
        touch((t * share).min(bytes), ((t + 1) * share).min(bytes))
    });
}

/// Runs `work(t)` for every share `t` in `0..shares`: share 0 on the calling thread, the others
/// on threads of their own named `name`; a share whose thread cannot be started runs on the
/// calling thread.
fn on_threads(name: &str, shares: usize, work: impl Fn(usize) + Sync) {
    if shares <= 1 {
        return (0..shares).for_each(work);
    }
    let work = &work;
    std::thread::scope(|scope| {
        for t in 1..shares {
            let spawned = std::thread::Builder::new()
                .name(name.into())
                .spawn_scoped(scope, move || work(t));
            if spawned.is_err() {
                work(t);
            }
        }
        work(0);
    });
}

impl HostAllocator for RegisteredHostAllocator {
    fn allocate(&self, bytes: usize) -> Result<NonNull<u8>, String> {
        if !registers(bytes) {
            return self.plain.allocate(bytes);
        }
        let ptr = Self::map(bytes)?;
        // SAFETY: the mapping is ours, faulted in and `bytes` long.
        let registered = with_context(&self.plain.ctx, || {
            unsafe { sys::cuMemHostRegister_v2(ptr.as_ptr() as *mut _, bytes, sys::CU_MEMHOSTREGISTER_PORTABLE) }
                .result()
        })
        .and_then(|r| r.map_err(|e| e.to_string()));
        match registered {
            Ok(()) => Ok(ptr),
            Err(e) => {
                // SAFETY: the mapping was never handed out.
                unsafe { Self::unmap(ptr, bytes) };
                Err(format!("cuMemHostRegister of {bytes} bytes: {e}"))
            }
        }
    }

    unsafe fn free(&self, ptr: NonNull<u8>, bytes: usize) {
        if !registers(bytes) {
            // SAFETY: the caller's contract; blocks of this size came from `plain`.
            return unsafe { self.plain.free(ptr, bytes) };
        }
        // SAFETY: the block was registered by `allocate` and is unused. A failure leaves
        // the pages locked until the process ends; unmapping still returns them.
        let _ = with_context(&self.plain.ctx, || {
            unsafe { sys::cuMemHostUnregister(ptr.as_ptr() as *mut _) }.result()
        });
        // SAFETY: the caller's contract: a mapping from `allocate`, unused.
        unsafe { Self::unmap(ptr, bytes) };
    }
}

/// The class of a request of `len` bytes: the block size it gets.
pub fn class_size(len: usize) -> usize {
    if len <= MIN_BLOCK {
        return MIN_BLOCK;
    }
    // Eight classes per power of two: steps of 1/8 of the power below `len`.
    let step = 1usize << (usize::BITS - 1 - len.leading_zeros() - 3);
    len.div_ceil(step) * step
}

/// The lengths of every buffer of `batch`'s columns (values, offsets or views, data buffers,
/// validity bits; their children's too): the requests a batch like it makes of the pool when
/// it comes down from the device, each column part a buffer of its own. For
/// [`PinnedPool::pin_ahead`], by a caller that brings down batches like one it has (the runs
/// of a Parquet scan read on the device come down whole one after another, each about as
/// large as the one before).
pub fn block_lens(batch: &RecordBatch) -> Vec<usize> {
    fn of(data: &ArrayData, lens: &mut Vec<usize>) {
        lens.extend(data.buffers().iter().map(Buffer::len));
        lens.extend(data.nulls().map(|n| n.buffer().len()));
        for child in data.child_data() {
            of(child, lens);
        }
    }
    let mut lens = vec![];
    for column in batch.columns() {
        of(&column.to_data(), &mut lens);
    }
    lens.retain(|&len| len > 0);
    lens
}

/// A block address that may cross threads (the pool owns the memory).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct BlockPtr(NonNull<u8>);

// SAFETY: a block is plain memory owned by exactly one party at a time (the free list or one
// buffer).
unsafe impl Send for BlockPtr {}
unsafe impl Sync for BlockPtr {}

/// What the pool holds and did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PinnedPoolStats {
    /// Most pinned bytes the pool holds (in use and free).
    pub limit: usize,
    /// Pinned bytes held now (in use and free).
    pub pinned_bytes: usize,
    /// Of those, bytes in free blocks.
    pub free_bytes: usize,
    /// Requests served by a free block.
    pub reused: u64,
    /// Requests served by a new block.
    pub allocated: u64,
    /// Requests served with heap memory (over the limit, no driver, or the driver refused).
    pub unpinned: u64,
}

struct State {
    limit: usize,
    pinned_bytes: usize,
    free_bytes: usize,
    /// Free blocks by class size.
    free: BTreeMap<usize, Vec<BlockPtr>>,
    reused: u64,
    allocated: u64,
    unpinned: u64,
    /// Why the last pinned allocation failed.
    last_error: Option<String>,
}

struct Shared {
    allocator: Mutex<Option<Arc<dyn HostAllocator>>>,
    state: Mutex<State>,
}

impl Shared {
    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn allocator(&self) -> Option<Arc<dyn HostAllocator>> {
        self.allocator.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// A free block of class `size`, counted as reused.
    fn take_free(state: &mut State, size: usize) -> Option<BlockPtr> {
        let blocks = state.free.get_mut(&size)?;
        let block = blocks.pop().expect("no empty free lists");
        if blocks.is_empty() {
            state.free.remove(&size);
        }
        state.free_bytes -= size;
        state.reused += 1;
        Some(block)
    }

    /// Takes free blocks out of `state`, largest first, until `needed` more bytes fit under the
    /// limit or none are left; the caller frees them outside the lock.
    fn evict(state: &mut State, needed: usize) -> Vec<(BlockPtr, usize)> {
        let mut victims = vec![];
        while state.pinned_bytes + needed > state.limit {
            let Some((&size, blocks)) = state.free.iter_mut().next_back() else {
                break;
            };
            let block = blocks.pop().expect("no empty free lists");
            if blocks.is_empty() {
                state.free.remove(&size);
            }
            state.free_bytes -= size;
            state.pinned_bytes -= size;
            victims.push((block, size));
        }
        victims
    }

    fn release(&self, victims: Vec<(BlockPtr, usize)>) {
        if victims.is_empty() {
            return;
        }
        if let Some(a) = self.allocator() {
            free_blocks(&*a, &victims);
        }
    }

    /// A new block of `size` bytes, already counted in `pinned_bytes`: counted as allocated, or
    /// on a refusal uncounted, with the reason kept.
    fn allocate_counted(&self, allocator: &dyn HostAllocator, size: usize) -> Option<BlockPtr> {
        match allocator.allocate(size) {
            Ok(ptr) => {
                self.state().allocated += 1;
                Some(BlockPtr(ptr))
            }
            Err(e) => {
                let mut state = self.state();
                state.pinned_bytes -= size;
                state.last_error = Some(e);
                None
            }
        }
    }

    /// A block of `size` bytes back from a buffer.
    fn give_back(&self, block: BlockPtr, size: usize) {
        let mut state = self.state();
        if state.pinned_bytes <= state.limit {
            state.free.entry(size).or_default().push(block);
            state.free_bytes += size;
        } else {
            // The limit was lowered while the block was out.
            state.pinned_bytes -= size;
            drop(state);
            self.release(vec![(block, size)]);
        }
    }
}

/// A pool of pinned host memory (see the module docs). Cloning shares the pool.
#[derive(Clone)]
pub struct PinnedPool {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for PinnedPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PinnedPool").field("stats", &self.stats()).finish()
    }
}

/// `GPUSORT_PINNED_LIMIT`, else a quarter of the host's memory.
fn default_limit() -> usize {
    if let Ok(v) = std::env::var("GPUSORT_PINNED_LIMIT")
        && let Some(bytes) = gpusort::parse_byte_size(&v)
    {
        return bytes;
    }
    host_memory().map_or(FALLBACK_LIMIT, |m| m / 4)
}

/// The host's memory (Linux: `MemTotal` of `/proc/meminfo`).
fn host_memory() -> Option<usize> {
    let info = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = info.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kib: usize = line.split_whitespace().nth(1)?.parse().ok()?;
    kib.checked_mul(1024)
}

/// Bytes of blocks one releasing thread takes at least (about 10 ms of unpinning and
/// unmapping at the H100 machine's ~10 GB/s).
const RELEASE_SHARE: usize = 128 << 20;

/// Frees `blocks`, unused blocks of `allocator`, on the calling thread.
fn free_blocks(allocator: &dyn HostAllocator, blocks: &[(BlockPtr, usize)]) {
    for &(b, size) in blocks {
        // SAFETY: the caller's contract: unused blocks from this allocator.
        unsafe { allocator.free(b.0, size) };
    }
}

/// Frees `victims` (unused blocks of `allocator`): on the calling thread when they are few,
/// else spread over threads by bytes, one per [`RELEASE_SHARE`] up to one per core. The
/// driver unpins a block page by page and the kernel unmaps it the same way; a sort under a
/// GPU budget leaves ~15 GB pinned, which one thread gives back in ~0.5 s at the end.
fn release_spread(allocator: &dyn HostAllocator, mut victims: Vec<(BlockPtr, usize)>) {
    let total: usize = victims.iter().map(|(_, size)| size).sum();
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let threads = (total / RELEASE_SHARE).clamp(1, cores).min(victims.len());
    if threads <= 1 {
        return free_blocks(allocator, &victims);
    }
    // Largest first, each to the share with the fewest bytes so far.
    victims.sort_by_key(|(_, size)| std::cmp::Reverse(*size));
    let mut shares: Vec<(usize, Vec<(BlockPtr, usize)>)> = (0..threads).map(|_| (0, vec![])).collect();
    for victim in victims {
        let share = shares
            .iter_mut()
            .min_by_key(|(bytes, _)| *bytes)
            .expect("one share at least");
        share.0 += victim.1;
        share.1.push(victim);
    }
    on_threads("gpusort-unpin", threads, |t| free_blocks(allocator, &shares[t].1));
}

impl PinnedPool {
    /// An empty pool that holds at most `limit` pinned bytes, with no allocator yet (it hands
    /// out heap memory until [`Self::attach`]).
    pub fn new(limit: usize) -> Self {
        Self {
            shared: Arc::new(Shared {
                allocator: Mutex::new(None),
                state: Mutex::new(State {
                    limit,
                    pinned_bytes: 0,
                    free_bytes: 0,
                    free: BTreeMap::new(),
                    reused: 0,
                    allocated: 0,
                    unpinned: 0,
                    last_error: None,
                }),
            }),
        }
    }

    /// A pool whose blocks come from `allocator`.
    pub fn with_allocator(limit: usize, allocator: Arc<dyn HostAllocator>) -> Self {
        let pool = Self::new(limit);
        *pool.shared.allocator.lock().unwrap() = Some(allocator);
        pool
    }

    /// The process's pool (limit: `GPUSORT_PINNED_LIMIT`, else a quarter of host memory).
    pub fn global() -> &'static PinnedPool {
        static POOL: OnceLock<PinnedPool> = OnceLock::new();
        POOL.get_or_init(|| PinnedPool::new(default_limit()))
    }

    /// Pins with the driver of `ctx` from now on, unless the pool already has an allocator.
    pub fn attach(&self, ctx: &Arc<CudaContext>) {
        let mut a = self.shared.allocator.lock().unwrap_or_else(|p| p.into_inner());
        if a.is_none() {
            let plain = CudaHostAllocator { ctx: Arc::clone(ctx) };
            *a = Some(if RegisteredHostAllocator::enabled() {
                Arc::new(RegisteredHostAllocator { plain })
            } else {
                Arc::new(plain)
            });
        }
    }

    /// Most pinned bytes the pool holds.
    pub fn limit(&self) -> usize {
        self.shared.state().limit
    }

    /// Holds at most `limit` pinned bytes from now on (free blocks over it are released now;
    /// blocks in use, when they come back).
    pub fn set_limit(&self, limit: usize) {
        let victims = {
            let mut state = self.shared.state();
            state.limit = limit;
            Shared::evict(&mut state, 0)
        };
        self.shared.release(victims);
    }

    /// Releases every free block; returns their bytes. A large release is spread over threads
    /// (see [`release_spread`]); evictions, which happen while a sort runs, are not.
    pub fn trim(&self) -> usize {
        let victims = {
            let mut state = self.shared.state();
            let limit = state.limit;
            state.limit = 0;
            let v = Shared::evict(&mut state, 0);
            state.limit = limit;
            v
        };
        let bytes = victims.iter().map(|(_, size)| size).sum();
        if let Some(a) = self.shared.allocator() {
            release_spread(&*a, victims);
        }
        bytes
    }

    /// What the pool holds and did.
    pub fn stats(&self) -> PinnedPoolStats {
        let s = self.shared.state();
        PinnedPoolStats {
            limit: s.limit,
            pinned_bytes: s.pinned_bytes,
            free_bytes: s.free_bytes,
            reused: s.reused,
            allocated: s.allocated,
            unpinned: s.unpinned,
        }
    }

    /// Why the last pinned allocation the driver refused failed, if one did.
    pub fn last_error(&self) -> Option<String> {
        self.shared.state().last_error.clone()
    }

    /// A buffer of `len` bytes: pinned when the pool can, else heap memory. Its bytes are
    /// not initialized (a reused block holds what its last user wrote).
    pub fn alloc(&self, len: usize) -> HostBuffer {
        if len == 0 {
            return HostBuffer::heap(0);
        }
        let size = class_size(len);
        let allocator = self.shared.allocator();
        let victims = {
            let mut state = self.shared.state();
            if let Some(block) = Shared::take_free(&mut state, size) {
                drop(state);
                return self.pinned(block, size, len);
            }
            if allocator.is_none() || size > state.limit {
                state.unpinned += 1;
                return HostBuffer::heap(len);
            }
            let victims = Shared::evict(&mut state, size);
            if state.pinned_bytes + size > state.limit {
                state.unpinned += 1;
                drop(state);
                self.shared.release(victims);
                return HostBuffer::heap(len);
            }
            // Counted now, so that concurrent requests stay under the limit.
            state.pinned_bytes += size;
            victims
        };
        self.shared.release(victims);
        match self
            .shared
            .allocate_counted(allocator.expect("checked above").as_ref(), size)
        {
            Some(block) => self.pinned(block, size, len),
            None => {
                self.shared.state().unpinned += 1;
                HostBuffer::heap(len)
            }
        }
    }

    /// A buffer of `len` bytes for one large copy: a free pinned block when the pool has one
    /// of its class, else a new pinned block up to [`FRESH_PIN_MAX`] bytes, else heap memory
    /// (which [`Transfers`](crate::transfer::Transfers) moves through a small pinned ring).
    ///
    /// Pinning runs at 1.4–2.4 GB/s on the H100 machine with `cuMemHostAlloc` and ~10 GB/s
    /// with huge pages and `cuMemHostRegister`, both well below PCIe's ~50 GB/s: a block is worth
    /// pinning when it will be reused, not for a one-off copy of gigabytes.
    pub fn transfer_buffer(&self, len: usize) -> HostBuffer {
        if len <= FRESH_PIN_MAX {
            return self.alloc(len);
        }
        let size = class_size(len);
        let mut state = self.shared.state();
        if let Some(block) = Shared::take_free(&mut state, size) {
            drop(state);
            return self.pinned(block, size, len);
        }
        state.unpinned += 1;
        HostBuffer::heap(len)
    }

    /// Pins blocks ahead of their requests: afterwards the free lists hold at least as many
    /// blocks of each class as `lens` has requests of it (a length listed twice wants two
    /// blocks). Missing blocks are allocated up to the limit, evicting nothing; the first
    /// refusal ends it. Returns the bytes newly pinned.
    ///
    /// Why: a new block costs ~10-50 ms (faulting and registering its pages, slower while the
    /// cores are busy), so a caller whose requests are known ahead, the sorted rows handed out
    /// a range at a time, pins the next ranges' blocks on a thread of its own instead of on
    /// its path.
    pub fn ensure_free(&self, lens: &[usize]) -> usize {
        let mut wanted: BTreeMap<usize, usize> = BTreeMap::new();
        for &len in lens.iter().filter(|&&l| l > 0) {
            *wanted.entry(class_size(len)).or_default() += 1;
        }
        let Some(allocator) = self.shared.allocator() else {
            return 0;
        };
        let mut pinned = 0;
        for (size, want) in wanted {
            loop {
                {
                    let mut state = self.shared.state();
                    let have = state.free.get(&size).map_or(0, Vec::len);
                    if have >= want || state.pinned_bytes + size > state.limit {
                        break;
                    }
                    // Counted now, so that concurrent requests stay under the limit.
                    state.pinned_bytes += size;
                }
                let Some(block) = self.shared.allocate_counted(allocator.as_ref(), size) else {
                    return pinned;
                };
                let mut state = self.shared.state();
                state.free.entry(size).or_default().push(block);
                state.free_bytes += size;
                pinned += size;
            }
        }
        pinned
    }

    /// [`Self::ensure_free`] of `lens` on a thread of its own, for a caller that knows its next
    /// requests before it makes them; `then` gets the bytes newly pinned and the time it took.
    /// `None` when no thread could be started (nothing is pinned then).
    pub fn pin_ahead(
        &self,
        lens: Vec<usize>,
        then: impl FnOnce(usize, Duration) + Send + 'static,
    ) -> Option<JoinHandle<()>> {
        let pool = self.clone();
        std::thread::Builder::new()
            .name("gpusort-pin-ahead".into())
            .spawn(move || {
                let start = Instant::now();
                let pinned = pool.ensure_free(&lens);
                then(pinned, start.elapsed());
            })
            .ok()
    }

    fn pinned(&self, block: BlockPtr, size: usize, len: usize) -> HostBuffer {
        HostBuffer {
            ptr: block.0,
            len,
            memory: Memory::Pinned(PinnedBlock {
                block,
                size,
                shared: Arc::clone(&self.shared),
            }),
        }
    }
}

/// A pinned block out of the pool; dropping it gives it back.
struct PinnedBlock {
    block: BlockPtr,
    size: usize,
    shared: Arc<Shared>,
}

impl Drop for PinnedBlock {
    fn drop(&mut self) {
        self.shared.give_back(self.block, self.size);
    }
}

// SAFETY: the pool's state is behind mutexes and the block is plain memory.
impl std::panic::RefUnwindSafe for PinnedBlock {}

enum Memory {
    Pinned(PinnedBlock),
    Heap(MutableBuffer),
}

/// Host memory for copies to and from the device: a pinned block of a [`PinnedPool`], or heap
/// memory when the pool could not give one. [`Self::into_buffer`] makes it an Arrow
/// [`Buffer`] without a copy; a pinned block returns to its pool when the last array built
/// on it is dropped.
pub struct HostBuffer {
    ptr: NonNull<u8>,
    len: usize,
    memory: Memory,
}

// SAFETY: the buffer owns its memory exclusively.
unsafe impl Send for HostBuffer {}
unsafe impl Sync for HostBuffer {}

impl std::fmt::Debug for HostBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HostBuffer")
            .field("len", &self.len)
            .field("pinned", &self.is_pinned())
            .finish()
    }
}

impl HostBuffer {
    /// `len` bytes of heap memory, not initialized.
    pub(crate) fn heap(len: usize) -> Self {
        let mut b = gpusort::cpu::uninit(len);
        let ptr = NonNull::new(b.as_mut_ptr()).expect("MutableBuffer pointers are not null");
        Self {
            ptr,
            len,
            memory: Memory::Heap(b),
        }
    }

    /// Bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it holds no bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Whether the memory is page-locked (copies run at full PCIe speed).
    pub fn is_pinned(&self) -> bool {
        matches!(self.memory, Memory::Pinned(_))
    }

    /// The bytes.
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: the buffer owns `len` bytes at `ptr`.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    /// The bytes, to write.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: the buffer owns `len` bytes at `ptr`, and `&mut self` is exclusive.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }

    /// The bytes as 32-bit words (whole words only).
    pub fn as_words(&self) -> &[u32] {
        // SAFETY: blocks are page-aligned and heap buffers 64-byte aligned.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr() as *const u32, self.len / 4) }
    }

    /// The bytes as 32-bit words, to write.
    pub fn as_words_mut(&mut self) -> &mut [u32] {
        // SAFETY: as above, and `&mut self` is exclusive.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr() as *mut u32, self.len / 4) }
    }

    /// Keeps the first `len` bytes.
    pub fn truncate(&mut self, len: usize) {
        self.len = self.len.min(len);
    }

    /// An Arrow buffer of the bytes, sharing the memory.
    pub fn into_buffer(self) -> Buffer {
        match self.memory {
            Memory::Heap(mut b) => {
                b.truncate(self.len);
                b.into()
            }
            Memory::Pinned(block) => {
                // SAFETY: `ptr` points to `len` initialized bytes of the block, which the
                // owner keeps alive (and out of the pool) until the last buffer goes.
                unsafe { Buffer::from_custom_allocation(self.ptr, self.len, Arc::new(block)) }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::alloc::Layout;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[test]
    fn huge_page_mapping_is_aligned_faulted_and_whole() {
        // Sizes the pool asks for: class sizes at and above the register threshold, some not
        // a multiple of the huge page.
        for len in [REGISTER_MIN, REGISTER_MIN + (256 << 10), 3 * REGISTER_MIN + MIN_BLOCK] {
            let bytes = class_size(len);
            assert!(registers(bytes));
            let ptr = RegisteredHostAllocator::map(bytes).unwrap();
            assert_eq!(ptr.as_ptr() as usize % HUGE_PAGE, 0, "aligned to a huge page");
            // SAFETY: the mapping is `bytes` long and ours until unmapped below.
            let block = unsafe { std::slice::from_raw_parts_mut(ptr.as_ptr(), bytes) };
            assert!(block.iter().all(|&b| b == 0), "anonymous memory reads as zero");
            block.iter_mut().enumerate().for_each(|(i, b)| *b = i as u8);
            assert_eq!(block[bytes - 1], (bytes - 1) as u8);
            // SAFETY: made by `map` with these bytes; `block` is not used again.
            unsafe { RegisteredHostAllocator::unmap(ptr, bytes) };
        }
        assert!(!registers(REGISTER_MIN - MIN_BLOCK));
    }

    /// Heap blocks standing in for pinned ones, counted.
    #[derive(Default)]
    struct CountingAllocator {
        live: AtomicUsize,
        live_bytes: AtomicUsize,
        fail_over: Option<usize>,
        /// The threads that freed blocks.
        freed_on: Mutex<std::collections::HashSet<std::thread::ThreadId>>,
    }

    impl HostAllocator for CountingAllocator {
        fn allocate(&self, bytes: usize) -> Result<NonNull<u8>, String> {
            if self.fail_over.is_some_and(|max| bytes > max) {
                return Err(format!("refused {bytes} bytes"));
            }
            self.live.fetch_add(1, Ordering::SeqCst);
            self.live_bytes.fetch_add(bytes, Ordering::SeqCst);
            // SAFETY: a non-zero size.
            let p = unsafe { std::alloc::alloc(Layout::from_size_align(bytes, 4096).unwrap()) };
            NonNull::new(p).ok_or_else(|| "out of memory".into())
        }

        unsafe fn free(&self, ptr: NonNull<u8>, bytes: usize) {
            self.freed_on.lock().unwrap().insert(std::thread::current().id());
            self.live.fetch_sub(1, Ordering::SeqCst);
            self.live_bytes.fetch_sub(bytes, Ordering::SeqCst);
            // SAFETY: allocated above with this layout.
            unsafe { std::alloc::dealloc(ptr.as_ptr(), Layout::from_size_align(bytes, 4096).unwrap()) };
        }
    }

    fn pool(limit: usize) -> (PinnedPool, Arc<CountingAllocator>) {
        let a = Arc::new(CountingAllocator::default());
        (PinnedPool::with_allocator(limit, a.clone()), a)
    }

    #[test]
    fn classes_round_up_by_at_most_an_eighth() {
        assert_eq!(class_size(1), MIN_BLOCK);
        assert_eq!(class_size(MIN_BLOCK), MIN_BLOCK);
        for len in [
            MIN_BLOCK + 1,
            100_000,
            1 << 20,
            (1 << 20) + 1,
            40_000_000,
            840_000_000,
            3 << 30,
        ] {
            let c = class_size(len);
            assert!(c >= len && c - len <= len / 8, "{len} -> {c}");
            assert_eq!(class_size(c), c, "a class is its own class");
        }
        // Eight classes between 1 MiB and 2 MiB.
        let classes: std::collections::BTreeSet<usize> =
            ((1 << 20) + 1..=(2 << 20)).step_by(4096).map(class_size).collect();
        assert_eq!(classes.len(), 8, "{classes:?}");
    }

    #[test]
    fn dropped_buffers_return_to_the_pool_and_are_reused() {
        let (pool, a) = pool(1 << 30);
        let mut b = pool.alloc(1_000_000);
        assert!(b.is_pinned());
        assert_eq!(b.len(), 1_000_000);
        b.as_mut_slice().fill(7);
        let ptr = b.as_slice().as_ptr();
        drop(b);
        let s = pool.stats();
        assert_eq!((s.allocated, s.reused, s.free_bytes), (1, 0, class_size(1_000_000)));
        // Same class: the same block.
        let b = pool.alloc(990_000);
        assert_eq!(b.as_slice().as_ptr(), ptr);
        assert_eq!(pool.stats().reused, 1);
        assert_eq!(pool.stats().free_bytes, 0);
        // Another class: a new block.
        let c = pool.alloc(5_000_000);
        assert_ne!(c.as_slice().as_ptr(), ptr);
        assert_eq!(a.live.load(Ordering::SeqCst), 2);
        assert_eq!(pool.stats().pinned_bytes, class_size(1_000_000) + class_size(5_000_000));
        drop((b, c));
        pool.trim();
        assert_eq!(a.live.load(Ordering::SeqCst), 0);
        assert_eq!(pool.stats().pinned_bytes, 0);
    }

    #[test]
    fn a_large_trim_gives_every_block_back_across_threads() {
        let (pool, a) = pool(4 << 30);
        // 24 blocks of three classes, ~0.8 GB (heap memory the test never touches).
        let buffers: Vec<HostBuffer> = (0..24).map(|i| pool.alloc((24 + i % 3) << 20)).collect();
        let held = pool.stats().pinned_bytes;
        assert_eq!(a.live.load(Ordering::SeqCst), 24);
        drop(buffers);
        assert_eq!(pool.trim(), held, "every free block's bytes");
        assert_eq!(a.live.load(Ordering::SeqCst), 0);
        assert_eq!(a.live_bytes.load(Ordering::SeqCst), 0);
        assert_eq!(pool.stats().pinned_bytes, 0);
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        assert_eq!(
            a.freed_on.lock().unwrap().len(),
            cores.min(held / RELEASE_SHARE),
            "one thread a share"
        );
        // A small trim stays on the calling thread.
        let (small, a) = super::tests::pool(1 << 30);
        drop((small.alloc(1 << 20), small.alloc(3 << 20)));
        small.trim();
        assert_eq!(*a.freed_on.lock().unwrap(), [std::thread::current().id()].into());
        // Nothing free: nothing to give back.
        assert_eq!(small.trim(), 0);
    }

    #[test]
    fn arrow_buffers_hold_their_block_until_the_last_clone_goes() {
        let (pool, _a) = pool(1 << 30);
        let mut b = pool.alloc(4 * 1000);
        for (i, w) in b.as_words_mut().iter_mut().enumerate() {
            *w = i as u32;
        }
        let buffer = b.into_buffer();
        let array = arrow::array::UInt32Array::new(arrow::buffer::ScalarBuffer::new(buffer.clone(), 10, 5), None);
        drop(buffer);
        assert_eq!(pool.stats().free_bytes, 0, "the array still holds the block");
        assert_eq!(array.values().to_vec(), vec![10, 11, 12, 13, 14]);
        let slice = array.slice(1, 2);
        drop(array);
        assert_eq!(pool.stats().free_bytes, 0, "a slice still holds the block");
        drop(slice);
        assert_eq!(pool.stats().free_bytes, MIN_BLOCK);
    }

    #[test]
    fn the_limit_evicts_free_blocks_then_falls_back_to_the_heap() {
        let (pool, a) = pool(4 << 20);
        let x = pool.alloc(2 << 20);
        let y = pool.alloc(1 << 20);
        drop(y);
        // 2 MiB in use, 1 MiB free: 2 MiB more only fits by releasing the free block.
        let z = pool.alloc(2 << 20);
        assert!(z.is_pinned());
        let s = pool.stats();
        assert_eq!((s.pinned_bytes, s.free_bytes), (4 << 20, 0));
        assert_eq!(a.live_bytes.load(Ordering::SeqCst), 4 << 20);
        // Nothing free to release: heap memory, still usable.
        let mut w = pool.alloc(1 << 20);
        assert!(!w.is_pinned());
        w.as_mut_slice().fill(1);
        assert_eq!(w.into_buffer().len(), 1 << 20);
        assert_eq!(pool.stats().unpinned, 1);
        // Larger than the whole limit.
        assert!(!pool.alloc(5 << 20).is_pinned());
        drop((x, z));
        assert_eq!(pool.stats().free_bytes, 4 << 20);
        // Lowering the limit releases free blocks.
        pool.set_limit(2 << 20);
        assert_eq!(pool.stats().pinned_bytes, 2 << 20);
        assert_eq!(a.live_bytes.load(Ordering::SeqCst), 2 << 20);
    }

    #[test]
    fn blocks_pinned_ahead_serve_the_requests_they_were_pinned_for() {
        let (pool, a) = pool(16 << 20);
        // Two blocks of one class (two lengths of it), one of another; zero wants nothing.
        let pinned = pool.ensure_free(&[1 << 20, (1 << 20) - 4096, 3 << 20, 0]);
        assert_eq!(pinned, 2 * (1 << 20) + (3 << 20));
        let s = pool.stats();
        assert_eq!((s.allocated, s.free_bytes, s.pinned_bytes), (3, pinned, pinned));
        // Already there: nothing more.
        assert_eq!(pool.ensure_free(&[1 << 20, 3 << 20]), 0);
        let (x, y, z) = (pool.alloc(1 << 20), pool.alloc(1 << 20), pool.alloc(3 << 20));
        assert!(x.is_pinned() && y.is_pinned() && z.is_pinned());
        let s = pool.stats();
        assert_eq!((s.allocated, s.reused, s.free_bytes), (3, 3, 0));
        // One more of the first class; the limit stops it short of a second 8 MiB block.
        assert_eq!(pool.ensure_free(&[1 << 20, 8 << 20, 8 << 20]), (1 << 20) + (8 << 20));
        assert_eq!(pool.stats().pinned_bytes, 14 << 20);
        assert_eq!(a.live_bytes.load(Ordering::SeqCst), 14 << 20);
        drop((x, y, z));
        // A refusal ends it and says why.
        let refusing = Arc::new(CountingAllocator {
            fail_over: Some(1 << 20),
            ..Default::default()
        });
        let pool = PinnedPool::with_allocator(1 << 30, refusing);
        // Classes go smallest first: 64 KiB and 1 MiB pinned, 2 MiB refused.
        assert_eq!(pool.ensure_free(&[1 << 20, 2 << 20, 1000]), (1 << 20) + MIN_BLOCK);
        assert!(pool.last_error().unwrap().contains("refused"));
        assert_eq!(pool.stats().pinned_bytes, (1 << 20) + MIN_BLOCK);
        // No allocator: nothing pinned.
        assert_eq!(PinnedPool::new(1 << 30).ensure_free(&[1 << 20]), 0);
    }

    #[test]
    fn blocks_out_when_the_limit_drops_are_released_on_return() {
        let (pool, a) = pool(8 << 20);
        let x = pool.alloc(4 << 20);
        pool.set_limit(1 << 20);
        drop(x);
        assert_eq!(pool.stats().pinned_bytes, 0);
        assert_eq!(a.live.load(Ordering::SeqCst), 0);
    }

    /// A batch's buffer lengths (values, views, their bytes, validity) pinned ahead on a thread
    /// are the blocks a batch like it then takes, none pinned anew.
    #[test]
    fn blocks_pinned_ahead_on_a_thread_serve_a_batch_like_the_one_they_were_sized_by() {
        use arrow::array::{ArrayRef, Int64Array, StringViewArray};
        use arrow::datatypes::{DataType, Field, Schema};
        let long = "a string longer than twelve bytes";
        let strings: Vec<Option<&str>> = (0..20_000).map(|i| (i % 3 != 0).then_some(long)).collect();
        let schema = Arc::new(Schema::new(vec![
            Field::new("i", DataType::Int64, false),
            Field::new("s", DataType::Utf8View, true),
        ]));
        let columns: Vec<ArrayRef> = vec![
            Arc::new(Int64Array::from_iter_values(0..20_000)),
            Arc::new(StringViewArray::from(strings)),
        ];
        let batch = RecordBatch::try_new(schema, columns).unwrap();
        let lens = block_lens(&batch);
        // The values, the views, the views' bytes and their validity bits; no empty buffer.
        assert!(
            lens.contains(&(8 * 20_000)) && lens.contains(&(16 * 20_000)),
            "{lens:?}"
        );
        assert!(lens.contains(&20_000usize.div_ceil(8)), "{lens:?}");
        let long_bytes = long.len() * (20_000 - 20_000usize.div_ceil(3));
        assert!(lens.iter().sum::<usize>() >= 24 * 20_000 + long_bytes, "{lens:?}");
        assert!(lens.iter().all(|&l| l > 0));

        let (pool, a) = pool(64 << 20);
        let (tx, rx) = std::sync::mpsc::channel();
        let thread = pool.pin_ahead(lens.clone(), move |bytes, _| tx.send(bytes).unwrap());
        thread.expect("a thread").join().unwrap();
        let wanted: usize = lens.iter().map(|&l| class_size(l)).sum();
        assert_eq!(rx.recv().unwrap(), wanted);
        assert_eq!(a.live_bytes.load(Ordering::SeqCst), wanted);
        // A batch like it takes those blocks, and pins none of its own.
        let taken: Vec<HostBuffer> = lens.iter().map(|&l| pool.transfer_buffer(l)).collect();
        assert!(taken.iter().all(HostBuffer::is_pinned));
        let s = pool.stats();
        assert_eq!(
            (s.reused, s.allocated, s.free_bytes),
            (lens.len() as u64, lens.len() as u64, 0)
        );
    }

    /// A trim gives every free block back, once.
    #[test]
    fn a_trim_releases_every_free_block_once() {
        let (pool, a) = pool(64 << 20);
        let held: Vec<_> = (0..37).map(|i| pool.alloc((64 << 10) * (1 + i % 5))).collect();
        assert_eq!(a.live.load(Ordering::SeqCst), 37);
        drop(held);
        pool.trim();
        assert_eq!(a.live.load(Ordering::SeqCst), 0);
        assert_eq!(a.live_bytes.load(Ordering::SeqCst), 0);
        assert_eq!((pool.stats().pinned_bytes, pool.stats().free_bytes), (0, 0));
    }

    #[test]
    fn refused_allocations_give_heap_memory_and_say_why() {
        let a = Arc::new(CountingAllocator {
            fail_over: Some(1 << 20),
            ..Default::default()
        });
        let pool = PinnedPool::with_allocator(1 << 30, a.clone());
        let b = pool.alloc(2 << 20);
        assert!(!b.is_pinned());
        assert_eq!(pool.stats().pinned_bytes, 0, "the failed block is not counted");
        assert!(pool.last_error().unwrap().contains("refused"));
        assert!(pool.alloc(1000).is_pinned());
        // No allocator: heap memory.
        assert!(!PinnedPool::new(1 << 30).alloc(1000).is_pinned());
        assert!(pool.alloc(0).is_empty());
    }

    #[test]
    fn threads_share_the_pool_without_losing_blocks() {
        let (pool, a) = pool(64 << 20);
        std::thread::scope(|s| {
            for t in 0..8 {
                let pool = pool.clone();
                s.spawn(move || {
                    for i in 0..200 {
                        let len = MIN_BLOCK * (1 + (t + i) % 5);
                        let mut b = pool.alloc(len);
                        b.as_mut_slice()[len - 1] = t as u8;
                        let buffer = b.into_buffer();
                        assert_eq!(buffer[len - 1], t as u8);
                    }
                });
            }
        });
        let s = pool.stats();
        assert_eq!(s.free_bytes, s.pinned_bytes, "every block came back");
        assert_eq!(a.live_bytes.load(Ordering::SeqCst), s.pinned_bytes);
        assert!(s.reused > 0 && s.reused + s.allocated + s.unpinned == 1600, "{s:?}");
    }
}
