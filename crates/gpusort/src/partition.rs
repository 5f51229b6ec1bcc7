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

use arrow::array::{ArrayRef, RecordBatch};
use arrow::compute::{LexicographicalComparator, SortOptions, concat};
use arrow::datatypes::{Field, Schema};
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

/// Compares rows of one batch of keys by their radix keys, then (for inexact layouts) by the
/// full values, then by position.
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
        for w in &self.words {
            match w[a].cmp(&w[b]) {
                Ordering::Equal => {}
                other => return other,
            }
        }
        match &self.exact {
            Some(c) => c.compare(a, b),
            None => Ordering::Equal,
        }
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
        // splitmix64
        self.state = self.state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
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
