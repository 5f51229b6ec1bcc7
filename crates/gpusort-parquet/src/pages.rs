//! Page compression apart from encoding: the writer's columns are encoded by arrow-rs without
//! compression, and the pages of a whole row group are then compressed in one batch by a
//! [`PageCompressor`] (the GPU through nvCOMP, or [`CpuZstd`] here), so a compressor that wants
//! big batches gets every page of the row group at once.
//!
//! The flow of one row group:
//!
//! 1. [`CapturingPageStoreFactory`], installed in arrow-rs's `ArrowRowGroupWriterFactory`, gives
//!    each leaf column chunk's writer a page store that keeps the serialized pages (header and
//!    data of each) in one shared [`ChunkPages`]; the writer thread takes the handles of a row
//!    group's chunks with [`CapturingPageStoreFactory::take_created`] right after it creates the
//!    row group's column writers (one store a leaf, created in leaf order).
//! 2. The columns are encoded as usual, with `Compression::UNCOMPRESSED`.
//! 3. [`compress_row_group`] reads each chunk's pages back with arrow-rs's page reader. arrow-rs
//!    writes a chunk's dictionary page after its data pages (it moves it first only when it
//!    splices the chunk into the file); pages are told apart by their type, read from their
//!    headers, and put in file order: the dictionary page first.
//! 4. One [`PageCompressor::compress`] call compresses every page of every column of the row
//!    group: a data page v1 or a dictionary page whole, a data page v2 past its repetition and
//!    definition levels (which stay uncompressed, as the format says). A v2 page whose values do
//!    not get smaller keeps them uncompressed (`is_compressed` false), as arrow-rs does.
//! 5. Each chunk is rewritten: new page headers (the compressed and uncompressed sizes), the
//!    column metadata's codec, sizes and page offsets, and the offset index's page offsets and
//!    sizes. Statistics, the column index, the bloom filter, page encodings and each page's first
//!    row are as the encoder made them: compression changes none of them. The writer thread
//!    appends the [`CompressedChunk`]s to the row group in leaf order.
//!
//! Page CRCs are not written (arrow-rs does not write them either) and encrypted files are not
//! supported (the tool writes none).

use std::io::{Read, Write};
use std::sync::{Arc, Mutex, MutexGuard};

use bytes::Bytes;
use parquet::arrow::arrow_writer::{ArrowColumnChunk, PageKey, PageStore, PageStoreArgs, PageStoreFactory};
use parquet::basic::{Compression, ZstdLevel};
use parquet::column::page::{CompressedPage, Page, PageWriteSpec, PageWriter};
use parquet::column::writer::ColumnCloseResult;
use parquet::errors::{ParquetError, Result};
use parquet::file::properties::ReaderProperties;
use parquet::file::reader::{ChunkReader, Length};
use parquet::file::serialized_reader::SerializedPageReader;
use parquet::file::writer::{SerializedPageWriter, SerializedRowGroupWriter, TrackedWrite};
use rayon::prelude::*;

use crate::encoder::EncodedChunk;

/// Compresses many independent buffers at once, each into what any decoder of the codec reads
/// (for zstd: one frame, or several concatenated, as the zstd format allows). Implementations:
/// the GPU (nvCOMP, [`crate::gpu_pages`]) and `CpuZstd` here.
pub trait PageCompressor: Send + Sync + std::fmt::Debug {
    /// The Parquet codec the frames are in (e.g. Compression::ZSTD(level)) — written into the column metadata.
    fn codec(&self) -> Compression;
    /// Short human name for the summary, e.g. "zstd on the CPU" / "zstd on the GPU (nvCOMP)".
    fn name(&self) -> String;
    /// One compressed buffer per input, in order.
    fn compress(&self, pages: &[&[u8]]) -> Result<Vec<Vec<u8>>, ParquetError>;
    /// What it did so far, for the summary where there is more to say than [`Self::name`]
    /// (e.g. the GPU's share of the bytes).
    fn report(&self) -> Option<String> {
        None
    }
}

/// zstd on the CPU: the pages compressed in parallel on rayon's threads, one zstd frame each.
#[derive(Debug)]
pub struct CpuZstd {
    level: i32,
}

impl CpuZstd {
    /// zstd at `level`.
    ///
    /// # Panics
    ///
    /// When `level` is not 1 to 22 (the levels Parquet's `ZstdLevel` takes).
    pub fn new(level: i32) -> Self {
        assert!((1..=22).contains(&level), "the zstd level must be 1 to 22, not {level}");
        Self { level }
    }

    /// A compressor of this level, for [`Self::compress_one`] (one a thread).
    pub fn compressor(&self) -> std::io::Result<zstd::bulk::Compressor<'static>> {
        zstd::bulk::Compressor::new(self.level)
    }

    /// `page` compressed by `compressor` (from [`Self::compressor`]).
    pub fn compress_one(
        &self,
        compressor: &mut std::io::Result<zstd::bulk::Compressor<'static>>,
        page: &[u8],
    ) -> Result<Vec<u8>> {
        match compressor {
            Ok(compressor) => compressor
                .compress(page)
                .map_err(|e| ParquetError::External(Box::new(e))),
            Err(e) => Err(ParquetError::General(format!("starting zstd: {e}"))),
        }
    }
}

impl PageCompressor for CpuZstd {
    fn codec(&self) -> Compression {
        Compression::ZSTD(ZstdLevel::try_new(self.level).expect("checked in CpuZstd::new"))
    }

    fn name(&self) -> String {
        "zstd on the CPU".into()
    }

    fn compress(&self, pages: &[&[u8]]) -> Result<Vec<Vec<u8>>> {
        pages
            .par_iter()
            .map_init(
                || self.compressor(),
                |compressor, page| self.compress_one(compressor, page),
            )
            .collect()
    }
}

/// No compression: each page as it is (the codec `UNCOMPRESSED`), for uncompressed output
/// whose columns gpusort's encoder writes.
#[derive(Debug)]
pub struct Uncompressed;

impl PageCompressor for Uncompressed {
    fn codec(&self) -> Compression {
        Compression::UNCOMPRESSED
    }

    fn name(&self) -> String {
        "uncompressed".into()
    }

    fn compress(&self, pages: &[&[u8]]) -> Result<Vec<Vec<u8>>> {
        Ok(pages.iter().map(|p| p.to_vec()).collect())
    }
}

/// One column chunk's serialized pages (each page's header, then its data), in the order its
/// column writer wrote them: shared between the chunk's page store and the writer thread.
#[derive(Debug, Clone, Default)]
pub struct ChunkPages(Arc<Mutex<Vec<Bytes>>>);

impl ChunkPages {
    fn lock(&self) -> MutexGuard<'_, Vec<Bytes>> {
        self.0.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The chunk's bytes, as written, in one buffer; the store keeps nothing.
    fn take(&self) -> Bytes {
        let blobs = std::mem::take(&mut *self.lock());
        let mut bytes = Vec::with_capacity(blobs.iter().map(Bytes::len).sum());
        for blob in &blobs {
            bytes.extend_from_slice(blob);
        }
        Bytes::from(bytes)
    }
}

/// The page store of one column chunk: its blobs go to the shared [`ChunkPages`].
struct CapturingStore(ChunkPages);

impl PageStore for CapturingStore {
    fn put(&mut self, value: Bytes) -> Result<PageKey> {
        let mut blobs = self.0.lock();
        blobs.push(value);
        Ok(PageKey::new(blobs.len() as u64 - 1))
    }

    fn take(&mut self, key: PageKey) -> Result<Bytes> {
        let mut blobs = self.0.lock();
        let blob = usize::try_from(key.get())
            .ok()
            .and_then(|i| blobs.get_mut(i))
            .ok_or_else(|| ParquetError::General(format!("no page {} in this column chunk", key.get())))?;
        Ok(std::mem::take(blob))
    }

    fn memory_size(&self) -> usize {
        self.0.lock().iter().map(Bytes::len).sum()
    }
}

/// A [`PageStoreFactory`] whose stores keep each chunk's pages where the writer can take them
/// (see the module doc).
#[derive(Debug, Default)]
pub struct CapturingPageStoreFactory {
    /// The stores created since the last [`Self::take_created`]: leaf index and pages.
    created: Mutex<Vec<(usize, ChunkPages)>>,
}

impl CapturingPageStoreFactory {
    /// A factory that has created nothing yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// The pages of the chunks whose stores were created since the last call, by leaf column.
    /// Call it right after `ArrowRowGroupWriterFactory::create_column_writers` (on the thread
    /// that calls that): the chunks of that row group, in leaf order.
    pub fn take_created(&self) -> Vec<ChunkPages> {
        let mut created = std::mem::take(&mut *self.created.lock().unwrap_or_else(|p| p.into_inner()));
        created.sort_by_key(|(leaf, _)| *leaf);
        created.into_iter().map(|(_, pages)| pages).collect()
    }
}

impl PageStoreFactory for CapturingPageStoreFactory {
    fn create(&self, args: &PageStoreArgs<'_>) -> Result<Box<dyn PageStore>> {
        let pages = ChunkPages::default();
        self.created
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push((args.column_index(), pages.clone()));
        Ok(Box::new(CapturingStore(pages)))
    }
}

/// A column chunk with compressed pages, ready for its row group.
#[derive(Debug)]
pub struct CompressedChunk {
    segments: Segments,
    close: ColumnCloseResult,
}

impl CompressedChunk {
    /// Appends the chunk as the row group's next column.
    pub fn append_to_row_group<W: Write + Send>(self, row_group: &mut SerializedRowGroupWriter<'_, W>) -> Result<()> {
        row_group.append_column(&self.segments, self.close)
    }
}

/// A row group's column chunk, encoded uncompressed: by the Parquet crate (its pages in the
/// store [`CapturingPageStoreFactory::take_created`] gave), or by gpusort's encoder.
#[derive(Debug)]
pub enum EncodedColumn {
    ParquetCrate(ArrowColumnChunk, ChunkPages),
    Gpusort(EncodedChunk),
}

impl EncodedColumn {
    /// The chunk's pages in file order, and what its writer said of them.
    fn into_pages(self) -> Result<(Vec<Page>, ColumnCloseResult)> {
        match self {
            EncodedColumn::ParquetCrate(chunk, pages) => {
                let close = chunk.close().clone();
                // The chunk's store is empty already (its pages were taken), or is after this.
                drop(chunk);
                Ok((read_pages(pages.take(), &close)?, close))
            }
            EncodedColumn::Gpusort(chunk) => Ok((chunk.pages, chunk.close)),
        }
    }
}

/// One row group's column chunks, in leaf order, with every page compressed by one call of
/// `compressor`.
pub fn compress_row_group(chunks: Vec<EncodedColumn>, compressor: &dyn PageCompressor) -> Result<Vec<CompressedChunk>> {
    let read: Vec<(Vec<Page>, ColumnCloseResult)> = chunks
        .into_par_iter()
        .map(EncodedColumn::into_pages)
        .collect::<Result<_>>()?;
    let frames = compress_pages(&read, compressor)?;
    let codec = compressor.codec();
    let mut frames = frames.into_iter();
    let per_chunk: Vec<_> = read
        .into_iter()
        .map(|(pages, close)| {
            let frames: Vec<Vec<u8>> = frames.by_ref().take(pages.len()).collect();
            (pages, frames, close)
        })
        .collect();
    per_chunk
        .into_par_iter()
        .map(|(pages, frames, close)| rewrite_chunk(pages, frames, close, codec))
        .collect()
}

/// The pages of one uncompressed chunk, `bytes` as its writer wrote them, in file order.
fn read_pages(bytes: Bytes, close: &ColumnCloseResult) -> Result<Vec<Page>> {
    let meta = &close.metadata;
    if meta.compression() != Compression::UNCOMPRESSED {
        return Err(ParquetError::General(format!(
            "column {}: pages to compress must be encoded uncompressed, not {}",
            meta.column_path(),
            meta.compression()
        )));
    }
    if i64::try_from(bytes.len()).ok() != Some(meta.compressed_size()) {
        return Err(ParquetError::General(format!(
            "column {}: {} bytes of pages captured, the column writer wrote {}",
            meta.column_path(),
            bytes.len(),
            meta.compressed_size()
        )));
    }
    // Read from the first byte on, in write order, whatever the type of each page.
    let as_written = meta
        .clone()
        .into_builder()
        .set_dictionary_page_offset(None)
        .set_data_page_offset(0)
        .build()?;
    let properties = Arc::new(ReaderProperties::builder().set_read_page_statistics(true).build());
    let rows = usize::try_from(close.rows_written).map_err(|e| ParquetError::External(Box::new(e)))?;
    let reader = SerializedPageReader::new_with_properties(Arc::new(bytes), &as_written, rows, None, properties)?;
    let mut pages: Vec<Page> = reader.collect::<Result<_>>()?;
    if pages.iter().filter(|p| p.is_dictionary_page()).count() > 1 {
        return Err(ParquetError::General(format!(
            "column {}: more than one dictionary page",
            meta.column_path()
        )));
    }
    // The dictionary page first (a stable sort: the data pages keep their order).
    pages.sort_by_key(|page| !page.is_dictionary_page());
    Ok(pages)
}

/// The bytes of `page` that are compressed: all but a data page v2's levels.
fn compressible(page: &Page) -> Result<&[u8]> {
    match page {
        Page::DataPageV2 {
            buf,
            def_levels_byte_len,
            rep_levels_byte_len,
            ..
        } => {
            let levels = *def_levels_byte_len as usize + *rep_levels_byte_len as usize;
            buf.get(levels..)
                .ok_or_else(|| ParquetError::General("a data page v2 shorter than its levels".into()))
        }
        _ => Ok(page.buffer()),
    }
}

/// The compressed frames of every page of `chunks`, chunk after chunk, in one call.
fn compress_pages(chunks: &[(Vec<Page>, ColumnCloseResult)], compressor: &dyn PageCompressor) -> Result<Vec<Vec<u8>>> {
    let inputs: Vec<&[u8]> = chunks
        .iter()
        .flat_map(|(pages, _)| pages.iter().map(compressible))
        .collect::<Result<_>>()?;
    let frames = compressor.compress(&inputs)?;
    if frames.len() != inputs.len() {
        return Err(ParquetError::General(format!(
            "{}: {} frames for {} pages",
            compressor.name(),
            frames.len(),
            inputs.len()
        )));
    }
    Ok(frames)
}

/// `page` with `frame` for its compressible bytes, and its uncompressed size.
fn with_frame(page: Page, frame: Vec<u8>) -> Result<CompressedPage> {
    let uncompressed = page.buffer().len();
    let page = match page {
        Page::DataPage { .. } | Page::DictionaryPage { .. } => set_buffer(page, Bytes::from(frame)),
        Page::DataPageV2 {
            ref buf,
            def_levels_byte_len,
            rep_levels_byte_len,
            ..
        } => {
            let levels = def_levels_byte_len as usize + rep_levels_byte_len as usize;
            if frame.len() >= buf.len() - levels {
                // Values that do not get smaller stay as they are.
                page
            } else {
                let mut bytes = Vec::with_capacity(levels + frame.len());
                bytes.extend_from_slice(&buf[..levels]);
                bytes.extend_from_slice(&frame);
                let page = set_buffer(page, Bytes::from(bytes));
                set_compressed(page)
            }
        }
    };
    Ok(CompressedPage::new(page, uncompressed))
}

fn set_buffer(mut page: Page, bytes: Bytes) -> Page {
    match &mut page {
        Page::DataPage { buf, .. } | Page::DataPageV2 { buf, .. } | Page::DictionaryPage { buf, .. } => *buf = bytes,
    }
    page
}

fn set_compressed(mut page: Page) -> Page {
    if let Page::DataPageV2 { is_compressed, .. } = &mut page {
        *is_compressed = true;
    }
    page
}

/// One chunk written again with its pages' frames (see the module doc): each page's header,
/// then its frames as they are, not copied into one buffer.
fn rewrite_chunk(
    pages: Vec<Page>,
    frames: Vec<Vec<u8>>,
    close: ColumnCloseResult,
    codec: Compression,
) -> Result<CompressedChunk> {
    let mut sink = TrackedWrite::new(Segments::default());
    let mut specs = Vec::with_capacity(pages.len());
    for (page, frame) in pages.into_iter().zip(frames) {
        let page = with_frame(page, frame)?;
        sink.inner_mut().expect(page.compressed_page().buffer().clone());
        specs.push(SerializedPageWriter::new(&mut sink).write_page(page)?);
    }
    let mut segments = sink.into_inner()?;
    segments.end_small();
    let close = rewritten_close(close, &specs, codec)?;
    Ok(CompressedChunk { segments, close })
}

/// A column chunk's bytes in pieces: page headers (and pages the writer's buffer took in)
/// copied together, each larger page's data the `Bytes` it already is. As a [`Write`] it
/// takes what the Parquet crate's page writer writes, and keeps the data it was told to
/// expect (`expect`) where the writer hands over that very slice; as a [`ChunkReader`] it
/// reads back in order.
#[derive(Debug, Default)]
struct Segments {
    parts: Vec<Bytes>,
    small: Vec<u8>,
    expected: Option<Bytes>,
    len: u64,
}

impl Segments {
    /// The next page's data, kept as it is if it comes in one write.
    fn expect(&mut self, data: Bytes) {
        self.expected = Some(data);
    }

    /// Ends the run of copied bytes.
    fn end_small(&mut self) {
        if !self.small.is_empty() {
            self.parts.push(Bytes::from(std::mem::take(&mut self.small)));
        }
    }
}

impl Write for Segments {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        match self.expected.take() {
            Some(data) if data.as_ptr() == buf.as_ptr() && data.len() == buf.len() => {
                self.end_small();
                self.parts.push(data);
            }
            expected => {
                self.expected = expected;
                self.small.extend_from_slice(buf);
            }
        }
        self.len += buf.len() as u64;
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Length for Segments {
    fn len(&self) -> u64 {
        self.len
    }
}

impl ChunkReader for Segments {
    type T = SegmentsRead;

    fn get_read(&self, start: u64) -> Result<SegmentsRead> {
        let mut skip = usize::try_from(start).map_err(|e| ParquetError::External(Box::new(e)))?;
        let mut parts = std::collections::VecDeque::with_capacity(self.parts.len());
        for part in &self.parts {
            if skip >= part.len() {
                skip -= part.len();
            } else {
                parts.push_back(part.slice(skip..));
                skip = 0;
            }
        }
        Ok(SegmentsRead(parts))
    }

    fn get_bytes(&self, start: u64, length: usize) -> Result<Bytes> {
        let mut read = self.get_read(start)?;
        match read.0.front() {
            Some(first) if first.len() >= length => Ok(first.slice(..length)),
            _ => {
                let mut out = vec![0; length];
                read.read_exact(&mut out)?;
                Ok(Bytes::from(out))
            }
        }
    }
}

/// Reads [`Segments`] in order from a start.
struct SegmentsRead(std::collections::VecDeque<Bytes>);

impl Read for SegmentsRead {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        while let Some(front) = self.0.front_mut() {
            if front.is_empty() {
                self.0.pop_front();
                continue;
            }
            let n = front.len().min(buf.len());
            buf[..n].copy_from_slice(&front[..n]);
            bytes::Buf::advance(front, n);
            return Ok(n);
        }
        Ok(0)
    }
}

/// `close` for the chunk its pages' `specs` (in file order) describe, compressed with `codec`.
fn rewritten_close(
    mut close: ColumnCloseResult,
    specs: &[PageWriteSpec],
    codec: Compression,
) -> Result<ColumnCloseResult> {
    use parquet::basic::PageType;
    let size = |f: fn(&PageWriteSpec) -> usize| -> Result<i64> {
        i64::try_from(specs.iter().map(f).sum::<usize>()).map_err(|e| ParquetError::External(Box::new(e)))
    };
    let dictionary = specs.iter().find(|s| s.page_type == PageType::DICTIONARY_PAGE);
    let data: Vec<&PageWriteSpec> = specs
        .iter()
        .filter(|s| s.page_type != PageType::DICTIONARY_PAGE)
        .collect();
    close.metadata = close
        .metadata
        .into_builder()
        .set_compression(codec)
        .set_total_compressed_size(size(|s| s.compressed_size)?)
        .set_total_uncompressed_size(size(|s| s.uncompressed_size)?)
        .set_dictionary_page_offset(dictionary.map(|s| s.offset as i64))
        // As arrow-rs's column writer: 0 when there is no data page.
        .set_data_page_offset(data.first().map_or(0, |s| s.offset as i64))
        .build()?;
    close.bytes_written = specs.iter().map(|s| s.bytes_written).sum();
    if let Some(index) = close.offset_index.as_mut() {
        if index.page_locations.len() != data.len() {
            return Err(ParquetError::General(format!(
                "column {}: {} data pages but {} in the offset index",
                close.metadata.column_path(),
                data.len(),
                index.page_locations.len()
            )));
        }
        // Each page's first row (and unencoded bytes) stay; where it is and its size change.
        for (location, spec) in index.page_locations.iter_mut().zip(&data) {
            location.offset = spec.offset as i64;
            location.compressed_page_size =
                i32::try_from(spec.compressed_size).map_err(|e| ParquetError::External(Box::new(e)))?;
        }
    }
    Ok(close)
}

#[cfg(test)]
pub(crate) mod tests {
    use std::fs::File;
    use std::path::Path;

    use arrow::array::{
        ArrayRef, BooleanArray, Date32Array, Decimal128Array, Int32Array, Int64Array, ListArray, RecordBatch,
        StringArray, StringViewArray, StructArray,
    };
    use arrow::datatypes::{DataType, Field, Int32Type, Schema, SchemaRef};
    use parquet::arrow::ArrowWriter;
    use parquet::arrow::arrow_reader::{
        ArrowReaderMetadata, ArrowReaderOptions, ParquetRecordBatchReaderBuilder, RowSelection, RowSelectionPolicy,
        RowSelector,
    };
    use parquet::basic::Encoding;
    use parquet::file::metadata::{PageIndexPolicy, ParquetMetaData};
    use parquet::file::properties::{WriterProperties, WriterVersion};
    use parquet::file::reader::{FileReader, SerializedFileReader};
    use parquet::file::serialized_reader::ReadOptionsBuilder;
    use parquet::schema::types::ColumnPath;

    use super::*;

    use crate::writer::{ColumnEncoder, SortedParquetWriter, WriteOptions, WriteStats};

    #[test]
    fn segments_keep_the_expected_data_and_read_back_from_any_offset() {
        let data = Bytes::from((0..20_000u32).map(|i| i as u8).collect::<Vec<u8>>());
        let mut sink = TrackedWrite::new(Segments::default());
        sink.write_all(b"head").unwrap();
        sink.inner_mut().expect(data.clone());
        sink.write_all(&data).unwrap();
        sink.write_all(b"tail").unwrap();
        let mut segments = sink.into_inner().unwrap();
        segments.end_small();
        // The data is kept as it is, not copied; the small writes around it are copied.
        assert!(segments.parts.iter().any(|p| p.as_ptr() == data.as_ptr()));
        let mut all = b"head".to_vec();
        all.extend_from_slice(&data);
        all.extend_from_slice(b"tail");
        assert_eq!(segments.len(), all.len() as u64);
        for start in [0usize, 3, 4, 5, 20_003, 20_004, 20_007, 20_008] {
            let mut read = vec![];
            segments.get_read(start as u64).unwrap().read_to_end(&mut read).unwrap();
            assert_eq!(read, all[start..], "from {start}");
            let len = (all.len() - start).min(10);
            assert_eq!(
                segments.get_bytes(start as u64, len).unwrap(),
                all[start..start + len],
                "{start}"
            );
        }
    }
    const ROWS: usize = 10_000;
    const ROW_GROUP: usize = 3_000;
    /// Leaf columns: eight flat ones, the list's items, the struct's two fields.
    const LEAVES: usize = 11;

    fn schema() -> SchemaRef {
        let list_item = Arc::new(Field::new_list_field(DataType::Int32, true));
        let st = vec![
            Field::new("x", DataType::Int64, true),
            Field::new("y", DataType::Utf8, true),
        ];
        Arc::new(Schema::new(vec![
            Field::new("i", DataType::Int32, true),
            Field::new("l", DataType::Int64, true),
            // Five values: dictionary-encoded throughout.
            Field::new("cat", DataType::Utf8, false),
            // Distinct values (string views in the batches): the dictionary falls back to plain.
            Field::new("s", DataType::Utf8, true),
            Field::new("long", DataType::Utf8View, true),
            Field::new("d", DataType::Decimal128(20, 3), true),
            Field::new("day", DataType::Date32, true),
            Field::new("b", DataType::Boolean, true),
            Field::new("list", DataType::List(list_item), true),
            Field::new("st", DataType::Struct(st.into()), true),
        ]))
    }

    fn hash(i: usize) -> u64 {
        (i as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 7
    }

    /// Rows `from..from + n` (the same rows for the same numbers).
    fn batch(from: usize, n: usize) -> RecordBatch {
        let rows = from..from + n;
        let opt = |i: usize, every: usize| (!i.is_multiple_of(every)).then_some(i);
        let schema = schema();
        let DataType::Struct(st) = schema.field(9).data_type() else {
            unreachable!()
        };
        let st = StructArray::new(
            st.clone(),
            vec![
                Arc::new(Int64Array::from_iter(
                    rows.clone().map(|i| opt(i, 5).map(|i| hash(i) as i64)),
                )),
                Arc::new(StringArray::from_iter(
                    rows.clone().map(|i| opt(i, 6).map(|i| format!("y{}", i % 50))),
                )),
            ],
            None,
        );
        let columns: Vec<ArrayRef> = vec![
            Arc::new(Int32Array::from_iter(
                rows.clone().map(|i| opt(i, 7).map(|i| (hash(i) % 1000) as i32 - 500)),
            )),
            Arc::new(Int64Array::from_iter(
                rows.clone().map(|i| opt(i, 11).map(|i| hash(i) as i64)),
            )),
            Arc::new(StringArray::from_iter_values(
                rows.clone().map(|i| format!("cat{}", i % 5)),
            )),
            Arc::new(StringViewArray::from_iter(
                rows.clone().map(|i| opt(i, 13).map(|i| format!("s{:x}", hash(i)))),
            )),
            Arc::new(StringViewArray::from_iter(
                rows.clone()
                    .map(|i| opt(i, 29).map(|i| format!("{}-{i}", "long".repeat(5 + i % 40)))),
            )),
            Arc::new(
                Decimal128Array::from_iter(rows.clone().map(|i| opt(i, 3).map(|i| hash(i) as i128 - (1 << 40))))
                    .with_precision_and_scale(20, 3)
                    .unwrap(),
            ),
            Arc::new(Date32Array::from_iter(
                rows.clone().map(|i| opt(i, 17).map(|i| (i % 3000) as i32)),
            )),
            Arc::new(BooleanArray::from_iter(
                rows.clone().map(|i| opt(i, 19).map(|i| hash(i).is_multiple_of(3))),
            )),
            Arc::new(ListArray::from_iter_primitive::<Int32Type, _, _>(rows.clone().map(
                |i| {
                    opt(i, 23).map(|i| {
                        (0..i % 4)
                            .map(|k| (k != 2).then_some((i + k) as i32))
                            .collect::<Vec<_>>()
                    })
                },
            ))),
            Arc::new(st),
        ];
        let fields: Vec<Field> = schema
            .fields()
            .iter()
            .zip(&columns)
            .map(|(f, c)| f.as_ref().clone().with_data_type(c.data_type().clone()))
            .collect();
        RecordBatch::try_new(Arc::new(Schema::new(fields)), columns).unwrap()
    }

    /// The test's rows written to `path`, the pages compressed by `compressor` (or by the
    /// Parquet crate with zstd(3)): small pages, row groups and dictionaries, page statistics
    /// in the page headers, a bloom filter on `cat`.
    pub(crate) async fn write(
        path: &Path,
        compressor: Option<Arc<dyn PageCompressor>>,
        version: WriterVersion,
    ) -> Result<WriteStats> {
        let schema = schema();
        let order_by = [crate::SortKey::asc("cat"), crate::SortKey::desc("i")];
        let options = WriteOptions {
            row_group_size: ROW_GROUP,
            codec: "zstd(3)".parse().unwrap(),
            memory_budget: None,
            page_compressor: compressor,
            column_encoder: ColumnEncoder::default(),
        };
        let properties = WriterProperties::builder()
            .set_writer_version(version)
            .set_data_page_size_limit(2048)
            .set_write_batch_size(128)
            .set_dictionary_page_size_limit(4096)
            .set_write_page_header_statistics(true)
            .set_column_bloom_filter_enabled(ColumnPath::from("cat"), true)
            .build();
        let file = File::create(path).unwrap();
        let mut writer = SortedParquetWriter::try_new_with_properties(file, schema, &order_by, &options, properties)?;
        for from in (0..ROWS).step_by(1700) {
            writer.write(batch(from, (ROWS - from).min(1700))).await?;
        }
        writer.finish().await
    }

    fn page_index_options() -> ArrowReaderOptions {
        ArrowReaderOptions::new().with_page_index_policy(PageIndexPolicy::Required)
    }

    fn read_all(path: &Path) -> RecordBatch {
        let reader =
            ParquetRecordBatchReaderBuilder::try_new_with_options(File::open(path).unwrap(), page_index_options())
                .unwrap()
                .build()
                .unwrap();
        let batches: Vec<RecordBatch> = reader.collect::<Result<_, _>>().unwrap();
        arrow::compute::concat_batches(&batches[0].schema(), &batches).unwrap()
    }

    fn metadata(path: &Path) -> Arc<ParquetMetaData> {
        let file = File::open(path).unwrap();
        Arc::clone(
            ArrowReaderMetadata::load(&file, page_index_options())
                .unwrap()
                .metadata(),
        )
    }

    /// `actual` has the rows, pages, statistics and indexes of `expected`, its chunks zstd.
    pub(crate) fn assert_same_file(expected: &Path, actual: &Path) {
        let rows = read_all(expected);
        assert_eq!(rows.num_rows(), ROWS);
        assert_eq!(read_all(actual), rows);
        let file_len = std::fs::metadata(actual).unwrap().len() as i64;
        assert_same_metadata(&metadata(expected), &metadata(actual), file_len);
        assert_same_pages(expected, actual);
        assert_row_selection(actual, &rows);
    }

    fn assert_same_metadata(expected: &ParquetMetaData, actual: &ParquetMetaData, file_len: i64) {
        let kv = |m: &ParquetMetaData| m.file_metadata().key_value_metadata().cloned();
        assert_eq!(kv(actual), kv(expected));
        assert_eq!(actual.num_row_groups(), ROWS.div_ceil(ROW_GROUP));
        assert_eq!(actual.num_row_groups(), expected.num_row_groups());
        let (ci_e, ci_a) = (expected.column_index().unwrap(), actual.column_index().unwrap());
        let (oi_e, oi_a) = (expected.offset_index().unwrap(), actual.offset_index().unwrap());
        for (g, (ge, ga)) in expected.row_groups().iter().zip(actual.row_groups()).enumerate() {
            assert_eq!(ga.num_rows(), ge.num_rows());
            assert!(ga.sorting_columns().is_some());
            assert_eq!(ga.sorting_columns(), ge.sorting_columns());
            assert_eq!(ga.num_columns(), LEAVES);
            for c in 0..ga.num_columns() {
                let (ce, ca) = (ge.column(c), ga.column(c));
                assert!(
                    matches!(ca.compression(), Compression::ZSTD(_)),
                    "{:?}",
                    ca.compression()
                );
                assert_eq!(ca.statistics(), ce.statistics());
                assert!(ca.statistics().is_some());
                assert_eq!(ca.num_values(), ce.num_values());
                assert_eq!(
                    ca.dictionary_page_offset().is_some(),
                    ce.dictionary_page_offset().is_some()
                );
                assert_eq!(ca.encodings_mask(), ce.encodings_mask());
                assert_eq!(ca.page_encoding_stats_mask(), ce.page_encoding_stats_mask());
                assert_eq!(ci_a[g][c], ci_e[g][c]);
                let (le, la) = (&oi_e[g][c], &oi_a[g][c]);
                let first_rows = |l: &OffsetIndexMetaData| -> Vec<i64> {
                    l.page_locations().iter().map(|p| p.first_row_index).collect()
                };
                assert_eq!(first_rows(la), first_rows(le));
                assert_eq!(
                    la.unencoded_byte_array_data_bytes(),
                    le.unencoded_byte_array_data_bytes()
                );
                assert_pages_laid_out(la, ca, file_len);
            }
        }
    }

    use parquet::file::metadata::ColumnChunkMetaData;
    use parquet::file::page_index::offset_index::OffsetIndexMetaData;

    /// The data pages one after the other, from the chunk's first data page to its end.
    fn assert_pages_laid_out(index: &OffsetIndexMetaData, chunk: &ColumnChunkMetaData, file_len: i64) {
        let (start, len) = chunk.byte_range();
        let mut next = chunk.data_page_offset();
        assert!(next > start as i64 || chunk.dictionary_page_offset().is_none());
        for page in index.page_locations() {
            assert_eq!(page.offset, next);
            assert!(page.compressed_page_size > 0);
            next = page.offset + page.compressed_page_size as i64;
            assert!(next <= file_len);
        }
        assert_eq!(next, (start + len) as i64);
    }

    /// Every page of `actual` decodes to the page of `expected`; most chunks have several
    /// data pages, and some a dictionary that fell back mid-chunk (the dictionary page
    /// is then in the middle of what arrow-rs wrote).
    fn assert_same_pages(expected: &Path, actual: &Path) {
        let open = |path: &Path| {
            let properties = ReaderProperties::builder().set_read_page_statistics(true).build();
            let options = ReadOptionsBuilder::new().with_reader_properties(properties).build();
            SerializedFileReader::new_with_options(File::open(path).unwrap(), options).unwrap()
        };
        let (re, ra) = (open(expected), open(actual));
        let (mut fell_back, mut several) = (0, 0);
        for g in 0..ra.num_row_groups() {
            for c in 0..LEAVES {
                let pages = |r: &SerializedFileReader<File>| -> Vec<Page> {
                    let pages = r.get_row_group(g).unwrap().get_column_page_reader(c).unwrap();
                    pages.collect::<Result<_>>().unwrap()
                };
                let (pe, pa) = (pages(&re), pages(&ra));
                assert_eq!(pa.len(), pe.len());
                several += usize::from(pa.iter().filter(|p| p.is_data_page()).count() >= 2);
                for (x, y) in pe.iter().zip(&pa) {
                    assert_eq!(y.page_type(), x.page_type());
                    assert_eq!(y.num_values(), x.num_values());
                    assert_eq!(y.encoding(), x.encoding());
                    assert_eq!(y.buffer(), x.buffer());
                    assert_eq!(y.statistics(), x.statistics());
                }
                let encodings: Vec<Encoding> = pa.iter().filter(|p| p.is_data_page()).map(Page::encoding).collect();
                // Plain (data page v1) or delta (v2) after the dictionary.
                let dictionary = |e: &Encoding| *e == Encoding::RLE_DICTIONARY;
                if encodings.iter().any(dictionary) && !encodings.iter().all(dictionary) {
                    fell_back += 1;
                }
            }
        }
        assert!(fell_back > 0, "no dictionary fell back");
        assert!(
            several >= ra.num_row_groups() * LEAVES / 2,
            "{several} chunks of several pages"
        );
    }

    /// Rows selected by the page index read as the same rows of `all`.
    fn assert_row_selection(path: &Path, all: &RecordBatch) {
        let selection = RowSelection::from(vec![
            RowSelector::skip(2500),
            RowSelector::select(1000),
            RowSelector::skip(4000),
            RowSelector::select(700),
            RowSelector::skip(ROWS - 8200),
        ]);
        let reader =
            ParquetRecordBatchReaderBuilder::try_new_with_options(File::open(path).unwrap(), page_index_options())
                .unwrap()
                .with_row_selection(selection)
                .with_row_selection_policy(RowSelectionPolicy::Selectors)
                .build()
                .unwrap();
        let batches: Vec<RecordBatch> = reader.collect::<Result<_, _>>().unwrap();
        let got = arrow::compute::concat_batches(&all.schema(), &batches).unwrap();
        let want =
            arrow::compute::concat_batches(&all.schema(), &[all.slice(2500, 1000), all.slice(7500, 700)]).unwrap();
        assert_eq!(got, want);
    }

    /// zstd frames of the pages with their last byte changed (`valid` frames), or bytes that
    /// are no frame at all.
    #[derive(Debug)]
    struct Garbling {
        valid: bool,
    }

    impl PageCompressor for Garbling {
        fn codec(&self) -> Compression {
            CpuZstd::new(3).codec()
        }
        fn name(&self) -> String {
            "garbling".into()
        }
        fn compress(&self, pages: &[&[u8]]) -> Result<Vec<Vec<u8>>> {
            if !self.valid {
                return Ok(pages.iter().map(|p| vec![0x5a; p.len() / 3 + 9]).collect());
            }
            let changed: Vec<Vec<u8>> = pages
                .iter()
                .map(|p| {
                    let mut p = p.to_vec();
                    if let Some(last) = p.last_mut() {
                        *last ^= 0x10;
                    }
                    p
                })
                .collect();
            CpuZstd::new(3).compress(&changed.iter().map(Vec::as_slice).collect::<Vec<_>>())
        }
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn pages_compressed_apart_read_as_the_parquet_crates() {
        let dir = tempfile::tempdir().unwrap();
        let (expected, actual) = (dir.path().join("expected.parquet"), dir.path().join("actual.parquet"));
        let v1 = WriterVersion::PARQUET_1_0;
        let stats = write(&expected, None, v1).await.unwrap();
        assert_eq!((stats.rows, stats.row_groups), (ROWS as u64, 4));
        write(&actual, Some(Arc::new(CpuZstd::new(3))), v1).await.unwrap();
        assert_same_file(&expected, &actual);

        // The checks see pages that are wrong, whether they decode or not.
        for valid in [true, false] {
            let garbled = dir.path().join(format!("garbled-{valid}.parquet"));
            write(&garbled, Some(Arc::new(Garbling { valid })), v1).await.unwrap();
            let checked = std::panic::catch_unwind(|| assert_same_file(&expected, &garbled));
            assert!(
                checked.is_err(),
                "garbled pages (valid frames: {valid}) passed the checks"
            );
        }
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn data_pages_v2_are_compressed_past_their_levels() {
        let dir = tempfile::tempdir().unwrap();
        let (expected, actual) = (dir.path().join("expected.parquet"), dir.path().join("actual.parquet"));
        let v2 = WriterVersion::PARQUET_2_0;
        write(&expected, None, v2).await.unwrap();
        write(&actual, Some(Arc::new(CpuZstd::new(3))), v2).await.unwrap();
        assert_same_file(&expected, &actual);
        let reader = SerializedFileReader::new(File::open(&actual).unwrap()).unwrap();
        let pages = reader.get_row_group(0).unwrap().get_column_page_reader(3).unwrap();
        let compressed = pages
            .map(Result::unwrap)
            .filter(|page| {
                matches!(
                    page,
                    Page::DataPageV2 {
                        is_compressed: true,
                        ..
                    }
                )
            })
            .count();
        assert!(compressed > 0);
    }

    #[derive(Debug)]
    struct Failing;

    impl PageCompressor for Failing {
        fn codec(&self) -> Compression {
            CpuZstd::new(3).codec()
        }
        fn name(&self) -> String {
            "failing".into()
        }
        fn compress(&self, _: &[&[u8]]) -> Result<Vec<Vec<u8>>> {
            Err(ParquetError::General("the compressor failed on purpose".into()))
        }
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn a_compressor_error_is_the_writers_error() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("out.parquet");
        let err = write(&path, Some(Arc::new(Failing)), WriterVersion::PARQUET_1_0)
            .await
            .unwrap_err();
        assert!(err.to_string().contains("the compressor failed on purpose"), "{err}");
    }

    #[test]
    fn chunks_of_no_rows_are_compressed_too() {
        let schema = schema();
        let properties = WriterProperties::builder()
            .set_compression(Compression::UNCOMPRESSED)
            .build();
        let writer = ArrowWriter::try_new(Vec::new(), Arc::clone(&schema), Some(properties)).unwrap();
        let (mut file, factory) = writer.into_serialized_writer().unwrap();
        let stores = Arc::new(CapturingPageStoreFactory::new());
        let factory = factory.with_page_store_factory(Arc::clone(&stores) as _);
        let writers = factory.create_column_writers(0).unwrap();
        let pages = stores.take_created();
        assert_eq!((writers.len(), pages.len()), (LEAVES, LEAVES));
        let chunks: Vec<EncodedColumn> = writers
            .into_iter()
            .zip(pages)
            .map(|(w, pages)| EncodedColumn::ParquetCrate(w.close().unwrap(), pages))
            .collect();
        let chunks = compress_row_group(chunks, &CpuZstd::new(3)).unwrap();
        let mut row_group = file.next_row_group().unwrap();
        for chunk in chunks {
            chunk.append_to_row_group(&mut row_group).unwrap();
        }
        row_group.close().unwrap();
        let bytes = Bytes::from(file.into_inner().unwrap());
        let reader = ParquetRecordBatchReaderBuilder::try_new(bytes).unwrap();
        let meta = reader.metadata().clone();
        assert_eq!((meta.num_row_groups(), meta.row_group(0).num_rows()), (1, 0));
        assert!(matches!(
            meta.row_group(0).column(2).compression(),
            Compression::ZSTD(_)
        ));
        let rows: usize = reader.build().unwrap().map(|b| b.unwrap().num_rows()).sum();
        assert_eq!(rows, 0);
    }
}
