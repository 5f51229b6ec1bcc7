//! [`GpuSortSession::finish_sorted`] as named steps: the host's columns and key, the uploads
//! joined, the device plan and its memory, the device phase (assembly, the key on the device,
//! [`Gpu::sort`]), ties ordered (on the device by their bytes past the prefix, `ties.rs`, or
//! on the host), the device columns put in order. The sorted rows then come down a range at a
//! time ([`SortedRows`], `sorted_rows.rs`). The sort itself is `sort.rs` (Bandyopadhyay &
//! Sahni's strategies, ICPADS 2011, section IV); no kernel is launched here but through [`Gpu`].

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use arrow::array::{Array, ArrayRef, RecordBatch, RecordBatchOptions};
use arrow::buffer::Buffer;
use arrow::compute::SortColumn;
use cudarc::driver::{CudaEvent, CudaSlice, CudaStream, DevicePtr, result};
use gpusort::cpu::gather::concat_column;
use gpusort::keys::{BytesColumnStats, ColumnStats, KeyLayout, OrdinalKind, native_ordinal_kind};
use gpusort::plan::{RecordMove, Strategy, radix_passes};
use gpusort::ties::{TailGroups, TieBitmaps, TruncationTest};
use gpusort::{EncoderOptions, KeyEncoder, SortKey, SortOutput, SortSpec, SortStats};
use rayon::prelude::*;

use super::device_input::DeviceOwners;
use super::range_blocks::{LongBytes, RangeBlocks};
use super::sorted_rows::SortedRows;
use super::upload::{DeviceSegment, Uploaded};
use super::{GpuColumn, GpuSortSession};
use crate::encode::{DeviceEncodedKeys, DeviceKeyColumn, DeviceKeyKind, KEY_MAX_WORDS};
use crate::error::{CudaSortError, Result};
use crate::gpu::Gpu;
use crate::memory::{DeviceReservation, device_bytes_needed};
use crate::pinned::{HostBuffer, PinnedPool};
use crate::table::{DeviceColumn, DeviceTable, GpuSortPlan};
use crate::ties::{DeviceViews, GatheredTails, SortedWord};
use crate::transfer::Transfers;

/// Keys encoded on the host: the encoder (its layout, and the columns tied rows are ordered
/// by), the key words in pinned buffers, and the bits of each word that vary.
struct HostKeys {
    encoder: KeyEncoder,
    words: Vec<HostBuffer>,
    varying: Vec<u32>,
}

/// A key the device encodes from its columns: each sort key's device column (its index in
/// the session's device columns) and what it holds, the most key words the key's types can
/// take, the statistics of its view columns (gathered on the host, which holds the views), and,
/// when a string prefix is cut (an inexact key), the key's columns concatenated on the host
/// for ordering tied rows.
struct DeviceKeys {
    columns: Vec<(usize, DeviceKeyType)>,
    /// The session's encoder options, less whole values where they would take the key past
    /// [`KEY_MAX_WORDS`].
    encoder: EncoderOptions,
    max_words: usize,
    bytes_stats: Vec<Option<BytesColumnStats>>,
    tie_columns: Option<Vec<SortColumn>>,
    /// Bytes of the view columns' data buffers, which go to the device for the encoding.
    buffer_bytes: usize,
}

/// What a key column on the device holds.
#[derive(Debug, Clone, Copy)]
enum DeviceKeyType {
    Ordinal(OrdinalKind),
    Views,
}

/// What rows with tied key prefixes are ordered by: the key's layout, the columns that order
/// rows exactly (one per field), each key word's varying bits and the value of those that do
/// not vary.
struct KeyTies<'a> {
    layout: &'a KeyLayout,
    columns: &'a [SortColumn],
    varying: &'a [u32],
    constants: Vec<u32>,
    /// Per field, a view column on the device (its index among the device's columns) whose
    /// data buffers are there too: its ties' tails are read there.
    views: Vec<Option<(usize, &'a KeyViewBuffers)>>,
}

/// Where a sort's key is encoded.
enum KeySource {
    Host(HostKeys),
    Device(DeviceKeys),
}

/// The host's side of a sort: the columns it concatenated (the keys unless the device encodes
/// them, and every column the device does not move) and where the key is encoded.
pub(super) struct HostSide {
    /// Indices of the concatenated columns, sorted.
    on_host: Vec<usize>,
    concatenated: Vec<ArrayRef>,
    keys: KeySource,
}

impl HostSide {
    /// The concatenated columns the host gathers (those of `on_device` left out: key columns
    /// concatenated only to encode the key), each with its index; the key is dropped.
    pub(super) fn into_gathered(self, on_device: impl Fn(usize) -> bool) -> Vec<(usize, ArrayRef)> {
        (self.on_host.into_iter().zip(self.concatenated))
            .filter(|(c, _)| !on_device(*c))
            .collect()
    }
}

/// How the device sorts: the record move (indirect when tied string prefixes are ordered on
/// the host), its columns, which of them have nulls, whether gathers are packed, and the
/// device memory it holds of the budget.
pub(super) struct DevicePlan {
    pub(super) reservation: DeviceReservation,
    pub(super) strategy: Strategy,
    pub(super) direct: bool,
    /// Whether the key is inexact (truncated string prefixes): tie groups are found on the host (and ordered there or on the device).
    pub(super) inexact: bool,
    pub(super) columns: Vec<GpuColumn>,
    /// Indices into `columns` of the columns with nulls.
    pub(super) nullable: Vec<usize>,
    pub(super) pack_gathers: bool,
    /// Device view columns (not of the key) whose data buffers go up after the sort, for the
    /// output's values to be laid out there ([`GpuSortSession::with_output_views`]).
    pub(super) output_views: Vec<usize>,
}

/// The device's columns assembled from their segments, values and validity bits.
struct Assembled {
    values: Vec<DeviceColumn>,
    bitmaps: Vec<Option<CudaSlice<u8>>>,
}

/// The key on the device: its words (those that vary; a one-word stand-in for the others),
/// the bits of each word that vary, and the key's bits in all; encoded there, its layout and
/// the value of each word that does not vary.
struct DeviceKeyWords {
    words: Vec<CudaSlice<u32>>,
    varying: Vec<u32>,
    bits: u32,
    encoded: Option<EncodedKey>,
}

/// A key encoded on the device: its layout, the bits of each word that vary and the value of
/// each word that does not, and per field, the data buffers of a view column with the table of
/// their device addresses (kept for ordering tied rows by their tails on the device).
pub(super) struct EncodedKey {
    layout: KeyLayout,
    varying: Vec<u32>,
    common: Vec<u32>,
    views: Vec<Option<KeyViewBuffers>>,
}

/// A view key column's distinct data buffers packed on the device, and the device address of
/// the buffer each (raised) buffer index of its views names.
pub(super) struct KeyViewBuffers {
    _data: ViewData,
    pub(super) table: CudaSlice<u64>,
}

/// Where a view column's data buffers are on the device: packed by the session from the host's,
/// or the device batches' own (held by their owners).
enum ViewData {
    Packed(#[allow(dead_code)] CudaSlice<u8>),
    Batches(#[allow(dead_code)] Arc<DeviceOwners>),
}

/// GPU-side marks for the timeline (assembly, key upload), only while it is logged.
struct Marks(Option<[CudaEvent; 3]>);

impl Marks {
    fn new(gpu: &Gpu) -> Result<Self> {
        Ok(Self(
            match log::log_enabled!(target: "gpusort::timeline", log::Level::Debug) {
                true => Some([gpu.event()?, gpu.event()?, gpu.event()?]),
                false => None,
            },
        ))
    }

    fn mark(&self, i: usize, stream: &CudaStream) -> Result<()> {
        self.0.as_ref().map_or(Ok(()), |m| Ok(m[i].record(stream)?))
    }

    fn log_sorted(&self, sort_ms: f32, merged_runs: usize) -> Result<()> {
        if let Some(m) = &self.0 {
            let how = match merged_runs {
                0 => String::new(),
                k => format!(", {k} sorted runs merged"),
            };
            log::debug!(
                target: "gpusort::timeline",
                "session: sorted (GPU: assembly {:.2} ms, keys up {:.2} ms, sort {:.2} ms{how})",
                m[0].elapsed_ms(&m[1])?,
                m[1].elapsed_ms(&m[2])?,
                sort_ms
            );
        }
        Ok(())
    }
}

/// The sorted rows on their way to the host: what the device sorted, the permutation on the
/// device and (once downloaded) on the host.
pub(super) struct Sorted {
    pub(super) table: DeviceTable,
    pub(super) values: Vec<DeviceColumn>,
    pub(super) bitmaps: Vec<Option<CudaSlice<u8>>>,
    pub(super) perm_dev: CudaSlice<u32>,
    pub(super) perm: HostBuffer,
    /// Whether `perm` came down before the columns (the host needs it to order ties or to
    /// gather columns of its own).
    pub(super) perm_first: bool,
    pub(super) device_ms: f32,
    /// A key encoded on the device.
    pub(super) device_key: Option<EncodedKey>,
    /// Per device column, the data buffers of a view column on the device (and their address
    /// table): a view key's, sent for its encoding, and those of
    /// [`DevicePlan::output_views`], sent after the sort; kept until the last range came down,
    /// the output's views are compacted there ([`SortedRows::next_batches`](super::SortedRows::next_batches)).
    pub(super) view_buffers: Vec<Option<KeyViewBuffers>>,
}

impl GpuSortSession {
    /// Sorts every row pushed and returns the first `limit` (all with `None`), as one batch,
    /// with the permutation and what the sort did.
    pub fn finish(self, limit: Option<usize>) -> Result<SortOutput> {
        let mut sorted = self.finish_sorted(limit)?;
        let batch = sorted.next_batch(sorted.num_rows())?;
        sorted.into_output(batch)
    }

    /// Sorts every row pushed and keeps the first `limit` (all with `None`) sorted on the
    /// device, for [`SortedRows::next_batch`] to hand out a range of rows at a time: a caller
    /// that writes the rows (a Parquet writer) encodes one range while the next comes down.
    pub fn finish_sorted(mut self, limit: Option<usize>) -> Result<SortedRows> {
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
        // The device's crossover: the calibrated rule, or its tuning profile's.
        let strategy = self
            .gpu
            .options()
            .planned_strategy(self.strategy, self.schema.fields().len(), self.spec.len());
        if n == 0 {
            stats.strategy = Some(strategy);
            return Ok(SortedRows::empty(Arc::clone(&self.schema), stats));
        }
        let host = self.host_side(&mut stats)?;
        let start = Instant::now();
        let mut uploaded = self.join_uploads(&mut stats)?;
        let mut plan = self.plan_device(&host.keys, &mut uploaded, strategy, &mut stats)?;
        log::debug!(
            target: "gpusort::timeline",
            "session: {} bytes of the device budget held",
            plan.reservation.bytes()
        );
        let blocks = self.range_blocks(&plan, limit);

        // The device phase: one sort at a time on the sort stream.
        let waiting = Instant::now();
        let device = self.device_lock.lock().unwrap_or_else(|p| p.into_inner());
        stats.device_wait += waiting.elapsed();
        let mut copies = Transfers::new(self.gpu.stream());
        let mut sorted = self.sort_on_device(&host.keys, uploaded.segments, &plan, &mut copies, &mut stats)?;
        let device_key = sorted.device_key.take();
        if let Some(ties) = key_ties(&host.keys, device_key.as_ref()) {
            self.order_ties(&ties, &mut sorted, &mut plan.reservation, &mut copies, &mut stats)?;
        }
        // The key's view data buffers stay for the output's views (freed in stream order with
        // the sorted rows); the rest of the key goes now.
        sorted.view_buffers = kept_view_buffers(&host.keys, device_key, plan.columns.len());
        self.upload_output_views(&plan, &mut sorted, &mut copies)?;
        sorted.table.keys.clear();
        self.put_in_order(&plan, &mut sorted, limit, &mut copies)?;
        drop(device);
        stats.sort_time = start.elapsed();
        log::debug!(target: "gpusort::timeline", "session: sorted rows on the device");
        Ok(SortedRows::new(self, host, plan, sorted, copies, limit, stats, blocks))
    }

    /// The blocks the sorted rows' ranges come down into: for a caller that takes more than
    /// one range ([`Self::with_output_ranges`]), planned and pinned ahead now, while the device
    /// sorts; else learnt from the first range.
    fn range_blocks(&self, plan: &DevicePlan, limit: usize) -> RangeBlocks {
        let (range_rows, ahead) = (
            self.output_ranges,
            self.gpu.options().pin_ahead && self.pin_ranges_ahead,
        );
        if range_rows == 0 || limit <= range_rows || !ahead {
            return RangeBlocks::new(plan.columns.len()).with_pin_ahead(ahead);
        }
        let widths: Vec<usize> = plan.columns.iter().map(|c| c.width).collect();
        // With output views, every view column is laid out on the device (a view key's too).
        let views: Vec<(usize, LongBytes)> = match self.output_views && self.gpu.options().compact_views {
            true => (0..plan.columns.len())
                .filter(|k| self.view_lists.get(*k).is_some_and(Option::is_some))
                .map(|k| (k, self.long_bytes[k]))
                .collect(),
            false => vec![],
        };
        let blocks = RangeBlocks::planned(&widths, &plan.nullable, &views, range_rows);
        blocks.pin_ahead((limit - range_rows).div_ceil(range_rows));
        blocks
    }

    /// The sorted rows' device columns in order (gathered through the permutation unless the
    /// sort moved them), and the permutation on the host when the caller wants it and it is
    /// not there yet.
    fn put_in_order(&self, plan: &DevicePlan, sorted: &mut Sorted, limit: usize, copies: &mut Transfers) -> Result<()> {
        let (gpu, n) = (&self.gpu, self.rows);
        if !plan.direct {
            let (start, end) = (gpu.event()?, gpu.event()?);
            start.record(gpu.stream())?;
            gpu.gather_columns(&mut sorted.values, n, &sorted.perm_dev, limit, plan.pack_gathers)?;
            end.record(gpu.stream())?;
            end.synchronize()?;
            sorted.device_ms += start.elapsed_ms(&end)?;
        }
        if !sorted.perm_first && self.want_permutation {
            // SAFETY: read once the stream synchronizes.
            unsafe { copies.download_words(&sorted.perm_dev, &mut sorted.perm) }?;
            gpu.stream().synchronize()?;
            sorted.perm_first = true;
        }
        Ok(())
    }

    /// The host's columns concatenated, and the key: encoded on the device from the columns it
    /// holds when they are native, else on the host into pinned buffers.
    fn host_side(&self, stats: &mut SortStats) -> Result<HostSide> {
        let device_keys = self.device_keys()?;
        if self.device_input.is_some() && device_keys.as_ref().is_none_or(|d| d.inexact()) {
            // The host holds none of the rows to encode the key or order tied prefixes with.
            return Err(CudaSortError::Unsupported(
                "device batches whose key the device cannot encode whole (string keys longer than it encodes)".into(),
            ));
        }
        let start = Instant::now();
        let key_columns = || self.spec.keys().iter().map(|k| k.column);
        let mut on_host: Vec<usize> = match &device_keys {
            Some(d) if !d.inexact() => vec![],
            _ => key_columns().collect(),
        };
        on_host.extend((0..self.schema.fields().len()).filter(|c| !self.columns.iter().any(|(i, _)| i == c)));
        on_host.sort_unstable();
        on_host.dedup();
        let concatenated = self.concat_columns(&on_host)?;
        stats.concat_time = start.elapsed();
        let host_column = |c: usize| Arc::clone(&concatenated[on_host.binary_search(&c).expect("a host column")]);
        let keys = match device_keys {
            Some(mut d) => {
                if d.inexact() {
                    let columns = (self.spec.keys().iter())
                        .map(|k| SortColumn {
                            values: host_column(k.column),
                            options: Some(k.options),
                        })
                        .collect();
                    d.tie_columns = Some(columns);
                }
                KeySource::Device(d)
            }
            None => {
                let start = Instant::now();
                let keys = self.encode_on_host(&concatenated, &on_host)?;
                stats.encode_time = start.elapsed();
                log::debug!(target: "gpusort::timeline", "session: keys encoded");
                KeySource::Host(keys)
            }
        };
        Ok(HostSide {
            on_host,
            concatenated,
            keys,
        })
    }

    /// Waits for the uploader's last copies.
    fn join_uploads(&mut self, stats: &mut SortStats) -> Result<Uploaded> {
        let mut uploaded = match self.uploader.take() {
            Some(u) => u.join()?,
            None => Uploaded::default(),
        };
        if let Some(d) = &mut self.device_input {
            uploaded.segments = std::mem::take(&mut d.segments);
            // The sort's reservation starts from what holds the batches.
            let held = std::mem::replace(&mut d.reservation, self.budget.reservation());
            uploaded.reservation = Some(held);
        }
        log::debug!(
            target: "gpusort::timeline",
            "session: uploads done ({} of {} bytes copied from where they were, not staged)",
            uploaded.in_place,
            uploaded.to_device
        );
        stats.stage_time = uploaded.stage_time;
        stats.upload_time = uploaded.upload_time;
        stats.device_wait = uploaded.budget_wait;
        stats.bytes_to_device = uploaded.to_device;
        stats.bytes_in_place = uploaded.in_place;
        Ok(uploaded)
    }

    /// The record move, the device's columns, and the device memory of the sort reserved
    /// from the budget (with packed gathers where they fit now, else without: waiting for
    /// memory other sorts hold); fails with [`CudaSortError::OutOfMemory`] when the sort needs
    /// more than its limit or the budget, with [`CudaSortError::Busy`] when the budget refuses.
    fn plan_device(
        &self,
        keys: &KeySource,
        uploaded: &mut Uploaded,
        strategy: Strategy,
        stats: &mut SortStats,
    ) -> Result<DevicePlan> {
        let n = self.rows;
        let inexact = match keys {
            KeySource::Host(k) => !k.encoder.layout().is_exact(),
            KeySource::Device(d) => d.tie_columns.is_some(),
        };
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
                nullable: uploaded.segments.iter().any(|s| s.bitmaps[k].is_some())
                    || self.device_input.as_ref().is_some_and(|d| d.bits(k).is_some()),
            })
            .collect();
        let nullable: Vec<usize> = (0..columns.len()).filter(|&k| columns[k].nullable).collect();
        // Key words on the device: those that vary, or (encoded there) at most every word
        // the key's types can take.
        let key_words = match keys {
            KeySource::Host(k) => k.varying.iter().filter(|v| **v != 0).count(),
            KeySource::Device(d) => d.max_words,
        };
        let widths: Vec<usize> = columns.iter().map(|c| c.width).collect();
        // A key encoded from views reads their data buffers on the device.
        let buffers = match keys {
            KeySource::Device(d) => d.buffer_bytes,
            KeySource::Host(_) => 0,
        };
        // Device batches' data buffers stay until the sorted rows are released.
        let kept = self.device_input.as_ref().map_or(0, |d| d.kept_bytes);
        let needed = |pack| device_bytes_needed(n, key_words, &widths, nullable.len(), direct, pack) + buffers + kept;
        let available = self.budget.per_sort(self.gpu.free_memory()?, self.memory_limit);
        let (packed, needed) = (needed(true), needed(false));
        if needed > available {
            return Err(CudaSortError::OutOfMemory { needed, available });
        }
        // The output's other view columns' buffers, where they fit beside the sort.
        let (mut output_views, extra) = self.output_view_columns(keys);
        let (packed, needed) = match needed + extra <= available {
            true => (packed + extra, needed + extra),
            false => {
                output_views.clear();
                (packed, needed)
            }
        };
        let mut reservation = uploaded.reservation.take().unwrap_or_else(|| self.budget.reservation());
        // Packed gathers where the memory allows without waiting.
        let pack_gathers = packed <= available && reservation.try_grow_to(packed);
        if !pack_gathers {
            stats.device_wait += reservation.grow_to(needed).map_err(CudaSortError::Busy)?;
        }
        let strategy = Strategy::new(strategy.algorithm, record_move);
        stats.strategy = Some(strategy);
        stats.moved_columns = if direct { columns.len() } else { 0 };
        stats.gathered_columns = self.schema.fields().len() - stats.moved_columns;
        stats.host_gathered_columns = self.schema.fields().len() - columns.len();
        Ok(DevicePlan {
            reservation,
            strategy,
            direct,
            inexact,
            columns,
            nullable,
            pack_gathers,
            output_views,
        })
    }

    /// The device phase up to the sorted permutation: the columns assembled, the key on the
    /// device, the table (direct: the columns and their validity lanes in it), [`Gpu::sort`];
    /// the permutation downloaded first when the host needs it before the columns.
    fn sort_on_device(
        &self,
        keys: &KeySource,
        segments: Vec<DeviceSegment>,
        plan: &DevicePlan,
        copies: &mut Transfers,
        stats: &mut SortStats,
    ) -> Result<Sorted> {
        let (gpu, n) = (&self.gpu, self.rows);
        let stream = gpu.stream();
        let marks = Marks::new(gpu)?;
        marks.mark(0, stream)?;
        let mut cols = self.assemble(segments, &plan.columns)?;
        marks.mark(1, stream)?;
        let mut key = self.key_on_device(keys, &cols, copies, stats)?;
        let device_key = key.encoded.take();
        let passes = radix_passes(&key.varying, self.digit_bits);
        stats.key_bits = key.bits;
        stats.passes = passes.len();
        let mut table = DeviceTable {
            num_rows: n,
            keys: key.words,
            columns: vec![],
            records: None,
        };
        if plan.direct {
            // The columns move with the keys; validity too, 32 columns' bits per u32 lane.
            table.columns = std::mem::take(&mut cols.values);
            for group in plan.nullable.chunks(32) {
                let refs: Vec<(&CudaSlice<u8>, u32)> =
                    group.iter().map(|&k| (cols.bitmaps[k].as_ref().unwrap(), 0)).collect();
                let lane = gpu.pack_bits(&refs, n)?;
                table.columns.push(DeviceColumn { data: lane, width: 4 });
            }
        }
        marks.mark(2, stream)?;
        let sort_plan = GpuSortPlan {
            strategy: plan.strategy,
            passes,
            keep_keys: plan.inexact,
            want_perm: true,
            pack_gathers: plan.pack_gathers,
            switches: gpu.sort_switches(),
            sorted_runs: self.sorted_runs.clone(),
        };
        let result = gpu.sort(&mut table, &sort_plan)?;
        stats.input_order = result.input_order;
        stats.merged_runs = result.merged_runs;
        // The strategy that ran: SRTS where the device's shapes do not hold the planned MSD.
        stats.strategy = Some(result.strategy);
        marks.log_sorted(result.kernel_ms, result.merged_runs)?;
        let perm_dev = result.perm.expect("asked for the permutation");
        let mut perm = PinnedPool::global().transfer_buffer(4 * n);
        // The host needs the permutation before the columns come down only to resolve ties
        // or to gather columns of its own; otherwise it follows them.
        let perm_first = plan.inexact || self.schema.fields().len() > plan.columns.len();
        if perm_first {
            // SAFETY: synchronized right after.
            unsafe { copies.download_words(&perm_dev, &mut perm) }?;
            stream.synchronize()?;
        }
        Ok(Sorted {
            table,
            values: cols.values,
            bitmaps: cols.bitmaps,
            perm_dev,
            perm,
            perm_first,
            device_ms: result.kernel_ms,
            device_key,
            view_buffers: vec![],
        })
    }

    /// The key words on the device: the host's varying words uploaded, or the key encoded
    /// there from its columns ([`crate::encode`]); a word that does not vary is a one-word
    /// stand-in that no pass reads.
    fn key_on_device(
        &self,
        keys: &KeySource,
        cols: &Assembled,
        copies: &mut Transfers,
        stats: &mut SortStats,
    ) -> Result<DeviceKeyWords> {
        let (gpu, n) = (&self.gpu, self.rows);
        let (words, varying, bits, encoded) = match keys {
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
                (words, k.varying.clone(), k.encoder.layout().total_bits(), None)
            }
            KeySource::Device(d) => {
                let start = Instant::now();
                let (layout, encoded, views) = self.encode_on_device(d, cols, copies)?;
                let words = (encoded.words.into_iter())
                    .zip(&encoded.varying)
                    .map(|(w, v)| match *v != 0 {
                        true => Ok(w),
                        false => gpu.alloc_words(1),
                    })
                    .collect::<Result<Vec<_>>>()?;
                stats.encode_time = start.elapsed();
                stats.keys_on_device = true;
                log::debug!(target: "gpusort::timeline", "session: keys encoded on the device");
                let bits = layout.total_bits();
                let key = EncodedKey {
                    layout,
                    varying: encoded.varying.clone(),
                    common: encoded.common,
                    views,
                };
                (words, encoded.varying, bits, Some(key))
            }
        };
        Ok(DeviceKeyWords {
            words,
            varying,
            bits,
            encoded,
        })
    }

    /// Rows whose truncated string prefixes tie, found in bitmaps of the sorted key computed
    /// on the device ([`Self::tie_bitmaps`], [`gpusort::ties::find_ties`]): the groups of a
    /// field whose later fields are exact are ordered on the device by the bytes past the
    /// prefix ([`Self::order_tails_on_device`]), the others on the host by their whole values,
    /// and the corrected permutation goes back up for the gathers. Nothing to do for an exact
    /// key.
    fn order_ties(
        &self,
        keys: &KeyTies<'_>,
        sorted: &mut Sorted,
        reservation: &mut DeviceReservation,
        copies: &mut Transfers,
        stats: &mut SortStats,
    ) -> Result<()> {
        let n = self.rows;
        if keys.layout.is_exact() || n <= 1 {
            return Ok(());
        }
        let bitmaps = self.tie_bitmaps(keys, &sorted.table.keys, copies)?;
        let marks = TieBitmaps::new(
            (bitmaps.iter())
                .map(|b| b.as_ref().map(|[a, t]| [a.as_words(), t.as_words()]))
                .collect(),
        );
        let columns = keys.columns;
        let options = self.gpu.options();
        let views_of = |s: usize| keys.views.get(s).copied().flatten().filter(|_| options.tie_views);
        let ties = gpusort::ties::find_ties(
            keys.layout,
            columns,
            &marks,
            sorted.perm.as_words_mut(),
            &|s, c, groups| {
                let rows = groups.iter().map(|g| g.len()).sum();
                options.device_ties.on_device(groups.len(), rows) && (views_of(s).is_some() || GatheredTails::takes(c))
            },
        )?;
        drop(bitmaps);
        log::debug!(target: "gpusort::timeline", "session: {} tie groups found", ties.resolved.len());
        stats.tie_groups = ties.resolved.len();
        if ties.resolved.is_empty() {
            return Ok(());
        }
        let gathered = tails_for_device(
            columns,
            &|s| views_of(s).is_some(),
            &ties.deferred,
            sorted.perm.as_words(),
            reservation,
        );
        if gathered.is_none() {
            for t in &ties.deferred {
                gpusort::ties::order_tails(&columns[t.field], t.skip, &t.groups, sorted.perm.as_words_mut());
            }
        }
        // SAFETY: `perm` is only read until the downloads below have synchronized.
        sorted.perm_dev = unsafe { copies.upload_buffer_words(&self.gpu, &sorted.perm, n) }?;
        if let Some(gathered) = gathered {
            let views: Vec<Option<DeviceViews<'_>>> = (ties.deferred.iter())
                .map(|t| {
                    views_of(t.field).map(|(k, v)| DeviceViews {
                        views: &sorted.values[k].data,
                        buffers: &v.table,
                    })
                })
                .collect();
            let (perm_dev, perm) = (&mut sorted.perm_dev, &mut sorted.perm);
            self.order_tails_on_device(columns, &ties.deferred, &gathered, &views, perm_dev, perm, copies)?;
            stats.device_tie_groups = ties.deferred.iter().map(|t| t.groups.len()).sum();
        }
        Ok(())
    }

    /// For each field of `keys` whose ties are to be found ([`TruncationTest::of`]), the
    /// bitmaps of its sorted rows equal to the row before through it and of its truncated
    /// values ([`Gpu::tie_marks`]), read from the sorted key words `sorted_keys` on the device
    /// (a word that does not vary is the host's value).
    fn tie_bitmaps(
        &self,
        keys: &KeyTies<'_>,
        sorted_keys: &[CudaSlice<u32>],
        copies: &mut Transfers,
    ) -> Result<Vec<Option<[HostBuffer; 2]>>> {
        let layout = keys.layout;
        let mut bitmaps = vec![];
        for s in 0..layout.fields().len() {
            let Some(test) = TruncationTest::of(layout, s) else {
                bitmaps.push(None);
                continue;
            };
            let words: Vec<SortedWord<'_>> = (sorted_keys.iter().zip(keys.varying).zip(&keys.constants))
                .enumerate()
                .map(|(w, ((dev, &v), &constant))| match v {
                    0 => SortedWord::Constant(constant),
                    _ => SortedWord::Varying(dev, layout.word_mask_through(s, w)),
                })
                .collect();
            bitmaps.push(Some(self.gpu.tie_marks(
                &words,
                layout.pad(),
                &test,
                self.rows,
                copies,
            )?));
        }
        Ok(bitmaps)
    }

    /// `tails`' groups ordered on the device in `sorted.perm_dev` by their `gathered` tails
    /// ([`Gpu::order_gathered`]), the host's copy of the permutation brought up to date, and
    /// what the device left (values equal for more than 256 bytes past the prefix) ordered on
    /// the host and sent back up.
    #[allow(clippy::too_many_arguments)]
    fn order_tails_on_device(
        &self,
        columns: &[SortColumn],
        tails: &[TailGroups],
        gathered: &[GatheredTails],
        views: &[Option<DeviceViews<'_>>],
        perm_dev: &mut CudaSlice<u32>,
        perm: &mut HostBuffer,
        copies: &mut Transfers,
    ) -> Result<()> {
        let mut left = vec![];
        for ((t, g), v) in tails.iter().zip(gathered).zip(views) {
            let start = Instant::now();
            let done = self.gpu.order_gathered(g, v.as_ref(), t, perm_dev, copies)?;
            log::debug!(
                target: "gpusort::timeline",
                "session: {} tie groups ({}) ordered on the device in {:.1} ms ({} batches, {} radix rounds, {} left \
                 to the host)",
                t.groups.len(),
                match v {
                    Some(_) => "tails read through the views".to_string(),
                    None => format!("{} bytes of tails gathered", g.len()),
                },
                start.elapsed().as_secs_f64() * 1e3,
                done.batches,
                done.large_rounds,
                done.left.len()
            );
            left.extend(done.left.into_iter().map(|(r, skip)| (&columns[t.field], r, skip)));
        }
        // SAFETY: synchronized right after.
        unsafe { copies.download_words(perm_dev, perm) }?;
        self.gpu.stream().synchronize()?;
        if !left.is_empty() {
            for (column, r, skip) in left {
                gpusort::ties::order_tails(column, skip, &[r], perm.as_words_mut());
            }
            // SAFETY: as in `order_ties`.
            *perm_dev = unsafe { copies.upload_buffer_words(&self.gpu, perm, self.rows) }?;
        }
        Ok(())
    }

    /// The key's columns on the device, when the device encodes the key itself; `None` when
    /// the host encodes it: some sort column is neither native nor a view on the device, the
    /// key is longer than [`KEY_MAX_WORDS`] both with its views' values whole and with their
    /// prefixes, or `GPUSORT_DEVICE_KEYS=0`. The view columns' statistics are gathered here,
    /// over the batches (no concatenation).
    ///
    /// The prefixes' bound alone does not decide: two string keys take 17 words of prefixes
    /// (TPC-H lineitem's `l_returnflag, l_linestatus, l_extendedprice DESC, l_orderkey,
    /// l_linenumber`), while their values of one byte take 6 words whole. Encoded on the host,
    /// that key took 0.43 s of 16 cores while the last uploads waited (stop 42).
    fn device_keys(&self) -> Result<Option<DeviceKeys>> {
        if !self.gpu.options().device_keys {
            return Ok(None);
        }
        let Some(max_words) = KeyLayout::device_max_words(&self.spec, &self.schema, &self.encoder) else {
            return Ok(None);
        };
        let columns = self
            .spec
            .keys()
            .iter()
            .map(|key| {
                let k = self.columns.iter().position(|(c, _)| *c == key.column)?;
                let data_type = self.schema.field(key.column).data_type();
                match native_ordinal_kind(data_type) {
                    Some(kind) => Some((k, DeviceKeyType::Ordinal(kind))),
                    None => self.view_lists[k].is_some().then_some((k, DeviceKeyType::Views)),
                }
            })
            .collect::<Option<Vec<_>>>();
        let Some(columns) = columns else {
            return Ok(None);
        };
        let mut buffer_bytes = 0;
        let mut bytes_stats = vec![];
        for (key, &(k, t)) in self.spec.keys().iter().zip(&columns) {
            bytes_stats.push(match t {
                DeviceKeyType::Ordinal(_) => None,
                DeviceKeyType::Views => match &self.device_input {
                    Some(d) => d.stats(k),
                    None => {
                        let parts: Vec<&dyn Array> =
                            self.batches.iter().map(|b| b.column(key.column).as_ref()).collect();
                        buffer_bytes += self.view_buffers(k).0.iter().map(|b| b.len()).sum::<usize>();
                        Some(gpusort::keys::bytes_column_stats(&parts)?)
                    }
                },
            });
        }
        // Values whole where the options take them so and the key still fits the device's
        // words; else the prefixes whose words were counted above.
        let whole = KeyLayout::device_words(&self.spec, &self.schema, &self.encoder, &bytes_stats);
        let (encoder, max_words) = match whole {
            Some(words) if words <= KEY_MAX_WORDS => (self.encoder.clone(), words),
            _ if max_words <= KEY_MAX_WORDS => (self.encoder.without_whole_values(), max_words),
            _ => return Ok(None),
        };
        Ok(Some(DeviceKeys {
            columns,
            encoder,
            max_words,
            bytes_stats,
            tie_columns: None,
            buffer_bytes,
        }))
    }

    /// The distinct data buffers that device column `k`'s staged views index, and for each
    /// raised buffer index the one it names. Batches often list the same buffers in lists of
    /// their own (a Parquet reader's batches share its pages and dictionaries): each goes to
    /// the device once.
    fn view_buffers(&self, k: usize) -> (Vec<&Buffer>, Vec<usize>) {
        let (c, _) = self.columns[k];
        let parts: Vec<&dyn Array> = self.batches.iter().map(|b| b.column(c).as_ref()).collect();
        let listed = match &self.view_lists[k] {
            Some(lists) => lists.buffers(&parts),
            None => vec![],
        };
        let mut seen: HashMap<(usize, usize), usize> = HashMap::new();
        let mut distinct = vec![];
        let index = (listed.into_iter())
            .map(|b| {
                *seen.entry((b.as_ptr() as usize, b.len())).or_insert_with(|| {
                    distinct.push(b);
                    distinct.len() - 1
                })
            })
            .collect();
        (distinct, index)
    }

    /// Device column `k`'s distinct view data buffers packed into one device buffer, with the
    /// table of each raised buffer index's address there; the bytes and buffers sent.
    fn upload_view_buffers(&self, k: usize, copies: &mut Transfers) -> Result<(KeyViewBuffers, usize, usize)> {
        let (data, mut addresses, bytes, distinct) = match &self.device_input {
            // The device batches' buffers are there: only their table goes up.
            Some(d) => (ViewData::Batches(d.owners()), d.buffers.clone(), 0, 0),
            None => {
                let (distinct, index) = self.view_buffers(k);
                let parts: Vec<&[u8]> = distinct.iter().map(|b| b.as_slice()).collect();
                let (packed, starts) = copies.upload_packed(&self.gpu, &parts)?;
                let base = packed.device_ptr(copies.stream()).0;
                let addresses = index.iter().map(|&d| base + starts[d] as u64).collect();
                let bytes = parts.iter().map(|p| p.len()).sum();
                (ViewData::Packed(packed), addresses, bytes, parts.len())
            }
        };
        addresses.push(0);
        let buffers = KeyViewBuffers {
            _data: data,
            table: copies.stream().clone_htod(&addresses)?,
        };
        Ok((buffers, bytes, distinct))
    }

    /// The device view columns (not of the key) whose data buffers go up for the output, and
    /// their bytes: none unless [`GpuSortSession::with_output_views`] and
    /// [`GpuOptions::compact_views`](crate::GpuOptions::compact_views).
    fn output_view_columns(&self, keys: &KeySource) -> (Vec<usize>, usize) {
        // Device batches' views have their data nowhere else.
        let wanted = self.output_views || self.device_input.is_some();
        if !wanted || !self.gpu.options().compact_views {
            return (vec![], 0);
        }
        let of_key = |k: usize| match keys {
            KeySource::Device(d) => d
                .columns
                .iter()
                .any(|&(c, t)| c == k && matches!(t, DeviceKeyType::Views)),
            KeySource::Host(_) => false,
        };
        let columns: Vec<usize> = (0..self.columns.len())
            .filter(|&k| self.view_lists[k].is_some() && !of_key(k))
            .collect();
        let bytes = (columns.iter())
            .map(|&k| self.view_buffers(k).0.iter().map(|b| b.len()).sum::<usize>())
            .sum();
        (columns, bytes)
    }

    /// The data buffers of [`DevicePlan::output_views`]' columns sent up, for the output.
    fn upload_output_views(&self, plan: &DevicePlan, sorted: &mut Sorted, copies: &mut Transfers) -> Result<()> {
        if plan.output_views.is_empty() {
            return Ok(());
        }
        let start = Instant::now();
        let mut uploaded = 0;
        for &k in &plan.output_views {
            let (buffers, bytes, _) = self.upload_view_buffers(k, copies)?;
            sorted.view_buffers[k] = Some(buffers);
            uploaded += bytes;
        }
        log::debug!(
            target: "gpusort::timeline",
            "session: {uploaded} bytes of the output's view data buffers sent in {:.1} ms",
            start.elapsed().as_secs_f64() * 1e3
        );
        Ok(())
    }

    /// The key encoded on the device from its assembled columns (`cols`): the view columns'
    /// data buffers uploaded and listed, the native columns' bounds found there, the layout
    /// laid out from both, and the words written.
    fn encode_on_device(
        &self,
        d: &DeviceKeys,
        cols: &Assembled,
        copies: &mut Transfers,
    ) -> Result<(KeyLayout, DeviceEncodedKeys, Vec<Option<KeyViewBuffers>>)> {
        let (gpu, n) = (&self.gpu, self.rows);
        // Each view column's data buffers, and the table of their device addresses.
        let start = Instant::now();
        let (mut uploaded, mut distinct_buffers) = (0, 0);
        let mut views: Vec<Option<KeyViewBuffers>> = vec![];
        for &(k, t) in &d.columns {
            views.push(match t {
                DeviceKeyType::Ordinal(_) => None,
                DeviceKeyType::Views => {
                    let (buffers, bytes, distinct) = self.upload_view_buffers(k, copies)?;
                    uploaded += bytes;
                    distinct_buffers += distinct;
                    Some(buffers)
                }
            });
        }
        let key_columns: Vec<DeviceKeyColumn<'_>> = (d.columns.iter().zip(&views))
            .map(|(&(k, t), v)| DeviceKeyColumn {
                values: &cols.values[k].data,
                valid: cols.bitmaps[k].as_ref(),
                kind: match (t, v) {
                    (DeviceKeyType::Ordinal(kind), _) => DeviceKeyKind::Ordinal(kind),
                    (DeviceKeyType::Views, v) => DeviceKeyKind::Views(&v.as_ref().expect("a buffer table").table),
                },
            })
            .collect();
        if views.iter().any(Option::is_some) {
            log::debug!(
                target: "gpusort::timeline",
                "session: {uploaded} bytes of the key's view data buffers ({distinct_buffers} distinct) sent in {:.1} ms",
                start.elapsed().as_secs_f64() * 1e3
            );
        }
        let native: Vec<DeviceKeyColumn<'_>> = (key_columns.iter())
            .filter(|c| matches!(c.kind, DeviceKeyKind::Ordinal(_)))
            .copied()
            .collect();
        let mut native_stats = gpu.native_key_stats(&native, n)?.into_iter();
        let column_stats: Vec<ColumnStats> = (d.bytes_stats.iter())
            .map(|b| match b {
                Some(b) => ColumnStats::Bytes(*b),
                None => ColumnStats::Native(native_stats.next().expect("a native column's bounds")),
            })
            .collect();
        let layout = KeyLayout::from_column_stats(&self.spec, &column_stats, &d.encoder)?;
        // The buffers' uploads and the kernel run on the one stream, in order.
        let encoded = gpu.encode_device_keys(&key_columns, &layout, n)?;
        Ok((layout, encoded, views))
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
    fn assemble(&self, mut segments: Vec<DeviceSegment>, columns: &[GpuColumn]) -> Result<Assembled> {
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
            match &self.device_input {
                Some(d) => {
                    // Device batches' bits were laid end to end on the host; their values'
                    // memory is freed on their producer's stream, so the copies are waited for
                    // first.
                    if let (Some(bits), Some(host)) = (&bits, d.bits(k)) {
                        // SAFETY: `host` outlives the synchronization below.
                        unsafe {
                            result::memcpy_htod_async(bits.device_ptr(stream).0, host, stream.cu_stream())?;
                        }
                    }
                    stream.synchronize()?;
                }
                None => {
                    for s in &segments {
                        if let Some(bits) = &bits {
                            // Segments start on a byte of the bitmap (their rows are a multiple
                            // of 64).
                            let dst = bits.device_ptr(stream).0 + (s.first_row / 8) as u64;
                            let len = s.rows.div_ceil(8);
                            // SAFETY: the bitmap holds the segment's bits.
                            unsafe {
                                match &s.bitmaps[k] {
                                    Some(src) => result::memcpy_dtod_async(
                                        dst,
                                        src.device_ptr(stream).0,
                                        len,
                                        stream.cu_stream(),
                                    ),
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
                    }
                }
            }
            if self.device_input.is_some() || self.copy_stream.is_some() {
                for s in segments.iter_mut() {
                    s.values[k] = None;
                    s.bitmaps[k] = None;
                }
            }
            values.push(DeviceColumn {
                data: col,
                width: c.width,
            });
            bitmaps.push(bits);
        }
        Ok(Assembled { values, bitmaps })
    }
}

/// The tails of `deferred`'s groups ([`GatheredTails`]), gathered while the host's permutation
/// `perm` is current (only their rows, for a field whose views and data buffers are on the
/// device: `through_views`), when there are some and `reservation` grows to hold them on the
/// device beside the sort; `None` leaves the groups to the host.
fn tails_for_device(
    columns: &[SortColumn],
    through_views: &dyn Fn(usize) -> bool,
    deferred: &[TailGroups],
    perm: &[u32],
    reservation: &mut DeviceReservation,
) -> Option<Vec<GatheredTails>> {
    if deferred.is_empty() {
        return None;
    }
    let gathered = (deferred.iter())
        .map(|t| match through_views(t.field) {
            true => Some(GatheredTails::rows_of(t, perm)),
            false => GatheredTails::gather(&columns[t.field], t, perm),
        })
        .collect::<Option<Vec<_>>>()?;
    let need = (gathered.iter().zip(deferred)).map(|(g, t)| g.device_bytes(t)).max()?;
    reservation.try_grow_to(reservation.bytes() + need).then_some(gathered)
}

impl DeviceKeys {
    /// Whether a view column's values are longer than the key's prefix holds (past their
    /// common prefix): tied rows then need their whole values compared.
    fn inexact(&self) -> bool {
        self.bytes_stats.iter().flatten().any(|s| !s.is_exact(&self.encoder))
    }
}

/// What tied key prefixes are ordered by, when the key is inexact: the host encoder's layout,
/// columns and words, or the layout of a key encoded on the device (`device_key`: layout,
/// varying bits, common bits) with the key columns concatenated for it.
/// Per device column (of `columns`), the data buffers of the view key column it is, taken
/// out of the key encoded on the device.
fn kept_view_buffers(keys: &KeySource, key: Option<EncodedKey>, columns: usize) -> Vec<Option<KeyViewBuffers>> {
    let mut kept: Vec<Option<KeyViewBuffers>> = (0..columns).map(|_| None).collect();
    if let (KeySource::Device(d), Some(key)) = (keys, key) {
        for (&(k, _), buffers) in d.columns.iter().zip(key.views) {
            if let Some(b) = buffers {
                kept[k] = Some(b);
            }
        }
    }
    kept
}

fn key_ties<'a>(keys: &'a KeySource, device_key: Option<&'a EncodedKey>) -> Option<KeyTies<'a>> {
    match keys {
        KeySource::Host(k) => Some(KeyTies {
            layout: k.encoder.layout(),
            columns: k.encoder.sort_columns(),
            varying: &k.varying,
            constants: k.words.iter().map(|w| w.as_words()[0]).collect(),
            views: vec![],
        }),
        KeySource::Device(d) => {
            let key = device_key?;
            Some(KeyTies {
                layout: &key.layout,
                columns: d.tie_columns.as_deref()?,
                varying: &key.varying,
                constants: key.common.clone(),
                views: (d.columns.iter().zip(&key.views))
                    .map(|(&(k, _), v)| v.as_ref().map(|v| (k, v)))
                    .collect(),
            })
        }
    }
}
