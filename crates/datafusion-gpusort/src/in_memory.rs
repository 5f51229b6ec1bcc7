//! [`InMemorySorter`]: sorts rows held in memory on the chosen backend — the GPU, or the CPU
//! with the reason — for every sort an external sort makes: the whole input when it fits, each
//! run, the buffered rows of a TopK sort, and each step of the range merge.
//!
//! # Algorithm
//!
//! 1. **Path.** A sort goes to the GPU when `gpusort.device` and `gpusort.strategy` allow one,
//!    a device is usable and the rows reach `gpusort.min_rows`; else to the CPU backend, and
//!    the reason is recorded in the `cpu_fallback` metric. When `gpusort.devices` names two
//!    GPUs or more and the rows make two key ranges or more, the sort splits over the GPUs
//!    ([`MultiGpuBackend`]: one key range a GPU, all at once, concatenated in order).
//! 2. **Sort input.** Sort expressions that are not plain columns are evaluated and appended
//!    to the batch as extra columns, which the sort spec then names; they are dropped from the
//!    sorted output.
//! 3. **Streaming to the GPU.** Without a `fetch`, when sorts run on a GPU, each input batch is
//!    pushed, as it arrives, into a [`GpuSortSession`]: its fixed-width columns are staged in
//!    pinned memory and cross PCIe while the rest of the input is read, so the sort of the
//!    buffered rows only encodes the key columns, sorts and downloads. The batches are kept as
//!    well: when the sort turns out to be for the CPU (fewer rows than `gpusort.min_rows`) or
//!    the GPU fails (out of memory, a driver error), the session is dropped and the same rows
//!    sort on the CPU, with the reason in `cpu_fallback`. A sort split over several GPUs does
//!    not stream: its ranges are known only once every row is in.
//! 4. **Sort.** The rows sort whole (the payload moved by the GPU's record sort or the CPU's
//!    radix passes), or, for a range-merge step on the CPU, by their key columns alone into a
//!    permutation that the step gathers through.
//! 5. **Output.** Sorted rows are cut into `batch_size` slices whose view columns keep only
//!    their own bytes.

use std::sync::Arc;
use std::thread::JoinHandle;

use arrow::array::{ArrayRef, RecordBatch, RecordBatchOptions, UInt32Array};
use arrow::datatypes::{Field, Schema, SchemaRef};
use datafusion::common::utils::memory::get_record_batch_memory_size;
use datafusion::error::{DataFusionError, Result};
use datafusion::physical_expr::LexOrdering;
use datafusion::physical_expr::expressions::Column;
use gpusort::cpu::gather::concat_batches;
use gpusort::{SortKey, SortOutput, SortRequest, SortSpec, SplitOptions};
use gpusort_cuda::{
    CudaBackend, CudaSortError, GpuSortSession, MultiGpuBackend, PinnedPool, SortFootprint, SortedRows, block_lens,
    gpu_encoder_options,
};
use rayon::prelude::*;

use crate::config::{DeviceChoice, GpuSortConfig, StrategyChoice};
use crate::device::{cpu_backend, gpu_backend, gpu_backends};
use crate::device_output::DeviceOutput;
use crate::device_scan::{Call, DeviceScan, ScanFiles};
use crate::error::GpuSortExecError;
use crate::metrics::GpuSortMetrics;
use crate::narrow_keys::{narrow_decimal, narrows, narrows_keys};

/// Output batches from which [`InMemorySorter::slices`] cuts them on all cores.
const PARALLEL_SLICES: usize = 64;

/// Key bytes per row and sort key a sort holds on the host besides its input and output (key
/// words, double buffered, and the permutation).
pub(crate) const KEY_BYTES_PER_ROW_AND_KEY: usize = 24;

/// Where a sort runs.
pub(crate) enum SortPath {
    Gpu(Arc<CudaBackend>),
    /// Split by key ranges over several GPUs (`gpusort.devices`).
    Gpus(Arc<MultiGpuBackend>),
    Cpu {
        reason: Option<String>,
    },
}

impl SortPath {
    /// Whether the sort runs on a GPU (or several).
    fn is_gpu(&self) -> bool {
        !matches!(self, Self::Cpu { .. })
    }
}

/// Cuts sorted rows into output batches of `batch_size` rows whose view columns keep only
/// their own bytes when `compact_views` (`gpusort.compact_output_views`).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Slicer {
    pub(crate) batch_size: usize,
    compact_views: bool,
}

impl Slicer {
    /// Batches of `batch_size` rows, their view columns compacted when `compact_views`.
    pub(crate) fn new(batch_size: usize, compact_views: bool) -> Self {
        Self {
            batch_size: batch_size.max(1),
            compact_views,
        }
    }

    /// Whether the batches' view columns are compacted (a copy of their bytes).
    pub(crate) fn compacts_views(&self) -> bool {
        self.compact_views
    }

    /// `batches` already cut, their view columns compacted (on all cores) but for those of
    /// `done` (compacted where they were cut).
    pub(crate) fn compact(&self, batches: Vec<RecordBatch>, done: &[usize]) -> Result<Vec<RecordBatch>> {
        batches.into_par_iter().map(|b| compact_views(b, done)).collect()
    }

    /// Whether [`Self::compact`] has anything to do for batches of `schema`.
    pub(crate) fn compacts_any(&self, schema: &SchemaRef, done: &[usize]) -> bool {
        self.compact_views && has_views_to_compact(schema, done)
    }

    /// `sorted` in batches of at most `batch_size` rows, cut on all cores when there are many.
    pub(crate) fn slices(&self, sorted: &RecordBatch) -> Result<Vec<RecordBatch>> {
        let n = sorted.num_rows();
        let count = n.div_ceil(self.batch_size);
        let slice = |i: usize| {
            let start = i * self.batch_size;
            let slice = sorted.slice(start, self.batch_size.min(n - start));
            if self.compact_views {
                compact_views(slice, &[])
            } else {
                Ok(slice)
            }
        };
        // Slices alone cost a microsecond each: only compacting them is worth rayon's pool (a
        // range's 128 slices waited there behind other work).
        if count < PARALLEL_SLICES || !self.compact_views {
            (0..count).map(slice).collect()
        } else {
            (0..count).into_par_iter().map(slice).collect()
        }
    }
}

/// The rows of an in-memory sort: one batch, or (on request, for more than
/// `gpusort.output_range_rows`) a GPU session's rows still on the device, to come down a range
/// at a time ([`DeviceOutput`]), or brought down in such ranges, each a batch of its own.
pub(crate) enum SortedOutput {
    Batch(RecordBatch),
    OnDevice(Box<DeviceOutput>),
    Ranges(Vec<RecordBatch>),
}

impl SortedOutput {
    /// The rows as batches on the host (`OnDevice` is only made when [`Delivery::OnDevice`]
    /// asked for it, whose callers take it apart).
    fn into_batches(self) -> Vec<RecordBatch> {
        match self {
            Self::Batch(batch) => vec![batch],
            Self::Ranges(ranges) => ranges,
            Self::OnDevice(_) => unreachable!("rows stay on the device only when asked to"),
        }
    }
}

/// Takes a merge step's sorted rows a range at a time as they come down (on the blocking
/// thread that brings them down); `Ok(false)` when nobody wants more.
pub(crate) type RangeSink = Box<dyn FnMut(RecordBatch) -> Result<bool> + Send>;

/// How a GPU session's sorted rows come to the host.
///
/// `Ranges` is for rows that a range merge reads on (an external sort's runs and its steps'
/// output): each range of `gpusort.run_range_rows` rows comes down into pinned blocks of
/// its own, all of one size class a column part, so a run's first ranges go back to the pool
/// once the merge read past them and a step's ranges come down into them, where blocks of one
/// piece a run or step stayed out until its last row was read and every step pinned ~2.5 GB
/// anew (0.3 s of a step on TPC-H lineitem under a 4 GiB GPU budget, stop 53).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Delivery {
    /// In one batch.
    Whole,
    /// Left on the device to come down a range at a time ([`DeviceOutput`]) when there are
    /// more than `gpusort.output_range_rows`, else in one batch.
    OnDevice,
    /// In ranges of `gpusort.run_range_rows`, each a batch, all brought down now; the
    /// session's input is released first, once the rows are sorted on the device, so that the
    /// ranges reuse its pinned blocks.
    Ranges,
}

/// What a sort that read its files on the GPU made of them: their rows sorted, or sorted runs
/// to merge (and the rows of a run cut from the input, the merge's steps' size).
pub(crate) enum ScanOutput {
    Sorted(SortedOutput),
    /// Each run's rows, in ranges of `gpusort.run_range_rows` ([`Delivery::Ranges`]).
    Runs(Vec<Vec<RecordBatch>>, Option<usize>),
}

/// The fewest rows a GPU sort must hold to cut the input into runs of its size: a GPU sort
/// costs a millisecond or more however small (launches, copies, synchronizations), which is
/// what a core takes to sort a few thousand rows. Under a GPU budget of 64 KiB, runs of the one
/// row it held made a batch a run, each sorted on the GPU (or failing there) and merged: a
/// 300,000-row sort did not finish in 240 s on the H200 (stop 46).
pub(crate) const MIN_GPU_RUN_ROWS: usize = 4096;

/// Rows of a device scan's files read on the host to size its runs by ([`InMemorySorter::run_rows`]).
const SAMPLE_ROWS: usize = 8192;

/// Sorts rows held in memory (see the module docs).
pub(crate) struct InMemorySorter {
    pub(crate) schema: SchemaRef,
    pub(crate) expr: LexOrdering,
    options: GpuSortConfig,
    pub(crate) batch_size: usize,
    pub(crate) metrics: GpuSortMetrics,
    /// The buffered batches on their way to the GPU (see the module docs), and the backend;
    /// or why they are not (a GPU failure, for the sort of the buffered rows).
    session: Option<(GpuSortSession, Arc<CudaBackend>)>,
    session_failed: Option<String>,
    /// Whether some buffered rows went to the GPU session hollow
    /// (`gpusort.release_uploaded_input`): they can no longer sort on the CPU.
    released: bool,
}

impl InMemorySorter {
    /// A sorter of rows of `schema` by `expr` into batches of `batch_size` rows.
    pub(crate) fn new(
        schema: SchemaRef,
        expr: LexOrdering,
        options: GpuSortConfig,
        batch_size: usize,
        metrics: GpuSortMetrics,
    ) -> Self {
        Self {
            schema,
            expr,
            options,
            batch_size: batch_size.max(1),
            metrics,
            session: None,
            session_failed: None,
            released: false,
        }
    }

    /// A sorter of the same configuration that takes over the GPU session of the buffered rows
    /// (and why there is none): it sorts them on a task of its own while this one takes the
    /// next rows into a new session.
    pub(crate) fn detach(&mut self) -> Self {
        Self {
            schema: Arc::clone(&self.schema),
            expr: self.expr.clone(),
            options: self.options.clone(),
            batch_size: self.batch_size,
            metrics: self.metrics.clone(),
            session: self.session.take(),
            session_failed: self.session_failed.take(),
            released: std::mem::take(&mut self.released),
        }
    }

    /// Pushes `batch` into the GPU session of the buffered rows ([`Self::push`]). Returns the
    /// batch to buffer: with `gpusort.release_uploaded_input`, once the buffered rows (`rows`,
    /// with this batch's) reach `gpusort.min_rows` and `fit` (the caller's run size, within
    /// which one GPU sort holds them), the columns the GPU took are hollow
    /// ([`gpusort::hollow`]).
    pub(crate) fn push_to_gpu(&mut self, batch: RecordBatch, rows: usize, fit: Option<usize>) -> Result<RecordBatch> {
        // Past `min_rows` the sort is the GPU's and, within its run size, fits it: what goes
        // up need not stay on the host. Rows past what the GPU holds keep the CPU fallback.
        let release =
            self.options.release_uploaded_input && rows >= self.options.min_rows && fit.is_some_and(|fit| rows <= fit);
        if !self.push(&batch, release)? {
            return Ok(batch);
        }
        let Some((session, _)) = &self.session else {
            return Ok(batch);
        };
        // The session's columns are the batch's, then the sort expressions' values.
        let released: Vec<usize> = (session.released_columns().iter().copied())
            .filter(|&c| c < batch.num_columns())
            .collect();
        if released.is_empty() {
            return Ok(batch);
        }
        self.released = true;
        Ok(gpusort::hollow::hollow_batch(&batch, &released).0)
    }

    /// Pushes `batch` into the GPU session of the buffered rows, starting one with the first
    /// batch when sorts run on a GPU (`release`: from this batch on, the session keeps only
    /// the host columns it reads). A failed push drops the session: the rows sort on the CPU,
    /// with the reason. Whether the session took the batch.
    fn push(&mut self, batch: &RecordBatch, release: bool) -> Result<bool> {
        if self.session_failed.is_some() {
            return Ok(false);
        }
        let (extended, spec) = match self.sort_input(batch, true) {
            Ok(input) => input,
            Err(e) => {
                // A decimal out of its precision, say: the rows sort on the CPU, which reads it
                // as it is (or fails the same way on an expression).
                self.session = None;
                self.session_failed = Some(format!("GPU failed: {e}"));
                return Ok(false);
            }
        };
        if self.session.is_none() {
            // The row count is not known yet: `gpusort.min_rows` is checked at the sort.
            let Ok(SortPath::Gpu(gpu)) = self.choose_path(usize::MAX) else {
                return Ok(false);
            };
            match self.begin_session(&gpu, extended.schema(), spec, false) {
                Ok(s) => self.session = Some((s, gpu)),
                Err(e) => {
                    self.session_failed = Some(format!("GPU failed: {e}"));
                    return Ok(false);
                }
            }
        }
        let (session, _) = self.session.as_mut().expect("started above");
        if release {
            session.release_input();
        }
        if let Err(e) = session.push(&extended) {
            self.session = None;
            self.session_failed = Some(format!("GPU failed: {e}"));
            return Ok(false);
        }
        Ok(true)
    }

    /// The error of a sort whose GPU failed after its rows were released from the host.
    fn released_error(&self, reason: &str) -> Option<datafusion::error::DataFusionError> {
        self.released.then(|| {
            GpuSortExecError::Released {
                reason: reason.to_string(),
            }
            .into()
        })
    }

    /// Memory a sort of `batch`'s rows needs besides the rows: their sorted copy, the key
    /// columns (their values when they are expressions), the key words and the permutation.
    /// It is reserved with the rows, so a run can always be sorted the fast way (the payload
    /// moved by the GPU or the CPU radix passes) and then spilled, however full the pool is.
    pub(crate) fn work_bytes_of(&self, batch: &RecordBatch) -> usize {
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

    /// `sorted` as `batch_size` slices whose view columns keep only their own bytes (with
    /// `gpusort.compact_output_views`, the default; else the slices as they are).
    ///
    /// Slicing costs ~0.1 µs per column of each slice (2.9 ms for 1221 slices of 21 columns on
    /// the H100 machine, on the path between the sort and the first output batch), so many
    /// slices are cut on all cores.
    pub(crate) fn slices(&self, sorted: &RecordBatch) -> Result<Vec<RecordBatch>> {
        self.slicer().slices(sorted)
    }

    /// How this sorter cuts sorted rows into output batches.
    pub(crate) fn slicer(&self) -> Slicer {
        Slicer::new(self.batch_size, self.options.compact_output_views)
    }

    /// The most rows of one run: `gpusort.max_run_rows`, and what one GPU sort of batches
    /// like `batch` can take when sorts run on a GPU, where that is at least
    /// [`MIN_GPU_RUN_ROWS`] and one batch. A GPU that holds fewer (a `gpu_memory_limit` of a
    /// few kilobytes) does not cut the runs: the sort is then larger than the GPU takes and
    /// runs on the CPU, once, instead of as a run per batch, each failing on the GPU first.
    pub(crate) fn run_rows(&self, batch: &RecordBatch) -> Option<usize> {
        let configured = (self.options.max_run_rows > 0).then_some(self.options.max_run_rows);
        let least = MIN_GPU_RUN_ROWS.max(batch.num_rows());
        let max_rows = |gpu: &CudaBackend| {
            self.sort_input(batch, true).ok().and_then(|(extended, spec)| {
                let request = SortRequest::new(&extended, &spec).with_strategy(self.options.strategy.strategy());
                gpu.max_rows_within(&gpu_request(&request), self.gpu_limit())
                    .ok()
                    .filter(|&rows| rows >= least)
            })
        };
        let gpu = match self.choose_path(usize::MAX) {
            Ok(SortPath::Gpu(gpu)) => max_rows(&gpu),
            // Each GPU sorts one key range: the smallest GPU's rows on each, less a tenth for
            // ranges the sample left larger than the mean.
            Ok(SortPath::Gpus(multi)) => multi
                .gpus()
                .iter()
                .map(|g| max_rows(g))
                .collect::<Option<Vec<usize>>>()
                .and_then(|rows| rows.into_iter().min())
                .map(|least| (least / 10 * 9 * multi.gpus().len()).max(1)),
            _ => None,
        };
        match (configured, gpu) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    pub(crate) fn gpu_limit(&self) -> Option<usize> {
        (self.options.gpu_memory_limit.0 > 0).then_some(self.options.gpu_memory_limit.0)
    }

    /// Sorts `batches` by their key columns alone and returns the permutation (its first
    /// `limit` rows).
    pub(crate) async fn sort_keys(&mut self, batches: &[RecordBatch], limit: Option<usize>) -> Result<UInt32Array> {
        let rows: usize = batches.iter().map(|b| b.num_rows()).sum();
        let spec = key_spec(&self.expr);
        let key_parts = batches
            .iter()
            .map(|b| self.key_columns(b, false))
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

    /// Sorts `batches` in one piece and returns the sorted rows (at most `limit`): through the
    /// GPU session that holds them when there is one (and the sort is for the GPU), else
    /// concatenated and sorted on the chosen path. The caller has reserved the working memory
    /// ([`Self::work_bytes_of`]).
    pub(crate) async fn sort_batches(
        &mut self,
        batches: Vec<RecordBatch>,
        limit: Option<usize>,
    ) -> Result<RecordBatch> {
        let sorted = self.sort_batches_out(batches, limit, Delivery::Whole).await?;
        Ok(sorted.into_batches().pop().expect("one batch"))
    }

    /// The rows of a run (sorted as [`Self::sort_batches`] does), in ranges where a GPU session
    /// sorted them ([`Delivery::Ranges`]), else in one batch.
    pub(crate) async fn sort_run(
        &mut self,
        batches: Vec<RecordBatch>,
        limit: Option<usize>,
    ) -> Result<Vec<RecordBatch>> {
        let delivery = self.run_delivery();
        Ok(self.sort_batches_out(batches, limit, delivery).await?.into_batches())
    }

    /// Most ranges the sorted rows of a merge step of `rows` rows come down in (one when they
    /// come down whole).
    pub(crate) fn step_ranges(&self, rows: usize) -> usize {
        match self.options.run_range_rows {
            0 => 1,
            range_rows => rows.div_ceil(range_rows).max(1),
        }
    }

    /// How the sorted rows of a run or a merge step come down: in ranges with
    /// `gpusort.run_range_rows`, else whole.
    fn run_delivery(&self) -> Delivery {
        match self.options.run_range_rows {
            0 => Delivery::Whole,
            _ => Delivery::Ranges,
        }
    }

    /// [`Self::sort_batches`], the sorted rows delivered as `delivery` asks where a GPU session
    /// sorted them.
    pub(crate) async fn sort_batches_out(
        &mut self,
        mut batches: Vec<RecordBatch>,
        limit: Option<usize>,
        delivery: Delivery,
    ) -> Result<SortedOutput> {
        let rows = batches.iter().map(|b| b.num_rows()).sum();
        let mut path = self.choose_path(rows)?;
        if let Some(reason) = self.session_failed.take() {
            path = SortPath::Cpu { reason: Some(reason) };
        }
        if let (SortPath::Gpu(_), Some((session, gpu))) = (&path, self.session.take()) {
            debug_assert_eq!(session.num_rows(), rows, "the session holds the buffered rows");
            match self
                .finish_session(session, gpu, limit, delivery, batches, None)
                .await?
            {
                Ok(sorted) => {
                    self.released = false;
                    return Ok(sorted);
                }
                Err((reason, back)) => {
                    batches = back;
                    path = SortPath::Cpu { reason: Some(reason) };
                }
            }
        }
        self.session = None;
        // Released rows sort through their session or not at all (on the CPU, or split over
        // GPUs, they would sort hollow).
        let reason = match &path {
            SortPath::Cpu { reason: Some(r) } => r.as_str(),
            _ => "the rows did not sort through their GPU session",
        };
        if let Some(e) = self.released_error(reason) {
            return Err(e);
        }
        let input = if batches.len() == 1 {
            batches.into_iter().next().unwrap()
        } else {
            let _timer = self.metrics.concat_time.timer();
            let batch = concat_batches(&self.schema, &batches).map_err(GpuSortExecError::from)?;
            drop(batches);
            batch
        };
        Ok(SortedOutput::Batch(self.sort(input, path, limit).await?))
    }

    /// Sorts the rows of `session` on the GPU and delivers them as `delivery` asks: in ranges
    /// or whole, handed to `sink` as each comes down where there is one (the output is then
    /// empty). `input` (the batches the session read, kept for the CPU) is released once the
    /// rows are sorted on the device: on another core, or before the first range comes down
    /// for [`Delivery::Ranges`]. `Err(reason)`, with `input` back, when the GPU failed and
    /// the rows must sort on the CPU.
    #[allow(clippy::type_complexity)]
    async fn finish_session(
        &mut self,
        session: GpuSortSession,
        gpu: Arc<CudaBackend>,
        limit: Option<usize>,
        delivery: Delivery,
        input: Vec<RecordBatch>,
        sink: Option<RangeSink>,
    ) -> Result<Result<SortedOutput, (String, Vec<RecordBatch>)>> {
        let timer = self.metrics.baseline.elapsed_compute().clone();
        let metrics = self.metrics.clone();
        let width = self.schema.fields().len();
        let range_rows = match delivery {
            Delivery::Whole => 0,
            Delivery::OnDevice => self.options.output_range_rows,
            Delivery::Ranges => self.options.run_range_rows,
        };
        let kept = limit.unwrap_or(usize::MAX).min(session.num_rows());
        let ranges = range_rows > 0 && kept > range_rows;
        // Rows left on the device to come down in ranges: every view column's values are laid
        // out there for them (not only a view key's), where the device memory allows. Their
        // blocks are pinned ahead while the device sorts. Not so for the ranges of a run or a
        // step: a device scan pins a run's blocks ahead of the run ([`pin_ahead_like`]; two
        // threads pinning at once took twice as long, stop 54), and a step's input gives its
        // blocks back once sorted.
        let left_on_device = ranges && delivery == Delivery::OnDevice;
        let session =
            (session.with_output_views(left_on_device)).with_output_ranges(if left_on_device { range_rows } else { 0 });
        let out = blocking(move || {
            let _timer = timer.timer();
            let device = gpusort::SortBackend::name(gpu.as_ref());
            let rows = match session.finish_sorted(limit) {
                Ok(rows) => rows,
                // The CPU would fail the same way.
                Err(CudaSortError::Core(e)) => return Err(GpuSortExecError::from(e).into()),
                Err(e) => return Ok(Err((format!("GPU failed: {e}"), input))),
            };
            if left_on_device {
                rayon::spawn(move || drop(input));
                let output = DeviceOutput::new(rows, device, width, range_rows, metrics.clone());
                return Ok(Ok(SortedOutput::OnDevice(Box::new(output))));
            }
            let down = ComeDown {
                width,
                metrics: &metrics,
                device: &device,
            };
            if !ranges {
                return down.whole(rows, input, sink);
            }
            down.in_ranges(rows, range_rows, input, sink)
                .map(|b| Ok(SortedOutput::Ranges(b)))
        })
        .await;
        log::debug!(target: "gpusort::timeline", "GPU session finished");
        out
    }

    /// Sorts `input` on `path` and returns the sorted rows (at most `limit`).
    async fn sort(&mut self, input: RecordBatch, path: SortPath, limit: Option<usize>) -> Result<RecordBatch> {
        let _timer = self.metrics.baseline.elapsed_compute().timer();
        let (extended, spec, path) = match (self.sort_input(&input, path.is_gpu()), path.is_gpu()) {
            (Ok((extended, spec)), _) => (extended, spec, path),
            (Err(e), true) => {
                let (extended, spec) = self.sort_input(&input, false)?;
                let reason = Some(format!("GPU failed: {e}"));
                (extended, spec, SortPath::Cpu { reason })
            }
            (Err(e), false) => return Err(e),
        };
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
    /// columns appended) and the sort specification over it. `for_gpu`: a sort on a GPU, for
    /// which decimal key columns are narrowed (`narrow_keys.rs`) where that lets the device
    /// encode the key.
    fn sort_input(&self, input: &RecordBatch, for_gpu: bool) -> Result<(RecordBatch, SortSpec)> {
        let plain = self.column_keys(input.num_columns());
        let narrow = for_gpu
            && plain
                .as_ref()
                .is_some_and(|keys| narrows_keys(keys.iter().map(|k| input.schema_ref().field(k.column).data_type())));
        if let Some(keys) = plain.filter(|_| !narrow) {
            // Every sort expression is a column of the input: the input as it is.
            return Ok((input.clone(), SortSpec::new(keys)));
        }
        let mut columns: Vec<ArrayRef> = input.columns().to_vec();
        let mut fields: Vec<Arc<Field>> = input.schema().fields().iter().cloned().collect();
        let mut keys = Vec::with_capacity(self.expr.len());
        for e in self.expr.iter() {
            let column = match e.expr.downcast_ref::<Column>() {
                Some(c) if narrow && narrows(input.schema_ref().field(c.index()).data_type()) => {
                    let values = narrow_decimal(input.column(c.index()).as_ref())?;
                    let field = input.schema_ref().field(c.index());
                    fields.push(Arc::new(Field::new(
                        format!("{} as Decimal64", field.name()),
                        values.data_type().clone(),
                        true,
                    )));
                    columns.push(values);
                    columns.len() - 1
                }
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

    /// The sort keys, when every sort expression is a column (of `columns`).
    fn column_keys(&self, columns: usize) -> Option<Vec<SortKey>> {
        (self.expr.iter())
            .map(|e| match e.expr.downcast_ref::<Column>() {
                Some(c) if c.index() < columns => Some(SortKey {
                    column: c.index(),
                    options: e.options,
                }),
                _ => None,
            })
            .collect()
    }

    /// The rows of `scan`'s files read and decoded on the GPU into a session and sorted there
    /// (left on the device to come down in ranges when many: `device_scan.rs`); where they are
    /// more than one GPU sort holds ([`Self::run_rows`] of a sample of them), in runs of whole
    /// row groups, each read into a session of its own and brought to the host sorted, for the
    /// caller to merge (`runs`: whether it may). `Err(reason)` when the device cannot read or
    /// sort them, before any row is emitted.
    pub(crate) async fn sort_device_scan(
        &mut self,
        scan: Arc<DeviceScan>,
        runs: bool,
    ) -> Result<Result<ScanOutput, String>> {
        let Some(keys) = self.column_keys(self.schema.fields().len()) else {
            return Ok(Err("a sort expression is not a column".into()));
        };
        if let Err(why) = self.gpu_by_choice() {
            // Known without the files' footers.
            return Ok(Err(why));
        }
        let files = match blocking(move || Ok(scan.open())).await? {
            Ok(files) => Arc::new(files),
            Err(why) => return Ok(Err(why)),
        };
        let rows = files.rows();
        crate::device_scan::mark(format_args!("device scan: {rows} rows in the footers"));
        let (gpu, ordinal) = match (self.choose_path(rows)?, self.options.device.ordinal()) {
            (SortPath::Gpu(gpu), Some(ordinal)) => (gpu, ordinal),
            (SortPath::Cpu { reason: Some(why) }, _) => return Ok(Err(why)),
            _ => return Ok(Err("the sort does not run on one GPU".into())),
        };
        // Read only where the GPU sorts: what its runs are sized by.
        let (schema, opened) = (Arc::clone(&self.schema), Arc::clone(&files));
        let sample = match blocking(move || Ok(opened.sample(&schema, SAMPLE_ROWS))).await? {
            Ok(sample) => sample,
            Err(why) => return Ok(Err(why)),
        };
        let (most_rows, footprint) = self.scan_run_bounds(&gpu, &sample);
        let fits = |rows: usize, pages: usize| rows <= most_rows && footprint.is_none_or(|f| f.fits(rows, pages));
        let runs = match files.runs(&self.schema, fits) {
            Ok(several) if several.len() > 1 && !runs => {
                return Ok(Err(format!(
                    "{rows} rows are more than one GPU sort holds, and a memory limit bounds the runs"
                )));
            }
            Ok(runs) => runs,
            Err(why) => return Ok(Err(why)),
        };
        let one = runs.len() == 1;
        let mut sorted: Vec<Vec<RecordBatch>> = Vec::with_capacity(runs.len());
        let mut pinning = None;
        for (i, calls) in runs.into_iter().enumerate() {
            if !one {
                crate::device_scan::mark(format_args!("device scan: run {i}"));
            }
            if let Some(previous) = sorted.last().filter(|_| gpu.gpu().options().pin_ahead) {
                let rows = files.run_rows(&calls);
                pinning = pin_ahead_like(previous, rows, self.options.run_range_rows, pinning.take());
            }
            let session = match self
                .read_run(&gpu, ordinal, SortSpec::new(keys.clone()), &files, calls)
                .await?
            {
                Ok(session) => session,
                Err(why) => return Ok(Err(why)),
            };
            // One run stays on the device for the consumer; several come down in ranges (all of
            // a run's before the next run's session: its device memory must go).
            let delivery = if one { Delivery::OnDevice } else { self.run_delivery() };
            // A run's blocks pinned ahead of it, its ranges do not pin theirs ahead as well.
            let session = session.with_ranges_pinned_ahead(pinning.is_none());
            match self
                .finish_session(session, Arc::clone(&gpu), None, delivery, vec![], None)
                .await?
            {
                Ok(out) if one => {
                    self.record_scan(&files);
                    return Ok(Ok(ScanOutput::Sorted(out)));
                }
                Ok(run) => sorted.push(run.into_batches()),
                Err((why, _)) => return Ok(Err(why)),
            }
        }
        // Merge steps upload rows from the host: sized as runs cut from the input are.
        let run_rows = self.run_rows(&sample);
        self.record_scan(&files);
        Ok(Ok(ScanOutput::Runs(sorted, run_rows)))
    }

    /// The most rows of a device scan's run (`gpusort.max_run_rows`, or no bound), and what a
    /// GPU sort of rows like `sample` takes of `gpu`'s memory (`None` where unknown: the sort
    /// itself then says whether it fits). A run's decompressed pages stay on the device beside
    /// its sort.
    fn scan_run_bounds(&self, gpu: &CudaBackend, sample: &RecordBatch) -> (usize, Option<SortFootprint>) {
        let most_rows = match self.options.max_run_rows {
            0 => usize::MAX,
            n => n,
        };
        let footprint = self.sort_input(sample, true).ok().and_then(|(extended, spec)| {
            let request = SortRequest::new(&extended, &spec).with_strategy(self.options.strategy.strategy());
            gpu.footprint_within(&gpu_request(&request), self.gpu_limit(), true)
                .ok()
        });
        (most_rows, footprint)
    }

    /// The row groups of `calls` read on the GPU into a new session of `spec`.
    async fn read_run(
        &self,
        gpu: &Arc<CudaBackend>,
        ordinal: usize,
        spec: SortSpec,
        files: &Arc<ScanFiles>,
        calls: Vec<Call>,
    ) -> Result<Result<GpuSortSession, String>> {
        let session = match self.begin_session(gpu, Arc::clone(&self.schema), spec, false) {
            Ok(session) => session,
            Err(e) => return Ok(Err(format!("GPU failed: {e}"))),
        };
        crate::device_scan::mark(format_args!("device scan: session begun"));
        let (schema, backend, files) = (Arc::clone(&self.schema), Arc::clone(gpu), Arc::clone(files));
        let timer = self.metrics.input_time.clone();
        blocking(move || {
            let _timer = timer.timer();
            Ok(files.read_into(&backend, ordinal, &schema, session, &calls))
        })
        .await
    }

    /// Counts `files`, read on the device, in the metrics (and marks the timeline).
    fn record_scan(&self, files: &ScanFiles) {
        crate::device_scan::mark(format_args!("device scan: {} file(s) read on the device", files.len()));
        self.metrics.device_scan_files.add(files.len());
        self.metrics.device_scan_rows.add(files.rows());
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH);
        self.metrics
            .device_scan_end_ns
            .set(now.map_or(0, |d| d.as_nanos() as usize));
    }

    /// The GPU the options allow, or why they choose the CPU whatever the rows
    /// (`gpusort.strategy` or `gpusort.device` = cpu).
    fn gpu_by_choice(&self) -> std::result::Result<usize, String> {
        match (self.options.strategy, self.options.device.ordinal()) {
            (StrategyChoice::Cpu, _) => Err("gpusort.strategy = cpu".into()),
            (_, None) => Err("gpusort.device = cpu".into()),
            (_, Some(ordinal)) => Ok(ordinal),
        }
    }

    pub(crate) fn choose_path(&self, rows: usize) -> Result<SortPath> {
        let o = &self.options;
        let cpu = |reason: String| Ok(SortPath::Cpu { reason: Some(reason) });
        let ordinal = match self.gpu_by_choice() {
            Ok(ordinal) => ordinal,
            Err(why) => return cpu(why),
        };
        if rows < o.min_rows {
            return cpu(format!("{rows} rows < gpusort.min_rows = {}", o.min_rows));
        }
        match gpu_backends(&o.devices) {
            Some(Ok(gpus)) if gpus.len() > 1 => {
                let split = SplitOptions {
                    min_rows_per_range: o.split_min_rows,
                    ..SplitOptions::default()
                };
                let multi = MultiGpuBackend::try_new(gpus)
                    .map_err(|e| GpuSortExecError::Sort(e.into()))?
                    .with_options(split);
                if multi.options().ranges_for(rows, multi.gpus().len()) > 1 {
                    return Ok(SortPath::Gpus(Arc::new(multi)));
                }
            }
            Some(Err(reason)) if o.device == DeviceChoice::Auto => return cpu(reason),
            Some(Err(reason)) => {
                return Err(GpuSortExecError::DevicesUnavailable {
                    devices: o.devices.to_string(),
                    reason,
                }
                .into());
            }
            _ => {}
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

    /// The rows of `parts` (`rows` of them) sorted whole on the GPU, the first `limit` of
    /// them, handed to `sink` as they come down: the parts go through a GPU session as a run's
    /// input batches do, and the sorted rows come back in ranges ([`Delivery::Ranges`]: the
    /// parts, released once the rows are sorted on the device, give their pinned blocks back
    /// for the ranges; with `gpusort.run_range_rows` 0, in one batch), each to the consumer as
    /// soon as it is down. `Err(parts)` when the step's sort is not for the GPU (the key sort
    /// and a gather on every core then run instead) or when the GPU failed before the parts
    /// were released (the reason is kept for the metrics).
    ///
    /// On the GPU, moving the rows through it costs less than a gather of them on the host:
    /// the host only stages and encodes, and the download lands in reused pinned memory.
    /// `sorted_runs` (empty: not known) says that the parts are sorted runs of these many rows,
    /// one after the other, which the device then merges instead of sorting them.
    pub(crate) async fn sort_whole_on_gpu(
        &mut self,
        parts: Vec<RecordBatch>,
        rows: usize,
        sorted_runs: Vec<usize>,
        limit: Option<usize>,
        sink: RangeSink,
    ) -> Result<Result<(), Vec<RecordBatch>>> {
        if !matches!(self.choose_path(rows)?, SortPath::Gpu(_)) {
            return Ok(Err(parts));
        }
        self.session = None;
        for part in &parts {
            if !self.push(part, false)? {
                break;
            }
        }
        let Some((session, gpu)) = self.session.take() else {
            return Ok(Err(parts));
        };
        let session = session.with_sorted_runs(sorted_runs);
        let delivery = self.run_delivery();
        match (self.finish_session(session, gpu, limit, delivery, parts, Some(sink))).await? {
            Ok(_) => Ok(Ok(())),
            Err((reason, parts)) => {
                self.session_failed = Some(reason);
                Ok(Err(parts))
            }
        }
    }
}

impl InMemorySorter {
    /// A GPU session on `gpu` for rows of `schema` sorted by `spec`, with this sorter's
    /// strategy and device memory limit; `permutation`: the sort hands back its permutation.
    fn begin_session(
        &self,
        gpu: &CudaBackend,
        schema: SchemaRef,
        spec: SortSpec,
        permutation: bool,
    ) -> Result<GpuSortSession, CudaSortError> {
        Ok(gpu
            .begin_sort(schema, spec)?
            .with_strategy(self.options.strategy.strategy())
            .with_memory_limit(self.gpu_limit())
            .with_permutation(permutation))
    }

    /// The key columns of `batch` alone, in the sort's order ([`key_spec`] sorts them), as
    /// [`Self::sort_input`] makes them (`for_gpu`: decimal keys narrowed where that pays).
    fn key_columns(&self, batch: &RecordBatch, for_gpu: bool) -> Result<RecordBatch> {
        let (extended, spec) = self.sort_input(batch, for_gpu)?;
        let columns: Vec<usize> = spec.keys().iter().map(|k| k.column).collect();
        Ok(extended.project(&columns)?)
    }

    /// Whether a range-merge step of `parts` sends only their key columns to the GPU
    /// ([`Self::sort_keys_on_gpu`]) rather than whole rows ([`Self::sort_whole_on_gpu`]): with
    /// `gpusort.merge_keys_only`, where the key columns are at most half of the rows' bytes,
    /// as the first part's slices count them (the columns of a batch read from a spill file
    /// share one buffer, so buffer sizes would not tell them apart).
    pub(crate) fn merges_keys_only(&self, parts: &[RecordBatch]) -> bool {
        if !self.options.merge_keys_only {
            return false;
        }
        let Some(first) = parts.first() else {
            return false;
        };
        let bytes = |b: &RecordBatch| -> Option<usize> {
            b.columns()
                .iter()
                .map(|c| c.to_data().get_slice_memory_size().ok())
                .sum()
        };
        match (
            self.key_columns(first, true).ok().as_ref().and_then(bytes),
            bytes(first),
        ) {
            (Some(keys), Some(all)) => 2 * keys <= all,
            _ => false,
        }
    }

    /// The permutation that sorts `parts` (`rows` rows; `sorted_runs`: sorted runs of these
    /// many rows, one after the other, or empty), its first `limit` entries, from their key
    /// columns alone sorted on the GPU: only the keys go up (through a GPU session, which
    /// merges the runs where that pays against its radix passes) and only the permutation
    /// comes down. `None` when the sort is not for the GPU, or when the GPU failed (the reason
    /// is kept for the metrics, and [`Self::sort_keys`] then sorts on the CPU).
    pub(crate) async fn sort_keys_on_gpu(
        &mut self,
        parts: &[RecordBatch],
        rows: usize,
        sorted_runs: Vec<usize>,
        limit: Option<usize>,
    ) -> Result<Option<UInt32Array>> {
        let SortPath::Gpu(gpu) = self.choose_path(rows)? else {
            return Ok(None);
        };
        let pushed = (|| -> std::result::Result<Option<GpuSortSession>, String> {
            let mut session: Option<GpuSortSession> = None;
            for part in parts {
                let keys = self.key_columns(part, true).map_err(|e| e.to_string())?;
                let s = match session.as_mut() {
                    Some(s) => s,
                    None => {
                        let s = self
                            .begin_session(&gpu, keys.schema(), key_spec(&self.expr), true)
                            .map_err(|e| e.to_string())?;
                        session.insert(s.with_sorted_runs(sorted_runs.clone()))
                    }
                };
                s.push(&keys).map_err(|e| e.to_string())?;
            }
            Ok(session)
        })();
        let session = match pushed {
            Ok(Some(session)) => session,
            Ok(None) => return Ok(None),
            Err(e) => {
                self.session_failed = Some(format!("GPU failed: {e}"));
                return Ok(None);
            }
        };
        let (metrics, timer) = (self.metrics.clone(), self.metrics.baseline.elapsed_compute().clone());
        let sorted = blocking(move || {
            let _timer = timer.timer();
            let device = gpusort::SortBackend::name(gpu.as_ref());
            match session.finish_sorted(limit).and_then(|rows| rows.into_output(None)) {
                Ok(out) => {
                    metrics.record(&out.stats, Some(&device));
                    Ok(Ok(out.indices))
                }
                // The CPU would fail the same way.
                Err(CudaSortError::Core(e)) => Err(GpuSortExecError::from(e).into()),
                Err(e) => Ok(Err(format!("GPU failed: {e}"))),
            }
        })
        .await?;
        match sorted {
            Ok(indices) => Ok(Some(indices)),
            Err(reason) => {
                self.session_failed = Some(reason);
                Ok(None)
            }
        }
    }
}

/// Pins, on a thread of its own, the host blocks a device scan's run of `rows` rows will come
/// down into: its ranges of `range_rows` rows (or one piece, with 0) each as many and as large
/// blocks as `previous`'s (the run before's ranges) first range took, scaled by the rows where
/// a run comes down in one piece; once the pinning for the run before ended (`before`). Each
/// run of TPC-H lineitem (~10M rows) pinned ~2 GB on its way down, ~130 ms of its ~210 ms
/// (stop 50, an H200); ahead, that overlaps the run's reading and sorting. Pinning a run's
/// blocks ahead takes longer than the run (~0.2 s against ~0.15 s on lineitem, stop 51), so
/// every other run finds all its blocks and the others part of them: the scan's reading
/// 0.11-0.42 s shorter under a 4 GiB GPU budget.
fn pin_ahead_like(
    previous: &[RecordBatch],
    rows: usize,
    range_rows: usize,
    before: Option<JoinHandle<()>>,
) -> Option<JoinHandle<()>> {
    if let Some(before) = before {
        let _ = before.join();
    }
    let first = previous.first()?;
    let lens = if previous.len() > 1 && range_rows > 0 {
        // Ranges of one size class a column part: the first range's blocks, a range at a time.
        block_lens(first).repeat(rows.div_ceil(range_rows))
    } else {
        let scale = rows as f64 / first.num_rows().max(1) as f64;
        (block_lens(first).into_iter())
            .map(|len| (len as f64 * scale).ceil() as usize)
            .collect()
    };
    PinnedPool::global().pin_ahead(lens, |bytes, took| {
        crate::device_scan::mark(format_args!(
            "device scan: {bytes} bytes pinned ahead of the run in {:.1} ms",
            took.as_secs_f64() * 1e3
        ))
    })
}

/// Sorted rows brought down to the host ([`InMemorySorter::finish_session`]): the schema's
/// `width` columns kept, the sort counted in `metrics` as done on `device`.
struct ComeDown<'a> {
    width: usize,
    metrics: &'a GpuSortMetrics,
    device: &'a str,
}

impl ComeDown<'_> {
    /// `rows` in one batch, handed to `sink` where there is one (the output then empty);
    /// `input` released once they are down, or given back with the reason when the GPU failed.
    #[allow(clippy::type_complexity)]
    fn whole(
        &self,
        mut rows: SortedRows,
        input: Vec<RecordBatch>,
        sink: Option<RangeSink>,
    ) -> Result<Result<SortedOutput, (String, Vec<RecordBatch>)>> {
        let out = match rows
            .next_batch(rows.num_rows())
            .and_then(|batch| rows.into_output(batch))
        {
            Ok(out) => out,
            Err(e) => return Ok(Err((format!("GPU failed: {e}"), input))),
        };
        // Released on another core (see GpuSortSession::finish).
        rayon::spawn(move || drop(input));
        self.metrics.record(&out.stats, Some(self.device));
        let batch = drop_extended_columns(out.batch, self.width)?;
        match sink {
            Some(mut sink) => sink(batch).map(|_| Ok(SortedOutput::Ranges(vec![]))),
            None => Ok(Ok(SortedOutput::Batch(batch))),
        }
    }

    /// `rows` in ranges of `range_rows`, `input` released first (its pinned blocks back in the
    /// pool for the ranges), each range handed to `sink` as it comes down where there is one
    /// (the output then empty), else returned.
    fn in_ranges(
        &self,
        mut rows: SortedRows,
        range_rows: usize,
        input: Vec<RecordBatch>,
        mut sink: Option<RangeSink>,
    ) -> Result<Vec<RecordBatch>> {
        // From here on a failure has no rows to sort on the CPU.
        drop(input);
        let failed = |e: CudaSortError| {
            DataFusionError::Execution(format!(
                "GPU failed while its sorted rows came down, their input already released: {e}"
            ))
        };
        let mut batches = vec![];
        let mut ranges = 0;
        while let Some(range) = rows.next_batch(range_rows).map_err(failed)? {
            ranges += 1;
            let range = drop_extended_columns(range, self.width)?;
            match sink.as_mut() {
                None => batches.push(range),
                // Nobody reads on: the rest stays on the device, freed with it.
                Some(sink) => {
                    if !sink(range)? {
                        break;
                    }
                }
            }
        }
        self.metrics.record(rows.stats(), Some(self.device));
        self.metrics.device_ranges.add(ranges);
        Ok(batches)
    }
}

/// The spec that sorts the key columns alone ([`InMemorySorter::key_columns`]).
fn key_spec(expr: &LexOrdering) -> SortSpec {
    SortSpec::new(expr.iter().enumerate().map(|(column, e)| SortKey {
        column,
        options: e.options,
    }))
}

/// Runs `f` on tokio's blocking threads (sorts, gathers and spill writes are CPU or I/O
/// bound).
pub(crate) async fn blocking<T: Send + 'static>(f: impl FnOnce() -> Result<T> + Send + 'static) -> Result<T> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| GpuSortExecError::Task(e.to_string()))?
}

/// Runs `request` on `path`; a GPU failure (out of memory, a driver error) reruns it on the
/// CPU and records why.
fn run_sort(
    request: &SortRequest<'_>,
    path: SortPath,
    gpu_limit: Option<usize>,
    metrics: &GpuSortMetrics,
) -> Result<SortOutput, GpuSortExecError> {
    let (sorted, device) = match path {
        SortPath::Gpu(gpu) => (
            gpu.sort_within(&gpu_request(request), gpu_limit),
            gpusort::SortBackend::name(gpu.as_ref()),
        ),
        SortPath::Gpus(gpus) => (
            gpus.sort_within(&gpu_request(request), gpu_limit),
            gpusort::SortBackend::name(gpus.as_ref()),
        ),
        SortPath::Cpu { reason } => return sort_on_cpu(request, reason, metrics),
    };
    match sorted {
        Ok(out) => {
            metrics.record(&out.stats, Some(&device));
            Ok(out)
        }
        // The CPU would fail the same way.
        Err(CudaSortError::Core(e)) => Err(e.into()),
        Err(e) => sort_on_cpu(request, Some(format!("GPU failed: {e}")), metrics),
    }
}

/// Runs `request` on the CPU backend, recording `reason` (why not on a GPU) when there is one.
fn sort_on_cpu(
    request: &SortRequest<'_>,
    reason: Option<String>,
    metrics: &GpuSortMetrics,
) -> Result<SortOutput, GpuSortExecError> {
    if let Some(reason) = reason {
        metrics.cpu_fallback.add(reason);
    }
    let out = gpusort::SortBackend::sort(cpu_backend(), request)?;
    metrics.record(&out.stats, None);
    Ok(out)
}

/// `request` as a GPU sort runs it: with the longer string prefixes a device sorts cheaply
/// ([`gpu_encoder_options`]).
fn gpu_request<'a>(request: &SortRequest<'a>) -> SortRequest<'a> {
    request.clone().with_encoder_options(gpu_encoder_options())
}

/// `batch` without the evaluated key columns [`InMemorySorter::sort_input`] appended after the
/// input's `width` columns.
pub(crate) fn drop_extended_columns(batch: RecordBatch, width: usize) -> Result<RecordBatch> {
    if batch.num_columns() > width {
        Ok(batch.project(&(0..width).collect::<Vec<_>>())?)
    } else {
        Ok(batch)
    }
}

/// A slice of string or binary view columns keeps every data buffer of the whole sorted
/// column alive, and operators that concatenate such slices copy those buffers each time
/// (quadratic in the output with small batches): view columns of an output batch keep only the
/// bytes their rows use. Columns of `done` are left as they are.
fn compact_views(batch: RecordBatch, done: &[usize]) -> Result<RecordBatch> {
    use arrow::array::{Array, AsArray};
    use arrow::datatypes::DataType;
    if !has_views_to_compact(&batch.schema(), done) {
        return Ok(batch);
    }
    let columns = (batch.columns().iter().enumerate())
        .map(|(i, c)| -> ArrayRef {
            match c.data_type() {
                _ if done.contains(&i) => Arc::clone(c),
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

/// Whether `schema` has a string or binary view column that is not among `done`.
fn has_views_to_compact(schema: &SchemaRef, done: &[usize]) -> bool {
    use arrow::datatypes::DataType;
    (schema.fields().iter().enumerate())
        .any(|(i, f)| matches!(f.data_type(), DataType::Utf8View | DataType::BinaryView) && !done.contains(&i))
}

#[cfg(test)]
mod tests {
    use arrow::array::{AsArray, StringViewArray};
    use arrow::datatypes::{DataType, Field, Schema};

    use super::*;

    /// A slice of two long-string view columns, each sharing the whole column's buffers.
    fn sliced() -> RecordBatch {
        let values: Vec<String> = (0..1000)
            .map(|i| format!("a value longer than twelve bytes {i:04}"))
            .collect();
        let column = || -> ArrayRef { Arc::new(StringViewArray::from_iter_values(&values)) };
        let schema = Arc::new(Schema::new(vec![
            Field::new("a", DataType::Utf8View, false),
            Field::new("b", DataType::Utf8View, false),
        ]));
        RecordBatch::try_new(schema, vec![column(), column()])
            .unwrap()
            .slice(10, 5)
    }

    fn data_bytes(batch: &RecordBatch, c: usize) -> usize {
        batch
            .column(c)
            .as_string_view()
            .data_buffers()
            .iter()
            .map(|b| b.len())
            .sum()
    }

    /// A batch of five u64 columns as a spill file gives it back: every column a slice of
    /// one buffer.
    fn read_back() -> RecordBatch {
        use arrow::array::UInt64Array;
        use arrow::ipc::{reader::StreamReader, writer::StreamWriter};
        let fields: Vec<Field> = (0..5)
            .map(|i| Field::new(format!("c{i}"), DataType::UInt64, false))
            .collect();
        let schema = Arc::new(Schema::new(fields));
        let columns: Vec<ArrayRef> = (0..5)
            .map(|i| Arc::new(UInt64Array::from_iter_values((0..1000).map(|r| r * 5 + i))) as ArrayRef)
            .collect();
        let batch = RecordBatch::try_new(Arc::clone(&schema), columns).unwrap();
        let mut bytes = vec![];
        let mut w = StreamWriter::try_new(&mut bytes, &schema).unwrap();
        w.write(&batch).unwrap();
        w.finish().unwrap();
        drop(w);
        let mut r = StreamReader::try_new(std::io::Cursor::new(bytes), None).unwrap();
        r.next().unwrap().unwrap().slice(100, 400)
    }

    #[test]
    fn merge_steps_send_the_keys_alone_where_asked_and_they_are_under_half_a_row() {
        use datafusion::physical_expr::PhysicalSortExpr;
        let batch = read_back();
        let sorter = |keys: &[usize], keys_only: bool| {
            let expr = keys
                .iter()
                .map(|&k| PhysicalSortExpr::new_default(Arc::new(Column::new(&format!("c{k}"), k)) as _));
            let options = GpuSortConfig {
                merge_keys_only: keys_only,
                ..Default::default()
            };
            let metrics = GpuSortMetrics::new(&Default::default(), 0);
            InMemorySorter::new(batch.schema(), LexOrdering::new(expr).unwrap(), options, 8192, metrics)
        };
        let parts = [batch.clone(), batch.clone()];
        assert!(sorter(&[0], true).merges_keys_only(&parts));
        assert!(sorter(&[3, 1], true).merges_keys_only(&parts));
        assert!(!sorter(&[0, 1, 2], true).merges_keys_only(&parts));
        assert!(!sorter(&[0], false).merges_keys_only(&parts));
        assert!(!sorter(&[0], true).merges_keys_only(&[]));
    }

    #[tokio::test]
    async fn rows_released_to_a_failed_gpu_fail_the_sort_instead_of_sorting_hollow_on_the_cpu() {
        use datafusion::physical_expr::PhysicalSortExpr;
        let batch = read_back();
        let expr = LexOrdering::new([PhysicalSortExpr::new_default(Arc::new(Column::new("c0", 0)) as _)]).unwrap();
        let sorter = || {
            let metrics = GpuSortMetrics::new(&Default::default(), 0);
            InMemorySorter::new(batch.schema(), expr.clone(), GpuSortConfig::default(), 8192, metrics)
        };
        let (hollow, _) = gpusort::hollow::hollow_batch(&batch, &[1, 2, 3, 4]);
        // As a GPU session that failed after taking hollow rows leaves it.
        let mut failed = sorter();
        failed.released = true;
        failed.session_failed = Some("GPU failed: a driver error".into());
        let err = failed
            .sort_batches(vec![hollow.clone()], None)
            .await
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("GPU failed: a driver error") && err.contains("gpusort.release_uploaded_input = true"),
            "{err}"
        );
        // Its run sorter takes the flag along; the sorter left for the next rows is clear.
        let mut failed = sorter();
        failed.released = true;
        failed.session_failed = Some("GPU failed: out of memory".into());
        let mut run = failed.detach();
        assert!(!failed.released && run.released);
        assert!(run.sort_batches(vec![hollow], None).await.is_err());
        // Without a release the same failure sorts on the CPU.
        let mut kept = sorter();
        kept.session_failed = Some("GPU failed: a driver error".into());
        let sorted = kept.sort_batches(vec![batch.clone()], None).await.unwrap();
        assert_eq!(sorted, batch, "c0 is ascending already");
    }

    #[test]
    fn compaction_leaves_the_columns_already_compacted() {
        let batch = sliced();
        let whole = data_bytes(&batch, 0);
        let own: usize = (0..5).map(|i| batch.column(1).as_string_view().value(i).len()).sum();
        let slicer = Slicer {
            batch_size: 8192,
            compact_views: true,
        };
        assert!(slicer.compacts_any(&batch.schema(), &[0]));
        assert!(!slicer.compacts_any(&batch.schema(), &[0, 1]));
        let out = slicer.compact(vec![batch.clone()], &[0]).unwrap();
        assert_eq!(out[0], batch, "the same rows");
        assert_eq!(data_bytes(&out[0], 0), whole, "column 0 is left as it was");
        assert_eq!(data_bytes(&out[0], 1), own, "column 1 holds its rows' bytes alone");
        let off = Slicer {
            batch_size: 8192,
            compact_views: false,
        };
        assert!(!off.compacts_any(&batch.schema(), &[]));
    }
}
