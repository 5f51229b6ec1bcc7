//! Unit tests of the CPU backend (the differential fuzz test is in `tests/`).

use std::sync::Arc;

use arrow::array::*;
use arrow::compute::lexsort_to_indices;
use arrow::datatypes::{DataType, Field, Schema};

use super::*;
use crate::keys::EncoderOptions;
use crate::plan::Strategy;
use crate::spec::{SortKey, SortSpec};

fn batch(cols: Vec<ArrayRef>) -> RecordBatch {
    let fields: Vec<Field> = cols
        .iter()
        .enumerate()
        .map(|(i, c)| Field::new(format!("c{i}"), c.data_type().clone(), true))
        .collect();
    RecordBatch::try_new(Arc::new(Schema::new(fields)), cols).unwrap()
}

/// Stable reference: lexsort, then ties broken by input row.
fn reference(b: &RecordBatch, spec: &SortSpec) -> Vec<u32> {
    let cols = spec.to_sort_columns(b);
    let cmp = arrow::compute::LexicographicalComparator::try_new(&cols).unwrap();
    let mut idx: Vec<u32> = (0..b.num_rows() as u32).collect();
    idx.sort_by(|&x, &y| cmp.compare(x as usize, y as usize).then(x.cmp(&y)));
    let unstable = lexsort_to_indices(&cols, None).unwrap();
    // lexsort agrees up to the order of equal rows.
    for (a, r) in unstable.values().iter().zip(&idx) {
        assert!(cmp.compare(*a as usize, *r as usize).is_eq());
    }
    idx
}

/// `b` sorted by `spec` on the CPU backend with `strategy` and string prefixes of
/// `max_prefix_bytes`.
fn sort_with(b: &RecordBatch, spec: &SortSpec, strategy: Strategy, max_prefix_bytes: usize) -> SortOutput {
    CpuBackend::new()
        .sort(
            &SortRequest::new(b, spec)
                .with_strategy(Some(strategy))
                .with_encoder_options(EncoderOptions {
                    max_prefix_bytes,
                    ..Default::default()
                }),
        )
        .unwrap()
}

fn check_all_strategies(b: &RecordBatch, spec: &SortSpec, backend: &CpuBackend) {
    let want = reference(b, spec);
    for strategy in Strategy::ALL {
        for limit in [None, Some(0), Some(1), Some(b.num_rows() / 2), Some(b.num_rows() + 3)] {
            let out = backend
                .sort(
                    &SortRequest::new(b, spec)
                        .with_strategy(Some(strategy))
                        .with_limit(limit),
                )
                .unwrap();
            let k = limit.unwrap_or(usize::MAX).min(b.num_rows());
            assert_eq!(out.indices.values(), &want[..k], "{strategy} limit {limit:?}");
            let idx = UInt32Array::from(want[..k].to_vec());
            for (c, col) in out.batch.columns().iter().enumerate() {
                let expected = arrow::compute::take(b.column(c).as_ref(), &idx, None).unwrap();
                assert_eq!(col.to_data(), expected.to_data(), "column {c} with {strategy}");
            }
        }
    }
}

#[test]
fn empty_and_tiny_inputs() {
    let backend = CpuBackend::new();
    for n in [0usize, 1, 2] {
        let b = batch(vec![
            Arc::new(Int32Array::from_iter_values((0..n as i32).rev())),
            Arc::new(StringArray::from_iter_values((0..n).map(|i| format!("v{i}")))),
        ]);
        check_all_strategies(&b, &SortSpec::new([SortKey::sql(0, false)]), &backend);
    }
}

#[test]
fn nullable_payload_moves_with_its_validity() {
    let n = 100_000;
    let b = batch(vec![
        Arc::new(UInt32Array::from_iter_values(
            (0..n).map(|i| (i as u32).wrapping_mul(2654435761) % 1000),
        )),
        Arc::new(Int64Array::from_iter((0..n).map(|i| (i % 3 != 0).then_some(i as i64)))),
        Arc::new(Float32Array::from_iter(
            (0..n).map(|i| (i % 5 != 0).then_some(i as f32)),
        )),
        Arc::new(BooleanArray::from_iter(
            (0..n).map(|i| (i % 7 != 0).then_some(i % 2 == 0)),
        )),
        Arc::new(StringArray::from_iter(
            (0..n).map(|i| (i % 11 != 0).then(|| format!("{i}"))),
        )),
    ]);
    check_all_strategies(&b, &SortSpec::new([SortKey::sql(0, false)]), &CpuBackend::new());
    check_all_strategies(
        &b,
        &SortSpec::new([SortKey::sql(1, true), SortKey::sql(0, false)]),
        &CpuBackend::new().with_digit_bits(11).unwrap(),
    );
}

#[test]
fn truncated_strings_resolve_in_both_strategies() {
    let n = 50_000;
    let words = ["common-prefix-alpha", "common-prefix-beta", "common-prefix-al", "c"];
    let b = batch(vec![
        Arc::new(StringArray::from_iter((0..n).map(|i| {
            (i % 13 != 0).then(|| format!("{}{}", words[i % 4], (i * 7919) % 97))
        }))),
        Arc::new(Int32Array::from_iter_values((0..n as i32).map(|i| i % 10))),
        Arc::new(UInt64Array::from_iter(
            (0..n).map(|i| (i % 17 != 0).then_some(i as u64)),
        )),
    ]);
    for max_prefix_bytes in [0, 2, 8] {
        let spec = SortSpec::new([SortKey::new(0, false, true), SortKey::sql(1, true)]);
        let want = reference(&b, &spec);
        for strategy in Strategy::ALL {
            let out = sort_with(&b, &spec, strategy, max_prefix_bytes);
            assert_eq!(out.indices.values(), &want[..]);
            let idx = UInt32Array::from(want.clone());
            for (c, col) in out.batch.columns().iter().enumerate() {
                let expected = arrow::compute::take(b.column(c).as_ref(), &idx, None).unwrap();
                assert_eq!(col.to_data(), expected.to_data(), "column {c}");
            }
            assert!(out.stats.tie_groups > 0 || max_prefix_bytes == 8);
        }
    }
}

#[test]
fn small_limits_sort_only_candidates() {
    let n = 200_000u32;
    let b = batch(vec![
        Arc::new(UInt32Array::from_iter_values(
            (0..n).map(|i| i.wrapping_mul(2654435761)),
        )),
        Arc::new(UInt32Array::from_iter_values(0..n)),
    ]);
    let spec = SortSpec::new([SortKey::sql(0, true)]);
    let want = reference(&b, &spec);
    for limit in [1usize, 10, 1000, 20_000] {
        let out = CpuBackend::new()
            .sort(&SortRequest::new(&b, &spec).with_limit(Some(limit)))
            .unwrap();
        assert_eq!(out.indices.values(), &want[..limit]);
        assert_eq!(out.batch.num_rows(), limit);
    }
}

#[test]
fn dedicated_pool_and_digit_width_errors() {
    let backend = CpuBackend::new().with_threads(3).unwrap();
    let b = batch(vec![Arc::new(Int16Array::from_iter_values(
        (0..100_000).map(|i| (i * 37 % 1000) as i16),
    ))]);
    check_all_strategies(&b, &SortSpec::new([SortKey::sql(0, false)]), &backend);
    assert!(CpuBackend::new().with_digit_bits(0).is_err());
    assert!(CpuBackend::new().with_digit_bits(17).is_err());
}

#[test]
fn stats_report_the_work() {
    let n = 10_000u32;
    let b = batch(vec![
        // 512 keys in no order: neither presorted nor few distinct.
        Arc::new(UInt32Array::from_iter_values(
            (0..n).map(|i| i.wrapping_mul(2654435761) % 512),
        )),
        Arc::new(StringArray::from_iter_values((0..n).map(|i| i.to_string()))),
        Arc::new(Int64Array::from_iter_values((0..n).map(i64::from))),
    ]);
    let spec = SortSpec::new([SortKey::sql(0, false)]);
    let out = CpuBackend::new()
        .sort(&SortRequest::new(&b, &spec).with_strategy(Some(Strategy::SRTS_DIRECT)))
        .unwrap();
    assert_eq!(out.stats.key_bits, 9);
    assert_eq!(out.stats.passes, 2);
    assert_eq!(out.stats.input_order, None);
    assert_eq!((out.stats.moved_columns, out.stats.gathered_columns), (2, 1));
    let out = CpuBackend::new()
        .sort(&SortRequest::new(&b, &spec).with_strategy(Some(Strategy::SRTS_INDIRECT)))
        .unwrap();
    assert_eq!((out.stats.moved_columns, out.stats.gathered_columns), (0, 3));
}

/// Presorted shapes of real columns (nulls, truncated strings, several keys, DESC) give the
/// reference order in every strategy and with every limit, and say which shape they took.
#[test]
fn presorted_inputs_match_the_reference() {
    use crate::plan::InputOrder;
    let n = 150_000usize;
    // Sorted by (a, s) with nulls first; `s` shares a prefix longer than the key keeps.
    let a = Int64Array::from_iter((0..n).map(|i| (i >= 100).then_some((i / 7) as i64)));
    let s = StringArray::from_iter_values((0..n).map(|i| format!("shared-prefix-{:06}", i.max(100) % 7)));
    let sorted = batch(vec![Arc::new(a), Arc::new(s)]);
    let spec = SortSpec::new([SortKey::new(0, false, true), SortKey::sql(1, false)]);
    // Reversed with ties: DESC order read ascending, and ascending read with DESC.
    let d = Int32Array::from_iter_values((0..n as i32).map(|i| (n as i32 - i) / 3));
    let reversed = batch(vec![
        Arc::new(d),
        Arc::new(UInt8Array::from_iter_values((0..n).map(|i| i as u8))),
    ]);
    // Three sorted partitions appended; and few distinct keys in no order.
    let runs = Int32Array::from_iter_values((0..n).map(|i| ((i % 50_000) / 4) as i32));
    let few = UInt16Array::from_iter((0..n).map(|i| (i % 9 != 0).then_some((i * 7919 % 31) as u16)));
    let mixed = batch(vec![Arc::new(runs), Arc::new(few)]);
    let cases = [
        (&sorted, spec.clone(), Some(InputOrder::Sorted)),
        (
            &reversed,
            SortSpec::new([SortKey::sql(0, false)]),
            Some(InputOrder::Reversed),
        ),
        (
            &reversed,
            SortSpec::new([SortKey::sql(0, true)]),
            Some(InputOrder::Sorted),
        ),
        (
            &mixed,
            SortSpec::new([SortKey::sql(0, false)]),
            Some(InputOrder::Runs(3)),
        ),
        (
            &mixed,
            SortSpec::new([SortKey::sql(1, true)]),
            Some(InputOrder::FewDistinct(32)),
        ),
    ];
    for (b, spec, order) in cases {
        check_all_strategies(b, &spec, &CpuBackend::new());
        for max_prefix_bytes in [4, 32] {
            let out = sort_with(b, &spec, Strategy::SRTS_DIRECT, max_prefix_bytes);
            assert_eq!(out.stats.input_order, order, "{spec:?}");
            assert_eq!(out.stats.passes, 0);
        }
    }
    // Sorted input comes back without a copy.
    let out = sort_with(&sorted, &spec, Strategy::SRTS_DIRECT, 4);
    assert!(out.batch.column(0).to_data().ptr_eq(&sorted.column(0).to_data()));
    // Reversed strings whose 4-byte prefixes tie in groups of 1,000: ordered in full.
    let tail = StringArray::from_iter_values((0..n).rev().map(|i| format!("k{:03}-{:08}", i / 1000, i % 1000)));
    let tail = batch(vec![Arc::new(tail)]);
    let spec = SortSpec::new([SortKey::sql(0, false)]);
    check_all_strategies(&tail, &spec, &CpuBackend::new());
    let out = sort_with(&tail, &spec, Strategy::SRTS_INDIRECT, 4);
    assert_eq!(out.indices.values(), &reference(&tail, &spec)[..]);
    assert_eq!(out.stats.input_order, Some(InputOrder::Reversed));
    assert!(out.stats.tie_groups > 0);
}

/// Nested keys sort by Arrow's row format bytes, which carry the key's direction: rows whose
/// bytes tie on the key's truncated prefix are ordered by those bytes ascending (DataFusion's
/// Tie groups ordered by the bytes past the prefix alone (every later field exact) and by
/// the full comparison (a later string field also truncated), for string views, large
/// binaries and a fixed-size binary, with equal full values that must keep the later keys'
/// order and then the input's.
#[test]
fn tie_groups_sort_by_their_tails_or_in_full() {
    let n = 20_000;
    let stems = [
        "https://example.com/a/very/long/shared/path/",
        "https://example.com/a/very/long/other/",
    ];
    let s1 = StringViewArray::from_iter(
        (0..n).map(|i| (i % 17 != 3).then(|| format!("{}{}", stems[i % 2], (i * 7919) % 61))),
    );
    let s2 = LargeBinaryArray::from_iter(
        (0..n).map(|i| (i % 19 != 4).then(|| format!("{}{}", "b".repeat(30), (i * 104729) % 53).into_bytes())),
    );
    let fixed = FixedSizeBinaryArray::try_from_iter((0..n).map(|i| {
        let mut v = [7u8; 24];
        v[20..].copy_from_slice(&[(i % 41) as u8, 0, 0, ((i * 7) % 3) as u8]);
        v
    }))
    .unwrap();
    let k = Int32Array::from_iter_values((0..n as i32).map(|i| i % 5));
    // Values equal for 80 bytes past a varying first byte: refined 8 bytes at a time, then
    // compared in full.
    let long = StringArray::from_iter_values((0..n).map(|i| format!("{}{}{}", i % 3, "y".repeat(80), (i * 7) % 50)));
    let b = batch(vec![
        Arc::new(s1),
        Arc::new(s2),
        Arc::new(fixed),
        Arc::new(k),
        Arc::new(long),
    ]);
    let specs = [
        SortSpec::new([SortKey::sql(0, false), SortKey::sql(3, true)]),
        SortSpec::new([
            SortKey::new(0, true, true),
            SortKey::sql(1, false),
            SortKey::sql(3, false),
        ]),
        SortSpec::new([SortKey::sql(3, false), SortKey::new(1, true, false)]),
        SortSpec::new([SortKey::sql(2, true), SortKey::sql(3, false)]),
        SortSpec::new([SortKey::sql(4, false), SortKey::sql(3, true)]),
        SortSpec::new([SortKey::sql(4, true), SortKey::sql(3, false)]),
    ];
    for (k, spec) in specs.iter().enumerate() {
        let want = reference(&b, spec);
        for max_prefix_bytes in [0, 3, 8, 32] {
            for strategy in [Strategy::SRTS_DIRECT, Strategy::GRS_INDIRECT] {
                let out = sort_with(&b, spec, strategy, max_prefix_bytes);
                assert_eq!(
                    out.indices.values(),
                    &want[..],
                    "spec {k}, prefix {max_prefix_bytes}, {strategy}"
                );
                // Past the common prefix, s1 needs 14 bytes, s2 2 and the fixed binary 4.
                let truncated = max_prefix_bytes == 0
                    || (k < 2 && max_prefix_bytes < 14)
                    || (k == 3 && max_prefix_bytes < 4)
                    || k >= 4;
                assert_eq!(
                    out.stats.tie_groups > 0,
                    truncated,
                    "spec {k}, prefix {max_prefix_bytes}"
                );
            }
        }
    }
}

/// `array_query.slt`: `ORDER BY column2 DESC` over `[2, 3]`, `NULL`, `[4, 5]`).
#[test]
fn nested_keys_descending_resolve_truncated_ties() {
    use arrow::datatypes::Int64Type;
    let lists = ListArray::from_iter_primitive::<Int64Type, _, _>(vec![
        Some(vec![Some(2), Some(3)]),
        None,
        Some(vec![Some(4), Some(5)]),
        Some(vec![Some(4)]),
        Some(vec![]),
    ]);
    let b = batch(vec![Arc::new(lists), Arc::new(UInt32Array::from_iter_values(0..5))]);
    for (descending, nulls_first, want) in [
        (true, true, [1, 2, 3, 0, 4]),
        (true, false, [2, 3, 0, 4, 1]),
        (false, true, [1, 4, 0, 3, 2]),
        (false, false, [4, 0, 3, 2, 1]),
    ] {
        let spec = SortSpec::new([SortKey::new(0, descending, nulls_first)]);
        assert_eq!(reference(&b, &spec), want);
        for max_prefix_bytes in [0, 1, 8, 16, 64] {
            for strategy in Strategy::ALL {
                let out = sort_with(&b, &spec, strategy, max_prefix_bytes);
                assert_eq!(
                    out.indices.values(),
                    &want[..],
                    "desc {descending}, nulls first {nulls_first}, prefix {max_prefix_bytes}, {strategy}"
                );
            }
        }
    }
}

#[test]
fn unsupported_sort_column_is_an_error_not_a_panic() {
    let values = ListArray::from_iter_primitive::<arrow::datatypes::Int32Type, _, _>(vec![Some(vec![Some(1)])]);
    let dict = DictionaryArray::try_new(Int32Array::from(vec![0, 0]), Arc::new(values)).unwrap();
    let schema = Schema::new(vec![Field::new("odd", dict.data_type().clone(), true)]);
    let b = RecordBatch::try_new(Arc::new(schema), vec![Arc::new(dict)]).unwrap();
    let spec = SortSpec::new([SortKey::sql(0, false)]);
    let err = CpuBackend::new().sort(&SortRequest::new(&b, &spec)).unwrap_err();
    assert!(matches!(err, GpusortError::UnsupportedType { .. }), "{err}");
    assert!(matches!(DataType::Null, DataType::Null));
}
