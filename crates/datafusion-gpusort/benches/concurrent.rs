//! Many `ORDER BY` queries at once (issue 28): 1, 4 and 16 clients, each with a
//! `SessionContext` of its own over the `sql` bench's two tables, each running its queries
//! back to back (`SELECT * FROM t_a ORDER BY k`, `SELECT * FROM t_b ORDER BY a, s DESC, b`, in
//! turn): the aggregate rows/s and the p50/p99 latency of a query, for gpusort on the GPU
//! (default options), gpusort on the CPU (`gpusort.device = cpu`) and stock DataFusion; and,
//! given the DuckDB script's output, DuckDB's figures and gpusort's ratio to them.
//!
//! ```text
//! cargo bench -p datafusion-gpusort --bench concurrent                # 10M rows per table
//! BENCH_ROWS=100000 BENCH_QUERIES=2 cargo bench -p datafusion-gpusort --bench concurrent
//! BENCH_PARQUET_DIR=/tmp/tables cargo bench -p datafusion-gpusort --bench concurrent
//! python3 crates/datafusion-gpusort/benches/concurrent_duckdb.py /tmp/tables > duckdb.json
//! BENCH_DUCKDB_JSON=duckdb.json cargo bench -p datafusion-gpusort --bench concurrent
//! ```
//!
//! Environment: `BENCH_ROWS` (rows per table, default 10,000,000), `BENCH_CLIENTS` (default
//! `1,4,16`), `BENCH_QUERIES` (queries per client, default 4, at least 2: both tables),
//! `BENCH_PARTITIONS` (MemTable partitions and `target_partitions`, default 16),
//! `BENCH_CONTENDERS` (a comma list of `gpu`, `cpu`, `stock`; default all, `gpu` only when a
//! GPU is usable), `BENCH_PARQUET_DIR` (write the tables there as `t_a.parquet` and
//! `t_b.parquet` for the DuckDB script, then bench), `BENCH_DUCKDB_JSON` (the DuckDB script's
//! output: its rows and the ratios are printed), `BENCH_JSON` (also write the results there).
//!
//! Goals (issue 28): with 16 clients gpusort on the GPU sorts at least as many rows/s as with
//! one, and at least 3x DuckDB's rows/s with as many threads.

use std::error::Error;
use std::fmt::Write as _;
use std::sync::Arc;
use std::time::{Duration, Instant};

use arrow::array::RecordBatch;
use arrow::datatypes::SchemaRef;
use datafusion::dataframe::DataFrameWriteOptions;
use datafusion::datasource::MemTable;
use datafusion::execution::SessionStateBuilder;
use datafusion::prelude::{SessionConfig, SessionContext};
use datafusion_gpusort::{SessionStateBuilderExt, gpu_backend};

mod common;
use common::{env_usize, partitioned, scenarios};

type Result<T> = std::result::Result<T, Box<dyn Error + Send + Sync>>;

/// The two queries, over the tables as `t_a` and `t_b` (the DuckDB script runs the same).
const QUERIES: [&str; 2] = [
    "SELECT * FROM t_a ORDER BY k",
    "SELECT * FROM t_b ORDER BY a, s DESC, b",
];

/// Who sorts.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Contender {
    Gpu,
    Cpu,
    Stock,
}

impl Contender {
    fn name(self) -> &'static str {
        match self {
            Contender::Gpu => "gpusort gpu",
            Contender::Cpu => "gpusort cpu",
            Contender::Stock => "datafusion",
        }
    }

    fn key(self) -> &'static str {
        match self {
            Contender::Gpu => "gpu",
            Contender::Cpu => "cpu",
            Contender::Stock => "stock",
        }
    }
}

/// One level's figures.
#[derive(Debug, Clone, Copy)]
struct Level {
    clients: usize,
    queries: usize,
    seconds: f64,
    rows_per_s: f64,
    p50_ms: f64,
    p99_ms: f64,
}

/// A client's session: the tables registered, gpusort on the GPU, the CPU, or not at all.
async fn session(
    c: Contender,
    partitions: usize,
    tables: &[(String, SchemaRef, Vec<Vec<RecordBatch>>)],
) -> Result<SessionContext> {
    let config = SessionConfig::new().with_target_partitions(partitions);
    let mut builder = SessionStateBuilder::new().with_config(config).with_default_features();
    if c != Contender::Stock {
        builder = builder.with_gpusort();
    }
    let ctx = SessionContext::new_with_state(builder.build());
    for (name, schema, parts) in tables {
        ctx.register_table(
            name.as_str(),
            Arc::new(MemTable::try_new(Arc::clone(schema), parts.clone())?),
        )?;
    }
    if c == Contender::Cpu {
        ctx.sql("SET gpusort.device = 'cpu'").await?.collect().await?;
    }
    Ok(ctx)
}

/// The `q`-quantile of sorted `v`.
fn quantile(v: &[f64], q: f64) -> f64 {
    v[((v.len() - 1) as f64 * q).round() as usize]
}

/// `clients` clients, each running `queries` queries back to back; the aggregate figures.
async fn level(
    c: Contender,
    clients: usize,
    queries: usize,
    partitions: usize,
    rows: usize,
    tables: &[(String, SchemaRef, Vec<Vec<RecordBatch>>)],
) -> Result<Level> {
    let mut sessions = vec![];
    for _ in 0..clients {
        sessions.push(session(c, partitions, tables).await?);
    }
    let start = Instant::now();
    let tasks: Vec<_> = sessions
        .into_iter()
        .enumerate()
        .map(|(client, ctx)| {
            tokio::spawn(async move {
                let mut latencies = vec![];
                for q in 0..queries {
                    let sql = QUERIES[(client + q) % 2];
                    let t = Instant::now();
                    let batches = ctx.sql(sql).await?.collect().await?;
                    let n: usize = batches.iter().map(|b| b.num_rows()).sum();
                    assert_eq!(n, rows, "{sql}");
                    drop(batches);
                    latencies.push(t.elapsed());
                }
                Ok::<_, Box<dyn Error + Send + Sync>>(latencies)
            })
        })
        .collect();
    let mut latencies: Vec<f64> = vec![];
    for t in tasks {
        latencies.extend(t.await??.iter().map(|d: &Duration| d.as_secs_f64() * 1e3));
    }
    let seconds = start.elapsed().as_secs_f64();
    latencies.sort_by(f64::total_cmp);
    Ok(Level {
        clients,
        queries: latencies.len(),
        seconds,
        rows_per_s: (latencies.len() * rows) as f64 / seconds,
        p50_ms: quantile(&latencies, 0.5),
        p99_ms: quantile(&latencies, 0.99),
    })
}

/// DuckDB's levels from the script's JSON output: each object with `"clients"` and
/// `"rows_per_s"` (and `"p50_ms"`, `"p99_ms"`, `"queries"`, `"seconds"`).
fn duckdb_levels(json: &str) -> Vec<Level> {
    let number = |obj: &str, key: &str| -> Option<f64> {
        let at = obj.find(&format!("\"{key}\""))? + key.len() + 2;
        let rest = obj[at..].trim_start().strip_prefix(':')?.trim_start();
        let end = rest.find([',', '}', '\n']).unwrap_or(rest.len());
        rest[..end].trim().parse().ok()
    };
    json.split('{')
        .filter_map(|obj| {
            Some(Level {
                clients: number(obj, "clients")? as usize,
                queries: number(obj, "queries").unwrap_or(0.0) as usize,
                seconds: number(obj, "seconds").unwrap_or(0.0),
                rows_per_s: number(obj, "rows_per_s")?,
                p50_ms: number(obj, "p50_ms").unwrap_or(f64::NAN),
                p99_ms: number(obj, "p99_ms").unwrap_or(f64::NAN),
            })
        })
        .collect()
}

fn main() -> Result<()> {
    let rows = env_usize("BENCH_ROWS", 10_000_000);
    let queries = env_usize("BENCH_QUERIES", 4).max(2);
    let partitions = env_usize("BENCH_PARTITIONS", 16);
    let clients: Vec<usize> = std::env::var("BENCH_CLIENTS")
        .unwrap_or_else(|_| "1,4,16".into())
        .split(',')
        .filter_map(|c| c.trim().parse().ok())
        .collect();
    let gpu = gpu_backend(0);
    let wanted = std::env::var("BENCH_CONTENDERS").unwrap_or_else(|_| "gpu,cpu,stock".into());
    let contenders: Vec<Contender> = [Contender::Gpu, Contender::Cpu, Contender::Stock]
        .into_iter()
        .filter(|c| wanted.split(',').any(|w| w.trim() == c.key()))
        .filter(|c| match (c, &gpu) {
            (Contender::Gpu, Err(why)) => {
                eprintln!("gpusort gpu not run: {why}");
                false
            }
            _ => true,
        })
        .collect();
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    let started = Instant::now();
    let tables: Vec<(String, SchemaRef, Vec<Vec<RecordBatch>>)> = scenarios(rows)
        .into_iter()
        .zip(["t_a", "t_b"])
        .map(|(s, name)| {
            (
                name.to_string(),
                s.batch.schema(),
                partitioned(&s.batch, partitions, 8192),
            )
        })
        .collect();
    eprintln!("tables of {rows} rows made in {:.1} s", started.elapsed().as_secs_f64());

    if let Ok(dir) = std::env::var("BENCH_PARQUET_DIR") {
        std::fs::create_dir_all(&dir)?;
        runtime.block_on(async {
            let ctx = session(Contender::Stock, partitions, &tables).await?;
            for (name, _, _) in &tables {
                let path = format!("{dir}/{name}.parquet");
                ctx.table(name.as_str())
                    .await?
                    .write_parquet(&path, DataFrameWriteOptions::new().with_single_file_output(true), None)
                    .await?;
                eprintln!("wrote {path}");
            }
            Ok::<_, Box<dyn Error + Send + Sync>>(())
        })?;
    }

    let mut results: Vec<(Contender, Level)> = vec![];
    let mut out = String::new();
    writeln!(
        out,
        "{rows} rows per table, {queries} queries per client, {partitions} partitions\n\
         {:<12} {:>7} {:>7} {:>8} {:>12} {:>9} {:>9} {:>9}",
        "contender", "clients", "queries", "wall s", "Mrows/s", "vs 1", "p50 ms", "p99 ms"
    )?;
    for &c in &contenders {
        // Warm-up: each query once (the GPU opened and its kernels loaded).
        runtime.block_on(level(c, 1, 2, partitions, rows, &tables))?;
        let mut one = None;
        for &n in &clients {
            let l = runtime.block_on(level(c, n, queries, partitions, rows, &tables))?;
            let base = *one.get_or_insert(l.rows_per_s);
            writeln!(
                out,
                "{:<12} {:>7} {:>7} {:>8.2} {:>12.1} {:>8.2}x {:>9.1} {:>9.1}",
                c.name(),
                n,
                l.queries,
                l.seconds,
                l.rows_per_s / 1e6,
                l.rows_per_s / base,
                l.p50_ms,
                l.p99_ms
            )?;
            eprint!("{}", out.lines().last().map(|l| format!("{l}\n")).unwrap_or_default());
            results.push((c, l));
        }
    }
    if let Ok(Some(budget)) = gpu.as_ref().map(|g| Some(g.memory_budget().stats())) {
        writeln!(out, "device memory budget after the runs: {budget:?}")?;
    }
    if let Ok(path) = std::env::var("BENCH_DUCKDB_JSON") {
        let duck = duckdb_levels(&std::fs::read_to_string(&path)?);
        for d in &duck {
            writeln!(
                out,
                "{:<12} {:>7} {:>7} {:>8.2} {:>12.1} {:>9} {:>9.1} {:>9.1}",
                "duckdb",
                d.clients,
                d.queries,
                d.seconds,
                d.rows_per_s / 1e6,
                "",
                d.p50_ms,
                d.p99_ms
            )?;
        }
        writeln!(
            out,
            "\nratio of rows/s to DuckDB's with as many clients (goal: gpusort gpu >= 3x):"
        )?;
        for (c, l) in &results {
            if let Some(d) = duck.iter().find(|d| d.clients == l.clients) {
                writeln!(
                    out,
                    "{:<12} {:>3} clients: {:.2}x",
                    c.name(),
                    l.clients,
                    l.rows_per_s / d.rows_per_s
                )?;
            }
        }
    }
    // Goal: 16 clients (the most run) reach at least one client's throughput.
    for &c in &contenders {
        let levels: Vec<&Level> = results.iter().filter(|(x, _)| *x == c).map(|(_, l)| l).collect();
        if let (Some(first), Some(last)) = (levels.first(), levels.last())
            && levels.len() > 1
        {
            writeln!(
                out,
                "{}: {} clients reach {:.2}x the rows/s of {} ({})",
                c.name(),
                last.clients,
                last.rows_per_s / first.rows_per_s,
                first.clients,
                if last.rows_per_s >= first.rows_per_s {
                    "goal met"
                } else {
                    "goal missed"
                }
            )?;
        }
    }
    println!("{out}");
    if let Ok(path) = std::env::var("BENCH_JSON") {
        let mut json = format!("{{\"rows\": {rows}, \"results\": [\n");
        for (i, (c, l)) in results.iter().enumerate() {
            let sep = if i + 1 < results.len() { "," } else { "" };
            writeln!(
                json,
                "  {{\"contender\": \"{}\", \"clients\": {}, \"queries\": {}, \"seconds\": {:.4}, \"rows_per_s\": {:.1}, \"p50_ms\": {:.2}, \"p99_ms\": {:.2}}}{sep}",
                c.key(),
                l.clients,
                l.queries,
                l.seconds,
                l.rows_per_s,
                l.p50_ms,
                l.p99_ms
            )?;
        }
        json.push_str("]}\n");
        std::fs::write(path, json)?;
    }
    Ok(())
}
