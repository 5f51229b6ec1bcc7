//! The output file: sorted batches in, a Parquet file out, with the sort recorded in each row
//! group's `sorting_columns`. Row groups are cut at `--row-group-size` rows and their columns
//! encoded and compressed in parallel on a thread pool of the writer's own (not the sort's), a
//! few row groups at a time, driven by a thread of their own, so encoding overlaps with the
//! sort producing the next rows.
//!
//! Under a memory budget (a share of `--memory-limit`, see [`writer_share`]) a row group is also
//! cut when its rows reach half the budget in memory, and row groups wait to be encoded while
//! those in flight (their rows and their encoded pages, counted as twice their rows) would
//! take more than the budget.
//!
//! Each row group's columns are encoded by rayon tasks, one a column (see
//! `row_group.rs`), by gpusort's encoder ([`crate::encoder`]) where it takes them
//! ([`ColumnEncoder`]). With a [`PageCompressor`] ([`WriteOptions::page_compressor`], or zstd
//! on the CPU for gpusort's encoder) the columns are encoded uncompressed and each row group's
//! pages are then compressed in one batch (see [`crate::pages`]).

use std::io::Write;
use std::str::FromStr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc as std_mpsc;
use std::thread::JoinHandle;

use arrow::array::{Array, AsArray, RecordBatch};
use arrow::datatypes::{DataType, Schema, SchemaRef};
use parquet::arrow::arrow_writer::ArrowRowGroupWriterFactory;
use parquet::arrow::{ArrowSchemaConverter, ArrowWriter};
use parquet::basic::Compression;
use parquet::errors::ParquetError;
use parquet::file::metadata::{KeyValue, SortingColumn};
use parquet::file::properties::{WriterProperties, WriterPropertiesPtr};
use parquet::file::writer::SerializedFileWriter;
use parquet::schema::types::ColumnDescPtr;
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc};

use crate::encoder;
use crate::pages::{CapturingPageStoreFactory, CpuZstd, PageCompressor, Uncompressed};
use crate::row_group::{Encoded, RowGroupJob};
use crate::{SortKey, order_by_sql};

/// Rows per row group unless `--row-group-size` says otherwise (the Parquet writer's default).
pub const DEFAULT_ROW_GROUP_SIZE: usize = 1024 * 1024;

/// Row groups encoded at once: one per thread (at least two, at most sixteen). Columns take
/// very unequal time (a long string column is most of a row group's work), so as many row
/// groups as threads keep every core busy even when one column is all that is left of each;
/// fewer left most cores idle (two row groups of 16 columns on 16 cores: the writer ran at the
/// speed of two cores on TPC-H lineitem). A row group in flight holds its encoded pages; its
/// rows are slices of the sorted output, not copies. [`ROW_GROUPS_ENV`] sets another number.
fn row_groups_in_flight() -> Result<usize, ParquetError> {
    match std::env::var(ROW_GROUPS_ENV) {
        Ok(v) => parse_row_groups(&v).map_err(ParquetError::General),
        Err(_) => Ok(rayon::current_num_threads().clamp(2, 16)),
    }
}

/// `GPUSORT_WRITER_ROW_GROUPS` (2 to 256): the row groups the writer has in flight instead of
/// one per thread (`scripts/device-ab.sh` compares them).
pub const ROW_GROUPS_ENV: &str = "GPUSORT_WRITER_ROW_GROUPS";

fn parse_row_groups(v: &str) -> Result<usize, String> {
    crate::parse_count(ROW_GROUPS_ENV, v, 2..=256, "row groups")
}

/// Bytes the output file is written in at once (see [`SortedParquetWriter::try_new`]).
const OUTPUT_BUFFER_BYTES: usize = 4 << 20;

/// The key under which the output's file metadata records the ORDER BY list in SQL.
pub const ORDER_BY_METADATA_KEY: &str = "gpusort.order_by";

/// The part of `--memory-limit` the writer keeps for the row groups it encodes (the sort's
/// memory pool has the rest): an eighth, at most 1 GiB.
pub fn writer_share(memory_limit: usize) -> usize {
    (memory_limit / 8).clamp(1, 1 << 30)
}

/// The codecs, as `--compression` takes them.
pub const CODECS: &str = "uncompressed (or none), snappy, lz4_raw, lz4, gzip(0..9), brotli(0..11), zstd(1..22)";

/// A compression codec of the output: every codec the Parquet crate writes (`uncompressed`
/// or `none`, `snappy`, `lz4_raw`, `lz4` (Hadoop's framing), `gzip(LEVEL)`, `brotli(LEVEL)`,
/// `zstd(LEVEL)`; a codec with levels alone takes its default level: gzip 6, brotli 1, zstd 3).
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
        use parquet::basic::{BrotliLevel, GzipLevel, ZstdLevel};
        let t: String = s
            .trim()
            .to_ascii_lowercase()
            .chars()
            .filter(|c| !c.is_whitespace())
            .collect();
        let (name, level) = match t.split_once('(') {
            Some((name, rest)) => {
                let Some(level) = rest.strip_suffix(')') else {
                    return Err(format!("{s}: expected CODEC or CODEC(LEVEL), e.g. zstd(3)"));
                };
                (name, Some(level))
            }
            None => (t.as_str(), None),
        };
        let number = |range: &str| -> Result<Option<i64>, String> {
            level
                .map(|l| {
                    l.parse::<i64>()
                        .map_err(|_| format!("{s}: the level of {name} is a number, {range}"))
                })
                .transpose()
        };
        let bad_level = |range: &str| format!("{s}: the level of {name} must be {range}");
        let no_level = || -> Result<(), String> {
            match level {
                Some(_) => Err(format!("{s}: {name} has no levels")),
                None => Ok(()),
            }
        };
        let compression = match name {
            "uncompressed" | "none" => no_level().map(|()| Compression::UNCOMPRESSED)?,
            "snappy" => no_level().map(|()| Compression::SNAPPY)?,
            "lz4_raw" | "lz4raw" => no_level().map(|()| Compression::LZ4_RAW)?,
            "lz4" => no_level().map(|()| Compression::LZ4)?,
            "gzip" => {
                let level = number("0 to 9")?.unwrap_or(6);
                let level = u32::try_from(level).map_err(|_| bad_level("0 to 9"))?;
                Compression::GZIP(GzipLevel::try_new(level).map_err(|_| bad_level("0 to 9"))?)
            }
            "brotli" => {
                let level = number("0 to 11")?.unwrap_or(1);
                let level = u32::try_from(level).map_err(|_| bad_level("0 to 11"))?;
                Compression::BROTLI(BrotliLevel::try_new(level).map_err(|_| bad_level("0 to 11"))?)
            }
            "zstd" => {
                let level = number("1 to 22")?.unwrap_or(3);
                let level = i32::try_from(level).map_err(|_| bad_level("1 to 22"))?;
                if !(1..=22).contains(&level) {
                    return Err(bad_level("1 to 22"));
                }
                Compression::ZSTD(ZstdLevel::try_new(level).map_err(|_| bad_level("1 to 22"))?)
            }
            _ => return Err(format!("unknown codec {s}; the codecs are {CODECS}")),
        };
        Ok(Self(compression))
    }
}

impl std::fmt::Display for Codec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0 {
            Compression::ZSTD(level) => write!(f, "zstd({})", level.compression_level()),
            Compression::GZIP(level) => write!(f, "gzip({})", level.compression_level()),
            Compression::BROTLI(level) => write!(f, "brotli({})", level.compression_level()),
            other => write!(f, "{}", other.to_string().to_ascii_lowercase()),
        }
    }
}

/// Which encoder writes the columns: gpusort's ([`crate::encoder`]) every column it takes
/// (the rest go to the Parquet crate's), or the Parquet crate's every column.
///
/// gpusort's needs the pages compressed apart from encoding ([`crate::pages`]): it serves
/// zstd (compressed by [`WriteOptions::page_compressor`], else by [`CpuZstd`] at the codec's
/// level) and uncompressed output; other codecs are the Parquet crate's alone.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ColumnEncoder {
    /// gpusort's (`gpusort`).
    #[default]
    Gpusort,
    /// The Parquet crate's (`parquet`).
    ParquetCrate,
}

impl FromStr for ColumnEncoder {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim().to_ascii_lowercase().as_str() {
            "gpusort" => Ok(Self::Gpusort),
            "parquet" => Ok(Self::ParquetCrate),
            _ => Err(format!("expected gpusort or parquet, got '{s}'")),
        }
    }
}

impl std::fmt::Display for ColumnEncoder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Gpusort => "gpusort",
            Self::ParquetCrate => "parquet",
        })
    }
}

/// How the output is written.
#[derive(Debug, Clone)]
pub struct WriteOptions {
    /// Rows per row group.
    pub row_group_size: usize,
    /// The codec of every column (unless `page_compressor` is set).
    pub codec: Codec,
    /// Bytes the row groups being encoded may hold (see the module doc); `None`: no bound
    /// but the number of row groups in flight.
    pub memory_budget: Option<usize>,
    /// What compresses the pages, a row group at a time, in its codec (which then replaces
    /// `codec`); `None`: the Parquet crate compresses each page with `codec` as it encodes it.
    pub page_compressor: Option<Arc<dyn PageCompressor>>,
    /// Which encoder writes the columns.
    pub column_encoder: ColumnEncoder,
}

impl Default for WriteOptions {
    fn default() -> Self {
        Self {
            row_group_size: DEFAULT_ROW_GROUP_SIZE,
            codec: Codec::default(),
            memory_budget: None,
            page_compressor: None,
            column_encoder: ColumnEncoder::default(),
        }
    }
}

/// What compresses the pages apart from encoding: `options.page_compressor`, else where
/// gpusort's encoder writes the columns, zstd at the codec's level on the CPU (or nothing, for
/// uncompressed output); `None`: the Parquet crate compresses as it encodes.
fn page_compressor_for(options: &WriteOptions) -> Option<Arc<dyn PageCompressor>> {
    match (&options.page_compressor, options.column_encoder, options.codec.0) {
        (Some(compressor), _, _) => Some(Arc::clone(compressor)),
        (None, ColumnEncoder::Gpusort, Compression::ZSTD(level)) => {
            Some(Arc::new(CpuZstd::new(level.compression_level())))
        }
        (None, ColumnEncoder::Gpusort, Compression::UNCOMPRESSED) => Some(Arc::new(Uncompressed)),
        _ => None,
    }
}

/// The memory budget in permits of this many bytes (a semaphore counts in `u32`s).
const BUDGET_UNIT: usize = 1024;

/// Bytes the rows of `batch` take in memory: each column's slice (not the whole buffers a
/// slice shares), and for string and binary views the bytes of the long values they point at.
pub fn batch_bytes(batch: &RecordBatch) -> usize {
    batch.columns().iter().map(|c| column_bytes(c.as_ref())).sum()
}

fn column_bytes(column: &dyn Array) -> usize {
    fn long_values(views: &[u128]) -> usize {
        views.iter().map(|v| *v as u32 as usize).filter(|&len| len > 12).sum()
    }
    match column.data_type() {
        DataType::Utf8View => 16 * column.len() + long_values(column.as_string_view().views()),
        DataType::BinaryView => 16 * column.len() + long_values(column.as_binary_view().views()),
        _ => column
            .to_data()
            .get_slice_memory_size()
            .unwrap_or_else(|_| column.get_array_memory_size()),
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
    /// Bytes of `pending`.
    pending_bytes: usize,
    /// The memory budget: row groups in flight hold permits of [`BUDGET_UNIT`] bytes.
    budget: Option<(Arc<Semaphore>, usize)>,
    rows: u64,
    sender: Option<mpsc::Sender<RowGroup>>,
    thread: Option<JoinHandle<Result<usize, ParquetError>>>,
    sorting_columns: bool,
    progress: WriteProgress,
}

impl SortedParquetWriter {
    /// Starts writing `file` with columns `schema` (batches of other but compatible types are
    /// converted), recording `order_by` as the sort of every row group. The file is written
    /// on a thread of the writer's own.
    pub fn try_new<W: Write + Send + 'static>(
        file: W,
        schema: SchemaRef,
        order_by: &[SortKey],
        options: &WriteOptions,
    ) -> Result<Self, ParquetError> {
        Self::try_new_with_properties(file, schema, order_by, options, WriterProperties::default())
    }

    /// As [`Self::try_new`], starting from `properties` (e.g. per-column encodings or
    /// statistics) instead of the Parquet crate's defaults; `options` and the sort's metadata
    /// are set on top of them (the sort's key joins `properties`' key-value metadata).
    pub fn try_new_with_properties<W: Write + Send + 'static>(
        file: W,
        schema: SchemaRef,
        order_by: &[SortKey],
        options: &WriteOptions,
        properties: WriterProperties,
    ) -> Result<Self, ParquetError> {
        if options.row_group_size == 0 {
            return Err(ParquetError::General("the row group size must be at least 1".into()));
        }
        let sorting = sorting_columns(&schema, order_by)?;
        let page_compressor = page_compressor_for(options);
        let encoding_codec = match page_compressor {
            Some(_) => Compression::UNCOMPRESSED,
            None => options.codec.0,
        };
        // The sort's key joins the metadata `properties` has (replacing one of its name).
        let mut metadata: Vec<KeyValue> = properties
            .key_value_metadata()
            .into_iter()
            .flatten()
            .filter(|kv| kv.key != ORDER_BY_METADATA_KEY)
            .cloned()
            .collect();
        if !order_by.is_empty() {
            metadata.push(KeyValue::new(ORDER_BY_METADATA_KEY.to_string(), order_by_sql(order_by)));
        }
        let props = properties
            .into_builder()
            .set_compression(encoding_codec)
            .set_max_row_group_row_count(Some(options.row_group_size))
            .set_sorting_columns(sorting.clone())
            .set_key_value_metadata(Some(metadata))
            .build();
        // The Arrow writer adds the Arrow schema to the file metadata; its lower half then
        // writes row groups whose columns were encoded elsewhere.
        // The Parquet crate copies each appended chunk through an 8 KiB buffer, and its own
        // `BufWriter` passes writes of that size straight on: a write call every 8 KiB
        // (~20 ms a row group of TPC-H lineitem, one after another on the writer's thread)
        // unless the file is buffered here.
        let file = std::io::BufWriter::with_capacity(OUTPUT_BUFFER_BYTES, file);
        let (file_writer, factory) =
            ArrowWriter::try_new(file, Arc::clone(&schema), Some(props))?.into_serialized_writer()?;
        let (sender, receiver) = mpsc::channel::<RowGroup>(1);
        let progress = WriteProgress {
            units: Arc::default(),
            columns: schema.fields().len().max(1) as u64,
        };
        // As many threads as rayon's global pool, which the sort keeps (see crate::row_group).
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(rayon::current_num_threads())
            .thread_name(|i| format!("gpusort-encode-{i}"))
            .build()
            .map_err(|e| ParquetError::External(Box::new(e)))?;
        let encoder = Encoder::new(
            &file_writer,
            factory,
            page_compressor,
            options.column_encoder,
            &schema,
            &progress,
            Arc::new(pool),
        );
        let in_flight = row_groups_in_flight()?;
        let thread = std::thread::Builder::new()
            .name("gpusort-writer".into())
            .spawn(move || write_row_groups(file_writer, encoder, receiver, in_flight))
            .map_err(|e| ParquetError::External(Box::new(e)))?;
        Ok(Self {
            schema,
            row_group_size: options.row_group_size,
            pending: vec![],
            pending_rows: 0,
            pending_bytes: 0,
            budget: options.memory_budget.map(|bytes| {
                let permits = bytes
                    .div_ceil(BUDGET_UNIT)
                    .clamp(1, Semaphore::MAX_PERMITS.min(u32::MAX as usize));
                (Arc::new(Semaphore::new(permits)), permits)
            }),
            rows: 0,
            sender: Some(sender),
            thread: Some(thread),
            sorting_columns: sorting.is_some(),
            progress,
        })
    }

    /// Adds `batch` to the file; full row groups go to the encoder (waiting while it has as
    /// many as it encodes at once, and one more queued, or as the memory budget allows).
    pub async fn write(&mut self, batch: RecordBatch) -> Result<(), ParquetError> {
        let mut batch = batch;
        // Half the budget a row group: its rows and its encoded pages fit the budget.
        let group_cap = self
            .budget
            .as_ref()
            .map_or(usize::MAX, |(_, permits)| permits * BUDGET_UNIT / 2);
        let row_bytes = if self.budget.is_some() && batch.num_rows() > 0 {
            batch_bytes(&batch).div_ceil(batch.num_rows()).max(1)
        } else {
            0
        };
        while batch.num_rows() > 0 {
            let mut take = (self.row_group_size - self.pending_rows).min(batch.num_rows());
            if row_bytes > 0 {
                let room = group_cap.saturating_sub(self.pending_bytes).div_ceil(row_bytes).max(1);
                take = take.min(room);
            }
            self.pending.push(batch.slice(0, take));
            self.pending_rows += take;
            self.pending_bytes += take * row_bytes;
            self.rows += take as u64;
            batch = batch.slice(take, batch.num_rows() - take);
            if self.pending_rows == self.row_group_size || self.pending_bytes >= group_cap {
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
        let batches = std::mem::take(&mut self.pending);
        let bytes = std::mem::take(&mut self.pending_bytes);
        self.pending_rows = 0;
        // Its rows and its encoded pages, until it is in the file.
        let permit = match &self.budget {
            Some((semaphore, permits)) => {
                let want = (2 * bytes).div_ceil(BUDGET_UNIT).clamp(1, *permits) as u32;
                Some(
                    Arc::clone(semaphore)
                        .acquire_many_owned(want)
                        .await
                        .map_err(|e| ParquetError::External(Box::new(e)))?,
                )
            }
            None => None,
        };
        let sender = self.sender.as_ref().expect("not finished");
        if sender
            .send(RowGroup {
                batches,
                _permit: permit,
            })
            .await
            .is_err()
        {
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

/// A row group on its way to the file, with its share of the memory budget.
struct RowGroup {
    batches: Vec<RecordBatch>,
    _permit: Option<OwnedSemaphorePermit>,
}

/// Starts the encoding of row groups, each on the writer's thread pool (see [`crate::row_group`]).
struct Encoder {
    factory: ArrowRowGroupWriterFactory,
    /// The page compressor, and the page stores that keep the pages it compresses.
    compressing: Option<(Arc<dyn PageCompressor>, Arc<CapturingPageStoreFactory>)>,
    /// For each top-level field, its leaf's descriptor where gpusort's encoder writes it.
    gpusort: Arc<Vec<Option<ColumnDescPtr>>>,
    properties: WriterPropertiesPtr,
    schema: SchemaRef,
    /// Which top-level field each leaf column belongs to.
    roots: Vec<usize>,
    units: Arc<AtomicU64>,
    /// The writer's thread pool.
    pool: Arc<rayon::ThreadPool>,
}

impl Encoder {
    fn new<W: Write + Send>(
        file_writer: &SerializedFileWriter<W>,
        factory: ArrowRowGroupWriterFactory,
        page_compressor: Option<Arc<dyn PageCompressor>>,
        column_encoder: ColumnEncoder,
        schema: &SchemaRef,
        progress: &WriteProgress,
        pool: Arc<rayon::ThreadPool>,
    ) -> Self {
        let descr = file_writer.schema_descr();
        let properties = Arc::clone(file_writer.properties());
        let roots: Vec<usize> = (0..descr.num_columns()).map(|i| descr.get_column_root_idx(i)).collect();
        // gpusort's encoder writes a field that is one leaf it takes, where pages are compressed apart.
        let gpusort = (0..schema.fields().len())
            .map(|field| {
                let mut leaves = roots.iter().enumerate().filter(|(_, r)| **r == field).map(|(i, _)| i);
                match (leaves.next(), leaves.next()) {
                    (Some(leaf), None) if column_encoder == ColumnEncoder::Gpusort && page_compressor.is_some() => {
                        let leaf = descr.column(leaf);
                        encoder::encodes(schema.field(field), &leaf, &properties).then_some(leaf)
                    }
                    _ => None,
                }
            })
            .collect();
        let compressing = page_compressor.map(|compressor| (compressor, Arc::new(CapturingPageStoreFactory::new())));
        let factory = match &compressing {
            Some((_, stores)) => factory.with_page_store_factory(Arc::clone(stores) as _),
            None => factory,
        };
        Self {
            factory,
            compressing,
            gpusort: Arc::new(gpusort),
            properties,
            schema: Arc::clone(schema),
            roots,
            units: Arc::clone(&progress.units),
            pool,
        }
    }

    /// Starts encoding row group `index` (and compressing its pages) on rayon's threads; its
    /// chunks come back on the channel returned, with `permit`.
    fn start(
        &self,
        index: usize,
        group: Vec<RecordBatch>,
        permit: Option<OwnedSemaphorePermit>,
    ) -> Result<std_mpsc::Receiver<Encoded>, ParquetError> {
        let writers = self.factory.create_column_writers(index);
        // The stores created, even when a writer was not: the next row group has its own.
        let captured = self.compressing.as_ref().map(|(_, stores)| stores.take_created());
        let writers = writers?;
        let compressing = match (&self.compressing, captured) {
            (Some((compressor, _)), Some(pages)) => {
                if pages.len() != writers.len() {
                    return Err(ParquetError::General(format!(
                        "{} column writers but {} page stores",
                        writers.len(),
                        pages.len()
                    )));
                }
                Some((Arc::clone(compressor), pages))
            }
            _ => None,
        };
        let (done, result) = std_mpsc::channel::<Encoded>();
        RowGroupJob {
            index,
            batches: group,
            writers,
            roots: self.roots.clone(),
            gpusort: Arc::clone(&self.gpusort),
            properties: Arc::clone(&self.properties),
            schema: Arc::clone(&self.schema),
            compressing,
            units: Arc::clone(&self.units),
            done,
            permit,
            pool: Arc::clone(&self.pool),
        }
        .spawn();
        Ok(result)
    }
}

/// The writer thread: starts encoding each row group received (its columns in parallel, up to
/// `in_flight_max` row groups at once, see [`row_groups_in_flight`]) and hands it to an appender thread, which
/// appends them in order ([`append_in_order`]). Returns the number of row groups.
///
/// Why two threads: appending a row group writes its ~25 MB to the file (5-20 ms). When one
/// thread did both, a row group that arrived meanwhile waited to start, the sort's batches
/// waited for the writer to take them, and the sorted rows' ranges came down ~9 ms later each
/// (TPC-H lineitem SF10 on an H200, stop 40: ~0.5 s of a 2 s writing phase).
fn write_row_groups<W: Write + Send>(
    file_writer: SerializedFileWriter<W>,
    encoder: Encoder,
    mut receiver: mpsc::Receiver<RowGroup>,
    in_flight_max: usize,
) -> Result<usize, ParquetError> {
    // In flight: those queued here, the one the appender waits for, the one being handed over.
    let (started, to_append) = std_mpsc::sync_channel::<std_mpsc::Receiver<Encoded>>(in_flight_max.saturating_sub(2));
    let failed = AtomicBool::new(false);
    std::thread::scope(|scope| {
        let appender = std::thread::Builder::new()
            .name("gpusort-append".into())
            .spawn_scoped(scope, || append_in_order(file_writer, to_append, &failed))
            .map_err(|e| ParquetError::External(Box::new(e)))?;
        let mut result = Ok(0);
        while let Some(RowGroup {
            batches: group,
            _permit: permit,
        }) = receiver.blocking_recv()
        {
            let index = *result.as_ref().expect("an error ends the loop");
            match encoder.start(index, group, permit) {
                // The appender stopped on an error: its result says which.
                Ok(encoding) => {
                    if started.send(encoding).is_err() {
                        break;
                    }
                    result = Ok(index + 1);
                }
                Err(e) => {
                    failed.store(true, Ordering::Release);
                    result = Err(e);
                    break;
                }
            }
        }
        drop(started);
        let appended = appender
            .join()
            .unwrap_or_else(|_| Err(ParquetError::General("the row group appender panicked".into())));
        let started = result?;
        let appended = appended?;
        debug_assert_eq!(started, appended);
        Ok(appended)
    })
}

/// Appends the row groups `to_append` gives, in order, each once encoded, then closes the file
/// (not after an error, here or where `failed` says). Returns the number of row groups.
fn append_in_order<W: Write + Send>(
    mut file_writer: SerializedFileWriter<W>,
    to_append: std_mpsc::Receiver<std_mpsc::Receiver<Encoded>>,
    failed: &AtomicBool,
) -> Result<usize, ParquetError> {
    let mut appended = 0;
    for encoding in to_append {
        let (chunks, permit) = encoding
            .recv()
            .unwrap_or_else(|_| (Err(ParquetError::General("a row group encoder panicked".into())), None));
        let mut row_group = file_writer.next_row_group()?;
        chunks?.append_to(&mut row_group)?;
        let closed = row_group.close()?;
        crate::mark(format_args!(
            "writer: row group {} appended ({} rows)",
            closed.ordinal().unwrap_or(-1),
            closed.num_rows()
        ));
        // Its memory is free once its pages are in the file.
        drop(permit);
        appended += 1;
    }
    if failed.load(Ordering::Acquire) {
        return Err(ParquetError::General("a row group failed to start".into()));
    }
    file_writer.close()?;
    Ok(appended)
}

/// Parquet's `sorting_columns` for `order_by`: each key as the index of its leaf column.
/// `None` when a key is a nested column (it has no single leaf), or there is no key.
fn sorting_columns(schema: &Schema, order_by: &[SortKey]) -> Result<Option<Vec<SortingColumn>>, ParquetError> {
    if order_by.is_empty() {
        return Ok(None);
    }
    let descr = ArrowSchemaConverter::new().convert(schema)?;
    let mut out = vec![];
    for key in order_by {
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
    use arrow::array::ArrayRef;
    use arrow::array::{Array, Int32Array, StringArray, StringViewArray, StructArray};
    use arrow::datatypes::Field;
    use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
    use std::fs::File;

    #[test]
    fn row_groups_in_flight_parse() {
        assert_eq!(parse_row_groups(" 32 "), Ok(32));
        for bad in ["1", "257", "x", ""] {
            assert!(parse_row_groups(bad).unwrap_err().contains("2 to 256"), "{bad}");
        }
    }

    #[test]
    fn codecs_parse_with_their_levels() {
        assert_eq!("zstd(3)".parse::<Codec>().unwrap(), Codec::default());
        for (text, shown) in [
            ("ZSTD", "zstd(3)"),
            ("zstd(19)", "zstd(19)"),
            ("snappy", "snappy"),
            ("Uncompressed", "uncompressed"),
            ("none", "uncompressed"),
            ("lz4_raw", "lz4_raw"),
            ("lz4", "lz4"),
            ("gzip", "gzip(6)"),
            ("gzip(9)", "gzip(9)"),
            ("brotli", "brotli(1)"),
            ("brotli( 11 )", "brotli(11)"),
        ] {
            assert_eq!(text.parse::<Codec>().unwrap().to_string(), shown, "{text}");
        }
        let err = |text: &str| text.parse::<Codec>().unwrap_err();
        assert_eq!(err("zstd(99)"), "zstd(99): the level of zstd must be 1 to 22");
        assert_eq!(err("zstd(0)"), "zstd(0): the level of zstd must be 1 to 22");
        assert_eq!(err("gzip(10)"), "gzip(10): the level of gzip must be 0 to 9");
        assert_eq!(err("brotli(-1)"), "brotli(-1): the level of brotli must be 0 to 11");
        assert_eq!(err("gzip(fast)"), "gzip(fast): the level of gzip is a number, 0 to 9");
        assert_eq!(err("snappy(2)"), "snappy(2): snappy has no levels");
        assert_eq!(err("zstd(3"), "zstd(3: expected CODEC or CODEC(LEVEL), e.g. zstd(3)");
        assert!(err("lzo").starts_with("unknown codec lzo; the codecs are uncompressed"));
    }

    #[test]
    fn batch_bytes_count_slices_and_long_views() {
        let ints: ArrayRef = Arc::new(Int32Array::from_iter_values(0..1000));
        let views: ArrayRef = Arc::new(StringViewArray::from_iter_values((0..1000).map(|i| {
            if i % 2 == 0 {
                "short".to_string()
            } else {
                format!("{i:0>20}")
            }
        })));
        let schema = Arc::new(Schema::new(vec![
            Field::new("i", DataType::Int32, false),
            Field::new("s", DataType::Utf8View, false),
        ]));
        let batch = RecordBatch::try_new(schema, vec![ints, views]).unwrap();
        assert_eq!(batch_bytes(&batch), 4000 + 16_000 + 500 * 20);
        assert_eq!(batch_bytes(&batch.slice(0, 10)), 40 + 160 + 5 * 20);
        assert_eq!(writer_share(64 << 20), 8 << 20);
        assert_eq!(writer_share(64 << 30), 1 << 30);
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn eight_byte_decimals_are_written_as_the_schema_s_decimals() {
        use arrow::array::{AsArray, Decimal64Array, Decimal128Array};
        use arrow::datatypes::Decimal128Type;
        // A file of decimal(15, 2) and decimal(7, 1) columns (INT64 and INT32 in Parquet),
        // written from batches of 8-byte decimals (as the tool reads INT64 decimals).
        let schema = Arc::new(Schema::new(vec![
            Field::new("d", DataType::Decimal128(15, 2), true),
            Field::new("e", DataType::Decimal128(7, 1), false),
        ]));
        let batch_schema = Arc::new(Schema::new(vec![
            Field::new("d", DataType::Decimal64(15, 2), true),
            Field::new("e", DataType::Decimal64(7, 1), false),
        ]));
        let d = |i: i64| (i % 5 != 0).then_some((i * 7919 % 2001 - 1000) * 100_003);
        let batch = |from: i64, n: i64| {
            let dd = Decimal64Array::from_iter((from..from + n).map(d)).with_precision_and_scale(15, 2);
            let ee =
                Decimal64Array::from_iter_values((from..from + n).map(|i| i % 7 - 3)).with_precision_and_scale(7, 1);
            RecordBatch::try_new(
                Arc::clone(&batch_schema),
                vec![Arc::new(dd.unwrap()), Arc::new(ee.unwrap())],
            )
            .unwrap()
        };
        for encoder in [ColumnEncoder::Gpusort, ColumnEncoder::ParquetCrate] {
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("out.parquet");
            let options = WriteOptions {
                row_group_size: 1000,
                codec: "zstd(1)".parse().unwrap(),
                memory_budget: None,
                page_compressor: None,
                column_encoder: encoder,
            };
            let mut w =
                SortedParquetWriter::try_new(File::create(&path).unwrap(), Arc::clone(&schema), &[], &options).unwrap();
            w.write(batch(0, 1500)).await.unwrap();
            w.write(batch(1500, 700)).await.unwrap();
            w.finish().await.unwrap();
            let reader = ParquetRecordBatchReaderBuilder::try_new(File::open(&path).unwrap()).unwrap();
            let columns = reader.parquet_schema().columns().to_vec();
            assert_eq!(columns[0].physical_type(), parquet::basic::Type::INT64, "{encoder:?}");
            assert_eq!(columns[1].physical_type(), parquet::basic::Type::INT32, "{encoder:?}");
            let batches: Vec<RecordBatch> = reader.build().unwrap().collect::<Result<_, _>>().unwrap();
            let out = arrow::compute::concat_batches(&batches[0].schema(), &batches).unwrap();
            // Read back as the schema says: 16-byte decimals of the same values.
            assert_eq!(out.schema().fields(), schema.fields(), "{encoder:?}");
            let want_d = Decimal128Array::from_iter((0..2200).map(|i| d(i).map(i128::from)));
            assert_eq!(
                out.column(0)
                    .as_primitive::<Decimal128Type>()
                    .iter()
                    .collect::<Vec<_>>(),
                want_d.iter().collect::<Vec<_>>(),
                "{encoder:?}"
            );
            let want_e: Vec<i128> = (0..2200).map(|i| i128::from(i % 7 - 3)).collect();
            assert_eq!(
                out.column(1).as_primitive::<Decimal128Type>().values().to_vec(),
                want_e,
                "{encoder:?}"
            );
        }
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
        let order_by = [SortKey::desc("s"), SortKey::asc("k")];
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
            memory_budget: None,
            page_compressor: None,
            column_encoder: ColumnEncoder::default(),
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
        let by_nested = [SortKey::asc("nested")];
        assert_eq!(sorting_columns(&schema, &by_nested).unwrap(), None);
        assert_eq!(sorting_columns(&schema, &[]).unwrap(), None);
    }
}
