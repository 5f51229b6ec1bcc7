//! Range partitioning for a sort spread over several sorters (workers, or GPUs): splitters
//! chosen from a sample of the keys, as Spark's `RangePartitioner` and the sample sort do, and
//! the assignment of rows to the key ranges between them.
//!
//! Rows are ordered by their sort keys and then by their **position** (a `u64` that numbers
//! the rows of the input in its order, e.g. file and row within the file), so the order is
//! total: ranges are intervals of `(key, position)`, and rows with equal keys are split
//! across ranges by position instead of all landing in one range. Sorting each range by
//! `(key, position)` and concatenating the ranges in order gives the stable sort of the whole
//! input, with no merge; when one key value fills most of the input (all keys equal, zipf),
//! its rows still spread over the ranges as the sample says.
//!
//! Keys are compared through gpusort's order-preserving radix keys ([`crate::keys`]): the
//! splitters and the rows to assign are encoded together, so their keys share one layout, and
//! where a string prefix leaves two keys tied, the full values decide.

use std::cmp::Ordering;

use arrow::array::BooleanBufferBuilder;
use arrow::array::{Array, ArrayRef, RecordBatch, Scalar};
use arrow::buffer::BooleanBuffer;
use arrow::compute::kernels::cmp;
use arrow::compute::{LexicographicalComparator, SortOptions, concat};
use arrow::datatypes::{DataType, Field, Schema};
use std::sync::Arc;

use arrow::error::ArrowError;

use crate::error::{GpusortError, Result};

fn invalid(message: String) -> GpusortError {
    GpusortError::Arrow(ArrowError::InvalidArgumentError(message))
}
use crate::keys::{EncoderOptions, KeyEncoder};
use crate::spec::{SortKey, SortSpec};

/// The boundaries between `n + 1` key ranges: `n` rows of the sort key columns, each with its
/// position, ascending in `(key, position)`. Range `i` holds the rows at or after splitter
/// `i - 1` and before splitter `i`.
#[derive(Debug, Clone)]
pub struct Splitters {
    keys: Vec<ArrayRef>,
    positions: Vec<u64>,
    options: Vec<SortOptions>,
}

/// Compares rows of one batch of keys by their radix keys, or, for inexact layouts (string
/// prefixes), by their full values.
struct RowOrder {
    words: Vec<Vec<u32>>,
    exact: Option<LexicographicalComparator>,
}

impl RowOrder {
    fn new(keys: &[ArrayRef], options: &[SortOptions]) -> Result<Self> {
        let fields: Vec<Field> = keys
            .iter()
            .enumerate()
            .map(|(i, k)| Field::new(format!("k{i}"), k.data_type().clone(), true))
            .collect();
        let batch = RecordBatch::try_new(Arc::new(Schema::new(fields)), keys.to_vec())?;
        let spec = SortSpec::new(
            options
                .iter()
                .enumerate()
                .map(|(column, o)| SortKey { column, options: *o }),
        );
        let encoder = KeyEncoder::try_new(&batch, &spec, &EncoderOptions::default())?;
        let exact = if encoder.layout().is_exact() {
            None
        } else {
            Some(LexicographicalComparator::try_new(encoder.sort_columns())?)
        };
        Ok(Self {
            words: encoder.encode().words,
            exact,
        })
    }

    fn cmp_keys(&self, a: usize, b: usize) -> Ordering {
        // An inexact field's words can tie where its values differ, and the words of the
        // fields after it must not decide then: the full values order the rows.
        if let Some(c) = &self.exact {
            return c.compare(a, b);
        }
        for w in &self.words {
            match w[a].cmp(&w[b]) {
                Ordering::Equal => {}
                other => return other,
            }
        }
        Ordering::Equal
    }
}

fn check_keys(keys: &[ArrayRef], positions: usize, options: &[SortOptions]) -> Result<usize> {
    if keys.is_empty() || keys.len() != options.len() {
        return Err(invalid(format!(
            "range partitioning needs one or more key columns and one sort option each, got {} and {}",
            keys.len(),
            options.len()
        )));
    }
    let rows = keys[0].len();
    if keys.iter().any(|k| k.len() != rows) || positions != rows {
        return Err(invalid(format!(
            "key columns and positions of different lengths ({rows} rows, {positions} positions)"
        )));
    }
    Ok(rows)
}

impl Splitters {
    /// Splitters from their rows: `keys` (one array per sort key, each of the splitters'
    /// length), `positions` and the keys' options. Fails unless they are ascending.
    pub fn try_new(keys: Vec<ArrayRef>, positions: Vec<u64>, options: Vec<SortOptions>) -> Result<Self> {
        let n = check_keys(&keys, positions.len(), &options)?;
        let order = RowOrder::new(&keys, &options)?;
        for i in 1..n {
            let c = order.cmp_keys(i - 1, i).then(positions[i - 1].cmp(&positions[i]));
            if c == Ordering::Greater {
                return Err(invalid(format!(
                    "splitters {} and {i} are not in ascending (key, position) order",
                    i - 1
                )));
            }
        }
        Ok(Self {
            keys,
            positions,
            options,
        })
    }

    /// Splitters for `ranges` ranges from a sample: the sample's rows (`keys`, `positions`)
    /// are sorted by `(key, position)` and the rows at the quantiles `i * n / ranges`
    /// (`i = 1..ranges`) become the splitters, so each range gets about `n / ranges` sample
    /// rows, whatever the number of distinct keys. An empty sample (or one range) gives no
    /// splitter: every row goes to range 0.
    pub fn from_sample(keys: &[ArrayRef], positions: &[u64], options: &[SortOptions], ranges: usize) -> Result<Self> {
        let n = check_keys(keys, positions.len(), options)?;
        if n == 0 || ranges <= 1 {
            let keys = keys.iter().map(|k| k.slice(0, 0)).collect();
            return Ok(Self {
                keys,
                positions: vec![],
                options: options.to_vec(),
            });
        }
        let order = RowOrder::new(keys, options)?;
        let mut rows: Vec<usize> = (0..n).collect();
        rows.sort_by(|&a, &b| order.cmp_keys(a, b).then(positions[a].cmp(&positions[b])));
        let picks: Vec<u32> = (1..ranges).map(|i| rows[(i * n / ranges).min(n - 1)] as u32).collect();
        let picks = arrow::array::UInt32Array::from(picks);
        let keys = keys
            .iter()
            .map(|k| arrow::compute::take(k.as_ref(), &picks, None))
            .collect::<std::result::Result<Vec<_>, _>>()?;
        let positions = picks.values().iter().map(|&r| positions[r as usize]).collect();
        Ok(Self {
            keys,
            positions,
            options: options.to_vec(),
        })
    }

    /// Number of ranges (splitters + 1).
    pub fn num_ranges(&self) -> usize {
        self.positions.len() + 1
    }

    /// The splitters' key columns.
    pub fn keys(&self) -> &[ArrayRef] {
        &self.keys
    }

    /// The splitters' positions.
    pub fn positions(&self) -> &[u64] {
        &self.positions
    }

    /// The sort options of the key columns.
    pub fn options(&self) -> &[SortOptions] {
        &self.options
    }

    /// The range of each row (`keys`: the rows' sort key columns, of the splitters' types;
    /// `positions`: their positions): the number of splitters at or before the row in
    /// `(key, position)` order.
    pub fn assign(&self, keys: &[ArrayRef], positions: &[u64]) -> Result<Vec<u32>> {
        let rows = check_keys(keys, positions.len(), &self.options)?;
        let s = self.positions.len();
        if s == 0 || rows == 0 {
            return Ok(vec![0; rows]);
        }
        if keys.len() != self.keys.len() {
            return Err(invalid(format!(
                "{} key columns, the splitters have {}",
                keys.len(),
                self.keys.len()
            )));
        }
        match self.assign_by_kernels(keys, positions)? {
            Some(ranges) => Ok(ranges),
            None => self.assign_by_radix_keys(keys, positions),
        }
    }
}

impl Splitters {
    /// [`Self::assign`] through gpusort's radix keys: the splitters and the rows encoded together
    /// (one layout), each row's range found by a binary search over the splitters.
    fn assign_by_radix_keys(&self, keys: &[ArrayRef], positions: &[u64]) -> Result<Vec<u32>> {
        let (s, rows) = (self.positions.len(), positions.len());
        // Splitters first, then the rows: one encoding, so their keys compare.
        let combined = self
            .keys
            .iter()
            .zip(keys)
            .map(|(a, b)| concat(&[a.as_ref(), b.as_ref()]))
            .collect::<std::result::Result<Vec<_>, _>>()?;
        let order = RowOrder::new(&combined, &self.options)?;
        Ok((0..rows)
            .map(|r| {
                let row = s + r;
                // Splitters are ascending: count those <= the row.
                let (mut lo, mut hi) = (0usize, s);
                while lo < hi {
                    let mid = (lo + hi) / 2;
                    let c = order.cmp_keys(mid, row).then(self.positions[mid].cmp(&positions[r]));
                    if c == Ordering::Greater {
                        hi = mid;
                    } else {
                        lo = mid + 1;
                    }
                }
                lo as u32
            })
            .collect())
    }
}

impl Splitters {
    /// [`Self::assign`] by Arrow's comparison kernels ([`Self::at_or_after`]); `None` where a
    /// key column's type is not one they order as the radix keys do.
    fn assign_by_kernels(&self, keys: &[ArrayRef], positions: &[u64]) -> Result<Option<Vec<u32>>> {
        let Some(at_or_after) = self.at_or_after(keys, |p| {
            BooleanBuffer::collect_bool(positions.len(), |r| positions[r] >= p)
        })?
        else {
            return Ok(None);
        };
        Ok(Some(
            (0..positions.len())
                .map(|r| at_or_after.iter().map(|ge| ge.value(r) as u32).sum())
                .collect(),
        ))
    }

    /// The rows of each range, as bitmaps, for rows at consecutive positions from `first`
    /// (what a split of one batch assigns: a chunk of its rows): [`Self::assign`] 64 rows a
    /// word. `None` where a key column's type is not one Arrow's kernels order as the radix
    /// keys do.
    pub fn range_bitmaps(&self, keys: &[ArrayRef], first: u64) -> Result<Option<Vec<BooleanBuffer>>> {
        let rows = check_keys(keys, keys.first().map_or(0, |k| k.len()), &self.options)?;
        let from = |p: u64| {
            // Rows at positions >= p: those from index p - first on.
            let at = p.saturating_sub(first).min(rows as u64) as usize;
            let mut b = BooleanBufferBuilder::new(rows);
            b.append_n(at, false);
            b.append_n(rows - at, true);
            b.finish()
        };
        let Some(at_or_after) = self.at_or_after(keys, from)? else {
            return Ok(None);
        };
        // Splitters ascend, so each bitmap holds the next: range r is at or after splitter
        // r - 1 and not at or after splitter r.
        let all = BooleanBuffer::new_set(rows);
        let none = BooleanBuffer::new_unset(rows);
        let bounds: Vec<&BooleanBuffer> = std::iter::once(&all)
            .chain(&at_or_after)
            .chain(std::iter::once(&none))
            .collect();
        Ok(Some(bounds.windows(2).map(|w| w[0] & &!w[1]).collect()))
    }

    /// For each splitter, the rows at or after it in `(key, position)` order, by Arrow's
    /// comparison kernels where every key column is of a type they order as the radix keys do
    /// ([`kernel_ordered`]); `None` otherwise. `position_at_least(p)` is the rows whose
    /// position is at least `p`.
    ///
    /// The rows at or after a splitter are
    /// `after_1 | (equal_1 & (after_2 | (equal_2 & ... (position >= the splitter's))))`, each
    /// `after_c` and `equal_c` one kernel call against the splitter's value, 64 rows a word.
    fn at_or_after(
        &self,
        keys: &[ArrayRef],
        position_at_least: impl Fn(u64) -> BooleanBuffer,
    ) -> Result<Option<Vec<BooleanBuffer>>> {
        if keys.len() != self.keys.len() || !keys.iter().all(|k| kernel_ordered(k.data_type())) {
            return Ok(None);
        }
        let mut at_or_after = Vec::with_capacity(self.positions.len());
        for (s, &position) in self.positions.iter().enumerate() {
            let mut ge = position_at_least(position);
            for (c, column) in keys.iter().enumerate().rev() {
                let (after, equal) = after_and_equal(column, &self.keys[c].slice(s, 1), self.options[c])?;
                ge = &after | &(&equal & &ge);
            }
            at_or_after.push(ge);
        }
        Ok(Some(at_or_after))
    }
}

/// Whether Arrow's comparison kernels order values of `data_type` as gpusort's radix keys do
/// (integers, IEEE `totalOrder` for floats, dates, times, timestamps, durations, 4- to 16-byte
/// decimals, booleans, strings and binaries by their bytes).
fn kernel_ordered(data_type: &DataType) -> bool {
    use DataType::*;
    matches!(
        data_type,
        Int8 | Int16
            | Int32
            | Int64
            | UInt8
            | UInt16
            | UInt32
            | UInt64
            | Float16
            | Float32
            | Float64
            | Date32
            | Date64
            | Time32(_)
            | Time64(_)
            | Timestamp(_, _)
            | Duration(_)
            | Decimal32(_, _)
            | Decimal64(_, _)
            | Decimal128(_, _)
            | Boolean
            | Utf8
            | LargeUtf8
            | Utf8View
            | Binary
            | LargeBinary
            | BinaryView
    )
}

/// For each row of `column`: whether it sorts after `value` (one row of the column's type)
/// under `options`, and whether it equals it (two nulls are equal).
fn after_and_equal(
    column: &ArrayRef,
    value: &ArrayRef,
    options: SortOptions,
) -> Result<(BooleanBuffer, BooleanBuffer)> {
    let rows = column.len();
    let valid = match column.logical_nulls() {
        Some(n) => n.inner().clone(),
        None => BooleanBuffer::new_set(rows),
    };
    if value.is_null(0) {
        // Non-null rows come after a null one when nulls sort first; null rows equal it.
        let after = if options.nulls_first {
            valid.clone()
        } else {
            BooleanBuffer::new_unset(rows)
        };
        return Ok((after, !&valid));
    }
    let scalar = Scalar::new(Arc::clone(value));
    let beyond = if options.descending {
        cmp::lt(column, &scalar)?
    } else {
        cmp::gt(column, &scalar)?
    };
    let equal = cmp::eq(column, &scalar)?;
    let mut after = beyond.values() & &valid;
    if !options.nulls_first {
        // Null rows come after every value.
        after = &after | &!&valid;
    }
    Ok((after, equal.values() & &valid))
}

/// How even a partitioning is: the largest range's rows over the mean (1.0 is perfect; `n`
/// ranges with everything in one give `n`). 1.0 for no rows.
pub fn imbalance(range_rows: &[usize]) -> f64 {
    let total: usize = range_rows.iter().sum();
    if total == 0 || range_rows.is_empty() {
        return 1.0;
    }
    let max = *range_rows.iter().max().unwrap_or(&0) as f64;
    max / (total as f64 / range_rows.len() as f64)
}

/// splitmix64: the next value of a seeded generator whose state is `state` (the reservoir's
/// and the split sort's samples).
pub(crate) fn splitmix64(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// A uniform sample of at most `capacity` rows of a stream of rows (Vitter's reservoir
/// algorithm R), with a seeded generator so the same input gives the same sample. It decides
/// which rows to keep; the caller keeps their values in slots `0..capacity`.
#[derive(Debug, Clone)]
pub struct Reservoir {
    capacity: usize,
    seen: u64,
    state: u64,
}

impl Reservoir {
    /// A reservoir of `capacity` rows, its choices drawn from `seed`.
    pub fn new(capacity: usize, seed: u64) -> Self {
        Self {
            capacity,
            seen: 0,
            state: seed ^ 0x9e37_79b9_7f4a_7c15,
        }
    }

    fn next(&mut self) -> u64 {
        splitmix64(&mut self.state)
    }

    /// Offers the next `rows` rows of the stream; returns `(row, slot)` for each row to keep,
    /// `row` counted within these `rows`: the value goes into `slot`, replacing what was there
    /// (slots fill in order `0, 1, ...` first). A later pair may name a slot an earlier pair
    /// of the same call filled.
    pub fn offer(&mut self, rows: usize) -> Vec<(usize, usize)> {
        let mut kept = vec![];
        for row in 0..rows {
            let seen = self.seen;
            self.seen += 1;
            if (seen as usize) < self.capacity {
                kept.push((row, seen as usize));
            } else if self.capacity > 0 {
                let j = self.next() % (seen + 1);
                if (j as usize) < self.capacity {
                    kept.push((row, j as usize));
                }
            }
        }
        kept
    }

    /// Rows offered so far.
    pub fn seen(&self) -> u64 {
        self.seen
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::{Array, Int64Array, StringArray};

    fn asc() -> SortOptions {
        SortOptions {
            descending: false,
            nulls_first: false,
        }
    }

    /// The kernels' assignment equals the radix keys' on every type they take, with nulls,
    /// few distinct values (ties split by position), both directions and both null orders,
    /// one and two key columns; other types take the radix keys.
    #[test]
    fn kernel_assignment_equals_radix_key_assignment() {
        use gpusort_testing::{ColumnShape, random_array, sortable_types};
        use rand::prelude::*;
        let mut rng = rand::rngs::SmallRng::seed_from_u64(26);
        let types = sortable_types();
        let mut kernel_cases = 0;
        for case in 0..300 {
            let columns = 1 + case % 2;
            let n = rng.random_range(1..3000);
            let keys: Vec<ArrayRef> = (0..columns)
                .map(|_| {
                    let t = &types[rng.random_range(0..types.len())];
                    let shape = ColumnShape::random(&mut rng);
                    random_array(&mut rng, t, n, shape)
                })
                .collect();
            let options: Vec<SortOptions> = (0..columns)
                .map(|_| SortOptions {
                    descending: rng.random_bool(0.5),
                    nulls_first: rng.random_bool(0.5),
                })
                .collect();
            let positions: Vec<u64> = (0..n as u64).map(|p| p * 3 + 1).collect();
            let sample: Vec<u32> = (0..n as u32).filter(|_| rng.random_bool(0.3)).collect();
            let sample_keys: Vec<ArrayRef> = keys
                .iter()
                .map(|k| {
                    arrow::compute::take(k.as_ref(), &arrow::array::UInt32Array::from(sample.clone()), None).unwrap()
                })
                .collect();
            let sample_positions: Vec<u64> = sample.iter().map(|&r| positions[r as usize]).collect();
            let ranges = rng.random_range(2..6);
            let splitters = Splitters::from_sample(&sample_keys, &sample_positions, &options, ranges).unwrap();
            if splitters.positions().is_empty() {
                continue;
            }
            let by_keys = splitters.assign_by_radix_keys(&keys, &positions).unwrap();
            let what = format!(
                "case {case}: {:?} {options:?}",
                keys.iter().map(|k| k.data_type()).collect::<Vec<_>>()
            );
            match splitters.assign_by_kernels(&keys, &positions).unwrap() {
                Some(by_kernels) => {
                    kernel_cases += 1;
                    if let Some(r) = (0..n).find(|&r| by_kernels[r] != by_keys[r]) {
                        let show = |k: &ArrayRef, i: usize| arrow::util::display::array_value_to_string(k, i).unwrap();
                        let row: Vec<String> = keys.iter().map(|k| show(k, r)).collect();
                        let sp: Vec<Vec<String>> = (0..splitters.positions().len())
                            .map(|i| splitters.keys().iter().map(|k| show(k, i)).collect())
                            .collect();
                        panic!(
                            "{what}: row {r} {row:?} pos {} kernels {} keys {}; splitters {sp:?} at {:?}",
                            positions[r],
                            by_kernels[r],
                            by_keys[r],
                            splitters.positions()
                        );
                    }
                }
                None => assert!(keys.iter().any(|k| !kernel_ordered(k.data_type())), "{what}"),
            }
            assert_eq!(splitters.assign(&keys, &positions).unwrap(), by_keys, "{what}");
        }
        assert!(kernel_cases > 100, "{kernel_cases} cases took the kernels");
    }

    /// Assigns every row and checks the ranges are the sorted order cut into intervals.
    fn check_intervals(keys: &[ArrayRef], positions: &[u64], options: &[SortOptions], ranges: usize) -> Vec<usize> {
        let s = Splitters::from_sample(keys, positions, options, ranges).unwrap();
        assert_eq!(s.num_ranges(), ranges.max(1));
        let assigned = s.assign(keys, positions).unwrap();
        let order = RowOrder::new(keys, options).unwrap();
        let mut rows: Vec<usize> = (0..positions.len()).collect();
        rows.sort_by(|&a, &b| order.cmp_keys(a, b).then(positions[a].cmp(&positions[b])));
        let in_order: Vec<u32> = rows.iter().map(|&r| assigned[r]).collect();
        assert!(in_order.windows(2).all(|w| w[0] <= w[1]), "{in_order:?}");
        let mut counts = vec![0usize; s.num_ranges()];
        for a in assigned {
            counts[a as usize] += 1;
        }
        counts
    }

    #[test]
    fn even_ranges_on_distinct_keys() {
        let n = 10_000;
        let keys: Vec<ArrayRef> = vec![Arc::new(Int64Array::from_iter_values((0..n).map(|i| (i * 7919) % n)))];
        let pos: Vec<u64> = (0..n as u64).collect();
        let counts = check_intervals(&keys, &pos, &[asc()], 4);
        assert_eq!(counts, vec![2500; 4]);
    }

    #[test]
    fn all_keys_equal_split_by_position() {
        let n = 1000;
        let keys: Vec<ArrayRef> = vec![Arc::new(Int64Array::from(vec![42i64; n]))];
        let pos: Vec<u64> = (0..n as u64).collect();
        let s = Splitters::from_sample(&keys, &pos, &[asc()], 3).unwrap();
        let assigned = s.assign(&keys, &pos).unwrap();
        // Ranges follow the positions: stable.
        assert!(assigned.windows(2).all(|w| w[0] <= w[1]));
        let counts = check_intervals(&keys, &pos, &[asc()], 3);
        assert!(imbalance(&counts) < 1.01, "{counts:?}");
    }

    #[test]
    fn zipf_keys_spread_and_a_sample_suffices() {
        // Key k appears about n / (k + 1) times.
        let mut values = vec![];
        for k in 0..200i64 {
            values.extend(std::iter::repeat_n(k, 20_000 / (k as usize + 1)));
        }
        let n = values.len();
        // Interleave so positions do not follow keys.
        let values: Vec<i64> = (0..n).map(|i| values[(i * 7919) % n]).collect();
        let keys: Vec<ArrayRef> = vec![Arc::new(Int64Array::from(values))];
        let pos: Vec<u64> = (0..n as u64).collect();
        // A 1-in-10 sample picks the splitters.
        let sample_rows: Vec<u32> = (0..n as u32).step_by(10).collect();
        let idx = arrow::array::UInt32Array::from(sample_rows.clone());
        let sample_keys = vec![arrow::compute::take(keys[0].as_ref(), &idx, None).unwrap()];
        let sample_pos: Vec<u64> = sample_rows.iter().map(|&r| pos[r as usize]).collect();
        let s = Splitters::from_sample(&sample_keys, &sample_pos, &[asc()], 8).unwrap();
        let assigned = s.assign(&keys, &pos).unwrap();
        let mut counts = vec![0usize; 8];
        for a in &assigned {
            counts[*a as usize] += 1;
        }
        assert!(imbalance(&counts) < 1.1, "{counts:?}");
        // The most frequent key (0: about 20000 rows of ~118000, more than an eighth) spans more
        // than one range.
        let ranges_of_0: std::collections::BTreeSet<u32> = (0..n)
            .filter(|&i| keys[0].as_any().downcast_ref::<Int64Array>().unwrap().value(i) == 0)
            .map(|i| assigned[i])
            .collect();
        assert!(ranges_of_0.len() >= 2, "{ranges_of_0:?}");
    }

    #[test]
    fn descending_nulls_and_long_strings() {
        let strings: Vec<Option<String>> = (0..500)
            .map(|i| (i % 17 != 0).then(|| format!("a-long-common-prefix-{:05}-{}", (i * 31) % 97, "x".repeat(i % 5))))
            .collect();
        let keys: Vec<ArrayRef> = vec![
            Arc::new(StringArray::from(strings)),
            Arc::new(Int64Array::from_iter((0..500).map(|i| (i % 3 != 0).then_some(i % 7)))),
        ];
        let options = [
            SortOptions {
                descending: true,
                nulls_first: true,
            },
            asc(),
        ];
        let pos: Vec<u64> = (0..500).rev().collect();
        let counts = check_intervals(&keys, &pos, &options, 5);
        assert_eq!(counts.iter().sum::<usize>(), 500);
        assert!(imbalance(&counts) < 1.05, "{counts:?}");
    }

    #[test]
    fn rows_outside_the_sample_and_checks() {
        let keys: Vec<ArrayRef> = vec![Arc::new(Int64Array::from(vec![10i64, 20, 30]))];
        let s = Splitters::from_sample(&keys, &[0, 1, 2], &[asc()], 3).unwrap();
        assert_eq!(s.positions(), &[1, 2]);
        let rows: Vec<ArrayRef> = vec![Arc::new(Int64Array::from(vec![5i64, 20, 20, 25, 30, 99]))];
        // Ties with a splitter's key go by position: (20, 0) before (20, 1), (30, 0) before (30, 2).
        assert_eq!(s.assign(&rows, &[0, 0, 5, 0, 0, 0]).unwrap(), vec![0, 0, 1, 1, 1, 2]);
        assert!(Splitters::try_new(s.keys().to_vec(), vec![2, 1], vec![asc()]).is_ok());
        let desc: Vec<ArrayRef> = vec![Arc::new(Int64Array::from(vec![30i64, 20]))];
        assert!(Splitters::try_new(desc, vec![0, 0], vec![asc()]).is_err());
        assert!(s.assign(&rows, &[0]).is_err());
        let empty = Splitters::from_sample(&keys, &[0, 1, 2], &[asc()], 1).unwrap();
        assert_eq!(empty.assign(&rows, &[0; 6]).unwrap(), vec![0; 6]);
        assert_eq!(empty.keys()[0].len(), 0);
        assert_eq!(imbalance(&[]), 1.0);
        assert_eq!(imbalance(&[0, 10]), 2.0);
    }

    #[test]
    fn reservoir_is_uniform_and_seeded() {
        let mut hits = vec![0u32; 100];
        for seed in 0..400 {
            let mut r = Reservoir::new(10, seed);
            let mut slots = vec![usize::MAX; 10];
            for chunk in 0..10 {
                for (row, slot) in r.offer(10) {
                    slots[slot] = chunk * 10 + row;
                }
            }
            assert_eq!(r.seen(), 100);
            for s in slots {
                hits[s] += 1;
            }
        }
        // Each row is kept with probability 1/10: 40 of 400 expected.
        assert!(hits.iter().all(|&h| (15..=70).contains(&h)), "{hits:?}");
        let a = Reservoir::new(5, 7).offer(50);
        let b = Reservoir::new(5, 7).offer(50);
        assert_eq!(a, b);
    }
}
