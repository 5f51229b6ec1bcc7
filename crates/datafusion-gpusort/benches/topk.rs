//! `ORDER BY k LIMIT n`, end to end, for a range of `n`: stock DataFusion (its TopK, a
//! streaming heap of `n` rows per partition, then a merge) against `GpuSortExec` taking every
//! TopK (`gpusort.topk_max_fetch = 0`: the whole input buffered, sorted on the GPU and cut to
//! `n` rows). The crossover sets the default of `gpusort.topk_max_fetch`, below which the rule
//! leaves the TopK to DataFusion; the last column says which plan the default makes.
//!
//! ```text
//! cargo bench -p datafusion-gpusort --bench topk                 # 10M rows, 5 runs
//! BENCH_ROWS=200000 BENCH_RUNS=1 cargo bench -p datafusion-gpusort --bench topk
//! ```
//!
//! Environment: `BENCH_ROWS` (default 10,000,000), `BENCH_RUNS` (timed runs after a warm-up,
//! default 5), `BENCH_PARTITIONS` (default 16), `BENCH_LIMITS` (comma-separated `n`, default
//! `10,1000,10000,100000,1000000`), `BENCH_CSV` (also write the table there).
//!
//! The table is the `sql` bench's first: a random u32 key and 20 u32 columns. Each contender's
//! output must hold `n` rows whose keys equal stock DataFusion's, row by row.

use std::error::Error;
use std::fmt::Write as _;
use std::sync::Arc;

use arrow::array::{Array, RecordBatch, UInt32Array};
use datafusion::datasource::MemTable;
use datafusion::execution::SessionStateBuilder;
use datafusion::physical_plan::{ExecutionPlan, collect};
use datafusion::prelude::{SessionConfig, SessionContext};
use datafusion_gpusort::{GpuSortConfig, GpuSortExec, SessionStateBuilderExt, gpu_backend};
use rand::SeedableRng;
use rand::rngs::SmallRng;

mod common;
use common::{SEED, env_usize, partitioned, time, u32_table};

type Result<T> = std::result::Result<T, Box<dyn Error>>;

/// A session over `data` as table `t`: stock DataFusion, or gpusort with these options.
fn session(
    gpusort: Option<&[(&str, &str)]>,
    partitions: usize,
    data: &[Vec<RecordBatch>],
    schema: arrow::datatypes::SchemaRef,
) -> Result<SessionContext> {
    let mut config = SessionConfig::new()
        .with_target_partitions(partitions)
        .with_batch_size(8192);
    let mut builder = SessionStateBuilder::new().with_default_features();
    if let Some(options) = gpusort {
        config.options_mut().extensions.insert(GpuSortConfig::default());
        for (k, v) in options {
            config = config.set_str(k, v);
        }
        builder = builder.with_config(config).with_gpusort();
    } else {
        builder = builder.with_config(config);
    }
    let ctx = SessionContext::new_with_state(builder.build());
    ctx.register_table("t", Arc::new(MemTable::try_new(schema, data.to_vec())?))?;
    Ok(ctx)
}

/// The key column of the output, in order.
fn keys(batches: &[RecordBatch]) -> Result<Vec<u32>> {
    let mut out = vec![];
    for b in batches {
        let k = b
            .column(0)
            .as_any()
            .downcast_ref::<UInt32Array>()
            .ok_or("key column k is not u32")?;
        out.extend(k.values().iter().copied());
    }
    Ok(out)
}

/// Whether `plan` sorts with `GpuSortExec`, and whether those sorts ran on the GPU.
fn gpu_sort(plan: &Arc<dyn ExecutionPlan>) -> (bool, usize) {
    let mut found = plan.downcast_ref::<GpuSortExec>().is_some();
    let mut gpu = if found {
        plan.metrics()
            .and_then(|m| m.sum_by_name("gpu_sorts"))
            .map_or(0, |v| v.as_usize())
    } else {
        0
    };
    for c in plan.children() {
        let (f, g) = gpu_sort(c);
        found |= f;
        gpu += g;
    }
    (found, gpu)
}

fn ms(d: std::time::Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn main() -> Result<()> {
    let rows = env_usize("BENCH_ROWS", 10_000_000);
    let runs = env_usize("BENCH_RUNS", 5).max(1);
    let partitions = env_usize("BENCH_PARTITIONS", 16).max(1);
    let limits: Vec<usize> = std::env::var("BENCH_LIMITS")
        .unwrap_or_else(|_| "10,1000,10000,100000,1000000".into())
        .split(',')
        .map(|s| s.trim().parse())
        .collect::<std::result::Result<_, _>>()?;
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    println!(
        "ORDER BY k LIMIT n end to end: {rows} rows (u32 key + 20 u32), {partitions} partitions, median and min of {runs} runs after a warm-up"
    );
    match gpu_backend(0) {
        Ok(gpu) => println!("GPU: {}", gpu.gpu().info()),
        Err(why) => println!("GPU: none usable ({why}); GpuSortExec sorts on the CPU backend"),
    }
    let default_max = GpuSortConfig::default().topk_max_fetch;

    let table = u32_table(rows, &mut SmallRng::seed_from_u64(SEED));
    let data = partitioned(&table.batch, partitions, 8192);
    let schema = table.batch.schema();
    drop(table);
    let stock = session(None, partitions, &data, Arc::clone(&schema))?;
    let forced = session(
        Some(&[("gpusort.topk_max_fetch", "0")]),
        partitions,
        &data,
        Arc::clone(&schema),
    )?;
    let defaults = session(Some(&[]), partitions, &data, Arc::clone(&schema))?;

    let mut out = String::new();
    writeln!(out)?;
    writeln!(
        out,
        "| n | stock TopK median ms | min ms | GpuSortExec median ms | min ms | GpuSortExec vs stock (median) | GpuSortExec ran on | default plan (topk_max_fetch = {default_max}) | keys equal |"
    )?;
    writeln!(out, "|---:|---:|---:|---:|---:|---:|---|---|---|")?;
    let mut csv = String::from(
        "rows,partitions,runs,n,stock_median_ms,stock_min_ms,gpusort_median_ms,gpusort_min_ms,speedup,gpu_sorts,default_plan,keys_equal\n",
    );
    for &n in &limits {
        let sql = format!("SELECT * FROM t ORDER BY k LIMIT {n}");
        let timed = |ctx: &SessionContext| {
            time(runs, || {
                runtime.block_on(async {
                    let out = ctx.sql(&sql).await.unwrap().collect().await.unwrap();
                    out.iter().map(|b| b.num_rows()).sum()
                })
            })
        };
        let (stock_median, stock_min) = timed(&stock);
        let (ours_median, ours_min) = timed(&forced);
        // One more run of each with the plan kept, for the check and the metrics.
        let run = |ctx: &SessionContext| {
            runtime.block_on(async {
                let plan = ctx.sql(&sql).await?.create_physical_plan().await?;
                let batches = collect(Arc::clone(&plan), ctx.task_ctx()).await?;
                Ok::<_, datafusion::error::DataFusionError>((plan, batches))
            })
        };
        let (_, expected) = run(&stock)?;
        let (plan, actual) = run(&forced)?;
        let (_, gpu_sorts) = gpu_sort(&plan);
        let (default_plan, _) = run(&defaults)?;
        let default_plan = if gpu_sort(&default_plan).0 {
            "GpuSortExec"
        } else {
            "DataFusion's TopK"
        };
        let expected = keys(&expected)?;
        let equal = expected.len() == n.min(rows) && expected == keys(&actual)?;
        let ran_on = if gpu_sorts > 0 { "GPU" } else { "CPU backend" };
        eprintln!(
            "n = {n}: stock {:.1} ms, GpuSortExec {:.1} ms ({ran_on})",
            ms(stock_median),
            ms(ours_median)
        );
        let speedup = stock_median.as_secs_f64() / ours_median.as_secs_f64();
        writeln!(
            out,
            "| {n} | {:.1} | {:.1} | {:.1} | {:.1} | {speedup:.2}x | {ran_on} | {default_plan} | {} |",
            ms(stock_median),
            ms(stock_min),
            ms(ours_median),
            ms(ours_min),
            if equal { "yes" } else { "NO" }
        )?;
        writeln!(
            csv,
            "{rows},{partitions},{runs},{n},{:.3},{:.3},{:.3},{:.3},{speedup:.4},{gpu_sorts},{default_plan},{equal}",
            ms(stock_median),
            ms(stock_min),
            ms(ours_median),
            ms(ours_min)
        )?;
    }
    print!("{out}");
    if let Ok(path) = std::env::var("BENCH_CSV") {
        std::fs::write(&path, csv)?;
        println!("wrote {path}");
    }
    Ok(())
}
