//! [`Gpu::sort`]: one record sort of a [`DeviceTable`] following a [`GpuSortPlan`] — the
//! strategies of Bandyopadhyay & Sahni (ICPADS 2011, section IV: GRS or SRTS, direct or
//! indirect) and gpusort's MSD hybrid. It decides what moves, runs the passes (`lsd.rs` for GRS
//! and SRTS, `msd` for the MSD hybrid) and then the gathers of the indirect strategy
//! (`gather.rs`, `kernels/gather.cu`); it launches no kernel of its own. Before the passes, one
//! read of the key (`presorted.rs`) finds input already in order (nothing moves) or strictly
//! reversed (everything is reversed in place).

use cudarc::driver::CudaSlice;
use gpusort::plan::{Algorithm, InputOrder, RecordMove, Strategy};

use crate::error::{CudaSortError, Result};
use crate::gpu::{Gpu, rows_u32};
use crate::kernels::MSD_LOCAL_MAX_WORDS;
use crate::shapes::{msd_local_smem, msd_scatter_smem};
use crate::table::{DeviceTable, GpuSortPlan, GpuSortResult};

impl Gpu {
    /// Sorts `table` in place following `plan`.
    pub fn sort(&self, table: &mut DeviceTable, plan: &GpuSortPlan) -> Result<GpuSortResult> {
        let n = table.num_rows;
        self.check_sort(table, plan)?;
        let start = self.event()?;
        let end = self.event()?;
        start.record(&self.stream)?;
        let mut perm = None;
        let mut input_order = None;
        if n > 1 && !plan.passes.is_empty() {
            if plan.switches.presorted {
                input_order = self.input_order(&table.keys, &plan.key_words(), n)?;
            }
            perm = match input_order {
                Some(InputOrder::Sorted) => None,
                Some(_) => self.reverse_table(table, plan.want_perm)?,
                None => self.run_sort(table, plan)?,
            };
        }
        if plan.want_perm && perm.is_none() {
            perm = Some(self.iota(n)?);
        }
        end.record(&self.stream)?;
        end.synchronize()?;
        Ok(GpuSortResult {
            perm: if plan.want_perm { perm } else { None },
            kernel_ms: start.elapsed_ms(&end)?,
            input_order,
        })
    }

    /// Refuses what the kernels do not take: more than 2^32 - 1 rows, MSD sizes out of range
    /// ([`SortSwitches`](crate::SortSwitches)), digits wider than 8 bits or of words the table lacks, records not a multiple of 4 bytes, columns of widths no
    /// gather has.
    fn check_sort(&self, table: &DeviceTable, plan: &GpuSortPlan) -> Result<()> {
        rows_u32(table.num_rows)?;
        plan.switches.check()?;
        if let Some(p) = plan
            .passes
            .iter()
            .find(|p| p.bits > 8 || p.bits == 0 || p.word >= table.keys.len())
        {
            return Err(CudaSortError::Unsupported(format!(
                "pass {p:?} (digits of 1 to 8 bits of existing words)"
            )));
        }
        if let Some(r) = &table.records
            && (r.bytes == 0 || r.bytes % 4 != 0)
        {
            return Err(CudaSortError::Unsupported(format!(
                "records of {} bytes (a multiple of 4 is needed)",
                r.bytes
            )));
        }
        let kernels = self.kernels()?;
        if let Some(c) = table.columns.iter().find(|c| kernels.gather_for(c.width).is_none()) {
            return Err(CudaSortError::Unsupported(format!(
                "a column of {} bytes per row",
                c.width
            )));
        }
        Ok(())
    }

    /// Whether the MSD hybrid's kernels fit the device for a key of `words` words: its
    /// block-local sort and its 256-bin partition scatter, with the staging the lanes of `table`
    /// need (`MsdRun::start`: the moved columns' widths when `direct`, 4 to 8 bytes).
    fn msd_fits(&self, words: usize, table: &DeviceTable, direct: bool) -> Result<bool> {
        let widest = if direct {
            table.columns.iter().map(|c| c.width).max().unwrap_or(4)
        } else {
            4
        };
        let stage = widest.clamp(4, 8);
        let smem = &self.kernels()?.smem;
        Ok(msd_local_smem(words, stage) <= smem.msd_local as usize
            && msd_scatter_smem(false, self.tile, stage) <= smem.msd_scatter[0] as usize)
    }

    /// The passes of the plan's algorithm, then the gathers; returns the permutation when the
    /// row index moved.
    fn run_sort(&self, table: &mut DeviceTable, plan: &GpuSortPlan) -> Result<Option<CudaSlice<u32>>> {
        let direct = plan.strategy.record_move == RecordMove::Direct;
        let words = plan.key_words();
        let msd = plan.strategy.algorithm == Algorithm::Msd
            && words.len() <= MSD_LOCAL_MAX_WORDS
            && self.msd_fits(words.len(), table, direct)?;
        // The MSD sort moves ByField columns directly but gathers Hybrid records once.
        let gathers_records = !direct || (msd && table.records.is_some());
        let needs_index = plan.want_perm || !direct || gathers_records;
        let perm = if msd {
            self.run_msd(table, plan, direct, needs_index)?
        } else if plan.strategy.algorithm == Algorithm::Msd {
            // Keys of more words than a block-local sort holds, or an MSD sort whose kernels
            // do not fit the device's shared memory: SRTS.
            let srts = GpuSortPlan {
                strategy: Strategy::new(Algorithm::Srts, plan.strategy.record_move),
                ..plan.clone()
            };
            self.run_passes(table, &srts, direct, needs_index)?
        } else {
            self.run_passes(table, plan, direct, needs_index)?
        };
        if gathers_records {
            let p = perm.as_ref().expect("indirect sorts make a permutation");
            if direct {
                self.gather_records(table, p)?;
            } else {
                self.gather_payload(table, p, plan.pack_gathers)?;
            }
        }
        Ok(perm)
    }
}
