//! Rows that are on the device already: a [`DeviceBatch`] (a Parquet reader's row groups
//! decoded there, `gpusort_parquet::gpu_decode`) joins a [`GpuSortSession`] without crossing
//! PCIe.
//!
//! # How a device batch joins the session
//!
//! - **Values.** Each column's values become a segment of their own: the batch's rows at the
//!   session's next row, assembled with the other segments by device-to-device copies at
//!   finish, as uploaded segments are. Every column of the schema must be a device column
//!   (fixed width of 1 to 16 bytes, or a string or binary view); a batch of another schema is
//!   refused before anything moves.
//! - **Validity.** A batch's rows start anywhere in the session's bitmap, not on a byte: its
//!   bits (a few hundred kilobytes for millions of rows) come to the host as it joins and are
//!   laid end to end there ([`BooleanBufferBuilder`]); the whole bitmap goes up once, at
//!   finish.
//! - **Views' data.** A long view names its data buffer by index: the batch's views index the
//!   session's device buffers from [`GpuSortSession::device_buffers`] on (its producer raises
//!   them so: the session cannot read the views to check), and the batch brings those buffers'
//!   device addresses. Every view column then has its buffers on the device for its key's
//!   encoding and the output's compaction ([`SortedRows::next_batches`](super::SortedRows::next_batches)).
//! - **Memory.** The batch's owner (its columns' and buffers' device memory, and the budget's
//!   reservations that hold them) stays with the session until the sorted rows are released;
//!   the sort stream is synchronized before it goes, since it was read there.
//! - **Key statistics.** A string or binary key needs its bounds (shortest, longest, bytes all
//!   values start with): they are taken from the batch's views, downloaded into pinned memory
//!   as it joins (16 bytes a row; a long value's first 4 bytes are in its view, so a common
//!   prefix past them is not seen: the key then holds a few bytes more than it needs, still in
//!   order).
//!
//! A session is fed either batches of the host ([`GpuSortSession::push`]) or device batches,
//! not both.

use std::any::Any;
use std::sync::Arc;

use arrow::array::BooleanBufferBuilder;
use arrow::buffer::{BooleanBuffer, Buffer};
use cudarc::driver::{CudaSlice, CudaStream};
use gpusort::keys::BytesColumnStats;
use rayon::prelude::*;

use super::upload::DeviceSegment;
use crate::error::{CudaSortError, Result};
use crate::memory::{DeviceBudget, DeviceReservation};
use crate::pinned::PinnedPool;
use crate::transfer::Transfers;

/// One column of a [`DeviceBatch`]: at least `rows * width` bytes of values (a view column's
/// 16-byte views), and Arrow's validity bits in 32-bit words when the column has nulls.
pub struct DeviceBatchColumn {
    pub values: CudaSlice<u8>,
    pub validity: Option<CudaSlice<u32>>,
}

/// Rows in device memory, in the layout of a [`GpuSortSession`]'s columns (see the module
/// docs): a column for each of the session's schema's, and the data buffers the view columns'
/// long views index.
pub struct DeviceBatch {
    rows: usize,
    columns: Vec<DeviceBatchColumn>,
    first_buffer: u32,
    buffers: Vec<u64>,
    owner: Box<dyn Any + Send + Sync>,
    reservations: Vec<DeviceReservation>,
    kept_bytes: usize,
}

impl DeviceBatch {
    /// `rows` rows of `columns` (one per field of the session's schema, each in memory that
    /// `owner` does not free before it is dropped), whose long views index the data buffers at
    /// device addresses `buffers` under indices `first_buffer..` (the session's
    /// [`GpuSortSession::device_buffers`] when it joins). `owner` holds what the views' data
    /// buffers are in (and any reservation of the budget that holds them).
    pub fn new(
        rows: usize,
        columns: Vec<DeviceBatchColumn>,
        first_buffer: u32,
        buffers: Vec<u64>,
        owner: Box<dyn Any + Send + Sync>,
    ) -> Self {
        Self {
            rows,
            columns,
            first_buffer,
            buffers,
            owner,
            reservations: vec![],
            kept_bytes: 0,
        }
    }

    /// With the budget's reservations that hold the batch's device memory (its columns and
    /// its data buffers): the session takes them over, one holder with its own, so that the
    /// sort never waits for memory it holds itself. `kept_bytes` of them are the data
    /// buffers', which stay for the whole sort (the columns' become the sort's columns).
    pub fn with_reservations(mut self, reservations: Vec<DeviceReservation>, kept_bytes: usize) -> Self {
        self.reservations = reservations;
        self.kept_bytes = kept_bytes;
        self
    }

    /// Rows.
    pub fn num_rows(&self) -> usize {
        self.rows
    }
}

/// What the owners of a session's device batches hold, released after the sort stream passed
/// every read of it.
pub(super) struct DeviceOwners {
    stream: Arc<CudaStream>,
    owners: Vec<Box<dyn Any + Send + Sync>>,
}

impl Drop for DeviceOwners {
    fn drop(&mut self) {
        // Their memory may still be read by work queued on the sort stream.
        let _ = self.stream.synchronize();
        self.owners.clear();
    }
}

/// A session's device batches so far (see the module docs).
pub(super) struct DeviceInput {
    /// Per batch, each device column's values (no bits: those are in `bits`).
    pub(super) segments: Vec<DeviceSegment>,
    /// Per device column, the validity bits of every row so far, once one batch had nulls.
    bits: Vec<Option<BooleanBufferBuilder>>,
    /// Per device column, the statistics of a view key column's values so far.
    stats: Vec<Option<ViewStats>>,
    /// The data buffers' device addresses, by (raised) buffer index.
    pub(super) buffers: Vec<u64>,
    /// The batches' owners (shared once the sort keeps the views' buffers).
    owners: Arc<DeviceOwners>,
    /// The batches' reservations of the session's budget, merged.
    pub(super) reservation: DeviceReservation,
    /// Bytes of the batches' data buffers, held for the whole sort.
    pub(super) kept_bytes: usize,
    rows: usize,
}

impl DeviceInput {
    /// No batch yet, of `columns` device columns, the view keys among them (`view_keys`)
    /// gathering statistics.
    /// `stream` is the sort's, which reads the batches' memory; `budget` the session's.
    pub(super) fn new(
        columns: usize,
        view_keys: &[usize],
        stream: &Arc<CudaStream>,
        budget: &Arc<DeviceBudget>,
    ) -> Self {
        Self {
            segments: vec![],
            bits: (0..columns).map(|_| None).collect(),
            stats: (0..columns)
                .map(|k| view_keys.contains(&k).then(ViewStats::default))
                .collect(),
            buffers: vec![],
            owners: Arc::new(DeviceOwners {
                stream: Arc::clone(stream),
                owners: vec![],
            }),
            reservation: budget.reservation(),
            kept_bytes: 0,
            rows: 0,
        }
    }

    /// Adds `batch` (its columns checked against `widths`, the device columns' bytes per
    /// row): its values as a segment, its bits and view keys' statistics to the host's.
    /// `stream` is the batch's producer's, idle: the bits come down on it.
    pub(super) fn push(&mut self, batch: DeviceBatch, widths: &[usize], stream: &Arc<CudaStream>) -> Result<()> {
        let n = batch.rows;
        if Arc::get_mut(&mut self.owners).is_none() {
            return Err(CudaSortError::Unsupported(
                "a device batch pushed after the sort took the batches".into(),
            ));
        }
        if batch.columns.len() != widths.len() {
            return Err(CudaSortError::Unsupported(format!(
                "a device batch of {} columns in a sort of {}",
                batch.columns.len(),
                widths.len()
            )));
        }
        if batch.first_buffer as usize != self.buffers.len() {
            return Err(CudaSortError::Unsupported(format!(
                "a device batch whose views index buffers from {} on, where the session has {}",
                batch.first_buffer,
                self.buffers.len()
            )));
        }
        for (k, (c, &w)) in batch.columns.iter().zip(widths).enumerate() {
            let words = c.validity.as_ref().map_or(n.div_ceil(32), |v| v.len());
            if c.values.len() < n * w || words < n.div_ceil(32) {
                return Err(CudaSortError::Unsupported(format!(
                    "device column {k}: {} bytes of values and {words} words of bits for {n} rows of {w} bytes",
                    c.values.len()
                )));
            }
        }
        let mut values = vec![];
        for (k, c) in batch.columns.into_iter().enumerate() {
            let bits = match &c.validity {
                Some(v) => Some(BooleanBuffer::new(Buffer::from_vec(stream.clone_dtoh(v)?), 0, n)),
                None => None,
            };
            if let Some(stats) = &mut self.stats[k] {
                // Into a pinned block of the pool (the next batch's reuses it): at PCIe's
                // speed, where a fresh heap buffer took ~0.1 s a call in page faults.
                let mut views = PinnedPool::global().alloc(16 * n);
                views.truncate(16 * n);
                let mut copies = Transfers::new(stream);
                // SAFETY: read once the stream synchronizes, right after.
                unsafe { copies.download(&c.values, &mut views) }?;
                stream.synchronize()?;
                stats.add(views.as_slice(), bits.as_ref());
            }
            self.add_bits(k, bits.as_ref(), n);
            values.push(Some(c.values));
        }
        self.segments.push(DeviceSegment {
            first_row: self.rows,
            rows: n,
            values,
            bitmaps: widths.iter().map(|_| None).collect(),
        });
        let owners = Arc::get_mut(&mut self.owners).expect("checked above");
        owners.owners.push(batch.owner);
        for r in batch.reservations {
            if let Err(other) = self.reservation.merge(r) {
                // Of another budget: held as long as the memory.
                owners.owners.push(Box::new(other));
            }
        }
        self.kept_bytes += batch.kept_bytes;
        self.buffers.extend(batch.buffers);
        self.rows += n;
        Ok(())
    }

    /// Appends `n` rows of column `k`'s bits (`None`: all valid).
    fn add_bits(&mut self, k: usize, bits: Option<&BooleanBuffer>, n: usize) {
        let rows = self.rows;
        match (&mut self.bits[k], bits) {
            (Some(b), Some(bits)) => b.append_buffer(bits),
            (Some(b), None) => b.append_n(n, true),
            (None, Some(bits)) => {
                let mut b = BooleanBufferBuilder::new(rows + n);
                b.append_n(rows, true);
                b.append_buffer(bits);
                self.bits[k] = Some(b);
            }
            (None, None) => {}
        }
    }

    /// Device column `k`'s validity bits of every row, when some row is null.
    pub(super) fn bits(&self, k: usize) -> Option<&[u8]> {
        self.bits[k].as_ref().map(|b| b.as_slice())
    }

    /// Device column `k`'s statistics as a key, when it is a view key.
    pub(super) fn stats(&self, k: usize) -> Option<BytesColumnStats> {
        self.stats[k].as_ref().map(|s| s.stats(self.rows))
    }

    /// The batches' owners, shared by whatever reads their buffers (the views' tables).
    pub(super) fn owners(&self) -> Arc<DeviceOwners> {
        Arc::clone(&self.owners)
    }
}

/// The bounds of a view column's valid values seen in their views (see the module docs).
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct ViewStats {
    valid: usize,
    min_len: Option<u32>,
    max_len: u32,
    /// The bytes all valid values were seen to start with: `prefix[..common]`.
    prefix: [u8; 12],
    common: usize,
}

impl ViewStats {
    /// One view's valid value.
    fn of_view(view: &[u8]) -> Self {
        let len = u32::from_le_bytes(view[..4].try_into().expect("4 bytes"));
        let seen = if len <= 12 { len as usize } else { 4 };
        let mut prefix = [0; 12];
        prefix[..seen].copy_from_slice(&view[4..4 + seen]);
        Self {
            valid: 1,
            min_len: Some(len),
            max_len: len,
            prefix,
            common: seen,
        }
    }

    /// Both's values together.
    fn merge(self, other: Self) -> Self {
        if self.valid == 0 {
            return other;
        }
        if other.valid == 0 {
            return self;
        }
        let limit = self.common.min(other.common);
        let common = (0..limit).take_while(|&i| self.prefix[i] == other.prefix[i]).count();
        Self {
            valid: self.valid + other.valid,
            min_len: self.min_len.min(other.min_len),
            max_len: self.max_len.max(other.max_len),
            prefix: self.prefix,
            common,
        }
    }

    /// Adds the valid ones of `views` (16 bytes each; `bits` their validity).
    fn add(&mut self, views: &[u8], bits: Option<&BooleanBuffer>) {
        const CHUNK: usize = 1 << 16;
        let seen = views
            .par_chunks(16 * CHUNK)
            .enumerate()
            .map(|(c, chunk)| {
                (chunk.chunks_exact(16).enumerate())
                    .filter(|(i, _)| bits.is_none_or(|b| b.value(c * CHUNK + i)))
                    .fold(Self::default(), |acc, (_, view)| acc.merge(Self::of_view(view)))
            })
            .reduce(Self::default, Self::merge);
        *self = self.merge(seen);
    }

    /// As the key encoder's statistics of a column of `rows` rows.
    fn stats(&self, rows: usize) -> BytesColumnStats {
        BytesColumnStats {
            rows,
            valid_rows: self.valid,
            common_prefix: if self.valid == 0 { 0 } else { self.common },
            min_len: self.min_len.unwrap_or(0) as usize,
            max_len: self.max_len as usize,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::{Array, StringViewArray};

    fn views_of(array: &StringViewArray) -> Vec<u8> {
        array.views().iter().flat_map(|v| v.to_le_bytes()).collect()
    }

    #[test]
    fn view_stats_match_the_values_bounds_where_the_views_show_them() {
        let values = StringViewArray::from(vec![
            Some("abcdef"),
            None,
            Some("abcdxyz"),
            Some("abcd and a value longer than twelve"),
            Some(""),
        ]);
        let mut s = ViewStats::default();
        s.add(&views_of(&values), values.nulls().map(|n| n.inner()));
        let stats = s.stats(values.len());
        assert_eq!((stats.rows, stats.valid_rows), (5, 4));
        assert_eq!((stats.min_len, stats.max_len), (0, 35));
        assert_eq!(stats.common_prefix, 0, "the empty value starts with nothing");

        let values = StringViewArray::from(vec!["abcdef", "abcdxyz", "abcd and a value longer than twelve"]);
        let mut s = ViewStats::default();
        s.add(&views_of(&values), None);
        assert_eq!(s.stats(3).common_prefix, 4, "a long value shows its first 4 bytes");
        assert_eq!((s.stats(3).min_len, s.stats(3).max_len), (6, 35));

        let values = StringViewArray::from(vec!["prefix-1", "prefix-22", "prefix-3"]);
        let mut s = ViewStats::default();
        // In two parts, as two batches join.
        s.add(&views_of(&values)[..32], None);
        s.add(&views_of(&values)[32..], None);
        assert_eq!(s.stats(3).common_prefix, 7);
        assert_eq!(
            (s.stats(3).valid_rows, s.stats(3).min_len, s.stats(3).max_len),
            (3, 8, 9)
        );

        let none = ViewStats::default().stats(2);
        assert_eq!(
            (none.valid_rows, none.common_prefix, none.min_len, none.max_len),
            (0, 0, 0, 0)
        );
    }
}
