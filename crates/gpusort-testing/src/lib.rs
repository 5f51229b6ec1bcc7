//! Test support for gpusort: seeded random Arrow tables with the values that break sorts
//! (nulls, NaN, -0.0, extremes, empty and long strings sharing long prefixes, dictionaries),
//! and the reference every backend must equal: Arrow's `lexsort_to_indices` made stable
//! (equal keys keep input order) followed by `take`.

use std::sync::Arc;

use arrow::array::*;
use arrow::buffer::{NullBuffer, OffsetBuffer};
use arrow::compute::{LexicographicalComparator, lexsort_to_indices};
use arrow::datatypes::*;
use gpusort::{SortKey, SortOutput, SortSpec};
use half::f16;
use rand::distr::{Alphanumeric, SampleString};
use rand::prelude::*;
use rand::rngs::SmallRng;

/// The sort column types the fuzz tests draw from: every type a SQL ORDER BY can see.
pub fn sortable_types() -> Vec<DataType> {
    use DataType::*;
    let dict = |v: DataType| Dictionary(Box::new(Int32), Box::new(v));
    vec![
        Boolean,
        Int8,
        Int16,
        Int32,
        Int64,
        UInt8,
        UInt16,
        UInt32,
        UInt64,
        Float16,
        Float32,
        Float64,
        Decimal32(9, 2),
        Decimal64(18, 3),
        Decimal128(38, 5),
        Decimal256(76, 10),
        Date32,
        Date64,
        Time32(TimeUnit::Second),
        Time32(TimeUnit::Millisecond),
        Time64(TimeUnit::Microsecond),
        Time64(TimeUnit::Nanosecond),
        Timestamp(TimeUnit::Second, None),
        Timestamp(TimeUnit::Millisecond, Some("+05:30".into())),
        Timestamp(TimeUnit::Microsecond, None),
        Timestamp(TimeUnit::Nanosecond, Some("UTC".into())),
        Duration(TimeUnit::Second),
        Duration(TimeUnit::Nanosecond),
        Interval(IntervalUnit::YearMonth),
        Interval(IntervalUnit::DayTime),
        Interval(IntervalUnit::MonthDayNano),
        Utf8,
        LargeUtf8,
        Utf8View,
        Binary,
        LargeBinary,
        BinaryView,
        FixedSizeBinary(3),
        FixedSizeBinary(16),
        dict(Utf8),
        dict(Int64),
        Dictionary(Box::new(UInt8), Box::new(Float64)),
        Dictionary(Box::new(Int16), Box::new(LargeBinary)),
        // Nested keys sort by their Arrow row format bytes.
        List(Arc::new(Field::new_list_field(Int32, true))),
        Struct(Fields::from(vec![
            Field::new("a", Int16, true),
            Field::new("b", Utf8, true),
        ])),
    ]
}

/// Types for payload (non-key) columns: the sortable ones and the null type.
pub fn payload_types() -> Vec<DataType> {
    let mut t = sortable_types();
    t.push(DataType::Null);
    t
}

/// How values are drawn for one column.
#[derive(Debug, Clone, Copy)]
pub struct ColumnShape {
    /// Fraction of null rows.
    pub null_fraction: f64,
    /// Distinct values to draw from (few make ties); `None` for the type's whole range.
    pub distinct: Option<u64>,
}

impl ColumnShape {
    /// A random shape: 0-30% nulls (none half the time), and one time in three few
    /// distinct values.
    pub fn random(rng: &mut impl Rng) -> Self {
        Self {
            null_fraction: if rng.random_bool(0.5) {
                0.0
            } else {
                rng.random_range(0.0..0.3)
            },
            distinct: rng.random_bool(0.33).then(|| rng.random_range(1..40)),
        }
    }
}

fn pick<T: Copy>(rng: &mut impl Rng, specials: &[T], random: impl FnOnce(&mut dyn RngCore) -> T) -> T {
    if !specials.is_empty() && rng.random_bool(0.1) {
        specials[rng.random_range(0..specials.len())]
    } else {
        let mut r: &mut dyn RngCore = rng;
        random(&mut r)
    }
}

/// A value source: draws uniformly from a small pool when the shape asks for few
/// distinct values.
fn values<T: Clone>(
    rng: &mut SmallRng,
    len: usize,
    shape: ColumnShape,
    mut draw: impl FnMut(&mut SmallRng) -> T,
) -> Vec<Option<T>> {
    let pool: Option<Vec<T>> = shape.distinct.map(|d| (0..d).map(|_| draw(rng)).collect());
    (0..len)
        .map(|_| {
            if shape.null_fraction > 0.0 && rng.random_bool(shape.null_fraction) {
                None
            } else {
                Some(match &pool {
                    Some(p) => p[rng.random_range(0..p.len())].clone(),
                    None => draw(rng),
                })
            }
        })
        .collect()
}

fn prim<T: ArrowPrimitiveType>(
    rng: &mut SmallRng,
    len: usize,
    shape: ColumnShape,
    specials: &[T::Native],
    random: impl Fn(&mut dyn RngCore) -> T::Native,
) -> PrimitiveArray<T> {
    values(rng, len, shape, |r| pick(r, specials, &random))
        .into_iter()
        .collect()
}

/// A random string: empty, short, with zero bytes, non-ASCII, or long and sharing a long
/// prefix with others.
fn random_string(rng: &mut impl Rng) -> String {
    match rng.random_range(0..10) {
        0 => String::new(),
        1 => "\0".repeat(rng.random_range(1..3)),
        2 => format!("héllo wörld {}", rng.random_range(0..100)),
        3 | 4 => format!("a-long-shared-prefix/that/spans/many/key/words/{}", {
            let n = rng.random_range(0..6);
            Alphanumeric.sample_string(rng, n)
        }),
        5 => format!("a-long-shared-prefix/{}", rng.random_range(0..4)),
        _ => {
            let n = rng.random_range(0..12);
            Alphanumeric.sample_string(rng, n)
        }
    }
}

/// A random array of `data_type`.
pub fn random_array(rng: &mut SmallRng, data_type: &DataType, len: usize, shape: ColumnShape) -> ArrayRef {
    use DataType::*;
    macro_rules! ints {
        ($t:ty, $n:ty) => {
            Arc::new(prim::<$t>(
                rng,
                len,
                shape,
                &[<$n>::MIN, <$n>::MAX, 0 as $n, 1 as $n],
                |r| {
                    if r.random_bool(0.5) {
                        r.random()
                    } else {
                        r.random_range(0..100) as $n
                    }
                },
            ))
        };
    }
    match data_type {
        Null => Arc::new(NullArray::new(len)),
        Boolean => Arc::new(
            values(rng, len, shape, |r| r.random_bool(0.5))
                .into_iter()
                .collect::<BooleanArray>(),
        ),
        Int8 => ints!(Int8Type, i8),
        Int16 => ints!(Int16Type, i16),
        Int32 => ints!(Int32Type, i32),
        Int64 => ints!(Int64Type, i64),
        UInt8 => ints!(UInt8Type, u8),
        UInt16 => ints!(UInt16Type, u16),
        UInt32 => ints!(UInt32Type, u32),
        UInt64 => ints!(UInt64Type, u64),
        Float16 => Arc::new(prim::<Float16Type>(
            rng,
            len,
            shape,
            &[
                f16::NAN,
                -f16::NAN,
                f16::INFINITY,
                f16::NEG_INFINITY,
                f16::ZERO,
                f16::NEG_ZERO,
                f16::MAX,
                f16::MIN,
            ],
            |r| f16::from_f32(r.random_range(-100.0..100.0)),
        )),
        Float32 => Arc::new(prim::<Float32Type>(
            rng,
            len,
            shape,
            &[
                f32::NAN,
                -f32::NAN,
                f32::from_bits(0x7fc0_0001),
                f32::INFINITY,
                f32::NEG_INFINITY,
                0.0,
                -0.0,
                f32::MIN_POSITIVE,
            ],
            |r| r.random_range(-1e6..1e6),
        )),
        Float64 => Arc::new(prim::<Float64Type>(
            rng,
            len,
            shape,
            &[
                f64::NAN,
                -f64::NAN,
                f64::from_bits(0x7ff0_0000_0000_0001),
                f64::INFINITY,
                f64::NEG_INFINITY,
                0.0,
                -0.0,
                f64::MAX,
            ],
            |r| {
                if r.random_bool(0.5) {
                    r.random_range(-1e12..1e12)
                } else {
                    r.random_range(-3.0..3.0)
                }
            },
        )),
        Decimal32(p, s) => Arc::new(
            prim::<Decimal32Type>(rng, len, shape, &[-999_999_999, 999_999_999, 0], |r| {
                r.random_range(-999_999_999..=999_999_999)
            })
            .with_precision_and_scale(*p, *s)
            .unwrap(),
        ),
        Decimal64(p, s) => Arc::new(
            prim::<Decimal64Type>(rng, len, shape, &[-(10i64.pow(18) - 1), 10i64.pow(18) - 1, 0], |r| {
                r.random_range(-(10i64.pow(18) - 1)..10i64.pow(18))
            })
            .with_precision_and_scale(*p, *s)
            .unwrap(),
        ),
        Decimal128(p, s) => Arc::new(
            prim::<Decimal128Type>(rng, len, shape, &[-(10i128.pow(38) - 1), 10i128.pow(38) - 1, 0], |r| {
                if r.random_bool(0.5) {
                    r.random::<i64>() as i128 * 1_000_000
                } else {
                    r.random_range(-500..500)
                }
            })
            .with_precision_and_scale(*p, *s)
            .unwrap(),
        ),
        Decimal256(p, s) => Arc::new(
            prim::<Decimal256Type>(
                rng,
                len,
                shape,
                &[i256::MIN, i256::MAX, i256::ZERO, i256::MINUS_ONE],
                |r| i256::from_parts(r.random(), r.random::<i128>() >> r.random_range(0..127)),
            )
            .with_precision_and_scale(*p, *s)
            .unwrap(),
        ),
        Date32 => ints!(Date32Type, i32),
        Date64 => ints!(Date64Type, i64),
        Time32(TimeUnit::Second) => Arc::new(prim::<Time32SecondType>(rng, len, shape, &[0, 86_399], |r| {
            r.random_range(0..86_400)
        })),
        Time32(_) => Arc::new(prim::<Time32MillisecondType>(rng, len, shape, &[0, 86_399_999], |r| {
            r.random_range(0..86_400_000)
        })),
        Time64(TimeUnit::Microsecond) => Arc::new(prim::<Time64MicrosecondType>(rng, len, shape, &[0], |r| {
            r.random_range(0..86_400_000_000)
        })),
        Time64(_) => Arc::new(prim::<Time64NanosecondType>(rng, len, shape, &[0], |r| {
            r.random_range(0..86_400_000_000_000)
        })),
        Timestamp(unit, tz) => {
            let a = prim::<TimestampNanosecondType>(rng, len, shape, &[i64::MIN, i64::MAX, 0], |r| r.random());
            let data = a.into_data().into_builder().data_type(Timestamp(*unit, tz.clone()));
            make_array(data.build().unwrap())
        }
        Duration(unit) => {
            let a = prim::<DurationNanosecondType>(rng, len, shape, &[i64::MIN, i64::MAX, 0], |r| {
                r.random_range(-1000..1000)
            });
            make_array(a.into_data().into_builder().data_type(Duration(*unit)).build().unwrap())
        }
        Interval(IntervalUnit::YearMonth) => ints!(IntervalYearMonthType, i32),
        Interval(IntervalUnit::DayTime) => Arc::new(prim::<IntervalDayTimeType>(
            rng,
            len,
            shape,
            &[IntervalDayTime::MIN, IntervalDayTime::MAX, IntervalDayTime::ZERO],
            |r| IntervalDayTime::new(r.random_range(-3..3), r.random_range(-5..5)),
        )),
        Interval(IntervalUnit::MonthDayNano) => Arc::new(prim::<IntervalMonthDayNanoType>(
            rng,
            len,
            shape,
            &[
                IntervalMonthDayNano::MIN,
                IntervalMonthDayNano::MAX,
                IntervalMonthDayNano::ZERO,
            ],
            |r| IntervalMonthDayNano::new(r.random_range(-2..2), r.random_range(-2..2), r.random_range(-3..3)),
        )),
        Utf8 => Arc::new(
            values(rng, len, shape, random_string)
                .into_iter()
                .collect::<StringArray>(),
        ),
        LargeUtf8 => Arc::new(
            values(rng, len, shape, random_string)
                .into_iter()
                .collect::<LargeStringArray>(),
        ),
        Utf8View => Arc::new(
            values(rng, len, shape, random_string)
                .into_iter()
                .collect::<StringViewArray>(),
        ),
        Binary => Arc::new(BinaryArray::from_iter(values(rng, len, shape, |r| {
            random_string(r).into_bytes()
        }))),
        LargeBinary => Arc::new(LargeBinaryArray::from_iter(values(rng, len, shape, |r| {
            random_string(r).into_bytes()
        }))),
        BinaryView => Arc::new(BinaryViewArray::from_iter(values(rng, len, shape, |r| {
            random_string(r).into_bytes()
        }))),
        FixedSizeBinary(w) => {
            let w = *w as usize;
            let vals = values(rng, len, shape, |r| {
                let mut b = vec![0u8; w];
                if r.random_bool(0.7) {
                    r.fill(&mut b[..]);
                }
                b
            });
            Arc::new(FixedSizeBinaryArray::try_from_sparse_iter_with_size(vals.into_iter(), w as i32).unwrap())
        }
        Dictionary(k, v) => {
            let dict_len = rng.random_range(1..20);
            let values_shape = ColumnShape {
                null_fraction: if rng.random_bool(0.2) { 0.2 } else { 0.0 },
                distinct: None,
            };
            let dict_values = random_array(rng, v, dict_len, values_shape);
            let keys: Vec<Option<i64>> = values(rng, len, shape, |r| r.random_range(0..dict_len as i64));
            let keys: ArrayRef = Arc::new(Int64Array::from(keys));
            let keys = arrow::compute::cast(&keys, k).unwrap();
            let data = ArrayData::builder(data_type.clone())
                .len(len)
                .add_buffer(keys.to_data().buffers()[0].clone())
                .nulls(keys.nulls().cloned())
                .add_child_data(dict_values.to_data())
                .build()
                .unwrap();
            make_array(data)
        }
        List(f) => {
            let child_len = len * 2;
            let child = random_array(
                rng,
                f.data_type(),
                child_len,
                ColumnShape {
                    null_fraction: 0.1,
                    distinct: None,
                },
            );
            let mut offsets = vec![0i32];
            for _ in 0..len {
                let last = *offsets.last().unwrap();
                offsets.push((last + rng.random_range(0..3)).min(child_len as i32));
            }
            let nulls = NullBuffer::from_iter((0..len).map(|_| !rng.random_bool(shape.null_fraction)));
            Arc::new(ListArray::new(
                f.clone(),
                OffsetBuffer::new(offsets.into()),
                child,
                Some(nulls),
            ))
        }
        Struct(fields) => {
            let children = fields
                .iter()
                .map(|f| {
                    let shape = ColumnShape::random(rng);
                    random_array(rng, f.data_type(), len, shape)
                })
                .collect();
            let nulls = NullBuffer::from_iter((0..len).map(|_| !rng.random_bool(shape.null_fraction)));
            Arc::new(StructArray::new(fields.clone(), children, Some(nulls)))
        }
        other => panic!("random_array: no generator for {other}"),
    }
}

/// Row counts that hit the edges of tiles, chunks and digit histograms.
pub const EDGE_SIZES: &[usize] = &[
    0, 1, 2, 3, 31, 32, 33, 255, 256, 257, 1023, 1024, 1025, 4095, 4096, 4097, 16383, 16384, 16385, 32767, 32768,
    32769, 65535, 65536, 65537,
];

/// A random table and a random ORDER BY over it.
#[derive(Debug, Clone)]
pub struct FuzzCase {
    /// The rows.
    pub batch: RecordBatch,
    /// What to sort by.
    pub spec: SortSpec,
}

/// A random table of `len` rows: 1-4 sort columns of random sortable types with random
/// directions and null placements, and 0-4 payload columns of mixed types.
pub fn random_case(rng: &mut SmallRng, len: usize) -> FuzzCase {
    let sortable = sortable_types();
    let payload = payload_types();
    let num_keys = rng.random_range(1..=4);
    let num_payload = rng.random_range(0..=4);
    let mut fields = vec![];
    let mut columns = vec![];
    for i in 0..num_keys + num_payload {
        let t = if i < num_keys {
            sortable[rng.random_range(0..sortable.len())].clone()
        } else {
            payload[rng.random_range(0..payload.len())].clone()
        };
        let shape = ColumnShape::random(rng);
        let col = random_array(rng, &t, len, shape);
        fields.push(Field::new(format!("c{i}"), t, true));
        columns.push(col);
    }
    // Sort keys in random column order; payload columns shuffled in between.
    let mut order: Vec<usize> = (0..fields.len()).collect();
    order.shuffle(rng);
    let fields: Vec<Field> = order.iter().map(|&i| fields[i].clone()).collect();
    let columns: Vec<ArrayRef> = order.iter().map(|&i| columns[i].clone()).collect();
    let keys = (0..num_keys).map(|k| {
        let column = order.iter().position(|&i| i == k).unwrap();
        SortKey::new(column, rng.random_bool(0.5), rng.random_bool(0.5))
    });
    let spec = SortSpec::new(keys.collect::<Vec<_>>());
    let batch = RecordBatch::try_new(Arc::new(Schema::new(fields)), columns).unwrap();
    // A quarter of the cases come presorted, as clustered tables do.
    let arrangement = match rng.random_range(0..12) {
        0 => Arrangement::Sorted,
        1 => Arrangement::Reversed,
        2 => Arrangement::Runs(rng.random_range(2..=80)),
        _ => Arrangement::AsDrawn,
    };
    let batch = arrange(rng, &batch, &spec, arrangement);
    FuzzCase { batch, spec }
}

/// The order rows come in, for the presorted inputs a sort may shortcut.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Arrangement {
    /// As they were drawn.
    AsDrawn,
    /// In the sort's order.
    Sorted,
    /// In the reverse of the sort's order.
    Reversed,
    /// Interleaved at random from this many runs in the sort's order, one run after another.
    Runs(usize),
}

/// `batch`'s rows in `arrangement` with respect to `spec`.
pub fn arrange(rng: &mut SmallRng, batch: &RecordBatch, spec: &SortSpec, arrangement: Arrangement) -> RecordBatch {
    let sorted = stable_reference(batch, spec);
    let order: Vec<u32> = match arrangement {
        Arrangement::AsDrawn => return batch.clone(),
        Arrangement::Sorted => sorted,
        Arrangement::Reversed => sorted.into_iter().rev().collect(),
        Arrangement::Runs(k) => {
            let mut runs: Vec<Vec<u32>> = vec![vec![]; k];
            sorted
                .into_iter()
                .for_each(|row| runs[rng.random_range(0..k)].push(row));
            runs.concat()
        }
    };
    let indices = UInt32Array::from(order);
    let columns = batch
        .columns()
        .iter()
        .map(|c| arrow::compute::take(c.as_ref(), &indices, None).unwrap())
        .collect();
    RecordBatch::try_new(batch.schema(), columns).unwrap()
}

/// The stable sorted order of `batch` by `spec`: Arrow's `lexsort_to_indices` with runs of
/// equal keys put back in input order. Panics if `lexsort_to_indices` and Arrow's
/// comparator disagree.
pub fn stable_reference(batch: &RecordBatch, spec: &SortSpec) -> Vec<u32> {
    let cols = spec.to_sort_columns(batch);
    let cmp = LexicographicalComparator::try_new(&cols).unwrap();
    let mut idx: Vec<u32> = lexsort_to_indices(&cols, None).unwrap().values().to_vec();
    let mut start = 0;
    for i in 1..=idx.len() {
        if i == idx.len() || cmp.compare(idx[i - 1] as usize, idx[i] as usize).is_ne() {
            if i < idx.len() {
                assert!(
                    cmp.compare(idx[i - 1] as usize, idx[i] as usize).is_lt(),
                    "lexsort out of order at {i}"
                );
            }
            idx[start..i].sort_unstable();
            start = i;
        }
    }
    idx
}

/// Asserts that `out` is `batch` sorted by `spec`, stable, with the first `limit` rows:
/// its permutation equals the stable reference and each column equals `take` of the
/// input by it.
pub fn assert_matches_reference(
    batch: &RecordBatch,
    spec: &SortSpec,
    limit: Option<usize>,
    out: &SortOutput,
    what: &str,
) {
    let want = stable_reference(batch, spec);
    let k = limit.unwrap_or(usize::MAX).min(batch.num_rows());
    let got = out.indices.values();
    if got[..] != want[..k] {
        let at = got
            .iter()
            .zip(&want)
            .position(|(a, b)| a != b)
            .unwrap_or(k.min(got.len()));
        panic!(
            "{what}: permutation differs from the reference at position {at} of {k} (got {:?}, want {:?}); spec {:?}, schema {:?}",
            got.get(at),
            want.get(at),
            spec,
            batch.schema()
        );
    }
    assert_eq!(out.batch.num_rows(), k, "{what}: row count");
    let idx = UInt32Array::from(want[..k].to_vec());
    for (c, col) in out.batch.columns().iter().enumerate() {
        let expected = arrow::compute::take(batch.column(c).as_ref(), &idx, None).unwrap();
        assert_eq!(col.data_type(), expected.data_type(), "{what}: column {c} type");
        assert!(
            col.to_data() == expected.to_data(),
            "{what}: column {c} ({}) differs from take(reference)",
            col.data_type()
        );
    }
}

/// A seeded random number generator; `GPUSORT_FUZZ_SEED` overrides `default`.
pub fn rng_from_env(default: u64) -> (SmallRng, u64) {
    let seed = std::env::var("GPUSORT_FUZZ_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default);
    (SmallRng::seed_from_u64(seed), seed)
}

/// The key distributions of the presorted benchmarks: keys a sort may shortcut (sorted,
/// reversed, reversed with ties, a few sorted runs, few distinct keys) beside those it may not (random, zipf,
/// nearly sorted with scattered swaps).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyDistribution {
    /// Uniform 64-bit keys.
    Random,
    /// Uniform keys in ascending order.
    Sorted,
    /// Uniform keys in descending order.
    Reversed,
    /// This many distinct keys in descending order (each repeated: ties), as an ascending
    /// clustered column read for `ORDER BY ... DESC`.
    ReversedTies(usize),
    /// This many ascending runs of uniform keys, one after another.
    SortedRuns(usize),
    /// This many distinct keys, spread over 64 bits, in no order.
    Distinct(usize),
    /// Zipf-distributed ranks (exponent 1.1 over 1M values), each spread over 64 bits.
    Zipf,
    /// Sorted, then one row in a thousand swapped with a random other.
    NearlySorted,
}

impl KeyDistribution {
    /// Every distribution, random first (the others are compared with it).
    pub const ALL: [KeyDistribution; 8] = [
        Self::Random,
        Self::Sorted,
        Self::Reversed,
        Self::ReversedTies(1000),
        Self::SortedRuns(8),
        Self::Distinct(16),
        Self::Zipf,
        Self::NearlySorted,
    ];

    /// A short name for tables.
    pub fn name(&self) -> String {
        match self {
            Self::Random => "random".into(),
            Self::Sorted => "sorted".into(),
            Self::Reversed => "reversed".into(),
            Self::ReversedTies(k) => format!("reversed, {k} distinct"),
            Self::SortedRuns(k) => format!("{k} sorted runs"),
            Self::Distinct(k) => format!("{k} distinct"),
            Self::Zipf => "zipf 1.1 over 1M".into(),
            Self::NearlySorted => "nearly sorted (0.1% swapped)".into(),
        }
    }

    /// `n` keys drawn with `seed`.
    pub fn keys(&self, n: usize, seed: u64) -> Vec<u64> {
        /// Spreads a small rank over 64 bits, keeping distinct ranks distinct.
        fn spread(rank: u64) -> u64 {
            rank.wrapping_mul(0x9e37_79b9_7f4a_7c15)
        }
        let mut rng = SmallRng::seed_from_u64(seed);
        let mut keys: Vec<u64> = (0..n).map(|_| rng.random()).collect();
        match *self {
            Self::Random => {}
            Self::Sorted => keys.sort_unstable(),
            Self::Reversed => keys.sort_unstable_by(|a, b| b.cmp(a)),
            Self::ReversedTies(k) => {
                keys.iter_mut().for_each(|x| *x = (*x % k.max(1) as u64) << 24);
                keys.sort_unstable_by(|a, b| b.cmp(a));
            }
            Self::SortedRuns(k) => keys
                .chunks_mut(n.div_ceil(k.max(1)).max(1))
                .for_each(|c| c.sort_unstable()),
            Self::Distinct(k) => keys.iter_mut().for_each(|x| *x = spread(*x % k as u64)),
            Self::Zipf => {
                let values = 1_000_000usize;
                let mut cdf: Vec<f64> = (1..=values).map(|r| (r as f64).powf(-1.1)).collect();
                for i in 1..values {
                    cdf[i] += cdf[i - 1];
                }
                let total = cdf[values - 1];
                keys.iter_mut().for_each(|x| {
                    let u = (*x >> 11) as f64 / (1u64 << 53) as f64 * total;
                    *x = spread(cdf.partition_point(|&c| c < u) as u64);
                });
            }
            Self::NearlySorted => {
                keys.sort_unstable();
                for _ in 0..n / 1000 {
                    let (a, b) = (rng.random_range(0..n), rng.random_range(0..n));
                    keys.swap(a, b);
                }
            }
        }
        keys
    }
}
