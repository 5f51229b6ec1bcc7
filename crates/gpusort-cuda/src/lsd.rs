//! The LSD record sorts, GRS and SRTS, direct or indirect (Bandyopadhyay & Sahni, ICPADS 2011,
//! sections III, V and VI): the passes of [`GpuSortPlan::passes`], least significant digit
//! first, each moving every lane from one of its buffers to the other.
//!
//! Each pass reads the key word of its digit from where the last pass left it and writes every
//! moved column to its other buffer ([`DoubleBuffer`]). Which buffers each pass reads and
//! writes is worked out on the host first ([`Gpu::plan_passes`]); all lane tables then go to
//! the device in one copy and the passes of one family are launched back to back on one
//! stream: `grs.rs` (`kernels/grs.cu`) or `srts.rs` (`kernels/srts.cu`, its passes as one sweep
//! where `onesweep.rs` allows, `kernels/onesweep.cu`), all through the lane tables of
//! `kernels/common.cuh` (`lanes.rs`).

use cudarc::driver::{CudaSlice, DevicePtr};
use gpusort::plan::Algorithm;

use crate::error::{CudaSortError, Result};
use crate::gpu::Gpu;
use crate::lanes::{
    DoubleBuffer, LANE_DIGIT, LANE_IOTA, Lane, LaneSet, PassInputs, Records, Role, mark_lane_pairs, scatter_smem,
};
use crate::presorted::{OrderScan, Passes};
use crate::table::{DeviceTable, GpuSortPlan};

/// The lane tables of every pass of a sort, worked out on the host before any launch.
struct PassTables {
    /// Each pass's lanes.
    tables: Vec<Vec<Lane>>,
    /// Each pass's Hybrid records (zero bytes: none).
    recs: Vec<Records>,
    /// Where each pass reads the key word of its digit.
    digit_src: Vec<u64>,
    /// The widest lane, in bytes per row.
    max_width: usize,
}

impl Gpu {
    /// Runs the LSD passes of `plan` over `table` (GRS, or SRTS for SRTS and MSD plans): the
    /// key words always move, the row index when `needs_index`, the payload when `direct`.
    /// Returns the permutation when the index moved. The host work done, it waits for `order`
    /// before the first kernel and stops there, the table as it came, where the rows are
    /// already sorted or reversed. The key words `carried`, which no pass reads, move in every
    /// pass (a sort by a digit of another word: `Gpu::sort_by_ranks`).
    pub(crate) fn run_passes(
        &self,
        table: &mut DeviceTable,
        plan: &GpuSortPlan,
        direct: bool,
        needs_index: bool,
        order: &mut OrderScan<'_>,
        carried: &[usize],
    ) -> Result<Passes> {
        let n = table.num_rows;
        let s = &self.stream;
        let mut set = LaneSet::take(table, |_| true, true, direct, direct);
        // Each key word's buffer before the first pass (what the one-sweep histogram reads).
        let word_src: Vec<u64> = set
            .lanes
            .iter()
            .filter(|l| l.key_word().is_some())
            .map(|l| l.ptr(0, s))
            .collect();
        let mut pt = self.plan_passes(&mut set.lanes, n, plan, direct, needs_index, carried)?;
        let stage_width = stage_width(&mut pt.tables, pt.max_width, plan.switches.pair_lanes);
        let (lane_buf, offsets) = self.upload_lane_tables(&pt.tables)?;
        let inputs = PassInputs {
            n,
            passes: &plan.passes,
            word_src: &word_src,
            digit_src: &pt.digit_src,
            tables: &pt.tables,
            offsets: &offsets,
            lane_base: lane_buf.device_ptr(s).0,
            recs: &pt.recs,
            stage_width,
            dyn_smem: scatter_smem(self.tile, stage_width),
        };
        let allowed = self.kernels()?.smem.scatter;
        if inputs.dyn_smem > allowed {
            // The shapes' tile fits 8-byte staging; only a misestimated static size gets here.
            return Err(CudaSortError::Unsupported(format!(
                "a tile scatter of {} bytes of shared memory (the device's kernels may use {allowed})",
                inputs.dyn_smem
            )));
        }
        if let Some(found) = order.settle()? {
            set.restore_input(table);
            return Ok(Passes::Skipped(found));
        }
        match plan.strategy.algorithm {
            Algorithm::Grs => self.grs(&inputs)?,
            Algorithm::Srts | Algorithm::Msd | Algorithm::Sample => {
                let onesweep = plan.switches.onesweep && self.onesweep_fits(stage_width)?;
                self.srts(&inputs, onesweep)?
            }
        }
        let perm = set.restore(table, |l| l.cur);
        // The lane tables must outlive the kernels that read them.
        s.synchronize()?;
        drop(lane_buf);
        Ok(Passes::Ran(perm))
    }

    /// Pass by pass, what moves from which buffer to which: a key word while a later pass
    /// reads it (or to the end with [`GpuSortPlan::keep_keys`], or in every pass when
    /// `carried`), the row index when `needs_index`, the payload when `direct`, over `n` rows.
    /// Allocates each second buffer when it is first written.
    fn plan_passes(
        &self,
        lanes: &mut [DoubleBuffer],
        n: usize,
        plan: &GpuSortPlan,
        direct: bool,
        needs_index: bool,
        carried: &[usize],
    ) -> Result<PassTables> {
        let (s, passes) = (&self.stream, &plan.passes);
        let word_used_later = |w: usize, p: usize| passes[p + 1..].iter().any(|q| q.word == w);
        let word_sorted = |w: usize| passes.iter().any(|q| q.word == w);
        let mut out = PassTables {
            tables: vec![],
            recs: vec![],
            digit_src: vec![],
            max_width: 4,
        };
        for (p, pass) in passes.iter().enumerate() {
            let w = lanes
                .iter()
                .find(|l| l.role == Role::KeyWord(pass.word))
                .expect("a key word");
            out.digit_src.push(w.ptr(w.cur.expect("key words exist"), s));
            let mut table = vec![];
            let mut rec = Records::default();
            for lane in lanes.iter_mut() {
                let moves = match lane.role {
                    Role::KeyWord(w) => {
                        word_used_later(w, p) || (plan.keep_keys && word_sorted(w)) || carried.contains(&w)
                    }
                    Role::Index => needs_index,
                    Role::Column | Role::Records => direct,
                };
                if !moves {
                    continue;
                }
                let to = lane.cur.map_or(0, |c| 1 - c);
                lane.ensure(self, to, n)?;
                let src = lane.cur.map_or(0, |c| lane.ptr(c, s));
                let dst = lane.ptr(to, s);
                if lane.role == Role::Records {
                    rec = Records::new(src, dst, lane.width);
                } else {
                    out.max_width = out.max_width.max(lane.width);
                    let mut flags = if lane.cur.is_none() { LANE_IOTA } else { 0 };
                    if lane.role == Role::KeyWord(pass.word) {
                        flags |= LANE_DIGIT;
                    }
                    table.push(Lane {
                        src,
                        dst,
                        width: lane.width as u32,
                        flags,
                    });
                }
                lane.cur = Some(to);
            }
            out.tables.push(table);
            out.recs.push(rec);
        }
        Ok(out)
    }

    /// Every pass's lane table in one upload: the buffer and each table's byte offset in it.
    fn upload_lane_tables(&self, tables: &[Vec<Lane>]) -> Result<(CudaSlice<u64>, Vec<usize>)> {
        let mut flat: Vec<u64> = vec![];
        let mut offsets = vec![];
        for t in tables {
            offsets.push(flat.len() * 8);
            for l in t {
                flat.extend([l.src, l.dst, ((l.flags as u64) << 32) | l.width as u64]);
            }
        }
        Ok((self.stream.clone_htod(&flat)?, offsets))
    }
}

/// Bytes a staged value takes in the scatters' shared memory: 16-byte rows are staged as two
/// 8-byte halves, and 4-byte lanes moved in pairs (`pair_lanes`, the plan's
/// [`SortSwitches::pair_lanes`](crate::SortSwitches::pair_lanes)) need 8 bytes too; else the
/// widest lane's, at least 4.
fn stage_width(tables: &mut [Vec<Lane>], max_width: usize, pair_lanes: bool) -> usize {
    if pair_lanes && mark_lane_pairs(tables) {
        8
    } else {
        max_width.clamp(4, 8)
    }
}
