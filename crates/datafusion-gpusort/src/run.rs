//! [`SortedRun`]: a run of an external sort — rows already in their final relative order,
//! held in memory as batches or spilled to Arrow IPC files through DataFusion's
//! [`SpillManager`] (so the disk manager, its size limit, the session's spill compression and
//! the spill metrics all apply).
//!
//! A large run is spilled as several *stripes*: consecutive pieces of it, each in its own file,
//! written at the same time by their own threads ([`spill_striped`]). One thread writes a
//! file at only ~1–2 GB/s (IPC encoding and the page cache), so the writes of the run
//! generation, not the GPU, set its pace; stripes multiply the writers. A striped run reads
//! back as one stream: the stripes in order, each opened when the one before it ends.
//!
//! A spilled run's files are deleted when the last reference to them goes: after the merge has
//! read them, or when the query is cancelled or fails.

use std::sync::Arc;

use arrow::array::RecordBatch;
use datafusion::error::Result;
use datafusion::execution::SendableRecordBatchStream;
use datafusion::execution::spill_file::SpillFile;
use datafusion::physical_plan::common::spawn_buffered;
use datafusion::physical_plan::spill::SpillManager;
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use futures::{StreamExt, TryStreamExt};

/// One sorted run (see the module docs).
pub enum SortedRun {
    /// Batches in memory; the sorter's reservation holds `bytes` for them.
    Memory {
        /// The sorted rows, in order.
        batches: Vec<RecordBatch>,
        /// Bytes the batches hold.
        bytes: usize,
    },
    /// IPC files: the run's stripes, in order.
    Spilled {
        /// The files (each deleted when dropped).
        files: Vec<Arc<dyn SpillFile>>,
        /// Rows in the files.
        rows: usize,
        /// Memory the largest batch in the file takes once read back.
        max_batch_bytes: usize,
    },
}

impl std::fmt::Debug for SortedRun {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Memory { batches, bytes } => write!(f, "SortedRun::Memory({} batches, {bytes} bytes)", batches.len()),
            Self::Spilled { files, rows, .. } => {
                let paths: Vec<_> = files.iter().map(|f| f.path()).collect();
                write!(f, "SortedRun::Spilled({paths:?}, {rows} rows)")
            }
        }
    }
}

impl SortedRun {
    /// A run held in memory: `batches` (often slices of one sorted batch) that hold `bytes`.
    pub fn in_memory(batches: Vec<RecordBatch>, bytes: usize) -> Self {
        Self::Memory { batches, bytes }
    }

    /// Rows in the run.
    pub fn rows(&self) -> usize {
        match self {
            Self::Memory { batches, .. } => batches.iter().map(|b| b.num_rows()).sum(),
            Self::Spilled { rows, .. } => *rows,
        }
    }

    /// Memory held for the run (0 once spilled).
    pub fn memory_bytes(&self) -> usize {
        match self {
            Self::Memory { bytes, .. } => *bytes,
            Self::Spilled { .. } => 0,
        }
    }

    /// Memory one batch of the run takes while a merge reads it.
    pub fn max_batch_bytes(&self) -> usize {
        match self {
            // Slices of one batch share its buffers: an even share each.
            Self::Memory { batches, bytes } => bytes / batches.len().max(1),
            Self::Spilled { max_batch_bytes, .. } => *max_batch_bytes,
        }
    }

    /// Whether the run is on disk.
    pub fn is_spilled(&self) -> bool {
        matches!(self, Self::Spilled { .. })
    }

    /// The run's batches as a stream, read back from disk when spilled: on a task of its own
    /// that reads up to `read_ahead` batches ahead of the consumer, through every stripe.
    pub fn into_stream(self, spill: &SpillManager, read_ahead: usize) -> Result<SendableRecordBatchStream> {
        let schema = Arc::clone(spill.schema());
        match self {
            Self::Memory { batches, .. } => Ok(Box::pin(RecordBatchStreamAdapter::new(
                schema,
                futures::stream::iter(batches.into_iter().map(Ok)),
            ))),
            Self::Spilled {
                files, max_batch_bytes, ..
            } => {
                let spill = spill.clone();
                // The files live until the run is read to its end, then are deleted on a
                // blocking thread; a stream dropped before its end deletes them at once. So
                // no merge step waits for a deletion: deleting a file of the page cache while
                // its pages are being written back waits for the disk (a second or more when
                // many runs end together, or when dozens of stripes end in one step).
                let mut keep = Some(files.clone());
                let stripes = futures::stream::iter(files)
                    .map(move |file| spill.read_spill_as_stream_unbuffered(file, Some(max_batch_bytes)))
                    .try_flatten()
                    .chain(futures::stream::poll_fn(move |_| {
                        if let Some(files) = keep.take() {
                            delete_off_thread(files);
                        }
                        std::task::Poll::Ready(None)
                    }));
                Ok(spawn_buffered(
                    Box::pin(RecordBatchStreamAdapter::new(schema, stripes)),
                    read_ahead,
                ))
            }
        }
    }
}

/// Drops `files` (deleting them) on a blocking thread when there is a tokio runtime, else here.
fn delete_off_thread(files: Vec<Arc<dyn SpillFile>>) {
    match tokio::runtime::Handle::try_current() {
        Ok(handle) => drop(handle.spawn_blocking(move || drop(files))),
        Err(_) => drop(files),
    }
}

/// Writes `batches` (sorted rows, in order) to one spill file; `None` when there were no rows.
pub fn spill_batches<'a>(
    spill: &SpillManager,
    batches: impl Iterator<Item = Result<&'a RecordBatch>>,
    what: &str,
) -> Result<Option<SortedRun>> {
    let mut file = spill.create_in_progress_file(what)?;
    let mut rows = 0;
    let mut max_batch_bytes = 0;
    for batch in batches {
        let batch = batch?;
        if batch.num_rows() == 0 {
            continue;
        }
        max_batch_bytes = max_batch_bytes.max(file.append_batch(batch)?);
        rows += batch.num_rows();
    }
    Ok(file.finish()?.map(|file| SortedRun::Spilled {
        files: vec![file],
        rows,
        max_batch_bytes,
    }))
}

/// Writes `batches` (sorted rows, in order) as `stripes` files at once, each of consecutive
/// batches with about the same number of rows, each by its own thread; `None` when there were
/// no rows. One stripe is [`spill_batches`].
pub fn spill_striped(
    spill: &SpillManager,
    batches: &[RecordBatch],
    stripes: usize,
    what: &str,
) -> Result<Option<SortedRun>> {
    let stripes = stripes.clamp(1, batches.len().max(1));
    if stripes == 1 {
        return spill_batches(spill, batches.iter().map(Ok), what);
    }
    // Cut where the running row count passes each stripe's share.
    let total: usize = batches.iter().map(|b| b.num_rows()).sum();
    let mut cuts = vec![0];
    let mut seen = 0;
    for (i, b) in batches.iter().enumerate() {
        seen += b.num_rows();
        if cuts.len() < stripes && seen * stripes >= total * cuts.len() && i + 1 < batches.len() {
            cuts.push(i + 1);
        }
    }
    cuts.push(batches.len());
    let written: Vec<Result<Option<SortedRun>>> = std::thread::scope(|scope| {
        let writers: Vec<_> = cuts
            .windows(2)
            .map(|w| {
                let part = &batches[w[0]..w[1]];
                scope.spawn(move || spill_batches(spill, part.iter().map(Ok), what))
            })
            .collect();
        writers
            .into_iter()
            .map(|w| w.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
            .collect()
    });
    let (mut files, mut rows, mut max_batch_bytes) = (vec![], 0, 0);
    // An error drops, and so deletes, every stripe written.
    let written = written.into_iter().collect::<Result<Vec<_>>>()?;
    for run in written.into_iter().flatten() {
        if let SortedRun::Spilled {
            files: f,
            rows: r,
            max_batch_bytes: m,
        } = run
        {
            files.extend(f);
            rows += r;
            max_batch_bytes = max_batch_bytes.max(m);
        }
    }
    Ok((!files.is_empty()).then_some(SortedRun::Spilled {
        files,
        rows,
        max_batch_bytes,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::{AsArray, UInt64Array};
    use arrow::datatypes::{DataType, Field, Schema, UInt64Type};
    use datafusion::execution::runtime_env::RuntimeEnv;
    use datafusion::physical_plan::metrics::{ExecutionPlanMetricsSet, SpillMetrics};

    fn manager() -> SpillManager {
        let schema = Arc::new(Schema::new(vec![Field::new("k", DataType::UInt64, false)]));
        let metrics = SpillMetrics::new(&ExecutionPlanMetricsSet::new(), 0);
        SpillManager::new(Arc::new(RuntimeEnv::default()), metrics, schema)
    }

    /// Batches of 0, 1, 2, ... in runs of `sizes` rows.
    fn batches(spill: &SpillManager, sizes: &[usize]) -> Vec<RecordBatch> {
        let mut next = 0u64;
        sizes
            .iter()
            .map(|&n| {
                let values = UInt64Array::from_iter_values(next..next + n as u64);
                next += n as u64;
                RecordBatch::try_new(Arc::clone(spill.schema()), vec![Arc::new(values)]).unwrap()
            })
            .collect()
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_striped_run_reads_back_in_order_and_deletes_its_files() {
        let spill = manager();
        let input = batches(&spill, &[5, 0, 7, 1, 9, 3, 3, 8, 2, 6]);
        let run = spill_striped(&spill, &input, 3, "test run").unwrap().unwrap();
        let SortedRun::Spilled { files, rows, .. } = &run else {
            panic!("not spilled: {run:?}");
        };
        assert_eq!((files.len(), *rows), (3, 44));
        let paths: Vec<_> = files
            .iter()
            .map(|f| f.path().expect("a file path").to_path_buf())
            .collect();
        assert!(paths.iter().all(|p| p.exists()));
        let read: Vec<RecordBatch> = run.into_stream(&spill, 2).unwrap().try_collect().await.unwrap();
        let values: Vec<u64> = read
            .iter()
            .flat_map(|b| b.column(0).as_primitive::<UInt64Type>().values().to_vec())
            .collect();
        assert_eq!(values, (0..44).collect::<Vec<u64>>());
        // The reading task drops the files as it ends, just after the stream's last item.
        for _ in 0..500 {
            if paths.iter().all(|p| !p.exists()) {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        assert!(
            paths.iter().all(|p| !p.exists()),
            "the stripes are deleted with the stream"
        );
    }

    #[test]
    fn stripes_never_outnumber_batches_and_one_stripe_is_one_file() {
        let spill = manager();
        let input = batches(&spill, &[4, 4]);
        let run = spill_striped(&spill, &input, 8, "test run").unwrap().unwrap();
        assert!(matches!(&run, SortedRun::Spilled { files, rows: 8, .. } if files.len() == 2));
        let run = spill_striped(&spill, &input, 1, "test run").unwrap().unwrap();
        assert!(matches!(&run, SortedRun::Spilled { files, rows: 8, .. } if files.len() == 1));
        assert!(spill_striped(&spill, &[], 4, "test run").unwrap().is_none());
    }
}
