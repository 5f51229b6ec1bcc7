//! [`MultiLevelMerge`]: merges the sorted runs of an external sort into its output, in
//! balanced levels.
//!
//! # Algorithm
//!
//! 1. **Final merge, when it fits.** A merge reads every run it takes through a buffer
//!    ([`merge_bytes`]: for a spilled run its current batch, the batch read ahead and the
//!    batch's encoded keys; for an in-memory run the encoded keys of its current batch; and
//!    one output batch). When the pool holds the buffers of every run and there are no more
//!    runs than the disk manager's `max_spill_merge_fan_in`, the runs merge into the output:
//!    by key ranges ([`RangeMerge`]) when the pool also holds the memory of a step, else row
//!    by row by the heap merge ([`RunMergeStream`]). One run alone is streamed as it is.
//! 2. **Fan-in.** Otherwise the fan-in `F` is the most runs whose buffers the pool grants, each
//!    as large as the largest run's, at most `max_spill_merge_fan_in`: any `F` runs can then
//!    be merged at once. When not even two fit, the in-memory runs are written to disk first,
//!    which frees their memory.
//! 3. **Levels.** With `R` runs the merge needs `L = ceil(log_F(R))` passes over the rows, the
//!    last of them the final merge. One level of intermediate merges leaves `F^(L-1)` runs
//!    (one pass fewer): it merges the fewest leading runs that do that, in groups of equal
//!    size (at most `F` runs each, sizes differing by at most one), each group by the heap
//!    merge into one spilled run that takes the group's place; the other runs are left as
//!    they are. Only adjacent runs are merged, so ties keep their input order. The levels
//!    repeat (the fan-in found again each time) until the final merge fits.
//!
//! # Bound on the spill volume
//!
//! A row is written to disk at most once with its run and once at each of the `L - 1`
//! intermediate levels; the final merge streams to the output without writing. So, with `F`
//! the smallest fan-in of the levels:
//!
//! ```text
//! spilled_rows  <= ceil(log_F(R)) * rows
//! spilled_bytes <= ceil(log_F(R)) * (bytes of all rows as spilled IPC batches)
//! ```
//!
//! (merging the leading runs into one, over and over, would write the first run's rows up to
//! `R - F + 1` times). The `spill_count`, `spilled_bytes` and `spilled_rows` metrics count
//! every write, `intermediate_merges` the groups merged and `merge_levels` the levels.
//!
//! The merge holds the sort's reservation until the output stream ends or is dropped; spill
//! files are deleted as their runs are read to the end, or when the stream is dropped.

use std::sync::Arc;

use datafusion::error::{DataFusionError, Result};
use datafusion::execution::memory_pool::MemoryReservation;
use datafusion::physical_plan::SendableRecordBatchStream;
use datafusion::physical_plan::metrics::RecordOutput;
use datafusion::physical_plan::spill::SpillManager;
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use futures::StreamExt;

use crate::error::too_small;
use crate::in_memory::InMemorySorter;
use crate::merge::RunMergeStream;
use crate::metrics::GpuSortMetrics;
use crate::range_merge::{RangeMerge, step_rows};
use crate::run::SortedRun;
use crate::run_store::RunStore;

/// Batches a spilled run reads ahead in a heap merge (DataFusion's own spill readers' default).
const SPILL_READ_AHEAD: usize = 2;

/// Merges sorted runs into the output stream (see the module docs).
pub(crate) struct MultiLevelMerge {
    /// The runs, in input order.
    runs: Vec<SortedRun>,
    /// Holds the in-memory runs' bytes, and the merge buffers while a merge runs.
    reservation: MemoryReservation,
    metrics: GpuSortMetrics,
    /// Sorts the range merge's steps.
    sorter: InMemorySorter,
    spill: SpillManager,
    /// Most runs one merge reads (0: no limit).
    fan_in: usize,
    /// Rows to produce (`None`: all).
    fetch: Option<usize>,
    /// Most rows one sort takes (what one GPU sort holds, or `gpusort.max_run_rows`).
    run_rows: Option<usize>,
}

impl MultiLevelMerge {
    /// A merge of `runs` (in input order) into at most `fetch` rows, holding `reservation`,
    /// sorting its steps with `sorter` (whose metrics it records), spilling through `spill`,
    /// at most `fan_in` runs at once (0: no limit), a sort taking at most `run_rows` rows.
    pub(crate) fn new(
        runs: Vec<SortedRun>,
        reservation: MemoryReservation,
        sorter: InMemorySorter,
        spill: SpillManager,
        fan_in: usize,
        fetch: Option<usize>,
        run_rows: Option<usize>,
    ) -> Self {
        Self {
            runs,
            reservation,
            metrics: sorter.metrics.clone(),
            sorter,
            spill,
            fan_in,
            fetch,
            run_rows,
        }
    }

    /// Merges the runs into the output stream (see the module docs).
    pub(crate) async fn stream(mut self) -> Result<SendableRecordBatchStream> {
        log::debug!(target: "gpusort::timeline", "merging {} runs", self.runs.len());
        loop {
            if self.runs.len() == 1 {
                return self.stream_one();
            }
            if let Some(need) = self.reserve_final_merge() {
                return self.final_merge(need);
            }
            match self.fan_in_within_memory() {
                Ok(fan_in) => self.merge_level(fan_in).await?,
                Err(_) if self.spill_memory_runs().await? => {}
                Err((need, e)) => return Err(too_small(need, "to merge two sorted runs", e)),
            }
        }
    }

    /// Reserves the buffers of a merge of every run, when the fan-in allows one and the pool
    /// grants them; the bytes reserved.
    fn reserve_final_merge(&mut self) -> Option<usize> {
        if self.fan_in != 0 && self.runs.len() > self.fan_in.max(2) {
            return None;
        }
        let need = merge_bytes(&self.runs);
        self.reservation.try_grow(need).ok().map(|()| need)
    }

    /// The fan-in of the next level: the most runs, at most `max_spill_merge_fan_in`, whose
    /// buffers the pool grants when each is as large as the largest run's (so that any group
    /// of that many fits); at least 2, else the size of two buffers and the refusal.
    fn fan_in_within_memory(&mut self) -> std::result::Result<usize, (usize, DataFusionError)> {
        let n = self.runs.len();
        let cap = if self.fan_in == 0 { n } else { self.fan_in.max(2).min(n) };
        let per_run = self.runs.iter().map(buffer_bytes).max().unwrap_or(0);
        let output = self.runs.iter().map(|r| r.max_batch_bytes()).max().unwrap_or(0);
        let need = |k: usize| k * per_run + output;
        let fits = |k: usize| match self.reservation.try_grow(need(k)) {
            Ok(()) => {
                self.reservation.shrink(need(k));
                Ok(())
            }
            Err(e) => Err((need(k), e)),
        };
        fits(2)?;
        let (mut lo, mut hi) = (2, cap.max(2));
        while lo < hi {
            let mid = (lo + hi).div_ceil(2);
            if fits(mid).is_ok() {
                lo = mid;
            } else {
                hi = mid - 1;
            }
        }
        Ok(lo)
    }

    /// One level of intermediate merges with fan-in `fan_in` ([`level_groups`]): the leading
    /// runs merged in groups of equal size, each into one spilled run in the group's place.
    async fn merge_level(&mut self, fan_in: usize) -> Result<()> {
        let (groups, merged) = level_groups(self.runs.len(), fan_in);
        log::debug!(target: "gpusort::timeline", "merge level: {merged} of {} runs in {groups} groups", self.runs.len());
        let rest = self.runs.split_off(merged);
        let mut leading = std::mem::take(&mut self.runs).into_iter();
        for g in 0..groups {
            let size = merged / groups + usize::from(g < merged % groups);
            let group: Vec<SortedRun> = leading.by_ref().take(size).collect();
            let run = self.merge_group(group).await?;
            self.runs.extend(run);
        }
        self.runs.extend(rest);
        self.metrics.merge_levels.add(1);
        Ok(())
    }

    /// Writes every in-memory run to disk, in parallel, and releases their memory; whether
    /// there was one.
    async fn spill_memory_runs(&mut self) -> Result<bool> {
        let runs = std::mem::take(&mut self.runs);
        let mut store = RunStore::with_runs(runs, self.spill.clone(), self.metrics.spill_time.clone());
        let started = store.start_memory_spills();
        let (runs, freed) = store.finish().await?;
        self.runs = runs;
        self.reservation.shrink(freed);
        Ok(started)
    }

    /// The last run, streamed as it is (its first `fetch` rows); it holds the reservation until
    /// the output ends.
    fn stream_one(mut self) -> Result<SendableRecordBatchStream> {
        let run = self.runs.pop().expect("one run");
        let stream = run.into_stream(&self.spill, SPILL_READ_AHEAD)?;
        let stream = stream.scan(self.fetch.unwrap_or(usize::MAX), |remaining, batch| {
            let out = match batch {
                Ok(_) if *remaining == 0 => None,
                Ok(b) => {
                    let n = b.num_rows().min(*remaining);
                    *remaining -= n;
                    Some(Ok(b.slice(0, n)))
                }
                Err(e) => Some(Err(e)),
            };
            futures::future::ready(out)
        });
        let reservation = self.reservation;
        let baseline = self.metrics.baseline.clone();
        Ok(Box::pin(RecordBatchStreamAdapter::new(
            Arc::clone(&self.sorter.schema),
            stream.map(move |batch| {
                let _held = &reservation;
                if let Ok(b) = &batch {
                    b.record_output(&baseline);
                }
                batch
            }),
        )))
    }

    /// The final merge of every run into the output, whose heap-merge buffers (`need`) are
    /// reserved: by key ranges when the pool holds a step (it gives `need` back), else the
    /// heap merge, which holds the reservation until the output is consumed.
    fn final_merge(mut self, need: usize) -> Result<SendableRecordBatchStream> {
        let keys = self.sorter.expr.len();
        let batch_size = self.sorter.batch_size;
        if let Some(rows) = step_rows(&self.runs, &mut self.reservation, self.run_rows, keys, batch_size) {
            self.reservation.shrink(need);
            return RangeMerge::stream(self.runs, self.reservation, self.sorter, &self.spill, self.fetch, rows);
        }
        let runs = std::mem::take(&mut self.runs);
        let merge = self.heap_merge(runs)?;
        Ok(Box::pin(
            merge
                .with_metrics(self.metrics.baseline.clone())
                .with_merge_time(self.metrics.merge_time.clone())
                .with_reservation(self.reservation),
        ))
    }

    /// Merges `group` (adjacent runs, in input order) into one spilled run (`None`: no rows).
    async fn merge_group(&mut self, group: Vec<SortedRun>) -> Result<Option<SortedRun>> {
        let need = merge_bytes(&group);
        self.reservation
            .try_grow(need)
            .map_err(|e| too_small(need, "to merge sorted runs", e))?;
        let held: usize = group.iter().map(|r| r.memory_bytes()).sum();
        let merge = self.heap_merge(group)?.with_merge_time(self.metrics.merge_time.clone());
        let merged = spill_stream(&self.spill, merge).await?;
        self.reservation.shrink(need + held);
        self.metrics.intermediate_merges.add(1);
        Ok(merged)
    }

    /// The heap merge of `runs`.
    fn heap_merge(&self, runs: Vec<SortedRun>) -> Result<RunMergeStream> {
        let streams = runs
            .into_iter()
            .map(|r| r.into_stream(&self.spill, SPILL_READ_AHEAD))
            .collect::<Result<Vec<_>>>()?;
        RunMergeStream::try_new(
            Arc::clone(&self.sorter.schema),
            self.sorter.expr.clone(),
            streams,
            self.sorter.batch_size,
            self.fetch,
        )
    }
}

/// Writes the merged rows of `merge` to one spill file; `None` when there were none.
async fn spill_stream(spill: &SpillManager, mut merge: RunMergeStream) -> Result<Option<SortedRun>> {
    let mut file = spill.create_in_progress_file("GpuSortExec merged run")?;
    let (mut rows, mut max_batch_bytes) = (0, 0);
    while let Some(batch) = merge.next().await {
        let batch = batch?;
        max_batch_bytes = max_batch_bytes.max(file.append_batch(&batch)?);
        rows += batch.num_rows();
    }
    Ok(file
        .finish()
        .map_err(|e| e.context("GpuSortExec could not spill a merged run"))?
        .map(|file| SortedRun::Spilled {
            files: vec![file],
            rows,
            max_batch_bytes,
        }))
}

/// The groups of one level of intermediate merges over `n` runs with fan-in `fan_in`: how
/// many groups, and how many leading runs they take (split evenly among them). With
/// `L = ceil(log_fan_in(n))` passes needed, the level leaves `fan_in^(L-1)` runs, which need
/// one pass fewer: the fewest groups do that when each takes up to `fan_in` runs (a group of
/// `k` runs removes `k - 1`). With `n <= fan_in`, one group of all.
fn level_groups(n: usize, fan_in: usize) -> (usize, usize) {
    if n <= fan_in || fan_in < 2 {
        return (1, n);
    }
    let mut target = 1;
    while target * fan_in < n {
        target *= fan_in;
    }
    let groups = (n - target).div_ceil(fan_in - 1);
    (groups, n - target + groups)
}

/// Memory a merge of `runs` needs besides what the runs hold: each run's buffer
/// ([`buffer_bytes`]) and one output batch.
fn merge_bytes(runs: &[SortedRun]) -> usize {
    let inputs: usize = runs.iter().map(buffer_bytes).sum();
    inputs + runs.iter().map(|r| r.max_batch_bytes()).max().unwrap_or(0)
}

/// What a merge holds to read `run`: for a spilled run its current batch, the batch read
/// ahead and the batch's encoded keys; for an in-memory run the encoded keys of its current
/// batch.
fn buffer_bytes(run: &SortedRun) -> usize {
    if run.is_spilled() {
        3 * run.max_batch_bytes()
    } else {
        run.max_batch_bytes()
    }
}

#[cfg(test)]
mod tests {
    use super::level_groups;

    /// Passes over the rows of `n` runs with fan-in `f`: levels until one merge fits, plus it;
    /// and the most times a run is merged.
    fn passes(mut runs: Vec<usize>, f: usize) -> (usize, usize) {
        let mut levels = 1;
        while runs.len() > f {
            let (groups, merged) = level_groups(runs.len(), f);
            let rest = runs.split_off(merged);
            let mut leading = runs.into_iter();
            runs = (0..groups)
                .map(|g| {
                    let size = merged / groups + usize::from(g < merged % groups);
                    assert!((2..=f).contains(&size), "a group of {size} runs at fan-in {f}");
                    leading.by_ref().take(size).max().unwrap() + 1
                })
                .collect();
            runs.extend(rest);
            levels += 1;
        }
        (levels, runs.into_iter().max().unwrap_or(0) + 1)
    }

    #[test]
    fn each_row_is_written_at_most_ceil_log_f_of_the_runs_times() {
        for f in 2..=9usize {
            for n in 2..=300 {
                let bound = (1..).find(|&l| f.pow(l) >= n).unwrap() as usize;
                let (levels, writes) = passes(vec![0; n], f);
                assert_eq!(levels, bound, "{n} runs at fan-in {f}");
                assert!(writes <= bound, "{n} runs at fan-in {f}: a row written {writes} times");
            }
        }
        // 58 runs merged two at a time: 6 writes at most (the leading-run scheme wrote up to 57).
        assert_eq!(level_groups(58, 2), (26, 52));
        assert_eq!(level_groups(10, 8), (1, 3));
        assert_eq!(level_groups(5, 8), (1, 5));
    }
}
