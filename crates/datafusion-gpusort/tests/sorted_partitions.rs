//! `GpuSortPreservingMergeExec` on the CPU path: the merge of partitions that are already
//! sorted (a table declared `WITH ORDER`), checked against stock DataFusion's
//! `SortPreservingMergeExec` row for row, for the order of ties, under memory limits that make
//! it spill, and on empty input.

use std::sync::Arc;

use datafusion::catalog::TableProvider;
use datafusion::execution::memory_pool::{FairSpillPool, MemoryPool};
use datafusion::physical_plan::{ExecutionPlanProperties, collect};
use datafusion_gpusort::GpuSortPreservingMergeExec;

#[path = "support/tables.rs"]
mod tables;
use tables::{plan, rows};

#[path = "support/sorted.rs"]
mod sorted;
use futures::StreamExt;
use sorted::{
    ORDER, files_under, has_stock_merge, k_id, partitions_then_k, run_merge, session, session_in, sorted_table,
};

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
    let expected = partitions_then_k(&table).await;
    let ours = session(true, table, None);
    for min_rows in ["100000", "0"] {
        ours.sql(&format!("SET gpusort.min_rows = {min_rows}")).await.unwrap();
        let (_, batches) = rows(&ours, "SELECT k, id FROM t ORDER BY k NULLS FIRST").await;
        assert!(
            k_id(&batches, 0, 1) == expected,
            "min_rows {min_rows}: ties out of partition order"
        );
    }
}

/// A `LIMIT` of at most `gpusort.topk_max_fetch` keeps DataFusion's merge (it stops reading
/// early); a larger one merges here and keeps its first rows, equal to DataFusion's (also where
/// one partition holds every row: one run, cut at the limit); the option off keeps DataFusion's.
#[tokio::test]
async fn limits_and_the_option_off() {
    let table = sorted_table(5000, 3, 100);
    let stock = session(false, Arc::clone(&table), None);
    let ours = session(true, table, None);
    let p = plan(&ours, &format!("SELECT * FROM t ORDER BY {ORDER} LIMIT 5")).await;
    assert!(has_stock_merge(&p) && !p.contains("GpuSortPreservingMergeExec"), "{p}");
    for (q, fetch) in [
        (format!("SELECT * FROM t ORDER BY {ORDER} LIMIT 1500"), 1500),
        (format!("SELECT * FROM t ORDER BY {ORDER} LIMIT 1000 OFFSET 700"), 1700),
        (
            format!("SELECT * FROM t WHERE id % 3 = 0 ORDER BY {ORDER} LIMIT 4999"),
            4999,
        ),
    ] {
        let p = plan(&ours, &q).await;
        assert!(
            p.contains(&format!(
                "GpuSortPreservingMergeExec: [k@0 ASC, s@1 DESC NULLS LAST, id@2 ASC NULLS LAST], fetch={fetch}"
            )) && !has_stock_merge(&p),
            "{q}:\n{p}"
        );
        let (expected, _) = rows(&stock, &q).await;
        let (actual, _) = rows(&ours, &q).await;
        assert_eq!(actual, expected, "{q}");
    }
    // One partition holds every row: one run, cut at the limit. (Built by hand: a scan under
    // a planned limit takes the fetch itself.)
    let full = sorted_table(9000, 3, 100);
    let part = full.batches[0].read().await.clone();
    let rows_in = part.iter().map(|b| b.num_rows()).sum::<usize>();
    let only = Arc::new(
        datafusion::datasource::MemTable::try_new(full.schema(), vec![part, vec![], vec![]])
            .unwrap()
            .with_sort_order(full.sort_order.lock().clone()),
    );
    let (stock_one, ours_one) = (session(false, Arc::clone(&only), None), session(true, only, None));
    let scan = ours_one
        .sql("SELECT * FROM t")
        .await
        .unwrap()
        .create_physical_plan()
        .await
        .unwrap();
    let order = scan.output_ordering().expect("declared sorted").clone();
    for fetch in [1, 1200, rows_in + 5] {
        let merge = GpuSortPreservingMergeExec::try_new(order.clone(), Arc::clone(&scan))
            .unwrap()
            .with_fetch(Some(fetch));
        let batches = collect(Arc::new(merge), ours_one.task_ctx()).await.unwrap();
        let q = format!("SELECT * FROM t ORDER BY {ORDER} LIMIT {fetch}");
        let (expected, _) = rows(&stock_one, &q).await;
        let actual = arrow::util::pretty::pretty_format_batches(&batches)
            .unwrap()
            .to_string();
        assert!(actual == expected, "fetch {fetch} of one partition's {rows_in} rows");
    }
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
    let tmp = tempfile::tempdir().unwrap();
    let mut spilled = 0;
    for limit in [8 << 10, 128 << 10, 512 << 10, 2 << 20, 64 << 20] {
        let pool: Arc<dyn MemoryPool> = Arc::new(FairSpillPool::new(limit));
        let ours = session_in(true, Arc::clone(&table), Some(Arc::clone(&pool)), Some(tmp.path()));
        match run_merge(&ours, &q).await {
            Ok((batches, m)) => {
                let actual = arrow::util::pretty::pretty_format_batches(&batches)
                    .unwrap()
                    .to_string();
                assert!(actual == expected, "limit {limit}: rows differ from DataFusion's");
                spilled += usize::from(sorted::metric(&m, "spill_count") > 0);
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
        assert_eq!(files_under(tmp.path()), 0, "limit {limit}: spill files left");
    }
    // 30,000 rows of ~1 MB: the three smaller pools that succeed all spill.
    assert!(spilled >= 2, "{spilled} pools made the merge spill");
}

/// A merge dropped after its first batch, having spilled, leaves no reservation and no file.
#[tokio::test]
async fn a_merge_dropped_early_leaves_nothing() {
    let table = sorted_table(30_000, 4, 500);
    let tmp = tempfile::tempdir().unwrap();
    let pool: Arc<dyn MemoryPool> = Arc::new(FairSpillPool::new(256 << 10));
    let ours = session_in(true, table, Some(Arc::clone(&pool)), Some(tmp.path()));
    let mut stream = ours
        .sql(&format!("SELECT * FROM t ORDER BY {ORDER}"))
        .await
        .unwrap()
        .execute_stream()
        .await
        .unwrap();
    let first = stream.next().await.unwrap().unwrap();
    assert!(first.num_rows() > 0);
    assert!(files_under(tmp.path()) > 0, "the merge should hold spilled runs");
    drop(stream);
    // Spill files are deleted off the async threads: wait a little for them.
    for _ in 0..100 {
        if files_under(tmp.path()) == 0 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    assert_eq!(files_under(tmp.path()), 0, "spill files left");
    assert_eq!(pool.reserved(), 0);
}

#[tokio::test]
async fn empty_input_merges_to_no_rows() {
    let ours = session(true, sorted_table(0, 3, 10), None);
    let q = format!("SELECT * FROM t ORDER BY {ORDER}");
    assert!(plan(&ours, &q).await.contains("GpuSortPreservingMergeExec"));
    let (_, batches) = rows(&ours, &q).await;
    assert_eq!(batches.iter().map(|b| b.num_rows()).sum::<usize>(), 0);
}
