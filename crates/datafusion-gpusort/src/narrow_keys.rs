//! Decimal sort keys narrowed for the GPU: a key column of 16-byte decimals of up to 18 digits
//! (`Decimal128(p <= 18, s)`, what DataFusion reads from Parquet's INT64 decimals) sorts on the
//! GPU through an appended copy of it as 8-byte decimals (`Decimal64(p, s)`, the same values).
//!
//! Why: a GPU session encodes the key on the device only when every sort column is a native
//! integer or float, or a string view (`gpusort::keys::native_ordinal_kind`); a 16-byte
//! decimal is neither, and one such column sends the whole key to the host encoder, which
//! concatenates the key columns after the input and encodes them while the last uploads wait.
//! On TPC-H lineitem SF10 (`ORDER BY l_returnflag, l_linestatus, l_extendedprice DESC,
//! l_orderkey, l_linenumber`) that took 0.43 s of 16 cores; the key encoded on the device,
//! ~0.05 s (stop 42). The copy costs a cast as each batch arrives and 8 bytes a row more to
//! upload; the decimal itself still moves as a payload column, and the copy is dropped from
//! the output as every appended key column is.
//!
//! Only where every other sort column is one the device encodes: else the host encodes the
//! key anyway, and the copy would be for nothing.

use std::sync::Arc;

use arrow::array::{Array, ArrayRef, AsArray, Decimal64Array};
use arrow::datatypes::{DataType, Decimal128Type};
use arrow::error::ArrowError;
use gpusort::keys::native_ordinal_kind;

/// Whether a sort over key columns of `key_types` narrows its decimal keys for the GPU: some
/// key is a decimal [`narrows`] takes, and every key is such a decimal, a native type or a
/// string or binary view.
pub(crate) fn narrows_keys<'a>(key_types: impl IntoIterator<Item = &'a DataType> + Clone) -> bool {
    let device = |t: &DataType| {
        narrows(t) || native_ordinal_kind(t).is_some() || matches!(t, DataType::Utf8View | DataType::BinaryView)
    };
    key_types.clone().into_iter().any(narrows) && key_types.into_iter().all(device)
}

/// Whether a key column of `data_type` is narrowed: 16-byte decimals of up to 18 digits.
pub(crate) fn narrows(data_type: &DataType) -> bool {
    matches!(data_type, DataType::Decimal128(p, _) if *p <= 18)
}

/// `array` (16-byte decimals of up to 18 digits) as 8-byte decimals; fails on a value that is
/// not within 64 bits (a value outside its precision, which Arrow does not check everywhere).
pub(crate) fn narrow_decimal(array: &dyn Array) -> Result<ArrayRef, ArrowError> {
    let DataType::Decimal128(precision, scale) = *array.data_type() else {
        return Err(ArrowError::InvalidArgumentError(format!(
            "narrowing a {} column as a decimal",
            array.data_type()
        )));
    };
    let values = array.as_primitive::<Decimal128Type>();
    let narrow: Decimal64Array = values.try_unary(|v| {
        i64::try_from(v).map_err(|_| {
            ArrowError::InvalidArgumentError(format!(
                "the decimal({precision}, {scale}) value {v} does not fit in 64 bits"
            ))
        })
    })?;
    Ok(Arc::new(narrow.with_precision_and_scale(precision, scale)?))
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::{Decimal64Array, Decimal128Array};

    #[test]
    fn keys_narrow_only_where_the_device_encodes_the_rest() {
        let d = DataType::Decimal128(15, 2);
        let wide = DataType::Decimal128(20, 2);
        assert!(narrows_keys([&d, &DataType::Utf8View, &DataType::Int64]));
        assert!(!narrows_keys([&DataType::Utf8View, &DataType::Int64]), "no decimal");
        assert!(
            !narrows_keys([&d, &DataType::Utf8]),
            "strings: the host encodes the key"
        );
        assert!(!narrows_keys([&d, &wide]), "a wide decimal: the host encodes the key");
        assert!(!narrows(&wide) && !narrows(&DataType::Decimal64(15, 2)));
    }

    #[test]
    fn decimals_narrow_with_their_nulls_or_fail_out_of_range() {
        let a = Decimal128Array::from(vec![Some(-5), None, Some(i64::MAX as i128), Some(i64::MIN as i128)])
            .with_precision_and_scale(18, 3)
            .unwrap();
        let n = narrow_decimal(&a).unwrap();
        let want = Decimal64Array::from(vec![Some(-5), None, Some(i64::MAX), Some(i64::MIN)])
            .with_precision_and_scale(18, 3)
            .unwrap();
        assert_eq!(n.as_primitive::<arrow::datatypes::Decimal64Type>(), &want);
        let over = Decimal128Array::from(vec![Some(1), Some(i64::MAX as i128 + 1)])
            .with_precision_and_scale(18, 0)
            .unwrap();
        assert!(
            narrow_decimal(&over)
                .unwrap_err()
                .to_string()
                .contains("does not fit in 64 bits")
        );
        // A null slot's value is never read.
        let hidden = Decimal128Array::new(
            vec![1i128, i128::MAX].into(),
            Some(arrow::buffer::NullBuffer::from(vec![true, false])),
        )
        .with_precision_and_scale(18, 0)
        .unwrap();
        assert_eq!(narrow_decimal(&hidden).unwrap().null_count(), 1);
    }
}
