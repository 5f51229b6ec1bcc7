//! Unit tests of the key encoder, type by type.

use std::cmp::Ordering;
use std::sync::Arc;

use arrow::array::*;
use arrow::compute::{LexicographicalComparator, SortColumn};
use arrow::datatypes::*;
use half::f16;

use super::*;
use crate::spec::SortKey;

fn key(k: &EncodedKeys, row: usize) -> Vec<u32> {
    k.words.iter().map(|w| w[row]).collect()
}

/// Encodes `cols` with every direction and null placement and checks, for every pair of
/// rows, that the key order agrees with Arrow's comparator: exactly for exact layouts,
/// and up to ties of truncated values otherwise.
fn check_columns(cols: Vec<ArrayRef>, opts: &EncoderOptions) -> Vec<KeyLayout> {
    let fields: Vec<Field> = cols
        .iter()
        .enumerate()
        .map(|(i, c)| Field::new(format!("c{i}"), c.data_type().clone(), true))
        .collect();
    let batch = RecordBatch::try_new(Arc::new(Schema::new(fields)), cols.clone()).unwrap();
    let mut layouts = vec![];
    for mask in 0..(1u32 << (2 * cols.len())) {
        let keys: Vec<SortKey> = (0..cols.len())
            .map(|i| SortKey::new(i, mask >> (2 * i) & 1 == 1, mask >> (2 * i + 1) & 1 == 1))
            .collect();
        let spec = SortSpec::new(keys.clone());
        let enc = KeyEncoder::try_new(&batch, &spec, opts).unwrap();
        let encoded = enc.encode();
        let sort_cols: Vec<SortColumn> = keys
            .iter()
            .map(|k| SortColumn {
                values: cols[k.column].clone(),
                options: Some(k.options),
            })
            .collect();
        let cmp = LexicographicalComparator::try_new(&sort_cols).unwrap();
        let exact = enc.layout().is_exact();
        for i in 0..batch.num_rows() {
            for j in 0..batch.num_rows() {
                let by_key = key(&encoded, i).cmp(&key(&encoded, j));
                let by_value = cmp.compare(i, j);
                if exact || by_key != Ordering::Equal {
                    assert_eq!(
                        by_key,
                        by_value,
                        "rows {i} and {j}, keys {keys:?}, layout {:?}",
                        enc.layout()
                    );
                }
            }
        }
        layouts.push(enc.layout().clone());
    }
    layouts
}

fn check(col: ArrayRef) -> Vec<KeyLayout> {
    check_columns(vec![col], &EncoderOptions::default())
}

#[test]
fn integers_with_extremes_and_nulls() {
    check(Arc::new(Int8Array::from(vec![
        Some(i8::MIN),
        None,
        Some(-1),
        Some(0),
        Some(i8::MAX),
        Some(0),
    ])));
    check(Arc::new(Int16Array::from(vec![
        Some(i16::MAX),
        Some(i16::MIN),
        None,
        Some(7),
    ])));
    check(Arc::new(Int32Array::from(vec![
        Some(i32::MIN),
        Some(i32::MAX),
        Some(-5),
        None,
        Some(-5),
    ])));
    check(Arc::new(Int64Array::from(vec![
        Some(i64::MIN),
        Some(i64::MAX),
        Some(0),
        None,
    ])));
    check(Arc::new(UInt8Array::from(vec![Some(0), Some(255), None, Some(17)])));
    check(Arc::new(UInt16Array::from(vec![Some(0), Some(u16::MAX), None])));
    check(Arc::new(UInt32Array::from(vec![
        Some(u32::MAX),
        Some(0),
        Some(1),
        None,
    ])));
    check(Arc::new(UInt64Array::from(vec![
        Some(u64::MAX),
        Some(0),
        None,
        Some(u64::MAX - 1),
    ])));
}

#[test]
fn integers_narrow_to_their_range() {
    let layouts = check(Arc::new(Int64Array::from(vec![1000, 1255, 1100, 1000])));
    assert!(layouts.iter().all(|l| l.total_bits() == 8), "{layouts:?}");
    // A null adds a one-bit flag.
    let layouts = check(Arc::new(Int64Array::from(vec![Some(1000), None, Some(1255)])));
    assert!(layouts.iter().all(|l| l.total_bits() == 9));
    // All equal: no bits; all null: no bits.
    let layouts = check(Arc::new(Int32Array::from(vec![7, 7, 7])));
    assert!(layouts.iter().all(|l| l.total_bits() == 0));
    let layouts = check(Arc::new(Int32Array::from(vec![None, None])));
    assert!(layouts.iter().all(|l| l.total_bits() == 0));
    // Full range of u64: 64 bits, 2 words.
    let layouts = check(Arc::new(UInt64Array::from(vec![0, u64::MAX])));
    assert!(layouts.iter().all(|l| l.total_bits() == 64 && l.num_words() == 2));
}

#[test]
fn floats_total_order() {
    let neg_nan = f64::from_bits(f64::NAN.to_bits() | (1 << 63));
    check(Arc::new(Float64Array::from(vec![
        Some(0.0),
        Some(-0.0),
        Some(f64::NAN),
        Some(f64::from_bits(0x7ff0_0000_0000_0001)), // signalling NaN, smallest payload
        Some(neg_nan),
        Some(f64::INFINITY),
        Some(f64::NEG_INFINITY),
        None,
        Some(f64::MIN_POSITIVE),
        Some(-1.5),
        Some(f64::MAX),
        Some(f64::MIN),
    ])));
    check(Arc::new(Float32Array::from(vec![
        Some(0.0f32),
        Some(-0.0),
        Some(f32::NAN),
        Some(f32::from_bits(0x7fff_ffff)),
        None,
        Some(f32::NEG_INFINITY),
        Some(1e-45),
    ])));
    check(Arc::new(Float16Array::from(vec![
        Some(f16::from_f32(0.0)),
        Some(f16::NEG_ZERO),
        Some(f16::NAN),
        Some(f16::INFINITY),
        None,
        Some(f16::from_f32(-2.5)),
    ])));
}

#[test]
fn decimals() {
    let d128 = Decimal128Array::from(vec![Some(i128::MIN), Some(i128::MAX), Some(0), None, Some(-1)])
        .with_precision_and_scale(38, 2)
        .unwrap();
    check(Arc::new(d128));
    let d256 = Decimal256Array::from(vec![
        Some(i256::MIN),
        Some(i256::MAX),
        Some(i256::ZERO),
        None,
        Some(i256::from_i128(i128::MIN)),
        Some(i256::from_i128(-7)),
    ]);
    check(Arc::new(d256));
    let d32 = Decimal32Array::from(vec![Some(-99999), Some(12), None])
        .with_precision_and_scale(9, 3)
        .unwrap();
    check(Arc::new(d32));
    let d64 = Decimal64Array::from(vec![Some(i64::MIN), Some(3), None]);
    check(Arc::new(d64));
}

#[test]
fn temporal_types() {
    check(Arc::new(Date32Array::from(vec![
        Some(-719162),
        Some(0),
        None,
        Some(19000),
    ])));
    check(Arc::new(Date64Array::from(vec![Some(i64::MIN), Some(0), None])));
    check(Arc::new(Time32SecondArray::from(vec![Some(86399), Some(0), None])));
    check(Arc::new(Time32MillisecondArray::from(vec![Some(5), Some(1), None])));
    check(Arc::new(Time64MicrosecondArray::from(vec![
        Some(5),
        Some(86_399_999_999),
        None,
    ])));
    check(Arc::new(Time64NanosecondArray::from(vec![Some(5), Some(1), None])));
    check(Arc::new(
        TimestampNanosecondArray::from(vec![Some(i64::MIN), Some(i64::MAX), None, Some(0)]).with_timezone("+02:00"),
    ));
    check(Arc::new(TimestampSecondArray::from(vec![Some(-1), Some(1), None])));
    check(Arc::new(DurationMillisecondArray::from(vec![Some(-1), Some(1), None])));
    check(Arc::new(IntervalYearMonthArray::from(vec![Some(-12), Some(13), None])));
    check(Arc::new(IntervalDayTimeArray::from(vec![
        Some(IntervalDayTime::new(1, -5)),
        Some(IntervalDayTime::new(-1, 5)),
        Some(IntervalDayTime::new(1, i32::MAX)),
        None,
        Some(IntervalDayTime::new(0, 0)),
    ])));
    check(Arc::new(IntervalMonthDayNanoArray::from(vec![
        Some(IntervalMonthDayNano::new(1, 0, -5)),
        Some(IntervalMonthDayNano::new(0, 31, 0)),
        Some(IntervalMonthDayNano::new(i32::MIN, i32::MIN, i64::MIN)),
        Some(IntervalMonthDayNano::new(i32::MAX, i32::MAX, i64::MAX)),
        None,
    ])));
}

#[test]
fn booleans_and_null_type() {
    let layouts = check(Arc::new(BooleanArray::from(vec![
        Some(true),
        None,
        Some(false),
        Some(true),
    ])));
    assert!(layouts.iter().all(|l| l.total_bits() == 2));
    let layouts = check(Arc::new(NullArray::new(4)));
    assert!(layouts.iter().all(|l| l.total_bits() == 0));
}

fn strings() -> Vec<Option<&'static str>> {
    vec![
        Some(""),
        Some("a"),
        Some("a\0"),
        Some("a\0\0"),
        None,
        Some("ab"),
        Some("abcdefghijklmnop"),
        Some("abcdefghijklmnoq"),
        Some("abcdefghijklmno"),
        Some("abcdefgh"),
        Some("b"),
        Some("\u{ff}"),
        Some("abcdefghijklmnop"),
        Some(""),
    ]
}

#[test]
fn strings_all_kinds() {
    check(Arc::new(StringArray::from(strings())));
    check(Arc::new(LargeStringArray::from(strings())));
    check(Arc::new(StringViewArray::from(strings())));
    let bin: Vec<Option<&[u8]>> = strings().iter().map(|s| s.map(|s| s.as_bytes())).collect();
    check(Arc::new(BinaryArray::from(bin.clone())));
    check(Arc::new(LargeBinaryArray::from(bin.clone())));
    check(Arc::new(BinaryViewArray::from(bin)));
    let fixed = FixedSizeBinaryArray::try_from_sparse_iter_with_size(
        vec![Some(b"abc"), None, Some(b"ab\0"), Some(b"\xff\0\0"), Some(b"abc")].into_iter(),
        3,
    )
    .unwrap();
    let layouts = check(Arc::new(fixed));
    assert!(layouts.iter().all(|l| l.is_exact()));
}

#[test]
fn strings_with_small_prefixes_tie_only_when_truncated() {
    for max_prefix_bytes in [0, 1, 2, 3, 8] {
        check_columns(
            vec![Arc::new(StringArray::from(strings()))],
            &EncoderOptions {
                max_prefix_bytes,
                ..Default::default()
            },
        );
    }
}

#[test]
fn shared_prefixes_are_skipped() {
    let vals: Vec<String> = (0..50)
        .map(|i| format!("https://example.com/item/{:04}", (i * 37) % 50))
        .collect();
    let col: ArrayRef = Arc::new(StringArray::from(vals));
    let layouts = check(col);
    for l in layouts {
        let f = &l.fields()[0];
        assert!(f.exact);
        assert_eq!(
            f.encoding,
            FieldEncoding::Bytes {
                common_prefix: 27, // "https://example.com/item/00"
                prefix_bytes: 2,
                len_min: 2,
                len_max: 2
            }
        );
        assert_eq!(f.bits(), 16);
    }
}

#[test]
fn dictionaries_sort_by_value() {
    let keys = Int32Array::from(vec![Some(0), Some(1), None, Some(2), Some(3), Some(1), Some(4)]);
    let values = StringArray::from(vec![Some("zeta"), Some("alpha"), Some("zeta"), None, Some("mid")]);
    let dict = DictionaryArray::try_new(keys, Arc::new(values)).unwrap();
    let layouts = check(Arc::new(dict));
    // 3 distinct non-null values: ranks 0..2 (2 bits) plus a null flag.
    assert!(layouts.iter().all(|l| l.total_bits() == 3), "{layouts:?}");
    let keys = UInt8Array::from(vec![2, 0, 1, 0]);
    let values = Float64Array::from(vec![1.5, -0.0, f64::NAN]);
    check(Arc::new(DictionaryArray::try_new(keys, Arc::new(values)).unwrap()));
}

#[test]
fn several_columns_concatenate() {
    let a: ArrayRef = Arc::new(Int32Array::from(vec![Some(1), Some(1), None, Some(2), Some(1), None]));
    let b: ArrayRef = Arc::new(StringArray::from(vec![
        Some("x"),
        Some("yy"),
        Some("x"),
        None,
        Some("x"),
        None,
    ]));
    let c: ArrayRef = Arc::new(Float64Array::from(vec![0.5, -1.0, 2.0, 2.0, f64::NAN, 0.5]));
    check_columns(vec![a, b, c], &EncoderOptions::default());
}

#[test]
fn nested_types_use_the_row_format() {
    let list = ListArray::from_iter_primitive::<Int32Type, _, _>(vec![
        Some(vec![Some(1), Some(2)]),
        Some(vec![]),
        None,
        Some(vec![Some(1)]),
        Some(vec![Some(1), None]),
        Some(vec![Some(0), Some(9), Some(9)]),
    ]);
    check(Arc::new(list));
    let st = StructArray::from(vec![
        (
            Arc::new(Field::new("x", DataType::Int32, true)),
            Arc::new(Int32Array::from(vec![Some(1), None, Some(1), Some(0)])) as ArrayRef,
        ),
        (
            Arc::new(Field::new("y", DataType::Utf8, true)),
            Arc::new(StringArray::from(vec![Some("b"), Some("a"), Some("a"), None])) as ArrayRef,
        ),
    ]);
    check(Arc::new(st));
}

#[test]
fn unsupported_types_name_the_column() {
    let values = ListArray::from_iter_primitive::<Int32Type, _, _>(vec![Some(vec![Some(1)])]);
    let dict = DictionaryArray::try_new(Int32Array::from(vec![0, 0]), Arc::new(values)).unwrap();
    let schema = Schema::new(vec![Field::new("weird", dict.data_type().clone(), true)]);
    let batch = RecordBatch::try_new(Arc::new(schema), vec![Arc::new(dict)]).unwrap();
    let err = KeyEncoder::try_new(
        &batch,
        &SortSpec::new([SortKey::sql(0, false)]),
        &EncoderOptions::default(),
    )
    .unwrap_err();
    let msg = err.to_string();
    assert!(msg.contains("weird") && msg.contains("Dictionary"), "{msg}");
}

#[test]
fn sliced_arrays_encode_their_own_rows() {
    let full = Int32Array::from((0..100).rev().collect::<Vec<i32>>());
    let sliced: ArrayRef = Arc::new(full.slice(10, 20));
    check(sliced);
    let s = StringArray::from(strings());
    check(Arc::new(s.slice(3, 8)));
}

#[test]
fn word_masks_cover_fields() {
    let a: ArrayRef = Arc::new(UInt64Array::from(vec![0, u64::MAX]));
    let b: ArrayRef = Arc::new(UInt8Array::from(vec![0, 15]));
    let schema = Schema::new(vec![
        Field::new("a", DataType::UInt64, false),
        Field::new("b", DataType::UInt8, false),
    ]);
    let batch = RecordBatch::try_new(Arc::new(schema), vec![a, b]).unwrap();
    let spec = SortSpec::new([SortKey::sql(0, false), SortKey::sql(1, false)]);
    let enc = KeyEncoder::try_new(&batch, &spec, &EncoderOptions::default()).unwrap();
    let l = enc.layout();
    assert_eq!((l.total_bits(), l.num_words(), l.pad()), (68, 3, 28));
    assert_eq!(l.word_mask_through(0, 0), u32::MAX); // padding bits are zero anyway
    assert_eq!(l.word_mask_through(0, 1), u32::MAX);
    assert_eq!(l.word_mask_through(0, 2), 0xFFFF_FFF0);
    assert_eq!(l.word_mask_through(1, 2), u32::MAX);
}

#[test]
fn sortable_types_are_reported() {
    use arrow::datatypes::{DataType, Field};
    assert!(super::is_sortable(&DataType::Utf8View));
    assert!(super::is_sortable(&DataType::Dictionary(
        Box::new(DataType::Int8),
        Box::new(DataType::Utf8)
    )));
    assert!(super::is_sortable(&DataType::List(Arc::new(Field::new(
        "x",
        DataType::Int32,
        true
    )))));
    // Maps go through Arrow's row format like the other nested types.
    assert!(super::is_sortable(&DataType::Map(
        Arc::new(Field::new(
            "entries",
            DataType::Struct(
                vec![
                    Field::new("k", DataType::Utf8, false),
                    Field::new("v", DataType::Int32, true)
                ]
                .into()
            ),
            false
        )),
        false
    )));
    // Dictionaries of nested values have neither a radix encoding nor a row encoding.
    assert!(!super::is_sortable(&DataType::Dictionary(
        Box::new(DataType::Int32),
        Box::new(DataType::List(Arc::new(Field::new("x", DataType::Int32, true))))
    )));
}

#[test]
fn encode_into_recycled_memory_matches_encode_and_finds_the_varying_bits() {
    // Three chunks of rows, a multi-word key, nulls; one column constant in its high bits.
    let n = 3 * super::CHUNK + 77;
    let a: ArrayRef = Arc::new(Int64Array::from_iter(
        (0..n).map(|i| (i % 11 != 0).then_some((i as i64 % 1000) << 20)),
    ));
    let b: ArrayRef = Arc::new(StringArray::from_iter_values((0..n).map(|i| format!("k{}", i % 5000))));
    let c: ArrayRef = Arc::new(UInt8Array::from_iter_values((0..n).map(|_| 9)));
    let batch = RecordBatch::try_new(
        Arc::new(Schema::new(vec![
            Field::new("a", DataType::Int64, true),
            Field::new("b", DataType::Utf8, false),
            Field::new("c", DataType::UInt8, false),
        ])),
        vec![a, b, c],
    )
    .unwrap();
    let spec = SortSpec::new([
        SortKey::new(0, true, false),
        SortKey::new(1, false, true),
        SortKey::sql(2, false),
    ]);
    let enc = KeyEncoder::try_new(&batch, &spec, &EncoderOptions::default()).unwrap();
    let want = enc.encode();
    assert!(want.words.len() >= 2);
    // Destinations full of garbage and longer than the rows.
    let mut dirty: Vec<Vec<u32>> = (0..want.words.len())
        .map(|w| vec![0xA5A5_0000 | w as u32; n + 9])
        .collect();
    let mut views: Vec<&mut [u32]> = dirty.iter_mut().map(|w| &mut w[..]).collect();
    let varying = enc.encode_into(&mut views);
    for (w, (got, want)) in dirty.iter().zip(&want.words).enumerate() {
        assert!(got[..n] == want[..], "word {w}");
    }
    assert_eq!(varying, crate::plan::varying_bits(&want.words));
    assert!(varying.iter().any(|v| *v != 0));
    // One row: nothing varies.
    let one = batch.slice(5, 1);
    let enc = KeyEncoder::try_new(&one, &spec, &EncoderOptions::default()).unwrap();
    let mut words = vec![vec![u32::MAX; 1]; enc.layout().num_words()];
    let mut views: Vec<&mut [u32]> = words.iter_mut().map(|w| &mut w[..]).collect();
    assert!(enc.encode_into(&mut views).iter().all(|v| *v == 0));
    assert_eq!(words, enc.encode().words);
}

/// Native columns of every native kind: with and without nulls, all null, one value, ranges
/// that need every bit of the type.
fn native_columns() -> Vec<ArrayRef> {
    vec![
        Arc::new(Int8Array::from(vec![Some(-3), None, Some(i8::MAX), Some(i8::MIN)])),
        Arc::new(Int16Array::from(vec![Some(7), Some(7), Some(7), Some(7)])),
        Arc::new(Int32Array::from(vec![None, Some(-1), None, Some(1 << 20)])),
        Arc::new(Int64Array::from(vec![i64::MIN, 0, i64::MAX, -1])),
        Arc::new(UInt8Array::from(vec![None, None, None, None])),
        Arc::new(UInt16Array::from(vec![1, 2, 3, 4])),
        Arc::new(UInt32Array::from(vec![Some(u32::MAX), Some(0), None, Some(5)])),
        Arc::new(UInt64Array::from(vec![u64::MAX, 0, 1, 2])),
        Arc::new(Float16Array::from(vec![
            f16::NAN,
            f16::NEG_INFINITY,
            f16::ZERO,
            f16::ONE,
        ])),
        Arc::new(Float32Array::from(vec![Some(-0.0), Some(0.0), None, Some(f32::NAN)])),
        Arc::new(Float64Array::from(vec![
            -1.5,
            f64::INFINITY,
            f64::MIN_POSITIVE,
            -f64::NAN,
        ])),
        Arc::new(Date32Array::from(vec![Some(19000), None, Some(-5), Some(19001)])),
        Arc::new(TimestampNanosecondArray::from(vec![1, 2, 3, i64::MAX])),
        Arc::new(
            Decimal64Array::from(vec![10, -20, 30, 40])
                .with_precision_and_scale(18, 2)
                .unwrap(),
        ),
    ]
}

#[test]
fn layouts_from_native_statistics_match_the_encoder() {
    let cols = native_columns();
    let fields: Vec<Field> = cols
        .iter()
        .enumerate()
        .map(|(i, c)| Field::new(format!("c{i}"), c.data_type().clone(), true))
        .collect();
    let schema = Arc::new(Schema::new(fields));
    let batch = RecordBatch::try_new(Arc::clone(&schema), cols.clone()).unwrap();
    // Every column alone, and runs of three (fields that straddle words), in both directions
    // and null placements.
    check_native_layouts(&batch, &cols);
    // No rows at all.
    let empty: Vec<ArrayRef> = cols.iter().map(|c| c.slice(0, 0)).collect();
    check_native_layouts(&RecordBatch::try_new(schema, empty.clone()).unwrap(), &empty);
}

fn check_native_layouts(batch: &RecordBatch, cols: &[ArrayRef]) {
    let schema = batch.schema();
    let mut specs: Vec<Vec<usize>> = (0..cols.len()).map(|c| vec![c]).collect();
    specs.extend((0..cols.len() - 2).map(|c| vec![c, c + 1, c + 2]));
    specs.push((0..cols.len()).rev().collect());
    for columns in specs {
        for mask in 0..4u32 {
            let spec = SortSpec::new(columns.iter().map(|&c| SortKey::new(c, mask & 1 == 1, mask & 2 == 2)));
            let layout = KeyEncoder::try_new(batch, &spec, &EncoderOptions::default())
                .unwrap()
                .layout()
                .clone();
            // The statistics a device would gather: counts from the column, bounds from the
            // encoder's own analysis.
            let stats: Vec<NativeColumnStats> = columns
                .iter()
                .zip(layout.fields())
                .map(|(&c, f)| {
                    let col = &cols[c];
                    let bounds = match &f.encoding {
                        FieldEncoding::Ordinal { min, max, .. } => {
                            (col.len() > col.null_count()).then_some((min.lo as u64, max.lo as u64))
                        }
                        FieldEncoding::Constant => None,
                        other => panic!("column {c}: {other:?}"),
                    };
                    NativeColumnStats {
                        kind: native_ordinal_kind(col.data_type()).unwrap(),
                        rows: col.len(),
                        valid_rows: col.len() - col.null_count(),
                        bounds,
                    }
                })
                .collect();
            assert_eq!(
                KeyLayout::from_native_stats(&spec, &stats).unwrap(),
                layout,
                "{columns:?} {mask}"
            );
            let max_words = KeyLayout::native_max_words(&spec, &schema).unwrap();
            assert!(
                layout.num_words() <= max_words,
                "{columns:?}: {layout:?} > {max_words} words"
            );
        }
    }
}

#[test]
fn native_kinds_agree_with_the_encoder() {
    for col in native_columns() {
        let kind = native_ordinal_kind(col.data_type()).unwrap();
        let field = build_field("c", &col, SortOptions::default(), &EncoderOptions::default()).unwrap();
        if let FieldEncoding::Ordinal { kind: k, .. } = field.encoder.encoding() {
            assert_eq!(k, kind, "{}", col.data_type());
        }
        let width = kind.native_width().unwrap() as usize;
        assert_eq!(Some(width), col.data_type().primitive_width(), "{}", col.data_type());
    }
    for t in [
        DataType::Boolean,
        DataType::Utf8,
        DataType::Decimal128(10, 2),
        DataType::Interval(IntervalUnit::DayTime),
        DataType::Dictionary(Box::new(DataType::Int32), Box::new(DataType::Utf8)),
    ] {
        assert_eq!(native_ordinal_kind(&t), None, "{t}");
    }
    let spec = SortSpec::new([SortKey::new(0, false, false)]);
    let schema = Schema::new(vec![Field::new("s", DataType::Utf8, true)]);
    assert_eq!(KeyLayout::native_max_words(&spec, &schema), None);
}

/// String and binary columns for the statistics tests: views inline and out of line, offsets,
/// nulls, all null, all equal, empty strings, long shared prefixes and embedded zero bytes.
fn byte_columns() -> Vec<ArrayRef> {
    let long = "https://example.com/a/very/long/shared/path/of/sixty/bytes/";
    let strings: Vec<Option<String>> = (0..300)
        .map(|i| match i % 7 {
            0 => None,
            1 => Some(String::new()),
            2 => Some(format!("{long}{i}")),
            3 => Some(format!("{long}{}", i * 31 % 17)),
            4 => Some(format!("s{i}")),
            5 => Some(format!("{long}\0{i}")),
            _ => Some("short".into()),
        })
        .collect();
    let shared: Vec<Option<String>> = (0..200).map(|i| Some(format!("{long}{}", i % 13))).collect();
    vec![
        Arc::new(StringViewArray::from_iter(strings.iter().map(|s| s.as_deref()))),
        Arc::new(StringArray::from_iter(strings.iter().map(|s| s.as_deref()))),
        Arc::new(BinaryViewArray::from_iter(
            strings.iter().map(|s| s.as_deref().map(str::as_bytes)),
        )),
        Arc::new(StringViewArray::from_iter(shared.iter().map(|s| s.as_deref()))),
        Arc::new(StringViewArray::from_iter((0..100).map(|_| Some("same")))),
        Arc::new(StringViewArray::from_iter((0..100).map(|_| None::<&str>))),
        Arc::new(StringViewArray::from_iter((0..100).map(|i| (i % 2 == 0).then_some("")))),
    ]
}

/// The layout laid out from statistics gathered over a string column's parts (as a GPU sort
/// holds its batches) is the encoder's own, for every prefix length and direction.
#[test]
fn bytes_stats_lay_out_the_encoders_field() {
    for col in byte_columns() {
        let schema = Arc::new(Schema::new(vec![Field::new("s", col.data_type().clone(), true)]));
        let batch = RecordBatch::try_new(schema, vec![Arc::clone(&col)]).unwrap();
        // The column cut into parts of several sizes, one of them empty.
        let cuts = [0, 0, 1, 37, 100, col.len()];
        let parts: Vec<ArrayRef> = cuts
            .windows(2)
            .map(|w| col.slice(w[0].min(col.len()), w[1].min(col.len()) - w[0].min(col.len())))
            .collect();
        let refs: Vec<&dyn Array> = parts.iter().map(|p| p.as_ref()).collect();
        let stats = bytes_column_stats(&refs).unwrap();
        assert_eq!(stats.rows, col.len());
        assert_eq!(stats.valid_rows, col.len() - col.null_count());
        let longest = stats.max_len - stats.common_prefix;
        for (max_prefix_bytes, whole_values_up_to) in
            [(0, 0), (1, 0), (4, 0), (8, 0), (32, 0), (100, 0), (1, 64), (4, 3)]
        {
            let opts = EncoderOptions {
                max_prefix_bytes,
                whole_values_up_to,
            };
            // Whole values where the longest fits; else the prefix.
            assert_eq!(
                opts.prefix_bytes(longest),
                if longest <= whole_values_up_to {
                    longest
                } else {
                    longest.min(max_prefix_bytes)
                }
            );
            if stats.valid_rows > 0 && longest <= whole_values_up_to {
                assert!(
                    stats.is_exact(&opts),
                    "{} whole up to {whole_values_up_to}",
                    col.data_type()
                );
            }
            for mask in 0..4u32 {
                let spec = SortSpec::new([SortKey::new(0, mask & 1 == 1, mask & 2 == 2)]);
                let layout = KeyEncoder::try_new(&batch, &spec, &opts).unwrap().layout().clone();
                let from_stats = KeyLayout::from_column_stats(&spec, &[ColumnStats::Bytes(stats)], &opts).unwrap();
                assert_eq!(
                    from_stats,
                    layout,
                    "{} prefix {max_prefix_bytes} mask {mask}",
                    col.data_type()
                );
                assert_eq!(
                    stats.is_exact(&opts),
                    layout.is_exact(),
                    "{} prefix {max_prefix_bytes}",
                    col.data_type()
                );
                if matches!(col.data_type(), DataType::Utf8View | DataType::BinaryView) {
                    let schema = batch.schema();
                    let narrow = opts.without_whole_values();
                    let narrow_layout =
                        KeyLayout::from_column_stats(&spec, &[ColumnStats::Bytes(stats)], &narrow).unwrap();
                    let most = KeyLayout::device_max_words(&spec, schema.as_ref(), &opts).unwrap();
                    assert!(narrow_layout.num_words() <= most, "{narrow_layout:?} > {most} words");
                    let words = KeyLayout::device_words(&spec, schema.as_ref(), &opts, &[Some(stats)]).unwrap();
                    assert!(layout.num_words() <= words, "{layout:?} > {words} words");
                    assert!(words <= layout.num_words() + 1, "{words} words bound {layout:?}");
                }
            }
        }
    }
    assert!(bytes_column_stats(&[&Int32Array::from(vec![1]) as &dyn Array]).is_err());
}
