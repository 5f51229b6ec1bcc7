//! Distributed `ORDER BY` on 1, 2, 4... loopback workers against single-node gpusort and stock
//! DataFusion, in one process (the workers share its cores and its GPU):
//!
//! ```sh
//! cargo bench -p gpusort-distributed --bench tpch_workers -- lineitem.parquet \
//!     --workers 1,2,4 --order-by "l_shipdate, l_orderkey, l_linenumber" --runs 2 [--ranges-per-worker 1]
//! ```
//!
//! Each contender runs `SELECT * FROM lineitem ORDER BY ...` to a collected result, `--runs`
//! times; a run's time covers planning (for the distributed sort, its sample job) and the
//! query. Every result is checked against single-node gpusort's: its rows, an order-sensitive
//! checksum of the `ORDER BY` columns (plain column names) and an order-free checksum of whole
//! rows. Prints a markdown table: best time, rows/s, speed-ups, and for the distributed sort
//! the splitters' quality (the largest range's rows over the mean, from the workers' counts).

use std::sync::Arc;
use std::time::{Duration, Instant};

use arrow::array::RecordBatch;
use datafusion::common::hash_utils::create_hashes;
use datafusion::error::{DataFusionError, Result};
use datafusion::execution::SessionStateBuilder;
use datafusion::physical_plan::repartition::REPARTITION_RANDOM_STATE;
use datafusion::physical_plan::{ExecutionPlan, collect};
use datafusion::prelude::{ParquetReadOptions, SessionConfig, SessionContext};
use datafusion_gpusort::gpu_backend;
use gpusort_distributed::{LoopbackCluster, RangeSortMetrics, sorts_by_device};

/// Rows, an order-sensitive checksum of the key columns and an order-free one of the rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
struct Digest {
    rows: usize,
    keys: u64,
    row_sum: u64,
}

fn digest(batches: &[RecordBatch], keys: &[String]) -> Result<Digest> {
    let mut d = Digest::default();
    let mut hashes = vec![];
    for b in batches {
        hashes.clear();
        hashes.resize(b.num_rows(), 0);
        let key_columns = keys
            .iter()
            .map(|k| b.column_by_name(k).cloned())
            .collect::<Option<Vec<_>>>()
            .ok_or_else(|| DataFusionError::Plan(format!("ORDER BY columns {keys:?} not all in the result")))?;
        create_hashes(&key_columns, REPARTITION_RANDOM_STATE.random_state(), &mut hashes)?;
        d.keys = hashes
            .iter()
            .fold(d.keys, |acc, h| acc.wrapping_mul(0x100_0000_01b3).wrapping_add(*h));
        hashes.iter_mut().for_each(|h| *h = 0);
        create_hashes(b.columns(), REPARTITION_RANDOM_STATE.random_state(), &mut hashes)?;
        d.row_sum = hashes.iter().fold(d.row_sum, |acc, h| acc.wrapping_add(*h));
        d.rows += b.num_rows();
    }
    Ok(d)
}

/// One contender's best run and what its sort said of itself.
struct Row {
    contender: &'static str,
    workers: Option<usize>,
    best: Duration,
    digest: Digest,
    sorts: (usize, usize),
    imbalance: Option<f64>,
}

/// Runs `sql` `runs` times on `ctx`: the best time, the result's digest (every run's must
/// agree), the GPU and CPU sorts and the splitters' quality of the last run.
async fn measure(
    contender: &'static str,
    workers: Option<usize>,
    ctx: &SessionContext,
    sql: &str,
    keys: &[String],
    runs: usize,
) -> Result<Row> {
    let mut row = Row {
        contender,
        workers,
        best: Duration::MAX,
        digest: Digest::default(),
        sorts: (0, 0),
        imbalance: None,
    };
    for run in 0..runs.max(1) {
        let start = Instant::now();
        let df = ctx.sql(sql).await?;
        let task = Arc::new(df.task_ctx());
        let plan: Arc<dyn ExecutionPlan> = df.create_physical_plan().await?;
        let batches = collect(Arc::clone(&plan), task).await?;
        row.best = row.best.min(start.elapsed());
        let d = digest(&batches, keys)?;
        drop(batches);
        if run > 0 && d != row.digest {
            return Err(DataFusionError::Execution(format!(
                "{contender}: runs differ: {:?} vs {d:?}",
                row.digest
            )));
        }
        row.digest = d;
        match RangeSortMetrics::try_from_executed(Arc::clone(&plan)).await? {
            Some(m) => (row.sorts, row.imbalance) = ((m.gpu_sorts, m.cpu_sorts), Some(m.imbalance())),
            None => row.sorts = sorts_by_device(&plan)?,
        }
    }
    Ok(row)
}

fn arg(args: &[String], name: &str) -> Option<String> {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1).cloned())
}

/// The first argument that is neither a `--flag` nor a flag's value.
fn positional(args: &[String]) -> Option<String> {
    let valued = ["--workers", "--order-by", "--runs", "--ranges-per-worker"];
    let mut it = args.iter().skip(1);
    while let Some(a) = it.next() {
        if valued.contains(&a.as_str()) {
            it.next();
        } else if !a.starts_with("--") {
            return Some(a.clone());
        }
    }
    None
}

async fn context(state: SessionStateBuilder, path: &str) -> Result<SessionContext> {
    let ctx = SessionContext::new_with_state(state.build());
    ctx.register_parquet("lineitem", path, ParquetReadOptions::default())
        .await?;
    Ok(ctx)
}

fn print_table(rows: &[Row], runs: usize) {
    let (single, stock) = (rows[0].best.as_secs_f64(), rows[1].best.as_secs_f64());
    println!(
        "| contender | workers | sorts gpu/cpu | seconds (best of {runs}) | M rows/s | speed-up vs gpusort one node | speed-up vs DataFusion | largest range / mean |"
    );
    println!("|---|---|---|---|---|---|---|---|");
    for r in rows {
        let s = r.best.as_secs_f64();
        println!(
            "| {} | {} | {}/{} | {s:.3} | {:.1} | {:.2} | {:.2} | {} |",
            r.contender,
            r.workers.map_or("-".into(), |w| w.to_string()),
            r.sorts.0,
            r.sorts.1,
            r.digest.rows as f64 / s / 1e6,
            single / s,
            stock / s,
            r.imbalance.map_or("-".into(), |q| format!("{q:.3}"))
        );
    }
}

#[tokio::main]
async fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let path = positional(&args).ok_or_else(|| {
        DataFusionError::Plan(
            "usage: tpch_workers LINEITEM.parquet [--workers 1,2,4] [--order-by LIST] [--runs N]".into(),
        )
    })?;
    let order_by = arg(&args, "--order-by").unwrap_or_else(|| "l_shipdate, l_orderkey, l_linenumber".into());
    let parse = |s: &str| {
        s.trim()
            .parse::<usize>()
            .map_err(|e| DataFusionError::Plan(format!("{s}: {e}")))
    };
    let workers = arg(&args, "--workers")
        .unwrap_or_else(|| "1,2,4".into())
        .split(',')
        .map(parse)
        .collect::<Result<Vec<_>>>()?;
    let runs = arg(&args, "--runs").map_or(Ok(2), |s| parse(&s))?;
    let ranges_per_worker = arg(&args, "--ranges-per-worker").map_or(Ok(1), |s| parse(&s))?;
    let keys: Vec<String> = order_by
        .split(',')
        .filter_map(|k| k.split_whitespace().next().map(String::from))
        .collect();
    let sql = format!("SELECT * FROM lineitem ORDER BY {order_by}");
    println!("{sql}\n{path}, {ranges_per_worker} range(s) per worker");
    // Opened once, outside the timed runs, as the first GPU sort would; the workers share it.
    match gpu_backend(0) {
        Ok(gpu) => println!("Sort device: GPU {}", gpu.gpu().info()),
        Err(why) => println!("Sort device: CPU (no usable GPU: {why})"),
    }

    let single = context(
        datafusion_gpusort::register(SessionStateBuilder::new().with_default_features()),
        &path,
    )
    .await?;
    let mut rows = vec![measure("gpusort one node", None, &single, &sql, &keys, runs).await?];
    let stock = context(SessionStateBuilder::new().with_default_features(), &path).await?;
    rows.push(measure("DataFusion", None, &stock, &sql, &keys, runs).await?);
    for &w in &workers {
        let cluster = LoopbackCluster::try_new(w).await?;
        let ctx = cluster.context(SessionConfig::new(), ranges_per_worker);
        ctx.register_parquet("lineitem", &path, ParquetReadOptions::default())
            .await?;
        rows.push(measure("gpusort distributed", Some(w), &ctx, &sql, &keys, runs).await?);
    }
    print_table(&rows, runs);
    let reference = rows[0].digest;
    let wrong: Vec<String> = rows
        .iter()
        .filter(|r| r.digest != reference)
        .map(|r| format!("{} {:?}: {:?}", r.contender, r.workers, r.digest))
        .collect();
    if !wrong.is_empty() {
        return Err(DataFusionError::Execution(format!(
            "results differ from gpusort one node ({reference:?}): {wrong:?}"
        )));
    }
    println!(
        "every result equals gpusort one node's: {} rows, same key order, same rows",
        reference.rows
    );
    Ok(())
}
