//! Ordering rows whose keys tie on a truncated string or binary prefix.
//!
//! A byte field keeps a fixed prefix of each value (see [`crate::keys`]). After the radix
//! sort, rows are ordered by their keys; rows whose keys agree on every bit up to the end
//! of an inexact field, and whose values there are truncated (longer than the prefix),
//! may still be out of order. Each such **tie group** is a contiguous range of sorted
//! positions; it is ordered by comparing the full values of that column and of every later
//! sort column, with the input row as the final tie-break (which keeps the sort stable).
//! Groups are independent and are sorted in parallel.
//!
//! When every later sort field is exact, a group needs less: the radix sort has already put
//! its rows in the order of the later fields and then of the input row, so a stable sort by
//! the bytes past the prefix alone (which all its rows share) finishes it, with no
//! comparison of the prefix again nor of the later columns ([`order_tails`]). The GPU backend
//! orders such groups on the device instead ([`find_ties`] leaves them to it).

use std::ops::Range;

use arrow::array::AsArray;
use arrow::compute::{LexicographicalComparator, SortColumn};
use arrow::datatypes::DataType;
use rayon::prelude::*;

use crate::error::Result;
use crate::keys::{FieldEncoding, KeyLayout, ordinal::Ordinal};

/// Reads `nbits` (<= 64) bits at `pos` (from the key's most significant bit) of `row`.
fn bits_at(words: &[&[u32]], pad: u32, row: usize, pos: u32, nbits: u32) -> u64 {
    let mut g = pad + pos;
    let mut left = nbits;
    let mut v = 0u64;
    while left > 0 {
        let in_word = g % 32;
        let take = (32 - in_word).min(left);
        let word = words[(g / 32) as usize][row];
        let part = (word >> (32 - in_word - take)) & (u32::MAX >> (32 - take));
        v = (v << take) | part as u64;
        g += take;
        left -= take;
    }
    v
}

/// How a sorted key tells that a row's value of an inexact byte field was cut at its prefix:
/// the null flag (where the field has one) says "not null", and the length bits hold the
/// capped length (the prefix and one). The GPU backend runs the same test on the device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TruncationTest {
    /// The null flag's key bit and the value it has for a value that is not null.
    pub null_flag: Option<(u32, u32)>,
    /// The length bits' first key bit and count (at most 32), and the code of a truncated
    /// value; 0 bits where every value has one length, and then the code is 1 when that length
    /// is the capped one (every value truncated), else 0.
    pub length: (u32, u32, u32),
}

impl TruncationTest {
    /// The test of `layout`'s field `s`; `None` for an exact field or one that is not bytes.
    pub fn of(layout: &KeyLayout, s: usize) -> Option<Self> {
        let field = &layout.fields()[s];
        let FieldEncoding::Bytes {
            prefix_bytes,
            len_min,
            len_max,
            ..
        } = field.encoding
        else {
            return None;
        };
        if field.exact {
            return None;
        }
        let cap = prefix_bytes as u32 + 1;
        let len_bits = (len_max - len_min).bit_len();
        let code = if field.options.descending {
            len_max.wrapping_sub(cap)
        } else {
            cap.wrapping_sub(len_min)
        };
        Some(Self {
            null_flag: (field.null_bits == 1).then_some((field.pos, field.options.nulls_first as u32)),
            length: if len_bits == 0 {
                (0, 0, (len_min == cap) as u32)
            } else {
                (field.end() - len_bits, len_bits, code)
            },
        })
    }

    /// Whether sorted `row` of the key `words` (with `pad` leading bits) holds a truncated value.
    pub fn holds(&self, words: &[&[u32]], pad: u32, row: usize) -> bool {
        if let Some((pos, present)) = self.null_flag
            && bits_at(words, pad, row, pos, 1) != present as u64
        {
            return false; // a null
        }
        match self.length {
            (_, 0, code) => code != 0,
            (pos, bits, code) => bits_at(words, pad, row, pos, bits) == code as u64,
        }
    }
}

/// Where [`find_ties`] reads the sorted key: which rows agree with the row before them on every
/// key bit through a field, and which rows' values of a field were truncated.
pub trait TieMarks: Sync {
    /// The maximal runs of at least two of the `rows` sorted rows whose keys agree through
    /// field `s`.
    fn equal_runs(&self, s: usize, rows: usize) -> Vec<Range<usize>>;
    /// Whether sorted row `row`'s value of the inexact byte field `s` was truncated.
    fn truncated(&self, s: usize, row: usize) -> bool;
}

/// The sorted key words on the host, read where [`find_ties`] asks ([`TieMarks`]).
pub struct KeyWords<'a> {
    layout: &'a KeyLayout,
    words: &'a [&'a [u32]],
    /// Each field's [`TruncationTest`].
    tests: Vec<Option<TruncationTest>>,
}

impl<'a> KeyWords<'a> {
    /// The sorted `words` of keys of `layout`.
    pub fn new(layout: &'a KeyLayout, words: &'a [&'a [u32]]) -> Self {
        let tests = (0..layout.fields().len())
            .map(|s| TruncationTest::of(layout, s))
            .collect();
        Self { layout, words, tests }
    }
}

impl KeyWords<'_> {
    /// The [`TieBitmaps`] pair of field `s` (rows that agree with the row before them through
    /// it, rows whose value was truncated), computed here: what the GPU backend computes on the
    /// device; `None` for a field that is exact or not bytes.
    pub fn bitmaps(&self, s: usize, rows: usize) -> Option<[Vec<u32>; 2]> {
        let test = self.tests[s]?;
        let n = rows;
        let mut bits = [vec![0u32; n.div_ceil(32)], vec![0u32; n.div_ceil(32)]];
        for g in self.equal_runs(s, n) {
            for i in g.start + 1..g.end {
                bits[0][i / 32] |= 1 << (i % 32);
            }
        }
        for i in 0..n {
            if test.holds(self.words, self.layout.pad(), i) {
                bits[1][i / 32] |= 1 << (i % 32);
            }
        }
        Some(bits)
    }
}

impl TieMarks for KeyWords<'_> {
    fn equal_runs(&self, s: usize, rows: usize) -> Vec<Range<usize>> {
        let masks: Vec<(usize, u32)> = (0..self.words.len())
            .map(|w| (w, self.layout.word_mask_through(s, w)))
            .filter(|&(_, m)| m != 0)
            .collect();
        let words = self.words;
        runs(rows, &|i| {
            masks.iter().all(|&(w, m)| (words[w][i] ^ words[w][i - 1]) & m == 0)
        })
    }

    fn truncated(&self, s: usize, row: usize) -> bool {
        self.tests[s].is_some_and(|t| t.holds(self.words, self.layout.pad(), row))
    }
}

/// [`TieMarks`] as bitmaps over the sorted rows (bit `i % 32` of word `i / 32` is row `i`), one
/// pair a field: rows that agree with the row before them through the field, and rows whose
/// value was truncated. The GPU backend computes them on the device and downloads these bits
/// instead of the key.
pub struct TieBitmaps<'a> {
    fields: Vec<Option<[&'a [u32]; 2]>>,
}

impl<'a> TieBitmaps<'a> {
    /// For each field its (agrees, truncated) bitmaps, or `None` for a field that has no ties
    /// to find.
    pub fn new(fields: Vec<Option<[&'a [u32]; 2]>>) -> Self {
        Self { fields }
    }

    fn bit(bits: &[u32], i: usize) -> bool {
        bits[i / 32] >> (i % 32) & 1 == 1
    }
}

impl TieMarks for TieBitmaps<'_> {
    fn equal_runs(&self, s: usize, rows: usize) -> Vec<Range<usize>> {
        match self.fields.get(s) {
            Some(Some([agrees, _])) => runs(rows, &|i| Self::bit(agrees, i)),
            _ => vec![],
        }
    }

    fn truncated(&self, s: usize, row: usize) -> bool {
        matches!(self.fields.get(s), Some(Some([_, t])) if Self::bit(t, row))
    }
}

/// Finds the tie groups of `layout`'s inexact fields in the sorted `words` and orders
/// them by `sort_columns` (one per field, as [`crate::keys::KeyEncoder::sort_columns`]
/// gives them). `perm` maps sorted positions to input rows and is reordered inside each
/// group. Returns the reordered ranges, ascending and disjoint.
pub fn resolve_ties(
    layout: &KeyLayout,
    sort_columns: &[SortColumn],
    words: &[&[u32]],
    perm: &mut [u32],
) -> Result<Vec<Range<usize>>> {
    let marks = KeyWords::new(layout, words);
    Ok(find_ties(layout, sort_columns, &marks, perm, &|_, _, _| false)?.resolved)
}

/// Tie groups of one field whose order [`find_ties`] left to its caller: every later field is
/// exact, so a stable sort of each group by the bytes of `sort_columns[field]` past the first
/// `skip` (which its rows share, and all go on past) finishes it, as [`order_tails`] does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TailGroups {
    /// The sort field (and column).
    pub field: usize,
    /// Bytes every row of a group shares.
    pub skip: usize,
    /// The column's direction.
    pub descending: bool,
    /// The groups, ascending and disjoint.
    pub groups: Vec<Range<usize>>,
}

/// What [`find_ties`] found: the tie groups (ascending, disjoint), and those it left to its caller.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Ties {
    /// Every tie group, ordered here or not.
    pub resolved: Vec<Range<usize>>,
    /// The groups `defer` took, per field.
    pub deferred: Vec<TailGroups>,
}

/// Whether [`find_ties`] leaves a field's tie groups to its caller, given the field, its
/// column and the groups.
pub type Defer<'a> = dyn Fn(usize, &SortColumn, &[Range<usize>]) -> bool + 'a;

/// [`resolve_ties`] over the key as `marks` read it, but the groups of a field whose later
/// fields are exact and that `defer` takes (given the field, its column and groups) are left as
/// they are and returned ([`Ties::deferred`]), for the caller to order elsewhere (the GPU
/// backend orders them on the device).
pub fn find_ties(
    layout: &KeyLayout,
    sort_columns: &[SortColumn],
    marks: &dyn TieMarks,
    perm: &mut [u32],
    defer: &Defer<'_>,
) -> Result<Ties> {
    let n = perm.len();
    let mut resolved: Vec<Range<usize>> = vec![];
    let mut deferred = vec![];
    for (s, field) in layout.fields().iter().enumerate() {
        let FieldEncoding::Bytes {
            common_prefix,
            prefix_bytes,
            ..
        } = field.encoding
        else {
            continue;
        };
        if field.exact || n < 2 {
            continue;
        }
        let groups: Vec<Range<usize>> = (marks.equal_runs(s, n).into_iter())
            .filter(|g| marks.truncated(s, g.start) && !inside(&resolved, g))
            .collect();
        if groups.is_empty() {
            continue;
        }
        let later_exact = layout.fields()[s + 1..].iter().all(|f| f.exact);
        let skip = common_prefix + prefix_bytes;
        if later_exact && defer(s, &sort_columns[s], &groups) {
            resolved.extend(groups.iter().cloned());
            resolved.sort_by_key(|r| r.start);
            deferred.push(TailGroups {
                field: s,
                skip,
                descending: field.options.descending,
                groups,
            });
            continue;
        }
        if later_exact && order_tails(&sort_columns[s], skip, &groups, perm) {
            resolved.extend(groups);
            resolved.sort_by_key(|r| r.start);
            continue;
        }
        sort_groups(&sort_columns[s..], &groups, perm)?;
        resolved.extend(groups);
        resolved.sort_by_key(|r| r.start);
    }
    Ok(Ties { resolved, deferred })
}

/// Orders each of `groups` (disjoint ranges of `perm`) by comparing the full values of
/// `sort_columns`, the input row last, in parallel.
fn sort_groups(sort_columns: &[SortColumn], groups: &[Range<usize>], perm: &mut [u32]) -> Result<()> {
    let cmp = LexicographicalComparator::try_new(sort_columns)?;
    let base = perm.as_mut_ptr() as usize;
    groups.par_iter().for_each(|g| {
        // SAFETY: groups are disjoint ranges of `perm`.
        let slice = unsafe { std::slice::from_raw_parts_mut((base as *mut u32).add(g.start), g.len()) };
        let order = |a: &u32, b: &u32| cmp.compare(*a as usize, *b as usize).then(a.cmp(b));
        if slice.len() > 4096 {
            slice.par_sort_unstable_by(order);
        } else {
            slice.sort_unstable_by(order);
        }
    });
    Ok(())
}

/// Orders each group of `perm` (disjoint ranges whose rows share `column`'s first `skip`
/// bytes and are longer) by the bytes after them, stably, in `column`'s direction. False,
/// with nothing done, where `column` is not a string or binary array.
pub fn order_tails(column: &SortColumn, skip: usize, groups: &[Range<usize>], perm: &mut [u32]) -> bool {
    let descending = column.options.is_some_and(|o| o.descending);
    with_value_bytes(column, |bytes| sort_tails(bytes, skip, descending, groups, perm)).is_some()
}

/// Calls `f` with an accessor of the bytes of `column`'s values by row (downcast once), where
/// `column` is a string or binary array; `None` for another type.
pub fn with_value_bytes<'a, R>(
    column: &'a SortColumn,
    f: impl FnOnce(&(dyn Fn(usize) -> &'a [u8] + Sync + 'a)) -> R,
) -> Option<R> {
    let values = column.values.as_ref();
    Some(match values.data_type() {
        DataType::Utf8 => {
            let a = values.as_string::<i32>();
            f(&|i| a.value(i).as_bytes())
        }
        DataType::LargeUtf8 => {
            let a = values.as_string::<i64>();
            f(&|i| a.value(i).as_bytes())
        }
        DataType::Utf8View => {
            let a = values.as_string_view();
            f(&|i| a.value(i).as_bytes())
        }
        DataType::Binary => {
            let a = values.as_binary::<i32>();
            f(&|i| a.value(i))
        }
        DataType::LargeBinary => {
            let a = values.as_binary::<i64>();
            f(&|i| a.value(i))
        }
        DataType::BinaryView => {
            let a = values.as_binary_view();
            f(&|i| a.value(i))
        }
        DataType::FixedSizeBinary(_) => {
            let a = values.as_fixed_size_binary();
            f(&|i| a.value(i))
        }
        _ => return None,
    })
}

/// [`order_tails`] over one column type's byte accessor: each group refined in parallel.
fn sort_tails<'a, F: Fn(usize) -> &'a [u8] + Sync + ?Sized>(
    bytes: &F,
    skip: usize,
    descending: bool,
    groups: &[Range<usize>],
    perm: &mut [u32],
) {
    let base = perm.as_mut_ptr() as usize;
    groups.par_iter().for_each(|g| {
        // SAFETY: groups are disjoint ranges of `perm`.
        let rows = unsafe { std::slice::from_raw_parts_mut((base as *mut u32).add(g.start), g.len()) };
        refine(bytes, skip, descending, rows, 0);
    });
}

/// Refinements of a group by the next 8 bytes before its rows are compared in full.
const REFINE_DEPTH: usize = 4;

/// Orders `rows`, whose values share their first `skip` bytes and are longer, by the bytes
/// after them, keeping the order of equal values. Each step sorts a gathered key of the next
/// 8 bytes (big-endian, zero-padded), the length left (up to 9: more than 8) and the row's
/// place, which reads every value once instead of once per comparison; the runs still equal
/// with more bytes to come take the next 8, and after [`REFINE_DEPTH`] steps a comparison
/// sort of the rest of the values finishes them.
fn refine<'a, F: Fn(usize) -> &'a [u8] + Sync + ?Sized>(
    bytes: &F,
    skip: usize,
    descending: bool,
    rows: &mut [u32],
    depth: usize,
) {
    if rows.len() < 2 {
        return;
    }
    if depth == REFINE_DEPTH {
        return compare_tails(bytes, skip, descending, rows);
    }
    let flip = if descending { u64::MAX } else { 0 };
    let mut keyed: Vec<(u64, u32, u32)> = rows
        .iter()
        .enumerate()
        .map(|(place, &r)| {
            let tail = &bytes(r as usize)[skip..];
            let mut word = [0u8; 8];
            let take = tail.len().min(8);
            word[..take].copy_from_slice(&tail[..take]);
            let left = tail.len().min(9) as u32;
            let left = if descending { 9 - left } else { left };
            (u64::from_be_bytes(word) ^ flip, left, place as u32)
        })
        .collect();
    if keyed.len() > 1 << 14 {
        keyed.par_sort_unstable();
    } else {
        keyed.sort_unstable();
    }
    let before = rows.to_vec();
    for (dst, k) in rows.iter_mut().zip(&keyed) {
        *dst = before[k.2 as usize];
    }
    // Runs of equal keys whose values go on past these 8 bytes.
    let more = if descending { 0 } else { 9 };
    let mut start = 0;
    while start < keyed.len() {
        let mut end = start + 1;
        while end < keyed.len() && keyed[end].0 == keyed[start].0 && keyed[end].1 == keyed[start].1 {
            end += 1;
        }
        if end - start >= 2 && keyed[start].1 == more {
            refine(bytes, skip + 8, descending, &mut rows[start..end], depth + 1);
        }
        start = end;
    }
}

/// Orders `rows` (as [`refine`]) by comparing the bytes past `skip` in full.
fn compare_tails<'a, F: Fn(usize) -> &'a [u8] + Sync + ?Sized>(
    bytes: &F,
    skip: usize,
    descending: bool,
    rows: &mut [u32],
) {
    let tail = |row: u32| &bytes(row as usize)[skip..];
    // Rows and their places: an unstable sort by (tail, place) is a stable sort by tail.
    let order = |a: &u64, b: &u64| {
        let (ra, rb) = (*a as u32, *b as u32);
        let by_tail = if descending {
            tail(rb).cmp(tail(ra))
        } else {
            tail(ra).cmp(tail(rb))
        };
        by_tail.then((a >> 32).cmp(&(b >> 32)))
    };
    let mut keyed: Vec<u64> = rows
        .iter()
        .enumerate()
        .map(|(i, &r)| ((i as u64) << 32) | r as u64)
        .collect();
    if keyed.len() > 1 << 14 {
        keyed.par_sort_unstable_by(order);
    } else {
        keyed.sort_unstable_by(order);
    }
    for (dst, k) in rows.iter_mut().zip(&keyed) {
        *dst = *k as u32;
    }
}

/// True when `g` lies inside one of the sorted, disjoint `ranges`.
fn inside(ranges: &[Range<usize>], g: &Range<usize>) -> bool {
    let k = ranges.partition_point(|r| r.start <= g.start);
    k > 0 && ranges[k - 1].end >= g.end
}

/// The maximal runs of at least two positions `i - 1, i` for which `same(i)` holds,
/// found in parallel: each task reports the runs that start in its part.
pub fn runs(n: usize, same: &(impl Fn(usize) -> bool + Sync)) -> Vec<Range<usize>> {
    const PART: usize = 1 << 16;
    (0..n.div_ceil(PART))
        .into_par_iter()
        .flat_map_iter(|p| {
            let (lo, hi) = (p * PART, n.min((p + 1) * PART));
            let mut out = vec![];
            // The first run starting at or after `lo` (a run through `lo` began earlier).
            let mut start = lo;
            if lo > 0 {
                while start < n && same(start) {
                    start += 1;
                }
            }
            while start < hi {
                let mut end = start + 1;
                while end < n && same(end) {
                    end += 1;
                }
                if end - start >= 2 {
                    out.push(start..end);
                }
                start = end;
            }
            out
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_cross_part_boundaries() {
        let n = 200_000;
        // Values: runs of length 1..=5 cycling, one very long run in the middle.
        let mut vals = vec![];
        let mut v = 0;
        while vals.len() < n {
            let len = if v == 20_000 { 100_000 } else { v % 5 + 1 };
            vals.extend(std::iter::repeat_n(v, len));
            v += 1;
        }
        vals.truncate(n);
        let got = runs(n, &|i| vals[i] == vals[i - 1]);
        let mut want = vec![];
        let mut s = 0;
        for i in 1..=n {
            if i == n || vals[i] != vals[i - 1] {
                if i - s >= 2 {
                    want.push(s..i);
                }
                s = i;
            }
        }
        assert_eq!(got, want);
        assert!(runs(1, &|_| true).is_empty());
        assert_eq!(runs(2, &|_| true), vec![0..2]);
        assert_eq!(runs(3, &|i| i == 2), vec![1..3]);
    }

    /// Ties found through the device's bitmaps ([`TieBitmaps`]) are the ties found in the key
    /// words ([`KeyWords`]): the same groups, ordered the same, for strings ASC and DESC, nulls
    /// first and last, with nulls, values as long as the prefix, and a later exact key.
    #[test]
    fn bitmaps_find_the_ties_the_key_words_find() {
        use std::sync::Arc;

        use arrow::array::{ArrayRef, Int32Array, RecordBatch, StringArray};
        use arrow::datatypes::{Field, Schema};

        use crate::keys::{EncoderOptions, KeyEncoder};
        use crate::spec::{SortKey, SortSpec};

        let n = 3000;
        let s: StringArray = (0..n)
            .map(|i| match i % 7 {
                0 => None,
                1 => Some(format!("{:02}", i % 40)),
                2 => Some(format!("{}", i % 10)),
                _ => Some(format!("{:02}-shared-{}-{}", i % 40, i % 5, (i * 37) % 101)),
            })
            .collect();
        let b = Int32Array::from_iter_values((0..n).map(|i| (i % 4) as i32));
        let cols: Vec<ArrayRef> = vec![Arc::new(s), Arc::new(b)];
        let schema = Schema::new(vec![
            Field::new("s", cols[0].data_type().clone(), true),
            Field::new("b", cols[1].data_type().clone(), false),
        ]);
        let batch = RecordBatch::try_new(Arc::new(schema), cols).unwrap();
        for (descending, nulls_first) in [(false, false), (true, true), (true, false)] {
            for later in [false, true] {
                let mut keys = vec![SortKey::new(0, descending, nulls_first)];
                if later {
                    keys.push(SortKey::new(1, false, false));
                }
                let enc = KeyEncoder::try_new(
                    &batch,
                    &SortSpec::new(keys),
                    &EncoderOptions {
                        max_prefix_bytes: 2,
                        ..Default::default()
                    },
                )
                .unwrap();
                let encoded = enc.encode();
                let mut order: Vec<u32> = (0..n as u32).collect();
                order.sort_by_key(|&r| encoded.words.iter().map(|w| w[r as usize]).collect::<Vec<_>>());
                let sorted: Vec<Vec<u32>> = (encoded.words.iter())
                    .map(|w| order.iter().map(|&r| w[r as usize]).collect())
                    .collect();
                let views: Vec<&[u32]> = sorted.iter().map(Vec::as_slice).collect();
                let layout = enc.layout();
                let words = KeyWords::new(layout, &views);
                let bitmaps: Vec<Option<[Vec<u32>; 2]>> =
                    (0..layout.fields().len()).map(|f| words.bitmaps(f, n)).collect();
                assert!(bitmaps[0].is_some() && bitmaps.iter().skip(1).all(Option::is_none));
                let bits = TieBitmaps::new(
                    bitmaps
                        .iter()
                        .map(|b| b.as_ref().map(|[a, t]| [&a[..], &t[..]]))
                        .collect(),
                );
                let (mut by_words, mut by_bits) = (order.clone(), order.clone());
                let cols = enc.sort_columns();
                let from_words = find_ties(layout, cols, &words, &mut by_words, &|_, _, _| false).unwrap();
                let from_bits = find_ties(layout, cols, &bits, &mut by_bits, &|_, _, _| false).unwrap();
                assert!(from_words.resolved.len() > 10, "{descending} {nulls_first} {later}");
                assert_eq!(from_words, from_bits);
                assert_eq!(by_words, by_bits);
            }
        }
    }

    #[test]
    fn inside_ranges() {
        let r = vec![0..3, 10..20];
        assert!(inside(&r, &(11..15)));
        assert!(inside(&r, &(10..20)));
        assert!(!inside(&r, &(5..7)));
        assert!(!inside(&r, &(2..5)));
    }
}
