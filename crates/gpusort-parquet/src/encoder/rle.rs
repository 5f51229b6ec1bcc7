//! Parquet's RLE / bit-packing hybrid encoding, which carries dictionary indices and
//! definition levels: runs of at least eight equal values are written as one RLE run (a
//! varint header `count << 1`, then the value in `ceil(bit_width / 8)` bytes), everything
//! else as bit-packed groups of eight values (a header `groups << 1 | 1`, then the values
//! packed least significant bit first, `bit_width` bytes a group). The last group is padded
//! with zeros; readers know the number of values from the page header.

/// Appends `values` (each below `2^bit_width`) to `out`, RLE / bit-packing hybrid encoded.
///
/// A run is written as one where it covers a whole group of eight counted from the end of the
/// last run (the literals before it then fill whole groups): the groups are looked at in that
/// alignment, and one of eight equal values is extended as far as its value repeats.
pub fn encode(values: &[u32], bit_width: u8, out: &mut Vec<u8>) {
    debug_assert!(bit_width <= 32);
    debug_assert!(bit_width == 32 || values.iter().all(|&v| u64::from(v) < 1u64 << bit_width));
    let n = values.len();
    let mut literal_start = 0;
    let mut group = 0;
    while group + 8 <= n {
        let g: &[u32; 8] = values[group..group + 8].try_into().expect("eight values");
        let value = g[0];
        // All eight equal (compared at once, without a branch per value).
        if g.iter().fold(0, |acc, &v| acc | (v ^ value)) != 0 {
            group += 8;
            continue;
        }
        let mut run_end = group + 8;
        while run_end < n && values[run_end] == value {
            run_end += 1;
        }
        pack(&values[literal_start..group], bit_width, out);
        put_rle(value, run_end - group, bit_width, out);
        literal_start = run_end;
        group = run_end;
    }
    pack(&values[literal_start..], bit_width, out);
}

/// A dictionary-encoded page's values: the bit width of indices into a dictionary of `n`
/// values, in one byte, then `indices` RLE / bit-packed; `indices` is left empty.
pub fn dictionary_indices(indices: &mut Vec<u32>, n: usize) -> Vec<u8> {
    let width = bit_width_for(n);
    let mut bytes = Vec::with_capacity(2 + indices.len() * usize::from(width) / 8 + 16);
    bytes.push(width);
    encode(indices, width, &mut bytes);
    indices.clear();
    bytes
}

/// The bytes of an all-`value` run of `count` values.
pub fn put_rle(value: u32, count: usize, bit_width: u8, out: &mut Vec<u8>) {
    if count == 0 {
        return;
    }
    put_varint((count as u64) << 1, out);
    let bytes = usize::from(bit_width).div_ceil(8);
    out.extend_from_slice(&value.to_le_bytes()[..bytes]);
}

/// `values` as bit-packed groups of eight (the last padded with zeros).
fn pack(values: &[u32], bit_width: u8, out: &mut Vec<u8>) {
    if values.is_empty() {
        return;
    }
    let groups = values.len().div_ceil(8);
    put_varint(((groups as u64) << 1) | 1, out);
    let width = usize::from(bit_width);
    // Each group is stored as a whole word of 8, 16 or 32 bytes, of which the next group
    // overwrites what is past its `width` bytes: room for the last word's excess, then cut.
    let start = out.len();
    out.resize(start + groups * width + 32, 0);
    let dst = &mut out[start..];
    let mut chunks = values.chunks_exact(8);
    for (k, group) in chunks.by_ref().enumerate() {
        pack_group(
            group.try_into().expect("eight values"),
            bit_width,
            &mut dst[k * width..],
        );
    }
    let rest = chunks.remainder();
    if !rest.is_empty() {
        let mut group = [0u32; 8];
        group[..rest.len()].copy_from_slice(rest);
        pack_group(&group, bit_width, &mut dst[(groups - 1) * width..]);
    }
    out.truncate(start + groups * width);
}

/// Eight values in `bit_width` bytes, written at the start of `dst` (which has room for 32),
/// the bytes after them overwritten.
#[inline]
fn pack_group(group: &[u32; 8], bit_width: u8, dst: &mut [u8]) {
    let width = u32::from(bit_width);
    if width <= 8 {
        // Eight values of up to 8 bits fit one 64-bit word.
        let mut word = 0u64;
        for (k, &v) in group.iter().enumerate() {
            word |= u64::from(v) << (k as u32 * width);
        }
        dst[..8].copy_from_slice(&word.to_le_bytes());
    } else if width <= 16 {
        // Eight values of up to 16 bits fit one 128-bit word.
        let mut word = 0u128;
        for (k, &v) in group.iter().enumerate() {
            word |= u128::from(v) << (k as u32 * width);
        }
        dst[..16].copy_from_slice(&word.to_le_bytes());
    } else {
        // Four values of up to 32 bits fit 128 bits; the second half starts where the first
        // ends, which may be within a byte.
        let mut word = 0u128;
        for (k, &v) in group[..4].iter().enumerate() {
            word |= u128::from(v) << (k as u32 * width);
        }
        let mut high = 0u128;
        for (k, &v) in group[4..].iter().enumerate() {
            high |= u128::from(v) << (k as u32 * width);
        }
        // 8 * width bits in all, at most 256: the low 4 * width bits, then the rest.
        let low_bits = 4 * width;
        dst[..16].copy_from_slice(&(word | high.checked_shl(low_bits).unwrap_or(0)).to_le_bytes());
        let rest = if low_bits == 128 {
            high
        } else {
            high >> (128 - low_bits)
        };
        dst[16..32].copy_from_slice(&rest.to_le_bytes());
    }
}

/// An unsigned LEB128 varint.
pub fn put_varint(mut v: u64, out: &mut Vec<u8>) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// The bits an index below `n` needs (0 when `n <= 1`), as Parquet sizes dictionary indices.
pub fn bit_width_for(n: usize) -> u8 {
    let max = n.saturating_sub(1) as u64;
    (64 - max.leading_zeros()) as u8
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A decoder written from the format's description, for the tests.
    pub(crate) fn decode(mut bytes: &[u8], bit_width: u8, count: usize) -> Vec<u32> {
        fn varint(bytes: &mut &[u8]) -> u64 {
            let mut v = 0u64;
            let mut shift = 0;
            loop {
                let b = bytes[0];
                *bytes = &bytes[1..];
                v |= u64::from(b & 0x7f) << shift;
                if b < 0x80 {
                    return v;
                }
                shift += 7;
            }
        }
        let mut out = vec![];
        while out.len() < count {
            let header = varint(&mut bytes);
            if header & 1 == 0 {
                let n = (header >> 1) as usize;
                let width = usize::from(bit_width).div_ceil(8);
                let mut value = [0u8; 4];
                value[..width].copy_from_slice(&bytes[..width]);
                bytes = &bytes[width..];
                out.extend(std::iter::repeat_n(u32::from_le_bytes(value), n));
            } else {
                let values = (header >> 1) as usize * 8;
                let width = u64::from(bit_width);
                for k in 0..values as u64 {
                    let mut v = 0u64;
                    for b in 0..width {
                        let bit = k * width + b;
                        if bytes[(bit / 8) as usize] >> (bit % 8) & 1 == 1 {
                            v |= 1 << b;
                        }
                    }
                    out.push(v as u32);
                }
                bytes = &bytes[(values * usize::from(bit_width)) / 8..];
            }
        }
        assert!(bytes.is_empty(), "{} bytes left over", bytes.len());
        out.truncate(count);
        out
    }

    fn round_trip(values: &[u32], bit_width: u8) -> Vec<u8> {
        let mut out = vec![];
        encode(values, bit_width, &mut out);
        assert_eq!(decode(&out, bit_width, values.len()), values, "bit width {bit_width}");
        out
    }

    #[test]
    fn runs_and_literals_round_trip_at_every_width() {
        let mut state = 0x2545_f491_4f6c_dd1du64;
        let mut next = || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        for bit_width in 0..=32u8 {
            let max = if bit_width == 32 {
                u64::from(u32::MAX)
            } else {
                (1u64 << bit_width) - 1
            };
            for len in [0usize, 1, 7, 8, 9, 15, 16, 17, 100, 1000] {
                // Random values, and runs of random lengths among them.
                let mut values = Vec::with_capacity(len);
                while values.len() < len {
                    let v = (next() % (max + 1)) as u32;
                    let run = if next() % 3 == 0 { (next() % 20) as usize } else { 1 };
                    values.extend(std::iter::repeat_n(v, run.min(len - values.len()).max(1)));
                }
                values.truncate(len);
                round_trip(&values, bit_width);
            }
        }
    }

    #[test]
    fn long_runs_become_rle_runs() {
        // 3 literals, then 1000 sevens: the first 5 sevens complete the group, the rest is one run.
        let mut values = vec![1, 2, 3];
        values.extend(std::iter::repeat_n(7, 1000));
        let out = round_trip(&values, 3);
        // Header, 3 bytes of one group; header of 995 (2 bytes), 1 value byte.
        assert_eq!(out.len(), 1 + 3 + 2 + 1);
        // All equal: one run, one header and one value byte.
        assert_eq!(round_trip(&[1; 100_000], 1).len(), 3 + 1);
        // A zero bit width writes no value bytes.
        assert_eq!(round_trip(&[0; 10], 0), vec![20]);
    }

    #[test]
    fn widths_of_dictionaries() {
        assert_eq!(bit_width_for(0), 0);
        assert_eq!(bit_width_for(1), 0);
        assert_eq!(bit_width_for(2), 1);
        assert_eq!(bit_width_for(3), 2);
        assert_eq!(bit_width_for(256), 8);
        assert_eq!(bit_width_for(257), 9);
    }
}
