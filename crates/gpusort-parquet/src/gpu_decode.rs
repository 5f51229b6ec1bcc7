//! Row groups of a Parquet file decoded on the GPU into Arrow columns in device memory (issue
//! 20's reading phase; `crates/gpusort-cuda/kernels/NOTES.md`, "Parquet decode on the GPU: the
//! plan", step 3). [`GpuPageDecoder::decode`] lists the chunks' pages as stored
//! ([`column_chunk_pages`]), decompresses every snappy or zstd page of the call in one nvCOMP call and
//! uploads the uncompressed ones, makes views of the PLAIN byte arrays, and decodes every data
//! page in one launch ([`gpusort_cuda::parquet`]).
//!
//! What it decodes: flat columns, required or optional, of the types [`ColumnPlan::for_field`]
//! lists (integers, floats, dates, times, timestamps, decimals stored as INT32 or INT64, byte
//! arrays as `Utf8View` / `BinaryView`), pages v1 and v2 that are PLAIN or dictionary encoded,
//! uncompressed, snappy or zstd (one codec a call). Anything else is refused before the GPU is touched
//! ([`GpuPageDecoder::plan`]), and the caller reads the file with the Parquet crate.
//!
//! Byte arrays' views point into the decompressed pages themselves: buffer 0 is nvCOMP's
//! output, buffer 1 the uploaded pages ([`GpuRowGroups::buffers`]); no byte is copied.

use std::sync::Arc;

use arrow::array::{ArrayRef, RecordBatch, make_array};
use arrow::buffer::{BooleanBuffer, Buffer, NullBuffer};
use arrow::datatypes::{DataType, Field, FieldRef, Schema, SchemaRef};
use bytes::Bytes;
use gpusort_cuda::parquet::{PAGE_DICT, PAGE_OPTIONAL, PAGE_PLAIN, PAGE_V1_LEVELS, ParquetPage, ViewRegion};
use gpusort_cuda::{DeviceBatch, DeviceBatchColumn, DeviceBuffers, Gpu, KernelCache, PageCodec, PageDecompressor};
use parquet::arrow::parquet_to_arrow_schema;
use parquet::basic::{Compression, Encoding, Type as PhysicalType};
use parquet::errors::{ParquetError, Result};
use parquet::file::metadata::{ColumnChunkMetaData, ParquetMetaData};

use crate::stored_pages::{ColumnChunkPages, PageKind, StoredPage, column_chunk_pages};

/// How one column is decoded: the file's column it reads (its index among the file's leaf
/// columns), bytes a stored value takes (0: byte arrays), bytes of its Arrow value (16 for
/// views), whether it widens with its sign, and its output field.
#[derive(Debug, Clone, PartialEq)]
pub struct ColumnPlan {
    pub column: usize,
    pub in_width: u32,
    pub out_width: u32,
    pub sign: bool,
    pub optional: bool,
    pub field: FieldRef,
}

impl ColumnPlan {
    /// The plan of `field` (as the Parquet crate's reader returns it) stored as `physical` in
    /// the file's column `column`, or why the device does not decode it.
    pub fn for_field(column: usize, field: &Field, physical: PhysicalType, optional: bool) -> Result<Self, String> {
        use DataType as D;
        use PhysicalType as P;
        let (in_width, out_width, sign, out_type) = match (physical, field.data_type()) {
            (P::INT32, D::Int32 | D::UInt32 | D::Date32 | D::Time32(_) | D::Decimal32(..)) => (4, 4, false, None),
            (P::INT32, D::Int8 | D::UInt8) => (4, 1, false, None),
            (P::INT32, D::Int16 | D::UInt16) => (4, 2, false, None),
            (P::INT32, D::Decimal64(..)) => (4, 8, true, None),
            (P::INT32, D::Decimal128(..)) => (4, 16, true, None),
            (P::INT64, D::Int64 | D::UInt64 | D::Time64(_) | D::Timestamp(..) | D::Decimal64(..)) => {
                (8, 8, false, None)
            }
            (P::INT64, D::Decimal128(..)) => (8, 16, true, None),
            (P::FLOAT, D::Float32) => (4, 4, false, None),
            (P::DOUBLE, D::Float64) => (8, 8, false, None),
            (P::BYTE_ARRAY, D::Utf8 | D::LargeUtf8 | D::Utf8View) => (0, 16, false, Some(D::Utf8View)),
            (P::BYTE_ARRAY, D::Binary | D::LargeBinary | D::BinaryView) => (0, 16, false, Some(D::BinaryView)),
            (p, t) => return Err(format!("column '{}': {t} stored as {p}", field.name())),
        };
        let out = match out_type {
            Some(t) => Field::new(field.name(), t, optional),
            None => field.clone().with_nullable(optional),
        };
        Ok(Self {
            column,
            in_width,
            out_width,
            sign,
            optional,
            field: Arc::new(out),
        })
    }
}

/// Decodes Parquet row groups on one GPU; see the module doc.
pub struct GpuPageDecoder {
    gpu: Arc<Gpu>,
    nvcomp: PageDecompressor,
    /// The types the columns are decoded as, where not the file's own ([`Self::with_schema`]).
    schema: Option<SchemaRef>,
}

impl std::fmt::Debug for GpuPageDecoder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GpuPageDecoder")
            .field("nvcomp", &self.nvcomp)
            .finish_non_exhaustive()
    }
}

/// A column of the decoded row groups in device memory: `width` bytes a row, and a validity
/// bitmap (Arrow's, in 32-bit words) where the column is optional.
pub struct GpuColumn {
    pub field: FieldRef,
    pub width: usize,
    pub values: cudarc::driver::CudaSlice<u8>,
    pub validity: Option<cudarc::driver::CudaSlice<u32>>,
}

/// Row groups decoded into device memory: their columns, and the decompressed pages the byte
/// arrays' views point into (buffer 0: nvCOMP's output; buffer 1: pages uploaded as stored).
pub struct GpuRowGroups {
    pub rows: usize,
    pub columns: Vec<GpuColumn>,
    pub buffers: [DeviceBuffers; 2],
    /// The buffer index of `buffers[0]` in the long views ([`GpuPageDecoder::decode_at`]).
    pub first_buffer: u32,
    /// Where the call's time went.
    pub times: DecodeTimes,
    _views: cudarc::driver::CudaSlice<u8>,
    /// The columns' and views' device memory, held of the budget (the pages hold theirs).
    _held: gpusort_cuda::DeviceReservation,
}

/// Seconds of a [`GpuPageDecoder::decode`] call: listing the pages, moving them to the device
/// (packing, upload, nvCOMP), and the kernels (views, then pages; waited for).
#[derive(Debug, Clone, Copy, Default)]
pub struct DecodeTimes {
    pub list: f64,
    pub pages: f64,
    pub kernels: f64,
}

/// A Parquet file's bytes (all of them, or the range a call decodes: [`Self::read_range`]),
/// the file offset of the first, and whether they are in pinned host memory
/// ([`Self::read_pinned`]): then the pages of a call cross PCIe in one copy at full speed, else
/// through a pinned copy.
#[derive(Debug, Clone)]
pub struct FileBytes {
    pub bytes: Bytes,
    pub pinned: bool,
    pub offset: u64,
}

impl From<Bytes> for FileBytes {
    /// A whole file's bytes in pageable memory.
    fn from(bytes: Bytes) -> Self {
        Self {
            bytes,
            pinned: false,
            offset: 0,
        }
    }
}

/// A file's bytes in pinned host memory.
struct PinnedBytes(gpusort_cuda::HostBuffer);

impl AsRef<[u8]> for PinnedBytes {
    fn as_ref(&self) -> &[u8] {
        self.0.as_slice()
    }
}

/// Bytes a thread of [`FileBytes::read_range`] reads at a time.
const READ_PIECE: usize = 16 << 20;

impl FileBytes {
    /// The file at `path` read into pinned host memory ([`Self::read_range`] of all of it).
    pub fn read_pinned(path: &std::path::Path) -> std::io::Result<Self> {
        let file = std::fs::File::open(path)?;
        let len = file.metadata()?.len();
        Self::read_range(&file, 0..len)
    }

    /// Bytes `range` of `file` read into pinned host memory (a block of the process's pool,
    /// pageable memory where the pool has none), pieces of it on every core. A sort that
    /// reads each call's range ([`GpuPageDecoder::byte_range`]) and drops it after the call
    /// pins a call's bytes once and reuses them, where pinning a whole file of gigabytes took
    /// ~0.2 s on the H200 (stop 48).
    pub fn read_range(file: &std::fs::File, range: std::ops::Range<u64>) -> std::io::Result<Self> {
        use rayon::prelude::*;
        use std::os::unix::fs::FileExt;
        let len = usize::try_from(range.end.saturating_sub(range.start)).map_err(std::io::Error::other)?;
        let mut buffer = gpusort_cuda::PinnedPool::global().alloc(len);
        buffer.truncate(len);
        (buffer.as_mut_slice().par_chunks_mut(READ_PIECE).enumerate())
            .try_for_each(|(i, piece)| file.read_exact_at(piece, range.start + (i * READ_PIECE) as u64))?;
        let pinned = buffer.is_pinned();
        Ok(Self {
            bytes: Bytes::from_owner(PinnedBytes(buffer)),
            pinned,
            offset: range.start,
        })
    }
}

fn external(e: impl std::error::Error + Send + Sync + 'static) -> ParquetError {
    ParquetError::External(Box::new(e))
}

/// Where a page's bytes went: buffer 0 (decompressed) or 1 (uploaded), and its index there.
#[derive(Debug, Clone, Copy)]
struct Placed {
    buffer: usize,
    index: usize,
}

/// The buffers a call sends to the device: compressed pages (of one codec) and their sizes, and
/// raw bytes.
#[derive(Default)]
struct Uploads<'a> {
    codec: Option<PageCodec>,
    compressed: Vec<&'a [u8]>,
    sizes: Vec<usize>,
    raw: Vec<&'a [u8]>,
}

impl<'a> Uploads<'a> {
    /// Sends `page`'s values (past any v2 levels): decompressed where compressed.
    fn values(&mut self, page: &'a StoredPage, codec: Compression) -> Result<Placed> {
        let bytes = &page.bytes[page.levels_bytes..];
        if !page.compressed {
            return Ok(self.raw(bytes));
        }
        let codec = page_codec(codec).ok_or_else(|| ParquetError::NYI(format!("{codec} pages on the GPU")))?;
        if self.codec.is_some_and(|c| c != codec) {
            return Err(ParquetError::NYI("pages of two codecs in one call".into()));
        }
        self.codec = Some(codec);
        let size = page
            .uncompressed_bytes
            .ok_or_else(|| ParquetError::General(format!("a {} page without its size", codec.name())))?;
        self.compressed.push(bytes);
        self.sizes.push(size);
        Ok(Placed {
            buffer: 0,
            index: self.compressed.len() - 1,
        })
    }

    fn raw(&mut self, bytes: &'a [u8]) -> Placed {
        self.raw.push(bytes);
        Placed {
            buffer: 1,
            index: self.raw.len() - 1,
        }
    }
}

/// A data page of a column chunk, before the device addresses are known.
struct PagePlan {
    column: usize,
    row: u64,
    values: Placed,
    levels: Option<Placed>,
    levels_len: usize,
    /// The dictionary page's place (fixed-width dictionaries), or the index of its views'
    /// region (byte arrays); a PLAIN byte-array page: its own region.
    dict: Option<Placed>,
    region: Option<usize>,
    dict_len: usize,
    page: ParquetPage,
}

impl GpuPageDecoder {
    /// A decoder on GPU `ordinal`; an error says why there is none (no GPU, no nvCOMP).
    pub fn try_new(ordinal: usize) -> gpusort_cuda::Result<Self> {
        let nvcomp = PageDecompressor::try_new(ordinal)?;
        let gpu = Arc::new(Gpu::open(ordinal, &KernelCache::from_env())?);
        Ok(Self {
            gpu,
            nvcomp,
            schema: None,
        })
    }

    /// Holds its device memory (the pages, the decoded columns) of `budget` instead of the
    /// process's budget of the device.
    pub fn with_budget(mut self, budget: Arc<gpusort_cuda::DeviceBudget>) -> Self {
        self.nvcomp = self.nvcomp.with_budget(budget);
        self
    }

    /// Decodes the columns `schema` names, each as its field there ([`Self::plan_as`]).
    pub fn with_schema(mut self, schema: SchemaRef) -> Self {
        self.schema = Some(schema);
        self
    }

    /// The GPU it decodes on.
    pub fn gpu(&self) -> &Arc<Gpu> {
        &self.gpu
    }

    /// How each column of `meta`'s file is decoded, or why the device cannot decode the file
    /// (a nested or repeated column, a type of no plan).
    pub fn plan(meta: &ParquetMetaData) -> Result<Vec<ColumnPlan>, String> {
        Self::plan_as(meta, None)
    }

    /// [`Self::plan`], or where `schema` is given, of the file's columns it names (all or some,
    /// in its order: a projection), each decoded as its field there: a table's types for the
    /// file's columns (a decimal of INT64 as `Decimal64`, say). An error where it names a
    /// column the file does not hold.
    pub fn plan_as(meta: &ParquetMetaData, schema: Option<&Schema>) -> Result<Vec<ColumnPlan>, String> {
        let file = meta.file_metadata();
        let descr = file.schema_descr();
        let natural = parquet_to_arrow_schema(descr, file.key_value_metadata()).map_err(|e| e.to_string())?;
        if natural.fields().len() != descr.num_columns() {
            return Err("nested columns".into());
        }
        let names = |s: &Schema| s.fields().iter().map(|f| f.name().clone()).collect::<Vec<_>>();
        let (schema, columns): (&Schema, Vec<usize>) = match schema {
            None => (&natural, (0..natural.fields().len()).collect()),
            Some(s) => {
                let in_file = |name: &String| {
                    let mut at = (natural.fields().iter()).enumerate().filter(|(_, f)| f.name() == name);
                    match (at.next(), at.next()) {
                        (Some((i, _)), None) => Ok(i),
                        _ => Err(format!(
                            "the file's columns {:?} hold no column {name} (or more than one)",
                            names(&natural)
                        )),
                    }
                };
                (s, names(s).iter().map(in_file).collect::<Result<_, _>>()?)
            }
        };
        (schema.fields().iter().zip(columns))
            .map(|(field, i)| {
                let col = descr.column(i);
                if col.max_rep_level() > 0 || col.max_def_level() > 1 {
                    return Err(format!("column '{}' is repeated or nested", field.name()));
                }
                ColumnPlan::for_field(i, field, col.physical_type(), col.max_def_level() == 1)
            })
            .collect()
    }

    /// The bytes of the file that `row_groups`' column chunks lie in (what a call of them
    /// reads: [`FileBytes::read_range`]).
    pub fn byte_range(meta: &ParquetMetaData, row_groups: &[usize]) -> std::ops::Range<u64> {
        Self::columns_byte_range(meta, row_groups, &all_columns(meta))
    }

    /// [`Self::byte_range`] of the chunks of `columns` alone (a projection's).
    pub fn columns_byte_range(meta: &ParquetMetaData, row_groups: &[usize], columns: &[usize]) -> std::ops::Range<u64> {
        let ranges = (row_groups.iter())
            .flat_map(|&g| columns.iter().map(move |&c| meta.row_group(g).column(c)))
            .map(|c| {
                let (start, len) = c.byte_range();
                start..start + len
            });
        ranges
            .reduce(|a, b| a.start.min(b.start)..a.end.max(b.end))
            .unwrap_or(0..0)
    }

    /// Whether the device decodes the chunks of `row_groups` of `meta`'s file, by what their
    /// metadata lists (codec, encodings), or why not; [`Self::decode`] checks each page again.
    pub fn check_row_groups(meta: &ParquetMetaData, row_groups: &[usize]) -> Result<(), String> {
        Self::check_columns(meta, row_groups, &all_columns(meta))
    }

    /// [`Self::check_row_groups`] of the chunks of `columns` alone (a projection's).
    pub fn check_columns(meta: &ParquetMetaData, row_groups: &[usize], columns: &[usize]) -> Result<(), String> {
        let mut codecs = None;
        for &g in row_groups {
            let rg = meta.row_groups().get(g).ok_or_else(|| format!("no row group {g}"))?;
            for chunk in columns.iter().map(|&c| rg.column(c)) {
                let name = chunk.column_path().string();
                match (chunk.compression(), page_codec(chunk.compression())) {
                    (Compression::UNCOMPRESSED, _) => {}
                    (_, Some(codec)) if codecs.is_none_or(|c| c == codec) => codecs = Some(codec),
                    (_, Some(_)) => return Err(format!("column '{name}': pages of two codecs in one call")),
                    (other, None) => return Err(format!("column '{name}': {other} pages")),
                }
                // RLE: the levels' (and booleans'); BIT_PACKED, old levels, is not read.
                if let Some(e) = chunk.encodings().find(|e| {
                    !matches!(
                        e,
                        Encoding::PLAIN | Encoding::PLAIN_DICTIONARY | Encoding::RLE_DICTIONARY | Encoding::RLE
                    )
                }) {
                    return Err(format!("column '{name}': {e} pages"));
                }
            }
        }
        Ok(())
    }

    /// Decodes `row_groups` of `file` (its bytes; `meta` its metadata) into device memory.
    pub fn decode(&self, file: &FileBytes, meta: &ParquetMetaData, row_groups: &[usize]) -> Result<GpuRowGroups> {
        self.decode_at(file, meta, row_groups, 0)
    }

    /// [`Self::decode`], the long views indexing the two page buffers as `first_buffer` and
    /// `first_buffer + 1`: where they come among the buffers of a sort's earlier row groups
    /// ([`GpuRowGroups::into_device_batch`]).
    pub fn decode_at(
        &self,
        file: &FileBytes,
        meta: &ParquetMetaData,
        row_groups: &[usize],
        first_buffer: u32,
    ) -> Result<GpuRowGroups> {
        let (pinned, offset, file) = (file.pinned, file.offset, &file.bytes);
        let start = std::time::Instant::now();
        let plans = Self::plan_as(meta, self.schema.as_deref()).map_err(ParquetError::NYI)?;
        let columns: Vec<usize> = plans.iter().map(|p| p.column).collect();
        Self::check_columns(meta, row_groups, &columns).map_err(ParquetError::NYI)?;
        // Every chunk's pages, row group by row group.
        let mut chunks = vec![];
        let mut rows = 0u64;
        for &g in row_groups {
            let rg = meta.row_group(g);
            for (k, plan) in plans.iter().enumerate() {
                let chunk = chunk_in(rg.column(plan.column), offset, file.len())?;
                let pages = column_chunk_pages(file, &chunk, rg.num_rows() as usize)?;
                chunks.push((k, rows..rows + rg.num_rows() as u64, pages));
            }
            rows += rg.num_rows() as u64;
        }
        let rows = rows as usize;
        let mut uploads = Uploads::default();
        let (pages, regions) = plan_pages(&chunks, &plans, &mut uploads)?;
        let mut times = DecodeTimes {
            list: start.elapsed().as_secs_f64(),
            ..DecodeTimes::default()
        };
        let buffers = self.to_device(file, pinned, &uploads)?;
        times.pages = start.elapsed().as_secs_f64() - times.list;
        let view_count: usize = regions.iter().map(|r| r.1).sum();
        // The columns and the views, held of the budget the pages are.
        let column_bytes: usize = (plans.iter())
            .map(|p| rows * p.out_width as usize + if p.optional { 4 * rows.div_ceil(32) } else { 0 })
            .sum();
        let mut held = self.nvcomp.reservation();
        if !held.try_grow_to(column_bytes + 16 * view_count) {
            return Err(ParquetError::General(format!(
                "the device memory budget has no room for {:.1} MB of decoded columns now",
                (column_bytes + 16 * view_count) as f64 / 1e6
            )));
        }
        let columns = (plans.iter())
            .map(|p| self.alloc_column(p, rows))
            .collect::<gpusort_cuda::Result<Vec<_>>>()
            .map_err(external)?;
        let views = self.gpu.alloc_bytes(16 * view_count).map_err(external)?;
        let stream = self.gpu.stream();
        let (regions, pages) = describe(&buffers, first_buffer, &columns, &views, &regions, pages, stream)?;
        let launched = std::time::Instant::now();
        self.gpu.parquet_plain_views(&regions).map_err(external)?;
        self.gpu.parquet_decode(&pages).map_err(external)?;
        times.kernels = launched.elapsed().as_secs_f64();
        Ok(GpuRowGroups {
            rows,
            columns,
            buffers,
            first_buffer,
            times,
            _views: views,
            _held: held,
        })
    }

    /// The call's pages on the device: the range of the file that holds them uploaded whole
    /// (buffer 1, whose pieces are the uploads' raw slices: one copy, none packed; at full
    /// speed from `pinned` memory, [`FileBytes::read_pinned`]), and the compressed pages
    /// decompressed from it there (buffer 0). Where the codec needs its inputs at aligned
    /// addresses, the compressed pages are packed on the host instead (the decompressor's
    /// call) and the range holds the raw pages alone.
    fn to_device(&self, file: &Bytes, pinned: bool, uploads: &Uploads) -> Result<[DeviceBuffers; 2]> {
        let offset = |b: &[u8]| {
            let at = (b.as_ptr() as usize).wrapping_sub(file.as_ptr() as usize);
            match at.checked_add(b.len()) {
                Some(end) if end <= file.len() => Ok(at),
                _ => Err(ParquetError::General("a page outside the file's bytes".into())),
            }
        };
        let codec = uploads.codec.unwrap_or(PageCodec::Snappy);
        let in_place = self.nvcomp.input_alignment(codec) == 1;
        let (mut lo, mut hi) = (usize::MAX, 0);
        let in_range = (uploads.compressed.iter()).filter(|_| in_place).chain(&uploads.raw);
        for b in in_range {
            let at = offset(b)?;
            (lo, hi) = (lo.min(at), hi.max(at + b.len()));
        }
        let lo = lo.min(hi);
        let pieces: Vec<(usize, usize)> = (uploads.raw.iter())
            .map(|b| Ok((offset(b)? - lo, b.len())))
            .collect::<Result<_>>()?;
        let range = (self.nvcomp)
            .upload_range(&file[lo..hi], &pieces, pinned)
            .map_err(external)?;
        let decompressed = if in_place {
            let base = {
                use cudarc::driver::DevicePtr;
                range.data.device_ptr(self.nvcomp.stream()).0
            };
            let inputs: Vec<(u64, &[u8])> = (uploads.compressed.iter())
                .map(|b| Ok((base + (offset(b)? - lo) as u64, *b)))
                .collect::<Result<_>>()?;
            self.nvcomp.decompress_on_device(codec, &inputs, &uploads.sizes)
        } else {
            (self.nvcomp).decompress_to_device(codec, &uploads.compressed, &uploads.sizes)
        };
        Ok([decompressed.map_err(external)?, range])
    }

    fn alloc_column(&self, plan: &ColumnPlan, rows: usize) -> gpusort_cuda::Result<GpuColumn> {
        let validity = match plan.optional {
            true => Some(self.gpu.stream().alloc_zeros::<u32>(rows.div_ceil(32).max(1))?),
            false => None,
        };
        Ok(GpuColumn {
            field: Arc::clone(&plan.field),
            width: plan.out_width as usize,
            values: self.gpu.alloc_bytes(rows * plan.out_width as usize)?,
            validity,
        })
    }
}

/// Every leaf column of `meta`'s file.
fn all_columns(meta: &ParquetMetaData) -> Vec<usize> {
    (0..meta.file_metadata().schema_descr().num_columns()).collect()
}

/// The codec nvCOMP decompresses for a Parquet `codec` (`None`: none does, or none is needed).
fn page_codec(codec: Compression) -> Option<PageCodec> {
    match codec {
        Compression::SNAPPY => Some(PageCodec::Snappy),
        Compression::ZSTD(_) => Some(PageCodec::Zstd),
        _ => None,
    }
}

/// A region of PLAIN byte arrays to view: where its bytes went, values at most, v1 levels first.
type RegionPlan = (Placed, usize, bool);

/// Each data page's plan and the regions of PLAIN byte arrays, every page's bytes added to
/// `uploads`; an error for an encoding the device does not decode.
fn plan_pages<'a>(
    chunks: &'a [(usize, std::ops::Range<u64>, ColumnChunkPages)],
    plans: &[ColumnPlan],
    uploads: &mut Uploads<'a>,
) -> Result<(Vec<PagePlan>, Vec<RegionPlan>)> {
    let (mut pages, mut regions) = (vec![], vec![]);
    for (column, rows, chunk) in chunks {
        let plan = &plans[*column];
        let bytes = plan.in_width == 0;
        let dict = match &chunk.dictionary {
            Some(d) if matches!(d.encoding, Encoding::PLAIN | Encoding::PLAIN_DICTIONARY) => {
                let placed = uploads.values(d, chunk.codec)?;
                if bytes {
                    regions.push((placed, d.num_values, false));
                }
                Some((placed, regions.len().wrapping_sub(1), d.num_values))
            }
            Some(d) => return Err(ParquetError::NYI(format!("a dictionary of {} on the GPU", d.encoding))),
            None => None,
        };
        let mut row = rows.start;
        for page in &chunk.data {
            let encoding = match page.encoding {
                Encoding::PLAIN => PAGE_PLAIN,
                Encoding::RLE_DICTIONARY | Encoding::PLAIN_DICTIONARY if dict.is_some() => PAGE_DICT,
                e => return Err(ParquetError::NYI(format!("{e} pages on the GPU"))),
            };
            let v1_levels = plan.optional && page.kind == PageKind::DataV1;
            let values = uploads.values(page, chunk.codec)?;
            let levels =
                (plan.optional && page.kind == PageKind::DataV2).then(|| uploads.raw(&page.bytes[..page.levels_bytes]));
            let (mut dict_at, mut region, mut dict_len) = (None, None, 0);
            if encoding == PAGE_DICT {
                let (placed, r, n) = dict.expect("checked above");
                (dict_at, region, dict_len) = (Some(placed), bytes.then_some(r), n);
            } else if bytes {
                regions.push((values, page.num_values, v1_levels));
                (region, dict_len) = (Some(regions.len() - 1), page.num_values);
            }
            let flags = if plan.optional { PAGE_OPTIONAL } else { 0 } | if v1_levels { PAGE_V1_LEVELS } else { 0 };
            pages.push(PagePlan {
                column: *column,
                row,
                values,
                levels,
                levels_len: if levels.is_some() { page.levels_bytes } else { 0 },
                dict: dict_at,
                region,
                dict_len,
                page: ParquetPage {
                    encoding,
                    flags,
                    num_values: u32_of(page.num_values)?,
                    in_width: plan.in_width,
                    out_width: plan.out_width,
                    sign: plan.sign as u32,
                    ..ParquetPage::default()
                },
            });
            row += page.num_values as u64;
        }
        // Every output row is written by a page: a chunk whose pages hold other than its row
        // group's rows is refused rather than leave rows unwritten.
        if row != rows.end {
            return Err(ParquetError::General(format!(
                "a chunk's pages hold {} rows of its row group's {}",
                row - rows.start,
                rows.end - rows.start
            )));
        }
    }
    Ok((pages, regions))
}

/// `chunk`'s metadata with its offsets into bytes that start at file offset `offset` (`len`
/// of them), which must hold the chunk.
fn chunk_in(chunk: &ColumnChunkMetaData, offset: u64, len: usize) -> Result<ColumnChunkMetaData> {
    let (start, size) = chunk.byte_range();
    if start < offset || start + size > offset + len as u64 {
        return Err(ParquetError::General(format!(
            "column chunk at {start}..{} is not in the bytes read ({offset}..{})",
            start + size,
            offset + len as u64
        )));
    }
    if offset == 0 {
        return Ok(chunk.clone());
    }
    let shift = |at: i64| at - offset as i64;
    chunk
        .clone()
        .into_builder()
        .set_data_page_offset(shift(chunk.data_page_offset()))
        .set_dictionary_page_offset(chunk.dictionary_page_offset().map(shift))
        .set_index_page_offset(chunk.index_page_offset().map(shift))
        .build()
}

fn u32_of(n: usize) -> Result<u32> {
    u32::try_from(n).map_err(|_| ParquetError::General(format!("{n} does not fit a page's 32 bits")))
}

/// The plans with the device addresses filled in: the regions' and the pages' descriptors.
fn describe(
    buffers: &[DeviceBuffers; 2],
    first_buffer: u32,
    columns: &[GpuColumn],
    views: &cudarc::driver::CudaSlice<u8>,
    regions: &[RegionPlan],
    pages: Vec<PagePlan>,
    stream: &Arc<cudarc::driver::CudaStream>,
) -> Result<(Vec<ViewRegion>, Vec<ParquetPage>)> {
    use cudarc::driver::DevicePtr;
    let base: Vec<u64> = buffers.iter().map(|b| b.data.device_ptr(stream).0).collect();
    for b in buffers {
        if b.data.len() > u32::MAX as usize {
            return Err(ParquetError::NYI("over 4 GiB of pages in one call".into()));
        }
    }
    let at = |p: Placed| base[p.buffer] + buffers[p.buffer].offsets[p.index] as u64;
    let len = |p: Placed| u32_of(buffers[p.buffer].sizes[p.index]);
    let views_base = views.device_ptr(stream).0;
    let mut region_views = vec![];
    let mut out = vec![];
    for &(placed, count, v1_levels) in regions {
        let first: u64 = region_views
            .last()
            .map_or(0, |&(a, n): &(u64, usize)| a + 16 * n as u64);
        region_views.push((first, count));
        out.push(ViewRegion {
            data: at(placed),
            views: views_base + first,
            base: base[placed.buffer],
            len: len(placed)?,
            count: u32_of(count)?,
            buffer: first_buffer
                .checked_add(placed.buffer as u32)
                .ok_or_else(|| ParquetError::General("over 2^32 page buffers".into()))?,
            flags: if v1_levels { PAGE_V1_LEVELS } else { 0 },
        });
    }
    let mut descs = Vec::with_capacity(pages.len());
    for p in pages {
        let column = &columns[p.column];
        let mut d = p.page;
        d.data = at(p.values);
        d.data_len = len(p.values)?;
        if let Some(l) = p.levels {
            d.levels = at(l);
            d.levels_len = u32_of(p.levels_len)?;
        }
        d.dict = match (p.region, p.dict) {
            (Some(r), _) => views_base + region_views[r].0,
            (None, Some(placed)) => at(placed),
            (None, None) => 0,
        };
        d.dict_len = u32_of(p.dict_len)?;
        d.out = column.values.device_ptr(stream).0;
        d.validity = column.validity.as_ref().map_or(0, |v| v.device_ptr(stream).0);
        d.row = p.row;
        descs.push(d);
    }
    Ok((out, descs))
}

impl GpuRowGroups {
    /// The output schema: each column's field (byte arrays as views).
    pub fn schema(&self) -> SchemaRef {
        Arc::new(Schema::new(
            self.columns.iter().map(|c| Arc::clone(&c.field)).collect::<Vec<_>>(),
        ))
    }

    /// The row groups as a sort's [`DeviceBatch`]: the columns move, the page buffers (which
    /// the views index, as [`GpuPageDecoder::decode_at`] numbered them) and the budget's
    /// reservation go with the batch's owner.
    pub fn into_device_batch(self) -> DeviceBatch {
        use cudarc::driver::DevicePtr;
        let stream = Arc::clone(self.buffers[0].data.stream());
        let addresses = (self.buffers.iter()).map(|b| b.data.device_ptr(&stream).0).collect();
        let columns = (self.columns.into_iter())
            .map(|c| DeviceBatchColumn {
                values: c.values,
                validity: c.validity,
            })
            .collect();
        let [decompressed, raw] = self.buffers;
        let ((decompressed, held_decompressed), (raw, held_raw)) = (decompressed.into_parts(), raw.into_parts());
        let kept = decompressed.len() + raw.len();
        // The views of the PLAIN byte arrays were read by the decode, which waited for them:
        // freed, and their bytes no longer held of the budget.
        let mut held = self._held;
        held.shrink_to(held.bytes().saturating_sub(self._views.len()));
        drop(self._views);
        let owner = Box::new((decompressed, raw));
        DeviceBatch::new(self.rows, columns, self.first_buffer, addresses, owner)
            .with_reservations(vec![held, held_decompressed, held_raw], kept)
    }

    /// The columns downloaded as a record batch (tests, and checks against the CPU's reader):
    /// the views' buffers are the two page buffers, downloaded whole.
    pub fn download(&self, gpu: &Gpu) -> gpusort_cuda::Result<RecordBatch> {
        let s = gpu.stream();
        let pages: Vec<Buffer> = (self.buffers.iter())
            .map(|b| s.clone_dtoh(&b.data).map(Buffer::from_vec))
            .collect::<Result<_, _>>()?;
        let mut arrays: Vec<ArrayRef> = vec![];
        for c in &self.columns {
            let mut values = s.clone_dtoh(&c.values)?;
            values.truncate(self.rows * c.width);
            let nulls = match &c.validity {
                Some(v) => {
                    let words = s.clone_dtoh(v)?;
                    let bits = BooleanBuffer::new(Buffer::from_vec(words), 0, self.rows);
                    Some(NullBuffer::new(bits))
                }
                None => None,
            };
            let mut buffers = vec![Buffer::from_vec(values)];
            if c.width == 16 && matches!(c.field.data_type(), DataType::Utf8View | DataType::BinaryView) {
                // Buffers before the call's own stand empty (no view indexes them).
                buffers.extend((0..self.first_buffer).map(|_| Buffer::from_vec(Vec::<u8>::new())));
                buffers.extend(pages.iter().cloned());
            }
            let data = arrow::array::ArrayData::try_new(
                c.field.data_type().clone(),
                self.rows,
                nulls.map(|n| n.into_inner().into_inner()),
                0,
                buffers,
                vec![],
            )
            .map_err(|e| gpusort_cuda::CudaSortError::Decode(e.to_string()))?;
            data.validate_full()
                .map_err(|e| gpusort_cuda::CudaSortError::Decode(e.to_string()))?;
            arrays.push(make_array(data));
        }
        s.synchronize()?;
        RecordBatch::try_new(self.schema(), arrays).map_err(|e| gpusort_cuda::CudaSortError::Decode(e.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::{
        Array, BinaryArray, Date32Array, Decimal128Array, Float32Array, Float64Array, Int8Array, Int16Array,
        Int32Array, Int64Array, LargeStringArray, StringArray, TimestampMicrosecondArray, UInt8Array, UInt16Array,
        UInt32Array, UInt64Array,
    };
    use parquet::arrow::ArrowWriter;
    use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
    use parquet::file::metadata::ParquetMetaDataReader;
    use parquet::file::properties::{WriterProperties, WriterVersion};
    use rand::rngs::SmallRng;
    use rand::{Rng, SeedableRng};

    /// The decoder on GPU 0, or `None` with a note that `test` did not run; missing nvCOMP or
    /// GPU fails it under GPUSORT_REQUIRE_NVCOMP=1 or GPUSORT_REQUIRE_GPU=1.
    fn decoder_for_test(test: &str) -> Option<GpuPageDecoder> {
        match GpuPageDecoder::try_new(0) {
            Ok(d) => Some(d),
            Err(why) if std::env::var("GPUSORT_REQUIRE_NVCOMP").as_deref() == Ok("1") => {
                panic!("GPUSORT_REQUIRE_NVCOMP=1 but {why}")
            }
            Err(why)
                if std::env::var("GPUSORT_REQUIRE_GPU").as_deref() == Ok("1") && gpusort_cuda::probe(0).is_err() =>
            {
                panic!("GPUSORT_REQUIRE_GPU=1 but no GPU: {why}")
            }
            Err(why) => {
                eprintln!("{test} did not run: {why}");
                None
            }
        }
    }

    /// A batch of every type the decoder takes; `nulls` of the rows null in nullable columns,
    /// `distinct` values a column draws from (few: dictionaries hold them all).
    fn batch(rng: &mut SmallRng, rows: usize, nulls: f64, distinct: u64) -> RecordBatch {
        let pick = |rng: &mut SmallRng| -> Option<u64> {
            (!rng.random_bool(nulls)).then(|| rng.random_range(0..distinct).wrapping_mul(0x9e37_79b9_7f4a_7c15))
        };
        let col = |rng: &mut SmallRng| (0..rows).map(|_| pick(rng)).collect::<Vec<_>>();
        let text = |v: u64| "ab".repeat((v % 11) as usize) + &v.to_string();
        let columns: Vec<(&str, ArrayRef, bool)> = vec![
            (
                "i8",
                Arc::new(col(rng).into_iter().map(|v| v.map(|v| v as i8)).collect::<Int8Array>()),
                true,
            ),
            (
                "i16",
                Arc::new(
                    col(rng)
                        .into_iter()
                        .map(|v| v.map(|v| v as i16))
                        .collect::<Int16Array>(),
                ),
                true,
            ),
            (
                "i32",
                Arc::new(
                    col(rng)
                        .into_iter()
                        .map(|v| v.map(|v| v as i32))
                        .collect::<Int32Array>(),
                ),
                true,
            ),
            (
                "i64",
                Arc::new(
                    col(rng)
                        .into_iter()
                        .map(|v| v.map(|v| v as i64))
                        .collect::<Int64Array>(),
                ),
                true,
            ),
            (
                "u8",
                Arc::new(col(rng).into_iter().map(|v| v.map(|v| v as u8)).collect::<UInt8Array>()),
                true,
            ),
            (
                "u16",
                Arc::new(
                    col(rng)
                        .into_iter()
                        .map(|v| v.map(|v| v as u16))
                        .collect::<UInt16Array>(),
                ),
                true,
            ),
            (
                "u32",
                Arc::new(
                    col(rng)
                        .into_iter()
                        .map(|v| v.map(|v| v as u32))
                        .collect::<UInt32Array>(),
                ),
                true,
            ),
            ("u64", Arc::new(col(rng).into_iter().collect::<UInt64Array>()), true),
            (
                "f32",
                Arc::new(
                    col(rng)
                        .into_iter()
                        .map(|v| v.map(|v| v as i32 as f32 / 7.0))
                        .collect::<Float32Array>(),
                ),
                true,
            ),
            (
                "f64",
                Arc::new(
                    col(rng)
                        .into_iter()
                        .map(|v| v.map(|v| v as i64 as f64 / 3.0))
                        .collect::<Float64Array>(),
                ),
                true,
            ),
            (
                "date",
                Arc::new(
                    col(rng)
                        .into_iter()
                        .map(|v| v.map(|v| (v % 40_000) as i32 - 20_000))
                        .collect::<Date32Array>(),
                ),
                true,
            ),
            (
                "ts",
                Arc::new(
                    col(rng)
                        .into_iter()
                        .map(|v| v.map(|v| v as i64 >> 8))
                        .collect::<TimestampMicrosecondArray>(),
                ),
                true,
            ),
            (
                "dec9",
                Arc::new(
                    col(rng)
                        .into_iter()
                        .map(|v| v.map(|v| (v as i32 % 999_999_999) as i128))
                        .collect::<Decimal128Array>()
                        .with_precision_and_scale(9, 2)
                        .unwrap(),
                ),
                true,
            ),
            (
                "dec15",
                Arc::new(
                    col(rng)
                        .into_iter()
                        .map(|v| v.map(|v| (v as i64 % 999_999_999_999_999) as i128))
                        .collect::<Decimal128Array>()
                        .with_precision_and_scale(15, 2)
                        .unwrap(),
                ),
                true,
            ),
            (
                "s",
                Arc::new(col(rng).into_iter().map(|v| v.map(text)).collect::<StringArray>()),
                true,
            ),
            (
                "ls",
                Arc::new(col(rng).into_iter().map(|v| v.map(text)).collect::<LargeStringArray>()),
                true,
            ),
            (
                "b",
                Arc::new(
                    col(rng)
                        .into_iter()
                        .map(|v| v.map(|v| v.to_le_bytes()[..(v % 9) as usize].to_vec()))
                        .collect::<BinaryArray>(),
                ),
                true,
            ),
            // Required columns: no levels.
            (
                "req_i64",
                Arc::new((0..rows as i64).map(|i| i * 31 % 1000).collect::<Int64Array>()),
                false,
            ),
            (
                "req_s",
                Arc::new(
                    (0..rows)
                        .map(|i| text(i as u64 * 7 % distinct.max(1)))
                        .map(Some)
                        .collect::<StringArray>(),
                ),
                false,
            ),
        ];
        let fields: Vec<Field> = (columns.iter())
            .map(|(n, a, nullable)| Field::new(*n, a.data_type().clone(), *nullable))
            .collect();
        RecordBatch::try_new(
            Arc::new(Schema::new(fields)),
            columns.into_iter().map(|c| c.1).collect(),
        )
        .unwrap()
    }

    fn write(batch: &RecordBatch, props: WriterProperties) -> Bytes {
        let mut out = vec![];
        let mut w = ArrowWriter::try_new(&mut out, batch.schema(), Some(props)).unwrap();
        // Two row groups a write, of uneven sizes.
        let cut = batch.num_rows() / 3;
        w.write(&batch.slice(0, cut)).unwrap();
        w.flush().unwrap();
        w.write(&batch.slice(cut, batch.num_rows() - cut)).unwrap();
        w.close().unwrap();
        Bytes::from(out)
    }

    /// `file` as the decoder takes it: in pageable memory, or copied to pinned memory.
    fn input(file: &Bytes, pinned: bool) -> FileBytes {
        if !pinned {
            return file.clone().into();
        }
        let mut buffer = gpusort_cuda::PinnedPool::global().alloc(file.len());
        buffer.as_mut_slice().copy_from_slice(file);
        let pinned = buffer.is_pinned();
        FileBytes {
            bytes: Bytes::from_owner(PinnedBytes(buffer)),
            pinned,
            offset: 0,
        }
    }

    /// What the Parquet crate reads of `row_groups`, with byte arrays as views.
    fn cpu_read(file: &Bytes, row_groups: &[usize]) -> Vec<ArrayRef> {
        let reader = ParquetRecordBatchReaderBuilder::try_new(file.clone())
            .unwrap()
            .with_row_groups(row_groups.to_vec())
            .with_batch_size(1 << 20)
            .build()
            .unwrap();
        let schema = arrow::array::RecordBatchReader::schema(&reader);
        let batches: Vec<RecordBatch> = reader.map(|b| b.unwrap()).collect();
        let whole = arrow::compute::concat_batches(&schema, &batches).unwrap();
        (whole.columns().iter())
            .map(|a| match a.data_type() {
                DataType::Utf8 | DataType::LargeUtf8 => arrow::compute::cast(a, &DataType::Utf8View).unwrap(),
                DataType::Binary | DataType::LargeBinary => arrow::compute::cast(a, &DataType::BinaryView).unwrap(),
                _ => Arc::clone(a),
            })
            .collect()
    }

    /// Every column of every row group, decoded on the GPU, equals the Parquet crate's reading:
    /// every type, with and without nulls, dictionaries and their fallback to PLAIN, pages v1
    /// and v2, snappy, zstd and uncompressed, pages of a few rows and of many, the file in pinned
    /// memory (all row groups) and in pageable memory (the last).
    #[test]
    fn gpu_decode_reads_as_the_parquet_crate() {
        let Some(decoder) = decoder_for_test("gpu_decode_reads_as_the_parquet_crate") else {
            return;
        };
        let mut rng = SmallRng::seed_from_u64(20);
        let mut cases = 0;
        for (rows, nulls, distinct) in [(5_000, 0.2, 50), (20_000, 0.0, 1 << 40), (3_000, 1.0, 10), (1, 0.5, 3)] {
            let data = batch(&mut rng, rows, nulls, distinct);
            for version in [WriterVersion::PARQUET_1_0, WriterVersion::PARQUET_2_0] {
                for (codec, dictionary, page_rows) in [
                    (Compression::SNAPPY, true, 1_000),
                    (Compression::SNAPPY, false, 20_000),
                    (Compression::ZSTD(Default::default()), true, 700),
                    (Compression::ZSTD(Default::default()), false, 20_000),
                    (Compression::UNCOMPRESSED, true, 333),
                    (Compression::UNCOMPRESSED, false, 64),
                ] {
                    // Pages v2 fall back from a full dictionary to PLAIN here: to the DELTA
                    // encodings by default, which the device does not decode (refused below).
                    let props = WriterProperties::builder()
                        .set_writer_version(version)
                        .set_encoding(Encoding::PLAIN)
                        .set_compression(codec)
                        .set_dictionary_enabled(dictionary)
                        // Small dictionaries fall back to PLAIN inside a chunk.
                        .set_dictionary_page_size_limit(4096)
                        .set_data_page_row_count_limit(page_rows)
                        .set_write_batch_size(page_rows.min(1024))
                        .build();
                    let file = write(&data, props);
                    let meta = ParquetMetaDataReader::new().parse_and_finish(&file).unwrap();
                    let groups: Vec<usize> = (0..meta.num_row_groups()).collect();
                    for chosen in [groups.clone(), groups[groups.len() - 1..].to_vec()] {
                        let what = format!(
                            "{rows} rows, nulls {nulls}, {version:?}, {codec}, dictionary {dictionary}, {page_rows} a page, row groups {chosen:?}"
                        );
                        let decoded = decoder
                            .decode(&input(&file, chosen.len() > 1), &meta, &chosen)
                            .unwrap_or_else(|e| panic!("{what}: {e}"));
                        let got = decoded
                            .download(decoder.gpu())
                            .unwrap_or_else(|e| panic!("{what}: {e}"));
                        let expected = cpu_read(&file, &chosen);
                        assert_eq!(got.num_rows(), expected[0].len(), "{what}");
                        for (i, (g, e)) in got.columns().iter().zip(&expected).enumerate() {
                            assert_eq!(
                                g.as_ref(),
                                e.as_ref(),
                                "{what}: column {}",
                                got.schema().field(i).name()
                            );
                        }
                        cases += 1;
                    }
                }
            }
        }
        assert_eq!(cases, 96);
        // The DELTA encodings are refused (before the GPU is used): the caller reads the file
        // with the Parquet crate.
        let props = WriterProperties::builder()
            .set_writer_version(WriterVersion::PARQUET_2_0)
            .set_dictionary_enabled(false)
            .build();
        let file = write(&batch(&mut rng, 100, 0.1, 10), props);
        let meta = ParquetMetaDataReader::new().parse_and_finish(&file).unwrap();
        let why = GpuPageDecoder::check_row_groups(&meta, &[0]).unwrap_err();
        assert!(why.contains("DELTA_BINARY_PACKED pages"), "{why}");
        let err = decoder
            .decode(&file.into(), &meta, &[0])
            .err()
            .expect("DELTA pages refused");
        assert!(err.to_string().contains("DELTA_BINARY_PACKED pages"), "{err}");
    }

    /// `columns` sorted by `keys` (column, descending, nulls first), stably: arrow's sort with
    /// each row's place as the last key.
    fn sorted_on_the_cpu(columns: &[ArrayRef], keys: &[(usize, bool, bool)]) -> Vec<ArrayRef> {
        use arrow::compute::{SortColumn, SortOptions, lexsort_to_indices, take};
        let n = columns[0].len() as u32;
        let mut sort: Vec<SortColumn> = (keys.iter())
            .map(|&(c, descending, nulls_first)| SortColumn {
                values: Arc::clone(&columns[c]),
                options: Some(SortOptions {
                    descending,
                    nulls_first,
                }),
            })
            .collect();
        sort.push(SortColumn {
            values: Arc::new(UInt32Array::from_iter_values(0..n)),
            options: None,
        });
        let indices = lexsort_to_indices(&sort, None).unwrap();
        columns
            .iter()
            .map(|c| take(c.as_ref(), &indices, None).unwrap())
            .collect()
    }

    /// Row groups decoded on the GPU join a sort as device batches (each call's page buffers
    /// numbered after the earlier calls'), and the sorted rows equal the Parquet crate's
    /// reading sorted stably on the CPU: native keys and string keys, nulls first and last,
    /// many ties and few, row groups whose rows start off a byte of the bitmaps, the rows taken
    /// whole and in ranges of compacted batches. A session refuses what it cannot take.
    #[test]
    fn decoded_row_groups_sort_in_a_session_as_on_the_cpu() {
        let test = "decoded_row_groups_sort_in_a_session_as_on_the_cpu";
        let Some(decoder) = decoder_for_test(test) else {
            return;
        };
        let backend = gpusort_cuda::CudaBackend::try_new(0).unwrap();
        let mut rng = SmallRng::seed_from_u64(26);
        for (rows, nulls, distinct) in [(30_001, 0.2, 1 << 40), (20_003, 0.3, 40)] {
            let data = batch(&mut rng, rows, nulls, distinct);
            let props = WriterProperties::builder()
                .set_compression(Compression::SNAPPY)
                .set_dictionary_page_size_limit(4096)
                .set_max_row_group_row_count(Some(3_001))
                .set_data_page_row_count_limit(1_000)
                .set_write_batch_size(1_000)
                .build();
            let file = write(&data, props);
            let mut on_disk = tempfile::NamedTempFile::new().unwrap();
            std::io::Write::write_all(&mut on_disk, &file).unwrap();
            let meta = ParquetMetaDataReader::new().parse_and_finish(&file).unwrap();
            let groups: Vec<usize> = (0..meta.num_row_groups()).collect();
            let expected_input = cpu_read(&file, &groups);
            let schema = decoder.decode(&input(&file, false), &meta, &[0]).unwrap().schema();
            let at = |name: &str| schema.index_of(name).unwrap();
            let lists: [Vec<(usize, bool, bool)>; 3] = [
                vec![(at("i32"), false, true), (at("f64"), true, false)],
                vec![(at("s"), false, false), (at("i64"), true, true)],
                vec![
                    (at("ls"), true, true),
                    (at("date"), false, false),
                    (at("ts"), true, false),
                ],
            ];
            for (l, keys) in lists.iter().enumerate() {
                let what = format!("{rows} rows, {distinct} distinct, keys {keys:?}");
                let spec = gpusort::SortSpec::new(keys.iter().map(|&(c, d, n)| gpusort::SortKey::new(c, d, n)));
                let mut session = backend.begin_sort(Arc::clone(&schema), spec).unwrap();
                assert_eq!(session.device_batches_refusal(), None, "{what}");
                // Calls of 1, 2, 3... row groups, each reading its range of the file.
                let (mut next, mut take) = (0, 1);
                while next < groups.len() {
                    let chosen = &groups[next..(next + take).min(groups.len())];
                    let range = GpuPageDecoder::byte_range(&meta, chosen);
                    let piece = FileBytes::read_range(on_disk.as_file(), range).unwrap();
                    let decoded = decoder
                        .decode_at(&piece, &meta, chosen, session.device_buffers())
                        .unwrap_or_else(|e| panic!("{what}: {e}"));
                    session
                        .push_device(decoded.into_device_batch())
                        .unwrap_or_else(|e| panic!("{what}: {e}"));
                    (next, take) = (next + take, take + 1);
                }
                assert_eq!(session.num_rows(), rows, "{what}");
                let got: Vec<ArrayRef> = if l == 1 {
                    // In ranges, each of batches whose views were laid out on the device.
                    let mut sorted = session.finish_sorted(None).unwrap();
                    let mut parts = vec![];
                    while let Some(batches) = sorted.next_batches(7_000, 3_000).unwrap() {
                        parts.extend(batches);
                    }
                    let whole = arrow::compute::concat_batches(&schema, &parts).unwrap();
                    whole.columns().to_vec()
                } else {
                    session.finish(None).unwrap().batch.columns().to_vec()
                };
                let expected = sorted_on_the_cpu(&expected_input, keys);
                for (i, (g, e)) in got.iter().zip(&expected).enumerate() {
                    assert_eq!(g.as_ref(), e.as_ref(), "{what}: column {}", schema.field(i).name());
                }
            }
        }

        // What a session refuses.
        let file = write(&batch(&mut rng, 100, 0.1, 10), WriterProperties::builder().build());
        let meta = ParquetMetaDataReader::new().parse_and_finish(&file).unwrap();
        let decoded = || decoder.decode(&input(&file, false), &meta, &[0]).unwrap();
        let schema = decoded().schema();
        let spec = || gpusort::SortSpec::new([gpusort::SortKey::new(0, false, false)]);
        let mut session = backend.begin_sort(Arc::clone(&schema), spec()).unwrap();
        let wrong = decoder.decode_at(&input(&file, false), &meta, &[0], 5).unwrap();
        let err = session.push_device(wrong.into_device_batch()).unwrap_err().to_string();
        assert!(
            err.contains("index buffers from 5 on, where the session has 0"),
            "{err}"
        );
        session.push_device(decoded().into_device_batch()).unwrap();
        let host = decoded().download(decoder.gpu()).unwrap();
        let err = session.push(&host).unwrap_err().to_string();
        assert!(
            err.contains("a batch of the host in a sort fed device batches"),
            "{err}"
        );
        // A column that is not a device column (strings not as views), and a host batch first.
        let utf8 = Arc::new(Schema::new(vec![
            Field::new("k", DataType::Int64, false),
            Field::new("s", DataType::Utf8, true),
        ]));
        let session = backend.begin_sort(utf8, spec()).unwrap();
        let why = session.device_batches_refusal().unwrap();
        assert!(why.contains("column 's' of type Utf8 is not a device column"), "{why}");
        let mut session = backend.begin_sort(Arc::clone(&schema), spec()).unwrap();
        session.push(&host).unwrap();
        assert_eq!(
            session.device_batches_refusal().as_deref(),
            Some("batches of the host were pushed")
        );
        let err = session
            .push_device(decoded().into_device_batch())
            .unwrap_err()
            .to_string();
        assert!(err.contains("batches of the host were pushed"), "{err}");
    }

    /// A call's range of the file holds its row groups' chunks, whose pages listed from it
    /// (the chunks' offsets moved to the range's) are the pages listed from the whole file;
    /// a chunk outside the range is refused.
    #[test]
    fn a_calls_range_lists_the_pages_the_whole_file_does() {
        let mut rng = SmallRng::seed_from_u64(48);
        let props = WriterProperties::builder()
            .set_compression(Compression::SNAPPY)
            .set_max_row_group_row_count(Some(777))
            .set_data_page_row_count_limit(100)
            .set_write_batch_size(100)
            .build();
        let file = write(&batch(&mut rng, 3_000, 0.1, 30), props);
        let meta = ParquetMetaDataReader::new().parse_and_finish(&file).unwrap();
        assert!(meta.num_row_groups() >= 4);
        for call in [vec![0], vec![1, 2], vec![3]] {
            let range = GpuPageDecoder::byte_range(&meta, &call);
            assert!(range.start > 0 && range.end < file.len() as u64, "{range:?}");
            let piece = file.slice(range.start as usize..range.end as usize);
            for &g in &call {
                let rg = meta.row_group(g);
                for c in rg.columns() {
                    let rows = rg.num_rows() as usize;
                    let whole = column_chunk_pages(&file, c, rows).unwrap();
                    let moved = chunk_in(c, range.start, piece.len()).unwrap();
                    let from_piece = column_chunk_pages(&piece, &moved, rows).unwrap();
                    let bytes = |p: &ColumnChunkPages| {
                        (p.dictionary.iter().chain(&p.data))
                            .map(|s| (s.bytes.to_vec(), s.uncompressed_bytes))
                            .collect::<Vec<_>>()
                    };
                    assert_eq!(bytes(&whole), bytes(&from_piece), "row group {g}");
                }
            }
            let outside = meta.row_group(if call[0] == 0 { 3 } else { 0 }).column(0);
            let err = chunk_in(outside, range.start, piece.len()).unwrap_err().to_string();
            assert!(err.contains("is not in the bytes read"), "{err}");
        }
    }

    #[test]
    fn read_pinned_reads_the_whole_file() {
        let dir = tempfile::tempdir().unwrap();
        for len in [0, 1, READ_PIECE - 1, READ_PIECE + 17] {
            let path = dir.path().join(format!("f{len}"));
            let mut rng = SmallRng::seed_from_u64(len as u64);
            let bytes: Vec<u8> = (0..len).map(|_| rng.random()).collect();
            std::fs::write(&path, &bytes).unwrap();
            let read = FileBytes::read_pinned(&path).unwrap();
            assert!(read.bytes[..] == bytes[..], "{len} bytes");
        }
        assert!(FileBytes::read_pinned(&dir.path().join("missing")).is_err());
    }

    /// Types and shapes the device does not decode are refused by the plan, before any GPU
    /// work.
    #[test]
    fn plans_refuse_what_the_device_does_not_decode() {
        use arrow::array::{BooleanArray, FixedSizeBinaryArray};
        let cases: Vec<(ArrayRef, &str)> = vec![
            (
                Arc::new(BooleanArray::from(vec![true, false])),
                "Boolean stored as BOOLEAN",
            ),
            (
                Arc::new(FixedSizeBinaryArray::try_from_iter([[1u8, 2], [3, 4]].into_iter()).unwrap()),
                "FixedSizeBinary(2) stored as FIXED_LEN_BYTE_ARRAY",
            ),
            (
                Arc::new(
                    Decimal128Array::from(vec![1, 2])
                        .with_precision_and_scale(30, 2)
                        .unwrap(),
                ),
                "stored as FIXED_LEN_BYTE_ARRAY",
            ),
        ];
        for (array, says) in cases {
            let data = RecordBatch::try_from_iter([("c", array)]).unwrap();
            let file = write(&data, WriterProperties::builder().build());
            let meta = ParquetMetaDataReader::new().parse_and_finish(&file).unwrap();
            let why = GpuPageDecoder::plan(&meta).unwrap_err();
            assert!(why.contains(says), "{why}");
        }
        let data = batch(&mut SmallRng::seed_from_u64(1), 10, 0.1, 5);
        // One nvCOMP call decompresses one codec (the workspace's Parquet crate writes no
        // codec but snappy and zstd, so no other is tried here).
        let mixed = WriterProperties::builder()
            .set_compression(Compression::SNAPPY)
            .set_column_compression("i16".into(), Compression::ZSTD(Default::default()))
            .build();
        let file = write(&data, mixed);
        let meta = ParquetMetaDataReader::new().parse_and_finish(&file).unwrap();
        let why = GpuPageDecoder::check_row_groups(&meta, &[0]).unwrap_err();
        assert_eq!(why, "column 'i16': pages of two codecs in one call");
        assert!(
            GpuPageDecoder::check_row_groups(&meta, &[9])
                .unwrap_err()
                .contains("no row group 9")
        );
        let file = write(
            &data,
            WriterProperties::builder().set_compression(Compression::SNAPPY).build(),
        );
        let meta = ParquetMetaDataReader::new().parse_and_finish(&file).unwrap();
        assert_eq!(GpuPageDecoder::check_row_groups(&meta, &[0, 1]), Ok(()));
        let meta = ParquetMetaDataReader::new().parse_and_finish(&file).unwrap();
        let plans = GpuPageDecoder::plan(&meta).unwrap();
        assert_eq!(plans.len(), data.num_columns());
        assert_eq!(plans[14].field.data_type(), &DataType::Utf8View);
        assert_eq!((plans[12].in_width, plans[12].out_width, plans[12].sign), (4, 16, true));
        assert!(plans[0].optional && !plans[17].optional);
    }

    /// The decoder's device memory is held of its budget while the decoded row groups live,
    /// and given back when they go; a budget without room for the columns refuses the decode.
    #[test]
    fn decoded_row_groups_hold_their_memory_of_the_budget() {
        let Some(decoder) = decoder_for_test("decoded_row_groups_hold_their_memory_of_the_budget") else {
            return;
        };
        let data = batch(&mut SmallRng::seed_from_u64(3), 20_000, 0.1, 1000);
        let file: FileBytes = write(&data, WriterProperties::builder().build()).into();
        let meta = ParquetMetaDataReader::new().parse_and_finish(&file.bytes).unwrap();
        let budget = gpusort_cuda::DeviceBudget::new(1 << 30);
        let decoder = decoder.with_budget(Arc::clone(&budget));
        let decoded = decoder.decode(&file, &meta, &[0, 1]).unwrap();
        assert!(budget.stats().reserved >= 20_000 * 16, "{:?}", budget.stats());
        drop(decoded);
        assert_eq!(budget.stats().reserved, 0);
        let small = gpusort_cuda::DeviceBudget::new(64 << 10);
        let decoder = GpuPageDecoder::try_new(0).unwrap().with_budget(Arc::clone(&small));
        let err = decoder.decode(&file, &meta, &[0, 1]).err().expect("no room");
        assert!(err.to_string().contains("budget has no room"), "{err}");
        assert_eq!(small.stats().reserved, 0);
    }

    /// A corrupt page (a dictionary page's bit width above 32, a PLAIN string's length past the
    /// page) fails the decode with what is wrong, not with wrong rows.
    #[test]
    fn corrupt_pages_fail_the_decode() {
        let Some(decoder) = decoder_for_test("corrupt_pages_fail_the_decode") else {
            return;
        };
        let data = batch(&mut SmallRng::seed_from_u64(2), 2_000, 0.0, 20);
        for (dictionary, column, says) in [
            (true, 17, "a bit width above 32"),
            (false, 18, "PLAIN values past the end of the page"),
        ] {
            let props = WriterProperties::builder()
                .set_compression(Compression::UNCOMPRESSED)
                .set_dictionary_enabled(dictionary)
                .build();
            let file = write(&data, props);
            let meta = ParquetMetaDataReader::new().parse_and_finish(&file).unwrap();
            let rg = meta.row_group(0);
            let pages = column_chunk_pages(&file, rg.column(column), rg.num_rows() as usize).unwrap();
            // The first data page's first byte: the indices' bit width, or the low byte of the
            // first string's length.
            let at = pages.data[0].bytes.as_ptr() as usize - file.as_ptr() as usize;
            let mut bad = file.to_vec();
            bad[at] = 200;
            let err = decoder
                .decode(&Bytes::from(bad).into(), &meta, &[0])
                .err()
                .expect("a corrupt page");
            assert!(err.to_string().contains(says), "{err}");
        }
    }
}
