//! The host side of sample sort ([`Algorithm::Sample`](gpusort::plan::Algorithm::Sample);
//! kernels in `kernels/sample.cu`): the comparison sort that Bandyopadhyay & Sahni extend to
//! records beside GRS and SRTS ("Sorting Large Multifield Records on a GPU", section IV, after
//! Leischner, Osipov & Sanders' GPU sample sort), direct or indirect.
//!
//! Each **level** splits every segment still larger than one block ([`MSD_LOCAL_CAP`](crate::kernels::MSD_LOCAL_CAP) rows) by
//! [`SAMPLE_SPLITTERS`] splitters drawn from a sample of its own keys: `sample_splitters` sorts
//! the sample in shared memory, `sample_classify` writes each row's bucket and counts the
//! buckets of each chunk, the counts are scanned, and the MSD sort's partition scatter moves
//! every lane to its bucket (all of this through `msd::MsdRun`, so the record moves are the MSD
//! sort's: stable, tile by tile through shared memory). Buckets of keys equal to a splitter are
//! sorted already; the others still too large are split again at the next level
//! ([`sample_schedule`]). Adjacent final buckets are joined into segments of at most a block,
//! and each is sorted on the whole key by the MSD sort's block-local sort; a bucket of equal
//! keys larger than a block is only copied to the final buffer, in pieces.

use cudarc::driver::{CudaSlice, DevicePtr, DeviceRepr, LaunchConfig, PushKernelArg};

use crate::error::{CudaSortError, Result};
use crate::gpu::Gpu;
use crate::kernels::{BLOCK, MSD_LOCAL_MAX_WORDS, SAMPLE_SIZE, SAMPLE_SPLITTERS};
use crate::msd::{FinalSegment, LocalDigits, MsdKey, MsdRun, MsdSchedule, PartitionDigit, Segment};
use crate::msd::{covered, split_segments};
use crate::presorted::{OrderScan, Passes};
use crate::table::{DeviceTable, GpuSortPlan};

/// Buckets of one level: below, equal to and between the splitters (`2 * 127 + 1`), within the
/// 256 bins of the partition scatter.
const BUCKETS: usize = 256;

/// Levels after which a sample sort stops splitting and fails: with 127 splitters a level
/// divides a segment of distinct keys about a hundredfold, and keys equal to a splitter leave
/// at the level that draws them, so no input of fewer than 2^32 rows needs half as many.
pub const SAMPLE_MAX_LEVELS: usize = 8;

/// How far down the splitters' search tree a segment of `len` rows is split (`depth[seg]` of
/// `sample_classify`): `2^depth` buckets between splitters, enough that they hold half a block
/// (`local_rows / 2`) on average, at most all 128 of [`SAMPLE_SPLITTERS`]. The half leaves room
/// for the buckets' spread, so that few of them need a level more.
pub fn search_depth(len: usize, local_rows: usize) -> u32 {
    let buckets = len.div_ceil((local_rows / 2).max(1)).max(2);
    let most = (SAMPLE_SPLITTERS + 1).trailing_zeros();
    (usize::BITS - (buckets - 1).leading_zeros()).clamp(1, most)
}

/// The device addresses of a level's key words (`struct SampleKey` in sample.cu), by value.
#[repr(C)]
#[derive(Clone, Copy)]
struct SampleWords([u64; MSD_LOCAL_MAX_WORDS]);

// SAFETY: a plain array of device addresses, laid out as the kernel's struct of 4 pointers.
unsafe impl DeviceRepr for SampleWords {}

impl Gpu {
    /// The sample sort of `table` following `plan` (see the module docs); returns the
    /// permutation when the index moved. The key must read at most [`MSD_LOCAL_MAX_WORDS`]
    /// words. Its buffers allocated, it waits for `order` and stops there, the table as it
    /// came, where the rows are already sorted or reversed.
    pub(crate) fn run_sample(
        &self,
        table: &mut DeviceTable,
        plan: &GpuSortPlan,
        direct: bool,
        needs_index: bool,
        order: &mut OrderScan<'_>,
    ) -> Result<Passes> {
        let n = table.num_rows;
        let key = MsdKey::new(&plan.passes);
        let local_rows = plan.switches.msd_local_rows;
        let run = match MsdRun::open(self, table, plan, (direct, needs_index), order, "a sample sort")? {
            Ok(run) => run,
            Err(skipped) => return Ok(skipped),
        };
        let mut level = SampleLevels {
            bucket: self.alloc_words(if n > local_rows { n } else { 1 })?,
            run,
            words: plan.key_words(),
            local_rows,
        };
        let whole = key.local_digits(key.start(), &plan.passes);
        // The host's part of the schedule, between levels (for the profile).
        let (mut host, mut last) = (std::time::Duration::ZERO, std::time::Instant::now());
        let sched = sample_schedule(n, local_rows, whole, |depth, segs| {
            host += last.elapsed();
            let starts = level.split(depth, segs);
            last = std::time::Instant::now();
            starts
        })?;
        host += last.elapsed();
        let SampleLevels { mut run, bucket, .. } = level;
        run.prof.note(|| {
            format!(
                "{} levels, schedule on the host {:.3} ms",
                sched.levels,
                host.as_secs_f64() * 1e3
            )
        });
        run.local_sorts(&sched, local_rows, plan.keep_keys)?;
        run.keep.push(bucket);
        run.finish(table, sched.levels % 2).map(Passes::Ran)
    }
}

/// The levels of one sample sort: the MSD run that moves the rows, each row's bucket and the
/// key words (most significant first).
struct SampleLevels<'a> {
    run: MsdRun<'a>,
    bucket: CudaSlice<u32>,
    words: Vec<usize>,
    local_rows: usize,
}

impl SampleLevels<'_> {
    /// One level: the splitters of each of `segments` (their rows in buffer `depth % 2`), each
    /// row's bucket and the chunks' counts, their scan, the scatter to the other buffer, and
    /// where each bucket of each segment starts (the only download).
    fn split(&mut self, depth: usize, segments: &[Segment]) -> Result<Vec<u32>> {
        let (gpu, s) = (self.run.gpu, self.run.gpu.stream());
        let key = self.key_at(depth);
        let num_words = self.words.len() as u32;
        let splitters = self.splitters(segments, key, num_words)?;
        let depths: Vec<u32> = segments
            .iter()
            .map(|g| search_depth(g.len as usize, self.local_rows))
            .collect();
        let depth_dev = s.clone_htod(&depths)?;
        let counts = self.run.partition_tables(segments, 0)?;
        let (sp_p, bucket_p) = (splitters.device_ptr(s).0, self.bucket.device_ptr(s).0);
        let depth_p = depth_dev.device_ptr(s).0;
        // SAFETY: every chunk lies within the n rows of the key words and of `bucket`; the
        // splitter table holds SAMPLE_SPLITTERS x words words of each chunk's segment; the
        // counts hold 256 bins a chunk.
        unsafe {
            s.launch_builder(&gpu.kernels()?.sample_classify)
                .arg(&counts.chunk_table)
                .arg(&key)
                .arg(&num_words)
                .arg(&sp_p)
                .arg(&depth_p)
                .arg(&bucket_p)
                .arg(&counts.hist)
                .launch(LaunchConfig {
                    grid_dim: (counts.chunks as u32, 1, 1),
                    block_dim: (BLOCK, 1, 1),
                    shared_mem_bytes: 0,
                })?;
        }
        self.run.prof.mark(gpu, "sample_classify")?;
        self.run.keep.extend([splitters, depth_dev]);
        self.run.scan_counts(&counts)?;
        let digit = PartitionDigit {
            src: bucket_p,
            shift: 0,
            bits: BUCKETS.trailing_zeros(),
            key_word: None,
        };
        self.run.scatter(depth, &digit, &counts)?;
        self.run.segment_starts(segments, digit.bits, &counts)
    }

    /// The key words' addresses in buffer `depth % 2`.
    fn key_at(&self, depth: usize) -> SampleWords {
        let mut ptrs = [0u64; MSD_LOCAL_MAX_WORDS];
        for (p, &w) in ptrs.iter_mut().zip(&self.words) {
            let lane = self.run.set.key_word(w).expect("every key word is a lane");
            *p = lane.ptr(depth % 2, self.run.gpu.stream());
        }
        SampleWords(ptrs)
    }

    /// `sample_splitters`: each segment's splitters, word-major.
    fn splitters(&mut self, segments: &[Segment], key: SampleWords, num_words: u32) -> Result<CudaSlice<u32>> {
        let (gpu, s) = (self.run.gpu, self.run.gpu.stream());
        let seg_dev = s.clone_htod(&segments.iter().flat_map(|g| [g.start, g.len]).collect::<Vec<u32>>())?;
        let splitters = gpu.alloc_words(segments.len() * num_words as usize * SAMPLE_SPLITTERS)?;
        let (seg_p, sp_p) = (seg_dev.device_ptr(s).0, splitters.device_ptr(s).0);
        let smem = (num_words as usize * 4 + 2) * SAMPLE_SIZE;
        // SAFETY: one block per segment, each within the n rows of the key words; the table
        // holds SAMPLE_SPLITTERS x words words per segment; `smem` is what the kernel indexes
        // (under the 48 KiB every block may use: at most 4 words).
        unsafe {
            s.launch_builder(&gpu.kernels()?.sample_splitters)
                .arg(&seg_p)
                .arg(&key)
                .arg(&num_words)
                .arg(&sp_p)
                .launch(LaunchConfig {
                    grid_dim: (segments.len() as u32, 1, 1),
                    block_dim: (BLOCK, 1, 1),
                    shared_mem_bytes: smem as u32,
                })?;
        }
        self.run.prof.mark(gpu, "sample_splitters")?;
        self.run.keep.push(seg_dev);
        Ok(splitters)
    }
}

/// Runs the levels of a sample sort of `n` rows through `split` (which moves the rows of the
/// segments it is given, all at one depth, and returns where each of the 256 buckets of
/// each starts) until every bucket either holds keys equal to a splitter or at most
/// `local_rows` rows. Final buckets are sorted on `whole` (every digit of the key): plan
/// `depth` of `levels + 1` equal plans, so that the small buckets of one depth share blocks.
/// Buckets of keys equal to a splitter are sorted with their neighbours (nothing moves within
/// them) where a block holds them, and copied in pieces where it does not; giving them a plan
/// of their own would cut the batches at each of them, and with a row or two in most of them
/// that multiplied the blocks of the local sort.
pub fn sample_schedule(
    n: usize,
    local_rows: usize,
    whole: LocalDigits,
    mut split: impl FnMut(usize, &[Segment]) -> Result<Vec<u32>>,
) -> Result<MsdSchedule> {
    let mut current = vec![(
        Segment {
            start: 0,
            len: n as u32,
        },
        0usize,
    )];
    let mut finals = vec![];
    let mut depth = 0;
    loop {
        let big = final_buckets(current, local_rows, |seg| {
            finals.push(FinalSegment {
                seg,
                depth,
                plan: depth,
            })
        });
        if big.is_empty() {
            break;
        }
        if depth == SAMPLE_MAX_LEVELS {
            return Err(CudaSortError::Unsupported(format!(
                "a sample sort whose buckets still hold {} rows after {SAMPLE_MAX_LEVELS} levels",
                big.iter().map(|s| s.len).max().unwrap_or(0)
            )));
        }
        let starts = split(depth, &big)?;
        current = split_segments(&big, &starts, BUCKETS)?;
        depth += 1;
    }
    let plans = vec![whole; depth + 1];
    covered(finals, n, depth, plans)
}

/// The buckets of one level (in row order, each with its bucket number) that the next level
/// splits: those of keys between two splitters larger than `local_rows`. The others are final;
/// each run of adjacent final buckets is handed to `final_segment` as one segment of at most
/// `local_rows` rows (a bucket of keys equal to a splitter may be larger alone). Buckets are
/// ranges of keys, and no key is in two, so a stable sort of adjacent buckets together is the
/// same as one of each: this way a level leaves about as many final segments as blocks of rows,
/// not 255 per segment split (which took the host ~60 ns each, 37 ms at 100M rows).
fn final_buckets(
    buckets: Vec<(Segment, usize)>,
    local_rows: usize,
    mut final_segment: impl FnMut(Segment),
) -> Vec<Segment> {
    let mut big = vec![];
    let mut open: Option<Segment> = None;
    for (seg, bucket) in buckets {
        // Odd buckets hold keys equal to a splitter (the whole input is bucket 0).
        if bucket % 2 == 0 && seg.len as usize > local_rows {
            big.push(seg);
            continue;
        }
        match open.as_mut() {
            Some(o) if o.start + o.len == seg.start && (o.len + seg.len) as usize <= local_rows => o.len += seg.len,
            _ => {
                if let Some(o) = open.replace(seg) {
                    final_segment(o);
                }
            }
        }
    }
    if let Some(o) = open {
        final_segment(o);
    }
    big
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::msd::batches;
    use gpusort::plan::radix_passes;
    use rand::prelude::*;
    use rand::rngs::SmallRng;

    /// What the kernels do, on the host: splitters from a sorted sample (every 16th of 2048
    /// keys drawn at random), each row's bucket, the stable scatter, the buckets' starts.
    fn simulate_level(keys: &mut [u64], segments: &[Segment], local: usize, rng: &mut SmallRng) -> Vec<u32> {
        let mut starts = vec![];
        for seg in segments {
            let rows = &mut keys[seg.start as usize..(seg.start + seg.len) as usize];
            let mut sample: Vec<u64> = (0..SAMPLE_SIZE)
                .map(|_| rows[rng.random_range(0..rows.len())])
                .collect();
            sample.sort();
            let all: Vec<u64> = (0..SAMPLE_SPLITTERS).map(|j| sample[(j + 1) * 16 - 1]).collect();
            let gap = (SAMPLE_SPLITTERS + 1) >> search_depth(rows.len(), local);
            let sp: Vec<u64> = all.iter().skip(gap - 1).step_by(gap).copied().collect();
            let bucket = |k: u64| {
                let pos = sp.partition_point(|&x| x < k);
                2 * pos + (pos < sp.len() && sp[pos] == k) as usize
            };
            let mut counts = [0u32; BUCKETS];
            rows.iter().for_each(|&k| counts[bucket(k)] += 1);
            let mut at = seg.start;
            for c in counts {
                starts.push(at);
                at += c;
            }
            rows.sort_by_key(|&k| bucket(k));
        }
        starts
    }

    /// The schedule covers every row once, ends with buckets a block holds (or of equal keys),
    /// and its batches sort the rows, for keys of every spread: distinct, few distinct, one
    /// value, heavy duplicates among distinct ones.
    #[test]
    fn levels_end_in_buckets_a_block_sorts() {
        let mut rng = SmallRng::seed_from_u64(7);
        let n = 300_000;
        let local = 8192;
        let key_of = |shape: &str, r: &mut SmallRng, i: usize| -> u64 {
            match shape {
                "distinct" => r.random(),
                "16 values" => r.random_range(0..16),
                "one value" => 42,
                _ if i.is_multiple_of(2) => 5,
                _ => r.random(),
            }
        };
        for name in ["distinct", "16 values", "one value", "half one value"] {
            let mut keys: Vec<u64> = (0..n).map(|i| key_of(name, &mut rng, i)).collect();
            let mut want = keys.clone();
            want.sort();
            let passes = radix_passes(&[u32::MAX, u32::MAX], 8);
            let key = MsdKey::new(&passes);
            let whole = key.local_digits(key.start(), &passes);
            let mut levels = 0;
            let sched = sample_schedule(n, local, whole, |depth, segs| {
                assert_eq!(depth, levels, "{name}");
                levels += 1;
                Ok(simulate_level(&mut keys, segs, local, &mut rng))
            })
            .unwrap();
            assert!(sched.levels <= 3, "{name}: {} levels", sched.levels);
            for f in &sched.finals {
                let rows = &keys[f.seg.start as usize..(f.seg.start + f.seg.len) as usize];
                if f.seg.len as usize > local {
                    assert!(
                        rows.iter().all(|&k| k == rows[0]),
                        "{name}: a large bucket of equal keys"
                    );
                }
                assert_eq!(f.plan, f.depth);
            }
            // The block-local sort of every batch, then the whole is sorted; the batches are few.
            let (batch_list, _) = batches(&sched, local);
            for b in &batch_list {
                assert!(b.len as usize <= local);
                keys[b.start as usize..(b.start + b.len) as usize].sort();
            }
            assert_eq!(keys, want, "{name}");
            assert!(
                batch_list.len() <= 4 * n.div_ceil(local),
                "{name}: {} batches",
                batch_list.len()
            );
        }
    }

    /// Two levels of random keys: the second level splits its segments only as far as they
    /// need, and its buckets, with a bucket of one key equal to a splitter between every two,
    /// are joined into final segments of about a block's worth of rows, each a batch of its own.
    #[test]
    fn small_buckets_share_blocks() {
        let mut rng = SmallRng::seed_from_u64(1);
        let (n, local) = (1_500_000, 8192);
        let mut keys: Vec<u64> = (0..n).map(|_| rng.random::<u32>() as u64).collect();
        let passes = radix_passes(&[u32::MAX], 8);
        let key = MsdKey::new(&passes);
        let whole = key.local_digits(key.start(), &passes);
        let mut buckets = 0;
        let sched = sample_schedule(n, local, whole, |_, segs| {
            let starts = simulate_level(&mut keys, segs, local, &mut rng);
            buckets += split_segments(segs, &starts, BUCKETS).unwrap().len();
            Ok(starts)
        })
        .unwrap();
        assert_eq!(sched.levels, 2);
        // 255 buckets of the first level; the second splits each of its ~12K rows into 4.
        assert!(buckets < 8 * n.div_ceil(local), "{buckets}");
        assert!(
            sched.finals.len() <= 2 * n.div_ceil(local),
            "{} finals",
            sched.finals.len()
        );
        let (batch_list, _) = batches(&sched, local);
        assert_eq!(batch_list.len(), sched.finals.len());
        let mut want = keys.clone();
        want.sort();
        for b in &batch_list {
            keys[b.start as usize..(b.start + b.len) as usize].sort();
        }
        assert_eq!(keys, want);
    }

    /// A segment is split into buckets of about half a block: all 128 for the whole input, a
    /// few for one a little larger than a block.
    #[test]
    fn segments_are_split_as_far_as_they_need() {
        assert_eq!(search_depth(100_000_000, 8192), 7);
        assert_eq!(search_depth(128 * 4096, 8192), 7);
        assert_eq!(search_depth(128 * 4096 - 4096, 8192), 7);
        assert_eq!(search_depth(64 * 4096, 8192), 6);
        assert_eq!(search_depth(12_000, 8192), 2);
        assert_eq!(search_depth(8193, 8192), 2);
        assert_eq!(search_depth(8192, 8192), 1);
        assert_eq!(search_depth(41, 40), 2);
        assert_eq!(search_depth(2, 1), 1);
    }

    /// A segment that never shrinks (a `split` that keeps every row in bucket 0) fails after
    /// [`SAMPLE_MAX_LEVELS`] levels instead of looping.
    #[test]
    fn levels_are_bounded() {
        let err = sample_schedule(100_000, 8192, LocalDigits::default(), |_, segs| {
            let starts =
                |s: &Segment| std::iter::once(s.start).chain(std::iter::repeat_n(s.start + s.len, BUCKETS - 1));
            Ok(segs.iter().flat_map(starts).collect())
        })
        .unwrap_err()
        .to_string();
        assert!(err.contains("after 8 levels"), "{err}");
    }
}
