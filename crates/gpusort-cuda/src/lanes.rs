//! Lanes: what a radix pass moves, for every family that moves rows (`kernels/grs.cu`,
//! `srts.cu`, `onesweep.cu` and `msd.cu`, through `struct Lane` and `struct Records` of
//! `kernels/common.cuh`).
//!
//! Every column a sort moves — a key word, the row index, a ByField column, Hybrid records — is
//! a [`DoubleBuffer`]: two device buffers that the passes read and write in turn (ping-pong).
//! A pass's **lane table** says, per lane, where it reads, where it writes, its width and its
//! flags; the scatters of the tile (common.cuh `scatter_staged_tile`) move every lane of the
//! table. Moving the payload with the keys in every pass is the paper's direct strategy, moving
//! only the keys and the row index its indirect one (Bandyopadhyay & Sahni, ICPADS 2011,
//! section III).

use cudarc::driver::{CudaSlice, CudaStream, DevicePtr, DeviceRepr};
use gpusort::plan::RadixPass;

use crate::error::Result;
use crate::gpu::Gpu;
use crate::table::{DeviceColumn, DeviceRecords, DeviceTable};

/// Dynamic shared memory of a tile scatter (common.cuh `scatter_staged_tile`) of `tile` rows:
/// the slots' global positions, then the staging of values of `stage_width` bytes.
pub(crate) fn scatter_smem(tile: usize, stage_width: usize) -> u32 {
    (tile * 4 + tile * stage_width) as u32
}

/// A lane of the kernels' lane table (`struct Lane` in `kernels/common.cuh`).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Lane {
    pub(crate) src: u64,
    pub(crate) dst: u64,
    pub(crate) width: u32,
    pub(crate) flags: u32,
}
/// Marks with [`LANE_PAIR`] the first of every two plain 4-byte lanes next to each other (not
/// the digit word, not the row index's first pass), pairing from the front of each table: the
/// scatters move such lanes in pairs (common.cuh `stage_lane_pair`) when their staging has 8
/// bytes a row. Whether any lane was marked.
pub(crate) fn mark_lane_pairs(tables: &mut [Vec<Lane>]) -> bool {
    let plain4 = |l: &Lane| l.width == 4 && l.flags == 0;
    let mut any = false;
    for t in tables {
        let mut l = 0;
        while l + 1 < t.len() {
            if plain4(&t[l]) && plain4(&t[l + 1]) {
                t[l].flags |= LANE_PAIR;
                any = true;
                l += 2;
            } else {
                l += 1;
            }
        }
    }
    any
}

pub(crate) use crate::kernels::{LANE_DIGIT, LANE_IOTA, LANE_PAIR};

impl Lane {
    /// The lane as the six u32 words of the CUDA struct.
    pub(crate) fn as_words(&self) -> [u32; 6] {
        [
            self.src as u32,
            (self.src >> 32) as u32,
            self.dst as u32,
            (self.dst >> 32) as u32,
            self.width,
            self.flags,
        ]
    }
}

/// Hybrid records to move in a pass (`struct Records` in `kernels/common.cuh`).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Records {
    src: u64,
    dst: u64,
    bytes: u32,
    piece: u32,
}
// SAFETY: plain old data with the layout of the CUDA struct.
unsafe impl DeviceRepr for Records {}

impl Records {
    /// Records of `bytes` bytes (a multiple of 4) from `src` to `dst`.
    pub(crate) fn new(src: u64, dst: u64, bytes: usize) -> Self {
        Self {
            src,
            dst,
            bytes: bytes as u32,
            piece: record_piece(bytes),
        }
    }
}

/// The piece a group of threads moves a record of `bytes` bytes (a multiple of 4) in: 16, 8 or
/// 4 bytes (paper Fig. 6).
pub(crate) fn record_piece(bytes: usize) -> u32 {
    [16u32, 8, 4]
        .into_iter()
        .find(|p| bytes.is_multiple_of(*p as usize))
        .unwrap()
}

/// What the pass launchers of both families take: the passes, where each reads its digit,
/// the uploaded lane tables and records, and the dynamic shared memory of the scatters.
pub(crate) struct PassInputs<'a> {
    pub(crate) n: usize,
    pub(crate) passes: &'a [RadixPass],
    /// Each key word's buffer before the first pass (what the one-sweep histogram reads).
    pub(crate) word_src: &'a [u64],
    pub(crate) digit_src: &'a [u64],
    pub(crate) tables: &'a [Vec<Lane>],
    pub(crate) offsets: &'a [usize],
    pub(crate) lane_base: u64,
    pub(crate) recs: &'a [Records],
    /// Bytes a staged value takes in the scatters' shared memory (4 or 8).
    pub(crate) stage_width: usize,
    /// The dynamic shared memory of a GRS / SRTS scatter ([`scatter_smem`] of a tile).
    pub(crate) dyn_smem: u32,
}

impl PassInputs<'_> {
    /// The lane table of pass `p`: its device address and length.
    pub(crate) fn lanes(&self, p: usize) -> (u64, u32) {
        (self.lane_base + self.offsets[p] as u64, self.tables[p].len() as u32)
    }
}

/// A device buffer of either element type.
pub(crate) enum Buf {
    Words(CudaSlice<u32>),
    Bytes(CudaSlice<u8>),
}

impl Buf {
    pub(crate) fn ptr(&self, stream: &CudaStream) -> u64 {
        match self {
            Buf::Words(s) => s.device_ptr(stream).0,
            Buf::Bytes(s) => s.device_ptr(stream).0,
        }
    }
}

/// What a [`DoubleBuffer`] holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Role {
    /// Key word `w` of the table (u32 words).
    KeyWord(usize),
    /// The row index (u32 words), made by the first pass that moves it.
    Index,
    /// A ByField column.
    Column,
    /// Hybrid row-major records (moved as [`Records`], not as a lane).
    Records,
}

/// A column a sort moves, with its two buffers (ping-pong).
pub(crate) struct DoubleBuffer {
    pub(crate) role: Role,
    /// Bytes per row (per record for Hybrid records).
    pub(crate) width: usize,
    pub(crate) bufs: [Option<Buf>; 2],
    /// Which buffer holds the rows now (the LSD passes follow it; the MSD sort goes by depth);
    /// `None`: the row index, not yet made (iota).
    pub(crate) cur: Option<usize>,
}

impl DoubleBuffer {
    fn new(role: Role, width: usize, first: Option<Buf>) -> Self {
        Self {
            role,
            width,
            cur: first.is_some().then_some(0),
            bufs: [first, None],
        }
    }

    /// The key word it is, if it is one.
    pub(crate) fn key_word(&self) -> Option<usize> {
        match self.role {
            Role::KeyWord(w) => Some(w),
            _ => None,
        }
    }

    /// The device address of buffer `b` (0 while it has none).
    pub(crate) fn ptr(&self, b: usize, stream: &CudaStream) -> u64 {
        self.bufs[b].as_ref().map_or(0, |x| x.ptr(stream))
    }

    /// Allocates buffer `b` for `n` rows unless it has one: words for key words and the row
    /// index, bytes for the rest.
    pub(crate) fn ensure(&mut self, gpu: &Gpu, b: usize, n: usize) -> Result<()> {
        if self.bufs[b].is_none() {
            self.bufs[b] = Some(match self.role {
                Role::KeyWord(_) | Role::Index => Buf::Words(gpu.alloc_words(n)?),
                Role::Column | Role::Records => Buf::Bytes(gpu.alloc_bytes(n * self.width)?),
            });
        }
        Ok(())
    }
}

/// What a sort moves, taken out of its [`DeviceTable`] and put back when it is done: the key
/// words, the row index, ByField columns and Hybrid records, in that order (the order of every
/// lane table), and aside the key words no pass reads, which stay as they are.
pub(crate) struct LaneSet {
    pub(crate) lanes: Vec<DoubleBuffer>,
    untouched: Vec<(usize, CudaSlice<u32>)>,
}

impl LaneSet {
    /// Takes from `table` the key words that `moves_word` names (the others wait aside), a row
    /// index when `index`, the ByField columns when `columns` and the Hybrid records when
    /// `records`.
    pub(crate) fn take(
        table: &mut DeviceTable,
        moves_word: impl Fn(usize) -> bool,
        index: bool,
        columns: bool,
        records: bool,
    ) -> Self {
        let mut lanes = vec![];
        let mut untouched = vec![];
        for (w, words) in table.keys.drain(..).enumerate() {
            match moves_word(w) {
                true => lanes.push(DoubleBuffer::new(Role::KeyWord(w), 4, Some(Buf::Words(words)))),
                false => untouched.push((w, words)),
            }
        }
        if index {
            lanes.push(DoubleBuffer::new(Role::Index, 4, None));
        }
        if columns {
            for c in table.columns.drain(..) {
                lanes.push(DoubleBuffer::new(Role::Column, c.width, Some(Buf::Bytes(c.data))));
            }
        }
        if records && let Some(r) = table.records.take() {
            lanes.push(DoubleBuffer::new(Role::Records, r.bytes, Some(Buf::Bytes(r.data))));
        }
        Self { lanes, untouched }
    }

    /// The lane of key word `w`.
    pub(crate) fn key_word(&self, w: usize) -> Option<&DoubleBuffer> {
        self.lanes.iter().find(|l| l.role == Role::KeyWord(w))
    }

    /// Puts every lane's buffer `final_buf(lane)` back into `table` (a lane without one, the
    /// row index never made, is dropped) and returns the row index: the permutation.
    pub(crate) fn restore(
        self,
        table: &mut DeviceTable,
        final_buf: impl Fn(&DoubleBuffer) -> Option<usize>,
    ) -> Option<CudaSlice<u32>> {
        let mut keys = self.untouched;
        let mut perm = None;
        for mut lane in self.lanes {
            let Some(b) = final_buf(&lane) else { continue };
            let buf = lane.bufs[b].take().expect("the final buffer exists");
            match (lane.role, buf) {
                (Role::KeyWord(w), Buf::Words(x)) => keys.push((w, x)),
                (Role::Index, Buf::Words(x)) => perm = Some(x),
                (Role::Column, Buf::Bytes(data)) => table.columns.push(DeviceColumn {
                    data,
                    width: lane.width,
                }),
                (Role::Records, Buf::Bytes(data)) => {
                    table.records = Some(DeviceRecords {
                        data,
                        bytes: lane.width,
                    })
                }
                _ => unreachable!("lanes keep their buffer kinds"),
            }
        }
        keys.sort_by_key(|(w, _)| *w);
        table.keys = keys.into_iter().map(|(_, x)| x).collect();
        perm
    }

    /// Puts every lane's input buffer back into `table`, as [`Self::take`] found it, before
    /// any pass wrote one (a sort that stops after its host work, `presorted.rs`); the row
    /// index and every second buffer are dropped.
    pub(crate) fn restore_input(self, table: &mut DeviceTable) {
        self.restore(table, |lane| (lane.role != Role::Index).then_some(0));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lane_pairs_are_two_plain_four_byte_lanes_side_by_side() {
        let lane = |width, flags| Lane {
            width,
            flags,
            ..Lane::default()
        };
        let marked = |tables: &[Vec<Lane>]| -> Vec<Vec<bool>> {
            tables
                .iter()
                .map(|t| t.iter().map(|l| l.flags & LANE_PAIR != 0).collect())
                .collect()
        };
        // Key word (the digit), three u32 columns: the first two pair, the third moves alone.
        let mut t = vec![vec![lane(4, LANE_DIGIT), lane(4, 0), lane(4, 0), lane(4, 0)]];
        assert!(mark_lane_pairs(&mut t));
        assert_eq!(marked(&t), [[false, true, false, false]]);
        // Four u32 columns: two pairs.
        let mut t = vec![vec![
            lane(4, LANE_DIGIT),
            lane(4, 0),
            lane(4, 0),
            lane(4, 0),
            lane(4, 0),
        ]];
        assert!(mark_lane_pairs(&mut t));
        assert_eq!(marked(&t), [[false, true, false, true, false]]);
        // The row index's first pass is no plain lane; nor is a u32 next to a u64.
        let mut t = vec![
            vec![lane(4, LANE_DIGIT), lane(4, LANE_IOTA), lane(4, 0)],
            vec![lane(4, 0), lane(8, 0), lane(4, 0)],
        ];
        assert!(!mark_lane_pairs(&mut t));
        assert_eq!(marked(&t), [[false; 3], [false; 3]]);
        // One pass with a pair is enough (the staging is one size for all passes).
        let mut t = vec![
            vec![lane(4, LANE_DIGIT), lane(4, LANE_IOTA)],
            vec![lane(4, LANE_DIGIT), lane(4, 0), lane(4, 0)],
        ];
        assert!(mark_lane_pairs(&mut t));
        assert_eq!(marked(&t), [vec![false, false], vec![false, true, false]]);
        // The flag is a bit of its own.
        assert_eq!(LANE_PAIR & (LANE_IOTA | LANE_DIGIT), 0);
    }
}
