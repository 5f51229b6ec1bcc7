//! The host side of the MSD hybrid radix sort ([`Algorithm::Msd`](gpusort::plan::Algorithm::Msd);
//! kernels in `kernels/msd.cu`): gpusort's own family beside GRS and SRTS, whose batched
//! block-local sorts follow BPLG-BMCS (Diéguez, Amor & Doallo, J. Supercomputing 2017; see
//! `docs/papers.md`).
//!
//! The key is read from its most significant varying bit down. While a segment of rows holds
//! more than the block-local sort takes ([`MSD_LOCAL_CAP`] rows), it is split by the next
//! **partition digit** (up to [`MSD_MAX_DIGIT_BITS`] bits of one key word, as wide as the largest
//! segment needs): all such segments of one depth in one pass, every moved column going from one
//! buffer to the other. Then each **final segment** is sorted by one block on its remaining
//! digits (the LSD passes of the plan, cut below the digits already used), several small
//! segments of one depth to a block, and written to the final buffer.
//!
//! [`schedule`] decides all of this from the digit counts each partition pass reports. It runs
//! the passes through a callback, so the same schedule drives the GPU ([`Gpu::run_msd`], one
//! [`MsdRun`] step after another) and the host simulation of the tests.

mod schedule;

use cudarc::driver::{CudaSlice, DevicePtr, LaunchConfig, PushKernelArg};

use crate::shapes::{msd_local_smem, msd_scatter_smem};

pub use self::schedule::*;
use crate::error::{CudaSortError, Result};
use crate::gpu::Gpu;
use crate::kernels::{BLOCK, MSD_BINS, MSD_LOCAL_CAP, MSD_LOCAL_MAX_WORDS};
use crate::lanes::{LANE_DIGIT, LANE_IOTA, Lane, LaneSet, Role};
use crate::presorted::{OrderScan, Passes};
use crate::profile::Profile;
use crate::table::{DeviceTable, GpuSortPlan};

pub use crate::kernels::MSD_MAX_DIGIT_BITS;
use crate::kernels::{LANE_SKIP, MSD_LOCAL_BLOCK as LOCAL_BLOCK};

/// Rows per chunk of a partition pass over `rows` rows on a GPU of `sms` multiprocessors:
/// about four chunks per multiprocessor, whole tiles.
fn chunk_rows(rows: usize, sms: usize, tile: usize) -> usize {
    rows.div_ceil(4 * sms.max(1)).div_ceil(tile).max(1) * tile
}

/// Flattens kernel-parameter structs of u32 fields, for one upload.
fn words<const N: usize>(rows: impl IntoIterator<Item = [u32; N]>) -> Vec<u32> {
    let mut v: Vec<u32> = rows.into_iter().flatten().collect();
    if v.is_empty() {
        v.push(0);
    }
    v
}

/// One MSD sort under way: the lanes it moves (key words the passes read, the row index,
/// the columns when direct), what the launches read (kept until the sort is done) and the
/// profile. The sample sort (`sample.rs`) runs its partition scatters and block-local sorts
/// through it too.
pub(crate) struct MsdRun<'a> {
    pub(crate) gpu: &'a Gpu,
    pub(crate) set: LaneSet,
    /// Bytes a staged value takes in the scatters' shared memory.
    stage_width: usize,
    /// Device tables the launches read, freed once the sort has synchronized.
    pub(crate) keep: Vec<CudaSlice<u32>>,
    pub(crate) prof: Profile,
}

/// A partition pass's counts and their scan: per chunk and digit (or bucket), where its rows
/// go.
pub(crate) struct PartitionCounts {
    /// Digit bins of the pass's kernels (256 or 2048): index into [`MSD_BINS`].
    wide: usize,
    pub(crate) chunks: usize,
    pub(crate) chunk_table: u64,
    seg_table: u64,
    /// The counts, `hist_len` words, which the kernels write.
    pub(crate) hist: u64,
    hist_len: usize,
    /// Their exclusive scan ([`MsdRun::scan_counts`]).
    offsets: u64,
}

/// What a partition pass splits by: a word of `bits`-bit values at `src` (each row's value is
/// `(word >> shift) & mask`), and the key word lane it is, if it is one (staged once with the
/// digits).
pub(crate) struct PartitionDigit {
    pub(crate) src: u64,
    pub(crate) shift: u32,
    pub(crate) bits: u32,
    pub(crate) key_word: Option<usize>,
}

impl PartitionDigit {
    fn mask(&self) -> u32 {
        (1u32 << self.bits) - 1
    }
}

impl Gpu {
    /// The MSD sort of `table` following `plan` (see the module docs); returns the permutation
    /// when the index moved. The key must read at most [`MSD_LOCAL_MAX_WORDS`] words. Its
    /// buffers allocated, it waits for `order` and stops there, the table as it came, where the
    /// rows are already sorted or reversed.
    pub(crate) fn run_msd(
        &self,
        table: &mut DeviceTable,
        plan: &GpuSortPlan,
        direct: bool,
        needs_index: bool,
        order: &mut OrderScan<'_>,
    ) -> Result<Passes> {
        let n = table.num_rows;
        let local_rows = plan.switches.msd_local_rows;
        let mut run = match MsdRun::open(self, table, plan, (direct, needs_index), order, "an MSD sort")? {
            Ok(run) => run,
            Err(skipped) => return Ok(skipped),
        };
        // Partition digits of more than 8 bits only where their scatter fits the device.
        let wide_fits =
            msd_scatter_smem(true, self.tile, run.stage_width) <= self.kernels()?.smem.msd_scatter[1] as usize;
        let max_bits = if wide_fits {
            plan.switches.msd_max_bits
        } else {
            plan.switches.msd_max_bits.min(8)
        };
        let sched = schedule(n, &plan.passes, local_rows, max_bits, |level| run.partition(level))?;
        run.local_sorts(&sched, local_rows, plan.keep_keys)?;
        run.finish(table, sched.levels % 2).map(Passes::Ran)
    }
}

impl<'a> MsdRun<'a> {
    /// The start of `what` (the MSD sort or the sample sort), which ends in block-local sorts:
    /// refuses a key of more than [`MSD_LOCAL_MAX_WORDS`] words, takes the lanes
    /// ([`Self::start`]; `moves`: direct, needs the index), then waits for `order`. `Err` holds
    /// what to return where the rows were already in order (the table as it came).
    pub(crate) fn open(
        gpu: &'a Gpu,
        table: &mut DeviceTable,
        plan: &GpuSortPlan,
        moves: (bool, bool),
        order: &mut OrderScan<'_>,
        what: &str,
    ) -> Result<std::result::Result<Self, Passes>> {
        let words = plan.key_words().len();
        if words > MSD_LOCAL_MAX_WORDS {
            return Err(CudaSortError::Unsupported(format!(
                "{what} of a key of {words} words (at most {MSD_LOCAL_MAX_WORDS})"
            )));
        }
        let partitions = table.num_rows > plan.switches.msd_local_rows;
        let run = Self::start(gpu, table, plan, moves.0, moves.1, partitions)?;
        if let Some(found) = order.settle()? {
            run.set.restore_input(table);
            return Ok(Err(Passes::Skipped(found)));
        }
        Ok(Ok(run))
    }

    /// Takes the lanes out of `table`, each with its second buffer when there are partition
    /// passes (`partitions`), and the row index with its first.
    fn start(
        gpu: &'a Gpu,
        table: &mut DeviceTable,
        plan: &GpuSortPlan,
        direct: bool,
        needs_index: bool,
        partitions: bool,
    ) -> Result<Self> {
        let n = table.num_rows;
        let read: std::collections::BTreeSet<usize> = plan.passes.iter().map(|p| p.word).collect();
        let mut set = LaneSet::take(table, |w| read.contains(&w), needs_index, direct, false);
        for lane in set.lanes.iter_mut() {
            if partitions {
                lane.ensure(gpu, 1, n)?;
            }
            if lane.role == Role::Index {
                lane.ensure(gpu, 0, n)?;
            }
        }
        let stage_width = set.lanes.iter().map(|l| l.width).max().unwrap_or(4).clamp(4, 8);
        Ok(Self {
            gpu,
            set,
            stage_width,
            keep: vec![],
            prof: Profile::new(gpu)?,
        })
    }

    /// One partition pass (`level`): the digit counts of every chunk and their scan, the
    /// scatter of every lane to the other buffer, and where each new segment starts (the only
    /// download).
    fn partition(&mut self, level: &PartitionLevel) -> Result<Vec<u32>> {
        let lane = self.set.key_word(level.digit.word).expect("the digit's word is a lane");
        let digit = PartitionDigit {
            src: lane.ptr(level.depth % 2, self.gpu.stream()),
            shift: level.digit.shift,
            bits: level.digit.bits,
            key_word: Some(level.digit.word),
        };
        let counts = self.count_digits(&level.segments, &digit)?;
        self.scatter(level.depth, &digit, &counts)?;
        self.segment_starts(&level.segments, digit.bits, &counts)
    }

    /// `msd_count_*` over the chunks of the pass's segments, then the scan of the histogram.
    fn count_digits(&mut self, segments: &[Segment], digit: &PartitionDigit) -> Result<PartitionCounts> {
        let (gpu, s) = (self.gpu, self.gpu.stream());
        let counts = self.partition_tables(segments, (digit.bits > 8) as usize)?;
        // SAFETY: every chunk lies within the n rows of the digit word; the histogram holds
        // bins counts per chunk.
        unsafe {
            s.launch_builder(&gpu.kernels()?.msd_count[counts.wide])
                .arg(&counts.chunk_table)
                .arg(&digit.src)
                .arg(&digit.shift)
                .arg(&digit.mask())
                .arg(&counts.hist)
                .launch(chunk_grid(counts.chunks, 0))?;
        }
        self.prof.mark(gpu, "msd_count")?;
        self.scan_counts(&counts)?;
        Ok(counts)
    }

    /// The chunks of a partition pass over `segments` with `MSD_BINS[wide]` bins a chunk
    /// (`struct MsdChunk` in msd.cu: the chunk's segment at `pad0`), the segments' table and the
    /// histogram, uploaded or allocated and kept until the sort is done.
    pub(crate) fn partition_tables(&mut self, segments: &[Segment], wide: usize) -> Result<PartitionCounts> {
        let (gpu, s) = (self.gpu, self.gpu.stream());
        let rows: usize = segments.iter().map(|s| s.len as usize).sum();
        let sms = gpu.info().multiprocessors as usize;
        let (chunks, segs, hist_len) = chunks(segments, MSD_BINS[wide], chunk_rows(rows, sms, gpu.tile()));
        let chunk_table = s.clone_htod(&words(
            chunks
                .iter()
                .map(|c| [c.start, c.len, c.hist, c.stride, c.bias, c.seg, 0, 0]),
        ))?;
        let seg_table = s.clone_htod(&words(segs.iter().map(|x| [x[0], x[1], x[2], 0])))?;
        let hist = gpu.alloc_words(hist_len)?;
        let offsets = gpu.alloc_words(hist_len)?;
        let ptr = |b: &CudaSlice<u32>| b.device_ptr(s).0;
        let counts = PartitionCounts {
            wide,
            chunks: chunks.len(),
            chunk_table: ptr(&chunk_table),
            seg_table: ptr(&seg_table),
            hist: ptr(&hist),
            hist_len,
            offsets: ptr(&offsets),
        };
        self.keep.extend([chunk_table, seg_table, hist, offsets]);
        Ok(counts)
    }

    /// The exclusive scan of the counts the kernels wrote.
    pub(crate) fn scan_counts(&mut self, counts: &PartitionCounts) -> Result<()> {
        let (gpu, s) = (self.gpu, self.gpu.stream());
        let sums = gpu.alloc_words(counts.hist_len.div_ceil(gpu.tile()))?;
        gpu.exclusive_scan(counts.hist, counts.offsets, sums.device_ptr(s).0, counts.hist_len)?;
        self.prof.mark(gpu, "msd_scan")?;
        self.keep.push(sums);
        Ok(())
    }

    /// `msd_scatter_*`: every lane of every chunk to the other buffer, by the scanned counts of
    /// `digit`, the rows in buffer `depth % 2`.
    pub(crate) fn scatter(&mut self, depth: usize, digit: &PartitionDigit, counts: &PartitionCounts) -> Result<()> {
        let (gpu, s) = (self.gpu, self.gpu.stream());
        let p = depth % 2;
        let lane_table: Vec<Lane> = self
            .set
            .lanes
            .iter()
            .map(|l| {
                let mut flags = 0;
                if l.role == Role::Index && depth == 0 {
                    flags |= LANE_IOTA;
                }
                if digit.key_word.is_some_and(|w| l.role == Role::KeyWord(w)) {
                    flags |= LANE_DIGIT;
                }
                Lane {
                    src: if flags & LANE_IOTA != 0 { 0 } else { l.ptr(p, s) },
                    dst: l.ptr(1 - p, s),
                    width: l.width as u32,
                    flags,
                }
            })
            .collect();
        let lane_dev = s.clone_htod(&words(lane_table.iter().map(|l| l.as_words())))?;
        let (lanes_p, num_lanes) = (lane_dev.device_ptr(s).0, lane_table.len() as u32);
        let tile = gpu.tile();
        let dyn_smem = msd_scatter_smem(counts.wide == 1, tile, self.stage_width) as u32;
        // SAFETY: the lane table lists buffers of n rows; the offsets come from the scan of
        // the counts of the same digits.
        unsafe {
            s.launch_builder(&gpu.kernels()?.msd_scatter[counts.wide])
                .arg(&counts.chunk_table)
                .arg(&digit.src)
                .arg(&digit.shift)
                .arg(&digit.mask())
                .arg(&counts.offsets)
                .arg(&lanes_p)
                .arg(&num_lanes)
                .launch(chunk_grid(counts.chunks, dyn_smem))?;
        }
        self.prof.mark(gpu, "msd_scatter")?;
        self.keep.push(lane_dev);
        Ok(())
    }

    /// `msd_subsegments`: the first row of each of the `2^bits` digit values of each segment,
    /// downloaded for the schedule.
    pub(crate) fn segment_starts(
        &mut self,
        segments: &[Segment],
        bits: u32,
        counts: &PartitionCounts,
    ) -> Result<Vec<u32>> {
        let (gpu, s) = (self.gpu, self.gpu.stream());
        let values = 1u32 << bits;
        let num_segs = segments.len() as u32;
        let starts = gpu.alloc_words(num_segs as usize * values as usize)?;
        let starts_p = starts.device_ptr(s).0;
        // SAFETY: `starts` holds num_segs * values words; the offsets come from the scan.
        unsafe {
            s.launch_builder(&gpu.kernels()?.msd_subsegments)
                .arg(&counts.seg_table)
                .arg(&num_segs)
                .arg(&values)
                .arg(&counts.offsets)
                .arg(&starts_p)
                .launch(gpu.grid_for(num_segs as usize * values as usize))?;
        }
        let host = s.clone_dtoh(&starts)?;
        self.prof.mark(gpu, "msd_segments+host")?;
        self.keep.push(starts);
        Ok(host)
    }

    /// `msd_local`: every batch of final segments sorted by one block on its remaining digits
    /// and written to the final buffer (key words only with `keep_keys`).
    pub(crate) fn local_sorts(&mut self, sched: &MsdSchedule, local_rows: usize, keep_keys: bool) -> Result<()> {
        let started = std::time::Instant::now();
        let (batch_list, seg_starts) = batches(sched, local_rows);
        if batch_list.is_empty() {
            return Ok(());
        }
        let (gpu, s) = (self.gpu, self.gpu.stream());
        let (plan_rows, digit_table) = self.local_plans(sched);
        let max_words = sched.plans.iter().map(|d| d.words.len()).max().unwrap_or(0);
        let key_area = (4 * max_words).max(self.stage_width) * MSD_LOCAL_CAP;
        let dyn_smem = msd_local_smem(max_words, self.stage_width) as u32;
        let lane_table = self.local_lanes(sched.levels, keep_keys);
        let batch_dev = s.clone_htod(&words(
            batch_list
                .iter()
                .map(|b| [b.start, b.len, b.segs, b.seg_first, b.plan, b.src, 0, 0]),
        ))?;
        let plan_dev = s.clone_htod(&words(plan_rows))?;
        let digit_dev = s.clone_htod(&words(digit_table.iter().map(|&d| [d])))?;
        let seg_dev = s.clone_htod(&words(seg_starts.iter().map(|&x| [x])))?;
        let lane_dev = s.clone_htod(&words(lane_table.iter().map(|l| l.as_words())))?;
        self.prof.mark(gpu, "msd_local_tables")?;
        self.prof.note(|| {
            format!(
                "{} final segments in {} batches, tables on the host {:.3} ms",
                sched.finals.len(),
                batch_list.len(),
                started.elapsed().as_secs_f64() * 1e3
            )
        });
        let (num_lanes, key_area32) = (self.set.lanes.len() as u32, key_area as u32);
        let ptr = |b: &CudaSlice<u32>| b.device_ptr(s).0;
        let (b_p, p_p, d_p, s_p, l_p) = (
            ptr(&batch_dev),
            ptr(&plan_dev),
            ptr(&digit_dev),
            ptr(&seg_dev),
            ptr(&lane_dev),
        );
        // SAFETY: every batch lies within the n rows of every lane; plans, digits and
        // segment starts are the tables `batches` and `schedule` made.
        unsafe {
            s.launch_builder(&gpu.kernels()?.msd_local)
                .arg(&b_p)
                .arg(&p_p)
                .arg(&d_p)
                .arg(&s_p)
                .arg(&l_p)
                .arg(&num_lanes)
                .arg(&key_area32)
                .launch(LaunchConfig {
                    grid_dim: (batch_list.len() as u32, 1, 1),
                    block_dim: (LOCAL_BLOCK, 1, 1),
                    shared_mem_bytes: dyn_smem,
                })?;
        }
        self.prof.mark(gpu, "msd_local")?;
        self.keep.extend([batch_dev, plan_dev, digit_dev, seg_dev, lane_dev]);
        Ok(())
    }

    /// The block-local plan of each depth (`struct LocalPlan` in msd.cu: its key words as
    /// lane indices, its digits' count and first index) and the digits they index.
    fn local_plans(&self, sched: &MsdSchedule) -> (Vec<[u32; 8]>, Vec<u32>) {
        let lane_index = |w: usize| {
            let lanes = &self.set.lanes;
            lanes.iter().position(|l| l.role == Role::KeyWord(w)).unwrap() as u32
        };
        let mut digit_table: Vec<u32> = vec![];
        let mut plan_rows: Vec<[u32; 8]> = vec![];
        for d in &sched.plans {
            let mut row = [0u32; 8];
            row[0] = d.words.len() as u32;
            for (i, &w) in d.words.iter().enumerate() {
                row[1 + i] = lane_index(w);
            }
            row[5] = d.digits.len() as u32;
            row[6] = digit_table.len() as u32;
            digit_table.extend(
                d.digits
                    .iter()
                    .map(|&(slot, shift, bits)| slot as u32 | shift << 8 | bits << 16),
            );
            plan_rows.push(row);
        }
        (plan_rows, digit_table)
    }

    /// The block-local sort's lane table: every lane read from either buffer (a batch's rows
    /// are where its depth left them), written to the final buffer of `levels` partition
    /// passes; the row index made here when there was no partition pass, key words left
    /// unwritten unless `keep_keys`.
    fn local_lanes(&self, levels: usize, keep_keys: bool) -> Vec<Lane> {
        let s = self.gpu.stream();
        let mut table = vec![];
        for p in 0..2 {
            for l in &self.set.lanes {
                let mut flags = 0;
                if l.role == Role::Index && levels == 0 {
                    flags |= LANE_IOTA;
                }
                if l.key_word().is_some() && !keep_keys {
                    flags |= LANE_SKIP;
                }
                table.push(Lane {
                    src: if flags & LANE_IOTA != 0 { 0 } else { l.ptr(p, s) },
                    dst: l.ptr(levels % 2, s),
                    width: l.width as u32,
                    flags,
                });
            }
        }
        table
    }

    /// The final buffers back into the table, once the kernels that read the tables are done;
    /// returns the permutation when the index moved.
    pub(crate) fn finish(self, table: &mut DeviceTable, final_buf: usize) -> Result<Option<CudaSlice<u32>>> {
        let perm = self.set.restore(table, |_| Some(final_buf));
        // The tables must outlive the kernels that read them.
        self.gpu.stream().synchronize()?;
        drop(self.keep);
        self.prof.report()?;
        Ok(perm)
    }
}

/// A block per chunk of a partition pass, with `smem` bytes of dynamic shared memory.
fn chunk_grid(chunks: usize, smem: u32) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (chunks as u32, 1, 1),
        block_dim: (BLOCK, 1, 1),
        shared_mem_bytes: smem,
    }
}
