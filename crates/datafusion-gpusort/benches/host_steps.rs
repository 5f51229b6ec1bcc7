//! The host-side steps of a sort, one by one, on the `sql` bench's tables cut into its
//! 8192-row batches: what the GPU path spends on the CPU besides the copies (and what the CPU
//! path spends besides its radix passes). Prints the median and minimum of `BENCH_RUNS` runs
//! of each step:
//!
//! - `concat all columns`: the input in one batch (the CPU path, and the GPU path before the
//!   streaming session);
//! - `concat key columns`: the sort key columns alone (the GPU session's `finish`);
//! - `encode keys`: the key analysis and encoding into reused buffers (`KeyEncoder`);
//! - `gather host columns`: the columns the GPU does not move (strings), through a
//!   permutation of the rows;
//! - `cut output batches`: the sorted rows as `batch_size` slices;
//! - `record output per slice`: DataFusion's output metrics of every slice (rows, and the
//!   memory size of its arrays, which walks every column).
//!
//! ```text
//! BENCH_ROWS=1000000 cargo bench -p datafusion-gpusort --bench host_steps
//! ```

use std::sync::Arc;

use arrow::array::RecordBatch;
use datafusion::physical_plan::metrics::{BaselineMetrics, ExecutionPlanMetricsSet, RecordOutput};
use gpusort::cpu::gather::{concat_batches, fixed_width, gather_column};
use gpusort::{EncoderOptions, KeyEncoder, SortKey, SortSpec};
use rand::prelude::*;
use rand::rngs::SmallRng;

mod common;
use common::{Scenario, env_usize, partitioned, scenarios, time};

fn ms(d: std::time::Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn main() {
    let rows = env_usize("BENCH_ROWS", 10_000_000);
    let runs = env_usize("BENCH_RUNS", 5).max(1);
    let batch_size = 8192;
    let threads = rayon::current_num_threads();
    println!(
        "Host steps of a sort: {rows} rows in {batch_size}-row batches, {threads} threads, median / min of {runs} runs"
    );
    println!();
    println!("| workload | step | median ms | min ms |");
    println!("|---|---|---:|---:|");
    for Scenario { name, batch, spec, .. } in scenarios(rows) {
        let schema = batch.schema();
        let batches: Vec<RecordBatch> = partitioned(&batch, 1, batch_size).remove(0);
        let report = |step: &str, (median, min): (std::time::Duration, std::time::Duration)| {
            println!("| {name} | {step} | {:.1} | {:.1} |", ms(median), ms(min));
        };
        report(
            "concat all columns",
            time(runs, || concat_batches(&schema, &batches).unwrap().num_rows()),
        );
        let key_columns: Vec<usize> = spec.keys().iter().map(|k| k.column).collect();
        let key_schema = Arc::new(schema.project(&key_columns).unwrap());
        let key_batches: Vec<RecordBatch> = batches.iter().map(|b| b.project(&key_columns).unwrap()).collect();
        report(
            "concat key columns",
            time(runs, || concat_batches(&key_schema, &key_batches).unwrap().num_rows()),
        );
        let keys = concat_batches(&key_schema, &key_batches).unwrap();
        let key_spec = SortSpec::new(spec.keys().iter().enumerate().map(|(column, k)| SortKey {
            column,
            options: k.options,
        }));
        let words = KeyEncoder::try_new(&keys, &key_spec, &EncoderOptions::default())
            .unwrap()
            .layout()
            .num_words();
        let mut buffers = vec![vec![0u32; rows]; words];
        report(
            "encode keys",
            time(runs, || {
                let encoder = KeyEncoder::try_new(&keys, &key_spec, &EncoderOptions::default()).unwrap();
                let mut views: Vec<&mut [u32]> = buffers.iter_mut().map(|w| &mut w[..]).collect();
                encoder.encode_into(&mut views).len()
            }),
        );
        // A random permutation stands for the sort's (the gathers' access pattern is random).
        let mut perm: Vec<u32> = (0..rows as u32).collect();
        perm.shuffle(&mut SmallRng::seed_from_u64(1));
        let host: Vec<usize> = (0..schema.fields().len())
            .filter(|&c| fixed_width(schema.field(c).data_type()).is_none_or(|w| w > 16))
            .collect();
        if !host.is_empty() {
            let whole = concat_batches(&schema, &batches).unwrap();
            report(
                "gather host columns",
                time(runs, || {
                    host.iter()
                        .map(|&c| gather_column(whole.column(c), &perm).unwrap().len())
                        .sum()
                }),
            );
        }
        let whole = concat_batches(&schema, &batches).unwrap();
        report(
            "cut output batches",
            time(runs, || {
                (0..rows)
                    .step_by(batch_size)
                    .map(|s| whole.slice(s, batch_size.min(rows - s)).num_rows())
                    .sum()
            }),
        );
        let slices: Vec<RecordBatch> = (0..rows)
            .step_by(batch_size)
            .map(|s| whole.slice(s, batch_size.min(rows - s)))
            .collect();
        let metrics = ExecutionPlanMetricsSet::new();
        let baseline = BaselineMetrics::new(&metrics, 0);
        report(
            "record output per slice (DataFusion)",
            time(runs, || {
                slices.iter().map(|b| b.record_output(&baseline).num_rows()).sum()
            }),
        );
    }
}
