//! The strategy a `GpuSortExec`'s plan names: the one the sort will run on the device, decided
//! by the function the sort itself asks ([`KernelShapes::runnable`]), so that EXPLAIN never
//! names the MSD hybrid where the device's shared memory makes the sort run SRTS.

use arrow::datatypes::{DataType, Schema};
use gpusort::Strategy;
use gpusort::keys::native_ordinal_kind;
use gpusort::plan::{Algorithm, RecordMove};
use gpusort_cuda::shapes::KernelShapes;

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

/// The name of what a sort planned as `planned` runs on GPU `ordinal`, with the shapes of the
/// process's backend of that GPU (opened here when no query has yet: the sort would open it):
/// only the MSD hybrid depends on the device; without a usable GPU the planned name stays (the
/// sort then runs on the CPU and its metrics say so).
pub(crate) fn on_device(planned: Strategy, ordinal: usize, schema: &Schema, key_types: &[DataType]) -> String {
    if planned.algorithm != Algorithm::Msd {
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
    use gpusort_cuda::shapes::SmemLimits;

    use super::*;

    /// At every GPU's shared memory, for every strategy, key bound and staging, the name the
    /// plan gives covers what the sort runs for each number of varying key words up to the bound:
    /// the strategy before "where" for keys the MSD hybrid holds, the one at the end for the
    /// others (both, where the name is one strategy).
    #[test]
    fn the_plan_names_the_strategy_that_runs() {
        let mut conditional = 0;
        for kib in [64, 96, 99, 163, 227] {
            let shapes = KernelShapes::new(SmemLimits::gpu_with(kib << 10), &KernelTuning::default());
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
        let at = |kib: usize| KernelShapes::new(SmemLimits::gpu_with(kib << 10), &KernelTuning::default());
        assert_eq!(runnable_name(&at(99), Strategy::MSD_DIRECT, Some(2), 8), "srts-direct");
        assert_eq!(runnable_name(&at(227), Strategy::MSD_DIRECT, Some(2), 8), "msd-direct");
        assert_eq!(
            runnable_name(&at(99), Strategy::MSD_INDIRECT, None, 4),
            "msd-indirect where the key varies in at most 1 words, else srts-indirect"
        );
        assert_eq!(runnable_name(&at(227), Strategy::SRTS_DIRECT, None, 8), "srts-direct");
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
