//! [`SortedRows`]: a finished session's sorted rows, held on the device and handed out a range
//! at a time ([`SortedRows::next_batch`]): each range's device columns come down (with their
//! validity bits, gathered or unpacked for the range alone) while the host gathers its own
//! columns through the range's part of the permutation.
//!
//! Why ranges: a Parquet writer that gets the first million sorted rows encodes them while the
//! next million cross PCIe, where one batch of every row made it wait for the whole download
//! (0.7-0.9 s of TPC-H lineitem SF10's 5 s, stop 32). [`GpuSortSession::finish`] takes the
//! whole range at once and is the same sort.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use arrow::array::{Array, ArrayRef, RecordBatch, RecordBatchOptions, UInt32Array, new_empty_array};
use arrow::buffer::{BooleanBuffer, Buffer, NullBuffer, ScalarBuffer};
use arrow::datatypes::SchemaRef;
use cudarc::driver::CudaEvent;
use gpusort::cpu::gather::{ViewBufferLists, fixed_array, gather_column, views_array};
use gpusort::{SortOutput, SortStats};
use rayon::prelude::*;

use super::GpuSortSession;
use super::finish::{DevicePlan, HostSide, Sorted};
use super::range_blocks::{Part, RANGES_AHEAD, RangeBlocks};
use crate::error::Result;
use crate::gpu::Gpu;
use crate::pinned::{HostBuffer, PinnedPool};
use crate::transfer::Transfers;

/// What stays on the device until the last range came down. Fields drop in order: the device
/// buffers, then the copies' ring, then the plan (whose reservation is released last).
struct OnDevice {
    sorted: Sorted,
    copies: Transfers,
    plan: DevicePlan,
    gpu: Arc<Gpu>,
    device_lock: Arc<Mutex<()>>,
}

/// A column of the output that comes from the device: bytes per row, an array of its type (for
/// the output's data type and children), and the data buffers its sorted views index when it
/// is a view column.
struct OutputColumn {
    width: usize,
    like: ArrayRef,
    view_data: Option<Arc<[Buffer]>>,
}

/// A device column's range on its way down: the values (views compacted on the device, for
/// a column that was), the validity bits, and the compacted views' bytes with where each
/// block's bytes start (and, last, where they end).
struct Download {
    values: HostBuffer,
    bits: Option<HostBuffer>,
    compacted: Option<(HostBuffer, Vec<u64>)>,
}

/// A range's column: an array, or views compacted on the device a block of rows at a time
/// (each block's bytes, `bytes[bases[b]..bases[b + 1]]`, become a buffer of its own).
enum RangeColumn {
    Array(ArrayRef),
    Compacted {
        like: ArrayRef,
        views: Buffer,
        nulls: Option<NullBuffer>,
        bytes: HostBuffer,
        bases: Vec<u64>,
    },
}

impl RangeColumn {
    /// The whole range as one array ([`SortedRows::next_batch`] compacts no views).
    fn whole(self) -> ArrayRef {
        match self {
            Self::Array(a) => a,
            Self::Compacted { .. } => unreachable!("a range brought down whole has no compacted views"),
        }
    }

    /// Rows `start..start + len` (block `b` of compacted views).
    fn block(&self, b: usize, start: usize, len: usize) -> ArrayRef {
        match self {
            Self::Array(a) => a.slice(start, len),
            Self::Compacted {
                like,
                views,
                nulls,
                bytes,
                bases,
            } => {
                let own = &bytes.as_slice()[bases[b] as usize..bases[b + 1] as usize];
                let data: Arc<[Buffer]> = match own.is_empty() {
                    true => Arc::from(vec![]),
                    false => Arc::from(vec![Buffer::from_slice_ref(own)]),
                };
                views_array(
                    like.data_type(),
                    data,
                    views.slice_with_length(16 * start, 16 * len),
                    nulls.as_ref().map(|n| n.slice(start, len)),
                    len,
                )
            }
        }
    }
}

/// The sorted rows of a [`GpuSortSession`], handed out in order a range at a time (see the
/// module docs). Made by [`GpuSortSession::finish_sorted`]. The device memory and its
/// reservation are released when the last row has come down, or when this is dropped.
pub struct SortedRows {
    device: Option<OnDevice>,
    schema: SchemaRef,
    /// The device's columns, in the order of the plan's.
    device_columns: Vec<OutputColumn>,
    /// The host's concatenated columns (index, column), gathered through the permutation a
    /// range at a time; `None` for an empty sort.
    host: Option<Vec<(usize, ArrayRef)>>,
    /// The permutation on the host, when the host needs it (its own columns, tied prefixes)
    /// or the caller asked for it; else empty.
    perm: HostBuffer,
    want_permutation: bool,
    rows: usize,
    next: usize,
    stats: SortStats,
    /// Of the last range's start of downloads: the time in host buffers' allocation and in the
    /// views' compaction on the device (for the timeline).
    start_parts: [Duration; 2],
    /// Whether views are compacted in every range, [`Self::next_batch`]'s too: the rows came
    /// as device batches, whose views' data buffers the host does not have.
    compact_always: bool,
    /// The pinned blocks the ranges come down into.
    blocks: RangeBlocks,
}

impl std::fmt::Debug for SortedRows {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SortedRows")
            .field("rows", &self.rows)
            .field("next", &self.next)
            .finish()
    }
}

impl SortedRows {
    /// No rows.
    pub(super) fn empty(schema: SchemaRef, stats: SortStats) -> Self {
        Self {
            device: None,
            schema,
            device_columns: vec![],
            host: None,
            perm: HostBuffer::heap(0),
            want_permutation: false,
            rows: 0,
            next: 0,
            stats,
            start_parts: Default::default(),
            blocks: RangeBlocks::new(0),
            compact_always: false,
        }
    }

    /// The first `rows` rows of `sorted` (put in order on the device) to hand out, into
    /// `blocks` (pinned ahead, or not yet known).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn new(
        mut session: GpuSortSession,
        host: HostSide,
        plan: DevicePlan,
        mut sorted: Sorted,
        copies: Transfers,
        rows: usize,
        mut stats: SortStats,
        blocks: RangeBlocks,
    ) -> Self {
        stats.bytes_to_device += copies.to_device;
        stats.bytes_from_device = copies.from_device;
        let batches = std::mem::take(&mut session.batches);
        let view_lists = std::mem::take(&mut session.view_lists);
        let device_columns = (plan.columns.iter().zip(view_lists))
            .map(|(c, lists)| {
                let parts: Vec<&dyn Array> = batches.iter().map(|b| b.column(c.index).as_ref()).collect();
                OutputColumn {
                    width: c.width,
                    like: new_empty_array(session.schema.field(c.index).data_type()),
                    view_data: lists.map(|l: ViewBufferLists| l.into_buffers(&parts)),
                }
            })
            .collect();
        let on_device = |c: usize| plan.columns.iter().any(|d| d.index == c);
        let gathered = host.into_gathered(on_device);
        // The input batches are of no further use (the views' data buffers are shared above,
        // the host's columns concatenated): released now, on another core (thousands of arrays
        // whose reference counts other threads last touched).
        rayon::spawn(move || drop(batches));
        let perm = std::mem::replace(&mut sorted.perm, HostBuffer::heap(0));
        let perm = if sorted.perm_first { perm } else { HostBuffer::heap(0) };
        let compact_always = session.device_input.is_some();
        Self {
            device: Some(OnDevice {
                sorted,
                copies,
                plan,
                gpu: Arc::clone(&session.gpu),
                device_lock: Arc::clone(&session.device_lock),
            }),
            schema: Arc::clone(&session.schema),
            device_columns,
            host: Some(gathered),
            perm,
            want_permutation: session.want_permutation,
            rows,
            next: 0,
            stats,
            start_parts: Default::default(),
            blocks,
            compact_always,
        }
    }

    /// Rows in all (the sort's limit).
    pub fn num_rows(&self) -> usize {
        self.rows
    }

    /// Rows not handed out yet.
    pub fn rows_left(&self) -> usize {
        self.rows - self.next
    }

    /// What the sort did; its download and gather times count the ranges handed out so far.
    pub fn stats(&self) -> &SortStats {
        &self.stats
    }

    /// The next `max_rows` sorted rows (at least one; fewer at the end) as a batch of the
    /// session's schema, `None` once every row was handed out. Views index the input's data buffers (every range
    /// shares them); other columns are buffers of their own.
    pub fn next_batch(&mut self, max_rows: usize) -> Result<Option<RecordBatch>> {
        // Compacted in one block, a range's views hold its own downloaded bytes.
        let compact = self.compact_always.then_some(max_rows.max(1));
        let Some((host_sorted, device_sorted, rows)) = self.next_range(max_rows, compact)? else {
            return Ok(None);
        };
        let columns = self.output_columns(host_sorted, device_sorted, rows);
        Ok(Some(self.batch_of(
            columns.into_iter().map(RangeColumn::whole).collect(),
            rows,
        )?))
    }

    /// The next `max_rows` sorted rows (at least one; fewer at the end) cut into batches of
    /// `batch_rows` rows, `None` once every row was handed out. The view columns listed by
    /// [`Self::compacted_columns`] hold only their own rows' bytes in each batch: their values
    /// were laid out anew on the device, where their data buffers are, a batch at a time
    /// (Arrow's `gc` of each batch does that on the host, reading the values at random). Other
    /// columns are slices of the range's buffers. With `batch_rows` at least `max_rows`, the
    /// range comes as one batch whose compacted columns hold the downloaded bytes themselves (a
    /// writer that encodes the range reads each value's bytes in row order).
    pub fn next_batches(&mut self, max_rows: usize, batch_rows: usize) -> Result<Option<Vec<RecordBatch>>> {
        let batch_rows = batch_rows.max(1);
        let Some((host_sorted, device_sorted, rows)) = self.next_range(max_rows, Some(batch_rows))? else {
            return Ok(None);
        };
        let columns = self.output_columns(host_sorted, device_sorted, rows);
        let batches: Vec<(usize, usize)> = (0..rows.div_ceil(batch_rows))
            .map(|b| (b * batch_rows, batch_rows.min(rows - b * batch_rows)))
            .collect();
        let batch = |(b, (start, len)): (usize, (usize, usize))| {
            let columns = columns.iter().map(|c| c.block(b, start, len)).collect();
            self.batch_of(columns, len)
        };
        // One batch (a writer's whole range) is made here, not on rayon's pool, where it would
        // wait behind other work; several copy their blocks' bytes on all cores.
        let batches = match batches.len() {
            1 => batches.into_iter().enumerate().map(batch).collect::<Result<Vec<_>>>()?,
            _ => batches
                .into_par_iter()
                .enumerate()
                .map(batch)
                .collect::<Result<Vec<_>>>()?,
        };
        Ok(Some(batches))
    }

    /// The schema's view columns that [`Self::next_batches`] compacts on the device: those
    /// whose data buffers are there (a view key's, sent for its encoding, and with
    /// [`GpuSortSession::with_output_views`] the others'; none with
    /// [`GpuOptions::compact_views`](crate::GpuOptions::compact_views) off).
    pub fn compacted_columns(&self) -> Vec<usize> {
        let Some(d) = self.device.as_ref().filter(|d| d.gpu.options().compact_views) else {
            return vec![];
        };
        (d.plan.columns.iter().zip(&self.device_columns).enumerate())
            .filter(|(k, (_, c))| c.view_data.is_some() && d.sorted.view_buffers.get(*k).is_some_and(Option::is_some))
            .map(|(_, (g, _))| g.index)
            .collect()
    }

    /// Brings down the next `max_rows` rows (view columns compacted in blocks of the given
    /// rows where they can be), with the host's columns gathered meanwhile.
    #[allow(clippy::type_complexity)]
    fn next_range(
        &mut self,
        max_rows: usize,
        compact: Option<usize>,
    ) -> Result<Option<(Vec<Option<ArrayRef>>, Vec<Download>, usize)>> {
        if self.next >= self.rows {
            self.release();
            return Ok(None);
        }
        let (first, rows) = (self.next, max_rows.max(1).min(self.rows - self.next));
        let start = Instant::now();
        let (device_sorted, downloads) = self.start_downloads(first, rows, compact)?;
        let started = start.elapsed();
        let later = (self.rows - first - rows).div_ceil(max_rows.max(1));
        self.blocks.pin_ahead(later.min(RANGES_AHEAD));
        let host_sorted = self.gather_on_host(first, rows)?;
        let gathered = start.elapsed();
        self.finish_downloads(downloads)?;
        let downloaded = start.elapsed();
        self.stats.gather_time += downloaded;
        self.next += rows;
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        log::debug!(
            target: "gpusort::timeline",
            "session: rows {first}..{} handed out (downloads started {:.2} ms [host buffers {:.2}, views compacted {:.2}], host gather {:.2}, downloads done {:.2})",
            first + rows,
            ms(started),
            ms(self.start_parts[0]),
            ms(self.start_parts[1]),
            ms(gathered - started),
            ms(downloaded - gathered),
        );
        if self.next == self.rows {
            self.release();
        }
        Ok(Some((host_sorted, device_sorted, rows)))
    }

    /// The whole output as [`GpuSortSession::finish`] returns it: `batch` (the rows handed out
    /// last, all of them when none were before), the permutation when asked for, the stats.
    pub fn into_output(mut self, batch: Option<RecordBatch>) -> Result<SortOutput> {
        self.release();
        let batch = batch.unwrap_or_else(|| RecordBatch::new_empty(Arc::clone(&self.schema)));
        let kept = if self.want_permutation { self.rows } else { 0 };
        let mut perm = std::mem::replace(&mut self.perm, HostBuffer::heap(0));
        perm.truncate(4 * kept);
        let indices = UInt32Array::new(ScalarBuffer::new(perm.into_buffer(), 0, kept), None);
        Ok(SortOutput {
            batch,
            indices,
            stats: self.stats.clone(),
        })
    }

    /// Starts downloading rows `first..first + rows` of each device column (and its validity
    /// bits; view columns whose data buffers are on the device compacted in blocks of
    /// `compact` rows when given): the downloads, and the events around the copies (`None`
    /// without device columns). Pinned buffers (a range's columns are pool blocks that come
    /// back when the batch is dropped) are read only after [`Self::finish_downloads`].
    #[allow(clippy::type_complexity)]
    fn start_downloads(
        &mut self,
        first: usize,
        rows: usize,
        compact: Option<usize>,
    ) -> Result<(Vec<Download>, Option<[CudaEvent; 2]>)> {
        let Some(d) = self.device.as_mut() else {
            return Ok((vec![], None));
        };
        let _device = d.device_lock.lock().unwrap_or_else(|p| p.into_inner());
        let (gpu, plan, sorted) = (&d.gpu, &d.plan, &d.sorted);
        let events = [gpu.event()?, gpu.event()?];
        events[0].record(gpu.stream())?;
        let before = d.copies.from_device;
        let (mut in_alloc, mut in_compact) = (Duration::ZERO, Duration::ZERO);
        // First each column's validity bits and, for views laid out on the device, their
        // bytes counted; one synchronization for all of them; then the layouts and the copies.
        let t = Instant::now();
        let mut columns = vec![];
        for (k, c) in self.device_columns.iter().enumerate() {
            let dev = match plan.direct {
                true => &sorted.table.columns[k].data,
                false => &sorted.values[k].data,
            };
            let dev_bits = match &sorted.bitmaps[k] {
                None => None,
                Some(bits) if plan.direct => {
                    let j = plan.nullable.iter().position(|&x| x == k).expect("a nullable column");
                    let lane = &sorted.table.columns[plan.columns.len() + j / 32].data;
                    Some(gpu.unpack_bits(lane, (j % 32) as u32, first, rows)?)
                }
                Some(bits) => Some(gpu.gather_bitmap(bits, 0, &sorted.perm_dev, first, rows)?),
            };
            let counted = match (compact, c.view_data.is_some(), sorted.view_buffers.get(k)) {
                (Some(block_rows), true, Some(Some(b))) if gpu.options().compact_views => Some((
                    gpu.count_view_bytes(dev, first, rows, dev_bits.as_ref(), block_rows)?,
                    &b.table,
                )),
                _ => None,
            };
            columns.push((dev, dev_bits, counted));
        }
        if columns.iter().any(|(_, _, counted)| counted.is_some()) {
            gpu.stream().synchronize()?;
        }
        in_compact += t.elapsed();
        let mut out = vec![];
        for (k, (dev, dev_bits, counted)) in columns.into_iter().enumerate() {
            let t = Instant::now();
            let compacted = match counted {
                Some((counted, table)) => gpu.lay_out_views(counted, table)?,
                None => None,
            };
            in_compact += t.elapsed();
            let width = self.device_columns[k].width;
            let t = Instant::now();
            let mut values = self.blocks.take(k, Part::Values, rows * width);
            in_alloc += t.elapsed();
            let compacted = match compacted {
                Some(views) => {
                    let t = Instant::now();
                    let len = *views.bases.last().expect("the end") as usize;
                    let mut bytes = self.blocks.take(k, Part::Bytes, len);
                    in_alloc += t.elapsed();
                    // SAFETY: read only after the stream passed the copies (finish_downloads);
                    // the device buffers are freed in stream order, after them.
                    unsafe {
                        d.copies.download_at(&views.views, 0, &mut values)?;
                        d.copies.download_at(&views.bytes, 0, &mut bytes)?;
                    }
                    Some((bytes, views.bases))
                }
                None => {
                    // SAFETY: read only after the stream passed the copy (finish_downloads).
                    unsafe { d.copies.download_at(dev, first * width, &mut values) }?;
                    None
                }
            };
            let bits = match dev_bits {
                None => None,
                Some(dev_bits) => {
                    let mut host = self.blocks.take(k, Part::Bits, rows.div_ceil(32) * 4);
                    // SAFETY: as above; `dev_bits` is freed in stream order, after the copy.
                    unsafe { d.copies.download(&dev_bits, &mut host) }?;
                    Some(host)
                }
            };
            out.push(Download {
                values,
                bits,
                compacted,
            });
        }
        events[1].record(gpu.stream())?;
        self.start_parts = [in_alloc, in_compact];
        self.stats.bytes_from_device += d.copies.from_device - before;
        Ok((out, Some(events)))
    }

    /// Waits for the downloads [`Self::start_downloads`] started, and counts their time.
    fn finish_downloads(&mut self, events: Option<[CudaEvent; 2]>) -> Result<()> {
        if let Some([start, end]) = events {
            end.synchronize()?;
            self.stats.download_time += Duration::from_secs_f64(start.elapsed_ms(&end)? as f64 / 1e3);
        }
        Ok(())
    }

    /// Rows `first..first + rows` of each host column, gathered through the permutation;
    /// `None` for the device's columns.
    fn gather_on_host(&self, first: usize, rows: usize) -> Result<Vec<Option<ArrayRef>>> {
        let Some(gathered) = &self.host else {
            return Ok(vec![]);
        };
        let head: &[u32] = match self.perm.is_empty() {
            true => &[],
            false => &self.perm.as_words()[first..first + rows],
        };
        let mut columns = vec![None; self.schema.fields().len()];
        // Only the host's columns go to rayon's pool: a range with none (every column on the
        // device) would otherwise wait its turn behind the writer's tasks for nothing.
        let sorted = match gathered.as_slice() {
            [] => vec![],
            [(c, column)] => vec![(*c, gather_column(column, head)?)],
            _ => (gathered.par_iter())
                .map(|(c, column)| Ok((*c, gather_column(column, head)?)))
                .collect::<gpusort::Result<Vec<_>>>()?,
        };
        for (c, column) in sorted {
            columns[c] = Some(column);
        }
        Ok(columns)
    }

    /// The range's columns in schema order: the host's gathered columns and the device's
    /// downloaded ones (pool buffers become the arrays, no copy; views index the shared data
    /// buffers, or their blocks' compacted bytes).
    fn output_columns(
        &self,
        host_sorted: Vec<Option<ArrayRef>>,
        device_sorted: Vec<Download>,
        rows: usize,
    ) -> Vec<RangeColumn> {
        let mut device_sorted = self.device_columns.iter().zip(device_sorted);
        host_sorted
            .into_iter()
            .map(|host| match host {
                Some(sorted) => RangeColumn::Array(sorted),
                None => {
                    let (c, download) = device_sorted.next().expect("a device column");
                    let nulls = (download.bits).map(|b| NullBuffer::new(BooleanBuffer::new(b.into_buffer(), 0, rows)));
                    match (&c.view_data, download.compacted) {
                        (None, _) => {
                            RangeColumn::Array(fixed_array(c.like.as_ref(), download.values.into_buffer(), nulls, rows))
                        }
                        (Some(data), None) => RangeColumn::Array(views_array(
                            c.like.data_type(),
                            Arc::clone(data),
                            download.values.into_buffer(),
                            nulls,
                            rows,
                        )),
                        // One block: its bytes are the downloaded buffer, no copy.
                        (Some(_), Some((bytes, bases))) if bases.len() == 2 => {
                            let data: Arc<[Buffer]> = match bytes.is_empty() {
                                true => Arc::from(vec![]),
                                false => Arc::from(vec![bytes.into_buffer()]),
                            };
                            RangeColumn::Array(views_array(
                                c.like.data_type(),
                                data,
                                download.values.into_buffer(),
                                nulls,
                                rows,
                            ))
                        }
                        (Some(_), Some((bytes, bases))) => RangeColumn::Compacted {
                            like: Arc::clone(&c.like),
                            views: download.values.into_buffer(),
                            nulls,
                            bytes,
                            bases,
                        },
                    }
                }
            })
            .collect()
    }

    /// A batch of the session's schema of `columns`, `rows` rows each.
    fn batch_of(&self, columns: Vec<ArrayRef>, rows: usize) -> Result<RecordBatch> {
        Ok(RecordBatch::try_new_with_options(
            Arc::clone(&self.schema),
            columns,
            &RecordBatchOptions::new().with_row_count(Some(rows)),
        )
        .map_err(gpusort::GpusortError::from)?)
    }

    /// Frees the device memory (in stream order, before its reservation is released) and
    /// releases the host's columns on another core, once no row is left to hand out.
    fn release(&mut self) {
        if let Some(d) = self.device.take() {
            let mut device_time = Duration::from_secs_f64(d.sorted.device_ms as f64 / 1e3);
            if !d.plan.direct {
                device_time += self.stats.download_time;
            }
            self.stats.device_time = Some(device_time);
            drop(d);
            log::debug!(
                target: "gpusort::timeline",
                "session: device memory released (pinned pool: {:?})",
                PinnedPool::global().stats()
            );
        }
        if let Some(columns) = self.host.take() {
            rayon::spawn(move || drop(columns));
        }
    }
}

impl Drop for SortedRows {
    fn drop(&mut self) {
        self.release();
    }
}
