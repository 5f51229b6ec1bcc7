//! The uploader of a [`GpuSortSession`](super::GpuSortSession): segments staged into pinned
//! buffers on all cores and copied to the device on the session's copy stream while the input
//! arrives (see the session's module docs). No kernel: copies only.
//!
//! Values that lie in pinned host memory already (sorted runs that came down into the pinned
//! pool and are merged again, `GpuOptions::direct_uploads`) are not staged: the device copies
//! them from where they are ([`direct_parts`]), and the staged rest of their column around them,
//! each stretch of adjacent pieces in one copy ([`copy_column`]).

use std::sync::Arc;
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use arrow::array::{Array, RecordBatch};
use arrow::buffer::Buffer;
use arrow::util::bit_mask::set_bits;
use cudarc::driver::sys::CUdeviceptr;
use cudarc::driver::{CudaEvent, CudaSlice, CudaStream, DevicePtr};
use gpusort::cpu::gather::{fixed_values, rebase_view};
use rayon::prelude::*;

use super::{SEGMENT_ALIGN, SEGMENT_BYTES, STAGE_TASK_BYTES, STAGING_DEPTH};
use crate::error::{CudaSortError, Result};
use crate::gpu::Gpu;
use crate::memory::DeviceReservation;
use crate::pinned::{HostBuffer, PinnedPool};
use crate::transfer::{Transfers, is_pinned};

/// Rows `offset..offset + len` of a batch, going to row `at` of a segment; for each device
/// column, by how much its long views' buffer indices rise (where the batch's data buffers
/// start among the session's; 0 for other columns).
#[derive(Debug, Clone)]
pub(super) struct Part {
    pub(super) batch: RecordBatch,
    pub(super) offset: usize,
    pub(super) len: usize,
    pub(super) at: usize,
    pub(super) first_buffers: Arc<[u32]>,
}

/// Where the columns of a segment lie in its staging buffer: each device column's values
/// (`rows * width` bytes), then each one's validity bits (`rows / 8` bytes).
#[derive(Debug, Clone)]
pub(super) struct SegmentLayout {
    pub(super) rows: usize,
    /// Device columns: index in the batch and bytes per row.
    columns: Vec<(usize, usize)>,
    values: Vec<usize>,
    bitmaps: Vec<usize>,
    bytes: usize,
}

impl SegmentLayout {
    pub(super) fn new(columns: Vec<(usize, usize)>, rows: usize) -> Self {
        debug_assert!(rows.is_multiple_of(SEGMENT_ALIGN));
        let mut at = 0;
        let values = columns
            .iter()
            .map(|(_, w)| {
                let o = at;
                at += rows * w;
                o
            })
            .collect();
        let bitmaps = columns
            .iter()
            .map(|_| {
                let o = at;
                at += rows / 8;
                o
            })
            .collect();
        Self {
            rows,
            columns,
            values,
            bitmaps,
            bytes: at,
        }
    }

    /// Rows per segment for `columns` (and at most `expected` rows, rounded up).
    pub(super) fn rows_for(columns: &[(usize, usize)], expected: Option<usize>) -> usize {
        let row_bytes = columns.iter().map(|(_, w)| *w).sum::<usize>().max(1) + columns.len().div_ceil(8);
        let rows = (SEGMENT_BYTES / row_bytes).max(SEGMENT_ALIGN);
        let rows = expected.map_or(rows, |e| rows.min(e.max(1)));
        rows.div_ceil(SEGMENT_ALIGN) * SEGMENT_ALIGN
    }
}

/// A pointer that parallel staging tasks write disjoint ranges through.
#[derive(Clone, Copy)]
struct SendPtr(*mut u8);
// SAFETY: every task writes its own byte range.
unsafe impl Send for SendPtr {}
unsafe impl Sync for SendPtr {}

impl SendPtr {
    /// The address `offset` bytes on.
    fn at(self, offset: usize) -> *mut u8 {
        self.0.wrapping_add(offset)
    }
}

/// Sets bits `start..start + len` of `bits` (ORed in, as [`set_bits`] does).
fn set_ones(bits: &mut [u8], start: usize, len: usize) {
    const ONES: [u8; 1024] = [0xFF; 1024];
    let mut done = 0;
    while done < len {
        let n = (len - done).min(ONES.len() * 8);
        set_bits(bits, &ONES, start + done, 0, n);
        done += n;
    }
}

/// For each device column, each part's values where the device copies them from the part's
/// own buffer rather than from the staging buffer ([`direct_parts`]).
type Direct = Vec<Vec<Option<Buffer>>>;

/// [`Direct`] for `parts`: with `enabled`, the values of a part that lie in pinned host memory
/// (the driver says, [`is_pinned`]; asked once an allocation) and cross unchanged (not views
/// whose buffer indices rise). Runs on the uploader's thread, whose context the driver's
/// answer needs.
fn direct_parts(layout: &SegmentLayout, parts: &[Part], enabled: bool) -> Direct {
    let mut pinned = std::collections::HashMap::<usize, bool>::new();
    (layout.columns.iter().enumerate())
        .map(|(k, &(c, w))| {
            (parts.iter())
                .map(|part| {
                    if !enabled || part.first_buffers[k] != 0 {
                        return None;
                    }
                    let values =
                        fixed_values(part.batch.column(c).as_ref(), w).slice_with_length(part.offset * w, part.len * w);
                    let whole = values.data_ptr().as_ptr() as usize;
                    (*pinned.entry(whole).or_insert_with(|| is_pinned(values.as_slice()))).then_some(values)
                })
                .collect()
        })
        .collect()
}

/// Copies the rows of `parts` into `buf` (laid out by `layout`), on all cores, but for the
/// values `direct` copies from where they are; returns, per device column, whether its
/// validity bits were staged (some part has nulls in it).
fn stage(layout: &SegmentLayout, parts: &[Part], direct: &Direct, buf: &mut [u8]) -> Vec<bool> {
    assert!(buf.len() >= layout.bytes);
    let base = SendPtr(buf.as_mut_ptr());
    let nullable: Vec<bool> = layout
        .columns
        .iter()
        .map(|&(c, _)| parts.iter().any(|p| p.batch.column(c).null_count() > 0))
        .collect();
    // Values: (column, part, rows of the part) tasks of about STAGE_TASK_BYTES.
    let mut tasks = vec![];
    for (k, &(_, w)) in layout.columns.iter().enumerate() {
        let step = (STAGE_TASK_BYTES / w).max(1);
        for (p, part) in parts.iter().enumerate().filter(|(p, _)| direct[k][*p].is_none()) {
            for start in (0..part.len).step_by(step) {
                tasks.push((k, p, start, step.min(part.len - start)));
            }
        }
    }
    tasks.par_iter().for_each(|&(k, p, start, len)| {
        let (c, w) = layout.columns[k];
        let part = &parts[p];
        let values = fixed_values(part.batch.column(c).as_ref(), w);
        let src = &values.as_slice()[(part.offset + start) * w..(part.offset + start + len) * w];
        let dst = layout.values[k] + (part.at + start) * w;
        match part.first_buffers[k] {
            // SAFETY: tasks write disjoint ranges of the column's region of `buf`.
            0 => unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), base.at(dst), src.len()) },
            first => {
                let dst = base.at(dst) as *mut u128;
                for (i, view) in src.chunks_exact(16).enumerate() {
                    let view = rebase_view(u128::from_le_bytes(view.try_into().unwrap()), first);
                    // SAFETY: as above; the row's 16 bytes, which may be unaligned.
                    unsafe { dst.add(i).write_unaligned(view) };
                }
            }
        }
    });
    // Validity: one task per column (parts may share a byte).
    (0..layout.columns.len())
        .into_par_iter()
        .filter(|&k| nullable[k])
        .for_each(|k| {
            let (c, _) = layout.columns[k];
            // SAFETY: each task writes its own column's bitmap region.
            let bits = unsafe { std::slice::from_raw_parts_mut(base.at(layout.bitmaps[k]), layout.rows / 8) };
            // `set_bits` ORs into the bytes (and may write whole bytes ahead of the parts that
            // follow, in order): they start cleared.
            bits.fill(0);
            for part in parts {
                match part.batch.column(c).nulls() {
                    Some(n) => {
                        set_bits(bits, n.validity(), part.at, n.offset() + part.offset, part.len);
                    }
                    None => set_ones(bits, part.at, part.len),
                }
            }
        });
    nullable
}

/// A segment on the device: its rows, each device column's values and (when it has nulls in
/// the segment) validity bits, allocated on the copy stream.
pub(super) struct DeviceSegment {
    pub(super) first_row: usize,
    pub(super) rows: usize,
    pub(super) values: Vec<Option<CudaSlice<u8>>>,
    pub(super) bitmaps: Vec<Option<CudaSlice<u8>>>,
}

/// A segment for the uploader.
pub(super) struct SegmentJob {
    pub(super) first_row: usize,
    pub(super) rows: usize,
    pub(super) parts: Vec<Part>,
}

/// What the uploader did.
#[derive(Default)]
pub(super) struct Uploaded {
    pub(super) segments: Vec<DeviceSegment>,
    pub(super) device_bytes: usize,
    /// The budget's bytes the segments hold.
    pub(super) reservation: Option<DeviceReservation>,
    /// Time spent waiting for the budget.
    pub(super) budget_wait: Duration,
    pub(super) to_device: u64,
    /// Of `to_device`, the bytes copied from where they were (not staged).
    pub(super) in_place: u64,
    pub(super) stage_time: Duration,
    pub(super) upload_time: Duration,
}

/// The uploader thread of a session (see the module docs).
pub(super) struct Uploader {
    jobs: Option<mpsc::Sender<SegmentJob>>,
    thread: Option<JoinHandle<Result<Uploaded>>>,
}

impl Uploader {
    pub(super) fn start(
        gpu: Arc<Gpu>,
        stream: Arc<CudaStream>,
        layout: SegmentLayout,
        available: usize,
        reservation: DeviceReservation,
    ) -> Result<Self> {
        let (tx, rx) = mpsc::channel::<SegmentJob>();
        let thread = std::thread::Builder::new()
            .name("gpusort-upload".into())
            .spawn(move || upload_segments(&gpu, &stream, &layout, available, reservation, rx))
            .map_err(|e| CudaSortError::Unsupported(format!("cannot start the upload thread: {e}")))?;
        Ok(Self {
            jobs: Some(tx),
            thread: Some(thread),
        })
    }

    /// Hands over a segment; false when the thread has stopped (with an error).
    pub(super) fn send(&self, job: SegmentJob) -> bool {
        self.jobs.as_ref().is_some_and(|j| j.send(job).is_ok())
    }

    /// Waits for every upload.
    pub(super) fn join(mut self) -> Result<Uploaded> {
        self.jobs = None;
        match self.thread.take().expect("joined once").join() {
            Ok(r) => r,
            Err(_) => Err(CudaSortError::Unsupported("the upload thread panicked".into())),
        }
    }
}

impl Drop for Uploader {
    fn drop(&mut self) {
        self.jobs = None;
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// A segment being staged on a thread of its own: its buffer, the nullable columns, the time
/// it took and the values copied from where they are come back when it is done.
type Staging<'scope> = std::thread::ScopedJoinHandle<'scope, (HostBuffer, Vec<bool>, Duration, Direct)>;

/// The uploader's loop: stage each segment in the next staging buffer, up to `ahead` segments
/// at once, then, in order, reserve its device memory (within `available`, waiting for the
/// budget) and start its copies.
///
/// Why several at once: each segment's staging is a fork-join over rayon's pool, which while
/// the input is read shares the cores with the readers. One segment at a time took 10-50 ms
/// each then (its last tasks waiting for a core) and ~1 ms after the input ended: on TPC-H
/// lineitem SF10 (an H200, 16 cores) four fifths of the segments were staged after the input
/// had ended, 0.3 s of the sort phase (stop 41).
fn upload_segments(
    gpu: &Gpu,
    stream: &Arc<CudaStream>,
    layout: &SegmentLayout,
    available: usize,
    reservation: DeviceReservation,
    jobs: mpsc::Receiver<SegmentJob>,
) -> Result<Uploaded> {
    gpu.context().bind_to_thread()?;
    let ahead = gpu.options().stage_ahead.max(1);
    let mut up = SegmentCopies {
        gpu,
        stream,
        layout,
        available,
        reservation,
        out: Uploaded::default(),
        copies: Transfers::new(stream),
        // Staging buffers (ahead being staged, the rest crossing PCIe) and, for each, the
        // event after the copies that last read it (or the buffers copied in place beside it).
        staging: (0..ahead + STAGING_DEPTH - 1).map(|_| (None, None, vec![])).collect(),
        timings: vec![],
    };
    let result = std::thread::scope(|scope| -> Result<()> {
        let mut staged: std::collections::VecDeque<(SegmentJobHead, usize, Duration, Staging<'_>)> = Default::default();
        for (j, job) in jobs.iter().enumerate() {
            if staged.len() == ahead {
                let (head, slot, wait, staging) = staged.pop_front().expect("ahead >= 1");
                up.start_copies(head, slot, wait, staging)?;
            }
            let slot = j % up.staging.len();
            let wait = Instant::now();
            if let Some(e) = up.staging[slot].1.take() {
                e.synchronize()?;
            }
            up.staging[slot].2.clear();
            let wait = wait.elapsed();
            let mut buf = match up.staging[slot].0.take() {
                Some(b) => b,
                None => PinnedPool::global().alloc(layout.bytes),
            };
            let head = SegmentJobHead {
                first_row: job.first_row,
                rows: job.rows,
                spans: job.parts.iter().map(|p| (p.at, p.len)).collect(),
            };
            let direct = direct_parts(layout, &job.parts, gpu.options().direct_uploads);
            let handle = std::thread::Builder::new()
                .name("gpusort-stage".into())
                .spawn_scoped(scope, move || {
                    let start = Instant::now();
                    let nullable = stage(layout, &job.parts, &direct, buf.as_mut_slice());
                    (buf, nullable, start.elapsed(), direct)
                })
                .map_err(|e| CudaSortError::Unsupported(format!("cannot start a staging thread: {e}")))?;
            staged.push_back((head, slot, wait, handle));
        }
        while let Some((head, slot, wait, staging)) = staged.pop_front() {
            up.start_copies(head, slot, wait, staging)?;
        }
        Ok(())
    });
    // The staging buffers go back to the pool only once no copy reads them.
    let synced = stream.synchronize();
    result?;
    synced?;
    up.finish()
}

/// What [`upload_segments`] keeps of a segment while it is staged: its rows, and each part's
/// first row in it and rows.
struct SegmentJobHead {
    first_row: usize,
    rows: usize,
    spans: Vec<(usize, usize)>,
}

/// The copies side of [`upload_segments`]: the staged segments' device memory and copies.
struct SegmentCopies<'a> {
    gpu: &'a Gpu,
    stream: &'a Arc<CudaStream>,
    layout: &'a SegmentLayout,
    available: usize,
    reservation: DeviceReservation,
    out: Uploaded,
    copies: Transfers,
    staging: Vec<(Option<HostBuffer>, Option<CudaEvent>, Vec<Buffer>)>,
    timings: Vec<(CudaEvent, CudaEvent)>,
}

impl SegmentCopies<'_> {
    /// Waits for segment `head`'s staging into buffer `slot`, reserves its device memory and
    /// starts its copies; the buffer is free again after the event it leaves in `slot`.
    fn start_copies(&mut self, head: SegmentJobHead, slot: usize, wait: Duration, staging: Staging<'_>) -> Result<()> {
        let waited = Instant::now();
        let (buf, nullable, staged, direct) = staging
            .join()
            .map_err(|_| CudaSortError::Unsupported("a staging thread panicked".into()))?;
        let (layout, j) = (self.layout, self.out.segments.len());
        let device_bytes = self.out.device_bytes + segment_device_bytes(layout, head.rows, &nullable);
        if device_bytes > self.available {
            return Err(CudaSortError::OutOfMemory {
                needed: device_bytes,
                available: self.available,
            });
        }
        self.out.budget_wait += self.reservation.grow_to(device_bytes).map_err(CudaSortError::Busy)?;
        self.out.stage_time += staged;
        let in_place: usize = direct.iter().flatten().flatten().map(|b| b.len()).sum();
        self.out.in_place += in_place as u64;
        log::debug!(
            target: "gpusort::timeline",
            "upload: segment {j} staged ({} rows; {:.2} ms waiting for its buffer, {:.2} ms staging, \
             {:.2} ms waiting for it; {in_place} bytes copied in place)",
            head.rows,
            wait.as_secs_f64() * 1e3,
            staged.as_secs_f64() * 1e3,
            waited.elapsed().as_secs_f64() * 1e3
        );
        let begin = self.gpu.event()?;
        begin.record(self.stream)?;
        let mut segment = DeviceSegment {
            first_row: head.first_row,
            rows: head.rows,
            values: vec![],
            bitmaps: vec![],
        };
        let bytes = buf.as_slice();
        for (k, &(_, w)) in layout.columns.iter().enumerate() {
            let values = &bytes[layout.values[k]..layout.values[k] + head.rows * w];
            // SAFETY: written by the copies before anything reads it.
            let dst = unsafe { self.stream.alloc::<u8>(values.len().max(1)) }?;
            // SAFETY: `dst` holds the column's rows; the staging buffer and the buffers copied
            // in place stay in `slot` until the stream passes its event.
            unsafe {
                copy_column(
                    &mut self.copies,
                    values,
                    &direct[k],
                    &head.spans,
                    w,
                    dst.device_ptr(self.stream).0,
                )
            }?;
            segment.values.push(Some(dst));
            self.out.device_bytes += values.len();
            segment.bitmaps.push(if nullable[k] {
                let bits = &bytes[layout.bitmaps[k]..layout.bitmaps[k] + head.rows.div_ceil(8)];
                self.out.device_bytes += bits.len();
                Some(upload(self.stream, &mut self.copies, bits)?)
            } else {
                None
            });
        }
        let end = self.gpu.event()?;
        end.record(self.stream)?;
        log::debug!(target: "gpusort::timeline", "upload: segment {j} copies started");
        let free = self.gpu.event()?;
        free.record(self.stream)?;
        let held = direct.into_iter().flatten().flatten().collect();
        self.staging[slot] = (Some(buf), Some(free), held);
        self.timings.push((begin, end));
        self.out.segments.push(segment);
        debug_assert_eq!(self.out.device_bytes, device_bytes);
        Ok(())
    }

    /// What was uploaded, once the stream has synchronized.
    fn finish(mut self) -> Result<Uploaded> {
        for (b, e) in &self.timings {
            self.out.upload_time += Duration::from_secs_f64(b.elapsed_ms(e)? as f64 / 1e3);
        }
        self.out.to_device = self.copies.to_device;
        self.out.reservation = Some(self.reservation);
        Ok(self.out)
    }
}

/// Device bytes of a segment of `rows` rows: each column's values, and the validity bits of
/// those with nulls in it.
fn segment_device_bytes(layout: &SegmentLayout, rows: usize, nullable: &[bool]) -> usize {
    let values: usize = layout.columns.iter().map(|&(_, w)| rows * w).sum();
    values + nullable.iter().filter(|n| **n).count() * rows.div_ceil(8)
}

/// Starts the copies of a device column of a segment to `dst`: each part's values (rows
/// `spans[p]` of the segment, `width` bytes each) from its own buffer where `direct[p]` holds
/// it, else from `staged` (the column's region of the staging buffer); adjacent pieces of one
/// allocation in one copy (a staged column, or the slices of one run's pinned block, whole).
///
/// # Safety
/// `dst` has room for the segment's rows; `staged` and the buffers of `direct` stay alive and
/// unchanged until the stream has passed these copies.
unsafe fn copy_column(
    copies: &mut Transfers,
    staged: &[u8],
    direct: &[Option<Buffer>],
    spans: &[(usize, usize)],
    width: usize,
    dst: CUdeviceptr,
) -> Result<()> {
    // A stretch to copy: its first byte, the allocation it lies in, where it goes, its bytes.
    let mut stretch: Option<(*const u8, usize, usize, usize)> = None;
    let flush = |copies: &mut Transfers, s: Option<(*const u8, usize, usize, usize)>| -> Result<()> {
        match s {
            // SAFETY: the stretch is adjacent pieces of one live allocation; the caller's
            // contract for the rest.
            Some((src, _, at, len)) => unsafe {
                copies.upload_to(std::slice::from_raw_parts(src, len), dst + at as u64)
            },
            None => Ok(()),
        }
    };
    for (p, &(at, len)) in spans.iter().enumerate() {
        let (src, whole) = match &direct[p] {
            Some(b) => (b.as_slice(), b.data_ptr().as_ptr() as usize),
            None => (&staged[at * width..(at + len) * width], staged.as_ptr() as usize),
        };
        stretch = match stretch {
            Some((s, w, d, n)) if w == whole && s.wrapping_add(n) == src.as_ptr() && d + n == at * width => {
                Some((s, w, d, n + src.len()))
            }
            done => {
                flush(copies, done)?;
                Some((src.as_ptr(), whole, at * width, src.len()))
            }
        };
    }
    flush(copies, stretch)
}

/// Starts copying `bytes` to new device memory allocated on `stream`.
fn upload(stream: &Arc<CudaStream>, copies: &mut Transfers, bytes: &[u8]) -> Result<CudaSlice<u8>> {
    // SAFETY: written by the copy before anything reads it.
    let dst = unsafe { stream.alloc::<u8>(bytes.len().max(1)) }?;
    // SAFETY: `dst` holds the bytes; the staging buffer is not reused or freed before the
    // stream passes its event.
    unsafe { copies.upload_to(bytes, dst.device_ptr(stream).0) }?;
    Ok(dst)
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::{FixedSizeBinaryArray, Int64Array, UInt32Array};
    use arrow::datatypes::DataType;
    use arrow::datatypes::{Field, Schema};

    fn batch(n: usize, seed: usize, nulls: bool) -> RecordBatch {
        let a = UInt32Array::from_iter(
            (0..n).map(|i| (!nulls || !(i + seed).is_multiple_of(3)).then_some((i * 7 + seed) as u32)),
        );
        let b = Int64Array::from_iter_values((0..n).map(|i| -((i + seed) as i64)));
        let c = FixedSizeBinaryArray::try_from_iter((0..n).map(|i| [(i + seed) as u8, 1])).unwrap();
        RecordBatch::try_new(
            Arc::new(Schema::new(vec![
                Field::new("a", DataType::UInt32, true),
                Field::new("b", DataType::Int64, false),
                Field::new("c", DataType::FixedSizeBinary(2), false),
            ])),
            vec![Arc::new(a), Arc::new(b), Arc::new(c)],
        )
        .unwrap()
    }

    #[test]
    fn segments_hold_a_multiple_of_64_rows_sized_by_the_payload() {
        let cols = vec![(0, 4), (1, 8)];
        let rows = SegmentLayout::rows_for(&cols, None);
        assert_eq!(rows % SEGMENT_ALIGN, 0);
        assert!(rows * 12 <= SEGMENT_BYTES && rows * 13 > SEGMENT_BYTES / 2, "{rows}");
        assert_eq!(SegmentLayout::rows_for(&cols, Some(100)), 128);
        assert_eq!(SegmentLayout::rows_for(&cols, Some(0)), 64);
        let l = SegmentLayout::new(cols, 128);
        assert_eq!(
            (l.values.clone(), l.bitmaps.clone(), l.bytes),
            (vec![0, 512], vec![1536, 1552], 1568)
        );
    }

    #[test]
    fn staging_copies_values_and_validity_at_unaligned_row_offsets() {
        // Parts as a push cuts them: a sliced batch, one with no nulls, one that starts mid-byte.
        let first = batch(40, 1, true).slice(3, 21);
        let second = batch(30, 2, false);
        let third = batch(50, 3, true).slice(5, 40);
        let mut parts = vec![];
        let mut at = 0;
        for (b, offset, len) in [(&first, 0, 21), (&second, 0, 30), (&third, 1, 39)] {
            parts.push(Part {
                batch: b.clone(),
                offset,
                len,
                at,
                first_buffers: Arc::from(vec![0; 3]),
            });
            at += len;
        }
        let rows = at;
        let layout = SegmentLayout::new(vec![(0, 4), (1, 8), (2, 2)], 128);
        let mut buf = vec![0xEEu8; layout.bytes];
        let nullable = stage(&layout, &parts, &vec![vec![None; parts.len()]; 3], &mut buf);
        assert_eq!(nullable, vec![true, false, false]);
        // Expected: the parts' rows concatenated.
        let whole =
            arrow::compute::concat_batches(&first.schema(), &[first.clone(), second.clone(), third.slice(1, 39)])
                .unwrap();
        for (k, &(c, w)) in layout.columns.iter().enumerate() {
            let want = fixed_values(whole.column(c).as_ref(), w);
            assert_eq!(
                &buf[layout.values[k]..layout.values[k] + rows * w],
                want.as_slice(),
                "column {c}"
            );
        }
        let bits = &buf[layout.bitmaps[0]..layout.bitmaps[0] + rows.div_ceil(8)];
        let valid = whole.column(0).nulls().unwrap();
        for r in 0..rows {
            assert_eq!(bits[r / 8] >> (r % 8) & 1 == 1, valid.is_valid(r), "row {r}");
        }
        // Columns without nulls in the segment leave their bitmap region alone.
        assert!(buf[layout.bitmaps[1]..layout.bytes].iter().all(|&b| b == 0xEE));
    }

    #[test]
    fn staging_raises_long_views_to_the_data_buffers_of_their_batch() {
        use arrow::array::{AsArray, StringViewBuilder};
        use gpusort::cpu::gather::{ViewBufferLists, concat_column};
        let strings = |seed: usize| {
            let mut b = StringViewBuilder::new().with_fixed_block_size(64);
            for i in 0..50 {
                match (i + seed) % 4 {
                    0 => b.append_null(),
                    1 => b.append_value("short"),
                    _ => b.append_value(format!("a value longer than twelve bytes {i} {seed}")),
                }
            }
            Arc::new(b.finish()) as arrow::array::ArrayRef
        };
        let batches: Vec<RecordBatch> = (0..3)
            .map(|seed| {
                RecordBatch::try_from_iter([("s", strings(seed))])
                    .unwrap()
                    .slice(seed, 40)
            })
            .collect();
        let mut lists = ViewBufferLists::default();
        let mut parts = vec![];
        for (i, b) in batches.iter().enumerate() {
            let first = lists.first_of(i, b.column(0).as_string_view().data_buffers()).unwrap();
            assert_eq!(first > 0, i > 0, "each batch has buffers of its own");
            parts.push(Part {
                batch: b.clone(),
                offset: 0,
                len: 40,
                at: 40 * i,
                first_buffers: Arc::from(vec![first]),
            });
        }
        let layout = SegmentLayout::new(vec![(0, 16)], 128);
        let mut buf = vec![0u8; layout.bytes];
        stage(&layout, &parts, &vec![vec![None; parts.len()]], &mut buf);
        // The views a concatenation of the batches makes, which index the same buffers.
        let columns: Vec<&dyn Array> = batches.iter().map(|b| b.column(0).as_ref()).collect();
        let want = concat_column(&columns).unwrap();
        assert_eq!(&buf[..120 * 16], fixed_values(want.as_ref(), 16).as_slice());
    }

    #[test]
    fn ones_cover_exactly_their_range() {
        let mut bits = vec![0u8; 1200];
        set_ones(&mut bits, 13, 9000);
        for i in 0..bits.len() * 8 {
            assert_eq!(bits[i / 8] >> (i % 8) & 1 == 1, (13..9013).contains(&i), "bit {i}");
        }
    }
}
