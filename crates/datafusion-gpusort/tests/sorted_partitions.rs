//! `GpuSortPreservingMergeExec` on the CPU path: the merge of partitions that are already
//! sorted (a table declared `WITH ORDER`), checked against stock DataFusion's
//! `SortPreservingMergeExec` row for row, for the order of ties, under memory limits that make
//! it spill, and on empty input.

use std::cmp::Ordering;
use std::sync::Arc;

use arrow::array::{Array, AsArray, Int64Array, RecordBatch, StringViewArray};
use arrow::datatypes::{DataType, Field, Int64Type, Schema};
use datafusion::datasource::MemTable;
use datafusion::execution::SessionStateBuilder;
use datafusion::execution::memory_pool::{FairSpillPool, MemoryPool};
use datafusion::execution::runtime_env::RuntimeEnvBuilder;
use datafusion::physical_plan::{ExecutionPlan, collect};
use datafusion::prelude::{SessionConfig, SessionContext, col};
use datafusion_gpusort::{GpuSortPreservingMergeExec, SessionStateBuilderExt};

#[path = "support/tables.rs"]
mod tables;
use tables::{plan, rows};

/// The order every partition of [`sorted_table`] is in, as SQL.
const ORDER: &str = "k NULLS FIRST, s DESC NULLS LAST, id";

/// One row: `k` (nulls, many repeats), `s` (nulls, repeats), `id` (unique).
type Row = (Option<i64>, Option<String>, i64);

/// `rows` rows in `partitions` partitions (some of them may be empty), each sorted by
/// [`ORDER`] and cut into batches of `batch_rows`, declared sorted that way.
fn sorted_table(rows: usize, partitions: usize, batch_rows: usize) -> Arc<MemTable> {
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
fn declared_order(a: &Row, b: &Row) -> Ordering {
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
fn session(gpusort: bool, table: Arc<MemTable>, pool: Option<Arc<dyn MemoryPool>>) -> SessionContext {
    let mut runtime = RuntimeEnvBuilder::new();
    if let Some(pool) = pool {
        runtime = runtime.with_memory_pool(pool);
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

/// Whether a plan holds DataFusion's own merge.
fn has_stock_merge(plan: &str) -> bool {
    plan.replace("GpuSortPreservingMergeExec", "")
        .contains("SortPreservingMergeExec")
}

/// Runs `sql` and returns its batches and the spill files of the plan's
/// `GpuSortPreservingMergeExec`s.
async fn run_counting_spills(ctx: &SessionContext, sql: &str) -> datafusion::error::Result<(Vec<RecordBatch>, usize)> {
    let plan = ctx.sql(sql).await?.create_physical_plan().await?;
    let batches = collect(Arc::clone(&plan), ctx.task_ctx()).await?;
    let mut value = 0;
    let mut nodes: Vec<Arc<dyn ExecutionPlan>> = vec![plan];
    while let Some(node) = nodes.pop() {
        if node.downcast_ref::<GpuSortPreservingMergeExec>().is_some() {
            value += node.metrics().and_then(|m| m.spill_count()).unwrap_or(0);
        }
        nodes.extend(node.children().into_iter().cloned());
    }
    Ok((batches, value))
}

#[tokio::test]
async fn merges_sorted_partitions_as_stock_datafusion_does() {
    for (rows_n, partitions, batch_rows) in [(3000, 3, 70), (5000, 6, 1000), (40, 5, 3)] {
        let table = sorted_table(rows_n, partitions, batch_rows);
        let stock = session(false, Arc::clone(&table), None);
        let ours = session(true, table, None);
        for (q, min_rows) in [
            (format!("SELECT * FROM t ORDER BY {ORDER}"), "100000"),
            (format!("SELECT * FROM t ORDER BY {ORDER}"), "0"),
            (format!("SELECT id, s FROM t ORDER BY {ORDER}"), "0"),
            (format!("SELECT * FROM t WHERE id % 3 = 1 ORDER BY {ORDER}"), "0"),
        ] {
            ours.sql(&format!("SET gpusort.min_rows = {min_rows}")).await.unwrap();
            let what = format!("{q} ({rows_n} rows, {partitions} partitions, min_rows {min_rows})");
            let p = plan(&ours, &q).await;
            assert!(
                p.contains("GpuSortPreservingMergeExec") && !has_stock_merge(&p),
                "{what}:\n{p}"
            );
            assert!(!p.contains("SortExec"), "{what}: a sort is planned:\n{p}");
            let p = plan(&stock, &q).await;
            assert!(has_stock_merge(&p), "{what}: stock DataFusion plans no merge:\n{p}");
            let (expected, _) = rows(&stock, &q).await;
            let (actual, batches) = rows(&ours, &q).await;
            assert_eq!(actual, expected, "{what}");
            assert!(batches.iter().all(|b| b.num_rows() <= 100), "{what}: batch_size");
        }
    }
}

#[tokio::test]
async fn rows_with_equal_keys_come_out_partition_by_partition() {
    let table = sorted_table(4000, 4, 128);
    // Expected: the partitions one after the other, sorted stably by k alone.
    let mut expected: Vec<(Option<i64>, i64)> = vec![];
    for partition in table.batches.iter() {
        for batch in partition.read().await.iter() {
            let k = batch.column(0).as_primitive::<Int64Type>();
            let id = batch.column(2).as_primitive::<Int64Type>();
            expected.extend((0..batch.num_rows()).map(|i| (k.is_valid(i).then(|| k.value(i)), id.value(i))));
        }
    }
    expected.sort_by_key(|r| r.0);
    let ours = session(true, table, None);
    for min_rows in ["100000", "0"] {
        ours.sql(&format!("SET gpusort.min_rows = {min_rows}")).await.unwrap();
        let (_, batches) = rows(&ours, "SELECT k, id FROM t ORDER BY k NULLS FIRST").await;
        let actual: Vec<(Option<i64>, i64)> = batches
            .iter()
            .flat_map(|b| {
                let k = b.column(0).as_primitive::<Int64Type>().clone();
                let id = b.column(1).as_primitive::<Int64Type>().clone();
                (0..b.num_rows()).map(move |i| (k.is_valid(i).then(|| k.value(i)), id.value(i)))
            })
            .collect();
        assert!(actual == expected, "min_rows {min_rows}: ties out of partition order");
    }
}

#[tokio::test]
async fn a_limit_and_the_option_off_keep_datafusion_merge() {
    let ours = session(true, sorted_table(1000, 3, 100), None);
    let p = plan(&ours, &format!("SELECT * FROM t ORDER BY {ORDER} LIMIT 5")).await;
    assert!(has_stock_merge(&p) && !p.contains("GpuSortPreservingMergeExec"), "{p}");
    ours.sql("SET gpusort.merge_sorted_partitions = false").await.unwrap();
    let p = plan(&ours, &format!("SELECT * FROM t ORDER BY {ORDER}")).await;
    assert!(has_stock_merge(&p) && !p.contains("GpuSortPreservingMergeExec"), "{p}");
}

#[tokio::test]
async fn small_pools_spill_or_fail_clearly_and_memory_returns_to_zero() {
    let table = sorted_table(30_000, 4, 500);
    let stock = session(false, Arc::clone(&table), None);
    let q = format!("SELECT * FROM t ORDER BY {ORDER}");
    let (expected, _) = rows(&stock, &q).await;
    let mut spilled = 0;
    for limit in [8 << 10, 128 << 10, 512 << 10, 2 << 20, 64 << 20] {
        let pool: Arc<dyn MemoryPool> = Arc::new(FairSpillPool::new(limit));
        let ours = session(true, Arc::clone(&table), Some(Arc::clone(&pool)));
        match run_counting_spills(&ours, &q).await {
            Ok((batches, spills)) => {
                let actual = arrow::util::pretty::pretty_format_batches(&batches)
                    .unwrap()
                    .to_string();
                assert!(actual == expected, "limit {limit}: rows differ from DataFusion's");
                spilled += usize::from(spills > 0);
            }
            Err(e) => {
                let msg = e.to_string();
                assert!(
                    msg.contains("Resources exhausted") && msg.contains("for GpuSortPreservingMergeExec"),
                    "{msg}"
                );
            }
        }
        assert_eq!(pool.reserved(), 0, "limit {limit}");
    }
    // 30,000 rows of ~1 MB: the three smaller pools that succeed all spill.
    assert!(spilled >= 2, "{spilled} pools made the merge spill");
}

#[tokio::test]
async fn empty_input_merges_to_no_rows() {
    let ours = session(true, sorted_table(0, 3, 10), None);
    let q = format!("SELECT * FROM t ORDER BY {ORDER}");
    assert!(plan(&ours, &q).await.contains("GpuSortPreservingMergeExec"));
    let (_, batches) = rows(&ours, &q).await;
    assert_eq!(batches.iter().map(|b| b.num_rows()).sum::<usize>(), 0);
}
