//! The CPU backend on presorted input: sorted, reversed, a few sorted runs, few distinct keys,
//! and for contrast random, zipf and nearly sorted (0.1% of rows swapped, which is many short
//! runs and takes the radix passes) — `gpusort_testing::KeyDistribution`. Each row: the sort's median time, its ratio to the random
//! keys' time and to a parallel copy of the same columns (the floor a one-pass shortcut can
//! approach), and the shape the sort recognised.
//!
//! ```text
//! cargo bench -p gpusort --bench presorted                   # 10M rows, 5 runs
//! GPUSORT_BENCH_ROWS=1000000 GPUSORT_BENCH_RUNS=3 cargo bench -p gpusort --bench presorted
//! ```
//!
//! The table is a u64 key and two u32 payload columns (16 bytes a row).

use std::sync::Arc;
use std::time::{Duration, Instant};

use arrow::array::{ArrayRef, RecordBatch, UInt32Array, UInt64Array};
use arrow::datatypes::{DataType, Field, Schema};
use gpusort::{CpuBackend, SortBackend, SortKey, SortRequest, SortSpec};
use gpusort_testing::KeyDistribution;
use rayon::prelude::*;

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// The median of `runs` timings of `f`, after one warm-up call; and its last result.
fn time<T>(runs: usize, mut f: impl FnMut() -> T) -> (Duration, T) {
    let mut out = f();
    let mut times: Vec<Duration> = (0..runs)
        .map(|_| {
            let start = Instant::now();
            out = f();
            start.elapsed()
        })
        .collect();
    times.sort();
    (times[runs / 2], out)
}

fn main() {
    let n = env_usize("GPUSORT_BENCH_ROWS", 10_000_000);
    let runs = env_usize("GPUSORT_BENCH_RUNS", 5).max(1);
    let threads = rayon::current_num_threads();
    println!("gpusort CPU backend on presorted input: {n} rows (u64 key + 2 u32), {threads} threads, median of {runs}");
    let schema = Arc::new(Schema::new(vec![
        Field::new("k", DataType::UInt64, false),
        Field::new("a", DataType::UInt32, false),
        Field::new("b", DataType::UInt32, false),
    ]));
    let spec = SortSpec::new([SortKey::sql(0, false)]);
    let backend = CpuBackend::new();
    let a: ArrayRef = Arc::new(UInt32Array::from_iter_values(0..n as u32));
    let b: ArrayRef = Arc::new(UInt32Array::from_iter_values((0..n as u32).rev()));
    let mut random_time = None;
    println!(
        "| keys | gpusort cpu (ms) | / random | / copy | copy (ms) | encode + sort + gather (ms) | recognised as |\n| --- | ---: | ---: | ---: | ---: | --- | --- |"
    );
    for dist in KeyDistribution::ALL {
        let name = dist.name();
        let k: ArrayRef = Arc::new(UInt64Array::from(dist.keys(n, 42)));
        let batch = RecordBatch::try_new(schema.clone(), vec![k, a.clone(), b.clone()]).unwrap();
        let (sort, order) = time(runs, || {
            let out = backend.sort(&SortRequest::new(&batch, &spec)).unwrap();
            assert_eq!(out.batch.num_rows(), n);
            (out.stats.input_order, out.stats)
        });
        let (order, stats) = order;
        // The floor: every column's bytes copied once, on all threads.
        let (copy, _) = time(runs, || {
            batch
                .columns()
                .iter()
                .map(|c| {
                    let data = c.to_data();
                    let bytes = data.buffers()[0].as_slice();
                    let mut out = vec![0u8; bytes.len()];
                    out.par_chunks_mut(1 << 20)
                        .zip(bytes.par_chunks(1 << 20))
                        .for_each(|(o, i)| o.copy_from_slice(i));
                    out.len()
                })
                .sum::<usize>()
        });
        let random = *random_time.get_or_insert(sort);
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        println!(
            "| {name} | {:.1} | {:.2} | {:.2} | {:.1} | {:.1} + {:.1} + {:.1} | {} |",
            ms(sort),
            ms(sort) / ms(random),
            ms(sort) / ms(copy),
            ms(copy),
            ms(stats.encode_time),
            ms(stats.sort_time),
            ms(stats.gather_time),
            order.map_or("(radix passes)".to_string(), |o| o.to_string())
        );
    }
}
