//! The value encoders of one column chunk: dictionary encoding (each distinct value once in the
//! dictionary page, the data pages holding indices) while the dictionary stays under its size
//! limit, plain encoding after. [`FixedEncoder`] takes 4- and 8-byte integers (INT32, INT64),
//! [`BytesEncoder`] strings and binary (BYTE_ARRAY) as views or offsets.
//!
//! Where the Parquet crate's encoder is general (every value hashed by its bytes through a
//! generic interner, every string compared twice for the page's minimum and maximum), these
//! know their types: integers hash as integers; a value equal to the one before it takes the
//! same index without a lookup (sorted columns are runs); and a dictionary-encoded page of
//! strings takes its minimum and maximum over the distinct values it holds, not over every
//! value.

use std::borrow::Cow;
use std::cmp::Ordering;
use std::ops::Range;

use arrow::array::{Array, AsArray};
use arrow::datatypes::{DataType, Date32Type, Decimal64Type, Decimal128Type, Int32Type, Int64Type};
use hashbrown::HashTable;

use super::rle;

/// One page's values, encoded.
pub(super) struct PageValues {
    /// The page's value bytes (past its levels).
    pub bytes: Vec<u8>,
    /// Dictionary indices (true) or plain values.
    pub dictionary: bool,
    /// The smallest and largest value, plain encoded (`None`: no value in the page).
    pub min_max: Option<(Vec<u8>, Vec<u8>)>,
    /// Bytes of the byte array values, unencoded (`None` for other types).
    pub unencoded_bytes: Option<i64>,
}

/// What the chunk's driver asks of an encoder.
pub(super) trait ValueEncoder {
    /// Adds the non-null values of `array[offset..offset + len]`.
    fn put(&mut self, array: &dyn Array, offset: usize, len: usize);
    /// The size the page's values would take now.
    fn page_bytes(&self) -> usize;
    /// The dictionary page's size, while values are dictionary encoded.
    fn dictionary_bytes(&self) -> Option<usize>;
    /// Ends the page.
    fn flush_page(&mut self) -> PageValues;
    /// Encodes the values of the pages after this plainly (the dictionary stays for the pages
    /// before).
    fn stop_dictionary(&mut self);
    /// The dictionary page (plain values) and its number of values, when a page used it.
    fn dictionary_page(&mut self) -> Option<(Vec<u8>, usize)>;
    /// How two plain-encoded values of this column compare in Parquet's order for its type.
    fn compare(a: &[u8], b: &[u8]) -> Ordering;
}

/// The page's plain bytes, leaving room for as many in the next page: a page's buffer grown
/// from nothing reallocates a dozen times, each time into memory the kernel zeroes.
fn take_sized(plain: &mut Vec<u8>) -> Vec<u8> {
    let next = Vec::with_capacity(plain.len());
    std::mem::replace(plain, next)
}

/// A hash of a 64-bit value: the two halves of its product with a large odd constant, folded.
#[inline]
fn hash_u64(v: u64) -> u64 {
    let p = u128::from(v ^ 0x243f_6a88_85a3_08d3).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    (p as u64) ^ ((p >> 64) as u64)
}

/// A hash of a byte string: 8 bytes at a time through [`hash_u64`], with its length.
#[inline]
fn hash_bytes(bytes: &[u8]) -> u64 {
    let mut h = hash_u64(bytes.len() as u64);
    let mut chunks = bytes.chunks_exact(8);
    for c in chunks.by_ref() {
        h = hash_u64(h ^ u64::from_le_bytes(c.try_into().expect("8 bytes")));
    }
    let rest = chunks.remainder();
    if !rest.is_empty() {
        let mut last = [0u8; 8];
        last[..rest.len()].copy_from_slice(rest);
        h = hash_u64(h ^ u64::from_le_bytes(last));
    }
    h
}

/// A 4- or 8-byte integer as Parquet stores it.
pub(super) trait Fixed: Copy + Ord + Default + std::fmt::Debug + Send + 'static {
    const WIDTH: usize;
    fn bits(self) -> u64;
    fn put_le(self, out: &mut Vec<u8>);
    fn from_le(bytes: &[u8]) -> Self;
    /// `array[offset..offset + len]`'s values (nulls included) in this type.
    fn values(array: &dyn Array, offset: usize, len: usize) -> Cow<'_, [Self]>;
}

macro_rules! fixed {
    ($t:ty, $bits:ty, $($dt:pat => $arrow:ty),+) => {
        impl Fixed for $t {
            const WIDTH: usize = std::mem::size_of::<$t>();
            #[inline]
            fn bits(self) -> u64 {
                self as $bits as u64
            }
            #[inline]
            fn put_le(self, out: &mut Vec<u8>) {
                out.extend_from_slice(&self.to_le_bytes());
            }
            fn from_le(bytes: &[u8]) -> Self {
                <$t>::from_le_bytes(bytes.try_into().expect("a plain value of the column's width"))
            }
            fn values(array: &dyn Array, offset: usize, len: usize) -> Cow<'_, [Self]> {
                match array.data_type() {
                    // As the Parquet crate writes decimals of up to 9 (18) digits: the
                    // unscaled value as INT32 (INT64).
                    DataType::Decimal128(..) => Cow::Owned(
                        array.as_primitive::<Decimal128Type>().values()[offset..offset + len]
                            .iter()
                            .map(|&v| v as $t)
                            .collect(),
                    ),
                    DataType::Decimal64(..) if Self::WIDTH < 8 => Cow::Owned(
                        array.as_primitive::<Decimal64Type>().values()[offset..offset + len]
                            .iter()
                            .map(|&v| v as $t)
                            .collect(),
                    ),
                    $($dt => Cow::Borrowed(&array.as_primitive::<$arrow>().values()[offset..offset + len]),)+
                    other => unreachable!("{other} is not encoded as {}", stringify!($t)),
                }
            }
        }
    };
}

fixed!(i32, u32, DataType::Int32 => Int32Type, DataType::Date32 => Date32Type);
fixed!(i64, u64, DataType::Int64 => Int64Type, DataType::Decimal64(..) => Decimal64Type);

/// Whether `data_type` is read by [`Fixed::values`] for `T` (`width` 4 or 8).
pub(super) fn fixed_reads(data_type: &DataType, width: usize) -> bool {
    match (data_type, width) {
        (DataType::Int32 | DataType::Date32, 4) | (DataType::Int64, 8) => true,
        (DataType::Decimal64(precision, _) | DataType::Decimal128(precision, _), 4) => *precision <= 9,
        (DataType::Decimal64(precision, _) | DataType::Decimal128(precision, _), 8) => *precision <= 18,
        _ => false,
    }
}

/// Dictionary or plain encoding of 4- or 8-byte integers.
pub(super) struct FixedEncoder<T: Fixed> {
    dictionary: Option<FixedDictionary<T>>,
    /// The dictionary's values once the pages went plain.
    stopped: Option<Vec<T>>,
    /// Whether a page used the dictionary.
    dictionary_used: bool,
    /// This page's indices (dictionary) or plain bytes.
    indices: Vec<u32>,
    plain: Vec<u8>,
    min_max: Option<(T, T)>,
}

/// A direct-mapped cache of recent values and their indices, in front of a dictionary's hash
/// table: a column of few distinct values (or a run) finds each in one comparison.
struct Recent<K> {
    slots: Box<[(K, u32)]>,
}

impl<K: Copy + Eq + Default> Recent<K> {
    /// `u32::MAX` marks an empty slot (a dictionary has fewer values).
    fn new() -> Self {
        Self {
            slots: vec![(K::default(), u32::MAX); 256].into_boxed_slice(),
        }
    }

    /// The slot of a value whose bits are `bits`: the top byte of their product with a large
    /// odd constant.
    #[inline]
    fn slot(bits: u64) -> usize {
        (bits.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 56) as usize
    }

    #[inline]
    fn get(&self, slot: usize, key: K) -> Option<u32> {
        let (k, i) = self.slots[slot];
        (i != u32::MAX && k == key).then_some(i)
    }

    #[inline]
    fn put(&mut self, slot: usize, key: K, index: u32) {
        self.slots[slot] = (key, index);
    }
}

struct FixedDictionary<T> {
    table: HashTable<u32>,
    values: Vec<T>,
    recent: Recent<T>,
}

impl<T: Fixed> FixedDictionary<T> {
    #[inline]
    fn index(&mut self, v: T) -> u32 {
        let slot = Recent::<T>::slot(v.bits());
        if let Some(index) = self.recent.get(slot, v) {
            return index;
        }
        let values = &mut self.values;
        let hash = hash_u64(v.bits());
        let index = match self.table.find(hash, |&i| values[i as usize] == v) {
            Some(&i) => i,
            None => {
                let i = values.len() as u32;
                values.push(v);
                self.table
                    .insert_unique(hash, i, |&i| hash_u64(values[i as usize].bits()));
                i
            }
        };
        self.recent.put(slot, v, index);
        index
    }
}

impl<T: Fixed> FixedEncoder<T> {
    pub(super) fn new(dictionary: bool) -> Self {
        Self {
            dictionary: dictionary.then(|| FixedDictionary {
                table: HashTable::new(),
                values: vec![],
                recent: Recent::new(),
            }),
            stopped: None,
            dictionary_used: false,
            indices: vec![],
            plain: vec![],
            min_max: None,
        }
    }

    /// Adds `values`, all non-null: their minimum and maximum in one pass the compiler
    /// vectorizes, then their indices, or their bytes at once.
    fn put_all(&mut self, values: &[T]) {
        let (Some(&min), Some(&max)) = (values.iter().min(), values.iter().max()) else {
            return;
        };
        self.merge_min_max(min, max);
        match &mut self.dictionary {
            Some(d) => self.indices.extend(values.iter().map(|&v| d.index(v))),
            None => {
                self.plain.reserve(values.len() * T::WIDTH);
                values.iter().for_each(|v| v.put_le(&mut self.plain));
            }
        }
    }

    fn merge_min_max(&mut self, min: T, max: T) {
        self.min_max = Some(match self.min_max {
            Some((a, b)) => (a.min(min), b.max(max)),
            None => (min, max),
        });
    }
}

impl<T: Fixed> ValueEncoder for FixedEncoder<T> {
    fn put(&mut self, array: &dyn Array, offset: usize, len: usize) {
        let values = T::values(array, offset, len);
        match array.nulls().filter(|n| n.null_count() > 0) {
            None => self.put_all(&values),
            Some(nulls) => {
                let valid: Vec<T> = nulls.slice(offset, len).valid_indices().map(|i| values[i]).collect();
                self.put_all(&valid);
            }
        }
    }

    fn page_bytes(&self) -> usize {
        match &self.dictionary {
            Some(d) => 1 + self.indices.len() * usize::from(rle::bit_width_for(d.values.len())) / 8,
            None => self.plain.len(),
        }
    }

    fn dictionary_bytes(&self) -> Option<usize> {
        self.dictionary.as_ref().map(|d| d.values.len() * T::WIDTH)
    }

    fn flush_page(&mut self) -> PageValues {
        let min_max = self.min_max.take().map(|(min, max)| {
            let (mut a, mut b) = (vec![], vec![]);
            min.put_le(&mut a);
            max.put_le(&mut b);
            (a, b)
        });
        let (bytes, dictionary) = match &self.dictionary {
            Some(d) => {
                self.dictionary_used = true;
                (rle::dictionary_indices(&mut self.indices, d.values.len()), true)
            }
            None => (take_sized(&mut self.plain), false),
        };
        PageValues {
            bytes,
            dictionary,
            min_max,
            unencoded_bytes: None,
        }
    }

    fn stop_dictionary(&mut self) {
        debug_assert!(self.indices.is_empty(), "the page is flushed first");
        if let Some(d) = self.dictionary.take() {
            // The values stay for the dictionary page.
            self.stopped = Some(d.values);
        }
    }

    fn dictionary_page(&mut self) -> Option<(Vec<u8>, usize)> {
        if !self.dictionary_used {
            return None;
        }
        let values = match self.dictionary.take() {
            Some(d) => d.values,
            None => self.stopped.take().unwrap_or_default(),
        };
        let mut bytes = Vec::with_capacity(values.len() * T::WIDTH);
        values.iter().for_each(|v| v.put_le(&mut bytes));
        Some((bytes, values.len()))
    }

    fn compare(a: &[u8], b: &[u8]) -> Ordering {
        T::from_le(a).cmp(&T::from_le(b))
    }
}

/// Whether `data_type` is read by [`BytesEncoder`].
pub(super) fn bytes_reads(data_type: &DataType) -> bool {
    matches!(
        data_type,
        DataType::Utf8
            | DataType::LargeUtf8
            | DataType::Utf8View
            | DataType::Binary
            | DataType::LargeBinary
            | DataType::BinaryView
    )
}

/// A byte array value's key, the first 16 bytes of an Arrow view of it: its length, then for a
/// value of up to 12 bytes all its bytes (zero padded), for a longer one its first 4. Values
/// of up to 12 bytes are equal when their keys are; longer ones with equal keys compare their
/// bytes.
#[inline]
fn key_of(v: &[u8]) -> u128 {
    let mut b = [0u8; 16];
    b[..4].copy_from_slice(&(v.len() as u32).to_le_bytes());
    let n = if v.len() <= 12 { v.len() } else { 4 };
    b[4..4 + n].copy_from_slice(&v[..n]);
    u128::from_le_bytes(b)
}

/// The key of an Arrow view: its length and inline bytes (padding cleared), or its length and
/// prefix.
#[inline]
fn key_of_view(view: u128) -> u128 {
    let len = view as u32;
    let bits = if len <= 12 { 32 + 8 * len } else { 64 };
    if bits >= 128 {
        view
    } else {
        view & ((1u128 << bits) - 1)
    }
}

/// Whether the value of `key` is all in its key.
#[inline]
fn inline(key: u128) -> bool {
    key as u32 <= 12
}

/// The first 4 bytes of a key's value, as a big-endian number (zero padded): values whose
/// prefixes differ compare as their prefixes do.
#[inline]
fn prefix(key: u128) -> u32 {
    u32::from_be_bytes(((key >> 32) as u32).to_le_bytes())
}

/// How two values compare (Parquet's byte order), their prefixes first.
#[inline]
fn compare_values(a: (u128, &[u8]), b: (u128, &[u8])) -> Ordering {
    prefix(a.0).cmp(&prefix(b.0)).then_with(|| a.1.cmp(b.1))
}

/// Calls `f` with the key and bytes of each non-null value of `array[offset..offset + len]`, in
/// order.
fn each_value(array: &dyn Array, offset: usize, len: usize, mut f: impl FnMut(u128, &[u8])) {
    fn each<'a, A>(
        a: &'a A,
        nulls: Option<&arrow::buffer::NullBuffer>,
        offset: usize,
        len: usize,
        mut f: impl FnMut(&[u8]),
    ) where
        &'a A: arrow::array::ArrayAccessor,
        <&'a A as arrow::array::ArrayAccessor>::Item: AsRef<[u8]>,
    {
        use arrow::array::ArrayAccessor;
        match nulls.filter(|n| n.null_count() > 0) {
            None => (offset..offset + len).for_each(|i| f(a.value(i).as_ref())),
            Some(nulls) => nulls
                .slice(offset, len)
                .valid_indices()
                .for_each(|i| f(a.value(offset + i).as_ref())),
        }
    }
    /// Views: the key is the view's, and a short value's bytes are read from it.
    fn views<'a, A>(
        a: &'a A,
        views: &[u128],
        nulls: Option<&arrow::buffer::NullBuffer>,
        offset: usize,
        len: usize,
        mut f: impl FnMut(u128, &[u8]),
    ) where
        &'a A: arrow::array::ArrayAccessor,
        <&'a A as arrow::array::ArrayAccessor>::Item: AsRef<[u8]>,
    {
        use arrow::array::ArrayAccessor;
        let mut one = |i: usize| {
            let key = key_of_view(views[i]);
            if inline(key) {
                let bytes = key.to_le_bytes();
                f(key, &bytes[4..4 + key as u32 as usize]);
            } else {
                f(key, a.value(i).as_ref());
            }
        };
        match nulls.filter(|n| n.null_count() > 0) {
            None => (offset..offset + len).for_each(one),
            Some(nulls) => nulls.slice(offset, len).valid_indices().for_each(|i| one(offset + i)),
        }
    }
    let nulls = array.nulls();
    let mut keyed = |v: &[u8]| f(key_of(v), v);
    match array.data_type() {
        DataType::Utf8View => {
            let a = array.as_string_view();
            views(a, a.views(), nulls, offset, len, f)
        }
        DataType::BinaryView => {
            let a = array.as_binary_view();
            views(a, a.views(), nulls, offset, len, f)
        }
        DataType::Utf8 => each(array.as_string::<i32>(), nulls, offset, len, &mut keyed),
        DataType::LargeUtf8 => each(array.as_string::<i64>(), nulls, offset, len, &mut keyed),
        DataType::Binary => each(array.as_binary::<i32>(), nulls, offset, len, &mut keyed),
        DataType::LargeBinary => each(array.as_binary::<i64>(), nulls, offset, len, &mut keyed),
        other => unreachable!("{other} is not encoded as a byte array"),
    }
}

/// Dictionary or plain encoding of strings and binary.
pub(super) struct BytesEncoder {
    dictionary: Option<BytesDictionary>,
    /// Whether a page used the dictionary (then kept here once the pages went plain).
    dictionary_used: bool,
    stopped: Option<BytesDictionary>,
    indices: Vec<u32>,
    /// The page's values, plain encoded (each a 4-byte length and its bytes).
    plain: Vec<u8>,
    /// The smallest and largest plain value of the page: its key, and where it is in `plain`.
    plain_min_max: PlainMinMax,
    unencoded: i64,
}

/// One value of a dictionary: its key, where its bytes are in the page, and its hash.
struct Entry {
    key: u128,
    bytes: Range<usize>,
    hash: u64,
}

struct BytesDictionary {
    table: HashTable<u32>,
    /// The dictionary page as it is written: each value's 4-byte length, then its bytes.
    page: Vec<u8>,
    entries: Vec<Entry>,
    /// The index of the last value: a run takes one comparison, no hash.
    last: Option<u32>,
    /// Recent values by key: a value of up to 12 bytes is its key; a longer one is checked.
    recent: Recent<u128>,
    /// The indices this page holds (`seen[i]` is the page's number when it does).
    seen: Vec<u32>,
    page_number: u32,
    page_indices: Vec<u32>,
}

impl BytesDictionary {
    fn new() -> Self {
        Self {
            table: HashTable::new(),
            page: vec![],
            entries: vec![],
            last: None,
            recent: Recent::new(),
            seen: vec![],
            page_number: 1,
            page_indices: vec![],
        }
    }

    /// The key and bytes of entry `i`.
    fn value(&self, i: u32) -> (u128, &[u8]) {
        let e = &self.entries[i as usize];
        (e.key, &self.page[e.bytes.clone()])
    }

    /// Whether entry `i` is the value of `key` and `v`.
    #[inline]
    fn is(entries: &[Entry], page: &[u8], i: u32, key: u128, v: &[u8]) -> bool {
        let e = &entries[i as usize];
        e.key == key && (inline(key) || page[e.bytes.clone()] == *v)
    }

    #[inline]
    fn index(&mut self, key: u128, v: &[u8]) -> u32 {
        let index = match self.last {
            Some(last) if Self::is(&self.entries, &self.page, last, key, v) => last,
            _ => {
                // A long value's key (length and prefix) names a candidate, its bytes decide.
                let slot = Recent::<u128>::slot(key as u64 ^ (key >> 64) as u64);
                match self.recent.get(slot, key) {
                    Some(index) if Self::is(&self.entries, &self.page, index, key, v) => index,
                    _ => {
                        let index = self.lookup(key, v);
                        self.recent.put(slot, key, index);
                        index
                    }
                }
            }
        };
        if self.seen[index as usize] != self.page_number {
            self.seen[index as usize] = self.page_number;
            self.page_indices.push(index);
        }
        self.last = Some(index);
        index
    }

    /// The index of the value of `key` and `v`, added to the dictionary if it is new.
    #[inline]
    fn lookup(&mut self, key: u128, v: &[u8]) -> u32 {
        let hash = if inline(key) {
            hash_u64(hash_u64(key as u64) ^ (key >> 64) as u64)
        } else {
            hash_bytes(v)
        };
        let (page, entries) = (&mut self.page, &mut self.entries);
        match self.table.find(hash, |&i| Self::is(entries, page, i, key, v)) {
            Some(&i) => i,
            None => {
                let i = entries.len() as u32;
                page.extend_from_slice(&(v.len() as u32).to_le_bytes());
                let start = page.len();
                page.extend_from_slice(v);
                entries.push(Entry {
                    key,
                    bytes: start..page.len(),
                    hash,
                });
                self.seen.push(0);
                self.table.insert_unique(hash, i, |&i| entries[i as usize].hash);
                i
            }
        }
    }

    /// The smallest and largest value of the page, and starts the next page.
    fn page_min_max(&mut self) -> Option<(Vec<u8>, Vec<u8>)> {
        let indices = std::mem::take(&mut self.page_indices);
        self.page_number += 1;
        let (&first, rest) = indices.split_first()?;
        let (mut min, mut max) = (first, first);
        for &i in rest {
            let v = self.value(i);
            if compare_values(v, self.value(min)) == Ordering::Less {
                min = i;
            } else if compare_values(v, self.value(max)) == Ordering::Greater {
                max = i;
            }
        }
        let out = Some((self.value(min).1.to_vec(), self.value(max).1.to_vec()));
        self.page_indices = indices;
        self.page_indices.clear();
        out
    }
}

/// The smallest and largest value of a plain page: each value's key, and where it is.
type PlainMinMax = Option<((u128, Range<usize>), (u128, Range<usize>))>;

impl BytesEncoder {
    pub(super) fn new(dictionary: bool) -> Self {
        Self {
            dictionary: dictionary.then(BytesDictionary::new),
            dictionary_used: false,
            stopped: None,
            indices: vec![],
            plain: vec![],
            plain_min_max: None,
            unencoded: 0,
        }
    }

    #[inline]
    fn put_plain(plain: &mut Vec<u8>, min_max: &mut PlainMinMax, key: u128, v: &[u8]) {
        plain.extend_from_slice(&(v.len() as u32).to_le_bytes());
        let range = plain.len()..plain.len() + v.len();
        plain.extend_from_slice(v);
        match min_max {
            None => *min_max = Some(((key, range.clone()), (key, range))),
            Some((min, max)) => {
                if compare_values((key, v), (min.0, &plain[min.1.clone()])) == Ordering::Less {
                    *min = (key, range);
                } else if compare_values((key, v), (max.0, &plain[max.1.clone()])) == Ordering::Greater {
                    *max = (key, range);
                }
            }
        }
    }
}

impl ValueEncoder for BytesEncoder {
    fn put(&mut self, array: &dyn Array, offset: usize, len: usize) {
        let unencoded = &mut self.unencoded;
        match &mut self.dictionary {
            Some(d) => {
                let indices = &mut self.indices;
                each_value(array, offset, len, |key, v| {
                    *unencoded += v.len() as i64;
                    indices.push(d.index(key, v));
                });
            }
            None => {
                let (plain, min_max) = (&mut self.plain, &mut self.plain_min_max);
                each_value(array, offset, len, |key, v| {
                    *unencoded += v.len() as i64;
                    Self::put_plain(plain, min_max, key, v);
                });
            }
        }
    }

    fn page_bytes(&self) -> usize {
        match &self.dictionary {
            Some(d) => 1 + self.indices.len() * usize::from(rle::bit_width_for(d.entries.len())) / 8,
            None => self.plain.len(),
        }
    }

    fn dictionary_bytes(&self) -> Option<usize> {
        self.dictionary.as_ref().map(|d| d.page.len())
    }

    fn flush_page(&mut self) -> PageValues {
        let unencoded_bytes = Some(std::mem::take(&mut self.unencoded));
        match &mut self.dictionary {
            Some(d) => {
                self.dictionary_used = true;
                PageValues {
                    bytes: rle::dictionary_indices(&mut self.indices, d.entries.len()),
                    dictionary: true,
                    min_max: d.page_min_max(),
                    unencoded_bytes,
                }
            }
            None => {
                let min_max = self
                    .plain_min_max
                    .take()
                    .map(|(min, max)| (self.plain[min.1].to_vec(), self.plain[max.1].to_vec()));
                PageValues {
                    bytes: take_sized(&mut self.plain),
                    dictionary: false,
                    min_max,
                    unencoded_bytes,
                }
            }
        }
    }

    fn stop_dictionary(&mut self) {
        debug_assert!(self.indices.is_empty(), "the page is flushed first");
        self.stopped = self.dictionary.take();
    }

    fn dictionary_page(&mut self) -> Option<(Vec<u8>, usize)> {
        if !self.dictionary_used {
            return None;
        }
        let d = self.dictionary.take().or_else(|| self.stopped.take())?;
        let n = d.entries.len();
        Some((d.page, n))
    }

    fn compare(a: &[u8], b: &[u8]) -> Ordering {
        a.cmp(b)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hashes_spread_values_that_differ_in_high_bits_only() {
        // Decimals are multiples of 100, dates close together: their hashes' low bits differ.
        let low: std::collections::HashSet<u64> = (0..1024u64).map(|v| hash_u64(v * 1024) & 1023).collect();
        assert!(low.len() > 600, "{} distinct low 10 bits of 1024", low.len());
        assert_ne!(hash_bytes(b"ab"), hash_bytes(b"ab\0"));
        assert_ne!(hash_bytes(b""), hash_bytes(b"\0"));
    }

    #[test]
    fn keys_hold_short_values_and_order_by_prefix() {
        use arrow::array::StringViewArray;
        let values = ["", "a", "a\0", "ab", "abcdefghijkl", "abcdefghijklm", "abcz", "\u{ff}"];
        let array = StringViewArray::from_iter_values(values);
        // A view's key is the key of its bytes.
        for (i, v) in values.iter().enumerate() {
            assert_eq!(key_of_view(array.views()[i]), key_of(v.as_bytes()), "{v:?}");
        }
        // Keys order as the values do (bytes compared where prefixes are equal).
        for a in values {
            for b in values {
                let (a, b) = (a.as_bytes(), b.as_bytes());
                assert_eq!(compare_values((key_of(a), a), (key_of(b), b)), a.cmp(b), "{a:?} {b:?}");
            }
        }
        assert!(inline(key_of(b"abcdefghijkl")) && !inline(key_of(b"abcdefghijklm")));
    }
}
