//! The pages of a Parquet column chunk as the file stores them, still compressed: the input
//! of a decoder that decompresses and decodes pages elsewhere than the Parquet crate's reader
//! does (the GPU: nvCOMP decompresses a batch of pages in one call and kernels decode them,
//! issue 20's reading phase; see `crates/gpusort-cuda/kernels/NOTES.md`, "Parquet decode on
//! the GPU: the plan").
//!
//! [`column_chunk_pages`] walks a chunk with the Parquet crate's page reader (its headers,
//! page index and encryption checks) told that the chunk is uncompressed, so that each page
//! comes back as stored. What a decoder needs that the page then no longer says, the size of
//! its values decompressed, is read from the page's header (its first fields, which every
//! writer writes first), else from the compressed bytes themselves: snappy and zstd frames
//! may begin with it ([`uncompressed_size`]).

use std::sync::Arc;

use bytes::Bytes;
use parquet::basic::{Compression, Encoding, Type as PhysicalType};
use parquet::column::page::{Page, PageReader};
use parquet::errors::{ParquetError, Result};
use parquet::file::metadata::ColumnChunkMetaData;
use parquet::file::serialized_reader::SerializedPageReader;

/// What a stored page holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PageKind {
    /// The chunk's dictionary (plain-encoded values).
    Dictionary,
    /// Data page v1: levels and values, compressed together.
    DataV1,
    /// Data page v2: levels uncompressed first (`levels_bytes` of them), then the values,
    /// compressed where `compressed` says.
    DataV2,
}

/// One page as the file stores it.
#[derive(Debug, Clone)]
pub struct StoredPage {
    pub kind: PageKind,
    /// The page's bytes past its header: the levels of a v2 page, then the (compressed) rest.
    pub bytes: Bytes,
    /// Bytes of v2 levels at the front of `bytes`, never compressed (0 for other pages).
    pub levels_bytes: usize,
    /// Whether the bytes past the levels are compressed with the chunk's codec.
    pub compressed: bool,
    /// Bytes the compressed part has decompressed, where its format says (snappy, zstd with
    /// a content size, or not compressed); `None` for codecs that do not.
    pub uncompressed_bytes: Option<usize>,
    /// Values in the page (nulls included; a dictionary's entries).
    pub num_values: usize,
    /// The encoding of the values (of the entries, for a dictionary).
    pub encoding: Encoding,
}

impl StoredPage {
    /// A page compressed whole with the chunk's `codec` (a dictionary or a data page v1).
    fn whole(kind: PageKind, codec: Compression, bytes: Bytes, num_values: u32, encoding: Encoding) -> Self {
        Self {
            kind,
            uncompressed_bytes: uncompressed_size(codec, &bytes),
            bytes,
            levels_bytes: 0,
            compressed: codec != Compression::UNCOMPRESSED,
            num_values: num_values as usize,
            encoding,
        }
    }
}

impl StoredPage {
    /// A data page v2: `levels_bytes` of levels, never compressed, then its values,
    /// `compressed` with the chunk's `codec` or not.
    fn v2(
        codec: Compression,
        bytes: Bytes,
        levels_bytes: usize,
        compressed: bool,
        num_values: u32,
        encoding: Encoding,
    ) -> Result<Self> {
        let Some(values) = bytes.get(levels_bytes..) else {
            return Err(ParquetError::General(format!(
                "a data page v2 of {} bytes with {levels_bytes} bytes of levels",
                bytes.len()
            )));
        };
        Ok(Self {
            kind: PageKind::DataV2,
            uncompressed_bytes: match compressed {
                true => uncompressed_size(codec, values),
                false => Some(values.len()),
            },
            levels_bytes,
            compressed,
            num_values: num_values as usize,
            encoding,
            bytes,
        })
    }
}

/// The stored pages of one column chunk.
#[derive(Debug, Clone)]
pub struct ColumnChunkPages {
    pub codec: Compression,
    pub physical_type: PhysicalType,
    pub dictionary: Option<StoredPage>,
    pub data: Vec<StoredPage>,
}

impl ColumnChunkPages {
    /// Values in the data pages, nulls included.
    pub fn num_values(&self) -> usize {
        self.data.iter().map(|p| p.num_values).sum()
    }
}

/// The pages of the column chunk `meta` describes (of a row group of `rows` rows) in `file`
/// (the whole file's bytes), each as stored.
pub fn column_chunk_pages(file: &Bytes, meta: &ColumnChunkMetaData, rows: usize) -> Result<ColumnChunkPages> {
    let codec = meta.compression();
    let stored = meta
        .clone()
        .into_builder()
        .set_compression(Compression::UNCOMPRESSED)
        .build()?;
    let mut pages = SerializedPageReader::new(Arc::new(file.clone()), &stored, rows, None)?;
    // Where the next page's header starts in `file`.
    let mut header_at = meta.byte_range().0 as usize;
    let mut out = ColumnChunkPages {
        codec,
        physical_type: meta.column_type(),
        dictionary: None,
        data: vec![],
    };
    while let Some(page) = pages.get_next_page()? {
        let mut page = match page {
            Page::DictionaryPage {
                buf,
                num_values,
                encoding,
                ..
            } => StoredPage::whole(PageKind::Dictionary, codec, buf, num_values, encoding),
            Page::DataPage {
                buf,
                num_values,
                encoding,
                ..
            } => StoredPage::whole(PageKind::DataV1, codec, buf, num_values, encoding),
            Page::DataPageV2 {
                buf,
                num_values,
                encoding,
                def_levels_byte_len,
                rep_levels_byte_len,
                is_compressed,
                ..
            } => {
                let levels_bytes = (def_levels_byte_len + rep_levels_byte_len) as usize;
                let compressed = codec != Compression::UNCOMPRESSED && is_compressed;
                StoredPage::v2(codec, buf, levels_bytes, compressed, num_values, encoding)?
            }
        };
        // The page's bytes are a slice of `file` (the reader of `Bytes` does not copy): its
        // header is what lies between them and the page before.
        let at = (page.bytes.as_ptr() as usize).wrapping_sub(file.as_ptr() as usize);
        if let Some((plain, stored)) = file.get(header_at..at).and_then(header_sizes)
            && stored == page.bytes.len()
            && plain >= page.levels_bytes
        {
            page.uncompressed_bytes = Some(plain - page.levels_bytes);
        }
        header_at = at + page.bytes.len();
        match page.kind {
            PageKind::Dictionary if out.dictionary.is_some() || !out.data.is_empty() => {
                return Err(ParquetError::General(
                    "a dictionary page that is not the chunk's first page".into(),
                ));
            }
            PageKind::Dictionary => out.dictionary = Some(page),
            _ => out.data.push(page),
        }
    }
    Ok(out)
}

/// The size `compressed` (one page's bytes under `codec`) has decompressed, where its format
/// begins with it: snappy's length (a little-endian base-128 varint), zstd's frame content
/// size; the length itself when not compressed. `None` otherwise (other codecs, a zstd frame
/// without its size, bytes too short).
pub fn uncompressed_size(codec: Compression, compressed: &[u8]) -> Option<usize> {
    match codec {
        Compression::UNCOMPRESSED => Some(compressed.len()),
        Compression::SNAPPY => snappy_length(compressed),
        Compression::ZSTD(_) => zstd_content_size(compressed),
        _ => None,
    }
}

/// The sizes a page header gives, uncompressed and stored: its fields 2 and 3, after field 1
/// (the page's type), each a 32-bit integer of Thrift's compact protocol (a field header byte,
/// then a zigzag varint). `None` where the header does not begin so.
fn header_sizes(header: &[u8]) -> Option<(usize, usize)> {
    const I32: u8 = 5;
    let (mut at, mut id, mut fields) = (0, 0u8, [0i64; 3]);
    while id < 3 {
        let b = *header.get(at)?;
        let delta = b >> 4;
        if b & 0x0f != I32 || delta == 0 {
            return None;
        }
        id += delta;
        let (v, n) = varint(header.get(at + 1..)?)?;
        *fields.get_mut(usize::from(id) - 1)? = (v >> 1) as i64 ^ -((v & 1) as i64);
        at += 1 + n;
    }
    Some((usize::try_from(fields[1]).ok()?, usize::try_from(fields[2]).ok()?))
}

/// A little-endian base-128 varint of at most 10 bytes: its value and length.
fn varint(bytes: &[u8]) -> Option<(u64, usize)> {
    let mut value = 0u64;
    for (i, &b) in bytes.iter().take(10).enumerate() {
        value |= u64::from(b & 0x7f) << (7 * i);
        if b & 0x80 == 0 {
            return Some((value, i + 1));
        }
    }
    None
}

/// Snappy's preamble: the uncompressed length as a varint of at most 5 bytes (32 bits).
fn snappy_length(bytes: &[u8]) -> Option<usize> {
    let (value, _) = varint(&bytes[..bytes.len().min(5)])?;
    u32::try_from(value).ok().map(|v| v as usize)
}

/// A zstd frame's content size, from its frame header (RFC 8878, 3.1.1.1): the descriptor's
/// top two bits give the field's size (with the single-segment flag), after the window
/// descriptor and dictionary id when present.
fn zstd_content_size(bytes: &[u8]) -> Option<usize> {
    const MAGIC: [u8; 4] = [0x28, 0xb5, 0x2f, 0xfd];
    if bytes.len() < 5 || bytes[..4] != MAGIC {
        return None;
    }
    let descriptor = bytes[4];
    let single_segment = descriptor & 0x20 != 0;
    let dictionary_id_bytes = [0, 1, 2, 4][(descriptor & 0x03) as usize];
    let content_size_bytes = match descriptor >> 6 {
        0 if single_segment => 1,
        0 => return None,
        1 => 2,
        2 => 4,
        _ => 8,
    };
    let start = 5 + usize::from(!single_segment) + dictionary_id_bytes;
    let field = bytes.get(start..start + content_size_bytes)?;
    let mut le = [0u8; 8];
    le[..content_size_bytes].copy_from_slice(field);
    let size = u64::from_le_bytes(le) + if content_size_bytes == 2 { 256 } else { 0 };
    usize::try_from(size).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::{ArrayRef, Int32Array, Int64Array, RecordBatch, StringArray};
    use arrow::datatypes::{DataType, Field, Schema};
    use parquet::arrow::ArrowWriter;
    use parquet::basic::ZstdLevel;
    use parquet::file::properties::{WriterProperties, WriterVersion};
    use parquet::file::reader::{FileReader, SerializedFileReader};

    fn table(rows: usize) -> RecordBatch {
        let schema = Arc::new(Schema::new(vec![
            Field::new("i", DataType::Int64, false),
            Field::new("d", DataType::Int32, true),
            Field::new("s", DataType::Utf8, true),
        ]));
        let i: Int64Array = (0..rows as i64).map(|v| v * 7919 % 100_003).collect();
        let d: Int32Array = (0..rows).map(|v| (v % 9 != 4).then_some((v % 37) as i32)).collect();
        let s: StringArray = (0..rows)
            .map(|v| (v % 11 != 3).then(|| format!("value {} {}", v % 53, "x".repeat(v % 23))))
            .collect();
        let columns: Vec<ArrayRef> = vec![Arc::new(i), Arc::new(d), Arc::new(s)];
        RecordBatch::try_new(schema, columns).unwrap()
    }

    fn file(props: WriterProperties, batch: &RecordBatch) -> Bytes {
        let mut out = vec![];
        let mut w = ArrowWriter::try_new(&mut out, batch.schema(), Some(props)).unwrap();
        w.write(batch).unwrap();
        w.close().unwrap();
        Bytes::from(out)
    }

    /// The stored part of `page` decompressed (levels of a v2 page in front, as the Parquet
    /// crate's reader hands them out).
    fn decompressed(codec: Compression, page: &StoredPage) -> Vec<u8> {
        let (levels, rest) = page.bytes.split_at(page.levels_bytes);
        let mut out = levels.to_vec();
        match (page.compressed, codec) {
            (false, _) | (true, Compression::UNCOMPRESSED) => out.extend_from_slice(rest),
            (true, Compression::SNAPPY) => out.extend(snap::raw::Decoder::new().decompress_vec(rest).unwrap()),
            (true, Compression::ZSTD(_)) => out.extend(zstd::stream::decode_all(rest).unwrap()),
            (true, other) => panic!("{other} in the test"),
        }
        out
    }

    /// Every page as stored, decompressed here, equals what the Parquet crate's own reader
    /// decompresses, page for page, with the size the stored bytes announced; the data pages
    /// hold every row's value.
    #[test]
    fn stored_pages_decompress_to_the_parquet_crates_pages() {
        let batch = table(50_000);
        let codecs = [
            Compression::UNCOMPRESSED,
            Compression::SNAPPY,
            Compression::ZSTD(ZstdLevel::try_new(3).unwrap()),
        ];
        for codec in codecs {
            for version in [WriterVersion::PARQUET_1_0, WriterVersion::PARQUET_2_0] {
                for dictionary in [true, false] {
                    let props = WriterProperties::builder()
                        .set_compression(codec)
                        .set_writer_version(version)
                        .set_dictionary_enabled(dictionary)
                        .set_data_page_size_limit(16 << 10)
                        .set_max_row_group_row_count(Some(20_000))
                        .build();
                    let bytes = file(props, &batch);
                    let reader = SerializedFileReader::new(bytes.clone()).unwrap();
                    let what = format!("{codec}, {version:?}, dictionary {dictionary}");
                    let mut data_pages = 0;
                    for (g, group) in reader.metadata().row_groups().iter().enumerate() {
                        let rows = group.num_rows() as usize;
                        for (c, meta) in group.columns().iter().enumerate() {
                            let ours = column_chunk_pages(&bytes, meta, rows).unwrap();
                            // The file names the codec, not its level.
                            assert_eq!(std::mem::discriminant(&ours.codec), std::mem::discriminant(&codec));
                            assert_eq!(ours.num_values(), rows, "{what}");
                            let theirs: Vec<Page> = reader
                                .get_row_group(g)
                                .unwrap()
                                .get_column_page_reader(c)
                                .unwrap()
                                .map(|p| p.unwrap())
                                .collect();
                            let stored: Vec<&StoredPage> = ours.dictionary.iter().chain(&ours.data).collect();
                            assert_eq!(stored.len(), theirs.len(), "{what}");
                            assert_eq!(ours.dictionary.is_some(), dictionary, "{what}");
                            for (s, t) in stored.iter().zip(&theirs) {
                                let plain = decompressed(codec, s);
                                assert_eq!(plain, t.buffer().as_ref(), "{what}");
                                // From the header (the Parquet crate's zstd frames do not
                                // say their size).
                                assert_eq!(s.uncompressed_bytes, Some(plain.len() - s.levels_bytes), "{what}");
                                assert_eq!((s.num_values, s.encoding), (t.num_values() as usize, t.encoding()));
                                let kind = match t {
                                    Page::DictionaryPage { .. } => PageKind::Dictionary,
                                    Page::DataPage { .. } => PageKind::DataV1,
                                    Page::DataPageV2 { .. } => PageKind::DataV2,
                                };
                                assert_eq!(s.kind, kind, "{what}");
                                data_pages += usize::from(kind != PageKind::Dictionary);
                            }
                        }
                    }
                    // 16 KiB pages: several a chunk.
                    assert!(data_pages > 3 * 3, "{what}: {data_pages} data pages");
                }
            }
        }
    }

    #[test]
    fn sizes_read_from_the_compressed_bytes() {
        for len in [0usize, 1, 127, 128, 300, 16_383, 16_384, 1 << 20, 5_000_000] {
            let data: Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();
            let snappy = snap::raw::Encoder::new().compress_vec(&data).unwrap();
            assert_eq!(uncompressed_size(Compression::SNAPPY, &snappy), Some(len));
            let zstd = zstd::bulk::compress(&data, 1).unwrap();
            let codec = Compression::ZSTD(ZstdLevel::default());
            assert_eq!(uncompressed_size(codec, &zstd), Some(len), "zstd {len}");
            assert_eq!(uncompressed_size(Compression::UNCOMPRESSED, &data), Some(len));
        }
        // A page header: type 0 (data page), 1,000 bytes uncompressed, 300 stored, then more.
        assert_eq!(
            header_sizes(&[0x15, 0x00, 0x15, 0xd0, 0x0f, 0x15, 0xd8, 0x04, 0x2c]),
            Some((1000, 300))
        );
        assert_eq!(header_sizes(&[0x15, 0x00, 0x15, 0xd0]), None, "cut");
        assert_eq!(header_sizes(&[0x18, 0x00]), None, "not an i32");
        // A varint that does not end, a zstd frame without its size, a codec that says none.
        assert_eq!(snappy_length(&[0x80, 0x80]), None);
        assert_eq!(zstd_content_size(&[0x28, 0xb5, 0x2f, 0xfd, 0x00, 0x00]), None);
        assert_eq!(uncompressed_size(Compression::LZ4_RAW, &[1, 2, 3]), None);
    }
}
