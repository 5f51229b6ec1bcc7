//! The CPU backend against Arrow's `lexsort_to_indices` + `take` and against DataFusion's
//! `ORDER BY` (a `SortExec` per partition and a `SortPreservingMergeExec`) on the same data
//! and the same cores, as ratios in one run.
//!
//! ```text
//! cargo bench -p datafusion-gpusort --bench cpu_backend            # 10M rows, 5 runs
//! GPUSORT_BENCH_ROWS=1000000 GPUSORT_BENCH_RUNS=3 cargo bench ...  # smaller
//! ```
//!
//! Tables: (a) a u32 key + 20 u32 columns; (b) 3 key columns (i32 with 100 values, a
//! string of 8-16 characters, i64) + 4 u32 columns. All threads of the machine are used
//! by every contender (DataFusion gets one partition per thread).

use std::sync::Arc;

use arrow::array::RecordBatch;
use arrow::compute::{concat_batches, lexsort_to_indices, take_record_batch};
use datafusion::datasource::MemTable;
use datafusion::prelude::{SessionConfig, SessionContext};
use gpusort::{CpuBackend, SortBackend, SortRequest, Strategy};

mod common;
use common::{Scenario, env_usize, partitioned, scenarios, time};

fn main() {
    let rows = env_usize("GPUSORT_BENCH_ROWS", 10_000_000);
    let runs = env_usize("GPUSORT_BENCH_RUNS", 5);
    let threads = rayon::current_num_threads();
    let batch_size = 8192;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(threads)
        .enable_all()
        .build()
        .unwrap();
    println!("gpusort CPU backend benchmark: {rows} rows, {threads} threads, median of {runs} runs");
    let mut table = vec![];
    for scenario in scenarios(rows) {
        let Scenario { name, batch, spec, sql } = scenario;
        // DataFusion reads the table as 8192-row batches spread over one partition per thread.
        let partitions = partitioned(&batch, threads, batch_size);
        let small_batches: Vec<RecordBatch> = partitions.iter().flatten().cloned().collect();
        let config = SessionConfig::new()
            .with_target_partitions(threads)
            .with_batch_size(batch_size);
        let ctx = SessionContext::new_with_config(config);
        ctx.register_table("t", Arc::new(MemTable::try_new(batch.schema(), partitions).unwrap()))
            .unwrap();
        let (df, _) = time(runs, || {
            runtime.block_on(async {
                let out = ctx.sql(sql).await.unwrap().collect().await.unwrap();
                out.iter().map(|b| b.num_rows()).sum()
            })
        });
        let mut rows_out = vec![(format!("datafusion ORDER BY ({threads} partitions)"), df)];

        let backend = CpuBackend::new();
        for (label, strategy) in [
            ("gpusort cpu, planner's choice", None),
            ("gpusort cpu, direct", Some(Strategy::SRTS_DIRECT)),
            ("gpusort cpu, indirect", Some(Strategy::SRTS_INDIRECT)),
        ] {
            let (t, _) = time(runs, || {
                let out = backend
                    .sort(&SortRequest::new(&batch, &spec).with_strategy(strategy))
                    .unwrap();
                out.batch.num_rows()
            });
            rows_out.push((label.to_string(), t));
        }
        let (t, _) = time(runs, || {
            let one = concat_batches(&batch.schema(), &small_batches).unwrap();
            backend.sort(&SortRequest::new(&one, &spec)).unwrap().batch.num_rows()
        });
        rows_out.push(("gpusort cpu incl. concat of 8192-row batches".to_string(), t));
        let sort_cols = spec.to_sort_columns(&batch);
        let (t, _) = time(runs.min(3), || {
            let idx = lexsort_to_indices(&sort_cols, None).unwrap();
            take_record_batch(&batch, &idx).unwrap().num_rows()
        });
        rows_out.push(("arrow lexsort_to_indices + take (1 thread)".to_string(), t));
        // The outputs agree (checked once, outside the timings).
        let ours = backend.sort(&SortRequest::new(&batch, &spec)).unwrap();
        let idx = lexsort_to_indices(&sort_cols, None).unwrap();
        let theirs = take_record_batch(&batch, &idx).unwrap();
        for k in spec.keys() {
            assert_eq!(
                ours.batch.column(k.column),
                theirs.column(k.column),
                "sort column {}",
                k.column
            );
        }
        for (label, t) in rows_out {
            table.push((name, label, t, df));
        }
    }
    println!();
    println!("| table | contender | median ms | DataFusion / this |");
    println!("|---|---|---:|---:|");
    for (name, label, t, df) in table {
        println!(
            "| {name} | {label} | {:.1} | {:.2}x |",
            t.as_secs_f64() * 1e3,
            df.as_secs_f64() / t.as_secs_f64()
        );
    }
}
