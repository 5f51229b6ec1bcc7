//! [`GpuSortSession`]: a GPU sort fed batch by batch, so that the input crosses PCIe while it
//! arrives instead of after it.
//!
//! # Input: segments
//!
//! The rows are cut, in input order, into **segments** of a fixed number of rows (about
//! [`SEGMENT_BYTES`] of fixed-width payload, a multiple of 64 rows). When [`GpuSortSession::push`]
//! completes a segment it hands it to the session's **uploader thread**, which
//!
//! 1. takes the next of [`STAGING_DEPTH`] pinned staging buffers (from the [`PinnedPool`]),
//!    waiting for the copy that last read it;
//! 2. copies the segment's rows of every device column into it on all cores, ByField: each
//!    column's values at their row offsets, then the validity bits of the columns that have
//!    nulls in the segment;
//! 3. starts one host-to-device copy per column (and bitmap) on the session's **copy stream**
//!    into device memory of its own.
//!
//! So while batch `k` arrives, segment `j` is staged and segment `j - 1` crosses PCIe.
//!
//! Device columns are the fixed-width ones of 1 to 16 bytes ([`fixed_width`]) except
//! dictionaries (batches may each bring their own dictionary): their values move on the
//! device. Every other column, and the sort keys, stay on the host.
//!
//! # Finish
//!
//! [`GpuSortSession::finish`] sends the last, partial segment and waits for the uploads. Then:
//!
//! 1. when a sort column is not a native integer or float on the device (strings, booleans,
//!    dictionaries, 16-byte decimals...), the **key columns** alone are concatenated on the
//!    host and encoded whole by [`KeyEncoder`] into pinned buffers (the encoding needs the
//!    whole column: minimum, maximum, common prefixes), while the last uploads finish; only
//!    the key words that vary go up;
//! 2. each device column is assembled from its segments by device-to-device copies on the sort
//!    stream (a column of a segment without nulls gets all-valid bits), each segment's copy
//!    freed once its column is assembled; keys of native columns are then encoded on the
//!    device from the assembled columns ([`crate::encode`]: the same words, no host pass and
//!    no key upload; `GPUSORT_DEVICE_KEYS=0` encodes them on the host instead);
//! 3. [`Gpu::sort`] runs the planned strategy (the rule calibrated on the H100, or the one asked for);
//!    truncated string keys that tie are ordered on the host as in the one-batch sort;
//! 4. the sorted device columns come down straight into pinned pool buffers that become the
//!    output arrays (no host copy after the download), while the host concatenates and
//!    gathers the other columns through the permutation ([`gather_column`]).
//!
//! The result is the same stable order as the CPU backend's. A session that is dropped
//! instead (the caller sorts elsewhere) frees its device and pinned memory.

use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use arrow::array::{Array, ArrayRef, RecordBatch, RecordBatchOptions, UInt32Array};
use arrow::buffer::{BooleanBuffer, NullBuffer, ScalarBuffer};
use arrow::datatypes::{DataType, SchemaRef};
use arrow::util::bit_mask::set_bits;
use cudarc::driver::{CudaEvent, CudaSlice, CudaStream, DevicePtr, result};
use gpusort::backend::{check_rows, planned_strategy};
use gpusort::cpu::gather::{concat_column, fixed_array, fixed_values, fixed_width, gather_column};
use gpusort::keys::{KeyLayout, OrdinalKind, native_ordinal_kind};
use gpusort::plan::{RecordMove, Strategy, radix_passes};
use gpusort::{EncoderOptions, KeyEncoder, SortKey, SortOutput, SortSpec, SortStats};
use rayon::prelude::*;

use crate::encode::{DeviceKeyColumn, KEY_MAX_WORDS};
use crate::error::{CudaSortError, Result};
use crate::gpu::Gpu;
use crate::memory::device_bytes_needed;
use crate::pinned::{HostBuffer, PinnedPool};
use crate::table::{DeviceColumn, DeviceTable, GpuSortPlan};
use crate::transfer::Transfers;

/// Bytes of a string or binary sort key (after the column's common prefix) that a GPU sort
/// encodes into its key unless asked otherwise: each key word costs the device a few radix
/// passes (milliseconds), while rows whose truncated prefixes tie are ordered on the host by
/// comparing whole values (seconds: TPC-H's `l_comment`, 60M rows of 10-43 bytes, took 5.2 s
/// to resolve with the CPU backend's 8-byte prefixes).
pub const GPU_STRING_PREFIX_BYTES: usize = 32;

/// Pinned staging bytes of one segment (its rows: this over the bytes of a row of payload).
pub const SEGMENT_BYTES: usize = 32 << 20;
/// Staging buffers in flight: one being filled, the others crossing PCIe.
pub const STAGING_DEPTH: usize = 3;
/// Segments hold a multiple of this many rows, so their validity bits start on a byte.
const SEGMENT_ALIGN: usize = 64;
/// Rows (of one column) per staging copy task.
const STAGE_TASK_BYTES: usize = 1 << 20;

/// Rows `offset..offset + len` of a batch, going to row `at` of a segment.
#[derive(Debug, Clone)]
struct Part {
    batch: RecordBatch,
    offset: usize,
    len: usize,
    at: usize,
}

/// Where the columns of a segment lie in its staging buffer: each device column's values
/// (`rows * width` bytes), then each one's validity bits (`rows / 8` bytes).
#[derive(Debug, Clone)]
struct SegmentLayout {
    rows: usize,
    /// Device columns: index in the batch and bytes per row.
    columns: Vec<(usize, usize)>,
    values: Vec<usize>,
    bitmaps: Vec<usize>,
    bytes: usize,
}

impl SegmentLayout {
    fn new(columns: Vec<(usize, usize)>, rows: usize) -> Self {
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
    fn rows_for(columns: &[(usize, usize)], expected: Option<usize>) -> usize {
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

/// Copies the rows of `parts` into `buf` (laid out by `layout`), on all cores; returns, per
/// device column, whether its validity bits were staged (some part has nulls in it).
fn stage(layout: &SegmentLayout, parts: &[Part], buf: &mut [u8]) -> Vec<bool> {
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
        for (p, part) in parts.iter().enumerate() {
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
        // SAFETY: tasks write disjoint ranges of the column's region of `buf`.
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), base.at(dst), src.len()) };
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
struct DeviceSegment {
    first_row: usize,
    rows: usize,
    values: Vec<Option<CudaSlice<u8>>>,
    bitmaps: Vec<Option<CudaSlice<u8>>>,
}

/// A segment for the uploader.
struct SegmentJob {
    first_row: usize,
    rows: usize,
    parts: Vec<Part>,
}

/// What the uploader did.
#[derive(Default)]
struct Uploaded {
    segments: Vec<DeviceSegment>,
    device_bytes: usize,
    to_device: u64,
    stage_time: Duration,
    upload_time: Duration,
}

/// Keys encoded on the host: the encoder (its layout, and the columns tied rows are ordered
/// by), the key words in pinned buffers, and the bits of each word that vary.
struct HostKeys {
    encoder: KeyEncoder,
    words: Vec<HostBuffer>,
    varying: Vec<u32>,
}

/// A key the device encodes from its columns: each sort key's device column (its index in
/// the session's device columns) and ordinal kind, and the most key words the key's types
/// can take.
struct DeviceKeys {
    columns: Vec<(usize, OrdinalKind)>,
    max_words: usize,
}

/// Where a sort's key is encoded.
enum KeySource {
    Host(HostKeys),
    Device(DeviceKeys),
}

/// The uploader thread of a session (see the module docs).
struct Uploader {
    jobs: Option<mpsc::Sender<SegmentJob>>,
    thread: Option<JoinHandle<Result<Uploaded>>>,
}

impl Uploader {
    fn start(gpu: Arc<Gpu>, stream: Arc<CudaStream>, layout: SegmentLayout, available: usize) -> Result<Self> {
        let (tx, rx) = mpsc::channel::<SegmentJob>();
        let thread = std::thread::Builder::new()
            .name("gpusort-upload".into())
            .spawn(move || upload_segments(&gpu, &stream, &layout, available, rx))
            .map_err(|e| CudaSortError::Unsupported(format!("cannot start the upload thread: {e}")))?;
        Ok(Self {
            jobs: Some(tx),
            thread: Some(thread),
        })
    }

    /// Hands over a segment; false when the thread has stopped (with an error).
    fn send(&self, job: SegmentJob) -> bool {
        self.jobs.as_ref().is_some_and(|j| j.send(job).is_ok())
    }

    /// Waits for every upload.
    fn join(mut self) -> Result<Uploaded> {
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

/// The uploader's loop: stage each segment in the next staging buffer and start its copies.
fn upload_segments(
    gpu: &Gpu,
    stream: &Arc<CudaStream>,
    layout: &SegmentLayout,
    available: usize,
    jobs: mpsc::Receiver<SegmentJob>,
) -> Result<Uploaded> {
    gpu.context().bind_to_thread()?;
    let pool = PinnedPool::global();
    let mut out = Uploaded::default();
    let mut copies = Transfers::new(stream);
    // Staging buffers and the event after the copies that last read each.
    let mut staging: Vec<(HostBuffer, Option<CudaEvent>)> = vec![];
    let mut timings: Vec<(CudaEvent, CudaEvent)> = vec![];
    let result = (|| -> Result<()> {
        for (j, job) in jobs.iter().enumerate() {
            let slot = j % STAGING_DEPTH;
            if staging.len() <= slot {
                staging.push((pool.alloc(layout.bytes), None));
            }
            let (buf, free) = &mut staging[slot];
            let wait = Instant::now();
            if let Some(e) = free.take() {
                e.synchronize()?;
            }
            let start = Instant::now();
            let nullable = stage(layout, &job.parts, buf.as_mut_slice());
            let staged = start.elapsed();
            out.stage_time += staged;
            log::debug!(
                target: "gpusort::timeline",
                "upload: segment {j} staged ({} rows; {:.2} ms waiting for its buffer, {:.2} ms staging)",
                job.rows,
                (start - wait).as_secs_f64() * 1e3,
                staged.as_secs_f64() * 1e3
            );
            let begin = gpu.event()?;
            begin.record(stream)?;
            let mut segment = DeviceSegment {
                first_row: job.first_row,
                rows: job.rows,
                values: vec![],
                bitmaps: vec![],
            };
            for (k, &(_, w)) in layout.columns.iter().enumerate() {
                let bytes = &buf.as_slice()[layout.values[k]..layout.values[k] + job.rows * w];
                segment.values.push(Some(upload(stream, &mut copies, bytes)?));
                out.device_bytes += bytes.len();
                segment.bitmaps.push(if nullable[k] {
                    let bits = &buf.as_slice()[layout.bitmaps[k]..layout.bitmaps[k] + job.rows.div_ceil(8)];
                    out.device_bytes += bits.len();
                    Some(upload(stream, &mut copies, bits)?)
                } else {
                    None
                });
            }
            let end = gpu.event()?;
            end.record(stream)?;
            log::debug!(target: "gpusort::timeline", "upload: segment {j} copies started");
            *free = Some(gpu.event()?);
            free.as_ref().unwrap().record(stream)?;
            timings.push((begin, end));
            out.segments.push(segment);
            if out.device_bytes > available {
                return Err(CudaSortError::OutOfMemory {
                    needed: out.device_bytes,
                    available,
                });
            }
        }
        Ok(())
    })();
    // The staging buffers go back to the pool only once no copy reads them.
    let synced = stream.synchronize();
    result?;
    synced?;
    for (b, e) in &timings {
        out.upload_time += Duration::from_secs_f64(b.elapsed_ms(e)? as f64 / 1e3);
    }
    out.to_device = copies.to_device;
    Ok(out)
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

/// A column the device moves or gathers: its index, width, and whether it has nulls.
#[derive(Debug, Clone, Copy)]
struct GpuColumn {
    index: usize,
    width: usize,
    nullable: bool,
}

/// A GPU sort fed batch by batch (see the module docs). Made by
/// [`CudaBackend::begin_sort`](crate::CudaBackend::begin_sort).
pub struct GpuSortSession {
    gpu: Arc<Gpu>,
    device_lock: Arc<Mutex<()>>,
    digit_bits: u32,
    schema: SchemaRef,
    spec: SortSpec,
    strategy: Option<Strategy>,
    encoder: EncoderOptions,
    memory_limit: Option<usize>,
    expected_rows: Option<usize>,
    /// Whether [`GpuSortSession::finish`] returns the permutation.
    want_permutation: bool,
    /// Device columns (index, width).
    columns: Vec<(usize, usize)>,
    batches: Vec<RecordBatch>,
    rows: usize,
    /// The segment being filled: its parts and rows; rows handed to the uploader before it;
    /// the layout once the first batch came.
    open: Vec<Part>,
    open_rows: usize,
    sent_rows: usize,
    layout: Option<SegmentLayout>,
    copy_stream: Option<Arc<CudaStream>>,
    uploader: Option<Uploader>,
    /// Why an upload failed: the session cannot sort any more.
    failed: Option<String>,
}

impl std::fmt::Debug for GpuSortSession {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GpuSortSession")
            .field("spec", &self.spec)
            .field("rows", &self.rows)
            .field("batches", &self.batches.len())
            .finish()
    }
}

impl GpuSortSession {
    pub(crate) fn new(
        gpu: Arc<Gpu>,
        device_lock: Arc<Mutex<()>>,
        digit_bits: u32,
        schema: SchemaRef,
        spec: SortSpec,
    ) -> Result<Self> {
        spec.validate(schema.fields().len())?;
        let columns = schema
            .fields()
            .iter()
            .enumerate()
            .filter(|(_, f)| !matches!(f.data_type(), DataType::Dictionary(..)))
            .filter_map(|(i, f)| Some((i, fixed_width(f.data_type()).filter(|w| *w <= 16)?)))
            .collect();
        Ok(Self {
            gpu,
            device_lock,
            digit_bits,
            schema,
            spec,
            strategy: None,
            encoder: EncoderOptions {
                max_prefix_bytes: GPU_STRING_PREFIX_BYTES,
            },
            memory_limit: None,
            expected_rows: None,
            want_permutation: true,
            columns,
            batches: vec![],
            rows: 0,
            open: vec![],
            open_rows: 0,
            sent_rows: 0,
            layout: None,
            copy_stream: None,
            uploader: None,
            failed: None,
        })
    }

    /// Runs `strategy` instead of the planner's choice.
    pub fn with_strategy(mut self, strategy: Option<Strategy>) -> Self {
        self.strategy = strategy;
        self
    }

    /// Encodes keys with these options.
    pub fn with_encoder_options(mut self, encoder: EncoderOptions) -> Self {
        self.encoder = encoder;
        self
    }

    /// Fails with [`CudaSortError::OutOfMemory`] — while the input arrives, or at the latest
    /// before the sort starts — when the sort would need more than `limit` bytes of device
    /// memory (or more than the device has free).
    pub fn with_memory_limit(mut self, limit: Option<usize>) -> Self {
        self.memory_limit = limit;
        self
    }

    /// Whether [`GpuSortSession::finish`] returns the permutation (the default). Without it
    /// the output's `indices` are empty and the permutation does not cross PCIe unless the
    /// host needs it (to gather columns of its own or to order tied string prefixes).
    pub fn with_permutation(mut self, want: bool) -> Self {
        self.want_permutation = want;
        self
    }

    /// Sizes the staging for about `rows` rows (smaller segments for a small sort).
    pub fn with_expected_rows(mut self, rows: usize) -> Self {
        self.expected_rows = Some(rows);
        self
    }

    /// Rows pushed so far.
    pub fn num_rows(&self) -> usize {
        self.rows
    }

    /// Adds `batch` (of the session's schema) to the sort and starts moving its device columns
    /// to the GPU. Fails when an earlier upload failed (out of device memory, a driver error):
    /// the session is then of no further use.
    pub fn push(&mut self, batch: &RecordBatch) -> Result<()> {
        let n = batch.num_rows();
        if n == 0 {
            return Ok(());
        }
        let types_match = batch.num_columns() == self.schema.fields().len()
            && batch
                .schema()
                .fields()
                .iter()
                .zip(self.schema.fields())
                .all(|(a, b)| a.data_type() == b.data_type());
        if !types_match {
            return Err(CudaSortError::Unsupported(format!(
                "a batch of schema {:?} in a sort of {:?}",
                batch.schema(),
                self.schema
            )));
        }
        self.check_failed()?;
        check_rows(self.rows + n)?;
        self.batches.push(batch.clone());
        self.rows += n;
        if self.columns.is_empty() {
            return Ok(());
        }
        let segment_rows = match &self.layout {
            Some(l) => l.rows,
            None => {
                let rows = SegmentLayout::rows_for(&self.columns, self.expected_rows);
                self.layout.insert(SegmentLayout::new(self.columns.clone(), rows)).rows
            }
        };
        let mut offset = 0;
        while offset < n {
            let len = (segment_rows - self.open_rows).min(n - offset);
            self.open.push(Part {
                batch: batch.clone(),
                offset,
                len,
                at: self.open_rows,
            });
            self.open_rows += len;
            offset += len;
            if self.open_rows == segment_rows {
                self.send_segment()?;
            }
        }
        Ok(())
    }

    /// Hands the open segment to the uploader (starting it first).
    fn send_segment(&mut self) -> Result<()> {
        if self.open_rows == 0 {
            return Ok(());
        }
        if self.uploader.is_none() {
            let free = self.gpu.free_memory()?;
            let available = self.memory_limit.map_or(free, |l| l.min(free));
            let stream = self.gpu.context().new_stream()?;
            let layout = self.layout.clone().expect("a layout with the first rows");
            self.copy_stream = Some(Arc::clone(&stream));
            self.uploader = Some(Uploader::start(Arc::clone(&self.gpu), stream, layout, available)?);
        }
        let job = SegmentJob {
            first_row: self.sent_rows,
            rows: self.open_rows,
            parts: std::mem::take(&mut self.open),
        };
        self.sent_rows += self.open_rows;
        self.open_rows = 0;
        if !self.uploader.as_ref().unwrap().send(job) {
            // The uploader stopped on an error: that error.
            let e = match self.uploader.take().unwrap().join() {
                Err(e) => e,
                Ok(_) => CudaSortError::Unsupported("the upload thread stopped".into()),
            };
            self.failed = Some(e.to_string());
            return Err(e);
        }
        Ok(())
    }

    /// Fails when an earlier upload failed.
    fn check_failed(&self) -> Result<()> {
        match &self.failed {
            Some(why) => Err(CudaSortError::Unsupported(format!("an earlier upload failed: {why}"))),
            None => Ok(()),
        }
    }

    /// Sorts every row pushed and returns the first `limit` (all with `None`), as one batch,
    /// with the permutation and what the sort did.
    pub fn finish(mut self, limit: Option<usize>) -> Result<SortOutput> {
        let n = self.rows;
        let limit = limit.unwrap_or(n).min(n);
        self.check_failed()?;
        // The last segment goes to the uploader; the host's columns are concatenated and the
        // keys encoded while the uploads finish.
        self.send_segment()?;
        log::debug!(target: "gpusort::timeline", "session finish: {n} rows, last segment sent");
        let mut stats = SortStats {
            rows: n,
            ..Default::default()
        };
        let strategy = planned_strategy(self.strategy, self.schema.fields().len(), self.spec.len());
        if n == 0 {
            stats.strategy = Some(strategy);
            return Ok(SortOutput {
                batch: RecordBatch::new_empty(Arc::clone(&self.schema)),
                indices: UInt32Array::from(Vec::<u32>::new()),
                stats,
            });
        }

        // Keys of native columns are encoded on the device, from the columns it holds.
        let device_keys = self.device_keys();
        // The host's columns: the keys (unless the device encodes them), and every column the
        // device does not move.
        let start = Instant::now();
        let mut on_host: Vec<usize> = match device_keys {
            Some(_) => vec![],
            None => self.spec.keys().iter().map(|k| k.column).collect(),
        };
        on_host.extend((0..self.schema.fields().len()).filter(|c| !self.columns.iter().any(|(i, _)| i == c)));
        on_host.sort_unstable();
        on_host.dedup();
        let concatenated = self.concat_columns(&on_host)?;
        let host_column = |c: usize| &concatenated[on_host.binary_search(&c).expect("a host column")];
        stats.concat_time = start.elapsed();

        let pool = PinnedPool::global();
        let keys = match device_keys {
            Some(d) => KeySource::Device(d),
            None => {
                let start = Instant::now();
                let keys = self.encode_on_host(&concatenated, &on_host)?;
                stats.encode_time = start.elapsed();
                log::debug!(target: "gpusort::timeline", "session: keys encoded");
                KeySource::Host(keys)
            }
        };

        let start = Instant::now();
        let uploaded = match self.uploader.take() {
            Some(u) => u.join()?,
            None => Uploaded::default(),
        };
        log::debug!(target: "gpusort::timeline", "session: uploads done");
        stats.stage_time = uploaded.stage_time;
        stats.upload_time = uploaded.upload_time;
        stats.bytes_to_device = uploaded.to_device;
        let inexact = matches!(&keys, KeySource::Host(k) if !k.encoder.layout().is_exact());
        // Tie resolution needs the permutation before the columns move: indirect.
        let direct = strategy.record_move == RecordMove::Direct && !inexact;
        let record_move = if direct {
            RecordMove::Direct
        } else {
            RecordMove::Indirect
        };
        let columns: Vec<GpuColumn> = self
            .columns
            .iter()
            .enumerate()
            .map(|(k, &(index, width))| GpuColumn {
                index,
                width,
                nullable: uploaded.segments.iter().any(|s| s.bitmaps[k].is_some()),
            })
            .collect();
        let nullable: Vec<usize> = (0..columns.len()).filter(|&k| columns[k].nullable).collect();
        // Key words on the device: those that vary, or (encoded there) at most every word
        // the key's types can take.
        let key_words = match &keys {
            KeySource::Host(k) => k.varying.iter().filter(|v| **v != 0).count(),
            KeySource::Device(d) => d.max_words,
        };
        let needed = |pack| {
            device_bytes_needed(
                n,
                key_words,
                &columns.iter().map(|c| c.width).collect::<Vec<_>>(),
                nullable.len(),
                direct,
                pack,
            )
        };
        let gpu = &self.gpu;
        let free = gpu.free_memory()? + uploaded.device_bytes;
        let available = self.memory_limit.map_or(free, |l| l.min(free));
        // Packed gathers where the memory allows.
        let pack_gathers = needed(true) <= available;
        let needed = needed(false);
        if needed > available {
            return Err(CudaSortError::OutOfMemory { needed, available });
        }
        stats.strategy = Some(Strategy::new(strategy.algorithm, record_move));
        stats.moved_columns = if direct { columns.len() } else { 0 };
        stats.gathered_columns = self.schema.fields().len() - stats.moved_columns;
        stats.host_gathered_columns = self.schema.fields().len() - columns.len();

        // The device phase: one sort at a time on the sort stream.
        let _device = self.device_lock.lock().unwrap_or_else(|p| p.into_inner());
        let stream = gpu.stream();
        let mut copies = Transfers::new(stream);
        // GPU-side marks for the timeline (assembly, key upload), only while it is logged.
        let marks = match log::log_enabled!(target: "gpusort::timeline", log::Level::Debug) {
            true => Some([gpu.event()?, gpu.event()?, gpu.event()?]),
            false => None,
        };
        let mark = |i: usize| marks.as_ref().map_or(Ok(()), |m| m[i].record(stream));
        mark(0)?;
        let (values, bitmaps) = self.assemble(uploaded.segments, &columns)?;
        mark(1)?;
        // Keys: only words that vary are kept on the device (no pass reads the others).
        let (key_words, varying, key_bits) = match &keys {
            KeySource::Host(k) => {
                let words = k
                    .words
                    .iter()
                    .zip(&k.varying)
                    .map(|(w, v)| match *v != 0 {
                        // SAFETY: the words stay untouched until the sort has synchronized.
                        true => unsafe { copies.upload_buffer_words(gpu, w, n) },
                        false => gpu.alloc_words(1),
                    })
                    .collect::<Result<Vec<_>>>()?;
                (words, k.varying.clone(), k.encoder.layout().total_bits())
            }
            KeySource::Device(d) => {
                let start = Instant::now();
                let key_columns: Vec<DeviceKeyColumn<'_>> = d
                    .columns
                    .iter()
                    .map(|&(k, kind)| DeviceKeyColumn {
                        values: &values[k],
                        valid: bitmaps[k].as_ref(),
                        kind,
                    })
                    .collect();
                let column_stats = gpu.native_key_stats(&key_columns, n)?;
                let layout = KeyLayout::from_native_stats(&self.spec, &column_stats)?;
                let (words, varying) = gpu.encode_native_keys(&key_columns, &layout, n)?;
                let words = words
                    .into_iter()
                    .zip(&varying)
                    .map(|(w, v)| match *v != 0 {
                        true => Ok(w),
                        false => gpu.alloc_words(1),
                    })
                    .collect::<Result<Vec<_>>>()?;
                stats.encode_time = start.elapsed();
                log::debug!(target: "gpusort::timeline", "session: keys encoded on the device");
                (words, varying, layout.total_bits())
            }
        };
        let passes = radix_passes(&varying, self.digit_bits);
        stats.key_bits = key_bits;
        stats.passes = passes.len();
        let mut table = DeviceTable {
            num_rows: n,
            keys: key_words,
            columns: vec![],
            records: None,
        };
        let mut values: Vec<DeviceColumn> = values
            .into_iter()
            .zip(&columns)
            .map(|(data, c)| DeviceColumn { data, width: c.width })
            .collect();
        if direct {
            // The columns move with the keys; validity too, 32 columns' bits per u32 lane.
            table.columns = std::mem::take(&mut values);
            for group in nullable.chunks(32) {
                let refs: Vec<(&CudaSlice<u8>, u32)> =
                    group.iter().map(|&k| (bitmaps[k].as_ref().unwrap(), 0)).collect();
                let lane = gpu.pack_bits(&refs, n)?;
                table.columns.push(DeviceColumn { data: lane, width: 4 });
            }
        }
        mark(2)?;
        let plan = GpuSortPlan {
            strategy: Strategy::new(strategy.algorithm, record_move),
            passes,
            keep_keys: inexact,
            want_perm: true,
            pack_gathers,
        };
        let result = gpu.sort(&mut table, &plan)?;
        let mut device_ms = result.kernel_ms;
        let mut perm_dev = result.perm.expect("asked for the permutation");
        if let Some(m) = &marks {
            log::debug!(
                target: "gpusort::timeline",
                "session: sorted (GPU: assembly {:.2} ms, keys up {:.2} ms, sort {:.2} ms)",
                m[0].elapsed_ms(&m[1])?,
                m[1].elapsed_ms(&m[2])?,
                result.kernel_ms
            );
        }
        let mut perm = pool.transfer_buffer(4 * n);
        // The host needs the permutation before the columns come down only to resolve ties
        // or to gather columns of its own; otherwise it follows them.
        let host_gathers = self.schema.fields().len() > columns.len();
        let perm_first = inexact || host_gathers;
        if perm_first {
            // SAFETY: synchronized right after.
            unsafe { copies.download_words(&perm_dev, &mut perm) }?;
            stream.synchronize()?;
        }
        if let (KeySource::Host(HostKeys { encoder, words, .. }), true) = (&keys, inexact && n > 1) {
            let layout = encoder.layout();
            let mut sorted: Vec<Option<HostBuffer>> = vec![];
            for (w, v) in table.keys.iter().zip(&varying) {
                sorted.push(if *v != 0 {
                    let mut host = pool.transfer_buffer(4 * n);
                    // SAFETY: synchronized below, before any read.
                    unsafe { copies.download_words(w, &mut host) }?;
                    Some(host)
                } else {
                    None
                });
            }
            stream.synchronize()?;
            // Constant words are sorted in any order.
            let views: Vec<&[u32]> = sorted
                .iter()
                .zip(words)
                .map(|(s, original)| s.as_ref().unwrap_or(original).as_words())
                .collect();
            let ties = gpusort::ties::resolve_ties(layout, encoder.sort_columns(), &views, perm.as_words_mut())?;
            stats.tie_groups = ties.len();
            if !ties.is_empty() {
                // SAFETY: `perm` is only read until the downloads below have synchronized.
                perm_dev = unsafe { copies.upload_buffer_words(gpu, &perm, n) }?;
            }
        }
        table.keys.clear();
        stats.sort_time = start.elapsed();

        // The device's columns come down into pool buffers (indirect: gathered first, only the
        // rows kept) while the host gathers the others.
        let start = Instant::now();
        let downloads_start = gpu.event()?;
        downloads_start.record(stream)?;
        let mut sorted_values: Vec<HostBuffer> = vec![];
        let mut sorted_bits: Vec<Option<HostBuffer>> = vec![];
        // Indirect: the columns gathered together first (packed into rows where that reads
        // fewer sectors and fits, see `Gpu::gather_columns`).
        if !direct {
            gpu.gather_columns(&mut values, n, &perm_dev, limit, pack_gathers)?;
        }
        for (k, c) in columns.iter().enumerate() {
            let dev = if direct {
                &table.columns[k].data
            } else {
                &values[k].data
            };
            let mut host = pool.transfer_buffer(limit * c.width);
            // SAFETY: read only after the stream synchronizes below.
            unsafe { copies.download(dev, &mut host) }?;
            sorted_values.push(host);
            sorted_bits.push(match &bitmaps[k] {
                None => None,
                Some(bits) => {
                    let dev_bits = if direct {
                        let j = nullable.iter().position(|&x| x == k).unwrap();
                        gpu.unpack_bits(&table.columns[columns.len() + j / 32].data, (j % 32) as u32, limit)?
                    } else {
                        gpu.gather_bitmap(bits, 0, &perm_dev, limit)?
                    };
                    let mut host = pool.alloc(limit.div_ceil(32) * 4);
                    // SAFETY: as above.
                    unsafe { copies.download(&dev_bits, &mut host) }?;
                    Some(host)
                }
            });
        }
        if !perm_first && self.want_permutation {
            // SAFETY: read only after the stream synchronizes below.
            unsafe { copies.download_words(&perm_dev, &mut perm) }?;
        }
        let downloads_end = gpu.event()?;
        downloads_end.record(stream)?;
        // Only read when the host gathers columns, and then it came down first.
        let head: &[u32] = if perm_first { &perm.as_words()[..limit] } else { &[] };
        let host_sorted = (0..self.schema.fields().len())
            .into_par_iter()
            .map(|c| match columns.iter().any(|g| g.index == c) {
                true => Ok(None),
                false => gather_column(host_column(c), head).map(Some),
            })
            .collect::<gpusort::Result<Vec<Option<ArrayRef>>>>()?;
        downloads_end.synchronize()?;
        log::debug!(target: "gpusort::timeline", "session: downloads done");
        let download_ms = downloads_start.elapsed_ms(&downloads_end)?;
        stats.download_time = Duration::from_secs_f64(download_ms as f64 / 1e3);
        if !direct {
            // Gathers and downloads interleave; the device time counts both.
            device_ms += download_ms;
        }
        stats.device_time = Some(Duration::from_secs_f64(device_ms as f64 / 1e3));
        drop((table, values, bitmaps));
        let mut device_sorted = sorted_values.into_iter().zip(sorted_bits);
        let out_columns: Vec<ArrayRef> = host_sorted
            .into_iter()
            .enumerate()
            .map(|(c, host)| match host {
                Some(sorted) => sorted,
                None => {
                    let (values, bits) = device_sorted.next().expect("a device column");
                    let nulls = bits.map(|b| NullBuffer::new(BooleanBuffer::new(b.into_buffer(), 0, limit)));
                    fixed_array(self.batches[0].column(c).as_ref(), values.into_buffer(), nulls, limit)
                }
            })
            .collect();
        let batch = RecordBatch::try_new_with_options(
            Arc::clone(&self.schema),
            out_columns,
            &RecordBatchOptions::new().with_row_count(Some(limit)),
        )
        .map_err(gpusort::GpusortError::from)?;
        stats.gather_time = start.elapsed();
        log::debug!(target: "gpusort::timeline", "session: output batch built");
        stats.bytes_to_device += copies.to_device;
        stats.bytes_from_device = copies.from_device;
        let kept = if self.want_permutation { limit } else { 0 };
        perm.truncate(4 * kept);
        let indices = UInt32Array::new(ScalarBuffer::new(perm.into_buffer(), 0, kept), None);
        drop((copies, _device));
        // The input's batches (and their concatenated columns) are released on another core:
        // thousands of arrays whose reference counts other threads last touched.
        let input = (std::mem::take(&mut self.batches), concatenated);
        rayon::spawn(move || drop(input));
        log::debug!(target: "gpusort::timeline", "session: input released");
        Ok(SortOutput { batch, indices, stats })
    }

    /// The key's columns on the device, when the device encodes the key itself; `None` when
    /// the host encodes it: some sort column is not native or not on the device, the key
    /// could be longer than [`KEY_MAX_WORDS`], or `GPUSORT_DEVICE_KEYS=0`.
    fn device_keys(&self) -> Option<DeviceKeys> {
        if std::env::var("GPUSORT_DEVICE_KEYS").is_ok_and(|v| v == "0") {
            return None;
        }
        let max_words = KeyLayout::native_max_words(&self.spec, &self.schema)?;
        if max_words > KEY_MAX_WORDS {
            return None;
        }
        let columns = self
            .spec
            .keys()
            .iter()
            .map(|key| {
                let k = self.columns.iter().position(|(c, _)| *c == key.column)?;
                Some((k, native_ordinal_kind(self.schema.field(key.column).data_type())?))
            })
            .collect::<Option<Vec<_>>>()?;
        Some(DeviceKeys { columns, max_words })
    }

    /// The keys encoded on the host into pinned buffers, from the concatenated columns
    /// `concatenated` (of the columns `on_host`, which hold every sort column).
    fn encode_on_host(&self, concatenated: &[ArrayRef], on_host: &[usize]) -> Result<HostKeys> {
        let n = self.rows;
        let host_column = |c: usize| &concatenated[on_host.binary_search(&c).expect("a host column")];
        let key_columns: Vec<usize> = {
            let mut k: Vec<usize> = self.spec.keys().iter().map(|k| k.column).collect();
            k.sort_unstable();
            k.dedup();
            k
        };
        let key_batch = RecordBatch::try_new_with_options(
            Arc::new(self.schema.project(&key_columns).map_err(gpusort::GpusortError::from)?),
            key_columns.iter().map(|&c| Arc::clone(host_column(c))).collect(),
            &RecordBatchOptions::new().with_row_count(Some(n)),
        )
        .map_err(gpusort::GpusortError::from)?;
        let key_spec = SortSpec::new(self.spec.keys().iter().map(|k| SortKey {
            column: key_columns.binary_search(&k.column).expect("a key column"),
            options: k.options,
        }));
        let encoder = KeyEncoder::try_new(&key_batch, &key_spec, &self.encoder)?;
        let pool = PinnedPool::global();
        let mut words: Vec<HostBuffer> = (0..encoder.layout().num_words())
            .map(|_| pool.transfer_buffer(4 * n))
            .collect();
        let varying = {
            let mut views: Vec<&mut [u32]> = words.iter_mut().map(|w| w.as_words_mut()).collect();
            encoder.encode_into(&mut views)
        };
        Ok(HostKeys {
            encoder,
            words,
            varying,
        })
    }

    /// Columns `columns` (sorted) of every batch pushed, each in one array.
    fn concat_columns(&self, columns: &[usize]) -> Result<Vec<ArrayRef>> {
        Ok(columns
            .par_iter()
            .map(|&c| {
                if self.batches.len() == 1 {
                    return Ok(Arc::clone(self.batches[0].column(c)));
                }
                let parts: Vec<&dyn Array> = self.batches.iter().map(|b| b.column(c).as_ref()).collect();
                concat_column(&parts)
            })
            .collect::<gpusort::Result<Vec<_>>>()?)
    }

    /// Each device column in one buffer on the sort stream, from its segments (device-to-device
    /// copies), with its validity bits when it has nulls; each column's segment copies are
    /// freed as soon as the column is assembled.
    #[allow(clippy::type_complexity)]
    fn assemble(
        &self,
        mut segments: Vec<DeviceSegment>,
        columns: &[GpuColumn],
    ) -> Result<(Vec<CudaSlice<u8>>, Vec<Option<CudaSlice<u8>>>)> {
        let gpu = &self.gpu;
        let stream = gpu.stream();
        let n = self.rows;
        let mut values = vec![];
        let mut bitmaps = vec![];
        for (k, c) in columns.iter().enumerate() {
            let col = gpu.alloc_bytes(n * c.width)?;
            let col_ptr = col.device_ptr(stream).0;
            let bits = if c.nullable {
                Some(gpu.alloc_bytes(n.div_ceil(8))?)
            } else {
                None
            };
            // The values of every segment in one launch.
            let ranges: Vec<(u64, u64, usize)> = segments
                .iter()
                .map(|s| {
                    let src = s.values[k].as_ref().expect("each column assembled once");
                    (
                        src.device_ptr(stream).0,
                        col_ptr + (s.first_row * c.width) as u64,
                        s.rows * c.width,
                    )
                })
                .collect();
            // SAFETY: each source holds the segment's rows of the column, which land at their
            // own rows of `col`.
            unsafe { gpu.copy_ranges(&ranges) }?;
            for s in &segments {
                if let Some(bits) = &bits {
                    // Segments start on a byte of the bitmap (their rows are a multiple of 64).
                    let dst = bits.device_ptr(stream).0 + (s.first_row / 8) as u64;
                    let len = s.rows.div_ceil(8);
                    // SAFETY: the bitmap holds the segment's bits.
                    unsafe {
                        match &s.bitmaps[k] {
                            Some(src) => {
                                result::memcpy_dtod_async(dst, src.device_ptr(stream).0, len, stream.cu_stream())
                            }
                            None => result::memset_d8_async(dst, 0xFF, len, stream.cu_stream()),
                        }
                    }?;
                }
            }
            if let Some(copy_stream) = &self.copy_stream {
                // The segments' buffers are freed on the copy stream: after these copies.
                let assembled = gpu.event()?;
                assembled.record(stream)?;
                copy_stream.wait(&assembled)?;
                for s in segments.iter_mut() {
                    s.values[k] = None;
                    s.bitmaps[k] = None;
                }
            }
            values.push(col);
            bitmaps.push(bits);
        }
        Ok((values, bitmaps))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::{FixedSizeBinaryArray, Int64Array, UInt32Array};
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
            });
            at += len;
        }
        let rows = at;
        let layout = SegmentLayout::new(vec![(0, 4), (1, 8), (2, 2)], 128);
        let mut buf = vec![0xEEu8; layout.bytes];
        let nullable = stage(&layout, &parts, &mut buf);
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
    fn ones_cover_exactly_their_range() {
        let mut bits = vec![0u8; 1200];
        set_ones(&mut bits, 13, 9000);
        for i in 0..bits.len() * 8 {
            assert_eq!(bits[i / 8] >> (i % 8) & 1 == 1, (13..9013).contains(&i), "bit {i}");
        }
    }
}
