//! The external sort, end to end: `SELECT * FROM t ORDER BY k` over a table of a random u64
//! key and 4 u64 columns (400M rows, ~16 GB, by default), with a host memory pool that forces
//! spilling and a GPU memory budget far below the table, against stock DataFusion under the
//! same memory pool, against DuckDB under the same memory limit (`external_duckdb.py`, run by
//! this bench on the table written as Arrow IPC files: DuckDB's Python package must be
//! importable), and against gpusort's in-memory sort of the same table (no limits) — all in one
//! run. Every output is streamed (not collected) and checked: sorted by `k`, the same
//! row count, and the same wrapping sums of every column as the input.
//!
//! ```text
//! cargo bench -p datafusion-gpusort --bench external --no-run    # the binary for a GPU machine
//! EXT_ROWS=2000000 EXT_POOL=64M EXT_GPU_LIMIT=32M cargo bench -p datafusion-gpusort --bench external
//! ```
//!
//! Environment: `EXT_ROWS` (default 400,000,000), `EXT_POOL` (the memory pool of the limited
//! contenders, default `4G`), `EXT_GPU_LIMIT` (`gpusort.gpu_memory_limit`, default `2G`),
//! `EXT_PARTITIONS` (table partitions and `target_partitions`, default 16), `EXT_SPILL_DIR`
//! (default the system temp dir), `EXT_CONTENDERS` (comma-separated labels to run, default
//! all: `stock`, `duckdb`, `gpusort`, `gpusort-keys` (range-merge steps send only their keys to
//! the GPU: `gpusort.merge_keys_only`), `gpusort-cpu`, `in-memory`), `EXT_DUCKDB_SCRIPT` (the
//! DuckDB script, default `benches/external_duckdb.py` of this crate, found from the working
//! directory or the crate's), `EXT_CSV` (also write the table there),
//! `EXT_CHECK` (`parallel`, the default: output batches are checked 64 at a time on every core;
//! `inline`: each batch on the consumer's thread as it comes).

use std::error::Error;
use std::fmt::Write as _;
use std::sync::Arc;
use std::time::{Duration, Instant};

use arrow::array::{ArrayRef, AsArray, RecordBatch, UInt64Array};
use arrow::datatypes::{DataType, Field, Schema, UInt64Type};
use datafusion::datasource::MemTable;
use datafusion::execution::SessionStateBuilder;
use datafusion::execution::disk_manager::{DiskManagerBuilder, DiskManagerMode};
use datafusion::execution::memory_pool::FairSpillPool;
use datafusion::execution::runtime_env::RuntimeEnvBuilder;
use datafusion::physical_plan::metrics::MetricsSet;
use datafusion::physical_plan::{ExecutionPlan, execute_stream};
use datafusion::prelude::{SessionConfig, SessionContext};
use datafusion_gpusort::{ByteSize, SessionStateBuilderExt};
use futures::StreamExt;
use rand::prelude::*;
use rand::rngs::SmallRng;
use rayon::prelude::*;

mod common;
use common::{SEED, env_usize, timeline};

type Result<T> = std::result::Result<T, Box<dyn Error>>;

const COLUMNS: usize = 5;
const BATCH: usize = 8192;
/// Rows of the query each gpusort contender runs before it is timed (over `gpusort.min_rows`).
const WARM_UP_ROWS: usize = 200_000;

/// The table, split into `partitions`, and the wrapping sum of every column.
fn table(rows: usize, partitions: usize) -> (Vec<Vec<RecordBatch>>, [u64; COLUMNS]) {
    let schema = schema();
    let batches: Vec<RecordBatch> = (0..rows.div_ceil(BATCH))
        .into_par_iter()
        .map(|b| {
            let mut rng = SmallRng::seed_from_u64(SEED ^ (b as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15));
            let n = BATCH.min(rows - b * BATCH);
            let columns: Vec<ArrayRef> = (0..COLUMNS)
                .map(|_| Arc::new(UInt64Array::from_iter_values((0..n).map(|_| rng.random::<u64>()))) as ArrayRef)
                .collect();
            RecordBatch::try_new(Arc::clone(&schema), columns).unwrap()
        })
        .collect();
    let sums = batches.par_iter().map(sums_of).reduce(|| [0; COLUMNS], add_sums);
    let mut parts = vec![vec![]; partitions.max(1)];
    let n = parts.len();
    for (i, b) in batches.into_iter().enumerate() {
        parts[i % n].push(b);
    }
    (parts, sums)
}

fn schema() -> Arc<Schema> {
    let mut fields = vec![Field::new("k", DataType::UInt64, false)];
    fields.extend((1..COLUMNS).map(|i| Field::new(format!("c{i}"), DataType::UInt64, false)));
    Arc::new(Schema::new(fields))
}

fn sums_of(b: &RecordBatch) -> [u64; COLUMNS] {
    let mut s = [0u64; COLUMNS];
    for (c, sum) in s.iter_mut().enumerate() {
        *sum = b
            .column(c)
            .as_primitive::<UInt64Type>()
            .values()
            .iter()
            .fold(0u64, |a, v| a.wrapping_add(*v));
    }
    s
}

fn add_sums(a: [u64; COLUMNS], b: [u64; COLUMNS]) -> [u64; COLUMNS] {
    std::array::from_fn(|i| a[i].wrapping_add(b[i]))
}

/// What the consumer checks of the output: sorted by `k` (within and across batches), its rows
/// and the wrapping sums of every column.
///
/// The batches are checked in groups, in parallel: one core reading 16 GB would take ~2.5 s
/// and be the slowest step of a fast sort, so that the bench measured its own consumer.
/// `EXT_CHECK=inline` checks every batch as it comes, on the consumer's thread, instead.
struct Check {
    rows: usize,
    last: Option<u64>,
    sorted: bool,
    sums: [u64; COLUMNS],
}

impl Default for Check {
    fn default() -> Self {
        Self {
            rows: 0,
            last: None,
            sorted: true,
            sums: [0; COLUMNS],
        }
    }
}

impl Check {
    /// Checks consecutive output batches.
    fn add(&mut self, batches: Vec<RecordBatch>) {
        let each: Vec<_> = batches
            .par_iter()
            .map(|b| {
                let k = b.column(0).as_primitive::<UInt64Type>().values();
                let ends = k.first().map(|f| (*f, *k.last().unwrap()));
                (b.num_rows(), ends, k.windows(2).all(|w| w[0] <= w[1]), sums_of(b))
            })
            .collect();
        for (rows, ends, sorted, sums) in each {
            self.rows += rows;
            self.sorted &= sorted;
            if let Some((first, last)) = ends {
                self.sorted &= self.last.is_none_or(|l| l <= first);
                self.last = Some(last);
            }
            self.sums = add_sums(self.sums, sums);
        }
    }
}

/// One way of running the query.
struct Contender {
    label: &'static str,
    /// DuckDB (`external_duckdb.py`) instead of DataFusion.
    duckdb: bool,
    gpusort: bool,
    /// The memory pool is limited.
    limited: bool,
    /// `gpusort.*` options.
    options: &'static [(&'static str, &'static str)],
}

const CONTENDERS: &[Contender] = &[
    Contender {
        label: "stock",
        duckdb: false,
        gpusort: false,
        limited: true,
        options: &[],
    },
    Contender {
        label: "duckdb",
        duckdb: true,
        gpusort: false,
        limited: true,
        options: &[],
    },
    Contender {
        label: "gpusort",
        duckdb: false,
        gpusort: true,
        limited: true,
        options: &[],
    },
    Contender {
        label: "gpusort-keys",
        duckdb: false,
        gpusort: true,
        limited: true,
        options: &[("gpusort.merge_keys_only", "true")],
    },
    Contender {
        label: "gpusort-cpu",
        duckdb: false,
        gpusort: true,
        limited: true,
        options: &[("gpusort.device", "cpu")],
    },
    Contender {
        label: "in-memory",
        duckdb: false,
        gpusort: true,
        limited: false,
        options: &[],
    },
];

struct Outcome {
    time: Duration,
    rows: usize,
    ok: bool,
    metrics: MetricsSet,
    /// What ran, where the metrics do not say (DuckDB's version).
    path: Option<String>,
}

/// Where spills (and DuckDB's table files) go: `EXT_SPILL_DIR`, or the system temp dir.
fn spill_dir() -> String {
    std::env::var("EXT_SPILL_DIR").unwrap_or_else(|_| std::env::temp_dir().display().to_string())
}

/// The DuckDB script: `EXT_DUCKDB_SCRIPT`, or the crate's from the working directory (the
/// repository root on the GPU machine) or from where the crate was built.
fn duckdb_script() -> String {
    const REL: &str = "crates/datafusion-gpusort/benches/external_duckdb.py";
    std::env::var("EXT_DUCKDB_SCRIPT").unwrap_or_else(|_| {
        if std::path::Path::new(REL).exists() {
            REL.into()
        } else {
            concat!(env!("CARGO_MANIFEST_DIR"), "/benches/external_duckdb.py").into()
        }
    })
}

/// DuckDB's run of the query: the table written as Arrow IPC files (one a partition, not
/// timed) into the spill directory, `external_duckdb.py` run on them with the pool as DuckDB's
/// memory limit, its `key=value` lines read back, the files removed.
fn run_duckdb(parts: &[Vec<RecordBatch>], sums: [u64; COLUMNS], pool: usize) -> Result<Outcome> {
    let spill_dir = spill_dir();
    let dir = std::path::Path::new(&spill_dir).join(format!("gpusort-external-duckdb-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let written = parts.par_iter().enumerate().try_for_each(|(i, batches)| {
        let write = || -> std::result::Result<(), arrow::error::ArrowError> {
            let file = std::fs::File::create(dir.join(format!("part-{i:03}.arrow")))?;
            let mut w = arrow::ipc::writer::FileWriter::try_new(std::io::BufWriter::new(file), &schema())?;
            for b in batches {
                w.write(b)?;
            }
            w.finish()
        };
        write().map_err(|e| e.to_string())
    });
    let run = written.and_then(|_| {
        std::process::Command::new("python3")
            .arg(duckdb_script())
            .arg(&dir)
            .arg(pool.to_string())
            .arg(&spill_dir)
            .stderr(std::process::Stdio::inherit())
            .output()
            .map_err(|e| e.to_string())
    });
    std::fs::remove_dir_all(&dir)?;
    let out = run?;
    let text = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        return Err(format!("external_duckdb.py failed ({}): {text}", out.status).into());
    }
    let value = |key: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(key)?.strip_prefix('='))
            .ok_or_else(|| format!("external_duckdb.py printed no {key}: {text}"))
    };
    let got_sums: Vec<u64> = value("sums")?
        .split(',')
        .map(|s| s.parse())
        .collect::<std::result::Result<_, _>>()?;
    Ok(Outcome {
        time: Duration::from_secs_f64(value("ms")?.parse::<f64>()? / 1e3),
        rows: value("rows")?.parse()?,
        ok: value("sorted")? == "1" && got_sums == sums,
        metrics: MetricsSet::new(),
        path: Some(format!("duckdb {}", value("version")?)),
    })
}

async fn run(
    c: &Contender,
    parts: &[Vec<RecordBatch>],
    sums: [u64; COLUMNS],
    pool: usize,
    gpu_limit: &str,
    timelines: bool,
    check_batches: usize,
) -> Result<Outcome> {
    let partitions = parts.len();
    let spill_dir = spill_dir();
    let mut runtime = RuntimeEnvBuilder::new().with_disk_manager_builder(
        DiskManagerBuilder::default().with_mode(DiskManagerMode::Directories(vec![spill_dir.into()])),
    );
    if c.limited {
        runtime = runtime.with_memory_pool(Arc::new(FairSpillPool::new(pool)));
    }
    let config = SessionConfig::new().with_target_partitions(partitions);
    let mut builder = SessionStateBuilder::new()
        .with_config(config)
        .with_runtime_env(runtime.build_arc()?)
        .with_default_features();
    if c.gpusort {
        builder = builder.with_gpusort();
    }
    let ctx = SessionContext::new_with_state(builder.build());
    if c.gpusort {
        ctx.sql(&format!(
            "SET gpusort.gpu_memory_limit = '{}'",
            if c.limited { gpu_limit } else { "0" }
        ))
        .await?;
        for (k, v) in c.options {
            ctx.sql(&format!("SET {k} = '{v}'")).await?;
        }
    }
    if c.gpusort {
        // Open the device and compile (or load) the kernels before the clock starts: a
        // first use with an empty kernel cache spends seconds in NVRTC.
        let (warm, _) = table(WARM_UP_ROWS, 1);
        ctx.register_table("warm_up", Arc::new(MemTable::try_new(schema(), warm)?))?;
        ctx.sql("SELECT * FROM warm_up ORDER BY k").await?.collect().await?;
        ctx.deregister_table("warm_up")?;
    }
    ctx.register_table("t", Arc::new(MemTable::try_new(schema(), parts.to_vec())?))?;
    let t0 = timeline::start();
    let start = Instant::now();
    let plan = ctx
        .sql("SELECT * FROM t ORDER BY k")
        .await?
        .create_physical_plan()
        .await?;
    let mut stream = execute_stream(Arc::clone(&plan), ctx.task_ctx())?;
    let mut check = Check::default();
    let mut pending = vec![];
    while let Some(batch) = stream.next().await {
        let batch = batch?;
        if check.rows == 0 && pending.is_empty() {
            timeline::mark("first output batch");
        }
        pending.push(batch);
        if pending.len() >= check_batches {
            check.add(std::mem::take(&mut pending));
        }
    }
    check.add(pending);
    let time = start.elapsed();
    timeline::mark("last output batch");
    drop(stream);
    if c.gpusort && timelines {
        // The upload thread's per-segment lines are left out.
        let text = timeline::take(t0);
        let lines: Vec<&str> = text.lines().filter(|l| !l.contains("segment")).collect();
        println!("timeline, {}:\n{}", c.label, lines.join("\n"));
    }
    let reserved = ctx.runtime_env().memory_pool.reserved();
    if reserved != 0 {
        return Err(format!("{}: {reserved} bytes still reserved", c.label).into());
    }
    Ok(Outcome {
        time,
        rows: check.rows,
        ok: check.sorted && check.sums == sums,
        metrics: metrics_of(&plan),
        path: None,
    })
}

/// The metrics of the plan's sort operators, summed.
fn metrics_of(plan: &Arc<dyn ExecutionPlan>) -> MetricsSet {
    let mut out = MetricsSet::new();
    if plan.name().contains("Sort")
        && let Some(m) = plan.metrics()
    {
        for metric in m.iter() {
            out.push(Arc::clone(metric));
        }
    }
    for child in plan.children() {
        for metric in metrics_of(child).iter() {
            out.push(Arc::clone(metric));
        }
    }
    out
}

fn count(m: &MetricsSet, name: &str) -> usize {
    m.sum_by_name(name).map(|v| v.as_usize()).unwrap_or(0)
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn text(m: &MetricsSet, name: &str) -> String {
    m.iter()
        .filter(|x| x.value().name() == name)
        .map(|x| x.value().to_string())
        .find(|v| v != "none")
        .unwrap_or_else(|| "-".into())
}

#[tokio::main]
async fn main() -> Result<()> {
    let rows = env_usize("EXT_ROWS", 400_000_000);
    let partitions = env_usize("EXT_PARTITIONS", 16);
    let pool: ByteSize = std::env::var("EXT_POOL").unwrap_or_else(|_| "4G".into()).parse()?;
    let gpu_limit = std::env::var("EXT_GPU_LIMIT").unwrap_or_else(|_| "2G".into());
    let wanted = std::env::var("EXT_CONTENDERS").ok();
    let timelines = timeline::from_env()?;
    let check_batches = match std::env::var("EXT_CHECK").as_deref() {
        Ok("inline") => 1,
        Ok("parallel") | Err(_) => 64,
        Ok(other) => return Err(format!("EXT_CHECK is inline or parallel, not {other}").into()),
    };
    let start = Instant::now();
    let (parts, sums) = table(rows, partitions);
    let bytes = rows * COLUMNS * 8;
    println!(
        "external sort: {rows} rows x {COLUMNS} u64 ({:.1} GB), {partitions} partitions, pool {} ({} GB), gpusort.gpu_memory_limit {gpu_limit}, output checked {}; table made in {:.1} s",
        bytes as f64 / 1e9,
        pool,
        pool.0 as f64 / 1e9,
        if check_batches > 1 { "in parallel" } else { "inline" },
        start.elapsed().as_secs_f64()
    );
    let mut table = String::new();
    writeln!(
        table,
        "| contender | pool | time ms | Mrows/s | vs stock | vs DuckDB | of in-memory | runs | spill files | spilled GB | merges | GPU-merged steps | GPU key steps | merge ms | path | cpu_fallback | ok |"
    )?;
    writeln!(
        table,
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
    )?;
    let mut results = vec![];
    for c in CONTENDERS {
        if let Some(w) = &wanted
            && !w.split(',').any(|x| x.trim() == c.label)
        {
            continue;
        }
        eprintln!("running {} ...", c.label);
        let out = if c.duckdb {
            run_duckdb(&parts, sums, pool.0)
        } else {
            run(c, &parts, sums, pool.0, &gpu_limit, timelines, check_batches).await
        };
        match &out {
            Ok(o) => eprintln!("  {} in {:.0} ms", c.label, ms(o.time)),
            Err(e) => eprintln!("  {} failed: {e}", c.label),
        }
        results.push((c, out));
    }
    let time_of = |label: &str| {
        results
            .iter()
            .find(|(c, o)| c.label == label && o.is_ok())
            .map(|(_, o)| o.as_ref().unwrap().time)
    };
    let (stock, duck, memory) = (time_of("stock"), time_of("duckdb"), time_of("in-memory"));
    for (c, out) in &results {
        let Ok(o) = out else {
            writeln!(table, "| {} | failed: {} |", c.label, out.as_ref().err().unwrap())?;
            continue;
        };
        let ratio = |base: Option<Duration>| {
            base.map_or("-".into(), |b| {
                format!("{:.2}x", b.as_secs_f64() / o.time.as_secs_f64())
            })
        };
        let share = |base: Option<Duration>| {
            base.map_or("-".into(), |b| {
                format!("{:.0}%", 100.0 * b.as_secs_f64() / o.time.as_secs_f64())
            })
        };
        let m = &o.metrics;
        // DuckDB's run has no DataFusion metrics: its cells say "-", not 0.
        let known = |v: usize| {
            if o.path.is_some() {
                "-".to_string()
            } else {
                v.to_string()
            }
        };
        writeln!(
            table,
            "| {} | {} | {:.0} | {:.1} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            c.label,
            if c.limited { pool.to_string() } else { "none".into() },
            ms(o.time),
            o.rows as f64 / o.time.as_secs_f64() / 1e6,
            ratio(stock),
            ratio(duck),
            share(memory),
            known(count(m, "runs")),
            known(m.spill_count().unwrap_or(0)),
            m.spilled_bytes()
                .map_or("-".into(), |b| format!("{:.2}", b as f64 / 1e9)),
            known(count(m, "intermediate_merges")),
            known(count(m, "gpu_merged_steps")),
            known(count(m, "gpu_key_steps")),
            known(count(m, "merge_time") / 1_000_000),
            o.path.clone().unwrap_or_else(|| text(m, "path")),
            text(m, "cpu_fallback"),
            if o.ok && o.rows == rows { "yes" } else { "NO" },
        )?;
    }
    println!("{table}");
    for (c, out) in &results {
        if let (Ok(o), true) = (out, c.gpusort) {
            println!("{} GpuSortExec metrics: {}", c.label, o.metrics.aggregate_by_name());
        }
    }
    if let Ok(path) = std::env::var("EXT_CSV") {
        std::fs::write(path, &table)?;
    }
    if results
        .iter()
        .any(|(_, o)| !matches!(o, Ok(o) if o.ok && o.rows == rows))
    {
        return Err("a contender failed or gave a wrong result".into());
    }
    Ok(())
}
