//! gpusort in an embedded DataFusion engine: a `SessionContext` built with `.with_gpusort()`
//! runs SQL `ORDER BY` queries over `testdata/orders.parquet`. For each query it prints the
//! physical plan (with its `GpuSortExec`), the first rows, the time, and the `GpuSortExec` line
//! of `EXPLAIN ANALYZE`, whose metrics say which path ran — the GPU, or gpusort's CPU backend
//! and why.
//!
//! ```text
//! cargo run --release --example sql_order_by
//! cargo run --release --example sql_order_by -- FILE "SELECT * FROM orders ORDER BY ..."
//! ```
//!
//! The file is registered as table `orders`; queries given after it replace the built-in ones.

use std::error::Error;
use std::sync::Arc;
use std::time::Instant;

use arrow::array::{AsArray, RecordBatch};
use arrow::util::pretty::pretty_format_batches;
use datafusion::execution::SessionStateBuilder;
use datafusion::physical_plan::{ExecutionPlan, collect, displayable};
use datafusion::prelude::{ParquetReadOptions, SessionContext};
use datafusion_gpusort::{GpuSortExec, SessionStateBuilderExt, gpu_backend};

/// The built-in queries: a top-k, a multi-column sort with string keys, and a sort on a
/// nullable timestamp.
const QUERIES: &[&str] = &[
    "SELECT order_id, customer, city, amount FROM orders ORDER BY amount DESC, order_id LIMIT 10",
    "SELECT status, city, amount, order_id, customer FROM orders \
     ORDER BY status, city NULLS FIRST, amount DESC, order_id",
    "SELECT order_id, shipped_at, priority, express FROM orders ORDER BY shipped_at DESC NULLS LAST, order_id",
];

/// Rows of each result that are printed.
const SHOWN_ROWS: usize = 5;

#[tokio::main]
async fn main() -> Result<(), Box<dyn Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let default_path = concat!(env!("CARGO_MANIFEST_DIR"), "/../testdata/orders.parquet");
    let path = args.first().map(String::as_str).unwrap_or(default_path);
    let queries: Vec<&str> = if args.len() > 1 {
        args[1..].iter().map(String::as_str).collect()
    } else {
        QUERIES.to_vec()
    };

    // The GPU is opened once per process, on the first sort that wants it; opening it here
    // says up front which path the sorts will take.
    match gpu_backend(0) {
        Ok(gpu) => println!("GPU: {}; sorts of >= gpusort.min_rows rows run on it", gpu.gpu().info()),
        Err(why) => println!(
            "No usable GPU ({why}): GpuSortExec sorts on gpusort's CPU backend (same results), \
             and the metrics say so"
        ),
    }

    // The one line that turns gpusort on: `.with_gpusort()` (or `datafusion_gpusort::register`).
    let state = SessionStateBuilder::new()
        .with_default_features()
        .with_gpusort()
        .build();
    let ctx = SessionContext::new_with_state(state);
    ctx.register_parquet("orders", path, ParquetReadOptions::default())
        .await?;
    // Options are ordinary session settings, e.g.:
    //   SET gpusort.device = 'cpu';  SET gpusort.min_rows = 0;  SET gpusort.enabled = false;
    println!("registered {path} as `orders`");

    for query in queries {
        println!("\n=== {query}");
        let start = Instant::now();
        let plan = ctx.sql(query).await?.create_physical_plan().await?;
        let planned = start.elapsed();
        println!("\n-- physical plan\n{}", displayable(plan.as_ref()).indent(false));

        let start = Instant::now();
        let batches = collect(Arc::clone(&plan), ctx.task_ctx()).await?;
        let ran = start.elapsed();
        let rows: usize = batches.iter().map(RecordBatch::num_rows).sum();
        println!("-- first {} of {rows} rows", SHOWN_ROWS.min(rows));
        println!("{}", pretty_format_batches(&first_rows(&batches, SHOWN_ROWS))?);
        println!(
            "-- {rows} rows in {:.1} ms (planning {:.1} ms, execution {:.1} ms)",
            (planned + ran).as_secs_f64() * 1e3,
            planned.as_secs_f64() * 1e3,
            ran.as_secs_f64() * 1e3
        );
        println!("-- {}", which_path(&plan));

        println!("-- EXPLAIN ANALYZE, the GpuSortExec line:");
        let analyzed = ctx.sql(&format!("EXPLAIN ANALYZE {query}")).await?.collect().await?;
        let mut found = false;
        for batch in &analyzed {
            let Some(text) = batch.column_by_name("plan") else {
                continue;
            };
            for row in text.as_string::<i32>().iter().flatten() {
                for line in row.lines().filter(|l| l.contains("GpuSortExec")) {
                    found = true;
                    // The metrics on a line of their own.
                    match line.trim().split_once(", metrics=[") {
                        Some((op, metrics)) => println!("{op}\n  metrics=[{metrics}"),
                        None => println!("{}", line.trim()),
                    }
                }
            }
        }
        if !found {
            println!("(none: DataFusion's own sort ran, or no sort was needed)");
        }
    }
    Ok(())
}

/// The first `n` rows of `batches`.
fn first_rows(batches: &[RecordBatch], n: usize) -> Vec<RecordBatch> {
    let mut left = n;
    let mut out = vec![];
    for b in batches {
        if left == 0 {
            break;
        }
        let take = left.min(b.num_rows());
        out.push(b.slice(0, take));
        left -= take;
    }
    out
}

/// Where the plan's `GpuSortExec`s sorted, from their metrics: the GPU, or the CPU and why.
fn which_path(plan: &Arc<dyn ExecutionPlan>) -> String {
    let (mut gpu_sorts, mut cpu_sorts) = (0, 0);
    let (mut paths, mut reasons) = (vec![], vec![]);
    let mut nodes = vec![Arc::clone(plan)];
    let mut sorts = 0;
    while let Some(node) = nodes.pop() {
        nodes.extend(node.children().into_iter().cloned());
        if node.downcast_ref::<GpuSortExec>().is_none() {
            continue;
        }
        sorts += 1;
        let Some(metrics) = node.metrics() else { continue };
        for m in metrics.aggregate_by_name().iter() {
            let v = m.value();
            match v.name() {
                "gpu_sorts" => gpu_sorts += v.as_usize(),
                "cpu_sorts" => cpu_sorts += v.as_usize(),
                "path" => paths.push(v.to_string()),
                "cpu_fallback" => reasons.push(v.to_string()),
                _ => {}
            }
        }
    }
    if sorts == 0 {
        return "no GpuSortExec in this plan (DataFusion's sort ran)".into();
    }
    let paths = paths.join("; ");
    if cpu_sorts == 0 {
        format!("ran on the GPU: {paths}")
    } else if gpu_sorts == 0 {
        format!("ran on the CPU: {paths}; why: {}", reasons.join("; "))
    } else {
        format!(
            "{gpu_sorts} sorts on the GPU, {cpu_sorts} on the CPU: {paths}; CPU because: {}",
            reasons.join("; ")
        )
    }
}
