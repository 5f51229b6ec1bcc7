//! SQL `ORDER BY`, end to end (`ctx.sql(q).await?.collect().await?`, planning included): stock
//! DataFusion against gpusort's operator with its default options (the GPU when there is one,
//! one `GpuSortExec` over all partitions), with `gpusort.output_range_rows = 0` (the sorted
//! rows taken whole rather than a range at a time), with `gpusort.merge_partitions = false` (a
//! `GpuSortExec` per partition, merged by a `GpuSortPreservingMergeExec`) and with
//! `gpusort.device = cpu`. Prints a table of median and minimum times with ratios to stock
//! DataFusion, what the `GpuSortExec` metrics say (path, CPU fallback reason, kernel time,
//! bytes over PCIe and the PCIe round trip they cost), and whether every contender's output
//! is sorted with the same keys and rows as stock DataFusion's. It also times the input alone
//! (`SELECT * FROM t`, no sort): what reading the table through DataFusion costs.
//!
//! Each table runs a second time with **sorted partitions**: every partition sorted by the
//! query's keys and the `MemTable` declared sorted so, as files written sorted are. DataFusion
//! then plans no sort, only its `SortPreservingMergeExec` over the partitions; gpusort's rule
//! makes that a `GpuSortPreservingMergeExec` (the merge of the runs on the GPU), whose
//! `gpusort.device = cpu` contender merges them on every core instead.
//!
//! ```text
//! cargo bench -p datafusion-gpusort --bench sql                  # 10M rows, 5 runs
//! BENCH_ROWS=200000 BENCH_RUNS=1 cargo bench -p datafusion-gpusort --bench sql
//! cargo bench -p datafusion-gpusort --bench sql --no-run         # the binary for a GPU machine
//! ```
//!
//! Environment: `BENCH_ROWS` (default 10,000,000), `BENCH_RUNS` (timed runs after one warm-up,
//! default 5), `BENCH_PARTITIONS` (MemTable partitions and `target_partitions`, default 16),
//! `BENCH_CSV` (also write the table there), `BENCH_SORTED_PARTITIONS` (0: skip the sorted
//! partitions' runs), `PCIE_H2D_GBPS` / `PCIE_D2H_GBPS` (pinned
//! bandwidths for the round-trip estimate, default 48.2 / 53.2 GB/s: the H100 machine's).
//!
//! Tables (the same seeded data as the `cpu_backend` bench): (a) a u32 key + 20 u32 columns,
//! `ORDER BY k`; (b) 3 keys (i32 with 100 values, a string of 8-16 characters, i64) + 4 u32
//! columns, `ORDER BY a, s DESC, b`; (c) table (b) with its strings as string views (as
//! DataFusion reads Parquet strings), whose keys the GPU encodes itself.

use std::error::Error;
use std::fmt::Write as _;
use std::sync::Arc;
use std::time::Duration;

use arrow::array::{Array, RecordBatch, UInt32Array};
use arrow::compute::{SortColumn, concat_batches, lexsort_to_indices, take_record_batch};
use arrow::row::{OwnedRow, RowConverter, SortField};
use datafusion::datasource::MemTable;
use datafusion::execution::SessionStateBuilder;
use datafusion::logical_expr::SortExpr;
use datafusion::physical_plan::{ExecutionPlan, ExecutionPlanProperties, collect};
use datafusion::prelude::{SessionConfig, SessionContext, col};
use datafusion_gpusort::{GpuSortExec, GpuSortPreservingMergeExec, SessionStateBuilderExt, gpu_backend};
use gpusort::SortSpec;

mod common;
use common::{Scenario, env_f64, env_usize, partitioned, scenarios, time, timeline, with_string_views};

type Result<T> = std::result::Result<T, Box<dyn Error>>;

/// One run of `sql` on `ctx` with its timeline.
fn timeline(runtime: &tokio::runtime::Runtime, ctx: &SessionContext, sql: &str) -> Result<String> {
    let t0 = timeline::start();
    runtime.block_on(async {
        let df = ctx.sql(sql).await?;
        timeline::mark("logical plan");
        let out = df.collect().await?;
        timeline::mark("collected");
        drop(out);
        timeline::mark("output dropped");
        Ok::<_, datafusion::error::DataFusionError>(())
    })?;
    Ok(timeline::take(t0))
}

/// One way of running the query.
struct Contender {
    label: &'static str,
    gpusort: bool,
    /// Statements run on the session before the query.
    setup: &'static [&'static str],
    /// Whether it runs on sorted partitions too (where it would plan what another does).
    on_sorted: bool,
}

const CONTENDERS: &[Contender] = &[
    Contender {
        label: "datafusion (stock)",
        gpusort: false,
        setup: &[],
        on_sorted: true,
    },
    Contender {
        label: "gpusort (defaults)",
        gpusort: true,
        setup: &[],
        on_sorted: true,
    },
    Contender {
        // The sorted rows taken whole instead of in ranges: what the ranges cost a consumer
        // that keeps every batch (a collect).
        label: "gpusort output_range_rows=0",
        gpusort: true,
        setup: &["SET gpusort.output_range_rows = 0"],
        on_sorted: false,
    },
    Contender {
        label: "gpusort merge_partitions=false",
        gpusort: true,
        setup: &["SET gpusort.merge_partitions = false"],
        on_sorted: false,
    },
    Contender {
        label: "gpusort device=cpu",
        gpusort: true,
        setup: &["SET gpusort.device = 'cpu'"],
        on_sorted: true,
    },
];

/// What identifies a correct sort cheaply: the row count, whether the sort keys are
/// non-decreasing in the ORDER BY's order, a hash of the key sequence (the same for every
/// correct sort, whatever the order of ties) and the sum of a payload column (the same rows).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Fingerprint {
    rows: usize,
    sorted: bool,
    key_hash: u64,
    payload_sum: u64,
}

fn fingerprint(batches: &[RecordBatch], spec: &SortSpec) -> Result<Fingerprint> {
    let Some(first) = batches.first() else {
        return Ok(Fingerprint {
            rows: 0,
            sorted: true,
            key_hash: 0,
            payload_sum: 0,
        });
    };
    let schema = first.schema();
    let fields = spec
        .keys()
        .iter()
        .map(|k| SortField::new_with_options(schema.field(k.column).data_type().clone(), k.options))
        .collect();
    let converter = RowConverter::new(fields)?;
    let payload = schema.index_of("f0")?;
    let mut fp = Fingerprint {
        rows: 0,
        sorted: true,
        key_hash: 0xcbf2_9ce4_8422_2325,
        payload_sum: 0,
    };
    let mut last: Option<OwnedRow> = None;
    for batch in batches {
        if batch.num_rows() == 0 {
            continue;
        }
        fp.rows += batch.num_rows();
        let keys: Vec<_> = spec.keys().iter().map(|k| Arc::clone(batch.column(k.column))).collect();
        let rows = converter.convert_columns(&keys)?;
        for row in rows.iter() {
            if let Some(prev) = &last
                && prev.row() > row
            {
                fp.sorted = false;
            }
            // FNV-1a over the row-encoded keys, with each row's length as a separator.
            for &b in (row.as_ref().len() as u32).to_le_bytes().iter().chain(row.as_ref()) {
                fp.key_hash = (fp.key_hash ^ u64::from(b)).wrapping_mul(0x100_0000_01b3);
            }
            last = Some(row.owned());
        }
        let f0 = batch
            .column(payload)
            .as_any()
            .downcast_ref::<UInt32Array>()
            .ok_or("payload column f0 is not u32")?;
        fp.payload_sum = f0
            .values()
            .iter()
            .fold(fp.payload_sum, |s, &v| s.wrapping_add(u64::from(v)));
    }
    Ok(fp)
}

/// What the `GpuSortExec`s and `GpuSortPreservingMergeExec`s of an executed plan recorded (summed over partitions and nodes).
#[derive(Debug, Default, Clone)]
struct SortMetrics {
    nodes: usize,
    gpu_sorts: usize,
    cpu_sorts: usize,
    path: Vec<String>,
    cpu_fallback: Vec<String>,
    elapsed_compute_ns: usize,
    /// Per phase, in [`PHASES`] order.
    phase_ns: [usize; PHASES.len()],
    kernel_ns: usize,
    bytes_to_device: usize,
    bytes_from_device: usize,
    /// Range-merge steps, and those whose runs the GPU merged (`merge.cu`).
    merge_steps: usize,
    gpu_merged_steps: usize,
}

/// The phases of a sort as the `GpuSortExec` metrics time them, in the order they happen (the
/// first three overlap the input's arrival; gather overlaps download on the GPU path).
const PHASES: [(&str, &str); 9] = [
    ("input_time", "input"),
    ("stage_time", "stage"),
    ("upload_time", "upload"),
    ("concat_time", "concat"),
    ("encode_time", "encode"),
    ("sort_time", "sort"),
    ("download_time", "download"),
    ("gather_time", "gather"),
    ("output_time", "output"),
];

fn visit(plan: &Arc<dyn ExecutionPlan>, f: &mut dyn FnMut(&Arc<dyn ExecutionPlan>)) {
    f(plan);
    for child in plan.children() {
        visit(child, f);
    }
}

fn sort_metrics(plan: &Arc<dyn ExecutionPlan>) -> SortMetrics {
    let mut m = SortMetrics::default();
    visit(plan, &mut |node| {
        if node.downcast_ref::<GpuSortExec>().is_none() && node.downcast_ref::<GpuSortPreservingMergeExec>().is_none() {
            return;
        }
        m.nodes += 1;
        let Some(set) = node.metrics() else { return };
        for metric in set.aggregate_by_name().iter() {
            let value = metric.value();
            let n = value.as_usize();
            match value.name() {
                "gpu_sorts" => m.gpu_sorts += n,
                "cpu_sorts" => m.cpu_sorts += n,
                "elapsed_compute" => m.elapsed_compute_ns += n,
                "gpu_kernel_time" => m.kernel_ns += n,
                "bytes_to_device" => m.bytes_to_device += n,
                "bytes_from_device" => m.bytes_from_device += n,
                "range_merge_steps" => m.merge_steps += n,
                "gpu_merged_steps" => m.gpu_merged_steps += n,
                "path" => m.path.push(value.to_string()),
                "cpu_fallback" => m.cpu_fallback.push(value.to_string()),
                name => {
                    if let Some(p) = PHASES.iter().position(|(metric, _)| *metric == name) {
                        m.phase_ns[p] += n;
                    }
                }
            }
        }
    });
    m
}

/// The plan's sorts and merges, top down, e.g. `SortPreservingMergeExec > SortExec x16`
/// (x16: the operator's output partitions).
fn plan_shape(plan: &Arc<dyn ExecutionPlan>) -> String {
    let mut parts = vec![];
    visit(plan, &mut |node| match node.name() {
        name @ ("SortExec" | "GpuSortExec") => {
            parts.push(format!("{name} x{}", node.output_partitioning().partition_count()))
        }
        name @ ("SortPreservingMergeExec" | "GpuSortPreservingMergeExec" | "CoalescePartitionsExec") => {
            parts.push(name.to_string())
        }
        _ => {}
    });
    parts.join(" > ")
}

/// Each partition of `data` sorted by `spec`, in `batch_size`-row batches.
fn sort_partitions(data: &[Vec<RecordBatch>], spec: &SortSpec, batch_size: usize) -> Result<Vec<Vec<RecordBatch>>> {
    let mut sorted = vec![];
    for part in data {
        let Some(first) = part.first() else {
            sorted.push(vec![]);
            continue;
        };
        let whole = concat_batches(&first.schema(), part)?;
        let columns: Vec<SortColumn> = spec
            .keys()
            .iter()
            .map(|k| SortColumn {
                values: Arc::clone(whole.column(k.column)),
                options: Some(k.options),
            })
            .collect();
        let whole = take_record_batch(&whole, &lexsort_to_indices(&columns, None)?)?;
        let rows = whole.num_rows();
        sorted.push(
            (0..rows)
                .step_by(batch_size)
                .map(|start| whole.slice(start, batch_size.min(rows - start)))
                .collect(),
        );
    }
    Ok(sorted)
}

/// `spec` as the `MemTable`'s declared order.
fn declared_order(spec: &SortSpec, schema: &arrow::datatypes::Schema) -> Vec<Vec<SortExpr>> {
    let exprs = spec.keys().iter().map(|k| {
        col(format!("\"{}\"", schema.field(k.column).name())).sort(!k.options.descending, k.options.nulls_first)
    });
    vec![exprs.collect()]
}

/// A session with table `t` (gpusort registered or not; declared sorted by `order` when given),
/// after running `setup`.
async fn session(
    c: &Contender,
    partitions: usize,
    batch_size: usize,
    data: &[Vec<RecordBatch>],
    schema: arrow::datatypes::SchemaRef,
    order: Option<Vec<Vec<SortExpr>>>,
) -> Result<SessionContext> {
    let config = SessionConfig::new()
        .with_target_partitions(partitions)
        .with_batch_size(batch_size);
    let mut builder = SessionStateBuilder::new().with_config(config).with_default_features();
    if c.gpusort {
        builder = builder.with_gpusort();
    }
    let ctx = SessionContext::new_with_state(builder.build());
    let table = MemTable::try_new(schema, data.to_vec())?;
    let table = match order {
        Some(order) => table.with_sort_order(order),
        None => table,
    };
    ctx.register_table("t", Arc::new(table))?;
    for s in c.setup {
        ctx.sql(s).await?.collect().await?;
    }
    Ok(ctx)
}

struct Row {
    workload: String,
    contender: &'static str,
    plan: String,
    median: Duration,
    min: Duration,
    stock_median: Duration,
    fingerprint: Fingerprint,
    matches_stock: bool,
    metrics: Option<SortMetrics>,
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn ns_ms(ns: usize) -> f64 {
    ns as f64 / 1e6
}

fn csv_field(s: &str) -> String {
    if s.contains([',', '"', '\n']) {
        format!("\"{}\"", s.replace('"', "\"\""))
    } else {
        s.to_string()
    }
}

/// One table (unsorted or with sorted partitions) and its query.
struct Workload<'a> {
    name: String,
    data: &'a [Vec<RecordBatch>],
    schema: arrow::datatypes::SchemaRef,
    /// The table's declared order (sorted partitions).
    order: Option<Vec<Vec<SortExpr>>>,
    spec: &'a SortSpec,
    sql: &'static str,
}

impl Workload<'_> {
    /// Times every contender that runs on it; a row each, checked against the first (stock).
    fn contenders(
        &self,
        runtime: &tokio::runtime::Runtime,
        rows: usize,
        runs: usize,
        partitions: usize,
        batch_size: usize,
        timelines: bool,
    ) -> Result<Vec<Row>> {
        let mut out = vec![];
        let mut stock: Option<(Duration, Fingerprint)> = None;
        for c in CONTENDERS.iter().filter(|c| self.order.is_none() || c.on_sorted) {
            let ctx = runtime.block_on(session(
                c,
                partitions,
                batch_size,
                self.data,
                Arc::clone(&self.schema),
                self.order.clone(),
            ))?;
            let (median, min) = time(runs, || {
                runtime.block_on(async {
                    let out = ctx.sql(self.sql).await.unwrap().collect().await.unwrap();
                    out.iter().map(|b| b.num_rows()).sum()
                })
            });
            // One more run with the physical plan kept, for its metrics and its output.
            let (batches, plan) = runtime.block_on(async {
                let plan = ctx.sql(self.sql).await?.create_physical_plan().await?;
                let batches = collect(Arc::clone(&plan), ctx.task_ctx()).await?;
                Ok::<_, datafusion::error::DataFusionError>((batches, plan))
            })?;
            let fp = fingerprint(&batches, self.spec)?;
            drop(batches);
            if timelines && c.gpusort {
                println!(
                    "timeline of one run, {}, {}:\n{}",
                    self.name,
                    c.label,
                    timeline(runtime, &ctx, self.sql)?
                );
            }
            let (stock_median, matches_stock) = match &stock {
                None => {
                    stock = Some((median, fp.clone()));
                    (median, fp.rows == rows && fp.sorted)
                }
                Some((t, s)) => (*t, fp == *s && fp.sorted),
            };
            eprintln!(
                "  {:<32} median {:>9.1} ms  min {:>9.1} ms",
                c.label,
                ms(median),
                ms(min)
            );
            out.push(Row {
                workload: self.name.clone(),
                contender: c.label,
                plan: plan_shape(&plan),
                median,
                min,
                stock_median,
                fingerprint: fp,
                matches_stock,
                metrics: c.gpusort.then(|| sort_metrics(&plan)),
            });
        }
        Ok(out)
    }
}

fn main() -> Result<()> {
    let rows = env_usize("BENCH_ROWS", 10_000_000);
    let runs = env_usize("BENCH_RUNS", 5).max(1);
    let partitions = env_usize("BENCH_PARTITIONS", 16).max(1);
    let h2d = env_f64("PCIE_H2D_GBPS", 48.2);
    let d2h = env_f64("PCIE_D2H_GBPS", 53.2);
    let batch_size = 8192;
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    let threads = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);

    println!(
        "SQL ORDER BY end to end: {rows} rows, {partitions} partitions, {threads} threads, median and min of {runs} runs after a warm-up"
    );
    // Opens the GPU once for the process (as the first GPU sort would), so that no timed run
    // pays for the CUDA context and kernel set-up.
    let gpu = match gpu_backend(0) {
        Ok(gpu) => {
            let info = gpu.gpu().info().to_string();
            println!("GPU: {info}");
            Ok(info)
        }
        Err(why) => {
            println!("GPU: none usable ({why}); every gpusort contender sorts on the CPU backend");
            Err(why)
        }
    };
    println!(
        "PCIe round trip estimated at {h2d} GB/s host->device, {d2h} GB/s device->host (PCIE_H2D_GBPS, PCIE_D2H_GBPS)"
    );

    let timelines = timeline::from_env()?;
    let mut table: Vec<Row> = vec![];
    let mut scans: Vec<(&str, Duration, Duration)> = vec![];
    let sorted_too = env_usize("BENCH_SORTED_PARTITIONS", 1) != 0;
    let mut tables = scenarios(rows);
    // The string table again with string views, as DataFusion reads Parquet strings: their
    // keys are encoded on the device.
    tables.push(with_string_views(&tables[1], "3 keys (i32, utf8view, i64) + 4 u32"));
    for Scenario { name, batch, spec, sql } in tables {
        let data = partitioned(&batch, partitions, batch_size);
        let schema = batch.schema();
        drop(batch);
        eprintln!("{name}: {sql}");
        let run = Workload {
            name: name.to_string(),
            data: &data,
            schema: Arc::clone(&schema),
            order: None,
            spec: &spec,
            sql,
        };
        table.extend(run.contenders(&runtime, rows, runs, partitions, batch_size, timelines)?);
        if sorted_too {
            let sorted = sort_partitions(&data, &spec, batch_size)?;
            eprintln!("{name}, sorted partitions: {sql}");
            let run = Workload {
                name: format!("{name}, sorted partitions"),
                data: &sorted,
                schema: Arc::clone(&schema),
                order: Some(declared_order(&spec, &schema)),
                spec: &spec,
                sql,
            };
            table.extend(run.contenders(&runtime, rows, runs, partitions, batch_size, timelines)?);
        }
        // What reading the table costs without a sort: DataFusion's scan of every partition
        // through the CoalescePartitionsExec that `collect` adds (the input side of the
        // one-GpuSortExec plan).
        let ctx = runtime.block_on(session(
            &CONTENDERS[0],
            partitions,
            batch_size,
            &data,
            Arc::clone(&schema),
            None,
        ))?;
        let (median, min) = time(runs, || {
            runtime.block_on(async {
                let out = ctx.sql("SELECT * FROM t").await.unwrap().collect().await.unwrap();
                out.iter().map(|b| b.num_rows()).sum()
            })
        });
        scans.push((name, median, min));
    }

    let round_trip =
        |m: &SortMetrics| (m.bytes_to_device as f64 / (h2d * 1e9) + m.bytes_from_device as f64 / (d2h * 1e9)) * 1e3;
    let mut out = String::new();
    writeln!(out)?;
    writeln!(
        out,
        "The input alone, `SELECT * FROM t` (no sort; DataFusion coalesces the partitions):"
    )?;
    for (name, median, min) in &scans {
        writeln!(out, "  {name}: median {:.1} ms, min {:.1} ms", ms(*median), ms(*min))?;
    }
    writeln!(out)?;
    writeln!(
        out,
        "| workload | contender | plan | median ms | min ms | speedup vs stock (median) | output check |"
    )?;
    writeln!(out, "|---|---|---|---:|---:|---:|---|")?;
    for r in &table {
        let check = if r.matches_stock {
            format!("ok ({} rows, sorted)", r.fingerprint.rows)
        } else {
            format!("MISMATCH {:?}", r.fingerprint)
        };
        writeln!(
            out,
            "| {} | {} | {} | {:.1} | {:.1} | {:.2}x | {check} |",
            r.workload,
            r.contender,
            r.plan,
            ms(r.median),
            ms(r.min),
            r.stock_median.as_secs_f64() / r.median.as_secs_f64(),
        )?;
    }
    writeln!(out)?;
    writeln!(
        out,
        "GpuSortExec metrics of one run (times summed over partitions; PCIe round trip = to_device / H2D + from_device / D2H):"
    )?;
    writeln!(out)?;
    writeln!(
        out,
        "| workload | contender | path | cpu_fallback | sorts gpu/cpu | merge steps (on the GPU) | sort op ms | gpu_kernel ms | to device MB | from device MB | PCIe round trip ms | end-to-end / round trip |"
    )?;
    writeln!(out, "|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")?;
    for r in &table {
        let Some(m) = &r.metrics else { continue };
        let rt = round_trip(m);
        let ratio = if rt > 0.0 {
            format!("{:.1}x", ms(r.median) / rt)
        } else {
            "n/a (nothing crossed PCIe)".into()
        };
        writeln!(
            out,
            "| {} | {} | {} | {} | {}/{} | {} ({}) | {:.1} | {:.2} | {:.1} | {:.1} | {:.2} | {ratio} |",
            r.workload,
            r.contender,
            m.path.join("; "),
            m.cpu_fallback.join("; "),
            m.gpu_sorts,
            m.cpu_sorts,
            m.merge_steps,
            m.gpu_merged_steps,
            ns_ms(m.elapsed_compute_ns),
            ns_ms(m.kernel_ns),
            m.bytes_to_device as f64 / 1e6,
            m.bytes_from_device as f64 / 1e6,
            rt,
        )?;
    }
    writeln!(out)?;
    writeln!(
        out,
        "Where the time went, per phase (ms summed over partitions; stage and upload overlap the input, gather overlaps download):"
    )?;
    writeln!(out)?;
    let names: Vec<&str> = PHASES.iter().map(|(_, name)| *name).collect();
    writeln!(out, "| workload | contender | {} | gpu_kernel |", names.join(" | "))?;
    writeln!(out, "|---|---|{}---:|", "---:|".repeat(PHASES.len()))?;
    for r in &table {
        let Some(m) = &r.metrics else { continue };
        let phases: Vec<String> = m.phase_ns.iter().map(|ns| format!("{:.1}", ns_ms(*ns))).collect();
        writeln!(
            out,
            "| {} | {} | {} | {:.2} |",
            r.workload,
            r.contender,
            phases.join(" | "),
            ns_ms(m.kernel_ns)
        )?;
    }
    writeln!(out)?;
    let gpu_sorts: usize = table
        .iter()
        .filter_map(|r| r.metrics.as_ref())
        .map(|m| m.gpu_sorts)
        .sum();
    match &gpu {
        Ok(info) if gpu_sorts > 0 => writeln!(
            out,
            "GPU path taken on {info} ({gpu_sorts} GPU sorts in the metrics runs)"
        )?,
        Ok(info) => writeln!(
            out,
            "GPU path NOT taken although {info} is usable: see cpu_fallback above"
        )?,
        Err(why) => writeln!(out, "GPU path NOT taken: no usable GPU ({why})")?,
    }
    let pool = gpusort_cuda::PinnedPool::global().stats();
    writeln!(
        out,
        "Pinned pool: {:.0} MB pinned ({:.0} MB free) of a {:.0} MB limit; {} buffers reused, {} allocated, {} unpinned",
        pool.pinned_bytes as f64 / 1e6,
        pool.free_bytes as f64 / 1e6,
        pool.limit as f64 / 1e6,
        pool.reused,
        pool.allocated,
        pool.unpinned
    )?;
    print!("{out}");

    if let Ok(path) = std::env::var("BENCH_CSV") {
        let mut csv = String::from(
            "workload,contender,plan,rows,runs,partitions,median_ms,min_ms,speedup_vs_stock,output_ok,path,cpu_fallback,gpu_sorts,cpu_sorts,merge_steps,gpu_merged_steps,sort_op_ms,",
        );
        for (_, name) in PHASES {
            csv.push_str(&format!("{name}_ms,"));
        }
        csv.push_str(
            "gpu_kernel_ms,bytes_to_device,bytes_from_device,pcie_h2d_gbps,pcie_d2h_gbps,pcie_round_trip_ms,e2e_over_round_trip\n",
        );
        for r in &table {
            let m = r.metrics.clone().unwrap_or_default();
            let rt = round_trip(&m);
            let mut fields = vec![
                r.workload.to_string(),
                r.contender.to_string(),
                r.plan.clone(),
                r.fingerprint.rows.to_string(),
                runs.to_string(),
                partitions.to_string(),
                format!("{:.3}", ms(r.median)),
                format!("{:.3}", ms(r.min)),
                format!("{:.4}", r.stock_median.as_secs_f64() / r.median.as_secs_f64()),
                r.matches_stock.to_string(),
                m.path.join("; "),
                m.cpu_fallback.join("; "),
                m.gpu_sorts.to_string(),
                m.cpu_sorts.to_string(),
                m.merge_steps.to_string(),
                m.gpu_merged_steps.to_string(),
                format!("{:.3}", ns_ms(m.elapsed_compute_ns)),
            ];
            fields.extend(m.phase_ns.iter().map(|ns| format!("{:.3}", ns_ms(*ns))));
            fields.extend([
                format!("{:.3}", ns_ms(m.kernel_ns)),
                m.bytes_to_device.to_string(),
                m.bytes_from_device.to_string(),
                h2d.to_string(),
                d2h.to_string(),
                format!("{rt:.3}"),
                if rt > 0.0 {
                    format!("{:.3}", ms(r.median) / rt)
                } else {
                    String::new()
                },
            ]);
            let line: Vec<String> = fields.iter().map(|f| csv_field(f)).collect();
            csv.push_str(&line.join(","));
            csv.push('\n');
        }
        std::fs::write(&path, csv)?;
        println!("wrote {path}");
    }

    if table.iter().any(|r| !r.matches_stock) {
        return Err("an output differs from stock DataFusion's (see the table)".into());
    }
    Ok(())
}
