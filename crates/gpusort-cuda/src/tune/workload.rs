//! The sorts each candidate of `gpusort tune` is timed on, their inputs, and the CPU's answer
//! they are checked against. Host code only: [`GpuMeasurer`](super::GpuMeasurer) uploads the
//! inputs and checks what comes back with [`WorkloadData::check_keys`] and
//! [`WorkloadData::check_fields`].
//!
//! The defaults are the rows `kernels/NOTES.md` tracks on the H100 (the paper bench's goal rows):
//! 100M u32 and u64 keys alone, and 10M records of a u32 key and m = 2 and m = 20 u32 fields
//! (ByField), each sorted by the strategy the planner picks for it, as a query's sort would be.

use gpusort::plan::{Strategy, varying_bits};
use rayon::prelude::*;

use crate::options::GpuOptions;

/// One sort of the search: random keys of one or two words, and `fields` u32 columns beside them
/// (0: keys only, sorted in place).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Workload {
    /// Rows.
    pub rows: usize,
    /// Key words: 1 (u32) or 2 (u64; keys only).
    pub key_words: usize,
    /// u32 columns besides the key (ByField).
    pub fields: usize,
}

impl Workload {
    /// The search's workloads at `scale` of their full size (1.0: 100M keys, 10M records).
    pub fn defaults(scale: f64) -> Vec<Self> {
        let rows = |n: f64| ((n * scale) as usize).max(1 << 16);
        vec![
            Self::keys(rows(100e6), 1),
            Self::keys(rows(100e6), 2),
            Self::records(rows(10e6), 2),
            Self::records(rows(10e6), 20),
        ]
    }

    /// `rows` keys of `words` words, alone.
    pub fn keys(rows: usize, words: usize) -> Self {
        Self {
            rows,
            key_words: words.clamp(1, 2),
            fields: 0,
        }
    }

    /// `rows` records of a u32 key and `fields` u32 columns.
    pub fn records(rows: usize, fields: usize) -> Self {
        Self {
            rows,
            key_words: 1,
            fields,
        }
    }

    /// Its name, e.g. `keys-u64-100M`, `byfield-m20-10M`.
    pub fn name(&self) -> String {
        let rows = match self.rows {
            r if r % 1_000_000 == 0 => format!("{}M", r / 1_000_000),
            r if r % 1000 == 0 => format!("{}K", r / 1000),
            r => r.to_string(),
        };
        if self.fields == 0 {
            format!("keys-u{}-{rows}", 32 * self.key_words)
        } else {
            format!("byfield-m{}-{rows}", self.fields)
        }
    }

    /// The strategy the planner runs it with under `options` (a key column and `fields` others).
    pub fn strategy(&self, options: &GpuOptions) -> Strategy {
        options.planned_strategy(None, self.fields + 1, 1)
    }
}

/// A workload's inputs and the CPU's answer.
#[derive(Debug)]
pub struct WorkloadData {
    /// Key words, word 0 most significant.
    pub key_words: Vec<Vec<u32>>,
    /// The u32 columns.
    pub fields: Vec<Vec<u32>>,
    /// The bits of each key word that vary ([`varying_bits`]).
    pub varying: Vec<u32>,
    /// Keys only: the key words in sorted order; records: the stable sorted order of the rows.
    expected: Expected,
}

#[derive(Debug)]
enum Expected {
    Keys(Vec<Vec<u32>>),
    Order(Vec<u32>),
}

/// A 64-bit mix of `x` (SplitMix64's finalizer): the inputs are a function of seed, column and row.
fn mix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// `n` random words of column `column`.
fn random_column(n: usize, seed: u64, column: u64) -> Vec<u32> {
    let base = mix(seed ^ column.wrapping_mul(0x2545_f491_4f6c_dd1d));
    (0..n as u64).into_par_iter().map(|i| mix(base ^ i) as u32).collect()
}

impl WorkloadData {
    /// The inputs of `w` from `seed`, and their sorted order by the CPU.
    pub fn generate(w: &Workload, seed: u64) -> Self {
        let n = w.rows;
        let key_words: Vec<Vec<u32>> = (0..w.key_words as u64).map(|c| random_column(n, seed, c)).collect();
        let fields: Vec<Vec<u32>> = (0..w.fields as u64).map(|c| random_column(n, seed, 16 + c)).collect();
        let varying = varying_bits(&key_words);
        let expected = if w.fields == 0 {
            let mut keys: Vec<u64> = (0..n)
                .into_par_iter()
                .map(|i| key_words.iter().fold(0u64, |k, w| (k << 32) | w[i] as u64))
                .collect();
            keys.par_sort_unstable();
            let words = (0..w.key_words)
                .map(|c| {
                    let shift = 32 * (w.key_words - 1 - c);
                    keys.par_iter().map(|k| (k >> shift) as u32).collect()
                })
                .collect();
            Expected::Keys(words)
        } else {
            // Key, then row: the order of a stable sort.
            let mut rows: Vec<u64> = (0..n)
                .into_par_iter()
                .map(|i| ((key_words[0][i] as u64) << 32) | i as u64)
                .collect();
            rows.par_sort_unstable();
            Expected::Order(rows.into_par_iter().map(|r| r as u32).collect())
        };
        Self {
            key_words,
            fields,
            varying,
            expected,
        }
    }

    /// Whether `got`, the key words after a keys-only sort, are the CPU's; else the first
    /// difference.
    pub fn check_keys(&self, got: &[Vec<u32>]) -> std::result::Result<(), String> {
        let Expected::Keys(want) = &self.expected else {
            return Err("a records workload checked by its keys".into());
        };
        if got.len() != want.len() {
            return Err(format!("{} key words, {} expected", got.len(), want.len()));
        }
        for (w, (g, e)) in got.iter().zip(want).enumerate() {
            first_difference(g, e, |i| e[i]).map_or(Ok(()), |(i, g, e)| {
                Err(format!("key word {w} of row {i}: {g:#x}, the CPU's {e:#x}"))
            })?;
        }
        Ok(())
    }

    /// Whether `got`, the u32 columns after a sort (little-endian bytes), are the inputs' in
    /// the CPU's stable order; else the first difference.
    pub fn check_fields(&self, got: &[Vec<u8>]) -> std::result::Result<(), String> {
        self.check_first_fields(got, self.fields.len())
    }

    /// As [`Self::check_fields`] for a sort of the first `columns` columns only.
    pub fn check_first_fields(&self, got: &[Vec<u8>], columns: usize) -> std::result::Result<(), String> {
        let Expected::Order(order) = &self.expected else {
            return Err("a keys workload checked by its columns".into());
        };
        if got.len() != columns || columns > self.fields.len() {
            return Err(format!("{} columns, {columns} expected", got.len()));
        }
        for (c, (bytes, input)) in got.iter().zip(&self.fields).enumerate() {
            if bytes.len() != 4 * input.len() {
                return Err(format!(
                    "column {c}: {} bytes, {} expected",
                    bytes.len(),
                    4 * input.len()
                ));
            }
            let words: Vec<u32> = bytes
                .par_chunks_exact(4)
                .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect();
            first_difference(&words, input, |i| input[order[i] as usize]).map_or(Ok(()), |(i, g, e)| {
                Err(format!("column {c}, sorted row {i}: {g:#x}, the CPU's {e:#x}"))
            })?;
        }
        Ok(())
    }
}

/// The first row `i` where `got[i]` is not `want(i)` (or the lengths differ: the shorter's
/// length), with both values.
fn first_difference(got: &[u32], like: &[u32], want: impl Fn(usize) -> u32 + Sync) -> Option<(usize, u32, u32)> {
    if got.len() != like.len() {
        let i = got.len().min(like.len());
        return Some((i, got.get(i).copied().unwrap_or(0), like.get(i).map_or(0, |_| want(i))));
    }
    got.par_iter()
        .enumerate()
        .find_first(|(i, g)| **g != want(*i))
        .map(|(i, g)| (i, *g, want(i)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn workloads_are_named_and_planned_as_the_planner_would() {
        let w = Workload::defaults(1.0);
        let names: Vec<String> = w.iter().map(Workload::name).collect();
        assert_eq!(
            names,
            ["keys-u32-100M", "keys-u64-100M", "byfield-m2-10M", "byfield-m20-10M"]
        );
        let d = GpuOptions::default();
        assert_eq!(w[0].strategy(&d), Strategy::SRTS_DIRECT);
        assert_eq!(w[2].strategy(&d), Strategy::SRTS_DIRECT);
        assert_eq!(w[3].strategy(&d), Strategy::SRTS_INDIRECT);
        let one = GpuOptions {
            direct_max_fields: 1,
            ..d
        };
        assert_eq!(w[2].strategy(&one), Strategy::SRTS_INDIRECT);
        assert_eq!(Workload::defaults(0.01)[2].name(), "byfield-m2-100K");
        assert_eq!(Workload::keys(1234, 3).key_words, 2);
    }

    /// The CPU's answer is a sorted permutation of the input, and the checks find a wrong answer.
    #[test]
    fn the_reference_is_right_and_wrong_answers_are_found() {
        let keys = WorkloadData::generate(&Workload::keys(5000, 2), 7);
        let Expected::Keys(sorted) = &keys.expected else {
            panic!()
        };
        let pairs: Vec<(u32, u32)> = sorted[0].iter().copied().zip(sorted[1].iter().copied()).collect();
        assert!(pairs.windows(2).all(|p| p[0] <= p[1]));
        let mut input: Vec<(u32, u32)> = keys.key_words[0]
            .iter()
            .copied()
            .zip(keys.key_words[1].iter().copied())
            .collect();
        input.sort();
        assert_eq!(input, pairs);
        keys.check_keys(sorted).unwrap();
        let mut wrong = sorted.clone();
        wrong[1].swap(10, 11);
        let err = keys.check_keys(&wrong).unwrap_err();
        assert!(err.contains("key word 1 of row 10"), "{err}");
        assert!(keys.check_keys(&keys.key_words).is_err(), "unsorted input passed");
        assert!(keys.check_keys(&sorted[..1]).is_err());

        // Records: a stable sort (ties kept in input order) of 8-bit keys, so that there are ties.
        let mut recs = WorkloadData::generate(&Workload::records(3000, 3), 9);
        for k in &mut recs.key_words[0] {
            *k >>= 24;
        }
        let mut order: Vec<u32> = (0..3000).collect();
        order.sort_by_key(|&i| recs.key_words[0][i as usize]);
        recs.expected = Expected::Order(order.clone());
        let bytes = |cols: &[Vec<u32>]| -> Vec<Vec<u8>> {
            cols.iter()
                .map(|c| order.iter().flat_map(|&i| c[i as usize].to_le_bytes()).collect())
                .collect()
        };
        let good = bytes(&recs.fields);
        recs.check_fields(&good).unwrap();
        let mut wrong = good.clone();
        wrong[2][40] ^= 1;
        let err = recs.check_fields(&wrong).unwrap_err();
        assert!(err.contains("column 2, sorted row 10"), "{err}");
        assert!(recs.check_fields(&good[..2]).is_err());
        // A sort of the first two columns only.
        recs.check_first_fields(&good[..2], 2).unwrap();
        assert!(recs.check_first_fields(&wrong[1..3], 2).is_err());
        assert!(recs.check_fields(&[vec![], vec![], vec![]]).is_err());
    }

    /// The generated records' order is the stable order of their keys.
    #[test]
    fn the_records_reference_is_stable() {
        let recs = WorkloadData::generate(&Workload::records(4000, 1), 3);
        let Expected::Order(order) = &recs.expected else {
            panic!()
        };
        let mut want: Vec<u32> = (0..4000).collect();
        want.sort_by_key(|&i| recs.key_words[0][i as usize]);
        assert_eq!(order, &want);
    }
}
