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
}
