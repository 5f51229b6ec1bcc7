//! Kernel shapes from the device's attributes (issue 27): the tile sizes the kernels are compiled
//! with and the strategies a sort may use, as a function of the shared memory a block and an SM
//! offer, so that every GPU from Turing to Blackwell gets kernels that load, and the H100 the
//! shapes measured on it (one point of the function).
//!
//! [`KernelShapes::new`] is pure host code: it takes [`SmLimits`] (the device's, or capped by
//! `GPUSORT_SMEM_CAP` to emulate a smaller GPU on a larger one) and the tuning asked for, and
//! estimates each kernel's static shared memory from the sources' layouts. When the kernels are
//! loaded, each one's dynamic shared memory is set to what the shapes need, at most what the
//! block limit leaves beside the kernel's real static shared memory ([`DynSmem`]); a sort checks
//! its needs against those before it chooses the one-sweep pass or the MSD hybrid, and falls back
//! to SRTS's three-kernel passes where they do not fit. A sort never fails because a kernel does
//! not fit.

use std::fmt;

use gpusort::plan::{Algorithm, Strategy};

use crate::device::DeviceInfo;
use crate::kernels::{
    BLOCK, KernelTuning, MSD_LOCAL_BLOCK, MSD_LOCAL_CAP, MSD_LOCAL_MAX_SEGS, MSD_LOCAL_MAX_WORDS, MSD_RANK_SMEM,
};
use crate::lanes::scatter_smem;

/// Shared memory an SM keeps for each resident block besides what the block asks for (1 KiB from
/// sm_80 on; counted on every architecture).
pub const SMEM_RESERVED_PER_BLOCK: usize = 1024;

/// Widest staging of a tile scatter: 8 bytes a row (16-byte values move as two halves).
pub const MAX_STAGE_WIDTH: usize = 8;

/// Blocks per SM the one-sweep tile is shrunk to keep where shared memory allows (the H100 runs
/// 3 of 256 threads; 1 leaves the look-back's latency uncovered).
pub const ONESWEEP_MIN_RESIDENT: u32 = 2;

/// The smallest one-sweep tile (rows per thread) chosen to keep [`ONESWEEP_MIN_RESIDENT`] blocks
/// per SM; below it the tile that fits one block is kept instead.
pub const ONESWEEP_MIN_IPT: usize = 8;

/// Bytes of `RankSmem<256, u32, threads>` / `RankShared<256, threads, C>` (kernels/common.cuh):
/// per-warp counters of `counter` bytes (257 each), three u32 arrays of the 256 bins, 32 scan
/// words.
const fn rank_smem_b8(threads: usize, counter: usize) -> usize {
    (threads / 32 * 257 * counter).div_ceil(16) * 16 + 3 * 256 * 4 + 32 * 4
}

/// Static shared memory of a GRS / SRTS scatter (`RankSmem<256>`), estimated from the layout.
pub const SCATTER_STATIC_SMEM: usize = rank_smem_b8(BLOCK as usize, 4) + 256;

/// Static shared memory of the one-sweep pass of `threads`-thread blocks (`RankSmem` and the
/// tile number), estimated.
pub const fn onesweep_static_smem(threads: usize) -> usize {
    rank_smem_b8(threads, 4) + 256
}

/// Static shared memory of the MSD block-local sort (`RankShared<256, LOCAL_BLOCK, u16>` and the
/// batch's segment starts), estimated.
pub const MSD_LOCAL_STATIC_SMEM: usize = rank_smem_b8(MSD_LOCAL_BLOCK as usize, 2) + (MSD_LOCAL_MAX_SEGS + 1) * 4 + 256;

/// Dynamic shared memory of an MSD partition scatter of `tile` rows with `wide` (2048-bin) digits
/// or not, values staged `stage_width` bytes wide (msd/mod.rs `partition`).
pub const fn msd_scatter_smem(wide: bool, tile: usize, stage_width: usize) -> usize {
    MSD_RANK_SMEM[wide as usize].div_ceil(16) * 16 + tile * 4 + tile * stage_width
}

/// Dynamic shared memory of the MSD block-local sort of keys of `words` words, values staged
/// `stage_width` bytes wide (msd/mod.rs `local_sorts`).
pub const fn msd_local_smem(words: usize, stage_width: usize) -> usize {
    let key = if 4 * words > stage_width {
        4 * words
    } else {
        stage_width
    };
    key * MSD_LOCAL_CAP + 4 * MSD_LOCAL_CAP
}

/// What a block and an SM offer: shared memory, threads and registers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SmLimits {
    /// Most shared memory of one block, static and dynamic, with opt-in.
    pub per_block: usize,
    /// Shared memory of one SM.
    pub per_sm: usize,
    /// Threads resident on one SM (2048 from Volta to Hopper and on the A100; 1536 on sm_86,
    /// sm_89 and sm_120; 1024 on Turing).
    pub threads_per_sm: u32,
    /// 32-bit registers of one SM (64 Ki on every architecture from Volta on).
    pub registers_per_sm: u32,
}

/// Threads an SM holds where the device does not say otherwise (Volta, the A100, Hopper).
pub const DEFAULT_THREADS_PER_SM: u32 = 2048;

/// Registers of an SM where the device does not say otherwise (every architecture from Volta).
pub const DEFAULT_REGISTERS_PER_SM: u32 = 64 * 1024;

/// Most registers one thread may use (every architecture from Volta).
pub const MAX_REGISTERS_PER_THREAD: u32 = 255;

/// Threads a one-sweep SM is compiled to hold at most (`ONESWEEP_MIN_BLOCKS` of onesweep.cu by
/// default: 3 blocks of 256, 2 of 384, 1 of 512), so that larger residency does not squeeze the
/// tile's registers into spills.
pub const ONESWEEP_COMPILED_THREADS: u32 = 768;

impl SmLimits {
    /// The device's limits.
    pub fn of(info: &DeviceInfo) -> Self {
        Self {
            per_block: info.smem_per_block,
            per_sm: info.smem_per_sm,
            threads_per_sm: info.threads_per_sm,
            registers_per_sm: info.registers_per_sm,
        }
    }

    /// Blocks of `threads` threads using `smem` bytes of shared memory and `registers` registers
    /// a thread that an SM holds at once: the least of what its shared memory (with the 1 KiB a
    /// block keeps), its threads and its registers allow.
    pub fn resident(&self, smem: usize, threads: u32, registers: u32) -> u32 {
        let by_smem = (self.per_sm / (smem + SMEM_RESERVED_PER_BLOCK)) as u32;
        let by_registers = self.registers_per_sm / (registers.max(1) * threads);
        by_smem.min(self.threads_per_sm / threads).min(by_registers)
    }

    /// The registers a thread of a kernel compiled with `__launch_bounds__(threads, min_blocks)`
    /// may use: what leaves room for `min_blocks` blocks, in the allocation unit of 8, at most
    /// [`MAX_REGISTERS_PER_THREAD`].
    pub fn register_cap(&self, threads: u32, min_blocks: u32) -> u32 {
        (self.registers_per_sm / (threads * min_blocks.max(1)) / 8 * 8).min(MAX_REGISTERS_PER_THREAD)
    }

    /// The limits of a GPU whose blocks may use `per_block` bytes and whose SMs have that and
    /// the 1 KiB a block keeps ([`SMEM_RESERVED_PER_BLOCK`]): 227 KiB is the H100, 163 KiB the
    /// A100, 99 KiB sm_86 / sm_89 (A10, L4, RTX 3090, RTX 4090), 96 KiB the V100 (whose SM has
    /// no reserve: 96 KiB).
    pub fn gpu_with(per_block: usize) -> Self {
        Self {
            per_block,
            per_sm: per_block + SMEM_RESERVED_PER_BLOCK,
            threads_per_sm: DEFAULT_THREADS_PER_SM,
            registers_per_sm: DEFAULT_REGISTERS_PER_SM,
        }
    }

    /// These limits, with shared memory at most that of a GPU with `cap` bytes a block
    /// (`GPUSORT_SMEM_CAP`); threads and registers as they are.
    pub fn capped(self, cap: Option<usize>) -> Self {
        match cap {
            None => self,
            Some(cap) => {
                let g = Self::gpu_with(cap);
                Self {
                    per_block: self.per_block.min(g.per_block),
                    per_sm: self.per_sm.min(g.per_sm),
                    ..self
                }
            }
        }
    }
}

/// The one-sweep pass's shape.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OnesweepShape {
    /// Threads of a block.
    pub block: u32,
    /// Rows per thread of a tile.
    pub ipt: usize,
    /// Blocks resident on an SM with 8-byte staging (the persistent grid is this many per SM).
    pub blocks_per_sm: u32,
    /// Blocks per SM the pass is compiled for (`ONESWEEP_MIN_BLOCKS`, the minimum of its
    /// `__launch_bounds__`): [`ONESWEEP_COMPILED_THREADS`] worth, at most what the SM's threads
    /// hold. Not fewer where shared memory holds fewer: compiled for the two blocks that 163 KiB
    /// holds (128 registers a thread instead of 80), 100M u32 keys sorted 13% slower on the
    /// H100 (and u64 keys 6% faster; kernels/NOTES.md, "Registers").
    pub min_blocks: u32,
    /// Registers a thread of the pass may use ([`SmLimits::register_cap`] for `min_blocks`).
    pub registers: u32,
}

/// Every kernel's shape on a device: the tiles they are compiled with and the strategies that
/// fit (estimated from the sources' layouts; [`DynSmem`] holds the loaded kernels' real limits).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KernelShapes {
    /// The limits they were chosen for.
    pub limits: SmLimits,
    /// Rows per thread of a GRS / SRTS / MSD tile (`IPT`).
    pub ipt: usize,
    /// The one-sweep pass, or `None` where no tile of it fits (SRTS then runs three kernels a
    /// pass).
    pub onesweep: Option<OnesweepShape>,
    /// MSD partition digits of up to 11 bits fit with 8-byte staging (else up to 8 bits).
    pub msd_wide: bool,
    /// Most key words the MSD block-local sort holds with 4-byte and with 8-byte staging (0: the
    /// MSD hybrid is not used for such sorts; SRTS is).
    pub msd_local_words: [usize; 2],
}

impl KernelShapes {
    /// The shapes for `limits` and the tuning asked for: each tile as asked where it fits, else
    /// the largest that fits; the one-sweep tile (unless `GPUSORT_ONESWEEP_IPT` chose it) shrunk
    /// to keep [`ONESWEEP_MIN_RESIDENT`] blocks per SM, down to [`ONESWEEP_MIN_IPT`] rows per
    /// thread.
    pub fn new(limits: SmLimits, tuning: &KernelTuning) -> Self {
        let per_block = limits.per_block;
        let tile_fits = |ipt: usize| {
            let tile = BLOCK as usize * ipt;
            scatter_smem(tile, MAX_STAGE_WIDTH) as usize + SCATTER_STATIC_SMEM <= per_block
                && msd_scatter_smem(false, tile, MAX_STAGE_WIDTH) <= per_block
        };
        let ipt = (1..=tuning.ipt).rev().find(|&i| tile_fits(i)).unwrap_or(1);
        let block = tuning.onesweep_block();
        let os_need = |i: usize| {
            scatter_smem(block as usize * i, MAX_STAGE_WIDTH) as usize + onesweep_static_smem(block as usize)
        };
        let os_shape = |i: usize| {
            let min_blocks = tuning.onesweep_min_blocks.unwrap_or_else(|| {
                (ONESWEEP_COMPILED_THREADS / block).clamp(1, (limits.threads_per_sm / block).max(1))
            });
            let registers = limits.register_cap(block, min_blocks);
            OnesweepShape {
                block,
                ipt: i,
                blocks_per_sm: limits.resident(os_need(i), block, registers),
                min_blocks,
                registers,
            }
        };
        let asked = tuning.onesweep_ipt();
        let fitting = (1..=asked).rev().find(|&i| os_need(i) <= per_block);
        let onesweep = match (tuning.onesweep_ipt, fitting) {
            (_, None) => None,
            (Some(_), Some(i)) => Some(os_shape(i)),
            (None, Some(i)) => Some(
                (ONESWEEP_MIN_IPT.min(i)..=i)
                    .rev()
                    .map(os_shape)
                    .find(|s| s.blocks_per_sm >= ONESWEEP_MIN_RESIDENT)
                    .unwrap_or_else(|| os_shape(i)),
            ),
        };
        let tile = BLOCK as usize * ipt;
        let local_words = |stage: usize| {
            (1..=MSD_LOCAL_MAX_WORDS)
                .rev()
                .find(|&w| msd_local_smem(w, stage) + MSD_LOCAL_STATIC_SMEM <= per_block)
                .unwrap_or(0)
        };
        Self {
            limits,
            ipt,
            onesweep: onesweep.filter(|s| s.blocks_per_sm >= 1),
            msd_wide: msd_scatter_smem(true, tile, MAX_STAGE_WIDTH) <= per_block,
            msd_local_words: [local_words(4), local_words(MAX_STAGE_WIDTH)],
        }
    }

    /// The most key words the MSD hybrid's block-local sort holds with values staged
    /// `stage_width` bytes wide (4, or 8 for lanes wider than 4 bytes), where its partition
    /// scatter fits too; 0 where the MSD hybrid cannot run at all.
    pub fn msd_key_words(&self, stage_width: usize) -> usize {
        let stage = stage_width.clamp(4, MAX_STAGE_WIDTH);
        let scatter_fits = msd_scatter_smem(false, BLOCK as usize * self.ipt, stage) <= self.limits.per_block;
        if scatter_fits {
            self.msd_local_words[(stage > 4) as usize]
        } else {
            0
        }
    }

    /// The strategy a sort planned as `planned` runs with these shapes, for a key whose passes
    /// read `key_words` words and lanes staged `stage_width` bytes wide (the widest moved lane,
    /// 4 to 8): the MSD hybrid or sample sort where the MSD kernels they end in hold that key
    /// ([`Self::msd_key_words`]), else SRTS with the same record move; GRS and SRTS as planned. The one place this is decided:
    /// [`Gpu::sort`](crate::Gpu::sort) runs it and reports it, and the plan (`GpuSortExec`'s
    /// EXPLAIN) names it.
    pub fn runnable(&self, planned: Strategy, key_words: usize, stage_width: usize) -> Strategy {
        if planned.algorithm.sorts_in_blocks() && key_words > self.msd_key_words(stage_width) {
            Strategy::new(Algorithm::Srts, planned.record_move)
        } else {
            planned
        }
    }

    /// `tuning` with the tiles of these shapes: unchanged where they are as asked (so the H100's
    /// programs are the prebuilt ones).
    pub fn tuning(&self, tuning: &KernelTuning) -> KernelTuning {
        let mut t = tuning.clone();
        t.ipt = self.ipt;
        if let Some(s) = self.onesweep {
            if s.ipt != tuning.onesweep_ipt() {
                t.onesweep_ipt = Some(s.ipt);
            }
            if s.min_blocks != (ONESWEEP_COMPILED_THREADS / s.block).max(1) {
                t.onesweep_min_blocks = Some(s.min_blocks);
            }
        }
        t
    }
}

impl fmt::Display for KernelShapes {
    /// One line: the limits, the tiles, the strategies that fit.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} KiB a block, {} KiB, {} threads and {} Ki registers an SM: tiles {} x {}; ",
            self.limits.per_block >> 10,
            self.limits.per_sm >> 10,
            self.limits.threads_per_sm,
            self.limits.registers_per_sm >> 10,
            BLOCK,
            self.ipt
        )?;
        match self.onesweep {
            Some(s) => write!(
                f,
                "one sweep {} x {} ({} blocks/SM, compiled for {}: {} registers a thread)",
                s.block, s.ipt, s.blocks_per_sm, s.min_blocks, s.registers
            )?,
            None => write!(f, "no one sweep (SRTS three-kernel passes)")?,
        }
        write!(
            f,
            "; MSD partition digits up to {} bits, ",
            if self.msd_wide { 11 } else { 8 }
        )?;
        match self.msd_local_words {
            [0, 0] => write!(f, "no MSD block-local sort (SRTS instead)"),
            [w4, w8] => write!(
                f,
                "MSD block-local sorts of keys up to {w4} words (4-byte lanes), {w8} (8-byte lanes)"
            ),
        }
    }
}

/// The dynamic shared memory each loaded kernel may use: what the shapes need, at most what the
/// block limit leaves beside the kernel's static shared memory (set as its
/// `MAX_DYNAMIC_SHARED_SIZE_BYTES` when loaded).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct DynSmem {
    /// GRS and SRTS scatters (both bin counts).
    pub scatter: u32,
    /// The one-sweep pass.
    pub onesweep: u32,
    /// MSD partition scatters of 256 and 2048 bins.
    pub msd_scatter: [u32; 2],
    /// The MSD block-local sort.
    pub msd_local: u32,
}

#[cfg(test)]
mod tests {
    use super::*;

    const KIB: usize = 1024;

    fn shapes(per_block_kib: usize) -> KernelShapes {
        KernelShapes::new(SmLimits::gpu_with(per_block_kib * KIB), &KernelTuning::default())
    }

    /// A GPU's limits: `per_block` and `per_sm` KiB of shared memory, `threads` an SM.
    fn gpu(per_block: usize, per_sm: usize, threads_per_sm: u32) -> SmLimits {
        SmLimits {
            per_block: per_block * KIB,
            per_sm: per_sm * KIB,
            threads_per_sm,
            registers_per_sm: 64 * 1024,
        }
    }

    /// A one-sweep shape of 256-thread blocks compiled for `min_blocks` an SM (80 registers a
    /// thread for 3 blocks, 128 for 2, 255 for 1).
    fn os(ipt: usize, blocks_per_sm: u32, min_blocks: u32) -> Option<OnesweepShape> {
        Some(OnesweepShape {
            block: 256,
            ipt,
            blocks_per_sm,
            min_blocks,
            registers: [255, 255, 128, 80][min_blocks as usize],
        })
    }

    /// The shape function at the limits of the V100 (96 KiB), sm_86/sm_89 (99 KiB), the A100
    /// (163 KiB) and the H100 (227 KiB; 228 KiB an SM): the H100 gets the measured shapes. The
    /// pass is compiled for three blocks of 256 wherever an SM's threads hold them.
    #[test]
    fn shapes_at_each_gpu_s_shared_memory() {
        let h100 = KernelShapes::new(gpu(227, 228, 2048), &KernelTuning::default());
        assert_eq!(h100, shapes(227));
        assert_eq!(
            (h100.ipt, h100.onesweep, h100.msd_wide, h100.msd_local_words),
            (16, os(20, 3, 3), true, [4, 4])
        );
        assert_eq!(h100.tuning(&KernelTuning::default()), KernelTuning::default());
        let a100 = shapes(163);
        assert_eq!(
            (a100.ipt, a100.onesweep, a100.msd_wide, a100.msd_local_words),
            (16, os(20, 2, 3), true, [3, 3])
        );
        assert_eq!(a100.tuning(&KernelTuning::default()), KernelTuning::default());
        let ada = shapes(99);
        assert_eq!(
            (ada.ipt, ada.onesweep, ada.msd_wide, ada.msd_local_words),
            (16, os(12, 2, 3), false, [1, 0])
        );
        assert_eq!(ada.tuning(&KernelTuning::default()).onesweep_ipt, Some(12));
        // sm_86 / sm_89 as they are: 1536 threads an SM hold the same two blocks.
        assert_eq!(
            KernelShapes::new(gpu(99, 100, 1536), &KernelTuning::default()),
            KernelShapes {
                limits: gpu(99, 100, 1536),
                ..ada
            }
        );
        let volta = shapes(96);
        assert_eq!(
            (volta.ipt, volta.onesweep, volta.msd_wide, volta.msd_local_words),
            (16, os(12, 2, 3), false, [1, 0])
        );
        // A real V100's SM has 96 KiB, no reserve beyond the block's: a smaller tile keeps 2 blocks.
        let v100 = KernelShapes::new(gpu(96, 96, 2048), &KernelTuning::default());
        assert_eq!(v100.onesweep, os(11, 2, 3));
        // Turing (sm_75: 64 KiB a block and an SM, 1024 threads): one one-sweep block an SM; no
        // MSD.
        let turing = KernelShapes::new(gpu(64, 64, 1024), &KernelTuning::default());
        assert_eq!(
            (turing.ipt, turing.onesweep, turing.msd_wide, turing.msd_local_words),
            (16, os(17, 1, 3), false, [0, 0])
        );
        // Threads bound residency and the compiled blocks where shared memory does not: 512
        // threads an SM hold two blocks.
        let few_threads = KernelShapes::new(gpu(227, 228, 512), &KernelTuning::default());
        assert_eq!(few_threads.onesweep, os(20, 2, 2));
        assert_eq!(
            few_threads.tuning(&KernelTuning::default()).onesweep_min_blocks,
            Some(2)
        );
        // Asked-for compiled blocks stay as asked; the registers follow them.
        let asked = KernelTuning {
            onesweep_min_blocks: Some(1),
            ..KernelTuning::default()
        };
        assert_eq!(KernelShapes::new(gpu(227, 228, 2048), &asked).onesweep, os(20, 1, 1));
        assert_eq!(
            h100.to_string(),
            "227 KiB a block, 228 KiB, 2048 threads and 64 Ki registers an SM: tiles 256 x 16; one sweep 256 x 20 \
             (3 blocks/SM, compiled for 3: 80 registers a thread); MSD partition \
             digits up to 11 bits, MSD block-local sorts of keys up to 4 words (4-byte lanes), 4 (8-byte lanes)"
        );
        assert_eq!(
            volta.to_string(),
            "96 KiB a block, 97 KiB, 2048 threads and 64 Ki registers an SM: tiles 256 x 16; one sweep 256 x 12 \
             (2 blocks/SM, compiled for 3: 80 registers a thread); MSD partition \
             digits up to 8 bits, MSD block-local sorts of keys up to 1 words (4-byte lanes), 0 (8-byte lanes)"
        );
    }

    /// A planned MSD (or sample) sort runs as planned only where the block-local sort holds the key at the lanes'
    /// staging (the shapes' `msd_local_words`: 4 / 4 words on the H100, 3 / 3 at 163 KiB, 1 / 0
    /// at 99 KiB, none at 64 KiB), else SRTS with the same record move; GRS and SRTS run as
    /// planned.
    #[test]
    fn msd_runs_where_the_shapes_hold_its_key() {
        for (kib, held) in [(227, [4, 4]), (163, [3, 3]), (99, [1, 0]), (96, [1, 0]), (64, [0, 0])] {
            let sh = shapes(kib);
            for (stage, held) in [(4, held[0]), (8, held[1])] {
                assert_eq!(sh.msd_key_words(stage), held, "{kib} KiB, stage {stage}");
                for words in 1..=MSD_LOCAL_MAX_WORDS + 1 {
                    for planned in Strategy::ALL {
                        let runs = sh.runnable(planned, words, stage);
                        let want = match planned.algorithm {
                            Algorithm::Msd | Algorithm::Sample if words > held => {
                                Strategy::new(Algorithm::Srts, planned.record_move)
                            }
                            _ => planned,
                        };
                        assert_eq!(runs, want, "{kib} KiB, stage {stage}, {words} words, {planned}");
                    }
                }
            }
        }
    }

    /// Every shape fits its limits, whatever the tuning, and smaller limits never get larger tiles.
    #[test]
    fn shapes_fit_their_limits() {
        let mut last: Option<KernelShapes> = None;
        for kib in (48..=228).rev() {
            for (ipt, os_ipt, os_block) in [(16, None, None), (32, Some(32), Some(512)), (8, Some(4), Some(384))] {
                let t = KernelTuning {
                    ipt,
                    onesweep_ipt: os_ipt,
                    onesweep_block: os_block,
                    ..KernelTuning::default()
                };
                let s = shapes_for(kib, &t);
                let tile = BLOCK as usize * s.ipt;
                assert!(scatter_smem(tile, 8) as usize + SCATTER_STATIC_SMEM <= kib * KIB);
                if let Some(o) = s.onesweep {
                    let need =
                        scatter_smem(o.block as usize * o.ipt, 8) as usize + onesweep_static_smem(o.block as usize);
                    assert!(need <= kib * KIB && o.blocks_per_sm >= 1, "{kib} KiB: {s}");
                    assert!(o.ipt <= t.onesweep_ipt());
                }
                if s.msd_wide {
                    assert!(msd_scatter_smem(true, tile, 8) <= kib * KIB);
                }
                assert!(s.ipt <= ipt);
            }
            let s = shapes(kib);
            if let Some(l) = last {
                assert!(
                    s.ipt <= l.ipt && s.msd_local_words[1] <= l.msd_local_words[1],
                    "{kib} KiB"
                );
            }
            last = Some(s);
        }
        // The cap lowers both limits, never raises them.
        let h100 = gpu(227, 228, 2048);
        assert_eq!(h100.capped(None), h100);
        assert_eq!(h100.capped(Some(99 * KIB)), SmLimits::gpu_with(99 * KIB));
        assert_eq!(h100.capped(Some(300 * KIB)), h100);
    }

    /// The H100's programs are the prebuilt ones; the programs of every capped shape compile
    /// (for sm_90, where NVRTC is installed; `GPUSORT_REQUIRE_GPU=1` makes its absence a failure).
    #[test]
    fn each_cap_s_programs_build() {
        for (name, source) in shapes(227).tuning(&KernelTuning::default()).programs() {
            assert!(
                crate::prebuilt::find(&source, "sm_90").is_some(),
                "{name} is not prebuilt"
            );
        }
        if !crate::device::nvrtc_present() {
            return crate::test_support::not_run("CAPPED PROGRAMS COMPILE TEST", "NVRTC (libnvrtc) is not installed");
        }
        let default = KernelTuning::default().programs();
        for kib in [96, 99, 163] {
            for (name, source) in shapes(kib).tuning(&KernelTuning::default()).programs() {
                if default.iter().any(|(n, s)| *n == name && *s == source) {
                    continue;
                }
                let cubin = crate::kernels::compile_cubin(&source, "sm_90");
                assert!(cubin.is_ok(), "{kib} KiB {name}: {}", cubin.unwrap_err());
            }
        }
    }

    fn shapes_for(kib: usize, t: &KernelTuning) -> KernelShapes {
        KernelShapes::new(SmLimits::gpu_with(kib * KIB), t)
    }
}
