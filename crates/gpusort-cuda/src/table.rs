//! The rows a sort permutes on the device ([`DeviceTable`]: key words ByField, payload columns
//! ByField and/or Hybrid row-major records, the layouts of Bandyopadhyay & Sahni, ICPADS 2011,
//! section II) and what a sort does with them ([`GpuSortPlan`]) and returns ([`GpuSortResult`]).
//! Plain data: no kernel is launched here ([`Gpu::sort`](crate::Gpu::sort) is in `sort.rs`).

use cudarc::driver::CudaSlice;
use gpusort::plan::{InputOrder, RadixPass, Strategy};

use crate::error::{CudaSortError, Result};
use crate::kernels::{MSD_LOCAL_CAP, MSD_MAX_DIGIT_BITS};
use crate::merge::MergeMethod;
use crate::options::GpuOptions;

/// A fixed-width ByField column on the device: `width` bytes (1, 2, 4, 8 or 16) per row.
#[derive(Debug)]
pub struct DeviceColumn {
    /// The rows.
    pub data: CudaSlice<u8>,
    /// Bytes per row.
    pub width: usize,
}

/// Row-major records on the device (the Hybrid layout): `bytes` per record, a multiple of 4.
#[derive(Debug)]
pub struct DeviceRecords {
    /// The records.
    pub data: CudaSlice<u8>,
    /// Bytes per record.
    pub bytes: usize,
}

/// Rows on the device: key words and payload.
#[derive(Debug)]
pub struct DeviceTable {
    /// Rows.
    pub num_rows: usize,
    /// Key words, ByField, word 0 most significant.
    pub keys: Vec<CudaSlice<u32>>,
    /// ByField payload columns.
    pub columns: Vec<DeviceColumn>,
    /// Hybrid payload: row-major records.
    pub records: Option<DeviceRecords>,
}

/// What a sort does.
#[derive(Debug, Clone, PartialEq)]
pub struct GpuSortPlan {
    /// Algorithm and record move.
    pub strategy: Strategy,
    /// Digit passes, least significant first (digits of at most 8 bits).
    pub passes: Vec<RadixPass>,
    /// Leave every key word that a pass reads in sorted order.
    pub keep_keys: bool,
    /// Return the permutation (sorted position -> input row).
    pub want_perm: bool,
    /// Indirect: gather groups of columns packed into rows
    /// ([`Gpu::gather_columns`](crate::Gpu::gather_columns)), which holds more device memory
    /// ([`gather_bytes_per_row`](crate::gather::gather_bytes_per_row)).
    pub pack_gathers: bool,
    /// How the passes run: one sweep, lane pairs, MSD segment sizes ([`Gpu::sort_switches`](crate::Gpu::sort_switches)
    /// gives the device's defaults).
    pub switches: SortSwitches,
    /// The rows are sorted runs of these many rows, one after the other (empty: not known).
    /// With [`SortSwitches::merge`], they are merged (`merge.rs`) where that pays against the
    /// plan's radix passes (a merge round costs about one). Each run must be sorted by the key.
    pub sorted_runs: Vec<usize>,
}

impl GpuSortPlan {
    /// The key words the passes read, most significant first: those that vary (the others are
    /// equal in every row and may be one-word stand-ins).
    pub(crate) fn key_words(&self) -> Vec<usize> {
        let words: std::collections::BTreeSet<usize> = self.passes.iter().map(|p| p.word).collect();
        words.into_iter().collect()
    }
}

/// Per-sort settings of how the passes run, not what they compute: every choice sorts the same.
/// They belong to one sort, so two sorts at once on one [`Gpu`](crate::Gpu) each keep theirs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SortSwitches {
    /// SRTS's passes run as one sweep where they can (`onesweep_plan`;
    /// off: every SRTS pass runs the three kernels).
    pub onesweep: bool,
    /// The GRS, SRTS and one-sweep scatters move plain 4-byte lanes (u32 columns, the row index
    /// after the first pass, key words other than the digit's) two at a time, with 8 bytes a row
    /// of staging.
    pub pair_lanes: bool,
    /// Segments of at most this many rows go to the MSD sort's block-local sort (1 to
    /// [`MSD_LOCAL_CAP`]): smaller values make more partition passes.
    pub msd_local_rows: usize,
    /// The widest MSD partition digit (1 to [`MSD_MAX_DIGIT_BITS`]).
    pub msd_max_bits: u32,
    /// One read of the key first finds input already in order or reversed (`presorted.rs`).
    pub presorted: bool,
    /// From how many rows the scan also looks for few distinct keys, sorted by one pass over
    /// their ranks (`presorted.rs`; `None`: never; the options' default is
    /// [`DISTINCT_MIN_ROWS`](crate::DISTINCT_MIN_ROWS)).
    pub few_distinct: Option<usize>,
    /// How a plan's sorted runs ([`GpuSortPlan::sorted_runs`]) are merged; `None`: they are
    /// radix-sorted like any rows.
    pub merge: Option<MergeMethod>,
}

impl SortSwitches {
    /// The settings `options` give a sort (`GPUSORT_ONESWEEP`, `GPUSORT_PAIR_LANES`,
    /// `GPUSORT_MSD_BITS`, `GPUSORT_PRESORTED`, `GPUSORT_FEW_DISTINCT`), block-local MSD sorts of up to [`MSD_LOCAL_CAP`] rows.
    pub fn new(options: &GpuOptions) -> Self {
        Self {
            onesweep: options.onesweep,
            pair_lanes: options.pair_lanes,
            msd_local_rows: MSD_LOCAL_CAP,
            msd_max_bits: options.msd_max_bits,
            presorted: options.presorted,
            few_distinct: options.few_distinct.then_some(crate::DISTINCT_MIN_ROWS),
            merge: options.merge,
        }
    }

    /// Refuses MSD sizes the kernels do not take.
    pub(crate) fn check(&self) -> Result<()> {
        if !(1..=MSD_LOCAL_CAP).contains(&self.msd_local_rows) {
            return Err(CudaSortError::Unsupported(format!(
                "MSD block-local sorts of {} rows (1 to {MSD_LOCAL_CAP})",
                self.msd_local_rows
            )));
        }
        if !(1..=MSD_MAX_DIGIT_BITS).contains(&self.msd_max_bits) {
            return Err(CudaSortError::Unsupported(format!(
                "MSD partition digits of {} bits (1 to {MSD_MAX_DIGIT_BITS})",
                self.msd_max_bits
            )));
        }
        Ok(())
    }
}

/// What a sort returns.
#[derive(Debug)]
pub struct GpuSortResult {
    /// The permutation, when asked for (or when the strategy made one anyway).
    pub perm: Option<CudaSlice<u32>>,
    /// Time between the sort's first and last kernel, from device events.
    pub kernel_ms: f32,
    /// The order the key was found in when that replaced the passes (sorted or reversed).
    pub input_order: Option<InputOrder>,
    /// The strategy that ran (or would have run, where the input was presorted): the plan's,
    /// or SRTS where the device's shapes do not hold the MSD hybrid for this key
    /// ([`KernelShapes::runnable`](crate::shapes::KernelShapes::runnable)).
    pub strategy: Strategy,
    /// Sorted runs merged instead of the radix passes (0: the passes ran, or nothing did).
    pub merged_runs: usize,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sort_switches_come_from_the_options_and_are_checked() {
        let options = GpuOptions {
            onesweep: false,
            msd_max_bits: 5,
            ..GpuOptions::default()
        };
        let s = SortSwitches::new(&options);
        assert_eq!(
            s,
            SortSwitches {
                onesweep: false,
                pair_lanes: true,
                msd_local_rows: MSD_LOCAL_CAP,
                msd_max_bits: 5,
                presorted: true,
                few_distinct: Some(crate::DISTINCT_MIN_ROWS),
                merge: Some(MergeMethod::Tree),
            }
        );
        s.check().unwrap();
        for (rows, bits) in [(0, 5), (MSD_LOCAL_CAP + 1, 5), (1, 0), (1, MSD_MAX_DIGIT_BITS + 1)] {
            let bad = SortSwitches {
                msd_local_rows: rows,
                msd_max_bits: bits,
                ..s
            };
            let err = bad.check().unwrap_err();
            assert!(err.to_string().contains("MSD"), "{err}");
        }
    }
}
