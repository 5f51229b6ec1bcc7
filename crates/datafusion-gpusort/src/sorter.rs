//! [`GpuSorter`]: what one partition of a `GpuSortExec` does — buffer the input under a
//! [`MemoryReservation`], evaluate the sort expressions, sort on the chosen backend (GPU, or
//! the CPU with the reason), and emit the sorted rows in `batch_size` batches.
//!
//! # External sort
//!
//! When the input does not fit, the sorter sorts it in **runs** and merges them:
//!
//! - **Run generation.** A run is cut when the next batch would take the buffered rows past
//!   what one GPU sort can hold within `gpusort.gpu_memory_limit` (or the device's free memory;
//!   [`CudaBackend::max_rows_within`]), or when the memory pool refuses the next batch. Runs cut
//!   for the GPU budget stay in memory while the pool allows; runs cut for memory are spilled.
//! - **Sorting a run.** A run sorts like the in-memory sort (the payload moved by the GPU's
//!   record sort or the CPU's radix passes). The memory that needs — the sorted copy, the keys,
//!   the permutation — is reserved with every buffered batch, so runs are at most about half
//!   the pool and a run can always be sorted and then spilled, however full the pool is.
//! - **Spill.** Runs are written as Arrow IPC through DataFusion's `SpillManager` (disk
//!   manager, `datafusion.execution.spill_compression`, spill metrics); in-memory runs are
//!   spilled first when the pool runs short.
//! - **Merge.** The final merge goes by key ranges ([`RangeMerge`]): each step takes from
//!   every run its rows below a splitter key (the smallest of the runs' last rows read), sorts
//!   their keys alone (on the GPU when there is one, else on every core) and gathers the rows
//!   in parallel. With too little memory for a step, a stable row-by-row heap merge on the
//!   rows' encoded keys ([`RunMergeStream`]) runs instead. When the pool cannot hold a read
//!   buffer for every run, or there are more runs than the disk manager's
//!   `max_spill_merge_fan_in`, the leading runs are first merged into one spilled run (adjacent
//!   runs only, so ties keep their input order).
//!
//! Every byte held is reserved; the reservation returns to zero and spill files are deleted
//! when the output stream ends or is dropped.
//!
//! With a `fetch` (TopK: `ORDER BY ... LIMIT n`) the buffered input is cut down to its best
//! `n` rows whenever it grows past a threshold (or the pool runs short), so memory stays
//! bounded by the limit.
//!
//! # Streaming to the GPU
//!
//! Without a `fetch`, when sorts run on a GPU, each batch is also pushed, as it arrives, into a
//! [`GpuSortSession`]: its fixed-width columns are staged in pinned memory and cross PCIe while
//! the rest of the input is read, so the sort of the buffered rows (the in-memory sort, or a
//! run) only encodes the key columns, sorts and downloads. The batches are kept (and reserved)
//! as well: when the sort turns out to be for the CPU (fewer rows than `gpusort.min_rows`) or
//! the GPU fails (out of memory, a driver error), the session is dropped and the same rows
//! sort on the CPU, with the reason in `cpu_fallback`.

use std::sync::Arc;

use arrow::array::{Array, ArrayRef, RecordBatch, RecordBatchOptions, UInt32Array};
use arrow::compute::interleave_record_batch;
use arrow::datatypes::{Field, Schema, SchemaRef};
use datafusion::common::human_readable_size;
use datafusion::common::runtime::SpawnedTask;
use datafusion::common::utils::memory::get_record_batch_memory_size;
use datafusion::error::{DataFusionError, Result};
use datafusion::execution::memory_pool::MemoryReservation;
use datafusion::physical_expr::LexOrdering;
use datafusion::physical_expr::expressions::Column;
use datafusion::physical_plan::SendableRecordBatchStream;
use datafusion::physical_plan::metrics::RecordOutput;
use datafusion::physical_plan::spill::SpillManager;
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use futures::{SinkExt, StreamExt, TryStreamExt};
use gpusort::cpu::gather::concat_batches;
use gpusort::{EncoderOptions, SortKey, SortOutput, SortRequest, SortSpec};
use gpusort_cuda::{CudaBackend, CudaSortError, GPU_STRING_PREFIX_BYTES, GpuSortSession};
use rayon::prelude::*;

use crate::config::{DeviceChoice, GpuSortConfig, StrategyChoice};
use crate::device::{cpu_backend, gpu_backend};
use crate::error::GpuSortExecError;
use crate::merge::RunMergeStream;
use crate::metrics::GpuSortMetrics;
use crate::run::{SortedRun, spill_striped};

/// Rows a TopK sort buffers before cutting them down to the best `fetch`: at least this many,
/// and at least four times `fetch`.
const TOPK_MIN_BUFFER_ROWS: usize = 1 << 20;

/// Output batches from which [`GpuSorter::slices`] cuts them on all cores.
const PARALLEL_SLICES: usize = 64;

/// Key bytes per row and sort key a sort holds on the host besides its input and output (key
/// words, double buffered, and the permutation).
const KEY_BYTES_PER_ROW_AND_KEY: usize = 24;

/// A run being written to disk on a blocking thread.
type SpillTask = tokio::task::JoinHandle<Result<Option<SortedRun>>>;

/// Where a sort runs.
enum SortPath {
    Gpu(Arc<CudaBackend>),
    Cpu { reason: Option<String> },
}

/// Sorts one partition's input (see the module docs).
pub struct GpuSorter {
    schema: SchemaRef,
    expr: LexOrdering,
    fetch: Option<usize>,
    options: GpuSortConfig,
    batch_size: usize,
    /// Input not yet sorted, its rows, its bytes, and the bytes reserved besides them for
    /// sorting it ([`Self::work_bytes_of`]).
    batches: Vec<RecordBatch>,
    rows: usize,
    input_bytes: usize,
    work_bytes: usize,
    /// The buffered batches on their way to the GPU (see the module docs), and the backend;
    /// or why they are not (a GPU failure, for the sort of the buffered rows).
    session: Option<(GpuSortSession, Arc<CudaBackend>)>,
    session_failed: Option<String>,
    /// Sorted runs, in input order.
    runs: Vec<SortedRun>,
    /// Runs being written to disk in the background: their place in `runs` (an empty
    /// placeholder until the write ends), the task, and the bytes held until then.
    spilling: Vec<(usize, SpillTask, usize)>,
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
            schema,
            expr,
            fetch,
            options,
            batch_size: batch_size.max(1),
            batches: vec![],
            rows: 0,
            input_bytes: 0,
            work_bytes: 0,
            session: None,
            session_failed: None,
            runs: vec![],
            spilling: vec![],
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
        if self.fetch.is_none() {
            let limit = match self.run_rows {
                Some(limit) => limit,
                None => *self.run_rows.insert(self.run_rows(&batch)),
            };
            if let Some(limit) = limit
                && self.rows > 0
                && self.rows + n > limit
            {
                self.metrics.budget_runs.add(1);
                self.make_run(false).await?;
            }
        }
        let input = get_record_batch_memory_size(&batch);
        let keys = self.work_bytes_of(&batch);
        let size = input + keys;
        while let Err(refused) = self.reservation.try_grow(size) {
            if self.finish_oldest_spill().await? || self.spill_memory_runs().await? {
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
        self.rows += n;
        self.input_bytes += input;
        self.work_bytes += keys;
        if self.fetch.is_none() {
            let time = self.metrics.input_time.clone();
            let _timer = time.timer();
            self.push_to_gpu(&batch)?;
        }
        self.batches.push(batch);
        if let Some(fetch) = self.fetch
            && self.rows >= TOPK_MIN_BUFFER_ROWS.max(fetch.saturating_mul(4))
        {
            self.compact_topk(fetch).await?;
        }
        Ok(())
    }

    /// Sorts what was buffered (merging it with the runs made so far) and streams it out in
    /// `batch_size` batches.
    pub async fn finish(mut self) -> Result<SendableRecordBatchStream> {
        let schema = Arc::clone(&self.schema);
        if (self.rows == 0 && self.runs.is_empty()) || self.fetch == Some(0) {
            self.reservation.free();
            return Ok(Box::pin(RecordBatchStreamAdapter::new(
                schema,
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
            let batches = self.take_batches();
            let sorted = self.sort_batches(batches, self.fetch).await?;
            self.reservation.try_resize(get_record_batch_memory_size(&sorted))?;
            log::debug!(target: "gpusort::timeline", "GpuSortExec: sorted rows reserved");
            return self.stream_sorted(sorted);
        }
        if self.rows > 0 {
            self.make_run(false).await?;
        }
        self.merge().await
    }

    /// Pushes `batch` into the GPU session of the buffered rows, starting one with the first
    /// batch when sorts run on a GPU. A failed push drops the session: the rows sort on the
    /// CPU, with the reason.
    fn push_to_gpu(&mut self, batch: &RecordBatch) -> Result<()> {
        if self.session_failed.is_some() {
            return Ok(());
        }
        let (extended, spec) = self.sort_input(batch)?;
        if self.session.is_none() {
            // The row count is not known yet: `gpusort.min_rows` is checked at the sort.
            let Ok(SortPath::Gpu(gpu)) = self.choose_path(usize::MAX) else {
                return Ok(());
            };
            let session = gpu.begin_sort(extended.schema(), spec).map(|s| {
                s.with_strategy(self.options.strategy.strategy())
                    .with_memory_limit(self.gpu_limit())
                    .with_permutation(false)
            });
            match session {
                Ok(s) => self.session = Some((s, gpu)),
                Err(e) => {
                    self.session_failed = Some(format!("GPU failed: {e}"));
                    return Ok(());
                }
            }
        }
        let (session, _) = self.session.as_mut().expect("started above");
        if let Err(e) = session.push(&extended) {
            self.session = None;
            self.session_failed = Some(format!("GPU failed: {e}"));
        }
        Ok(())
    }

    /// Streams `sorted` (which the reservation holds) in `batch_size` slices.
    fn stream_sorted(self, sorted: RecordBatch) -> Result<SendableRecordBatchStream> {
        let schema = Arc::clone(&self.schema);
        let (slices, bytes) = {
            let _timer = self.metrics.output_time.timer();
            (self.slices(&sorted)?, get_record_batch_memory_size(&sorted))
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

    /// Memory a sort of `batch`'s rows needs besides the rows: their sorted copy, the key
    /// columns (their values when they are expressions), the key words and the permutation.
    /// It is reserved with the rows, so a run can always be sorted the fast way (the payload
    /// moved by the GPU or the CPU radix passes) and then spilled, however full the pool is.
    fn work_bytes_of(&self, batch: &RecordBatch) -> usize {
        let rows = batch.num_rows();
        let columns: usize = self
            .expr
            .iter()
            .map(|e| match e.expr.downcast_ref::<Column>() {
                Some(c) if c.index() < batch.num_columns() => batch.column(c.index()).get_array_memory_size(),
                _ => 2 * 16 * rows,
            })
            .sum();
        get_record_batch_memory_size(batch) + columns + rows * (KEY_BYTES_PER_ROW_AND_KEY * self.expr.len().max(1) + 4)
    }

    /// The buffered batches (the reservation still holds their bytes).
    fn take_batches(&mut self) -> Vec<RecordBatch> {
        self.rows = 0;
        self.input_bytes = 0;
        self.work_bytes = 0;
        std::mem::take(&mut self.batches)
    }

    /// `sorted` as `batch_size` slices whose view columns keep only their own bytes.
    ///
    /// Slicing costs ~0.1 µs per column of each slice (2.9 ms for 1221 slices of 21 columns on
    /// the H100 machine, on the path between the sort and the first output batch), so many
    /// slices are cut on all cores.
    fn slices(&self, sorted: &RecordBatch) -> Result<Vec<RecordBatch>> {
        let n = sorted.num_rows();
        let count = n.div_ceil(self.batch_size);
        let slice = |i: usize| {
            let start = i * self.batch_size;
            compact_views(sorted.slice(start, self.batch_size.min(n - start)))
        };
        if count < PARALLEL_SLICES {
            (0..count).map(slice).collect()
        } else {
            (0..count).into_par_iter().map(slice).collect()
        }
    }

    /// Cuts the buffered rows of a TopK sort down to their best `fetch`.
    async fn compact_topk(&mut self, fetch: usize) -> Result<()> {
        let held = self.held();
        let batches = self.take_batches();
        let best = self.sort_batches(batches, Some(fetch)).await?;
        self.reservation.shrink(held);
        let size = get_record_batch_memory_size(&best);
        let work = self.work_bytes_of(&best);
        self.reservation.try_grow(size + work)?;
        self.metrics.topk_compactions.add(1);
        self.rows = best.num_rows();
        self.input_bytes = size;
        self.work_bytes = work;
        self.batches.push(best);
        Ok(())
    }

    /// The most rows of one run: `gpusort.max_run_rows`, and what one GPU sort of batches
    /// like `batch` can take when sorts run on a GPU.
    fn run_rows(&self, batch: &RecordBatch) -> Option<usize> {
        let configured = (self.options.max_run_rows > 0).then_some(self.options.max_run_rows);
        let gpu = match self.choose_path(usize::MAX) {
            Ok(SortPath::Gpu(gpu)) => self.sort_input(batch).ok().and_then(|(extended, spec)| {
                let request = SortRequest::new(&extended, &spec).with_strategy(self.options.strategy.strategy());
                gpu.max_rows_within(&gpu_request(&request), self.gpu_limit())
                    .ok()
                    .map(|rows| rows.max(1))
            }),
            _ => None,
        };
        match (configured, gpu) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    fn gpu_limit(&self) -> Option<usize> {
        (self.options.gpu_memory_limit.0 > 0).then_some(self.options.gpu_memory_limit.0)
    }

    /// Sorts the buffered rows into a run: spilled when `spill` is set (or when the pool
    /// cannot hold it), else kept in memory.
    async fn make_run(&mut self, spill: bool) -> Result<()> {
        let held = self.held();
        log::debug!(target: "gpusort::timeline", "run {}: sorting {} rows", self.runs.len(), self.rows);
        let batches = self.take_batches();
        self.metrics.runs.add(1);
        let sorted = self.sort_batches(batches, self.fetch).await?;
        log::debug!(target: "gpusort::timeline", "run {}: sorted", self.runs.len());
        let size = get_record_batch_memory_size(&sorted);
        let slices = self.slices(&sorted)?;
        drop(sorted);
        let run = if !spill && size <= held {
            self.reservation.shrink(held - size);
            self.runs.push(SortedRun::in_memory(slices, size));
            // When the next run could not be buffered beside this one, write this one — and
            // every run still in memory — to disk now, in parallel, while the next one is read
            // and sorted: one writer at a time would bound run generation by its speed.
            if let Some(limit) = self.memory_limit
                && self.reservation.size() + held > limit
            {
                self.start_memory_spills();
            }
            return Ok(());
        } else {
            let run = self.spill_batches(slices, "GpuSortExec sorted run").await?;
            self.reservation.shrink(held);
            run
        };
        self.runs.extend(run);
        Ok(())
    }

    /// Writes `batches` (sorted rows, in order) to a spill file, off the async threads.
    async fn spill_batches(&self, batches: Vec<RecordBatch>, what: &'static str) -> Result<Option<SortedRun>> {
        let spill = self.spill.clone();
        let time = self.metrics.spill_time.clone();
        blocking(move || {
            let _timer = time.timer();
            let stripes = spill_stripes(batches.len());
            spill_striped(&spill, &batches, stripes, what)
        })
        .await
        .map_err(|e| e.context("GpuSortExec could not spill a sorted run"))
    }

    /// Starts writing in-memory run `i` to disk on a blocking thread; its bytes stay reserved
    /// until [`Self::finish_oldest_spill`] sees the write end.
    fn start_spill(&mut self, i: usize) {
        let SortedRun::Memory { batches, bytes } = std::mem::replace(
            &mut self.runs[i],
            SortedRun::Memory {
                batches: vec![],
                bytes: 0,
            },
        ) else {
            return;
        };
        let spill = self.spill.clone();
        let time = self.metrics.spill_time.clone();
        log::debug!(target: "gpusort::timeline", "run {i}: spill started");
        let task = tokio::task::spawn_blocking(move || {
            let _timer = time.timer();
            let out = spill_striped(&spill, &batches, spill_stripes(batches.len()), "GpuSortExec sorted run");
            log::debug!(target: "gpusort::timeline", "run {i}: spill written");
            out
        });
        self.spilling.push((i, task, bytes));
    }

    /// Waits for the oldest run being written to disk and releases its memory; whether there
    /// was one. The others keep writing: several spills are in flight while the pool has
    /// room for them, which is what makes a run-generation phase bound by disk writes go
    /// faster than one writer.
    async fn finish_oldest_spill(&mut self) -> Result<bool> {
        if self.spilling.is_empty() {
            return Ok(false);
        }
        log::debug!(target: "gpusort::timeline", "waiting for the oldest of {} spills", self.spilling.len());
        let (i, task, bytes) = self.spilling.remove(0);
        let run = task
            .await
            .map_err(|e| GpuSortExecError::Task(e.to_string()))?
            .map_err(|e| e.context("GpuSortExec could not spill a sorted run"))?;
        if let Some(run) = run {
            self.runs[i] = run;
        }
        self.reservation.shrink(bytes);
        if self.spilling.is_empty() {
            // Placeholders of runs that had no rows (indices of runs being written stay put
            // until then).
            self.runs.retain(|r| r.rows() > 0);
        }
        Ok(true)
    }

    /// Waits for every run being written to disk; whether there were any.
    async fn finish_spills(&mut self) -> Result<bool> {
        let any = !self.spilling.is_empty();
        while self.finish_oldest_spill().await? {}
        Ok(any)
    }

    /// Starts writing every in-memory run to disk, in parallel, and waits for the oldest
    /// write; whether there was a run to write.
    async fn spill_memory_runs(&mut self) -> Result<bool> {
        let started = self.start_memory_spills();
        self.finish_oldest_spill().await?;
        Ok(started)
    }

    /// Starts writing every in-memory run to disk; whether there was one.
    fn start_memory_spills(&mut self) -> bool {
        let memory: Vec<usize> = (0..self.runs.len())
            .filter(|&i| !self.runs[i].is_spilled() && self.runs[i].rows() > 0)
            .filter(|&i| !self.spilling.iter().any(|(j, ..)| *j == i))
            .collect();
        for &i in &memory {
            self.start_spill(i);
        }
        !memory.is_empty()
    }

    /// Sorts `batches` by their key columns alone and returns the permutation (its first
    /// `limit` rows).
    async fn sort_keys(&mut self, batches: &[RecordBatch], limit: Option<usize>) -> Result<UInt32Array> {
        let rows: usize = batches.iter().map(|b| b.num_rows()).sum();
        // The key columns alone; the spec over them is the same for every batch.
        let spec = SortSpec::new(self.expr.iter().enumerate().map(|(column, e)| SortKey {
            column,
            options: e.options,
        }));
        let key_parts = batches
            .iter()
            .map(|b| {
                let (extended, full) = self.sort_input(b)?;
                let columns: Vec<usize> = full.keys().iter().map(|k| k.column).collect();
                Ok(extended.project(&columns)?)
            })
            .collect::<Result<Vec<_>>>()?;
        let keys = {
            let _timer = self.metrics.concat_time.timer();
            concat_batches(&key_parts[0].schema(), &key_parts).map_err(GpuSortExecError::from)?
        };
        drop(key_parts);
        log::debug!(target: "gpusort::timeline", "sort keys: {rows} rows concatenated");
        let path = match self.session_failed.take() {
            // The GPU failed to sort these rows whole: their keys sort on the CPU, with the reason.
            Some(reason) => SortPath::Cpu { reason: Some(reason) },
            None => self.choose_path(rows)?,
        };
        let strategy = self.options.strategy.strategy();
        let gpu_limit = self.gpu_limit();
        let metrics = self.metrics.clone();
        let timer = self.metrics.baseline.elapsed_compute().clone();
        blocking(move || {
            let _timer = timer.timer();
            let request = SortRequest::new(&keys, &spec).with_strategy(strategy).with_limit(limit);
            let indices = run_sort(&request, path, gpu_limit, &metrics)?.indices;
            let n = limit.map_or(indices.len(), |l| l.min(indices.len()));
            Ok(indices.slice(0, n))
        })
        .await
    }

    /// Merges the runs into the output stream (see the module docs).
    async fn merge(mut self) -> Result<SendableRecordBatchStream> {
        self.finish_spills().await?;
        log::debug!(target: "gpusort::timeline", "merging {} runs", self.runs.len());
        let merge_time = self.metrics.merge_time.clone();
        loop {
            if self.runs.len() == 1 {
                let run = self.runs.pop().unwrap();
                let stream = run.into_stream(&self.spill, SPILL_READ_AHEAD)?;
                let reservation = self.reservation;
                let baseline = self.metrics.baseline.clone();
                return Ok(Box::pin(RecordBatchStreamAdapter::new(
                    Arc::clone(&self.schema),
                    stream.map(move |batch| {
                        let _held = &reservation;
                        if let Ok(b) = &batch {
                            b.record_output(&baseline);
                        }
                        batch
                    }),
                )));
            }
            let n = self.runs.len();
            let fan_in = if self.fan_in == 0 { n } else { self.fan_in.max(2) };
            let mut k = n.min(fan_in);
            let mut refused = None;
            while k >= 2 {
                let need = merge_bytes(&self.runs[..k]);
                match self.reservation.try_grow(need) {
                    Ok(()) => break,
                    Err(e) => refused = Some((need, e)),
                }
                k -= 1;
            }
            if k < 2 {
                if self.spill_memory_runs().await? {
                    self.finish_spills().await?;
                    continue;
                }
                let (need, e) = refused.expect("a refused reservation");
                return Err(too_small(need, "to merge two sorted runs", e));
            }
            let need = merge_bytes(&self.runs[..k]);
            if k == n
                && let Some(chunk_rows) = self.range_merge_chunk()
            {
                // The final merge, by sorting key ranges of all runs at once.
                return self.range_merge(need, chunk_rows);
            }
            let group: Vec<SortedRun> = self.runs.drain(..k).collect();
            let held: usize = group.iter().map(|r| r.memory_bytes()).sum();
            let streams = group
                .into_iter()
                .map(|r| r.into_stream(&self.spill, SPILL_READ_AHEAD))
                .collect::<Result<Vec<_>>>()?;
            let merge = RunMergeStream::try_new(
                Arc::clone(&self.schema),
                self.expr.clone(),
                streams,
                self.batch_size,
                self.fetch,
            )?;
            if self.runs.is_empty() {
                // The final merge: it holds the reservation until the output is consumed.
                let reservation = self.reservation;
                return Ok(Box::pin(
                    merge
                        .with_metrics(self.metrics.baseline.clone())
                        .with_merge_time(merge_time)
                        .with_reservation(reservation),
                ));
            }
            // More runs than one merge can read: merge the leading ones into one spilled run.
            let merged = {
                let mut merge = merge.with_merge_time(merge_time.clone());
                let mut file = self.spill.create_in_progress_file("GpuSortExec merged run")?;
                let (mut rows, mut max_batch_bytes) = (0, 0);
                while let Some(batch) = merge.next().await {
                    let batch = batch?;
                    max_batch_bytes = max_batch_bytes.max(file.append_batch(&batch)?);
                    rows += batch.num_rows();
                }
                file.finish()
                    .map_err(|e| e.context("GpuSortExec could not spill a merged run"))?
                    .map(|file| SortedRun::Spilled {
                        files: vec![file],
                        rows,
                        max_batch_bytes,
                    })
            };
            self.reservation.shrink(need + held);
            self.metrics.intermediate_merges.add(1);
            if let Some(run) = merged {
                self.runs.insert(0, run);
            }
        }
    }

    /// Rows of one step of the range merge of `runs`, with their memory reserved: the run size
    /// (what one GPU sort holds, or `gpusort.max_run_rows`; 4M rows on the CPU), halved until
    /// the pool grants it (down to 64K rows). `None` when it does not: the heap merge then runs,
    /// in less memory.
    fn range_merge_chunk(&mut self) -> Option<usize> {
        let bytes_per_row = self
            .runs
            .iter()
            .map(|r| match r {
                SortedRun::Memory { bytes, .. } => bytes.div_ceil(r.rows().max(1)),
                SortedRun::Spilled { max_batch_bytes, .. } => max_batch_bytes.div_ceil(self.batch_size),
            })
            .max()
            .unwrap_or(0)
            .max(1);
        // Each run reads whole batches: a step takes up to one batch per run more than asked.
        let slack = self.runs.len() * self.batch_size;
        let mut rows = match self.run_rows.flatten() {
            Some(gpu) if slack < gpu / 2 => gpu - slack,
            Some(gpu) => gpu / 2,
            None => RANGE_MERGE_CPU_ROWS,
        };
        loop {
            let bytes = range_merge_bytes(rows, bytes_per_row, self.expr.len(), self.runs.len(), self.batch_size);
            if self.reservation.try_grow(bytes).is_ok() {
                return Some(rows);
            }
            if rows / 2 < RANGE_MERGE_MIN_ROWS {
                return None;
            }
            rows /= 2;
        }
    }

    /// The final merge by key ranges: each step takes, from every run, its rows below one
    /// splitter key, sorts their keys (on the GPU when there is one) and gathers the rows
    /// through the permutation (see [`RangeMerge`]). The step's memory is reserved, and `need`
    /// (the heap merge's), which it gives back.
    fn range_merge(mut self, need: usize, chunk_rows: usize) -> Result<SendableRecordBatchStream> {
        self.reservation.shrink(need);
        let runs = std::mem::take(&mut self.runs);
        // Spilled runs read a few batches ahead, on their own tasks, while a step sorts.
        let ahead = range_merge_read_ahead(chunk_rows, runs.len(), self.batch_size);
        let readers = runs
            .into_iter()
            .map(|r| Ok(RunReader::new(r.into_stream(&self.spill, ahead)?)))
            .collect::<Result<Vec<_>>>()?;
        let schema = Arc::clone(&self.schema);
        let state = RangeMerge {
            remaining: self.fetch.unwrap_or(usize::MAX),
            sorter: self,
            readers,
            chunk_rows,
            step: 0,
        };
        // Steps run one ahead of the consumer, on their own task: step i + 1 reads and sorts
        // while step i's batches are consumed (its output is reserved, see
        // `range_merge_bytes`). Dropping the stream aborts the task, which frees everything.
        let (mut tx, rx) = futures::channel::mpsc::channel::<Result<Vec<RecordBatch>>>(0);
        let task = SpawnedTask::spawn(async move {
            let mut state = state;
            loop {
                let step = match state.next_step().await {
                    Ok(Some(batches)) => Ok(batches),
                    Ok(None) => break,
                    Err(e) => Err(e),
                };
                let failed = step.is_err();
                if tx.send(step).await.is_err() || failed {
                    break;
                }
            }
        });
        let stream = futures::stream::unfold((rx, task), |(mut rx, task)| async move {
            rx.next().await.map(|step| (step, (rx, task)))
        })
        .map_ok(|batches| futures::stream::iter(batches.into_iter().map(Ok)))
        .try_flatten();
        Ok(Box::pin(RecordBatchStreamAdapter::new(schema, stream)))
    }

    /// Sorts `batches` in one piece and returns the sorted rows (at most `limit`): through the
    /// GPU session that holds them when there is one (and the sort is for the GPU), else
    /// concatenated and sorted on the chosen path. The caller has reserved the working memory
    /// ([`Self::work_bytes_of`]).
    async fn sort_batches(&mut self, batches: Vec<RecordBatch>, limit: Option<usize>) -> Result<RecordBatch> {
        let rows = batches.iter().map(|b| b.num_rows()).sum();
        let mut path = self.choose_path(rows)?;
        if let Some(reason) = self.session_failed.take() {
            path = SortPath::Cpu { reason: Some(reason) };
        }
        if let (SortPath::Gpu(_), Some((session, gpu))) = (&path, self.session.take()) {
            debug_assert_eq!(session.num_rows(), rows, "the session holds the buffered rows");
            match self.finish_session(session, gpu, limit).await? {
                Ok(sorted) => {
                    // Released on another core (see GpuSortSession::finish).
                    rayon::spawn(move || drop(batches));
                    return Ok(sorted);
                }
                Err(reason) => path = SortPath::Cpu { reason: Some(reason) },
            }
        }
        self.session = None;
        let input = if batches.len() == 1 {
            batches.into_iter().next().unwrap()
        } else {
            let _timer = self.metrics.concat_time.timer();
            let batch = concat_batches(&self.schema, &batches).map_err(GpuSortExecError::from)?;
            drop(batches);
            batch
        };
        self.sort(input, path, limit).await
    }

    /// Sorts the rows of `session` on the GPU; `Err(reason)` when the GPU failed and the rows
    /// must sort on the CPU.
    async fn finish_session(
        &mut self,
        session: GpuSortSession,
        gpu: Arc<CudaBackend>,
        limit: Option<usize>,
    ) -> Result<Result<RecordBatch, String>> {
        let timer = self.metrics.baseline.elapsed_compute().clone();
        let metrics = self.metrics.clone();
        let width = self.schema.fields().len();
        let out = blocking(move || {
            let _timer = timer.timer();
            match session.finish(limit) {
                Ok(out) => {
                    metrics.record(&out.stats, Some(&gpusort::SortBackend::name(gpu.as_ref())));
                    Ok(Ok(drop_extended_columns(out.batch, width)?))
                }
                // The CPU would fail the same way.
                Err(CudaSortError::Core(e)) => Err(GpuSortExecError::from(e).into()),
                Err(e) => Ok(Err(format!("GPU failed: {e}"))),
            }
        })
        .await;
        log::debug!(target: "gpusort::timeline", "GPU session finished");
        out
    }

    /// Sorts `input` on `path` and returns the sorted rows (at most `limit`).
    async fn sort(&mut self, input: RecordBatch, path: SortPath, limit: Option<usize>) -> Result<RecordBatch> {
        let _timer = self.metrics.baseline.elapsed_compute().timer();
        let (extended, spec) = self.sort_input(&input)?;
        drop(input);
        let strategy = self.options.strategy.strategy();
        let gpu_limit = self.gpu_limit();
        let metrics = self.metrics.clone();
        let width = self.schema.fields().len();
        blocking(move || -> Result<RecordBatch> {
            let request = SortRequest::new(&extended, &spec)
                .with_strategy(strategy)
                .with_limit(limit);
            let out = run_sort(&request, path, gpu_limit, &metrics)?;
            drop_extended_columns(out.batch, width)
        })
        .await
    }

    /// The batch to sort (the input, with the values of sort expressions that are not plain
    /// columns appended) and the sort specification over it.
    fn sort_input(&self, input: &RecordBatch) -> Result<(RecordBatch, SortSpec)> {
        let plain: Option<Vec<SortKey>> = self
            .expr
            .iter()
            .map(|e| match e.expr.downcast_ref::<Column>() {
                Some(c) if c.index() < input.num_columns() => Some(SortKey {
                    column: c.index(),
                    options: e.options,
                }),
                _ => None,
            })
            .collect();
        if let Some(keys) = plain {
            // Every sort expression is a column of the input: the input as it is.
            return Ok((input.clone(), SortSpec::new(keys)));
        }
        let mut columns: Vec<ArrayRef> = input.columns().to_vec();
        let mut fields: Vec<Arc<Field>> = input.schema().fields().iter().cloned().collect();
        let mut keys = Vec::with_capacity(self.expr.len());
        for e in self.expr.iter() {
            let column = match e.expr.downcast_ref::<Column>() {
                Some(c) if c.index() < input.num_columns() => c.index(),
                _ => {
                    let values = e.expr.evaluate(input)?.into_array(input.num_rows())?;
                    fields.push(Arc::new(Field::new(
                        format!("{}", e.expr),
                        values.data_type().clone(),
                        true,
                    )));
                    columns.push(values);
                    columns.len() - 1
                }
            };
            keys.push(SortKey {
                column,
                options: e.options,
            });
        }
        let batch = RecordBatch::try_new_with_options(
            Arc::new(Schema::new_with_metadata(fields, input.schema().metadata().clone())),
            columns,
            &RecordBatchOptions::new().with_row_count(Some(input.num_rows())),
        )?;
        Ok((batch, SortSpec::new(keys)))
    }

    fn choose_path(&self, rows: usize) -> Result<SortPath> {
        let o = &self.options;
        let cpu = |reason: String| Ok(SortPath::Cpu { reason: Some(reason) });
        if o.strategy == StrategyChoice::Cpu {
            return cpu("gpusort.strategy = cpu".into());
        }
        let ordinal = match o.device {
            DeviceChoice::Cpu => return cpu("gpusort.device = cpu".into()),
            DeviceChoice::Auto => 0,
            DeviceChoice::Gpu(n) => n,
        };
        if rows < o.min_rows {
            return cpu(format!("{rows} rows < gpusort.min_rows = {}", o.min_rows));
        }
        match gpu_backend(ordinal) {
            Ok(gpu) => Ok(SortPath::Gpu(gpu)),
            Err(reason) if o.device == DeviceChoice::Auto => cpu(reason),
            Err(reason) => Err(GpuSortExecError::DeviceUnavailable {
                device: ordinal,
                reason,
            }
            .into()),
        }
    }
}

/// The rows of `batches` (taken as one sequence) at `indices`, as one batch.
fn gather(batches: &[RecordBatch], indices: &[u32]) -> Result<RecordBatch> {
    let mut starts = Vec::with_capacity(batches.len() + 1);
    starts.push(0usize);
    for b in batches {
        starts.push(starts.last().unwrap() + b.num_rows());
    }
    let pairs: Vec<(usize, usize)> = indices
        .iter()
        .map(|&i| {
            let i = i as usize;
            let b = starts.partition_point(|&s| s <= i) - 1;
            (b, i - starts[b])
        })
        .collect();
    let refs: Vec<&RecordBatch> = batches.iter().collect();
    Ok(interleave_record_batch(&refs, &pairs)?)
}

/// Rows a range-merge step takes when sorts run on the CPU.
const RANGE_MERGE_CPU_ROWS: usize = 4 << 20;

/// Batches a spilled run reads ahead in a heap merge (DataFusion's own spill readers' default).
const SPILL_READ_AHEAD: usize = 2;

/// Fewest batches of a stripe of a spilled run.
const MIN_STRIPE_BATCHES: usize = 32;

/// Stripes a sorted run of `batches` batches is spilled as (see [`crate::run`]): a writer per
/// four cores, at most four, and none shorter than [`MIN_STRIPE_BATCHES`].
fn spill_stripes(batches: usize) -> usize {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    (cores / 4).clamp(1, 4).min(batches / MIN_STRIPE_BATCHES).max(1)
}

/// Fewest batches each spilled run reads ahead during the range merge.
const RANGE_MERGE_MIN_READ_AHEAD: usize = 8;

/// Batches each of `runs` spilled runs reads ahead during a range merge of `rows`-row steps:
/// its share of a whole step, so that the next step's rows are read and decoded (on the
/// readers' own tasks) while this one sorts.
fn range_merge_read_ahead(rows: usize, runs: usize, batch_size: usize) -> usize {
    rows.div_ceil(runs.max(1) * batch_size.max(1))
        .max(RANGE_MERGE_MIN_READ_AHEAD)
}

/// Fewest rows a range-merge step takes; with less memory the heap merge runs.
const RANGE_MERGE_MIN_ROWS: usize = 1 << 16;

/// Memory the range merge holds with steps of `rows` rows over `runs` runs of batches of
/// `batch_size` rows: a step's rows read, their sorted copy and the sort of their keys; the
/// previous step's output, waiting for the consumer; and the batches each run reads ahead
/// (about the next step's rows, see [`range_merge_read_ahead`]).
fn range_merge_bytes(rows: usize, bytes_per_row: usize, keys: usize, runs: usize, batch_size: usize) -> usize {
    let ahead = range_merge_read_ahead(rows, runs, batch_size);
    rows * (3 * bytes_per_row + KEY_BYTES_PER_ROW_AND_KEY * keys.max(1) + 16 + 4)
        + runs * (ahead + 1) * batch_size * bytes_per_row
}

/// A run being read by the range merge: the batches read and not yet taken (with their sort
/// key columns), rows taken from the first one, and the rest of the run.
struct RunReader {
    stream: SendableRecordBatchStream,
    loaded: std::collections::VecDeque<(RecordBatch, Vec<ArrayRef>)>,
    /// Rows of the first loaded batch already taken.
    offset: usize,
    /// Rows loaded and not taken.
    rows: usize,
    done: bool,
}

/// A row of a loaded batch: its sort key columns and its index.
#[derive(Clone)]
struct KeyRef {
    keys: Vec<ArrayRef>,
    row: usize,
}

impl RunReader {
    fn new(stream: SendableRecordBatchStream) -> Self {
        Self {
            stream,
            loaded: Default::default(),
            offset: 0,
            rows: 0,
            done: false,
        }
    }

    /// Reads batches until `rows` rows are loaded or the run ends.
    async fn load(&mut self, rows: usize, expr: &LexOrdering) -> Result<()> {
        while !self.done && self.rows < rows {
            match self.stream.next().await {
                Some(batch) => {
                    let batch = batch?;
                    if batch.num_rows() == 0 {
                        continue;
                    }
                    let keys = expr
                        .iter()
                        .map(|e| e.expr.evaluate(&batch)?.into_array(batch.num_rows()))
                        .collect::<Result<Vec<_>>>()?;
                    self.rows += batch.num_rows();
                    self.loaded.push_back((batch, keys));
                }
                None => self.done = true,
            }
        }
        Ok(())
    }

    /// The last loaded row.
    fn last(&self) -> Option<KeyRef> {
        self.loaded.back().map(|(b, keys)| KeyRef {
            keys: keys.clone(),
            row: b.num_rows() - 1,
        })
    }

    /// Loaded rows before the first that `before` does not place ahead of `bound` (binary
    /// search: the loaded rows are sorted).
    fn count(&self, cmp: &KeyCmp, bound: &KeyRef, before: impl Fn(std::cmp::Ordering) -> bool) -> Result<usize> {
        let mut n = 0;
        for (i, (batch, keys)) in self.loaded.iter().enumerate() {
            let start = if i == 0 { self.offset } else { 0 };
            let c = cmp.comparator(keys, &bound.keys)?;
            let len = batch.num_rows();
            if before(c(len - 1, bound.row)) {
                n += len - start;
                continue;
            }
            let (mut lo, mut hi) = (start, len - 1);
            while lo < hi {
                let mid = (lo + hi) / 2;
                if before(c(mid, bound.row)) {
                    lo = mid + 1;
                } else {
                    hi = mid;
                }
            }
            return Ok(n + lo - start);
        }
        Ok(n)
    }

    /// Takes the next `n` loaded rows, as slices.
    fn take(&mut self, mut n: usize, out: &mut Vec<RecordBatch>) {
        self.rows -= n;
        while n > 0 {
            let (batch, _) = self.loaded.front().expect("rows loaded");
            let len = batch.num_rows() - self.offset;
            if n < len {
                out.push(batch.slice(self.offset, n));
                self.offset += n;
                return;
            }
            out.push(batch.slice(self.offset, len));
            self.loaded.pop_front();
            self.offset = 0;
            n -= len;
        }
    }
}

/// Compares rows of two batches' sort key columns in the sort's order.
struct KeyCmp {
    options: Vec<arrow::compute::SortOptions>,
}

impl KeyCmp {
    fn comparator(
        &self,
        left: &[ArrayRef],
        right: &[ArrayRef],
    ) -> Result<impl Fn(usize, usize) -> std::cmp::Ordering + use<>> {
        let cmps = left
            .iter()
            .zip(right)
            .zip(&self.options)
            .map(|((l, r), o)| arrow::array::make_comparator(l.as_ref(), r.as_ref(), *o))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(move |i: usize, j: usize| {
            for c in &cmps {
                match c(i, j) {
                    std::cmp::Ordering::Equal => continue,
                    o => return o,
                }
            }
            std::cmp::Ordering::Equal
        })
    }

    fn compare(&self, a: &KeyRef, b: &KeyRef) -> Result<std::cmp::Ordering> {
        Ok(self.comparator(&a.keys, &b.keys)?(a.row, b.row))
    }
}

/// The final merge by key ranges ([`GpuSorter::range_merge`]).
///
/// Each step reads about `chunk_rows / runs` more rows of every run, takes as splitter the
/// smallest of the runs' last loaded rows (runs read to the end do not count), and takes from
/// every run its loaded rows below the splitter: all rows of the whole input below it, since
/// each run is sorted and loaded at least that far. Those rows, concatenated in run order,
/// are sorted by their keys alone — stably, so ties keep their run order, which is input order
/// — and gathered in parallel. When no loaded row is below the splitter, the rows equal to it
/// come first in the output: they leave run by run, unsorted (they are all equal).
///
/// The steps replace a row-by-row heap merge (one core) with sorts that use the GPU or every
/// core; each step's memory is reserved once for the whole merge.
struct RangeMerge {
    sorter: GpuSorter,
    readers: Vec<RunReader>,
    chunk_rows: usize,
    remaining: usize,
    /// Steps taken (for the timeline).
    step: usize,
}

impl RangeMerge {
    async fn next_step(&mut self) -> Result<Option<Vec<RecordBatch>>> {
        if self.remaining == 0 {
            self.finish();
            return Ok(None);
        }
        let merge_time = self.sorter.metrics.merge_time.clone();
        let expr = self.sorter.expr.clone();
        let cmp = KeyCmp {
            options: expr.iter().map(|e| e.options).collect(),
        };
        let open = self.readers.iter().filter(|r| !r.done).count().max(1);
        let per_run = (self.chunk_rows / open).max(1);
        // All runs at once: spilled runs decode on their own tasks, in parallel.
        let step = self.step;
        self.step += 1;
        futures::future::try_join_all(self.readers.iter_mut().map(|r| r.load(per_run, &expr))).await?;
        log::debug!(target: "gpusort::timeline", "merge step {step}: runs loaded");
        let _timer = merge_time.timer();
        // The splitter: the smallest last loaded row of the runs that go on.
        let mut splitter: Option<KeyRef> = None;
        for r in self.readers.iter().filter(|r| !r.done) {
            if let Some(last) = r.last()
                && match &splitter {
                    None => true,
                    Some(s) => cmp.compare(&last, s)?.is_lt(),
                }
            {
                splitter = Some(last);
            }
        }
        let mut parts = vec![];
        match splitter {
            None => {
                // Every run is loaded to its end: all that is left.
                for r in self.readers.iter_mut() {
                    let n = r.rows;
                    r.take(n, &mut parts);
                }
            }
            Some(s) => {
                let counts = self
                    .readers
                    .iter()
                    .map(|r| r.count(&cmp, &s, |o| o.is_lt()))
                    .collect::<Result<Vec<_>>>()?;
                if counts.iter().all(|c| *c == 0) {
                    // Nothing below the splitter: the rows equal to it are the smallest left.
                    drop(_timer);
                    let mut equal = vec![];
                    for i in 0..self.readers.len() {
                        loop {
                            let r = &mut self.readers[i];
                            let n = r.count(&cmp, &s, |o| o.is_le())?;
                            let all = n == r.rows;
                            r.take(n, &mut equal);
                            if !all || r.done {
                                break;
                            }
                            r.load(r.rows + self.sorter.batch_size, &expr).await?;
                        }
                    }
                    self.sorter.metrics.range_merge_steps.add(1);
                    return Ok(Some(self.emit(equal)));
                }
                for (r, n) in self.readers.iter_mut().zip(counts) {
                    r.take(n, &mut parts);
                }
            }
        }
        drop(_timer);
        if parts.is_empty() {
            self.finish();
            return Ok(None);
        }
        self.sorter.metrics.range_merge_steps.add(1);
        let limit = (self.remaining != usize::MAX).then_some(self.remaining);
        let rows: usize = parts.iter().map(|p| p.num_rows()).sum();
        log::debug!(target: "gpusort::timeline", "merge step {step}: {rows} rows in {} slices", parts.len());
        if let Some(sorted) = self.sort_on_gpu(&parts, rows, limit).await? {
            // The step's input (slices of the loaded run batches, often their last
            // references) is freed on another core.
            rayon::spawn(move || drop(parts));
            let slices = self.sorter.slices(&sorted)?;
            let shared = (sorted.num_rows(), get_record_batch_memory_size(&sorted));
            log::debug!(target: "gpusort::timeline", "merge step {step}: sorted on the GPU");
            return Ok(Some(self.emit_slices(slices, Some(shared))));
        }
        let permutation = self.sorter.sort_keys(&parts, limit).await?;
        log::debug!(target: "gpusort::timeline", "merge step {step}: keys sorted");
        let batch_size = self.sorter.batch_size;
        let gathered = blocking(move || {
            permutation
                .values()
                .par_chunks(batch_size)
                .map(|chunk| gather(&parts, chunk))
                .collect::<Result<Vec<_>>>()
        })
        .await?;
        log::debug!(target: "gpusort::timeline", "merge step {step}: gathered");
        Ok(Some(self.emit(gathered)))
    }

    /// The rows of `parts` (`rows` of them) sorted whole on the GPU, the first `limit` of
    /// them: the parts go through a GPU session as a run's input batches do, and the sorted
    /// rows come back in one batch. `None` when the step's sort is not for the GPU (the key
    /// sort and a gather on every core then run instead) or when the GPU failed (the reason is
    /// kept for the metrics).
    ///
    /// On the GPU, moving the rows through it costs less than a gather of them on the host:
    /// the host only stages and encodes, and the download lands in reused pinned memory.
    async fn sort_on_gpu(
        &mut self,
        parts: &[RecordBatch],
        rows: usize,
        limit: Option<usize>,
    ) -> Result<Option<RecordBatch>> {
        let sorter = &mut self.sorter;
        if !matches!(sorter.choose_path(rows)?, SortPath::Gpu(_)) {
            return Ok(None);
        }
        sorter.session = None;
        for part in parts {
            sorter.push_to_gpu(part)?;
            if sorter.session.is_none() {
                break;
            }
        }
        let Some((session, gpu)) = sorter.session.take() else {
            return Ok(None);
        };
        match sorter.finish_session(session, gpu, limit).await? {
            Ok(sorted) => Ok(Some(sorted)),
            Err(reason) => {
                sorter.session_failed = Some(reason);
                Ok(None)
            }
        }
    }

    /// Counts `batches` as output (cut to what the `LIMIT` has left).
    fn emit(&mut self, batches: Vec<RecordBatch>) -> Vec<RecordBatch> {
        self.emit_slices(batches, None)
    }

    /// As [`Self::emit`]; with `shared = Some((rows, bytes))` the batches are slices of one
    /// batch of `rows` rows holding `bytes`, and each counts its share of them
    /// ([`GpuSortMetrics::record_output_slice`]).
    fn emit_slices(&mut self, batches: Vec<RecordBatch>, shared: Option<(usize, usize)>) -> Vec<RecordBatch> {
        let mut out = Vec::with_capacity(batches.len());
        for b in batches {
            if self.remaining == 0 {
                break;
            }
            let b = if b.num_rows() > self.remaining {
                b.slice(0, self.remaining)
            } else {
                b
            };
            self.remaining = self.remaining.saturating_sub(b.num_rows());
            match shared {
                Some((rows, bytes)) => self.sorter.metrics.record_output_slice(b.num_rows(), rows, bytes),
                None => {
                    (&b).record_output(&self.sorter.metrics.baseline);
                }
            }
            out.push(b);
        }
        out
    }

    /// Closes the runs (spill files are deleted when their readers go) and frees the memory.
    fn finish(&mut self) {
        self.readers.clear();
        self.sorter.reservation.free();
    }
}

/// Runs `f` on tokio's blocking threads (sorts, gathers and spill writes are CPU or I/O
/// bound).
async fn blocking<T: Send + 'static>(f: impl FnOnce() -> Result<T> + Send + 'static) -> Result<T> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| GpuSortExecError::Task(e.to_string()))?
}

/// The error for a memory pool too small to make progress: what was needed, for what.
fn too_small(needed: usize, what: &str, refused: DataFusionError) -> DataFusionError {
    DataFusionError::ResourcesExhausted(format!(
        "GpuSortExec needs at least {} more {what} and cannot spill its way below that \
         (raise the memory limit): {refused}",
        human_readable_size(needed)
    ))
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

/// Runs `request` on `path`; a GPU failure (out of memory, a driver error) reruns it on the
/// CPU and records why.
fn run_sort(
    request: &SortRequest<'_>,
    path: SortPath,
    gpu_limit: Option<usize>,
    metrics: &GpuSortMetrics,
) -> Result<SortOutput, GpuSortExecError> {
    let reason = match path {
        SortPath::Gpu(gpu) => match gpu.sort_within(&gpu_request(request), gpu_limit) {
            Ok(out) => {
                metrics.record(&out.stats, Some(&gpusort::SortBackend::name(gpu.as_ref())));
                return Ok(out);
            }
            // The CPU would fail the same way.
            Err(CudaSortError::Core(e)) => return Err(e.into()),
            Err(e) => Some(format!("GPU failed: {e}")),
        },
        SortPath::Cpu { reason } => reason,
    };
    if let Some(reason) = reason {
        metrics.cpu_fallback.add(reason);
    }
    let out = gpusort::SortBackend::sort(cpu_backend(), request)?;
    metrics.record(&out.stats, None);
    Ok(out)
}

/// `request` as a GPU sort runs it: with the longer string prefixes a device sorts cheaply
/// ([`GPU_STRING_PREFIX_BYTES`]).
fn gpu_request<'a>(request: &SortRequest<'a>) -> SortRequest<'a> {
    request.clone().with_encoder_options(EncoderOptions {
        max_prefix_bytes: GPU_STRING_PREFIX_BYTES,
    })
}

/// `batch` without the evaluated key columns [`GpuSorter::sort_input`] appended after the
/// input's `width` columns.
fn drop_extended_columns(batch: RecordBatch, width: usize) -> Result<RecordBatch> {
    if batch.num_columns() > width {
        Ok(batch.project(&(0..width).collect::<Vec<_>>())?)
    } else {
        Ok(batch)
    }
}

/// A slice of string or binary view columns keeps every data buffer of the whole sorted
/// column alive, and operators that concatenate such slices copy those buffers each time
/// (quadratic in the output with small batches): view columns of an output batch keep only the
/// bytes their rows use.
fn compact_views(batch: RecordBatch) -> Result<RecordBatch> {
    use arrow::array::{Array, AsArray};
    use arrow::datatypes::DataType;
    if !batch
        .columns()
        .iter()
        .any(|c| matches!(c.data_type(), DataType::Utf8View | DataType::BinaryView))
    {
        return Ok(batch);
    }
    let columns = batch
        .columns()
        .iter()
        .map(|c| -> ArrayRef {
            match c.data_type() {
                DataType::Utf8View if !c.as_string_view().data_buffers().is_empty() => {
                    Arc::new(c.as_string_view().gc())
                }
                DataType::BinaryView if !c.as_binary_view().data_buffers().is_empty() => {
                    Arc::new(c.as_binary_view().gc())
                }
                _ => Arc::clone(c),
            }
        })
        .collect();
    Ok(RecordBatch::try_new_with_options(
        batch.schema(),
        columns,
        &RecordBatchOptions::new().with_row_count(Some(batch.num_rows())),
    )?)
}
