//! What the GPU decode benches share: the Parquet crate's reading of a file, the peer a user
//! has (a row group a task on every core, byte arrays as views as the GPU's are).

#![allow(dead_code)]

use std::sync::Arc;

use arrow::array::RecordBatch;
use arrow::datatypes::{DataType, Field, Schema};
use bytes::Bytes;
use parquet::arrow::arrow_reader::{ArrowReaderMetadata, ArrowReaderOptions, ParquetRecordBatchReaderBuilder};

/// Rows of the CPU reader's batches (the tool's DataFusion reads 8,192 by default; the larger
/// batch is the cheaper one here).
pub const CPU_BATCH_ROWS: usize = 65_536;

/// The metadata the CPU's readers share (read once, as the tool does): byte arrays as views.
pub fn cpu_metadata(file: &Bytes) -> ArrowReaderMetadata {
    let plain = ArrowReaderMetadata::load(file, ArrowReaderOptions::new()).unwrap();
    let fields: Vec<Field> = (plain.schema().fields().iter())
        .map(|f| match f.data_type() {
            DataType::Utf8 | DataType::LargeUtf8 => f.as_ref().clone().with_data_type(DataType::Utf8View),
            DataType::Binary | DataType::LargeBinary => f.as_ref().clone().with_data_type(DataType::BinaryView),
            _ => f.as_ref().clone(),
        })
        .collect();
    let options = ArrowReaderOptions::new().with_schema(Arc::new(Schema::new(fields)));
    ArrowReaderMetadata::try_new(Arc::clone(plain.metadata()), options).unwrap()
}

/// The row group `g` of `file` read by the Parquet crate, in batches.
pub fn cpu_row_group(file: &Bytes, meta: &ArrowReaderMetadata, g: usize) -> Vec<RecordBatch> {
    let reader = ParquetRecordBatchReaderBuilder::new_with_metadata(file.clone(), meta.clone())
        .with_row_groups(vec![g])
        .with_batch_size(CPU_BATCH_ROWS)
        .build()
        .unwrap();
    reader.map(|b| b.unwrap()).collect()
}
