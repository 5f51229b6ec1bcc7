//! One sort over several GPUs of the host ([`MultiGpuBackend`]) against one GPU, in the same
//! process: random u64 keys (and `--payload P` u64 columns beside them) from host memory to
//! host memory, each GPU count's output checked against one GPU's (the same permutation: the
//! split sort is stable).
//!
//! ```text
//! multi_gpu [--rows N] [--payload P] [--gpus 1,2,4] [--reps R] [--csv out.csv]
//! ```
//!
//! Each timing is one [`MultiGpuBackend::sort_ranges_within`] call: the split (sample,
//! splitters, assignment, each range's columns gathered), the ranges' sorts at once (staging,
//! uploads, kernels, downloads, host gathers), and the permutations mapped to input rows; the
//! ranges are left as they are, one output each, as an operator emits them. The split alone is
//! timed apart, by phase (`split s`: splitters from the sample, rows assigned to ranges, the
//! ranges' columns gathered), and its ranges sorted at once and one after another (how far
//! the GPUs' sorts overlap). Minimum and median of `R` runs after a warm-up on every GPU.

use std::fmt::Write as _;
use std::sync::Arc;
use std::time::Instant;

use arrow::array::{ArrayRef, AsArray, RecordBatch, UInt64Array};
use arrow::datatypes::{DataType, Field, Schema, UInt64Type};
use gpusort::split::{RangeRows, assign_rows, choose_splitters, gather_ranges, sort_ranges};
use gpusort::{SortKey, SortOptions, SortOutput, SortRequest, SortSpec, SplitOptions};
use gpusort_cuda::{CudaBackend, MultiGpuBackend};
use rayon::prelude::*;

struct Args {
    rows: usize,
    payload: usize,
    gpus: Vec<usize>,
    reps: usize,
    csv: Option<String>,
}

fn args() -> Args {
    let mut a = Args {
        rows: 800_000_000,
        payload: 0,
        gpus: vec![1, 2, 4, 8],
        reps: 3,
        csv: None,
    };
    let v: Vec<String> = std::env::args().skip(1).filter(|s| s != "--bench").collect();
    let mut i = 0;
    while i < v.len() {
        let val = v.get(i + 1).cloned().unwrap_or_default();
        match v[i].as_str() {
            "--rows" => a.rows = val.parse().expect("--rows N"),
            "--payload" => a.payload = val.parse().expect("--payload P"),
            "--gpus" => {
                a.gpus = val
                    .split(',')
                    .map(|x| x.trim().parse().expect("--gpus 1,2,.."))
                    .collect()
            }
            "--reps" => a.reps = val.parse().expect("--reps R"),
            "--csv" => a.csv = Some(val),
            other => panic!("unknown argument {other}"),
        }
        i += 2;
    }
    a
}

/// `n` random u64 values (splitmix64 of the row and the column), made on all cores.
fn random_column(n: usize, column: u64) -> ArrayRef {
    let values: Vec<u64> = (0..n as u64)
        .into_par_iter()
        .map(|i| {
            let mut z = i.wrapping_add(column << 40).wrapping_mul(0x9e37_79b9_7f4a_7c15);
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            z ^ (z >> 31)
        })
        .collect();
    Arc::new(UInt64Array::from(values))
}

fn table(rows: usize, payload: usize) -> RecordBatch {
    let fields: Vec<Field> = (0..=payload)
        .map(|c| {
            Field::new(
                if c == 0 { "key".to_string() } else { format!("p{c}") },
                DataType::UInt64,
                false,
            )
        })
        .collect();
    let columns = (0..=payload).map(|c| random_column(rows, c as u64)).collect();
    RecordBatch::try_new(Arc::new(Schema::new(fields)), columns).expect("a table")
}

/// Fails loudly unless `outputs` (ranges in order) hold every row once with keys ascending,
/// and the same permutation as `reference` (one GPU's).
fn check(outputs: &[SortOutput], reference: Option<&[u32]>, input_sum: u64) {
    let rows: usize = outputs.iter().map(|o| o.batch.num_rows()).sum();
    let keys: Vec<&[u64]> = outputs
        .iter()
        .map(|o| o.batch.column(0).as_primitive::<UInt64Type>().values().as_ref())
        .collect();
    let sum = keys
        .par_iter()
        .map(|k| {
            k.par_iter()
                .fold(|| 0u64, |a, &b| a.wrapping_add(b))
                .reduce(|| 0, u64::wrapping_add)
        })
        .reduce(|| 0, u64::wrapping_add);
    assert_eq!(sum, input_sum, "the sorted keys' sum differs from the input's");
    for k in &keys {
        assert!(k.par_windows(2).all(|w| w[0] <= w[1]), "a range is not sorted");
    }
    for w in keys.windows(2) {
        if let (Some(a), Some(b)) = (w[0].last(), w[1].first()) {
            assert!(a <= b, "ranges out of order");
        }
    }
    if let Some(reference) = reference {
        assert_eq!(rows, reference.len());
        let mut at = 0;
        for o in outputs {
            let idx = o.indices.values();
            assert!(
                idx.par_iter().zip(&reference[at..at + idx.len()]).all(|(a, b)| a == b),
                "the permutation differs from one GPU's"
            );
            at += idx.len();
        }
    }
}

/// The split's phases, timed: splitters from the sample, rows assigned, ranges gathered.
fn timed_split(request: &SortRequest<'_>, ranges: usize, options: &SplitOptions) -> (Vec<RangeRows>, [f64; 3]) {
    let t = Instant::now();
    let splitters = choose_splitters(request, ranges, options).expect("splitters");
    let sample = t.elapsed().as_secs_f64();
    let t = Instant::now();
    let lists = assign_rows(request, &splitters).expect("assignment");
    let assign = t.elapsed().as_secs_f64();
    let t = Instant::now();
    let out = gather_ranges(request, lists).expect("gathers");
    (out, [sample, assign, t.elapsed().as_secs_f64()])
}

/// The allocator the `gpusort` tool runs with (mimalloc): freed memory comes back to the
/// process instead of the kernel, which decides what a sort's fresh memory costs.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// How far the ranges' sorts overlap: the split's ranges sorted one after another (each on
/// its GPU), all at once on rayon's one global pool, and all at once each on a rayon pool of its
/// own (as the backend does); twice, in that order, so that no variant is the only one to meet
/// memory the process has not used before.
fn overlap(request: &SortRequest<'_>, ranges: &[RangeRows], gpus: &[Arc<CudaBackend>]) {
    let at_once = |pool_per_range| {
        let options = SplitOptions {
            pool_per_range,
            ..SplitOptions::default()
        };
        let t = Instant::now();
        sort_ranges(request, ranges, &options, |i, r| gpus[i].sort_within(r, None)).expect("the ranges' sorts");
        t.elapsed().as_secs_f64()
    };
    let one_after_another = || -> Vec<f64> {
        ranges
            .iter()
            .enumerate()
            .map(|(i, range)| {
                let mut own = request.clone();
                own.batch = &range.batch;
                let t = Instant::now();
                gpus[i].sort_within(&own, None).expect("a range's sort");
                t.elapsed().as_secs_f64()
            })
            .collect()
    };
    for round in 1..=2 {
        let apart = one_after_another();
        let shared = at_once(false);
        let own = at_once(true);
        println!(
            "{} GPUs, the split's ranges, round {round}: one after another {apart:.3?} s (sum {:.3}); at once {shared:.3} s (one pool), {own:.3} s (a pool a range)",
            gpus.len(),
            apart.iter().sum::<f64>()
        );
    }
}

fn main() {
    let a = args();
    let available = gpusort_cuda::device::device_count().expect("a GPU");
    let gpus: Vec<Arc<CudaBackend>> = (0..available)
        .map(|o| Arc::new(CudaBackend::try_new(o).expect("the GPU opens")))
        .collect();
    for g in &gpus {
        println!("# GPU {}", g.gpu().info());
    }
    let counts: Vec<usize> = a.gpus.iter().copied().filter(|&g| g >= 1 && g <= available).collect();
    let skipped: Vec<usize> = a.gpus.iter().copied().filter(|&g| g > available).collect();
    if !skipped.is_empty() {
        println!("# skipped GPU counts {skipped:?}: the machine has {available}");
    }
    let threads = rayon::current_num_threads();
    println!(
        "# {} rows, a u64 key + {} u64 columns ({:.1} GB), {} reps, {} host threads",
        a.rows,
        a.payload,
        (a.rows * 8 * (a.payload + 1)) as f64 / 1e9,
        a.reps,
        threads
    );
    let spec = SortSpec::new([SortKey {
        column: 0,
        options: SortOptions::default(),
    }]);
    // Warm-up: every GPU compiles or loads its kernels and fills its pinned staging.
    let warm = table(4 << 20, a.payload);
    for g in &gpus {
        g.sort_within(&SortRequest::new(&warm, &spec), None)
            .expect("warm-up sort");
    }
    drop(warm);
    let t = Instant::now();
    let batch = table(a.rows, a.payload);
    println!("# input made in {:.2} s", t.elapsed().as_secs_f64());
    let input_sum = batch
        .column(0)
        .as_primitive::<UInt64Type>()
        .values()
        .par_iter()
        .fold(|| 0u64, |x, &y| x.wrapping_add(y))
        .reduce(|| 0, u64::wrapping_add);
    let request = SortRequest::new(&batch, &spec);

    let mut csv = String::from("gpus,rows,payload,min_s,median_s,split_s,speedup\n");
    let mut table_out = String::from(
        "| GPUs | min s | median s | x one GPU | split s (splitters + assign + gather) | rows per GPU | strategy |\n|---:|---:|---:|---:|---|---|---|\n",
    );
    let mut reference: Option<Vec<u32>> = None;
    let mut one_gpu = None;
    for &g in &counts {
        let backend = MultiGpuBackend::try_new(gpus[..g].to_vec()).expect("a backend");
        let options: SplitOptions = backend.options().clone();
        let (split_s, phases) = if g > 1 {
            let (ranges, phases) = timed_split(&request, g, &options);
            overlap(&request, &ranges, &gpus[..g]);
            drop(ranges);
            (
                phases.iter().sum::<f64>(),
                format!("{:.3} + {:.3} + {:.3}", phases[0], phases[1], phases[2]),
            )
        } else {
            (0.0, "-".into())
        };
        let mut times = vec![];
        let mut last = None;
        for _ in 0..a.reps {
            drop(last.take());
            let t = Instant::now();
            match backend.sort_ranges_within(&request, None) {
                Ok(outputs) => last = Some(outputs),
                Err(e) => {
                    println!("{g} GPU(s) failed: {e}");
                    break;
                }
            }
            times.push(t.elapsed().as_secs_f64());
        }
        let Some(outputs) = last else {
            writeln!(table_out, "| {g} | failed | | | | | |").unwrap();
            continue;
        };
        check(&outputs, reference.as_deref(), input_sum);
        if reference.is_none() {
            reference = Some(
                outputs
                    .iter()
                    .flat_map(|o| o.indices.values().iter().copied())
                    .collect(),
            );
        }
        times.sort_by(f64::total_cmp);
        let (min, median) = (times[0], times[times.len() / 2]);
        let base = *one_gpu.get_or_insert(min);
        let sizes: Vec<String> = outputs.iter().map(|o| o.batch.num_rows().to_string()).collect();
        let strategy = outputs[0].stats.strategy.map(|s| s.to_string()).unwrap_or_default();
        let speedup = base / min;
        writeln!(
            table_out,
            "| {g} | {min:.3} | {median:.3} | {speedup:.2}x | {split_s:.3} ({phases}) | {} | {strategy} |",
            sizes.join(" / ")
        )
        .unwrap();
        writeln!(
            csv,
            "{g},{},{},{min:.4},{median:.4},{split_s:.4},{speedup:.3}",
            a.rows, a.payload
        )
        .unwrap();
        println!("{g} GPU(s): {times:?}");
    }
    println!("\n{table_out}");
    println!(
        "Every output checked: keys ascending across the ranges, every key once (sum), the same permutation as one GPU's."
    );
    if let Some(path) = a.csv {
        std::fs::write(&path, csv).expect("write the CSV");
    }
}
