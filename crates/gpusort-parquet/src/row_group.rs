//! One row group's encoding: a rayon task a top-level column, each encoded by gpusort's
//! encoder ([`crate::encoder`]) or the Parquet crate's leaf writers; the row group is encoded
//! when its last column is, then its pages are compressed on a thread of its own (see
//! [`compress_off_rayon`]) and its chunks go back to the writer thread on a channel.
//!
//! Tasks, not a parallel loop in one task a row group: rayon runs the tasks a thread outside
//! its pool spawns in the order they came, so row groups finish one after another and their
//! compressions spread out in time. With a parallel loop inside a task, a thread waiting in one
//! row group's loop ran other row groups' columns on its stack: on TPC-H lineitem the 16 row
//! groups in flight finished encoding at one instant, and their 16 nvCOMP calls met on the
//! GPU at once, 225-250 ms each against 75 ms apart (`writer_props --whole --timeline`,
//! stop 24).
//!
//! The tasks run on the writer's own thread pool, not rayon's global one, which the sort uses:
//! where the sort merges runs while the writer encodes earlier rows (`--gpu-memory-limit`),
//! the sort's staging of each merge step queued behind the writer's tasks in the one pool,
//! 1.07 s a step for 2 ms of work (stop 24). Two pools share the cores as the OS schedules.

use std::io::Write;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc as std_mpsc;
use std::sync::{Arc, Mutex};

use arrow::array::{ArrayRef, RecordBatch};
use arrow::compute::cast;
use arrow::datatypes::{DataType, SchemaRef};
use parquet::arrow::arrow_writer::{ArrowColumnChunk, ArrowColumnWriter, compute_leaves};
use parquet::errors::ParquetError;
use parquet::file::properties::WriterPropertiesPtr;
use parquet::file::writer::SerializedRowGroupWriter;
use parquet::schema::types::ColumnDescPtr;
use tokio::sync::OwnedSemaphorePermit;

use crate::encoder::{self, EncodedChunk};
use crate::pages::{ChunkPages, CompressedChunk, EncodedColumn, PageCompressor, compress_row_group};

/// A row group's column chunks, in leaf order: as the Parquet crate encoded (and compressed)
/// them, or with their pages compressed by a [`PageCompressor`].
pub(crate) enum Chunks {
    Encoded(Vec<ArrowColumnChunk>),
    Compressed(Vec<CompressedChunk>),
}

impl Chunks {
    pub(crate) fn append_to<W: Write + Send>(
        self,
        row_group: &mut SerializedRowGroupWriter<'_, W>,
    ) -> Result<(), ParquetError> {
        match self {
            Chunks::Encoded(chunks) => chunks.into_iter().try_for_each(|c| c.append_to_row_group(row_group)),
            Chunks::Compressed(chunks) => chunks.into_iter().try_for_each(|c| c.append_to_row_group(row_group)),
        }
    }
}

/// An encoded row group, with its share of the memory budget.
pub(crate) type Encoded = (Result<Chunks, ParquetError>, Option<OwnedSemaphorePermit>);

/// One leaf column chunk of a row group, encoded.
enum EncodedLeaf {
    ParquetCrate(ArrowColumnChunk),
    Gpusort(EncodedChunk),
}

/// A row group to encode, and where its chunks go.
pub(crate) struct RowGroupJob {
    pub index: usize,
    pub batches: Vec<RecordBatch>,
    /// The Parquet crate's writers, one a leaf, in leaf order.
    pub writers: Vec<ArrowColumnWriter>,
    /// Which top-level field each leaf column belongs to.
    pub roots: Vec<usize>,
    /// Each top-level field's leaf where gpusort's encoder writes it.
    pub gpusort: Arc<Vec<Option<ColumnDescPtr>>>,
    pub properties: WriterPropertiesPtr,
    pub schema: SchemaRef,
    /// The page compressor, and each leaf's page store.
    pub compressing: Option<(Arc<dyn PageCompressor>, Vec<ChunkPages>)>,
    /// Rows times columns encoded, for the progress display.
    pub units: Arc<AtomicU64>,
    pub done: std_mpsc::Sender<Encoded>,
    /// The row group's share of the memory budget, held until its pages are in the file.
    pub permit: Option<OwnedSemaphorePermit>,
    /// The writer's thread pool.
    pub pool: Arc<rayon::ThreadPool>,
}

/// A field's leaves, encoded (or why not).
type FieldLeaves = Result<Vec<EncodedLeaf>, ParquetError>;

/// What a row group's column tasks share.
struct Shared {
    batches: Vec<RecordBatch>,
    gpusort: Arc<Vec<Option<ColumnDescPtr>>>,
    properties: WriterPropertiesPtr,
    schema: SchemaRef,
    units: Arc<AtomicU64>,
    /// Each field's leaves once encoded.
    fields: Mutex<Vec<Option<FieldLeaves>>>,
    /// Fields still being encoded.
    left: AtomicUsize,
    /// What the last task does with the chunks.
    then: Mutex<Option<Then>>,
}

/// Where a row group's chunks go once encoded.
struct Then {
    index: usize,
    pool: Arc<rayon::ThreadPool>,
    compressing: Option<(Arc<dyn PageCompressor>, Vec<ChunkPages>)>,
    done: std_mpsc::Sender<Encoded>,
    permit: Option<OwnedSemaphorePermit>,
}

/// `m` locked, whether or not a task panicked holding it (what it guards stays whole).
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl RowGroupJob {
    /// Spawns one rayon task a top-level field; the last one to finish sends the chunks on.
    pub(crate) fn spawn(self) {
        let n = self.schema.fields().len();
        let mut by_field: Vec<Vec<ArrowColumnWriter>> = (0..n).map(|_| vec![]).collect();
        for (writer, &root) in self.writers.into_iter().zip(&self.roots) {
            by_field[root].push(writer);
        }
        crate::mark(format_args!("writer: row group {} encoding", self.index));
        let shared = Arc::new(Shared {
            batches: self.batches,
            gpusort: self.gpusort,
            properties: self.properties,
            schema: self.schema,
            units: self.units,
            fields: Mutex::new((0..n).map(|_| None).collect()),
            left: AtomicUsize::new(n),
            then: Mutex::new(Some(Then {
                index: self.index,
                pool: Arc::clone(&self.pool),
                compressing: self.compressing,
                done: self.done,
                permit: self.permit,
            })),
        });
        if n == 0 {
            shared.finish();
        }
        for (i, writers) in by_field.into_iter().enumerate() {
            let shared = Arc::clone(&shared);
            self.pool.spawn(move || {
                let leaves = shared.encode_field(i, writers);
                lock(&shared.fields)[i] = Some(leaves);
                if shared.left.fetch_sub(1, Ordering::AcqRel) == 1 {
                    shared.finish();
                }
            });
        }
    }
}

impl Shared {
    /// Field `i`'s leaf chunks: by gpusort's encoder, or by `writers`.
    fn encode_field(&self, i: usize, mut writers: Vec<ArrowColumnWriter>) -> FieldLeaves {
        let field = self.schema.field(i);
        if let Some(descr) = &self.gpusort[i] {
            // The Parquet crate's writer for this leaf is not used.
            drop(writers);
            let arrays = self
                .batches
                .iter()
                .map(|b| to_encoder_type(b.column(i), field.data_type()))
                .collect::<Result<Vec<_>, _>>()?;
            let chunk = encoder::encode(&arrays, descr, &self.properties)?;
            let rows: u64 = self.batches.iter().map(|b| b.num_rows() as u64).sum();
            self.units.fetch_add(rows, Ordering::Relaxed);
            return Ok(vec![EncodedLeaf::Gpusort(chunk)]);
        }
        for batch in &self.batches {
            let column = to_output_type(batch.column(i), field.data_type())?;
            for (writer, leaf) in writers.iter_mut().zip(compute_leaves(field, &column)?) {
                writer.write(&leaf)?;
            }
            self.units.fetch_add(batch.num_rows() as u64, Ordering::Relaxed);
        }
        writers
            .into_iter()
            .map(|w| w.close().map(EncodedLeaf::ParquetCrate))
            .collect()
    }

    /// The row group's leaves in leaf order: compressed off rayon, or sent as they are.
    fn finish(&self) {
        let Some(Then {
            index,
            pool,
            compressing,
            done,
            permit,
        }) = lock(&self.then).take()
        else {
            return;
        };
        let leaves: FieldLeaves = std::mem::take(&mut *lock(&self.fields))
            .into_iter()
            .map(|f| {
                f.unwrap_or_else(|| {
                    Err(ParquetError::General(
                        "a column of the row group was not encoded".into(),
                    ))
                })
            })
            .collect::<Result<Vec<_>, _>>()
            .map(|fields| fields.into_iter().flatten().collect());
        match (leaves, compressing) {
            (Ok(leaves), Some((compressor, pages))) => {
                crate::mark(format_args!("writer: row group {index} encoded"));
                let columns = leaves
                    .into_iter()
                    .zip(pages)
                    .map(|(leaf, pages)| match leaf {
                        EncodedLeaf::ParquetCrate(chunk) => EncodedColumn::ParquetCrate(chunk, pages),
                        EncodedLeaf::Gpusort(chunk) => EncodedColumn::Gpusort(chunk),
                    })
                    .collect();
                compress_off_rayon(index, columns, compressor, pool, done, permit);
            }
            (leaves, _) => {
                let chunks = leaves.and_then(|leaves| {
                    leaves
                        .into_iter()
                        .map(|leaf| match leaf {
                            EncodedLeaf::ParquetCrate(chunk) => Ok(chunk),
                            EncodedLeaf::Gpusort(_) => Err(ParquetError::General(
                                "gpusort's encoder wrote a column whose pages nothing compresses".into(),
                            )),
                        })
                        .collect::<Result<Vec<_>, _>>()
                });
                let _ = done.send((chunks.map(Chunks::Encoded), permit));
            }
        }
    }
}

/// Compresses row group `index`'s pages on a thread of its own (its parallel loops in `pool`)
/// and sends the chunks to `done`.
///
/// Not on one of the pool's threads: a rayon thread waiting inside a parallel loop runs other tasks
/// meanwhile, on its own stack, so a task that waits there (for the GPU) holds up every task
/// under it. On TPC-H lineitem the row groups' compressions ran one after another so, and
/// the writer kept 6 of 16 cores busy (`writer_props --whole --timeline`, stop 23).
fn compress_off_rayon(
    index: usize,
    columns: Vec<EncodedColumn>,
    compressor: Arc<dyn PageCompressor>,
    pool: Arc<rayon::ThreadPool>,
    done: std_mpsc::Sender<Encoded>,
    permit: Option<OwnedSemaphorePermit>,
) {
    let work = move || {
        let chunks = pool
            .install(|| compress_row_group(columns, compressor.as_ref()))
            .map(Chunks::Compressed);
        crate::mark(format_args!("writer: row group {index} ready"));
        let _ = done.send((chunks, permit));
    };
    // Where no thread can be started, here: slower, not wrong.
    let work = Arc::new(std::sync::Mutex::new(Some(work)));
    let theirs = Arc::clone(&work);
    let spawned = std::thread::Builder::new().name("gpusort-pages".into()).spawn(move || {
        let work = theirs.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(work) = work {
            work();
        }
    });
    if let Err(e) = spawned {
        log::warn!("no thread for row group {index}'s pages ({e}): compressing them here");
        let work = work.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(work) = work {
            work();
        }
    }
}

/// `column` as gpusort's encoder takes it for an output field of type `to`: as
/// [`to_output_type`], but 8-byte decimals stay as they are for 16-byte decimals of the same
/// precision and scale (the encoder writes both as the same Parquet integers; a reader of the
/// input may have narrowed them, see `gpusort-cli`'s `narrow.rs`).
pub(crate) fn to_encoder_type(column: &ArrayRef, to: &DataType) -> Result<ArrayRef, ParquetError> {
    match (column.data_type(), to) {
        (DataType::Decimal64(p, s), DataType::Decimal128(q, t)) if (p, s) == (q, t) => Ok(Arc::clone(column)),
        _ => to_output_type(column, to),
    }
}

/// `column` as the output field's type wants it. The Parquet writer takes string and binary
/// views for string and binary columns as they are (DataFusion reads strings as views; the
/// output keeps the input's types); other differences are cast.
pub(crate) fn to_output_type(column: &ArrayRef, to: &DataType) -> Result<ArrayRef, ParquetError> {
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
