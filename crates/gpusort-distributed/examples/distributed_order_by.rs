//! A distributed `ORDER BY` on loopback: starts N datafusion-distributed workers on
//! 127.0.0.1 (in this process, each its own Arrow Flight server), registers a Parquet
//! `lineitem` table and runs `SELECT * FROM lineitem ORDER BY ...` through the
//! range-partitioned sort with `GpuSortExec` (on the GPU where one is usable, else the CPU),
//! then checks the order.
//!
//! ```sh
//! cargo run -p gpusort-distributed --example distributed_order_by -- \
//!     [--workers 3] [--ranges-per-worker 1] [--rows 600000] \
//!     [--parquet lineitem.parquet] [--order-by "l_shipdate, l_orderkey DESC"]
//! ```
//!
//! Without `--parquet` it writes a lineitem-shaped table of `--rows` rows (TPC-H's columns
//! that sorts usually key on, with its skew: 7 ship modes, 3 return flags) to a temporary file.

use std::sync::Arc;
use std::time::Instant;

use arrow::array::{ArrayRef, Date32Array, Float64Array, Int64Array, RecordBatch, StringArray};
use arrow::datatypes::{DataType, Field, Schema};
use datafusion::physical_plan::displayable;
use datafusion::prelude::{ParquetReadOptions, SessionConfig, SessionContext};
use gpusort_distributed::{LoopbackCluster, collect_with_metrics};
use parquet::arrow::ArrowWriter;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

fn arg(args: &[String], name: &str) -> Option<String> {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1).cloned())
}

fn write_lineitem(path: &std::path::Path, rows: usize) -> Result<(), Box<dyn std::error::Error>> {
    let schema = Arc::new(Schema::new(vec![
        Field::new("l_orderkey", DataType::Int64, false),
        Field::new("l_partkey", DataType::Int64, false),
        Field::new("l_quantity", DataType::Float64, false),
        Field::new("l_extendedprice", DataType::Float64, false),
        Field::new("l_returnflag", DataType::Utf8, false),
        Field::new("l_shipdate", DataType::Date32, false),
        Field::new("l_shipmode", DataType::Utf8, false),
    ]));
    let mut writer = ArrowWriter::try_new(std::fs::File::create(path)?, Arc::clone(&schema), None)?;
    let mut rng = SmallRng::seed_from_u64(1);
    let modes = ["AIR", "FOB", "MAIL", "RAIL", "REG AIR", "SHIP", "TRUCK"];
    let chunk = 100_000;
    for start in (0..rows).step_by(chunk) {
        let n = chunk.min(rows - start);
        let columns: Vec<ArrayRef> = vec![
            Arc::new(Int64Array::from_iter_values(
                (start..start + n).map(|i| (i / 4) as i64 + 1),
            )),
            Arc::new(Int64Array::from_iter_values(
                (0..n).map(|_| rng.random_range(1..200_000)),
            )),
            Arc::new(Float64Array::from_iter_values(
                (0..n).map(|_| rng.random_range(1..=50) as f64),
            )),
            Arc::new(Float64Array::from_iter_values(
                (0..n).map(|_| rng.random_range(900.0..105_000.0)),
            )),
            Arc::new(StringArray::from_iter_values(
                (0..n).map(|_| ["A", "N", "R"][rng.random_range(0..3)]),
            )),
            Arc::new(Date32Array::from_iter_values(
                (0..n).map(|_| 8036 + rng.random_range(0..2526)),
            )),
            Arc::new(StringArray::from_iter_values(
                (0..n).map(|_| modes[rng.random_range(0..7)]),
            )),
        ];
        writer.write(&RecordBatch::try_new(Arc::clone(&schema), columns)?)?;
    }
    writer.close()?;
    Ok(())
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let workers: usize = arg(&args, "--workers").map_or(Ok(3), |s| s.parse())?;
    let ranges_per_worker: usize = arg(&args, "--ranges-per-worker").map_or(Ok(1), |s| s.parse())?;
    let rows: usize = arg(&args, "--rows").map_or(Ok(600_000), |s| s.parse())?;
    let order_by = arg(&args, "--order-by").unwrap_or_else(|| "l_shipmode, l_shipdate DESC".into());
    let dir = tempfile::tempdir()?;
    let path = match arg(&args, "--parquet") {
        Some(p) => p,
        None => {
            let p = dir.path().join("lineitem.parquet");
            write_lineitem(&p, rows)?;
            p.to_string_lossy().into_owned()
        }
    };

    let cluster = LoopbackCluster::try_new(workers).await?;
    println!("{workers} workers on 127.0.0.1, ports {:?}", cluster.workers().ports);
    let ctx = cluster.context(SessionConfig::new(), ranges_per_worker);
    ctx.register_parquet("lineitem", &path, ParquetReadOptions::default())
        .await?;

    let sql = format!("SELECT * FROM lineitem ORDER BY {order_by}");
    println!("{sql}");
    let start = Instant::now();
    let plan = ctx.sql(&sql).await?.create_physical_plan().await?;
    println!(
        "planned (with the sample job) in {:.2?}:\n{}",
        start.elapsed(),
        displayable(plan.as_ref()).indent(true)
    );

    let start = Instant::now();
    let (batches, metrics) = collect_with_metrics(ctx.sql(&sql).await?).await?;
    let elapsed = start.elapsed();
    let total: usize = batches.iter().map(|b| b.num_rows()).sum();
    println!(
        "{total} rows in {elapsed:.2?} ({:.1} M rows/s), sample and sort",
        total as f64 / elapsed.as_secs_f64() / 1e6
    );
    if let Some(m) = metrics {
        println!(
            "rows per range {:?}: largest / mean {:.3}; sorts on the GPU {}, on the CPU {}",
            m.range_rows,
            m.imbalance(),
            m.gpu_sorts,
            m.cpu_sorts
        );
    }

    // Check: the same query on one node gives the same keys in the same order.
    let single = SessionContext::new();
    single
        .register_parquet("lineitem", &path, ParquetReadOptions::default())
        .await?;
    let keys_sql = format!(
        "SELECT {} FROM lineitem ORDER BY {order_by}",
        order_by
            .split(',')
            .map(|k| k.split_whitespace().next().unwrap_or(""))
            .collect::<Vec<_>>()
            .join(", ")
    );
    let want: Vec<RecordBatch> = single.sql(&keys_sql).await?.collect().await?;
    let want = arrow::compute::concat_batches(&want[0].schema(), &want)?;
    let got = arrow::compute::concat_batches(&batches[0].schema(), &batches)?;
    for (i, field) in want.schema().fields().iter().enumerate() {
        let column = got.column(got.schema().index_of(field.name())?);
        assert_eq!(
            column.to_data(),
            want.column(i).to_data(),
            "{} out of order",
            field.name()
        );
    }
    println!("order checked against a single-node sort");
    println!(
        "{}",
        arrow::util::pretty::pretty_format_batches(&[got.slice(0, 5.min(got.num_rows()))])?
    );
    Ok(())
}
