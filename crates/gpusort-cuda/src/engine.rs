//! The record sorts on the device: LSD radix passes of GRS or SRTS over key words already in
//! GPU memory, moving ByField columns or Hybrid row-major records **directly** (with the keys
//! in every pass) or **indirectly** (the row index moves; columns are gathered once at the end).
//!
//! A [`DeviceTable`] holds the rows: the key words (ByField, word 0 most significant), the
//! payload columns (ByField) and/or row-major records (Hybrid). [`Gpu::sort`] permutes it in
//! place following a [`GpuSortPlan`]: which passes (digits, least significant first), which
//! strategy, whether the key words and the permutation are wanted afterwards.
//!
//! Each pass reads the key word of its digit from where the last pass left it and writes every
//! moved column to its other buffer (two buffers per column, ping-pong). Which buffers each
//! pass reads and writes is worked out on the host first; all lane tables then go to the
//! device in one copy and the passes are launched back to back on one stream.
//!
//! SRTS's pass runs as one sweep with decoupled look-back (Adinets & Merrill's one-sweep radix
//! sort, kernels/onesweep.cu) when it can: digits of 5 to 8 bits and fewer than 2^30 rows
//! ([`onesweep_plan`]). One histogram read of each key word counts the digits of all its passes,
//! and each pass is then a single kernel that finds its tiles' digit offsets by looking back
//! over the tiles before them, where the paper's SRTS pass runs an upsweep (a second read of
//! the key word) and a spine before the downsweep: at 100M u32 keys on the H100 those two cost
//! ~0.19 ms of each ~1.03 ms pass. Passes of digits of up to 4 bits (16 bins), and every pass
//! of 2^30 rows or more, keep the three kernels.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering};

use cudarc::driver::{
    CudaContext, CudaEvent, CudaFunction, CudaSlice, CudaStream, DevicePtr, DeviceRepr, LaunchConfig, PushKernelArg,
    sys::{CUevent_flags, CUmemPool_attribute},
};
use gpusort::plan::{Algorithm, RadixPass, RecordMove, Strategy};

use crate::device::{self, DeviceInfo};
use crate::error::{CudaSortError, Result};
use crate::kernels::{
    CacheOutcome, KernelCache, KernelTuning, Kernels, LoadingKernels, MSD_LOCAL_CAP, MSD_LOCAL_MAX_WORDS,
    ONESWEEP_HIST_IPT, ONESWEEP_MAX_DIGITS, ONESWEEP_MAX_ROWS,
};
use crate::msd::MSD_MAX_DIGIT_BITS;

pub use crate::kernels::BLOCK;

/// Rows each thread of the gather kernels moves at once (`GATHER_ROWS` in gather.cu).
const GATHER_ROWS: usize = 8;

/// Rows of a `pack_rows` / `gather_unpack` tile (`PACK_ROWS` in gather.cu): one per thread.
const PACK_ROWS: u32 = 256;

/// The widest row of a packed gather group. On the H100 (10M rows of u32 columns, a random
/// permutation) one column gathered alone costs 0.16 ms; 20 columns gathered as 80-byte rows
/// 1.53 ms (0.077 ms a column); rows of 112 bytes are slower per column again (0.10 ms) and
/// 128-byte rows put every thread of a warp on one shared-memory bank.
pub const PACK_MAX_ROW_BYTES: usize = 80;

/// The fewest columns worth packing: two 4-byte columns gather faster one by one (0.32 ms
/// against 0.44 ms packed), four faster packed (0.51 ms against 0.64 ms).
pub const PACK_MIN_COLUMNS: usize = 3;

/// Groups of columns (indices into `widths`) that gather together as packed rows of at most
/// [`PACK_MAX_ROW_BYTES`] bytes, widest columns first so that every value sits at an offset
/// that is a multiple of its width; each group with its columns' offsets and its row width (a
/// multiple of 16). Groups of fewer than [`PACK_MIN_COLUMNS`] columns gather column by column.
pub fn pack_groups(widths: &[usize]) -> Vec<(Vec<(usize, usize)>, usize)> {
    let mut order: Vec<usize> = (0..widths.len()).collect();
    order.sort_by_key(|&k| std::cmp::Reverse(widths[k]));
    let mut groups: Vec<(Vec<(usize, usize)>, usize)> = vec![];
    let mut current: Vec<(usize, usize)> = vec![];
    let mut used = 0;
    for k in order {
        if used + widths[k] > PACK_MAX_ROW_BYTES && !current.is_empty() {
            groups.push((std::mem::take(&mut current), used.div_ceil(16) * 16));
            used = 0;
        }
        current.push((k, used));
        used += widths[k];
    }
    if !current.is_empty() {
        groups.push((current, used.div_ceil(16) * 16));
    }
    groups
}

/// Device bytes per row that a gather of columns of `widths` holds beyond the columns: the
/// widest column gathered alone, or (packed) the widest group's rows and gathered columns.
pub fn gather_bytes_per_row(widths: &[usize], pack: bool) -> usize {
    pack_groups(widths)
        .iter()
        .map(|(group, row_bytes)| {
            let sizes = group.iter().map(|&(k, _)| widths[k]);
            if pack && group.len() >= PACK_MIN_COLUMNS {
                row_bytes + sizes.sum::<usize>()
            } else {
                sizes.max().unwrap_or(0)
            }
        })
        .max()
        .unwrap_or(0)
}
/// Dynamic shared memory of a tile scatter (common.cuh `scatter_staged_tile`) of `tile` rows:
/// the slots' global positions, then the staging of values of `stage_width` bytes.
fn scatter_smem(tile: usize, stage_width: usize) -> u32 {
    (tile * 4 + tile * stage_width) as u32
}

/// Longest SRTS spine scanned by a single block.
const SINGLE_BLOCK_SPINE: usize = 16 * 1024;

/// The narrowest digit of a one-sweep pass: only the 256-bin pass is compiled, and digits of up
/// to 4 bits keep SRTS's 16-bin kernels.
pub const ONESWEEP_MIN_BITS: u32 = 5;

/// Words of the one-sweep state before its look-back table: word 0 is the tile counter; the
/// table starts 128 bytes in.
const ONESWEEP_HEADER_WORDS: usize = 32;

/// `n` as the row count kernels take (a u32): one sort holds at most 2^32 - 1 rows.
pub(crate) fn rows_u32(n: usize) -> Result<u32> {
    u32::try_from(n).map_err(|_| CudaSortError::Unsupported(format!("{n} rows in one sort (at most 2^32 - 1)")))
}

/// Words of the one-sweep state of a pass over `num_tiles` tiles: the header (tile counter)
/// and one look-back word per (tile, digit of 256). Zeroed before every pass.
pub(crate) fn onesweep_state_words(num_tiles: usize) -> usize {
    ONESWEEP_HEADER_WORDS + num_tiles * 256
}

/// One `onesweep_histogram` launch: up to [`ONESWEEP_MAX_DIGITS`] digit positions of key word
/// `word`, counted into the histogram slots `first_slot..first_slot + digits` (256 words each).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct HistLaunch {
    pub(crate) word: usize,
    pub(crate) first_slot: usize,
    pub(crate) digits: u32,
    /// Byte i: digit i's lowest bit.
    pub(crate) shifts: u32,
    /// Byte i: digit i's width in bits.
    pub(crate) widths: u32,
}

/// How SRTS's passes run as one sweep: the histogram launches (one per key word the one-sweep
/// passes read, more only for words of more than [`ONESWEEP_MAX_DIGITS`] such passes), and
/// each pass's histogram slot (where its digit offsets are after the scan), `None` for a pass
/// that runs the three kernels.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct OnesweepPlan {
    pub(crate) launches: Vec<HistLaunch>,
    pub(crate) slot: Vec<Option<usize>>,
}

impl OnesweepPlan {
    /// Histogram slots in all: one per one-sweep pass.
    pub(crate) fn slots(&self) -> usize {
        self.launches.iter().map(|l| l.digits as usize).sum()
    }
}

/// Whether a pass over `pass`'s digit can run as one sweep: only the 256-bin pass is compiled,
/// and digits of up to 4 bits keep SRTS's 16-bin kernels.
pub(crate) fn onesweep_digit(pass: &RadixPass) -> bool {
    (ONESWEEP_MIN_BITS..=8).contains(&pass.bits) && pass.shift + pass.bits <= 32
}

/// The one-sweep plan of `passes` over `n` rows, or `None` where every pass runs SRTS's three
/// kernels: no row, `n` of 2^30 rows or more (look-back values have 30 bits), or no digit of
/// [`ONESWEEP_MIN_BITS`] to 8 bits. Passes of other digits in a plan run the three kernels.
pub(crate) fn onesweep_plan(n: usize, passes: &[RadixPass]) -> Option<OnesweepPlan> {
    if n == 0 || n > ONESWEEP_MAX_ROWS || !passes.iter().any(onesweep_digit) {
        return None;
    }
    // Words in the order their first one-sweep pass comes.
    let mut words: Vec<usize> = vec![];
    for p in passes.iter().filter(|p| onesweep_digit(p)) {
        if !words.contains(&p.word) {
            words.push(p.word);
        }
    }
    let mut launches = vec![];
    let mut slot = vec![None; passes.len()];
    let mut next = 0;
    for w in words {
        let of_word: Vec<usize> = (0..passes.len())
            .filter(|&p| passes[p].word == w && onesweep_digit(&passes[p]))
            .collect();
        for chunk in of_word.chunks(ONESWEEP_MAX_DIGITS) {
            let mut launch = HistLaunch {
                word: w,
                first_slot: next,
                digits: chunk.len() as u32,
                shifts: 0,
                widths: 0,
            };
            for (i, &p) in chunk.iter().enumerate() {
                launch.shifts |= passes[p].shift << (8 * i);
                launch.widths |= passes[p].bits << (8 * i);
                slot[p] = Some(next);
                next += 1;
            }
            launches.push(launch);
        }
    }
    Some(OnesweepPlan { launches, slot })
}

/// What the one-sweep passes of a sort use: the digit offsets of every pass (256 words per
/// histogram slot), the tile counter and look-back table (zeroed before each pass), the grid.
struct OnesweepBufs {
    hist: CudaSlice<u32>,
    state: CudaSlice<u32>,
    grid: u32,
}

/// What the three-kernel SRTS passes of a sort use: block digit counts, the sums of a long
/// spine's chunks, the grid and each block's run of tiles.
struct SrtsBufs {
    counts: CudaSlice<u32>,
    spine_sums: CudaSlice<u32>,
    grid: u32,
    tiles_per_block: u32,
}

/// An opened GPU: a context, the stream sorts run on, and the compiled kernels.
#[derive(Debug)]
pub struct Gpu {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    /// Compiled and loaded in the background from [`Gpu::open`] on.
    kernels: LoadingKernels,
    info: DeviceInfo,
    tile: usize,
    /// The kernels' compile-time settings.
    tuning: KernelTuning,
    /// Threads of a one-sweep block (`ONESWEEP_BLOCK`).
    onesweep_block: u32,
    /// Rows of a one-sweep tile (`ONESWEEP_BLOCK` threads x `ONESWEEP_IPT` rows).
    onesweep_tile: usize,
    /// Segments of at most this many rows go to the MSD sort's block-local sort.
    msd_local_rows: AtomicUsize,
    /// Widest MSD partition digit.
    msd_max_bits: AtomicU32,
    /// Run SRTS's passes as one sweep where they can be ([`onesweep_plan`]).
    onesweep: AtomicBool,
    /// Move plain 4-byte lanes in pairs in the scatters (8-byte staging where a table has them).
    pair_lanes: AtomicBool,
    /// The device's stream-ordered memory pool (`CUmemoryPool` as an address), which keeps
    /// freed memory for the next allocation; `None` when the driver has none.
    mem_pool: Option<usize>,
}

/// A fixed-width ByField column on the device: `width` bytes (1, 2, 4, 8 or 16) per row.
#[derive(Debug)]
pub struct DeviceColumn {
    /// The rows.
    pub data: CudaSlice<u8>,
    /// Bytes per row.
    pub width: usize,
}

/// Row-major records on the device (the Hybrid layout): `bytes` per record, a multiple of 4.
#[derive(Debug)]
pub struct DeviceRecords {
    /// The records.
    pub data: CudaSlice<u8>,
    /// Bytes per record.
    pub bytes: usize,
}

/// Rows on the device: key words and payload.
#[derive(Debug)]
pub struct DeviceTable {
    /// Rows.
    pub num_rows: usize,
    /// Key words, ByField, word 0 most significant.
    pub keys: Vec<CudaSlice<u32>>,
    /// ByField payload columns.
    pub columns: Vec<DeviceColumn>,
    /// Hybrid payload: row-major records.
    pub records: Option<DeviceRecords>,
}

/// What a sort does.
#[derive(Debug, Clone, PartialEq)]
pub struct GpuSortPlan {
    /// Algorithm and record move.
    pub strategy: Strategy,
    /// Digit passes, least significant first (digits of at most 8 bits).
    pub passes: Vec<RadixPass>,
    /// Leave every key word that a pass reads in sorted order.
    pub keep_keys: bool,
    /// Return the permutation (sorted position -> input row).
    pub want_perm: bool,
    /// Indirect: gather groups of columns packed into rows ([`Gpu::gather_columns`]), which
    /// holds more device memory ([`gather_bytes_per_row`]).
    pub pack_gathers: bool,
}

/// What a sort returns.
#[derive(Debug)]
pub struct GpuSortResult {
    /// The permutation, when asked for (or when the strategy made one anyway).
    pub perm: Option<CudaSlice<u32>>,
    /// Time between the sort's first and last kernel, from device events.
    pub kernel_ms: f32,
}

/// Per-kernel device times, when `GPUSORT_PROFILE=1`: an event after every launch, summed by
/// kernel name at the end of a sort and printed to stderr.
pub(crate) struct Profile {
    marks: Option<std::cell::RefCell<Vec<(&'static str, CudaEvent)>>>,
}

impl Profile {
    pub(crate) fn new(gpu: &Gpu) -> Result<Self> {
        let on = std::env::var("GPUSORT_PROFILE").as_deref() == Ok("1");
        let marks = if on {
            let e = gpu.event()?;
            e.record(&gpu.stream)?;
            Some(std::cell::RefCell::new(vec![("start", e)]))
        } else {
            None
        };
        Ok(Self { marks })
    }

    pub(crate) fn mark(&self, gpu: &Gpu, name: &'static str) -> Result<()> {
        if let Some(m) = &self.marks {
            let e = gpu.event()?;
            e.record(&gpu.stream)?;
            m.borrow_mut().push((name, e));
        }
        Ok(())
    }

    pub(crate) fn report(&self) -> Result<()> {
        if let Some(m) = &self.marks {
            let m = m.borrow();
            if let Some((_, last)) = m.last() {
                last.synchronize()?;
            }
            let mut sums: Vec<(&str, f32, usize)> = vec![];
            for w in m.windows(2) {
                let t = w[0].1.elapsed_ms(&w[1].1)?;
                match sums.iter_mut().find(|s| s.0 == w[1].0) {
                    Some(s) => {
                        s.1 += t;
                        s.2 += 1;
                    }
                    None => sums.push((w[1].0, t, 1)),
                }
            }
            let line: Vec<String> = sums.iter().map(|(n, t, c)| format!("{n} {t:.3} ms/{c}")).collect();
            eprintln!("profile: {}", line.join(", "));
        }
        Ok(())
    }
}

/// A lane of the kernels' lane table (`struct Lane` in `kernels/common.cuh`).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Lane {
    pub(crate) src: u64,
    pub(crate) dst: u64,
    pub(crate) width: u32,
    pub(crate) flags: u32,
}
/// Marks with [`LANE_PAIR`] the first of every two plain 4-byte lanes next to each other (not
/// the digit word, not the row index's first pass), pairing from the front of each table: the
/// scatters move such lanes in pairs (common.cuh `stage_lane_pair`) when their staging has 8
/// bytes a row. Whether any lane was marked.
pub(crate) fn mark_lane_pairs(tables: &mut [Vec<Lane>]) -> bool {
    let plain4 = |l: &Lane| l.width == 4 && l.flags == 0;
    let mut any = false;
    for t in tables {
        let mut l = 0;
        while l + 1 < t.len() {
            if plain4(&t[l]) && plain4(&t[l + 1]) {
                t[l].flags |= LANE_PAIR;
                any = true;
                l += 2;
            } else {
                l += 1;
            }
        }
    }
    any
}

/// The lane's values are the row indices themselves (no source).
pub(crate) const LANE_IOTA: u32 = 1;
/// The lane is the key word of the pass's digit.
pub(crate) const LANE_DIGIT: u32 = 2;
/// The lane and the next move as a pair ([`mark_lane_pairs`]).
pub(crate) const LANE_PAIR: u32 = 8;

impl Lane {
    /// The lane as the six u32 words of the CUDA struct.
    pub(crate) fn as_words(&self) -> [u32; 6] {
        [
            self.src as u32,
            (self.src >> 32) as u32,
            self.dst as u32,
            (self.dst >> 32) as u32,
            self.width,
            self.flags,
        ]
    }
}

/// Hybrid records to move in a pass (`struct Records` in `kernels/common.cuh`).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
struct Records {
    src: u64,
    dst: u64,
    bytes: u32,
    piece: u32,
}
// SAFETY: plain old data with the layout of the CUDA struct.
unsafe impl DeviceRepr for Records {}

/// What the pass launchers of both families take: the passes, where each reads its digit,
/// the uploaded lane tables and records, and the dynamic shared memory of the scatters.
struct PassInputs<'a> {
    n: usize,
    passes: &'a [RadixPass],
    /// Each key word's buffer before the first pass (what the one-sweep histogram reads).
    word_src: &'a [u64],
    digit_src: &'a [u64],
    tables: &'a [Vec<Lane>],
    offsets: &'a [usize],
    lane_base: u64,
    recs: &'a [Records],
    /// Bytes a staged value takes in the scatters' shared memory (4 or 8).
    stage_width: usize,
    /// The dynamic shared memory of a GRS / SRTS scatter ([`scatter_smem`] of a tile).
    dyn_smem: u32,
}

impl PassInputs<'_> {
    /// The lane table of pass `p`: its device address and length.
    fn lanes(&self, p: usize) -> (u64, u32) {
        (self.lane_base + self.offsets[p] as u64, self.tables[p].len() as u32)
    }
}

/// A device buffer of either element type.
pub(crate) enum Buf {
    Words(CudaSlice<u32>),
    Bytes(CudaSlice<u8>),
}

impl Buf {
    pub(crate) fn ptr(&self, stream: &CudaStream) -> u64 {
        match self {
            Buf::Words(s) => s.device_ptr(stream).0,
            Buf::Bytes(s) => s.device_ptr(stream).0,
        }
    }
}

/// Something a pass moves, with its two buffers.
struct Item {
    width: usize,
    bufs: [Option<Buf>; 2],
    /// Which buffer holds the rows now; `None`: the row index not yet made (iota).
    cur: Option<usize>,
    /// Record bytes, for Hybrid records.
    record: Option<usize>,
}

impl Gpu {
    /// Opens device `ordinal`: a context, a stream, and the kernels (from `cache`, or
    /// compiled by NVRTC and stored there).
    pub fn open(ordinal: usize, cache: &KernelCache) -> Result<Self> {
        let (ctx, info) = device::open(ordinal)?;
        // Sorts order their work on their own stream; cudarc's per-buffer events are not needed.
        // SAFETY: every buffer of this context is used on `stream` or synchronized explicitly.
        unsafe { ctx.disable_event_tracking() };
        let stream = ctx.new_stream()?;
        let tuning = KernelTuning::from_env()?;
        let kernels = LoadingKernels::start(
            Arc::clone(&ctx),
            cache.clone(),
            tuning.programs(),
            info.arch(),
            info.nvrtc_version,
        );
        let msd_max_bits = match std::env::var("GPUSORT_MSD_BITS") {
            Ok(v) => v
                .parse::<u32>()
                .ok()
                .filter(|b| (1..=MSD_MAX_DIGIT_BITS).contains(b))
                .ok_or_else(|| {
                    CudaSortError::Unsupported(format!("GPUSORT_MSD_BITS={v} (1 to {MSD_MAX_DIGIT_BITS} bits)"))
                })?,
            Err(_) => MSD_MAX_DIGIT_BITS,
        };
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
            msd_local_rows: AtomicUsize::new(MSD_LOCAL_CAP),
            msd_max_bits: AtomicU32::new(msd_max_bits),
            onesweep: AtomicBool::new(std::env::var("GPUSORT_ONESWEEP").as_deref() != Ok("0")),
            pair_lanes: AtomicBool::new(std::env::var("GPUSORT_PAIR_LANES").as_deref() != Ok("0")),
            mem_pool,
        })
    }

    /// Segments of at most this many rows are sorted by the MSD sort's block-local sort
    /// (default and most: [`MSD_LOCAL_CAP`]).
    pub fn msd_local_rows(&self) -> usize {
        self.msd_local_rows.load(Ordering::Relaxed)
    }

    /// Sets [`Self::msd_local_rows`] (1 to [`MSD_LOCAL_CAP`]): smaller values make more
    /// partition passes (a knob for tests and tuning).
    pub fn set_msd_local_rows(&self, rows: usize) -> Result<()> {
        if !(1..=MSD_LOCAL_CAP).contains(&rows) {
            return Err(CudaSortError::Unsupported(format!(
                "MSD block-local sorts of {rows} rows (1 to {MSD_LOCAL_CAP})"
            )));
        }
        self.msd_local_rows.store(rows, Ordering::Relaxed);
        Ok(())
    }

    /// The widest MSD partition digit (default [`MSD_MAX_DIGIT_BITS`]; `GPUSORT_MSD_BITS`).
    pub fn msd_max_bits(&self) -> u32 {
        self.msd_max_bits.load(Ordering::Relaxed)
    }

    /// Sets [`Self::msd_max_bits`] (1 to [`MSD_MAX_DIGIT_BITS`]).
    pub fn set_msd_max_bits(&self, bits: u32) -> Result<()> {
        if !(1..=MSD_MAX_DIGIT_BITS).contains(&bits) {
            return Err(CudaSortError::Unsupported(format!(
                "MSD partition digits of {bits} bits (1 to {MSD_MAX_DIGIT_BITS})"
            )));
        }
        self.msd_max_bits.store(bits, Ordering::Relaxed);
        Ok(())
    }

    /// Whether SRTS's passes run as one sweep where they can ([`onesweep_plan`]; default on,
    /// off with `GPUSORT_ONESWEEP=0`).
    pub fn srts_onesweep(&self) -> bool {
        self.onesweep.load(Ordering::Relaxed)
    }

    /// Sets [`Self::srts_onesweep`] (off: every SRTS pass runs the three kernels, a knob for
    /// tests and comparisons).
    pub fn set_srts_onesweep(&self, on: bool) {
        self.onesweep.store(on, Ordering::Relaxed);
    }

    /// Whether the GRS, SRTS and one-sweep scatters move plain 4-byte lanes (u32 columns, the row
    /// index after the first pass, key words other than the digit's) two at a time, with 8 bytes
    /// a row of staging (default on, off with `GPUSORT_PAIR_LANES=0`).
    pub fn pair_lanes(&self) -> bool {
        self.pair_lanes.load(Ordering::Relaxed)
    }

    /// Sets [`Self::pair_lanes`] (a knob for tests and comparisons).
    pub fn set_pair_lanes(&self, on: bool) {
        self.pair_lanes.store(on, Ordering::Relaxed);
    }

    /// Rows per tile of the sort kernels.
    pub fn tile(&self) -> usize {
        self.tile
    }

    /// Rows per tile of the one-sweep pass.
    pub fn onesweep_tile(&self) -> usize {
        self.onesweep_tile
    }

    /// The kernels' compile-time settings (from the `GPUSORT_*` variables when opened).
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

    /// `0, 1, ..., n - 1` on the device.
    pub fn iota(&self, n: usize) -> Result<CudaSlice<u32>> {
        let n32 = rows_u32(n)?;
        let out = self.alloc_words(n)?;
        let p = out.device_ptr(&self.stream).0;
        // SAFETY: the kernel writes n words of `out`.
        unsafe {
            self.stream
                .launch_builder(&self.kernels()?.iota)
                .arg(&n32)
                .arg(&p)
                .launch(self.grid_for(n))?
        };
        Ok(out)
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

    /// Sorts `table` in place following `plan`.
    pub fn sort(&self, table: &mut DeviceTable, plan: &GpuSortPlan) -> Result<GpuSortResult> {
        let n = table.num_rows;
        rows_u32(n)?;
        if let Some(p) = plan
            .passes
            .iter()
            .find(|p| p.bits > 8 || p.bits == 0 || p.word >= table.keys.len())
        {
            return Err(CudaSortError::Unsupported(format!(
                "pass {p:?} (digits of 1 to 8 bits of existing words)"
            )));
        }
        if let Some(r) = &table.records
            && (r.bytes == 0 || r.bytes % 4 != 0)
        {
            return Err(CudaSortError::Unsupported(format!(
                "records of {} bytes (a multiple of 4 is needed)",
                r.bytes
            )));
        }
        let kernels = self.kernels()?;
        if let Some(c) = table.columns.iter().find(|c| kernels.gather_for(c.width).is_none()) {
            return Err(CudaSortError::Unsupported(format!(
                "a column of {} bytes per row",
                c.width
            )));
        }
        let start = self.event()?;
        let end = self.event()?;
        start.record(&self.stream)?;
        let direct = plan.strategy.record_move == RecordMove::Direct;
        let msd = plan.strategy.algorithm == Algorithm::Msd
            && plan
                .passes
                .iter()
                .map(|p| p.word)
                .collect::<std::collections::BTreeSet<_>>()
                .len()
                <= MSD_LOCAL_MAX_WORDS;
        // The MSD sort moves ByField columns directly but gathers Hybrid records once.
        let gathers_records = !direct || (msd && table.records.is_some());
        let needs_index = plan.want_perm || !direct || gathers_records;
        let mut perm = None;
        if n > 1 && !plan.passes.is_empty() {
            perm = if msd {
                self.run_msd(table, plan, direct, needs_index)?
            } else if plan.strategy.algorithm == Algorithm::Msd {
                // Keys of more words than a block-local sort holds: SRTS.
                let srts = GpuSortPlan {
                    strategy: Strategy::new(Algorithm::Srts, plan.strategy.record_move),
                    ..plan.clone()
                };
                self.run_passes(table, &srts, direct, needs_index)?
            } else {
                self.run_passes(table, plan, direct, needs_index)?
            };
            if gathers_records {
                let p = perm.as_ref().expect("indirect sorts make a permutation");
                if direct {
                    self.gather_records(table, p)?;
                } else {
                    self.gather_payload(table, p, plan.pack_gathers)?;
                }
            }
        }
        if plan.want_perm && perm.is_none() {
            perm = Some(self.iota(n)?);
        }
        end.record(&self.stream)?;
        end.synchronize()?;
        Ok(GpuSortResult {
            perm: if plan.want_perm { perm } else { None },
            kernel_ms: start.elapsed_ms(&end)?,
        })
    }

    /// Runs the passes; returns the permutation when the index moved.
    fn run_passes(
        &self,
        table: &mut DeviceTable,
        plan: &GpuSortPlan,
        direct: bool,
        needs_index: bool,
    ) -> Result<Option<CudaSlice<u32>>> {
        let n = table.num_rows;
        let s = &self.stream;
        let num_words = table.keys.len();
        let passes = &plan.passes;
        // Items: key words, the row index, ByField columns, Hybrid records.
        let mut items: Vec<Item> = vec![];
        for k in table.keys.drain(..) {
            items.push(Item {
                width: 4,
                bufs: [Some(Buf::Words(k)), None],
                cur: Some(0),
                record: None,
            });
        }
        let index_item = items.len();
        items.push(Item {
            width: 4,
            bufs: [None, None],
            cur: None,
            record: None,
        });
        let num_columns = if direct { table.columns.len() } else { 0 };
        let columns: Vec<DeviceColumn> = if direct {
            table.columns.drain(..).collect()
        } else {
            vec![]
        };
        for c in columns {
            items.push(Item {
                width: c.width,
                bufs: [Some(Buf::Bytes(c.data)), None],
                cur: Some(0),
                record: None,
            });
        }
        let records_item = if direct && let Some(r) = table.records.take() {
            items.push(Item {
                width: 0,
                bufs: [Some(Buf::Bytes(r.data)), None],
                cur: Some(0),
                record: Some(r.bytes),
            });
            Some(items.len() - 1)
        } else {
            None
        };
        let word_src: Vec<u64> = items[..num_words]
            .iter()
            .map(|w| w.bufs[0].as_ref().unwrap().ptr(s))
            .collect();
        let word_used_later = |w: usize, p: usize| passes[p + 1..].iter().any(|q| q.word == w);
        let word_sorted = |w: usize| passes.iter().any(|q| q.word == w);
        // Work out, pass by pass, what moves from which buffer to which.
        let mut tables: Vec<Vec<Lane>> = vec![];
        let mut recs: Vec<Records> = vec![];
        let mut digit_src: Vec<u64> = vec![];
        let mut max_width = 4usize;
        for (p, pass) in passes.iter().enumerate() {
            let w = &items[pass.word];
            digit_src.push(w.bufs[w.cur.unwrap()].as_ref().unwrap().ptr(s));
            let mut lanes = vec![];
            let mut rec = Records::default();
            for (i, item) in items.iter_mut().enumerate() {
                let moves = if i < num_words {
                    word_used_later(i, p) || (plan.keep_keys && word_sorted(i))
                } else if i == index_item {
                    needs_index
                } else {
                    direct
                };
                if !moves {
                    continue;
                }
                let to = match item.cur {
                    Some(c) => 1 - c,
                    None => 0,
                };
                if item.bufs[to].is_none() {
                    let bytes = match item.record {
                        Some(b) => n * b,
                        None => n * item.width,
                    };
                    item.bufs[to] = Some(if i < num_words || i == index_item {
                        Buf::Words(self.alloc_words(n)?)
                    } else {
                        Buf::Bytes(self.alloc_bytes(bytes)?)
                    });
                }
                let src = item.cur.map_or(0, |c| item.bufs[c].as_ref().unwrap().ptr(s));
                let dst = item.bufs[to].as_ref().unwrap().ptr(s);
                match item.record {
                    Some(bytes) => {
                        let piece = [16, 8, 4].into_iter().find(|p| bytes % p == 0).unwrap() as u32;
                        rec = Records {
                            src,
                            dst,
                            bytes: bytes as u32,
                            piece,
                        };
                    }
                    None => {
                        max_width = max_width.max(item.width);
                        let mut flags = if item.cur.is_none() { LANE_IOTA } else { 0 };
                        if i == pass.word {
                            flags |= LANE_DIGIT;
                        }
                        lanes.push(Lane {
                            src,
                            dst,
                            width: item.width as u32,
                            flags,
                        });
                    }
                }
                item.cur = Some(to);
            }
            tables.push(lanes);
            recs.push(rec);
        }
        // 16-byte rows are staged as two 8-byte halves; 4-byte lanes in pairs need 8 bytes too.
        let stage_width = if self.pair_lanes() && mark_lane_pairs(&mut tables) {
            8
        } else {
            max_width.clamp(4, 8)
        };
        // All lane tables in one upload.
        let mut flat: Vec<u64> = vec![];
        let mut offsets = vec![];
        for t in &tables {
            offsets.push(flat.len() * 8);
            for l in t {
                flat.extend([l.src, l.dst, ((l.flags as u64) << 32) | l.width as u64]);
            }
        }
        let lane_buf = s.clone_htod(&flat)?;
        let lane_base = lane_buf.device_ptr(s).0;
        let dyn_smem = scatter_smem(self.tile, stage_width);
        let inputs = PassInputs {
            n,
            passes,
            word_src: &word_src,
            digit_src: &digit_src,
            tables: &tables,
            offsets: &offsets,
            lane_base,
            recs: &recs,
            stage_width,
            dyn_smem,
        };
        match plan.strategy.algorithm {
            Algorithm::Grs => self.grs(&inputs)?,
            Algorithm::Srts | Algorithm::Msd => self.srts(&inputs)?,
        }
        // Put the final buffers back.
        let mut items = items.into_iter();
        for _ in 0..num_words {
            let mut item = items.next().unwrap();
            match item.bufs[item.cur.unwrap()].take() {
                Some(Buf::Words(k)) => table.keys.push(k),
                _ => unreachable!("key words are words"),
            }
        }
        let mut index = items.next().unwrap();
        let perm = match index.cur {
            Some(c) => match index.bufs[c].take() {
                Some(Buf::Words(p)) => Some(p),
                _ => unreachable!("the index is words"),
            },
            None => None,
        };
        for _ in 0..num_columns {
            let mut item = items.next().unwrap();
            let width = item.width;
            match item.bufs[item.cur.unwrap()].take() {
                Some(Buf::Bytes(data)) => table.columns.push(DeviceColumn { data, width }),
                _ => unreachable!("columns are bytes"),
            }
        }
        if records_item.is_some() {
            let mut item = items.next().unwrap();
            let bytes = item.record.unwrap();
            match item.bufs[item.cur.unwrap()].take() {
                Some(Buf::Bytes(data)) => table.records = Some(DeviceRecords { data, bytes }),
                _ => unreachable!("records are bytes"),
            }
        }
        // The lane tables must outlive the kernels that read them.
        s.synchronize()?;
        drop(lane_buf);
        Ok(perm)
    }

    /// GRS: per pass, tile ranks and histograms, a scan of the histograms, the tile scatter.
    fn grs(&self, x: &PassInputs<'_>) -> Result<()> {
        let (n, passes, digit_src, recs) = (x.n, x.passes, x.digit_src, x.recs);
        let s = &self.stream;
        let k = self.kernels()?;
        let num_tiles = n.div_ceil(self.tile);
        let ranks = unsafe { s.alloc::<u16>(n) }?;
        let hist = self.alloc_words(256 * num_tiles)?;
        let scanned = self.alloc_words(256 * num_tiles)?;
        let chunk_sums = self.alloc_words((256 * num_tiles).div_ceil(self.tile))?;
        let (ranks_p, hist_p, scanned_p, sums_p) = (
            ranks.device_ptr(s).0,
            hist.device_ptr(s).0,
            scanned.device_ptr(s).0,
            chunk_sums.device_ptr(s).0,
        );
        let n32 = n as u32;
        let tiles32 = num_tiles as u32;
        let prof = Profile::new(self)?;
        for (p, pass) in passes.iter().enumerate() {
            let (rank_fn, bins) = k.grs_rank.for_bits(pass.bits);
            let (scatter_fn, _) = k.grs_scatter.for_bits(pass.bits);
            let mask = (1u32 << pass.bits) - 1;
            let tiles_cfg = LaunchConfig {
                grid_dim: (tiles32, 1, 1),
                block_dim: (BLOCK, 1, 1),
                shared_mem_bytes: 0,
            };
            // SAFETY: kernels read n rows of the digit word and write n ranks and
            // bins * num_tiles counts.
            unsafe {
                s.launch_builder(rank_fn)
                    .arg(&n32)
                    .arg(&digit_src[p])
                    .arg(&pass.shift)
                    .arg(&mask)
                    .arg(&ranks_p)
                    .arg(&hist_p)
                    .arg(&tiles32)
                    .launch(tiles_cfg)?
            };
            prof.mark(self, "grs_rank")?;
            self.exclusive_scan(hist_p, scanned_p, sums_p, bins as usize * num_tiles)?;
            prof.mark(self, "grs_scan")?;
            let (lanes, num_lanes) = x.lanes(p);
            // SAFETY: the lane table lists buffers of n rows; offsets come from the scan.
            unsafe {
                s.launch_builder(scatter_fn)
                    .arg(&n32)
                    .arg(&digit_src[p])
                    .arg(&pass.shift)
                    .arg(&mask)
                    .arg(&ranks_p)
                    .arg(&hist_p)
                    .arg(&scanned_p)
                    .arg(&tiles32)
                    .arg(&lanes)
                    .arg(&num_lanes)
                    .arg(&recs[p])
                    .launch(LaunchConfig {
                        shared_mem_bytes: x.dyn_smem,
                        ..tiles_cfg
                    })?
            };
            prof.mark(self, "grs_scatter")?;
        }
        prof.report()
    }

    /// Exclusive scan of `len` words at `src` into `dst` (GRS phase 2; MSD partitions).
    pub(crate) fn exclusive_scan(&self, src: u64, dst: u64, sums: u64, len: usize) -> Result<()> {
        let s = &self.stream;
        let k = self.kernels()?;
        let chunks = len.div_ceil(self.tile) as u32;
        let len32 = len as u32;
        let cfg = |blocks: u32| LaunchConfig {
            grid_dim: (blocks, 1, 1),
            block_dim: (BLOCK, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: `src` and `dst` hold len words, `sums` one per chunk.
        unsafe {
            s.launch_builder(&k.scan_reduce)
                .arg(&src)
                .arg(&len32)
                .arg(&sums)
                .launch(cfg(chunks))?;
            s.launch_builder(&k.scan_spine).arg(&sums).arg(&chunks).launch(cfg(1))?;
            s.launch_builder(&k.scan_down)
                .arg(&src)
                .arg(&len32)
                .arg(&sums)
                .arg(&dst)
                .launch(cfg(chunks))?;
        }
        Ok(())
    }

    /// Persistent blocks for SRTS: as many as fit on the device at once, each with a run of
    /// at least one tile.
    fn srts_grid(&self, func: &CudaFunction, dyn_smem: u32, num_tiles: usize) -> Result<(u32, u32)> {
        let per_sm = func
            .occupancy_max_active_blocks_per_multiprocessor(BLOCK, dyn_smem as usize, None)?
            .max(1);
        let want = (self.info.multiprocessors * per_sm) as usize;
        let tiles_per_block = num_tiles.div_ceil(want.min(num_tiles).max(1));
        let grid = num_tiles.div_ceil(tiles_per_block);
        Ok((grid as u32, tiles_per_block as u32))
    }

    /// SRTS: each pass whose digit [`onesweep_plan`] allows (with [`Self::srts_onesweep`] on)
    /// as one sweep, the others (digits of up to 4 bits, or every pass at 2^30 rows or more)
    /// as the paper's three kernels: block digit counts, the top-level scan, the downsweep.
    fn srts(&self, x: &PassInputs<'_>) -> Result<()> {
        let plan = if self.srts_onesweep() {
            onesweep_plan(x.n, x.passes)
        } else {
            None
        };
        let prof = Profile::new(self)?;
        let mut one = match &plan {
            Some(plan) => Some(self.onesweep_prepare(x, plan, &prof)?),
            None => None,
        };
        let three = match &plan {
            Some(plan) if plan.slot.iter().all(Option::is_some) => None,
            _ => Some(self.srts_prepare(x)?),
        };
        for p in 0..x.passes.len() {
            match (
                plan.as_ref().and_then(|plan| plan.slot[p]),
                one.as_mut(),
                three.as_ref(),
            ) {
                (Some(slot), Some(one), _) => self.onesweep_pass(x, p, slot, one, &prof)?,
                (_, _, Some(three)) => self.srts_pass(x, p, three, &prof)?,
                _ => unreachable!("a pass without a one-sweep slot has the three kernels' buffers"),
            }
        }
        prof.report()
    }

    /// Persistent blocks of the one-sweep pass: as many as fit on the device at once (the grid
    /// the prototype measured), at most one per tile.
    fn onesweep_grid(&self, dyn_smem: u32, num_tiles: usize) -> Result<u32> {
        let per_sm = self
            .kernels()?
            .onesweep_pass
            .occupancy_max_active_blocks_per_multiprocessor(self.onesweep_block, dyn_smem as usize, None)?
            .max(1);
        Ok(((self.info.multiprocessors * per_sm) as usize).min(num_tiles).max(1) as u32)
    }

    /// The one-sweep passes' digit offsets (kernels/onesweep.cu): one histogram read per key
    /// word counts the digits of all its one-sweep passes, one scan turns each pass's counts
    /// into its digits' first positions. Passes whose digit is constant are not planned (the
    /// planner drops them), so none is looked for here: that would need a download.
    fn onesweep_prepare(&self, x: &PassInputs<'_>, plan: &OnesweepPlan, prof: &Profile) -> Result<OnesweepBufs> {
        let n = x.n;
        let s = &self.stream;
        let k = self.kernels()?;
        let num_tiles = n.div_ceil(self.onesweep_tile);
        let mut hist = self.alloc_words(256 * plan.slots())?;
        s.memset_zeros(&mut hist)?;
        let state = self.alloc_words(onesweep_state_words(num_tiles))?;
        let hist_p = hist.device_ptr(s).0;
        let n32 = n as u32;
        let cfg = |blocks: u32| LaunchConfig {
            grid_dim: (blocks, 1, 1),
            block_dim: (BLOCK, 1, 1),
            shared_mem_bytes: 0,
        };
        let hist_per_sm = k
            .onesweep_histogram
            .occupancy_max_active_blocks_per_multiprocessor(BLOCK, 0, None)?
            .max(1);
        let hist_grid = ((self.info.multiprocessors * hist_per_sm) as usize)
            .min(n.div_ceil(BLOCK as usize * ONESWEEP_HIST_IPT))
            .max(1) as u32;
        for l in &plan.launches {
            let dst = hist_p + (l.first_slot * 256 * 4) as u64;
            // SAFETY: the kernel reads n words of the key word and adds into `digits` zeroed
            // slots of 256 words inside `hist`.
            unsafe {
                s.launch_builder(&k.onesweep_histogram)
                    .arg(&n32)
                    .arg(&x.word_src[l.word])
                    .arg(&l.shifts)
                    .arg(&l.digits)
                    .arg(&l.widths)
                    .arg(&dst)
                    .launch(cfg(hist_grid))?
            };
            prof.mark(self, "onesweep_histogram")?;
        }
        let (slots, no_constant_flags) = (plan.slots() as u32, 0u64);
        // SAFETY: one block per 256-word slot of `hist`; n > 0; a null `constant` is not written.
        unsafe {
            s.launch_builder(&k.onesweep_scan)
                .arg(&hist_p)
                .arg(&n32)
                .arg(&no_constant_flags)
                .launch(cfg(slots))?
        };
        prof.mark(self, "onesweep_scan")?;
        Ok(OnesweepBufs {
            grid: self.onesweep_grid(scatter_smem(self.onesweep_tile, x.stage_width), num_tiles)?,
            hist,
            state,
        })
    }

    /// Pass `p` as one sweep: the tile counter and look-back table zeroed, then one
    /// `onesweep_pass_b8` over the tiles, with the downsweep's lane table, records and shared
    /// memory, its digit offsets from histogram slot `slot`.
    fn onesweep_pass(
        &self,
        x: &PassInputs<'_>,
        p: usize,
        slot: usize,
        b: &mut OnesweepBufs,
        prof: &Profile,
    ) -> Result<()> {
        let s = &self.stream;
        let pass = &x.passes[p];
        let num_tiles = x.n.div_ceil(self.onesweep_tile);
        let (n32, tiles32, mask) = (x.n as u32, num_tiles as u32, (1u32 << pass.bits) - 1);
        let (lanes, num_lanes) = x.lanes(p);
        let offsets = b.hist.device_ptr(s).0 + (slot * 256 * 4) as u64;
        let state_p = b.state.device_ptr(s).0;
        let (counter_p, lookback_p) = (state_p, state_p + (ONESWEEP_HEADER_WORDS * 4) as u64);
        // Stream-ordered: after the previous pass, before this one.
        s.memset_zeros(&mut b.state)?;
        prof.mark(self, "onesweep_clear")?;
        // SAFETY: the kernel reads n rows of the digit word and the pass's 256 digit offsets;
        // the tile counter and num_tiles * 256 look-back words are zeroed; the lane table lists
        // buffers of n rows; n < 2^30 (onesweep_plan).
        unsafe {
            s.launch_builder(&self.kernels()?.onesweep_pass)
                .arg(&n32)
                .arg(&x.digit_src[p])
                .arg(&pass.shift)
                .arg(&mask)
                .arg(&tiles32)
                .arg(&offsets)
                .arg(&counter_p)
                .arg(&lookback_p)
                .arg(&lanes)
                .arg(&num_lanes)
                .arg(&x.recs[p])
                .launch(LaunchConfig {
                    grid_dim: (b.grid, 1, 1),
                    block_dim: (self.onesweep_block, 1, 1),
                    shared_mem_bytes: scatter_smem(self.onesweep_tile, x.stage_width),
                })?
        };
        prof.mark(self, "onesweep_pass")
    }

    /// The three-kernel SRTS pass's grid and buffers: block counts and the long spine's sums.
    fn srts_prepare(&self, x: &PassInputs<'_>) -> Result<SrtsBufs> {
        let num_tiles = x.n.div_ceil(self.tile);
        let (grid, tiles_per_block) = self.srts_grid(&self.kernels()?.srts_downsweep.b8, x.dyn_smem, num_tiles)?;
        Ok(SrtsBufs {
            counts: self.alloc_words(256 * grid as usize)?,
            spine_sums: self.alloc_words((256 * grid as usize).div_ceil(self.tile))?,
            grid,
            tiles_per_block,
        })
    }

    /// Pass `p` as the paper's SRTS: block digit counts, the top-level scan, the downsweep.
    fn srts_pass(&self, x: &PassInputs<'_>, p: usize, b: &SrtsBufs, prof: &Profile) -> Result<()> {
        let s = &self.stream;
        let k = self.kernels()?;
        let pass = &x.passes[p];
        let num_tiles = x.n.div_ceil(self.tile);
        let (n32, tiles32) = (x.n as u32, num_tiles as u32);
        let (grid, tiles_per_block) = (b.grid, b.tiles_per_block);
        let counts_p = b.counts.device_ptr(s).0;
        let spine_sums_p = b.spine_sums.device_ptr(s).0;
        let cfg = |blocks: u32, smem: u32| LaunchConfig {
            grid_dim: (blocks, 1, 1),
            block_dim: (BLOCK, 1, 1),
            shared_mem_bytes: smem,
        };
        let (up, bins) = k.srts_upsweep.for_bits(pass.bits);
        let (down, _) = k.srts_downsweep.for_bits(pass.bits);
        let mask = (1u32 << pass.bits) - 1;
        let len = bins * grid;
        let (lanes, num_lanes) = x.lanes(p);
        // Upsweep and downsweep share their first arguments: rows, digit word, digit, tiles
        // and the counts.
        let sweep = |f| {
            let mut b = s.launch_builder(f);
            b.arg(&n32)
                .arg(&x.digit_src[p])
                .arg(&pass.shift)
                .arg(&mask)
                .arg(&tiles_per_block)
                .arg(&tiles32)
                .arg(&counts_p);
            b
        };
        // SAFETY: the kernels read n rows of the digit word; counts hold bins * grid words;
        // the lane table lists buffers of n rows.
        unsafe { sweep(up).launch(cfg(grid, 0))? };
        prof.mark(self, "srts_upsweep")?;
        // Top-level scan: one block for short spines; the three-kernel scan (chunk sums,
        // a one-block scan of the sums, chunk scans) when a single block would be slow.
        if len as usize <= SINGLE_BLOCK_SPINE {
            // SAFETY: counts hold `len` words.
            unsafe {
                s.launch_builder(&k.srts_spine)
                    .arg(&counts_p)
                    .arg(&len)
                    .launch(cfg(1, 0))?
            };
        } else {
            self.exclusive_scan(counts_p, counts_p, spine_sums_p, len as usize)?;
        }
        prof.mark(self, "srts_spine")?;
        // SAFETY: as above.
        unsafe {
            sweep(down)
                .arg(&lanes)
                .arg(&num_lanes)
                .arg(&x.recs[p])
                .launch(cfg(grid, x.dyn_smem))?
        };
        prof.mark(self, "srts_downsweep")
    }

    /// Rows `perm[0..rows]` of a column of `width`-byte rows, in a new buffer.
    pub fn gather_column(
        &self,
        src: &CudaSlice<u8>,
        width: usize,
        perm: &CudaSlice<u32>,
        rows: usize,
    ) -> Result<CudaSlice<u8>> {
        let s = &self.stream;
        let f = self
            .kernels()?
            .gather_for(width)
            .ok_or_else(|| CudaSortError::Unsupported(format!("a column of {width} bytes per row")))?;
        let out = self.alloc_bytes(rows * width)?;
        let (src, dst, perm_p, n32) = (
            src.device_ptr(s).0,
            out.device_ptr(s).0,
            perm.device_ptr(s).0,
            rows as u32,
        );
        // SAFETY: `perm` holds at least `rows` indices of rows of `src`; `out` holds `rows` rows.
        unsafe {
            s.launch_builder(f)
                .arg(&n32)
                .arg(&src)
                .arg(&perm_p)
                .arg(&dst)
                .launch(self.grid_for(rows.div_ceil(GATHER_ROWS)))?
        };
        Ok(out)
    }

    /// Bits `offset + perm[i]` of a bitmap for `i < rows`, as ceil(rows / 32) little-endian
    /// words (an Arrow bitmap).
    pub fn gather_bitmap(
        &self,
        bits: &CudaSlice<u8>,
        offset: u32,
        perm: &CudaSlice<u32>,
        rows: usize,
    ) -> Result<CudaSlice<u8>> {
        let s = &self.stream;
        let out = self.alloc_bytes(rows.div_ceil(32) * 4)?;
        let (src, dst, perm_p, n32) = (
            bits.device_ptr(s).0,
            out.device_ptr(s).0,
            perm.device_ptr(s).0,
            rows as u32,
        );
        // SAFETY: `perm` holds `rows` indices of bits of `bits`; `out` holds ceil(rows / 32) words.
        unsafe {
            s.launch_builder(&self.kernels()?.gather_bits)
                .arg(&n32)
                .arg(&src)
                .arg(&offset)
                .arg(&perm_p)
                .arg(&dst)
                .launch(self.grid_for(rows.div_ceil(32) * 32))?
        };
        Ok(out)
    }

    /// Bit `bit` of `rows` u32 words, as ceil(rows / 32) little-endian words (an Arrow bitmap).
    pub fn unpack_bits(&self, words: &CudaSlice<u8>, bit: u32, rows: usize) -> Result<CudaSlice<u8>> {
        let s = &self.stream;
        let out = self.alloc_bytes(rows.div_ceil(32) * 4)?;
        let (src, dst, n32) = (words.device_ptr(s).0, out.device_ptr(s).0, rows as u32);
        // SAFETY: `words` holds at least `rows` words; `out` holds ceil(rows / 32) words.
        unsafe {
            s.launch_builder(&self.kernels()?.unpack_validity)
                .arg(&n32)
                .arg(&src)
                .arg(&bit)
                .arg(&dst)
                .launch(self.grid_for(rows.div_ceil(32) * 32))?
        };
        Ok(out)
    }

    /// Queues the device-to-device copies `ranges` (source, destination, bytes) on the sort
    /// stream as one kernel launch instead of one copy call each: assembling 21 columns from
    /// 27 segments took 6 ms as 567 copies, most of it per-copy overhead.
    ///
    /// # Safety
    /// Each source holds its bytes, each destination has room for them, and no destination
    /// overlaps another range.
    pub unsafe fn copy_ranges(&self, ranges: &[(u64, u64, usize)]) -> Result<()> {
        if ranges.is_empty() {
            return Ok(());
        }
        let s = &self.stream;
        let table: Vec<u64> = ranges.iter().flat_map(|&(a, b, n)| [a, b, n as u64]).collect();
        // Freed in stream order, after the kernel.
        let table_dev = s.clone_htod(&table)?;
        let largest = ranges.iter().map(|r| r.2).max().unwrap_or(0);
        let threads = 256u32;
        let x = largest.div_ceil(threads as usize * 16 * 4).clamp(1, 64) as u32;
        let y = ranges.len().min(65_535) as u32;
        let (table_p, count) = (table_dev.device_ptr(s).0, ranges.len() as u32);
        // SAFETY: the table lists `count` ranges; the rest is the caller's contract.
        unsafe {
            s.launch_builder(&self.kernels()?.copy_ranges)
                .arg(&table_p)
                .arg(&count)
                .launch(LaunchConfig {
                    grid_dim: (x, y, 1),
                    block_dim: (threads, 1, 1),
                    shared_mem_bytes: 0,
                })?
        };
        Ok(())
    }

    /// One u32 lane of validity words from up to 32 bitmaps `(bytes, bit offset of row 0)`:
    /// bit `j` of word `i` is row `i`'s validity in bitmap `j`.
    pub fn pack_bits(&self, bitmaps: &[(&CudaSlice<u8>, u32)], rows: usize) -> Result<CudaSlice<u8>> {
        assert!(bitmaps.len() <= 32, "at most 32 bitmaps per lane");
        let s = &self.stream;
        let refs: Vec<u64> = bitmaps
            .iter()
            .flat_map(|(b, o)| [b.device_ptr(s).0, *o as u64])
            .collect();
        let refs_dev = s.clone_htod(&refs)?;
        let out = self.alloc_bytes(rows * 4)?;
        let (refs_p, dst, n32, count) = (
            refs_dev.device_ptr(s).0,
            out.device_ptr(s).0,
            rows as u32,
            bitmaps.len() as u32,
        );
        // SAFETY: `refs` lists `count` bitmaps of at least `rows` bits; `out` holds `rows` words.
        unsafe {
            s.launch_builder(&self.kernels()?.pack_validity)
                .arg(&n32)
                .arg(&refs_p)
                .arg(&count)
                .arg(&dst)
                .launch(self.grid_for(rows))?
        };
        // The reference table must outlive the kernel.
        s.synchronize()?;
        Ok(out)
    }

    /// The indirect strategy's record move: every column (and the records) gathered once.
    fn gather_payload(&self, table: &mut DeviceTable, perm: &CudaSlice<u32>, pack: bool) -> Result<()> {
        let n = table.num_rows;
        self.gather_columns(&mut table.columns, n, perm, n, pack)?;
        self.gather_records(table, perm)
    }

    /// Replaces every column of `cols` (each of `src_rows` rows) by its rows `perm[0..rows]`.
    /// Columns gather in the groups of [`pack_groups`]: with `pack`, a group of at least
    /// [`PACK_MIN_COLUMNS`] is packed into row-major rows that are then fetched once per row
    /// (gather.cu's `pack_rows` and `gather_unpack`); the others, and every column when few
    /// rows are kept (a top-k), gather one by one. A group's sources are freed once it is
    /// gathered, so the memory held beyond the columns is [`gather_bytes_per_row`].
    pub fn gather_columns(
        &self,
        cols: &mut [DeviceColumn],
        src_rows: usize,
        perm: &CudaSlice<u32>,
        rows: usize,
        pack: bool,
    ) -> Result<()> {
        let s = &self.stream;
        let prof = Profile::new(self)?;
        let widths: Vec<usize> = cols.iter().map(|c| c.width).collect();
        // Packing reads and writes every source row: not worth it for a few rows kept.
        let pack = pack && rows >= src_rows / 4 && rows > 0;
        for (group, row_bytes) in pack_groups(&widths) {
            if !pack || group.len() < PACK_MIN_COLUMNS {
                for &(k, _) in &group {
                    cols[k].data = self.gather_column(&cols[k].data, cols[k].width, perm, rows)?;
                    prof.mark(self, "gather_column")?;
                }
                continue;
            }
            let packed = self.alloc_bytes(src_rows * row_bytes)?;
            let mut dsts = vec![];
            for &(k, _) in &group {
                dsts.push(self.alloc_bytes(rows * cols[k].width)?);
            }
            let table = |ptrs: Vec<u64>| -> Vec<u64> {
                group
                    .iter()
                    .zip(ptrs)
                    .flat_map(|(&(k, offset), p)| [p, cols[k].width as u64 | (offset as u64) << 32])
                    .collect()
            };
            let srcs = s.clone_htod(&table(
                group.iter().map(|&(k, _)| cols[k].data.device_ptr(s).0).collect(),
            ))?;
            let outs = s.clone_htod(&table(dsts.iter().map(|d| d.device_ptr(s).0).collect()))?;
            let (srcs_p, outs_p, packed_p, perm_p) = (
                srcs.device_ptr(s).0,
                outs.device_ptr(s).0,
                packed.device_ptr(s).0,
                perm.device_ptr(s).0,
            );
            let (num, rb) = (group.len() as u32, row_bytes as u32);
            let cfg = |n: usize| LaunchConfig {
                grid_dim: (
                    n.div_ceil(PACK_ROWS as usize)
                        .clamp(1, self.info.multiprocessors as usize * 8) as u32,
                    1,
                    1,
                ),
                block_dim: (PACK_ROWS, 1, 1),
                // The tile, then the column table (16 bytes a column).
                shared_mem_bytes: PACK_ROWS * rb + 16 * num,
            };
            // SAFETY: every source column holds src_rows rows of its width and every output
            // `rows`; `packed` holds src_rows rows of row_bytes; perm holds `rows` indices
            // below src_rows; the tables list the group's columns with offsets inside a row.
            unsafe {
                s.launch_builder(&self.kernels()?.pack_rows)
                    .arg(&(src_rows as u32))
                    .arg(&srcs_p)
                    .arg(&num)
                    .arg(&rb)
                    .arg(&packed_p)
                    .launch(cfg(src_rows))?;
                prof.mark(self, "pack_rows")?;
                s.launch_builder(&self.kernels()?.gather_unpack)
                    .arg(&(rows as u32))
                    .arg(&packed_p)
                    .arg(&rb)
                    .arg(&perm_p)
                    .arg(&outs_p)
                    .arg(&num)
                    .launch(cfg(rows))?;
            }
            prof.mark(self, "gather_unpack")?;
            // The tables, the rows and the sources are freed in stream order, after the kernels.
            drop((srcs, outs, packed));
            for (&(k, _), d) in group.iter().zip(dsts) {
                cols[k].data = d;
            }
        }
        prof.report()
    }

    /// Hybrid records gathered once through the permutation, a group of threads per record.
    fn gather_records(&self, table: &mut DeviceTable, perm: &CudaSlice<u32>) -> Result<()> {
        let n = table.num_rows;
        let s = &self.stream;
        let perm_p = perm.device_ptr(s).0;
        let n32 = n as u32;
        if let Some(r) = table.records.as_mut() {
            let out = self.alloc_bytes(n * r.bytes)?;
            let piece = [16u32, 8, 4].into_iter().find(|p| r.bytes % *p as usize == 0).unwrap();
            let bytes = r.bytes as u32;
            let (src, dst) = (r.data.device_ptr(s).0, out.device_ptr(s).0);
            let pieces = n * (r.bytes / piece as usize);
            // SAFETY: src and dst hold n records; perm holds n indices below n.
            unsafe {
                s.launch_builder(&self.kernels()?.gather_records)
                    .arg(&n32)
                    .arg(&src)
                    .arg(&perm_p)
                    .arg(&dst)
                    .arg(&bytes)
                    .arg(&piece)
                    .launch(self.grid_for(pieces.div_ceil(GATHER_ROWS)))?
            };
            r.data = out;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lane_pairs_are_two_plain_four_byte_lanes_side_by_side() {
        let lane = |width, flags| Lane {
            width,
            flags,
            ..Lane::default()
        };
        let marked = |tables: &[Vec<Lane>]| -> Vec<Vec<bool>> {
            tables
                .iter()
                .map(|t| t.iter().map(|l| l.flags & LANE_PAIR != 0).collect())
                .collect()
        };
        // Key word (the digit), three u32 columns: the first two pair, the third moves alone.
        let mut t = vec![vec![lane(4, LANE_DIGIT), lane(4, 0), lane(4, 0), lane(4, 0)]];
        assert!(mark_lane_pairs(&mut t));
        assert_eq!(marked(&t), [[false, true, false, false]]);
        // Four u32 columns: two pairs.
        let mut t = vec![vec![
            lane(4, LANE_DIGIT),
            lane(4, 0),
            lane(4, 0),
            lane(4, 0),
            lane(4, 0),
        ]];
        assert!(mark_lane_pairs(&mut t));
        assert_eq!(marked(&t), [[false, true, false, true, false]]);
        // The row index's first pass is no plain lane; nor is a u32 next to a u64.
        let mut t = vec![
            vec![lane(4, LANE_DIGIT), lane(4, LANE_IOTA), lane(4, 0)],
            vec![lane(4, 0), lane(8, 0), lane(4, 0)],
        ];
        assert!(!mark_lane_pairs(&mut t));
        assert_eq!(marked(&t), [[false; 3], [false; 3]]);
        // One pass with a pair is enough (the staging is one size for all passes).
        let mut t = vec![
            vec![lane(4, LANE_DIGIT), lane(4, LANE_IOTA)],
            vec![lane(4, LANE_DIGIT), lane(4, 0), lane(4, 0)],
        ];
        assert!(mark_lane_pairs(&mut t));
        assert_eq!(marked(&t), [vec![false, false], vec![false, true, false]]);
        // The flag is a bit of its own.
        assert_eq!(LANE_PAIR & (LANE_IOTA | LANE_DIGIT), 0);
    }

    #[test]
    fn row_counts_above_u32_are_refused() {
        assert_eq!(rows_u32(0).unwrap(), 0);
        assert_eq!(rows_u32(u32::MAX as usize).unwrap(), u32::MAX);
        let err = rows_u32(u32::MAX as usize + 1).unwrap_err();
        assert!(matches!(err, CudaSortError::Unsupported(_)), "{err:?}");
        assert!(err.to_string().contains("4294967296 rows"), "{err}");
    }

    #[test]
    fn pack_groups_fill_rows_widest_first() {
        // 20 u32 columns: one 80-byte row.
        let g = pack_groups(&[4; 20]);
        assert_eq!(g.len(), 1);
        assert_eq!(g[0].1, 80);
        assert_eq!(
            g[0].0.iter().map(|c| c.1).collect::<Vec<_>>(),
            (0..20).map(|i| 4 * i).collect::<Vec<_>>()
        );
        // Mixed widths: every column once, offsets aligned to the width, rows within bounds.
        let widths = [1, 16, 4, 8, 2, 16, 16, 16, 16, 8, 4, 4, 1, 2];
        let groups = pack_groups(&widths);
        let mut seen: Vec<usize> = groups.iter().flat_map(|g| g.0.iter().map(|c| c.0)).collect();
        seen.sort();
        assert_eq!(seen, (0..widths.len()).collect::<Vec<_>>());
        for (cols, row_bytes) in &groups {
            assert!(*row_bytes <= PACK_MAX_ROW_BYTES && row_bytes % 16 == 0);
            let mut end = 0;
            for &(k, offset) in cols {
                assert_eq!(offset % widths[k], 0, "column {k} at {offset}");
                assert_eq!(offset, end);
                end += widths[k];
            }
            assert!(end <= *row_bytes);
        }
        assert!(pack_groups(&[]).is_empty());
        assert_eq!(pack_groups(&[2]), vec![(vec![(0, 0)], 16)]);
    }

    fn pass(word: usize, shift: u32, bits: u32) -> RadixPass {
        RadixPass { word, shift, bits }
    }

    #[test]
    fn onesweep_runs_only_digits_of_5_to_8_bits_below_2_pow_30_rows() {
        let eight = gpusort::plan::radix_passes(&[u32::MAX], 8);
        assert_eq!(eight.len(), 4);
        for n in [1, 2, 4095, 4096, 4097, 100_000_000, (1 << 30) - 1] {
            assert!(onesweep_plan(n, &eight).is_some(), "{n} rows");
        }
        assert_eq!(onesweep_plan(1 << 30, &eight), None);
        assert_eq!(onesweep_plan(u32::MAX as usize, &eight), None);
        assert_eq!(onesweep_plan(0, &eight), None);
        assert_eq!(onesweep_plan(10, &[]), None);
        // 4-bit digits (the paper's) keep the 16-bin three-kernel pass; so does any plan with
        // one digit of 1 to 4 bits among 8-bit ones.
        assert_eq!(onesweep_plan(1000, &gpusort::plan::radix_passes(&[u32::MAX], 4)), None);
        assert_eq!(onesweep_plan(1000, &[pass(0, 0, 4), pass(0, 4, 3)]), None);
        for bits in 1..=8 {
            let passes = gpusort::plan::radix_passes(&[u32::MAX], bits);
            let plan = onesweep_plan(1000, &passes);
            assert_eq!(plan.is_some(), bits >= ONESWEEP_MIN_BITS, "{bits}-bit digits");
            if let Some(plan) = plan {
                // At most 5 bits: 5, 5, 5, 5, 4, 4, 4; the 4-bit passes run the three kernels.
                for (p, q) in passes.iter().enumerate() {
                    assert_eq!(plan.slot[p].is_some(), q.bits >= ONESWEEP_MIN_BITS, "{bits}: {q:?}");
                }
                assert_eq!(plan.slots(), plan.slot.iter().flatten().count());
            }
        }
        // A narrow digit among 8-bit ones: only that pass runs the three kernels.
        let plan = onesweep_plan(1000, &[pass(1, 0, 8), pass(1, 8, 8), pass(0, 0, 3)]).unwrap();
        assert_eq!(plan.slot, vec![Some(0), Some(1), None]);
        assert_eq!(plan.launches.len(), 1);
        assert_eq!((plan.launches[0].word, plan.launches[0].digits), (1, 2));
        // What the engine would reject anyway: wider digits, digits past the word's end.
        assert_eq!(onesweep_plan(1000, &[pass(0, 0, 9)]), None);
        assert_eq!(onesweep_plan(1000, &[pass(0, 28, 8)]), None);
    }

    #[test]
    fn onesweep_counts_each_words_digits_in_one_histogram_read() {
        // Three words, least significant (word 2) first; word 1 has 17 varying bits: digits of
        // 6, 6 and 5 bits (masks differ within the launch).
        let passes = gpusort::plan::radix_passes(&[0xff, 0x1ffff << 3, u32::MAX], 8);
        let plan = onesweep_plan(5000, &passes).unwrap();
        assert_eq!(
            plan.launches,
            vec![
                HistLaunch {
                    word: 2,
                    first_slot: 0,
                    digits: 4,
                    shifts: 0x1810_0800,
                    widths: 0x0808_0808,
                },
                HistLaunch {
                    word: 1,
                    first_slot: 4,
                    digits: 3,
                    shifts: (3 + 12) << 16 | (3 + 6) << 8 | 3,
                    widths: 0x05_06_06,
                },
                HistLaunch {
                    word: 0,
                    first_slot: 7,
                    digits: 1,
                    shifts: 0,
                    widths: 8,
                },
            ]
        );
        assert_eq!(plan.slot, (0..8).map(Some).collect::<Vec<_>>());
        assert_eq!(plan.slots(), 8);
        // Every pass has its own slot, in the launch of its word, at its digit's index there.
        for (p, q) in passes.iter().enumerate() {
            let l = plan
                .launches
                .iter()
                .find(|l| {
                    l.word == q.word
                        && (l.first_slot..l.first_slot + l.digits as usize).contains(&plan.slot[p].unwrap())
                })
                .unwrap();
            let i = plan.slot[p].unwrap() - l.first_slot;
            assert_eq!((l.shifts >> (8 * i)) & 0xff, q.shift);
            assert_eq!((l.widths >> (8 * i)) & 0xff, q.bits);
        }
        // More than four digits of one word (narrow digits), and a word's passes apart: every
        // launch counts at most four positions of one word, slots stay distinct.
        let passes = [
            pass(1, 0, 5),
            pass(0, 0, 8),
            pass(1, 5, 5),
            pass(1, 10, 5),
            pass(1, 15, 5),
            pass(1, 20, 5),
            pass(1, 25, 7),
        ];
        let plan = onesweep_plan(10, &passes).unwrap();
        assert_eq!(
            plan.launches
                .iter()
                .map(|l| (l.word, l.first_slot, l.digits))
                .collect::<Vec<_>>(),
            vec![(1, 0, 4), (1, 4, 2), (0, 6, 1)]
        );
        assert_eq!(
            plan.slot,
            vec![Some(0), Some(6), Some(1), Some(2), Some(3), Some(4), Some(5)]
        );
        assert_eq!(plan.launches[1].shifts, 25 << 8 | 20);
        assert_eq!(plan.launches[1].widths, 7 << 8 | 5);
    }

    #[test]
    fn onesweep_state_holds_a_counter_and_a_look_back_word_per_tile_and_digit() {
        assert_eq!(onesweep_state_words(1), ONESWEEP_HEADER_WORDS + 256);
        // 100M rows in tiles of 4096: 24415 tiles, ~25 MB of look-back words (0.25 byte a row,
        // within the scratch that backend.rs counts per row).
        let tiles = 100_000_000usize.div_ceil(4096);
        assert_eq!(tiles, 24_415);
        assert_eq!(onesweep_state_words(tiles) * 4, 128 + 24_415 * 1024);
        // The look-back table starts 128 bytes in, after the tile counter.
        const { assert!(ONESWEEP_HEADER_WORDS * 4 == 128) };
        assert!(onesweep_state_words(tiles) * 4 <= 100_000_000 / 256 * 1024);
    }

    #[test]
    fn gather_memory_counts_the_packed_rows() {
        // 20 u32 columns: 80-byte rows plus 80 bytes of gathered columns, or one column.
        assert_eq!(gather_bytes_per_row(&[4; 20], true), 160);
        assert_eq!(gather_bytes_per_row(&[4; 20], false), 4);
        // Two columns gather one by one, packed or not.
        assert_eq!(gather_bytes_per_row(&[8, 4], true), 8);
        assert_eq!(gather_bytes_per_row(&[], true), 0);
    }
}
