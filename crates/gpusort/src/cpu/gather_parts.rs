//! Gathering rows from many batches at once: the rows of `parts`, taken as one sequence (their
//! concatenation, which is never built), at the positions a permutation lists, cut into output
//! batches built on every core.
//!
//! An external sort's merge step sorts the keys of a few thousand slices of its runs into a
//! permutation over their concatenation, then gathers the rows through it. Locating row `i`
//! by a binary search over the parts' starts, and Arrow's `interleave` of each output batch,
//! cost ~10x a plain gather. Here a row's part comes from a table of the part at every 1024th
//! row (then a step or two forward), once per output batch for all its columns, and
//! fixed-width columns are copied value by value from their parts' buffers; other columns go
//! through `interleave` with the same locations.

use std::sync::Arc;

use arrow::array::{Array, ArrayRef, RecordBatch, RecordBatchOptions};
use arrow::buffer::{BooleanBuffer, Buffer, NullBuffer};
use arrow::compute::interleave;
use arrow::datatypes::{DataType, SchemaRef};
use arrow::error::ArrowError;
use rayon::prelude::*;

use super::gather::{fixed_array, fixed_values, fixed_width};
use super::uninit;
use crate::error::Result;

/// log2 of the rows between two entries of the table that locates a row's part.
const BLOCK_SHIFT: u32 = 10;

/// Where row `i` of the parts' concatenation lies: its part and its row in it.
struct Locator {
    /// Row of the concatenation at which each part starts, and the total.
    starts: Vec<usize>,
    /// The part holding row `b << BLOCK_SHIFT`, for every block `b`.
    block_part: Vec<u32>,
}

impl Locator {
    fn new(parts: &[RecordBatch]) -> Self {
        let mut starts = Vec::with_capacity(parts.len() + 1);
        starts.push(0);
        for p in parts {
            starts.push(starts.last().unwrap() + p.num_rows());
        }
        let rows = *starts.last().unwrap();
        let mut block_part = Vec::with_capacity(rows.div_ceil(1 << BLOCK_SHIFT));
        let mut part = 0;
        for row in (0..rows).step_by(1 << BLOCK_SHIFT) {
            while starts[part + 1] <= row {
                part += 1;
            }
            block_part.push(part as u32);
        }
        Self { starts, block_part }
    }

    fn rows(&self) -> usize {
        *self.starts.last().unwrap()
    }

    /// (part, row within it) of row `i` (< [`Self::rows`]).
    #[inline]
    fn locate(&self, i: usize) -> (usize, usize) {
        let mut part = self.block_part[i >> BLOCK_SHIFT] as usize;
        while self.starts[part + 1] <= i {
            part += 1;
        }
        (part, i - self.starts[part])
    }
}

/// Rows `perm[0]`, `perm[1]`, ... of `parts` (batches of `schema`, taken as one sequence of
/// rows), as batches of `batch_rows` rows (the last may be shorter), built in parallel. Every
/// index must be below the parts' total rows.
pub fn gather_parts(
    schema: &SchemaRef,
    parts: &[RecordBatch],
    perm: &[u32],
    batch_rows: usize,
) -> Result<Vec<RecordBatch>> {
    let locator = Locator::new(parts);
    let columns: Vec<PartColumn> = (0..schema.fields().len()).map(|c| PartColumn::new(parts, c)).collect();
    perm.par_chunks(batch_rows.max(1))
        .map(|chunk| {
            // Indices are checked as they are located, not in a pass of their own.
            let at = chunk
                .iter()
                .map(|&i| match i as usize {
                    i if i < locator.rows() => Ok(locator.locate(i)),
                    i => Err(ArrowError::InvalidArgumentError(format!(
                        "row {i} gathered from parts of {} rows",
                        locator.rows()
                    ))),
                })
                .collect::<Result<Vec<(usize, usize)>, _>>()?;
            let arrays = columns.iter().map(|c| c.gather(&at)).collect::<Result<Vec<_>>>()?;
            let options = RecordBatchOptions::new().with_row_count(Some(chunk.len()));
            Ok(RecordBatch::try_new_with_options(Arc::clone(schema), arrays, &options)?)
        })
        .collect()
}

/// One column of every part, ready to gather from.
struct PartColumn<'a> {
    arrays: Vec<&'a dyn Array>,
    /// Value bytes of each part (rows `0..len`) and their width, where the column is a
    /// fixed-width primitive or fixed-size binary; `None`: gathered by `interleave`.
    fixed: Option<(usize, Vec<Buffer>)>,
    /// Whether a part has nulls.
    nulls: bool,
}

impl<'a> PartColumn<'a> {
    fn new(parts: &'a [RecordBatch], c: usize) -> Self {
        let arrays: Vec<&dyn Array> = parts.iter().map(|p| p.column(c).as_ref()).collect();
        // Dictionaries may differ between parts: `interleave` merges them.
        let fixed = arrays
            .first()
            .map(|a| a.data_type())
            .filter(|t| !matches!(t, DataType::Dictionary(..)))
            .and_then(fixed_width)
            .map(|w| (w, arrays.iter().map(|a| fixed_values(*a, w)).collect()));
        let nulls = arrays.iter().any(|a| a.null_count() > 0);
        Self { arrays, fixed, nulls }
    }

    /// The column's rows at `at` (part, row).
    fn gather(&self, at: &[(usize, usize)]) -> Result<ArrayRef> {
        let Some((width, values)) = &self.fixed else {
            return Ok(interleave(&self.arrays, at)?);
        };
        let values: Vec<&[u8]> = values.iter().map(|b| b.as_slice()).collect();
        let out = match width {
            1 => copy::<1>(&values, at),
            2 => copy::<2>(&values, at),
            4 => copy::<4>(&values, at),
            8 => copy::<8>(&values, at),
            16 => copy::<16>(&values, at),
            32 => copy::<32>(&values, at),
            w => unreachable!("unsupported width {w}"),
        };
        let nulls = self.nulls.then(|| {
            let bits = BooleanBuffer::collect_bool(at.len(), |k| {
                let (p, r) = at[k];
                self.arrays[p].is_valid(r)
            });
            NullBuffer::new(bits)
        });
        Ok(fixed_array(self.arrays[0], out, nulls, at.len()))
    }
}

/// Values of `W` bytes at `at` (part, row) of the parts' `values`.
fn copy<const W: usize>(values: &[&[u8]], at: &[(usize, usize)]) -> Buffer {
    // SAFETY: [u8; W] has alignment 1, and each part's values hold whole rows.
    let parts: Vec<&[[u8; W]]> = values
        .iter()
        .map(|v| unsafe { std::slice::from_raw_parts(v.as_ptr() as *const [u8; W], v.len() / W) })
        .collect();
    let mut out = uninit(at.len() * W);
    // SAFETY: as above; `out` holds `at.len()` rows, each written below before any read.
    let dst = unsafe { std::slice::from_raw_parts_mut(out.as_mut_ptr() as *mut [u8; W], at.len()) };
    for (o, &(p, r)) in dst.iter_mut().zip(at) {
        *o = parts[p][r];
    }
    out.into()
}

#[cfg(test)]
mod tests {
    use arrow::array::{BooleanArray, DictionaryArray, Int64Array, StringArray, UInt32Array};
    use arrow::compute::{concat_batches, take_record_batch};
    use arrow::datatypes::{Field, Int32Type, Schema};

    use super::*;

    fn batch(schema: &SchemaRef, start: i64, rows: usize) -> RecordBatch {
        let ints: Int64Array = (0..rows as i64)
            .map(|i| ((start + i) % 7 != 3).then_some((start + i) * 11 % 97))
            .collect();
        let plain: Int64Array = (0..rows as i64).map(|i| Some(start + i)).collect();
        let strings: StringArray = (0..rows as i64).map(|i| Some(format!("s{}", start + i))).collect();
        let bools: BooleanArray = (0..rows as i64).map(|i| Some((start + i) % 3 == 0)).collect();
        let dict: DictionaryArray<Int32Type> = (0..rows as i64)
            .map(|i| {
                if start > 500 {
                    "late"
                } else {
                    ["a", "b", "c"][((start + i) % 3) as usize]
                }
            })
            .collect();
        let columns: Vec<ArrayRef> = vec![
            Arc::new(ints),
            Arc::new(plain),
            Arc::new(strings),
            Arc::new(bools),
            Arc::new(dict),
        ];
        RecordBatch::try_new(Arc::clone(schema), columns).unwrap()
    }

    #[test]
    fn gathers_what_take_of_the_concatenation_gives() {
        let schema = Arc::new(Schema::new(vec![
            Field::new("ints", DataType::Int64, true),
            Field::new("plain", DataType::Int64, false),
            Field::new("strings", DataType::Utf8, false),
            Field::new("bools", DataType::Boolean, false),
            Field::new(
                "dict",
                DataType::Dictionary(Box::new(DataType::Int32), Box::new(DataType::Utf8)),
                false,
            ),
        ]));
        // Parts of uneven sizes, empty ones and slices among them, across table blocks.
        let mut parts = vec![];
        let mut start = 0;
        for (k, rows) in [700usize, 0, 1, 2500, 3, 0, 1300, 64, 2049].into_iter().enumerate() {
            let b = batch(&schema, start, rows + 5);
            parts.push(if k % 2 == 0 { b.slice(5, rows) } else { b.slice(0, rows) });
            start += rows as i64 + 5;
        }
        let whole = concat_batches(&schema, &parts).unwrap();
        let n = whole.num_rows() as u32;
        let perm: Vec<u32> = (0..n).map(|i| ((i as u64 * 7919 + 13) % n as u64) as u32).collect();
        for batch_rows in [1, 1000, 1 << 20] {
            let got = gather_parts(&schema, &parts, &perm, batch_rows).unwrap();
            assert!(got.iter().all(|b| b.num_rows() <= batch_rows));
            let got = concat_batches(&schema, &got).unwrap();
            let expected = take_record_batch(&whole, &UInt32Array::from(perm.clone())).unwrap();
            assert_eq!(got, expected, "batches of {batch_rows}");
        }
        assert!(gather_parts(&schema, &parts, &[n], 8).is_err());
        assert!(gather_parts(&schema, &parts, &[], 8).unwrap().is_empty());
    }
}
