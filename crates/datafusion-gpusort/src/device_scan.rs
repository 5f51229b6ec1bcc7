//! A sort's input read on the GPU: [`DeviceScan`] names the Parquet files that a
//! [`GpuSortExec`](crate::GpuSortExec)'s input reads whole (every row, every column, no
//! filter), and the sort reads them itself: a few row groups at a time, their bytes read into
//! pinned memory (one block of the pool, reused by the next call) and their pages decompressed
//! and decoded on the GPU
//! ([`gpusort_parquet::gpu_decode`]), the decoded columns joining the GPU session as device
//! batches ([`GpuSortSession::push_device`]). The input's rows never exist on the host, and no
//! core decodes Parquet.
//!
//! Where the device cannot take the files (a type, encoding or codec it does not decode, a key
//! it does not encode from the device's columns, no GPU or no nvCOMP, a file that changed), the
//! scan stops before any row is emitted and the sort executes its input as ever; the
//! `device_scan_fallback` metric counts it and the timeline says why.

use std::path::PathBuf;
use std::sync::Arc;

use arrow::datatypes::SchemaRef;
use datafusion::datasource::physical_plan::{FileScanConfig, ParquetSource};
use datafusion::datasource::source::DataSourceExec;
use datafusion::execution::object_store::ObjectStoreUrl;
use datafusion::parquet::file::metadata::ParquetMetaDataReader;
use datafusion::physical_plan::ExecutionPlan;
use datafusion::physical_plan::coalesce_partitions::CoalescePartitionsExec;
use datafusion::physical_plan::repartition::RepartitionExec;
use gpusort_cuda::{CudaBackend, GpuSortSession};
use gpusort_parquet::gpu_decode::{FileBytes, GpuPageDecoder};

/// Row groups decoded in one call: TPC-H lineitem's 64 (~7.3M rows, ~560 MB of pages) ran at
/// 259-264 ms for the whole SF10 file on the H200, 32 a little slower (stop 47).
pub const ROW_GROUPS_A_CALL: usize = 64;

/// The Parquet files a sort reads on the GPU (see the module docs).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceScan {
    files: Vec<PathBuf>,
    row_groups_a_call: usize,
}

impl DeviceScan {
    /// The local Parquet files `files`, in order, whose rows are the sort's input.
    pub fn new(files: Vec<PathBuf>) -> Self {
        Self {
            files,
            row_groups_a_call: ROW_GROUPS_A_CALL,
        }
    }

    /// Decodes `n` row groups a call (at least 1).
    pub fn with_row_groups_a_call(mut self, n: usize) -> Self {
        self.row_groups_a_call = n.max(1);
        self
    }

    /// The files.
    pub fn files(&self) -> &[PathBuf] {
        &self.files
    }

    /// The scan of the local Parquet files `plan` reads whole: a `DataSourceExec` of them with
    /// no predicate and no limit, its partitions maybe coalesced (without a fetch) or
    /// repartitioned; `None` for any other plan. Its columns are checked against the files'
    /// when they are read (a projection or partition columns make the sort read its input).
    pub fn of_plan(plan: &Arc<dyn ExecutionPlan>) -> Option<Self> {
        let passes = plan.downcast_ref::<RepartitionExec>().is_some()
            || plan
                .downcast_ref::<CoalescePartitionsExec>()
                .is_some_and(|c| c.fetch().is_none());
        if passes {
            let [child] = plan.children()[..] else { return None };
            return Self::of_plan(child);
        }
        let scan = plan.downcast_ref::<DataSourceExec>()?;
        let config = scan.data_source().downcast_ref::<FileScanConfig>()?;
        config.file_source.downcast_ref::<ParquetSource>()?;
        if config.file_source.filter().is_some()
            || config.limit.is_some()
            || config.object_store_url != ObjectStoreUrl::local_filesystem()
        {
            return None;
        }
        let mut files: Vec<PathBuf> = vec![];
        for file in config.file_groups.iter().flat_map(|g| g.iter()) {
            let path = PathBuf::from(format!("/{}", file.object_meta.location));
            if !files.contains(&path) {
                files.push(path);
            }
        }
        (!files.is_empty()).then(|| Self::new(files))
    }

    /// Rows of all files, from their footers; the reason when one cannot be read.
    pub(crate) fn rows(&self) -> Result<usize, String> {
        let mut rows = 0;
        for path in &self.files {
            let file = std::fs::File::open(path).map_err(|e| format!("{}: {e}", path.display()))?;
            let meta = ParquetMetaDataReader::new()
                .parse_and_finish(&file)
                .map_err(|e| format!("{}: {e}", path.display()))?;
            rows += meta.file_metadata().num_rows() as usize;
        }
        Ok(rows)
    }

    /// Every file decoded on the GPU of `gpu` (device `ordinal`) into `session`, whose schema
    /// the columns are decoded as; the reason when the device cannot.
    pub(crate) fn read_into(
        &self,
        gpu: &CudaBackend,
        ordinal: usize,
        schema: &SchemaRef,
        mut session: GpuSortSession,
    ) -> Result<GpuSortSession, String> {
        if let Some(why) = session.device_batches_refusal() {
            return Err(why);
        }
        let decoder = GpuPageDecoder::try_new(ordinal)
            .map_err(|e| e.to_string())?
            .with_budget(Arc::clone(gpu.memory_budget()))
            .with_schema(Arc::clone(schema));
        for path in &self.files {
            let at = |e: &dyn std::fmt::Display| format!("{}: {e}", path.display());
            let file = std::fs::File::open(path).map_err(|e| at(&e))?;
            let meta = ParquetMetaDataReader::new()
                .parse_and_finish(&file)
                .map_err(|e| at(&e))?;
            GpuPageDecoder::plan_as(&meta, Some(schema)).map_err(|e| at(&e))?;
            let groups: Vec<usize> = (0..meta.num_row_groups()).collect();
            GpuPageDecoder::check_row_groups(&meta, &groups).map_err(|e| at(&e))?;
            for call in groups.chunks(self.row_groups_a_call) {
                let range = GpuPageDecoder::byte_range(&meta, call);
                let bytes = FileBytes::read_range(&file, range).map_err(|e| at(&e))?;
                let decoded = decoder
                    .decode_at(&bytes, &meta, call, session.device_buffers())
                    .map_err(|e| at(&e))?;
                session
                    .push_device(decoded.into_device_batch())
                    .map_err(|e| e.to_string())?;
            }
        }
        Ok(session)
    }
}
