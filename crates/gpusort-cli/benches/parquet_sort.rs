//! A Parquet file sorted into a Parquet file, timed per phase, four ways in one run on one
//! machine:
//!
//! 1. `datafusion COPY`: what datafusion-cli runs for
//!    `COPY (SELECT * FROM t ORDER BY ...) TO 'out.parquet'` — stock DataFusion (no gpusort),
//!    the same library and version, its defaults (zstd(3), 1M-row row groups, parallel writer).
//! 2. `gpusort GPU`: `gpusort sort` (the CLI's own code) with `--device auto`.
//! 3. `gpusort CPU`: `gpusort sort --device cpu`, gpusort's CPU backend.
//! 4. `df sort + gpusort writer`: `gpusort sort --no-gpusort`: DataFusion's SortExec feeding the
//!    CLI's writer, which separates the sort's share from the writer's.
//!
//! ```text
//! BENCH_INPUT=/data/orders-1g.parquet BENCH_ORDER_BY="customer, amount DESC, order_id" \
//!     ./parquet_sort-<hash>
//! ```
//!
//! Environment: `BENCH_INPUT` (the Parquet file, required), `BENCH_ORDER_BY` (default
//! `amount DESC, order_id`), `BENCH_RUNS` (rounds, default 3; the variants take turns in each),
//! `BENCH_VARIANTS` (a comma-separated subset of `copy,gpu,cpu,df`), `BENCH_OUT_DIR` (where the
//! outputs go, default the system's temporary directory; they are removed at the end),
//! `BENCH_MEMORY_LIMIT` (gpusort's `--memory-limit`, default none), `BENCH_CHECK` (`0` skips
//! comparing each output's sort keys with COPY's), `BENCH_CSV` (also write the runs there).
//!
//! Phases: planning (inputs checked, plan made), reading (until the scans finished), sorting
//! (until the first sorted batch), writing (until the file is closed and renamed). For COPY
//! the first sorted batch is seen by polling its merge's output every 5 ms.
//! The GPU is opened (CUDA context, kernels) once, before the runs: its time is printed
//! apart; a `gpusort` process pays it once.

use std::collections::BTreeMap;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use arrow::array::{ArrayRef, RecordBatch};
use arrow::compute::{cast, concat};
use datafusion::physical_plan::{ExecutionPlan, collect};
use datafusion::prelude::{ParquetReadOptions, SessionContext};
use datafusion_gpusort::gpu_backend;
use gpusort_cli::inputs::Inputs;
use gpusort_cli::order_by::OrderBy;
use gpusort_cli::plan::format_size;
use gpusort_cli::report::{group_digits, rate, seconds};
use gpusort_cli::{PhaseTimes, PlanArgs, PlanMetrics, ProgressMode, SortArgs};
use parquet::arrow::ProjectionMask;
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;

type BoxError = Box<dyn std::error::Error>;

/// One way to sort.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Variant {
    Copy,
    Gpu,
    Cpu,
    DataFusionSort,
}

impl Variant {
    const ALL: [Variant; 4] = [Self::Copy, Self::Gpu, Self::Cpu, Self::DataFusionSort];

    fn key(self) -> &'static str {
        match self {
            Self::Copy => "copy",
            Self::Gpu => "gpu",
            Self::Cpu => "cpu",
            Self::DataFusionSort => "df",
        }
    }

    fn label(self) -> &'static str {
        match self {
            Self::Copy => "datafusion COPY",
            Self::Gpu => "gpusort GPU",
            Self::Cpu => "gpusort CPU",
            Self::DataFusionSort => "df sort + gpusort writer",
        }
    }
}

/// One timed run.
#[derive(Debug, Clone)]
struct Run {
    times: PhaseTimes,
    rows: u64,
    output_bytes: u64,
    sorted: String,
}

fn env(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.trim().is_empty())
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let Some(input) = env("BENCH_INPUT") else {
        eprintln!(
            "parquet_sort: set BENCH_INPUT to a Parquet file (e.g. one made by \
             `make_testdata --rows 50000000 --out FILE`), and BENCH_ORDER_BY to an ORDER BY list"
        );
        std::process::exit(2);
    };
    let order_by_text = env("BENCH_ORDER_BY").unwrap_or_else(|| "amount DESC, order_id".into());
    let runs: usize = env("BENCH_RUNS").map(|r| r.parse()).transpose()?.unwrap_or(3).max(1);
    let variants: Vec<Variant> = match env("BENCH_VARIANTS") {
        Some(list) => list
            .split(',')
            .map(|k| {
                Variant::ALL
                    .into_iter()
                    .find(|v| v.key() == k.trim())
                    .ok_or_else(|| format!("BENCH_VARIANTS: unknown variant {k}; known: copy,gpu,cpu,df"))
            })
            .collect::<Result<_, _>>()?,
        None => Variant::ALL.to_vec(),
    };
    let out_dir = tempfile::Builder::new().prefix("parquet_sort-").tempdir_in(
        env("BENCH_OUT_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(std::env::temp_dir),
    )?;
    let check = env("BENCH_CHECK").is_none_or(|v| v != "0");

    let inputs = Inputs::try_new(std::slice::from_ref(&input))?;
    let order_by = OrderBy::try_new(&order_by_text, &inputs.schema)?;
    println!(
        "input    {input}: {} rows, {}, {} row groups",
        group_digits(inputs.rows()),
        format_size(inputs.bytes()),
        inputs.files[0].row_groups
    );
    println!("order by {}", order_by.to_sql());
    println!(
        "machine  {} threads",
        std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1)
    );
    if variants.contains(&Variant::Gpu) {
        let start = Instant::now();
        match gpu_backend(0) {
            Ok(gpu) => println!(
                "GPU      {} (opened in {}: context and kernels, once per process, not in the times below)",
                gpu.gpu().info(),
                seconds(start.elapsed())
            ),
            Err(why) => println!("GPU      none ({why}): `gpusort GPU` sorts on the CPU and says so"),
        }
    }
    if let Some(limit) = env("BENCH_MEMORY_LIMIT") {
        println!("memory   gpusort --memory-limit {limit}; COPY has no limit (datafusion-cli's default)");
    }
    println!("runs     {runs} rounds, the variants in turn\n");

    let mut results: BTreeMap<Variant, Vec<Run>> = BTreeMap::new();
    for round in 0..runs {
        for &variant in &variants {
            let out = out_dir.path().join(format!("{}.parquet", variant.key()));
            let _ = std::fs::remove_file(&out);
            let run = match variant {
                Variant::Copy => run_copy(&input, &order_by.to_sql(), &out).await?,
                _ => run_gpusort(variant, &input, &order_by_text, &out).await?,
            };
            eprintln!(
                "round {} {:<26} {} ({} rows/s)",
                round + 1,
                variant.label(),
                seconds(run.times.total()),
                rate(run.rows, run.times.total())
            );
            if run.rows != inputs.rows() {
                return Err(format!("{} wrote {} rows of {}", variant.label(), run.rows, inputs.rows()).into());
            }
            results.entry(variant).or_default().push(run);
        }
        if round == 0 && check && variants.contains(&Variant::Copy) {
            let reference = out_dir.path().join("copy.parquet");
            for &variant in variants.iter().filter(|v| **v != Variant::Copy) {
                let out = out_dir.path().join(format!("{}.parquet", variant.key()));
                compare_keys(&reference, &out, &order_by, &inputs.schema)
                    .map_err(|e| format!("{}: {e}", variant.label()))?;
            }
            eprintln!("check    every output's sort keys equal COPY's, row for row");
        }
    }

    print_table(&results, &variants);
    if let Some(path) = env("BENCH_CSV") {
        write_csv(&path, &results, &input, &order_by.to_sql())?;
        println!("\nruns written to {path}");
    }
    Ok(())
}

/// datafusion-cli's way: `COPY (SELECT * FROM t ORDER BY ...) TO 'out'` in a stock session.
async fn run_copy(input: &str, order_by: &str, out: &Path) -> Result<Run, BoxError> {
    let start = Instant::now();
    let ctx = SessionContext::new();
    ctx.register_parquet("t", input, ParquetReadOptions::default()).await?;
    let sql = format!("COPY (SELECT * FROM t ORDER BY {order_by}) TO '{}'", out.display());
    let plan = ctx.sql(&sql).await?.create_physical_plan().await?;
    let sink_input = Arc::clone(plan.children()[0]);
    let run_start = Instant::now();
    let run_start_ns = unix_ns();

    // Poll for the first sorted batch out of the sort (merge) under the sink.
    let stop = Arc::new(AtomicBool::new(false));
    let poller = {
        let (stop, sink_input) = (Arc::clone(&stop), Arc::clone(&sink_input));
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                if sink_input.metrics().and_then(|m| m.output_rows()).unwrap_or(0) > 0 {
                    return Some(Instant::now());
                }
                std::thread::sleep(Duration::from_millis(5));
            }
            None
        })
    };
    let batches = collect(Arc::clone(&plan), ctx.task_ctx()).await?;
    let end = Instant::now();
    stop.store(true, Ordering::Relaxed);
    let first_output = poller.join().map_err(|_| "poller panicked")?.unwrap_or(end);
    let rows = batches
        .first()
        .and_then(|b| b.column(0).as_any().downcast_ref::<arrow::array::UInt64Array>())
        .map(|a| a.value(0))
        .unwrap_or(0);
    let metrics = PlanMetrics::collect(&plan);
    let read_end = metrics
        .read_end_ns
        .map(|ns| run_start + Duration::from_nanos(ns.saturating_sub(run_start_ns)))
        .unwrap_or(first_output)
        .min(first_output);
    Ok(Run {
        times: PhaseTimes {
            planning: run_start - start,
            reading: read_end - run_start,
            sorting: first_output - read_end,
            writing: end - first_output,
        },
        rows,
        output_bytes: std::fs::metadata(out)?.len(),
        sorted: sort_operator(&plan),
    })
}

/// `gpusort sort`, through the CLI's library.
async fn run_gpusort(variant: Variant, input: &str, order_by: &str, out: &Path) -> Result<Run, BoxError> {
    let mut plan = PlanArgs::new(vec![input.to_string()], order_by);
    match variant {
        Variant::Cpu => plan.device = "cpu".parse().map_err(|e| format!("{e}"))?,
        Variant::DataFusionSort => plan.no_gpusort = true,
        _ => {}
    }
    if let Some(limit) = env("BENCH_MEMORY_LIMIT") {
        plan.memory_limit = Some(limit.parse().map_err(|e| format!("BENCH_MEMORY_LIMIT: {e}"))?);
    }
    let args = SortArgs::new(plan, out);
    let report = gpusort_cli::sort::sort(&args, ProgressMode::Quiet)
        .await
        .map_err(|e| e.one_line())?;
    Ok(Run {
        times: report.times,
        rows: report.rows,
        output_bytes: report.output_bytes,
        sorted: report.metrics.where_sorted(),
    })
}

/// The sort operators in `plan`, by name.
fn sort_operator(plan: &Arc<dyn ExecutionPlan>) -> String {
    let mut names = vec![];
    let mut nodes = vec![Arc::clone(plan)];
    while let Some(node) = nodes.pop() {
        nodes.extend(node.children().into_iter().cloned());
        if node.name().contains("Sort") {
            names.push(node.name().to_string());
        }
    }
    names.join(" over ")
}

fn unix_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
}

/// The sort key columns of two outputs are equal row for row (ties may order other columns
/// differently: stock DataFusion's merge is not stable across partitions).
fn compare_keys(a: &Path, b: &Path, order_by: &OrderBy, schema: &arrow::datatypes::Schema) -> Result<(), BoxError> {
    for key in order_by.keys() {
        let to = schema.field_with_name(&key.column)?.data_type();
        let (x, y) = (key_column(a, &key.column, to)?, key_column(b, &key.column, to)?);
        if x.len() != y.len() {
            return Err(format!("{} rows of {} against {}", y.len(), key.column, x.len()).into());
        }
        if x.as_ref() != y.as_ref() {
            let first = (0..x.len())
                .find(|&i| x.slice(i, 1).as_ref() != y.slice(i, 1).as_ref())
                .unwrap_or(0);
            return Err(format!("column {} differs from COPY's first at row {first}", key.column).into());
        }
    }
    Ok(())
}

/// One column of a Parquet file, as type `to`.
fn key_column(path: &Path, column: &str, to: &arrow::datatypes::DataType) -> Result<ArrayRef, BoxError> {
    let builder = ParquetRecordBatchReaderBuilder::try_new(File::open(path)?)?;
    let index = builder.schema().index_of(column)?;
    let mask = ProjectionMask::roots(builder.parquet_schema(), [index]);
    let batches: Vec<RecordBatch> = builder.with_projection(mask).build()?.collect::<Result<_, _>>()?;
    let parts = batches
        .iter()
        .map(|b| cast(b.column(0), to))
        .collect::<Result<Vec<_>, _>>()?;
    let refs: Vec<&dyn arrow::array::Array> = parts.iter().map(|p| p.as_ref()).collect();
    Ok(if refs.is_empty() {
        arrow::array::new_empty_array(to)
    } else {
        concat(&refs)?
    })
}

/// The run of median total time.
fn median(runs: &[Run]) -> &Run {
    let mut sorted: Vec<&Run> = runs.iter().collect();
    sorted.sort_by_key(|r| r.times.total());
    sorted[sorted.len() / 2]
}

fn print_table(results: &BTreeMap<Variant, Vec<Run>>, variants: &[Variant]) {
    let copy_total = results.get(&Variant::Copy).map(|r| median(r).times.total());
    println!("\nmedian run of each (seconds; `vs COPY`: total time over COPY's, lower is faster)");
    println!(
        "{:<26} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8} {:>10}  sorted",
        "variant", "planning", "reading", "sorting", "writing", "total", "min", "vs COPY", "output"
    );
    for variant in variants {
        let Some(runs) = results.get(variant) else { continue };
        let m = median(runs);
        let min = runs.iter().map(|r| r.times.total()).min().unwrap_or_default();
        let t = &m.times;
        let ratio = copy_total
            .map(|c| format!("{:.2}x", t.total().as_secs_f64() / c.as_secs_f64()))
            .unwrap_or_else(|| "-".into());
        println!(
            "{:<26} {:>8.3} {:>8.3} {:>8.3} {:>8.3} {:>8.3} {:>8.3} {:>8} {:>10}  {}",
            variant.label(),
            t.planning.as_secs_f64(),
            t.reading.as_secs_f64(),
            t.sorting.as_secs_f64(),
            t.writing.as_secs_f64(),
            t.total().as_secs_f64(),
            min.as_secs_f64(),
            ratio,
            format_size(m.output_bytes),
            m.sorted
        );
    }
}

fn write_csv(path: &str, results: &BTreeMap<Variant, Vec<Run>>, input: &str, order_by: &str) -> Result<(), BoxError> {
    let mut csv = String::from(
        "variant,run,planning_s,reading_s,sorting_s,writing_s,total_s,rows,output_bytes,input,order_by,sorted\n",
    );
    for (variant, runs) in results {
        for (i, r) in runs.iter().enumerate() {
            let t = &r.times;
            csv.push_str(&format!(
                "{},{},{:.6},{:.6},{:.6},{:.6},{:.6},{},{},\"{}\",\"{}\",\"{}\"\n",
                variant.key(),
                i + 1,
                t.planning.as_secs_f64(),
                t.reading.as_secs_f64(),
                t.sorting.as_secs_f64(),
                t.writing.as_secs_f64(),
                t.total().as_secs_f64(),
                r.rows,
                r.output_bytes,
                input,
                order_by.replace('"', "\"\""),
                r.sorted.replace('"', "\"\"")
            ));
        }
    }
    std::fs::write(path, csv)?;
    Ok(())
}
