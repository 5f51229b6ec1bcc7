//! Writes `testdata/orders.parquet`: 200,000 deterministic rows of mixed types (integers,
//! decimals, dates, timestamps with nulls, low- and high-cardinality strings, booleans)
//! that the examples and tests sort. With `--rows N --out PATH` it writes N rows of the same
//! kind to PATH instead, in chunks of a million rows (so a file larger than memory can be
//! made): about 21 bytes a row, so `--rows 50000000` makes a ~1 GB file for benchmarks.
//!
//! ```text
//! cargo run --release --example make_testdata
//! cargo run --release --example make_testdata -- --rows 50000000 --out /data/orders-1g.parquet
//! ```
//!
//! `order_id` is unique (a multiple of 7919 modulo a prime above the row count), so a sort
//! ending in `order_id` has one right answer.

use std::fs::File;
use std::sync::Arc;

use arrow::array::*;
use arrow::datatypes::{DataType, Field, Schema, SchemaRef, TimeUnit};
use parquet::arrow::ArrowWriter;
use parquet::basic::{Compression, ZstdLevel};
use parquet::file::properties::WriterProperties;
use rand::prelude::*;
use rand::rngs::SmallRng;

/// Rows of `testdata/orders.parquet`.
const ROWS: usize = 200_000;

/// Rows generated at a time with `--rows`.
const CHUNK: usize = 1 << 20;

/// The first seed; chunk `c` uses `SEED + c`.
const SEED: u64 = 2026;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let default_path = concat!(env!("CARGO_MANIFEST_DIR"), "/../testdata/orders.parquet").to_string();
    let (rows, path) = parse_args(default_path)?;
    let schema = schema();
    let props = WriterProperties::builder()
        .set_compression(Compression::ZSTD(ZstdLevel::try_new(9)?))
        .set_max_row_group_row_count(Some(65_536))
        .build();
    let mut writer = ArrowWriter::try_new(File::create(&path)?, schema.clone(), Some(props))?;
    let prime = modulus(rows);
    // Generate the next chunk while the writer encodes this one.
    let (send, receive) = std::sync::mpsc::sync_channel::<RecordBatch>(1);
    let generator = {
        let schema = schema.clone();
        std::thread::spawn(move || -> Result<(), String> {
            let mut start = 0;
            let mut chunk = 0;
            while start < rows {
                let n = CHUNK.min(rows - start);
                let mut rng = SmallRng::seed_from_u64(SEED + chunk);
                let batch = orders(&schema, &mut rng, start, n, prime).map_err(|e| e.to_string())?;
                if send.send(batch).is_err() {
                    break;
                }
                start += n;
                chunk += 1;
            }
            Ok(())
        })
    };
    let mut written = 0;
    for batch in receive {
        writer.write(&batch)?;
        written += batch.num_rows();
        if rows > CHUNK {
            eprintln!("{written} of {rows} rows");
        }
    }
    generator.join().map_err(|_| "the generator panicked")??;
    writer.close()?;
    println!("wrote {written} rows to {path}");
    Ok(())
}

/// `--rows N` and `--out PATH`, each optional.
fn parse_args(default_path: String) -> Result<(usize, String), String> {
    let (mut rows, mut path) = (ROWS, default_path);
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let mut value = || args.next().ok_or(format!("{arg} needs a value"));
        match arg.as_str() {
            "--rows" => rows = value()?.parse().map_err(|e| format!("--rows: {e}"))?,
            "--out" => path = value()?,
            other => {
                return Err(format!(
                    "unknown argument {other}; usage: make_testdata [--rows N] [--out PATH]"
                ));
            }
        }
    }
    Ok((rows, path))
}

fn schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
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
    ]))
}

/// The modulus of `order_id`: 1,000,003 (the default file's), or the first prime above `rows`
/// when there are more rows, so that ids stay unique.
fn modulus(rows: usize) -> i64 {
    let is_prime = |n: i64| n > 1 && (2..).take_while(|d| d * d <= n).all(|d| n % d != 0);
    let mut p = (rows as i64).max(1_000_003);
    while !is_prime(p) || p == 7919 {
        p += 1;
    }
    p
}

/// Rows `start..start + rows` of the table.
fn orders(
    schema: &SchemaRef,
    rng: &mut SmallRng,
    start: usize,
    rows: usize,
    prime: i64,
) -> Result<RecordBatch, arrow::error::ArrowError> {
    let statuses = ["open", "shipped", "returned", "cancelled", "pending"];
    let cities = [
        "Lisbon", "Oslo", "Nairobi", "Lima", "Osaka", "Quito", "Perth", "Hanoi", "Accra", "Bern",
    ];
    let order_date: Vec<i32> = (0..rows).map(|_| rng.random_range(19_000..20_500)).collect();
    let first = start as i64;
    let columns: Vec<ArrayRef> = vec![
        Arc::new(Int64Array::from_iter_values(
            (first..first + rows as i64).map(|i| (i * 7_919) % prime),
        )),
        Arc::new(StringArray::from_iter_values(
            (0..rows).map(|_| format!("customer#{:06}", rng.random_range(0..20_000))),
        )),
        Arc::new(StringArray::from_iter((0..rows).map(|_| {
            rng.random_bool(0.95).then(|| cities[rng.random_range(0..cities.len())])
        }))),
        Arc::new(StringArray::from_iter_values(
            (0..rows).map(|_| statuses[rng.random_range(0..statuses.len())]),
        )),
        Arc::new(
            Decimal128Array::from_iter_values((0..rows).map(|_| rng.random_range(100..10_000_000)))
                .with_precision_and_scale(12, 2)?,
        ),
        Arc::new(Float64Array::from_iter((0..rows).map(|_| {
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
            (0..rows).map(|_| rng.random_bool(0.7).then(|| rng.random_range(1..=5))),
        )),
        Arc::new(BooleanArray::from_iter((0..rows).map(|_| Some(rng.random_bool(0.2))))),
    ];
    RecordBatch::try_new(schema.clone(), columns)
}
