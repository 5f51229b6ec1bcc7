//! Writes `testdata/orders.parquet`: 200,000 deterministic rows of mixed types (integers,
//! decimals, dates, timestamps with nulls, low- and high-cardinality strings, booleans)
//! that the examples and tests sort.
//!
//! ```text
//! cargo run --release --example make_testdata
//! ```

use std::fs::File;
use std::sync::Arc;

use arrow::array::*;
use arrow::datatypes::{DataType, Field, Schema, TimeUnit};
use parquet::arrow::ArrowWriter;
use parquet::basic::{Compression, ZstdLevel};
use parquet::file::properties::WriterProperties;
use rand::prelude::*;
use rand::rngs::SmallRng;

const ROWS: usize = 200_000;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut rng = SmallRng::seed_from_u64(2026);
    let statuses = ["open", "shipped", "returned", "cancelled", "pending"];
    let cities = [
        "Lisbon", "Oslo", "Nairobi", "Lima", "Osaka", "Quito", "Perth", "Hanoi", "Accra", "Bern",
    ];
    let schema = Arc::new(Schema::new(vec![
        Field::new("order_id", DataType::Int64, false),
        Field::new("customer", DataType::Utf8, false),
        Field::new("city", DataType::Utf8, true),
        Field::new("status", DataType::Utf8, false),
        Field::new("amount", DataType::Decimal128(12, 2), false),
        Field::new("discount", DataType::Float64, true),
        Field::new("order_date", DataType::Date32, false),
        Field::new(
            "shipped_at",
            DataType::Timestamp(TimeUnit::Millisecond, Some("UTC".into())),
            true,
        ),
        Field::new("priority", DataType::Int32, true),
        Field::new("express", DataType::Boolean, false),
    ]));
    let order_date: Vec<i32> = (0..ROWS).map(|_| rng.random_range(19_000..20_500)).collect();
    let columns: Vec<ArrayRef> = vec![
        Arc::new(Int64Array::from_iter_values(
            (0..ROWS as i64).map(|i| (i * 7_919) % 1_000_003),
        )),
        Arc::new(StringArray::from_iter_values(
            (0..ROWS).map(|_| format!("customer#{:06}", rng.random_range(0..20_000))),
        )),
        Arc::new(StringArray::from_iter((0..ROWS).map(|_| {
            rng.random_bool(0.95).then(|| cities[rng.random_range(0..cities.len())])
        }))),
        Arc::new(StringArray::from_iter_values(
            (0..ROWS).map(|_| statuses[rng.random_range(0..statuses.len())]),
        )),
        Arc::new(
            Decimal128Array::from_iter_values((0..ROWS).map(|_| rng.random_range(100..10_000_000)))
                .with_precision_and_scale(12, 2)?,
        ),
        Arc::new(Float64Array::from_iter((0..ROWS).map(|_| {
            rng.random_bool(0.9).then(|| (rng.random_range(0..50) as f64) / 100.0)
        }))),
        Arc::new(Date32Array::from(order_date.clone())),
        Arc::new(
            TimestampMillisecondArray::from_iter(order_date.iter().map(|d| {
                rng.random_bool(0.8)
                    .then(|| (*d as i64 + rng.random_range(0..10)) * 86_400_000 + rng.random_range(0..86_400_000))
            }))
            .with_timezone("UTC"),
        ),
        Arc::new(Int32Array::from_iter(
            (0..ROWS).map(|_| rng.random_bool(0.7).then(|| rng.random_range(1..=5))),
        )),
        Arc::new(BooleanArray::from_iter((0..ROWS).map(|_| Some(rng.random_bool(0.2))))),
    ];
    let batch = RecordBatch::try_new(schema.clone(), columns)?;
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../testdata/orders.parquet");
    let props = WriterProperties::builder()
        .set_compression(Compression::ZSTD(ZstdLevel::try_new(9)?))
        .set_max_row_group_row_count(Some(65_536))
        .build();
    let mut writer = ArrowWriter::try_new(File::create(path)?, schema, Some(props))?;
    writer.write(&batch)?;
    writer.close()?;
    println!("wrote {ROWS} rows to {path}");
    Ok(())
}
