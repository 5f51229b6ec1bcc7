//! Statistics as the Parquet format wants them for the column chunk and the column index:
//! byte array minimums and maximums cut to a length (a string's at a character boundary, its
//! maximum then raised to stay an upper bound), as the Parquet crate writes them so readers
//! prune the same way whichever encoder wrote the file.

use parquet::basic::{LogicalType, Type as PhysicalType};
use parquet::data_type::ByteArray;
use parquet::file::statistics::{Statistics, ValueStatistics};
use parquet::schema::types::ColumnDescriptor;

use super::values::Fixed;

/// Whether the column's values are strings (cut at character boundaries).
fn is_utf8(descr: &ColumnDescriptor) -> bool {
    descr.logical_type_ref() == Some(&LogicalType::String)
        || descr.converted_type() == parquet::basic::ConvertedType::UTF8
}

/// `min` cut to at most `length` bytes, and whether it was cut.
pub(super) fn truncate_min(descr: &ColumnDescriptor, length: Option<usize>, min: &[u8]) -> (Vec<u8>, bool) {
    let cut = length
        .filter(|&l| min.len() > l)
        .and_then(|l| match std::str::from_utf8(min) {
            Ok(s) if is_utf8(descr) => (1..=l)
                .rev()
                .find(|&i| s.is_char_boundary(i))
                .map(|i| min[..i].to_vec()),
            _ => Some(min[..l].to_vec()),
        });
    match cut {
        Some(v) => (v, true),
        None => (min.to_vec(), false),
    }
}

/// `max` cut to at most `length` bytes and raised to stay at least `max`, and whether it was.
pub(super) fn truncate_max(descr: &ColumnDescriptor, length: Option<usize>, max: &[u8]) -> (Vec<u8>, bool) {
    let cut = length.filter(|&l| max.len() > l).and_then(|l| {
        match std::str::from_utf8(max) {
            Ok(s) if is_utf8(descr) => {
                // A character is at most 4 bytes: the cut is within the last 3 of `l`.
                let at = (l.saturating_sub(3)..=l).rev().find(|&i| s.is_char_boundary(i))?;
                raise_utf8(&s[..at])
            }
            _ => raise_bytes(max[..l].to_vec()),
        }
    });
    match cut {
        Some(v) => (v, true),
        None => (max.to_vec(), false),
    }
}

/// The shortest prefix of `s` whose last character, raised by one code point of the same
/// width, makes a string above every string starting with `s`; `None` when none can be.
fn raise_utf8(s: &str) -> Option<Vec<u8>> {
    s.char_indices().rev().find_map(|(at, c)| {
        let next = char::from_u32(c as u32 + 1).filter(|n| n.len_utf8() == c.len_utf8())?;
        let mut out = s.as_bytes()[..at + c.len_utf8()].to_vec();
        next.encode_utf8(&mut out[at..]);
        Some(out)
    })
}

/// `bytes` plus one, as a big-endian number of the same length (trailing 0xff bytes become 0,
/// as the Parquet crate raises them); `None` when every byte is 0xff.
fn raise_bytes(mut bytes: Vec<u8>) -> Option<Vec<u8>> {
    let last = bytes.iter().rposition(|&b| b < u8::MAX)?;
    bytes[last] += 1;
    bytes[last + 1..].fill(0);
    Some(bytes)
}

/// An integer column chunk's statistics: `min_max` plain encoded, `nulls`, and the deprecated
/// fields where the type's order is signed.
fn fixed_statistics<T: Fixed>(min_max: Option<(&[u8], &[u8])>, nulls: u64, signed: bool) -> ValueStatistics<T> {
    let (min, max) = min_max.map(|(a, b)| (T::from_le(a), T::from_le(b))).unzip();
    ValueStatistics::new(min, max, None, Some(nulls), false).with_backwards_compatible_min_max(signed)
}

/// The column chunk's statistics: `min_max` plain encoded (none when every value is null),
/// `nulls`, byte arrays cut to `length`.
pub(super) fn chunk_statistics(
    descr: &ColumnDescriptor,
    min_max: Option<(&[u8], &[u8])>,
    nulls: u64,
    length: Option<usize>,
) -> Statistics {
    let signed = descr.sort_order().is_signed();
    match descr.physical_type() {
        PhysicalType::INT32 => Statistics::Int32(fixed_statistics(min_max, nulls, signed)),
        PhysicalType::INT64 => Statistics::Int64(fixed_statistics(min_max, nulls, signed)),
        PhysicalType::BYTE_ARRAY => {
            let Some((min, max)) = min_max else {
                return Statistics::ByteArray(
                    ValueStatistics::new(None, None, None, Some(nulls), false)
                        .with_backwards_compatible_min_max(signed),
                );
            };
            let (min, min_cut) = truncate_min(descr, length, min);
            let (max, max_cut) = truncate_max(descr, length, max);
            Statistics::ByteArray(
                ValueStatistics::new(
                    Some(ByteArray::from(min)),
                    Some(ByteArray::from(max)),
                    None,
                    Some(nulls),
                    signed,
                )
                .with_max_is_exact(!max_cut)
                .with_min_is_exact(!min_cut),
            )
        }
        other => unreachable!("the encoder does not write {other}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_are_raised_past_their_last_byte() {
        assert_eq!(raise_bytes(vec![1, 2]), Some(vec![1, 3]));
        assert_eq!(raise_bytes(vec![1, 0xff]), Some(vec![2, 0]));
        assert_eq!(raise_bytes(vec![0xff, 0xff]), None);
    }

    #[test]
    fn strings_are_raised_at_a_character_of_the_same_width() {
        assert_eq!(raise_utf8("ab"), Some(b"ac".to_vec()));
        // U+007F raised is U+0080, two bytes: the character before it is raised instead.
        assert_eq!(raise_utf8("a\u{7f}"), Some(b"b".to_vec()));
        assert_eq!(raise_utf8("\u{7f}"), None);
    }
}
