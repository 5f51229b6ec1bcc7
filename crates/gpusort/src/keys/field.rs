//! Per-column key fields: the column's statistics (range, common prefix) and the code that
//! writes its bits into the key words.

use std::ops::Range;
use std::sync::Arc;

use arrow::array::types::{IntervalDayTime, IntervalMonthDayNano};
use arrow::array::{
    Array, ArrayRef, AsArray, BinaryArray, FixedSizeBinaryArray, GenericByteArray, GenericByteViewArray,
};
use arrow::buffer::{BooleanBuffer, NullBuffer, ScalarBuffer};
use arrow::compute::SortOptions;
use arrow::datatypes::*;
use arrow::datatypes::{ByteArrayType, ByteViewType};
use arrow::row::{RowConverter, SortField};
use half::f16;
use rayon::prelude::*;

use super::ordinal::{Ordinal, OrdinalKind, ToOrdinal};
use super::writer::KeyWriter;
use super::{EncoderOptions, FieldEncoding};
use crate::error::{GpusortError, Result};

/// Rows per task when columns are scanned or encoded in parallel.
pub(crate) const CHUNK: usize = 1 << 14;

/// The null flag of a field: present when the column holds nulls.
pub(crate) struct NullFlag {
    pub(crate) nulls: Option<NullBuffer>,
    /// The flag's value for valid rows (1 with NULLS FIRST, 0 with NULLS LAST); null rows
    /// get the other value.
    pub(crate) valid_bit: u64,
}

impl NullFlag {
    pub(crate) fn bits(&self) -> u32 {
        self.nulls.is_some() as u32
    }
}

/// The value part of a key field.
pub(crate) trait FieldEncoder: Send + Sync {
    /// Bits of the value part.
    fn value_bits(&self) -> u32;
    /// False when equal keys may hold different values (a truncated string prefix).
    fn exact(&self) -> bool {
        true
    }
    /// What the encoding is, for plans and GPU encoders.
    fn encoding(&self) -> FieldEncoding;
    /// Writes rows `rows`: the null flag (if any) at `pos`, then the value bits.
    fn encode(&self, rows: Range<usize>, flag: &NullFlag, w: &KeyWriter, pos: u32);
}

/// Writes the low `bits` bits of `v` at `pos` of `row`.
#[inline(always)]
fn put_ordinal<O: Ordinal>(w: &KeyWriter, row: usize, pos: u32, v: O, bits: u32) {
    let mut p = pos;
    v.for_each_chunk(bits, |chunk, nb| {
        // SAFETY: rows of one range are written by one thread; the field fits the key.
        unsafe { w.put(row, p, chunk, nb) };
        p += nb;
    });
}

/// The loop shared by all ordinal fields: flag and value, combined into one write when
/// they fit 64 bits.
#[inline(always)]
fn encode_ordinals<O: Ordinal>(
    rows: Range<usize>,
    flag: &NullFlag,
    w: &KeyWriter,
    pos: u32,
    bits: u32,
    value: impl Fn(usize) -> O,
) {
    match &flag.nulls {
        None => {
            if bits == 0 {
                return;
            }
            for i in rows {
                put_ordinal(w, i, pos, value(i), bits);
            }
        }
        Some(nulls) => {
            for i in rows {
                if nulls.is_valid(i) {
                    if bits < 64 {
                        let v = (flag.valid_bit << bits) | value(i).low_u64();
                        // SAFETY: as in put_ordinal.
                        unsafe { w.put(i, pos, v, bits + 1) };
                    } else {
                        if flag.valid_bit == 1 {
                            // SAFETY: as in put_ordinal.
                            unsafe { w.put(i, pos, 1, 1) };
                        }
                        put_ordinal(w, i, pos + 1, value(i), bits);
                    }
                } else if flag.valid_bit == 0 {
                    // SAFETY: as in put_ordinal.
                    unsafe { w.put(i, pos, 1, 1) };
                }
            }
        }
    }
}

/// Per-row ordinal access for a column.
pub(crate) trait OrdinalSource: Send + Sync + 'static {
    type Ord: Ordinal;
    const KIND: OrdinalKind;
    fn get(&self, i: usize) -> Self::Ord;
}

/// The values of a primitive column.
pub(crate) struct Primitive<N: ArrowNativeType>(ScalarBuffer<N>);

impl<N: ArrowNativeType + ToOrdinal> OrdinalSource for Primitive<N> {
    type Ord = N::Ord;
    const KIND: OrdinalKind = N::KIND;
    #[inline(always)]
    fn get(&self, i: usize) -> N::Ord {
        // SAFETY: callers index rows of the column.
        unsafe { self.0.get_unchecked(i) }.ordinal()
    }
}

/// The bits of a boolean column.
pub(crate) struct Bits(BooleanBuffer);

impl OrdinalSource for Bits {
    type Ord = u8;
    const KIND: OrdinalKind = OrdinalKind::Boolean;
    #[inline(always)]
    fn get(&self, i: usize) -> u8 {
        // SAFETY: callers index rows of the column.
        unsafe { self.0.value_unchecked(i) as u8 }
    }
}

/// Dense ranks of a dictionary's values, looked up through its keys.
pub(crate) struct Ranks<K: ArrowNativeType> {
    keys: ScalarBuffer<K>,
    ranks: Arc<[u32]>,
}

impl<K: ArrowNativeType> OrdinalSource for Ranks<K> {
    type Ord = u32;
    const KIND: OrdinalKind = OrdinalKind::DictionaryRank;
    #[inline(always)]
    fn get(&self, i: usize) -> u32 {
        // SAFETY: callers index rows; valid keys index the dictionary (checked by Arrow),
        // and null rows are never read.
        unsafe { *self.ranks.get_unchecked(self.keys.get_unchecked(i).as_usize()) }
    }
}

/// A fixed-width field: the ordinal minus the column minimum (ASC) or the column maximum
/// minus the ordinal (DESC), in as many bits as the range needs.
pub(crate) struct OrdinalField<S: OrdinalSource> {
    src: S,
    min: S::Ord,
    max: S::Ord,
    bits: u32,
    descending: bool,
}

impl<S: OrdinalSource> OrdinalField<S> {
    fn new(src: S, len: usize, nulls: Option<&NullBuffer>, descending: bool) -> Self {
        let (min, max) = ordinal_bounds(&src, len, nulls).unwrap_or_default();
        Self {
            bits: max.sub(min).bit_len(),
            src,
            min,
            max,
            descending,
        }
    }
}

/// Minimum and maximum ordinal over the valid rows, or `None` when there are none.
fn ordinal_bounds<S: OrdinalSource>(src: &S, len: usize, nulls: Option<&NullBuffer>) -> Option<(S::Ord, S::Ord)> {
    (0..len.div_ceil(CHUNK))
        .into_par_iter()
        .filter_map(|c| {
            let rows = c * CHUNK..len.min((c + 1) * CHUNK);
            let mut acc: Option<(S::Ord, S::Ord)> = None;
            match nulls {
                None => {
                    let first = src.get(rows.start);
                    let (mut lo, mut hi) = (first, first);
                    for i in rows {
                        let v = src.get(i);
                        lo = lo.min(v);
                        hi = hi.max(v);
                    }
                    acc = Some((lo, hi));
                }
                Some(n) => {
                    for i in rows.filter(|&i| n.is_valid(i)) {
                        let v = src.get(i);
                        acc = Some(match acc {
                            None => (v, v),
                            Some((lo, hi)) => (lo.min(v), hi.max(v)),
                        });
                    }
                }
            }
            acc
        })
        .reduce_with(|a, b| (a.0.min(b.0), a.1.max(b.1)))
}

impl<S: OrdinalSource> FieldEncoder for OrdinalField<S> {
    fn value_bits(&self) -> u32 {
        self.bits
    }

    fn encoding(&self) -> FieldEncoding {
        FieldEncoding::Ordinal {
            kind: S::KIND,
            min: self.min.to_u256(),
            max: self.max.to_u256(),
        }
    }

    fn encode(&self, rows: Range<usize>, flag: &NullFlag, w: &KeyWriter, pos: u32) {
        let (src, min, max) = (&self.src, self.min, self.max);
        if self.descending {
            encode_ordinals(rows, flag, w, pos, self.bits, |i| max.sub(src.get(i)))
        } else {
            encode_ordinals(rows, flag, w, pos, self.bits, |i| src.get(i).sub(min))
        }
    }
}

/// Per-row byte access for string and binary columns.
pub(crate) trait BytesSource: Send + Sync + 'static {
    /// The bytes of row `i` (any value for null rows).
    fn bytes(&self, i: usize) -> &[u8];
}

pub(crate) struct OffsetBytes<T: ByteArrayType>(GenericByteArray<T>);

impl<T: ByteArrayType> BytesSource for OffsetBytes<T> {
    #[inline(always)]
    fn bytes(&self, i: usize) -> &[u8] {
        // SAFETY: callers index rows of the column.
        unsafe { self.0.value_unchecked(i) }.as_ref()
    }
}

pub(crate) struct ViewBytes<T: ByteViewType + ?Sized>(GenericByteViewArray<T>);

impl<T: ByteViewType + ?Sized> BytesSource for ViewBytes<T> {
    #[inline(always)]
    fn bytes(&self, i: usize) -> &[u8] {
        // SAFETY: callers index rows of the column.
        unsafe { self.0.value_unchecked(i) }.as_ref()
    }
}

pub(crate) struct FixedBytes(FixedSizeBinaryArray);

impl BytesSource for FixedBytes {
    #[inline(always)]
    fn bytes(&self, i: usize) -> &[u8] {
        // SAFETY: callers index rows of the column.
        unsafe { self.0.value_unchecked(i) }
    }
}

/// A string or binary field: the `prefix` bytes after the column's longest common prefix
/// `lcp` (zero-padded), then the remaining length capped at `prefix + 1`. Values longer
/// than `lcp + prefix` are truncated: rows with equal keys then need a comparison of the
/// full values (the field is not [`exact`](FieldEncoder::exact)).
pub(crate) struct BytesField<S: BytesSource> {
    src: S,
    shape: BytesShape,
    descending: bool,
}

/// What a scan of a string or binary column's valid values finds: the longest prefix they
/// share with a reference value (itself one of them), their shortest and longest length, and
/// how many there are. Scans of parts of a column fold into the column's ([`BytesScan::fold`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct BytesScan {
    pub(crate) lcp: usize,
    pub(crate) min_len: usize,
    pub(crate) max_len: usize,
    pub(crate) valid: usize,
}

impl BytesScan {
    /// Nothing seen yet, against a reference of `reference_len` bytes.
    pub(crate) fn empty(reference_len: usize) -> Self {
        Self {
            lcp: reference_len,
            min_len: usize::MAX,
            max_len: 0,
            valid: 0,
        }
    }

    /// Rows `rows` of `src` (those `nulls` says are valid) against `reference`.
    pub(crate) fn of<S: BytesSource + ?Sized>(
        src: &S,
        rows: Range<usize>,
        nulls: Option<&NullBuffer>,
        reference: &[u8],
    ) -> Self {
        let mut scan = Self::empty(reference.len());
        for i in rows.filter(|&i| nulls.is_none_or(|n| n.is_valid(i))) {
            let b = src.bytes(i);
            scan.max_len = scan.max_len.max(b.len());
            scan.min_len = scan.min_len.min(b.len());
            scan.valid += 1;
            if scan.lcp > 0 {
                scan.lcp = common_prefix(&reference[..scan.lcp], b);
            }
        }
        scan
    }

    pub(crate) fn fold(self, other: Self) -> Self {
        Self {
            lcp: self.lcp.min(other.lcp),
            min_len: self.min_len.min(other.min_len),
            max_len: self.max_len.max(other.max_len),
            valid: self.valid + other.valid,
        }
    }
}

/// A string or binary field's shape, from its column's common prefix `lcp` and its values'
/// shortest and longest length: `prefix` bytes after the common prefix, then the length capped
/// at `prefix + 1` (between `len_min` and `len_max`) in `len_bits`; exact when no value is cut.
/// `None` for the lengths: the column has no valid value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct BytesShape {
    pub(crate) lcp: usize,
    pub(crate) prefix: usize,
    pub(crate) len_min: u32,
    pub(crate) len_max: u32,
    pub(crate) len_bits: u32,
    pub(crate) exact: bool,
}

impl BytesShape {
    pub(crate) fn new(lcp: usize, lengths: Option<(usize, usize)>, options: &EncoderOptions) -> Self {
        let (lcp, (min_len, max_len)) = match lengths {
            Some(l) => (lcp, l),
            None => (0, (0, 0)),
        };
        let prefix = options.prefix_bytes(max_len - lcp);
        // The capped length grows with the length: its bounds are those of the bounds.
        let cap = |l: usize| (l - lcp).min(prefix + 1) as u32;
        let (len_min, len_max) = (cap(min_len), cap(max_len));
        Self {
            lcp,
            prefix,
            len_min,
            len_max,
            len_bits: (len_max - len_min).bit_len(),
            exact: max_len - lcp <= prefix,
        }
    }

    pub(crate) fn value_bits(&self) -> u32 {
        self.prefix as u32 * 8 + self.len_bits
    }

    pub(crate) fn encoding(&self) -> FieldEncoding {
        FieldEncoding::Bytes {
            common_prefix: self.lcp,
            prefix_bytes: self.prefix,
            len_min: self.len_min,
            len_max: self.len_max,
        }
    }
}

impl<S: BytesSource> BytesField<S> {
    fn new(src: S, len: usize, nulls: Option<&NullBuffer>, descending: bool, options: &EncoderOptions) -> Self {
        // A reference value: every common prefix is a prefix of it.
        let reference = (0..len)
            .find(|&i| nulls.is_none_or(|n| n.is_valid(i)))
            .map(|i| src.bytes(i));
        let scan = reference.map(|r| {
            (0..len.div_ceil(CHUNK))
                .into_par_iter()
                .map(|c| BytesScan::of(&src, c * CHUNK..len.min((c + 1) * CHUNK), nulls, r))
                .reduce(|| BytesScan::empty(r.len()), BytesScan::fold)
        });
        let shape = BytesShape::new(scan.map_or(0, |s| s.lcp), scan.map(|s| (s.min_len, s.max_len)), options);
        Self { src, shape, descending }
    }

    #[inline(always)]
    fn write_value(&self, w: &KeyWriter, row: usize, pos: u32) {
        let shape = &self.shape;
        let b = self.src.bytes(row);
        let tail = &b[shape.lcp.min(b.len())..];
        let invert = if self.descending { u64::MAX } else { 0 };
        // SAFETY: rows of one range are written by one thread; the field fits the key.
        let mut sink = unsafe { w.sink(row, pos) };
        let mut start = 0;
        while start < shape.prefix {
            let take = (shape.prefix - start).min(8);
            sink.push(load_be(tail, start, take) ^ invert, take as u32 * 8);
            start += take;
        }
        if shape.len_bits > 0 {
            let l = (tail.len().min(shape.prefix + 1)) as u32;
            let l = if self.descending {
                shape.len_max - l
            } else {
                l - shape.len_min
            };
            sink.push(l as u64, shape.len_bits);
        }
    }
}

/// Length of the common prefix of `a` and `b`.
#[inline]
pub fn common_prefix(a: &[u8], b: &[u8]) -> usize {
    let n = a.len().min(b.len());
    let mut i = 0;
    while i + 8 <= n {
        let x =
            u64::from_ne_bytes(a[i..i + 8].try_into().unwrap()) ^ u64::from_ne_bytes(b[i..i + 8].try_into().unwrap());
        if x != 0 {
            return i + (x.to_le().trailing_zeros() / 8) as usize;
        }
        i += 8;
    }
    while i < n && a[i] == b[i] {
        i += 1;
    }
    i
}

/// `count` (<= 8) bytes of `b` from `start`, big-endian and zero-padded past its end.
#[inline(always)]
fn load_be(b: &[u8], start: usize, count: usize) -> u64 {
    debug_assert!((1..=8).contains(&count));
    let v = if b.len() >= start + 8 {
        u64::from_be_bytes(b[start..start + 8].try_into().unwrap())
    } else {
        // Fewer than 8 bytes left: 4, 2 and 1 at a time (no call of memcpy for a few bytes).
        let avail = &b[start.min(b.len())..];
        let (mut v, mut p, mut shift) = (0u64, 0, 64);
        if avail.len() >= 4 {
            shift -= 32;
            v |= (u32::from_be_bytes(avail[..4].try_into().unwrap()) as u64) << shift;
            p = 4;
        }
        if avail.len() - p >= 2 {
            shift -= 16;
            v |= (u16::from_be_bytes(avail[p..p + 2].try_into().unwrap()) as u64) << shift;
            p += 2;
        }
        if avail.len() > p {
            v |= (avail[p] as u64) << (shift - 8);
        }
        v
    };
    v >> (64 - 8 * count as u32)
}

impl<S: BytesSource> FieldEncoder for BytesField<S> {
    fn value_bits(&self) -> u32 {
        self.shape.value_bits()
    }

    fn exact(&self) -> bool {
        self.shape.exact
    }

    fn encoding(&self) -> FieldEncoding {
        self.shape.encoding()
    }

    fn encode(&self, rows: Range<usize>, flag: &NullFlag, w: &KeyWriter, pos: u32) {
        match &flag.nulls {
            None => {
                if self.value_bits() > 0 {
                    rows.for_each(|i| self.write_value(w, i, pos))
                }
            }
            Some(nulls) => {
                for i in rows {
                    let valid = nulls.is_valid(i);
                    if valid as u64 == flag.valid_bit {
                        // SAFETY: rows of one range are written by one thread.
                        unsafe { w.put(i, pos, 1, 1) };
                    }
                    if valid {
                        self.write_value(w, i, pos + 1);
                    }
                }
            }
        }
    }
}

/// A field with no value bits: a column whose valid values are all equal or absent.
struct ConstantField;

impl FieldEncoder for ConstantField {
    fn value_bits(&self) -> u32 {
        0
    }
    fn encoding(&self) -> FieldEncoding {
        FieldEncoding::Constant
    }
    fn encode(&self, rows: Range<usize>, flag: &NullFlag, w: &KeyWriter, pos: u32) {
        encode_ordinals(rows, flag, w, pos, 0, |_| 0u8)
    }
}

/// Wraps a dictionary's rank field so that plans say what it is.
struct RankField<K: ArrowNativeType> {
    inner: OrdinalField<Ranks<K>>,
    distinct: usize,
}

impl<K: ArrowNativeType> FieldEncoder for RankField<K> {
    fn value_bits(&self) -> u32 {
        self.inner.value_bits()
    }
    fn encoding(&self) -> FieldEncoding {
        FieldEncoding::DictionaryRanks {
            distinct_values: self.distinct,
        }
    }
    fn encode(&self, rows: Range<usize>, flag: &NullFlag, w: &KeyWriter, pos: u32) {
        self.inner.encode(rows, flag, w, pos)
    }
}

/// A built field: its null flag, its value encoder, and the array tie comparisons must use
/// when it is not the column itself (nested columns become row-format binaries).
pub(crate) struct BuiltField {
    pub(crate) flag: NullFlag,
    pub(crate) encoder: Box<dyn FieldEncoder>,
    pub(crate) normalized: Option<(ArrayRef, SortOptions)>,
}

/// Builds the key field of `array` sorted with `options`.
pub(crate) fn build_field(
    name: &str,
    array: &ArrayRef,
    options: SortOptions,
    opts: &EncoderOptions,
) -> Result<BuiltField> {
    let nulls = array.logical_nulls().filter(|n| n.null_count() > 0);
    let all_null = nulls.as_ref().is_some_and(|n| n.null_count() == array.len());
    if all_null || array.data_type() == &DataType::Null {
        // Every row is null: nothing to tell apart.
        return Ok(BuiltField {
            flag: NullFlag {
                nulls: None,
                valid_bit: 0,
            },
            encoder: Box::new(ConstantField),
            normalized: None,
        });
    }
    let flag = NullFlag {
        nulls,
        valid_bit: options.nulls_first as u64,
    };
    let encoder = build_values(name, array, options, flag.nulls.as_ref(), opts);
    match encoder {
        Ok(encoder) => Ok(BuiltField {
            flag,
            encoder,
            normalized: None,
        }),
        Err(unsupported) => {
            // Nested types: Arrow's row format gives order-preserving bytes, nulls and
            // direction included, which then sort as an ascending binary column.
            let field = SortField::new_with_options(array.data_type().clone(), options);
            if !RowConverter::supports_fields(std::slice::from_ref(&field)) {
                return Err(unsupported);
            }
            let rows = RowConverter::new(vec![field])?.convert_columns(std::slice::from_ref(array))?;
            let binary: ArrayRef = Arc::new(BinaryArray::from_iter_values(rows.iter()));
            let asc = SortOptions::default();
            let encoder = build_values(name, &binary, asc, None, opts)?;
            Ok(BuiltField {
                flag: NullFlag {
                    nulls: None,
                    valid_bit: 0,
                },
                encoder,
                normalized: Some((binary, asc)),
            })
        }
    }
}

fn primitive<N: ArrowNativeType + ToOrdinal>(
    array: &ArrayRef,
    nulls: Option<&NullBuffer>,
    descending: bool,
) -> Box<dyn FieldEncoder> {
    let data = array.to_data();
    let values = ScalarBuffer::<N>::new(data.buffers()[0].clone(), data.offset(), data.len());
    Box::new(OrdinalField::new(Primitive(values), array.len(), nulls, descending))
}

fn bytes<S: BytesSource>(
    src: S,
    len: usize,
    nulls: Option<&NullBuffer>,
    descending: bool,
    opts: &EncoderOptions,
) -> Box<dyn FieldEncoder> {
    Box::new(BytesField::new(src, len, nulls, descending, opts))
}

fn build_values(
    name: &str,
    array: &ArrayRef,
    options: SortOptions,
    nulls: Option<&NullBuffer>,
    opts: &EncoderOptions,
) -> Result<Box<dyn FieldEncoder>> {
    use DataType::*;
    let desc = options.descending;
    let len = array.len();
    Ok(match array.data_type() {
        Boolean => Box::new(OrdinalField::new(
            Bits(array.as_boolean().values().clone()),
            len,
            nulls,
            desc,
        )),
        Int8 => primitive::<i8>(array, nulls, desc),
        Int16 => primitive::<i16>(array, nulls, desc),
        Int32 | Date32 | Time32(_) | Decimal32(_, _) | Interval(IntervalUnit::YearMonth) => {
            primitive::<i32>(array, nulls, desc)
        }
        Int64 | Date64 | Time64(_) | Timestamp(_, _) | Duration(_) | Decimal64(_, _) => {
            primitive::<i64>(array, nulls, desc)
        }
        UInt8 => primitive::<u8>(array, nulls, desc),
        UInt16 => primitive::<u16>(array, nulls, desc),
        UInt32 => primitive::<u32>(array, nulls, desc),
        UInt64 => primitive::<u64>(array, nulls, desc),
        Float16 => primitive::<f16>(array, nulls, desc),
        Float32 => primitive::<f32>(array, nulls, desc),
        Float64 => primitive::<f64>(array, nulls, desc),
        Decimal128(_, _) => primitive::<i128>(array, nulls, desc),
        Decimal256(_, _) => primitive::<i256>(array, nulls, desc),
        Interval(IntervalUnit::DayTime) => primitive::<IntervalDayTime>(array, nulls, desc),
        Interval(IntervalUnit::MonthDayNano) => primitive::<IntervalMonthDayNano>(array, nulls, desc),
        Utf8 => bytes(OffsetBytes(array.as_string::<i32>().clone()), len, nulls, desc, opts),
        LargeUtf8 => bytes(OffsetBytes(array.as_string::<i64>().clone()), len, nulls, desc, opts),
        Binary => bytes(OffsetBytes(array.as_binary::<i32>().clone()), len, nulls, desc, opts),
        LargeBinary => bytes(OffsetBytes(array.as_binary::<i64>().clone()), len, nulls, desc, opts),
        Utf8View => bytes(ViewBytes(array.as_string_view().clone()), len, nulls, desc, opts),
        BinaryView => bytes(ViewBytes(array.as_binary_view().clone()), len, nulls, desc, opts),
        FixedSizeBinary(_) => bytes(FixedBytes(array.as_fixed_size_binary().clone()), len, nulls, desc, opts),
        Dictionary(key, value) if is_flat(value) => match key.as_ref() {
            Int8 => ranks::<Int8Type>(array, nulls, desc)?,
            Int16 => ranks::<Int16Type>(array, nulls, desc)?,
            Int32 => ranks::<Int32Type>(array, nulls, desc)?,
            Int64 => ranks::<Int64Type>(array, nulls, desc)?,
            UInt8 => ranks::<UInt8Type>(array, nulls, desc)?,
            UInt16 => ranks::<UInt16Type>(array, nulls, desc)?,
            UInt32 => ranks::<UInt32Type>(array, nulls, desc)?,
            UInt64 => ranks::<UInt64Type>(array, nulls, desc)?,
            other => return Err(unsupported(name, array, format!("dictionary keys of type {other}"))),
        },
        _ => return Err(unsupported(name, array, "no radix key encoding for this type".into())),
    })
}

/// The scan of a string or binary column given in `parts` (arrays of one type, one after the
/// other), in parallel over the parts' chunks of rows; `None` when no value is valid, an error
/// for a type that is not string or binary.
pub(crate) fn scan_parts(parts: &[&dyn Array]) -> Result<Option<BytesScan>> {
    fn scan<S: BytesSource>(parts: Vec<(S, Option<NullBuffer>, usize)>) -> Option<BytesScan> {
        let reference = (parts.iter()).find_map(|(src, nulls, len)| {
            (0..*len)
                .find(|&i| nulls.as_ref().is_none_or(|n| n.is_valid(i)))
                .map(|i| src.bytes(i))
        })?;
        let tasks: Vec<(usize, usize)> = (parts.iter().enumerate())
            .flat_map(|(p, (_, _, len))| (0..len.div_ceil(CHUNK)).map(move |c| (p, c)))
            .collect();
        Some(
            tasks
                .into_par_iter()
                .map(|(p, c)| {
                    let (src, nulls, len) = &parts[p];
                    BytesScan::of(src, c * CHUNK..(*len).min((c + 1) * CHUNK), nulls.as_ref(), reference)
                })
                .reduce(|| BytesScan::empty(reference.len()), BytesScan::fold),
        )
    }
    fn sources<S: BytesSource>(
        parts: &[&dyn Array],
        f: impl Fn(&dyn Array) -> S,
    ) -> Vec<(S, Option<NullBuffer>, usize)> {
        (parts.iter())
            .map(|a| (f(*a), a.logical_nulls().filter(|n| n.null_count() > 0), a.len()))
            .collect()
    }
    use DataType::*;
    let Some(first) = parts.first() else {
        return Ok(None);
    };
    Ok(match first.data_type() {
        Utf8 => scan(sources(parts, |a| OffsetBytes(a.as_string::<i32>().clone()))),
        LargeUtf8 => scan(sources(parts, |a| OffsetBytes(a.as_string::<i64>().clone()))),
        Binary => scan(sources(parts, |a| OffsetBytes(a.as_binary::<i32>().clone()))),
        LargeBinary => scan(sources(parts, |a| OffsetBytes(a.as_binary::<i64>().clone()))),
        Utf8View => scan(sources(parts, |a| ViewBytes(a.as_string_view().clone()))),
        BinaryView => scan(sources(parts, |a| ViewBytes(a.as_binary_view().clone()))),
        FixedSizeBinary(_) => scan(sources(parts, |a| FixedBytes(a.as_fixed_size_binary().clone()))),
        other => {
            return Err(GpusortError::InvalidOption(format!(
                "a byte scan of a column of type {other}"
            )));
        }
    })
}

/// Types with a direct key encoding (dictionary values must be one of these).
fn is_flat(t: &DataType) -> bool {
    !t.is_nested() && !matches!(t, DataType::Dictionary(_, _) | DataType::Null)
}

fn unsupported(name: &str, array: &ArrayRef, reason: String) -> GpusortError {
    GpusortError::UnsupportedType {
        column: name.to_string(),
        data_type: array.data_type().clone(),
        reason,
    }
}

/// Dictionary columns sort by value: each dictionary value gets its dense rank among the
/// distinct values, and rows encode the rank of their key's value.
fn ranks<K: ArrowDictionaryKeyType>(
    array: &ArrayRef,
    nulls: Option<&NullBuffer>,
    descending: bool,
) -> Result<Box<dyn FieldEncoder>> {
    let dict = array.as_dictionary::<K>();
    let values = dict.values();
    let order = arrow::compute::sort_to_indices(values, None, None)?;
    let cmp = arrow::array::make_comparator(values.as_ref(), values.as_ref(), SortOptions::default())?;
    let mut ranks = vec![0u32; values.len()];
    let mut rank = 0u32;
    for (k, w) in order.values().iter().enumerate() {
        if k > 0 && cmp(order.value(k - 1) as usize, *w as usize).is_ne() {
            rank += 1;
        }
        ranks[*w as usize] = rank;
    }
    let distinct = if values.is_empty() { 0 } else { rank as usize + 1 };
    let src = Ranks {
        keys: dict.keys().values().clone(),
        ranks: ranks.into(),
    };
    Ok(Box::new(RankField {
        inner: OrdinalField::new(src, array.len(), nulls, descending),
        distinct,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn common_prefix_lengths() {
        assert_eq!(common_prefix(b"", b"abc"), 0);
        assert_eq!(common_prefix(b"abcdefghij", b"abcdefghiX"), 9);
        assert_eq!(common_prefix(b"abcdefgh", b"abcdefgh"), 8);
        assert_eq!(common_prefix(b"abcdefghijklmnopq", b"abcdefghijklmnopz"), 16);
        assert_eq!(common_prefix(b"xbc", b"abc"), 0);
        assert_eq!(common_prefix(b"abcd", b"abc"), 3);
    }

    #[test]
    fn load_be_pads_with_zeros() {
        assert_eq!(load_be(b"ab", 0, 4), 0x6162_0000);
        assert_eq!(load_be(b"abcdefghij", 2, 8), u64::from_be_bytes(*b"cdefghij"));
        assert_eq!(load_be(b"abc", 5, 2), 0);
        assert_eq!(load_be(b"abcdefghij", 8, 3), 0x696a00);
        // Every length left past `start` (0 to 7 read 4, 2 and 1 bytes at a time, 8 and more
        // at once) against a zero-padded copy.
        let bytes: Vec<u8> = (1..=24).collect();
        for len in 0..=bytes.len() {
            for start in 0..=len + 2 {
                for count in 1..=8 {
                    let mut padded = [0u8; 8];
                    for (i, p) in padded.iter_mut().enumerate().take(count) {
                        *p = bytes[..len].get(start + i).copied().unwrap_or(0);
                    }
                    let want = u64::from_be_bytes(padded) >> (64 - 8 * count as u32);
                    assert_eq!(load_be(&bytes[..len], start, count), want, "{len} {start} {count}");
                }
            }
        }
    }
}
