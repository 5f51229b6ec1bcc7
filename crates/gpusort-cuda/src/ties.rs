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
//! The column's values go up as Arrow holds them ([`DeviceBytes`]). What is still equal after
//! [`TIES_MAX_ROUNDS`] rounds (256 bytes past the prefix) is returned for the host's
//! comparison sort.
//!
//! [`find_ties`]: gpusort::ties::find_ties

use std::ops::Range;

use arrow::array::{Array, ArrayData};
use arrow::compute::SortColumn;
use arrow::datatypes::DataType;
use cudarc::driver::{CudaSlice, DevicePtr, DeviceRepr, LaunchConfig, PushKernelArg};
use gpusort::plan::{Strategy, radix_passes};
use gpusort::ties::TailGroups;

use crate::error::{CudaSortError, Result};
use crate::gpu::{Gpu, rows_u32};
use crate::kernels::{TIES_BLOCK, TIES_CAP, TIES_MAX_ROUNDS};
use crate::memory::device_bytes_needed;
use crate::table::{DeviceColumn, DeviceTable, GpuSortPlan};
use crate::transfer::Transfers;

/// How a [`DeviceBytes`] holds its values (`ByteColumn.kind` in ties.cu).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ByteKind {
    Offsets32 = 0,
    Offsets64 = 1,
    Views = 2,
    Fixed = 3,
}

impl ByteKind {
    /// The kind of a column of `data_type`, if the device reads it.
    fn of(data_type: &DataType) -> Option<Self> {
        match data_type {
            DataType::Utf8 | DataType::Binary => Some(Self::Offsets32),
            DataType::LargeUtf8 | DataType::LargeBinary => Some(Self::Offsets64),
            DataType::Utf8View | DataType::BinaryView => Some(Self::Views),
            DataType::FixedSizeBinary(_) => Some(Self::Fixed),
            _ => None,
        }
    }
}

/// A string or binary column's values on the device as Arrow holds them: offsets and bytes,
/// views and their data buffers end to end (with where each buffer starts), or fixed-width
/// values.
pub(crate) struct DeviceBytes {
    kind: ByteKind,
    width: u32,
    /// Offsets, or views (unused for fixed-width values).
    offsets: CudaSlice<u8>,
    data: CudaSlice<u8>,
    bases: CudaSlice<u64>,
}

/// `ByteColumn`, passed by value.
#[repr(C)]
struct ByteColumnArg {
    offsets: u64,
    data: u64,
    bases: u64,
    kind: u32,
    width: u32,
}

// SAFETY: device addresses and two words, laid out as the kernel's struct.
unsafe impl DeviceRepr for ByteColumnArg {}

/// The host parts of a column's upload: offsets (or views), the data parts, end to end, and
/// where each of the array's data buffers starts among them (views: a buffer the array lists
/// more than once, as the views of a column concatenated from batches that share a dictionary
/// page's buffer do, goes up once).
struct ByteParts<'a> {
    kind: ByteKind,
    width: u32,
    offsets: &'a [u8],
    data: Vec<&'a [u8]>,
    bases: Vec<u64>,
}

/// `buffers` once each (the same bytes listed again are found by address and length), and
/// where each listed buffer starts among them.
fn distinct_parts(buffers: &[arrow::buffer::Buffer]) -> (Vec<&[u8]>, Vec<u64>) {
    let mut at = std::collections::HashMap::new();
    let (mut parts, mut bases, mut total) = (vec![], Vec::with_capacity(buffers.len()), 0u64);
    for b in buffers {
        let bytes = b.as_slice();
        let base = *at.entry((bytes.as_ptr() as usize, bytes.len())).or_insert_with(|| {
            parts.push(bytes);
            total += bytes.len() as u64;
            total - bytes.len() as u64
        });
        bases.push(base);
    }
    (parts, bases)
}

impl<'a> ByteParts<'a> {
    /// What of `data`'s buffers the device reads, or `None` for a type it does not.
    fn of(data: &'a ArrayData) -> Option<Self> {
        let kind = ByteKind::of(data.data_type())?;
        let (n, off) = (data.len(), data.offset());
        let buffers = data.buffers();
        Some(match kind {
            ByteKind::Offsets32 | ByteKind::Offsets64 => {
                let w = if kind == ByteKind::Offsets32 { 4 } else { 8 };
                let offsets = &buffers[0].as_slice()[off * w..(off + n + 1) * w];
                // The bytes up to the last value's end (offsets index the whole buffer).
                let end = match kind {
                    ByteKind::Offsets32 => i32::from_le_bytes(offsets[n * 4..].try_into().ok()?) as usize,
                    _ => i64::from_le_bytes(offsets[n * 8..].try_into().ok()?) as usize,
                };
                Self {
                    kind,
                    width: 0,
                    offsets,
                    data: vec![&buffers[1].as_slice()[..end]],
                    bases: vec![0],
                }
            }
            ByteKind::Views => {
                let (data, bases) = distinct_parts(&buffers[1..]);
                Self {
                    kind,
                    width: 0,
                    offsets: &buffers[0].as_slice()[off * 16..(off + n) * 16],
                    data,
                    bases,
                }
            }
            ByteKind::Fixed => {
                let DataType::FixedSizeBinary(w) = data.data_type() else {
                    return None;
                };
                let w = *w as usize;
                Self {
                    kind,
                    width: w as u32,
                    offsets: &[],
                    data: vec![&buffers[0].as_slice()[off * w..(off + n) * w]],
                    bases: vec![0],
                }
            }
        })
    }

    /// Device bytes the upload holds.
    fn device_bytes(&self) -> usize {
        self.offsets.len() + self.data.iter().map(|d| d.len()).sum::<usize>() + 8 * self.bases.len()
    }
}

impl DeviceBytes {
    /// Whether the device reads `column`'s values (strings and binaries of every layout).
    pub(crate) fn takes(column: &SortColumn) -> bool {
        ByteKind::of(column.values.data_type()).is_some()
    }

    /// Device bytes the upload of `array` holds (0 for a type the device does not read).
    pub(crate) fn bytes_of(array: &dyn Array) -> usize {
        ByteParts::of(&array.to_data()).map_or(0, |p| p.device_bytes())
    }

    /// `array`'s values on `gpu`, copied through `copies` (the host's memory is no longer
    /// needed when this returns).
    pub(crate) fn upload(gpu: &Gpu, array: &dyn Array, copies: &mut Transfers) -> Result<Self> {
        let data = array.to_data();
        let parts = ByteParts::of(&data).ok_or_else(|| {
            CudaSortError::Unsupported(format!("tie groups of a {} column on the device", array.data_type()))
        })?;
        let stream = gpu.stream();
        let offsets = gpu.alloc_bytes(parts.offsets.len())?;
        let data_len: usize = parts.data.iter().map(|d| d.len()).sum();
        let bytes = gpu.alloc_bytes(data_len)?;
        let bases = stream.clone_htod(&parts.bases)?;
        // SAFETY: each destination holds its parts; heap parts are copied before the calls return.
        unsafe {
            copies.upload_parts(&[parts.offsets], offsets.device_ptr(stream).0)?;
            copies.upload_parts(&parts.data, bytes.device_ptr(stream).0)?;
        }
        Ok(Self {
            kind: parts.kind,
            width: parts.width,
            offsets,
            data: bytes,
            bases,
        })
    }

    /// Device bytes it holds.
    pub(crate) fn len(&self) -> usize {
        self.offsets.len() + self.data.len() + 8 * self.bases.len()
    }

    fn arg(&self, gpu: &Gpu) -> ByteColumnArg {
        let s = gpu.stream();
        ByteColumnArg {
            offsets: self.offsets.device_ptr(s).0,
            data: self.data.device_ptr(s).0,
            bases: self.bases.device_ptr(s).0,
            kind: self.kind as u32,
            width: self.width,
        }
    }
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

/// Device bytes [`Gpu::order_tails`] holds beside the column for `tails`' groups: the radix
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
        let mut table = vec![];
        let mut m = 0usize;
        for g in groups {
            table.extend([rows_u32(g.start)?, g.len() as u32, rows_u32(m)?, 0]);
            m += g.len();
        }
        let m32 = rows_u32(m)?;
        let s = self.stream();
        let groups_dev = s.clone_htod(&table)?;
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
    /// bytes, as ranges of sorted positions of `groups`.
    fn equal_runs(
        &self,
        keys: &[CudaSlice<u32>],
        groups: &[Range<usize>],
        descending: bool,
        copies: &mut Transfers,
    ) -> Result<Vec<Range<usize>>> {
        let m: usize = groups.iter().map(|g| g.len()).sum();
        let pool = crate::pinned::PinnedPool::global();
        let mut host = vec![];
        for k in keys {
            let mut h = pool.transfer_buffer(4 * m);
            // SAFETY: read after the synchronization below.
            unsafe { copies.download_words(k, &mut h) }?;
            host.push(h);
        }
        self.stream().synchronize()?;
        let w: Vec<&[u32]> = host.iter().map(|h| h.as_words()).collect();
        let same = |k: usize| w.iter().all(|w| w[k] == w[k - 1]);
        let more = if descending { 0 } else { 9 };
        let firsts: Vec<usize> = groups
            .iter()
            .scan(0, |m, g| {
                let first = *m;
                *m += g.len();
                Some(first)
            })
            .collect();
        Ok(gpusort::ties::runs(m, &same)
            .into_iter()
            .filter(|r| w[3][r.start] == more)
            .map(|r| {
                let g = w[0][r.start] as usize;
                let start = groups[g].start + (r.start - firsts[g]);
                start..start + r.len()
            })
            .collect())
    }
}
