//! A small table with nulls, NaN, -0.0 and repeated strings, and sessions with and without
//! gpusort, shared by the SQL test targets.
#![allow(dead_code)]

use std::sync::Arc;

use arrow::array::{Float64Array, Int32Array, RecordBatch, StringArray};
use arrow::datatypes::{DataType, Field, Schema};
use arrow::util::pretty::pretty_format_batches;
use datafusion::datasource::MemTable;
use datafusion::execution::SessionStateBuilder;
use datafusion::execution::runtime_env::RuntimeEnvBuilder;
use datafusion::prelude::{SessionConfig, SessionContext};
use datafusion_gpusort::SessionStateBuilderExt;

/// `rows` rows of (a Int32, b Utf8, c Float64) in `partitions` partitions.
pub fn table(rows: usize, partitions: usize) -> MemTable {
    let schema = Arc::new(Schema::new(vec![
        Field::new("a", DataType::Int32, true),
        Field::new("b", DataType::Utf8, true),
        Field::new("c", DataType::Float64, true),
    ]));
    let per = rows.div_ceil(partitions.max(1));
    let parts = (0..partitions)
        .map(|p| {
            let range = (p * per).min(rows)..((p + 1) * per).min(rows);
            let a: Int32Array = range
                .clone()
                .map(|i| (i % 7 != 3).then_some(((i * 7919) % 101) as i32))
                .collect();
            let b: StringArray = range
                .clone()
                .map(|i| (i % 11 != 5).then(|| format!("s{}", (i * 31) % 17)))
                .collect();
            let c: Float64Array = range
                .map(|i| match i % 13 {
                    0 => Some(f64::NAN),
                    1 => Some(-0.0),
                    2 => None,
                    _ => Some(((i * 37) % 29) as f64 - 14.0),
                })
                .collect();
            vec![RecordBatch::try_new(schema.clone(), vec![Arc::new(a), Arc::new(b), Arc::new(c)]).unwrap()]
        })
        .collect();
    MemTable::try_new(schema, parts).unwrap()
}

/// A session (gpusort on or off) with table `t` of `rows` rows in `partitions` partitions.
pub fn context(gpusort: bool, rows: usize, partitions: usize) -> SessionContext {
    context_in(SessionStateBuilder::new(), gpusort, rows, partitions)
}

/// [`context`] in a memory pool of `limit` bytes.
pub fn context_with_memory_limit(gpusort: bool, rows: usize, partitions: usize, limit: usize) -> SessionContext {
    let runtime = RuntimeEnvBuilder::new()
        .with_memory_limit(limit, 1.0)
        .build_arc()
        .unwrap();
    context_in(
        SessionStateBuilder::new().with_runtime_env(runtime),
        gpusort,
        rows,
        partitions,
    )
}

fn context_in(builder: SessionStateBuilder, gpusort: bool, rows: usize, partitions: usize) -> SessionContext {
    let config = SessionConfig::new().with_target_partitions(4).with_batch_size(100);
    let mut builder = builder.with_config(config).with_default_features();
    if gpusort {
        builder = builder.with_gpusort();
    }
    let ctx = SessionContext::new_with_state(builder.build());
    ctx.register_table("t", Arc::new(table(rows, partitions))).unwrap();
    ctx
}

/// The rows of `sql`, rendered, and its batches.
pub async fn rows(ctx: &SessionContext, sql: &str) -> (String, Vec<RecordBatch>) {
    let batches = ctx.sql(sql).await.unwrap().collect().await.unwrap();
    (pretty_format_batches(&batches).unwrap().to_string(), batches)
}

/// The plan of `sql`, rendered by `EXPLAIN`.
pub async fn plan(ctx: &SessionContext, sql: &str) -> String {
    rows(ctx, &format!("EXPLAIN {sql}")).await.0
}

/// Queries whose ORDER BY is a total order of the rows (DataFusion's sort is not stable, so
/// only total orders compare row for row).
pub const TOTAL_ORDER_QUERIES: &[&str] = &[
    "SELECT * FROM t ORDER BY a, b, c",
    "SELECT * FROM t ORDER BY a DESC NULLS LAST, c, b DESC",
    "SELECT * FROM t ORDER BY c DESC, a, b",
    "SELECT * FROM t ORDER BY b NULLS FIRST, a DESC, c",
    "SELECT * FROM t ORDER BY a + 1 DESC, c, b",
    "SELECT * FROM t ORDER BY abs(c), a, b, c",
    "SELECT * FROM t ORDER BY a, b, c LIMIT 7",
    "SELECT * FROM t ORDER BY a, b, c LIMIT 5 OFFSET 30",
    "SELECT * FROM t ORDER BY c, b, a LIMIT 0",
    "SELECT * FROM t WHERE a > 1000 ORDER BY a",
    "SELECT b, count(*) AS n FROM t GROUP BY b ORDER BY n DESC, b",
    "SELECT a, row_number() OVER (PARTITION BY b ORDER BY a, c) AS r FROM t ORDER BY a, r, b",
    "SELECT c, b, a FROM t ORDER BY b NULLS FIRST, a DESC, c",
    "SELECT a * 2 AS a2, c, b FROM t WHERE c > 0.5 ORDER BY b, a2 DESC, c",
    "SELECT c, b, a FROM t ORDER BY a, b, c LIMIT 1500",
];

/// Runs every query of [`TOTAL_ORDER_QUERIES`] on both sessions and compares the rows; checks
/// that gpusort's plans hold no DataFusion sort. Sets `gpusort.topk_max_fetch = 0` on `ours`
/// first, so that its `LIMIT`s sort in `GpuSortExec` too.
pub async fn compare_with_stock(stock: &SessionContext, ours: &SessionContext, what: &str) {
    ours.sql("SET gpusort.topk_max_fetch = 0").await.unwrap();
    for q in TOTAL_ORDER_QUERIES {
        let (expected, _) = rows(stock, q).await;
        let (actual, batches) = rows(ours, q).await;
        if actual != expected {
            let at = actual.lines().zip(expected.lines()).position(|(a, e)| a != e);
            panic!("{q} ({what}) differs from DataFusion at output line {at:?}");
        }
        let batch_size = ours.state().config().batch_size();
        assert!(
            batches.iter().all(|b| b.num_rows() <= batch_size),
            "batch_size respected: {q}"
        );
        let p = plan(ours, q).await;
        assert!(
            !p.replace("GpuSortExec", "").contains("SortExec"),
            "{q}: a DataFusion sort is left:\n{p}"
        );
    }
}
