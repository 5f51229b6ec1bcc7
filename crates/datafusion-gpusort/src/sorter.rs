//! [`GpuSorter`]: what one partition of a `GpuSortExec` does — buffer the input under a
//! [`MemoryReservation`], sort it on the chosen backend (GPU, or the CPU with the reason;
//! [`InMemorySorter`]), and emit the sorted rows in `batch_size` batches. When the input does
//! not fit, it generates sorted runs here and merges them ([`MultiLevelMerge`]).
//!
//! # Algorithm
//!
//! 1. **Buffer.** Each input batch is reserved before it is kept, together with what sorting
//!    it needs besides the rows (the sorted copy, the keys, the permutation;
//!    [`InMemorySorter::work_bytes_of`]), so runs are at most about half the pool and a run can
//!    always be sorted and then spilled, however full the pool is. Without a `fetch`, when
//!    sorts run on a GPU, each batch is also pushed to the GPU as it arrives.
//! 2. **Run generation.** A run is cut when the next batch would take the buffered rows past
//!    what one GPU sort can hold within `gpusort.gpu_memory_limit` (or the device's free memory;
//!    [`gpusort_cuda::CudaBackend::max_rows_within`]) or `gpusort.max_run_rows`, or when the memory pool
//!    refuses the next batch. A run sorts like the in-memory sort. A run cut for the GPU budget
//!    sorts on a task of its own while the next run's rows are read (one at a time), and stays
//!    in memory while the pool allows; runs cut for memory are spilled at once
//!    ([`RunStore`]: Arrow IPC through DataFusion's `SpillManager`, in-memory runs written in
//!    the background when the pool runs short).
//! 3. **Output.** Input that never needed a run sorts in one piece and streams out as slices of
//!    the sorted batch (or, when a GPU sorted many rows, of ranges brought down one after
//!    another while the consumer takes the earlier ones: `device_output.rs`); otherwise the last buffered rows become the last run and the runs are
//!    merged ([`MultiLevelMerge`]).
//!
//! With a `fetch` (TopK: `ORDER BY ... LIMIT n`) no runs are cut: the buffered input is cut
//! down to its best `n` rows whenever it grows past a threshold (or the pool runs short), so
//! memory stays bounded by the limit.
//!
//! Every byte held is reserved; the reservation returns to zero and spill files are deleted
//! when the output stream ends or is dropped.

use std::sync::Arc;

use arrow::array::RecordBatch;
use arrow::datatypes::SchemaRef;
use datafusion::common::runtime::SpawnedTask;
use datafusion::common::utils::memory::get_record_batch_memory_size;
use datafusion::error::{DataFusionError, Result};
use datafusion::execution::memory_pool::MemoryReservation;
use datafusion::physical_expr::LexOrdering;
use datafusion::physical_plan::SendableRecordBatchStream;
use datafusion::physical_plan::spill::SpillManager;
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use futures::StreamExt;

use crate::config::GpuSortConfig;
use crate::device_scan::DeviceScan;
use crate::error::too_small;
use crate::in_memory::{Delivery, InMemorySorter, ScanOutput, SortedOutput};
use crate::metrics::GpuSortMetrics;
use crate::multi_level_merge::MultiLevelMerge;
use crate::run::SortedRun;
use crate::run_store::RunStore;

/// Rows a TopK sort buffers before cutting them down to the best `fetch`: at least this many,
/// and at least four times `fetch`.
const TOPK_MIN_BUFFER_ROWS: usize = 1 << 20;

/// A run being sorted on a task of its own, and the bytes its rows hold of the reservation.
struct PendingRun {
    task: SpawnedTask<Result<Vec<RecordBatch>>>,
    held: usize,
}

/// Sorts one partition's input (see the module docs).
pub struct GpuSorter {
    fetch: Option<usize>,
    /// Sorts the buffered rows, and holds their GPU session.
    sorter: InMemorySorter,
    /// Input not yet sorted, its rows, its bytes, and the bytes reserved besides them for
    /// sorting it ([`InMemorySorter::work_bytes_of`]).
    batches: Vec<RecordBatch>,
    rows: usize,
    input_bytes: usize,
    work_bytes: usize,
    /// Sorted runs, in input order.
    runs: RunStore,
    /// The run being sorted on a task of its own while the next rows are read.
    pending: Option<PendingRun>,
    /// The memory pool's limit, when it has one.
    memory_limit: Option<usize>,
    /// Most rows of one run (`Some(None)`: no limit; `None`: not known yet).
    run_rows: Option<Option<usize>>,
    /// Most runs one merge reads (0: no limit).
    fan_in: usize,
    spill: SpillManager,
    /// Holds `input_bytes + work_bytes` plus the in-memory runs' bytes (and the working memory
    /// of a sort while one runs).
    reservation: MemoryReservation,
    metrics: GpuSortMetrics,
}

impl GpuSorter {
    /// A sorter of rows of `schema` by `expr`, keeping the first `fetch` rows, spilling
    /// through `spill`, merging at most `fan_in` runs at once (0: no limit), in a memory pool
    /// of `memory_limit` bytes (`None`: no limit known).
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        schema: SchemaRef,
        expr: LexOrdering,
        fetch: Option<usize>,
        options: GpuSortConfig,
        batch_size: usize,
        reservation: MemoryReservation,
        spill: SpillManager,
        fan_in: usize,
        memory_limit: Option<usize>,
        metrics: GpuSortMetrics,
    ) -> Self {
        Self {
            fetch,
            sorter: InMemorySorter::new(schema, expr, options, batch_size, metrics.clone()),
            batches: vec![],
            rows: 0,
            input_bytes: 0,
            work_bytes: 0,
            runs: RunStore::new(spill.clone(), metrics.spill_time.clone()),
            pending: None,
            memory_limit,
            run_rows: None,
            fan_in,
            spill,
            reservation,
            metrics,
        }
    }

    /// Buffers `batch` (reserving its memory first), cutting a sorted run first when the
    /// GPU budget or the memory pool calls for one.
    pub async fn insert(&mut self, batch: RecordBatch) -> Result<()> {
        let n = batch.num_rows();
        if n == 0 {
            return Ok(());
        }
        if self.fetch.is_none() && self.past_run_size(&batch) {
            self.metrics.budget_runs.add(1);
            self.start_run().await?;
        }
        let input = get_record_batch_memory_size(&batch);
        let keys = self.sorter.work_bytes_of(&batch);
        self.reserve(input + keys).await?;
        self.rows += n;
        self.input_bytes += input;
        self.work_bytes += keys;
        let batch = match self.fetch {
            None => {
                let time = self.metrics.input_time.clone();
                let _timer = time.timer();
                // The reservation keeps the batch's bytes even where the session releases
                // them (`gpusort.release_uploaded_input`): they are freed only once staged,
                // which may lag the input by half of it.
                let fit = self.run_rows.flatten();
                self.sorter.push_to_gpu(batch, self.rows, fit)?
            }
            Some(_) => batch,
        };
        self.batches.push(batch);
        if let Some(fetch) = self.fetch
            && self.rows >= TOPK_MIN_BUFFER_ROWS.max(fetch.saturating_mul(4))
        {
            self.compact_topk(fetch).await?;
        }
        Ok(())
    }

    /// Whether `batch` would take the buffered rows past the run size (found with the first
    /// batch: [`InMemorySorter::run_rows`]).
    fn past_run_size(&mut self, batch: &RecordBatch) -> bool {
        let limit = match self.run_rows {
            Some(limit) => limit,
            None => *self.run_rows.insert(self.sorter.run_rows(batch)),
        };
        limit.is_some_and(|limit| self.rows > 0 && self.rows + batch.num_rows() > limit)
    }

    /// Reserves `size` bytes for a batch to buffer: waiting for background spills, starting
    /// them, cutting the buffered rows down to a TopK's best or into a spilled run until the
    /// pool grants it.
    async fn reserve(&mut self, size: usize) -> Result<()> {
        while let Err(refused) = self.reservation.try_grow(size) {
            if self.finish_pending_run().await? || self.finish_oldest_spill().await? || self.spill_memory_runs().await?
            {
                continue;
            }
            match self.fetch {
                _ if self.rows == 0 => {
                    return Err(too_small(size, "to buffer one input batch", refused));
                }
                Some(fetch) if self.rows > fetch => self.compact_topk(fetch).await?,
                Some(_) => return Err(too_small(size, "to buffer the rows of the LIMIT", refused)),
                None => self.make_run(true).await?,
            }
        }
        Ok(())
    }

    /// Sorts the rows of `scan`'s files, read and decoded on the GPU (`device_scan.rs`), and
    /// streams them out; where they came in sorted runs (more than one GPU sort holds), the
    /// runs are stored as runs cut from the input are, and merged. The sorter back, untouched,
    /// when the device cannot (the reason goes to the timeline and the `device_scan_fallbacks`
    /// metric): the input is then executed.
    pub async fn sort_device_scan(mut self, scan: Arc<DeviceScan>) -> Result<Result<SendableRecordBatchStream, Self>> {
        // Runs come to the host all at once: only where no memory limit bounds what they hold.
        match self.sorter.sort_device_scan(scan, self.memory_limit.is_none()).await? {
            Ok(ScanOutput::Sorted(SortedOutput::OnDevice(rows))) => {
                let schema = Arc::clone(&self.sorter.schema);
                Ok(Ok(rows.into_stream(schema, self.sorter.slicer(), self.reservation, 0)))
            }
            Ok(ScanOutput::Sorted(SortedOutput::Batch(sorted))) => {
                self.reservation.try_resize(get_record_batch_memory_size(&sorted))?;
                self.stream_sorted(sorted).map(Ok)
            }
            Ok(ScanOutput::Sorted(SortedOutput::Ranges(_))) => unreachable!("one run stays on the device"),
            Ok(ScanOutput::Runs(runs, run_rows)) => {
                self.run_rows = Some(run_rows);
                self.metrics.budget_runs.add(runs.len().saturating_sub(1));
                for run in runs {
                    self.metrics.runs.add(1);
                    // Kept in memory where the pool grants it, else spilled (as `store_run`
                    // does with a run that outgrew what its rows held).
                    let size = run.iter().map(get_record_batch_memory_size).sum();
                    let held = if self.reservation.try_grow(size).is_ok() {
                        size
                    } else {
                        0
                    };
                    self.store_run(run, held, false).await?;
                }
                self.finish().await.map(Ok)
            }
            Err(why) => {
                log::debug!(target: "gpusort::timeline", "GpuSortExec: the input is read on the host: {why}");
                self.metrics.device_scan_fallbacks.add(1);
                Ok(Err(self))
            }
        }
    }

    /// Sorts what was buffered (merging it with the runs made so far) and streams it out in
    /// `batch_size` batches.
    pub async fn finish(mut self) -> Result<SendableRecordBatchStream> {
        self.finish_pending_run().await?;
        if (self.rows == 0 && self.runs.is_empty()) || self.fetch == Some(0) {
            self.reservation.free();
            return Ok(Box::pin(RecordBatchStreamAdapter::new(
                Arc::clone(&self.sorter.schema),
                futures::stream::empty(),
            )));
        }
        if let (true, Some(fetch)) = (self.runs.is_empty(), self.fetch) {
            // TopK: the best rows, sorted.
            self.compact_topk(fetch).await?;
            let sorted = self.take_batches().pop().expect("the best rows");
            self.reservation.try_resize(get_record_batch_memory_size(&sorted))?;
            return self.stream_sorted(sorted);
        }
        if self.runs.is_empty() {
            // In memory, in one piece (its working memory is reserved with the rows).
            let input_bytes = self.input_bytes;
            let batches = self.take_batches();
            return match self
                .sorter
                .sort_batches_out(batches, self.fetch, Delivery::OnDevice)
                .await?
            {
                SortedOutput::Batch(sorted) => {
                    self.reservation.try_resize(get_record_batch_memory_size(&sorted))?;
                    log::debug!(target: "gpusort::timeline", "GpuSortExec: sorted rows reserved");
                    self.stream_sorted(sorted)
                }
                // Still on the device: streamed out a range at a time, the input's reservation
                // held until the stream ends (the ranges index its view buffers).
                SortedOutput::OnDevice(rows) => {
                    let schema = Arc::clone(&self.sorter.schema);
                    Ok(rows.into_stream(schema, self.sorter.slicer(), self.reservation, input_bytes))
                }
                SortedOutput::Ranges(_) => unreachable!("ranges come down only when asked for"),
            };
        }
        if self.rows > 0 {
            self.make_run(false).await?;
        }
        let (runs, freed) = self.runs.finish().await?;
        self.reservation.shrink(freed);
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

    /// Streams `sorted` (which the reservation holds) in `batch_size` slices.
    fn stream_sorted(self, sorted: RecordBatch) -> Result<SendableRecordBatchStream> {
        let schema = Arc::clone(&self.sorter.schema);
        let (slices, bytes) = {
            let _timer = self.metrics.output_time.timer();
            (self.sorter.slices(&sorted)?, get_record_batch_memory_size(&sorted))
        };
        log::debug!(target: "gpusort::timeline", "GpuSortExec: {} output slices cut", slices.len());
        let rows = sorted.num_rows();
        drop(sorted);
        let reservation = self.reservation;
        let metrics = self.metrics.clone();
        // The reservation lives as long as the stream; it is freed when the stream is dropped.
        let last = slices.len().saturating_sub(1);
        let stream = futures::stream::iter(slices).enumerate().map(move |(i, batch)| {
            let _held = &reservation;
            metrics.record_output_slice(batch.num_rows(), rows, bytes);
            if i == last {
                log::debug!(target: "gpusort::timeline", "GpuSortExec: last output batch");
            }
            Ok(batch)
        });
        Ok(Box::pin(RecordBatchStreamAdapter::new(schema, stream)))
    }

    /// Bytes reserved for the buffered rows.
    fn held(&self) -> usize {
        self.input_bytes + self.work_bytes
    }

    /// The buffered batches (the reservation still holds their bytes).
    fn take_batches(&mut self) -> Vec<RecordBatch> {
        self.rows = 0;
        self.input_bytes = 0;
        self.work_bytes = 0;
        std::mem::take(&mut self.batches)
    }

    /// Cuts the buffered rows of a TopK sort down to their best `fetch`.
    async fn compact_topk(&mut self, fetch: usize) -> Result<()> {
        let held = self.held();
        let batches = self.take_batches();
        let best = self.sorter.sort_batches(batches, Some(fetch)).await?;
        self.reservation.shrink(held);
        let size = get_record_batch_memory_size(&best);
        let work = self.sorter.work_bytes_of(&best);
        self.reservation.try_grow(size + work)?;
        self.metrics.topk_compactions.add(1);
        self.rows = best.num_rows();
        self.input_bytes = size;
        self.work_bytes = work;
        self.batches.push(best);
        Ok(())
    }

    /// Sorts the buffered rows into a run: spilled when `spill` is set (or when the pool
    /// cannot hold it), else kept in memory.
    async fn make_run(&mut self, spill: bool) -> Result<()> {
        let (batches, held) = self.cut_run().await?;
        let sorted = self.sorter.sort_run(batches, self.fetch).await?;
        self.store_run(sorted, held, spill).await
    }

    /// The buffered rows as the next run (after the run being sorted is stored), and the bytes
    /// they hold of the reservation.
    async fn cut_run(&mut self) -> Result<(Vec<RecordBatch>, usize)> {
        self.finish_pending_run().await?;
        let held = self.held();
        log::debug!(target: "gpusort::timeline", "run {}: sorting {} rows", self.runs.len(), self.rows);
        self.metrics.runs.add(1);
        Ok((self.take_batches(), held))
    }

    /// Starts sorting the buffered rows into a run on a task of its own (the GPU session of
    /// these rows goes with it), while the next rows are read into a new session; the run is
    /// stored when the next run is cut, when memory is short, or at the end. One run sorts at
    /// a time: under `--gpu-memory-limit 4GiB` on TPC-H lineitem SF10, reading stopped for each
    /// of four runs' sorts and downloads (~0.2-0.35 s each, stop 33).
    async fn start_run(&mut self) -> Result<()> {
        let (batches, held) = self.cut_run().await?;
        let mut sorter = self.sorter.detach();
        let fetch = self.fetch;
        let task = SpawnedTask::spawn(async move { sorter.sort_run(batches, fetch).await });
        self.pending = Some(PendingRun { task, held });
        Ok(())
    }

    /// Waits for the run [`Self::start_run`] started and stores it; whether there was one.
    async fn finish_pending_run(&mut self) -> Result<bool> {
        let Some(PendingRun { task, held }) = self.pending.take() else {
            return Ok(false);
        };
        let sorted = task
            .join_unwind()
            .await
            .map_err(|e| DataFusionError::ExecutionJoin(Box::new(e)))??;
        self.store_run(sorted, held, false).await?;
        Ok(true)
    }

    /// Stores `sorted` (a run's rows, in one batch or in ranges, whose input held `held` bytes
    /// of the reservation) as the next run: spilled when `spill` is set or when it outgrew its
    /// rows, else kept in memory.
    async fn store_run(&mut self, sorted: Vec<RecordBatch>, held: usize, spill: bool) -> Result<()> {
        log::debug!(target: "gpusort::timeline", "run {}: sorted", self.runs.len());
        let size = sorted.iter().map(get_record_batch_memory_size).sum();
        let mut slices = vec![];
        for range in sorted {
            slices.extend(self.sorter.slices(&range)?);
        }
        if spill || size > held {
            self.runs.push_spilled(slices).await?;
            self.reservation.shrink(held);
            return Ok(());
        }
        self.reservation.shrink(held - size);
        self.runs.push_memory(SortedRun::in_memory(slices, size));
        // When the next run could not be buffered beside this one, write this one — and
        // every run still in memory — to disk now, in parallel, while the next one is read
        // and sorted: one writer at a time would bound run generation by its speed.
        if let Some(limit) = self.memory_limit
            && self.reservation.size() + held > limit
        {
            self.runs.start_memory_spills();
        }
        Ok(())
    }

    /// Waits for the oldest run being written to disk and releases its memory; whether there
    /// was one.
    async fn finish_oldest_spill(&mut self) -> Result<bool> {
        let freed = self.runs.finish_oldest_spill().await?;
        if let Some(bytes) = freed {
            self.reservation.shrink(bytes);
        }
        Ok(freed.is_some())
    }

    /// Starts writing every in-memory run to disk, in parallel, and waits for the oldest
    /// write; whether there was a run to write.
    async fn spill_memory_runs(&mut self) -> Result<bool> {
        let started = self.runs.start_memory_spills();
        self.finish_oldest_spill().await?;
        Ok(started)
    }
}
