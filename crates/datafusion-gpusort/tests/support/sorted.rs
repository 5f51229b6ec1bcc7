//! Tables whose partitions are each sorted (declared `WITH ORDER`), sessions over them, and
//! what the tests of `GpuSortPreservingMergeExec` read back: shared by the CPU and GPU tests.
#![allow(dead_code)]

use std::cmp::Ordering;
use std::path::Path;
use std::sync::Arc;

use arrow::array::{Array, AsArray, Int64Array, RecordBatch, StringViewArray};
use arrow::datatypes::{DataType, Field, Int64Type, Schema};
use datafusion::datasource::MemTable;
use datafusion::execution::SessionStateBuilder;
use datafusion::execution::disk_manager::{DiskManagerBuilder, DiskManagerMode};
use datafusion::execution::memory_pool::MemoryPool;
use datafusion::execution::runtime_env::RuntimeEnvBuilder;
use datafusion::physical_plan::metrics::MetricsSet;
use datafusion::physical_plan::{ExecutionPlan, collect};
use datafusion::prelude::{SessionConfig, SessionContext, col};
use datafusion_gpusort::{GpuSortPreservingMergeExec, SessionStateBuilderExt};

/// The order every partition of [`sorted_table`] is in, as SQL.
pub const ORDER: &str = "k NULLS FIRST, s DESC NULLS LAST, id";

/// One row: `k` (nulls, many repeats), `s` (nulls, repeats), `id` (unique).
pub type Row = (Option<i64>, Option<String>, i64);

/// `rows` rows in `partitions` partitions (some of them may be empty), each sorted by
/// [`ORDER`] and cut into batches of `batch_rows`, declared sorted that way.
pub fn sorted_table(rows: usize, partitions: usize, batch_rows: usize) -> Arc<MemTable> {
    let schema = Arc::new(Schema::new(vec![
        Field::new("k", DataType::Int64, true),
        Field::new("s", DataType::Utf8View, true),
        Field::new("id", DataType::Int64, false),
    ]));
    let mut parts: Vec<Vec<Row>> = vec![vec![]; partitions];
    for i in 0..rows {
        let h = (i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 20;
        let k = (h % 17 != 3).then_some((h % 41) as i64 - 20);
        let s = (h % 13 != 5).then(|| format!("v{}", (h >> 8) % 9));
        // Uneven partitions: partition p takes rows where h picks it.
        parts[((h >> 16) as usize % (partitions * 2)).min(partitions - 1)].push((k, s, i as i64));
    }
    let batches = parts
        .into_iter()
        .map(|mut part| {
            part.sort_by(declared_order);
            part.chunks(batch_rows)
                .map(|chunk| {
                    let k: Int64Array = chunk.iter().map(|r| r.0).collect();
                    let s: StringViewArray = chunk.iter().map(|r| r.1.as_deref()).collect();
                    let id: Int64Array = chunk.iter().map(|r| r.2).collect();
                    RecordBatch::try_new(Arc::clone(&schema), vec![Arc::new(k), Arc::new(s), Arc::new(id)]).unwrap()
                })
                .collect()
        })
        .collect();
    let order = vec![vec![
        col("k").sort(true, true),
        col("s").sort(false, false),
        col("id").sort(true, false),
    ]];
    Arc::new(MemTable::try_new(schema, batches).unwrap().with_sort_order(order))
}

/// [`ORDER`] on rows.
pub fn declared_order(a: &Row, b: &Row) -> Ordering {
    a.0.cmp(&b.0)
        .then_with(|| match (&a.1, &b.1) {
            (None, None) => Ordering::Equal,
            (None, Some(_)) => Ordering::Greater,
            (Some(_), None) => Ordering::Less,
            (Some(x), Some(y)) => y.cmp(x),
        })
        .then(a.2.cmp(&b.2))
}

/// A session with gpusort (or without) over `table` as `t`, batches of 100 rows, in a pool of
/// `pool` bytes (`None`: unbounded). Two target partitions: DataFusion 55 spreads a table of
/// fewer partitions than the target over more, and forgets its order when it does.
pub fn session(gpusort: bool, table: Arc<MemTable>, pool: Option<Arc<dyn MemoryPool>>) -> SessionContext {
    session_in(gpusort, table, pool, None)
}

/// [`session`], spilling into `spill_dir` (`None`: the OS's temporary directory).
pub fn session_in(
    gpusort: bool,
    table: Arc<MemTable>,
    pool: Option<Arc<dyn MemoryPool>>,
    spill_dir: Option<&Path>,
) -> SessionContext {
    let mut runtime = RuntimeEnvBuilder::new();
    if let Some(pool) = pool {
        runtime = runtime.with_memory_pool(pool);
    }
    if let Some(dir) = spill_dir {
        let mode = DiskManagerMode::Directories(vec![dir.to_path_buf()]);
        runtime = runtime.with_disk_manager_builder(DiskManagerBuilder::default().with_mode(mode));
    }
    let config = SessionConfig::new().with_target_partitions(2).with_batch_size(100);
    let mut builder = SessionStateBuilder::new()
        .with_config(config)
        .with_runtime_env(runtime.build_arc().unwrap())
        .with_default_features();
    if gpusort {
        builder = builder.with_gpusort();
    }
    let ctx = SessionContext::new_with_state(builder.build());
    ctx.register_table("t", table).unwrap();
    ctx
}

/// Files under `dir`, at any depth.
pub fn files_under(dir: &Path) -> usize {
    std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .map(|e| match e.path() {
            p if p.is_dir() => files_under(&p),
            _ => 1,
        })
        .sum()
}

/// Whether a plan holds DataFusion's own merge.
pub fn has_stock_merge(plan: &str) -> bool {
    plan.replace("GpuSortPreservingMergeExec", "")
        .contains("SortPreservingMergeExec")
}

/// Runs `sql` and returns its batches and the metrics of the plan's
/// `GpuSortPreservingMergeExec` (aggregated by name; empty when there is none).
pub async fn run_merge(ctx: &SessionContext, sql: &str) -> datafusion::error::Result<(Vec<RecordBatch>, MetricsSet)> {
    let plan = ctx.sql(sql).await?.create_physical_plan().await?;
    let batches = collect(Arc::clone(&plan), ctx.task_ctx()).await?;
    let mut metrics = MetricsSet::new();
    let mut nodes: Vec<Arc<dyn ExecutionPlan>> = vec![plan];
    while let Some(node) = nodes.pop() {
        if node.downcast_ref::<GpuSortPreservingMergeExec>().is_some() {
            for m in node
                .metrics()
                .into_iter()
                .flat_map(|m| m.iter().cloned().collect::<Vec<_>>())
            {
                metrics.push(m);
            }
        }
        nodes.extend(node.children().into_iter().cloned());
    }
    Ok((batches, metrics.aggregate_by_name()))
}

/// The count metric `name` of `m` (0 when absent).
pub fn metric(m: &MetricsSet, name: &str) -> usize {
    m.iter()
        .find(|x| x.value().name() == name)
        .map_or(0, |x| x.value().as_usize())
}

/// Columns `k` and `id` (the first two) of `batches` as rows.
pub fn k_id(batches: &[RecordBatch], k: usize, id: usize) -> Vec<(Option<i64>, i64)> {
    batches
        .iter()
        .flat_map(|b| {
            let ks = b.column(k).as_primitive::<Int64Type>().clone();
            let ids = b.column(id).as_primitive::<Int64Type>().clone();
            (0..b.num_rows()).map(move |i| (ks.is_valid(i).then(|| ks.value(i)), ids.value(i)))
        })
        .collect()
}

/// What `ORDER BY k NULLS FIRST` gives on `table` when ties keep partition order: the
/// partitions one after the other, sorted stably by `k`.
pub async fn partitions_then_k(table: &MemTable) -> Vec<(Option<i64>, i64)> {
    let mut rows = vec![];
    for partition in table.batches.iter() {
        rows.extend(k_id(&partition.read().await, 0, 2));
    }
    rows.sort_by_key(|r| r.0);
    rows
}
