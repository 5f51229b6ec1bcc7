//! A stable, multi-threaded LSD radix sort over ByField key words.
//!
//! Each pass over a digit works like one pass of GRS (Bandyopadhyay & Sahni, section VI)
//! with a CPU thread in place of a thread block and a chunk of rows in place of a tile:
//!
//! 1. every chunk counts its digits (the tile histogram);
//! 2. an exclusive scan over (digit, chunk) gives each chunk its first output position
//!    per digit (the scan of tile histograms);
//! 3. every chunk walks its rows in order and writes each row at the next position of its
//!    digit: the key words still needed and the row index move in one fused loop, which
//!    also records each row's destination (its rank);
//! 4. with the **direct** strategy each payload column is then scattered by those
//!    destinations, one column at a time (one stream of writes per column keeps the
//!    writes cache-friendly however many columns there are).
//!
//! Chunks are processed in row order and rows within a chunk in order, so equal digits
//! keep their relative order: the sort is stable. Key words no later pass reads (and that
//! tie resolution does not need) stop moving.

use std::ops::Range;

use arrow::buffer::{Buffer, MutableBuffer};
use rayon::prelude::*;

use crate::plan::RadixPass;

/// Rows below which a pass runs on one thread.
const MIN_CHUNK_ROWS: usize = 1 << 15;

/// A raw pointer that may cross threads; users write disjoint positions.
#[derive(Clone, Copy)]
pub(crate) struct SyncPtr<T>(pub(crate) *mut T);
// SAFETY: users guarantee that threads write disjoint elements.
unsafe impl<T> Send for SyncPtr<T> {}
unsafe impl<T> Sync for SyncPtr<T> {}

/// The values of a fixed-width column, as they are now.
enum Values {
    /// The input buffer, not yet moved.
    Input(Buffer),
    /// A buffer the sort owns.
    Owned(MutableBuffer),
}

impl Values {
    fn bytes(&self) -> &[u8] {
        match self {
            Values::Input(b) => b.as_slice(),
            Values::Owned(b) => b.as_slice(),
        }
    }
}

/// A fixed-width column moved by the direct strategy: `width` bytes per row.
pub(crate) struct MovedColumn {
    width: usize,
    cur: Values,
    spare: Option<MutableBuffer>,
}

impl MovedColumn {
    /// A column over `values`, exactly `rows * width` bytes (already sliced to the rows).
    pub(crate) fn new(values: Buffer, width: usize) -> Self {
        debug_assert!(is_movable_width(width));
        Self {
            width,
            cur: Values::Input(values),
            spare: None,
        }
    }

    /// The values in their current order.
    pub(crate) fn into_buffer(self) -> Buffer {
        match self.cur {
            Values::Input(b) => b,
            Values::Owned(b) => b.into(),
        }
    }

    /// Bytes per row.
    pub(crate) fn width(&self) -> usize {
        self.width
    }

    /// Mutable bytes of the current values (copying the input first if it is not owned).
    pub(crate) fn bytes_mut(&mut self) -> &mut [u8] {
        if let Values::Input(b) = &self.cur {
            self.cur = Values::Owned(MutableBuffer::from(b.as_slice().to_vec()));
        }
        match &mut self.cur {
            Values::Owned(b) => b.as_slice_mut(),
            Values::Input(_) => unreachable!(),
        }
    }
}

/// Widths the sort moves directly (others are gathered at the end).
pub(crate) fn is_movable_width(width: usize) -> bool {
    matches!(width, 1 | 2 | 4 | 8 | 16 | 32)
}

/// Sorts rows by their keys and returns the permutation (sorted position -> input row).
///
/// `words` are the key words; a word is moved (left in sorted order) when a later pass
/// reads it, or when `keep_words` and it is not constant (`varying[w] != 0`). `payload`
/// columns move in every pass. `passes` come least significant first.
pub(crate) fn lsd_sort(
    num_rows: usize,
    words: &mut [Vec<u32>],
    varying: &[u32],
    keep_words: bool,
    passes: &[RadixPass],
    payload: &mut [MovedColumn],
) -> Vec<u32> {
    let n = num_rows;
    let mut index: Vec<u32> = iota(n);
    if passes.is_empty() || n <= 1 {
        return index;
    }
    let chunks = (n / MIN_CHUNK_ROWS).clamp(1, rayon::current_num_threads());
    let chunk_len = n.div_ceil(chunks);
    let chunk = |t: usize| t * chunk_len..n.min((t + 1) * chunk_len);

    let mut index_tmp: Vec<u32> = uninit_u32(n);
    let mut word_tmp: Vec<Option<Vec<u32>>> = (0..words.len()).map(|_| None).collect();
    let mut dest: Vec<u32> = if payload.is_empty() { vec![] } else { uninit_u32(n) };
    let mut offsets = vec![];

    for (p, pass) in passes.iter().enumerate() {
        let buckets = pass.buckets();
        // 1. Chunk histograms.
        offsets.clear();
        offsets.resize(chunks * buckets, 0u32);
        let digits = &words[pass.word];
        offsets.par_chunks_mut(buckets).enumerate().for_each(|(t, h)| {
            for &x in &digits[chunk(t)] {
                h[pass.digit(x)] += 1;
            }
        });
        // A digit equal in every row leaves the order as it is.
        if (0..buckets).any(|b| (0..chunks).map(|t| offsets[t * buckets + b] as usize).sum::<usize>() == n) {
            continue;
        }
        // 2. Exclusive scan, digit-major then chunk: stable positions.
        let mut sum = 0u32;
        for b in 0..buckets {
            for t in 0..chunks {
                let c = offsets[t * buckets + b];
                offsets[t * buckets + b] = sum;
                sum += c;
            }
        }
        // 3. Move the index and the key words still needed; record destinations.
        let moved: Vec<usize> = (0..words.len())
            .filter(|&w| varying[w] != 0 && (keep_words || passes[p + 1..].iter().any(|q| q.word == w)))
            .collect();
        for &w in &moved {
            word_tmp[w].get_or_insert_with(|| uninit_u32(n));
        }
        {
            let mut srcs: Vec<&[u32]> = vec![&index];
            let mut dsts: Vec<SyncPtr<u32>> = vec![SyncPtr(index_tmp.as_mut_ptr())];
            for &w in &moved {
                srcs.push(&words[w]);
            }
            for (w, tmp) in word_tmp.iter_mut().enumerate() {
                if moved.contains(&w) {
                    dsts.push(SyncPtr(tmp.as_mut().unwrap().as_mut_ptr()));
                }
            }
            let dest_ptr = (!dest.is_empty()).then(|| SyncPtr(dest.as_mut_ptr()));
            let digits = &words[pass.word];
            offsets.par_chunks_mut(buckets).enumerate().for_each(|(t, offs)| {
                // SAFETY: positions from the scan are a permutation of 0..n and each chunk
                // writes only its own positions; `dest` entries are the chunk's own rows.
                unsafe { scatter_u32(digits, *pass, &srcs, &dsts, offs, chunk(t), dest_ptr) }
            });
        }
        std::mem::swap(&mut index, &mut index_tmp);
        for &w in &moved {
            std::mem::swap(&mut words[w], word_tmp[w].as_mut().unwrap());
        }
        // 4. Direct strategy: scatter every payload column by the destinations.
        if !payload.is_empty() {
            let targets: Vec<MutableBuffer> = payload
                .iter_mut()
                .map(|c| c.spare.take().unwrap_or_else(|| MutableBuffer::from_len_zeroed(n * c.width)))
                .collect();
            let tasks: Vec<(usize, usize)> = (0..payload.len()).flat_map(|c| (0..chunks).map(move |t| (c, t))).collect();
            let dst_ptrs: Vec<SyncPtr<u8>> = targets.iter().map(|b| SyncPtr(b.as_ptr() as *mut u8)).collect();
            let dest = &dest;
            tasks.par_iter().for_each(|&(c, t)| {
                let col = &payload[c];
                // SAFETY: destinations are a permutation of 0..n, chunks are disjoint, and
                // each target holds n * width bytes.
                unsafe { scatter_column(col.cur.bytes(), dst_ptrs[c].0, col.width, dest, chunk(t)) }
            });
            for (c, target) in payload.iter_mut().zip(targets) {
                if let Values::Owned(old) = std::mem::replace(&mut c.cur, Values::Owned(target)) {
                    c.spare = Some(old);
                }
            }
        }
    }
    index
}

/// `0, 1, ..., n - 1`.
pub(crate) fn iota(n: usize) -> Vec<u32> {
    let mut v = uninit_u32(n);
    v.par_chunks_mut(1 << 16).enumerate().for_each(|(c, s)| {
        for (k, x) in s.iter_mut().enumerate() {
            *x = (c * (1 << 16) + k) as u32;
        }
    });
    v
}

/// A vector of `n` u32 whose contents will all be overwritten.
fn uninit_u32(n: usize) -> Vec<u32> {
    // Zeroed allocations of this size come as fresh pages, without a pass over memory.
    vec![0u32; n]
}

/// The fused move of a pass for one chunk.
///
/// # Safety
/// Each `dsts[k]` holds `digits.len()` elements; the positions taken from `offs` are
/// written by this chunk only; `dest` (if any) holds `digits.len()` elements.
#[inline(never)]
unsafe fn scatter_u32(
    digits: &[u32],
    pass: RadixPass,
    srcs: &[&[u32]],
    dsts: &[SyncPtr<u32>],
    offs: &mut [u32],
    rows: Range<usize>,
    dest: Option<SyncPtr<u32>>,
) {
    macro_rules! fused {
        ($k:literal) => {{
            let s: [&[u32]; $k] = std::array::from_fn(|j| srcs[j]);
            let d: [*mut u32; $k] = std::array::from_fn(|j| dsts[j].0);
            for i in rows {
                // SAFETY: the caller's contract.
                unsafe {
                    let b = pass.digit(*digits.get_unchecked(i));
                    let pos = *offs.get_unchecked(b);
                    *offs.get_unchecked_mut(b) = pos + 1;
                    for j in 0..$k {
                        *d[j].add(pos as usize) = *s[j].get_unchecked(i);
                    }
                    if let Some(dp) = dest {
                        *dp.0.add(i) = pos;
                    }
                }
            }
        }};
    }
    match srcs.len() {
        1 => fused!(1),
        2 => fused!(2),
        3 => fused!(3),
        4 => fused!(4),
        _ => {
            for i in rows {
                // SAFETY: the caller's contract.
                unsafe {
                    let b = pass.digit(*digits.get_unchecked(i));
                    let pos = *offs.get_unchecked(b);
                    *offs.get_unchecked_mut(b) = pos + 1;
                    for (s, d) in srcs.iter().zip(dsts) {
                        *d.0.add(pos as usize) = *s.get_unchecked(i);
                    }
                    if let Some(dp) = dest {
                        *dp.0.add(i) = pos;
                    }
                }
            }
        }
    }
}

/// Scatters rows `rows` of a `width`-byte column to `dst` by `dest`.
///
/// # Safety
/// `dst` holds `dest.len() * width` bytes and no other thread writes the targets of `rows`.
unsafe fn scatter_column(src: &[u8], dst: *mut u8, width: usize, dest: &[u32], rows: Range<usize>) {
    unsafe fn go<const W: usize>(src: &[u8], dst: *mut u8, dest: &[u32], rows: Range<usize>) {
        // SAFETY: [u8; W] has alignment 1; lengths per the caller's contract.
        unsafe {
            let src = std::slice::from_raw_parts(src.as_ptr() as *const [u8; W], src.len() / W);
            let dst = dst as *mut [u8; W];
            for i in rows {
                *dst.add(*dest.get_unchecked(i) as usize) = *src.get_unchecked(i);
            }
        }
    }
    // SAFETY: forwarded contract.
    unsafe {
        match width {
            1 => go::<1>(src, dst, dest, rows),
            2 => go::<2>(src, dst, dest, rows),
            4 => go::<4>(src, dst, dest, rows),
            8 => go::<8>(src, dst, dest, rows),
            16 => go::<16>(src, dst, dest, rows),
            32 => go::<32>(src, dst, dest, rows),
            _ => unreachable!("unsupported width {width}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::{radix_passes, varying_bits};
    use rand::{Rng, SeedableRng, rngs::SmallRng};

    fn check(keys: Vec<Vec<u32>>, digit_bits: u32, with_payload: bool) {
        let n = keys.first().map_or(0, |w| w.len());
        let mut words = keys.clone();
        let varying = varying_bits(&words);
        let passes = radix_passes(&varying, digit_bits);
        let payload_vals: Vec<u64> = (0..n as u64).map(|i| i * 3 + 1).collect();
        let mut payload = if with_payload {
            vec![MovedColumn::new(Buffer::from_vec(payload_vals.clone()), 8)]
        } else {
            vec![]
        };
        let perm = lsd_sort(n, &mut words, &varying, true, &passes, &mut payload);
        let mut expected: Vec<u32> = (0..n as u32).collect();
        expected.sort_by_key(|&i| keys.iter().map(|w| w[i as usize]).collect::<Vec<_>>());
        assert_eq!(perm, expected);
        for (w, sorted) in words.iter().enumerate() {
            if varying[w] != 0 {
                let want: Vec<u32> = perm.iter().map(|&i| keys[w][i as usize]).collect();
                assert_eq!(sorted, &want);
            }
        }
        if let Some(col) = payload.pop() {
            let buf = col.into_buffer();
            let got: &[u64] = buf.typed_data();
            let want: Vec<u64> = perm.iter().map(|&i| payload_vals[i as usize]).collect();
            assert_eq!(got, &want[..]);
        }
    }

    #[test]
    fn sorts_stably_across_sizes_and_digits() {
        let mut rng = SmallRng::seed_from_u64(7);
        for n in [0usize, 1, 2, 3, 1000, MIN_CHUNK_ROWS - 1, MIN_CHUNK_ROWS + 1, 3 * MIN_CHUNK_ROWS + 5] {
            for digit_bits in [1, 4, 8, 11, 16] {
                for distinct in [1u32, 2, 100, u32::MAX] {
                    let w0: Vec<u32> = (0..n).map(|_| rng.random_range(0..=distinct.min(7))).collect();
                    let w1: Vec<u32> = (0..n).map(|_| rng.random::<u32>() % distinct.max(1)).collect();
                    check(vec![w1.clone()], digit_bits, digit_bits == 8);
                    check(vec![w0, w1], digit_bits, digit_bits != 8);
                }
            }
        }
    }

    #[test]
    fn sorted_and_reversed_inputs() {
        let n = 100_000u32;
        check(vec![(0..n).collect()], 8, true);
        check(vec![(0..n).rev().collect()], 8, true);
        check(vec![(0..n).map(|i| i % 2).collect()], 8, true);
    }
}
