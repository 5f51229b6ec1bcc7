//! The CPU backend: the paper's record sorts on the CPU, with results identical to the
//! GPU backend (and to a stable comparison sort).
//!
//! [`CpuBackend::sort`] encodes the sort columns into ByField key words
//! ([`crate::keys`]), plans the radix passes over the bits that vary
//! ([`crate::plan::radix_passes`]), and runs the stable multi-threaded LSD radix sort of
//! [`radix`] with the requested record strategy:
//!
//! - **direct**: every fixed-width column (primitives, fixed-size binaries, dictionary
//!   keys) moves with the key in every pass, its validity bits packed 32 columns to a word
//!   that moves too; other columns (booleans, strings, nested) are gathered at the end;
//! - **indirect**: only the key words and the row index move; every column is gathered
//!   once through the final permutation.
//!
//! Truncated string prefixes that tie are then ordered by [`crate::ties`]. With a `LIMIT`
//! much smaller than the input, only the rows whose top key digit can reach the first
//! `limit` positions are sorted.

pub mod gather;
pub mod gather_parts;
pub(crate) mod presorted;

/// The most distinct keys (of at most 64 bits) that count as few, counted instead of sorted
/// (the GPU backend's limit too).
pub use presorted::MAX_DISTINCT as PRESORTED_MAX_DISTINCT;
/// The most ascending runs that count as presorted input, merged instead of sorted (the GPU
/// backend's order scan records as many run starts).
pub use presorted::MAX_RUNS as PRESORTED_MAX_RUNS;
pub(crate) mod radix;

use std::sync::Arc;
use std::time::Instant;

use arrow::array::{Array, ArrayRef, RecordBatch, RecordBatchOptions, UInt32Array};
use arrow::buffer::{BooleanBuffer, Buffer, MutableBuffer, NullBuffer};
use rayon::prelude::*;

use crate::backend::{SortBackend, SortOutput, SortRequest, SortStats};
use crate::error::{GpusortError, Result};
use crate::keys::{EncodedKeys, KeyEncoder, KeyLayout};
use crate::plan::{InputOrder, RadixPass, RecordMove, varying_bits};
use crate::ties::resolve_ties;
use gather::{fixed_array, fixed_values, fixed_width, gather_bytes, gather_column};
use presorted::Presorted;
use radix::radix_sort;

/// The multi-threaded CPU radix sort backend.
#[derive(Debug, Clone)]
pub struct CpuBackend {
    digit_bits: u32,
    pool: Option<Arc<rayon::ThreadPool>>,
}

impl Default for CpuBackend {
    fn default() -> Self {
        Self::new()
    }
}

impl CpuBackend {
    /// A backend on rayon's global thread pool with 8-bit digits.
    pub fn new() -> Self {
        Self {
            digit_bits: 8,
            pool: None,
        }
    }

    /// Uses digits of at most `bits` bits (1 to 16).
    pub fn with_digit_bits(mut self, bits: u32) -> Result<Self> {
        if !(1..=16).contains(&bits) {
            return Err(GpusortError::InvalidOption(format!(
                "digit width {bits} is not in 1..=16"
            )));
        }
        self.digit_bits = bits;
        Ok(self)
    }

    /// Runs on a pool of its own with `threads` threads.
    pub fn with_threads(mut self, threads: usize) -> Result<Self> {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .thread_name(|i| format!("gpusort-cpu-{i}"))
            .build()
            .map_err(|e| GpusortError::InvalidOption(format!("cannot start {threads} threads: {e}")))?;
        self.pool = Some(Arc::new(pool));
        Ok(self)
    }

    fn run(&self, request: &SortRequest<'_>) -> Result<SortOutput> {
        request.check_rows()?;
        let batch = request.batch;
        let n = batch.num_rows();
        let strategy = request.strategy();
        let start = Instant::now();
        let encoder = KeyEncoder::try_new(batch, request.spec, &request.encoder)?;
        let keys = encoder.encode();
        let layout = encoder.layout();
        let encode_time = start.elapsed();

        let start = Instant::now();
        let limit = request.limit.unwrap_or(n).min(n);
        let mut stats = SortStats {
            strategy: Some(strategy),
            rows: n,
            key_bits: layout.total_bits(),
            ..Default::default()
        };
        // A small LIMIT sorts only the rows that can reach the first `limit` positions;
        // presorted keys skip the radix passes.
        let candidates = (limit < n / 8).then(|| top_candidates(&keys, layout, limit)).flatten();
        let (perm, direct) = match candidates {
            Some(rows) => {
                let perm = self.sort_rows(&keys, &rows, &encoder, &mut stats)?;
                (perm, DirectColumns::default())
            }
            None => match presorted::sort_presorted(&keys.words, n) {
                Some(sorted) => {
                    stats.input_order = Some(sorted.order);
                    let perm = finish_presorted(sorted, keys.words, &encoder, &mut stats)?;
                    (perm, DirectColumns::default())
                }
                None => self.sort_all(batch, keys, &encoder, strategy.record_move, &mut stats)?,
            },
        };
        stats.sort_time = start.elapsed();

        let start = Instant::now();
        let head = &perm[..limit];
        // Input already in order comes back as it is, without a copy.
        let in_place = stats.input_order == Some(InputOrder::Sorted) && is_identity(head);
        stats.moved_columns = direct.columns.len();
        stats.gathered_columns = batch.num_columns() - direct.columns.len();
        stats.host_gathered_columns = stats.gathered_columns;
        let columns = direct.finish(batch, n);
        let columns = batch
            .columns()
            .par_iter()
            .zip(columns)
            .map(|(col, moved)| match moved {
                Some(sorted) => Ok(sorted.slice(0, limit)),
                None if in_place => Ok(col.slice(0, limit)),
                None => gather_column(col, head),
            })
            .collect::<Result<Vec<ArrayRef>>>()?;
        let out = RecordBatch::try_new_with_options(
            batch.schema(),
            columns,
            &RecordBatchOptions::new().with_row_count(Some(limit)),
        )?;
        stats.gather_time = start.elapsed();
        stats.encode_time = encode_time;
        let mut perm = perm;
        perm.truncate(limit);
        Ok(SortOutput {
            batch: out,
            indices: UInt32Array::from(perm),
            stats,
        })
    }
}

impl CpuBackend {
    /// Sorts only `rows` (the candidates of a small LIMIT); returns the permutation.
    fn sort_rows(
        &self,
        keys: &EncodedKeys,
        rows: &[u32],
        encoder: &KeyEncoder,
        stats: &mut SortStats,
    ) -> Result<Vec<u32>> {
        let layout = encoder.layout();
        let keep_words = !layout.is_exact();
        let words: Vec<Vec<u32>> = keys
            .words
            .iter()
            .map(|w| rows.par_iter().map(|&r| w[r as usize]).collect())
            .collect();
        let sorted = radix_sort(rows.len(), words, keep_words, self.digit_bits, vec![]);
        stats.passes = sorted.digits;
        let mut perm: Vec<u32> = sorted.perm().par_iter().map(|&i| rows[i as usize]).collect();
        if keep_words {
            let words: Vec<&[u32]> = sorted.words.iter().map(|b| b.typed_data()).collect();
            stats.tie_groups = resolve_ties(layout, encoder.sort_columns(), &words, &mut perm)?.len();
        }
        Ok(perm)
    }

    /// Radix sorts every row, moving the columns of `record_move`; returns the permutation
    /// and the moved columns.
    fn sort_all(
        &self,
        batch: &RecordBatch,
        keys: EncodedKeys,
        encoder: &KeyEncoder,
        record_move: RecordMove,
        stats: &mut SortStats,
    ) -> Result<(Vec<u32>, DirectColumns)> {
        let layout = encoder.layout();
        let keep_words = !layout.is_exact();
        let mut direct = match record_move {
            RecordMove::Direct => DirectColumns::new(batch),
            RecordMove::Indirect => DirectColumns::default(),
        };
        let payload = std::mem::take(&mut direct.lanes);
        let sorted = radix_sort(batch.num_rows(), keys.words, keep_words, self.digit_bits, payload);
        stats.passes = sorted.digits;
        let mut perm = sorted.perm().to_vec();
        direct.sorted = sorted.payload;
        if keep_words {
            let words: Vec<&[u32]> = sorted.words.iter().map(|b| b.typed_data()).collect();
            let ties = resolve_ties(layout, encoder.sort_columns(), &words, &mut perm)?;
            stats.tie_groups = ties.len();
            direct.reorder(batch, &perm, &ties);
        }
        Ok((perm, direct))
    }
}

/// The permutation of presorted keys, with rows whose truncated string prefixes tie ordered
/// by their full values.
fn finish_presorted(
    sorted: Presorted,
    words: Vec<Vec<u32>>,
    encoder: &KeyEncoder,
    stats: &mut SortStats,
) -> Result<Vec<u32>> {
    let mut perm = sorted.perm;
    let layout = encoder.layout();
    if !layout.is_exact() {
        let words: Vec<Vec<u32>> = match sorted.order {
            InputOrder::Sorted => words,
            _ => words
                .iter()
                .map(|w| perm.par_iter().map(|&i| w[i as usize]).collect())
                .collect(),
        };
        let words: Vec<&[u32]> = words.iter().map(Vec::as_slice).collect();
        stats.tie_groups = resolve_ties(layout, encoder.sort_columns(), &words, &mut perm)?.len();
    }
    Ok(perm)
}

/// Whether `perm` is `0, 1, ..., n - 1`.
fn is_identity(perm: &[u32]) -> bool {
    perm.par_iter().enumerate().all(|(i, &p)| p as usize == i)
}

impl SortBackend for CpuBackend {
    fn name(&self) -> String {
        "cpu".to_string()
    }

    fn sort(&self, request: &SortRequest<'_>) -> Result<SortOutput> {
        match &self.pool {
            Some(pool) => pool.install(|| self.run(request)),
            None => self.run(request),
        }
    }
}

/// Rows whose most significant varying key digit (up to 16 bits) is at most the digit of
/// the `limit`-th smallest key, in input order; `None` when that would not cut the input
/// at least in half. Key order is only meaningful through the first inexact field (later
/// bits decide nothing between rows whose truncated values differ), so the digit must lie
/// within it.
fn top_candidates(keys: &EncodedKeys, layout: &KeyLayout, limit: usize) -> Option<Vec<u32>> {
    let varying = varying_bits(&keys.words);
    let w = varying.iter().position(|&v| v != 0)?;
    let hi = 32 - varying[w].leading_zeros();
    // Padded bit positions (from the top of word 0) the digit may cover.
    let usable_end = match layout.first_inexact() {
        Some(f) => layout.pad() + layout.fields()[f].end(),
        None => 32 * keys.words.len() as u32,
    };
    let digit_start = 32 * w as u32 + 32 - hi;
    let bits = hi.min(16).min(usable_end.checked_sub(digit_start)?);
    if bits == 0 {
        return None;
    }
    let pass = RadixPass {
        word: w,
        shift: hi - bits,
        bits,
    };
    let words = &keys.words[w];
    let counts = words
        .par_chunks(1 << 16)
        .map(|c| {
            let mut h = vec![0usize; pass.buckets()];
            c.iter().for_each(|&x| h[pass.digit(x)] += 1);
            h
        })
        .reduce(
            || vec![0usize; pass.buckets()],
            |mut a, b| {
                a.iter_mut().zip(b).for_each(|(x, y)| *x += y);
                a
            },
        );
    let mut sum = 0;
    let cut = counts.iter().position(|&c| {
        sum += c;
        sum >= limit.max(1)
    })?;
    if sum > keys.num_rows / 2 {
        return None;
    }
    let rows: Vec<u32> = words
        .par_iter()
        .enumerate()
        .filter(|(_, x)| pass.digit(**x) <= cut)
        .map(|(i, _)| i as u32)
        .collect();
    Some(rows)
}

/// The columns the direct strategy moves, and their validity bits packed 32 columns to a
/// word that moves too.
#[derive(Default)]
struct DirectColumns {
    /// (column index, width) of each moved value column.
    columns: Vec<(usize, usize)>,
    /// Nullable moved columns, by column index; column `nullable[j]` has its validity in
    /// bit `j % 32` of validity word `j / 32`.
    nullable: Vec<usize>,
    /// What the sort moves: the value columns, then the validity words.
    lanes: Vec<(Buffer, usize)>,
    /// The same, sorted.
    sorted: Vec<Buffer>,
}

impl DirectColumns {
    fn new(batch: &RecordBatch) -> Self {
        let mut this = Self::default();
        for (c, col) in batch.columns().iter().enumerate() {
            if let Some(width) = fixed_width(col.data_type()) {
                this.columns.push((c, width));
                this.lanes.push((fixed_values(col.as_ref(), width), width));
                if col.null_count() > 0 {
                    this.nullable.push(c);
                }
            }
        }
        let n = batch.num_rows();
        for group in this.nullable.chunks(32) {
            let nulls: Vec<&NullBuffer> = group.iter().map(|&c| batch.column(c).nulls().unwrap()).collect();
            let mut words = vec![0u32; n];
            words.par_chunks_mut(1 << 14).enumerate().for_each(|(k, ws)| {
                for (i, w) in ws.iter_mut().enumerate() {
                    *w = validity_word(&nulls, k * (1 << 14) + i);
                }
            });
            this.lanes.push((Buffer::from_vec(words), 4));
        }
        this
    }

    /// Rebuilds the rows of `ranges` (reordered after the radix sort) from the input.
    fn reorder(&mut self, batch: &RecordBatch, perm: &[u32], ranges: &[std::ops::Range<usize>]) {
        if ranges.is_empty() {
            return;
        }
        let num_values = self.columns.len();
        for (k, buffer) in self.sorted.iter_mut().enumerate() {
            let mut owned = std::mem::take(buffer)
                .into_mutable()
                .unwrap_or_else(|shared| MutableBuffer::from(shared.as_slice().to_vec()));
            let dst = owned.as_slice_mut();
            if k < num_values {
                let (c, width) = self.columns[k];
                let src = fixed_values(batch.column(c).as_ref(), width);
                for r in ranges {
                    let part = gather_bytes(src.as_slice(), width, &perm[r.clone()]);
                    dst[r.start * width..r.end * width].copy_from_slice(part.as_slice());
                }
            } else {
                let j = k - num_values;
                let group = &self.nullable[32 * j..self.nullable.len().min(32 * (j + 1))];
                let nulls: Vec<&NullBuffer> = group.iter().map(|&c| batch.column(c).nulls().unwrap()).collect();
                for r in ranges {
                    for i in r.clone() {
                        let w = validity_word(&nulls, perm[i] as usize);
                        dst[4 * i..4 * i + 4].copy_from_slice(&w.to_ne_bytes());
                    }
                }
            }
            *buffer = owned.into();
        }
    }

    /// The sorted columns: `Some` for each moved column, `None` for the others.
    fn finish(self, batch: &RecordBatch, n: usize) -> Vec<Option<ArrayRef>> {
        let mut out: Vec<Option<ArrayRef>> = vec![None; batch.num_columns()];
        let mut sorted = self.sorted;
        let validity = sorted.split_off(self.columns.len());
        for ((c, _), values) in self.columns.iter().zip(sorted) {
            let nulls = self.nullable.iter().position(|x| x == c).map(|j| {
                let words: &[u32] = validity[j / 32].typed_data();
                NullBuffer::new(bits_of(words, (j % 32) as u32, n))
            });
            out[*c] = Some(fixed_array(batch.column(*c).as_ref(), values, nulls, n));
        }
        out
    }
}

/// Bit `k` of the validity word of `row`: bit `j` is column `nulls[j]`'s validity.
fn validity_word(nulls: &[&NullBuffer], row: usize) -> u32 {
    nulls
        .iter()
        .enumerate()
        .fold(0u32, |w, (j, n)| w | ((n.is_valid(row) as u32) << j))
}

/// Bit `bit` of each word, as a bitmap.
fn bits_of(words: &[u32], bit: u32, n: usize) -> BooleanBuffer {
    let mut out = vec![0u64; n.div_ceil(64)];
    out.par_iter_mut().enumerate().for_each(|(k, o)| {
        let start = 64 * k;
        let end = n.min(start + 64);
        *o = words[start..end]
            .iter()
            .enumerate()
            .fold(0u64, |acc, (b, w)| acc | ((((w >> bit) & 1) as u64) << b));
    });
    BooleanBuffer::new(Buffer::from_vec(out), 0, n)
}

/// A buffer of `bytes` bytes (64-byte aligned, as Arrow wants) for output that is written
/// whole before it is read: no pass over memory to zero it (fresh pages are faulted in by the
/// threads that write them).
pub fn uninit(bytes: usize) -> MutableBuffer {
    let mut b = MutableBuffer::with_capacity(bytes);
    advise_huge_pages(b.as_mut_ptr(), b.capacity());
    // SAFETY: u8 has no invalid values, and every caller writes all bytes before reading.
    unsafe { b.set_len(bytes) };
    b
}

/// Asks Linux to back a large buffer with transparent huge pages (where THP is in `madvise`
/// mode, as on the H100 machine): the first write to each 2 MiB then costs one page fault
/// instead of 512, which is most of the cost of filling fresh memory (a 16 GB output).
#[cfg(target_os = "linux")]
fn advise_huge_pages(ptr: *mut u8, len: usize) {
    const HUGE: usize = 2 << 20;
    if len < 4 * HUGE {
        return;
    }
    let start = (ptr as usize).next_multiple_of(HUGE);
    let end = (ptr as usize + len) / HUGE * HUGE;
    if end > start {
        // SAFETY: advice only, on whole pages inside the allocation; a refusal changes nothing.
        unsafe { libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_HUGEPAGE) };
    }
}

#[cfg(not(target_os = "linux"))]
fn advise_huge_pages(_ptr: *mut u8, _len: usize) {}

/// `0, 1, ..., n - 1`.
pub(crate) fn iota(n: usize) -> Vec<u32> {
    let mut v = vec![0u32; n];
    v.par_chunks_mut(1 << 16).enumerate().for_each(|(c, s)| {
        for (k, x) in s.iter_mut().enumerate() {
            *x = (c * (1 << 16) + k) as u32;
        }
    });
    v
}

#[cfg(test)]
mod tests;
