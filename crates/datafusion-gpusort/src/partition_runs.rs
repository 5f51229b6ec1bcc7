//! [`PartitionRuns`]: the input partitions of a
//! [`GpuSortPreservingMergeExec`](crate::GpuSortPreservingMergeExec), each already sorted,
//! kept as the sorted runs of an external sort so that [`MultiLevelMerge`] merges them.
//!
//! # Algorithm
//!
//! Every partition is read on a task of its own; each batch is reserved before it is kept and
//! appended to its partition's run. When the pool refuses a batch, the partition holding the
//! most memory writes what it holds to disk as one sorted run (its later batches start a new
//! one: consecutive pieces of a sorted partition are sorted runs too), until the batch fits.
//! At the end the runs are, partition by partition, the spilled pieces in order and then what
//! is still in memory — input order, which the merge keeps for ties (partition 0's rows first).
//!
//! Every byte held is reserved; the reservation goes on to the merge, which returns it to zero
//! when its output ends or is dropped.

use std::sync::Arc;

use arrow::array::RecordBatch;
use datafusion::common::utils::memory::get_record_batch_memory_size;
use datafusion::error::Result;
use datafusion::execution::memory_pool::MemoryReservation;
use datafusion::physical_plan::SendableRecordBatchStream;
use datafusion::physical_plan::common::spawn_buffered;
use datafusion::physical_plan::spill::SpillManager;
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use futures::StreamExt;

use crate::error::too_small;
use crate::in_memory::InMemorySorter;
use crate::metrics::GpuSortMetrics;
use crate::multi_level_merge::MultiLevelMerge;
use crate::run::SortedRun;
use crate::run_store::RunStore;

/// Batches each input partition's task reads ahead of the collector.
const PARTITION_READ_AHEAD: usize = 2;

/// One partition's rows: the pieces written to disk, then the batches in memory.
#[derive(Default)]
struct PartitionRun {
    spilled: Vec<SortedRun>,
    batches: Vec<RecordBatch>,
    bytes: usize,
}

/// The sorted input partitions of a merge, as runs (see the module docs).
pub(crate) struct PartitionRuns {
    parts: Vec<PartitionRun>,
    /// Merges the runs at the end (its schema, sort expressions, options and metrics).
    sorter: InMemorySorter,
    /// Holds every in-memory batch's bytes.
    reservation: MemoryReservation,
    spill: SpillManager,
    /// Most runs one merge reads (0: no limit).
    fan_in: usize,
    /// Most rows one sort takes (found with the first batch).
    run_rows: Option<Option<usize>>,
    /// Rows the merge keeps (`None`: all).
    fetch: Option<usize>,
    metrics: GpuSortMetrics,
}

impl PartitionRuns {
    /// No rows yet of `partitions` partitions, merged by `sorter`, held under `reservation`,
    /// spilled through `spill`, at most `fan_in` runs merged at once (0: no limit).
    pub(crate) fn new(
        partitions: usize,
        sorter: InMemorySorter,
        reservation: MemoryReservation,
        spill: SpillManager,
        fan_in: usize,
    ) -> Self {
        Self {
            parts: (0..partitions).map(|_| PartitionRun::default()).collect(),
            metrics: sorter.metrics.clone(),
            sorter,
            reservation,
            spill,
            fan_in,
            run_rows: None,
            fetch: None,
        }
    }

    /// Keeps only the first `fetch` rows of the merge.
    pub(crate) fn with_fetch(mut self, fetch: Option<usize>) -> Self {
        self.fetch = fetch;
        self
    }

    /// Reads every stream of `inputs` (partition `i` the `i`-th), each on a task of its own,
    /// into its partition's run.
    pub(crate) async fn read(&mut self, inputs: Vec<SendableRecordBatchStream>) -> Result<()> {
        let tagged = inputs
            .into_iter()
            .enumerate()
            .map(|(i, stream)| spawn_buffered(stream, PARTITION_READ_AHEAD).map(move |batch| (i, batch)));
        let mut all = futures::stream::select_all(tagged);
        while let Some((partition, batch)) = all.next().await {
            let batch = batch?;
            let time = self.metrics.input_time.clone();
            let _timer = time.timer();
            self.insert(partition, batch).await?;
        }
        Ok(())
    }

    /// Keeps `batch` at the end of `partition`'s run, reserving its memory first.
    async fn insert(&mut self, partition: usize, batch: RecordBatch) -> Result<()> {
        if batch.num_rows() == 0 {
            return Ok(());
        }
        if self.run_rows.is_none() {
            self.run_rows = Some(self.sorter.run_rows(&batch));
        }
        let size = get_record_batch_memory_size(&batch);
        while let Err(refused) = self.reservation.try_grow(size) {
            if !self.spill_largest().await? {
                return Err(too_small(size, "to buffer one input batch", refused));
            }
        }
        let part = &mut self.parts[partition];
        part.batches.push(batch);
        part.bytes += size;
        Ok(())
    }

    /// Writes the in-memory rows of the partition holding the most to disk, as a run, and
    /// releases their memory; whether there were any.
    async fn spill_largest(&mut self) -> Result<bool> {
        let Some(part) = self.parts.iter_mut().filter(|p| p.bytes > 0).max_by_key(|p| p.bytes) else {
            return Ok(false);
        };
        let batches = std::mem::take(&mut part.batches);
        let bytes = std::mem::take(&mut part.bytes);
        let mut store = RunStore::new(self.spill.clone(), self.metrics.spill_time.clone());
        store.push_spilled(batches).await?;
        let (runs, _) = store.finish().await?;
        part.spilled.extend(runs);
        self.reservation.shrink(bytes);
        Ok(true)
    }

    /// Merges the runs into the output stream.
    pub(crate) async fn merge(self) -> Result<SendableRecordBatchStream> {
        let mut runs = vec![];
        for part in self.parts {
            runs.extend(part.spilled);
            if !part.batches.is_empty() {
                runs.push(SortedRun::in_memory(part.batches, part.bytes));
            }
        }
        log::debug!(target: "gpusort::timeline", "GpuSortPreservingMergeExec: {} sorted runs read", runs.len());
        if runs.is_empty() || self.fetch == Some(0) {
            let reservation = self.reservation;
            reservation.free();
            return Ok(Box::pin(RecordBatchStreamAdapter::new(
                Arc::clone(&self.sorter.schema),
                futures::stream::empty(),
            )));
        }
        self.metrics.runs.add(runs.len());
        let run_rows = self.run_rows.flatten();
        let merge = MultiLevelMerge::new(
            runs,
            self.reservation,
            self.sorter,
            self.spill,
            self.fan_in,
            self.fetch,
            run_rows,
        );
        merge.stream().await
    }
}
