//! Differential SQL fuzzing of gpusort against stock DataFusion, in the style of arrow-rs's
//! row-format `fuzz_test`: seeded random tables (every type gpusort encodes, nulls, NaN, -0.0,
//! infinities, long shared string prefixes, few distinct values so that ties happen), random
//! `ORDER BY` lists (columns and expressions, ASC/DESC, NULLS FIRST/LAST), `LIMIT`/`OFFSET`,
//! column subsets, random `target_partitions` and `batch_size`; each query runs on a session
//! with gpusort and on a stock one, and the results are compared.
//!
//! DataFusion's sort is not stable, so rows are not compared one for one. Instead:
//!
//! * the sequence of sort key values (the key expressions evaluated on the output rows) must
//!   be equal row by row (compared through Arrow's row format: bit-exact, NaN equal to NaN);
//! * gpusort's output must be ordered by the keys (Arrow's `LexicographicalComparator`);
//! * the output rows must be equal as multisets, leaving out, under `LIMIT` or `OFFSET`, the
//!   rows tied with the last (first) key value, which either sort may pick differently;
//! * the plan that ran must hold a `GpuSortExec` and no `SortExec` wherever stock DataFusion
//!   sorts, so the test cannot silently compare DataFusion with itself, but for the TopKs of
//!   at most `gpusort.topk_max_fetch` rows that the rule leaves to DataFusion (a case sets
//!   that option to 0, sending every TopK to `GpuSortExec`, three times in four);
//! * a query fails on one session exactly when it fails on the other.
//!
//! Under `LIMIT`, stock DataFusion 55.2 can be wrong: its TopK treats -0.0 and +0.0 as equal
//! (`ORDER BY f LIMIT 2` over `0.0, 0.0` then `-0.0, -0.0` returns the +0.0 rows, while its full
//! sort puts -0.0 first), and it orders lists and structs that hold nulls differently from its
//! full sort (`ORDER BY l DESC NULLS FIRST LIMIT 9`: the full sort puts `[NULL, NULL, NULL]`
//! before `[NULL, 0]`, the TopK after; under `ASC` a struct with a null field likewise). When
//! the keys differ under `LIMIT`/`OFFSET`, gpusort's result is
//! therefore compared with DataFusion's full sort cut to the window; if that matches, the query
//! counts as `stock_topk_wrong` instead of failing.
//!
//! Every case derives from one `u64` seed; a failure prints it with the query, the table's
//! schema and the session settings, and `run_sql_fuzz_case(seed, ..)` replays it.
#![allow(dead_code)]

use std::collections::BTreeSet;
use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use arrow::array::{
    Array, ArrayRef, BinaryArray, BooleanArray, Date32Array, Decimal128Array, DictionaryArray, Float32Array,
    Float64Array, Int8Array, Int16Array, Int32Array, Int64Array, LargeStringArray, ListArray, RecordBatch, StringArray,
    StringViewArray, StructArray, TimestampMicrosecondArray, TimestampMillisecondArray, TimestampNanosecondArray,
    TimestampSecondArray, UInt8Array, UInt16Array, UInt32Array, UInt64Array,
};
use arrow::buffer::NullBuffer;
use arrow::compute::{LexicographicalComparator, SortColumn, SortOptions, concat_batches, lexsort_to_indices, take};
use arrow::datatypes::{DataType, Field, Fields, Int32Type, Schema, SchemaRef, TimeUnit};
use arrow::row::{RowConverter, Rows, SortField};
use arrow::util::display::{ArrayFormatter, FormatOptions};
use datafusion::common::DFSchema;
use datafusion::datasource::MemTable;
use datafusion::error::DataFusionError;
use datafusion::execution::SessionStateBuilder;
use datafusion::execution::memory_pool::MemoryPool;
use datafusion::execution::runtime_env::{RuntimeEnv, RuntimeEnvBuilder};
use datafusion::logical_expr::simplify::SimplifyContext;
use datafusion::optimizer::simplify_expressions::ExprSimplifier;
use datafusion::physical_plan::sorts::sort::SortExec;
use datafusion::physical_plan::{ExecutionPlan, collect, execute_stream};
use datafusion::prelude::{SessionConfig, SessionContext};
use datafusion_gpusort::{GpuSortConfig, GpuSortExec};
use futures::StreamExt;
use rand::rngs::SmallRng;
use rand::seq::{IndexedRandom, SliceRandom};
use rand::{Rng, SeedableRng};

/// Queries run on each random table (one table and one pair of sessions per case).
pub const QUERIES_PER_CASE: usize = 3;

/// What a fuzz run did, summed over its cases.
#[derive(Debug, Default, Clone)]
pub struct FuzzReport {
    /// Random tables (each with its own sessions).
    pub cases: usize,
    /// Queries run on both sessions.
    pub queries: usize,
    /// Rows of the tables, summed over cases.
    pub table_rows: usize,
    /// Rows the compared queries returned, summed.
    pub output_rows: usize,
    /// The largest table.
    pub max_table_rows: usize,
    /// Queries with a `LIMIT`.
    pub with_limit: usize,
    /// Queries with an `OFFSET`.
    pub with_offset: usize,
    /// Queries with an expression (not a plain column) among their sort keys.
    pub with_expr: usize,
    /// Queries that also select their sort keys as `k0, k1, ...` (the others sort by the
    /// expressions themselves, evaluated inside the sort).
    pub keys_selected: usize,
    /// Queries that selected a subset of the columns.
    pub column_subset: usize,
    /// Queries whose gpusort plan sorts with `GpuSortExec` (stock DataFusion planned a sort).
    pub gpu_sort_plans: usize,
    /// Queries whose gpusort plan kept DataFusion's TopK (`gpusort.topk_max_fetch`).
    pub kept_topk: usize,
    /// Queries where stock DataFusion planned no sort (e.g. `LIMIT 0`, constant keys).
    pub no_sort_needed: usize,
    /// Queries that failed on both sessions (e.g. division by zero in a key expression).
    pub both_failed: usize,
    /// `LIMIT` queries where stock DataFusion's TopK was wrong and gpusort agreed with
    /// DataFusion's full sort instead.
    pub stock_topk_wrong: usize,
    /// Queries that ran out of memory on the gpusort session (memory-limited runs only).
    pub exhausted: usize,
    /// Sorts `GpuSortExec` ran on the GPU, from its metrics.
    pub gpu_sorts: usize,
    /// Sorts `GpuSortExec` ran on the CPU backend.
    pub cpu_sorts: usize,
    /// `GpuSortExec`'s `path` metric values seen (e.g. `cpu srts-direct`).
    pub paths: BTreeSet<String>,
    /// A few error messages of queries that failed on both sessions.
    pub failure_samples: Vec<String>,
    /// A few of the `stock_topk_wrong` queries, with the difference.
    pub topk_samples: Vec<String>,
}

impl FuzzReport {
    /// Adds `other` to this report.
    pub fn merge(&mut self, other: FuzzReport) {
        self.cases += other.cases;
        self.queries += other.queries;
        self.table_rows += other.table_rows;
        self.output_rows += other.output_rows;
        self.max_table_rows = self.max_table_rows.max(other.max_table_rows);
        self.with_limit += other.with_limit;
        self.with_offset += other.with_offset;
        self.with_expr += other.with_expr;
        self.keys_selected += other.keys_selected;
        self.column_subset += other.column_subset;
        self.gpu_sort_plans += other.gpu_sort_plans;
        self.kept_topk += other.kept_topk;
        self.no_sort_needed += other.no_sort_needed;
        self.both_failed += other.both_failed;
        self.stock_topk_wrong += other.stock_topk_wrong;
        self.exhausted += other.exhausted;
        self.gpu_sorts += other.gpu_sorts;
        self.cpu_sorts += other.cpu_sorts;
        self.paths.extend(other.paths);
        for s in other.topk_samples {
            if self.topk_samples.len() < 3 {
                self.topk_samples.push(s);
            }
        }
        for s in other.failure_samples {
            if self.failure_samples.len() < 8 && !self.failure_samples.contains(&s) {
                self.failure_samples.push(s);
            }
        }
    }
}

impl fmt::Display for FuzzReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "{} cases, {} queries; {} table rows (largest {}), {} rows compared",
            self.cases, self.queries, self.table_rows, self.max_table_rows, self.output_rows
        )?;
        writeln!(
            f,
            "queries: {} with LIMIT, {} with OFFSET, {} with key expressions, {} selecting their keys, {} on a column subset",
            self.with_limit, self.with_offset, self.with_expr, self.keys_selected, self.column_subset
        )?;
        writeln!(
            f,
            "plans: {} sorted by GpuSortExec, {} kept DataFusion's TopK, {} needed no sort; {} failed on both sessions, {} ran out of memory",
            self.gpu_sort_plans, self.kept_topk, self.no_sort_needed, self.both_failed, self.exhausted
        )?;
        writeln!(
            f,
            "stock DataFusion's LIMIT result wrong (gpusort matched its full sort): {}",
            self.stock_topk_wrong
        )?;
        write!(
            f,
            "GpuSortExec sorts: {} on the GPU, {} on the CPU; paths: {:?}",
            self.gpu_sorts, self.cpu_sorts, self.paths
        )?;
        for s in &self.topk_samples {
            write!(f, "\n  DataFusion's LIMIT result wrong: {s}")?;
        }
        for s in &self.failure_samples {
            write!(f, "\n  failed on both: {s}")?;
        }
        Ok(())
    }
}

// ---------------------------------------------------------------------------------------------
// Tables

/// A table of `MemTable` partitions.
#[derive(Debug, Clone)]
pub struct FuzzTable {
    /// Its schema (columns `c0, c1, ...` in random tables).
    pub schema: SchemaRef,
    /// Its partitions, each a list of batches.
    pub partitions: Vec<Vec<RecordBatch>>,
}

impl FuzzTable {
    /// A table of `columns` split into `partitions` partitions of about equal size, one batch each.
    pub fn from_columns(columns: Vec<(&str, ArrayRef)>, partitions: usize) -> Self {
        let schema = Arc::new(Schema::new(
            columns
                .iter()
                .map(|(name, a)| Field::new(*name, a.data_type().clone(), true))
                .collect::<Vec<_>>(),
        ));
        let rows = columns.first().map_or(0, |(_, a)| a.len());
        let arrays: Vec<ArrayRef> = columns.into_iter().map(|(_, a)| a).collect();
        let per = rows.div_ceil(partitions.max(1));
        let partitions = (0..partitions.max(1))
            .map(|p| {
                let start = (p * per).min(rows);
                let end = ((p + 1) * per).min(rows);
                let cols = arrays.iter().map(|a| a.slice(start, end - start)).collect();
                vec![RecordBatch::try_new(Arc::clone(&schema), cols).unwrap()]
            })
            .collect();
        Self { schema, partitions }
    }

    /// Its rows.
    pub fn rows(&self) -> usize {
        self.partitions.iter().flatten().map(|b| b.num_rows()).sum()
    }

    fn mem_table(&self) -> MemTable {
        MemTable::try_new(Arc::clone(&self.schema), self.partitions.clone()).unwrap()
    }

    /// Schema, null counts and partition layout, for failure messages.
    pub fn describe(&self) -> String {
        let mut s = String::new();
        for (i, f) in self.schema.fields().iter().enumerate() {
            let nulls: usize = self
                .partitions
                .iter()
                .flatten()
                .map(|b| b.column(i).logical_null_count())
                .sum();
            s.push_str(&format!(
                "\n    {} {}{} ({nulls} nulls)",
                f.name(),
                f.data_type(),
                if f.is_nullable() { "" } else { " NOT NULL" }
            ));
        }
        let layout: Vec<Vec<usize>> = self
            .partitions
            .iter()
            .map(|p| p.iter().map(|b| b.num_rows()).collect())
            .collect();
        format!("{} rows, partitions/batches {layout:?}, columns:{s}", self.rows())
    }
}

/// The column types the generator draws from.
const TYPES: &[fn(&mut SmallRng) -> DataType] = &[
    |_| DataType::Int8,
    |_| DataType::Int16,
    |_| DataType::Int32,
    |_| DataType::Int64,
    |_| DataType::UInt8,
    |_| DataType::UInt16,
    |_| DataType::UInt32,
    |_| DataType::UInt64,
    |_| DataType::Float32,
    |_| DataType::Float64,
    |rng| {
        let precision = *[1u8, 5, 9, 10, 18, 19, 28, 38].choose(rng).unwrap();
        let scale = rng.random_range(0..=precision.min(10)) as i8;
        DataType::Decimal128(precision, scale)
    },
    |_| DataType::Date32,
    |rng| {
        let unit = *[
            TimeUnit::Second,
            TimeUnit::Millisecond,
            TimeUnit::Microsecond,
            TimeUnit::Nanosecond,
        ]
        .choose(rng)
        .unwrap();
        let tz = [None, Some("UTC"), Some("+02:00"), Some("-05:30")]
            .choose(rng)
            .unwrap()
            .map(Arc::from);
        DataType::Timestamp(unit, tz)
    },
    |_| DataType::Boolean,
    |_| DataType::Utf8,
    |_| DataType::LargeUtf8,
    |_| DataType::Utf8View,
    |_| DataType::Binary,
    |_| DataType::Dictionary(Box::new(DataType::Int32), Box::new(DataType::Utf8)),
    // Nested columns: sorted through Arrow's row format, moved as payload by `take`.
    |_| DataType::new_list(DataType::Int32, true),
    |_| {
        DataType::Struct(Fields::from(vec![
            Field::new("a", DataType::Int16, true),
            Field::new("b", DataType::Utf8, true),
        ]))
    },
];

/// How the values of one column are drawn.
struct Shape {
    rows: usize,
    null_rate: f64,
    /// Draw from this many distinct values (ties), or fresh values for every row.
    distinct: Option<usize>,
}

impl Shape {
    fn random(rng: &mut SmallRng, rows: usize) -> Self {
        let null_rate = *[0.0, 0.0, 0.01, 0.1, 0.3].choose(rng).unwrap();
        let distinct = match rng.random_range(0..10) {
            0 => Some(1),
            1..=2 => Some(2),
            3..=4 => Some(rng.random_range(3..=20)),
            5 => Some(rng.random_range(20..=500)),
            _ => None,
        };
        Self {
            rows,
            null_rate,
            distinct,
        }
    }

    fn draw<T: Clone>(&self, rng: &mut SmallRng, fresh: impl Fn(&mut SmallRng) -> T) -> Vec<Option<T>> {
        let pool: Option<Vec<T>> = self.distinct.map(|k| (0..k).map(|_| fresh(rng)).collect());
        (0..self.rows)
            .map(|_| {
                if self.null_rate > 0.0 && rng.random_bool(self.null_rate) {
                    None
                } else {
                    Some(match &pool {
                        Some(p) => p[rng.random_range(0..p.len())].clone(),
                        None => fresh(rng),
                    })
                }
            })
            .collect()
    }
}

/// An integer in `min..=max`, often an extreme, zero or a small number.
fn int_in(rng: &mut SmallRng, min: i128, max: i128) -> i128 {
    match rng.random_range(0..16) {
        0 => min,
        1 => max,
        2 => 0.clamp(min, max),
        3 => (min + 1).min(max),
        4 => (max - 1).max(min),
        5..=9 => rng.random_range(min.max(-10)..=max.min(10)),
        _ => rng.random_range(min..=max),
    }
}

fn float_value(rng: &mut SmallRng) -> f64 {
    match rng.random_range(0..24) {
        0 => f64::NAN,
        1 => -0.0,
        2 => 0.0,
        3 => f64::INFINITY,
        4 => f64::NEG_INFINITY,
        5 => f64::MAX,
        6 => f64::MIN,
        7 => f64::MIN_POSITIVE,
        8 => 4.9e-324,
        9 => -f64::NAN,
        10..=15 => rng.random_range(-5..=5) as f64,
        _ => rng.random_range(-1e6..1e6),
    }
}

fn float32_value(rng: &mut SmallRng) -> f32 {
    match rng.random_range(0..24) {
        0 => f32::NAN,
        1 => -0.0,
        5 => f32::MAX,
        6 => f32::MIN,
        8 => 1e-45,
        9 => -f32::NAN,
        _ => float_value(rng) as f32,
    }
}

/// Strings with long shared prefixes, prefixes of each other, empty strings, non-ASCII and
/// NUL characters.
fn string_value(rng: &mut SmallRng, prefixes: &[String]) -> String {
    const ALPHABET: &[char] = &[
        'a', 'b', 'c', 'A', 'Z', '0', ' ', '_', 'é', 'ß', '日', '\u{0}', '\u{7f}', '😀',
    ];
    let short = |rng: &mut SmallRng, n: usize| -> String { (0..n).map(|_| *ALPHABET.choose(rng).unwrap()).collect() };
    let prefix = prefixes.choose(rng).unwrap();
    match rng.random_range(0..12) {
        0 => String::new(),
        1..=3 => {
            let n = rng.random_range(1..=4);
            short(rng, n)
        }
        4..=7 => {
            let n = rng.random_range(0..=3);
            format!("{prefix}{}", short(rng, n))
        }
        8 => {
            // A prefix of a prefix.
            let cut: Vec<char> = prefix.chars().collect();
            cut[..rng.random_range(0..=cut.len())].iter().collect()
        }
        _ => {
            let n = rng.random_range(5..=40);
            short(rng, n)
        }
    }
}

fn string_prefixes(rng: &mut SmallRng) -> Vec<String> {
    let base: String = (0..rng.random_range(4..=60))
        .map(|i| {
            if i % 7 == 6 {
                'é'
            } else {
                (b'a' + (i % 26) as u8) as char
            }
        })
        .collect();
    let mut out = vec![base.clone()];
    for _ in 0..rng.random_range(0..=2) {
        out.push(format!("{base}{}", "xy".repeat(rng.random_range(1..=20))));
    }
    out
}

fn binary_value(rng: &mut SmallRng, prefixes: &[Vec<u8>]) -> Vec<u8> {
    let prefix = prefixes.choose(rng).unwrap();
    let tail = |rng: &mut SmallRng| -> Vec<u8> {
        (0..rng.random_range(0..=4))
            .map(|_| *[0u8, 1, 0x7f, 0x80, 0xfe, 0xff, b'a'].choose(rng).unwrap())
            .collect()
    };
    match rng.random_range(0..8) {
        0 => vec![],
        1..=2 => tail(rng),
        3..=5 => [prefix.as_slice(), &tail(rng)].concat(),
        6 => prefix[..rng.random_range(0..=prefix.len())].to_vec(),
        _ => (0..rng.random_range(1..=30)).map(|_| rng.random()).collect(),
    }
}

/// A random column of `data_type`.
fn random_column(rng: &mut SmallRng, data_type: &DataType, shape: &Shape) -> ArrayRef {
    macro_rules! ints {
        ($array:ty, $t:ty) => {{
            let v = shape.draw(rng, |r| int_in(r, <$t>::MIN as i128, <$t>::MAX as i128) as $t);
            Arc::new(<$array>::from(v)) as ArrayRef
        }};
    }
    match data_type {
        DataType::Int8 => ints!(Int8Array, i8),
        DataType::Int16 => ints!(Int16Array, i16),
        DataType::Int32 => ints!(Int32Array, i32),
        DataType::Int64 => ints!(Int64Array, i64),
        DataType::UInt8 => ints!(UInt8Array, u8),
        DataType::UInt16 => ints!(UInt16Array, u16),
        DataType::UInt32 => ints!(UInt32Array, u32),
        DataType::UInt64 => ints!(UInt64Array, u64),
        DataType::Float32 => Arc::new(Float32Array::from(shape.draw(rng, float32_value))),
        DataType::Float64 => Arc::new(Float64Array::from(shape.draw(rng, float_value))),
        DataType::Decimal128(p, s) => {
            let max = 10i128.pow(*p as u32) - 1;
            let v = shape.draw(rng, |r| int_in(r, -max, max));
            Arc::new(Decimal128Array::from(v).with_precision_and_scale(*p, *s).unwrap())
        }
        DataType::Date32 => {
            // 0001-01-01 to 9999-12-31.
            let v = shape.draw(rng, |r| int_in(r, -719_162, 2_932_896) as i32);
            Arc::new(Date32Array::from(v))
        }
        DataType::Timestamp(unit, tz) => {
            let per_second: i128 = match unit {
                TimeUnit::Second => 1,
                TimeUnit::Millisecond => 1_000,
                TimeUnit::Microsecond => 1_000_000,
                TimeUnit::Nanosecond => 1_000_000_000,
            };
            // Mostly within +-100 years of 1970, sometimes i64's extremes.
            let wide = rng.random_bool(0.1);
            let v = shape.draw(rng, |r| {
                const CENTURY_SECONDS: i128 = 3_155_760_000;
                if wide {
                    int_in(r, i64::MIN as i128, i64::MAX as i128) as i64
                } else if r.random_bool(0.5) {
                    (int_in(r, -CENTURY_SECONDS, CENTURY_SECONDS) * per_second) as i64
                } else {
                    int_in(r, -CENTURY_SECONDS * per_second, CENTURY_SECONDS * per_second) as i64
                }
            });
            let tz = tz.clone();
            match unit {
                TimeUnit::Second => Arc::new(TimestampSecondArray::from(v).with_timezone_opt(tz)),
                TimeUnit::Millisecond => Arc::new(TimestampMillisecondArray::from(v).with_timezone_opt(tz)),
                TimeUnit::Microsecond => Arc::new(TimestampMicrosecondArray::from(v).with_timezone_opt(tz)),
                TimeUnit::Nanosecond => Arc::new(TimestampNanosecondArray::from(v).with_timezone_opt(tz)),
            }
        }
        DataType::Boolean => {
            let p = *[0.5, 0.05, 0.95].choose(rng).unwrap();
            Arc::new(BooleanArray::from(shape.draw(rng, |r| r.random_bool(p))))
        }
        DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View => {
            let prefixes = string_prefixes(rng);
            let v = shape.draw(rng, |r| string_value(r, &prefixes));
            match data_type {
                DataType::Utf8 => Arc::new(StringArray::from(v)),
                DataType::LargeUtf8 => Arc::new(LargeStringArray::from(v)),
                _ => Arc::new(StringViewArray::from_iter(v)),
            }
        }
        DataType::Binary => {
            let prefixes: Vec<Vec<u8>> = string_prefixes(rng).into_iter().map(String::into_bytes).collect();
            let v = shape.draw(rng, |r| binary_value(r, &prefixes));
            Arc::new(BinaryArray::from_iter(v))
        }
        DataType::Dictionary(_, _) => {
            // Unused values, repeated values and sometimes a null among the dictionary values.
            let prefixes = string_prefixes(rng);
            let n = rng.random_range(1..=24);
            let mut values: Vec<Option<String>> = (0..n).map(|_| Some(string_value(rng, &prefixes))).collect();
            if rng.random_bool(0.3) {
                let dup = values[rng.random_range(0..n)].clone();
                values.push(dup);
            }
            if rng.random_bool(0.15) {
                values.push(None);
            }
            let used = match shape.distinct {
                Some(k) => k.min(values.len()),
                None => values.len(),
            };
            let keys = Int32Array::from(
                (0..shape.rows)
                    .map(|_| {
                        (shape.null_rate == 0.0 || !rng.random_bool(shape.null_rate))
                            .then(|| rng.random_range(0..used) as i32)
                    })
                    .collect::<Vec<_>>(),
            );
            Arc::new(DictionaryArray::<Int32Type>::try_new(keys, Arc::new(StringArray::from(values))).unwrap())
        }
        DataType::List(_) => {
            // Up to 3 small elements, some null: ties and prefixes at every length.
            let v = shape.draw(rng, |r| {
                (0..r.random_range(0..=3))
                    .map(|_| (!r.random_bool(0.1)).then(|| int_in(r, -3, 3) as i32))
                    .collect::<Vec<_>>()
            });
            Arc::new(ListArray::from_iter_primitive::<Int32Type, _, _>(v))
        }
        DataType::Struct(fields) => {
            let prefixes = string_prefixes(rng);
            let v = shape.draw(rng, |r| {
                (
                    (!r.random_bool(0.1)).then(|| int_in(r, -2, 2) as i16),
                    (!r.random_bool(0.1)).then(|| string_value(r, &prefixes)),
                )
            });
            let a = Int16Array::from(v.iter().map(|x| x.as_ref().and_then(|(a, _)| *a)).collect::<Vec<_>>());
            let b = StringArray::from(
                v.iter()
                    .map(|x| x.as_ref().and_then(|(_, b)| b.clone()))
                    .collect::<Vec<_>>(),
            );
            let nulls = NullBuffer::from(v.iter().map(Option::is_some).collect::<Vec<_>>());
            Arc::new(StructArray::try_new(fields.clone(), vec![Arc::new(a), Arc::new(b)], Some(nulls)).unwrap())
        }
        other => panic!("no generator for {other}"),
    }
}

/// A random table: `c0, c1, ...` of random types, split into random partitions and batches.
pub fn random_table(rng: &mut SmallRng) -> FuzzTable {
    let rows = match rng.random_range(0..100) {
        0..=3 => 0,
        4..=7 => 1,
        8..=11 => 2,
        12..=13 => rng.random_range(150_000..=220_000),
        14..=40 => rng.random_range(3..=200),
        _ => rng.random_range(200..=20_000),
    };
    let ncols = rng.random_range(2..=8);
    let mut fields = Vec::with_capacity(ncols);
    let mut columns: Vec<ArrayRef> = Vec::with_capacity(ncols);
    for i in 0..ncols {
        let data_type = TYPES.choose(rng).unwrap()(rng);
        let shape = Shape::random(rng, rows);
        let column = random_column(rng, &data_type, &shape);
        let nullable = column.logical_null_count() > 0 || rng.random_bool(0.7);
        fields.push(Field::new(format!("c{i}"), data_type, nullable));
        columns.push(column);
    }
    // Sometimes the input arrives sorted (or reverse sorted) by one column.
    if rows > 1 && rng.random_bool(0.15) {
        let c = rng.random_range(0..ncols);
        let options = SortOptions {
            descending: rng.random_bool(0.5),
            nulls_first: rng.random_bool(0.5),
        };
        let order = lexsort_to_indices(
            &[SortColumn {
                values: Arc::clone(&columns[c]),
                options: Some(options),
            }],
            None,
        )
        .unwrap();
        columns = columns
            .iter()
            .map(|a| take(a.as_ref(), &order, None).unwrap())
            .collect();
    }
    let schema = Arc::new(Schema::new(fields));
    let npartitions = rng.random_range(1..=8);
    let nbatches: Vec<usize> = (0..npartitions).map(|_| rng.random_range(1..=3)).collect();
    let total: usize = nbatches.iter().sum();
    let mut cuts: Vec<usize> = (0..total - 1).map(|_| rng.random_range(0..=rows)).collect();
    cuts.push(0);
    cuts.push(rows);
    cuts.sort_unstable();
    let mut bounds = cuts.windows(2).map(|w| (w[0], w[1]));
    let partitions = nbatches
        .iter()
        .map(|&n| {
            (0..n)
                .map(|_| {
                    let (start, end) = bounds.next().unwrap();
                    let cols = columns
                        .iter()
                        .map(|a| {
                            let slice = a.slice(start, end - start);
                            match rng.random_range(0..4) {
                                // A copy with offset 0 (a dictionary gets its own values).
                                0 if matches!(a.data_type(), DataType::Dictionary(_, _)) => {
                                    let plain = arrow::compute::cast(&slice, &DataType::Utf8).unwrap();
                                    arrow::compute::cast(&plain, a.data_type()).unwrap()
                                }
                                0 => arrow::compute::concat(&[slice.as_ref()]).unwrap(),
                                // A slice of the whole column.
                                _ => slice,
                            }
                        })
                        .collect();
                    RecordBatch::try_new(Arc::clone(&schema), cols).unwrap()
                })
                .collect()
        })
        .collect();
    FuzzTable { schema, partitions }
}

// ---------------------------------------------------------------------------------------------
// Queries

/// A query and what the checker needs to know about it.
#[derive(Debug, Clone)]
pub struct FuzzQuery {
    /// The SQL (over table `t`).
    pub sql: String,
    /// The SQL without its `LIMIT` and `OFFSET`.
    pub base_sql: String,
    /// The sort keys as SQL expressions over the *output* columns, with their directions.
    pub keys: Vec<(String, SortOptions)>,
    /// `LIMIT n`.
    pub limit: Option<usize>,
    /// `OFFSET n` (0: none).
    pub offset: usize,
    /// Whether a sort key is an expression rather than a column.
    pub uses_expr: bool,
    /// Whether the keys are selected as `k0, k1, ...`.
    pub keys_selected: bool,
    /// Whether only some of the table's columns are selected.
    pub column_subset: bool,
}

impl FuzzQuery {
    /// `base_sql` with `LIMIT limit OFFSET offset`, whose keys are plain output columns, each
    /// `(column, descending, nulls_first)`.
    pub fn new(base_sql: impl Into<String>, keys: &[(&str, bool, bool)], limit: Option<usize>, offset: usize) -> Self {
        let base_sql = base_sql.into();
        Self {
            sql: with_limit(&base_sql, limit, offset),
            base_sql,
            keys: keys
                .iter()
                .map(|(c, descending, nulls_first)| {
                    (
                        c.to_string(),
                        SortOptions {
                            descending: *descending,
                            nulls_first: *nulls_first,
                        },
                    )
                })
                .collect(),
            limit,
            offset,
            uses_expr: false,
            keys_selected: false,
            column_subset: false,
        }
    }
}

fn with_limit(sql: &str, limit: Option<usize>, offset: usize) -> String {
    let mut sql = sql.to_string();
    if let Some(n) = limit {
        sql.push_str(&format!(" LIMIT {n}"));
    }
    if offset > 0 {
        sql.push_str(&format!(" OFFSET {offset}"));
    }
    sql
}

/// Expressions over one column of `data_type` (`{}` stands for the column).
fn expressions(data_type: &DataType) -> &'static [&'static str] {
    use DataType::*;
    match data_type {
        Int8 | Int16 | Int32 | Int64 => &["{} + 1", "{} % 3", "-{}", "abs({})", "10 / {}", "{} IS NULL"],
        UInt8 | UInt16 | UInt32 | UInt64 => &["{} + 1", "{} % 3", "{} * 2", "{} IS NULL"],
        Float32 | Float64 => &["-{}", "abs({})", "{} * 2", "floor({})", "{} + 1", "{} IS NULL"],
        Decimal128(_, _) => &["-{}", "{} + 1", "{} IS NULL"],
        Utf8 | LargeUtf8 | Utf8View | Dictionary(_, _) => &[
            "lower({})",
            "upper({})",
            "length({})",
            "{} || 'x'",
            "substr({}, 2, 3)",
            "{} IS NULL",
        ],
        Binary => &["{} IS NULL"],
        Boolean => &["NOT {}", "{} IS NULL"],
        // (Not date_trunc: DataFusion 55.2 overflows on timestamps near i64's extremes, a
        // panic in debug builds.)
        Date32 => &["CAST({} AS INT) % 7", "{} IS NULL"],
        Timestamp(_, _) => &["CAST({} AS BIGINT) / 1000000", "CAST({} AS BIGINT) % 7", "{} IS NULL"],
        _ => &["{} IS NULL"],
    }
}

fn is_integer(t: &DataType) -> bool {
    t.is_integer()
}

/// A random `ORDER BY` query over `schema` (the table is `t`; `rows` sizes `LIMIT` and `OFFSET`).
pub fn random_query(rng: &mut SmallRng, schema: &Schema, rows: usize) -> FuzzQuery {
    let fields = schema.fields();
    let nkeys = rng.random_range(1..=4);
    let keys_selected = rng.random_bool(0.5);
    let mut uses_expr = false;
    // (SQL over the table, the columns it reads, direction, explicit NULLS clause)
    let mut keys: Vec<(String, Vec<usize>, SortOptions, bool)> = vec![];
    for _ in 0..nkeys {
        let c = rng.random_range(0..fields.len());
        let name = fields[c].name();
        let (expr, reads) = match rng.random_range(0..100) {
            0..=69 => (name.clone(), vec![c]),
            70..=94 => {
                let template = expressions(fields[c].data_type()).choose(rng).unwrap();
                (template.replace("{}", name), vec![c])
            }
            _ => {
                let d = rng.random_range(0..fields.len());
                let (a, b) = (fields[c].data_type(), fields[d].data_type());
                if is_integer(a) && is_integer(b) {
                    (format!("{name} + {}", fields[d].name()), vec![c, d])
                } else if a == b {
                    (format!("coalesce({name}, {})", fields[d].name()), vec![c, d])
                } else {
                    (
                        format!("{name} IS NULL AND {} IS NOT NULL", fields[d].name()),
                        vec![c, d],
                    )
                }
            }
        };
        uses_expr |= expr != *name;
        let descending = rng.random_bool(0.5);
        let explicit = rng.random_bool(0.7);
        // Without NULLS FIRST/LAST DataFusion sorts nulls as the largest values.
        let nulls_first = if explicit { rng.random_bool(0.5) } else { descending };
        keys.push((
            expr,
            reads,
            SortOptions {
                descending,
                nulls_first,
            },
            explicit,
        ));
    }
    let direction = |o: &SortOptions, explicit: bool| {
        let d = if o.descending { "DESC" } else { "ASC" };
        match (explicit, o.nulls_first) {
            (false, _) => d.to_string(),
            (true, true) => format!("{d} NULLS FIRST"),
            (true, false) => format!("{d} NULLS LAST"),
        }
    };

    // The selected table columns: all (`*` or listed, shuffled) or a subset.
    let mut selected: Vec<usize> = (0..fields.len()).collect();
    let column_subset = rng.random_bool(0.35);
    if column_subset {
        selected.shuffle(rng);
        selected.truncate(rng.random_range(if keys_selected { 0 } else { 1 }..fields.len()));
    }
    if !keys_selected {
        // The keys are evaluated on the output, so it needs the columns they read.
        for (_, reads, _, _) in &keys {
            for c in reads {
                if !selected.contains(c) {
                    selected.push(*c);
                }
            }
        }
    }
    let star = !column_subset && rng.random_bool(0.5);
    if !star {
        selected.shuffle(rng);
    }
    let mut select: Vec<String> = if star {
        vec!["*".into()]
    } else {
        selected.iter().map(|&c| fields[c].name().clone()).collect()
    };
    let (order_by, check_keys): (Vec<String>, Vec<(String, SortOptions)>) = if keys_selected {
        for (i, (expr, ..)) in keys.iter().enumerate() {
            select.push(format!("{expr} AS k{i}"));
        }
        keys.iter()
            .enumerate()
            .map(|(i, (_, _, o, explicit))| (format!("k{i} {}", direction(o, *explicit)), (format!("k{i}"), *o)))
            .unzip()
    } else {
        keys.iter()
            .map(|(expr, _, o, explicit)| (format!("{expr} {}", direction(o, *explicit)), (expr.clone(), *o)))
            .unzip()
    };

    let pick_count = |rng: &mut SmallRng| match rng.random_range(0..6) {
        0 => 0,
        1 => 1,
        2 => rng.random_range(2..=10),
        3 => rows + rng.random_range(0..=3),
        _ => rng.random_range(0..=rows.max(1)),
    };
    let limit = rng.random_bool(0.4).then(|| pick_count(rng));
    let offset = if rng.random_bool(if limit.is_some() { 0.3 } else { 0.1 }) {
        pick_count(rng)
    } else {
        0
    };
    let base_sql = format!("SELECT {} FROM t ORDER BY {}", select.join(", "), order_by.join(", "));
    FuzzQuery {
        sql: with_limit(&base_sql, limit, offset),
        base_sql,
        keys: check_keys,
        limit,
        offset,
        uses_expr,
        keys_selected,
        column_subset: column_subset || (!star && selected.len() < fields.len()),
    }
}

// ---------------------------------------------------------------------------------------------
// Sessions

/// Session settings shared by both sessions of a case, and gpusort options drawn at random
/// (the test's `configure` runs after them and has the last word).
#[derive(Debug, Clone)]
pub struct FuzzSetup {
    /// `datafusion.execution.target_partitions`.
    pub target_partitions: usize,
    /// `datafusion.execution.batch_size`.
    pub batch_size: usize,
    /// `gpusort.merge_partitions`.
    pub merge_partitions: bool,
    /// `gpusort.strategy`.
    pub strategy: &'static str,
    /// `gpusort.topk_max_fetch`.
    pub topk_max_fetch: usize,
}

impl FuzzSetup {
    /// Random settings for a table of `rows` rows. (Batches stay above `rows / 256` rows: stock
    /// DataFusion, unoptimized, takes minutes to merge the thousands of sorted runs of a large
    /// table in tiny batches.)
    pub fn random(rng: &mut SmallRng, rows: usize) -> Self {
        let min = (rows / 256).clamp(7, 2048);
        let batch_size = match rng.random_range(0..4) {
            0 => rng.random_range(min..=min.max(64)),
            1 => rng.random_range(min.max(65)..=1024.max(min)),
            2 => 8192,
            _ => rng.random_range(1025.max(min)..=8192),
        };
        Self {
            target_partitions: rng.random_range(1..=8),
            batch_size,
            merge_partitions: rng.random_bool(0.7),
            topk_max_fetch: if rng.random_bool(0.75) {
                0
            } else {
                GpuSortConfig::default().topk_max_fetch
            },
            strategy: [
                "auto",
                "auto",
                "grs-direct",
                "grs-indirect",
                "srts-direct",
                "srts-indirect",
                "msd-direct",
                "msd-indirect",
                "samplesort-direct",
                "samplesort-indirect",
                "cpu",
            ]
            .choose(rng)
            .unwrap(),
        }
    }

    /// Fixed settings.
    pub fn new(target_partitions: usize, batch_size: usize) -> Self {
        Self {
            target_partitions,
            batch_size,
            merge_partitions: true,
            strategy: "auto",
            topk_max_fetch: 0,
        }
    }
}

/// The configuration function the test passes in, applied to the gpusort session's config.
pub type Configure<'a> = &'a dyn Fn(SessionConfig) -> SessionConfig;

/// A stock session and a gpusort session, both with table `t`. `runtime` (a memory pool)
/// applies to the gpusort session.
pub fn sessions(
    table: &FuzzTable,
    setup: &FuzzSetup,
    configure: Configure<'_>,
    runtime: Option<Arc<RuntimeEnv>>,
) -> (SessionContext, SessionContext) {
    let base = SessionConfig::new()
        .with_target_partitions(setup.target_partitions)
        .with_batch_size(setup.batch_size);
    let stock = SessionStateBuilder::new()
        .with_config(base.clone())
        .with_default_features()
        .build();
    let mut config = base;
    config.options_mut().extensions.insert(GpuSortConfig::default());
    let config = configure(
        config
            .set_bool("gpusort.merge_partitions", setup.merge_partitions)
            .set_str("gpusort.strategy", setup.strategy)
            .set_usize("gpusort.topk_max_fetch", setup.topk_max_fetch),
    );
    let mut builder = SessionStateBuilder::new()
        .with_config(config)
        .with_runtime_env(runtime.unwrap_or_else(|| Arc::new(RuntimeEnv::default())))
        .with_default_features();
    builder = datafusion_gpusort::register(builder);
    let ours = builder.build();
    let (stock, ours) = (
        SessionContext::new_with_state(stock),
        SessionContext::new_with_state(ours),
    );
    stock.register_table("t", Arc::new(table.mem_table())).unwrap();
    ours.register_table("t", Arc::new(table.mem_table())).unwrap();
    (stock, ours)
}

/// A runtime whose memory pool is `pool`.
pub fn runtime_with_pool(pool: Arc<dyn MemoryPool>) -> Arc<RuntimeEnv> {
    RuntimeEnvBuilder::new().with_memory_pool(pool).build_arc().unwrap()
}

// ---------------------------------------------------------------------------------------------
// Checking

/// How one query went, when it did not fail the check.
#[derive(Debug)]
pub enum Outcome {
    /// Both sessions returned the same rows (modulo tie order).
    Compared {
        /// Rows returned.
        rows: usize,
        /// Where DataFusion's `LIMIT` result was wrong (gpusort's agreed with DataFusion's
        /// full sort), the difference.
        stock_topk_wrong: Option<String>,
        /// Whether the gpusort plan sorted with `GpuSortExec`.
        gpu_sort_plan: bool,
        /// Whether the gpusort plan kept DataFusion's TopK (`gpusort.topk_max_fetch`).
        kept_topk: bool,
        /// Whether stock DataFusion planned no sort at all.
        no_sort_needed: bool,
        /// `GpuSortExec` sorts on the GPU / CPU, from its metrics.
        gpu_sorts: usize,
        /// See `gpu_sorts`.
        cpu_sorts: usize,
        /// `GpuSortExec`'s `path` metric values.
        paths: Vec<String>,
    },
    /// Both sessions failed.
    BothFailed(String),
    /// The gpusort session ran out of memory (allowed only when asked for).
    Exhausted(String),
}

/// The nodes of type `T` in `plan`.
fn count_nodes<T: ExecutionPlan + 'static>(plan: &Arc<dyn ExecutionPlan>) -> usize {
    count_matching::<T>(plan, &|_| true)
}

/// The nodes of type `T` in `plan` for which `f` holds.
fn count_matching<T: ExecutionPlan + 'static>(plan: &Arc<dyn ExecutionPlan>, f: &dyn Fn(&T) -> bool) -> usize {
    plan.downcast_ref::<T>().is_some_and(f) as usize
        + plan
            .children()
            .into_iter()
            .map(|c| count_matching::<T>(c, f))
            .sum::<usize>()
}

fn gpusort_metrics(plan: &Arc<dyn ExecutionPlan>, gpu: &mut usize, cpu: &mut usize, paths: &mut Vec<String>) {
    if plan.downcast_ref::<GpuSortExec>().is_some()
        && let Some(m) = plan.metrics()
    {
        *gpu += m.sum_by_name("gpu_sorts").map_or(0, |v| v.as_usize());
        *cpu += m.sum_by_name("cpu_sorts").map_or(0, |v| v.as_usize());
        for metric in m.iter() {
            if metric.value().name() == "path" {
                let text = metric.value().to_string();
                for p in text.split("; ") {
                    if p != "none" && !paths.iter().any(|q| q == p) {
                        paths.push(p.to_string());
                    }
                }
            }
        }
    }
    for c in plan.children() {
        gpusort_metrics(c, gpu, cpu, paths);
    }
}

/// The plan of `sql` and its output.
async fn run(ctx: &SessionContext, sql: &str) -> Result<(Arc<dyn ExecutionPlan>, Vec<RecordBatch>), DataFusionError> {
    let plan = ctx.sql(sql).await?.create_physical_plan().await?;
    let batches = collect(Arc::clone(&plan), ctx.task_ctx()).await?;
    Ok((plan, batches))
}

/// The values of the key expressions on `batch` (the whole output).
fn key_columns(
    ctx: &SessionContext,
    batch: &RecordBatch,
    keys: &[(String, SortOptions)],
) -> Result<Vec<ArrayRef>, String> {
    let schema = Arc::new(DFSchema::try_from(batch.schema().as_ref().clone()).map_err(|e| e.to_string())?);
    // As the planner does: coerce types, then simplify (some functions, e.g. `coalesce`, only
    // run once rewritten).
    let simplifier = ExprSimplifier::new(
        SimplifyContext::builder()
            .with_schema(Arc::clone(&schema))
            .with_config_options(Arc::new(ctx.state().config_options().as_ref().clone()))
            .build(),
    );
    keys.iter()
        .map(|(sql, _)| {
            let value = ctx
                .parse_sql_expr(sql, &schema)
                .and_then(|e| simplifier.coerce(e, &schema))
                .and_then(|e| simplifier.simplify(e))
                .and_then(|e| ctx.create_physical_expr(e, &schema))
                .and_then(|e| e.evaluate(batch))
                .and_then(|v| v.into_array(batch.num_rows()));
            value.map_err(|e| format!("harness: key {sql}: {e}"))
        })
        .collect()
}

fn row_converter(columns: &[ArrayRef]) -> RowConverter {
    RowConverter::new(columns.iter().map(|c| SortField::new(c.data_type().clone())).collect()).unwrap()
}

/// Row `i` of `columns`, rendered.
fn render_row(columns: &[ArrayRef], i: usize) -> String {
    let options = FormatOptions::default().with_null("NULL");
    let cells: Vec<String> = columns
        .iter()
        .map(|c| match ArrayFormatter::try_new(c.as_ref(), &options) {
            Ok(f) => f.value(i).try_to_string().unwrap_or_else(|e| format!("<{e}>")),
            Err(e) => format!("<{e}>"),
        })
        .collect();
    format!("({})", cells.join(", "))
}

fn render_rows(columns: &[ArrayRef], range: std::ops::Range<usize>) -> String {
    range
        .map(|i| format!("\n      {i}: {}", render_row(columns, i)))
        .collect::<String>()
}

/// The first adjacent pair out of order by `keys`, if any.
fn out_of_order(keys: &[ArrayRef], options: &[SortOptions]) -> Option<usize> {
    let columns: Vec<SortColumn> = keys
        .iter()
        .zip(options)
        .map(|(k, o)| SortColumn {
            values: Arc::clone(k),
            options: Some(*o),
        })
        .collect();
    let cmp = LexicographicalComparator::try_new(&columns).unwrap();
    let n = keys.first().map_or(0, |k| k.len());
    (1..n).find(|&i| cmp.compare(i - 1, i).is_gt())
}

fn is_exhausted(e: &str) -> bool {
    e.contains("Resources exhausted")
}

/// Compares gpusort's output `actual` with DataFusion's `expected` (see the module docs).
fn compare(
    stock: &SessionContext,
    query: &FuzzQuery,
    expected: &RecordBatch,
    actual: &RecordBatch,
) -> Result<(), String> {
    let n = actual.num_rows();
    if n != expected.num_rows() {
        return Err(format!("gpusort returned {n} rows, DataFusion {}", expected.num_rows()));
    }

    // (a) The key sequences are equal row by row.
    let expected_keys = key_columns(stock, expected, &query.keys)?;
    let actual_keys = key_columns(stock, actual, &query.keys)?;
    let options: Vec<SortOptions> = query.keys.iter().map(|(_, o)| *o).collect();
    if let Some(i) = out_of_order(&expected_keys, &options) {
        return Err(format!(
            "harness: stock DataFusion's output is not ordered by the keys at row {i}:{}",
            render_rows(&expected_keys, i - 1..i + 1)
        ));
    }
    let key_rows = row_converter(&actual_keys);
    let expected_key_rows = key_rows.convert_columns(&expected_keys).unwrap();
    let actual_key_rows = key_rows.convert_columns(&actual_keys).unwrap();
    if let Some(i) = (0..n).find(|&i| expected_key_rows.row(i) != actual_key_rows.row(i)) {
        let around = i.saturating_sub(2)..(i + 3).min(n);
        return Err(format!(
            "sort keys differ at output row {i} of {n}\n    gpusort:{}\n    DataFusion:{}",
            render_rows(&actual_keys, around.clone()),
            render_rows(&expected_keys, around)
        ));
    }
    // (c) Our output is ordered (implied by (a), checked on its own for clearer messages).
    if let Some(i) = out_of_order(&actual_keys, &options) {
        return Err(format!(
            "gpusort's output is not ordered by the keys at row {i}:{}",
            render_rows(&actual_keys, i - 1..i + 1)
        ));
    }

    // (b) The rows are equal as multisets, except those tied with the boundary keys of a
    // LIMIT / OFFSET window (which rows of a tie fall inside is up to each sort).
    let mut lo = 0;
    let mut hi = n;
    if n > 0 {
        if query.offset > 0 {
            while lo < n && actual_key_rows.row(lo) == actual_key_rows.row(0) {
                lo += 1;
            }
        }
        if query.limit.is_some_and(|l| n >= l) {
            while hi > lo && actual_key_rows.row(hi - 1) == actual_key_rows.row(n - 1) {
                hi -= 1;
            }
        }
    }
    let all = row_converter(actual.columns());
    let window = |rows: &Rows| -> Vec<(Vec<u8>, usize)> {
        let mut v: Vec<(Vec<u8>, usize)> = (lo..hi).map(|i| (rows.row(i).as_ref().to_vec(), i)).collect();
        v.sort_unstable();
        v
    };
    let expected_rows = window(&all.convert_columns(expected.columns()).unwrap());
    let actual_rows = window(&all.convert_columns(actual.columns()).unwrap());
    if let Some(j) = (0..expected_rows.len()).find(|&j| expected_rows[j].0 != actual_rows[j].0) {
        let (a, e) = (actual_rows[j].1, expected_rows[j].1);
        return Err(format!(
            "the rows differ (as multisets, rows {lo}..{hi} of {n}): gpusort has row {a} {}, DataFusion row {e} {}",
            render_row(actual.columns(), a),
            render_row(expected.columns(), e)
        ));
    }

    Ok(())
}

/// Runs `query` on both sessions and compares the results (see the module docs). `Err` is a
/// failed check, with the details.
pub async fn check_query(
    stock: &SessionContext,
    ours: &SessionContext,
    query: &FuzzQuery,
    allow_exhausted: bool,
) -> Result<Outcome, String> {
    let verbose = verbose();
    let start = Instant::now();
    let expected = run(stock, &query.sql).await;
    let stock_time = start.elapsed();
    let actual = run(ours, &query.sql).await;
    if verbose {
        println!(
            "  {}: DataFusion {stock_time:.2?}, gpusort {:.2?}",
            query.sql,
            start.elapsed() - stock_time
        );
    }
    let ((stock_plan, expected), (plan, actual)) = match (expected, actual) {
        (Ok(e), Ok(a)) => (e, a),
        (Err(e), Err(a)) => {
            if allow_exhausted && is_exhausted(&a.to_string()) && !is_exhausted(&e.to_string()) {
                return Ok(Outcome::Exhausted(a.to_string()));
            }
            return Ok(Outcome::BothFailed(e.to_string()));
        }
        (Ok(_), Err(a)) if allow_exhausted && is_exhausted(&a.to_string()) => {
            return Ok(Outcome::Exhausted(a.to_string()));
        }
        (Ok(_), Err(a)) => return Err(format!("gpusort failed where DataFusion succeeded: {a}")),
        (Err(e), Ok(_)) => return Err(format!("gpusort succeeded where DataFusion failed: {e}")),
    };

    // The plan really uses gpusort, but for the small TopKs the rule leaves to DataFusion.
    let topk_max_fetch = GpuSortConfig::from_config(ours.state().config().options()).topk_max_fetch;
    let stock_sorts = count_nodes::<SortExec>(&stock_plan);
    let gpu_sort_nodes = count_nodes::<GpuSortExec>(&plan);
    let kept_topks = count_matching::<SortExec>(&plan, &|s| s.fetch().is_some_and(|f| f <= topk_max_fetch));
    let left_sorts = count_nodes::<SortExec>(&plan) - kept_topks;
    let show = |p: &Arc<dyn ExecutionPlan>| {
        datafusion::physical_plan::displayable(p.as_ref())
            .indent(false)
            .to_string()
    };
    if stock_sorts > 0 && ((gpu_sort_nodes == 0 && kept_topks == 0) || left_sorts > 0) {
        return Err(format!(
            "stock DataFusion sorts ({stock_sorts} SortExec) but the gpusort plan has {gpu_sort_nodes} GpuSortExec and {left_sorts} SortExec (besides {kept_topks} TopK within gpusort.topk_max_fetch = {topk_max_fetch}):\n{}",
            show(&plan)
        ));
    }
    let batch_size = ours.state().config().batch_size();
    if let Some(b) = actual.iter().find(|b| b.num_rows() > batch_size) {
        return Err(format!(
            "an output batch of {} rows exceeds batch_size {batch_size}",
            b.num_rows()
        ));
    }

    let schema = stock_plan.schema();
    let ours_schema = plan.schema();
    let types = |s: &Schema| -> Vec<(String, DataType)> {
        s.fields()
            .iter()
            .map(|f| (f.name().clone(), f.data_type().clone()))
            .collect()
    };
    if types(&schema) != types(&ours_schema) {
        return Err(format!(
            "output schemas differ: stock {schema:?}, gpusort {ours_schema:?}"
        ));
    }
    let expected = concat_batches(&schema, &expected).map_err(|e| e.to_string())?;
    let actual = concat_batches(&schema, &actual).map_err(|e| e.to_string())?;
    let n = actual.num_rows();
    let mut stock_topk_wrong = None;
    if let Err(problem) = compare(stock, query, &expected, &actual) {
        if query.limit.is_none() && query.offset == 0 {
            return Err(problem);
        }
        // DataFusion's TopK is not always right (it takes -0.0 for +0.0, see the module
        // docs): the reference is then its full sort, cut to the LIMIT / OFFSET window.
        let (_, full) = run(stock, &query.base_sql)
            .await
            .map_err(|e| format!("{problem}\n  and DataFusion's full sort failed: {e}"))?;
        let full = concat_batches(&schema, &full).map_err(|e| e.to_string())?;
        let start = query.offset.min(full.num_rows());
        let len = query.limit.unwrap_or(usize::MAX).min(full.num_rows() - start);
        compare(stock, query, &full.slice(start, len), &actual).map_err(|e| {
            format!(
                "{problem}\n  and against DataFusion's full sort ({}): {e}",
                query.base_sql
            )
        })?;
        let types: Vec<String> = types(&schema).iter().map(|(n, t)| format!("{n}: {t}")).collect();
        stock_topk_wrong = Some(format!("{problem} (output columns {})", types.join(", ")));
    }

    let (mut gpu_sorts, mut cpu_sorts, mut paths) = (0, 0, vec![]);
    gpusort_metrics(&plan, &mut gpu_sorts, &mut cpu_sorts, &mut paths);
    Ok(Outcome::Compared {
        rows: n,
        stock_topk_wrong,
        gpu_sort_plan: gpu_sort_nodes > 0,
        kept_topk: kept_topks > 0,
        no_sort_needed: stock_sorts == 0,
        gpu_sorts,
        cpu_sorts,
        paths,
    })
}

/// Waits (a few seconds at most) for `pool` to hold nothing; cancelled tasks release their
/// memory when the runtime gets to drop them.
pub async fn wait_for_empty_pool(pool: &Arc<dyn MemoryPool>) -> Result<(), String> {
    let start = Instant::now();
    while pool.reserved() != 0 {
        if start.elapsed() > Duration::from_secs(10) {
            return Err(format!("{} bytes still reserved in the memory pool", pool.reserved()));
        }
        tokio::task::yield_now().await;
        std::thread::sleep(Duration::from_millis(1));
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Runs

/// Whether `SQL_FUZZ_VERBOSE` asks for every case, query and timing to be printed.
fn verbose() -> bool {
    std::env::var_os("SQL_FUZZ_VERBOSE").is_some_and(|v| !v.is_empty() && v != "0")
}

/// The seed of case `i` of a run with seed `seed` (SplitMix64).
pub fn case_seed(seed: u64, i: usize) -> u64 {
    let mut z = seed.wrapping_add((i as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15));
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Where a check failed, with everything needed to reproduce it.
fn failure(
    what: &str,
    table: &FuzzTable,
    setup: &FuzzSetup,
    ours: &SessionContext,
    query: &FuzzQuery,
    msg: &str,
) -> String {
    let options = GpuSortConfig::from_config(ours.state().config().options());
    format!(
        "SQL FUZZ FAILURE ({what})\n  query: {}\n  settings: target_partitions={}, batch_size={}, gpusort: enabled={}, min_rows={}, device={}, strategy={}, merge_partitions={}, gpu_memory_limit={}, topk_max_fetch={}\n  table t: {}\n  problem: {msg}",
        query.sql,
        setup.target_partitions,
        setup.batch_size,
        options.enabled,
        options.min_rows,
        options.device,
        options.strategy,
        options.merge_partitions,
        options.gpu_memory_limit,
        options.topk_max_fetch,
        table.describe(),
    )
}

/// Adds `outcome` of `query` to `report`.
fn tally(report: &mut FuzzReport, query: &FuzzQuery, outcome: Outcome) {
    report.queries += 1;
    report.with_limit += query.limit.is_some() as usize;
    report.with_offset += (query.offset > 0) as usize;
    report.with_expr += query.uses_expr as usize;
    report.keys_selected += query.keys_selected as usize;
    report.column_subset += query.column_subset as usize;
    match outcome {
        Outcome::Compared {
            rows,
            stock_topk_wrong,
            gpu_sort_plan,
            kept_topk,
            no_sort_needed,
            gpu_sorts,
            cpu_sorts,
            paths,
        } => {
            report.output_rows += rows;
            if let Some(problem) = stock_topk_wrong {
                report.stock_topk_wrong += 1;
                if report.topk_samples.len() < 3 {
                    report.topk_samples.push(format!("{} -- {problem}", query.sql));
                }
            }
            report.gpu_sort_plans += gpu_sort_plan as usize;
            report.kept_topk += kept_topk as usize;
            report.no_sort_needed += no_sort_needed as usize;
            report.gpu_sorts += gpu_sorts;
            report.cpu_sorts += cpu_sorts;
            report.paths.extend(paths);
        }
        Outcome::BothFailed(e) => {
            report.both_failed += 1;
            let e: String = e.chars().take(160).collect();
            if report.failure_samples.len() < 8 {
                report.failure_samples.push(format!("{e} [{}]", query.sql));
            }
        }
        Outcome::Exhausted(_) => report.exhausted += 1,
    }
}

/// Runs `queries` against `table` on both sessions and checks each; panics on a failed check,
/// printing `what` (how to reproduce), the query and the table.
pub async fn run_queries(
    what: &str,
    table: &FuzzTable,
    setup: &FuzzSetup,
    queries: &[FuzzQuery],
    configure: Configure<'_>,
) -> FuzzReport {
    let (stock, ours) = sessions(table, setup, configure, None);
    if verbose() {
        println!("{what}: {setup:?}, table {}", table.describe());
    }
    let mut report = FuzzReport {
        cases: 1,
        table_rows: table.rows(),
        max_table_rows: table.rows(),
        ..Default::default()
    };
    for query in queries {
        match check_query(&stock, &ours, query, false).await {
            Ok(outcome) => tally(&mut report, query, outcome),
            Err(msg) => panic!("{}", failure(what, table, setup, &ours, query, &msg)),
        }
    }
    report
}

/// One random case: a table, settings and [`QUERIES_PER_CASE`] queries, all from `case_seed`.
pub async fn run_sql_fuzz_case(case_seed: u64, configure: impl Fn(SessionConfig) -> SessionConfig) -> FuzzReport {
    let mut rng = SmallRng::seed_from_u64(case_seed);
    let table = random_table(&mut rng);
    let setup = FuzzSetup::random(&mut rng, table.rows());
    let queries: Vec<FuzzQuery> = (0..QUERIES_PER_CASE)
        .map(|_| random_query(&mut rng, &table.schema, table.rows()))
        .collect();
    let what = format!("case seed {case_seed:#018x}; replay with run_sql_fuzz_case({case_seed:#018x}, ..)");
    run_queries(&what, &table, &setup, &queries, &configure).await
}

/// `cases` random cases from `seed` (case `i` has seed [`case_seed`]`(seed, i)`); `configure`
/// sets gpusort options on the gpusort session (`config.set_str("gpusort.min_rows", "0")`).
/// Panics on the first failed check.
pub async fn run_sql_fuzz(seed: u64, cases: usize, configure: impl Fn(SessionConfig) -> SessionConfig) -> FuzzReport {
    let verbose = verbose();
    let mut report = FuzzReport::default();
    for i in 0..cases {
        let start = Instant::now();
        let case = run_sql_fuzz_case(case_seed(seed, i), &configure).await;
        if verbose {
            println!(
                "case {i} ({:#018x}): {} rows, {} rows out, {:.2?}",
                case_seed(seed, i),
                case.table_rows,
                case.output_rows,
                start.elapsed()
            );
        }
        report.merge(case);
    }
    report
}

/// Random queries over `table` (the adversarial tables of the tests), with fixed settings
/// drawn from `seed`.
pub async fn run_sql_fuzz_on_table(
    name: &str,
    table: &FuzzTable,
    seed: u64,
    queries: usize,
    configure: impl Fn(SessionConfig) -> SessionConfig,
) -> FuzzReport {
    let mut rng = SmallRng::seed_from_u64(seed);
    let setup = FuzzSetup::random(&mut rng, table.rows());
    let queries: Vec<FuzzQuery> = (0..queries)
        .map(|_| random_query(&mut rng, &table.schema, table.rows()))
        .collect();
    let what = format!("table {name}, seed {seed:#x}");
    run_queries(&what, table, &setup, &queries, &configure).await
}

/// A random case whose gpusort session has `pool`: each query succeeds with the right rows or
/// fails with "Resources exhausted", and leaves the pool empty; then each query's stream is
/// dropped before and after its first batch, which must leave the pool empty too.
pub async fn run_memory_case(
    case_seed: u64,
    pool: Arc<dyn MemoryPool>,
    configure: impl Fn(SessionConfig) -> SessionConfig,
) -> FuzzReport {
    let mut rng = SmallRng::seed_from_u64(case_seed);
    let table = random_table(&mut rng);
    let setup = FuzzSetup::random(&mut rng, table.rows());
    let queries: Vec<FuzzQuery> = (0..QUERIES_PER_CASE)
        .map(|_| random_query(&mut rng, &table.schema, table.rows()))
        .collect();
    let what = format!(
        "memory case seed {case_seed:#018x}, pool {pool:?}; replay with run_memory_case({case_seed:#018x}, ..)"
    );
    let (stock, ours) = sessions(&table, &setup, &configure, Some(runtime_with_pool(Arc::clone(&pool))));
    let fail = |query: &FuzzQuery, msg: &str| failure(&what, &table, &setup, &ours, query, msg);
    let mut report = FuzzReport {
        cases: 1,
        table_rows: table.rows(),
        max_table_rows: table.rows(),
        ..Default::default()
    };
    for query in &queries {
        match check_query(&stock, &ours, query, true).await {
            Ok(outcome) => tally(&mut report, query, outcome),
            Err(msg) => panic!("{}", fail(query, &msg)),
        }
        if let Err(msg) = wait_for_empty_pool(&pool).await {
            panic!("{}", fail(query, &format!("after the query: {msg}")));
        }
        // Cancellation: drop the stream unpolled, and after its first batch.
        let Ok(df) = ours.sql(&query.sql).await else { continue };
        let Ok(plan) = df.create_physical_plan().await else {
            continue;
        };
        for polls in [0, 1] {
            match execute_stream(Arc::clone(&plan), ours.task_ctx()) {
                Ok(mut stream) => {
                    if polls > 0
                        && let Some(Err(e)) = stream.next().await
                        && !is_exhausted(&e.to_string())
                    {
                        // The query failed on both sessions above, or this is new.
                        if !matches!(
                            check_query(&stock, &ours, query, true).await,
                            Ok(Outcome::BothFailed(_))
                        ) {
                            panic!("{}", fail(query, &format!("first batch failed: {e}")));
                        }
                    }
                    drop(stream);
                }
                Err(e) => panic!("{}", fail(query, &format!("execute_stream failed: {e}"))),
            }
            if let Err(msg) = wait_for_empty_pool(&pool).await {
                panic!(
                    "{}",
                    fail(query, &format!("after dropping the stream after {polls} polls: {msg}"))
                );
            }
        }
    }
    report
}
