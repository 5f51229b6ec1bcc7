//! What the benchmarks share: the two tables (seeded, so every bench sorts the same data),
//! their split into DataFusion partitions, environment knobs and the timing loop.
#![allow(dead_code)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use arrow::array::{ArrayRef, Int32Array, Int64Array, RecordBatch, StringArray, UInt32Array};
use arrow::datatypes::{DataType, Field, Schema};
use gpusort::{SortKey, SortSpec};
use rand::distr::{Alphanumeric, SampleString};
use rand::prelude::*;
use rand::rngs::SmallRng;

/// The seed of the tables' generator.
pub const SEED: u64 = 42;

/// `name` from the environment as a number, else `default`.
pub fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// `name` from the environment as a number, else `default`.
pub fn env_f64(name: &str, default: f64) -> f64 {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// A table, its sort and the same sort in SQL (over table `t`).
pub struct Scenario {
    pub name: &'static str,
    pub batch: RecordBatch,
    pub spec: SortSpec,
    pub sql: &'static str,
}

/// (a) a random u32 key + 20 random u32 columns, sorted by the key.
pub fn u32_table(rows: usize, rng: &mut SmallRng) -> Scenario {
    let mut fields = vec![Field::new("k", DataType::UInt32, false)];
    let mut cols: Vec<ArrayRef> = vec![Arc::new(UInt32Array::from_iter_values((0..rows).map(|_| rng.random())))];
    for i in 0..20 {
        fields.push(Field::new(format!("f{i}"), DataType::UInt32, false));
        cols.push(Arc::new(UInt32Array::from_iter_values((0..rows).map(|_| rng.random()))));
    }
    Scenario {
        name: "u32 key + 20 u32",
        batch: RecordBatch::try_new(Arc::new(Schema::new(fields)), cols).unwrap(),
        spec: SortSpec::new([SortKey::sql(0, false)]),
        sql: "SELECT * FROM t ORDER BY k",
    }
}

/// (b) 3 keys (i32 with 100 values, a string of 8-16 characters, i64) + 4 u32 columns.
pub fn three_key_table(rows: usize, rng: &mut SmallRng) -> Scenario {
    let mut fields = vec![
        Field::new("a", DataType::Int32, false),
        Field::new("s", DataType::Utf8, false),
        Field::new("b", DataType::Int64, false),
    ];
    let mut cols: Vec<ArrayRef> = vec![
        Arc::new(Int32Array::from_iter_values(
            (0..rows).map(|_| rng.random_range(0..100)),
        )),
        Arc::new(StringArray::from_iter_values((0..rows).map(|_| {
            let n = rng.random_range(8..=16);
            Alphanumeric.sample_string(rng, n)
        }))),
        Arc::new(Int64Array::from_iter_values((0..rows).map(|_| rng.random()))),
    ];
    for i in 0..4 {
        fields.push(Field::new(format!("f{i}"), DataType::UInt32, false));
        cols.push(Arc::new(UInt32Array::from_iter_values((0..rows).map(|_| rng.random()))));
    }
    Scenario {
        name: "3 keys (i32, utf8, i64) + 4 u32",
        batch: RecordBatch::try_new(Arc::new(Schema::new(fields)), cols).unwrap(),
        spec: SortSpec::new([SortKey::sql(0, false), SortKey::sql(1, true), SortKey::sql(2, false)]),
        sql: "SELECT * FROM t ORDER BY a, s DESC, b",
    }
}

/// `scenario` with its string columns as string views (as DataFusion reads Parquet strings),
/// named `name`.
pub fn with_string_views(scenario: &Scenario, name: &'static str) -> Scenario {
    let columns: Vec<ArrayRef> = (scenario.batch.columns().iter())
        .map(|c| match c.data_type() {
            DataType::Utf8 => arrow::compute::cast(c, &DataType::Utf8View).unwrap(),
            _ => Arc::clone(c),
        })
        .collect();
    let fields: Vec<Field> = (scenario.batch.schema().fields().iter())
        .zip(&columns)
        .map(|(f, c)| f.as_ref().clone().with_data_type(c.data_type().clone()))
        .collect();
    Scenario {
        name,
        batch: RecordBatch::try_new(Arc::new(Schema::new(fields)), columns).unwrap(),
        spec: scenario.spec.clone(),
        sql: scenario.sql,
    }
}

/// Both tables, from one generator seeded with [`SEED`] (in this order).
pub fn scenarios(rows: usize) -> Vec<Scenario> {
    let mut rng = SmallRng::seed_from_u64(SEED);
    let a = u32_table(rows, &mut rng);
    let b = three_key_table(rows, &mut rng);
    vec![a, b]
}

/// `batch` as `batch_size`-row slices dealt round-robin to `partitions` partitions (the
/// layout of a `MemTable` that DataFusion scans with one partition per thread).
pub fn partitioned(batch: &RecordBatch, partitions: usize, batch_size: usize) -> Vec<Vec<RecordBatch>> {
    let rows = batch.num_rows();
    let mut parts: Vec<Vec<RecordBatch>> = vec![vec![]; partitions.max(1)];
    let n = parts.len();
    for (i, start) in (0..rows).step_by(batch_size).enumerate() {
        parts[i % n].push(batch.slice(start, batch_size.min(rows - start)));
    }
    parts
}

/// Median and minimum of `runs` timings of `f` (at least one), after one warm-up run.
pub fn time(runs: usize, mut f: impl FnMut() -> usize) -> (Duration, Duration) {
    let rows = f();
    assert!(rows > 0);
    let mut t: Vec<Duration> = (0..runs.max(1))
        .map(|_| {
            let start = Instant::now();
            std::hint::black_box(f());
            start.elapsed()
        })
        .collect();
    t.sort();
    (t[t.len() / 2], t[0])
}

/// `BENCH_TIMELINE=1`: the `gpusort::timeline` debug events (the operator's and the GPU
/// session's steps) of a run, with the bench's own marks, in ms since the run started.
pub mod timeline {
    use std::fmt::Write as _;
    use std::sync::Mutex;
    use std::time::Instant;

    struct Timeline {
        events: Mutex<Vec<(Instant, String)>>,
    }

    impl log::Log for Timeline {
        fn enabled(&self, m: &log::Metadata) -> bool {
            m.target() == "gpusort::timeline"
        }

        fn log(&self, r: &log::Record) {
            if self.enabled(r.metadata()) {
                let now = Instant::now();
                let thread = std::thread::current().name().unwrap_or("?").to_string();
                let line = format!("[{thread}] {}", r.args());
                self.events.lock().unwrap_or_else(|p| p.into_inner()).push((now, line));
            }
        }

        fn flush(&self) {}
    }

    static TIMELINE: Timeline = Timeline {
        events: Mutex::new(vec![]),
    };

    /// Whether `BENCH_TIMELINE=1`; installs the logger when it is.
    pub fn from_env() -> Result<bool, String> {
        let on = std::env::var("BENCH_TIMELINE").is_ok_and(|v| v == "1");
        if on {
            log::set_logger(&TIMELINE).map_err(|e| e.to_string())?;
            log::set_max_level(log::LevelFilter::Debug);
        }
        Ok(on)
    }

    /// A bench step, as an event.
    pub fn mark(what: &str) {
        log::debug!(target: "gpusort::timeline", "bench: {what}");
    }

    /// Forgets earlier events; the start of a run.
    pub fn start() -> Instant {
        TIMELINE.events.lock().unwrap_or_else(|p| p.into_inner()).clear();
        let t0 = Instant::now();
        mark("start");
        t0
    }

    /// The events since `t0`, one per line.
    pub fn take(t0: Instant) -> String {
        let events = std::mem::take(&mut *TIMELINE.events.lock().unwrap_or_else(|p| p.into_inner()));
        let mut text = String::new();
        for (at, what) in events {
            let ms = at.saturating_duration_since(t0).as_secs_f64() * 1e3;
            let _ = writeln!(text, "  {ms:>9.2} ms  {what}");
        }
        text
    }
}
