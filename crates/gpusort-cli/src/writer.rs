//! The output file: sorted batches in, a Parquet file out, with the sort recorded in each row
//! group's `sorting_columns`. Row groups are cut at `--row-group-size` rows and their columns
//! encoded and compressed in parallel (rayon), a few row groups at a time, driven by a thread
//! of their own, so encoding overlaps with the sort producing the next rows.

use std::collections::VecDeque;
use std::fs::File;
use std::str::FromStr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc as std_mpsc;
use std::thread::JoinHandle;

use arrow::array::{ArrayRef, RecordBatch};
use arrow::compute::cast;
use arrow::datatypes::{DataType, Schema, SchemaRef};
use parquet::arrow::arrow_writer::{ArrowColumnChunk, ArrowColumnWriter, ArrowRowGroupWriterFactory, compute_leaves};
use parquet::arrow::{ArrowSchemaConverter, ArrowWriter};
use parquet::basic::Compression;
use parquet::errors::ParquetError;
use parquet::file::metadata::{KeyValue, SortingColumn};
use parquet::file::properties::WriterProperties;
use rayon::prelude::*;
use tokio::sync::mpsc;

use crate::order_by::OrderBy;

/// Rows per row group unless `--row-group-size` says otherwise (the Parquet writer's default).
pub const DEFAULT_ROW_GROUP_SIZE: usize = 1024 * 1024;

/// Row groups encoded at once: one per thread (at least two, at most sixteen). Columns take
/// very unequal time (a long string column is most of a row group's work), so as many row
/// groups as threads keep every core busy even when one column is all that is left of each;
/// fewer left most cores idle (two row groups of 16 columns on 16 cores: the writer ran at the
/// speed of two cores on TPC-H lineitem). A row group in flight holds its encoded pages; its
/// rows are slices of the sorted output, not copies.
fn row_groups_in_flight() -> usize {
    rayon::current_num_threads().clamp(2, 16)
}

/// The key under which the output's file metadata records the ORDER BY list in SQL.
pub const ORDER_BY_METADATA_KEY: &str = "gpusort.order_by";

/// A compression codec this build can write: `uncompressed`, `snappy` or `zstd(LEVEL)`
/// (`zstd` alone is level 3), parsed by the Parquet crate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Codec(pub Compression);

impl Default for Codec {
    fn default() -> Self {
        "zstd(3)".parse().expect("zstd(3) is a valid codec")
    }
}

impl FromStr for Codec {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let mut t = s.trim().to_ascii_lowercase();
        if t == "zstd" {
            t = "zstd(3)".into();
        }
        let compression = Compression::from_str(&t).map_err(|e| {
            let e = e.to_string();
            e.strip_prefix("Parquet error: ").unwrap_or(&e).to_string()
        })?;
        match compression {
            Compression::UNCOMPRESSED | Compression::SNAPPY | Compression::ZSTD(_) => Ok(Self(compression)),
            _ => Err(format!(
                "{s} is not built into gpusort; use uncompressed, snappy or zstd(1..22)"
            )),
        }
    }
}

impl std::fmt::Display for Codec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0 {
            Compression::ZSTD(level) => write!(f, "zstd({})", level.compression_level()),
            other => write!(f, "{}", other.to_string().to_ascii_lowercase()),
        }
    }
}

/// How the output is written.
#[derive(Debug, Clone)]
pub struct WriteOptions {
    /// Rows per row group.
    pub row_group_size: usize,
    /// The codec of every column.
    pub codec: Codec,
}

impl Default for WriteOptions {
    fn default() -> Self {
        Self {
            row_group_size: DEFAULT_ROW_GROUP_SIZE,
            codec: Codec::default(),
        }
    }
}

/// What the writer wrote.
#[derive(Debug, Clone, Copy, Default)]
pub struct WriteStats {
    /// Rows.
    pub rows: u64,
    /// Row groups.
    pub row_groups: usize,
    /// Whether `sorting_columns` is in the row groups' metadata (false only when a sort key is
    /// a nested column, which Parquet cannot name as one column).
    pub sorting_columns: bool,
}

/// How far a writer's encoding is, readable from another thread (the progress display).
#[derive(Debug, Clone)]
pub struct WriteProgress {
    /// Rows times top-level columns encoded.
    units: Arc<AtomicU64>,
    columns: u64,
}

impl WriteProgress {
    /// Rows encoded (each column's share counted: half the columns of a row group done is
    /// half its rows).
    pub fn rows(&self) -> u64 {
        self.units.load(Ordering::Relaxed) / self.columns
    }
}

/// Writes batches, in order, to a Parquet file; see the module doc.
pub struct SortedParquetWriter {
    schema: SchemaRef,
    row_group_size: usize,
    pending: Vec<RecordBatch>,
    pending_rows: usize,
    rows: u64,
    sender: Option<mpsc::Sender<Vec<RecordBatch>>>,
    thread: Option<JoinHandle<Result<usize, ParquetError>>>,
    sorting_columns: bool,
    progress: WriteProgress,
}

impl SortedParquetWriter {
    /// Starts writing `file` with columns `schema` (batches of other but compatible types are
    /// converted), recording `order_by` as the sort of every row group.
    pub fn try_new(
        file: File,
        schema: SchemaRef,
        order_by: &OrderBy,
        options: &WriteOptions,
    ) -> Result<Self, ParquetError> {
        if options.row_group_size == 0 {
            return Err(ParquetError::General("the row group size must be at least 1".into()));
        }
        let sorting = sorting_columns(&schema, order_by)?;
        let props = WriterProperties::builder()
            .set_compression(options.codec.0)
            .set_max_row_group_row_count(Some(options.row_group_size))
            .set_sorting_columns(sorting.clone())
            .set_key_value_metadata(Some(vec![KeyValue::new(
                ORDER_BY_METADATA_KEY.to_string(),
                order_by.to_sql(),
            )]))
            .build();
        // The Arrow writer adds the Arrow schema to the file metadata; its lower half then
        // writes row groups whose columns were encoded elsewhere.
        let (file_writer, factory) =
            ArrowWriter::try_new(file, Arc::clone(&schema), Some(props))?.into_serialized_writer()?;
        let (sender, receiver) = mpsc::channel::<Vec<RecordBatch>>(1);
        let thread_schema = Arc::clone(&schema);
        let progress = WriteProgress {
            units: Arc::default(),
            columns: schema.fields().len().max(1) as u64,
        };
        let units = Arc::clone(&progress.units);
        let thread = std::thread::Builder::new()
            .name("gpusort-writer".into())
            .spawn(move || write_row_groups(file_writer, factory, thread_schema, receiver, units))
            .map_err(|e| ParquetError::External(Box::new(e)))?;
        Ok(Self {
            schema,
            row_group_size: options.row_group_size,
            pending: vec![],
            pending_rows: 0,
            rows: 0,
            sender: Some(sender),
            thread: Some(thread),
            sorting_columns: sorting.is_some(),
            progress,
        })
    }

    /// Adds `batch` to the file; full row groups go to the encoder (waiting while it has as
    /// many as it encodes at once, and one more queued).
    pub async fn write(&mut self, batch: RecordBatch) -> Result<(), ParquetError> {
        let mut batch = batch;
        while batch.num_rows() > 0 {
            let take = (self.row_group_size - self.pending_rows).min(batch.num_rows());
            self.pending.push(batch.slice(0, take));
            self.pending_rows += take;
            self.rows += take as u64;
            batch = batch.slice(take, batch.num_rows() - take);
            if self.pending_rows == self.row_group_size {
                self.send_pending().await?;
            }
        }
        Ok(())
    }

    /// Rows handed to the writer so far (encoded or not yet).
    pub fn rows(&self) -> u64 {
        self.rows
    }

    /// A handle on how many rows are encoded.
    pub fn progress(&self) -> WriteProgress {
        self.progress.clone()
    }

    /// Writes the last row group and the footer.
    pub async fn finish(mut self) -> Result<WriteStats, ParquetError> {
        if self.pending_rows > 0 {
            self.send_pending().await?;
        }
        self.sender = None;
        let thread = self.thread.take().expect("finish runs once");
        let row_groups = tokio::task::spawn_blocking(move || thread.join())
            .await
            .map_err(|e| ParquetError::External(Box::new(e)))?
            .map_err(|_| ParquetError::General("the Parquet writer thread panicked".into()))??;
        Ok(WriteStats {
            rows: self.rows,
            row_groups,
            sorting_columns: self.sorting_columns,
        })
    }

    async fn send_pending(&mut self) -> Result<(), ParquetError> {
        let group = std::mem::take(&mut self.pending);
        self.pending_rows = 0;
        let sender = self.sender.as_ref().expect("not finished");
        if sender.send(group).await.is_err() {
            // The thread stopped on an error: its result says which.
            self.sender = None;
            let thread = self.thread.take().expect("the thread is there until finish");
            return match thread.join() {
                Ok(Err(e)) => Err(e),
                _ => Err(ParquetError::General("the Parquet writer thread stopped".into())),
            };
        }
        Ok(())
    }

    /// The file's schema.
    pub fn schema(&self) -> &SchemaRef {
        &self.schema
    }
}

/// The writer thread: encodes each row group received (its columns in parallel, up to
/// [`row_groups_in_flight`] row groups at once) and appends them in order. Returns the number
/// of row groups.
fn write_row_groups(
    mut file_writer: parquet::file::writer::SerializedFileWriter<File>,
    factory: ArrowRowGroupWriterFactory,
    schema: SchemaRef,
    mut receiver: mpsc::Receiver<Vec<RecordBatch>>,
    units: Arc<AtomicU64>,
) -> Result<usize, ParquetError> {
    // Which top-level field each leaf column belongs to.
    let descr = file_writer.schema_descr();
    let roots: Vec<usize> = (0..descr.num_columns()).map(|i| descr.get_column_root_idx(i)).collect();
    let mut in_flight: VecDeque<std_mpsc::Receiver<Result<Vec<ArrowColumnChunk>, ParquetError>>> = VecDeque::new();
    let mut index = 0;
    let in_flight_max = row_groups_in_flight();
    let append = |file_writer: &mut parquet::file::writer::SerializedFileWriter<File>,
                  chunks: Vec<ArrowColumnChunk>|
     -> Result<(), ParquetError> {
        let mut row_group = file_writer.next_row_group()?;
        for chunk in chunks {
            chunk.append_to_row_group(&mut row_group)?;
        }
        let closed = row_group.close()?;
        crate::timeline::mark(format_args!(
            "writer: row group {} appended ({} rows)",
            closed.ordinal().unwrap_or(-1),
            closed.num_rows()
        ));
        Ok(())
    };
    let wait = |r: std_mpsc::Receiver<Result<Vec<ArrowColumnChunk>, ParquetError>>| {
        r.recv()
            .unwrap_or_else(|_| Err(ParquetError::General("a row group encoder panicked".into())))
    };
    while let Some(group) = receiver.blocking_recv() {
        let writers = factory.create_column_writers(index)?;
        index += 1;
        let (done, result) = std_mpsc::channel();
        let (schema, roots, units) = (Arc::clone(&schema), roots.clone(), Arc::clone(&units));
        rayon::spawn(move || {
            let _ = done.send(encode_row_group(writers, &roots, &schema, &group, &units));
        });
        in_flight.push_back(result);
        while in_flight.len() >= in_flight_max {
            let chunks = wait(in_flight.pop_front().expect("not empty"))?;
            append(&mut file_writer, chunks)?;
        }
    }
    while let Some(r) = in_flight.pop_front() {
        append(&mut file_writer, wait(r)?)?;
    }
    file_writer.close()?;
    Ok(index)
}

/// Encodes one row group: each top-level column (its leaf writers) on its own rayon task.
fn encode_row_group(
    writers: Vec<ArrowColumnWriter>,
    roots: &[usize],
    schema: &Schema,
    batches: &[RecordBatch],
    units: &AtomicU64,
) -> Result<Vec<ArrowColumnChunk>, ParquetError> {
    let mut by_field: Vec<Vec<ArrowColumnWriter>> = (0..schema.fields().len()).map(|_| vec![]).collect();
    for (writer, &root) in writers.into_iter().zip(roots) {
        by_field[root].push(writer);
    }
    let chunks: Vec<Vec<ArrowColumnChunk>> = by_field
        .into_par_iter()
        .enumerate()
        .map(|(i, mut writers)| {
            let field = schema.field(i);
            for batch in batches {
                let column = to_output_type(batch.column(i), field.data_type())?;
                for (writer, leaf) in writers.iter_mut().zip(compute_leaves(field, &column)?) {
                    writer.write(&leaf)?;
                }
                units.fetch_add(batch.num_rows() as u64, Ordering::Relaxed);
            }
            writers.into_iter().map(ArrowColumnWriter::close).collect()
        })
        .collect::<Result<_, ParquetError>>()?;
    Ok(chunks.into_iter().flatten().collect())
}

/// `column` as the output field's type wants it. The Parquet writer takes string and binary
/// views for string and binary columns as they are (DataFusion reads strings as views; the
/// output keeps the input's types); other differences are cast.
fn to_output_type(column: &ArrayRef, to: &DataType) -> Result<ArrayRef, ParquetError> {
    let from = column.data_type();
    let as_is = from == to
        || matches!(
            (from, to),
            (DataType::Utf8View, DataType::Utf8 | DataType::LargeUtf8)
                | (DataType::BinaryView, DataType::Binary | DataType::LargeBinary)
        );
    if as_is {
        Ok(Arc::clone(column))
    } else {
        cast(column, to).map_err(|e| ParquetError::General(format!("converting {from} to {to}: {e}")))
    }
}

/// Parquet's `sorting_columns` for `order_by`: each key as the index of its leaf column.
/// `None` when a key is a nested column (it has no single leaf).
fn sorting_columns(schema: &Schema, order_by: &OrderBy) -> Result<Option<Vec<SortingColumn>>, ParquetError> {
    let descr = ArrowSchemaConverter::new().convert(schema)?;
    let mut out = vec![];
    for key in order_by.keys() {
        let root = schema
            .index_of(&key.column)
            .map_err(|e| ParquetError::General(e.to_string()))?;
        let leaves: Vec<usize> = (0..descr.num_columns())
            .filter(|&i| descr.get_column_root_idx(i) == root)
            .collect();
        let [leaf] = leaves[..] else { return Ok(None) };
        if descr.column(leaf).max_rep_level() > 0 || descr.column(leaf).path().parts().len() > 1 {
            return Ok(None);
        }
        out.push(SortingColumn {
            column_idx: leaf as i32,
            descending: key.descending,
            nulls_first: key.nulls_first,
        });
    }
    Ok(Some(out))
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::{Array, Int32Array, StringArray, StringViewArray, StructArray};
    use arrow::datatypes::Field;
    use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;

    #[test]
    fn codecs_parse_like_parquet_rewrite() {
        assert_eq!("zstd(3)".parse::<Codec>().unwrap(), Codec::default());
        assert_eq!("ZSTD".parse::<Codec>().unwrap().to_string(), "zstd(3)");
        assert_eq!("snappy".parse::<Codec>().unwrap().to_string(), "snappy");
        assert_eq!("Uncompressed".parse::<Codec>().unwrap().to_string(), "uncompressed");
        assert!(
            "gzip(6)"
                .parse::<Codec>()
                .unwrap_err()
                .contains("not built into gpusort")
        );
        assert!("zstd(99)".parse::<Codec>().is_err());
        assert!("fast".parse::<Codec>().is_err());
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn row_groups_are_cut_and_views_written_as_the_schema_says() {
        let schema = Arc::new(Schema::new(vec![
            Field::new("k", DataType::Int32, false),
            Field::new("s", DataType::Utf8, true),
            Field::new(
                "nested",
                DataType::Struct(vec![Field::new("x", DataType::Int32, true)].into()),
                true,
            ),
        ]));
        let order_by = OrderBy::try_new("s DESC, k", &schema).unwrap();
        // DataFusion's batches carry string views where the file has strings.
        let batch_schema = Arc::new(Schema::new(vec![
            Field::new("k", DataType::Int32, false),
            Field::new("s", DataType::Utf8View, true),
            schema.field(2).clone(),
        ]));
        let batch = |from: i32, n: i32| {
            let nested = StructArray::from(vec![(
                Arc::new(Field::new("x", DataType::Int32, true)),
                Arc::new(Int32Array::from_iter_values(from..from + n)) as ArrayRef,
            )]);
            RecordBatch::try_new(
                Arc::clone(&batch_schema),
                vec![
                    Arc::new(Int32Array::from_iter_values(from..from + n)),
                    Arc::new(StringViewArray::from_iter(
                        (from..from + n).map(|i| (i % 3 != 0).then(|| format!("v{i}"))),
                    )),
                    Arc::new(nested),
                ],
            )
            .unwrap()
        };
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("out.parquet");
        let options = WriteOptions {
            row_group_size: 7,
            codec: "snappy".parse().unwrap(),
        };
        let mut w =
            SortedParquetWriter::try_new(File::create(&path).unwrap(), Arc::clone(&schema), &order_by, &options)
                .unwrap();
        let progress = w.progress();
        w.write(batch(0, 10)).await.unwrap();
        w.write(batch(10, 3)).await.unwrap();
        w.write(batch(13, 20)).await.unwrap();
        let stats = w.finish().await.unwrap();
        assert_eq!((stats.rows, stats.row_groups, stats.sorting_columns), (33, 5, true));
        assert_eq!(progress.rows(), 33);

        let reader = ParquetRecordBatchReaderBuilder::try_new(File::open(&path).unwrap()).unwrap();
        let meta = reader.metadata().clone();
        assert_eq!(meta.num_row_groups(), 5);
        let sizes: Vec<i64> = meta.row_groups().iter().map(|g| g.num_rows()).collect();
        assert_eq!(sizes, [7, 7, 7, 7, 5]);
        for g in meta.row_groups() {
            assert_eq!(
                g.sorting_columns().unwrap(),
                &[
                    SortingColumn {
                        column_idx: 1,
                        descending: true,
                        nulls_first: true
                    },
                    SortingColumn {
                        column_idx: 0,
                        descending: false,
                        nulls_first: false
                    },
                ]
            );
            assert_eq!(g.column(0).compression(), Compression::SNAPPY);
        }
        let kv = meta.file_metadata().key_value_metadata().unwrap();
        assert!(
            kv.iter().any(|e| e.key == ORDER_BY_METADATA_KEY
                && e.value.as_deref() == Some("s DESC NULLS FIRST, k ASC NULLS LAST"))
        );
        let batches: Vec<RecordBatch> = reader.build().unwrap().collect::<Result<_, _>>().unwrap();
        let out = arrow::compute::concat_batches(&batches[0].schema(), &batches).unwrap();
        assert_eq!(out.schema().field(1).data_type(), &DataType::Utf8);
        let k: Vec<i32> = out
            .column(0)
            .as_any()
            .downcast_ref::<Int32Array>()
            .unwrap()
            .values()
            .to_vec();
        assert_eq!(k, (0..33).collect::<Vec<_>>());
        let s = out.column(1).as_any().downcast_ref::<StringArray>().unwrap();
        assert!(s.is_null(0) && s.value(1) == "v1" && s.value(32) == "v32");
        let nested = out.column(2).as_any().downcast_ref::<StructArray>().unwrap();
        assert_eq!(
            nested
                .column(0)
                .as_any()
                .downcast_ref::<Int32Array>()
                .unwrap()
                .value(32),
            32
        );

        // A nested sort key has no single leaf: no sorting_columns then.
        let by_nested = OrderBy::try_new("nested", &schema).unwrap();
        assert_eq!(sorting_columns(&schema, &by_nested).unwrap(), None);
    }
}
