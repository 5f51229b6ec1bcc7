//! One column chunk, encoded: the driver that cuts the rows into data pages, writes each
//! page's definition levels and values, and gathers what the chunk's metadata, column index
//! and offset index say of its pages.
//!
//! A page ends at `data_page_row_count_limit` rows, or once its values take
//! `data_page_size_limit` bytes (looked at every `write_batch_size` rows), as the writer's
//! properties say. Values are dictionary encoded while the dictionary stays below
//! `dictionary_page_size_limit`; the page during which it reaches that ends there, and the
//! pages after it are plain encoded.

use std::cmp::Ordering;

use arrow::array::{Array, ArrayRef};
use bytes::Bytes;
use parquet::basic::{Encoding, PageType};
use parquet::column::page::Page;
use parquet::column::writer::ColumnCloseResult;
use parquet::errors::{ParquetError, Result};
use parquet::file::metadata::{
    ColumnChunkMetaData, ColumnIndexBuilder, LevelHistogram, OffsetIndexBuilder, PageEncodingStats,
};
use parquet::file::properties::{EnabledStatistics, WriterProperties};
use parquet::schema::types::ColumnDescPtr;

use super::rle;
use super::statistics::{chunk_statistics, truncate_max, truncate_min};
use super::values::{PageValues, ValueEncoder};

/// A column chunk's pages, uncompressed, in file order (the dictionary page first), and what
/// its column writer would have said of them: the metadata's page offsets and sizes, and the
/// offset index's, are those of the uncompressed pages written from offset 0, to be set where
/// the pages are compressed and placed (`crate::pages`).
#[derive(Debug)]
pub struct EncodedChunk {
    pub pages: Vec<Page>,
    pub close: ColumnCloseResult,
}

/// The state of the chunk as its pages are cut.
struct Chunk<'a> {
    descr: &'a ColumnDescPtr,
    props: &'a WriterProperties,
    statistics: EnabledStatistics,
    data_pages: Vec<Page>,
    encoding_stats: Vec<PageEncodingStats>,
    column_index: ColumnIndexBuilder,
    offset_index: Option<OffsetIndexBuilder>,
    /// The chunk's smallest and largest value (plain encoded), nulls and unencoded bytes.
    min_max: Option<(Vec<u8>, Vec<u8>)>,
    nulls: u64,
    rows: u64,
    unencoded_bytes: Option<i64>,
    /// Whether the non-null pages' minimums and maximums ascend (descend) so far.
    ascending: bool,
    descending: bool,
    last_min_max: Option<(Vec<u8>, Vec<u8>)>,
    /// The current page: its rows, nulls, and definition levels once one is 0.
    page_rows: usize,
    page_nulls: usize,
    page_levels: Option<Vec<u32>>,
}

/// Encodes `arrays` (one column's slices of a row group, in order) as one column chunk of
/// `descr` under `props` with `encoder`.
pub(super) fn encode_chunk<E: ValueEncoder>(
    mut encoder: E,
    arrays: &[ArrayRef],
    descr: &ColumnDescPtr,
    props: &WriterProperties,
) -> Result<EncodedChunk> {
    let path = descr.path();
    let statistics = props.statistics_enabled(path);
    let mut column_index = ColumnIndexBuilder::new(descr.physical_type());
    if statistics != EnabledStatistics::Page {
        column_index.to_invalid();
    }
    let mut chunk = Chunk {
        descr,
        props,
        statistics,
        data_pages: vec![],
        encoding_stats: vec![],
        column_index,
        offset_index: (!props.offset_index_disabled() || statistics == EnabledStatistics::Page)
            .then(OffsetIndexBuilder::new),
        min_max: None,
        nulls: 0,
        rows: 0,
        unencoded_bytes: None,
        ascending: true,
        descending: true,
        last_min_max: None,
        page_rows: 0,
        page_nulls: 0,
        page_levels: None,
    };
    let row_limit = props.data_page_row_count_limit().max(1);
    let byte_limit = props.column_data_page_size_limit(path);
    let dictionary_limit = props.column_dictionary_page_size_limit(path);
    let step = props.write_batch_size().max(1);
    for array in arrays {
        let mut offset = 0;
        while offset < array.len() {
            let len = step.min(array.len() - offset).min(row_limit - chunk.page_rows);
            chunk.add_levels(array.as_ref(), offset, len);
            encoder.put(array.as_ref(), offset, len);
            offset += len;
            let dictionary_full = encoder.dictionary_bytes().is_some_and(|b| b >= dictionary_limit);
            if chunk.page_rows >= row_limit || encoder.page_bytes() >= byte_limit || dictionary_full {
                chunk.flush_page::<E>(encoder.flush_page())?;
            }
            if dictionary_full {
                encoder.stop_dictionary();
            }
        }
    }
    if chunk.page_rows > 0 {
        chunk.flush_page::<E>(encoder.flush_page())?;
    }
    chunk.close(encoder.dictionary_page())
}

impl Chunk<'_> {
    /// Counts the rows and nulls of `array[offset..offset + len]` into the page, with their
    /// definition levels once the page has a null.
    fn add_levels(&mut self, array: &dyn Array, offset: usize, len: usize) {
        let nulls = array
            .nulls()
            .filter(|n| n.null_count() > 0)
            .map(|n| n.slice(offset, len));
        let null_count = nulls.as_ref().map_or(0, |n| n.null_count());
        if self.descr.max_def_level() > 0 {
            match (&mut self.page_levels, &nulls) {
                (None, Some(n)) if null_count > 0 => {
                    let mut levels = vec![1u32; self.page_rows];
                    levels.extend(n.iter().map(u32::from));
                    self.page_levels = Some(levels);
                }
                (Some(levels), Some(n)) => levels.extend(n.iter().map(u32::from)),
                (Some(levels), None) => levels.resize(levels.len() + len, 1),
                _ => {}
            }
        }
        self.page_rows += len;
        self.page_nulls += null_count;
    }

    /// Ends the current page with `values`.
    fn flush_page<E: ValueEncoder>(&mut self, values: PageValues) -> Result<()> {
        let (rows, nulls) = (self.page_rows, self.page_nulls);
        // A required column's page is its values as they are; a nullable one's, its levels first.
        let buf = if self.descr.max_def_level() > 0 {
            let mut levels = Vec::with_capacity(16);
            match self.page_levels.take() {
                Some(l) => rle::encode(&l, 1, &mut levels),
                None => rle::put_rle(1, rows, 1, &mut levels),
            }
            let mut buf = Vec::with_capacity(4 + levels.len() + values.bytes.len());
            buf.extend_from_slice(&(levels.len() as u32).to_le_bytes());
            buf.extend_from_slice(&levels);
            buf.extend_from_slice(&values.bytes);
            buf
        } else {
            values.bytes
        };
        let encoding = if values.dictionary {
            self.props.dictionary_data_page_encoding()
        } else {
            Encoding::PLAIN
        };
        self.data_pages.push(Page::DataPage {
            buf: Bytes::from(buf),
            num_values: u32::try_from(rows).map_err(|e| ParquetError::External(Box::new(e)))?,
            encoding,
            def_level_encoding: Encoding::RLE,
            rep_level_encoding: Encoding::RLE,
            statistics: None,
        });
        match self.encoding_stats.last_mut() {
            Some(s) if s.encoding == encoding => s.count += 1,
            _ => self.encoding_stats.push(PageEncodingStats {
                page_type: PageType::DATA_PAGE,
                encoding,
                count: 1,
            }),
        }
        self.index_page::<E>(rows, nulls, values.min_max.as_ref(), values.unencoded_bytes);
        self.merge_min_max::<E>(values.min_max);
        self.rows += rows as u64;
        self.nulls += nulls as u64;
        if let Some(b) = values.unencoded_bytes {
            *self.unencoded_bytes.get_or_insert(0) += b;
        }
        self.page_rows = 0;
        self.page_nulls = 0;
        Ok(())
    }

    /// The page's entries in the column and offset indexes.
    fn index_page<E: ValueEncoder>(
        &mut self,
        rows: usize,
        nulls: usize,
        min_max: Option<&(Vec<u8>, Vec<u8>)>,
        unencoded_bytes: Option<i64>,
    ) {
        if self.column_index.valid() {
            match min_max {
                None => self.column_index.append(true, vec![], vec![], nulls as i64),
                Some((min, max)) => {
                    if let Some((last_min, last_max)) = &self.last_min_max {
                        let greater = |a: &[u8], b: &[u8]| E::compare(a, b) == Ordering::Greater;
                        self.ascending &= !(greater(last_min, min) || greater(last_max, max));
                        self.descending &= !(greater(min, last_min) || greater(max, last_max));
                    }
                    self.last_min_max = Some((min.clone(), max.clone()));
                    let length = self.props.column_index_truncate_length();
                    let (min, max) = if self.descr.physical_type() == parquet::basic::Type::BYTE_ARRAY {
                        (
                            truncate_min(self.descr, length, min).0,
                            truncate_max(self.descr, length, max).0,
                        )
                    } else {
                        (min.clone(), max.clone())
                    };
                    self.column_index.append(false, min, max, nulls as i64);
                }
            }
            self.column_index
                .append_histograms(&None, &self.level_histogram(rows, nulls));
        }
        if let Some(index) = &mut self.offset_index {
            // Where the page is, and its size, are set where it is written compressed.
            index.append_offset_and_size(0, 0);
            index.append_row_count(rows as i64);
            index.append_unencoded_byte_array_data_bytes(unencoded_bytes);
        }
    }

    /// Definition levels 0 and 1 counted, where the column has them and statistics are kept.
    fn level_histogram(&self, rows: usize, nulls: usize) -> Option<LevelHistogram> {
        (self.descr.max_def_level() > 0 && self.statistics != EnabledStatistics::None)
            .then(|| LevelHistogram::from(vec![nulls as i64, (rows - nulls) as i64]))
    }

    fn merge_min_max<E: ValueEncoder>(&mut self, page: Option<(Vec<u8>, Vec<u8>)>) {
        let Some((min, max)) = page else { return };
        self.min_max = Some(match self.min_max.take() {
            None => (min, max),
            Some((a, b)) => (
                if E::compare(&min, &a) == Ordering::Less { min } else { a },
                if E::compare(&max, &b) == Ordering::Greater {
                    max
                } else {
                    b
                },
            ),
        });
    }

    /// The chunk's pages and what its writer says of them.
    fn close(mut self, dictionary: Option<(Vec<u8>, usize)>) -> Result<EncodedChunk> {
        let mut pages = Vec::with_capacity(self.data_pages.len() + 1);
        let mut encodings = vec![Encoding::RLE];
        if let Some((bytes, n)) = dictionary {
            let encoding = self.props.dictionary_page_encoding();
            pages.push(Page::DictionaryPage {
                buf: Bytes::from(bytes),
                num_values: u32::try_from(n).map_err(|e| ParquetError::External(Box::new(e)))?,
                encoding,
                is_sorted: false,
            });
            encodings.push(encoding);
            self.encoding_stats.insert(
                0,
                PageEncodingStats {
                    page_type: PageType::DICTIONARY_PAGE,
                    encoding,
                    count: 1,
                },
            );
        }
        encodings.extend(self.data_pages.iter().map(Page::encoding));
        pages.append(&mut self.data_pages);
        let size: i64 = pages.iter().map(|p| p.buffer().len() as i64).sum();
        let mut builder = ColumnChunkMetaData::builder(self.descr.clone())
            .set_compression(parquet::basic::Compression::UNCOMPRESSED)
            .set_encodings_mask(parquet::basic::EncodingMask::new_from_encodings(encodings.iter()))
            .set_page_encoding_stats(std::mem::take(&mut self.encoding_stats))
            .set_total_compressed_size(size)
            .set_total_uncompressed_size(size)
            .set_num_values(self.rows as i64)
            .set_data_page_offset(0)
            .set_dictionary_page_offset(None);
        if self.statistics != EnabledStatistics::None {
            let min_max = self.min_max.as_ref().map(|(a, b)| (a.as_slice(), b.as_slice()));
            let length = self.props.statistics_truncate_length();
            let histogram = self.level_histogram(self.rows as usize, self.nulls as usize);
            builder = builder
                .set_statistics(chunk_statistics(self.descr, min_max, self.nulls, length))
                .set_unencoded_byte_array_data_bytes(self.unencoded_bytes)
                .set_definition_level_histogram(histogram);
        }
        let mut column_index = self.column_index;
        column_index.set_boundary_order(match (self.ascending, self.descending) {
            (true, _) => parquet::basic::BoundaryOrder::ASCENDING,
            (false, true) => parquet::basic::BoundaryOrder::DESCENDING,
            (false, false) => parquet::basic::BoundaryOrder::UNORDERED,
        });
        let column_index = if column_index.valid() {
            Some(column_index.build()?)
        } else {
            None
        };
        Ok(EncodedChunk {
            pages,
            close: ColumnCloseResult {
                bytes_written: 0,
                rows_written: self.rows,
                metadata: builder.build()?,
                bloom_filter: None,
                column_index,
                offset_index: self.offset_index.map(OffsetIndexBuilder::build),
            },
        })
    }
}
