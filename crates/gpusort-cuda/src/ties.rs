//! Tie groups ordered on the device (`kernels/ties.cu`, issue 23): rows whose keys tie on a
//! truncated string or binary prefix, with every later sort field exact, need a stable sort of
//! each group by the bytes past the prefix ([`gpusort::ties`], whose [`find_ties`] leaves such
//! groups to the caller). [`Gpu::order_tails`] does it on the device, 8 bytes a round:
//!
//! * groups of up to [`TIES_CAP`] rows are packed back to back into batches, one block each,
//!   and sorted in shared memory by a bitonic merge network, round after round until every run
//!   of equal bytes has ended (`ties_bmcs`, after Dieguez, Amor & Doallo's batched BPLG-BMCS);
//! * larger groups are sorted all at once by gpusort's own stable radix sort of (group, next 8
//!   bytes, bytes left) with the row index (`ties_keys`, [`Gpu::sort`], `ties_scatter`); their
//!   runs still equal take the next 8 bytes, as large groups again or in batches.
//!
//! What goes up is each tied row's bytes past the prefix and past the bytes all rows of its
//! group share, gathered on the host in sorted order ([`GatheredTails`]); or, when the column
//! is a view column whose views and data buffers the key's encoding put on the device
//! ([`DeviceViews`]), only the tied rows, the kernels reading their tails through the views
//! (stop 36: nothing read on the host). What is still equal
//! after [`TIES_MAX_ROUNDS`] rounds (256 bytes past those) is returned for the host's
//! comparison sort. Which rows tie is found on the device too ([`Gpu::tie_marks`]).
//!
//! [`find_ties`]: gpusort::ties::find_ties

use std::ops::Range;
use std::sync::atomic::AtomicUsize;
use std::sync::atomic::Ordering::Relaxed;

use arrow::buffer::{Buffer, ScalarBuffer};
use arrow::compute::SortColumn;
use cudarc::driver::{CudaSlice, DevicePtr, DevicePtrMut, DeviceRepr, LaunchConfig, PushKernelArg, result};
use gpusort::keys::common_prefix;
use gpusort::plan::{Strategy, radix_passes};
use gpusort::ties::{TailGroups, TieBitmaps, TieMarks, TruncationTest};
use rayon::prelude::*;

use crate::error::{CudaSortError, Result};
use crate::gpu::{Gpu, rows_u32};
use crate::kernels::{TIES_BLOCK, TIES_CAP, TIES_MAX_ROUNDS};
use crate::memory::device_bytes_needed;
use crate::pinned::HostBuffer;
use crate::table::{DeviceColumn, DeviceTable, GpuSortPlan};
use crate::transfer::Transfers;

/// The tails on the device, as `ByteColumn` in ties.cu reads them: gathered on the host
/// (`offsets`, i64, and `data`), or read through the tied rows' views.
pub(crate) enum DeviceBytes<'a> {
    Gathered {
        offsets: CudaSlice<u8>,
        data: CudaSlice<u8>,
    },
    /// Tail k: the bytes past the first `skip` (and, with `shared`, the `shared[group_of[k]]`
    /// its group's rows share after them) of the value of `views.views[rows[k]]`.
    Views {
        views: &'a DeviceViews<'a>,
        rows: &'a CudaSlice<u8>,
        skip: u32,
        shared: Option<(&'a CudaSlice<u32>, &'a CudaSlice<u32>)>,
    },
}

/// A string or binary view column on the device with its data buffers, as the key's encoding
/// put them there (`keys.cu`'s view fields): the column's 16-byte views in input order (their
/// buffer indices raised to the session's) and the device address of each buffer they name.
pub(crate) struct DeviceViews<'a> {
    pub(crate) views: &'a CudaSlice<u8>,
    pub(crate) buffers: &'a CudaSlice<u64>,
}

/// `ByteColumn`, passed by value.
#[repr(C)]
struct ByteColumnArg {
    offsets: u64,
    data: u64,
    views: u64,
    rows: u64,
    buffers: u64,
    group_of: u64,
    shared: u64,
    skip: u32,
    pad: u32,
}

// SAFETY: seven device addresses and two words, laid out as the kernel's struct.
unsafe impl DeviceRepr for ByteColumnArg {}

impl DeviceBytes<'_> {
    fn arg(&self, gpu: &Gpu) -> ByteColumnArg {
        let s = gpu.stream();
        match self {
            Self::Gathered { offsets, data } => ByteColumnArg {
                offsets: offsets.device_ptr(s).0,
                data: data.device_ptr(s).0,
                views: 0,
                rows: 0,
                buffers: 0,
                group_of: 0,
                shared: 0,
                skip: 0,
                pad: 0,
            },
            Self::Views {
                views,
                rows,
                skip,
                shared,
            } => ByteColumnArg {
                offsets: 0,
                data: 0,
                views: views.views.device_ptr(s).0,
                rows: rows.device_ptr(s).0,
                buffers: views.buffers.device_ptr(s).0,
                group_of: shared.map_or(0, |(g, _)| g.device_ptr(s).0),
                shared: shared.map_or(0, |(_, b)| b.device_ptr(s).0),
                skip: *skip,
                pad: 0,
            },
        }
    }
}

/// The bytes past the shared ones of every row of some tie groups, gathered on the host in
/// sorted order (one linear read of each tied value, no comparison): their offsets and bytes,
/// and each one's input row. What goes up is the tails, not the column: at TPC-H SF10,
/// `l_comment`'s tied rows' tails are 60 MB against the column's 2.8 GB (views and data
/// buffers), whose upload took longer than the host's whole ordering (stop 26).
///
/// A group's tails start past the bytes all its rows share beyond the key's prefix too (its
/// own common prefix, found in one more read of its values): URL-like values sharing a long
/// path are then ordered by the bytes where they differ, in one round instead of a round of
/// 8 bytes for each shared 8, and fewer bytes go up.
pub(crate) struct GatheredTails {
    /// Where each tail starts and the last one ends (i64), and the tails' bytes; `None` when
    /// the device reads the tails through the rows' views ([`Self::rows_of`]).
    bytes: Option<(Buffer, Vec<u8>)>,
    rows: ScalarBuffer<u32>,
    /// Each tail's group, where the device reads the tails through views (else empty).
    group_of: Vec<u32>,
    /// Where each group's tails start.
    firsts: Vec<usize>,
    /// Bytes each group's rows share past the key's prefix, not gathered (through views: 0
    /// here, the device finds them).
    shared: Vec<usize>,
}

impl GatheredTails {
    /// The tails of `tails`' groups of `column`, the rows at their positions in `perm`; `None`
    /// where the column is not a string or binary array.
    pub(crate) fn gather(column: &SortColumn, tails: &TailGroups, perm: &[u32]) -> Option<Self> {
        let (firsts, rows, group_of) = listed(tails, perm);
        let skip = tails.skip;
        gpusort::ties::with_value_bytes(column, |bytes| {
            let shared = shared_bytes(&rows, &group_of, &firsts, |r| &bytes(r)[skip..]);
            let lens: Vec<usize> = (rows.par_iter().zip(&group_of))
                .map(|(&r, &k)| bytes(r as usize).len().saturating_sub(skip + shared[k as usize]))
                .collect();
            let mut ends = Vec::with_capacity(rows.len() + 1);
            ends.push(0i64);
            for &l in &lens {
                ends.push(ends.last().unwrap() + l as i64);
            }
            let mut data = vec![0u8; *ends.last().unwrap() as usize];
            let base = data.as_mut_ptr() as usize;
            (rows.par_iter().zip(&group_of).zip(ends.par_iter())).for_each(|((&r, &k), &at)| {
                let tail = &bytes(r as usize)[skip + shared[k as usize]..];
                // SAFETY: the tails' ranges of `data` are disjoint and within it.
                unsafe { std::ptr::copy_nonoverlapping(tail.as_ptr(), (base as *mut u8).add(at as usize), tail.len()) };
            });
            Self {
                bytes: Some((Buffer::from_vec(ends), data)),
                rows: ScalarBuffer::from(rows),
                group_of: vec![],
                firsts,
                shared,
            }
        })
    }

    /// The rows of `tails`' groups at their positions in `perm`, for the device to read their
    /// tails through their views ([`DeviceViews`]): no byte is read on the host; the bytes a
    /// group's rows share are found on the device (`ties_shared`).
    pub(crate) fn rows_of(tails: &TailGroups, perm: &[u32]) -> Self {
        let (firsts, rows, group_of) = listed(tails, perm);
        Self {
            bytes: None,
            rows: ScalarBuffer::from(rows),
            group_of,
            shared: vec![0; firsts.len()],
            firsts,
        }
    }

    /// Whether tails of `column` can be gathered (strings and binaries of every layout).
    pub(crate) fn takes(column: &SortColumn) -> bool {
        gpusort::ties::with_value_bytes(column, |_| ()).is_some()
    }

    /// Device bytes its upload holds, with the sorts' own ([`tails_device_bytes`]).
    pub(crate) fn device_bytes(&self, tails: &TailGroups) -> usize {
        let bytes = self.bytes.as_ref().map_or(0, |(o, d)| o.len() + d.len());
        bytes + 4 * self.group_of.len() + 8 * self.firsts.len() + 8 * self.rows.len() + tails_device_bytes(tails)
    }

    /// Bytes of the gathered tails (0 when read through views).
    pub(crate) fn len(&self) -> usize {
        self.bytes.as_ref().map_or(0, |(_, d)| d.len())
    }
}

/// Where each of `tails`' groups starts among their rows listed group after group, those rows
/// (input rows, from `perm`) and each one's group.
fn listed(tails: &TailGroups, perm: &[u32]) -> (Vec<usize>, Vec<u32>, Vec<u32>) {
    let firsts = firsts(&tails.groups);
    let (rows, group_of): (Vec<u32>, Vec<u32>) = (tails.groups.par_iter().enumerate())
        .flat_map_iter(|(k, g)| perm[g.clone()].iter().map(move |&r| (r, k as u32)))
        .unzip();
    (firsts, rows, group_of)
}

/// What [`Gpu::order_tails`] did, and the groups it left to the host.
#[derive(Debug, Default)]
pub(crate) struct TailsOrdered {
    /// Batches of small groups sorted in shared memory (`ties_bmcs` blocks).
    pub batches: usize,
    /// Radix sorts of large groups.
    pub large_rounds: usize,
    /// Groups still equal after [`TIES_MAX_ROUNDS`] rounds, each with the bytes its rows share:
    /// for [`gpusort::ties::order_tails`] on the host.
    pub left: Vec<(Range<usize>, usize)>,
}

/// Device bytes [`Gpu::order_tails`] holds beside the tails for `tails`' groups: the radix
/// sort of the large groups' rows at their first round, and the batch tables.
pub(crate) fn tails_device_bytes(tails: &TailGroups) -> usize {
    let large: usize = tails.groups.iter().map(|g| g.len()).filter(|&l| l > TIES_CAP).sum();
    let large_sort = if large > 0 {
        device_bytes_needed(large, 4, &[4], 0, true, false) + 16 * tails.groups.len()
    } else {
        0
    };
    large_sort + 16 * tails.groups.len() + (1 << 20)
}

impl Gpu {
    /// Orders `tails`' groups of `perm` (sorted position -> input row) on the device by their
    /// `gathered` tails: the tails' indices sorted as [`Self::order_tails`] does, group by group,
    /// then each group's input rows written at its positions (`ties_place`). Returns what
    /// [`Self::order_tails`] did, with the groups left to the host as ranges of `perm` and the
    /// bytes their rows share.
    ///
    /// Tails that were not gathered are read through `views`, the column's views and data
    /// buffers on the device.
    pub(crate) fn order_gathered(
        &self,
        gathered: &GatheredTails,
        views: Option<&DeviceViews<'_>>,
        tails: &TailGroups,
        perm: &mut CudaSlice<u32>,
        copies: &mut Transfers,
    ) -> Result<TailsOrdered> {
        let m = gathered.rows.len();
        let m32 = rows_u32(m)?;
        let s = self.stream();
        let krow = copies.upload_heap(self, gathered.rows.inner().as_slice())?;
        let mut shared = gathered.shared.clone();
        let shared_dev;
        let bytes = match (&gathered.bytes, views) {
            (Some((offsets, data)), _) => DeviceBytes::Gathered {
                offsets: copies.upload_heap(self, offsets.as_slice())?,
                data: copies.upload_heap(self, data)?,
            },
            (None, Some(views)) => {
                let skip = u32::try_from(tails.skip)
                    .map_err(|_| CudaSortError::Unsupported(format!("a string prefix of {} bytes", tails.skip)))?;
                shared_dev = self.group_shared_bytes(views, &krow, skip, gathered)?;
                let found = s.clone_dtoh(&shared_dev.1)?;
                shared = found.iter().map(|&b| b as usize).collect();
                DeviceBytes::Views {
                    views,
                    rows: &krow,
                    skip,
                    shared: Some((&shared_dev.0, &shared_dev.1)),
                }
            }
            (None, None) => {
                return Err(CudaSortError::Unsupported(
                    "tails neither gathered nor on the device".into(),
                ));
            }
        };
        let mut ks = self.iota(m)?;
        let by_tail = TailGroups {
            groups: (gathered.firsts.iter().zip(&tails.groups))
                .map(|(&f, g)| f..f + g.len())
                .collect(),
            skip: 0,
            ..tails.clone()
        };
        let mut done = self.order_tails(&bytes, &by_tail, &mut ks, copies)?;
        let groups_dev = s.clone_htod(&group_table(&tails.groups, &gathered.firsts)?)?;
        let count = rows_u32(tails.groups.len())?;
        // SAFETY: the table describes the groups, `m` rows in all, inside `perm`; `ks` holds
        // indices of `krow`.
        unsafe {
            s.launch_builder(&self.kernels()?.ties_place)
                .arg(&groups_dev)
                .arg(&count)
                .arg(&m32)
                .arg(&ks)
                .arg(&krow)
                .arg(perm)
                .launch(self.grid_for(m))?
        };
        s.synchronize()?;
        // The groups left to the host, from ranges of tails back to ranges of `perm`.
        for (r, skip) in &mut done.left {
            let (g, at) = in_perm(&tails.groups, &gathered.firsts, r);
            *r = at;
            *skip += tails.skip + shared[g];
        }
        Ok(done)
    }

    /// The bytes each group of `gathered` (its tails read through `views` past `skip`) shares
    /// past `skip`, found on the device (`ties_shared`): each tail's group and the groups'
    /// shared bytes, on the device.
    fn group_shared_bytes(
        &self,
        views: &DeviceViews<'_>,
        krow: &CudaSlice<u8>,
        skip: u32,
        gathered: &GatheredTails,
    ) -> Result<(CudaSlice<u32>, CudaSlice<u32>)> {
        let s = self.stream();
        let m = gathered.rows.len();
        let m32 = rows_u32(m)?;
        let group_of = s.clone_htod(&gathered.group_of)?;
        let firsts: Vec<u32> = gathered.firsts.iter().map(|&f| rows_u32(f)).collect::<Result<_>>()?;
        let firsts = s.clone_htod(&firsts)?;
        let mut shared = s.alloc_zeros::<u32>(gathered.firsts.len().max(1))?;
        // SAFETY: `shared` holds a word per group; every byte 0xFF makes each word u32::MAX.
        unsafe {
            result::memset_d8_async(
                shared.device_ptr_mut(s).0,
                0xFF,
                4 * gathered.firsts.len(),
                s.cu_stream(),
            )
        }?;
        let col = DeviceBytes::Views {
            views,
            rows: krow,
            skip,
            shared: None,
        }
        .arg(self);
        // SAFETY: `group_of` and `krow` hold a word per tail, `firsts` and `shared` per group;
        // the views and buffers hold every row `krow` names.
        unsafe {
            s.launch_builder(&self.kernels()?.ties_shared)
                .arg(&col)
                .arg(&group_of)
                .arg(&firsts)
                .arg(&m32)
                .arg(&mut shared)
                .launch(self.grid_for(m))?
        };
        Ok((group_of, shared))
    }

    /// Orders `tails`' groups of `perm` (sorted position -> input row) by `column`'s bytes
    /// past their shared ones, stably: small groups in batches, large groups by the radix sort
    /// (module docs). Returns when the device is done.
    pub(crate) fn order_tails(
        &self,
        column: &DeviceBytes,
        tails: &TailGroups,
        perm: &mut CudaSlice<u32>,
        copies: &mut Transfers,
    ) -> Result<TailsOrdered> {
        let mut done = TailsOrdered::default();
        let (mut small, mut large): (Vec<_>, Vec<_>) = tails.groups.iter().cloned().partition(|g| g.len() <= TIES_CAP);
        let mut skip = tails.skip;
        // Kept until the device is done with them.
        let mut unfinished = vec![];
        for round in 0.. {
            if !small.is_empty() {
                unfinished.push(self.bmcs_batches(column, tails.descending, skip, &small, perm)?);
                done.batches += unfinished.last().map_or(0, |u| u.2.len());
            }
            if large.is_empty() {
                break;
            }
            if round == TIES_MAX_ROUNDS {
                done.left.extend(large.into_iter().map(|g| (g, skip)));
                break;
            }
            let runs = self.large_round(column, tails.descending, skip, &large, perm, copies)?;
            done.large_rounds += 1;
            skip += 8;
            (small, large) = runs.into_iter().partition(|g| g.len() <= TIES_CAP);
        }
        // The batches that ran out of rounds: their groups, as they were, go to the host.
        for (flags, skip, batches) in unfinished {
            let flags = self.stream().clone_dtoh(&flags)?;
            for (b, groups) in batches.into_iter().enumerate() {
                if flags[b] != 0 {
                    done.left.extend(groups.into_iter().map(|g| (g, skip)));
                }
            }
        }
        Ok(done)
    }

    /// Launches `ties_bmcs` over `groups` (each at most [`TIES_CAP`] rows, sharing `skip`
    /// bytes), packed into batches; returns the batches' unfinished flags, `skip` and each
    /// batch's groups.
    #[allow(clippy::type_complexity)]
    fn bmcs_batches(
        &self,
        column: &DeviceBytes,
        descending: bool,
        skip: usize,
        groups: &[Range<usize>],
        perm: &mut CudaSlice<u32>,
    ) -> Result<(CudaSlice<u32>, usize, Vec<Vec<Range<usize>>>)> {
        let (mut segs, mut batches, mut members) = (vec![], vec![], vec![]);
        let mut current: Vec<Range<usize>> = vec![];
        let mut rows = 0u32;
        let mut close = |current: &mut Vec<Range<usize>>, rows: &mut u32, segs: &Vec<u32>| {
            if !current.is_empty() {
                let count = current.len() as u32;
                batches.extend([segs.len() as u32 / 4 - count, count, *rows, 0]);
                members.push(std::mem::take(current));
                *rows = 0;
            }
        };
        for g in groups {
            if rows as usize + g.len() > TIES_CAP {
                close(&mut current, &mut rows, &segs);
            }
            segs.extend([rows_u32(g.start)?, g.len() as u32, rows, 0]);
            rows += g.len() as u32;
            current.push(g.clone());
        }
        close(&mut current, &mut rows, &segs);
        let nb = members.len();
        let s = self.stream();
        let segs_dev = s.clone_htod(&segs)?;
        let batches_dev = s.clone_htod(&batches)?;
        let flags = s.alloc_zeros::<u32>(nb.max(1))?;
        let (col, skip32, desc) = (column.arg(self), skip as u32, descending as u32);
        let cfg = LaunchConfig {
            grid_dim: (nb as u32, 1, 1),
            block_dim: (TIES_BLOCK, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: the tables describe `nb` batches of groups inside `perm`; `flags` holds a
        // word per batch; the column's buffers hold every row `perm` names.
        unsafe {
            s.launch_builder(&self.kernels()?.ties_bmcs)
                .arg(&col)
                .arg(&batches_dev)
                .arg(&segs_dev)
                .arg(perm)
                .arg(&skip32)
                .arg(&desc)
                .arg(&flags)
                .launch(cfg)?
        };
        Ok((flags, skip, members))
    }

    /// One round over the large `groups` (sharing `skip` bytes): their rows radix-sorted by
    /// (group, next 8 bytes, bytes left) and put back in `perm`; returns the runs still equal
    /// with bytes to come, as ranges of sorted positions.
    fn large_round(
        &self,
        column: &DeviceBytes,
        descending: bool,
        skip: usize,
        groups: &[Range<usize>],
        perm: &mut CudaSlice<u32>,
        copies: &mut Transfers,
    ) -> Result<Vec<Range<usize>>> {
        let m: usize = groups.iter().map(|g| g.len()).sum();
        let m32 = rows_u32(m)?;
        let s = self.stream();
        let groups_dev = s.clone_htod(&group_table(groups, &firsts(groups))?)?;
        let count = groups.len() as u32;
        let words = [
            self.alloc_words(m)?,
            self.alloc_words(m)?,
            self.alloc_words(m)?,
            self.alloc_words(m)?,
        ];
        let rows = self.alloc_bytes(4 * m)?;
        let (col, skip32, desc) = (column.arg(self), skip as u32, descending as u32);
        // SAFETY: the table describes `count` groups of `m` rows in all inside `perm`; each
        // output holds `m` words.
        unsafe {
            s.launch_builder(&self.kernels()?.ties_keys)
                .arg(&col)
                .arg(&groups_dev)
                .arg(&count)
                .arg(&m32)
                .arg(&*perm)
                .arg(&skip32)
                .arg(&desc)
                .arg(&words[0])
                .arg(&words[1])
                .arg(&words[2])
                .arg(&words[3])
                .arg(&rows)
                .launch(self.grid_for(m))?
        };
        let varying = [
            u32::MAX.checked_shr((count - 1).leading_zeros()).unwrap_or(0),
            u32::MAX,
            u32::MAX,
            15,
        ];
        let mut sorted = DeviceTable {
            num_rows: m,
            keys: words.into(),
            columns: vec![DeviceColumn { data: rows, width: 4 }],
            records: None,
        };
        let plan = GpuSortPlan {
            strategy: Strategy::SRTS_DIRECT,
            passes: radix_passes(&varying, 8),
            keep_keys: true,
            want_perm: false,
            pack_gathers: false,
            switches: self.sort_switches(),
            sorted_runs: vec![],
        };
        self.sort(&mut sorted, &plan)?;
        // SAFETY: as for ties_keys; `rows` holds the m sorted rows.
        unsafe {
            s.launch_builder(&self.kernels()?.ties_scatter)
                .arg(&groups_dev)
                .arg(&count)
                .arg(&m32)
                .arg(&sorted.columns[0].data)
                .arg(&mut *perm)
                .launch(self.grid_for(m))?
        };
        self.equal_runs(&sorted.keys, groups, descending, copies)
    }

    /// The runs of equal sorted key words (`ties_keys`' four) whose values go on past these 8
    /// bytes, as ranges of sorted positions of `groups`: found in [`Self::tie_marks`]'s bits.
    fn equal_runs(
        &self,
        keys: &[CudaSlice<u32>],
        groups: &[Range<usize>],
        descending: bool,
        copies: &mut Transfers,
    ) -> Result<Vec<Range<usize>>> {
        let m: usize = groups.iter().map(|g| g.len()).sum();
        let words: Vec<SortedWord<'_>> = keys.iter().map(|k| SortedWord::Varying(k, u32::MAX)).collect();
        // The bytes-left code (word 3) of a value that goes on.
        let more = TruncationTest {
            null_flag: None,
            length: (96, 32, if descending { 0 } else { 9 }),
        };
        let [agree, marked] = self.tie_marks(&words, 0, &more, m, copies)?;
        let marks = TieBitmaps::new(vec![Some([agree.as_words(), marked.as_words()])]);
        let firsts = firsts(groups);
        Ok((marks.equal_runs(0, m).into_iter())
            .filter(|r| marks.truncated(0, r.start))
            .map(|r| in_perm(groups, &firsts, &r).1)
            .collect())
    }

    /// The [`TieBitmaps`] pair of `n` sorted rows of a key of `words` (with `pad` leading bits):
    /// the rows whose key agrees with the row before them under the words' masks, and the rows
    /// whose bits pass `test`. Computed on the device (`ties_marks`, one read of the words) and
    /// downloaded: 2 bits a row instead of the key's words (11 words a row for lineitem's
    /// `l_comment` list, whose download and host scan took ~0.5 s at SF10 in stop 26). The
    /// bitmaps (1/16 byte a row) fit in the session's reservation, which held a second copy of
    /// the key (at least 4 bytes a row) for the sort that has finished.
    pub(crate) fn tie_marks(
        &self,
        words: &[SortedWord<'_>],
        pad: u32,
        test: &TruncationTest,
        n: usize,
        copies: &mut Transfers,
    ) -> Result<[HostBuffer; 2]> {
        let s = self.stream();
        let constants: Vec<u32> = (words.iter())
            .map(|w| match w {
                SortedWord::Constant(v) => *v,
                SortedWord::Varying(..) => 0,
            })
            .collect();
        let constants_dev = s.clone_htod(&constants)?;
        let base = constants_dev.device_ptr(s).0;
        let table: Vec<MarkWordArg> = (words.iter().enumerate())
            .map(|(w, word)| match word {
                SortedWord::Varying(dev, mask) => MarkWordArg {
                    p: dev.device_ptr(s).0,
                    mask: *mask,
                    rows: u32::MAX,
                },
                SortedWord::Constant(_) => MarkWordArg {
                    p: base + 4 * w as u64,
                    mask: 0,
                    rows: 0,
                },
            })
            .collect();
        let table_dev = s.clone_htod(&table)?;
        let bits_words = n.div_ceil(32);
        let (agree, marked) = (self.alloc_words(bits_words)?, self.alloc_words(bits_words)?);
        let (nwords, n32) = (words.len() as u32, rows_u32(n)?);
        let (has_null, null_bit, present) = match test.null_flag {
            Some((pos, present)) => (1u32, pad + pos, present),
            None => (0, 0, 0),
        };
        let (len_pos, len_bits, code) = test.length;
        let len_bit = if len_bits == 0 { 0 } else { pad + len_pos };
        // SAFETY: the table holds `nwords` words of at least `n` rows each (or one value, read
        // at index 0); each bitmap holds a word per 32 rows.
        unsafe {
            s.launch_builder(&self.kernels()?.ties_marks)
                .arg(&table_dev)
                .arg(&nwords)
                .arg(&n32)
                .arg(&has_null)
                .arg(&null_bit)
                .arg(&present)
                .arg(&len_bit)
                .arg(&len_bits)
                .arg(&code)
                .arg(&agree)
                .arg(&marked)
                .launch(self.grid_for(n))?
        };
        let pool = crate::pinned::PinnedPool::global();
        let mut host = [
            pool.transfer_buffer(4 * bits_words),
            pool.transfer_buffer(4 * bits_words),
        ];
        for (dev, h) in [&agree, &marked].into_iter().zip(&mut host) {
            // SAFETY: read after the synchronization below.
            unsafe { copies.download_words(dev, h) }?;
        }
        s.synchronize()?;
        Ok(host)
    }
}

/// One word of a sorted key on the device, as [`Gpu::tie_marks`] reads it.
pub(crate) enum SortedWord<'a> {
    /// The word's sorted values, and its bits a tie compares.
    Varying(&'a CudaSlice<u32>, u32),
    /// A word every row shares: its value.
    Constant(u32),
}

/// `MarkWord` (ties.cu): row i's word is `p[i & rows]`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
struct MarkWordArg {
    p: u64,
    mask: u32,
    rows: u32,
}

// SAFETY: a device address and two words, laid out as the kernel's struct.
unsafe impl DeviceRepr for MarkWordArg {}

/// For each group, the bytes that all its rows' `tail`s share (`rows` group after group, the
/// group of each in `group_of`, each group's first at `firsts`): each tail against its group's
/// first, in parallel over parts of the rows, each part keeping its own minimum of each group
/// it holds (one atomic minimum a part and group: one shared by every row of a 3.3M-row group
/// made this step take a second in stop 27).
fn shared_bytes<'a>(
    rows: &[u32],
    group_of: &[u32],
    firsts: &[usize],
    tail: impl Fn(usize) -> &'a [u8] + Sync,
) -> Vec<usize> {
    const PART: usize = 1 << 14;
    let shared: Vec<AtomicUsize> = (firsts.iter())
        .map(|&f| AtomicUsize::new(tail(rows[f] as usize).len()))
        .collect();
    (rows.par_chunks(PART).zip(group_of.par_chunks(PART))).for_each(|(rows_part, groups_part)| {
        let mut i = 0;
        while i < rows_part.len() {
            // The part's rows of one group (rows come group after group).
            let k = groups_part[i] as usize;
            let first = tail(rows[firsts[k]] as usize);
            let mut common = shared[k].load(Relaxed).min(first.len());
            while i < rows_part.len() && groups_part[i] as usize == k {
                common = common_prefix(&first[..common], tail(rows_part[i] as usize));
                i += 1;
            }
            shared[k].fetch_min(common, Relaxed);
        }
    });
    shared.into_iter().map(AtomicUsize::into_inner).collect()
}

/// Where each of `groups`' rows start among all their rows, group after group.
fn firsts(groups: &[Range<usize>]) -> Vec<usize> {
    (groups.iter())
        .scan(0, |m, g| {
            *m += g.len();
            Some(*m - g.len())
        })
        .collect()
}

/// Where `r`, a range of `groups`' rows counted group after group (each group's first at
/// `firsts`) inside one group, stands in the permutation; and that group.
fn in_perm(groups: &[Range<usize>], firsts: &[usize], r: &Range<usize>) -> (usize, Range<usize>) {
    let g = firsts.partition_point(|&f| f <= r.start) - 1;
    let start = groups[g].start + (r.start - firsts[g]);
    (g, start..start + r.len())
}

/// `TieGroup`s (ties.cu) of `groups`, whose rows start at `firsts` among all their rows.
fn group_table(groups: &[Range<usize>], firsts: &[usize]) -> Result<Vec<u32>> {
    let mut table = Vec::with_capacity(4 * groups.len());
    for (g, &f) in groups.iter().zip(firsts) {
        table.extend([rows_u32(g.start)?, rows_u32(g.len())?, rows_u32(f)?, 0]);
    }
    Ok(table)
}

#[cfg(test)]
mod tests {
    use rand::rngs::SmallRng;
    use rand::{Rng, SeedableRng};

    use super::*;
    use crate::kernels::KernelCache;

    /// Tails read through views: the groups' rows listed group after group from the
    /// permutation with their groups, no byte gathered (the device finds the shared bytes).
    #[test]
    fn rows_of_lists_the_groups_rows_in_order() {
        let perm = [9, 8, 7, 6, 5, 4, 3, 2];
        let tails = TailGroups {
            field: 0,
            skip: 32,
            descending: false,
            groups: vec![1..3, 4..7],
        };
        let t = GatheredTails::rows_of(&tails, &perm);
        assert_eq!(t.rows.as_ref(), &[8, 7, 5, 4, 3]);
        assert_eq!(t.firsts, [0, 2]);
        assert_eq!(t.shared, [0, 0]);
        assert_eq!(t.len(), 0);
        assert_eq!(t.group_of, [0, 0, 1, 1, 1]);
        assert_eq!(
            t.device_bytes(&tails),
            4 * 5 + 8 * 2 + 8 * 5 + tails_device_bytes(&tails)
        );
        let (_, at) = in_perm(&tails.groups, &t.firsts, &(3..5));
        assert_eq!(at, 5..7);
    }

    /// A group's shared bytes are the common prefix of all its tails: none where one row
    /// differs at once, all of the shortest where it is a prefix of the others, and for a
    /// group of one URL-like path every byte but the differing ones.
    #[test]
    fn groups_share_the_common_prefix_of_their_tails() {
        let tails: [&[u8]; 8] = [
            b"/path/that/all/share/1",
            b"/path/that/all/share/22",
            b"/path/that/all/share/3",
            b"abc",
            b"abcdef",
            b"ab",
            b"xyz",
            b"",
        ];
        // Groups: rows 0-2, 3-5, 6-7; their rows listed in another order than the tails.
        let rows = [2, 0, 1, 4, 3, 5, 7, 6];
        let group_of = [0, 0, 0, 1, 1, 1, 2, 2];
        let firsts = [0, 3, 6];
        let shared = shared_bytes(&rows, &group_of, &firsts, |r| tails[r]);
        assert_eq!(shared, [21, 2, 0]);
        // Groups across the parts of the parallel scan: the row that shares least is in the
        // second part of the first group.
        let many: Vec<Vec<u8>> = (0..40_000)
            .map(|i| match i {
                20_000 => b"common-pr".to_vec(),
                i if i < 30_000 => format!("common-prefix-{i}").into_bytes(),
                i => format!("other-{}", i % 7).into_bytes(),
            })
            .collect();
        let rows: Vec<u32> = (0..40_000).collect();
        let group_of: Vec<u32> = (0..40_000).map(|i| (i >= 30_000) as u32).collect();
        let shared = shared_bytes(&rows, &group_of, &[0, 30_000], |r| &many[r]);
        assert_eq!(shared, [9, 6]);
    }

    /// `ties_marks` on the GPU writes the bits the host reads from the same words: neighbours
    /// equal under each word's mask (a constant word among them), and rows whose null flag and
    /// length bits (across a word boundary, after a pad) pass the test, over a row count that
    /// is not a multiple of 32.
    #[test]
    fn tie_marks_are_the_host_s() {
        let gpu = match Gpu::open(0, &KernelCache::from_env()) {
            Ok(gpu) => gpu,
            Err(e) => return crate::test_support::not_run("TIE MARKS GPU TEST", e),
        };
        let n = 100_003;
        let mut rng = SmallRng::seed_from_u64(27);
        // Few distinct values, so that many neighbours agree.
        let words: Vec<Vec<u32>> = (0..4)
            .map(|w| match w {
                2 => vec![0x8000_0001; n],
                _ => (0..n)
                    .map(|_| rng.random_range(0..3u32) << 30 | rng.random_range(0..2u32))
                    .collect(),
            })
            .collect();
        let views: Vec<&[u32]> = words.iter().map(Vec::as_slice).collect();
        let masks = [u32::MAX, 0xC000_0000, u32::MAX, 0];
        let pad = 3;
        let tests = [
            TruncationTest {
                null_flag: Some((0, 1)),
                length: (28, 3, 2),
            },
            TruncationTest {
                null_flag: None,
                length: (0, 0, 1),
            },
            TruncationTest {
                null_flag: Some((32 - pad, 0)),
                length: (0, 0, 0),
            },
        ];
        let s = gpu.stream();
        let dev: Vec<CudaSlice<u32>> = words.iter().map(|w| s.clone_htod(w).unwrap()).collect();
        let sorted: Vec<SortedWord<'_>> = (dev.iter().zip(masks).enumerate())
            .map(|(w, (d, m))| match w {
                2 => SortedWord::Constant(words[2][0]),
                _ => SortedWord::Varying(d, m),
            })
            .collect();
        let mut copies = Transfers::new(s);
        for test in &tests {
            let [agree, marked] = gpu.tie_marks(&sorted, pad, test, n, &mut copies).unwrap();
            for i in 0..n {
                let same = i > 0 && (0..4).all(|w| (words[w][i] ^ words[w][i - 1]) & masks[w] == 0);
                let bit = |b: &HostBuffer| b.as_words()[i / 32] >> (i % 32) & 1 == 1;
                assert_eq!(bit(&agree), same, "row {i}");
                assert_eq!(bit(&marked), test.holds(&views, pad, i), "row {i}, {test:?}");
            }
        }
    }
}
