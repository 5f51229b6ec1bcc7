//! Hollow columns: an array of the same type and length as another that holds none of its
//! values. Fixed-width columns become zeros sliced from one buffer the process shares; a
//! string or binary view column keeps its data buffers (which sorted views still index) and
//! loses its views (zeros: empty values).
//!
//! A GPU sort whose rows have gone up to the device has no more use for the host's copy of
//! most columns. Holding them until the sort ends makes every byte of decoded input a byte of
//! memory the kernel hands out fresh and zeroes (stop 42 counted ~14 GB touched for the first
//! time while reading TPC-H lineitem SF10, a quarter of the reading's CPU time). Batches whose
//! uploaded columns are hollow keep their schema, their row count and the columns the host
//! still reads, while the memory of the others goes back to the allocator for the next
//! batches. Nothing may read a hollow column's values: whoever hollows a column gives up the
//! rows' fallback to the CPU.

use std::sync::{Arc, Mutex};

use arrow::array::{Array, ArrayData, ArrayRef, AsArray, BinaryViewArray, RecordBatch, StringViewArray, make_array};
use arrow::buffer::{Buffer, MutableBuffer, ScalarBuffer};
use arrow::datatypes::DataType;

/// The zeros hollow columns slice (grown to the largest asked for; never written).
static ZEROS: Mutex<Option<Buffer>> = Mutex::new(None);

/// The smallest shared buffer of zeros: a batch of 8,192 rows of 16-byte values.
const MIN_ZEROS: usize = 1 << 17;

/// `len` zero bytes, shared.
fn zeros(len: usize) -> Buffer {
    let mut shared = ZEROS.lock().unwrap_or_else(|e| e.into_inner());
    let buffer = match shared.as_ref() {
        Some(b) if b.len() >= len => b,
        _ => shared.insert(MutableBuffer::from_len_zeroed(len.max(MIN_ZEROS).next_power_of_two()).into()),
    };
    buffer.slice_with_length(0, len)
}

/// Bytes per value of the fixed-width types hollowed (`None` for the others).
fn fixed_width(data_type: &DataType) -> Option<usize> {
    match data_type {
        DataType::FixedSizeBinary(w) => usize::try_from(*w).ok(),
        t if t.is_primitive() => t.primitive_width(),
        _ => None,
    }
}

/// `array` hollow (see the module docs), or `None` for a type this does not hollow (booleans,
/// offsets, dictionaries, nested types).
pub fn hollow_column(array: &ArrayRef) -> Option<ArrayRef> {
    let n = array.len();
    let views = || ScalarBuffer::new(zeros(16 * n), 0, n);
    match array.data_type() {
        DataType::Utf8View => {
            let (_, data, _) = array.as_string_view().clone().into_parts();
            // SAFETY: zero views are empty inline values; they index no data buffer.
            Some(Arc::new(unsafe { StringViewArray::new_unchecked(views(), data, None) }))
        }
        DataType::BinaryView => {
            let (_, data, _) = array.as_binary_view().clone().into_parts();
            // SAFETY: as above.
            Some(Arc::new(unsafe { BinaryViewArray::new_unchecked(views(), data, None) }))
        }
        t => {
            let width = fixed_width(t)?;
            let data = ArrayData::builder(t.clone()).len(n).add_buffer(zeros(width * n));
            data.build().ok().map(make_array)
        }
    }
}

/// The bytes `hollow_column` frees of `array` when nothing else holds them: its values (a view
/// column's views) and its validity.
pub fn hollowed_bytes(array: &dyn Array) -> usize {
    let nulls = array.nulls().map_or(0, |n| n.buffer().capacity());
    match array.data_type() {
        DataType::Utf8View | DataType::BinaryView => 16 * array.len() + nulls,
        t => fixed_width(t).map_or(0, |w| w * array.len() + nulls),
    }
}

/// `batch` with its `columns` hollow (those of a type [`hollow_column`] takes; the others as
/// they are), and the bytes that frees.
pub fn hollow_batch(batch: &RecordBatch, columns: &[usize]) -> (RecordBatch, usize) {
    let mut arrays = batch.columns().to_vec();
    let mut freed = 0;
    for &c in columns {
        if let Some(hollow) = hollow_column(&arrays[c]) {
            freed += hollowed_bytes(arrays[c].as_ref());
            arrays[c] = hollow;
        }
    }
    // The same schema, types and lengths: the batch stays valid.
    let hollow = RecordBatch::try_new_with_options(
        batch.schema(),
        arrays,
        &arrow::array::RecordBatchOptions::new().with_row_count(Some(batch.num_rows())),
    )
    .expect("hollow columns keep their types and lengths");
    (hollow, freed)
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::{Date32Array, Decimal128Array, FixedSizeBinaryArray, Int64Array, StringArray, UInt8Array};
    use arrow::datatypes::{Field, Schema};

    fn long(i: usize) -> String {
        format!("a value longer than twelve bytes, number {i}")
    }

    #[test]
    fn hollow_columns_keep_type_and_length_and_hold_zeros() {
        let n = 1000;
        let ints: ArrayRef = Arc::new(Int64Array::from_iter((0..n as i64).map(|i| (i % 3 != 0).then_some(i))));
        let dates: ArrayRef = Arc::new(Date32Array::from_iter_values(0..n as i32));
        let decimals: ArrayRef = Arc::new(
            Decimal128Array::from_iter_values((0..n as i128).map(|i| i * 7))
                .with_precision_and_scale(20, 2)
                .unwrap(),
        );
        let fixed: ArrayRef = Arc::new(FixedSizeBinaryArray::try_from_iter((0..n).map(|i| [i as u8, 1, 2])).unwrap());
        for array in [&ints, &dates, &decimals, &fixed] {
            let hollow = hollow_column(array).expect("a fixed-width column hollows");
            assert_eq!(hollow.data_type(), array.data_type());
            assert_eq!(hollow.len(), n);
            assert_eq!(hollow.null_count(), 0);
            hollow.to_data().validate_full().unwrap();
            assert!(hollow.to_data().buffers()[0].as_slice().iter().all(|&b| b == 0));
        }
        assert_eq!(
            hollowed_bytes(ints.as_ref()),
            8 * n + ints.nulls().unwrap().buffer().capacity()
        );
        // Offsets and nested types stay as they are.
        let strings: ArrayRef = Arc::new(StringArray::from(vec!["x"; 4]));
        assert!(hollow_column(&strings).is_none());
        assert_eq!(hollowed_bytes(strings.as_ref()), 0);
    }

    #[test]
    fn hollow_views_keep_their_data_buffers() {
        let views: ArrayRef = Arc::new(StringViewArray::from_iter_values((0..300).map(long)));
        let hollow = hollow_column(&views).unwrap();
        let (a, b) = (views.as_string_view(), hollow.as_string_view());
        assert!(!b.data_buffers().is_empty());
        // The very list of buffers: a sort's output views index it.
        assert!(std::ptr::eq(a.data_buffers().as_ptr(), b.data_buffers().as_ptr()));
        assert!(b.iter().all(|v| v == Some("")));
        hollow.to_data().validate_full().unwrap();
        assert_eq!(hollowed_bytes(views.as_ref()), 16 * 300);
    }

    #[test]
    fn a_hollow_batch_keeps_the_columns_not_named_and_the_types_not_taken() {
        let schema = Arc::new(Schema::new(vec![
            Field::new("k", DataType::Int64, false),
            Field::new("v", DataType::UInt8, false),
            Field::new("s", DataType::Utf8, false),
        ]));
        let batch = RecordBatch::try_new(
            schema,
            vec![
                Arc::new(Int64Array::from_iter_values(0..50)),
                Arc::new(UInt8Array::from_iter_values(0..50)),
                Arc::new(StringArray::from_iter_values((0..50).map(long))),
            ],
        )
        .unwrap();
        let (hollow, freed) = hollow_batch(&batch, &[1, 2]);
        assert_eq!(freed, 50);
        assert_eq!(hollow.num_rows(), 50);
        assert_eq!(hollow.schema(), batch.schema());
        assert!(Arc::ptr_eq(hollow.column(0), batch.column(0)));
        assert!(
            hollow
                .column(1)
                .as_primitive::<arrow::datatypes::UInt8Type>()
                .values()
                .iter()
                .all(|&v| v == 0)
        );
        assert!(Arc::ptr_eq(hollow.column(2), batch.column(2)));
        // A larger batch grows the shared zeros.
        let big: ArrayRef = Arc::new(Int64Array::from_iter_values(0..(MIN_ZEROS as i64)));
        assert_eq!(hollow_column(&big).unwrap().len(), MIN_ZEROS);
    }
}
