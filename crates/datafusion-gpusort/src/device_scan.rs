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

use std::fs::File;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use arrow::array::RecordBatch;
use arrow::compute::cast;
use arrow::datatypes::SchemaRef;
use datafusion::datasource::physical_plan::{FileScanConfig, ParquetSource};
use datafusion::datasource::source::DataSourceExec;
use datafusion::execution::object_store::ObjectStoreUrl;
use datafusion::parquet::arrow::arrow_reader::{
    ArrowReaderMetadata, ArrowReaderOptions, ParquetRecordBatchReaderBuilder,
};
use datafusion::parquet::file::metadata::{ParquetMetaData, ParquetMetaDataReader};
use datafusion::physical_expr::expressions::Column;
use datafusion::physical_plan::ExecutionPlan;
use datafusion::physical_plan::coalesce_partitions::CoalescePartitionsExec;
use datafusion::physical_plan::repartition::RepartitionExec;
use gpusort_cuda::{CudaBackend, GpuSortSession};
use gpusort_parquet::gpu_decode::{FileBytes, GpuPageDecoder};

/// A mark on the timeline (`gpusort sort --timeline`).
pub(crate) fn mark(what: std::fmt::Arguments) {
    log::debug!(target: "gpusort::timeline", "{what}");
}

/// `e` as a reason that names the file it happened in.
fn in_file(path: &Path, e: impl std::fmt::Display) -> String {
    format!("{}: {e}", path.display())
}

/// Row groups decoded in one call: TPC-H lineitem's 64 (~7.3M rows, ~560 MB of pages) ran at
/// 259-264 ms for the whole SF10 file on the H200, 32 a little slower (stop 47).
pub const ROW_GROUPS_A_CALL: usize = 64;

/// The Parquet files a sort reads on the GPU (see the module docs).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceScan {
    files: Vec<PathBuf>,
    row_groups_a_call: usize,
    /// Why the scan's own projection keeps the device from reading it (a computed or renamed
    /// column): the sort executes its input, and counts the fallback.
    refused: Option<String>,
}

impl DeviceScan {
    /// The local Parquet files `files`, in order, whose rows are the sort's input.
    pub fn new(files: Vec<PathBuf>) -> Self {
        Self {
            files,
            row_groups_a_call: ROW_GROUPS_A_CALL,
            refused: None,
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
    /// by name when they are read: a projection of the files' columns is decoded alone, while
    /// partition columns, and a projection that computes or renames a column, make the sort
    /// read its input.
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
        // The files' columns are found by name: each output column must be one, unrenamed.
        let refused = (config.file_source.projection().into_iter())
            .flat_map(|p| p.iter())
            .find(|p| p.expr.downcast_ref::<Column>().is_none_or(|c| c.name() != p.alias))
            .map(|p| format!("the scan computes or renames its column {}", p.alias));
        (!files.is_empty()).then(|| Self {
            refused,
            ..Self::new(files)
        })
    }

    /// The files opened and their footers read; the reason when one cannot be (or the scan's
    /// projection is not read on the device).
    pub(crate) fn open(&self) -> Result<ScanFiles, String> {
        if let Some(why) = &self.refused {
            return Err(why.clone());
        }
        let files = (self.files.iter())
            .map(|path| {
                let file = File::open(path).map_err(|e| in_file(path, e))?;
                let meta = ParquetMetaDataReader::new()
                    .parse_and_finish(&file)
                    .map_err(|e| in_file(path, e))?;
                Ok((path.clone(), file, Arc::new(meta)))
            })
            .collect::<Result<_, String>>()?;
        Ok(ScanFiles {
            files,
            row_groups_a_call: self.row_groups_a_call,
        })
    }
}

/// A [`DeviceScan`]'s files opened, with their footers.
pub(crate) struct ScanFiles {
    files: Vec<(PathBuf, File, Arc<ParquetMetaData>)>,
    row_groups_a_call: usize,
}

/// One decode call: row groups `groups` of file `file`, whose pages lie in bytes `range`.
#[derive(Debug)]
pub(crate) struct Call {
    file: usize,
    groups: Vec<usize>,
    range: Range<u64>,
}

impl ScanFiles {
    /// How many files.
    pub(crate) fn len(&self) -> usize {
        self.files.len()
    }

    /// Rows of all files.
    pub(crate) fn rows(&self) -> usize {
        (self.files.iter())
            .map(|(_, _, meta)| meta.file_metadata().num_rows() as usize)
            .sum()
    }

    /// Rows of the row groups of `calls`.
    pub(crate) fn run_rows(&self, calls: &[Call]) -> usize {
        (calls.iter())
            .flat_map(|c| {
                c.groups
                    .iter()
                    .map(move |&g| self.files[c.file].2.row_group(g).num_rows() as usize)
            })
            .sum()
    }

    /// The decode calls of every file in runs, in order: whole row groups, as many as `fits`
    /// a run's rows and the bytes of their pages decompressed (which stay on the device until
    /// the run's sort ends); a call at most [`ROW_GROUPS_A_CALL`] of one file's. The reason
    /// when the device cannot decode a file as `schema`, or a row group alone does not fit.
    pub(crate) fn runs(
        &self,
        schema: &SchemaRef,
        fits: impl Fn(usize, usize) -> bool,
    ) -> Result<Vec<Vec<Call>>, String> {
        let mut runs: Vec<Vec<Call>> = vec![vec![]];
        let (mut rows, mut pages) = (0, 0);
        // Each file's columns that `schema` names (all, or a projection's).
        let mut columns = vec![];
        for (file, (path, _, meta)) in self.files.iter().enumerate() {
            let plans = GpuPageDecoder::plan_as(meta, Some(schema)).map_err(|e| in_file(path, e))?;
            columns.push(plans.iter().map(|p| p.column).collect::<Vec<_>>());
            let groups: Vec<usize> = (0..meta.num_row_groups()).collect();
            GpuPageDecoder::check_columns(meta, &groups, &columns[file]).map_err(|e| in_file(path, e))?;
            for g in groups {
                let group = meta.row_group(g);
                let n = group.num_rows() as usize;
                let bytes: usize = (columns[file].iter())
                    .map(|&c| group.column(c).uncompressed_size().max(0) as usize)
                    .sum();
                if !fits(n, bytes) {
                    let why = format!("row group {g} ({n} rows) alone is more than one GPU sort holds");
                    return Err(in_file(path, why));
                }
                if !fits(rows + n, pages + bytes) {
                    runs.push(vec![]);
                    (rows, pages) = (0, 0);
                }
                (rows, pages) = (rows + n, pages + bytes);
                let run = runs.last_mut().expect("a run");
                match run.last_mut() {
                    Some(call) if call.file == file && call.groups.len() < self.row_groups_a_call => {
                        call.groups.push(g)
                    }
                    _ => run.push(Call {
                        file,
                        groups: vec![g],
                        range: 0..0,
                    }),
                }
            }
        }
        for call in runs.iter_mut().flatten() {
            let meta = &self.files[call.file].2;
            call.range = GpuPageDecoder::columns_byte_range(meta, &call.groups, &columns[call.file]);
        }
        Ok(runs)
    }

    /// The first (at most) `rows` rows of the files, read on the host as `schema`: what a GPU
    /// sort of their rows is sized by ([`crate::in_memory`]'s `run_rows`).
    pub(crate) fn sample(&self, schema: &SchemaRef, rows: usize) -> Result<RecordBatch, String> {
        let (path, file, meta) = (self.files.iter())
            .find(|(_, _, meta)| meta.file_metadata().num_rows() > 0)
            .ok_or("the files have no rows")?;
        let file = file.try_clone().map_err(|e| in_file(path, e))?;
        // The footer read in `open`, not parsed again.
        let batch = ArrowReaderMetadata::try_new(Arc::clone(meta), ArrowReaderOptions::default())
            .map(|m| ParquetRecordBatchReaderBuilder::new_with_metadata(file, m))
            .and_then(|b| b.with_batch_size(rows).with_limit(rows).build())
            .map_err(|e| in_file(path, e))?
            .next()
            .ok_or("no rows read")?
            .map_err(|e| in_file(path, e))?;
        let columns = (schema.fields().iter())
            .map(|field| match batch.column_by_name(field.name()) {
                Some(column) => cast(column, field.data_type()).map_err(|e| in_file(path, e)),
                None => Err(in_file(path, format!("no column {}", field.name()))),
            })
            .collect::<Result<Vec<_>, _>>()?;
        RecordBatch::try_new(Arc::clone(schema), columns).map_err(|e| in_file(path, e))
    }

    /// A call's bytes read into pinned memory.
    fn read(&self, call: &Call) -> Result<FileBytes, String> {
        let (path, file, _) = &self.files[call.file];
        FileBytes::read_range(file, call.range.clone()).map_err(|e| in_file(path, e))
    }

    /// The row groups of `calls` decoded on the GPU of `gpu` (device `ordinal`) into `session`,
    /// whose schema the columns are decoded as; the reason when the device cannot. While a call's pages
    /// are decoded and join the session, a thread reads the next call's bytes (the device's
    /// work and the host's reading overlap; two calls' bytes are pinned at once).
    pub(crate) fn read_into(
        &self,
        gpu: &CudaBackend,
        ordinal: usize,
        schema: &SchemaRef,
        mut session: GpuSortSession,
        calls: &[Call],
    ) -> Result<GpuSortSession, String> {
        if let Some(why) = session.device_batches_refusal() {
            return Err(why);
        }
        let decoder = GpuPageDecoder::try_new(ordinal)
            .map_err(|e| e.to_string())?
            .with_budget(Arc::clone(gpu.memory_budget()))
            .with_schema(Arc::clone(schema));
        mark(format_args!("device scan: decoder ready, {} calls", calls.len()));
        std::thread::scope(|scope| {
            let read_ahead = |i: usize| calls.get(i).map(|c| scope.spawn(move || self.read(c)));
            let mut next = read_ahead(0);
            for (i, call) in calls.iter().enumerate() {
                let bytes = next
                    .take()
                    .expect("a read a call")
                    .join()
                    .map_err(|_| "a read panicked")??;
                next = read_ahead(i + 1);
                mark(format_args!("device scan: call {i}: {} bytes read", bytes.bytes.len()));
                let (path, _, meta) = &self.files[call.file];
                let decoded = decoder
                    .decode_at(&bytes, meta, &call.groups, session.device_buffers())
                    .map_err(|e| in_file(path, e))?;
                drop(bytes);
                let t = decoded.times;
                mark(format_args!(
                    "device scan: call {i}: {} rows decoded (pages listed {:.3} s, on the device {:.3} s, kernels launched {:.3} s)",
                    decoded.rows, t.list, t.pages, t.kernels
                ));
                session
                    .push_device(decoded.into_device_batch())
                    .map_err(|e| e.to_string())?;
                mark(format_args!("device scan: call {i}: pushed"));
            }
            Ok(session)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::{Int64Array, RecordBatch};
    use arrow::datatypes::{DataType, Field, Schema};
    use datafusion::parquet::arrow::ArrowWriter;
    use datafusion::parquet::file::properties::WriterProperties;

    /// A Parquet file of `rows` int64 rows in row groups of `group` rows.
    fn file_of(dir: &std::path::Path, name: &str, rows: i64, group: usize) -> PathBuf {
        let schema = Arc::new(Schema::new(vec![Field::new("a", DataType::Int64, false)]));
        let batch = RecordBatch::try_new(
            Arc::clone(&schema),
            vec![Arc::new(Int64Array::from_iter_values(0..rows))],
        )
        .unwrap();
        let path = dir.join(name);
        let props = WriterProperties::builder()
            .set_max_row_group_row_count(Some(group))
            .build();
        let mut writer = ArrowWriter::try_new(File::create(&path).unwrap(), schema, Some(props)).unwrap();
        writer.write(&batch).unwrap();
        writer.close().unwrap();
        path
    }

    #[test]
    fn calls_cover_every_row_group_of_every_file_once_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let paths = vec![
            file_of(dir.path(), "a.parquet", 500, 100),
            file_of(dir.path(), "b.parquet", 250, 100),
        ];
        let files = DeviceScan::new(paths).with_row_groups_a_call(2).open().unwrap();
        assert_eq!((files.len(), files.rows()), (2, 750));
        let schema = Arc::new(Schema::new(vec![Field::new("a", DataType::Int64, false)]));
        let runs = files.runs(&schema, |_, _| true).unwrap();
        assert_eq!(runs.len(), 1, "one run where the rows have no bound");
        let calls = runs.into_iter().next().unwrap();
        let groups: Vec<(usize, Vec<usize>)> = calls.iter().map(|c| (c.file, c.groups.clone())).collect();
        assert_eq!(
            groups,
            [
                (0, vec![0, 1]),
                (0, vec![2, 3]),
                (0, vec![4]),
                (1, vec![0, 1]),
                (1, vec![2])
            ]
        );
        for call in &calls {
            let bytes = files.read(call).unwrap();
            assert_eq!(bytes.offset, call.range.start);
            assert_eq!(bytes.bytes.len() as u64, call.range.end - call.range.start);
            // The file's own bytes of the range, wherever the pool put them.
            let whole = std::fs::read(&files.files[call.file].0).unwrap();
            assert_eq!(
                &bytes.bytes[..],
                &whole[call.range.start as usize..call.range.end as usize]
            );
        }
        // Consecutive calls of a file touch, in order.
        assert!(calls[0].range.end <= calls[1].range.start && calls[1].range.end <= calls[2].range.start);
    }

    #[test]
    fn runs_hold_whole_row_groups_within_their_rows() {
        let dir = tempfile::tempdir().unwrap();
        let paths = vec![
            file_of(dir.path(), "a.parquet", 500, 100),
            file_of(dir.path(), "b.parquet", 250, 100),
        ];
        let files = DeviceScan::new(paths).with_row_groups_a_call(2).open().unwrap();
        let schema = Arc::new(Schema::new(vec![Field::new("a", DataType::Int64, false)]));
        let runs = files.runs(&schema, |rows, _| rows <= 300).unwrap();
        let shape: Vec<Vec<(usize, Vec<usize>)>> = (runs.iter())
            .map(|run| run.iter().map(|c| (c.file, c.groups.clone())).collect())
            .collect();
        // 100 + 100 + 100 rows; 100 + 100 and the second file's first 100; its last 100 + 50:
        // a run spans files, a call does not.
        assert_eq!(
            shape,
            [
                vec![(0, vec![0, 1]), (0, vec![2])],
                vec![(0, vec![3, 4]), (1, vec![0])],
                vec![(1, vec![1, 2])],
            ]
        );
        for call in runs.iter().flatten() {
            let meta = &files.files[call.file].2;
            assert_eq!(call.range, GpuPageDecoder::byte_range(meta, &call.groups));
        }
        let why = files.runs(&schema, |rows, _| rows <= 99).unwrap_err();
        assert!(
            why.contains("a.parquet") && why.contains("row group 0 (100 rows)"),
            "{why}"
        );
        // The pages' bytes count too: runs of one row group where two groups' pages do not fit.
        let group = files.files[0].2.row_group(0);
        let bytes: i64 = group.columns().iter().map(|c| c.uncompressed_size()).sum();
        let one = files.runs(&schema, |_, pages| pages <= bytes as usize + 16).unwrap();
        assert_eq!(one.len(), 8, "a run a row group: {one:?}");
        // The sample: the first rows, as the sort's schema has them.
        let sample = files.sample(&schema, 64).unwrap();
        assert_eq!(sample.num_rows(), 64);
        assert_eq!(sample.schema(), schema);
    }

    /// The scan under the sort of `query` over `file` (table `f`), as the planner makes it,
    /// and the names of the sort's input columns.
    async fn scan_of(file: &Path, query: &str) -> (Option<DeviceScan>, Vec<String>) {
        let ctx = datafusion::prelude::SessionContext::new();
        let create = format!(
            "CREATE EXTERNAL TABLE f STORED AS PARQUET LOCATION '{}'",
            file.display()
        );
        ctx.sql(&create).await.unwrap();
        let plan = ctx.sql(query).await.unwrap().create_physical_plan().await.unwrap();
        let mut found = (None, vec![]);
        datafusion::common::tree_node::TreeNode::apply(&plan, |node| {
            if node.name() == "SortExec" {
                let input = node.children()[0].clone();
                let names = input.schema().fields().iter().map(|f| f.name().clone()).collect();
                found = (DeviceScan::of_plan(&input), names);
            }
            Ok(datafusion::common::tree_node::TreeNodeRecursion::Continue)
        })
        .unwrap();
        found
    }

    /// A projection of the files' columns is read by the device, by name, and only those
    /// columns' bytes; a projection that computes or renames a column is refused with a
    /// reason, as partition columns are when the files' columns are matched.
    #[tokio::test]
    async fn projections_of_the_files_columns_are_read_by_name() {
        let dir = tempfile::tempdir().unwrap();
        let schema = Arc::new(Schema::new(vec![
            Field::new("a", DataType::Int64, false),
            Field::new("b", DataType::Int64, false),
            Field::new("c", DataType::Int64, false),
        ]));
        let column = |k: i64| Arc::new(Int64Array::from_iter_values((0..1000).map(move |i| i * k))) as _;
        let batch = RecordBatch::try_new(Arc::clone(&schema), vec![column(1), column(2), column(3)]).unwrap();
        let path = dir.path().join("abc.parquet");
        let mut writer = ArrowWriter::try_new(File::create(&path).unwrap(), schema, None).unwrap();
        writer.write(&batch).unwrap();
        writer.close().unwrap();
        let scan = scan_of(&path, "SELECT b, a FROM f ORDER BY a").await.0.expect("a scan");
        let files = scan.open().unwrap();
        let projected = Arc::new(Schema::new(vec![
            Field::new("b", DataType::Int64, false),
            Field::new("a", DataType::Int64, false),
        ]));
        let runs = files.runs(&projected, |_, _| true).unwrap();
        let meta = &files.files[0].2;
        let (range, whole) = (&runs[0][0].range, GpuPageDecoder::byte_range(meta, &[0]));
        assert_eq!(*range, GpuPageDecoder::columns_byte_range(meta, &[0], &[1, 0]));
        assert!(
            range.start == whole.start && range.end < whole.end,
            "{range:?} of {whole:?}"
        );
        let plans = GpuPageDecoder::plan_as(meta, Some(&projected)).unwrap();
        assert_eq!(plans.iter().map(|p| p.column).collect::<Vec<_>>(), [1, 0]);
        // A column the files do not hold (a partition column's name, say).
        let other = Schema::new(vec![Field::new("d", DataType::Int64, false)]);
        let why = files.runs(&Arc::new(other), |_, _| true).unwrap_err();
        assert!(why.contains("hold no column d"), "{why}");
        // DataFusion 55 renames above the sort (its input has the files' names), and computes
        // in the scan, which is refused.
        let (scan, names) = scan_of(&path, "SELECT b AS a, c FROM f ORDER BY a").await;
        assert_eq!(
            (scan.and_then(|s| s.refused), names),
            (None, vec!["b".into(), "c".into()])
        );
        let (scan, _) = scan_of(&path, "SELECT a + 1 AS a, b FROM f ORDER BY a").await;
        let why = scan.expect("a scan").open().err().expect("refused");
        assert_eq!(why, "the scan computes or renames its column a");
    }

    #[test]
    fn a_missing_file_is_named_in_the_reason() {
        let why = DeviceScan::new(vec!["/nonexistent/x.parquet".into()])
            .open()
            .err()
            .unwrap();
        assert!(why.contains("/nonexistent/x.parquet"), "{why}");
    }
}
