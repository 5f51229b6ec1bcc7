//! GRS's passes (`kernels/grs.cu`): Bandyopadhyay & Sahni's GPU radix sort for multifield
//! records (ICPADS 2011, section VI; HiPC 2010, sections III and VI). Per pass: tile ranks and
//! histograms, an exclusive scan of the histograms, the tile scatter of every lane. The scan
//! ([`Gpu::exclusive_scan`], grs.cu's `scan_*`) also serves SRTS's long spines and the MSD
//! partitions.

use cudarc::driver::{DevicePtr, LaunchConfig, PushKernelArg};

use crate::error::Result;
use crate::gpu::Gpu;
use crate::kernels::BLOCK;
use crate::lanes::PassInputs;
use crate::profile::Profile;

impl Gpu {
    /// GRS: per pass, tile ranks and histograms, a scan of the histograms, the tile scatter.
    pub(crate) fn grs(&self, x: &PassInputs<'_>) -> Result<()> {
        let (n, passes, digit_src, recs) = (x.n, x.passes, x.digit_src, x.recs);
        let s = &self.stream;
        let k = self.kernels()?;
        let num_tiles = n.div_ceil(self.tile);
        let ranks = unsafe { s.alloc::<u16>(n) }?;
        let hist = self.alloc_words(256 * num_tiles)?;
        let scanned = self.alloc_words(256 * num_tiles)?;
        let chunk_sums = self.alloc_words((256 * num_tiles).div_ceil(self.tile))?;
        let (ranks_p, hist_p, scanned_p, sums_p) = (
            ranks.device_ptr(s).0,
            hist.device_ptr(s).0,
            scanned.device_ptr(s).0,
            chunk_sums.device_ptr(s).0,
        );
        let n32 = n as u32;
        let tiles32 = num_tiles as u32;
        let prof = Profile::new(self)?;
        for (p, pass) in passes.iter().enumerate() {
            let (rank_fn, bins) = k.grs_rank.for_bits(pass.bits);
            let (scatter_fn, _) = k.grs_scatter.for_bits(pass.bits);
            let mask = (1u32 << pass.bits) - 1;
            let tiles_cfg = LaunchConfig {
                grid_dim: (tiles32, 1, 1),
                block_dim: (BLOCK, 1, 1),
                shared_mem_bytes: 0,
            };
            // SAFETY: kernels read n rows of the digit word and write n ranks and
            // bins * num_tiles counts.
            unsafe {
                s.launch_builder(rank_fn)
                    .arg(&n32)
                    .arg(&digit_src[p])
                    .arg(&pass.shift)
                    .arg(&mask)
                    .arg(&ranks_p)
                    .arg(&hist_p)
                    .arg(&tiles32)
                    .launch(tiles_cfg)?
            };
            prof.mark(self, "grs_rank")?;
            self.exclusive_scan(hist_p, scanned_p, sums_p, bins as usize * num_tiles)?;
            prof.mark(self, "grs_scan")?;
            let (lanes, num_lanes) = x.lanes(p);
            // SAFETY: the lane table lists buffers of n rows; offsets come from the scan.
            unsafe {
                s.launch_builder(scatter_fn)
                    .arg(&n32)
                    .arg(&digit_src[p])
                    .arg(&pass.shift)
                    .arg(&mask)
                    .arg(&ranks_p)
                    .arg(&hist_p)
                    .arg(&scanned_p)
                    .arg(&tiles32)
                    .arg(&lanes)
                    .arg(&num_lanes)
                    .arg(&recs[p])
                    .launch(LaunchConfig {
                        shared_mem_bytes: x.dyn_smem,
                        ..tiles_cfg
                    })?
            };
            prof.mark(self, "grs_scatter")?;
        }
        prof.report()
    }

    /// Exclusive scan of `len` words at `src` into `dst` (GRS phase 2; MSD partitions).
    pub(crate) fn exclusive_scan(&self, src: u64, dst: u64, sums: u64, len: usize) -> Result<()> {
        let s = &self.stream;
        let k = self.kernels()?;
        let chunks = len.div_ceil(self.tile) as u32;
        let len32 = len as u32;
        let cfg = |blocks: u32| LaunchConfig {
            grid_dim: (blocks, 1, 1),
            block_dim: (BLOCK, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: `src` and `dst` hold len words, `sums` one per chunk.
        unsafe {
            s.launch_builder(&k.scan_reduce)
                .arg(&src)
                .arg(&len32)
                .arg(&sums)
                .launch(cfg(chunks))?;
            s.launch_builder(&k.scan_spine).arg(&sums).arg(&chunks).launch(cfg(1))?;
            s.launch_builder(&k.scan_down)
                .arg(&src)
                .arg(&len32)
                .arg(&sums)
                .arg(&dst)
                .launch(cfg(chunks))?;
        }
        Ok(())
    }
}
