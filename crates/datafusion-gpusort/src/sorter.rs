//! [`GpuSorter`]: what one partition of a `GpuSortExec` does — buffer the input under a
//! [`MemoryReservation`], evaluate the sort expressions, sort on the chosen backend (GPU, or
//! the CPU with the reason), and emit the sorted rows in `batch_size` batches.
//!
//! With a `fetch` (TopK: `ORDER BY ... LIMIT n`) the buffered input is cut down to its best
//! `n` rows whenever it grows past a threshold, so memory stays bounded by the limit.

use std::sync::Arc;

use arrow::array::{ArrayRef, RecordBatch, RecordBatchOptions};
use arrow::compute::concat;
use arrow::datatypes::{Field, Schema, SchemaRef};
use datafusion::common::utils::memory::get_record_batch_memory_size;
use datafusion::error::Result;
use datafusion::execution::memory_pool::MemoryReservation;
use datafusion::physical_expr::LexOrdering;
use datafusion::physical_expr::expressions::Column;
use datafusion::physical_plan::SendableRecordBatchStream;
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use futures::StreamExt;
use gpusort::{SortKey, SortOutput, SortRequest, SortSpec};
use gpusort_cuda::{CudaBackend, CudaSortError};
use rayon::prelude::*;

use crate::config::{DeviceChoice, GpuSortConfig, StrategyChoice};
use crate::device::{cpu_backend, gpu_backend};
use crate::error::GpuSortExecError;
use crate::metrics::GpuSortMetrics;

/// Rows a TopK sort buffers before cutting them down to the best `fetch`: at least this many,
/// and at least four times `fetch`.
const TOPK_MIN_BUFFER_ROWS: usize = 1 << 20;

/// Key bytes per row and sort key a sort holds on the host besides its input and output (key
/// words, double buffered, and the permutation).
const KEY_BYTES_PER_ROW_AND_KEY: usize = 24;

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
    batches: Vec<RecordBatch>,
    rows: usize,
    reservation: MemoryReservation,
    metrics: GpuSortMetrics,
}

impl GpuSorter {
    /// A sorter of rows of `schema` by `expr`, keeping the first `fetch` rows.
    pub fn new(
        schema: SchemaRef,
        expr: LexOrdering,
        fetch: Option<usize>,
        options: GpuSortConfig,
        batch_size: usize,
        reservation: MemoryReservation,
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
            reservation,
            metrics,
        }
    }

    /// Buffers `batch` (reserving its memory first).
    pub async fn insert(&mut self, batch: RecordBatch) -> Result<()> {
        if batch.num_rows() == 0 {
            return Ok(());
        }
        self.reservation.try_grow(get_record_batch_memory_size(&batch))?;
        self.rows += batch.num_rows();
        self.batches.push(batch);
        if let Some(fetch) = self.fetch
            && self.rows >= TOPK_MIN_BUFFER_ROWS.max(fetch.saturating_mul(4))
        {
            // Keep only the best `fetch` rows seen so far.
            let input = self.take_input()?;
            let best = self.sort(input, Some(fetch)).await?;
            self.metrics.topk_compactions.add(1);
            self.rows = best.num_rows();
            self.reservation.try_resize(get_record_batch_memory_size(&best))?;
            self.batches.push(best);
        }
        Ok(())
    }

    /// Sorts what was buffered and streams it out in `batch_size` batches.
    pub async fn finish(mut self) -> Result<SendableRecordBatchStream> {
        let schema = Arc::clone(&self.schema);
        if self.rows == 0 || self.fetch == Some(0) {
            self.reservation.free();
            return Ok(Box::pin(RecordBatchStreamAdapter::new(
                schema,
                futures::stream::empty(),
            )));
        }
        let input = self.take_input()?;
        let sorted = self.sort(input, self.fetch).await?;
        self.reservation.try_resize(get_record_batch_memory_size(&sorted))?;
        let batch_size = self.batch_size;
        let n = sorted.num_rows();
        let slices: Vec<RecordBatch> = (0..n)
            .step_by(batch_size)
            .map(|start| compact_views(sorted.slice(start, batch_size.min(n - start))))
            .collect::<Result<_>>()?;
        drop(sorted);
        let reservation = self.reservation;
        let baseline = self.metrics.baseline.clone();
        // The reservation lives as long as the stream; it is freed when the stream is dropped.
        let stream = futures::stream::iter(slices).map(move |batch| {
            let _held = &reservation;
            baseline.record_output(batch.num_rows());
            Ok(batch)
        });
        Ok(Box::pin(RecordBatchStreamAdapter::new(schema, stream)))
    }

    /// The buffered batches as one batch (reserving the copy while both exist).
    fn take_input(&mut self) -> Result<RecordBatch> {
        let batches = std::mem::take(&mut self.batches);
        let batch = if batches.len() == 1 {
            batches.into_iter().next().unwrap()
        } else {
            let held = self.reservation.size();
            self.reservation.try_grow(held)?;
            let batch = concat_in_parallel(&self.schema, &batches)?;
            drop(batches);
            self.reservation.try_resize(get_record_batch_memory_size(&batch))?;
            batch
        };
        self.rows = 0;
        Ok(batch)
    }

    /// Sorts `input` (which the reservation holds) and returns the sorted rows (at most
    /// `limit`); the reservation holds them afterwards (and the caller resizes it).
    async fn sort(&mut self, input: RecordBatch, limit: Option<usize>) -> Result<RecordBatch> {
        let _timer = self.metrics.baseline.elapsed_compute().timer();
        let rows = input.num_rows();
        let (extended, spec) = self.sort_input(&input)?;
        drop(input);
        let key_bytes = rows * KEY_BYTES_PER_ROW_AND_KEY * spec.len().max(1);
        self.reservation
            .try_grow(get_record_batch_memory_size(&extended) + key_bytes)?;
        let path = self.choose_path(rows)?;
        let strategy = self.options.strategy.strategy();
        let gpu_limit = (self.options.gpu_memory_limit.0 > 0).then_some(self.options.gpu_memory_limit.0);
        let metrics = self.metrics.clone();
        let width = self.schema.fields().len();
        let task = tokio::task::spawn_blocking(move || -> Result<RecordBatch, GpuSortExecError> {
            let request = SortRequest::new(&extended, &spec)
                .with_strategy(strategy)
                .with_limit(limit);
            let out = run_sort(&request, path, gpu_limit, &metrics)?;
            // Drop the evaluated key columns appended after the input's.
            let batch = if out.batch.num_columns() > width {
                out.batch
                    .project(&(0..width).collect::<Vec<_>>())
                    .map_err(gpusort::GpusortError::from)?
            } else {
                out.batch
            };
            Ok(batch)
        });
        let sorted = task
            .await
            .map_err(|e| GpuSortExecError::Task(e.to_string()))?
            .map_err(datafusion::error::DataFusionError::from)?;
        Ok(sorted)
    }

    /// The batch to sort (the input, with the values of sort expressions that are not plain
    /// columns appended) and the sort specification over it.
    fn sort_input(&self, input: &RecordBatch) -> Result<(RecordBatch, SortSpec)> {
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

/// Runs `request` on `path`; a GPU failure (out of memory, a driver error) reruns it on the
/// CPU and records why.
fn run_sort(
    request: &SortRequest<'_>,
    path: SortPath,
    gpu_limit: Option<usize>,
    metrics: &GpuSortMetrics,
) -> Result<SortOutput, GpuSortExecError> {
    let reason = match path {
        SortPath::Gpu(gpu) => match gpu.sort_within(request, gpu_limit) {
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

/// `concat_batches`, one column per core: a large sort's input is concatenated at memory
/// speed rather than one column after another.
fn concat_in_parallel(schema: &SchemaRef, batches: &[RecordBatch]) -> Result<RecordBatch> {
    let rows = batches.iter().map(|b| b.num_rows()).sum();
    let columns = (0..schema.fields().len())
        .into_par_iter()
        .map(|c| {
            let parts: Vec<&dyn arrow::array::Array> = batches.iter().map(|b| b.column(c).as_ref()).collect();
            concat(&parts)
        })
        .collect::<Result<Vec<ArrayRef>, _>>()?;
    Ok(RecordBatch::try_new_with_options(
        Arc::clone(schema),
        columns,
        &RecordBatchOptions::new().with_row_count(Some(rows)),
    )?)
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
