//! The external-sort test table, sessions with memory pools and disk managers, and helpers
//! to read a `GpuSortExec`'s metrics, shared by the CPU and GPU test targets.
#![allow(dead_code)]

use std::path::Path;
use std::sync::Arc;

use arrow::array::{Float64Array, Int64Array, RecordBatch, StringArray};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use arrow::util::pretty::pretty_format_batches;
use datafusion::datasource::MemTable;
use datafusion::execution::SessionStateBuilder;
use datafusion::execution::disk_manager::{DiskManagerBuilder, DiskManagerMode};
use datafusion::execution::memory_pool::FairSpillPool;
use datafusion::execution::runtime_env::RuntimeEnvBuilder;
use datafusion::physical_plan::metrics::MetricsSet;
use datafusion::physical_plan::{ExecutionPlan, collect};
use datafusion::prelude::{SessionConfig, SessionContext};
use datafusion_gpusort::SessionStateBuilderExt;

pub const ROWS: usize = 200_000;
pub const BATCH: usize = 4096;

pub fn schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("id", DataType::Int64, false),
        Field::new("k", DataType::Int64, true),
        Field::new("s", DataType::Utf8, true),
        Field::new("f", DataType::Float64, true),
    ]))
}

/// Rows `range` of the test table: `id` is the row number (so `ORDER BY x, id` is the stable
/// order of `ORDER BY x`), `k` has ~1000 distinct values and nulls, `s` ~100 strings and nulls.
pub fn batch(range: std::ops::Range<usize>) -> RecordBatch {
    let id: Int64Array = range.clone().map(|i| i as i64).collect();
    let k: Int64Array = range
        .clone()
        .map(|i| (i % 211 != 7).then_some(((i * 7919) % 1009) as i64 - 500))
        .collect();
    let s: StringArray = range
        .clone()
        .map(|i| (i % 13 != 4).then(|| format!("value-{:03}", (i * 31) % 97)))
        .collect();
    let f: Float64Array = range.map(|i| Some(((i * 37) % 101) as f64 / 4.0 - 10.0)).collect();
    RecordBatch::try_new(schema(), vec![Arc::new(id), Arc::new(k), Arc::new(s), Arc::new(f)]).unwrap()
}

pub fn batches() -> Vec<RecordBatch> {
    (0..ROWS)
        .step_by(BATCH)
        .map(|s| batch(s..(s + BATCH).min(ROWS)))
        .collect()
}

/// A session over table `t` (one partition, so the input order is fixed): gpusort or stock,
/// with a memory pool of `pool` bytes (none: unlimited), temp files in `tmp`, and `options`.
pub fn session(
    gpusort: bool,
    pool: Option<usize>,
    disk: DiskManagerBuilder,
    options: &[(&str, &str)],
) -> SessionContext {
    let mut runtime = RuntimeEnvBuilder::new().with_disk_manager_builder(disk);
    if let Some(limit) = pool {
        runtime = runtime.with_memory_pool(Arc::new(FairSpillPool::new(limit)));
    }
    let mut config = SessionConfig::new().with_target_partitions(1).with_batch_size(1000);
    for (k, v) in options.iter().filter(|(k, _)| k.starts_with("datafusion.")) {
        config = config.set_str(k, v);
    }
    let mut builder = SessionStateBuilder::new()
        .with_config(config)
        .with_runtime_env(Arc::new(runtime.build().unwrap()))
        .with_default_features();
    if gpusort {
        builder = builder.with_gpusort();
    }
    let ctx = SessionContext::new_with_state(builder.build());
    for (k, v) in options.iter().filter(|(k, _)| k.starts_with("gpusort.")) {
        // gpusort.* options exist once the extension is registered.
        ctx.state_ref().write().config_mut().options_mut().set(k, v).unwrap();
    }
    let table = MemTable::try_new(schema(), vec![batches()]).unwrap();
    ctx.register_table("t", Arc::new(table)).unwrap();
    ctx
}

pub fn disk_in(dir: &Path) -> DiskManagerBuilder {
    DiskManagerBuilder::default().with_mode(DiskManagerMode::Directories(vec![dir.to_path_buf()]))
}

/// Runs `sql`; its output and the metrics of its `GpuSortExec`.
pub async fn run(ctx: &SessionContext, sql: &str) -> datafusion::error::Result<(Vec<RecordBatch>, MetricsSet)> {
    let plan = ctx.sql(sql).await?.create_physical_plan().await?;
    let out = collect(Arc::clone(&plan), ctx.task_ctx()).await?;
    Ok((out, sort_metrics(&plan)))
}

pub fn sort_metrics(plan: &Arc<dyn ExecutionPlan>) -> MetricsSet {
    if plan.name() == "GpuSortExec" {
        return plan.metrics().unwrap().aggregate_by_name();
    }
    plan.children()
        .into_iter()
        .map(sort_metrics)
        .find(|m| m.iter().next().is_some())
        .unwrap_or_default()
}

pub fn metric(m: &MetricsSet, name: &str) -> usize {
    match name {
        "output_rows" => m.output_rows(),
        "spill_count" => m.spill_count(),
        "spilled_rows" => m.spilled_rows(),
        _ => m.sum_by_name(name).map(|v| v.as_usize()),
    }
    .unwrap_or(0)
}

pub fn render(batches: &[RecordBatch]) -> String {
    pretty_format_batches(batches).unwrap().to_string()
}

/// Regular files left under `dir` (spill files live in a subdirectory the disk manager makes).
pub fn files_under(dir: &Path) -> usize {
    walk(dir).len()
}

pub fn walk(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut out = vec![];
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let p = e.path();
        if p.is_dir() {
            out.extend(walk(&p));
        } else {
            out.push(p);
        }
    }
    out
}

/// Each query, and the stock query whose order is the stable order of the first.
pub const QUERIES: &[(&str, &str)] = &[
    ("SELECT * FROM t ORDER BY k, id", "SELECT * FROM t ORDER BY k, id"),
    ("SELECT * FROM t ORDER BY k DESC", "SELECT * FROM t ORDER BY k DESC, id"),
    (
        "SELECT * FROM t ORDER BY s NULLS FIRST, f DESC",
        "SELECT * FROM t ORDER BY s NULLS FIRST, f DESC, id",
    ),
    (
        "SELECT id, s FROM t ORDER BY k + 1, f",
        "SELECT id, s FROM t ORDER BY k + 1, f, id",
    ),
    // Six distinct keys: long runs of ties across runs and merge steps.
    (
        "SELECT * FROM t ORDER BY k IS NULL DESC, id % 3",
        "SELECT * FROM t ORDER BY k IS NULL DESC, id % 3, id",
    ),
];
