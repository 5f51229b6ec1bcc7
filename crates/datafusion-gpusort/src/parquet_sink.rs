//! [`GpuParquetSink`]: a sort's output written to Parquet files by gpusort's writer
//! (`gpusort_parquet::SortedParquetWriter`) where DataFusion planned its `ParquetSink`, as in
//! `COPY (SELECT ... ORDER BY ...) TO 'out.parquet'`.
//!
//! DataFusion's `ParquetSink` encodes a file's row groups one after another (its columns in
//! parallel), with the Parquet crate's encoder and zstd on the CPU: on TPC-H lineitem SF10 the
//! `COPY` of a sort took 16-22 s where the `gpusort` tool, whose writer this is, took 5-6 s
//! (stop 25, run 13). This sink writes the same files (the same writer properties, from the
//! session's `datafusion.execution.parquet.*` and the statement's options) with the tool's
//! writer: row groups encoded many at a time on every core, gpusort's column encoder, zstd
//! pages compressed on the GPU through nvCOMP where it loads, and the sort recorded in each
//! row group's `sorting_columns`.
//!
//! [`GpuSortRule`](crate::GpuSortRule) puts it in place of a `ParquetSink` whose input is
//! sorted by a [`GpuSortExec`](crate::GpuSortExec) or a
//! [`GpuSortPreservingMergeExec`](crate::GpuSortPreservingMergeExec) (through projections and
//! filters), where [`GpuParquetSink::unsupported`] finds nothing in the options it does not
//! follow, and `gpusort.parquet_sink` is on. Files go through the session's object store, as
//! `ParquetSink`'s do, and each is completed only once the input has ended without an error:
//! a failed write leaves no file where the store discards an upload never completed (the
//! local file system writes a temporary file and renames it at the end).

use std::fmt;
use std::io::Write;
use std::sync::Arc;

use arrow::array::RecordBatch;
use arrow::datatypes::SchemaRef;
use async_trait::async_trait;
use bytes::Bytes;
use datafusion::common::config::TableParquetOptions;
use datafusion::common::runtime::SpawnedTask;
use datafusion::common::{DataFusionError, Result};
use datafusion::datasource::file_format::file_compression_type::FileCompressionType;
use datafusion::datasource::file_format::write::ObjectWriterBuilder;
use datafusion::datasource::file_format::write::demux::DemuxedStreamReceiver;
use datafusion::datasource::physical_plan::{FileSink, FileSinkConfig};
use datafusion::datasource::sink::DataSink;
use datafusion::execution::TaskContext;
use datafusion::execution::memory_pool::{MemoryConsumer, MemoryLimit};
use datafusion::object_store::ObjectStore;
use datafusion::object_store::path::Path;
use datafusion::parquet::file::properties::{WriterProperties, WriterPropertiesBuilder};
use datafusion::parquet::schema::types::ColumnPath;
use datafusion::physical_expr::LexOrdering;
use datafusion::physical_plan::expressions::Column;
use datafusion::physical_plan::metrics::{ExecutionPlanMetricsSet, MetricBuilder, MetricsSet};
use datafusion::physical_plan::{DisplayAs, DisplayFormatType, SendableRecordBatchStream};
use gpusort_parquet::gpu_pages::{DeferredZstd, PagesGpu};
use gpusort_parquet::writer::{Codec, SortedParquetWriter, WriteOptions, writer_share};
use gpusort_parquet::{PageCompressor, SortKey};
use tokio::io::AsyncWriteExt;
use tokio::sync::mpsc;

use crate::config::GpuSortConfig;

/// Writes each file of a `COPY ... TO` or `INSERT INTO` a Parquet table with gpusort's writer;
/// see the module doc.
pub struct GpuParquetSink {
    config: FileSinkConfig,
    parquet_options: TableParquetOptions,
    /// The sort the input is in, as far as its keys are columns of the output.
    order_by: Vec<SortKey>,
    /// The GPU whose nvCOMP compresses zstd pages, or why none.
    gpu: PagesGpu,
    metrics: ExecutionPlanMetricsSet,
}

impl fmt::Debug for GpuParquetSink {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GpuParquetSink")
            .field("order_by", &gpusort_parquet::order_by_sql(&self.order_by))
            .finish()
    }
}

impl DisplayAs for GpuParquetSink {
    fn fmt_as(&self, t: DisplayFormatType, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match t {
            DisplayFormatType::Default | DisplayFormatType::Verbose => {
                let files: Vec<String> = self
                    .config
                    .file_group
                    .iter()
                    .map(|file| file.object_meta.location.to_string())
                    .collect();
                write!(
                    f,
                    "GpuParquetSink(files=[{}], order_by=[{}])",
                    files.join(", "),
                    gpusort_parquet::order_by_sql(&self.order_by)
                )
            }
            DisplayFormatType::TreeRender => write!(f, "order_by={}", gpusort_parquet::order_by_sql(&self.order_by)),
        }
    }
}

impl GpuParquetSink {
    /// What keeps gpusort's writer from writing a `ParquetSink` of `config` and `options` as it
    /// would (`None`: nothing). It writes one file a stream, with the writer properties
    /// DataFusion derives from `options`, less these: partitioned output (hive-style
    /// directories), encryption, content-defined chunking, `max_row_group_bytes`,
    /// `skip_arrow_metadata`, and a codec of a column's own (its pages are compressed a row
    /// group at a time, in one codec).
    pub fn unsupported(config: &FileSinkConfig, options: &TableParquetOptions) -> Option<&'static str> {
        let global = &options.global;
        if !config.table_partition_cols.is_empty() {
            Some("partitioned output")
        } else if options.crypto.file_encryption.is_some() || options.crypto.factory_id.is_some() {
            Some("encryption")
        } else if global.content_defined_chunking.enabled {
            Some("content-defined chunking")
        } else if global.max_row_group_bytes.is_some() {
            Some("max_row_group_bytes")
        } else if global.skip_arrow_metadata {
            Some("skip_arrow_metadata")
        } else if options
            .column_specific_options
            .values()
            .any(|c| c.compression.is_some())
        {
            Some("a column's own compression")
        } else {
            None
        }
    }

    /// The sink for `config` and `options` (where [`Self::unsupported`] finds nothing), whose input is in
    /// `ordering`, with `gpusort`'s device options.
    pub fn new(
        config: FileSinkConfig,
        parquet_options: TableParquetOptions,
        ordering: Option<&LexOrdering>,
        gpusort: &GpuSortConfig,
    ) -> Self {
        let order_by = order_by(ordering, config.output_schema());
        let gpu = gpusort
            .device
            .ordinal()
            .ok_or_else(|| "gpusort.device = cpu".to_string());
        Self {
            config,
            parquet_options,
            order_by,
            gpu,
            metrics: ExecutionPlanMetricsSet::new(),
        }
    }

    /// The keys the output is sorted by, most significant first.
    pub fn order_by(&self) -> &[SortKey] {
        &self.order_by
    }

    /// The writer's properties (DataFusion's, from the options) and options.
    fn writer_settings(&self, context: &TaskContext) -> Result<(WriterProperties, WriteOptions)> {
        // As DataFusion's sink: the Arrow schema in the key-value metadata (the Arrow writer
        // underneath sets it again, to the same schema).
        let mut parquet_options = self.parquet_options.clone();
        parquet_options.arrow_schema(self.config.output_schema());
        let properties = WriterPropertiesBuilder::try_from(&parquet_options)?.build();
        let codec = Codec(properties.compression(&ColumnPath::new(vec![])));
        let page_compressor =
            DeferredZstd::start(codec, self.gpu.clone()).map(|d| Arc::new(d) as Arc<dyn PageCompressor>);
        let memory_budget = match context.memory_pool().memory_limit() {
            MemoryLimit::Finite(limit) => Some(writer_share(limit)),
            MemoryLimit::Infinite | MemoryLimit::Unknown => None,
        };
        let options = WriteOptions {
            row_group_size: self.parquet_options.global.max_row_group_size.max(1),
            codec,
            memory_budget,
            page_compressor,
            ..WriteOptions::default()
        };
        Ok((properties, options))
    }

    /// Writes the batches of `rx` to `path` in `store`: the rows written, and the upload, to
    /// be completed once the input is known to have ended without an error (a channel that
    /// closes looks the same either way).
    async fn write_file(
        self: Arc<Self>,
        path: Path,
        mut rx: mpsc::Receiver<RecordBatch>,
        store: Arc<dyn ObjectStore>,
        context: Arc<TaskContext>,
    ) -> Result<(u64, Upload)> {
        let (properties, mut options) = self.writer_settings(&context)?;
        // The writer's memory: its share of a bounded pool, or as little as one row group at
        // a time where the pool cannot spare it.
        let reservation = MemoryConsumer::new(format!("GpuParquetSink[{path}]")).register(context.memory_pool());
        if let Some(budget) = options.memory_budget
            && reservation.try_grow(budget).is_err()
        {
            options.memory_budget = Some(1);
        }
        let buffer = context
            .session_config()
            .options()
            .execution
            .objectstore_writer_buffer_size;
        let object = ObjectWriterBuilder::new(FileCompressionType::UNCOMPRESSED, &path, store)
            .with_buffer_size(Some(buffer))
            .build()?;
        let (bytes_tx, upload) = spawn_upload(object);
        let file = ChannelWrite::new(bytes_tx);
        let schema = Arc::clone(self.config.output_schema());
        let mut writer =
            SortedParquetWriter::try_new_with_properties(file, schema, &self.order_by, &options, properties)
                .map_err(parquet_err)?;
        // The writer is dropped at the end of this block, failed or not: its thread then
        // drops its end of the channel, and the upload's task ends.
        let written = async move {
            while let Some(batch) = rx.recv().await {
                writer.write(batch).await.map_err(parquet_err)?;
            }
            writer.finish().await.map_err(parquet_err)
        }
        .await;
        let uploaded = upload
            .join_unwind()
            .await
            .map_err(|e| DataFusionError::ExecutionJoin(Box::new(e)))?;
        reservation.free();
        match written {
            Ok(stats) => Ok((stats.rows, uploaded)),
            // Where the upload failed first, its error says why the writer stopped.
            Err(e) => {
                uploaded.result?;
                Err(e)
            }
        }
    }
}

/// The keys of `ordering` that are columns of `schema`, up to the first that is not.
fn order_by(ordering: Option<&LexOrdering>, schema: &SchemaRef) -> Vec<SortKey> {
    let mut keys: Vec<SortKey> = vec![];
    for e in ordering.into_iter().flat_map(|o| o.iter()) {
        let Some(column) = e.expr.downcast_ref::<Column>() else {
            break;
        };
        let Some(field) = schema
            .fields()
            .get(column.index())
            .filter(|f| f.name() == column.name())
        else {
            break;
        };
        if keys.iter().all(|k| k.column != *field.name()) {
            keys.push(SortKey {
                column: field.name().clone(),
                descending: e.options.descending,
                nulls_first: e.options.nulls_first,
            });
        }
    }
    keys
}

fn parquet_err(e: datafusion::parquet::errors::ParquetError) -> DataFusionError {
    DataFusionError::ParquetError(Box::new(e))
}

/// Bytes a [`ChannelWrite`] gathers before it hands them to the upload.
const CHUNK_BYTES: usize = 8 << 20;

/// The file as the writer's thread writes it (a `std::io::Write`): chunks of [`CHUNK_BYTES`]
/// sent to the task that uploads them to the object store. What is left is sent when it is
/// flushed or dropped, so the upload has every byte once the writer has closed the file.
struct ChannelWrite {
    buffer: Vec<u8>,
    tx: Option<mpsc::Sender<Bytes>>,
}

impl ChannelWrite {
    fn new(tx: mpsc::Sender<Bytes>) -> Self {
        Self {
            buffer: Vec::with_capacity(CHUNK_BYTES),
            tx: Some(tx),
        }
    }

    fn send(&mut self) -> std::io::Result<()> {
        if self.buffer.is_empty() {
            return Ok(());
        }
        let chunk = Bytes::from(std::mem::replace(&mut self.buffer, Vec::with_capacity(CHUNK_BYTES)));
        let tx = self
            .tx
            .as_ref()
            .ok_or_else(|| std::io::Error::other("the upload has ended"))?;
        // The writer's own thread, outside the runtime: blocking here is waiting for the upload.
        tx.blocking_send(chunk)
            .map_err(|_| std::io::Error::other("the upload to the object store stopped"))
    }
}

impl Write for ChannelWrite {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.buffer.extend_from_slice(buf);
        if self.buffer.len() >= CHUNK_BYTES {
            self.send()?;
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.send()
    }
}

impl Drop for ChannelWrite {
    fn drop(&mut self) {
        // On the writer's thread, the rest of the file goes to the upload (an error here is the
        // upload's, which its task reports). Dropped on a runtime's thread, the writer never
        // started, and waiting there is not allowed: what is left is a failed file's.
        if tokio::runtime::Handle::try_current().is_err() {
            let _ = self.send();
        }
        self.tx = None;
    }
}

type ObjectWriter = Box<dyn tokio::io::AsyncWrite + Send + Unpin>;

/// The upload once every chunk was written, or the first write failed: completed
/// ([`Upload::complete`]) only when the file was written whole, else dropped as it is.
struct Upload {
    object: ObjectWriter,
    result: Result<()>,
    /// Bytes written to the object.
    bytes: usize,
}

impl Upload {
    /// Completes the upload; the file's bytes.
    async fn complete(mut self) -> Result<usize> {
        self.result?;
        self.object.shutdown().await?;
        Ok(self.bytes)
    }
}

/// A task writing the chunks it receives to `object`, until the sender is dropped.
fn spawn_upload(mut object: ObjectWriter) -> (mpsc::Sender<Bytes>, SpawnedTask<Upload>) {
    let (tx, mut rx) = mpsc::channel::<Bytes>(4);
    let task = SpawnedTask::spawn(async move {
        let (mut result, mut bytes) = (Ok(()), 0);
        while let Some(chunk) = rx.recv().await {
            if let Err(e) = object.write_all(&chunk).await {
                result = Err(DataFusionError::from(e));
                break;
            }
            bytes += chunk.len();
        }
        Upload { object, result, bytes }
    });
    (tx, task)
}

#[async_trait]
impl FileSink for GpuParquetSink {
    fn config(&self) -> &FileSinkConfig {
        &self.config
    }

    async fn spawn_writer_tasks_and_join(
        &self,
        context: &Arc<TaskContext>,
        demux_task: SpawnedTask<Result<()>>,
        mut file_stream_rx: DemuxedStreamReceiver,
        object_store: Arc<dyn ObjectStore>,
    ) -> Result<u64> {
        let rows_written = MetricBuilder::new(&self.metrics).global_counter("rows_written");
        let bytes_written = MetricBuilder::new(&self.metrics).global_counter("bytes_written");
        let this = Arc::new(self.clone_for_task());
        let mut files = vec![];
        while let Some((path, rx)) = file_stream_rx.recv().await {
            let task = Arc::clone(&this).write_file(path, rx, Arc::clone(&object_store), Arc::clone(context));
            files.push(SpawnedTask::spawn(task));
        }
        let mut written = Vec::with_capacity(files.len());
        for file in files {
            written.push(
                file.join_unwind()
                    .await
                    .map_err(|e| DataFusionError::ExecutionJoin(Box::new(e)))??,
            );
        }
        // An input that failed ends its files' streams as one that ended does: the files are
        // completed only once the input has ended without an error, else dropped unfinished
        // (no partial output where the store removes an upload never completed, as the local
        // file system does).
        demux_task
            .join_unwind()
            .await
            .map_err(|e| DataFusionError::ExecutionJoin(Box::new(e)))??;
        for (rows, upload) in written {
            bytes_written.add(upload.complete().await?);
            rows_written.add(rows as usize);
        }
        Ok(rows_written.value() as u64)
    }
}

impl GpuParquetSink {
    /// What a file's task needs of the sink (the sink itself is borrowed by `write_all`).
    fn clone_for_task(&self) -> Self {
        Self {
            config: self.config.clone(),
            parquet_options: self.parquet_options.clone(),
            order_by: self.order_by.clone(),
            gpu: self.gpu.clone(),
            metrics: self.metrics.clone(),
        }
    }
}

#[async_trait]
impl DataSink for GpuParquetSink {
    fn metrics(&self) -> Option<MetricsSet> {
        Some(self.metrics.clone_inner())
    }

    fn schema(&self) -> &SchemaRef {
        self.config.output_schema()
    }

    async fn write_all(&self, data: SendableRecordBatchStream, context: &Arc<TaskContext>) -> Result<u64> {
        FileSink::write_all(self, data, context).await
    }
}

#[cfg(test)]
mod tests {
    use std::pin::Pin;
    use std::sync::Mutex;
    use std::task::{Context, Poll};

    use arrow::compute::SortOptions;
    use arrow::datatypes::{DataType, Field, Schema};
    use datafusion::physical_expr::PhysicalSortExpr;
    use datafusion::physical_plan::expressions::{BinaryExpr, lit};

    use super::*;

    /// An object that keeps what is written, failing once it holds more than `limit` bytes.
    struct Sink {
        bytes: Arc<Mutex<Vec<u8>>>,
        limit: usize,
    }

    impl tokio::io::AsyncWrite for Sink {
        fn poll_write(self: Pin<&mut Self>, _: &mut Context<'_>, buf: &[u8]) -> Poll<std::io::Result<usize>> {
            let mut bytes = self.bytes.lock().unwrap();
            if bytes.len() + buf.len() > self.limit {
                return Poll::Ready(Err(std::io::Error::other("the store is full")));
            }
            bytes.extend_from_slice(buf);
            Poll::Ready(Ok(buf.len()))
        }
        fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
            Poll::Ready(Ok(()))
        }
        fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
            Poll::Ready(Ok(()))
        }
    }

    /// Writes `n` bytes through a `ChannelWrite` on a thread of its own, as the writer does.
    async fn upload(n: usize, limit: usize) -> (std::io::Result<()>, Upload, Arc<Mutex<Vec<u8>>>) {
        let bytes = Arc::new(Mutex::new(vec![]));
        let object = Box::new(Sink {
            bytes: Arc::clone(&bytes),
            limit,
        });
        let (tx, task) = spawn_upload(object);
        // A thread of its own, as the writer's is, joined off the runtime's threads.
        let thread = std::thread::spawn(move || {
            let mut file = ChannelWrite::new(tx);
            for i in 0..n / 1000 {
                file.write_all(&[i as u8; 1000])?;
            }
            file.write_all(&vec![7; n % 1000])
            // Dropped here: the rest goes out.
        });
        let written = tokio::task::spawn_blocking(move || thread.join().unwrap())
            .await
            .unwrap();
        (written, task.join_unwind().await.unwrap(), bytes)
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn the_upload_gets_every_byte_and_reports_its_failure() {
        let n = 2 * CHUNK_BYTES + 12_345;
        let (written, uploaded, bytes) = upload(n, usize::MAX).await;
        written.unwrap();
        assert_eq!(uploaded.complete().await.unwrap(), n);
        {
            let bytes = bytes.lock().unwrap();
            assert_eq!(bytes.len(), n);
            let at = CHUNK_BYTES + 1000;
            assert_eq!((bytes[0], bytes[at], bytes[n - 1]), (0, (at / 1000) as u8, 7));
        }

        // The store fails after the first chunk: the upload says why, whether or not the
        // writer's thread had sent its last chunk by then (the channel holds four) ...
        let (_, uploaded, _) = upload(4 * CHUNK_BYTES, CHUNK_BYTES + 1).await;
        let err = uploaded.complete().await.unwrap_err().to_string();
        assert!(err.contains("the store is full"), "{err}");
        // ... and a writer with more to send sees the upload stop.
        let (written, uploaded, _) = upload(10 * CHUNK_BYTES, CHUNK_BYTES + 1).await;
        assert!(written.unwrap_err().to_string().contains("upload"));
        assert!(uploaded.complete().await.is_err());
    }

    #[test]
    fn sorted_columns_become_the_files_sort_keys() {
        let schema = Arc::new(Schema::new(vec![
            Field::new("a", DataType::Int32, true),
            Field::new("b", DataType::Utf8, true),
        ]));
        let a = Arc::new(Column::new("a", 0));
        let b = Arc::new(Column::new("b", 1));
        let desc = SortOptions {
            descending: true,
            nulls_first: false,
        };
        let expr = |e, options| PhysicalSortExpr::new(e, options);
        let ordering = LexOrdering::new(vec![
            expr(b.clone(), desc),
            expr(a.clone(), SortOptions::default()),
            expr(b.clone(), SortOptions::default()),
        ])
        .unwrap();
        let keys = order_by(Some(&ordering), &schema);
        assert_eq!(
            keys,
            [
                SortKey {
                    column: "b".into(),
                    descending: true,
                    nulls_first: false
                },
                SortKey {
                    column: "a".into(),
                    descending: false,
                    nulls_first: true
                },
            ]
        );
        // Keys stop at the first that is not a column.
        let sum = Arc::new(BinaryExpr::new(
            a.clone(),
            datafusion::logical_expr::Operator::Plus,
            lit(1),
        ));
        let ordering = LexOrdering::new(vec![expr(a.clone(), desc), expr(sum, desc), expr(b, desc)]).unwrap();
        assert_eq!(order_by(Some(&ordering), &schema).len(), 1);
        assert!(order_by(None, &schema).is_empty());
    }
}
