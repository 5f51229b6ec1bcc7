//! Sorted runs merged on the device (`kernels/merge.cu`, issue 24): rows that the caller knows
//! to be a few sorted runs, one after the other (an external sort's merge step takes a slice of
//! every run), are merged in rounds instead of radix-sorted digit by digit. The merge is
//! stable — on equal keys the earlier run's row comes first — so it gives the same order as a
//! stable sort of the rows as they are.
//!
//! Two schedules share the kernels ([`MergeMethod`]):
//!
//! * [`MergeMethod::OddEven`], seed 003 (Ajdari et al., "A Version of Parallel Odd-Even Sorting
//!   Algorithm Implemented in CUDA Paradigm", sections 3-4): k rounds over the k runs as fixed
//!   blocks; round r merge-splits blocks i and i + 1 for every i = r (mod 2). The paper's blocks
//!   are of one size, and k rounds sort only such blocks: runs of 1, 1 and 5 rows holding 9, 8
//!   and 1..5 end as 1 | 8 | 2 3 4 5 9. A shorter first or last run is as good as one padded
//!   with keys below (above) every other, which never leave it, so those may be shorter
//!   ([`odd_even_applies`]); other runs are merged by the tree.
//! * [`MergeMethod::Tree`]: runs 0-1, 2-3, ... merged each round, halving the runs:
//!   ceil(log2 k) rounds.
//!
//! Every round reads and writes each key word and the row index once (merge-path tiles, see
//! the kernel source), so the tree's ceil(log2 k) rounds against the paper's k is the whole
//! difference. A round costs the H100 about one radix pass (kernels/NOTES.md, "merge.cu"), so
//! [`Gpu::sort`] merges where the rounds are at most its radix passes ([`merge_pays`]).

use cudarc::driver::{CudaSlice, CudaStream, DevicePtr, DeviceRepr, LaunchConfig, PushKernelArg};

use crate::error::{CudaSortError, Result};
use crate::gpu::{Gpu, rows_u32};
use crate::kernels::{MERGE_BLOCK, MERGE_MAX_WORDS, MERGE_TILE};

/// How sorted runs are merged (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MergeMethod {
    /// Pairs of neighbouring runs merged each round: ceil(log2 k) rounds.
    Tree,
    /// The paper's block odd-even merge: k rounds of merge-splits of neighbouring runs.
    OddEven,
}

impl MergeMethod {
    /// `tree` or `odd-even` (`GPUSORT_MERGE`, the bench's labels).
    pub fn name(self) -> &'static str {
        match self {
            MergeMethod::Tree => "tree",
            MergeMethod::OddEven => "odd-even",
        }
    }
}

/// One merge of a round: A at rows `start..start + a`, B right after it, `b` rows (0: A is
/// copied); its tiles start at `tile0` among the round's. Laid out as merge.cu's `MergePair`.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct MergePair {
    pub start: u32,
    pub a: u32,
    pub b: u32,
    pub tile0: u32,
}

/// Whether the paper's odd-even merge-split sorts runs of `runs` rows in k rounds: the runs
/// that are not empty all have one length, but for a shorter first or last one.
pub fn odd_even_applies(runs: &[usize]) -> bool {
    let runs: Vec<usize> = runs.iter().copied().filter(|&r| r > 0).collect();
    let Some(&most) = runs.iter().max() else {
        return true;
    };
    let k = runs.len();
    runs.iter().enumerate().all(|(i, &r)| r == most || i == 0 || i + 1 == k)
}

/// Whether merging `runs` by `method` (the tree where the paper's schedule does not apply)
/// pays against `passes` radix passes, and how: a merge round costs about one pass (measured
/// on the H100, stop 28, run 7, with the permutation: 100M u32 keys, 16 runs merged in 3.86 ms
/// against 4.17 ms for the 4 passes, 64 runs in 5.14 ms; 100M u64 keys, 64 runs 7.00 against
/// 7.98 ms for 8 passes).
pub(crate) fn merge_pays(runs: &[usize], method: MergeMethod, passes: usize) -> Option<MergeMethod> {
    let method = match method {
        MergeMethod::OddEven if !odd_even_applies(runs) => MergeMethod::Tree,
        m => m,
    };
    let rounds = merge_rounds(runs, method).len();
    (rounds > 0 && rounds <= passes).then_some(method)
}

/// The rounds that merge runs of `runs` rows (in order, from row 0; empty runs are skipped)
/// by `method`, each a list of pairs covering every row. None when there is at most one run.
pub(crate) fn merge_rounds(runs: &[usize], method: MergeMethod) -> Vec<Vec<MergePair>> {
    let mut bounds = vec![0usize];
    for &r in runs.iter().filter(|&&r| r > 0) {
        bounds.push(bounds.last().unwrap() + r);
    }
    let k = bounds.len() - 1;
    // A round from the runs' starts `b` (and the end) and the first run it pairs.
    let round = |b: &[usize], first: usize| {
        let mut pairs = vec![];
        let mut tile0 = 0;
        let mut push = |start: usize, mid: usize, end: usize| {
            let p = MergePair {
                start: start as u32,
                a: (mid - start) as u32,
                b: (end - mid) as u32,
                tile0,
            };
            tile0 += (end - start).div_ceil(MERGE_TILE) as u32;
            pairs.push(p);
        };
        let runs = b.len() - 1;
        if first == 1 {
            push(b[0], b[1], b[1]);
        }
        let mut i = first;
        while i < runs {
            if i + 1 < runs {
                push(b[i], b[i + 1], b[i + 2]);
            } else {
                push(b[i], b[i + 1], b[i + 1]);
            }
            i += 2;
        }
        pairs
    };
    let mut rounds = vec![];
    match method {
        MergeMethod::Tree => {
            while bounds.len() > 2 {
                rounds.push(round(&bounds, 0));
                // Every other bound goes; the last always stays.
                let last = *bounds.last().unwrap();
                bounds = bounds.iter().copied().step_by(2).collect();
                if *bounds.last().unwrap() != last {
                    bounds.push(last);
                }
            }
        }
        MergeMethod::OddEven if k > 1 => {
            for r in 0..k {
                rounds.push(round(&bounds, r % 2));
            }
        }
        MergeMethod::OddEven => {}
    }
    rounds
}

/// The device addresses of a round's key words (`MergeWords`), passed by value.
#[repr(C)]
#[derive(Clone, Copy)]
struct MergeWords([u64; MERGE_MAX_WORDS]);

// SAFETY: a plain array of device addresses, laid out as the kernel's struct of 8 pointers.
unsafe impl DeviceRepr for MergeWords {}

/// A round's launch: its key words in and out, its row indices in and out (`iota`: the input
/// index is the row's position), its pairs and tiles, where the tiles' splits go.
struct Round {
    from: MergeWords,
    to: MergeWords,
    nwords: u32,
    idx_in: u64,
    idx_out: u64,
    iota: u32,
    pairs: u64,
    npairs: u32,
    ntiles: u32,
    splits: u64,
}

/// The addresses of the word arrays `v`, as merge.cu's `MergeWords`.
fn word_ptrs(v: &[CudaSlice<u32>], s: &CudaStream) -> MergeWords {
    let mut p = MergeWords([0; MERGE_MAX_WORDS]);
    for (d, w) in p.0.iter_mut().zip(v) {
        *d = w.device_ptr(s).0;
    }
    p
}

/// Tiles of a round (the last pair's first tile and its own).
fn tiles_of(round: &[MergePair]) -> usize {
    let last = round.last().expect("a round has pairs");
    last.tile0 as usize + ((last.a + last.b) as usize).div_ceil(MERGE_TILE)
}

impl Gpu {
    /// Merges `n` rows that are sorted runs of `runs` rows each, one after the other, by the
    /// key words `words` of `keys` (those that vary, most significant first; the others may be
    /// one-word stand-ins, untouched). Those words are left in merged order; returns the
    /// permutation (merged position -> input row). Stable: equal keys keep their input order.
    /// Each run must be sorted by the key: the merge does not check it. The odd-even schedule
    /// takes only runs it sorts ([`odd_even_applies`]).
    pub fn merge_runs(
        &self,
        keys: &mut [CudaSlice<u32>],
        words: &[usize],
        n: usize,
        runs: &[usize],
        method: MergeMethod,
    ) -> Result<CudaSlice<u32>> {
        check_merge(keys, words, n, runs, method)?;
        let rounds = merge_rounds(runs, method);
        if rounds.is_empty() || words.is_empty() {
            // One run, or every key equal: the rows are in order.
            return self.iota(n);
        }
        let s = self.stream.clone();
        let mut cur: Vec<CudaSlice<u32>> = vec![];
        for &w in words {
            cur.push(std::mem::replace(&mut keys[w], self.alloc_words(1)?));
        }
        let mut next = (0..words.len())
            .map(|_| self.alloc_words(n))
            .collect::<Result<Vec<_>>>()?;
        let idx = [self.alloc_words(n)?, self.alloc_words(n)?];
        let table: Vec<u32> = rounds
            .iter()
            .flatten()
            .flat_map(|p| [p.start, p.a, p.b, p.tile0])
            .collect();
        let pairs_dev = s.clone_htod(&table)?;
        let splits = self.alloc_words(rounds.iter().map(|r| tiles_of(r)).max().unwrap_or(1))?;
        let mut offset = 0usize;
        for (r, round) in rounds.iter().enumerate() {
            self.merge_round(&Round {
                from: word_ptrs(&cur, &s),
                to: word_ptrs(&next, &s),
                nwords: words.len() as u32,
                idx_in: idx[r % 2].device_ptr(&s).0,
                idx_out: idx[(r + 1) % 2].device_ptr(&s).0,
                iota: u32::from(r == 0),
                pairs: pairs_dev.device_ptr(&s).0 + (offset * std::mem::size_of::<MergePair>()) as u64,
                npairs: round.len() as u32,
                ntiles: tiles_of(round) as u32,
                splits: splits.device_ptr(&s).0,
            })?;
            offset += round.len();
            std::mem::swap(&mut cur, &mut next);
        }
        for (&w, merged) in words.iter().zip(cur) {
            keys[w] = merged;
        }
        // The last round wrote the index into idx[rounds % 2]. The pairs table and the splits
        // are freed in the stream's order, after the kernels.
        let [even, odd] = idx;
        Ok(if rounds.len().is_multiple_of(2) { even } else { odd })
    }

    /// Launches one round: `merge_partition`, a thread a tile, then `merge_tiles`, a block a
    /// tile with the tile's words and indices in shared memory.
    fn merge_round(&self, r: &Round) -> Result<()> {
        let s = &self.stream;
        let kernels = self.kernels()?;
        let smem = ((r.nwords as usize + 1) * MERGE_TILE * 4 + MERGE_TILE * 2) as u32;
        // SAFETY: the pairs table holds `npairs` pairs of this round whose rows lie in the
        // rows of every word and index buffer; `splits` holds at least `ntiles` words.
        unsafe {
            s.launch_builder(&kernels.merge_partition)
                .arg(&r.from)
                .arg(&r.nwords)
                .arg(&r.pairs)
                .arg(&r.npairs)
                .arg(&r.ntiles)
                .arg(&r.splits)
                .launch(LaunchConfig {
                    grid_dim: (r.ntiles.div_ceil(256), 1, 1),
                    block_dim: (256, 1, 1),
                    shared_mem_bytes: 0,
                })?;
            s.launch_builder(&kernels.merge_tiles)
                .arg(&r.from)
                .arg(&r.to)
                .arg(&r.nwords)
                .arg(&r.idx_in)
                .arg(&r.idx_out)
                .arg(&r.iota)
                .arg(&r.pairs)
                .arg(&r.npairs)
                .arg(&r.splits)
                .launch(LaunchConfig {
                    grid_dim: (r.ntiles, 1, 1),
                    block_dim: (MERGE_BLOCK, 1, 1),
                    shared_mem_bytes: smem,
                })?;
        }
        Ok(())
    }
}

/// Refuses what [`Gpu::merge_runs`] does not take: more than 2^32 - 1 rows, runs that do not add
/// up to the rows, runs of different lengths for the odd-even schedule, more than
/// [`MERGE_MAX_WORDS`] words or words not of every row.
fn check_merge(keys: &[CudaSlice<u32>], words: &[usize], n: usize, runs: &[usize], method: MergeMethod) -> Result<()> {
    rows_u32(n)?;
    let total: usize = runs.iter().sum();
    if total != n {
        return Err(CudaSortError::Unsupported(format!(
            "sorted runs of {total} rows in all for {n} rows"
        )));
    }
    if method == MergeMethod::OddEven && !odd_even_applies(runs) {
        return Err(CudaSortError::Unsupported(
            "the odd-even merge-split of runs of different lengths (only the first and last may be shorter)".into(),
        ));
    }
    if words.len() > MERGE_MAX_WORDS || words.iter().any(|&w| w >= keys.len() || keys[w].len() < n) {
        return Err(CudaSortError::Unsupported(format!(
            "a merge by {} key words (at most {MERGE_MAX_WORDS}, each of every row)",
            words.len()
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The runs each round leaves: every pair's rows become one run.
    fn runs_after(round: &[MergePair]) -> Vec<(u32, u32)> {
        round.iter().map(|p| (p.start, p.a + p.b)).collect()
    }

    #[test]
    fn tree_rounds_halve_the_runs() {
        let t = MERGE_TILE as u32;
        let rounds = merge_rounds(&[3, 0, 5, 2, 4, 1], MergeMethod::Tree);
        // Empty runs are skipped: 5 runs take 3 rounds.
        assert_eq!(rounds.len(), 3);
        assert_eq!(
            rounds[0],
            vec![
                MergePair {
                    start: 0,
                    a: 3,
                    b: 5,
                    tile0: 0
                },
                MergePair {
                    start: 8,
                    a: 2,
                    b: 4,
                    tile0: 1
                },
                MergePair {
                    start: 14,
                    a: 1,
                    b: 0,
                    tile0: 2
                },
            ]
        );
        assert_eq!(runs_after(&rounds[1]), vec![(0, 14), (14, 1)]);
        assert_eq!(runs_after(&rounds[2]), vec![(0, 15)]);
        assert!(merge_rounds(&[7], MergeMethod::Tree).is_empty());
        assert!(merge_rounds(&[0, 7, 0], MergeMethod::OddEven).is_empty());
        // Tiles: a pair of 2.5 tiles takes 3, and the next pair starts after them.
        let r = merge_rounds(&[MERGE_TILE * 2, MERGE_TILE / 2, 1, 1], MergeMethod::Tree);
        assert_eq!((r[0][0].tile0, r[0][1].tile0), (0, 3));
        assert_eq!(r[0][0].a + r[0][0].b, 2 * t + t / 2);
    }

    #[test]
    fn odd_even_takes_runs_of_one_length_and_merges_pay_a_pass_a_round() {
        assert!(odd_even_applies(&[3, 5, 5, 5, 2]));
        assert!(odd_even_applies(&[0, 5, 0, 5, 1, 0]));
        assert!(!odd_even_applies(&[5, 3, 5]));
        assert!(odd_even_applies(&[]));
        // 4 runs: 2 rounds by the tree, 4 by odd-even; 16 runs: 4 rounds by the tree.
        assert_eq!(merge_pays(&[9; 4], MergeMethod::Tree, 2), Some(MergeMethod::Tree));
        assert_eq!(merge_pays(&[9; 4], MergeMethod::Tree, 1), None);
        assert_eq!(merge_pays(&[9; 4], MergeMethod::OddEven, 4), Some(MergeMethod::OddEven));
        assert_eq!(merge_pays(&[9; 4], MergeMethod::OddEven, 3), None);
        assert_eq!(
            merge_pays(&[9, 3, 9, 9], MergeMethod::OddEven, 2),
            Some(MergeMethod::Tree)
        );
        assert_eq!(merge_pays(&[9; 16], MergeMethod::Tree, 4), Some(MergeMethod::Tree));
        assert_eq!(merge_pays(&[9; 64], MergeMethod::Tree, 4), None);
        assert_eq!(merge_pays(&[9; 64], MergeMethod::Tree, 8), Some(MergeMethod::Tree));
        assert_eq!(
            merge_pays(&[9], MergeMethod::Tree, 8),
            None,
            "one run: nothing to merge"
        );
    }

    #[test]
    fn odd_even_rounds_merge_split_neighbours() {
        let rounds = merge_rounds(&[2, 3, 4, 5], MergeMethod::OddEven);
        assert_eq!(rounds.len(), 4, "k rounds for k blocks");
        // Even rounds pair 0-1 and 2-3; odd rounds copy block 0, pair 1-2, copy block 3.
        assert_eq!(runs_after(&rounds[0]), vec![(0, 5), (5, 9)]);
        assert_eq!(
            rounds[1].iter().map(|p| (p.start, p.a, p.b)).collect::<Vec<_>>(),
            vec![(0, 2, 0), (2, 3, 4), (9, 5, 0)]
        );
        assert_eq!(rounds[2], rounds[0]);
        // Every round covers every row once, in order.
        for round in &rounds {
            let mut at = 0;
            for p in round {
                assert_eq!(p.start, at);
                at += p.a + p.b;
            }
            assert_eq!(at, 14);
        }
    }
}
