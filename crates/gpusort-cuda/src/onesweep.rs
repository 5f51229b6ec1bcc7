//! SRTS's pass as one sweep (`kernels/onesweep.cu`): Adinets & Merrill's one-sweep radix sort
//! ("Onesweep: A Faster Least Significant Digit Radix Sort for GPUs", 2022; not one of
//! Bandyopadhyay & Sahni's algorithms), with decoupled look-back.
//!
//! It runs where [`onesweep_plan`] allows: digits of 5 to 8 bits and fewer than 2^30 rows. One
//! histogram read of each key word counts the digits of all its passes, and each pass is then a
//! single kernel that finds its tiles' digit offsets by looking back over the tiles before them,
//! where the paper's SRTS pass runs an upsweep (a second read of the key word) and a spine
//! before the downsweep: at 100M u32 keys on the H100 those two cost ~0.19 ms of each ~1.03 ms
//! pass. Passes of digits of up to 4 bits (16 bins), and every pass of 2^30 rows or more, keep
//! SRTS's three kernels (`srts.rs`).

use cudarc::driver::{CudaSlice, DevicePtr, LaunchConfig, PushKernelArg};
use gpusort::plan::RadixPass;

use crate::error::Result;
use crate::gpu::Gpu;
use crate::kernels::{BLOCK, ONESWEEP_HIST_IPT, ONESWEEP_MAX_DIGITS, ONESWEEP_MAX_ROWS};
use crate::lanes::{PassInputs, scatter_smem};
use crate::profile::Profile;

/// The narrowest digit of a one-sweep pass: only the 256-bin pass is compiled, and digits of up
/// to 4 bits keep SRTS's 16-bin kernels.
pub const ONESWEEP_MIN_BITS: u32 = 5;

/// Words of the one-sweep state before its look-back table: word 0 is the tile counter; the
/// table starts 128 bytes in.
const ONESWEEP_HEADER_WORDS: usize = 32;

/// Words of the one-sweep state of a pass over `num_tiles` tiles: the header (tile counter)
/// and one look-back word per (tile, digit of 256). Zeroed before every pass.
pub(crate) fn onesweep_state_words(num_tiles: usize) -> usize {
    ONESWEEP_HEADER_WORDS + num_tiles * 256
}

/// One `onesweep_histogram` launch: up to [`ONESWEEP_MAX_DIGITS`] digit positions of key word
/// `word`, counted into the histogram slots `first_slot..first_slot + digits` (256 words each).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct HistLaunch {
    pub(crate) word: usize,
    pub(crate) first_slot: usize,
    pub(crate) digits: u32,
    /// Byte i: digit i's lowest bit.
    pub(crate) shifts: u32,
    /// Byte i: digit i's width in bits.
    pub(crate) widths: u32,
}

/// How SRTS's passes run as one sweep: the histogram launches (one per key word the one-sweep
/// passes read, more only for words of more than [`ONESWEEP_MAX_DIGITS`] such passes), and
/// each pass's histogram slot (where its digit offsets are after the scan), `None` for a pass
/// that runs the three kernels.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct OnesweepPlan {
    pub(crate) launches: Vec<HistLaunch>,
    pub(crate) slot: Vec<Option<usize>>,
}

impl OnesweepPlan {
    /// Histogram slots in all: one per one-sweep pass.
    pub(crate) fn slots(&self) -> usize {
        self.launches.iter().map(|l| l.digits as usize).sum()
    }
}

/// Whether a pass over `pass`'s digit can run as one sweep: only the 256-bin pass is compiled,
/// and digits of up to 4 bits keep SRTS's 16-bin kernels.
pub(crate) fn onesweep_digit(pass: &RadixPass) -> bool {
    (ONESWEEP_MIN_BITS..=8).contains(&pass.bits) && pass.shift + pass.bits <= 32
}

/// The one-sweep plan of `passes` over `n` rows, or `None` where every pass runs SRTS's three
/// kernels: no row, `n` of 2^30 rows or more (look-back values have 30 bits), or no digit of
/// [`ONESWEEP_MIN_BITS`] to 8 bits. Passes of other digits in a plan run the three kernels.
pub(crate) fn onesweep_plan(n: usize, passes: &[RadixPass]) -> Option<OnesweepPlan> {
    if n == 0 || n > ONESWEEP_MAX_ROWS || !passes.iter().any(onesweep_digit) {
        return None;
    }
    // Words in the order their first one-sweep pass comes.
    let mut words: Vec<usize> = vec![];
    for p in passes.iter().filter(|p| onesweep_digit(p)) {
        if !words.contains(&p.word) {
            words.push(p.word);
        }
    }
    let mut launches = vec![];
    let mut slot = vec![None; passes.len()];
    let mut next = 0;
    for w in words {
        let of_word: Vec<usize> = (0..passes.len())
            .filter(|&p| passes[p].word == w && onesweep_digit(&passes[p]))
            .collect();
        for chunk in of_word.chunks(ONESWEEP_MAX_DIGITS) {
            let mut launch = HistLaunch {
                word: w,
                first_slot: next,
                digits: chunk.len() as u32,
                shifts: 0,
                widths: 0,
            };
            for (i, &p) in chunk.iter().enumerate() {
                launch.shifts |= passes[p].shift << (8 * i);
                launch.widths |= passes[p].bits << (8 * i);
                slot[p] = Some(next);
                next += 1;
            }
            launches.push(launch);
        }
    }
    Some(OnesweepPlan { launches, slot })
}

/// What the one-sweep passes of a sort use: the digit offsets of every pass (256 words per
/// histogram slot), the tile counter and look-back table (zeroed before each pass), the grid.
pub(crate) struct OnesweepBufs {
    hist: CudaSlice<u32>,
    state: CudaSlice<u32>,
    grid: u32,
}

impl Gpu {
    /// Persistent blocks of the one-sweep pass: as many as fit on the device at once (the grid
    /// the prototype measured), at most one per tile.
    /// Under `GPUSORT_SMEM_CAP`, no more blocks than an SM of the capped GPU holds (the
    /// driver's occupancy counts the kernel's real registers).
    fn onesweep_grid(&self, dyn_smem: u32, num_tiles: usize) -> Result<u32> {
        let pass = &self.kernels()?.onesweep_pass;
        let fixed = pass.shared_size_bytes()?.max(0) as usize;
        let capped = self
            .shapes
            .limits
            .resident(dyn_smem as usize + fixed, self.onesweep_block, 1);
        let per_sm = pass
            .occupancy_max_active_blocks_per_multiprocessor(self.onesweep_block, dyn_smem as usize, None)?
            .min(capped)
            .max(1);
        Ok(((self.info.multiprocessors * per_sm) as usize).min(num_tiles).max(1) as u32)
    }

    /// Whether the one-sweep pass fits this device (its shapes have one, and its tile with
    /// `stage_width`-byte staging fits the shared memory the loaded pass may use).
    pub(crate) fn onesweep_fits(&self, stage_width: usize) -> Result<bool> {
        Ok(self.shapes.onesweep.is_some()
            && scatter_smem(self.onesweep_tile, stage_width) <= self.kernels()?.smem.onesweep)
    }

    /// The one-sweep passes' digit offsets (kernels/onesweep.cu): one histogram read per key
    /// word counts the digits of all its one-sweep passes, one scan turns each pass's counts
    /// into its digits' first positions. Passes whose digit is constant are not planned (the
    /// planner drops them), so none is looked for here: that would need a download.
    pub(crate) fn onesweep_prepare(
        &self,
        x: &PassInputs<'_>,
        plan: &OnesweepPlan,
        prof: &Profile,
    ) -> Result<OnesweepBufs> {
        let n = x.n;
        let s = &self.stream;
        let k = self.kernels()?;
        let num_tiles = n.div_ceil(self.onesweep_tile);
        let mut hist = self.alloc_words(256 * plan.slots())?;
        s.memset_zeros(&mut hist)?;
        let state = self.alloc_words(onesweep_state_words(num_tiles))?;
        let hist_p = hist.device_ptr(s).0;
        let n32 = n as u32;
        let cfg = |blocks: u32| LaunchConfig {
            grid_dim: (blocks, 1, 1),
            block_dim: (BLOCK, 1, 1),
            shared_mem_bytes: 0,
        };
        let hist_per_sm = k
            .onesweep_histogram
            .occupancy_max_active_blocks_per_multiprocessor(BLOCK, 0, None)?
            .max(1);
        let hist_grid = ((self.info.multiprocessors * hist_per_sm) as usize)
            .min(n.div_ceil(BLOCK as usize * ONESWEEP_HIST_IPT))
            .max(1) as u32;
        for l in &plan.launches {
            let dst = hist_p + (l.first_slot * 256 * 4) as u64;
            // SAFETY: the kernel reads n words of the key word and adds into `digits` zeroed
            // slots of 256 words inside `hist`.
            unsafe {
                s.launch_builder(&k.onesweep_histogram)
                    .arg(&n32)
                    .arg(&x.word_src[l.word])
                    .arg(&l.shifts)
                    .arg(&l.digits)
                    .arg(&l.widths)
                    .arg(&dst)
                    .launch(cfg(hist_grid))?
            };
            prof.mark(self, "onesweep_histogram")?;
        }
        let (slots, no_constant_flags) = (plan.slots() as u32, 0u64);
        // SAFETY: one block per 256-word slot of `hist`; n > 0; a null `constant` is not written.
        unsafe {
            s.launch_builder(&k.onesweep_scan)
                .arg(&hist_p)
                .arg(&n32)
                .arg(&no_constant_flags)
                .launch(cfg(slots))?
        };
        prof.mark(self, "onesweep_scan")?;
        Ok(OnesweepBufs {
            grid: self.onesweep_grid(scatter_smem(self.onesweep_tile, x.stage_width), num_tiles)?,
            hist,
            state,
        })
    }

    /// Pass `p` as one sweep: the tile counter and look-back table zeroed, then one
    /// `onesweep_pass_b8` over the tiles, with the downsweep's lane table, records and shared
    /// memory, its digit offsets from histogram slot `slot`.
    pub(crate) fn onesweep_pass(
        &self,
        x: &PassInputs<'_>,
        p: usize,
        slot: usize,
        b: &mut OnesweepBufs,
        prof: &Profile,
    ) -> Result<()> {
        let s = &self.stream;
        let pass = &x.passes[p];
        let num_tiles = x.n.div_ceil(self.onesweep_tile);
        let (n32, tiles32, mask) = (x.n as u32, num_tiles as u32, (1u32 << pass.bits) - 1);
        let (lanes, num_lanes) = x.lanes(p);
        let offsets = b.hist.device_ptr(s).0 + (slot * 256 * 4) as u64;
        let state_p = b.state.device_ptr(s).0;
        let (counter_p, lookback_p) = (state_p, state_p + (ONESWEEP_HEADER_WORDS * 4) as u64);
        // Stream-ordered: after the previous pass, before this one.
        s.memset_zeros(&mut b.state)?;
        prof.mark(self, "onesweep_clear")?;
        // SAFETY: the kernel reads n rows of the digit word and the pass's 256 digit offsets;
        // the tile counter and num_tiles * 256 look-back words are zeroed; the lane table lists
        // buffers of n rows; n < 2^30 (onesweep_plan).
        unsafe {
            s.launch_builder(&self.kernels()?.onesweep_pass)
                .arg(&n32)
                .arg(&x.digit_src[p])
                .arg(&pass.shift)
                .arg(&mask)
                .arg(&tiles32)
                .arg(&offsets)
                .arg(&counter_p)
                .arg(&lookback_p)
                .arg(&lanes)
                .arg(&num_lanes)
                .arg(&x.recs[p])
                .launch(LaunchConfig {
                    grid_dim: (b.grid, 1, 1),
                    block_dim: (self.onesweep_block, 1, 1),
                    shared_mem_bytes: scatter_smem(self.onesweep_tile, x.stage_width),
                })?
        };
        prof.mark(self, "onesweep_pass")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pass(word: usize, shift: u32, bits: u32) -> RadixPass {
        RadixPass { word, shift, bits }
    }

    #[test]
    fn onesweep_runs_only_digits_of_5_to_8_bits_below_2_pow_30_rows() {
        let eight = gpusort::plan::radix_passes(&[u32::MAX], 8);
        assert_eq!(eight.len(), 4);
        for n in [1, 2, 4095, 4096, 4097, 100_000_000, (1 << 30) - 1] {
            assert!(onesweep_plan(n, &eight).is_some(), "{n} rows");
        }
        assert_eq!(onesweep_plan(1 << 30, &eight), None);
        assert_eq!(onesweep_plan(u32::MAX as usize, &eight), None);
        assert_eq!(onesweep_plan(0, &eight), None);
        assert_eq!(onesweep_plan(10, &[]), None);
        // 4-bit digits (the paper's) keep the 16-bin three-kernel pass; so does any plan with
        // one digit of 1 to 4 bits among 8-bit ones.
        assert_eq!(onesweep_plan(1000, &gpusort::plan::radix_passes(&[u32::MAX], 4)), None);
        assert_eq!(onesweep_plan(1000, &[pass(0, 0, 4), pass(0, 4, 3)]), None);
        for bits in 1..=8 {
            let passes = gpusort::plan::radix_passes(&[u32::MAX], bits);
            let plan = onesweep_plan(1000, &passes);
            assert_eq!(plan.is_some(), bits >= ONESWEEP_MIN_BITS, "{bits}-bit digits");
            if let Some(plan) = plan {
                // At most 5 bits: 5, 5, 5, 5, 4, 4, 4; the 4-bit passes run the three kernels.
                for (p, q) in passes.iter().enumerate() {
                    assert_eq!(plan.slot[p].is_some(), q.bits >= ONESWEEP_MIN_BITS, "{bits}: {q:?}");
                }
                assert_eq!(plan.slots(), plan.slot.iter().flatten().count());
            }
        }
        // A narrow digit among 8-bit ones: only that pass runs the three kernels.
        let plan = onesweep_plan(1000, &[pass(1, 0, 8), pass(1, 8, 8), pass(0, 0, 3)]).unwrap();
        assert_eq!(plan.slot, vec![Some(0), Some(1), None]);
        assert_eq!(plan.launches.len(), 1);
        assert_eq!((plan.launches[0].word, plan.launches[0].digits), (1, 2));
        // What the engine would reject anyway: wider digits, digits past the word's end.
        assert_eq!(onesweep_plan(1000, &[pass(0, 0, 9)]), None);
        assert_eq!(onesweep_plan(1000, &[pass(0, 28, 8)]), None);
    }

    #[test]
    fn onesweep_counts_each_words_digits_in_one_histogram_read() {
        // Three words, least significant (word 2) first; word 1 has 17 varying bits: digits of
        // 6, 6 and 5 bits (masks differ within the launch).
        let passes = gpusort::plan::radix_passes(&[0xff, 0x1ffff << 3, u32::MAX], 8);
        let plan = onesweep_plan(5000, &passes).unwrap();
        assert_eq!(
            plan.launches,
            vec![
                HistLaunch {
                    word: 2,
                    first_slot: 0,
                    digits: 4,
                    shifts: 0x1810_0800,
                    widths: 0x0808_0808,
                },
                HistLaunch {
                    word: 1,
                    first_slot: 4,
                    digits: 3,
                    shifts: (3 + 12) << 16 | (3 + 6) << 8 | 3,
                    widths: 0x05_06_06,
                },
                HistLaunch {
                    word: 0,
                    first_slot: 7,
                    digits: 1,
                    shifts: 0,
                    widths: 8,
                },
            ]
        );
        assert_eq!(plan.slot, (0..8).map(Some).collect::<Vec<_>>());
        assert_eq!(plan.slots(), 8);
        // Every pass has its own slot, in the launch of its word, at its digit's index there.
        for (p, q) in passes.iter().enumerate() {
            let l = plan
                .launches
                .iter()
                .find(|l| {
                    l.word == q.word
                        && (l.first_slot..l.first_slot + l.digits as usize).contains(&plan.slot[p].unwrap())
                })
                .unwrap();
            let i = plan.slot[p].unwrap() - l.first_slot;
            assert_eq!((l.shifts >> (8 * i)) & 0xff, q.shift);
            assert_eq!((l.widths >> (8 * i)) & 0xff, q.bits);
        }
        // More than four digits of one word (narrow digits), and a word's passes apart: every
        // launch counts at most four positions of one word, slots stay distinct.
        let passes = [
            pass(1, 0, 5),
            pass(0, 0, 8),
            pass(1, 5, 5),
            pass(1, 10, 5),
            pass(1, 15, 5),
            pass(1, 20, 5),
            pass(1, 25, 7),
        ];
        let plan = onesweep_plan(10, &passes).unwrap();
        assert_eq!(
            plan.launches
                .iter()
                .map(|l| (l.word, l.first_slot, l.digits))
                .collect::<Vec<_>>(),
            vec![(1, 0, 4), (1, 4, 2), (0, 6, 1)]
        );
        assert_eq!(
            plan.slot,
            vec![Some(0), Some(6), Some(1), Some(2), Some(3), Some(4), Some(5)]
        );
        assert_eq!(plan.launches[1].shifts, 25 << 8 | 20);
        assert_eq!(plan.launches[1].widths, 7 << 8 | 5);
    }

    #[test]
    fn onesweep_state_holds_a_counter_and_a_look_back_word_per_tile_and_digit() {
        assert_eq!(onesweep_state_words(1), ONESWEEP_HEADER_WORDS + 256);
        // 100M rows in tiles of 4096: 24415 tiles, ~25 MB of look-back words (0.25 byte a row,
        // within the scratch that backend.rs counts per row).
        let tiles = 100_000_000usize.div_ceil(4096);
        assert_eq!(tiles, 24_415);
        assert_eq!(onesweep_state_words(tiles) * 4, 128 + 24_415 * 1024);
        // The look-back table starts 128 bytes in, after the tile counter.
        const { assert!(ONESWEEP_HEADER_WORDS * 4 == 128) };
        assert!(onesweep_state_words(tiles) * 4 <= 100_000_000 / 256 * 1024);
    }
}
