//! A stable, multi-threaded radix sort over ByField key words: most-significant-digit
//! passes over memory until buckets fit in cache, then a least-significant-digit sort of
//! each bucket in per-thread scratch.
//!
//! Every column the sort moves is a **lane** of fixed-width rows: the key words, the row
//! index (which becomes the permutation), and, with the **direct** strategy, every
//! fixed-width payload column. Payload lanes are read in place from their input.
//!
//! A **pass** over rows by one digit works like a pass of GRS (Bandyopadhyay & Sahni,
//! section VI) with a chunk of rows in place of a tile: each chunk counts its digits (the
//! tile histogram), an exclusive scan over (digit, chunk) gives each chunk its first output
//! position per digit, then each chunk walks its rows in order and writes each row at the
//! next position of its digit. Key words and the index move in one fused loop that also
//! records each row's destination (its rank); payload lanes are then scattered by those
//! destinations one column at a time. Chunks go in row order and rows in order within a
//! chunk, so a pass is stable.
//!
//! The sort of a range of rows:
//! - longer than the **local size** (rows whose lanes fit in about a megabyte): one pass by
//!   the most significant varying digit, in parallel chunks, wide enough that buckets come
//!   out about half the local size; then each bucket is sorted the same way, buckets in
//!   parallel;
//! - up to the local size: LSD passes over the bits that vary **within the range**, least
//!   significant first, on one thread, ping-ponging through that thread's scratch and
//!   landing back in the range;
//! - up to [`SMALL_ROWS`]: a comparison sort of the keys, then one gather per lane.
//!
//! Memory is touched once per lane for the sorted result (plus the destinations array), so
//! little time goes to faulting in fresh pages. Key words no later pass reads stop moving,
//! unless tie resolution needs them sorted (`keep_words`).

use std::ops::Range;
use std::sync::Mutex;

use arrow::buffer::{Buffer, MutableBuffer};
use rayon::prelude::*;

use super::uninit;
use crate::plan::{RadixPass, radix_passes};

/// Bytes of lane data a local sort works on (per buffer).
const LOCAL_BYTES: usize = 1 << 20;
/// Ranges at most this long are sorted by comparison.
const SMALL_ROWS: usize = 32;
/// Local ranges whose key has more varying digits than this are partitioned MSD first.
const MAX_LOCAL_LSD_PASSES: usize = 3;
/// Widest most-significant digit (4096 buckets).
const MAX_MSD_BITS: u32 = 12;
/// Rows per parallel chunk of a pass, at least.
const MIN_CHUNK_ROWS: usize = 1 << 15;

/// A raw pointer that may cross threads; users touch disjoint rows.
#[derive(Clone, Copy, Debug)]
struct Ptr(*mut u8);
// SAFETY: users guarantee that threads touch disjoint rows.
unsafe impl Send for Ptr {}
unsafe impl Sync for Ptr {}

impl Ptr {
    /// The pointer `rows` rows of `width` bytes further.
    fn at(self, rows: usize, width: usize) -> Ptr {
        // SAFETY: callers stay within the lane's allocation.
        Ptr(unsafe { self.0.add(rows * width) })
    }
}

/// Where a lane's rows are: its sort buffer, or the read-only input.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Loc {
    Input,
    Buf,
}

/// Widths the sort moves directly (others are gathered at the end).
pub(crate) fn is_movable_width(width: usize) -> bool {
    matches!(width, 1 | 2 | 4 | 8 | 16 | 32)
}

/// The sorted data: the permutation, and the key words and payload columns in sorted
/// order.
pub(crate) struct Sorted {
    /// Sorted position -> input row.
    pub(crate) perm: Buffer,
    /// Key words in sorted order; only words that vary, and only with `keep_words` (others
    /// are left in an unspecified order).
    pub(crate) words: Vec<Buffer>,
    /// The payload columns in sorted order.
    pub(crate) payload: Vec<Buffer>,
    /// Digits over the key's varying bits (what a plain LSD sort runs as passes).
    pub(crate) digits: usize,
}

impl Sorted {
    /// The permutation.
    pub(crate) fn perm(&self) -> &[u32] {
        self.perm.typed_data()
    }
}

/// Sorts `n` rows by their key `words` (ByField, word 0 most significant), moving the
/// `payload` columns (`(values, width)`, `n` rows each) with them.
pub(crate) fn radix_sort(
    n: usize,
    words: Vec<Vec<u32>>,
    keep_words: bool,
    digit_bits: u32,
    payload: Vec<(Buffer, usize)>,
) -> Sorted {
    let varying = crate::plan::varying_bits(&words);
    let digits = radix_passes(&varying, digit_bits).len();
    let num_words = words.len();
    // Every lane starts at its input (the key words, the index, the payload values); the
    // first pass writes it into a buffer of its own, which ends up holding the result.
    let mut inputs: Vec<Buffer> = words.into_iter().map(Buffer::from_vec).collect();
    inputs.push(Buffer::from_vec(super::iota(n)));
    let mut widths: Vec<usize> = vec![4; num_words + 1];
    for (values, width) in payload {
        debug_assert!(is_movable_width(width) && values.len() == n * width);
        inputs.push(values);
        widths.push(width);
    }
    let sorts = n > 1 && varying.iter().any(|&v| v != 0);
    let moves = |k: usize| sorts && (k >= num_words || varying[k] != 0);
    let mut bufs: Vec<MutableBuffer> = widths
        .iter()
        .enumerate()
        .map(|(k, w)| if moves(k) { uninit(n * w) } else { MutableBuffer::new(0) })
        .collect();
    let mut loc: Vec<Loc> = vec![Loc::Input; widths.len()];
    if sorts {
        let row_bytes: usize = widths.iter().sum::<usize>() + 4;
        let local_rows = (LOCAL_BYTES / row_bytes).max(2 * SMALL_ROWS);
        let has_payload = widths.len() > num_words + 1;
        let mut dest = if has_payload { vec![0u32; n] } else { vec![] };
        let mut sorter = Sorter {
            widths,
            bufs: bufs.iter_mut().map(|b| Ptr(b.as_mut_ptr())).collect(),
            inputs: inputs.iter().map(|b| Ptr(b.as_ptr() as *mut u8)).collect(),
            num_words,
            global_varying: varying.clone(),
            keep_words,
            digit_bits,
            local_rows,
            dest: Ptr(dest.as_mut_ptr() as *mut u8),
            has_payload,
            scratch: vec![],
        };
        sorter.scratch = (0..=rayon::current_num_threads())
            .map(|_| Mutex::new(Scratch::default()))
            .collect();
        loc = sorter.sort_range(0..n, &loc, &varying);
    }
    let mut out: Vec<Buffer> = inputs
        .into_iter()
        .zip(bufs)
        .zip(&loc)
        .map(|((input, buf), l)| match l {
            Loc::Input => input,
            Loc::Buf => buf.into(),
        })
        .collect();
    let payload = out.split_off(num_words + 1);
    let perm = out.pop().unwrap();
    Sorted {
        perm,
        words: out,
        payload,
        digits,
    }
}

/// A thread's scratch for local sorts: two buffers per lane and the destinations.
#[derive(Default)]
struct Scratch {
    lanes: [Vec<Vec<u8>>; 2],
    dest: Vec<u32>,
}

impl Scratch {
    fn ensure(&mut self, widths: &[usize], rows: usize) {
        for side in &mut self.lanes {
            side.resize_with(widths.len(), Vec::new);
            for (buf, w) in side.iter_mut().zip(widths) {
                if buf.len() < rows * w {
                    buf.resize(rows * w, 0);
                }
            }
        }
        if self.dest.len() < rows {
            self.dest.resize(rows, 0);
        }
    }
}

/// Where a lane's rows are during local LSD passes.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Place {
    Global(Loc),
    Scratch(usize),
}

/// A thread's scratch during a local sort: two row-0 pointers per lane, and destinations.
struct Local {
    sides: [Vec<Ptr>; 2],
    dest: Ptr,
}

struct Sorter {
    widths: Vec<usize>,
    bufs: Vec<Ptr>,
    inputs: Vec<Ptr>,
    num_words: usize,
    global_varying: Vec<u32>,
    keep_words: bool,
    digit_bits: u32,
    local_rows: usize,
    dest: Ptr,
    has_payload: bool,
    scratch: Vec<Mutex<Scratch>>,
}

impl Sorter {
    fn num_lanes(&self) -> usize {
        self.widths.len()
    }

    /// Row 0 of lane `k` at `loc`.
    fn base(&self, k: usize, loc: Loc) -> Ptr {
        match loc {
            Loc::Buf => self.bufs[k],
            Loc::Input => self.inputs[k],
        }
    }

    /// Lanes that have a buffer: the index, the payload and the varying key words.
    fn moves_at_all(&self, k: usize) -> bool {
        k >= self.num_words || self.global_varying[k] != 0
    }

    /// Lanes a local step over a range with key bits `varying` moves: the index, the
    /// payload, the words that vary in the range, and kept words.
    fn carried(&self, k: usize, varying: &[u32]) -> bool {
        k >= self.num_words || varying[k] != 0 || (self.keep_words && self.global_varying[k] != 0)
    }

    /// Lanes whose sorted rows are needed at the end.
    fn needed(&self, k: usize) -> bool {
        k >= self.num_words || (self.keep_words && self.global_varying[k] != 0)
    }

    /// Sorts rows `r`, whose lanes are at `loc`; `varying` are the key bits that vary
    /// within `r`. Needed lanes end in their buffers. Returns where the lanes are.
    fn sort_range(&self, r: Range<usize>, loc: &[Loc], varying: &[u32]) -> Vec<Loc> {
        let len = r.len();
        if len <= 1 || varying.iter().all(|&v| v == 0) {
            return loc.to_vec();
        }
        // Buckets aim at half the local size; ones up to a few times larger (the top word
        // had too few varying bits for a wider digit) still sort locally.
        if len <= 4 * self.local_rows {
            return self.local_sort(r, loc, varying);
        }
        // One pass by the most significant varying digit, wide enough that buckets come
        // out at about half the local size; it continues into the next word when the top
        // word has too few varying bits.
        let w = varying.iter().position(|&v| v != 0).unwrap();
        let hi = 32 - varying[w].leading_zeros();
        let want = (2 * len)
            .div_ceil(self.local_rows)
            .next_power_of_two()
            .trailing_zeros()
            .max(1);
        let next = varying[w + 1..].iter().any(|&v| v != 0) as u32;
        let available = if next == 1 {
            hi + 32
        } else {
            hi - varying[w].trailing_zeros()
        };
        let bits = available.min(want).min(MAX_MSD_BITS);
        // Every varying word moves: the buckets' sorts read them.
        let moved: Vec<(usize, Ptr, Ptr)> = (0..self.num_lanes())
            .filter(|&k| k >= self.num_words || varying[k] != 0)
            .map(|k| {
                let from = self.base(k, loc[k]).at(r.start, self.widths[k]);
                let to = self.bufs[k].at(r.start, self.widths[k]);
                (k, from, to)
            })
            .collect();
        let in_buf: Vec<usize> = moved
            .iter()
            .filter(|(k, ..)| loc[*k] == Loc::Buf)
            .map(|m| m.0)
            .collect();
        // Lanes already in their buffers go through a spare buffer for this pass.
        let mut spare: Vec<(usize, MutableBuffer)> =
            in_buf.iter().map(|&k| (k, uninit(len * self.widths[k]))).collect();
        let io: Vec<LaneIo> = moved
            .iter()
            .map(|&(k, from, to)| {
                let to = match spare.iter_mut().find(|s| s.0 == k) {
                    Some((_, b)) => Ptr(b.as_mut_ptr()),
                    None => to,
                };
                LaneIo {
                    lane: k,
                    src: from,
                    dst: to,
                    width: self.widths[k],
                }
            })
            .collect();
        let chunks = (len / MIN_CHUNK_ROWS).clamp(1, rayon::current_num_threads());
        let (digits, pass, _digit_buf) = if bits <= hi {
            let pass = RadixPass {
                word: w,
                shift: hi - bits,
                bits,
            };
            (self.base(w, loc[w]).at(r.start, 4), pass, None)
        } else {
            // The top `bits` bits of words w and w + 1 from bit `hi` of word w down, computed
            // once: into the destinations array (each row's digit is read before its
            // destination is written), or a buffer of their own without payload.
            let (hi_word, lo_word) = (
                self.base(w, loc[w]).at(r.start, 4),
                self.base(w + 1, loc[w + 1]).at(r.start, 4),
            );
            let mut own = (!self.has_payload).then(|| uninit(len * 4));
            let out = match &mut own {
                Some(b) => Ptr(b.as_mut_ptr()),
                None => self.dest.at(r.start, 4),
            };
            let shift = 32 + hi - bits;
            // SAFETY: rows of the range in the lanes and in the digit buffer.
            let (a, b, d) = unsafe {
                (
                    std::slice::from_raw_parts(hi_word.0 as *const u32, len),
                    std::slice::from_raw_parts(lo_word.0 as *const u32, len),
                    std::slice::from_raw_parts_mut(out.0 as *mut u32, len),
                )
            };
            d.par_chunks_mut(MIN_CHUNK_ROWS).enumerate().for_each(|(c, d)| {
                let base = c * MIN_CHUNK_ROWS;
                for (j, x) in d.iter_mut().enumerate() {
                    let v = ((a[base + j] as u64) << 32) | b[base + j] as u64;
                    *x = ((v >> shift) & ((1u64 << bits) - 1)) as u32;
                }
            });
            let pass = RadixPass {
                word: w,
                shift: 0,
                bits,
            };
            (out, pass, own)
        };
        // SAFETY: every lane pointer covers `len` rows of the range; the destinations
        // array covers all rows.
        let starts = unsafe { pass_rows(len, digits, pass, &io, self.dest.at(r.start, 4), self.num_words, chunks) };
        let Some(starts) = starts else {
            return loc.to_vec(); // cannot happen: the digit varies
        };
        // Lanes that went to a spare buffer come back to theirs (one copy of the range).
        for (k, b) in &spare {
            let dst = self.bufs[*k].at(r.start, self.widths[*k]);
            // SAFETY: the range's rows of the lane buffer; the spare holds them.
            unsafe { std::ptr::copy_nonoverlapping(b.as_ptr(), dst.0, len * self.widths[*k]) };
        }
        drop(spare);
        let mut after = loc.to_vec();
        for (k, ..) in &moved {
            after[*k] = Loc::Buf;
        }
        let buckets: Vec<Range<usize>> = starts
            .windows(2)
            .map(|s| r.start + s[0]..r.start + s[1])
            .filter(|b| b.len() > 1)
            .collect();
        buckets.into_par_iter().for_each(|b| {
            let v = self.varying(b.clone(), &after);
            self.sort_range(b, &after, &v);
        });
        after
    }

    /// Sorts a range of at most the local size on this thread, ending with the lanes in
    /// their buffers.
    fn local_sort(&self, r: Range<usize>, loc: &[Loc], varying: &[u32]) -> Vec<Loc> {
        let slot = rayon::current_thread_index().unwrap_or(self.scratch.len() - 1);
        let mut scratch = self.scratch[slot].lock().unwrap();
        scratch.ensure(&self.widths, r.len());
        let scratch = Local {
            sides: [0, 1].map(|s| scratch.lanes[s].iter_mut().map(|b| Ptr(b.as_mut_ptr())).collect()),
            dest: Ptr(scratch.dest.as_mut_ptr() as *mut u8),
        };
        // Lanes still at their input (a small top-level sort) first come to their buffers.
        for k in (0..self.num_lanes()).filter(|&k| loc[k] == Loc::Input && self.moves_at_all(k)) {
            self.copy_range(k, r.clone(), self.base(k, Loc::Input), self.base(k, Loc::Buf));
        }
        self.local_range(r, varying, &scratch);
        (0..self.num_lanes())
            .map(|k| if self.moves_at_all(k) { Loc::Buf } else { loc[k] })
            .collect()
    }

    /// Sorts rows `r` (in the lanes' buffers) through `scratch`: LSD passes when the key
    /// has few varying digits, else an MSD partition and a sort of each bucket.
    fn local_range(&self, r: Range<usize>, varying: &[u32], scratch: &Local) {
        let len = r.len();
        if len <= 1 || varying.iter().all(|&v| v == 0) {
            return;
        }
        if len <= SMALL_ROWS {
            return self.small_sort(r, varying, scratch);
        }
        let passes = radix_passes(varying, self.digit_bits);
        if passes.len() <= MAX_LOCAL_LSD_PASSES {
            return self.local_lsd(r, &passes, scratch);
        }
        // MSD partition by the top varying digit into the scratch, and back.
        let w = varying.iter().position(|&v| v != 0).unwrap();
        let hi = 32 - varying[w].leading_zeros();
        let bits = (hi - varying[w].trailing_zeros()).min(self.digit_bits).min(8);
        let pass = RadixPass {
            word: w,
            shift: hi - bits,
            bits,
        };
        let io: Vec<LaneIo> = (0..self.num_lanes())
            .filter(|&k| self.carried(k, varying))
            .map(|k| LaneIo {
                lane: k,
                src: self.home(k, r.start),
                dst: scratch.sides[0][k],
                width: self.widths[k],
            })
            .collect();
        // SAFETY: home and scratch cover the range's rows; the scratch destinations too.
        let starts = unsafe { pass_rows(len, self.home(w, r.start), pass, &io, scratch.dest, self.num_words, 1) };
        let starts = starts.expect("the top varying digit varies");
        for l in &io {
            // SAFETY: the range's rows, scratch to home.
            unsafe { std::ptr::copy_nonoverlapping(l.dst.0, l.src.0, len * l.width) };
        }
        for b in starts.windows(2) {
            if b[1] - b[0] > 1 {
                let sub = r.start + b[0]..r.start + b[1];
                let v = self.varying(sub.clone(), &vec![Loc::Buf; self.num_lanes()]);
                self.local_range(sub, &v, scratch);
            }
        }
    }

    /// LSD passes over rows `r`, ping-ponging through the scratch and landing home.
    fn local_lsd(&self, r: Range<usize>, passes: &[RadixPass], scratch: &Local) {
        let len = r.len();
        let home = Place::Global(Loc::Buf);
        let ptr_of = |k: usize, p: Place| match p {
            Place::Global(_) => self.home(k, r.start),
            Place::Scratch(side) => scratch.sides[side][k],
        };
        let mut place: Vec<Place> = vec![home; self.num_lanes()];
        // The passes each lane moves in: every pass for the index, the payload and kept
        // words; for other key words, until the last pass that reads them.
        let moves = |k: usize, p: usize| {
            k >= self.num_words
                || (self.keep_words && self.global_varying[k] != 0)
                || passes[p + 1..].iter().any(|q| q.word == k)
        };
        for (p, pass) in passes.iter().enumerate() {
            let digits = ptr_of(pass.word, place[pass.word]);
            let io: Vec<LaneIo> = (0..self.num_lanes())
                .filter(|&k| moves(k, p))
                .map(|k| {
                    let last = !(p + 1..passes.len()).any(|q| moves(k, q));
                    // A needed lane's last move lands home, unless it starts there.
                    let to = match place[k] {
                        Place::Scratch(_) if last && self.needed(k) => home,
                        Place::Scratch(side) => Place::Scratch(1 - side),
                        Place::Global(_) => Place::Scratch(0),
                    };
                    let io = LaneIo {
                        lane: k,
                        src: ptr_of(k, place[k]),
                        dst: ptr_of(k, to),
                        width: self.widths[k],
                    };
                    place[k] = to;
                    io
                })
                .collect();
            // SAFETY: every pointer covers the range's `len` rows; sources and destinations
            // are distinct buffers; the scratch destinations hold `len`.
            let moved = unsafe { pass_rows(len, digits, *pass, &io, scratch.dest, self.num_words, 1) };
            debug_assert!(moved.is_some(), "local passes only cover varying digits");
        }
        for k in (0..self.num_lanes()).filter(|&k| self.needed(k)) {
            if place[k] != home {
                let (src, dst) = (ptr_of(k, place[k]), ptr_of(k, home));
                // SAFETY: the range's rows in two distinct buffers.
                unsafe { std::ptr::copy_nonoverlapping(src.0, dst.0, len * self.widths[k]) };
            }
        }
    }

    /// A comparison sort of a few rows: order by the key words (then position), gather each
    /// lane into the scratch, and copy it home.
    fn small_sort(&self, r: Range<usize>, varying: &[u32], scratch: &Local) {
        let order = self.small_order(r.clone(), varying);
        for k in (0..self.num_lanes()).filter(|&k| self.carried(k, varying)) {
            let width = self.widths[k];
            let (src, tmp) = (self.home(k, r.start), scratch.sides[0][k]);
            // SAFETY: rows of the range in two distinct buffers.
            unsafe {
                gather_rows(src.0, tmp.0, width, &order);
                // A few rows: a plain loop beats a call to memcpy.
                for b in 0..r.len() * width {
                    *src.0.add(b) = *tmp.0.add(b);
                }
            }
        }
    }

    /// Row `row` of lane `k` in its buffer.
    fn home(&self, k: usize, row: usize) -> Ptr {
        self.bufs[k].at(row, self.widths[k])
    }

    /// Copies rows `r` of lane `k` between two distinct buffers (row 0 pointers).
    fn copy_range(&self, k: usize, r: Range<usize>, from: Ptr, to: Ptr) {
        let w = self.widths[k];
        // SAFETY: both buffers hold the range's rows and do not overlap.
        unsafe { std::ptr::copy_nonoverlapping(from.0.add(r.start * w), to.0.add(r.start * w), r.len() * w) };
    }

    /// The sorted order of the few rows of `r`: by key words, then position.
    fn small_order(&self, r: Range<usize>, varying: &[u32]) -> Vec<u32> {
        let words: Vec<*const u32> = (0..self.num_words)
            .filter(|&w| varying[w] != 0)
            .map(|w| self.home(w, r.start).0 as *const u32)
            .collect();
        // SAFETY: i is a row of the range.
        let key = |i: u32, w: *const u32| unsafe { *w.add(i as usize) };
        let mut order: Vec<u32> = (0..r.len() as u32).collect();
        order.sort_by(|&a, &b| {
            words
                .iter()
                .map(|&w| key(a, w).cmp(&key(b, w)))
                .find(|o| o.is_ne())
                .unwrap_or(a.cmp(&b))
        });
        order
    }

    /// Key bits that vary within `r`.
    fn varying(&self, r: Range<usize>, loc: &[Loc]) -> Vec<u32> {
        (0..self.num_words)
            .map(|w| {
                if self.global_varying[w] == 0 {
                    return 0;
                }
                // SAFETY: rows of the range; the lane holds n rows of 4 bytes.
                let s =
                    unsafe { std::slice::from_raw_parts(self.base(w, loc[w]).at(r.start, 4).0 as *const u32, r.len()) };
                let first = s[0];
                if s.len() > 4 * MIN_CHUNK_ROWS {
                    s.par_chunks(MIN_CHUNK_ROWS)
                        .map(|c| or_diff(c, first))
                        .reduce(|| 0, |a, b| a | b)
                } else {
                    or_diff(s, first)
                }
            })
            .collect()
    }
}

/// A lane moved by a pass: row 0 of its source and destination.
#[derive(Clone, Copy, Debug)]
struct LaneIo {
    lane: usize,
    src: Ptr,
    dst: Ptr,
    width: usize,
}

/// Moves `len` rows of the lanes in `io` by `pass`, in `chunks` parallel chunks: key words
/// and the index (lanes `0..=num_words`) in one fused loop, payload lanes by destination.
/// Returns the bucket boundaries relative to row 0 (`buckets + 1` of them), or `None`, and
/// moves nothing, when the digit is equal in every row.
///
/// # Safety
/// Every pointer covers `len` rows of its lane's width, sources and destinations do not
/// overlap, and `dest` covers `len` entries of 4 bytes.
unsafe fn pass_rows(
    len: usize,
    digits: Ptr,
    pass: RadixPass,
    io: &[LaneIo],
    dest: Ptr,
    num_words: usize,
    chunks: usize,
) -> Option<Vec<usize>> {
    let buckets = pass.buckets();
    let chunk_len = len.div_ceil(chunks);
    let chunk = |t: usize| t * chunk_len..len.min((t + 1) * chunk_len);
    // SAFETY: the caller's contract.
    let digits = unsafe { std::slice::from_raw_parts(digits.0 as *const u32, len) };
    // 1. Chunk histograms.
    let mut offsets = vec![0u32; chunks * buckets];
    let count = |t: usize, h: &mut [u32]| {
        for &x in &digits[chunk(t)] {
            h[pass.digit(x)] += 1;
        }
    };
    if chunks == 1 {
        count(0, &mut offsets);
    } else {
        offsets
            .par_chunks_mut(buckets)
            .enumerate()
            .for_each(|(t, h)| count(t, h));
    }
    // 2. Exclusive scan, digit-major then chunk.
    let mut starts = Vec::with_capacity(buckets + 1);
    let mut sum = 0u32;
    for b in 0..buckets {
        starts.push(sum as usize);
        for t in 0..chunks {
            let c = offsets[t * buckets + b];
            offsets[t * buckets + b] = sum;
            sum += c;
        }
    }
    starts.push(len);
    if starts.windows(2).any(|s| s[1] - s[0] == len) {
        return None;
    }
    // 3. The fused move of key words and index, recording destinations for the payload.
    let fused: Vec<(Ptr, Ptr)> = io
        .iter()
        .filter(|l| l.lane <= num_words)
        .map(|l| (l.src, l.dst))
        .collect();
    let payload: Vec<LaneIo> = io.iter().copied().filter(|l| l.lane > num_words).collect();
    let dest_ptr = (!payload.is_empty()).then_some(dest);
    // The digits may share memory with the destinations (each row's digit is read before
    // its destination is written), so the scatter reads them through a raw pointer.
    let digits = Ptr(digits.as_ptr() as *mut u8);
    let scatter = |t: usize, offs: &mut [u32]| {
        // SAFETY: scan positions are a permutation of 0..len; each chunk writes only its own
        // positions and the destinations of its own rows.
        unsafe { scatter_u32(digits, pass, &fused, offs, chunk(t), dest_ptr) }
    };
    if chunks == 1 {
        scatter(0, &mut offsets);
    } else {
        offsets
            .par_chunks_mut(buckets)
            .enumerate()
            .for_each(|(t, o)| scatter(t, o));
    }
    // 4. Payload lanes by the destinations, a column at a time.
    if !payload.is_empty() {
        // SAFETY: the caller's contract; the fused loop wrote all `len` destinations.
        let dest = unsafe { std::slice::from_raw_parts(dest.0 as *const u32, len) };
        let move_lane = |l: &LaneIo, rows: Range<usize>| {
            // SAFETY: destinations of `rows` are distinct rows of the lane.
            unsafe { scatter_rows(l.src.0, l.dst.0, l.width, dest, rows) }
        };
        if chunks == 1 {
            payload.iter().for_each(|l| move_lane(l, 0..len));
        } else {
            let tasks: Vec<(usize, usize)> = (0..payload.len())
                .flat_map(|p| (0..chunks).map(move |t| (p, t)))
                .collect();
            tasks
                .into_par_iter()
                .for_each(|(p, t)| move_lane(&payload[p], chunk(t)));
        }
    }
    Some(starts)
}

/// The bits in which some element of `s` differs from `first`.
fn or_diff(s: &[u32], first: u32) -> u32 {
    s.iter().fold(0u32, |acc, &x| acc | (x ^ first))
}

/// The fused move of a pass for one chunk: every `(src, dst)` lane of 4-byte rows moves
/// row `i` to the next position of its digit.
///
/// # Safety
/// `digits` and the lanes hold all rows; the positions taken from `offs` are written by
/// this chunk only; `dest` (if any) holds all rows, and may be `digits` itself.
#[inline(never)]
unsafe fn scatter_u32(
    digits: Ptr,
    pass: RadixPass,
    lanes: &[(Ptr, Ptr)],
    offs: &mut [u32],
    rows: Range<usize>,
    dest: Option<Ptr>,
) {
    let digits = digits.0 as *const u32;
    macro_rules! fused {
        ($k:literal) => {{
            let s: [*const u32; $k] = std::array::from_fn(|j| lanes[j].0.0 as *const u32);
            let d: [*mut u32; $k] = std::array::from_fn(|j| lanes[j].1.0 as *mut u32);
            let dest = dest.map(|p| p.0 as *mut u32);
            for i in rows {
                // SAFETY: the caller's contract.
                unsafe {
                    let b = pass.digit(*digits.add(i));
                    let pos = *offs.get_unchecked(b);
                    *offs.get_unchecked_mut(b) = pos + 1;
                    for j in 0..$k {
                        *d[j].add(pos as usize) = *s[j].add(i);
                    }
                    if let Some(dp) = dest {
                        *dp.add(i) = pos;
                    }
                }
            }
        }};
    }
    match lanes.len() {
        1 => fused!(1),
        2 => fused!(2),
        3 => fused!(3),
        4 => fused!(4),
        5 => fused!(5),
        _ => {
            let dest = dest.map(|p| p.0 as *mut u32);
            for i in rows {
                // SAFETY: the caller's contract.
                unsafe {
                    let b = pass.digit(*digits.add(i));
                    let pos = *offs.get_unchecked(b);
                    *offs.get_unchecked_mut(b) = pos + 1;
                    for (s, d) in lanes {
                        *(d.0 as *mut u32).add(pos as usize) = *(s.0 as *const u32).add(i);
                    }
                    if let Some(dp) = dest {
                        *dp.add(i) = pos;
                    }
                }
            }
        }
    }
}

/// `dst[j] = src[order[j]]` for rows of `width` bytes.
///
/// # Safety
/// `src` holds every row named by `order`, `dst` holds `order.len()` rows, no overlap.
unsafe fn gather_rows(src: *const u8, dst: *mut u8, width: usize, order: &[u32]) {
    unsafe fn go<const W: usize>(src: *const u8, dst: *mut u8, order: &[u32]) {
        let (src, dst) = (src as *const [u8; W], dst as *mut [u8; W]);
        for (j, &o) in order.iter().enumerate() {
            // SAFETY: [u8; W] has alignment 1; rows per the caller's contract.
            unsafe { *dst.add(j) = *src.add(o as usize) };
        }
    }
    // SAFETY: forwarded contract.
    unsafe {
        match width {
            1 => go::<1>(src, dst, order),
            2 => go::<2>(src, dst, order),
            4 => go::<4>(src, dst, order),
            8 => go::<8>(src, dst, order),
            16 => go::<16>(src, dst, order),
            32 => go::<32>(src, dst, order),
            _ => unreachable!("unsupported width {width}"),
        }
    }
}

/// Moves rows `rows` of a lane of `width`-byte rows from `src` to `dst` by `dest`.
///
/// # Safety
/// Both buffers hold every row named by `rows` and `dest`; no other thread writes the
/// destinations of `rows`.
unsafe fn scatter_rows(src: *const u8, dst: *mut u8, width: usize, dest: &[u32], rows: Range<usize>) {
    unsafe fn go<const W: usize>(src: *const u8, dst: *mut u8, dest: &[u32], rows: Range<usize>) {
        let (src, dst) = (src as *const [u8; W], dst as *mut [u8; W]);
        for i in rows {
            // SAFETY: [u8; W] has alignment 1; rows per the caller's contract.
            unsafe { *dst.add(*dest.get_unchecked(i) as usize) = *src.add(i) };
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
    use rand::{Rng, SeedableRng, rngs::SmallRng};

    fn check(keys: Vec<Vec<u32>>, digit_bits: u32, with_payload: bool, keep_words: bool) {
        let n = keys.first().map_or(0, |w| w.len());
        let payload_vals: Vec<u64> = (0..n as u64).map(|i| i * 3 + 1).collect();
        let payload = if with_payload {
            vec![
                (Buffer::from_vec(payload_vals.clone()), 8),
                (Buffer::from_vec(vec![7u8; n]), 1),
            ]
        } else {
            vec![]
        };
        let varying = crate::plan::varying_bits(&keys);
        let sorted = radix_sort(n, keys.clone(), keep_words, digit_bits, payload);
        let mut expected: Vec<u32> = (0..n as u32).collect();
        expected.sort_by_key(|&i| keys.iter().map(|w| w[i as usize]).collect::<Vec<_>>());
        assert_eq!(sorted.perm(), &expected[..], "n {n} digits {digit_bits}");
        if keep_words {
            for (w, s) in sorted.words.iter().enumerate() {
                if varying[w] != 0 {
                    let want: Vec<u32> = expected.iter().map(|&i| keys[w][i as usize]).collect();
                    assert_eq!(s.typed_data::<u32>(), &want[..]);
                }
            }
        }
        if with_payload {
            let want: Vec<u64> = expected.iter().map(|&i| payload_vals[i as usize]).collect();
            assert_eq!(sorted.payload[0].typed_data::<u64>(), &want[..]);
            assert_eq!(sorted.payload[1].as_slice(), &vec![7u8; n][..]);
        }
    }

    #[test]
    fn sorts_stably_across_sizes_and_digits() {
        let mut rng = SmallRng::seed_from_u64(7);
        for n in [
            0usize,
            1,
            2,
            3,
            SMALL_ROWS,
            SMALL_ROWS + 1,
            1000,
            40_000,
            70_000,
            3 * MIN_CHUNK_ROWS + 5,
        ] {
            for digit_bits in [1, 4, 8, 11, 16] {
                for distinct in [1u32, 2, 100, u32::MAX] {
                    let w0: Vec<u32> = (0..n).map(|_| rng.random_range(0..=distinct.min(7))).collect();
                    let w1: Vec<u32> = (0..n).map(|_| rng.random::<u32>() % distinct.max(1)).collect();
                    check(vec![w1.clone()], digit_bits, digit_bits == 8, false);
                    check(vec![w0, w1], digit_bits, digit_bits != 8, digit_bits % 2 == 0);
                }
            }
        }
    }

    #[test]
    fn skewed_and_structured_inputs() {
        let n = 300_000u32;
        check(vec![(0..n).collect()], 8, true, true);
        check(vec![(0..n).rev().collect()], 8, true, false);
        check(vec![(0..n).map(|i| i % 2).collect()], 8, true, true);
        // One huge bucket and many tiny ones.
        check(
            vec![(0..n).map(|i| if i % 10 == 0 { i } else { 5 }).collect()],
            11,
            true,
            true,
        );
        // Three words, the middle one constant.
        let w: Vec<Vec<u32>> = vec![
            (0..n).map(|i| i % 3).collect(),
            vec![9; n as usize],
            (0..n).map(|i| i.wrapping_mul(2654435761)).collect(),
        ];
        check(w, 8, true, true);
        check(
            vec![
                (0..n).map(|i| i.wrapping_mul(2654435761) >> 12).collect(),
                (0..n).map(|i| i % 7).collect(),
            ],
            8,
            false,
            false,
        );
    }
}
