//! The external sort on the CPU path: memory-limited sorts that must spill and merge, checked
//! against stock DataFusion (row for row) and for stability; memory accounting, temp files,
//! cancellation, a full disk and a pool too small to make progress.

use std::sync::Arc;
use std::time::Duration;

use arrow::array::RecordBatch;
use arrow::compute::SortOptions;
use arrow::datatypes::SchemaRef;
use datafusion::execution::disk_manager::{DiskManagerBuilder, DiskManagerMode};
use datafusion::execution::memory_pool::{FairSpillPool, MemoryPool};
use datafusion::execution::runtime_env::RuntimeEnvBuilder;
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::physical_expr::expressions::col;
use datafusion::physical_expr::{LexOrdering, PhysicalSortExpr};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::streaming::{PartitionStream, StreamingTableExec};
use datafusion::physical_plan::{ExecutionPlan, execute_stream};
use datafusion::prelude::SessionContext;
use datafusion_gpusort::{GpuSortConfig, GpuSortExec};
use futures::StreamExt;

#[path = "support/external.rs"]
mod external;
use external::{
    QUERIES, ROWS, batch, batches, disk_in, files_under, metric, render, run, schema, session, sort_metrics,
};

#[tokio::test]
async fn spilling_sorts_match_stock_and_keep_input_order_of_ties() {
    let tmp = tempfile::tempdir().unwrap();
    let stock = session(false, None, disk_in(tmp.path()), &[]);
    for (pool, compression) in [(3 << 20, "uncompressed"), (6 << 20, "lz4_frame")] {
        let pool_impl;
        let ours = {
            let ctx = session(
                true,
                Some(pool),
                disk_in(tmp.path()),
                &[
                    ("gpusort.device", "cpu"),
                    ("datafusion.execution.spill_compression", compression),
                ],
            );
            pool_impl = Arc::clone(&ctx.runtime_env().memory_pool);
            ctx
        };
        // Every query through the smaller pool; two through the other, compressed.
        let queries = if pool == 3 << 20 { QUERIES } else { &QUERIES[1..3] };
        for (q, stable) in queries {
            let (expected, _) = run(&stock, stable).await.unwrap();
            let (actual, m) = run(&ours, q).await.unwrap();
            assert_eq!(render(&actual), render(&expected), "{q}, pool {pool}, {compression}");
            let (spills, runs) = (metric(&m, "spill_count"), metric(&m, "runs"));
            // ~9 MB of input through a 3 or 6 MB pool: a handful of runs, each one file.
            assert!((2..=80).contains(&spills), "{q}: {spills} spill files");
            assert!(runs >= 2, "{q}: {runs} runs");
            // No room for a range-merge step: the heap merge.
            assert_eq!(metric(&m, "range_merge_steps"), 0, "{q}: {m}");
            // Every run but the last is spilled, once, and again by each merge of some runs
            // into one (when a read buffer for every run does not fit the pool).
            let spilled = metric(&m, "spilled_rows");
            let merges = metric(&m, "intermediate_merges");
            assert!(spilled >= ROWS / 2, "{q}: {spilled} rows spilled");
            assert!(merges > 0 || spilled <= ROWS, "{q}: {spilled} rows spilled");
            assert_eq!(pool_impl.reserved(), 0, "{q}: the pool is back to 0");
            assert_eq!(files_under(tmp.path()), 0, "{q}: spill files removed");
        }
    }
}

/// Stock DataFusion, and gpusort on the CPU in runs of at most 20,000 rows, no memory limit;
/// temp files in `tmp`.
fn stock_and_runs_of_20000_rows(tmp: &tempfile::TempDir) -> (SessionContext, SessionContext) {
    let stock = session(false, None, disk_in(tmp.path()), &[]);
    let ours = session(
        true,
        None,
        disk_in(tmp.path()),
        &[("gpusort.device", "cpu"), ("gpusort.max_run_rows", "20000")],
    );
    (stock, ours)
}

#[tokio::test]
async fn runs_sized_by_max_run_rows_stay_in_memory() {
    let tmp = tempfile::tempdir().unwrap();
    let (stock, ours) = stock_and_runs_of_20000_rows(&tmp);
    for (q, stable) in QUERIES {
        let (expected, _) = run(&stock, stable).await.unwrap();
        let (actual, m) = run(&ours, q).await.unwrap();
        assert_eq!(render(&actual), render(&expected), "{q}");
        assert!(metric(&m, "runs") >= 8, "{q}: {} runs", metric(&m, "runs"));
        assert!(metric(&m, "budget_runs") >= 8, "{q}");
        assert_eq!(metric(&m, "spill_count"), 0, "{q}: nothing spilled");
        assert!(metric(&m, "range_merge_steps") >= 2, "{q}: merged by key ranges: {m}");
        assert_eq!(metric(&m, "output_rows"), ROWS, "{q}");
    }
}

/// Input in the sort's order (or its reverse) cut into runs: the runs' key ranges are disjoint,
/// so the range merge's steps take shares of runs that do not overlap, which go out as they are
/// (`in_order_steps`), with no sort. Ties across runs go out in run order (input order), also
/// where a reversed order puts a group of ties across two runs; mixed keys sort every step.
#[tokio::test]
async fn runs_of_disjoint_key_ranges_pass_through_the_merge() {
    let tmp = tempfile::tempdir().unwrap();
    let (stock, ours) = stock_and_runs_of_20000_rows(&tmp);
    // How many of the steps go out as they are.
    enum Steps {
        All,
        Some,
        None,
        Any,
    }
    for (q, stable, steps_in_order) in [
        ("SELECT * FROM t ORDER BY id DESC", None, Steps::All),
        ("SELECT * FROM t ORDER BY id", None, Steps::All),
        // Groups of 30,000 rows: a group's ties span runs, in run order.
        (
            "SELECT * FROM t ORDER BY id / 30000",
            Some("SELECT * FROM t ORDER BY id / 30000, id"),
            Steps::All,
        ),
        // Reversed: the run with a group's first ties comes after the group's next run.
        (
            "SELECT * FROM t ORDER BY id / 30000 DESC",
            Some("SELECT * FROM t ORDER BY id / 30000 DESC, id"),
            Steps::Any,
        ),
        ("SELECT id, f FROM t ORDER BY id / 1000, f DESC, id", None, Steps::Some),
        ("SELECT * FROM t ORDER BY k, id", None, Steps::None),
    ] {
        let (expected, _) = run(&stock, stable.unwrap_or(q)).await.unwrap();
        let (actual, m) = run(&ours, q).await.unwrap();
        assert_eq!(render(&actual), render(&expected), "{q}");
        assert!(metric(&m, "runs") >= 8, "{q}: {m}");
        let (steps, in_order) = (metric(&m, "range_merge_steps"), metric(&m, "in_order_steps"));
        assert!(steps >= 2, "{q}: {m}");
        match steps_in_order {
            Steps::All => assert_eq!(in_order, steps, "{q}: {m}"),
            Steps::Some => assert!(
                in_order > 0 && in_order < steps,
                "{q}: {in_order} of {steps} steps in order"
            ),
            Steps::None => assert_eq!(in_order, 0, "{q}: {m}"),
            Steps::Any => {}
        }
    }
}

#[tokio::test]
async fn more_runs_than_the_fan_in_merge_in_levels() {
    let tmp = tempfile::tempdir().unwrap();
    let stock = session(false, None, disk_in(tmp.path()), &[]);
    let ours = session(
        true,
        Some(3 << 20),
        disk_in(tmp.path()).with_max_spill_merge_fan_in(2),
        &[("gpusort.device", "cpu"), ("gpusort.max_run_rows", "15000")],
    );
    for (q, stable) in &QUERIES[..2] {
        let (expected, _) = run(&stock, stable).await.unwrap();
        let (actual, m) = run(&ours, q).await.unwrap();
        assert_eq!(render(&actual), render(&expected), "{q}");
        assert!(metric(&m, "intermediate_merges") >= 5, "{q}: {m}");
        assert_eq!(ours.runtime_env().memory_pool.reserved(), 0);
        assert_eq!(files_under(tmp.path()), 0);
    }
}

/// Bytes of the test table written as Arrow IPC in `batch_rows`-row batches, as a spill
/// writes its rows (uncompressed).
fn ipc_bytes(batch_rows: usize) -> usize {
    let mut writer = arrow::ipc::writer::StreamWriter::try_new(Vec::new(), &schema()).unwrap();
    for start in (0..ROWS).step_by(batch_rows) {
        writer.write(&batch(start..(start + batch_rows).min(ROWS))).unwrap();
    }
    writer.into_inner().unwrap().len()
}

/// The multi-level merge's bound (see its module docs): with `R` runs merged at most `F` at a
/// time, each row is written at most `ceil(log_F(R))` times, so the bytes spilled are at most
/// that many times the table's.
#[tokio::test]
async fn many_runs_spill_within_the_merge_bound() {
    const FAN_IN: usize = 3;
    let tmp = tempfile::tempdir().unwrap();
    let stock = session(false, None, disk_in(tmp.path()), &[]);
    let ours = session(
        true,
        Some(3 << 20),
        disk_in(tmp.path()).with_max_spill_merge_fan_in(FAN_IN),
        &[("gpusort.device", "cpu"), ("gpusort.max_run_rows", "4000")],
    );
    let (q, stable) = QUERIES[0];
    let (expected, _) = run(&stock, stable).await.unwrap();
    let (actual, m) = run(&ours, q).await.unwrap();
    assert_eq!(render(&actual), render(&expected), "{q}");
    let runs = metric(&m, "runs");
    assert!(runs >= 40, "{runs} runs: {m}");
    // ceil(log_3(runs)) passes over the rows: 4 for 28 to 81 runs.
    let passes = (1..).find(|&l| FAN_IN.pow(l) >= runs).unwrap() as usize;
    let levels = metric(&m, "merge_levels");
    assert!(
        (1..passes).contains(&levels),
        "{levels} merge levels for {runs} runs: {m}"
    );
    let (rows, bytes) = (metric(&m, "spilled_rows"), m.spilled_bytes().unwrap_or(0));
    assert!(
        rows <= passes * ROWS,
        "{rows} rows spilled, bound {passes} x {ROWS}: {m}"
    );
    // The spilled batches are the session's (1000 rows); files add a header each.
    let bound = passes * ipc_bytes(1000) + metric(&m, "spill_count") * 1024;
    assert!(bytes > 0 && bytes <= bound, "{bytes} bytes spilled, bound {bound}: {m}");
    // (Merging the leading runs into one, over and over, wrote ~16 times the table here.)
    assert!(rows > ROWS, "the runs were merged in levels: {m}");
    assert_eq!(ours.runtime_env().memory_pool.reserved(), 0, "the pool is back to 0");
    assert_eq!(files_under(tmp.path()), 0, "spill files removed");
}

#[tokio::test]
async fn limit_under_a_small_pool_keeps_only_its_rows() {
    let tmp = tempfile::tempdir().unwrap();
    let stock = session(false, None, disk_in(tmp.path()), &[]);
    let ours = session(true, Some(3 << 20), disk_in(tmp.path()), &[("gpusort.device", "cpu")]);
    for q in [
        "SELECT * FROM t ORDER BY k DESC, id LIMIT 50",
        "SELECT * FROM t ORDER BY s, id LIMIT 5000 OFFSET 10",
    ] {
        let (expected, _) = run(&stock, q).await.unwrap();
        let (actual, m) = run(&ours, q).await.unwrap();
        assert_eq!(render(&actual), render(&expected), "{q}");
        assert_eq!(metric(&m, "spill_count"), 0, "{q}");
        assert_eq!(ours.runtime_env().memory_pool.reserved(), 0);
    }
}

#[tokio::test]
async fn a_full_disk_is_a_clear_error_and_leaves_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let ours = session(
        true,
        Some(3 << 20),
        disk_in(tmp.path()).with_max_temp_directory_size(256 << 10),
        &[("gpusort.device", "cpu")],
    );
    let err = run(&ours, "SELECT * FROM t ORDER BY k").await.unwrap_err().to_string();
    assert!(err.contains("GpuSortExec could not spill a sorted run"), "{err}");
    assert!(err.contains("exceeded") || err.contains("limit"), "{err}");
    assert_eq!(ours.runtime_env().memory_pool.reserved(), 0);
    assert_eq!(files_under(tmp.path()), 0);

    let no_disk = session(
        true,
        Some(3 << 20),
        DiskManagerBuilder::default().with_mode(DiskManagerMode::Disabled),
        &[("gpusort.device", "cpu")],
    );
    let err = run(&no_disk, "SELECT * FROM t ORDER BY k")
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("GpuSortExec could not spill a sorted run"), "{err}");
    assert!(err.to_lowercase().contains("disk"), "{err}");
    assert_eq!(no_disk.runtime_env().memory_pool.reserved(), 0);
}

#[tokio::test]
async fn a_pool_too_small_to_progress_says_what_it_needs() {
    let tmp = tempfile::tempdir().unwrap();
    let ours = session(true, Some(64 << 10), disk_in(tmp.path()), &[("gpusort.device", "cpu")]);
    let err = run(&ours, "SELECT * FROM t ORDER BY k").await.unwrap_err().to_string();
    assert!(
        err.contains("gpusort needs at least") && err.contains("for GpuSortExec"),
        "{err}"
    );
    assert!(err.contains("raise the memory limit"), "{err}");
    assert_eq!(ours.runtime_env().memory_pool.reserved(), 0);
    assert_eq!(files_under(tmp.path()), 0);
}

/// A partition that yields `batches` and then waits forever: a query over it never finishes.
#[derive(Debug)]
struct Stalling(Vec<RecordBatch>);

impl PartitionStream for Stalling {
    fn schema(&self) -> &SchemaRef {
        self.0[0].schema_ref()
    }

    fn execute(&self, _ctx: Arc<TaskContext>) -> SendableRecordBatchStream {
        let batches = self.0.clone();
        Box::pin(RecordBatchStreamAdapter::new(
            self.0[0].schema(),
            futures::stream::iter(batches.into_iter().map(Ok)).chain(futures::stream::pending()),
        ))
    }
}

#[tokio::test]
async fn a_query_cancelled_after_spilling_leaves_no_files_and_no_reservation() {
    let tmp = tempfile::tempdir().unwrap();
    let pool: Arc<dyn MemoryPool> = Arc::new(FairSpillPool::new(3 << 20));
    let runtime = RuntimeEnvBuilder::new()
        .with_memory_pool(Arc::clone(&pool))
        .with_disk_manager_builder(disk_in(tmp.path()))
        .build_arc()
        .unwrap();
    let ctx = Arc::new(TaskContext::default().with_runtime(runtime));
    let input =
        StreamingTableExec::try_new(schema(), vec![Arc::new(Stalling(batches()))], None, vec![], false, None).unwrap();
    let order = LexOrdering::new([PhysicalSortExpr::new(
        col("k", &schema()).unwrap(),
        SortOptions::default(),
    )])
    .unwrap();
    let mut options = GpuSortConfig::default();
    options.device = "cpu".parse().unwrap();
    let sort = Arc::new(
        GpuSortExec::try_new(order, Arc::new(input))
            .unwrap()
            .with_options(options),
    );
    let mut stream = execute_stream(Arc::clone(&sort) as _, ctx).unwrap();
    // The whole input is read and spilled, then the sort waits for more that never comes.
    let waited = tokio::time::timeout(Duration::from_secs(5), stream.next()).await;
    assert!(
        waited.is_err(),
        "the query cannot finish: {:?}",
        waited.map(|b| b.map(|b| b.map(|b| b.num_rows())))
    );
    let spilled = sort_metrics(&(sort as Arc<dyn ExecutionPlan>));
    assert!(metric(&spilled, "spill_count") >= 2, "{spilled}");
    assert!(files_under(tmp.path()) >= 2, "spill files exist while it runs");
    drop(stream);
    // Spill writes run on blocking threads; give one that was in flight time to end.
    for _ in 0..50 {
        if files_under(tmp.path()) == 0 && pool.reserved() == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(files_under(tmp.path()), 0, "spill files removed on cancel");
    assert_eq!(pool.reserved(), 0, "reservation freed on cancel");
}
