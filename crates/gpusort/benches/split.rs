//! The split of one sort into key ranges ([`gpusort::split`]), what a sort over several GPUs
//! pays on the host before its GPUs start: its phases (splitters from the sample, rows
//! assigned to ranges, the ranges' columns gathered) in ns a row, for 2 and 4 ranges, beside
//! one CPU sort of the same rows; and the split sort over CPU backends ([`SplitBackend`])
//! against one CPU backend. The CPU backends share the machine's cores, so the split sort
//! cannot be faster there: its ratio is the split's overhead, not a speedup.
//!
//! ```text
//! cargo bench -p gpusort --bench split                      # 20M rows, 3 runs
//! GPUSORT_BENCH_ROWS=5000000 GPUSORT_BENCH_RUNS=3 cargo bench -p gpusort --bench split
//! ```
//!
//! The table is a random u64 key and two u64 payload columns (24 bytes a row).

use std::sync::Arc;
use std::time::{Duration, Instant};

use arrow::array::{ArrayRef, RecordBatch, UInt64Array};
use arrow::datatypes::{DataType, Field, Schema};
use gpusort::split::{assign_rows, choose_splitters, gather_ranges};
use gpusort::{CpuBackend, SortBackend, SortKey, SortRequest, SortSpec, SplitBackend, SplitOptions};
use rayon::prelude::*;

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// The median of `runs` timings of `f`, after one warm-up call.
fn time(runs: usize, mut f: impl FnMut()) -> Duration {
    f();
    let mut times: Vec<Duration> = (0..runs)
        .map(|_| {
            let start = Instant::now();
            f();
            start.elapsed()
        })
        .collect();
    times.sort();
    times[runs / 2]
}

fn column(n: usize, salt: u64) -> ArrayRef {
    let v: Vec<u64> = (0..n as u64)
        .into_par_iter()
        .map(|i| {
            let mut z = (i ^ (salt << 48)).wrapping_mul(0x9e37_79b9_7f4a_7c15);
            z = (z ^ (z >> 31)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z ^ (z >> 29)
        })
        .collect();
    Arc::new(UInt64Array::from(v))
}

fn main() {
    let n = env_usize("GPUSORT_BENCH_ROWS", 20_000_000);
    let runs = env_usize("GPUSORT_BENCH_RUNS", 3).max(1);
    let schema = Arc::new(Schema::new(
        ["k", "a", "b"]
            .iter()
            .map(|name| Field::new(*name, DataType::UInt64, false))
            .collect::<Vec<_>>(),
    ));
    let batch = RecordBatch::try_new(schema, (0..3).map(|c| column(n, c)).collect()).unwrap();
    let spec = SortSpec::new([SortKey {
        column: 0,
        options: Default::default(),
    }]);
    let request = SortRequest::new(&batch, &spec);
    let options = SplitOptions::default();
    let ns = |d: Duration| d.as_secs_f64() * 1e9 / n as f64;
    println!(
        "# {n} rows (u64 key + 2 u64), {} threads, median of {runs}",
        rayon::current_num_threads()
    );
    let one = time(runs, || {
        CpuBackend::new().sort(&request).unwrap();
    });
    println!(
        "one CPU sort: {:.1} ms ({:.2} ns a row)",
        one.as_secs_f64() * 1e3,
        ns(one)
    );
    println!(
        "\n| ranges | splitters ms | assign ms | gather ms | split ns a row | split / one sort | SplitBackend ms | x one sort |"
    );
    println!("|---:|---:|---:|---:|---:|---:|---:|---:|");
    for ranges in [2, 4] {
        let splitters = time(runs, || {
            choose_splitters(&request, ranges, &options).unwrap();
        });
        let chosen = choose_splitters(&request, ranges, &options).unwrap();
        let assign = time(runs, || {
            assign_rows(&request, &chosen).unwrap();
        });
        let lists = assign_rows(&request, &chosen).unwrap();
        let gather = time(runs, || {
            gather_ranges(&request, lists.clone()).unwrap();
        });
        let split = splitters + assign + gather;
        let sorters: Vec<Arc<dyn SortBackend>> = (0..ranges).map(|_| Arc::new(CpuBackend::new()) as _).collect();
        let backend = SplitBackend::try_new(sorters).unwrap();
        let whole = time(runs, || {
            backend.sort(&request).unwrap();
        });
        println!(
            "| {ranges} | {:.1} | {:.1} | {:.1} | {:.2} | {:.2} | {:.1} | {:.2}x |",
            splitters.as_secs_f64() * 1e3,
            assign.as_secs_f64() * 1e3,
            gather.as_secs_f64() * 1e3,
            ns(split),
            split.as_secs_f64() / one.as_secs_f64(),
            whole.as_secs_f64() * 1e3,
            one.as_secs_f64() / whole.as_secs_f64(),
        );
    }
}
