//! Differential SQL fuzz test of `GpuSortExec` (CPU backend) against stock DataFusion: random
//! tables, `ORDER BY` lists, `LIMIT`/`OFFSET` and session settings (see
//! `support/sql_fuzz.rs`), adversarial tables, and memory-limited runs.
//!
//! ```text
//! cargo test -p datafusion-gpusort --test sql_fuzz -- --nocapture
//! SQL_FUZZ_SEED=7 SQL_FUZZ_CASES=2000 cargo test -p datafusion-gpusort --test sql_fuzz random -- --nocapture
//! SQL_FUZZ_CASE_SEED=0x1234abcd cargo test -p datafusion-gpusort --test sql_fuzz random -- --nocapture
//! ```

use std::sync::Arc;
use std::time::Instant;

use arrow::array::{
    ArrayRef, BooleanArray, DictionaryArray, Float32Array, Float64Array, Int32Array, Int64Array, StringArray,
    StringViewArray,
};
use arrow::datatypes::Int32Type;
use datafusion::execution::memory_pool::{FairSpillPool, GreedyMemoryPool, MemoryPool};
use datafusion::prelude::SessionConfig;

#[path = "support/sql_fuzz.rs"]
mod sql_fuzz;
use sql_fuzz::{FuzzQuery, FuzzReport, FuzzSetup, FuzzTable};

/// The seed of the CI run.
const SEED: u64 = 0x6770_7573_6f72_7431;
/// Random cases of the CI run (each a table with three queries).
const CASES: usize = 160;

/// The gpusort session of these tests: the CPU backend, whatever the machine has.
fn cpu(config: SessionConfig) -> SessionConfig {
    config.set_str("gpusort.device", "cpu")
}

fn env_u64(name: &str) -> Option<u64> {
    let v = std::env::var(name).ok()?;
    let v = v.trim();
    Some(match v.strip_prefix("0x") {
        Some(hex) => u64::from_str_radix(hex, 16).unwrap_or_else(|_| panic!("{name}={v}: not a number")),
        None => v.parse().unwrap_or_else(|_| panic!("{name}={v}: not a number")),
    })
}

#[tokio::test]
async fn random_queries_match_stock_datafusion() {
    let start = Instant::now();
    if let Some(case) = env_u64("SQL_FUZZ_CASE_SEED") {
        let report = sql_fuzz::run_sql_fuzz_case(case, cpu).await;
        println!("sql fuzz, case {case:#x}:\n{report}");
        return;
    }
    let seed = env_u64("SQL_FUZZ_SEED").unwrap_or(SEED);
    let cases = env_u64("SQL_FUZZ_CASES").map_or(CASES, |n| n as usize);
    println!("sql fuzz: seed {seed:#x}, {cases} cases");
    let report = sql_fuzz::run_sql_fuzz(seed, cases, cpu).await;
    println!("sql fuzz ({:.1?}):\n{report}", start.elapsed());
    // The generator must mostly produce queries that run and that gpusort sorts.
    assert!(
        report.both_failed * 10 <= report.queries,
        "too many invalid queries:\n{report}"
    );
    assert!(
        report.gpu_sort_plans * 2 >= report.queries,
        "too few GpuSortExec plans:\n{report}"
    );
    assert!(
        report.gpu_sorts == 0,
        "gpusort.device = cpu, yet GPU sorts ran:\n{report}"
    );
}

/// Column `v`: the row number, so that rows stay distinguishable when the keys tie.
fn row_ids(n: usize) -> ArrayRef {
    Arc::new(Int64Array::from_iter_values(0..n as i64))
}

fn long(i: usize) -> String {
    format!("{}{i:08}", "a shared prefix longer than any radix key word ".repeat(2))
}

/// Tables that are hard on sorts: ties everywhere, sorted and reverse-sorted input, two
/// distinct keys, all-null and all-NaN key columns.
fn adversarial_tables(n: usize) -> Vec<(&'static str, FuzzTable)> {
    let parts = 3;
    let equal = FuzzTable::from_columns(
        vec![
            ("k", Arc::new(Int32Array::from(vec![7; n]))),
            ("s", Arc::new(StringArray::from(vec![long(0); n]))),
            ("f", Arc::new(Float64Array::from(vec![-0.0; n]))),
            ("v", row_ids(n)),
        ],
        parts,
    );
    let ascending = |reverse: bool| {
        let order: Vec<usize> = if reverse {
            (0..n).rev().collect()
        } else {
            (0..n).collect()
        };
        FuzzTable::from_columns(
            vec![
                (
                    "k",
                    Arc::new(Int64Array::from_iter_values(order.iter().map(|&i| i as i64 - 100))),
                ),
                (
                    "s",
                    Arc::new(StringArray::from_iter_values(order.iter().map(|&i| long(i)))),
                ),
                (
                    "f",
                    Arc::new(Float64Array::from_iter_values(
                        order.iter().map(|&i| i as f64 / 3.0 - 50.0),
                    )),
                ),
                (
                    "d",
                    Arc::new(Int32Array::from_iter_values(order.iter().map(|&i| (i / 100) as i32))),
                ),
                ("v", row_ids(n)),
            ],
            parts,
        )
    };
    let two = FuzzTable::from_columns(
        vec![
            (
                "k",
                Arc::new(Int32Array::from_iter_values((0..n).map(|i| (i * 7919 % 2) as i32))),
            ),
            ("b", Arc::new(BooleanArray::from_iter((0..n).map(|i| Some(i % 3 == 0))))),
            (
                "s",
                Arc::new(StringViewArray::from_iter_values(
                    (0..n).map(|i| if i % 5 < 2 { long(1) } else { long(2) }),
                )),
            ),
            (
                "d",
                Arc::new(
                    DictionaryArray::<Int32Type>::try_new(
                        Int32Array::from_iter_values((0..n).map(|i| (i % 4) as i32)),
                        Arc::new(StringArray::from(vec!["x", "y", "x", "y"])),
                    )
                    .unwrap(),
                ),
            ),
            ("v", row_ids(n)),
        ],
        parts,
    );
    let nulls = FuzzTable::from_columns(
        vec![
            ("k", Arc::new(Int32Array::from(vec![None; n]))),
            ("s", Arc::new(StringArray::from(vec![None::<&str>; n]))),
            ("f", Arc::new(Float64Array::from(vec![None; n]))),
            ("v", row_ids(n)),
        ],
        parts,
    );
    let nan = FuzzTable::from_columns(
        vec![
            ("k", Arc::new(Float64Array::from(vec![f64::NAN; n]))),
            ("g", Arc::new(Float32Array::from(vec![f32::NAN; n]))),
            (
                "m",
                Arc::new(Float64Array::from_iter((0..n).map(|i| match i % 4 {
                    0 => Some(f64::NAN),
                    1 => Some(-f64::NAN),
                    2 => None,
                    _ => Some(f64::INFINITY),
                }))),
            ),
            ("v", row_ids(n)),
        ],
        parts,
    );
    vec![
        ("all-equal keys", equal),
        ("sorted", ascending(false)),
        ("reverse-sorted", ascending(true)),
        ("two distinct keys", two),
        ("all-null keys", nulls),
        ("all-NaN keys", nan),
    ]
}

#[tokio::test]
async fn adversarial_tables_match_stock_datafusion() {
    let start = Instant::now();
    let mut report = FuzzReport::default();
    for (i, (name, table)) in adversarial_tables(3000).into_iter().enumerate() {
        let schema = table.schema.clone();
        let first = schema.field(0).name().clone();
        // Explicit queries on the first (adversarial) key column, then random ones.
        let explicit = [
            FuzzQuery::new(
                format!("SELECT * FROM t ORDER BY {first}"),
                &[(&first, false, false)],
                None,
                0,
            ),
            FuzzQuery::new(
                format!("SELECT * FROM t ORDER BY {first} DESC NULLS LAST"),
                &[(&first, true, false)],
                None,
                0,
            ),
            FuzzQuery::new(
                format!("SELECT * FROM t ORDER BY {first} NULLS FIRST"),
                &[(&first, false, true)],
                Some(10),
                0,
            ),
            FuzzQuery::new(
                format!("SELECT * FROM t ORDER BY {first} DESC, v"),
                &[(&first, true, true), ("v", false, false)],
                Some(25),
                1000,
            ),
        ];
        for (j, setup) in [FuzzSetup::new(1, 8192), FuzzSetup::new(4, 100)].iter().enumerate() {
            report.merge(
                sql_fuzz::run_queries(&format!("table {name}, setup {j}"), &table, setup, &explicit, &cpu).await,
            );
        }
        for seed in 0..3 {
            report.merge(sql_fuzz::run_sql_fuzz_on_table(name, &table, (i * 10 + seed) as u64, 8, cpu).await);
        }
    }
    println!("adversarial tables ({:.1?}):\n{report}", start.elapsed());
    assert!(
        report.both_failed * 10 <= report.queries,
        "too many invalid queries:\n{report}"
    );
}

#[tokio::test]
async fn memory_pools_fail_cleanly_and_release_reservations() {
    let start = Instant::now();
    let mut report = FuzzReport::default();
    let mut by_size = vec![];
    for size in [1 << 10, 64 << 10, 1 << 20, 16 << 20, 512 << 20] {
        let before = report.clone();
        for (k, fair) in [true, false].into_iter().enumerate() {
            for case in 0..4 {
                let pool: Arc<dyn MemoryPool> = if fair {
                    Arc::new(FairSpillPool::new(size))
                } else {
                    Arc::new(GreedyMemoryPool::new(size))
                };
                let seed = sql_fuzz::case_seed(SEED ^ size as u64, k * 100 + case);
                report.merge(sql_fuzz::run_memory_case(seed, pool, cpu).await);
            }
        }
        by_size.push(format!(
            "{size} bytes: {} queries, {} out of memory",
            report.queries - before.queries,
            report.exhausted - before.exhausted
        ));
    }
    println!(
        "memory-limited runs ({:.1?}):\n{report}\n  {}",
        start.elapsed(),
        by_size.join("\n  ")
    );
    assert!(report.exhausted > 0, "no query ran out of memory:\n{report}");
    assert!(
        report.exhausted < report.queries - report.both_failed,
        "every query ran out of memory:\n{report}"
    );
}
