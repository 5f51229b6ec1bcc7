//! What the Parquet writer spends per column, and what its settings change: a Parquet file is
//! read into memory, then each of its columns is encoded alone (one thread, one row group of up
//! to `BENCH_ROWS` rows, default 1M) under each variant of the writer's properties. Prints a
//! table of milliseconds per column and variant, and the totals.
//!
//! ```text
//! writer_props-<hash> FILE.parquet
//! ```

use std::time::Instant;

use arrow::array::RecordBatch;
use arrow::compute::concat_batches;
use parquet::arrow::ArrowWriter;
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use parquet::basic::{Compression, ZstdLevel};
use parquet::file::properties::{EnabledStatistics, WriterProperties};

fn variants() -> Vec<(&'static str, WriterProperties)> {
    let zstd = |l| Compression::ZSTD(ZstdLevel::try_new(l).unwrap());
    let base = || WriterProperties::builder().set_compression(zstd(3));
    vec![
        ("default zstd(3)", base().build()),
        (
            "stats chunk",
            base().set_statistics_enabled(EnabledStatistics::Chunk).build(),
        ),
        ("no dictionary", base().set_dictionary_enabled(false).build()),
        ("zstd(1)", WriterProperties::builder().set_compression(zstd(1)).build()),
        (
            "uncompressed",
            WriterProperties::builder()
                .set_compression(Compression::UNCOMPRESSED)
                .build(),
        ),
        (
            "snappy",
            WriterProperties::builder().set_compression(Compression::SNAPPY).build(),
        ),
    ]
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let path = std::env::args()
        .nth(1)
        .filter(|a| a != "--bench")
        .ok_or("usage: writer_props FILE.parquet")?;
    let rows: usize = std::env::var("BENCH_ROWS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1 << 20);
    let reader = ParquetRecordBatchReaderBuilder::try_new(std::fs::File::open(&path)?)?
        .with_batch_size(8192)
        .build()?;
    let mut batches: Vec<RecordBatch> = vec![];
    let mut n = 0;
    for b in reader {
        let b = b?;
        n += b.num_rows();
        batches.push(b);
        if n >= rows {
            break;
        }
    }
    let all = concat_batches(&batches[0].schema(), &batches)?;
    let all = all.slice(0, rows.min(all.num_rows()));
    println!("{} rows of {path}", all.num_rows());
    let variants = variants();
    print!("| column |");
    for (name, _) in &variants {
        print!(" {name} |");
    }
    println!("\n|---|{}", "---:|".repeat(variants.len()));
    let mut totals = vec![0.0; variants.len()];
    for (i, field) in all.schema().fields().iter().enumerate() {
        let one = all.project(&[i])?;
        print!("| {} |", field.name());
        for (k, (_, props)) in variants.iter().enumerate() {
            let mut best = f64::MAX;
            for _ in 0..3 {
                let start = Instant::now();
                let mut w = ArrowWriter::try_new(Vec::new(), one.schema(), Some(props.clone()))?;
                // As the gpusort writer receives them: batches of 8192 rows.
                for at in (0..one.num_rows()).step_by(8192) {
                    w.write(&one.slice(at, 8192.min(one.num_rows() - at)))?;
                }
                let bytes = w.into_inner()?;
                std::hint::black_box(bytes);
                best = best.min(start.elapsed().as_secs_f64() * 1e3);
            }
            totals[k] += best;
            print!(" {best:.1} |");
        }
        println!();
    }
    print!("| **all** |");
    for t in totals {
        print!(" **{t:.0}** |");
    }
    println!();
    Ok(())
}
