//! Writing bit fields into ByField key words from many threads.

/// Destination of key bits: `num_words` arrays of 32-bit words (word 0 most significant),
/// one word per row in each. The key's bits are right-aligned: the top word has
/// `pad = 32 * num_words - total_bits` unused leading zero bits.
///
/// Rows are written by disjoint row ranges from different threads, through raw pointers:
/// every method is `unsafe` and callers guarantee that no two threads write the same row.
pub(crate) struct KeyWriter {
    words: Vec<*mut u32>,
    rows: usize,
    pad: u32,
}

// SAFETY: writes go through raw pointers to rows that callers partition between threads.
unsafe impl Send for KeyWriter {}
unsafe impl Sync for KeyWriter {}

impl KeyWriter {
    /// A writer over `words` (each at least `rows` long, `rows` being the shortest) holding a
    /// key of `total_bits` bits.
    pub(crate) fn new(words: &mut [&mut [u32]], total_bits: u32) -> Self {
        let rows = words.iter().map(|w| w.len()).min().unwrap_or(0);
        let pad = 32 * words.len() as u32 - total_bits;
        Self {
            words: words.iter_mut().map(|w| w.as_mut_ptr()).collect(),
            rows,
            pad,
        }
    }

    /// Sets every word of `rows` to zero.
    ///
    /// # Safety
    /// `rows.end <= rows`, and no other thread touches these rows now.
    pub(crate) unsafe fn clear(&self, rows: std::ops::Range<usize>) {
        debug_assert!(rows.end <= self.rows);
        for &w in &self.words {
            // SAFETY: the caller owns the rows.
            unsafe { std::ptr::write_bytes(w.add(rows.start), 0, rows.len()) };
        }
    }

    /// The OR and the AND of word `word` over `rows`.
    ///
    /// # Safety
    /// `rows.end <= rows`, the rows are written, and no other thread writes them now.
    pub(crate) unsafe fn or_and(&self, word: usize, rows: std::ops::Range<usize>) -> (u32, u32) {
        debug_assert!(rows.end <= self.rows);
        // SAFETY: the caller's contract.
        let w = unsafe { std::slice::from_raw_parts(self.words[word].add(rows.start), rows.len()) };
        w.iter().fold((0, u32::MAX), |(o, a), &x| (o | x, a & x))
    }

    /// ORs the low `nbits` (<= 64) bits of `value` into `row` at bit position `pos` counted
    /// from the key's most significant bit.
    ///
    /// # Safety
    /// `row < rows`, `pos + nbits <= total_bits`, and no other thread writes `row` now.
    #[inline(always)]
    pub(crate) unsafe fn put(&self, row: usize, pos: u32, value: u64, nbits: u32) {
        debug_assert!(row < self.rows && nbits <= 64);
        let mut g = self.pad + pos;
        let mut left = nbits;
        while left > 0 {
            let in_word = g % 32;
            let take = (32 - in_word).min(left);
            let part = ((value >> (left - take)) as u32) & (u32::MAX >> (32 - take));
            // SAFETY: the caller owns `row`; g / 32 < num_words as pos + nbits <= total_bits.
            unsafe {
                *self.words.get_unchecked((g / 32) as usize).add(row) |= part << (32 - in_word - take);
            }
            g += take;
            left -= take;
        }
    }
}

/// Bits written into one row's key from a position on, in order, each word ORed once: what
/// [`KeyWriter::put`] does piece by piece, without ORing one word again for every piece that
/// touches it (a chain of stores and loads of one address, where most of a string field's
/// encoding samples fell in stop 27's profile). [`KeyWriter::put`] stays a loop of its own for
/// single pieces (integers, null flags): a sink of one piece encoded an i64, an i32 with nulls
/// and an i64 13% slower on 2 cores (30.5 against 26.5 ms for 6M rows).
pub(crate) struct BitSink<'a> {
    writer: &'a KeyWriter,
    row: usize,
    /// Bits not yet written, from the most significant bit of `pending`.
    pending: u128,
    pending_bits: u32,
    /// The word the pending bits start in.
    word: usize,
}

impl KeyWriter {
    /// A sink of bits for `row` from key bit `pos` on.
    ///
    /// # Safety
    /// As [`Self::put`] for every bit pushed: `row < rows`, the bits end inside the key, and no
    /// other thread writes `row` now.
    #[inline(always)]
    pub(crate) unsafe fn sink(&self, row: usize, pos: u32) -> BitSink<'_> {
        let g = self.pad + pos;
        BitSink {
            writer: self,
            row,
            pending: 0,
            pending_bits: g % 32,
            word: (g / 32) as usize,
        }
    }
}

impl BitSink<'_> {
    /// Appends the low `nbits` (<= 64) bits of `value`.
    #[inline(always)]
    pub(crate) fn push(&mut self, value: u64, nbits: u32) {
        debug_assert!(nbits <= 64 && self.pending_bits < 32);
        if nbits == 0 {
            return;
        }
        let v = (value as u128) & (u128::MAX >> (128 - nbits));
        self.pending |= v << (128 - self.pending_bits - nbits);
        self.pending_bits += nbits;
        while self.pending_bits >= 32 {
            self.emit();
        }
    }

    /// ORs the top 32 pending bits into their word.
    #[inline(always)]
    fn emit(&mut self) {
        let part = (self.pending >> 96) as u32;
        // SAFETY: the sink's contract; `word` holds bits of the key.
        unsafe { *self.writer.words.get_unchecked(self.word).add(self.row) |= part };
        self.pending <<= 32;
        self.pending_bits = self.pending_bits.saturating_sub(32);
        self.word += 1;
    }
}

impl Drop for BitSink<'_> {
    /// Writes what is left (part of a word).
    #[inline(always)]
    fn drop(&mut self) {
        if self.pending != 0 {
            self.emit();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_straddle_words() {
        // 70-bit key: 3 words, 26 bits of padding.
        let mut words = vec![vec![0u32; 2]; 3];
        let mut views: Vec<&mut [u32]> = words.iter_mut().map(|w| &mut w[..]).collect();
        let w = KeyWriter::new(&mut views, 70);
        unsafe {
            w.put(0, 0, 0b11, 2); // top two bits of the key
            w.put(0, 2, u64::MAX, 64);
            w.put(0, 66, 0b1010, 4);
            w.put(1, 60, 0xFF, 8); // global bit 86: inside word 2
            w.put(1, 36, 0b1011, 4); // global bits 62..66: across words 1 and 2
        }
        assert_eq!(words[0][0], 0b11_1111);
        assert_eq!(words[1][0], u32::MAX);
        assert_eq!(words[2][0], 0xFFFF_FFFA);
        assert_eq!(words[1][1], 0b10);
        assert_eq!(words[2][1], (0b11 << 30) | (0xFF << 2));
    }

    /// A sink writes what the same pieces [`KeyWriter::put`] one by one write, from every
    /// position of a word, in pieces of every width.
    #[test]
    fn sinks_write_what_puts_write() {
        let pieces = [
            (0xDEAD_BEEF_0123_4567u64, 64),
            (0b101, 3),
            (u64::MAX, 64),
            (0x1234, 16),
            (7, 5),
            (1, 1),
        ];
        let bits: u32 = pieces.iter().map(|p| p.1).sum();
        for pos in 0..40 {
            let total = pos + bits + 9;
            let nw = total.div_ceil(32) as usize;
            let mut a = vec![vec![0u32; 1]; nw];
            let mut b = vec![vec![0u32; 1]; nw];
            let mut va: Vec<&mut [u32]> = a.iter_mut().map(|w| &mut w[..]).collect();
            let mut vb: Vec<&mut [u32]> = b.iter_mut().map(|w| &mut w[..]).collect();
            let (wa, wb) = (KeyWriter::new(&mut va, total), KeyWriter::new(&mut vb, total));
            let mut p = pos;
            // SAFETY: one row, the bits inside the key.
            unsafe {
                wa.put(0, 0, 0b11, 2.min(pos));
                wb.put(0, 0, 0b11, 2.min(pos));
                let mut sink = wb.sink(0, pos);
                for &(v, n) in &pieces {
                    wa.put(0, p, v, n);
                    sink.push(v, n);
                    p += n;
                }
                drop(sink);
                wa.put(0, p, 0x1FF, 9);
                wb.put(0, p, 0x1FF, 9);
            }
            assert_eq!(a, b, "from bit {pos}");
        }
    }
}
