//! SRTS's passes (`kernels/srts.cu`): Merrill & Grimshaw's radix sort as extended to
//! multifield records by Bandyopadhyay & Sahni (ICPADS 2011, section V). Per pass, on a grid of
//! persistent blocks: block digit counts (upsweep), the top-level scan (spine), the downsweep
//! that ranks and scatters every lane. Each pass whose digit allows it runs instead as one
//! sweep (`onesweep.rs`, `kernels/onesweep.cu`).

use cudarc::driver::{CudaFunction, CudaSlice, DevicePtr, LaunchConfig, PushKernelArg};

use crate::error::Result;
use crate::gpu::Gpu;
use crate::kernels::BLOCK;
use crate::lanes::PassInputs;
use crate::onesweep::onesweep_plan;
use crate::profile::Profile;

/// Longest SRTS spine scanned by a single block.
const SINGLE_BLOCK_SPINE: usize = 16 * 1024;

/// What the three-kernel SRTS passes of a sort use: block digit counts, the sums of a long
/// spine's chunks, the grid and each block's run of tiles.
struct SrtsBufs {
    counts: CudaSlice<u32>,
    spine_sums: CudaSlice<u32>,
    grid: u32,
    tiles_per_block: u32,
}

impl Gpu {
    /// Persistent blocks for SRTS: as many as fit on the device at once, each with a run of
    /// at least one tile.
    fn srts_grid(&self, func: &CudaFunction, dyn_smem: u32, num_tiles: usize) -> Result<(u32, u32)> {
        let per_sm = func
            .occupancy_max_active_blocks_per_multiprocessor(BLOCK, dyn_smem as usize, None)?
            .max(1);
        let want = (self.info.multiprocessors * per_sm) as usize;
        let tiles_per_block = num_tiles.div_ceil(want.min(num_tiles).max(1));
        let grid = num_tiles.div_ceil(tiles_per_block);
        Ok((grid as u32, tiles_per_block as u32))
    }

    /// SRTS: each pass whose digit [`onesweep_plan`] allows (with `onesweep`, the plan's
    /// [`SortSwitches::onesweep`](crate::SortSwitches::onesweep))
    /// as one sweep, the others (digits of up to 4 bits, or every pass at 2^30 rows or more)
    /// as the paper's three kernels: block digit counts, the top-level scan, the downsweep.
    pub(crate) fn srts(&self, x: &PassInputs<'_>, onesweep: bool) -> Result<()> {
        let plan = if onesweep { onesweep_plan(x.n, x.passes) } else { None };
        let prof = Profile::new(self)?;
        let mut one = match &plan {
            Some(plan) => Some(self.onesweep_prepare(x, plan, &prof)?),
            None => None,
        };
        let three = match &plan {
            Some(plan) if plan.slot.iter().all(Option::is_some) => None,
            _ => Some(self.srts_prepare(x)?),
        };
        for p in 0..x.passes.len() {
            match (
                plan.as_ref().and_then(|plan| plan.slot[p]),
                one.as_mut(),
                three.as_ref(),
            ) {
                (Some(slot), Some(one), _) => self.onesweep_pass(x, p, slot, one, &prof)?,
                (_, _, Some(three)) => self.srts_pass(x, p, three, &prof)?,
                _ => unreachable!("a pass without a one-sweep slot has the three kernels' buffers"),
            }
        }
        prof.report()
    }

    /// The three-kernel SRTS pass's grid and buffers: block counts and the long spine's sums.
    fn srts_prepare(&self, x: &PassInputs<'_>) -> Result<SrtsBufs> {
        let num_tiles = x.n.div_ceil(self.tile);
        let (grid, tiles_per_block) = self.srts_grid(&self.kernels()?.srts_downsweep.b8, x.dyn_smem, num_tiles)?;
        Ok(SrtsBufs {
            counts: self.alloc_words(256 * grid as usize)?,
            spine_sums: self.alloc_words((256 * grid as usize).div_ceil(self.tile))?,
            grid,
            tiles_per_block,
        })
    }

    /// Pass `p` as the paper's SRTS: block digit counts, the top-level scan, the downsweep.
    fn srts_pass(&self, x: &PassInputs<'_>, p: usize, b: &SrtsBufs, prof: &Profile) -> Result<()> {
        let s = &self.stream;
        let k = self.kernels()?;
        let pass = &x.passes[p];
        let num_tiles = x.n.div_ceil(self.tile);
        let (n32, tiles32) = (x.n as u32, num_tiles as u32);
        let (grid, tiles_per_block) = (b.grid, b.tiles_per_block);
        let counts_p = b.counts.device_ptr(s).0;
        let spine_sums_p = b.spine_sums.device_ptr(s).0;
        let cfg = |blocks: u32, smem: u32| LaunchConfig {
            grid_dim: (blocks, 1, 1),
            block_dim: (BLOCK, 1, 1),
            shared_mem_bytes: smem,
        };
        let (up, bins) = k.srts_upsweep.for_bits(pass.bits);
        let (down, _) = k.srts_downsweep.for_bits(pass.bits);
        let mask = (1u32 << pass.bits) - 1;
        let len = bins * grid;
        let (lanes, num_lanes) = x.lanes(p);
        // Upsweep and downsweep share their first arguments: rows, digit word, digit, tiles
        // and the counts.
        let sweep = |f| {
            let mut b = s.launch_builder(f);
            b.arg(&n32)
                .arg(&x.digit_src[p])
                .arg(&pass.shift)
                .arg(&mask)
                .arg(&tiles_per_block)
                .arg(&tiles32)
                .arg(&counts_p);
            b
        };
        // SAFETY: the kernels read n rows of the digit word; counts hold bins * grid words;
        // the lane table lists buffers of n rows.
        unsafe { sweep(up).launch(cfg(grid, 0))? };
        prof.mark(self, "srts_upsweep")?;
        // Top-level scan: one block for short spines; the three-kernel scan (chunk sums,
        // a one-block scan of the sums, chunk scans) when a single block would be slow.
        if len as usize <= SINGLE_BLOCK_SPINE {
            // SAFETY: counts hold `len` words.
            unsafe {
                s.launch_builder(&k.srts_spine)
                    .arg(&counts_p)
                    .arg(&len)
                    .launch(cfg(1, 0))?
            };
        } else {
            self.exclusive_scan(counts_p, counts_p, spine_sums_p, len as usize)?;
        }
        prof.mark(self, "srts_spine")?;
        // SAFETY: as above.
        unsafe {
            sweep(down)
                .arg(&lanes)
                .arg(&num_lanes)
                .arg(&x.recs[p])
                .launch(cfg(grid, x.dyn_smem))?
        };
        prof.mark(self, "srts_downsweep")
    }
}
