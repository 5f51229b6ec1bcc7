//! [`GpuSortSession`]: a GPU sort fed batch by batch, so that the input crosses PCIe while it
//! arrives instead of after it.
//!
//! # Input: segments
//!
//! The rows are cut, in input order, into **segments** of a fixed number of rows (about
//! [`SEGMENT_BYTES`] of fixed-width payload, a multiple of 64 rows). When [`GpuSortSession::push`]
//! completes a segment it hands it to the session's **uploader thread**, which
//!
//! 1. takes the next of its pinned staging buffers (from the [`PinnedPool`]; `stage_ahead +
//!    STAGING_DEPTH - 1` of them, see [`STAGING_DEPTH`]), waiting for the copy that last read it;
//! 2. copies the segment's rows of every device column into it on a thread of its own over
//!    all cores, ByField: each column's values at their row offsets, then the validity bits of
//!    the columns that have nulls in the segment; up to `GpuOptions::stage_ahead` segments are
//!    staged at once;
//! 3. in order, starts one host-to-device copy per column (and bitmap) on the session's
//!    **copy stream** into device memory of its own.
//!
//! So while batch `k` arrives, segments `j..j + stage_ahead` are staged and segment `j - 1`
//! crosses PCIe.
//!
//! Device columns are the fixed-width ones of 1 to 16 bytes ([`fixed_width`]) except
//! dictionaries (batches may each bring their own dictionary), and string and binary views
//! (`GpuOptions::device_views`): their values move on the device. A view is 16 bytes that
//! hold a short value or a long value's prefix, buffer index and offset; each batch brings its
//! own data buffers, so a long view's buffer index is raised as it is staged to where its
//! batch's buffers come among the session's ([`ViewBufferLists`]), and the sorted views index
//! them all, shared and never copied. Every other column, and the sort keys, stay on the
//! host.
//!
//! # Finish
//!
//! [`GpuSortSession::finish_sorted`] (and [`GpuSortSession::finish`], which takes every row
//! at once) sends the last, partial segment and waits for the uploads. Then:
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
//!    truncated string keys that tie are found on the host and ordered there or, for groups of
//!    many rows, on the device (`ties.rs`, `GPUSORT_DEVICE_TIES`);
//! 4. the device columns are put in order (gathered through the permutation on the device
//!    unless the sort moved them); then [`SortedRows::next_batch`] hands out a range of rows
//!    at a time: the range's device columns come down into pool buffers that become the
//!    output arrays (no host copy after the download), while the host gathers the other
//!    columns through the range's part of the permutation ([`gather_column`](gpusort::cpu::gather::gather_column)).
//!
//! The result is the same stable order as the CPU backend's. A session that is dropped
//! instead (the caller sorts elsewhere) frees its device and pinned memory.
//!
//! # Device memory
//!
//! Every byte a session holds on the device is reserved first from the process's
//! [`DeviceBudget`]: the uploader reserves each segment before it allocates it, and
//! [`GpuSortSession::finish`] reserves the sort's whole footprint before the device phase,
//! waiting for memory other sorts hold (see [`DeviceBudget`] for when it is refused instead:
//! [`CudaSortError::Busy`]). A sort that needs more than its own limit
//! ([`GpuSortSession::with_memory_limit`]) or the budget fails with
//! [`CudaSortError::OutOfMemory`] before it allocates. The reservation is released when the
//! sort's device memory is freed.

use std::sync::{Arc, Mutex};

use arrow::array::RecordBatch;
use arrow::datatypes::{DataType, SchemaRef};
use cudarc::driver::CudaStream;
use gpusort::backend::check_rows;
use gpusort::cpu::gather::{ViewBufferLists, fixed_width, view_data_buffers};
use gpusort::plan::Strategy;
use gpusort::{EncoderOptions, SortSpec};

use crate::error::{CudaSortError, Result};
use crate::gpu::Gpu;
use crate::memory::DeviceBudget;

mod device_input;
mod finish;
mod range_blocks;
mod sorted_rows;
mod upload;

pub use self::device_input::{DeviceBatch, DeviceBatchColumn};
pub use self::sorted_rows::SortedRows;

use self::device_input::DeviceInput;

use self::range_blocks::LongBytes;
use self::upload::{Part, SegmentJob, SegmentLayout, Uploader};

/// Bytes of a string or binary sort key (after the column's common prefix) that a GPU sort
/// encodes into its key unless asked otherwise: each key word costs the device a few radix
/// passes (milliseconds), while rows whose truncated prefixes tie are found in the downloaded
/// key words and ordered past the prefix (TPC-H's `l_comment`, 60M rows of 10-43 bytes, took
/// 5.2 s to resolve with the CPU backend's 8-byte prefixes at stop 13; finding its groups at
/// 32 bytes takes ~0.5 s on the H100 machine, ordering them ~0.25 s, stop 26).
pub const GPU_STRING_PREFIX_BYTES: usize = 32;

/// Bytes of a string or binary sort key (after the column's common prefix) up to which a GPU
/// sort encodes its values whole, past [`GPU_STRING_PREFIX_BYTES`], where the key's words
/// still fit what the device encodes (`KEY_MAX_WORDS`, 16: 48 bytes and two 64-bit keys do):
/// TPC-H's `l_comment` (10-43 bytes) then ties on no prefix, and the 2.8M groups tied on 32
/// bytes are not ordered afterwards (~0.35 s and the column's concatenation on the host, for
/// a few more radix passes).
pub const GPU_WHOLE_STRING_BYTES: usize = 48;

/// The key encoder's options of a GPU sort.
pub fn gpu_encoder_options() -> EncoderOptions {
    EncoderOptions {
        max_prefix_bytes: GPU_STRING_PREFIX_BYTES,
        whole_values_up_to: GPU_WHOLE_STRING_BYTES,
    }
}

/// Pinned staging bytes of one segment (its rows: this over the bytes of a row of payload).
pub const SEGMENT_BYTES: usize = 32 << 20;
/// Staging buffers with one segment staged at a time: one being filled, the others crossing
/// PCIe. Each more segment staged at once takes one more.
pub const STAGING_DEPTH: usize = 3;
/// Segments hold a multiple of this many rows, so their validity bits start on a byte.
const SEGMENT_ALIGN: usize = 64;
/// Rows (of one column) per staging copy task.
const STAGE_TASK_BYTES: usize = 1 << 20;

/// Whether columns of `data_type` are string or binary views.
fn is_view(data_type: &DataType) -> bool {
    matches!(data_type, DataType::Utf8View | DataType::BinaryView)
}

/// Bytes per row of a column of `data_type` on the device: fixed-width values of up to 16
/// bytes but dictionaries' keys (each batch may bring its own dictionary), and views when
/// `views`; `None` for a column the host gathers.
fn device_width(data_type: &DataType, views: bool) -> Option<usize> {
    match data_type {
        DataType::Dictionary(..) => None,
        t if is_view(t) => views.then_some(16),
        t => fixed_width(t).filter(|w| *w <= 16),
    }
}

/// Whether view columns move on the device: when `GpuOptions::device_views` allows and no
/// device memory limit bounds the sort (see [`GpuSortSession::with_memory_limit`]).
pub(crate) fn views_on_device(device_views: bool, memory_limit: Option<usize>) -> bool {
    device_views && memory_limit.is_none()
}

/// The device columns of `schema` (index, width), and each one's data buffer lists when it is
/// a view column (`views`: views move on the device).
#[allow(clippy::type_complexity)]
pub(crate) fn device_columns(schema: &SchemaRef, views: bool) -> (Vec<(usize, usize)>, Vec<Option<ViewBufferLists>>) {
    let columns: Vec<(usize, usize)> = schema
        .fields()
        .iter()
        .enumerate()
        .filter_map(|(i, f)| Some((i, device_width(f.data_type(), views)?)))
        .collect();
    let lists = columns
        .iter()
        .map(|&(i, _)| is_view(schema.field(i).data_type()).then(ViewBufferLists::default))
        .collect();
    (columns, lists)
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
    budget: Arc<DeviceBudget>,
    digit_bits: u32,
    schema: SchemaRef,
    spec: SortSpec,
    strategy: Option<Strategy>,
    encoder: EncoderOptions,
    memory_limit: Option<usize>,
    expected_rows: Option<usize>,
    /// Whether [`GpuSortSession::finish`] returns the permutation.
    want_permutation: bool,
    /// The rows pushed are sorted runs of these many rows, in push order (empty: not known).
    sorted_runs: Vec<usize>,
    output_views: bool,
    /// Rows a range the caller takes the sorted rows in (0: not known).
    output_ranges: usize,
    /// Whether the ranges' blocks are pinned ahead of them ([`Self::with_ranges_pinned_ahead`]).
    pin_ranges_ahead: bool,
    /// Device columns (index, width), chosen at the first push.
    columns: Vec<(usize, usize)>,
    /// Each device column's data buffers of the batches pushed, for view columns.
    view_lists: Vec<Option<ViewBufferLists>>,
    /// Each device column's long view bytes, sampled as the batches are pushed.
    long_bytes: Vec<LongBytes>,
    /// The batches pushed: as they came, or with the columns of `released` hollow.
    batches: Vec<RecordBatch>,
    /// Whether the host's copy of what goes up is released ([`Self::release_input`]).
    release_input: bool,
    /// The columns hollow in the batches kept once released: the device's, but the sort keys.
    released: Vec<usize>,
    /// Bytes hollowing freed.
    released_bytes: usize,
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
    /// The batches that were on the device already ([`Self::push_device`]).
    device_input: Option<DeviceInput>,
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
        budget: Arc<DeviceBudget>,
        digit_bits: u32,
        schema: SchemaRef,
        spec: SortSpec,
    ) -> Result<Self> {
        spec.validate(schema.fields().len())?;
        Ok(Self {
            gpu,
            device_lock,
            budget,
            digit_bits,
            schema,
            spec,
            strategy: None,
            encoder: gpu_encoder_options(),
            memory_limit: None,
            expected_rows: None,
            want_permutation: true,
            sorted_runs: vec![],
            output_views: false,
            output_ranges: 0,
            pin_ranges_ahead: true,
            columns: vec![],
            view_lists: vec![],
            long_bytes: vec![],
            batches: vec![],
            release_input: false,
            released: vec![],
            released_bytes: 0,
            rows: 0,
            open: vec![],
            open_rows: 0,
            sent_rows: 0,
            layout: None,
            copy_stream: None,
            uploader: None,
            failed: None,
            device_input: None,
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
    /// memory (or more than the process's device memory budget, see the module docs).
    ///
    /// Under a limit, string and binary views stay on the host: device memory is then what
    /// bounds the rows of a sort, and each view takes 16 bytes of it (under
    /// `--gpu-memory-limit 4GiB` on TPC-H lineitem, views on the device made runs smaller and
    /// the sort 6-10% slower, stop 32). The device columns are chosen at the first push.
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

    /// Says that the rows pushed are sorted runs of `runs` rows each, in push order (each
    /// sorted by the session's key, as an external sort's merge step takes them): the device
    /// merges them (`merge.rs`) where that pays against its radix passes. The order
    /// is the same either way; a session whose rows do not add up to the runs fails.
    pub fn with_sorted_runs(mut self, runs: Vec<usize>) -> Self {
        self.sorted_runs = runs;
        self
    }

    /// Lays out every view column's sorted values on the device as the rows come down in
    /// ranges ([`SortedRows::next_batches`]), not only a view key's (whose data buffers are
    /// there for its encoding): the other view columns' data buffers go up after the sort,
    /// where the device memory allows them without failing the sort. For a caller that takes
    /// the rows in ranges; with [`GpuOptions::compact_views`](crate::GpuOptions::compact_views)
    /// off, nothing goes up.
    pub fn with_output_views(mut self, on: bool) -> Self {
        self.output_views = on;
        self
    }

    /// The caller takes the sorted rows in ranges of `rows` rows
    /// ([`SortedRows::next_batches`]): the pinned host blocks of the first ranges are pinned
    /// while the device sorts, on a thread of their own (0: not known, pinned ahead from the
    /// first range on).
    pub fn with_output_ranges(mut self, rows: usize) -> Self {
        self.output_ranges = rows;
        self
    }

    /// Whether the pinned host blocks of the sorted rows' ranges are pinned ahead of them on a
    /// thread of their own (the default, where [`GpuOptions::pin_ahead`](crate::GpuOptions::pin_ahead)
    /// allows). Off for a caller that pins them ahead itself: two threads pinning at once each
    /// went at half the speed (stop 54).
    pub fn with_ranges_pinned_ahead(mut self, on: bool) -> Self {
        self.pin_ranges_ahead = on;
        self
    }

    /// From the next push on, keeps only the host columns the sort still reads of each batch:
    /// the sort keys, the columns that stay on the host, and the view columns' data buffers;
    /// the others' memory is released as soon as their segment is staged (the batch kept with
    /// them hollow, [`gpusort::hollow`]). The caller gives up its fallback to the CPU for the
    /// rows pushed from then on, and hollows its own copies of [`Self::released_columns`].
    pub fn release_input(&mut self) {
        self.release_input = true;
    }

    /// The columns a batch pushed after [`Self::release_input`] leaves hollow (known from the
    /// first push).
    pub fn released_columns(&self) -> &[usize] {
        match self.release_input {
            true => &self.released,
            false => &[],
        }
    }

    /// Bytes of the pushed batches released so far ([`Self::release_input`]): freed once the
    /// caller drops its own copies and their segments are staged.
    pub fn released_bytes(&self) -> usize {
        self.released_bytes
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
        if self.device_input.is_some() {
            return Err(CudaSortError::Unsupported(
                "a batch of the host in a sort fed device batches".into(),
            ));
        }
        check_rows(self.rows + n)?;
        if self.batches.is_empty() {
            let views = views_on_device(self.gpu.options().device_views, self.memory_limit);
            (self.columns, self.view_lists) = device_columns(&self.schema, views);
            self.long_bytes = vec![LongBytes::default(); self.columns.len()];
            let keys: Vec<usize> = self.spec.keys().iter().map(|k| k.column).collect();
            self.released = self
                .columns
                .iter()
                .map(|&(c, _)| c)
                .filter(|c| !keys.contains(c))
                .collect();
        }
        let first_buffers = self.view_first_buffers(batch)?;
        let part = self.batches.len();
        for (&(c, _), long) in self.columns.iter().zip(&mut self.long_bytes) {
            long.sample(part, batch.column(c).as_ref());
        }
        if self.released_columns().is_empty() {
            self.batches.push(batch.clone());
        } else {
            let (hollow, freed) = gpusort::hollow::hollow_batch(batch, &self.released);
            self.batches.push(hollow);
            self.released_bytes += freed;
        }
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
                first_buffers: Arc::clone(&first_buffers),
            });
            self.open_rows += len;
            offset += len;
            if self.open_rows == segment_rows {
                self.send_segment()?;
            }
        }
        Ok(())
    }

    /// Why this session cannot take device batches ([`Self::push_device`]), or `None` when it
    /// can: a column that is not a device column (fixed width of 1 to 16 bytes, or a view), a
    /// key the device cannot encode from its columns, views with
    /// [`GpuOptions::compact_views`](crate::GpuOptions::compact_views) off, batches of the
    /// host pushed. A key of strings longer than the device encodes whole is refused only at
    /// finish, when their lengths are known.
    pub fn device_batches_refusal(&self) -> Option<String> {
        if !self.batches.is_empty() {
            return Some("batches of the host were pushed".into());
        }
        let (columns, _) = device_columns(&self.schema, true);
        if let Some(f) = (self.schema.fields().iter().enumerate())
            .find(|(i, _)| !columns.iter().any(|(c, _)| c == i))
            .map(|(_, f)| f)
        {
            return Some(format!(
                "column '{}' of type {} is not a device column",
                f.name(),
                f.data_type()
            ));
        }
        let views = self.schema.fields().iter().any(|f| is_view(f.data_type()));
        if views && !self.gpu.options().compact_views {
            return Some("views are not compacted on the device (GPUSORT_COMPACT_VIEWS=0)".into());
        }
        if !self.gpu.options().device_keys {
            return Some("keys are not encoded on the device (GPUSORT_DEVICE_KEYS=0)".into());
        }
        match gpusort::keys::KeyLayout::device_max_words(&self.spec, &self.schema, &self.encoder) {
            Some(_) => None,
            None => {
                Some("a sort column is neither a native type nor a view: the device does not encode its key".into())
            }
        }
    }

    /// The device data buffers the batches pushed by [`Self::push_device`] brought: the next
    /// batch's long views index its own from this number on.
    pub fn device_buffers(&self) -> u32 {
        self.device_input.as_ref().map_or(0, |d| d.buffers.len() as u32)
    }

    /// Adds `batch`, rows already on the device (see [`DeviceBatch`]), to the sort: nothing
    /// crosses PCIe but its validity bits and, for a string key, its views (for the key's
    /// bounds). Refused when [`Self::device_batches_refusal`] says why, or when the batch's
    /// columns or buffers do not fit the session's.
    pub fn push_device(&mut self, batch: DeviceBatch) -> Result<()> {
        if batch.num_rows() == 0 {
            return Ok(());
        }
        self.check_failed()?;
        if self.device_input.is_none() {
            if let Some(why) = self.device_batches_refusal() {
                return Err(CudaSortError::Unsupported(format!("device batches: {why}")));
            }
            (self.columns, self.view_lists) = device_columns(&self.schema, true);
            self.long_bytes = vec![LongBytes::default(); self.columns.len()];
            let view_keys: Vec<usize> = (self.spec.keys().iter())
                .filter(|key| is_view(self.schema.field(key.column).data_type()))
                .filter_map(|key| self.columns.iter().position(|(c, _)| *c == key.column))
                .collect();
            self.device_input = Some(DeviceInput::new(
                self.columns.len(),
                &view_keys,
                self.gpu.stream(),
                &self.budget,
            ));
        }
        check_rows(self.rows + batch.num_rows())?;
        let stream = match &self.copy_stream {
            Some(s) => Arc::clone(s),
            None => Arc::clone(self.copy_stream.insert(self.gpu.context().new_stream()?)),
        };
        let widths: Vec<usize> = self.columns.iter().map(|(_, w)| *w).collect();
        let n = batch.num_rows();
        self.device_input
            .as_mut()
            .expect("made above")
            .push(batch, &widths, &stream)?;
        self.rows += n;
        Ok(())
    }

    /// For each device column, by how much the long views of `batch` (the next batch pushed)
    /// rise: where its data buffers start among the session's (0 for other columns).
    fn view_first_buffers(&mut self, batch: &RecordBatch) -> Result<Arc<[u32]>> {
        let part = self.batches.len();
        self.columns
            .iter()
            .zip(&mut self.view_lists)
            .map(|(&(c, _), lists)| match lists {
                None => Ok(0),
                Some(lists) => {
                    let data = view_data_buffers(batch.column(c).as_ref());
                    lists.first_of(part, data).ok_or_else(|| {
                        CudaSortError::Unsupported(format!("column {c}: more than {} data buffers", u32::MAX))
                    })
                }
            })
            .collect()
    }

    /// Hands the open segment to the uploader (starting it first).
    fn send_segment(&mut self) -> Result<()> {
        if self.open_rows == 0 {
            return Ok(());
        }
        if self.uploader.is_none() {
            let available = self.budget.per_sort(self.gpu.free_memory()?, self.memory_limit);
            let stream = self.gpu.context().new_stream()?;
            let layout = self.layout.clone().expect("a layout with the first rows");
            self.copy_stream = Some(Arc::clone(&stream));
            let reservation = self.budget.reservation();
            self.uploader = Some(Uploader::start(
                Arc::clone(&self.gpu),
                stream,
                layout,
                available,
                reservation,
            )?);
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
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::datatypes::{Field, Schema};

    #[test]
    fn device_columns_take_views_only_when_allowed_and_unlimited() {
        let schema: SchemaRef = Arc::new(Schema::new(vec![
            Field::new("i", DataType::Int64, false),
            Field::new("s", DataType::Utf8View, true),
            Field::new("o", DataType::Utf8, true),
            Field::new(
                "d",
                DataType::Dictionary(Box::new(DataType::Int32), Box::new(DataType::Utf8)),
                true,
            ),
            Field::new("b", DataType::BinaryView, false),
            Field::new("x", DataType::Decimal128(38, 2), false),
        ]));
        let (columns, lists) = device_columns(&schema, true);
        assert_eq!(columns, vec![(0, 8), (1, 16), (4, 16), (5, 16)]);
        assert_eq!(
            lists.iter().map(Option::is_some).collect::<Vec<_>>(),
            vec![false, true, true, false]
        );
        let (columns, lists) = device_columns(&schema, false);
        assert_eq!(columns, vec![(0, 8), (5, 16)]);
        assert!(lists.iter().all(Option::is_none));
        assert!(views_on_device(true, None));
        assert!(!views_on_device(true, Some(4 << 30)));
        assert!(!views_on_device(false, None));
    }
}
