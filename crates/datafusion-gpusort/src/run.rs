//! [`SortedRun`]: a run of an external sort — rows already in their final relative order,
//! held in memory as batches or spilled to one Arrow IPC file through DataFusion's
//! [`SpillManager`] (so the disk manager, its size limit, the session's spill compression and
//! the spill metrics all apply).
//!
//! A spilled run's file is deleted when the last reference to it goes: after the merge has read
//! it, or when the query is cancelled or fails.

use std::sync::Arc;

use arrow::array::RecordBatch;
use datafusion::error::Result;
use datafusion::execution::SendableRecordBatchStream;
use datafusion::execution::spill_file::SpillFile;
use datafusion::physical_plan::spill::SpillManager;
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;

/// One sorted run (see the module docs).
pub enum SortedRun {
    /// Batches in memory; the sorter's reservation holds `bytes` for them.
    Memory {
        /// The sorted rows, in order.
        batches: Vec<RecordBatch>,
        /// Bytes the batches hold.
        bytes: usize,
    },
    /// One IPC file.
    Spilled {
        /// The file (deleted when dropped).
        file: Arc<dyn SpillFile>,
        /// Rows in the file.
        rows: usize,
        /// Memory the largest batch in the file takes once read back.
        max_batch_bytes: usize,
    },
}

impl std::fmt::Debug for SortedRun {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Memory { batches, bytes } => write!(f, "SortedRun::Memory({} batches, {bytes} bytes)", batches.len()),
            Self::Spilled { file, rows, .. } => write!(f, "SortedRun::Spilled({:?}, {rows} rows)", file.path()),
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

    /// The run's batches as a stream, read back from disk when spilled.
    pub fn into_stream(self, spill: &SpillManager) -> Result<SendableRecordBatchStream> {
        match self {
            Self::Memory { batches, .. } => Ok(Box::pin(RecordBatchStreamAdapter::new(
                Arc::clone(spill.schema()),
                futures::stream::iter(batches.into_iter().map(Ok)),
            ))),
            Self::Spilled {
                file, max_batch_bytes, ..
            } => spill.read_spill_as_stream(file, Some(max_batch_bytes)),
        }
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
        file,
        rows,
        max_batch_bytes,
    }))
}
