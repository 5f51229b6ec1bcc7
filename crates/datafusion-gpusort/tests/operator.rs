//! GpuSortExec through SQL on the CPU path: plans, results against stock DataFusion, options,
//! metrics and memory accounting.

use std::sync::Arc;

use datafusion::execution::SessionStateBuilder;
use datafusion::execution::memory_pool::{FairSpillPool, MemoryPool};
use datafusion::execution::runtime_env::RuntimeEnvBuilder;
use datafusion::prelude::{SessionConfig, SessionContext};
use datafusion_gpusort::SessionStateBuilderExt;

#[path = "support/tables.rs"]
mod tables;
use tables::{compare_with_stock, context, plan, rows, table};

#[path = "support/device_scan.rs"]
mod device_scan;
use device_scan::{DEVICE_SCAN_ORDERS, check_device_scan, t_as_parquet};

#[tokio::test]
async fn order_by_matches_stock_datafusion() {
    // 8000 rows in batches of 100 come out as 80 slices, cut on all cores.
    for (rows, partitions) in [(2000, 1), (2000, 3), (8000, 3)] {
        let stock = context(false, rows, partitions);
        let ours = context(true, rows, partitions);
        compare_with_stock(&stock, &ours, &format!("{rows} rows, {partitions} partitions")).await;
    }
}

/// Whether a plan holds DataFusion's `SortExec`.
fn has_stock_sort(plan: &str) -> bool {
    plan.replace("GpuSortExec", "").contains("SortExec")
}

#[tokio::test]
async fn plans_show_gpu_sort_and_options_apply() {
    let ctx = context(true, 2000, 3);
    // A small TopK stays DataFusion's streaming heap (gpusort.topk_max_fetch = 1000) ...
    let p = plan(&ctx, "SELECT * FROM t ORDER BY a DESC LIMIT 10").await;
    assert!(
        has_stock_sort(&p) && p.contains("SortExec: TopK(fetch=10), expr=[a@0 DESC]") && !p.contains("GpuSortExec"),
        "{p}"
    );
    let p = plan(&ctx, "SELECT * FROM t ORDER BY a DESC LIMIT 990 OFFSET 10").await;
    assert!(!p.contains("GpuSortExec"), "{p}");
    // ... a larger one (the fetch counts the OFFSET) sorts in GpuSortExec.
    let p = plan(&ctx, "SELECT * FROM t ORDER BY a DESC LIMIT 990 OFFSET 11").await;
    assert!(
        p.contains("GpuSortExec: TopK(fetch=1001), expr=[a@0 DESC]") && !has_stock_sort(&p),
        "{p}"
    );
    ctx.sql("SET gpusort.topk_max_fetch = 0").await.unwrap();
    let p = plan(&ctx, "SELECT * FROM t ORDER BY a DESC LIMIT 10").await;
    assert!(p.contains("GpuSortExec: TopK(fetch=10), expr=[a@0 DESC]"), "{p}");
    assert!(p.contains("strategy=srts-direct") && p.contains("device=auto"), "{p}");
    // One sort over all partitions instead of per-partition sorts and a merge.
    assert!(
        p.contains("CoalescePartitionsExec") && !p.contains("SortPreservingMergeExec"),
        "{p}"
    );

    // Without merge_partitions: a sort per partition, merged on the GPU, or by DataFusion
    // without merge_sorted_partitions too.
    ctx.sql("SET gpusort.merge_partitions = false").await.unwrap();
    let p = plan(&ctx, "SELECT * FROM t ORDER BY a").await;
    assert!(
        p.contains("GpuSortPreservingMergeExec") && p.contains("preserve_partitioning=[true]"),
        "{p}"
    );
    ctx.sql("SET gpusort.merge_sorted_partitions = false").await.unwrap();
    let p = plan(&ctx, "SELECT * FROM t ORDER BY a").await;
    assert!(
        p.contains("SortPreservingMergeExec") && !p.contains("GpuSortPreservingMergeExec"),
        "{p}"
    );
    ctx.sql("SET gpusort.merge_sorted_partitions = true").await.unwrap();

    ctx.sql("SET gpusort.strategy = 'grs-indirect'").await.unwrap();
    let p = plan(&ctx, "SELECT * FROM t ORDER BY a").await;
    assert!(p.contains("strategy=grs-indirect"), "{p}");

    let err = ctx.sql("SET gpusort.strategy = 'bogus'").await.unwrap_err().to_string();
    assert!(err.contains("gpusort.strategy"), "{err}");

    ctx.sql("SET gpusort.enabled = false").await.unwrap();
    let p = plan(&ctx, "SELECT * FROM t ORDER BY a").await;
    assert!(p.contains("SortExec") && !p.contains("GpuSortExec"), "{p}");
}

/// Projections and filters that DataFusion plans between the merge of sorted partitions and
/// the per-partition sorts go above one `GpuSortExec` over all partitions.
#[tokio::test]
async fn projections_and_filters_over_partition_sorts_get_one_sort() {
    let ctx = context(true, 2000, 4);
    // (query, whether the projection is planned above the sort: below it when a sort key is
    // one of its expressions)
    for (q, above) in [
        ("SELECT c, b, a FROM t ORDER BY b NULLS FIRST, a DESC, c", true),
        (
            "SELECT a * 2 AS a2, c, b FROM t WHERE c > 0.5 ORDER BY b, a2 DESC, c",
            false,
        ),
        ("SELECT c, b, a FROM t ORDER BY a, b, c LIMIT 1500", true),
    ] {
        let p = plan(&ctx, q).await;
        assert!(
            p.matches("GpuSortExec").count() == 1
                && !p.contains("SortPreservingMergeExec")
                && !p.contains("preserve_partitioning=[true]")
                && p.contains("CoalescePartitionsExec")
                && !has_stock_sort(&p),
            "{q}:\n{p}"
        );
        let physical = p.split("physical_plan").nth(1).unwrap_or(&p);
        let (projection, sort) = (physical.find("ProjectionExec"), physical.find("GpuSortExec"));
        assert!(
            projection.is_some() && (projection < sort) == above,
            "{q}: the projection is {} the sort:\n{p}",
            if above { "above" } else { "below" }
        );
    }
    // Without merge_partitions, the per-partition sorts and a merge stay.
    ctx.sql("SET gpusort.merge_partitions = false").await.unwrap();
    let p = plan(&ctx, "SELECT c, b, a FROM t ORDER BY b, a, c").await;
    assert!(
        p.contains("GpuSortPreservingMergeExec") && p.contains("preserve_partitioning=[true]"),
        "{p}"
    );
}

#[tokio::test]
async fn explain_analyze_shows_path_and_reason() {
    let ctx = context(true, 2000, 1);
    let (text, _) = rows(&ctx, "EXPLAIN ANALYZE SELECT * FROM t ORDER BY b, a").await;
    assert!(text.contains("GpuSortExec"), "{text}");
    assert!(text.contains("cpu_sorts=1"), "{text}");
    assert!(text.contains("path=cpu srts-direct"), "{text}");
    assert!(
        text.contains("cpu_fallback=2000 rows < gpusort.min_rows = 100000"),
        "{text}"
    );

    ctx.sql("SET gpusort.device = 'cpu'").await.unwrap();
    let (text, _) = rows(&ctx, "EXPLAIN ANALYZE SELECT * FROM t ORDER BY b, a").await;
    assert!(text.contains("cpu_fallback=gpusort.device = cpu"), "{text}");

    // Above min_rows, with no GPU in CI, the reason is the missing GPU (on a GPU machine
    // this runs on the GPU).
    ctx.sql("SET gpusort.device = 'auto'").await.unwrap();
    ctx.sql("SET gpusort.min_rows = 0").await.unwrap();
    let (text, _) = rows(&ctx, "EXPLAIN ANALYZE SELECT * FROM t ORDER BY b, a").await;
    assert!(
        text.contains("gpu_sorts=1") || text.contains("cpu_fallback=no GPU"),
        "{text}"
    );
}

/// `gpusort.devices`: with `device = auto` and fewer GPUs than it names, the sort still runs
/// (on the CPU with the reason where there is no GPU, on the GPUs there are otherwise); with a
/// GPU number for `device`, a missing GPU of the list fails the query and says which option.
#[tokio::test]
async fn devices_option_splits_or_says_why_not() {
    let stock = context(false, 30_000, 3);
    let ours = context(true, 30_000, 3);
    for (k, v) in [("min_rows", "0"), ("devices", "all"), ("split_min_rows", "1000")] {
        ours.sql(&format!("SET gpusort.{k} = '{v}'")).await.unwrap();
    }
    compare_with_stock(&stock, &ours, "gpusort.devices = all").await;
    let (text, _) = rows(&ours, "EXPLAIN ANALYZE SELECT * FROM t ORDER BY b, a").await;
    assert!(
        text.contains("gpu_sorts=1") || text.contains("cpu_fallback=no GPU"),
        "{text}"
    );
    assert!(ours.sql("SET gpusort.devices = '0,x'").await.is_err());

    let gpus = gpusort_cuda::device::device_count().unwrap_or(0);
    let beyond = format!("0,{}", gpus.max(1));
    ours.sql("SET gpusort.device = '0'").await.unwrap();
    ours.sql(&format!("SET gpusort.devices = '{beyond}'")).await.unwrap();
    let err = ours
        .sql("SELECT * FROM t ORDER BY b, a")
        .await
        .unwrap()
        .collect()
        .await
        .unwrap_err()
        .to_string();
    assert!(
        err.contains(&format!("gpusort.devices = {beyond}, but a GPU of them cannot be used")),
        "{err}"
    );
}

#[tokio::test]
async fn memory_limits_fail_clearly_and_return_to_zero() {
    for limit in [4 << 10, 64 << 10, 256 << 10, 16 << 20] {
        let pool: Arc<dyn MemoryPool> = Arc::new(FairSpillPool::new(limit));
        let runtime = RuntimeEnvBuilder::new()
            .with_memory_pool(pool.clone())
            .build_arc()
            .unwrap();
        let state = SessionStateBuilder::new()
            .with_config(SessionConfig::new().with_target_partitions(2))
            .with_runtime_env(runtime)
            .with_default_features()
            .with_gpusort()
            .build();
        let ctx = SessionContext::new_with_state(state);
        ctx.register_table("t", Arc::new(table(20_000, 2))).unwrap();
        let result = ctx.sql("SELECT * FROM t ORDER BY b, a").await.unwrap().collect().await;
        match result {
            Ok(batches) => assert_eq!(batches.iter().map(|b| b.num_rows()).sum::<usize>(), 20_000),
            Err(e) => {
                let msg = e.to_string();
                assert!(
                    msg.contains("Resources exhausted") && msg.contains("GpuSortExec"),
                    "{msg}"
                );
            }
        }
        assert_eq!(pool.reserved(), 0, "limit {limit}");
    }
}

#[tokio::test]
async fn output_metrics_count_rows_batches_and_the_sorted_bytes_once() {
    use datafusion::common::utils::memory::RecordBatchMemoryCounter;
    use datafusion::physical_plan::{ExecutionPlan, collect};
    let ctx = context(true, 2000, 3);
    let plan = ctx
        .sql("SELECT * FROM t ORDER BY a, b")
        .await
        .unwrap()
        .create_physical_plan()
        .await
        .unwrap();
    let out = collect(Arc::clone(&plan), ctx.task_ctx()).await.unwrap();
    fn find(p: &Arc<dyn ExecutionPlan>) -> Option<Arc<dyn ExecutionPlan>> {
        if p.name() == "GpuSortExec" {
            return Some(Arc::clone(p));
        }
        p.children().into_iter().find_map(find)
    }
    let m = find(&plan)
        .expect("a GpuSortExec")
        .metrics()
        .unwrap()
        .aggregate_by_name();
    let sum = |name: &str| -> usize {
        m.iter()
            .filter(|x| x.value().name() == name)
            .map(|x| x.value().as_usize())
            .sum()
    };
    assert_eq!(m.output_rows(), Some(2000));
    assert_eq!(sum("output_batches"), out.len());
    assert_eq!(out.len(), 20, "2000 rows in batches of 100");
    // The slices share the sorted batch's buffers: the bytes are counted once, not per slice.
    let mut counter = RecordBatchMemoryCounter::new();
    let held: usize = out.iter().map(|b| counter.count_batch(b)).sum();
    let bytes = sum("output_bytes");
    assert!(
        bytes <= held && bytes + out.len() >= held,
        "output_bytes {bytes}, the output holds {held}"
    );
}

#[tokio::test]
async fn output_views_are_compacted_unless_asked_not_to() {
    use arrow::array::{Array, AsArray, RecordBatch};
    let ctx = context(true, 2000, 3);
    // Values of 30+ bytes: not inlined in the views, so they live in data buffers.
    let sql = "SELECT a, arrow_cast(concat(b, '-longer-than-twelve-bytes'), 'Utf8View') AS v FROM t ORDER BY a, v";
    assert!(plan(&ctx, sql).await.contains("GpuSortExec"));
    let (compacted, batches) = rows(&ctx, sql).await;
    ctx.sql("SET gpusort.compact_output_views = false").await.unwrap();
    let (sliced, slices) = rows(&ctx, sql).await;
    assert_eq!(compacted, sliced);
    assert_eq!(batches.len(), 20, "2000 rows in batches of 100");
    let held = |b: &RecordBatch| -> usize {
        let v = b.column(1).as_string_view();
        v.data_buffers().iter().map(|d| d.len()).sum()
    };
    let own = |b: &RecordBatch| -> usize {
        let v = b.column(1).as_string_view();
        (0..v.len()).filter(|&i| v.is_valid(i)).map(|i| v.value(i).len()).sum()
    };
    for (c, s) in batches.iter().zip(&slices) {
        assert!(
            own(c) > 0 && held(c) <= own(c),
            "compacted: holds {} for {} bytes",
            held(c),
            own(c)
        );
        // A slice keeps the sorted column's buffers: about twenty batches' bytes.
        assert!(held(s) >= 10 * own(s), "slice: holds {} for {} bytes", held(s), own(s));
    }
}

/// Stock DataFusion and gpusort on the CPU over 3,000 rows of `t`, written to `t.parquet` in
/// the directory returned.
async fn cpu_sorts_of_t_as_parquet() -> (tempfile::TempDir, SessionContext, SessionContext) {
    let dir = tempfile::tempdir().unwrap();
    let (stock, ours) = (context(false, 3_000, 4), context(true, 3_000, 4));
    ours.sql("SET gpusort.device = 'cpu'").await.unwrap();
    t_as_parquet(&stock, dir.path()).await;
    (dir, stock, ours)
}

/// A sort told its input's file (`DeviceScan`) that sorts on the CPU executes its input as ever:
/// stock DataFusion's rows, the fallback counted, no file read by the sort.
#[tokio::test]
async fn a_device_scan_of_a_sort_on_the_cpu_falls_back_to_the_input() {
    let (dir, stock, ours) = cpu_sorts_of_t_as_parquet().await;
    let file = dir.path().join("t.parquet");
    for order in DEVICE_SCAN_ORDERS {
        check_device_scan(&stock, &ours, &file, order, (0, 1)).await;
    }
}

/// With `gpusort.device_scan`, the rule tells a sort its Parquet input's files where the input
/// only scans them (all their columns or some), not where it filters them, and not without the
/// option; the rows are stock DataFusion's either way (here on the CPU, which reads the input).
#[tokio::test]
async fn the_rule_tells_a_sort_of_a_whole_parquet_scan_its_files() {
    let (dir, stock, ours) = cpu_sorts_of_t_as_parquet().await;
    let file = dir.path().join("t.parquet");
    let create = format!(
        "CREATE EXTERNAL TABLE f STORED AS PARQUET LOCATION '{}'",
        file.display()
    );
    for ctx in [&stock, &ours] {
        ctx.sql(&create).await.unwrap();
    }
    for (on, query, told) in [
        (true, "SELECT * FROM f ORDER BY a, b, c", true),
        (true, "SELECT c, a FROM f ORDER BY a, c", true),
        (true, "SELECT * FROM f WHERE a > 10 ORDER BY a, b, c", false),
        (true, "SELECT * FROM f ORDER BY a, b, c LIMIT 5", false),
        (false, "SELECT * FROM f ORDER BY a, b, c", false),
    ] {
        ours.sql(&format!("SET gpusort.device_scan = {on}")).await.unwrap();
        let shown = rows(&ours, &format!("EXPLAIN {query}")).await.0;
        assert_eq!(
            shown.contains("device_scan=1 files"),
            told,
            "{query} (device_scan {on}):\n{shown}"
        );
        assert_eq!(rows(&ours, query).await.0, rows(&stock, query).await.0, "{query}");
    }
}
