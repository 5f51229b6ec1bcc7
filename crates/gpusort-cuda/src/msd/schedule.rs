//! The schedule of the MSD hybrid radix sort, on the host alone: which partition digit splits
//! which segments at each depth ([`schedule`], [`MsdKey`]), how a partition pass is cut into
//! chunks for the blocks of `msd_count_*` and `msd_scatter_*` ([`chunks`]), and how the final
//! segments are batched for `msd_local` ([`batches`]) — the tables `kernels/msd.cu` reads. The
//! tests run the schedule through a host simulation of the kernels.

use std::collections::BTreeSet;

use gpusort::plan::RadixPass;

use crate::error::{CudaSortError, Result};
use crate::kernels::MSD_LOCAL_MAX_SEGS;

/// Rows `start..start + len`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Segment {
    /// First row.
    pub start: u32,
    /// Rows.
    pub len: u32,
}

impl Segment {
    fn end(&self) -> u32 {
        self.start + self.len
    }
}

/// Where the MSD sort is in the key: the word (an index into [`MsdKey::spans`]) and the bit of
/// that word below which bits are left.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cursor {
    span: usize,
    top: u32,
}

/// The varying bits of the key in MSD order: for each word a pass reads, most significant
/// word first, the span `lo..hi` of bits its passes cover.
#[derive(Debug, Clone, PartialEq)]
pub struct MsdKey {
    spans: Vec<(usize, u32, u32)>,
}

/// The remaining digits of segments finalized at one depth: the key words to hold (by word
/// index of the table) and the LSD digits over them: `(slot in words, shift, bits)`.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct LocalDigits {
    /// Key words, in slot order.
    pub words: Vec<usize>,
    /// Digits, least significant first.
    pub digits: Vec<(usize, u32, u32)>,
}

impl MsdKey {
    /// The key of `passes` (an LSD plan: least significant digit first).
    pub fn new(passes: &[RadixPass]) -> Self {
        let mut spans: Vec<(usize, u32, u32)> = vec![];
        let words: BTreeSet<usize> = passes.iter().map(|p| p.word).collect();
        for w in words {
            let of = passes.iter().filter(|p| p.word == w);
            let lo = of.clone().map(|p| p.shift).min().unwrap();
            let hi = of.map(|p| p.shift + p.bits).max().unwrap();
            spans.push((w, lo, hi));
        }
        Self { spans }
    }

    /// Words the key reads.
    pub fn words(&self) -> usize {
        self.spans.len()
    }

    /// The cursor before any digit.
    pub fn start(&self) -> Cursor {
        Cursor {
            span: 0,
            top: self.spans.first().map_or(0, |s| s.2),
        }
    }

    /// Whether every bit is above the cursor.
    pub fn exhausted(&self, c: Cursor) -> bool {
        c.span >= self.spans.len()
    }

    /// The next partition digit of at most `bits` bits below `c` (within one word), and the
    /// cursor after it.
    pub fn next_digit(&self, c: Cursor, bits: u32) -> Option<(RadixPass, Cursor)> {
        let &(word, lo, _) = self.spans.get(c.span)?;
        let bits = bits.clamp(1, c.top - lo);
        let shift = c.top - bits;
        let next = if shift == lo {
            Cursor {
                span: c.span + 1,
                top: self.spans.get(c.span + 1).map_or(0, |s| s.2),
            }
        } else {
            Cursor {
                span: c.span,
                top: shift,
            }
        };
        Some((RadixPass { word, shift, bits }, next))
    }

    /// The digits of `passes` below the cursor, least significant first, with the words they
    /// read.
    pub fn local_digits(&self, c: Cursor, passes: &[RadixPass]) -> LocalDigits {
        let mut out = LocalDigits::default();
        let Some(&(cur_word, _, _)) = self.spans.get(c.span) else {
            return out;
        };
        for p in passes {
            let (shift, bits) = if p.word > cur_word {
                (p.shift, p.bits)
            } else if p.word == cur_word && p.shift < c.top {
                (p.shift, p.bits.min(c.top - p.shift))
            } else {
                continue;
            };
            let slot = match out.words.iter().position(|&w| w == p.word) {
                Some(s) => s,
                None => {
                    out.words.push(p.word);
                    out.words.len() - 1
                }
            };
            out.digits.push((slot, shift, bits));
        }
        out
    }
}

/// Width of the partition digit for segments of at most `max_len` rows: enough that the
/// segments it makes hold about three quarters of `local_rows` each (uniform keys).
pub fn partition_bits(max_len: usize, local_rows: usize, max_bits: u32) -> u32 {
    let target = (local_rows * 3 / 4).max(1);
    let ratio = max_len.div_ceil(target).max(2);
    (usize::BITS - (ratio - 1).leading_zeros()).clamp(1, max_bits.max(1))
}

/// One partition pass: split `segments` (all at depth `depth`) by `digit`.
#[derive(Debug, Clone)]
pub struct PartitionLevel {
    /// Partition passes before this one (its rows are in buffer `depth % 2`).
    pub depth: usize,
    /// The digit.
    pub digit: RadixPass,
    /// The segments it splits, in row order.
    pub segments: Vec<Segment>,
}

/// A segment whose partitioning is over, and the depth at which it ended: its rows are in
/// buffer `depth % 2`, still to be sorted on the digits of `plans[plan]` (the MSD sort's plan
/// of that depth; the sample sort's whole key, or none for keys equal to a splitter).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FinalSegment {
    /// The rows.
    pub seg: Segment,
    /// Partition passes it went through.
    pub depth: usize,
    /// Its block-local plan: an index into [`MsdSchedule::plans`].
    pub plan: usize,
}

/// What the partition passes made.
#[derive(Debug, Clone)]
pub struct MsdSchedule {
    /// Partition passes run; the final buffer is `levels % 2`.
    pub levels: usize,
    /// Final segments, in row order, covering every row.
    pub finals: Vec<FinalSegment>,
    /// The block-local digits the final segments name (the MSD sort: one for each depth
    /// `0..=levels`).
    pub plans: Vec<LocalDigits>,
}

/// Runs the partition passes of an MSD sort of `n` rows by `passes` through `partition`
/// (which moves the rows and returns, for each segment and digit value, where the rows of that
/// value start) until every segment holds at most `local_rows` rows or the key is used up.
pub fn schedule(
    n: usize,
    passes: &[RadixPass],
    local_rows: usize,
    max_bits: u32,
    mut partition: impl FnMut(&PartitionLevel) -> Result<Vec<u32>>,
) -> Result<MsdSchedule> {
    let key = MsdKey::new(passes);
    let mut cursor = key.start();
    let mut current = vec![Segment {
        start: 0,
        len: n as u32,
    }];
    let mut finals = vec![];
    let mut plans = vec![];
    let mut depth = 0;
    loop {
        plans.push(key.local_digits(cursor, passes));
        let exhausted = key.exhausted(cursor);
        let (big, small): (Vec<Segment>, Vec<Segment>) = current
            .into_iter()
            .partition(|s| !exhausted && s.len as usize > local_rows);
        finals.extend(small.into_iter().map(|seg| FinalSegment {
            seg,
            depth,
            plan: depth,
        }));
        let Some(max_len) = big.iter().map(|s| s.len as usize).max() else {
            break;
        };
        let want = partition_bits(max_len, local_rows, max_bits);
        let (digit, next) = key.next_digit(cursor, want).expect("the key is not used up");
        let level = PartitionLevel {
            depth,
            digit,
            segments: big,
        };
        let starts = partition(&level)?;
        current = subsegments(&level.segments, &starts, 1 << digit.bits)?;
        cursor = next;
        depth += 1;
    }
    covered(finals, n, depth, plans)
}

/// The schedule of `finals`, in row order, once they are checked to cover the `n` rows once.
pub fn covered(mut finals: Vec<FinalSegment>, n: usize, levels: usize, plans: Vec<LocalDigits>) -> Result<MsdSchedule> {
    finals.sort_by_key(|f| f.seg.start);
    let mut at = 0u32;
    for f in &finals {
        if f.seg.start != at {
            return Err(CudaSortError::Unsupported(format!(
                "MSD schedule: segments do not cover row {at} (next starts at {})",
                f.seg.start
            )));
        }
        at = f.seg.end();
    }
    if at as usize != n {
        return Err(CudaSortError::Unsupported(format!(
            "MSD schedule: segments cover {at} of {n} rows"
        )));
    }
    Ok(MsdSchedule { levels, finals, plans })
}

/// The non-empty segments that splitting `segments` made, from the first row of each digit
/// value (`values` per segment), checked for consistency.
pub fn subsegments(segments: &[Segment], starts: &[u32], values: usize) -> Result<Vec<Segment>> {
    Ok(split_segments(segments, starts, values)?
        .into_iter()
        .map(|(s, _)| s)
        .collect())
}

/// [`subsegments`], each with its digit value (the sample sort's bucket).
pub fn split_segments(segments: &[Segment], starts: &[u32], values: usize) -> Result<Vec<(Segment, usize)>> {
    if starts.len() != segments.len() * values {
        return Err(CudaSortError::Unsupported(format!(
            "MSD partition returned {} segment starts for {} segments of {values} values",
            starts.len(),
            segments.len()
        )));
    }
    let mut out = vec![];
    for (s, seg) in segments.iter().enumerate() {
        let of = &starts[s * values..(s + 1) * values];
        for (d, &start) in of.iter().enumerate() {
            let end = of.get(d + 1).copied().unwrap_or(seg.end());
            if start < seg.start || end < start || end > seg.end() || (d == 0 && start != seg.start) {
                return Err(CudaSortError::Unsupported(format!(
                    "MSD partition of rows {}..{}: digit {d} spans {start}..{end}",
                    seg.start,
                    seg.end()
                )));
            }
            if end > start {
                out.push((
                    Segment {
                        start,
                        len: end - start,
                    },
                    d,
                ));
            }
        }
    }
    Ok(out)
}

/// A chunk of one segment: what one block of a partition pass counts and scatters
/// (`struct MsdChunk` in kernels/msd.cu).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Chunk {
    /// First row.
    pub start: u32,
    /// Rows.
    pub len: u32,
    /// Index of its count of digit 0 in the histogram.
    pub hist: u32,
    /// Chunks of its segment.
    pub stride: u32,
    /// Its segment's first row minus the rows of the partitioned segments before it.
    pub bias: u32,
    /// Its segment: an index into the pass's segments.
    pub seg: u32,
}

/// The chunks of a partition pass over `segments` with `bins` counters per chunk, chunks of
/// at most `chunk_rows` rows; also each segment's `(hist, stride, bias)` and the histogram's
/// length. The histogram is laid out segment by segment, digit-major within a segment, so that
/// its exclusive scan plus the segment's bias is where each chunk's rows of each digit go.
pub fn chunks(segments: &[Segment], bins: usize, chunk_rows: usize) -> (Vec<Chunk>, Vec<[u32; 3]>, usize) {
    let mut out = vec![];
    let mut segs = vec![];
    let mut hist = 0usize;
    let mut before = 0u32;
    for (k, s) in segments.iter().enumerate() {
        let c = (s.len as usize).div_ceil(chunk_rows).max(1);
        let bias = s.start - before;
        for i in 0..c {
            let start = s.start as usize + i * chunk_rows;
            out.push(Chunk {
                start: start as u32,
                len: (s.end() as usize - start).min(chunk_rows) as u32,
                hist: (hist + i) as u32,
                stride: c as u32,
                bias,
                seg: k as u32,
            });
        }
        segs.push([hist as u32, c as u32, bias]);
        hist += bins * c;
        before += s.len;
    }
    (out, segs, hist)
}

/// One block of the block-local sort (`struct LocalBatch` in kernels/msd.cu).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Batch {
    /// First row.
    pub start: u32,
    /// Rows.
    pub len: u32,
    /// Segments (1: no segment pass).
    pub segs: u32,
    /// Index of the first segment's start in the segment-start table.
    pub seg_first: u32,
    /// The depth whose plan sorts it.
    pub plan: u32,
    /// Buffer holding the rows.
    pub src: u32,
}

/// The blocks of the block-local sort, and the segment starts (relative to each batch's first
/// row) of batches of several segments. Segments already sorted and in the final buffer (of one
/// row, or with no digits left) are left out, unless the batch before them takes them as they
/// are (sorting or copying them in place changes nothing): leaving out a row between two small
/// segments would cut their batch in two, and the sample sort's buckets of one key equal to a
/// splitter sit between every two of its buckets. Segments too large for a block (only when the
/// key is used up: their rows are all equal) are copied to the final buffer in pieces.
pub fn batches(s: &MsdSchedule, local_rows: usize) -> (Vec<Batch>, Vec<u32>) {
    let final_buf = s.levels % 2;
    let mut out: Vec<Batch> = vec![];
    let mut starts: Vec<u32> = vec![];
    // Segment starts of the batch being built.
    let mut open: Option<(Batch, Vec<u32>)> = None;
    let close = |open: &mut Option<(Batch, Vec<u32>)>, out: &mut Vec<Batch>, starts: &mut Vec<u32>| {
        if let Some((mut b, seg)) = open.take() {
            if b.segs > 1 {
                b.seg_first = starts.len() as u32;
                starts.extend(seg);
            }
            out.push(b);
        }
    };
    for f in &s.finals {
        let plan = &s.plans[f.plan];
        let sorts = !plan.digits.is_empty() && f.seg.len > 1;
        let moves = f.depth % 2 != final_buf;
        let fits = open.as_ref().is_some_and(|(b, seg)| {
            b.plan as usize == f.plan
                && b.src as usize == f.depth % 2
                && b.start + b.len == f.seg.start
                && (b.len + f.seg.len) as usize <= local_rows
                && seg.len() < MSD_LOCAL_MAX_SEGS
        });
        if !sorts && !moves && !fits {
            close(&mut open, &mut out, &mut starts);
            continue;
        }
        if f.seg.len as usize > local_rows {
            // Equal keys (the key is used up): copies in pieces.
            close(&mut open, &mut out, &mut starts);
            let mut at = f.seg.start;
            while at < f.seg.end() {
                let len = (f.seg.end() - at).min(local_rows as u32);
                out.push(Batch {
                    start: at,
                    len,
                    segs: 1,
                    seg_first: 0,
                    plan: f.plan as u32,
                    src: (f.depth % 2) as u32,
                });
                at += len;
            }
            continue;
        }
        if fits {
            let (b, seg) = open.as_mut().unwrap();
            seg.push(b.len);
            b.len += f.seg.len;
            // With no digits the segments need no order among themselves beyond their own.
            if !plan.digits.is_empty() {
                b.segs += 1;
            }
        } else {
            close(&mut open, &mut out, &mut starts);
            open = Some((
                Batch {
                    start: f.seg.start,
                    len: f.seg.len,
                    segs: 1,
                    seg_first: 0,
                    plan: f.plan as u32,
                    src: (f.depth % 2) as u32,
                },
                vec![0],
            ));
        }
    }
    close(&mut open, &mut out, &mut starts);
    (out, starts)
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpusort::plan::radix_passes;
    use rand::prelude::*;
    use rand::rngs::SmallRng;

    #[test]
    fn key_spans_cursor_and_digits() {
        // Word 0: bits 4..12; word 1: 0..32 in 8-bit passes.
        let passes = radix_passes(&[0x0FF0, u32::MAX], 8);
        let key = MsdKey::new(&passes);
        assert_eq!(key.spans, vec![(0, 4, 12), (1, 0, 32)]);
        let c = key.start();
        assert_eq!(c, Cursor { span: 0, top: 12 });
        // A digit is cut at the word's end.
        let (d, c) = key.next_digit(c, 11).unwrap();
        assert_eq!((d.word, d.shift, d.bits), (0, 4, 8));
        assert_eq!(c, Cursor { span: 1, top: 32 });
        let (d, c2) = key.next_digit(c, 11).unwrap();
        assert_eq!((d.word, d.shift, d.bits), (1, 21, 11));
        // Below the cursor: word 1's bits 0..21, its passes cut at 21.
        let l = key.local_digits(c2, &passes);
        assert_eq!(l.words, vec![1]);
        assert_eq!(l.digits, vec![(0, 0, 8), (0, 8, 8), (0, 16, 5)]);
        // At the start: every pass, word 1 first (least significant).
        let l = key.local_digits(key.start(), &passes);
        assert_eq!(l.words, vec![1, 0]);
        assert_eq!(l.digits.len(), passes.len());
        assert!(key.local_digits(Cursor { span: 2, top: 0 }, &passes).digits.is_empty());
        assert!(key.exhausted(Cursor { span: 2, top: 0 }));
    }

    #[test]
    fn partition_bits_follow_the_largest_segment() {
        assert_eq!(partition_bits(10_000_000, 8192, 11), 11);
        assert_eq!(partition_bits(48_900, 8192, 11), 3);
        assert_eq!(partition_bits(8193, 8192, 11), 1);
        assert_eq!(partition_bits(100_000_000, 8192, 8), 8);
    }

    #[test]
    fn chunks_lay_out_the_histogram_by_segment() {
        let segs = [Segment { start: 10, len: 25 }, Segment { start: 40, len: 5 }];
        let (c, s, len) = chunks(&segs, 4, 10);
        assert_eq!(c.len(), 4);
        assert_eq!(
            c[0],
            Chunk {
                start: 10,
                len: 10,
                hist: 0,
                stride: 3,
                bias: 10,
                seg: 0
            }
        );
        assert_eq!((c[2].start, c[2].len, c[2].hist), (30, 5, 2));
        assert_eq!(
            c[3],
            Chunk {
                start: 40,
                len: 5,
                hist: 12,
                stride: 1,
                bias: 15,
                seg: 1
            }
        );
        assert_eq!(s, vec![[0, 3, 10], [12, 1, 15]]);
        assert_eq!(len, 16);
    }

    #[test]
    fn subsegments_are_checked() {
        let segs = [Segment { start: 0, len: 10 }];
        assert_eq!(
            subsegments(&segs, &[0, 0, 4, 4], 4).unwrap(),
            vec![Segment { start: 0, len: 4 }, Segment { start: 4, len: 6 }]
        );
        assert!(subsegments(&segs, &[0, 5, 4, 4], 4).is_err());
        assert!(subsegments(&segs, &[1, 5, 6, 7], 4).is_err());
        assert!(subsegments(&segs, &[0, 11, 11, 11], 4).is_err());
        assert!(subsegments(&segs, &[0, 1], 4).is_err());
    }

    /// The rows of a simulated MSD sort: key words and the row index, in two buffers.
    struct Sim {
        bufs: [Vec<Vec<u32>>; 2],
    }

    /// A host simulation of the kernels: stable partition per segment, then the block-local
    /// sorts of each batch; returns the permutation in the final buffer.
    fn simulate(keys: &[Vec<u32>], passes: &[RadixPass], local_rows: usize, max_bits: u32) -> Vec<u32> {
        let n = keys[0].len();
        let lanes: Vec<Vec<u32>> = keys.iter().cloned().chain([(0..n as u32).collect()]).collect();
        let index = keys.len();
        let mut sim = Sim {
            bufs: [lanes.clone(), vec![vec![u32::MAX; n]; lanes.len()]],
        };
        let sched = schedule(n, passes, local_rows, max_bits, |level| {
            let p = level.depth % 2;
            let d = level.digit;
            let mut starts = vec![];
            for seg in &level.segments {
                let rows: Vec<usize> = (seg.start as usize..seg.end() as usize).collect();
                let digit = |r: usize| d.digit(sim.bufs[p][d.word][r]);
                let mut order = rows.clone();
                order.sort_by_key(|&r| digit(r));
                let mut at = seg.start;
                for v in 0..1usize << d.bits {
                    starts.push(at);
                    at += rows.iter().filter(|&&r| digit(r) == v).count() as u32;
                }
                for (i, &r) in order.iter().enumerate() {
                    for l in 0..lanes.len() {
                        sim.bufs[1 - p][l][seg.start as usize + i] = sim.bufs[p][l][r];
                    }
                }
            }
            Ok(starts)
        })
        .unwrap();
        let final_buf = sched.levels % 2;
        let (list, seg_starts) = batches(&sched, local_rows);
        for b in &list {
            assert!(b.len as usize <= local_rows && b.segs as usize <= MSD_LOCAL_MAX_SEGS);
            let src = &sim.bufs[b.src as usize];
            let plan = &sched.plans[b.plan as usize];
            let mut order: Vec<usize> = (0..b.len as usize).collect();
            let row = |x: usize| b.start as usize + x;
            for &(slot, shift, bits) in &plan.digits {
                let p = RadixPass {
                    word: plan.words[slot],
                    shift,
                    bits,
                };
                order.sort_by_key(|&x| p.digit(src[p.word][row(x)]));
            }
            if b.segs > 1 {
                let of = &seg_starts[b.seg_first as usize..(b.seg_first + b.segs) as usize];
                order.sort_by_key(|&x| of.partition_point(|&s| s as usize <= x));
            }
            let moved: Vec<Vec<u32>> = (0..lanes.len())
                .map(|l| order.iter().map(|&x| src[l][row(x)]).collect())
                .collect();
            for (l, values) in moved.into_iter().enumerate() {
                sim.bufs[final_buf][l][b.start as usize..(b.start + b.len) as usize].copy_from_slice(&values);
            }
        }
        sim.bufs[final_buf][index].clone()
    }

    fn reference(keys: &[Vec<u32>]) -> Vec<u32> {
        let n = keys[0].len();
        let mut rows: Vec<u32> = (0..n as u32).collect();
        rows.sort_by_key(|&r| keys.iter().map(|w| w[r as usize]).collect::<Vec<_>>());
        rows
    }

    /// The schedule and batches of the MSD sort give the stable order: random and adversarial
    /// keys of one to three words, tiny local sorts (many partition levels, batches of many
    /// segments, used-up keys), digit widths of the local plans from 1 to 8 bits.
    #[test]
    fn simulated_msd_sort_matches_a_stable_sort() {
        let mut rng = SmallRng::seed_from_u64(7);
        for case in 0..400 {
            let n = [1usize, 2, 3, 17, 100, 1000, 5000][case % 7];
            let words = 1 + case % 3;
            let kind = (case / 7) % 6;
            let keys: Vec<Vec<u32>> = (0..words)
                .map(|w| {
                    (0..n)
                        .map(|i| match kind {
                            0 => rng.random(),
                            1 => 7,
                            2 => rng.random_range(0..3) << 20,
                            3 => (n - i) as u32,
                            4 => rng.random_range(0..50) << (w * 5),
                            _ => rng.random::<u32>() >> rng.random_range(0..32),
                        })
                        .collect()
                })
                .collect();
            let varying = gpusort::plan::varying_bits(&keys);
            let bits = [1u32, 3, 4, 8][rng.random_range(0..4)];
            let passes = radix_passes(&varying, bits);
            if passes.is_empty() {
                continue;
            }
            let local_rows = [1usize, 2, 5, 64, 700, 8192][rng.random_range(0..6)];
            let max_bits = [1u32, 4, 8, 11][rng.random_range(0..4)];
            let got = simulate(&keys, &passes, local_rows, max_bits);
            assert_eq!(
                got,
                reference(&keys),
                "case {case}: n {n} words {words} kind {kind} bits {bits} local {local_rows} max {max_bits}"
            );
        }
    }
}
