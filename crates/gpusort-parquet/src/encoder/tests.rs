//! Differential tests of gpusort's column chunk encoder: each table is written twice through
//! [`SortedParquetWriter`] from the same rows under the same properties, once by the Parquet
//! crate's encoder (the reference) and once by gpusort's, and the second file must read back
//! the same, carry the same chunk metadata, and have a page index that says of each of its own
//! pages what the pages hold (its pages may be cut elsewhere than the reference's).

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use arrow::array::{
    Array, ArrayRef, AsArray, BinaryArray, BinaryViewArray, BooleanArray, Date32Array, Decimal128Array,
    DictionaryArray, Float64Array, Int32Array, Int64Array, LargeBinaryArray, LargeStringArray, ListArray, RecordBatch,
    StringArray, StringViewArray, StructArray,
};
use arrow::datatypes::{DataType, Date32Type, Decimal128Type, Field, Int32Type, Int64Type, Schema, SchemaRef};
use parquet::arrow::arrow_reader::{
    ArrowReaderMetadata, ArrowReaderOptions, ParquetRecordBatchReaderBuilder, RowSelection, RowSelectionPolicy,
    RowSelector,
};
use parquet::arrow::arrow_writer::{ArrowColumnChunk, compute_leaves};
use parquet::arrow::{ArrowSchemaConverter, ArrowWriter};
use parquet::basic::{BoundaryOrder, Encoding, LogicalType, PageType};
use parquet::column::page::Page;
use parquet::column::writer::ColumnCloseResult;
use parquet::file::metadata::{ColumnChunkMetaData, PageIndexPolicy, ParquetMetaData};
use parquet::file::page_index::column_index::ColumnIndexMetaData;
use parquet::file::properties::{
    EnabledStatistics, ReaderProperties, WriterProperties, WriterPropertiesBuilder, WriterVersion,
};
use parquet::file::reader::{FileReader, SerializedFileReader};
use parquet::file::serialized_reader::ReadOptionsBuilder;
use parquet::schema::types::{ColumnDescPtr, ColumnPath};

use super::{encode, encodes};
use crate::SortKey;
use crate::writer::{ColumnEncoder, SortedParquetWriter, WriteOptions};

/// xorshift64: the tests' values, the same on every run.
struct Rng(u64);

impl Rng {
    /// The next number.
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    /// A number below `n`.
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    /// One of `items`.
    fn pick<T: Clone>(&mut self, items: &[T]) -> T {
        items[self.below(items.len() as u64) as usize].clone()
    }
}

/// `n` rows of `value` (given the row's number), each null with a chance of `nulls` in 100
/// (0: none, 100: all).
fn rows<T>(rng: &mut Rng, n: usize, nulls: u64, mut value: impl FnMut(&mut Rng, usize) -> T) -> Vec<Option<T>> {
    (0..n)
        .map(|i| {
            let v = value(rng, i);
            (rng.below(100) >= nulls).then_some(v)
        })
        .collect()
}

/// A column of the table: its field (nullable as said, of the array's type) and its rows.
fn col(name: &str, nullable: bool, array: impl Array + 'static) -> (Field, ArrayRef) {
    (Field::new(name, array.data_type().clone(), nullable), Arc::new(array))
}

/// `column` in a file field of `data_type` (string and binary views written as strings and
/// binary, as DataFusion's batches are).
fn as_field_type((field, rows): (Field, ArrayRef), data_type: DataType) -> (Field, ArrayRef) {
    (field.with_data_type(data_type), rows)
}

/// Integers of which a quarter are `i64`'s extremes and the values beside them.
fn extreme_i64(rng: &mut Rng) -> i64 {
    if rng.below(4) == 0 {
        rng.pick(&[i64::MIN, i64::MIN + 1, -1, 0, 1, i64::MAX - 1, i64::MAX])
    } else {
        rng.next() as i64
    }
}

/// As [`extreme_i64`], of `i32`.
fn extreme_i32(rng: &mut Rng) -> i32 {
    if rng.below(4) == 0 {
        rng.pick(&[i32::MIN, i32::MIN + 1, -1, 0, 1, i32::MAX - 1, i32::MAX])
    } else {
        rng.next() as i32
    }
}

/// A string of up to `max` bytes of ASCII and 2-, 3- and 4-byte characters; a fifth of them
/// empty or of one character.
fn text(rng: &mut Rng, max: usize) -> String {
    const CHARS: [char; 9] = ['a', 'b', 'z', '\u{7f}', 'é', '€', '\u{d7ff}', '𝄞', '\u{10ffff}'];
    let len = rng.pick(&[0, 1, 5, 12, 13, 40, 63, 64, 65, 100]).min(max);
    let mut s = String::new();
    while s.len() < len {
        s.push(rng.pick(&CHARS));
    }
    s
}

/// Bytes of up to `max`, a third of them 0xff.
fn bytes(rng: &mut Rng, max: usize) -> Vec<u8> {
    let len = rng.pick(&[0, 1, 8, 13, 64, 65, 90]).min(max);
    (0..len)
        .map(|_| if rng.below(3) == 0 { 0xff } else { rng.next() as u8 })
        .collect()
}

/// A table and how it is written.
struct Case {
    columns: Vec<(Field, ArrayRef)>,
    row_group_size: usize,
    /// Rows of each batch handed to the writer, cycled.
    batch_rows: Vec<usize>,
    codec: &'static str,
    properties: WriterPropertiesBuilder,
}

impl Case {
    fn new(columns: Vec<(Field, ArrayRef)>, row_group_size: usize, properties: WriterPropertiesBuilder) -> Self {
        Self {
            columns,
            row_group_size,
            batch_rows: vec![700, 1, 333, 64],
            codec: "zstd(3)",
            properties,
        }
    }

    /// Rows of the table.
    fn num_rows(&self) -> usize {
        self.columns[0].1.len()
    }

    /// The file's schema: the columns' fields.
    fn schema(&self) -> SchemaRef {
        Arc::new(Schema::new(
            self.columns.iter().map(|(f, _)| f.clone()).collect::<Vec<_>>(),
        ))
    }

    /// The rows of each batch handed to the writer, in order.
    fn batch_ranges(&self) -> Vec<std::ops::Range<usize>> {
        let mut out = vec![];
        for &n in self.batch_rows.iter().cycle() {
            let start = out.last().map_or(0, |r: &std::ops::Range<usize>| r.end);
            if start == self.num_rows() {
                return out;
            }
            out.push(start..(start + n).min(self.num_rows()));
        }
        unreachable!("batch_rows cycles")
    }

    /// Column `field`'s rows `start..start + len` in the arrays the writer hands the encoder:
    /// the batches' rows, cut at the row group's ends.
    fn pieces(&self, field: usize, start: usize, len: usize) -> Vec<ArrayRef> {
        let rows = &self.columns[field].1;
        self.batch_ranges()
            .into_iter()
            .filter_map(|r| {
                let (from, to) = (r.start.max(start), r.end.min(start + len));
                (from < to).then(|| rows.slice(from, to - from))
            })
            .collect()
    }

    /// The batches handed to the writer (columns of their rows' types).
    fn batches(&self) -> Vec<RecordBatch> {
        let fields: Vec<Field> = self
            .columns
            .iter()
            .map(|(f, rows)| f.clone().with_data_type(rows.data_type().clone()))
            .collect();
        let schema = Arc::new(Schema::new(fields));
        self.batch_ranges()
            .into_iter()
            .map(|r| {
                let columns = self
                    .columns
                    .iter()
                    .map(|(_, rows)| rows.slice(r.start, r.len()))
                    .collect();
                RecordBatch::try_new(Arc::clone(&schema), columns).unwrap()
            })
            .collect()
    }

    /// The table as the file holds it: each column in its field's type.
    fn expected_rows(&self) -> RecordBatch {
        let columns = self
            .columns
            .iter()
            .map(|(f, rows)| arrow::compute::cast(rows, f.data_type()).unwrap())
            .collect();
        RecordBatch::try_new(self.schema(), columns).unwrap()
    }

    /// Writes the table to `path` with `encoder`.
    async fn write(&self, path: &Path, encoder: ColumnEncoder) {
        let schema = self.schema();
        let order_by = [SortKey::asc(schema.field(0).name())];
        let options = WriteOptions {
            row_group_size: self.row_group_size,
            codec: self.codec.parse().unwrap(),
            memory_budget: None,
            page_compressor: None,
            column_encoder: encoder,
        };
        let file = File::create(path).unwrap();
        let properties = self.properties.clone().build();
        let mut writer =
            SortedParquetWriter::try_new_with_properties(file, schema, &order_by, &options, properties).unwrap();
        for batch in self.batches() {
            writer.write(batch).await.unwrap();
        }
        writer.finish().await.unwrap();
    }
}

/// A case written by both encoders, and what the checks common to every case found.
struct Written {
    _dir: tempfile::TempDir,
    actual: PathBuf,
    expected_meta: Arc<ParquetMetaData>,
    actual_meta: Arc<ParquetMetaData>,
    /// Pages of gpusort's file whose rows are those of a page of the reference.
    same_pages: usize,
    /// Pages of gpusort's file in all.
    pages: usize,
}

impl Written {
    /// The column index of leaf `c` in row group `g` (`NONE` where the file has none).
    fn column_index(&self, g: usize, c: usize) -> &ColumnIndexMetaData {
        column_index(&self.actual_meta, g, c)
    }

    /// The (page type, encoding) runs of the page encoding stats of leaf `c` in row group `g`,
    /// in gpusort's file.
    fn encodings(&self, g: usize, c: usize) -> Vec<(PageType, Encoding)> {
        encoding_runs(self.actual_meta.row_group(g).column(c))
    }
}

/// The column index of leaf `c` in row group `g` of `meta` (`NONE` where it has none).
fn column_index(meta: &ParquetMetaData, g: usize, c: usize) -> &ColumnIndexMetaData {
    meta.column_index()
        .map_or(&ColumnIndexMetaData::NONE, |index| &index[g][c])
}

/// The chunk's page encoding stats as (page type, encoding), in order, counts left out.
fn encoding_runs(chunk: &ColumnChunkMetaData) -> Vec<(PageType, Encoding)> {
    let stats = chunk.page_encoding_stats().expect("page encoding stats");
    stats.iter().map(|s| (s.page_type, s.encoding)).collect()
}

/// Reading with the page index where the file has one, and the page encoding stats whole.
fn read_options() -> ArrowReaderOptions {
    ArrowReaderOptions::new()
        .with_page_index_policy(PageIndexPolicy::Optional)
        .with_encoding_stats_as_mask(false)
}

/// The metadata of `path`, as [`read_options`] reads it.
fn metadata(path: &Path) -> Arc<ParquetMetaData> {
    let file = File::open(path).unwrap();
    Arc::clone(ArrowReaderMetadata::load(&file, read_options()).unwrap().metadata())
}

/// The rows of `path` that `selection` (all rows when `None`) selects, through its page index.
fn read(path: &Path, selection: Option<Vec<RowSelector>>) -> RecordBatch {
    let mut builder = ParquetRecordBatchReaderBuilder::try_new_with_options(File::open(path).unwrap(), read_options())
        .unwrap()
        .with_batch_size(977)
        .with_row_selection_policy(RowSelectionPolicy::Selectors);
    if let Some(selection) = selection {
        builder = builder.with_row_selection(RowSelection::from(selection));
    }
    let schema = builder.schema().clone();
    let batches: Vec<RecordBatch> = builder.build().unwrap().collect::<Result<_, _>>().unwrap();
    arrow::compute::concat_batches(&schema, &batches).unwrap()
}

/// The rows of `all` that `selection` selects.
fn selected(all: &RecordBatch, selection: &[RowSelector]) -> RecordBatch {
    let mut at = 0;
    let mut parts = vec![];
    for s in selection {
        if !s.skip {
            parts.push(all.slice(at, s.row_count));
        }
        at += s.row_count;
    }
    arrow::compute::concat_batches(&all.schema(), &parts).unwrap()
}

/// Writes `case` with both encoders and checks what holds for every case: both files read
/// back as the table; gpusort's chunks are the encoder's pages ([`assert_encoder_pages`]) and
/// have the reference's chunk metadata ([`assert_same_chunks`]); their pages, encodings and
/// page index describe their rows ([`assert_pages`], [`PageIndex::check`]); rows selected
/// through the page index read right ([`assert_selections`]).
async fn check(case: &Case) -> Written {
    let dir = tempfile::tempdir().unwrap();
    let (expected, actual) = (dir.path().join("expected.parquet"), dir.path().join("actual.parquet"));
    case.write(&expected, ColumnEncoder::ParquetCrate).await;
    case.write(&actual, ColumnEncoder::Gpusort).await;
    let rows = case.expected_rows();
    let read_back = read(&expected, None);
    assert_eq!(read_back.columns(), rows.columns(), "the Parquet crate's file");
    assert_eq!(read_back.schema().fields(), rows.schema().fields());
    let read_back = read(&actual, None);
    assert_eq!(read_back.columns(), rows.columns(), "gpusort's file");
    assert_eq!(read_back.schema().fields(), rows.schema().fields());

    let (expected_meta, actual_meta) = (metadata(&expected), metadata(&actual));
    assert!(
        assert_encoder_pages(case, &actual, &actual_meta) > 0,
        "the encoder wrote no chunk"
    );
    assert_same_chunks(&expected_meta, &actual_meta);
    assert_pages(&actual, &actual_meta);
    let props = case.properties.clone().build();
    let descrs = actual_meta.file_metadata().schema_descr();
    let (mut same_pages, mut pages, mut start) = (0, 0, 0);
    for (g, group) in actual_meta.row_groups().iter().enumerate() {
        let len = group.num_rows() as usize;
        for c in 0..descrs.num_columns() {
            let field = descrs.get_column_root_idx(c);
            let flat = descrs.column(c).path().parts().len() == 1;
            let values = flat
                .then(|| keys(rows.column(field).slice(start, len).as_ref()))
                .flatten();
            let page_index = PageIndex {
                actual: &actual_meta,
                expected: &expected_meta,
                g,
                c,
                truncate: props.column_index_truncate_length(),
            };
            same_pages += page_index.check(values.as_deref());
            pages += actual_meta.offset_index().map_or(0, |o| o[g][c].page_locations().len());
        }
        start += len;
    }
    assert_eq!(start, case.num_rows());
    assert_selections(&actual, &actual_meta, &rows);
    Written {
        _dir: dir,
        actual,
        expected_meta,
        actual_meta,
        same_pages,
        pages,
    }
}

/// Each chunk of `path` (whose metadata is `meta`) that gpusort's encoder takes is, page for
/// page, what [`encode`] makes of the row group's rows as the writer hands them over: the
/// writer used the encoder, and compression changed nothing. What the encoder says of the
/// chunk is what the Parquet crate's column writer says of the same rows: the whole statistics
/// as made (the file loses whether the deprecated min and max were written), values, level
/// histogram and unencoded bytes. Returns how many chunks.
fn assert_encoder_pages(case: &Case, path: &Path, meta: &ParquetMetaData) -> usize {
    let props = case.properties.clone().build();
    let reader = SerializedFileReader::new(File::open(path).unwrap()).unwrap();
    let descrs = meta.file_metadata().schema_descr();
    let schema = case.schema();
    let (mut chunks, mut start) = (0, 0);
    for (g, group) in meta.row_groups().iter().enumerate() {
        let len = group.num_rows() as usize;
        for c in 0..descrs.num_columns() {
            let (descr, field) = (descrs.column(c), descrs.get_column_root_idx(c));
            if !encodes(schema.field(field), &descr, &props) {
                continue;
            }
            let pieces = case.pieces(field, start, len);
            let encoded = encode(&pieces, &descr, &props).unwrap();
            let said = |close: &ColumnCloseResult| {
                let m = &close.metadata;
                let histogram = m.definition_level_histogram().cloned();
                (
                    close.rows_written,
                    m.statistics().cloned(),
                    m.num_values(),
                    m.unencoded_byte_array_data_bytes(),
                    histogram,
                )
            };
            let reference = reference_chunk(&schema, &props, (field, c), &pieces);
            assert_eq!(
                said(&encoded.close),
                said(reference.close()),
                "row group {g} column {c}"
            );
            let pages = file_pages(&reader, g, c);
            let facts = |p: &Page| (p.page_type(), p.num_values(), p.encoding(), p.buffer().clone());
            let (written, made): (Vec<_>, Vec<_>) = (
                pages.iter().map(facts).collect(),
                encoded.pages.iter().map(facts).collect(),
            );
            assert_eq!(
                written, made,
                "row group {g} column {c}: the file's pages are not the encoder's"
            );
            chunks += 1;
        }
        start += len;
    }
    chunks
}

/// Leaf `c` of `schema` (its field `field`, of one leaf) written from `arrays` by the Parquet
/// crate's column writer under `props`, as the writer would.
fn reference_chunk(
    schema: &SchemaRef,
    props: &WriterProperties,
    (field, c): (usize, usize),
    arrays: &[ArrayRef],
) -> ArrowColumnChunk {
    let writer = ArrowWriter::try_new(Vec::new(), Arc::clone(schema), Some(props.clone())).unwrap();
    let (_, factory) = writer.into_serialized_writer().unwrap();
    let mut column = factory.create_column_writers(0).unwrap().swap_remove(c);
    for array in arrays {
        for leaf in compute_leaves(schema.field(field), array).unwrap() {
            column.write(&leaf).unwrap();
        }
    }
    column.close().unwrap()
}

/// The pages of leaf `c` in row group `g`, uncompressed, in file order.
fn file_pages(reader: &SerializedFileReader<File>, g: usize, c: usize) -> Vec<Page> {
    let pages = reader.get_row_group(g).unwrap().get_column_page_reader(c).unwrap();
    pages.collect::<Result<_, _>>().unwrap()
}

/// Every chunk of `actual` carries what that of `expected` does: the whole statistics (values,
/// nulls, exactness, deprecated fields), values, level histograms, unencoded byte array bytes,
/// codec, encodings (page encoding stats as runs of page type and encoding: page counts may
/// differ), whether it has a dictionary page, an offset index and a column index.
fn assert_same_chunks(expected: &ParquetMetaData, actual: &ParquetMetaData) {
    assert_eq!(actual.num_row_groups(), expected.num_row_groups());
    for (g, (ge, ga)) in expected.row_groups().iter().zip(actual.row_groups()).enumerate() {
        assert_eq!(ga.num_rows(), ge.num_rows());
        for c in 0..ga.num_columns() {
            let facts = |m: &ParquetMetaData, chunk: &ColumnChunkMetaData| {
                (
                    chunk.statistics().cloned(),
                    chunk.num_values(),
                    chunk.definition_level_histogram().cloned(),
                    chunk.repetition_level_histogram().cloned(),
                    chunk.unencoded_byte_array_data_bytes(),
                    chunk.compression(),
                    *chunk.encodings_mask(),
                    encoding_runs(chunk),
                    chunk.dictionary_page_offset().is_some(),
                    m.offset_index().is_some(),
                    matches!(column_index(m, g, c), ColumnIndexMetaData::NONE),
                )
            };
            assert_eq!(
                facts(actual, ga.column(c)),
                facts(expected, ge.column(c)),
                "row group {g} column {}",
                ga.column(c).column_path()
            );
        }
    }
}

/// In every chunk of `path` the dictionary page, if any, comes first and is the only one;
/// the data pages are v1 and hold as many values as the offset index gives them rows (flat
/// columns), and their encodings are, in order, those the page encoding stats count.
fn assert_pages(path: &Path, meta: &ParquetMetaData) {
    let reader = SerializedFileReader::new(File::open(path).unwrap()).unwrap();
    for (g, group) in meta.row_groups().iter().enumerate() {
        for (c, chunk) in group.columns().iter().enumerate() {
            let pages = file_pages(&reader, g, c);
            let dictionaries: Vec<usize> = (0..pages.len()).filter(|&i| pages[i].is_dictionary_page()).collect();
            assert!(
                dictionaries.is_empty() || dictionaries == [0],
                "dictionary pages at {dictionaries:?}"
            );
            let mut runs: Vec<(PageType, Encoding, i32)> = vec![];
            for page in &pages {
                match runs.last_mut() {
                    Some((t, e, n)) if (*t, *e) == (page.page_type(), page.encoding()) => *n += 1,
                    _ => runs.push((page.page_type(), page.encoding(), 1)),
                }
            }
            let stats = chunk.page_encoding_stats().unwrap();
            let counted: Vec<_> = stats.iter().map(|s| (s.page_type, s.encoding, s.count)).collect();
            assert_eq!(runs, counted, "row group {g} column {}", chunk.column_path());
            let flat = chunk.column_descr().max_rep_level() == 0;
            if let (Some(index), true) = (meta.offset_index(), flat) {
                let data: Vec<u32> = pages
                    .iter()
                    .filter(|p| p.is_data_page())
                    .map(Page::num_values)
                    .collect();
                let locations = index[g][c].page_locations();
                let ends = locations
                    .iter()
                    .skip(1)
                    .map(|l| l.first_row_index)
                    .chain([group.num_rows()]);
                let rows: Vec<u32> = locations
                    .iter()
                    .zip(ends)
                    .map(|(l, end)| (end - l.first_row_index) as u32)
                    .collect();
                assert_eq!(data, rows, "row group {g} column {}", chunk.column_path());
            }
            assert!(pages.iter().all(|p| p.page_type() != PageType::DATA_PAGE_V2));
        }
    }
}

/// A value as Parquet orders a column's values: integers (of every width) by value, byte
/// arrays by their unsigned bytes.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
enum Key {
    Int(i128),
    Bytes(Vec<u8>),
}

impl Key {
    /// The bytes of a byte array (0 for an integer).
    fn len(&self) -> i64 {
        match self {
            Key::Int(_) => 0,
            Key::Bytes(b) => b.len() as i64,
        }
    }
}

/// The values of `array` as [`Key`]s (`None`: null); `None` for a type the tests do not order.
fn keys(array: &dyn Array) -> Option<Vec<Option<Key>>> {
    fn ints<T: Into<i128>>(values: impl Iterator<Item = Option<T>>) -> Vec<Option<Key>> {
        values.map(|v| v.map(|v| Key::Int(v.into()))).collect()
    }
    fn byte_arrays<T: AsRef<[u8]>>(values: impl Iterator<Item = Option<T>>) -> Vec<Option<Key>> {
        values.map(|v| v.map(|v| Key::Bytes(v.as_ref().to_vec()))).collect()
    }
    Some(match array.data_type() {
        DataType::Int32 => ints(array.as_primitive::<Int32Type>().iter()),
        DataType::Date32 => ints(array.as_primitive::<Date32Type>().iter()),
        DataType::Int64 => ints(array.as_primitive::<Int64Type>().iter()),
        DataType::Decimal128(precision, _) if *precision <= 18 => ints(array.as_primitive::<Decimal128Type>().iter()),
        DataType::Utf8 => byte_arrays(array.as_string::<i32>().iter()),
        DataType::LargeUtf8 => byte_arrays(array.as_string::<i64>().iter()),
        DataType::Utf8View => byte_arrays(array.as_string_view().iter()),
        DataType::Binary => byte_arrays(array.as_binary::<i32>().iter()),
        DataType::LargeBinary => byte_arrays(array.as_binary::<i64>().iter()),
        DataType::BinaryView => byte_arrays(array.as_binary_view().iter()),
        _ => return None,
    })
}

/// `min` as the Parquet crate writes a page's minimum cut to `length` bytes: a string keeps
/// the characters that fit whole (all of it when not even one does), bytes their first
/// `length`.
fn cut_min(min: &Key, utf8: bool, length: Option<usize>) -> Key {
    let (Key::Bytes(b), Some(l)) = (min, length) else {
        return min.clone();
    };
    if b.len() <= l {
        return min.clone();
    }
    match std::str::from_utf8(b) {
        Ok(s) if utf8 => {
            let fit: String = s
                .chars()
                .scan(0, |n, c| {
                    *n += c.len_utf8();
                    (*n <= l).then_some(c)
                })
                .collect();
            if fit.is_empty() {
                min.clone()
            } else {
                Key::Bytes(fit.into_bytes())
            }
        }
        _ => Key::Bytes(b[..l].to_vec()),
    }
}

/// `max` as the Parquet crate writes a page's maximum cut to `length` bytes, raised to stay
/// above every value it starts: a string's whole characters that fit, the last of them that
/// has a successor of its width raised and the rest dropped; bytes the first `length` plus
/// one, carrying (0xff becomes 0 and its left neighbour grows). Where nothing can be raised,
/// the value is kept whole.
fn cut_max(max: &Key, utf8: bool, length: Option<usize>) -> Key {
    let (Key::Bytes(b), Some(l)) = (max, length) else {
        return max.clone();
    };
    if b.len() <= l {
        return max.clone();
    }
    let raised = match std::str::from_utf8(b) {
        Ok(s) if utf8 => {
            let fit: Vec<char> = s
                .chars()
                .scan(0, |n, c| {
                    *n += c.len_utf8();
                    (*n <= l).then_some(c)
                })
                .collect();
            (0..fit.len()).rev().find_map(|k| {
                let next = char::from_u32(fit[k] as u32 + 1).filter(|n| n.len_utf8() == fit[k].len_utf8())?;
                Some(fit[..k].iter().chain([&next]).collect::<String>().into_bytes())
            })
        }
        _ => {
            let mut cut = b[..l].to_vec();
            let carry_from = cut.iter().rposition(|&x| x != 0xff);
            carry_from.map(|i| {
                cut[i] += 1;
                cut[i + 1..].fill(0);
                cut
            })
        }
    };
    raised.map_or_else(|| max.clone(), Key::Bytes)
}

/// Page `i`'s minimum and maximum in `index`; `None` for a null page or a type the tests do
/// not order.
fn index_min_max(index: &ColumnIndexMetaData, i: usize) -> Option<(Key, Key)> {
    let int = |v: i128| Key::Int(v);
    match index {
        ColumnIndexMetaData::INT32(x) => Some((int((*x.min_value(i)?).into()), int((*x.max_value(i)?).into()))),
        ColumnIndexMetaData::INT64(x) => Some((int((*x.min_value(i)?).into()), int((*x.max_value(i)?).into()))),
        ColumnIndexMetaData::BYTE_ARRAY(x) => Some((
            Key::Bytes(x.min_value(i)?.to_vec()),
            Key::Bytes(x.max_value(i)?.to_vec()),
        )),
        _ => None,
    }
}

/// The pages of leaf `c` in row group `g` of `meta`, as row ranges of the row group, as its
/// offset index says (none without one).
fn page_rows(meta: &ParquetMetaData, g: usize, c: usize) -> Vec<std::ops::Range<usize>> {
    let Some(index) = meta.offset_index() else {
        return vec![];
    };
    let locations = index[g][c].page_locations();
    let rows = meta.row_group(g).num_rows() as usize;
    let firsts: Vec<usize> = locations.iter().map(|l| l.first_row_index as usize).collect();
    let ends = firsts.iter().skip(1).copied().chain([rows]);
    firsts.iter().zip(ends).map(|(&a, b)| a..b).collect()
}

/// One chunk's page index in gpusort's file (`actual`), beside the reference's (`expected`).
struct PageIndex<'a> {
    actual: &'a ParquetMetaData,
    expected: &'a ParquetMetaData,
    g: usize,
    c: usize,
    truncate: Option<usize>,
}

/// What a page's entries in the column and offset index say of it.
#[derive(Debug, PartialEq)]
struct PageEntry {
    nulls: Option<i64>,
    null_page: bool,
    histogram: Option<Vec<i64>>,
    min_max: Option<(Key, Key)>,
    unencoded: Option<i64>,
}

impl PageIndex<'_> {
    /// Page `i`'s entry in `meta`'s page index (the column index's part `None` without one).
    fn entry(&self, meta: &ParquetMetaData, i: usize) -> PageEntry {
        let index = column_index(meta, self.g, self.c);
        let offsets = &meta.offset_index().expect("an offset index")[self.g][self.c];
        let unencoded = offsets.unencoded_byte_array_data_bytes().map(|u| u[i]);
        if matches!(index, ColumnIndexMetaData::NONE) {
            return PageEntry {
                nulls: None,
                null_page: false,
                histogram: None,
                min_max: None,
                unencoded,
            };
        }
        PageEntry {
            nulls: index.null_count(i),
            null_page: index.is_null_page(i),
            histogram: index.definition_level_histogram(i).map(<[i64]>::to_vec),
            min_max: index_min_max(index, i),
            unencoded,
        }
    }

    /// Checks the chunk's offset index: its pages partition the row group and lie one after
    /// another from the first data page to the chunk's end. Given the row group's `values` of
    /// the column, checks each page's column index entry (null count, null page, definition
    /// level histogram, minimum and maximum cut as the Parquet crate cuts them; where the page
    /// has its rows' unencoded bytes, those too) and the boundary order, against the rows;
    /// a page of the reference with the same rows has the same entry. Returns how many pages
    /// have a reference page of the same rows.
    fn check(&self, values: Option<&[Option<Key>]>) -> usize {
        let pages = page_rows(self.actual, self.g, self.c);
        if pages.is_empty() {
            assert!(self.actual.offset_index().is_none() && self.expected.offset_index().is_none());
            return 0;
        }
        let chunk = self.actual.row_group(self.g).column(self.c);
        assert!(pages.iter().all(|p| !p.is_empty()) && pages[0].start == 0, "{pages:?}");
        assert!(pages.windows(2).all(|w| w[0].end == w[1].start));
        let locations = self.actual.offset_index().unwrap()[self.g][self.c].page_locations();
        let (start, len) = chunk.byte_range();
        let ends = locations.iter().skip(1).map(|l| l.offset).chain([(start + len) as i64]);
        assert!(
            locations
                .iter()
                .zip(ends)
                .all(|(l, end)| l.offset + i64::from(l.compressed_page_size) == end)
        );
        assert_eq!(locations[0].offset, chunk.data_page_offset());

        let reference = page_rows(self.expected, self.g, self.c);
        let same = pages.iter().filter(|p| reference.contains(p)).count();
        for (i, p) in pages.iter().enumerate() {
            if let Some(j) = reference.iter().position(|r| r == p) {
                assert_eq!(
                    self.entry(self.actual, i),
                    self.entry(self.expected, j),
                    "page {i} ({p:?})"
                );
            }
        }
        if let Some(values) = values {
            self.check_against(&pages, values);
        }
        same
    }

    /// Checks the page entries and the boundary order against the rows (`values`).
    fn check_against(&self, pages: &[std::ops::Range<usize>], values: &[Option<Key>]) {
        let descr = self.actual.row_group(self.g).column(self.c).column_descr_ptr();
        let utf8 = descr.logical_type_ref() == Some(&LogicalType::String);
        let has_index = !matches!(column_index(self.actual, self.g, self.c), ColumnIndexMetaData::NONE);
        let byte_array = descr.physical_type() == parquet::basic::Type::BYTE_ARRAY;
        let (mut ascending, mut descending, mut last) = (true, true, None::<(Key, Key)>);
        for (i, p) in pages.iter().enumerate() {
            let page = &values[p.clone()];
            let nulls = page.iter().filter(|v| v.is_none()).count();
            let min_max = page
                .iter()
                .flatten()
                .min()
                .cloned()
                .zip(page.iter().flatten().max().cloned());
            let counted = PageEntry {
                nulls: has_index.then_some(nulls as i64),
                null_page: has_index && min_max.is_none(),
                histogram: (has_index && descr.max_def_level() > 0)
                    .then(|| vec![nulls as i64, (p.len() - nulls) as i64]),
                min_max: min_max
                    .as_ref()
                    .filter(|_| has_index)
                    .map(|(min, max)| (cut_min(min, utf8, self.truncate), cut_max(max, utf8, self.truncate))),
                unencoded: byte_array.then(|| page.iter().flatten().map(Key::len).sum()),
            };
            assert_eq!(
                self.entry(self.actual, i),
                counted,
                "page {i} ({p:?}) of column {}",
                descr.path()
            );
            if let (Some((min, max)), Some((last_min, last_max))) = (&min_max, &last) {
                ascending &= last_min <= min && last_max <= max;
                descending &= last_min >= min && last_max >= max;
            }
            last = min_max.or(last);
        }
        let order = match (ascending, descending) {
            (true, _) => BoundaryOrder::ASCENDING,
            (false, true) => BoundaryOrder::DESCENDING,
            (false, false) => BoundaryOrder::UNORDERED,
        };
        let index = column_index(self.actual, self.g, self.c);
        assert_eq!(
            index.get_boundary_order(),
            has_index.then_some(order),
            "column {}",
            descr.path()
        );
    }
}

/// Rows selected through the page index of `path` read as the same rows of `all`: runs of
/// a row to a few pages, across row groups; and, where the first column has a column index,
/// the pages whose minimum and maximum may hold a value of it (as a reader prunes), which
/// must hold every row of that value.
fn assert_selections(path: &Path, meta: &ParquetMetaData, all: &RecordBatch) {
    let mut rng = Rng(all.num_rows() as u64 * 0x9e37_79b9 + 1);
    let mut runs = vec![];
    let mut at = 0;
    while at < all.num_rows() {
        let longest = if rng.below(2) == 0 { 8 } else { 300 };
        let n = (1 + rng.below(longest) as usize).min(all.num_rows() - at);
        runs.push(if runs.len() % 2 == 0 {
            RowSelector::skip(n)
        } else {
            RowSelector::select(n)
        });
        at += n;
    }
    assert_eq!(read(path, Some(runs.clone())).columns(), selected(all, &runs).columns());

    let Some(values) = keys(all.column(0).as_ref()) else {
        return;
    };
    for probe in [0, all.num_rows() / 3, all.num_rows() - 1] {
        let Some(x) = values[probe].clone() else { continue };
        let mut pruned = vec![];
        for g in 0..meta.num_row_groups() {
            let index = column_index(meta, g, 0);
            if matches!(index, ColumnIndexMetaData::NONE) {
                return;
            }
            for (i, p) in page_rows(meta, g, 0).into_iter().enumerate() {
                let may_hold = index_min_max(index, i).is_some_and(|(min, max)| min <= x && x <= max);
                pruned.push(if may_hold {
                    RowSelector::select(p.len())
                } else {
                    RowSelector::skip(p.len())
                });
            }
        }
        let got = read(path, Some(pruned.clone()));
        assert_eq!(got.columns(), selected(all, &pruned).columns());
        let count = |v: &[Option<Key>]| v.iter().filter(|v| v.as_ref() == Some(&x)).count();
        assert_eq!(
            count(&keys(got.column(0).as_ref()).unwrap()),
            count(&values),
            "rows of {x:?} pruned"
        );
    }
}

/// The leaf descriptors of `schema`.
fn leaves(schema: &Schema) -> Vec<ColumnDescPtr> {
    let descr = ArrowSchemaConverter::new().convert(schema).unwrap();
    (0..descr.num_columns()).map(|i| descr.column(i)).collect()
}

/// Whether the encoder takes each leaf of `schema` under `props`.
fn taken(schema: &Schema, props: &WriterProperties) -> Vec<bool> {
    let descr = ArrowSchemaConverter::new().convert(schema).unwrap();
    (0..descr.num_columns())
        .map(|c| encodes(schema.field(descr.get_column_root_idx(c)), &descr.column(c), props))
        .collect()
}

#[test]
fn encodes_flat_columns_of_its_types() {
    // The types the encoder takes; then others: written as FIXED_LEN_BYTE_ARRAY, or as INT32
    // and INT64 of other logical types, or not integers nor byte arrays.
    let encoded = "Int32; Date32; Int64; Decimal128(9, 2); Decimal128(15, 2); Decimal128(18, 0); Utf8; LargeUtf8; \
                 Utf8View; Binary; LargeBinary; BinaryView";
    let others = "Decimal128(19, 2); Decimal128(38, 10); Int8; Int16; UInt32; UInt64; Date64; \
                  Timestamp(µs); Float64; Boolean; FixedSizeBinary(4); Dictionary(Int32, Utf8)";
    let parse = |list: &str, takes: bool| -> Vec<(DataType, bool)> {
        list.split("; ").map(|t| (t.parse().unwrap(), takes)).collect()
    };
    let types = [parse(encoded, true), parse(others, false)].concat();
    assert_eq!(types.len(), 24);
    let props = WriterProperties::builder().build();
    for nullable in [true, false] {
        let fields: Vec<Field> = types
            .iter()
            .enumerate()
            .map(|(i, (t, _))| Field::new(format!("c{i}"), t.clone(), nullable))
            .collect();
        let want: Vec<bool> = types.iter().map(|(_, takes)| *takes).collect();
        assert_eq!(taken(&Schema::new(fields), &props), want, "nullable: {nullable}");
    }
    // Leaves of nested columns are not flat.
    let nested = Schema::new(vec![
        Field::new(
            "list",
            DataType::List(Arc::new(Field::new_list_field(DataType::Int32, true))),
            true,
        ),
        Field::new(
            "st",
            DataType::Struct(vec![Field::new("x", DataType::Int64, true)].into()),
            true,
        ),
    ]);
    assert_eq!(taken(&nested, &props), [false, false]);
}

#[test]
fn encodes_under_the_properties_it_follows_only() {
    let schema = Schema::new(vec![
        Field::new("a", DataType::Int64, true),
        Field::new("b", DataType::Utf8View, false),
    ]);
    let a = ColumnPath::from("a");
    let under = |props: WriterPropertiesBuilder| taken(&schema, &props.build());
    let all = vec![true, true];
    // What the encoder follows: dictionaries on or off, statistics, sizes, truncation.
    assert_eq!(under(WriterProperties::builder().set_dictionary_enabled(false)), all);
    assert_eq!(
        under(WriterProperties::builder().set_statistics_enabled(EnabledStatistics::None)),
        all
    );
    assert_eq!(
        under(WriterProperties::builder().set_statistics_enabled(EnabledStatistics::Chunk)),
        all
    );
    assert_eq!(
        under(
            WriterProperties::builder()
                .set_data_page_size_limit(100)
                .set_data_page_row_count_limit(3)
                .set_column_index_truncate_length(None)
                .set_offset_index_disabled(true)
        ),
        all
    );
    // What it does not: the column with a bloom filter or a chosen encoding, or every column.
    assert_eq!(
        under(WriterProperties::builder().set_column_bloom_filter_enabled(a.clone(), true)),
        [false, true]
    );
    assert_eq!(
        under(WriterProperties::builder().set_column_encoding(a.clone(), Encoding::DELTA_BINARY_PACKED)),
        [false, true]
    );
    assert_eq!(
        under(WriterProperties::builder().set_bloom_filter_enabled(true)),
        [false, false]
    );
    assert_eq!(
        under(WriterProperties::builder().set_encoding(Encoding::PLAIN)),
        [false, false]
    );
    assert_eq!(
        under(WriterProperties::builder().set_writer_version(WriterVersion::PARQUET_2_0)),
        [false, false]
    );
    assert_eq!(
        under(WriterProperties::builder().set_write_page_header_statistics(true)),
        [false, false]
    );
    assert_eq!(
        under(WriterProperties::builder().set_column_write_page_header_statistics(a, true)),
        [false, true]
    );
    assert_eq!(
        under(WriterProperties::builder().set_content_defined_chunking(Some(Default::default()))),
        [false, false]
    );
}

#[test]
fn encode_refuses_arrays_it_does_not_read() {
    let schema = Schema::new(vec![
        Field::new("a", DataType::Int32, true),
        Field::new("s", DataType::Utf8, true),
    ]);
    let leaves = leaves(&schema);
    let props = WriterProperties::builder().build();
    let int64: ArrayRef = Arc::new(Int64Array::from(vec![1, 2]));
    let float: ArrayRef = Arc::new(Float64Array::from(vec![1.0]));
    let ints: ArrayRef = Arc::new(Int32Array::from(vec![Some(1), None]));
    for (leaf, arrays) in [(0, vec![Arc::clone(&ints), int64]), (0, vec![float]), (1, vec![ints])] {
        let err = encode(&arrays, &leaves[leaf], &props).unwrap_err().to_string();
        assert!(err.contains("does not write"), "{err}");
    }
}

/// `n` rows of integer, date and decimal columns: sorted and random, with extremes, some,
/// no and all nulls.
fn integer_columns(n: usize) -> Vec<(Field, ArrayRef)> {
    let mut rng = Rng(0x2545_f491_4f6c_dd1d);
    let r = &mut rng;
    let decimal = |v: Vec<Option<i128>>, p: u8| Decimal128Array::from(v).with_precision_and_scale(p, 2).unwrap();
    let sorted_edges = |i: usize| match i {
        0 => i64::MIN,
        1 => i64::MIN + 1,
        _ if i == n - 1 => i64::MAX,
        _ => i as i64 / 3 - 500,
    };
    vec![
        col("k", false, Int64Array::from_iter_values((0..n).map(sorted_edges))),
        col("i32", true, Int32Array::from(rows(r, n, 10, |r, _| extreme_i32(r)))),
        col(
            "i32_runs",
            true,
            Int32Array::from(rows(r, n, 0, |_, i| (i / 40) as i32 - 30)),
        ),
        col(
            "i32_req",
            false,
            Int32Array::from_iter_values((0..n).map(|_| r.below(50) as i32 - 25)),
        ),
        col(
            "date",
            true,
            Date32Array::from(rows(r, n, 5, |_, i| 18_000 + (i / 50) as i32)),
        ),
        col("i64", true, Int64Array::from(rows(r, n, 30, |r, _| extreme_i64(r)))),
        col(
            "dec15",
            true,
            decimal(
                rows(r, n, 10, |r, _| {
                    let edge = rng_edge(r, 10i128.pow(15) - 1);
                    edge.unwrap_or((r.next() % 10u64.pow(15)) as i128 - 5 * 10i128.pow(14))
                }),
                15,
            ),
        ),
        col(
            "dec9",
            false,
            decimal(rows(r, n, 0, |_, i| -999_999_999 + (i as i128 / 7) * 700_001), 9),
        ),
        col("none", true, Int32Array::from(rows(r, n, 100, |_, i| i as i32))),
        col("none64", true, Int64Array::from(rows(r, n, 100, |_, i| i as i64))),
    ]
}

/// A fifth of the time, one of `-max, -1, 0, 1, max`.
fn rng_edge(rng: &mut Rng, max: i128) -> Option<i128> {
    (rng.below(5) == 0).then(|| rng.pick(&[-max, -1, 0, 1, max]))
}

#[tokio::test(flavor = "multi_thread")]
async fn integers_dates_and_decimals_read_back_as_the_parquet_crates() {
    let properties = WriterProperties::builder()
        .set_data_page_size_limit(512)
        .set_write_batch_size(64)
        .set_dictionary_page_size_limit(1024);
    let written = check(&Case::new(integer_columns(4000), 1500, properties)).await;
    let meta = &written.actual_meta;
    assert_eq!(meta.num_row_groups(), 3);
    assert!(written.pages > 3 * 10 * 4, "{} pages", written.pages);
    for g in 0..meta.num_row_groups() {
        // The sorted columns' pages ascend.
        for c in [0, 2, 4, 7] {
            assert_eq!(
                written.column_index(g, c).get_boundary_order(),
                Some(BoundaryOrder::ASCENDING)
            );
        }
        // All-null pages.
        assert!(written.column_index(g, 8).is_null_page(0));
    }
    // The extremes are the chunk's statistics.
    let stats = meta.row_group(0).column(0).statistics().unwrap();
    assert_eq!(stats.min_bytes_opt(), Some(&i64::MIN.to_le_bytes()[..]));
    let stats = meta.row_group(2).column(0).statistics().unwrap();
    assert_eq!(stats.max_bytes_opt(), Some(&i64::MAX.to_le_bytes()[..]));
}

/// `n` rows of string and binary columns of every type the encoder takes: sorted and random,
/// short (inline views) and long, empty, with multi-byte characters and 0xff bytes past the
/// 64 bytes where statistics are cut, and some, no and all nulls.
fn byte_array_columns(n: usize) -> Vec<(Field, ArrayRef)> {
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let r = &mut rng;
    let mut sorted: Vec<String> = (0..n).map(|_| text(r, 100)).collect();
    sorted.sort();
    let views = |v: Vec<Option<String>>| StringViewArray::from_iter(v);
    vec![
        col("s", false, StringViewArray::from_iter_values(sorted)),
        col("view", true, views(rows(r, n, 10, |r, _| text(r, 100)))),
        col("short", true, views(rows(r, n, 20, |r, _| text(r, 12)))),
        as_field_type(
            col("utf8_views", true, views(rows(r, n, 10, |r, _| text(r, 80)))),
            DataType::Utf8,
        ),
        col("utf8", true, StringArray::from(rows(r, n, 0, |r, _| text(r, 70)))),
        col(
            "large",
            true,
            LargeStringArray::from(rows(r, n, 50, |r, _| text(r, 100))),
        ),
        col("empty", true, StringArray::from(rows(r, n, 30, |_, _| String::new()))),
        col("none", true, views(rows(r, n, 100, |r, _| text(r, 20)))),
        col("bin", true, BinaryArray::from_iter(rows(r, n, 10, |r, _| bytes(r, 90)))),
        as_field_type(
            col(
                "large_bin",
                true,
                BinaryViewArray::from_iter(rows(r, n, 10, |r, _| bytes(r, 90))),
            ),
            DataType::LargeBinary,
        ),
        col(
            "large_bin2",
            false,
            LargeBinaryArray::from_iter_values((0..n).map(|_| bytes(r, 70))),
        ),
        col(
            "binview",
            false,
            BinaryViewArray::from_iter_values((0..n).map(|_| bytes(r, 20))),
        ),
    ]
}

#[tokio::test(flavor = "multi_thread")]
async fn strings_and_binary_read_back_as_the_parquet_crates() {
    let properties = WriterProperties::builder()
        .set_data_page_size_limit(2048)
        .set_write_batch_size(50)
        .set_dictionary_page_size_limit(8192);
    let mut case = Case::new(byte_array_columns(3000), 1100, properties);
    case.codec = "uncompressed";
    let written = check(&case).await;
    let meta = &written.actual_meta;
    assert_eq!(meta.num_row_groups(), 3);
    for g in 0..meta.num_row_groups() {
        assert!(meta.row_group(g).column(0).compression() == parquet::basic::Compression::UNCOMPRESSED);
        assert_eq!(
            written.column_index(g, 0).get_boundary_order(),
            Some(BoundaryOrder::ASCENDING)
        );
        assert!(written.column_index(g, 7).is_null_page(0));
    }
}

/// Values at the edges of cutting a minimum or maximum to 64 bytes (and to fewer).
fn cut_edges() -> (Vec<String>, Vec<Vec<u8>>) {
    let a = |n: usize| "a".repeat(n);
    let strings = vec![
        String::new(),
        "a".into(),
        a(64),
        a(65),
        // Characters of 2, 3 and 4 bytes across the 64th byte, or ending at it.
        a(63) + "é" + "b",
        a(62) + "€" + "x",
        a(61) + "𝄞" + "x",
        a(60) + "𝄞" + "x",
        "é".repeat(40),
        "€".repeat(30),
        // Last characters with no successor of their width: an earlier one is raised.
        "z".repeat(63) + &"\u{7f}".repeat(5),
        "\u{7f}".repeat(70),
        "\u{d7ff}".repeat(25),
        "\u{10ffff}".repeat(20),
        "𝄞".repeat(17),
        "\u{ffff}".repeat(23),
    ];
    let ff = |n: usize| vec![0xffu8; n];
    let binary = vec![
        vec![],
        vec![0],
        vec![0; 70],
        [vec![1], ff(69)].concat(),
        [vec![0xfe], ff(63), vec![0; 6]].concat(),
        [vec![7; 62], vec![0xfe, 0xff, 0xff]].concat(),
        [ff(64), vec![1]].concat(),
        ff(65),
        ff(70),
        vec![0x80; 66],
    ];
    (strings, binary)
}

#[tokio::test(flavor = "multi_thread")]
async fn long_values_are_cut_in_the_page_index_as_the_parquet_crate_cuts_them() {
    let (strings, binary) = cut_edges();
    let n = 960;
    let mut rng = Rng(77);
    let r = &mut rng;
    // Sorted runs (each value the minimum and maximum of pages) and random order.
    let mut sorted_strings: Vec<&String> = (0..n).map(|i| &strings[i * strings.len() / n]).collect();
    sorted_strings.sort();
    let mut sorted_binary: Vec<&Vec<u8>> = (0..n).map(|i| &binary[i * binary.len() / n]).collect();
    sorted_binary.sort();
    let (string, blob) = (|r: &mut Rng, _| r.pick(&strings), |r: &mut Rng, _| r.pick(&binary));
    let columns = vec![
        col("s", false, StringArray::from_iter_values(sorted_strings)),
        col("view", true, StringViewArray::from(rows(r, n, 10, string))),
        col("large", true, LargeStringArray::from(rows(r, n, 0, string))),
        col("bin", false, BinaryArray::from_iter_values(sorted_binary)),
        col("binview", true, BinaryViewArray::from_iter(rows(r, n, 10, blob))),
        col("large_bin", true, LargeBinaryArray::from_iter(rows(r, n, 0, blob))),
    ];
    // Pages of 8 rows, cut alike by both encoders: every page's entry is compared with the
    // reference's too.
    for (index_length, statistics_length) in [
        (Some(64), Some(64)),
        (Some(5), Some(2)),
        (Some(1), Some(1)),
        (None, None),
    ] {
        let properties = WriterProperties::builder()
            .set_data_page_row_count_limit(8)
            .set_write_batch_size(8)
            .set_column_index_truncate_length(index_length)
            .set_statistics_truncate_length(statistics_length);
        let mut case = Case::new(columns.clone(), 320, properties);
        case.batch_rows = vec![64, 8, 200];
        let written = check(&case).await;
        assert_eq!(written.same_pages, written.pages, "cut at {index_length:?}");
        assert_eq!(written.pages, 6 * n / 8);
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn statistics_none_chunk_and_page_read_back_as_the_parquet_crates() {
    let mut columns = integer_columns(1500);
    columns.truncate(6);
    columns.extend(byte_array_columns(1500).into_iter().skip(1).take(5));
    let base = || {
        WriterProperties::builder()
            .set_data_page_size_limit(1000)
            .set_write_batch_size(100)
    };
    let all = |statistics| base().set_statistics_enabled(statistics);
    let configurations = [
        all(EnabledStatistics::None),
        all(EnabledStatistics::Chunk),
        all(EnabledStatistics::Page),
        // Per column, over the default (pages).
        base()
            .set_column_statistics_enabled(ColumnPath::from("i32"), EnabledStatistics::None)
            .set_column_statistics_enabled(ColumnPath::from("view"), EnabledStatistics::Chunk),
        // No offset index (statistics of pages set for every column keep it).
        all(EnabledStatistics::Chunk).set_offset_index_disabled(true),
        all(EnabledStatistics::Page).set_offset_index_disabled(true),
        base().set_offset_index_disabled(true),
    ];
    for properties in configurations {
        let props = properties.clone().build();
        let written = check(&Case::new(columns.clone(), 700, properties)).await;
        let meta = &written.actual_meta;
        assert_eq!(meta.offset_index().is_some(), !props.offset_index_disabled());
        for g in 0..meta.num_row_groups() {
            for (c, chunk) in meta.row_group(g).columns().iter().enumerate() {
                let statistics = props.statistics_enabled(chunk.column_path());
                assert_eq!(chunk.statistics().is_some(), statistics != EnabledStatistics::None);
                let index = !matches!(written.column_index(g, c), ColumnIndexMetaData::NONE);
                let readable = statistics == EnabledStatistics::Page && meta.offset_index().is_some();
                assert_eq!(index, readable, "column {}", chunk.column_path());
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn dictionaries_fall_back_to_plain_as_the_parquet_crates_do() {
    let n = 3000;
    let mut rng = Rng(5);
    let r = &mut rng;
    let columns = vec![
        col(
            "low",
            false,
            StringArray::from_iter_values((0..n).map(|i| format!("cat{}", i % 5))),
        ),
        col(
            "low_int",
            true,
            Int32Array::from(rows(r, n, 10, |r, _| r.below(10) as i32)),
        ),
        col(
            "high",
            true,
            StringViewArray::from(rows(r, n, 5, |r, _| format!("{:020}", r.next()))),
        ),
        col(
            "high_int",
            false,
            Int64Array::from_iter_values((0..n).map(|_| r.next() as i64)),
        ),
        col("plain", true, Int32Array::from(rows(r, n, 5, |r, _| r.below(3) as i32))),
        col(
            "plain_s",
            false,
            BinaryArray::from_iter_values((0..n).map(|i| [i as u8 % 4])),
        ),
        // One value: indices of no bits.
        col("one", true, Int64Array::from(rows(r, n, 5, |_, _| -7))),
        col(
            "one_s",
            false,
            StringArray::from_iter_values((0..n).map(|_| "x".repeat(70))),
        ),
    ];
    let (dictionary, fallback, plain) = (
        vec![
            (PageType::DICTIONARY_PAGE, Encoding::PLAIN),
            (PageType::DATA_PAGE, Encoding::RLE_DICTIONARY),
        ],
        vec![
            (PageType::DICTIONARY_PAGE, Encoding::PLAIN),
            (PageType::DATA_PAGE, Encoding::RLE_DICTIONARY),
            (PageType::DATA_PAGE, Encoding::PLAIN),
        ],
        vec![(PageType::DATA_PAGE, Encoding::PLAIN)],
    );
    for enabled in [true, false] {
        let properties = WriterProperties::builder()
            .set_dictionary_enabled(enabled)
            .set_dictionary_page_size_limit(2048)
            .set_data_page_size_limit(1024)
            .set_column_dictionary_enabled(ColumnPath::from("plain"), false)
            .set_column_dictionary_enabled(ColumnPath::from("plain_s"), false);
        let written = check(&Case::new(columns.clone(), 1500, properties)).await;
        for g in 0..2 {
            let want = if enabled {
                [
                    &dictionary,
                    &dictionary,
                    &fallback,
                    &fallback,
                    &plain,
                    &plain,
                    &dictionary,
                    &dictionary,
                ]
            } else {
                [&plain; 8]
            };
            for (c, want) in want.into_iter().enumerate() {
                assert_eq!(&written.encodings(g, c), want, "row group {g} column {c}");
            }
        }
        let reference = &written.expected_meta;
        assert_eq!(encoding_runs(reference.row_group(0).column(2)), written.encodings(0, 2));
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn columns_the_encoder_does_not_take_share_row_groups_with_its_own() {
    let n = 2000;
    let mut rng = Rng(99);
    let r = &mut rng;
    let list = ListArray::from_iter_primitive::<Int32Type, _, _>(rows(r, n, 10, |r, i| {
        (0..i % 4)
            .map(|k| (k != 2).then_some(r.next() as i32))
            .collect::<Vec<_>>()
    }));
    let fields = vec![
        Field::new("x", DataType::Int64, true),
        Field::new("y", DataType::Utf8, true),
    ];
    let st = StructArray::new(
        fields.into(),
        vec![
            Arc::new(Int64Array::from(rows(r, n, 10, |r, _| r.next() as i64))),
            Arc::new(StringArray::from(rows(r, n, 10, |r, _| text(r, 30)))),
        ],
        None,
    );
    let dictionary: DictionaryArray<Int32Type> =
        rows(r, n, 10, |r, _| r.pick(&["x", "yy", "zzz"])).into_iter().collect();
    let columns = vec![
        col("k", false, Int32Array::from_iter_values(0..n as i32)),
        col(
            "f",
            true,
            Float64Array::from(rows(r, n, 10, |r, _| r.next() as f64 / 3.0)),
        ),
        col("b", true, BooleanArray::from(rows(r, n, 10, |r, _| r.below(2) == 0))),
        col(
            "dec38",
            true,
            Decimal128Array::from(rows(r, n, 10, |r, _| r.next() as i128 * 1000))
                .with_precision_and_scale(38, 3)
                .unwrap(),
        ),
        col("list", true, list),
        col("st", true, st),
        col("dict", true, dictionary),
        col(
            "bloom",
            true,
            Int32Array::from(rows(r, n, 10, |r, _| r.below(100) as i32)),
        ),
        col("s", true, StringViewArray::from(rows(r, n, 10, |r, _| text(r, 80)))),
        col("i64", true, Int64Array::from(rows(r, n, 10, |r, _| extreme_i64(r)))),
    ];
    let properties = WriterProperties::builder()
        .set_data_page_size_limit(1024)
        .set_write_batch_size(100)
        .set_column_bloom_filter_enabled(ColumnPath::from("bloom"), true);
    let case = Case::new(columns, 800, properties);
    let takes = taken(&case.schema(), &case.properties.clone().build());
    // k, s and i64 are gpusort's; the rest (the list's and the struct's leaves included) the
    // Parquet crate's.
    let leaves = leaves(&case.schema());
    let mine: Vec<bool> = leaves.iter().map(|d| ["k", "s", "i64"].contains(&d.name())).collect();
    assert_eq!((takes.len(), takes), (11, mine));
    let written = check(&case).await;
    let bloom = leaves.iter().position(|d| d.name() == "bloom").unwrap();
    for g in 0..written.actual_meta.num_row_groups() {
        assert!(
            written
                .actual_meta
                .row_group(g)
                .column(bloom)
                .bloom_filter_offset()
                .is_some()
        );
    }
    // The bloom filter reads back and holds the row group's values.
    let properties = ReaderProperties::builder().set_read_bloom_filter(true).build();
    let options = ReadOptionsBuilder::new().with_reader_properties(properties).build();
    let reader = SerializedFileReader::new_with_options(File::open(&written.actual).unwrap(), options).unwrap();
    let group = reader.get_row_group(0).unwrap();
    let filter = group.get_column_bloom_filter(bloom).expect("a bloom filter");
    let field = case.columns.iter().position(|(f, _)| f.name() == "bloom").unwrap();
    let values = case.columns[field].1.slice(0, 800);
    assert!(
        values
            .as_primitive::<Int32Type>()
            .iter()
            .flatten()
            .all(|v| filter.check(&v))
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn pages_of_one_row_and_row_groups_of_a_few() {
    let mut rng = Rng(3);
    let r = &mut rng;
    let n = 37;
    let columns = vec![
        col("k", false, Int32Array::from_iter_values((0..n as i32).map(|i| i / 2))),
        col("i64", true, Int64Array::from(rows(r, n, 30, |r, _| extreme_i64(r)))),
        col("s", true, StringViewArray::from(rows(r, n, 30, |r, _| text(r, 70)))),
        col("b", true, BinaryArray::from_iter(rows(r, n, 30, |r, _| bytes(r, 70)))),
    ];
    let properties = WriterProperties::builder()
        .set_data_page_row_count_limit(1)
        .set_write_batch_size(1)
        .set_dictionary_page_size_limit(16);
    let mut case = Case::new(columns, 5, properties);
    case.batch_rows = vec![3, 1, 7];
    let written = check(&case).await;
    assert_eq!(written.actual_meta.num_row_groups(), 8);
    assert_eq!(written.pages, 4 * n);
    assert_eq!(written.same_pages, written.pages);
}

#[tokio::test(flavor = "multi_thread")]
async fn dictionaries_of_more_than_65536_values() {
    // Distinct values in one chunk: dictionary indices of 17 bits.
    let n = 70_000;
    let scattered = (0..n as i32).map(|i| i.wrapping_mul(0x9e37_79b1_u32 as i32));
    let hex = rows(&mut Rng(11), n, 1, |_, i| format!("{i:x}"));
    let columns = vec![
        col("k", false, Int32Array::from_iter_values(scattered)),
        col("s", true, StringViewArray::from(hex)),
    ];
    let mut case = Case::new(columns, n, WriterProperties::builder());
    case.batch_rows = vec![n];
    let written = check(&case).await;
    let dictionary = (PageType::DICTIONARY_PAGE, Encoding::PLAIN);
    let indices = (PageType::DATA_PAGE, Encoding::RLE_DICTIONARY);
    assert_eq!(written.encodings(0, 0), [dictionary, indices]);
    assert_eq!(written.encodings(0, 1), [dictionary, indices]);
}
