//! Many `ORDER BY` queries at once on one GPU (issue 28): 32 queries of mixed sizes and key
//! types run concurrently, half through one `SessionContext` and half through one each, some
//! under a small `gpusort.gpu_memory_limit`, some cancelled midway (the stream dropped). Every
//! query that runs to its end must return stock DataFusion's rows; none may fail; afterwards
//! the device memory budget holds nothing, the device's free memory and the pinned pool's
//! bytes in use are back at their starting level.
//!
//! On the GPU machine (sizes from 1K to 20M rows, every sort on the GPU):
//!
//! ```text
//! GPUSORT_REQUIRE_GPU=1 cargo test --release -p datafusion-gpusort --test gpu_concurrency -- --nocapture
//! ```
//!
//! Without a GPU (CI) the same queries run on the CPU path, 200 times smaller (at least 1K
//! rows), the memory-limited ones with small runs (`gpusort.max_run_rows`) instead.
//! `GPUSORT_CONCURRENCY_SCALE=N` divides the GPU sizes by N.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use arrow::array::{ArrayRef, Float64Array, Int32Array, Int64Array, RecordBatch, StringArray, UInt32Array};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use arrow::row::{RowConverter, SortField};
use datafusion::datasource::MemTable;
use datafusion::execution::SessionStateBuilder;
use datafusion::physical_plan::{display::DisplayableExecutionPlan, execute_stream};
use datafusion::prelude::{SessionConfig, SessionContext};
use datafusion_gpusort::SessionStateBuilderExt;
use futures::StreamExt;
use gpusort_cuda::PinnedPool;
use rayon::prelude::*;

mod common;
use common::gpu_present;

/// Rows of the 32 queries on the GPU.
const GPU_SIZES: [usize; 32] = [
    20_000_000, 20_000_000, 10_000_000, 5_000_000, 2_000_000, 2_000_000, 1_000_000, 1_000_000, 500_000, 500_000,
    500_000, 200_000, 200_000, 200_000, 200_000, 100_000, 100_000, 100_000, 100_000, 100_000, 10_000, 10_000, 10_000,
    10_000, 10_000, 10_000, 1_000, 1_000, 1_000, 1_000, 1_000, 1_000,
];

/// The queries, over table `{t}`: each a total order of the rows (`id` is unique), so they
/// compare row for row with DataFusion's sort, which is not stable.
const QUERIES: [&str; 4] = [
    "SELECT * FROM {t} ORDER BY k64 DESC, id",
    "SELECT * FROM {t} ORDER BY f NULLS FIRST, id DESC",
    "SELECT id, s, p FROM {t} ORDER BY s, id",
    "SELECT * FROM {t} ORDER BY k32, s DESC NULLS LAST, id",
];

/// Rows per batch of the tables.
const TABLE_BATCH: usize = 65_536;
/// Partitions of the tables.
const PARTITIONS: usize = 4;

fn mix(mut x: u64) -> u64 {
    // splitmix64's finalizer: a seeded, fast hash of the row number.
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

fn schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("id", DataType::Int64, false),
        Field::new("k32", DataType::Int32, true),
        Field::new("k64", DataType::Int64, true),
        Field::new("f", DataType::Float64, true),
        Field::new("s", DataType::Utf8, true),
        Field::new("p", DataType::UInt32, false),
    ]))
}

/// Rows `range` of a table: nulls in every key, NaN, -0.0 and 0.0, strings of 4 to 43
/// characters over five letters (shared prefixes, some longer than the GPU's 32-byte prefix).
fn batch(range: std::ops::Range<usize>) -> RecordBatch {
    let h: Vec<u64> = range.clone().map(|i| mix(i as u64)).collect();
    let id = Int64Array::from_iter_values(range.map(|i| i as i64));
    let k32: Int32Array = h
        .iter()
        .map(|&h| (h % 17 != 0).then_some((h % 1000) as i32 - 500))
        .collect();
    let k64: Int64Array = h.iter().map(|&h| (h % 23 != 0).then_some(h as i64)).collect();
    let f: Float64Array = h
        .iter()
        .map(|&h| match h % 31 {
            0 => Some(f64::NAN),
            1 => Some(-0.0),
            2 => Some(0.0),
            3 => None,
            _ => Some(((h >> 8) % 100_000) as f64 / 7.0 - 5000.0),
        })
        .collect();
    let s: StringArray = h
        .iter()
        .map(|&h| {
            (h % 29 != 0).then(|| {
                let len = 4 + (h >> 5) as usize % 40;
                (0..len)
                    .map(|j| (b'a' + ((h >> (j % 24)) % 5) as u8) as char)
                    .collect::<String>()
            })
        })
        .collect();
    let p = UInt32Array::from_iter_values(h.iter().map(|&h| (h >> 32) as u32));
    let columns: Vec<ArrayRef> = vec![
        Arc::new(id),
        Arc::new(k32),
        Arc::new(k64),
        Arc::new(f),
        Arc::new(s),
        Arc::new(p),
    ];
    RecordBatch::try_new(schema(), columns).unwrap()
}

/// A table of `rows` rows in [`PARTITIONS`] partitions.
fn table(rows: usize) -> Arc<MemTable> {
    let per = rows.div_ceil(PARTITIONS);
    let parts: Vec<Vec<RecordBatch>> = (0..PARTITIONS)
        .into_par_iter()
        .map(|p| {
            let (start, end) = ((p * per).min(rows), ((p + 1) * per).min(rows));
            (start..end)
                .step_by(TABLE_BATCH)
                .map(|b| batch(b..(b + TABLE_BATCH).min(end)))
                .collect()
        })
        .collect();
    Arc::new(MemTable::try_new(schema(), parts).unwrap())
}

/// One of the 32 queries.
#[derive(Debug, Clone)]
struct Query {
    index: usize,
    rows: usize,
    sql: String,
    /// Through a context of its own (else the shared one).
    own_context: bool,
    /// Under a small memory limit (GPU: `gpu_memory_limit`; CPU: `max_run_rows`).
    limited: bool,
    /// Dropped after this long (queries 0, 7, 8, 15, ...: the first 20M-row one among them).
    cancel_after: Option<Duration>,
}

fn queries(sizes: &[usize]) -> Vec<Query> {
    sizes
        .iter()
        .enumerate()
        .map(|(index, &rows)| Query {
            index,
            rows,
            sql: QUERIES[(index + index / 4) % 4].replace("{t}", &format!("t{rows}")),
            own_context: index % 2 == 1,
            limited: index % 4 == 1,
            cancel_after: matches!(index % 8, 0 | 7).then(|| Duration::from_millis(2 + 40 * (index as u64 % 5))),
        })
        .collect()
}

/// A session with gpusort (or stock DataFusion), `tables` registered and `settings` set.
async fn context(
    gpusort: bool,
    tables: &BTreeMap<usize, Arc<MemTable>>,
    settings: &[(&str, &str)],
) -> Arc<SessionContext> {
    let mut builder = SessionStateBuilder::new()
        .with_config(SessionConfig::new().with_target_partitions(PARTITIONS))
        .with_default_features();
    if gpusort {
        builder = builder.with_gpusort();
    }
    let ctx = SessionContext::new_with_state(builder.build());
    for (rows, t) in tables {
        ctx.register_table(format!("t{rows}"), Arc::clone(t) as _).unwrap();
    }
    for (k, v) in settings {
        ctx.sql(&format!("SET {k} = '{v}'")).await.unwrap();
    }
    Arc::new(ctx)
}

/// The first row where `actual` differs from `expected`, compared by their row encoding (NaN
/// equals NaN, -0.0 differs from 0.0), or a difference in row counts.
fn first_difference(expected: &[RecordBatch], actual: &[RecordBatch]) -> Option<String> {
    let count = |b: &[RecordBatch]| b.iter().map(|b| b.num_rows()).sum::<usize>();
    if count(expected) != count(actual) {
        return Some(format!("{} rows, expected {}", count(actual), count(expected)));
    }
    let first = expected.first()?;
    let fields = first
        .schema()
        .fields()
        .iter()
        .map(|f| SortField::new(f.data_type().clone()))
        .collect();
    let converter = RowConverter::new(fields).unwrap();
    let rows = |batches: &[RecordBatch]| {
        let mut rows = converter.empty_rows(0, 0);
        for b in batches {
            converter.append(&mut rows, b.columns()).unwrap();
        }
        rows
    };
    let (e, a) = (rows(expected), rows(actual));
    (0..e.num_rows())
        .find(|&i| e.row(i) != a.row(i))
        .map(|i| format!("row {i} differs"))
}

/// Bytes of the process's pinned pool in use (not free blocks it keeps).
fn pinned_in_use() -> usize {
    let s = PinnedPool::global().stats();
    s.pinned_bytes - s.free_bytes
}

/// What the GPU holds: the budget's reserved bytes and sorts, the device's free memory.
fn device_level() -> Option<(usize, usize, usize)> {
    let gpu = datafusion_gpusort::gpu_backend(0).ok()?;
    let budget = gpu.memory_budget().stats();
    Some((budget.reserved, budget.sorts, gpu.gpu().free_memory().unwrap()))
}

/// Runs `q` on `ours` (dropping it midway when it is to be cancelled) and, when it ran to its
/// end, on `stock`; an error names the query.
async fn run(q: Query, ours: Arc<SessionContext>, stock: Arc<SessionContext>) -> Result<(Query, bool), String> {
    let what = format!("query {} ({} rows): {}", q.index, q.rows, q.sql);
    let df = ours.sql(&q.sql).await.map_err(|e| format!("{what}: {e}"))?;
    let plan = df.create_physical_plan().await.map_err(|e| format!("{what}: {e}"))?;
    let mut stream = execute_stream(Arc::clone(&plan), ours.task_ctx()).map_err(|e| format!("{what}: {e}"))?;
    let started = Instant::now();
    let mut actual = vec![];
    loop {
        let next = match q.cancel_after {
            Some(after) => match tokio::time::timeout(after.saturating_sub(started.elapsed()), stream.next()).await {
                Ok(next) => next,
                // Cancelled: the stream and everything it holds are dropped.
                Err(_) => return Ok((q, false)),
            },
            None => stream.next().await,
        };
        match next {
            Some(batch) => actual.push(batch.map_err(|e| format!("{what}: {e}"))?),
            None => break,
        }
    }
    drop(stream);
    // A GPU sort that failed (other than for its own memory limit) and reran on the CPU.
    let metrics = DisplayableExecutionPlan::with_metrics(plan.as_ref())
        .indent(true)
        .to_string();
    if let Some(at) = metrics.find("GPU failed") {
        let failed = &metrics[at..];
        let failed = &failed[..failed.find(", ").unwrap_or(failed.len())];
        // Only a memory-limited query may find a sort over its own limit.
        if !(q.limited && failed.contains("needs") && !failed.contains("device memory budget")) {
            return Err(format!("{what}: {failed}"));
        }
    }
    let expected = stock
        .sql(&q.sql)
        .await
        .map_err(|e| format!("{what}: stock: {e}"))?
        .collect()
        .await
        .map_err(|e| format!("{what}: stock: {e}"))?;
    let difference = tokio::task::spawn_blocking(move || first_difference(&expected, &actual))
        .await
        .unwrap();
    match difference {
        Some(d) => Err(format!("{what}: differs from DataFusion: {d}")),
        None => Ok((q, true)),
    }
}

/// Waits up to 10 s for `f` to hold (memory is released on other threads and in stream
/// order); returns whether it did.
async fn eventually(mut f: impl FnMut() -> bool) -> bool {
    let start = Instant::now();
    while !f() {
        if start.elapsed() > Duration::from_secs(10) {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    true
}

#[tokio::test(flavor = "multi_thread")]
async fn thirty_two_concurrent_queries_match_datafusion_and_leave_nothing_behind() {
    // Without a usable GPU (and GPUSORT_REQUIRE_GPU=1 unset), the CPU path, smaller.
    let gpu = datafusion_gpusort::gpu_backend(0).is_ok() || gpu_present();
    if !gpu {
        eprintln!("the queries run on the CPU path, 200 times smaller");
    }
    let sizes: Vec<usize> = if gpu {
        let scale = std::env::var("GPUSORT_CONCURRENCY_SCALE")
            .ok()
            .and_then(|v| v.parse::<usize>().ok())
            .unwrap_or(1)
            .max(1);
        GPU_SIZES.iter().map(|n| (n / scale).max(1_000)).collect()
    } else {
        GPU_SIZES.iter().map(|n| (n / 200).max(1_000)).collect()
    };
    let started = Instant::now();
    let tables: BTreeMap<usize, Arc<MemTable>> = sizes.iter().map(|&n| (n, table(n))).collect();
    eprintln!(
        "tables of {:?} rows made in {:.1} s",
        tables.keys().collect::<Vec<_>>(),
        started.elapsed().as_secs_f64()
    );
    let device = if gpu { "0" } else { "cpu" };
    let on = [("gpusort.device", device), ("gpusort.min_rows", "0")];
    let limit = if gpu {
        ("gpusort.gpu_memory_limit", "64MiB")
    } else {
        ("gpusort.max_run_rows", "3000")
    };
    let limited = [on[0], on[1], limit];
    let stock = context(false, &tables, &[]).await;
    let shared = context(true, &tables, &on).await;

    // Warm up (the backend opened, the kernels loaded), then take the starting levels.
    let warm = queries(&[1_000]).remove(0);
    run(warm, Arc::clone(&shared), Arc::clone(&stock)).await.unwrap();
    let device_start = device_level();
    let pinned_start = pinned_in_use();

    let started = Instant::now();
    let mut tasks = vec![];
    for q in queries(&sizes) {
        let ours = match (q.own_context, q.limited) {
            (false, _) => Arc::clone(&shared),
            (true, false) => context(true, &tables, &on).await,
            (true, true) => context(true, &tables, &limited).await,
        };
        tasks.push(tokio::spawn(run(q, ours, Arc::clone(&stock))));
    }
    let mut failures = vec![];
    let (mut compared, mut cancelled) = (0, 0);
    for t in tasks {
        match t.await.expect("a query task panicked") {
            Ok((_, true)) => compared += 1,
            Ok((_, false)) => cancelled += 1,
            Err(e) => failures.push(e),
        }
    }
    eprintln!(
        "{compared} queries matched DataFusion, {cancelled} cancelled, {} failed, in {:.1} s",
        failures.len(),
        started.elapsed().as_secs_f64()
    );
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    assert_eq!(compared + cancelled, 32);
    assert!(cancelled <= 8 && compared >= 24);
    drop((shared, stock, tables));

    // Everything the queries held comes back.
    let pinned_back = eventually(|| pinned_in_use() <= pinned_start).await;
    assert!(
        pinned_back,
        "pinned bytes in use: {} after, {pinned_start} before ({:?})",
        pinned_in_use(),
        PinnedPool::global().stats()
    );
    if let Some((_, _, free_start)) = device_start {
        let budget = datafusion_gpusort::gpu_backend(0).unwrap().memory_budget().stats();
        eprintln!("device memory budget: {budget:?}");
        assert_eq!(budget.refusals, 0, "the budget refused sorts: {budget:?}");
        let back = eventually(|| {
            let (reserved, sorts, free) = device_level().unwrap();
            // The stream-ordered pool's idle memory counts as free; allow 64 MiB for the
            // driver's own (streams and events made meanwhile).
            reserved == 0 && sorts == 0 && free + (64 << 20) >= free_start
        })
        .await;
        assert!(back, "device: {:?} after, free {free_start} before", device_level());
    }
}
