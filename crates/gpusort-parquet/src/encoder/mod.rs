//! gpusort's own column chunk encoder, for the column types a sorted table is mostly made of:
//! 32- and 64-bit integers, dates, decimals of up to 18 digits, strings and binary (as views
//! or offsets), each top-level and flat, nullable or not. Every other column, and every column
//! under writer properties this encoder does not follow (a bloom filter, a chosen encoding,
//! data pages v2, statistics in page headers, content-defined chunking), is encoded by the
//! Parquet crate as before: [`encodes`] says which.
//!
//! It writes what the Parquet crate's writer writes, with its defaults: data pages v1 with
//! RLE definition levels; values dictionary encoded (the encodings the writer's properties name
//! for dictionary pages and their indices) until the dictionary reaches its limit, then plain;
//! chunk statistics,
//! a column index and an offset index, cut and raised alike (see `statistics.rs`). Pages are
//! left uncompressed for a [`crate::pages::PageCompressor`] to compress a row group at a time.
//!
//! It is faster than the Parquet crate's encoder because it is not general (see
//! `values.rs`'s doc): on TPC-H lineitem, encoding was two thirds of the writer's CPU time,
//! the larger part of it hashing and comparing values one by one through generic paths.

mod chunk;
mod rle;
mod statistics;
#[cfg(test)]
mod tests;
mod values;

use arrow::array::ArrayRef;
use arrow::datatypes::{DataType, Field};
use parquet::basic::Type as PhysicalType;
use parquet::errors::{ParquetError, Result};
use parquet::file::properties::{WriterProperties, WriterVersion};
use parquet::schema::types::ColumnDescPtr;

pub use chunk::EncodedChunk;
use values::{BytesEncoder, FixedEncoder};

/// Whether this encoder writes `field`'s column (`descr`, its only leaf) under `props`.
pub fn encodes(field: &Field, descr: &ColumnDescPtr, props: &WriterProperties) -> bool {
    let path = descr.path();
    let flat = descr.max_rep_level() == 0 && descr.max_def_level() <= 1 && descr.path().parts().len() == 1;
    let settings = props.writer_version() == WriterVersion::PARQUET_1_0
        && props.bloom_filter_properties(path).is_none()
        && props.encoding(path).is_none()
        && !props.write_page_header_statistics(path)
        && props.content_defined_chunking().is_none();
    flat && settings && reads(field.data_type(), descr.physical_type())
}

/// Whether arrays of `data_type` are read into values of `physical`.
fn reads(data_type: &DataType, physical: PhysicalType) -> bool {
    match physical {
        PhysicalType::INT32 => values::fixed_reads(data_type, 4),
        PhysicalType::INT64 => values::fixed_reads(data_type, 8),
        PhysicalType::BYTE_ARRAY => values::bytes_reads(data_type),
        _ => false,
    }
}

/// Encodes `arrays` (one column's slices of a row group, in order, all of one type) as a column
/// chunk of `descr` under `props`; the column must be one [`encodes`] takes.
pub fn encode(arrays: &[ArrayRef], descr: &ColumnDescPtr, props: &WriterProperties) -> Result<EncodedChunk> {
    let physical = descr.physical_type();
    if let Some(a) = arrays.iter().find(|a| !reads(a.data_type(), physical)) {
        return Err(ParquetError::General(format!(
            "column {}: gpusort's encoder does not write {} as {physical}",
            descr.path(),
            a.data_type()
        )));
    }
    let dictionary = props.dictionary_enabled(descr.path());
    match physical {
        PhysicalType::INT32 => chunk::encode_chunk(FixedEncoder::<i32>::new(dictionary), arrays, descr, props),
        PhysicalType::INT64 => chunk::encode_chunk(FixedEncoder::<i64>::new(dictionary), arrays, descr, props),
        _ => chunk::encode_chunk(BytesEncoder::new(dictionary), arrays, descr, props),
    }
}
