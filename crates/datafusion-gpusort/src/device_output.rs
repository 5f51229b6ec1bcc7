//! [`DeviceOutput`]: the sorted rows of a GPU session that are still on the device, streamed
//! out a range of `gpusort.output_range_rows` rows at a time (1M by default: about 130 MB of
//! TPC-H lineitem's device columns, ~11 ms over PCIe, a row group of the tool's writer, and
//! few enough ranges that their fixed costs, a synchronization and the host's gathers
//! started, stay small).
//!
//! # Algorithm
//!
//! A blocking task brings down one range after another ([`SortedRows::next_batch`], or
//! [`SortedRows::next_batches`] cut into output batches whose view key columns were compacted
//! on the device), cuts each into output batches ([`Slicer`]; views compacted on the host on
//! the rayon pool while the next range comes down) and sends them through a channel that holds
//! about two ranges: while the consumer (the Parquet writer of `gpusort sort` or of `COPY ... TO`)
//! encodes range `k`, range `k + 1` crosses PCIe. One batch of every row made the writer wait
//! for the whole download (0.7-0.9 s of TPC-H lineitem SF10's 5 s on the H100 machine, stop
//! 32). A failure past the first range ends the stream with the error (rows already handed
//! out cannot be sorted again on the CPU). The device memory is released once the last range
//! came down, or when the stream is dropped; the sort's metrics are recorded at its end.

use std::sync::Arc;

use arrow::array::RecordBatch;
use arrow::datatypes::SchemaRef;
use datafusion::error::Result;
use datafusion::execution::memory_pool::MemoryReservation;
use datafusion::physical_plan::SendableRecordBatchStream;
use datafusion::physical_plan::stream::{RecordBatchReceiverStream, RecordBatchStreamAdapter};
use futures::StreamExt;
use gpusort_cuda::SortedRows;

use crate::error::GpuSortExecError;
use crate::in_memory::{Slicer, drop_extended_columns};
use crate::metrics::GpuSortMetrics;

/// Ranges the channel holds ahead of the consumer.
const RANGES_AHEAD: usize = 2;

/// A GPU sort's rows on the device (see the module docs): the session's sorted rows, the
/// device's name (for the metrics), and the output's columns (the sorted batches may carry
/// evaluated sort expressions after them).
pub(crate) struct DeviceOutput {
    rows: SortedRows,
    device: String,
    width: usize,
    range_rows: usize,
    metrics: GpuSortMetrics,
}

impl DeviceOutput {
    /// `rows` to come down `range_rows` at a time.
    pub(crate) fn new(
        rows: SortedRows,
        device: String,
        width: usize,
        range_rows: usize,
        metrics: GpuSortMetrics,
    ) -> Self {
        Self {
            rows,
            device,
            width,
            range_rows: range_rows.max(1),
            metrics,
        }
    }

    /// The rows as a stream of `slicer`'s batches of `schema`, made on a blocking task up to
    /// [`RANGES_AHEAD`] ranges ahead of the consumer; `reservation` (the rows' memory) is held
    /// until the stream is dropped. The output batches count their share of `bytes` (the
    /// input's: what the sorted rows hold, their views sharing its data buffers).
    pub(crate) fn into_stream(
        mut self,
        schema: SchemaRef,
        slicer: Slicer,
        reservation: MemoryReservation,
        bytes: usize,
    ) -> SendableRecordBatchStream {
        let slices_per_range = self.range_rows.div_ceil(slicer.batch_size).max(1);
        let mut builder = RecordBatchReceiverStream::builder(Arc::clone(&schema), RANGES_AHEAD * slices_per_range);
        let tx = builder.tx();
        let total = self.rows.num_rows();
        let metrics = self.metrics.clone();
        builder.spawn_blocking(move || {
            // View key columns whose data buffers are on the device are compacted there: for
            // each output batch, or (when the batches need not be compacted, e.g. for a Parquet
            // writer) for the whole range, whose values a writer then reads in row order.
            let done = self.rows.compacted_columns();
            let mut cutting: Option<Cut> = None;
            loop {
                let range = match (slicer.compacts_views(), done.is_empty()) {
                    (true, _) => self.rows.next_batches(self.range_rows, slicer.batch_size),
                    (false, false) => self.rows.next_batches(self.range_rows, self.range_rows),
                    (false, true) => (self.rows.next_batch(self.range_rows)).map(|b| b.map(|b| vec![b])),
                };
                let range = range.map_err(sort_error)?;
                // The consumer is gone: nothing more to send.
                if let Some(cut) = cutting.take()
                    && !send(&tx, cut)?
                {
                    return Ok(());
                }
                let Some(range) = range else { break };
                self.metrics.device_ranges.add(1);
                let start = std::time::Instant::now();
                let range = (range.into_iter())
                    .map(|b| drop_extended_columns(b, self.width))
                    .collect::<Result<Vec<_>>>()?;
                // A range cut already goes out now; one being compacted while the next comes.
                match Cut::start(range, slicer, &done) {
                    cut @ Cut::Done(_) => {
                        let cut_ms = start.elapsed().as_secs_f64() * 1e3;
                        if !send(&tx, cut)? {
                            return Ok(());
                        }
                        log::debug!(
                            target: "gpusort::timeline",
                            "GpuSortExec: range cut in {cut_ms:.2} ms, sent in {:.2} ms",
                            start.elapsed().as_secs_f64() * 1e3 - cut_ms
                        );
                    }
                    cut @ Cut::Running(_) => cutting = Some(cut),
                }
            }
            self.metrics.record(self.rows.stats(), Some(&self.device));
            log::debug!(target: "gpusort::timeline", "GpuSortExec: last range handed out");
            Ok(())
        });
        let stream = builder.build().map(move |batch| {
            let _held = &reservation;
            if let Ok(b) = &batch {
                metrics.record_output_slice(b.num_rows(), total, bytes);
            }
            batch
        });
        Box::pin(RecordBatchStreamAdapter::new(schema, stream))
    }
}

/// A range being cut into output batches: with views to compact (a gather of their bytes,
/// ~1.8 ms a million rows of the `sql` bench's strings on 16 cores, longer than the next
/// range's download), on the rayon pool, so that it runs while the next range comes down; else
/// in place (cut already by [`SortedRows::next_batches`], or slices of one batch, which cost
/// microseconds).
enum Cut {
    Done(Result<Vec<RecordBatch>>),
    Running(std::sync::mpsc::Receiver<Result<Vec<RecordBatch>>>),
}

impl Cut {
    /// `range`: one batch to slice (views not compacted), or the batches
    /// [`SortedRows::next_batches`] cut, whose view columns but `done` are compacted here.
    fn start(range: Vec<RecordBatch>, slicer: Slicer, done: &[usize]) -> Self {
        let schema = match range.first() {
            Some(b) => b.schema(),
            None => return Self::Done(Ok(vec![])),
        };
        if !slicer.compacts_views() {
            let sliced: Result<Vec<Vec<RecordBatch>>> = range.iter().map(|b| slicer.slices(b)).collect();
            return Self::Done(sliced.map(|s| s.into_iter().flatten().collect()));
        }
        if !slicer.compacts_any(&schema, done) {
            return Self::Done(Ok(range));
        }
        let (finished, running) = std::sync::mpsc::sync_channel(1);
        let done = done.to_vec();
        rayon::spawn(move || {
            // The receiver is gone only when the stream ended with an error.
            let _ = finished.send(slicer.compact(range, &done));
        });
        Self::Running(running)
    }

    /// The range's output batches, once cut.
    fn slices(self) -> Result<Vec<RecordBatch>> {
        match self {
            Self::Done(slices) => slices,
            Self::Running(running) => running.recv().unwrap_or_else(|_| {
                Err(datafusion::error::DataFusionError::Internal(
                    "a range's cut ended without its batches".into(),
                ))
            }),
        }
    }
}

/// Sends `cut`'s batches on `tx`, once cut; false when the consumer is gone.
fn send(tx: &tokio::sync::mpsc::Sender<Result<RecordBatch>>, cut: Cut) -> Result<bool> {
    for slice in cut.slices()? {
        if tx.blocking_send(Ok(slice)).is_err() {
            return Ok(false);
        }
    }
    Ok(true)
}

fn sort_error(e: gpusort_cuda::CudaSortError) -> datafusion::error::DataFusionError {
    GpuSortExecError::Sort(e.into()).into()
}
