//! Presorted input, finished without the radix passes.
//!
//! ORDER BY over clustered tables often meets rows that are already in key order, in reverse
//! order, in a few ascending runs (partitions appended one after another) or with only a few
//! distinct keys. [`sort_presorted`] reads the key words once and recognises these shapes:
//!
//! - **sorted** (no row's key is greater than the next one's): the identity permutation;
//! - **reversed** (no row's key is smaller than the next one's): the groups of equal keys in
//!   reverse order, each group in input order, so the result stays stable;
//! - **a few ascending runs** (at most [`MAX_RUNS`]): a k-way merge. Splitter keys sampled
//!   from the runs cut every run by binary search into parts whose keys lie between two
//!   splitters; the parts are merged in parallel, each with a binary heap of run heads, equal
//!   keys taken in run order (which is input order);
//! - **few distinct keys** (at most [`MAX_DISTINCT`], keys of at most 64 bits): a stable
//!   counting sort over the ranks of the distinct keys.
//!
//! Anything else returns `None` after reading only a few rows of each chunk: random keys show
//! more than [`MAX_RUNS`] descents and ascents (or more than [`MAX_DISTINCT`] keys) within the
//! first few hundred rows, and every chunk stops as soon as one chunk has given up.
//!
//! The cost of a recognised shape is one read of the keys and one write of the permutation
//! (none for sorted input), against one read and write of every key word, index and moved
//! column per radix pass.

use std::cmp::Ordering;
use std::ops::Range;
use std::sync::atomic::{AtomicBool, Ordering as Atomic};

use rayon::prelude::*;

use crate::plan::InputOrder;

/// The most ascending runs merged instead of radix sorted.
pub const MAX_RUNS: usize = 64;
/// The most distinct keys counted instead of radix sorted.
pub const MAX_DISTINCT: usize = 256;
/// Rows per chunk of the parallel scans.
const CHUNK: usize = 1 << 16;
/// How often (in rows) a scan looks whether another chunk has given up.
const POLL: usize = 1 << 10;
/// The fewest rows worth a parallel merge part.
const MIN_PART: usize = 1 << 15;

/// A permutation for presorted keys, and the shape that was recognised.
pub(crate) struct Presorted {
    pub(crate) order: InputOrder,
    /// Sorted position -> input row.
    pub(crate) perm: Vec<u32>,
}

/// Key words of `n` rows, compared row against row (ByField: word 0 most significant).
#[derive(Clone, Copy)]
struct Keys<'a> {
    words: &'a [Vec<u32>],
}

impl Keys<'_> {
    fn cmp(&self, a: usize, b: usize) -> Ordering {
        match self.words {
            [w] => w[a].cmp(&w[b]),
            [hi, lo] => (hi[a], lo[a]).cmp(&(hi[b], lo[b])),
            words => words
                .iter()
                .map(|w| w[a].cmp(&w[b]))
                .find(|o| o.is_ne())
                .unwrap_or(Ordering::Equal),
        }
    }

    /// The key of `row` as one integer; only for keys of at most two words.
    fn key64(&self, row: usize) -> u64 {
        self.words.iter().fold(0u64, |k, w| (k << 32) | w[row] as u64)
    }
}

/// Sorts `n` rows by their key `words` when they are presorted in one of the shapes of the
/// module doc; `None` otherwise. The permutation is stable.
pub(crate) fn sort_presorted(words: &[Vec<u32>], n: usize) -> Option<Presorted> {
    if n < 2 || words.is_empty() {
        return None;
    }
    let keys = Keys { words };
    let scan = scan_order(keys, n);
    let (order, perm) = match scan {
        Some(s) if s.num_descents == 0 => (InputOrder::Sorted, super::iota(n)),
        // Every neighbour a descent: no two keys equal, no groups to find.
        Some(s) if s.ascents == 0 && s.num_descents == n - 1 => (InputOrder::Reversed, reverse_iota(n)),
        Some(s) if s.ascents == 0 => (InputOrder::Reversed, reverse(keys, n)),
        Some(s) => {
            let runs = runs_of(&s.descents, n);
            (InputOrder::Runs(runs.len()), merge_runs(keys, &runs, n))
        }
        None if words.len() <= 2 => {
            let distinct = distinct_keys(keys, n)?;
            (
                InputOrder::FewDistinct(distinct.len()),
                counting_sort(keys, &distinct, n),
            )
        }
        None => return None,
    };
    Some(Presorted { order, perm })
}

/// What one read pass found: the first rows whose key is smaller than the previous row's
/// (at most [`MAX_RUNS`] + 1 of them), how many there are, and how many rows have a greater
/// key than the previous one.
#[derive(Default)]
struct OrderScan {
    descents: Vec<usize>,
    num_descents: usize,
    ascents: usize,
}

impl OrderScan {
    /// Neither reversed nor in at most [`MAX_RUNS`] runs.
    fn unordered(&self) -> bool {
        self.num_descents > MAX_RUNS && self.ascents > 0
    }

    fn descent(&mut self, row: usize) {
        self.num_descents += 1;
        if self.descents.len() <= MAX_RUNS {
            self.descents.push(row);
        }
    }
}

/// One chunk's part of an [`OrderScan`]; `None` once the input is known to be unordered.
fn scan_chunk(keys: Keys<'_>, rows: Range<usize>, stop: &AtomicBool) -> Option<OrderScan> {
    let mut scan = OrderScan::default();
    for i in rows.start.max(1)..rows.end {
        match keys.cmp(i - 1, i) {
            Ordering::Greater => scan.descent(i),
            Ordering::Less => scan.ascents += 1,
            Ordering::Equal => {}
        }
        if scan.unordered() || (i % POLL == 0 && stop.load(Atomic::Relaxed)) {
            stop.store(true, Atomic::Relaxed);
            return None;
        }
    }
    Some(scan)
}

/// Scans the rows' order in parallel chunks; `None` as soon as they are neither sorted,
/// reversed nor in at most [`MAX_RUNS`] runs.
fn scan_order(keys: Keys<'_>, n: usize) -> Option<OrderScan> {
    let stop = AtomicBool::new(false);
    let chunks: Vec<Option<OrderScan>> = (0..n.div_ceil(CHUNK))
        .into_par_iter()
        .map(|c| scan_chunk(keys, c * CHUNK..n.min((c + 1) * CHUNK), &stop))
        .collect();
    let mut total = OrderScan::default();
    for chunk in chunks {
        let chunk = chunk?;
        total.ascents += chunk.ascents;
        chunk.descents.iter().for_each(|&d| total.descent(d));
        total.num_descents += chunk.num_descents - chunk.descents.len();
        if total.unordered() {
            return None;
        }
    }
    Some(total)
}

/// The ascending runs that `descents` (the rows starting a run, ascending) cut `0..n` into.
fn runs_of(descents: &[usize], n: usize) -> Vec<Range<usize>> {
    let mut starts = vec![0];
    starts.extend_from_slice(descents);
    let mut ends = descents.to_vec();
    ends.push(n);
    starts.into_iter().zip(ends).map(|(s, e)| s..e).collect()
}

/// n - 1, n - 2, ..., 0: the ascending order of rows whose keys strictly decrease.
fn reverse_iota(n: usize) -> Vec<u32> {
    let mut perm = vec![0u32; n];
    perm.par_chunks_mut(CHUNK).enumerate().for_each(|(c, out)| {
        for (k, slot) in out.iter_mut().enumerate() {
            *slot = (n - 1 - (c * CHUNK + k)) as u32;
        }
    });
    perm
}

/// The stable ascending order of rows whose keys never increase: groups of equal keys from
/// last to first, each in input order.
fn reverse(keys: Keys<'_>, n: usize) -> Vec<u32> {
    // Group starts: every row whose key differs from the previous row's.
    let starts: Vec<u32> = (0..n.div_ceil(CHUNK))
        .into_par_iter()
        .flat_map_iter(|c| {
            (c * CHUNK..n.min((c + 1) * CHUNK)).filter(move |&i| i == 0 || keys.cmp(i - 1, i) != Ordering::Equal)
        })
        .map(|i| i as u32)
        .collect();
    let mut perm = vec![0u32; n];
    perm.par_chunks_mut(CHUNK).enumerate().for_each(|(c, out)| {
        // Output position p holds a row of the group of input row n - 1 - p.
        let first = n - 1 - c * CHUNK;
        let mut g = starts.partition_point(|&s| s as usize <= first) - 1;
        for (k, slot) in out.iter_mut().enumerate() {
            let row = first - k;
            while starts[g] as usize > row {
                g -= 1;
            }
            let (start, end) = (starts[g] as usize, starts.get(g + 1).map_or(n, |&e| e as usize));
            // The group's rows are output from `n - end` on, in input order.
            let p = c * CHUNK + k;
            *slot = (start + (p - (n - end))) as u32;
        }
    });
    perm
}

/// Merges ascending `runs` (in input order) into one stable order.
fn merge_runs(keys: Keys<'_>, runs: &[Range<usize>], n: usize) -> Vec<u32> {
    let parts = (n / MIN_PART).clamp(1, 4 * rayon::current_num_threads());
    // Splitters: every `runs.len()`-th row of an evenly spaced sample of every run, in key
    // order; part t holds the keys in [splitter t - 1, splitter t).
    let mut sample: Vec<usize> = runs
        .iter()
        .flat_map(|r| (0..parts).map(move |t| r.start + t * r.len() / parts))
        .collect();
    sample.sort_by(|&a, &b| keys.cmp(a, b));
    let splitters: Vec<usize> = (1..parts).map(|t| sample[t * sample.len() / parts]).collect();
    // cuts[t][r]: where part t starts in run r.
    let mut cuts: Vec<Vec<usize>> = vec![runs.iter().map(|r| r.start).collect()];
    let below = splitters
        .par_iter()
        .map(|&s| runs.iter().map(|r| lower_bound(keys, r.clone(), s)).collect());
    cuts.par_extend(below);
    cuts.push(runs.iter().map(|r| r.end).collect());
    let mut perm = vec![0u32; n];
    let mut rest: &mut [u32] = &mut perm;
    let mut jobs = Vec::with_capacity(parts);
    for t in 0..parts {
        let part: Vec<Range<usize>> = (0..runs.len()).map(|r| cuts[t][r]..cuts[t + 1][r]).collect();
        let size = part.iter().map(|r| r.len()).sum();
        let (out, tail) = rest.split_at_mut(size);
        rest = tail;
        jobs.push((part, out));
    }
    jobs.into_par_iter().for_each(|(part, out)| merge_part(keys, part, out));
    perm
}

/// The first row of the ascending `run` whose key is not smaller than row `s`'s.
fn lower_bound(keys: Keys<'_>, run: Range<usize>, s: usize) -> usize {
    let (mut lo, mut hi) = (run.start, run.end);
    while lo < hi {
        let mid = lo + (hi - lo) / 2;
        if keys.cmp(mid, s) == Ordering::Less {
            lo = mid + 1;
        } else {
            hi = mid;
        }
    }
    lo
}

/// Merges the ascending `runs` (in input order) into `out` with a binary heap of run heads;
/// equal keys are taken from the earlier run first.
fn merge_part(keys: Keys<'_>, mut runs: Vec<Range<usize>>, out: &mut [u32]) {
    if keys.words.len() <= 2 {
        return merge_part64(keys, runs, out);
    }
    // Heap of run numbers, the smallest head on top.
    let less = |runs: &[Range<usize>], a: usize, b: usize| match keys.cmp(runs[a].start, runs[b].start) {
        Ordering::Equal => a < b,
        o => o == Ordering::Less,
    };
    let mut heap: Vec<usize> = (0..runs.len()).filter(|&r| !runs[r].is_empty()).collect();
    for i in (0..heap.len() / 2).rev() {
        sift_down(&mut heap, i, |a, b| less(&runs, a, b));
    }
    for slot in out.iter_mut() {
        let top = heap[0];
        *slot = runs[top].start as u32;
        runs[top].start += 1;
        if runs[top].is_empty() {
            heap.swap_remove(0);
        }
        if !heap.is_empty() {
            sift_down(&mut heap, 0, |a, b| less(&runs, a, b));
        }
    }
}

/// [`merge_part`] for keys of at most 64 bits: the heap holds each run's head key.
fn merge_part64(keys: Keys<'_>, mut runs: Vec<Range<usize>>, out: &mut [u32]) {
    use std::cmp::Reverse;
    use std::collections::BinaryHeap;
    let mut heap: BinaryHeap<Reverse<(u64, usize)>> = (0..runs.len())
        .filter(|&r| !runs[r].is_empty())
        .map(|r| Reverse((keys.key64(runs[r].start), r)))
        .collect();
    for slot in out.iter_mut() {
        let mut top = heap.peek_mut().expect("the runs hold as many rows as the output");
        let r = top.0.1;
        *slot = runs[r].start as u32;
        runs[r].start += 1;
        if runs[r].is_empty() {
            std::collections::binary_heap::PeekMut::pop(top);
        } else {
            top.0.0 = keys.key64(runs[r].start);
        }
    }
}

/// Restores the heap order below `i` (`less(a, b)`: `a` belongs above `b`).
fn sift_down(heap: &mut [usize], mut i: usize, less: impl Fn(usize, usize) -> bool) {
    loop {
        let (l, r) = (2 * i + 1, 2 * i + 2);
        let mut top = i;
        if l < heap.len() && less(heap[l], heap[top]) {
            top = l;
        }
        if r < heap.len() && less(heap[r], heap[top]) {
            top = r;
        }
        if top == i {
            return;
        }
        heap.swap(i, top);
        i = top;
    }
}

/// The distinct keys (of at most 64 bits), ascending; `None` when there are more than
/// [`MAX_DISTINCT`].
fn distinct_keys(keys: Keys<'_>, n: usize) -> Option<Vec<u64>> {
    let stop = AtomicBool::new(false);
    let sets: Vec<Option<Vec<u64>>> = (0..n.div_ceil(CHUNK))
        .into_par_iter()
        .map(|c| {
            let mut set: Vec<u64> = Vec::with_capacity(MAX_DISTINCT + 1);
            for i in c * CHUNK..n.min((c + 1) * CHUNK) {
                let k = keys.key64(i);
                if let Err(at) = set.binary_search(&k) {
                    set.insert(at, k);
                }
                if set.len() > MAX_DISTINCT || (i % POLL == 0 && stop.load(Atomic::Relaxed)) {
                    stop.store(true, Atomic::Relaxed);
                    return None;
                }
            }
            Some(set)
        })
        .collect();
    let mut all: Vec<u64> = vec![];
    for set in sets {
        all.extend(set?);
        all.sort_unstable();
        all.dedup();
        if all.len() > MAX_DISTINCT {
            return None;
        }
    }
    Some(all)
}

/// A stable counting sort of rows whose keys are all among `distinct` (ascending).
fn counting_sort(keys: Keys<'_>, distinct: &[u64], n: usize) -> Vec<u32> {
    let ranks: Vec<u8> = (0..n)
        .into_par_iter()
        .map(|i| {
            let k = keys.key64(i);
            distinct.partition_point(|&d| d < k) as u8
        })
        .collect();
    let counts: Vec<Vec<usize>> = ranks
        .par_chunks(CHUNK)
        .map(|c| {
            let mut h = vec![0usize; distinct.len()];
            c.iter().for_each(|&r| h[r as usize] += 1);
            h
        })
        .collect();
    // offsets[c][r]: where chunk c writes its first row of rank r.
    let mut offsets = counts.clone();
    let mut at = 0;
    for r in 0..distinct.len() {
        for (c, chunk) in counts.iter().enumerate() {
            offsets[c][r] = at;
            at += chunk[r];
        }
    }
    let mut perm = vec![0u32; n];
    let out = SharedOut(perm.as_mut_ptr());
    ranks
        .par_chunks(CHUNK)
        .zip(offsets)
        .enumerate()
        .for_each(|(c, (chunk, mut next))| {
            for (k, &r) in chunk.iter().enumerate() {
                // SAFETY: the offsets give every (chunk, rank) pair its own range of `perm`.
                unsafe { out.write(next[r as usize], (c * CHUNK + k) as u32) };
                next[r as usize] += 1;
            }
        });
    perm
}

/// The permutation's buffer, written by many threads at disjoint positions.
#[derive(Clone, Copy)]
struct SharedOut(*mut u32);
// SAFETY: writers touch disjoint positions (see `counting_sort`).
unsafe impl Send for SharedOut {}
unsafe impl Sync for SharedOut {}

impl SharedOut {
    /// # Safety
    /// `at` is inside the buffer and no other thread writes it.
    unsafe fn write(self, at: usize, v: u32) {
        // SAFETY: see the caller's contract.
        unsafe { *self.0.add(at) = v };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The stable order by comparison, to check against.
    fn expected(words: &[Vec<u32>], n: usize) -> Vec<u32> {
        let keys = Keys { words };
        let mut perm: Vec<u32> = (0..n as u32).collect();
        perm.sort_by(|&a, &b| keys.cmp(a as usize, b as usize));
        perm
    }

    fn check(words: Vec<Vec<u32>>, order: Option<InputOrder>) {
        let n = words[0].len();
        let got = sort_presorted(&words, n);
        assert_eq!(got.as_ref().map(|p| p.order), order);
        if let Some(p) = got {
            assert_eq!(p.perm, expected(&words, n));
        }
    }

    fn lcg(seed: &mut u64) -> u32 {
        *seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        (*seed >> 33) as u32
    }

    #[test]
    fn sorted_and_reversed_with_ties_across_chunks() {
        let n = 3 * CHUNK + 17;
        // Groups of 1,000 equal keys: a tie group crosses every chunk border.
        let asc: Vec<u32> = (0..n as u32).map(|i| i / 1000).collect();
        let desc: Vec<u32> = asc.iter().rev().copied().collect();
        check(vec![asc.clone()], Some(InputOrder::Sorted));
        check(vec![desc.clone()], Some(InputOrder::Reversed));
        // Strictly decreasing, one word and two (the low word decides within a high word).
        let strict: Vec<u32> = (0..n as u32).rev().collect();
        check(vec![strict.clone()], Some(InputOrder::Reversed));
        let hi: Vec<u32> = strict.iter().map(|&k| k / 100).collect();
        let lo: Vec<u32> = strict.iter().map(|&k| k % 100).collect();
        check(vec![hi, lo], Some(InputOrder::Reversed));
        // Strictly decreasing but for one tie at the end: the groups' path.
        let mut tie = strict.clone();
        tie[n - 1] = tie[n - 2];
        check(vec![tie], Some(InputOrder::Reversed));
        // Two words, few keys in no order: the low word decides within equal high words.
        let mut seed = 3;
        let hi: Vec<u32> = (0..n).map(|_| lcg(&mut seed) % 4).collect();
        let lo: Vec<u32> = (0..n).map(|_| lcg(&mut seed) % 5).collect();
        check(vec![hi, lo], Some(InputOrder::FewDistinct(20)));
        check(vec![vec![7; n]], Some(InputOrder::Sorted));
        check(
            vec![desc.iter().map(|&d| u32::MAX - d).collect(), desc],
            Some(InputOrder::Sorted),
        );
    }

    #[test]
    fn runs_are_merged_stably() {
        let mut seed = 1;
        for runs in [2usize, 3, 17, MAX_RUNS] {
            let n = 200_000 + runs;
            // Many equal keys across runs: the merge must take them in run order.
            let mut key: Vec<u32> = vec![];
            for _ in 0..runs {
                let mut part: Vec<u32> = (0..n / runs).map(|_| lcg(&mut seed) % 5_000).collect();
                part.sort();
                key.extend(part);
            }
            let got = sort_presorted(std::slice::from_ref(&key), key.len()).unwrap();
            assert_eq!(got.order, InputOrder::Runs(runs));
            assert_eq!(got.perm, expected(std::slice::from_ref(&key), key.len()));
        }
    }

    #[test]
    fn few_distinct_and_random_keys() {
        let mut seed = 7;
        let n = 5 * CHUNK;
        let few: Vec<u32> = (0..n).map(|_| lcg(&mut seed) % 200 * 1_000_003).collect();
        check(vec![few.clone()], Some(InputOrder::FewDistinct(200)));
        let wide: Vec<u32> = (0..n).map(|_| lcg(&mut seed) % 200).collect();
        check(vec![wide, few], None);
        let random: Vec<u32> = (0..n).map(|_| lcg(&mut seed)).collect();
        check(vec![random.clone()], None);
        // More than MAX_RUNS runs, keys all distinct: nothing to shortcut.
        let mut runs = random.clone();
        runs.chunks_mut(n / (MAX_RUNS + 8)).for_each(|c| c.sort());
        check(vec![runs], None);
        // Three words: no counting sort even for few keys.
        let three: Vec<Vec<u32>> = (0..3).map(|_| (0..n).map(|i| (i % 3) as u32).collect()).collect();
        check(three, None);
    }

    #[test]
    fn tiny_inputs() {
        check(vec![vec![]], None);
        check(vec![vec![5]], None);
        check(vec![vec![5, 4]], Some(InputOrder::Reversed));
        check(vec![vec![4, 5]], Some(InputOrder::Sorted));
        check(vec![vec![4, 6, 5]], Some(InputOrder::Runs(2)));
    }
}
