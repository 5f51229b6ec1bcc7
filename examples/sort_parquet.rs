//! Sorts a Parquet file with gpusort — on the GPU when there is one, else on the CPU backend —
//! and prints the first rows, the time, and which path it took (and why).
//!
//! ```text
//! cargo run --release --example sort_parquet                     # testdata/orders.parquet
//! cargo run --release --example sort_parquet -- FILE "col DESC, other"
//! ```
//!
//! The ORDER BY list here is parsed simply (`name [ASC|DESC] [NULLS FIRST|LAST]`, comma
//! separated); the `gpusort` command-line tool parses full SQL.

use std::fs::File;
use std::time::Instant;

use arrow::array::RecordBatchReader;
use arrow::compute::concat_batches;
use arrow::util::pretty::pretty_format_batches;
use gpusort::{CpuBackend, SortBackend, SortOptions, SortRequest, SortSpec};
use gpusort_cuda::CudaBackend;
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;

fn parse_order_by(list: &str) -> Result<Vec<(String, SortOptions)>, String> {
    list.split(',')
        .map(|item| {
            let words: Vec<String> = item.split_whitespace().map(|w| w.to_ascii_uppercase()).collect();
            let name = item.split_whitespace().next().ok_or("empty ORDER BY item")?.to_string();
            let descending = words.iter().any(|w| w == "DESC");
            let nulls_first = match words.iter().position(|w| w == "NULLS") {
                Some(p) => words
                    .get(p + 1)
                    .map(|w| w == "FIRST")
                    .ok_or("NULLS needs FIRST or LAST")?,
                None => descending, // SQL's default
            };
            Ok((
                name,
                SortOptions {
                    descending,
                    nulls_first,
                },
            ))
        })
        .collect()
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let default_path = concat!(env!("CARGO_MANIFEST_DIR"), "/../testdata/orders.parquet");
    let path = args.first().map(String::as_str).unwrap_or(default_path);
    let order_by = args
        .get(1)
        .map(String::as_str)
        .unwrap_or("status, amount DESC, order_id");

    let start = Instant::now();
    let reader = ParquetRecordBatchReaderBuilder::try_new(File::open(path)?)?.build()?;
    let schema = reader.schema();
    let batches = reader.collect::<Result<Vec<_>, _>>()?;
    let batch = concat_batches(&schema, &batches)?;
    let read_time = start.elapsed();

    let keys = parse_order_by(order_by)?;
    let spec = SortSpec::try_from_names(&schema, keys.iter().map(|(n, o)| (n.as_str(), *o)))?;
    // The GPU if there is one (its first use compiles the kernels, or reads them from the
    // cache); otherwise the CPU, saying why.
    let (backend, how): (Box<dyn SortBackend>, String) = match CudaBackend::try_new(0) {
        Ok(gpu) => {
            let how = format!("GPU {}", gpu.gpu().info());
            (Box::new(gpu), how)
        }
        Err(why) => (
            Box::new(CpuBackend::new()),
            format!("CPU radix sort on {} threads ({why})", rayon_threads()),
        ),
    };
    let start = Instant::now();
    let out = backend.sort(&SortRequest::new(&batch, &spec))?;
    let sort_time = start.elapsed();

    println!(
        "{}",
        pretty_format_batches(&[out.batch.slice(0, out.batch.num_rows().min(10))])?
    );
    println!(
        "sorted {} rows of {path} by `{order_by}` in {:.1} ms (read: {:.1} ms)",
        out.batch.num_rows(),
        sort_time.as_secs_f64() * 1e3,
        read_time.as_secs_f64() * 1e3
    );
    let s = &out.stats;
    println!(
        "path: {how}: {}, {}-bit key, {} passes; encode {:.1} ms, sort {:.1} ms, gather {:.1} ms",
        s.strategy.map(|x| x.to_string()).unwrap_or_default(),
        s.key_bits,
        s.passes,
        s.encode_time.as_secs_f64() * 1e3,
        s.sort_time.as_secs_f64() * 1e3,
        s.gather_time.as_secs_f64() * 1e3,
    );
    Ok(())
}

fn rayon_threads() -> usize {
    std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1)
}
