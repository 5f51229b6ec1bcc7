//! The strategy a `GpuSortExec`'s plan names: the one the sort will run on the device, decided
//! by the function the sort itself asks ([`KernelShapes::runnable`]), so that EXPLAIN never
//! names the MSD hybrid where the device's shared memory makes the sort run SRTS; and, for a
//! direct strategy over string or binary keys, the indirect one it runs when the keys' values
//! are longer than the device's prefix ([`with_string_switch`]).

use arrow::datatypes::{DataType, Schema};
use gpusort::Strategy;
use gpusort::keys::{may_encode_inexactly, native_ordinal_kind};
use gpusort::plan::RecordMove;
use gpusort_cuda::shapes::KernelShapes;
use gpusort_cuda::{GPU_STRING_PREFIX_BYTES, GPU_WHOLE_STRING_BYTES};

use crate::device::gpu_backend;

/// The name of what a sort planned as `planned` runs on a device of `shapes`, for a key of at
/// most `key_words` words (`None`: not known before the data) and moved lanes staged
/// `stage_width` bytes wide: [`KernelShapes::runnable`] where it is the same for every key up to
/// that bound, else both strategies and the number of varying key words that divides them
/// (constant key words are dropped at run time, so a wide key may still fit the MSD hybrid).
pub(crate) fn runnable_name(
    shapes: &KernelShapes,
    planned: Strategy,
    key_words: Option<usize>,
    stage_width: usize,
) -> String {
    let narrowest = shapes.runnable(planned, 1, stage_width);
    let widest = shapes.runnable(planned, key_words.unwrap_or(usize::MAX), stage_width);
    if narrowest == widest {
        narrowest.to_string()
    } else {
        format!(
            "{narrowest} where the key varies in at most {} words, else {widest}",
            shapes.msd_key_words(stage_width)
        )
    }
}

/// The name of what a sort planned as `planned` runs on GPU `ordinal`: the MSD hybrid's by
/// [`device_name`], and where the strategy is direct and a key may be longer than the device's
/// prefix, the indirect strategy it runs then too ([`with_string_switch`]).
pub(crate) fn on_device(planned: Strategy, ordinal: usize, schema: &Schema, key_types: &[DataType]) -> String {
    let name = device_name(planned, ordinal, schema, key_types);
    let indirect = Strategy {
        record_move: RecordMove::Indirect,
        ..planned
    };
    // Only where the GPU sorts (else the CPU backend does, and it has no strategies).
    with_string_switch(name, planned, key_types, || {
        gpusort_cuda::probe(ordinal)
            .is_ok()
            .then(|| device_name(indirect, ordinal, schema, key_types))
    })
}

/// The name of what a sort planned as `planned` runs on GPU `ordinal`, with the shapes of the
/// process's backend of that GPU (opened here when no query has yet: the sort would open it):
/// only the MSD hybrid and sample sort depend on the device; without a usable GPU the planned
/// name stays (the sort then runs on the CPU and its metrics say so).
fn device_name(planned: Strategy, ordinal: usize, schema: &Schema, key_types: &[DataType]) -> String {
    if !planned.algorithm.sorts_in_blocks() {
        return planned.to_string();
    }
    let Ok(backend) = gpu_backend(ordinal) else {
        return planned.to_string();
    };
    let direct = planned.record_move == RecordMove::Direct;
    runnable_name(
        backend.gpu().shapes(),
        planned,
        key_words(key_types),
        stage_width(schema, direct),
    )
}

/// `name` (what a sort planned as `planned` runs), followed by `indirect` (the name of the
/// indirect strategy, `None` where no GPU sorts) when `planned` moves records directly and a key may be longer than its
/// key field holds whole ([`GPU_WHOLE_STRING_BYTES`] at most, else the [`GPU_STRING_PREFIX_BYTES`]
/// the device sorts by): rows whose prefixes tie are then ordered by the permutation, so the
/// session sorts indirectly (its `plan_device` decides from the data, as this name says).
pub(crate) fn with_string_switch(
    name: String,
    planned: Strategy,
    key_types: &[DataType],
    indirect: impl FnOnce() -> Option<String>,
) -> String {
    let switches = planned.record_move == RecordMove::Direct
        && key_types
            .iter()
            .any(|t| may_encode_inexactly(t, GPU_STRING_PREFIX_BYTES));
    match switches.then(indirect).flatten() {
        Some(indirect) => {
            format!(
                "{name}; {indirect} where a key's values are longer than its key holds whole (up to {GPU_WHOLE_STRING_BYTES} bytes)"
            )
        }
        None => name,
    }
}

/// Most words a key of these types takes on the device (a null flag and every bit of each
/// native type); `None` for keys of other types (strings, decimals...), encoded on the host.
fn key_words(types: &[DataType]) -> Option<usize> {
    let mut bits = 0usize;
    for t in types {
        bits += 1 + 8 * native_ordinal_kind(t)?.native_width()? as usize;
    }
    Some(bits.div_ceil(32))
}

/// Bytes the MSD sort stages a moved value in: the widest fixed-width column when `direct`
/// (4 or 8), else the row index's 4.
fn stage_width(schema: &Schema, direct: bool) -> usize {
    let widest = schema
        .fields()
        .iter()
        .filter_map(|f| f.data_type().primitive_width())
        .max()
        .unwrap_or(4);
    if direct { widest.clamp(4, 8) } else { 4 }
}

#[cfg(test)]
mod tests {
    use gpusort_cuda::KernelTuning;
    use gpusort_cuda::shapes::SmLimits;

    use super::*;

    /// At every GPU's shared memory, for every strategy, key bound and staging, the name the
    /// plan gives covers what the sort runs for each number of varying key words up to the bound:
    /// the strategy before "where" for keys the MSD hybrid holds, the one at the end for the
    /// others (both, where the name is one strategy).
    #[test]
    fn the_plan_names_the_strategy_that_runs() {
        let mut conditional = 0;
        for kib in [64, 96, 99, 163, 227] {
            let shapes = KernelShapes::new(SmLimits::gpu_with(kib << 10), &KernelTuning::default());
            for planned in Strategy::ALL {
                for stage in [4, 8] {
                    for bound in 1..=6 {
                        let name = runnable_name(&shapes, planned, Some(bound), stage);
                        let fits = shapes.msd_key_words(stage);
                        conditional += name.contains(" where ") as usize;
                        for varying in 1..=bound {
                            let runs = shapes.runnable(planned, varying, stage).to_string();
                            let named = if varying <= fits {
                                name.starts_with(&runs)
                            } else {
                                name.ends_with(&runs)
                            };
                            assert!(
                                named,
                                "{kib} KiB, {planned}, stage {stage}, bound {bound}: '{name}' for {runs}"
                            );
                        }
                    }
                }
            }
        }
        assert!(conditional > 0, "some keys are held only when few words vary");
    }

    /// Under a 99 KiB budget (A10, L4, RTX 3090/4090) a planned MSD sort of lanes wider than 4
    /// bytes runs SRTS whatever the key, and the plan says so; on the H100 it runs MSD.
    #[test]
    fn msd_is_named_srts_where_it_does_not_fit() {
        let at = |kib: usize| KernelShapes::new(SmLimits::gpu_with(kib << 10), &KernelTuning::default());
        assert_eq!(runnable_name(&at(99), Strategy::MSD_DIRECT, Some(2), 8), "srts-direct");
        assert_eq!(runnable_name(&at(227), Strategy::MSD_DIRECT, Some(2), 8), "msd-direct");
        assert_eq!(
            runnable_name(&at(99), Strategy::MSD_INDIRECT, None, 4),
            "msd-indirect where the key varies in at most 1 words, else srts-indirect"
        );
        assert_eq!(runnable_name(&at(227), Strategy::SRTS_DIRECT, None, 8), "srts-direct");
    }

    /// A direct strategy over string, binary and long fixed-size binary keys names the indirect
    /// one the session switches to; numbers, dictionaries and indirect strategies do not.
    #[test]
    fn direct_sorts_of_long_keys_name_their_indirect_switch() {
        let indirect = || Some("srts-indirect".to_string());
        let name =
            |planned: Strategy, types: &[DataType]| with_string_switch(planned.to_string(), planned, types, indirect);
        for t in [
            DataType::Utf8,
            DataType::LargeUtf8,
            DataType::Utf8View,
            DataType::Binary,
            DataType::BinaryView,
            DataType::FixedSizeBinary(33),
        ] {
            assert_eq!(
                name(Strategy::SRTS_DIRECT, &[DataType::Int32, t.clone()]),
                "srts-direct; srts-indirect where a key's values are longer than its key holds whole (up to 48 bytes)",
                "{t}"
            );
            assert_eq!(
                name(Strategy::SRTS_INDIRECT, std::slice::from_ref(&t)),
                "srts-indirect",
                "{t}"
            );
        }
        for t in [
            DataType::Int64,
            DataType::FixedSizeBinary(32),
            DataType::Dictionary(Box::new(DataType::Int32), Box::new(DataType::Utf8)),
        ] {
            assert_eq!(
                name(Strategy::SRTS_DIRECT, std::slice::from_ref(&t)),
                "srts-direct",
                "{t}"
            );
        }
        // No GPU: the CPU sorts, and the name stays.
        let none = with_string_switch("srts-direct".into(), Strategy::SRTS_DIRECT, &[DataType::Utf8], || None);
        assert_eq!(none, "srts-direct");
    }

    #[test]
    fn key_words_and_staging_from_the_types() {
        assert_eq!(key_words(&[DataType::Int32]), Some(2), "33 bits");
        assert_eq!(key_words(&[DataType::UInt16, DataType::Int8]), Some(1));
        assert_eq!(key_words(&[DataType::Int64, DataType::Float64]), Some(5));
        assert_eq!(key_words(&[DataType::Utf8]), None);
        let schema = Schema::new(vec![
            arrow::datatypes::Field::new("a", DataType::Int32, false),
            arrow::datatypes::Field::new("b", DataType::Float64, true),
            arrow::datatypes::Field::new("s", DataType::Utf8, true),
        ]);
        assert_eq!(stage_width(&schema, true), 8);
        assert_eq!(stage_width(&schema, false), 4);
    }
}
