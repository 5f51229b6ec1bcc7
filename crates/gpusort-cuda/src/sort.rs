//! [`Gpu::sort`]: one record sort of a [`DeviceTable`] following a [`GpuSortPlan`] — the
//! strategies of Bandyopadhyay & Sahni (ICPADS 2011, section IV: GRS, SRTS or sample sort,
//! direct or indirect) and gpusort's MSD hybrid. It decides what moves, runs the passes (`lsd.rs`
//! for GRS and SRTS, `sample.rs` for sample sort, `msd` for the MSD hybrid) and then the gathers of the indirect strategy
//! (`gather.rs`, `kernels/gather.cu`); it launches no kernel of its own. Before the passes, one
//! read of the key (`presorted.rs`) finds input already in order (nothing moves) or strictly
//! reversed (everything is reversed in place), non-increasing (its groups of equal keys
//! reversed) or a few ascending runs; the sort waits for it
//! only once the passes' host work is done, just before their first kernel. Rows the plan says
//! are a few sorted runs, or the scan found to be, are merged instead (`merge.rs`) where that
//! pays against the radix passes; rows whose keys are few distinct values are sorted by one
//! pass over each row's rank among them ([`Gpu::sort_by_ranks`]).

use cudarc::driver::CudaSlice;
use gpusort::plan::{Algorithm, InputOrder, RadixPass, RecordMove, Strategy};

use crate::error::{CudaSortError, Result};
use crate::gpu::{Gpu, rows_u32};
use crate::kernels::MERGE_MAX_WORDS;
use crate::merge::{MergeMethod, merge_pays};
use crate::presorted::{OrderScan, Passes};
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
        let mut order = OrderScan::off();
        let mut strategy = plan.strategy;
        let mut merged_runs = 0;
        if let Some(method) = self.merge_of(plan, n) {
            perm = Some(self.merge_table(table, plan, &plan.sorted_runs, method)?);
            merged_runs = plan.sorted_runs.iter().filter(|&&r| r > 0).count();
        } else if n > 1 && !plan.passes.is_empty() {
            if plan.switches.presorted {
                // Enqueued, not waited for: the passes wait just before their first kernel.
                let merge = plan
                    .switches
                    .merge
                    .filter(|_| plan.key_words().len() <= MERGE_MAX_WORDS);
                let merge = merge.map(|m| (m, plan.passes.len()));
                let distinct = plan.switches.few_distinct.is_some_and(|rows| n >= rows);
                order = self.start_order_scan(&table.keys, &plan.key_words(), n, merge, distinct)?;
            }
            strategy = self.strategy_run(table, plan)?;
            perm = match self.run_sort(table, plan, strategy, &mut order, &[])? {
                Passes::Ran(perm) => perm,
                Passes::Skipped(InputOrder::Sorted) => None,
                Passes::Skipped(InputOrder::Runs(_)) => {
                    let (runs, method) = order.take_runs().expect("runs found are kept with their merge");
                    merged_runs = runs.len();
                    Some(self.merge_table(table, plan, &runs, method)?)
                }
                Passes::Skipped(InputOrder::FewDistinct(_)) => {
                    strategy = Strategy::new(Algorithm::Srts, plan.strategy.record_move);
                    self.sort_by_ranks(table, plan, order.take_ranks())?
                }
                Passes::Skipped(InputOrder::Reversed) if order.reversed_ties() => {
                    let perm = self.reverse_groups(table, &plan.key_words())?;
                    self.gather_payload_by(table, plan, &perm)?;
                    Some(perm)
                }
                Passes::Skipped(InputOrder::Reversed) => self.reverse_table(table, plan.want_perm)?,
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
            input_order: order.found(),
            strategy,
            merged_runs,
        })
    }

    /// The merge of `table`'s sorted `runs` (rows of each, in order) by `method`, then the
    /// payload gathered through the permutation, which it returns.
    fn merge_table(
        &self,
        table: &mut DeviceTable,
        plan: &GpuSortPlan,
        runs: &[usize],
        method: MergeMethod,
    ) -> Result<CudaSlice<u32>> {
        let n = table.num_rows;
        let perm = self.merge_runs(&mut table.keys, &plan.key_words(), n, runs, method)?;
        self.gather_payload_by(table, plan, &perm)?;
        Ok(perm)
    }

    /// `table`'s payload (its columns and records, if any) gathered through `perm`, packed
    /// where `plan` is indirect and asks for it: packed gathers hold memory only an indirect
    /// plan reserves.
    fn gather_payload_by(&self, table: &mut DeviceTable, plan: &GpuSortPlan, perm: &CudaSlice<u32>) -> Result<()> {
        if table.columns.is_empty() && table.records.is_none() {
            return Ok(());
        }
        let pack = plan.pack_gathers && plan.strategy.record_move == RecordMove::Indirect;
        self.gather_payload(table, perm, pack)
    }

    /// Sorts `table`, whose keys are few distinct values, by one stable 8-bit pass (SRTS, one
    /// sweep where it fits) over `ranks`, each row's rank among them, appended as a key word of
    /// its own: ranks order the rows as their keys do. The key words move with the
    /// rows where `plan` keeps them; the payload as the plan's strategy says. Returns the
    /// permutation when the row index moved.
    fn sort_by_ranks(
        &self,
        table: &mut DeviceTable,
        plan: &GpuSortPlan,
        ranks: CudaSlice<u32>,
    ) -> Result<Option<CudaSlice<u32>>> {
        let words = plan.key_words();
        let rank_word = table.keys.len();
        table.keys.push(ranks);
        let by_ranks = GpuSortPlan {
            strategy: Strategy::new(Algorithm::Srts, plan.strategy.record_move),
            passes: vec![RadixPass {
                word: rank_word,
                shift: 0,
                bits: 8,
            }],
            keep_keys: false,
            sorted_runs: vec![],
            ..plan.clone()
        };
        let carried = if plan.keep_keys { words } else { vec![] };
        let ran = self.run_sort(table, &by_ranks, by_ranks.strategy, &mut OrderScan::off(), &carried);
        // The ranks go, whether or not the pass ran.
        table.keys.truncate(rank_word);
        match ran? {
            Passes::Ran(perm) => Ok(perm),
            Passes::Skipped(_) => unreachable!("no order scan ran"),
        }
    }

    /// How `plan`'s sorted runs of `n` rows are merged, when they are: by the switches' method
    /// (the tree where the paper's odd-even schedule does not sort them), where that pays
    /// against the radix passes ([`merge_pays`]) and the kernels take the key.
    fn merge_of(&self, plan: &GpuSortPlan, n: usize) -> Option<MergeMethod> {
        let method = plan.switches.merge?;
        let words = plan.key_words().len();
        if n < 2 || plan.passes.is_empty() || words > MERGE_MAX_WORDS {
            return None;
        }
        merge_pays(&plan.sorted_runs, method, plan.passes.len())
    }

    /// Refuses what the kernels do not take: more than 2^32 - 1 rows, MSD sizes out of range
    /// ([`SortSwitches`](crate::SortSwitches)), digits wider than 8 bits or of words the table lacks, records not a multiple of 4 bytes, columns of widths no
    /// gather has, sorted runs that do not add up to the rows (whether or not they would be
    /// merged).
    fn check_sort(&self, table: &DeviceTable, plan: &GpuSortPlan) -> Result<()> {
        rows_u32(table.num_rows)?;
        plan.switches.check()?;
        let in_runs: usize = plan.sorted_runs.iter().sum();
        if !plan.sorted_runs.is_empty() && in_runs != table.num_rows {
            return Err(CudaSortError::Unsupported(format!(
                "sorted runs of {in_runs} rows in all for {} rows",
                table.num_rows
            )));
        }
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

    /// Whether the loaded MSD kernels take a key of `words` words with values staged `stage`
    /// bytes wide: their block-local sort and 256-bin partition scatter. The shapes promise it
    /// wherever [`KernelShapes::runnable`](crate::shapes::KernelShapes::runnable) names the
    /// MSD hybrid (the GPU test `shapes_fit_the_device` checks their estimates); this guard only
    /// keeps a short estimate from failing a sort.
    fn msd_loaded_fits(&self, words: usize, stage: usize) -> Result<bool> {
        let smem = &self.kernels()?.smem;
        Ok(msd_local_smem(words, stage) <= smem.msd_local as usize
            && msd_scatter_smem(false, self.tile, stage) <= smem.msd_scatter[0] as usize)
    }

    /// The strategy that runs `plan` over `table`: [`KernelShapes::runnable`] of the device's
    /// shapes (the MSD hybrid where its kernels hold the key, else SRTS), the function the
    /// plan's name comes from too.
    ///
    /// [`KernelShapes::runnable`]: crate::shapes::KernelShapes::runnable
    pub(crate) fn strategy_run(&self, table: &DeviceTable, plan: &GpuSortPlan) -> Result<Strategy> {
        let words = plan.key_words().len();
        let stage = msd_stage_width(table, plan.strategy.record_move == RecordMove::Direct);
        let run = self.shapes.runnable(plan.strategy, words, stage);
        if run.algorithm.sorts_in_blocks() && !self.msd_loaded_fits(words, stage)? {
            return Ok(Strategy::new(Algorithm::Srts, run.record_move));
        }
        Ok(run)
    }

    /// The passes of `strategy` (what [`Self::strategy_run`] says runs `plan`), then the
    /// gathers; returns the permutation when the row index moved, or, with nothing moved, the
    /// order `order` found the rows in. The key words `carried` (no pass reads them) move with
    /// the rows through the LSD passes.
    fn run_sort(
        &self,
        table: &mut DeviceTable,
        plan: &GpuSortPlan,
        strategy: Strategy,
        order: &mut OrderScan<'_>,
        carried: &[usize],
    ) -> Result<Passes> {
        let direct = plan.strategy.record_move == RecordMove::Direct;
        // The MSD and sample sorts move ByField columns directly but gather Hybrid records once.
        let gathers_records = !direct || (strategy.algorithm.sorts_in_blocks() && table.records.is_some());
        let needs_index = plan.want_perm || !direct || gathers_records;
        let passes = if strategy.algorithm == Algorithm::Msd {
            self.run_msd(table, plan, direct, needs_index, order)?
        } else if strategy.algorithm == Algorithm::Sample {
            self.run_sample(table, plan, direct, needs_index, order)?
        } else {
            let plan = GpuSortPlan {
                strategy,
                ..plan.clone()
            };
            self.run_passes(table, &plan, direct, needs_index, order, carried)?
        };
        let perm = match passes {
            Passes::Ran(perm) => perm,
            skipped => return Ok(skipped),
        };
        if gathers_records {
            let p = perm.as_ref().expect("indirect sorts make a permutation");
            if direct {
                self.gather_records(table, p)?;
            } else {
                self.gather_payload(table, p, plan.pack_gathers)?;
            }
        }
        Ok(Passes::Ran(perm))
    }
}

/// Bytes a value of the lanes the MSD sort moves takes in its staging: the widest ByField column
/// when `direct` (Hybrid records are gathered once, not moved), else the row index; 4 to 8
/// (`MsdRun::start`).
fn msd_stage_width(table: &DeviceTable, direct: bool) -> usize {
    let widest = if direct {
        table.columns.iter().map(|c| c.width).max().unwrap_or(4)
    } else {
        4
    };
    widest.clamp(4, 8)
}
