//! [`RangeBlocks`]: the pinned host blocks that [`SortedRows`](super::SortedRows)' ranges come
//! down into, each column's part always of one size class, and pinned ahead of the ranges on
//! a thread of their own.
//!
//! # Why
//!
//! A range's blocks come from the [`PinnedPool`], and return to it when the consumer drops the
//! range's arrays (a Parquet writer: once the range's row group is written, 10-20 ranges
//! later). Until the pool holds that many ranges' blocks, each range pinned new ones on its
//! way down: on TPC-H lineitem SF10 (an H200, stop 39, run 5) 19 of 58 ranges waited 10-82 ms
//! for them, 0.56 s of the 1.7 s that the ranges took to come down, while the writer had idle
//! cores. Two things take that off the ranges' path:
//!
//! - **One class a part.** A column's values, validity bits and compacted view bytes each ask
//!   for the largest class that part needed yet (a range with fewer rows or shorter strings
//!   takes a block of the same class), so every range reuses the blocks of the ones before.
//! - **Pinned ahead.** After each range starts down, a thread of its own makes sure the pool
//!   has [`RANGES_AHEAD`] more ranges' blocks free ([`PinnedPool::ensure_free`]); a session told
//!   its ranges ([`GpuSortSession::with_output_ranges`](super::GpuSortSession::with_output_ranges))
//!   starts that while the device sorts, from the sizes it plans (the view bytes estimated
//!   from a sample of the input's batches).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use arrow::array::{Array, AsArray};
use arrow::datatypes::DataType;

use crate::pinned::{HostBuffer, PinnedPool, class_size};

/// Ranges whose blocks are kept pinned ahead of the range coming down (at most a quarter of the
/// pool's limit): the writer of `gpusort sort` takes a range every ~5-30 ms, and pinning one
/// of TPC-H lineitem's (~225 MB) takes ~20-50 ms.
pub(super) const RANGES_AHEAD: usize = 8;

/// Input batches sampled for the view bytes a range's compacted columns hold.
const SAMPLE_EVERY: usize = 64;

/// Of a column's range: its values, its validity bits, its compacted views' bytes.
#[derive(Debug, Clone, Copy)]
pub(super) enum Part {
    Values = 0,
    Bits = 1,
    Bytes = 2,
}

/// The size classes of each device column's range parts (see the module docs).
pub(super) struct RangeBlocks {
    /// Per device column, by [`Part`]: the class of its blocks (0: none asked for yet).
    sizes: Vec<[usize; 3]>,
    /// Whether a thread is pinning blocks ahead now.
    pinning: Arc<AtomicBool>,
    /// Whether blocks are pinned ahead at all ([`GpuOptions::pin_ahead`](crate::GpuOptions::pin_ahead)).
    ahead: bool,
}

impl RangeBlocks {
    /// No sizes known yet, for `columns` device columns.
    pub(super) fn new(columns: usize) -> Self {
        Self {
            sizes: vec![[0; 3]; columns],
            pinning: Arc::new(AtomicBool::new(false)),
            ahead: true,
        }
    }

    /// Pins blocks ahead ([`Self::pin_ahead`]) only when `on`.
    pub(super) fn with_pin_ahead(mut self, on: bool) -> Self {
        self.ahead = on;
        self
    }

    /// The sizes planned for ranges of `range_rows` rows of device columns of `widths`: their
    /// values, the bits of the `nullable` ones, and for the `views` columns (device column,
    /// its long bytes sampled) the long values' bytes of a range.
    pub(super) fn planned(
        widths: &[usize],
        nullable: &[usize],
        views: &[(usize, LongBytes)],
        range_rows: usize,
    ) -> Self {
        let mut blocks = Self::new(widths.len());
        for (k, &width) in widths.iter().enumerate() {
            blocks.sizes[k][Part::Values as usize] = class_size(range_rows * width);
        }
        for &k in nullable {
            blocks.sizes[k][Part::Bits as usize] = class_size(range_rows.div_ceil(32) * 4);
        }
        for &(k, long) in views {
            let bytes = long.per_row() * range_rows as f64;
            // A margin over the sample's mean, so that most ranges fit the planned class.
            let bytes = (bytes * 1.05) as usize;
            if bytes > 0 {
                blocks.sizes[k][Part::Bytes as usize] = class_size(bytes);
            }
        }
        blocks
    }

    /// A buffer of `len` bytes for `part` of device column `k`: a block of the largest class
    /// that part asked for yet (so the next range reuses it), pinned where the pool can.
    pub(super) fn take(&mut self, k: usize, part: Part, len: usize) -> HostBuffer {
        if len == 0 {
            return HostBuffer::heap(0);
        }
        let size = &mut self.sizes[k][part as usize];
        *size = class_size(len.max(*size));
        let mut buffer = PinnedPool::global().transfer_buffer(*size);
        buffer.truncate(len);
        buffer
    }

    /// Makes sure, on a thread of its own, that the pool holds `ranges` more ranges' blocks
    /// free (at most [`RANGES_AHEAD`], and a quarter of the pool's limit); nothing when such a
    /// thread is still at it.
    pub(super) fn pin_ahead(&self, ranges: usize) {
        let pool = PinnedPool::global();
        let set: Vec<usize> = self.sizes.iter().flatten().copied().filter(|&s| s > 0).collect();
        let set_bytes: usize = set.iter().sum();
        let ranges = ranges.min(RANGES_AHEAD).min(pool.limit() / 4 / set_bytes.max(1));
        if !self.ahead || ranges == 0 || self.pinning.swap(true, Ordering::AcqRel) {
            return;
        }
        let lens: Vec<usize> = (0..ranges).flat_map(|_| set.iter().copied()).collect();
        let pinning = Arc::clone(&self.pinning);
        let spawned = pool.pin_ahead(lens, move |pinned, took| {
            if pinned > 0 {
                log::debug!(
                    target: "gpusort::timeline",
                    "session: {pinned} bytes pinned ahead for {ranges} ranges in {:.1} ms",
                    took.as_secs_f64() * 1e3
                );
            }
            pinning.store(false, Ordering::Release);
        });
        if spawned.is_none() {
            self.pinning.store(false, Ordering::Release);
        }
    }
}

/// The long (out-of-line) values' bytes of a view column, counted as its batches are pushed
/// over one batch of every [`SAMPLE_EVERY`] (the first always): what a range's compacted view
/// bytes are planned from. Counted at the push because the batches the session keeps may be
/// hollow by the time it plans ([`GpuSortSession::with_release_input`](super::GpuSortSession::with_release_input)).
#[derive(Debug, Default, Clone, Copy, PartialEq)]
pub(super) struct LongBytes {
    rows: usize,
    bytes: usize,
}

impl LongBytes {
    /// Counts `array` (of the `part`th batch pushed) when that batch is sampled.
    pub(super) fn sample(&mut self, part: usize, array: &dyn Array) {
        if !part.is_multiple_of(SAMPLE_EVERY) {
            return;
        }
        let views = match array.data_type() {
            DataType::Utf8View => array.as_string_view().views(),
            DataType::BinaryView => array.as_binary_view().views(),
            _ => return,
        };
        self.rows += array.len();
        self.bytes += (views.iter().enumerate())
            .filter(|(i, _)| array.is_valid(*i))
            .map(|(_, v)| *v as u32 as usize)
            .filter(|&len| len > 12)
            .sum::<usize>();
    }

    /// The mean long bytes of a row sampled; 0 without any.
    fn per_row(&self) -> f64 {
        if self.rows == 0 {
            0.0
        } else {
            self.bytes as f64 / self.rows as f64
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::{ArrayRef, Int64Array, RecordBatch, StringViewArray};
    use arrow::datatypes::{Field, Schema};

    fn batch(strings: &[Option<&str>]) -> RecordBatch {
        let schema = Arc::new(Schema::new(vec![
            Field::new("i", DataType::Int64, false),
            Field::new("s", DataType::Utf8View, true),
        ]));
        let ints: ArrayRef = Arc::new(Int64Array::from_iter_values(0..strings.len() as i64));
        let views: ArrayRef = Arc::new(StringViewArray::from(strings.to_vec()));
        RecordBatch::try_new(schema, vec![ints, views]).unwrap()
    }

    #[test]
    fn planned_sizes_are_the_classes_of_a_range() {
        let long = "a string longer than twelve"; // 27 bytes
        let batches = [
            batch(&[Some(long), Some("short"), None, Some(long)]),
            batch(&[Some(long), Some(long), Some("tiny"), Some("")]),
        ];
        // Both batches sampled (as the first of each SAMPLE_EVERY would be).
        let mut views = LongBytes::default();
        for b in &batches {
            views.sample(0, b.column(1).as_ref());
        }
        // Columns: i64 (8 bytes), a view (16), a nullable u32 (4).
        let blocks = RangeBlocks::planned(&[8, 16, 4], &[2], &[(1, views)], 1000);
        assert_eq!(blocks.sizes[0], [class_size(8000), 0, 0]);
        // Four long values of eight rows: 13.5 bytes a row, 5% over.
        assert_eq!(blocks.sizes[1], [class_size(16_000), 0, class_size(14_175)]);
        assert_eq!(blocks.sizes[2], [class_size(4000), class_size(128), 0]);
        // Not a view column, or no long values: no bytes planned.
        let mut ints = LongBytes::default();
        ints.sample(0, batches[0].column(0).as_ref());
        assert_eq!(ints, LongBytes::default());
        let blocks = RangeBlocks::planned(&[8, 16], &[], &[(0, ints)], 1000);
        assert_eq!(blocks.sizes[0][Part::Bytes as usize], 0);
        let mut short = LongBytes::default();
        short.sample(0, batch(&[Some("a"), None]).column(1).as_ref());
        assert_eq!(short.per_row(), 0.0);
        assert_eq!(LongBytes::default().per_row(), 0.0);
        // Only one batch of every SAMPLE_EVERY is counted.
        let mut sampled = LongBytes::default();
        for part in 0..2 * SAMPLE_EVERY {
            sampled.sample(part, batches[0].column(1).as_ref());
        }
        assert_eq!(sampled.rows, 8);
    }

    #[test]
    fn a_part_keeps_the_largest_class_it_asked_for() {
        let mut blocks = RangeBlocks::new(2);
        // The global pool has no GPU here: heap buffers, of the lengths asked for.
        let b = blocks.take(0, Part::Values, 1_000_000);
        assert_eq!(b.len(), 1_000_000);
        assert_eq!(blocks.sizes[0][0], class_size(1_000_000));
        // A smaller request keeps the class; a larger one raises it.
        assert_eq!(blocks.take(0, Part::Values, 10).len(), 10);
        assert_eq!(blocks.sizes[0][0], class_size(1_000_000));
        blocks.take(0, Part::Values, 3_000_000);
        assert_eq!(blocks.sizes[0][0], class_size(3_000_000));
        // Nothing asked: no class.
        assert!(blocks.take(1, Part::Bytes, 0).is_empty());
        assert_eq!(blocks.sizes[1], [0; 3]);
        // Off: no thread starts.
        let blocks = blocks.with_pin_ahead(false);
        blocks.pin_ahead(4);
        assert!(!blocks.pinning.load(Ordering::Acquire));
        // No allocator: pinning ahead pins nothing and leaves no thread at it.
        let blocks = blocks.with_pin_ahead(true);
        blocks.pin_ahead(4);
        for _ in 0..1000 {
            if !blocks.pinning.load(Ordering::Acquire) {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        assert!(!blocks.pinning.load(Ordering::Acquire));
    }
}
