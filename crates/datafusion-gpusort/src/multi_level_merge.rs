//! [`MultiLevelMerge`]: merges the sorted runs of an external sort into its output.
//!
//! # Algorithm
//!
//! 1. **Fan-in.** A merge reads every run it takes through a buffer ([`merge_bytes`]: for a
//!    spilled run its current batch, the batch read ahead and the batch's encoded keys; for an
//!    in-memory run the encoded keys of its current batch; and one output batch). The leading
//!    runs that the pool can hold buffers for, at most the disk manager's
//!    `max_spill_merge_fan_in`, are merged at once. When not even two fit, the in-memory runs
//!    are written to disk first, which frees their memory.
//! 2. **Intermediate merges.** While there are more runs than that, the leading runs are
//!    merged by the heap merge ([`RunMergeStream`]) into one spilled run, which takes their
//!    place. Only adjacent runs are merged, so ties keep their input order.
//! 3. **Final merge.** When every run fits, the runs merge into the output: by key ranges
//!    ([`RangeMerge`]) when the pool holds the memory of a step, else row by row by the heap
//!    merge. One run alone is streamed as it is.
//!
//! The merge holds the sort's reservation until the output stream ends or is dropped; spill
//! files are deleted as their runs are read to the end, or when the stream is dropped.

use std::sync::Arc;

use datafusion::error::Result;
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
    /// A merge of `runs` (in input order), whose in-memory runs `reservation` holds, reading at
    /// most `fan_in` runs at once (0: no limit), producing at most `fetch` rows.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        runs: Vec<SortedRun>,
        reservation: MemoryReservation,
        metrics: GpuSortMetrics,
        sorter: InMemorySorter,
        spill: SpillManager,
        fan_in: usize,
        fetch: Option<usize>,
        run_rows: Option<usize>,
    ) -> Self {
        Self {
            runs,
            reservation,
            metrics,
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
            let Some(k) = self.reserve_merge().await? else {
                continue;
            };
            let need = merge_bytes(&self.runs[..k]);
            if k == self.runs.len() {
                return self.final_merge(need);
            }
            self.merge_leading(k, need).await?;
        }
    }

    /// Reserves the buffers of a merge of as many leading runs as the pool and the fan-in
    /// allow; how many (`None`: fewer than two fitted, and the in-memory runs were written to
    /// disk to make room).
    async fn reserve_merge(&mut self) -> Result<Option<usize>> {
        let n = self.runs.len();
        let fan_in = if self.fan_in == 0 { n } else { self.fan_in.max(2) };
        let mut refused = None;
        for k in (2..=n.min(fan_in)).rev() {
            let need = merge_bytes(&self.runs[..k]);
            match self.reservation.try_grow(need) {
                Ok(()) => return Ok(Some(k)),
                Err(e) => refused = Some((need, e)),
            }
        }
        if self.spill_memory_runs().await? {
            return Ok(None);
        }
        let (need, e) = refused.expect("a refused reservation");
        Err(too_small(need, "to merge two sorted runs", e))
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

    /// The last run, streamed as it is; it holds the reservation until the output ends.
    fn stream_one(mut self) -> Result<SendableRecordBatchStream> {
        let run = self.runs.pop().expect("one run");
        let stream = run.into_stream(&self.spill, SPILL_READ_AHEAD)?;
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

    /// Merges the leading `k` runs, whose merge buffers (`need`) are reserved, into one
    /// spilled run in their place.
    async fn merge_leading(&mut self, k: usize, need: usize) -> Result<()> {
        let group: Vec<SortedRun> = self.runs.drain(..k).collect();
        let held: usize = group.iter().map(|r| r.memory_bytes()).sum();
        let merge = self.heap_merge(group)?.with_merge_time(self.metrics.merge_time.clone());
        let merged = spill_stream(&self.spill, merge).await?;
        self.reservation.shrink(need + held);
        self.metrics.intermediate_merges.add(1);
        if let Some(run) = merged {
            self.runs.insert(0, run);
        }
        Ok(())
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

/// Memory a merge of `runs` needs besides what the runs hold: for each spilled run its
/// current batch, the batch read ahead and the batch's encoded keys; for each in-memory run
/// the encoded keys of its current batch; and one output batch.
fn merge_bytes(runs: &[SortedRun]) -> usize {
    let inputs: usize = runs
        .iter()
        .map(|r| {
            if r.is_spilled() {
                3 * r.max_batch_bytes()
            } else {
                r.max_batch_bytes()
            }
        })
        .sum();
    inputs + runs.iter().map(|r| r.max_batch_bytes()).max().unwrap_or(0)
}
