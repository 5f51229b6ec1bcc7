//! The key encoder: Arrow sort columns to order-preserving unsigned radix keys.
//!
//! A sort over columns `k0, k1, ...` becomes a sort over one unsigned integer per row, the
//! **key**, whose natural order is the SQL order of the rows. The key is the concatenation,
//! most significant first, of one **field** per sort column:
//!
//! ```text
//!   key = [null flag k0][value bits k0][null flag k1][value bits k1] ...
//! ```
//!
//! - The null flag exists only when the column holds nulls; it is 0 for the rows that sort
//!   first (nulls with NULLS FIRST, values with NULLS LAST). Null rows have zero value bits.
//! - Fixed-width values map to an unsigned [ordinal](ordinal) in the type's order, then to
//!   `ordinal - min` (ASC) or `max - ordinal` (DESC) over the column's valid values, in
//!   exactly the bits that range needs: a column of `i64` between 1000 and 1255 costs 8 bits.
//! - Strings and binaries skip the longest prefix common to all values, keep the next
//!   [`EncoderOptions::max_prefix_bytes`] bytes, zero-padded, then the remaining length
//!   capped at one past the prefix. When a value is longer, its field is inexact: rows
//!   whose keys agree up to the end of that field get ordered by comparing full values
//!   (see [`KeyLayout::first_inexact`]).
//! - Dictionaries encode the dense rank of their value among the dictionary's distinct
//!   values; booleans one bit; nested types (lists, structs) go through Arrow's row format
//!   and then sort as binaries.
//!
//! The key is stored **ByField** (one array per 32-bit word, word 0 most significant) in
//! [`EncodedKeys`]: the layout the radix sorts of Bandyopadhyay & Sahni read, where a pass
//! over a digit reads one word array.

mod field;
pub mod ordinal;
mod writer;

use arrow::array::RecordBatch;
use arrow::compute::{SortColumn, SortOptions};
use rayon::prelude::*;

pub use field::common_prefix;
pub use ordinal::{OrdinalKind, U256};

use crate::error::{GpusortError, Result};
use crate::spec::SortSpec;
use field::{BuiltField, CHUNK, build_field};
use writer::KeyWriter;

/// Options of the key encoder.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct EncoderOptions {
    /// Bytes of a string or binary value (after the common prefix) that go into the key.
    /// Longer values are ordered by comparing them whole where their prefixes tie.
    pub max_prefix_bytes: usize,
    /// A string or binary column whose longest value (after the common prefix) is at most this
    /// many bytes goes into the key whole, even past `max_prefix_bytes`: no rows tie on a
    /// truncated prefix, so none need their values compared. 0 (the default): only
    /// `max_prefix_bytes`. Worth it where a key byte costs less than comparing tied rows does
    /// (on a GPU a 32-bit key word costs a few milliseconds over 60M rows, while ordering
    /// TPC-H `l_comment`'s 2.8M groups tied on 32 bytes took ~0.35 s).
    pub whole_values_up_to: usize,
}

impl Default for EncoderOptions {
    fn default() -> Self {
        Self {
            max_prefix_bytes: 8,
            whole_values_up_to: 0,
        }
    }
}

impl EncoderOptions {
    /// Bytes of a column's values (after their common prefix) that its key field holds, when
    /// the longest is `longest` bytes.
    pub fn prefix_bytes(&self, longest: usize) -> usize {
        if longest <= self.whole_values_up_to {
            longest
        } else {
            longest.min(self.max_prefix_bytes)
        }
    }

    /// These options without [`Self::whole_values_up_to`].
    pub fn without_whole_values(&self) -> Self {
        Self {
            whole_values_up_to: 0,
            ..self.clone()
        }
    }
}

/// How a field's value bits are computed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FieldEncoding {
    /// No value bits: the column's valid values are all equal (or there are none).
    Constant,
    /// `ordinal - min` (ASC) or `max - ordinal` (DESC) of a fixed-width value.
    Ordinal {
        /// How values map to ordinals.
        kind: OrdinalKind,
        /// Smallest ordinal among valid values.
        min: U256,
        /// Largest ordinal among valid values.
        max: U256,
    },
    /// A byte prefix and a capped length.
    Bytes {
        /// Bytes every valid value starts with (skipped).
        common_prefix: usize,
        /// Bytes after that in the key.
        prefix_bytes: usize,
        /// Smallest capped length among valid values.
        len_min: u32,
        /// Largest capped length among valid values.
        len_max: u32,
    },
    /// The dense rank of a dictionary value.
    DictionaryRanks {
        /// Distinct values in the dictionary.
        distinct_values: usize,
    },
}

/// One sort column's place in the key.
#[derive(Debug, Clone, PartialEq)]
pub struct KeyField {
    /// Index of the column in the input.
    pub column: usize,
    /// The sort options the field's bits are encoded with: the sort key's, except for a column
    /// encoded through Arrow's row format (nested types), whose bytes already order the rows as
    /// the key asks and are encoded ascending.
    pub options: SortOptions,
    /// Position of the field's first bit, counted from the key's most significant bit.
    pub pos: u32,
    /// 1 when the field starts with a null flag, else 0.
    pub null_bits: u32,
    /// Bits of the value part.
    pub value_bits: u32,
    /// False when rows with equal field bits may hold different values.
    pub exact: bool,
    /// How the value bits are computed.
    pub encoding: FieldEncoding,
}

impl KeyField {
    /// Bits of the whole field.
    pub fn bits(&self) -> u32 {
        self.null_bits + self.value_bits
    }

    /// Position one past the field's last bit.
    pub fn end(&self) -> u32 {
        self.pos + self.bits()
    }
}

/// The shape of a key: its fields and their bit positions.
#[derive(Debug, Clone, PartialEq)]
pub struct KeyLayout {
    fields: Vec<KeyField>,
    total_bits: u32,
}

impl KeyLayout {
    /// The fields, most significant first.
    pub fn fields(&self) -> &[KeyField] {
        &self.fields
    }

    /// Bits of the whole key.
    pub fn total_bits(&self) -> u32 {
        self.total_bits
    }

    /// 32-bit words per key.
    pub fn num_words(&self) -> usize {
        self.total_bits.div_ceil(32) as usize
    }

    /// Leading unused bits of word 0.
    pub fn pad(&self) -> u32 {
        32 * self.num_words() as u32 - self.total_bits
    }

    /// True when equal keys mean equal sort values.
    pub fn is_exact(&self) -> bool {
        self.fields.iter().all(|f| f.exact)
    }

    /// Index of the first inexact field, if any.
    pub fn first_inexact(&self) -> Option<usize> {
        self.fields.iter().position(|f| !f.exact)
    }

    /// Which bits of word `w` belong to fields `0..=field` (a mask over the word).
    pub fn word_mask_through(&self, field: usize, w: usize) -> u32 {
        let end = self.pad() + self.fields[field].end(); // in padded bit positions
        let word_start = 32 * w as u32;
        if end >= word_start + 32 {
            u32::MAX
        } else if end <= word_start {
            0
        } else {
            !(u32::MAX >> (end - word_start))
        }
    }
}

impl KeyLayout {
    /// The layout of the fields of `spec`'s keys, given for each its null bits, value bits,
    /// exactness and encoding, placed one after the other from the most significant bit.
    /// The layout of `spec`'s keys from each field's parts: the options its value bits are
    /// encoded with (the key's own, but ascending for a column encoded through Arrow's row
    /// format, whose bytes carry the key's direction and null order already), null flag bits,
    /// value bits, whether it is exact, and its encoding.
    fn from_parts(
        spec: &SortSpec,
        parts: impl Iterator<Item = (SortOptions, u32, u32, bool, FieldEncoding)>,
    ) -> Result<Self> {
        let mut pos = 0u32;
        let mut fields = Vec::with_capacity(spec.len());
        for (k, (options, null_bits, value_bits, exact, encoding)) in spec.keys().iter().zip(parts) {
            let field = KeyField {
                column: k.column,
                options,
                pos,
                null_bits,
                value_bits,
                exact,
                encoding,
            };
            pos = pos
                .checked_add(field.bits())
                .ok_or_else(|| GpusortError::InvalidOption("sort key longer than 2^32 bits".into()))?;
            fields.push(field);
        }
        Ok(Self {
            fields,
            total_bits: pos,
        })
    }

    /// The layout [`KeyEncoder::try_new`] builds for sort columns that are all
    /// [native](native_ordinal_kind), from their statistics alone (gathered where the values
    /// are, e.g. on a GPU): `stats[i]` describes the column of `spec`'s key `i`.
    ///
    /// A field gets a null flag when its column has both null and valid rows, and
    /// `bit_len(max - min)` value bits; a column whose rows are all null is a constant field.
    pub fn from_native_stats(spec: &SortSpec, stats: &[NativeColumnStats]) -> Result<Self> {
        let stats: Vec<ColumnStats> = stats.iter().map(|s| ColumnStats::Native(*s)).collect();
        Self::from_column_stats(spec, &stats, &EncoderOptions::default())
    }

    /// The layout [`KeyEncoder::try_new`] builds with `options`, from each sort column's
    /// statistics alone: [`KeyLayout::from_native_stats`]'s fields for native columns, and
    /// for string and binary columns the field of their common prefix and lengths.
    pub fn from_column_stats(spec: &SortSpec, stats: &[ColumnStats], options: &EncoderOptions) -> Result<Self> {
        if stats.len() != spec.len() {
            return Err(GpusortError::InvalidOption(format!(
                "{} column statistics for {} sort keys",
                stats.len(),
                spec.len()
            )));
        }
        Self::from_parts(
            spec,
            spec.keys().iter().zip(stats).map(|(k, s)| {
                let (rows, valid_rows) = s.rows();
                if valid_rows == 0 && rows > 0 {
                    // Every row null: nothing to tell apart.
                    return (k.options, 0, 0, true, FieldEncoding::Constant);
                }
                let null_bits = (valid_rows < rows) as u32;
                match s {
                    ColumnStats::Native(s) => {
                        let (min, max) = s.bounds.unwrap_or_default();
                        let value_bits = u64::BITS - max.wrapping_sub(min).leading_zeros();
                        let encoding = FieldEncoding::Ordinal {
                            kind: s.kind,
                            min: U256 { hi: 0, lo: min as u128 },
                            max: U256 { hi: 0, lo: max as u128 },
                        };
                        (k.options, null_bits, value_bits, true, encoding)
                    }
                    ColumnStats::Bytes(s) => {
                        let shape = s.shape(options);
                        (k.options, null_bits, shape.value_bits(), shape.exact, shape.encoding())
                    }
                }
            }),
        )
    }

    /// Most words a key of `spec` over columns of `schema` can take, encoded with `options`
    /// less [`EncoderOptions::whole_values_up_to`], when every sort column is
    /// [native](native_ordinal_kind) or a string or binary view (a null flag, every bit of the
    /// type, or the prefix and its capped length); else `None`. With the views' statistics,
    /// [`Self::device_words`] bounds the key whole values make.
    pub fn device_max_words(
        spec: &SortSpec,
        schema: &arrow::datatypes::Schema,
        options: &EncoderOptions,
    ) -> Option<usize> {
        use arrow::datatypes::DataType;
        key_words_of(spec, schema, |_, data_type| match data_type {
            DataType::Utf8View | DataType::BinaryView => {
                let prefix = options.max_prefix_bytes;
                Some(8 * prefix + (usize::BITS - (prefix + 1).leading_zeros()) as usize)
            }
            t => native_bits(t),
        })
    }

    /// Most words a key of `spec` over columns of `schema` takes, encoded with `options`, when
    /// every sort column is [native](native_ordinal_kind) or a string or binary view whose
    /// statistics `bytes` holds (one entry a key: `Some` for views, `None` for natives): a null
    /// flag, and every bit of the type or the bits the view's statistics give its field (which
    /// [`EncoderOptions::whole_values_up_to`] may take past [`Self::device_max_words`]); else
    /// `None`.
    pub fn device_words(
        spec: &SortSpec,
        schema: &arrow::datatypes::Schema,
        options: &EncoderOptions,
        bytes: &[Option<BytesColumnStats>],
    ) -> Option<usize> {
        if bytes.len() != spec.len() {
            return None;
        }
        key_words_of(spec, schema, |i, data_type| match &bytes[i] {
            Some(s) => Some(s.shape(options).value_bits() as usize),
            None => native_bits(data_type),
        })
    }

    /// Most words a key of `spec` over columns of `schema` can take when every sort column is
    /// [native](native_ordinal_kind) (a null flag and every bit of the type per field), else
    /// `None`.
    pub fn native_max_words(spec: &SortSpec, schema: &arrow::datatypes::Schema) -> Option<usize> {
        key_words_of(spec, schema, |_, data_type| native_bits(data_type))
    }
}

/// The 32-bit words of a key of `spec` over columns of `schema` whose `i`-th field takes a
/// null flag and `value_bits(i, its type)` bits; `None` where a field's bits are not known.
fn key_words_of(
    spec: &SortSpec,
    schema: &arrow::datatypes::Schema,
    value_bits: impl Fn(usize, &arrow::datatypes::DataType) -> Option<usize>,
) -> Option<usize> {
    let mut bits = 0usize;
    for (i, k) in spec.keys().iter().enumerate() {
        bits += 1 + value_bits(i, schema.fields().get(k.column)?.data_type())?;
    }
    Some(bits.div_ceil(32))
}

/// Every bit of a [native](native_ordinal_kind) type; `None` for other types.
fn native_bits(data_type: &arrow::datatypes::DataType) -> Option<usize> {
    Some(8 * native_ordinal_kind(data_type)?.native_width()? as usize)
}

/// What a sort column of a native type (see [`native_ordinal_kind`]) contributes to its key
/// field: enough to lay the key out without the values ([`KeyLayout::from_native_stats`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NativeColumnStats {
    /// How the column's values map to ordinals.
    pub kind: OrdinalKind,
    /// Rows of the column.
    pub rows: usize,
    /// Rows that are not null.
    pub valid_rows: usize,
    /// Smallest and largest ordinal among the valid rows (`None` when there are none).
    pub bounds: Option<(u64, u64)>,
}

/// The ordinal kind of a column type whose values are native integers or floats of 1, 2, 4
/// or 8 bytes, stored as such ([`OrdinalKind::Unsigned`], [`OrdinalKind::Signed`] or
/// [`OrdinalKind::Float`]): the types whose keys a device can encode from the raw values.
/// `None` for every other type (booleans, intervals, 16 and 32-byte decimals, strings,
/// dictionaries, nested types).
pub fn native_ordinal_kind(data_type: &arrow::datatypes::DataType) -> Option<OrdinalKind> {
    use arrow::datatypes::{DataType::*, IntervalUnit};
    Some(match data_type {
        Int8 => OrdinalKind::Signed(1),
        Int16 => OrdinalKind::Signed(2),
        Int32 | Date32 | Time32(_) | Decimal32(_, _) | Interval(IntervalUnit::YearMonth) => OrdinalKind::Signed(4),
        Int64 | Date64 | Time64(_) | Timestamp(_, _) | Duration(_) | Decimal64(_, _) => OrdinalKind::Signed(8),
        UInt8 => OrdinalKind::Unsigned(1),
        UInt16 => OrdinalKind::Unsigned(2),
        UInt32 => OrdinalKind::Unsigned(4),
        UInt64 => OrdinalKind::Unsigned(8),
        Float16 => OrdinalKind::Float(2),
        Float32 => OrdinalKind::Float(4),
        Float64 => OrdinalKind::Float(8),
        _ => return None,
    })
}

/// What a string or binary sort column contributes to its key field: its valid values'
/// longest common prefix and their shortest and longest length ([`bytes_column_stats`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BytesColumnStats {
    /// Rows of the column.
    pub rows: usize,
    /// Rows that are not null.
    pub valid_rows: usize,
    /// Bytes every valid value starts with.
    pub common_prefix: usize,
    /// The shortest valid value's length (0 when there is none).
    pub min_len: usize,
    /// The longest valid value's length.
    pub max_len: usize,
}

impl BytesColumnStats {
    /// The field's shape under `options`.
    fn shape(&self, options: &EncoderOptions) -> field::BytesShape {
        let lengths = (self.valid_rows > 0).then_some((self.min_len, self.max_len));
        field::BytesShape::new(self.common_prefix, lengths, options)
    }

    /// Whether the field holds every value whole under `options` (no value longer than the
    /// prefix past the common one): when it does not, rows with equal keys need their whole
    /// values compared.
    pub fn is_exact(&self, options: &EncoderOptions) -> bool {
        self.shape(options).exact
    }
}

/// What one sort column contributes to its key field, gathered where its values are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ColumnStats {
    /// A native column's bounds.
    Native(NativeColumnStats),
    /// A string or binary column's common prefix and lengths.
    Bytes(BytesColumnStats),
}

impl ColumnStats {
    /// Rows, and rows that are not null.
    fn rows(&self) -> (usize, usize) {
        match self {
            Self::Native(s) => (s.rows, s.valid_rows),
            Self::Bytes(s) => (s.rows, s.valid_rows),
        }
    }
}

/// The statistics of a string or binary column given in `parts` (arrays of one type, one
/// after the other, e.g. the batches of a sort): one pass over the values on every core, no
/// concatenation. Fails for a column of another type.
pub fn bytes_column_stats(parts: &[&dyn arrow::array::Array]) -> Result<BytesColumnStats> {
    let rows = parts.iter().map(|a| a.len()).sum();
    Ok(match field::scan_parts(parts)? {
        Some(scan) => BytesColumnStats {
            rows,
            valid_rows: scan.valid,
            common_prefix: scan.lcp,
            min_len: scan.min_len,
            max_len: scan.max_len,
        },
        None => BytesColumnStats {
            rows,
            valid_rows: 0,
            common_prefix: 0,
            min_len: 0,
            max_len: 0,
        },
    })
}

/// Keys in the ByField layout: `words[w][row]`, word 0 most significant.
#[derive(Debug, Clone, PartialEq)]
pub struct EncodedKeys {
    /// One array per 32-bit word of the key.
    pub words: Vec<Vec<u32>>,
    /// Rows.
    pub num_rows: usize,
}

/// Rows of a key tile: every field is written into a tile before the next tile is cleared, so
/// that its words (11 a row for lineitem's `l_comment, l_orderkey, l_linenumber`: 22 KiB) stay
/// in the first-level cache while the fields OR their bits in. Measured on 2 cores (stop 27; 6M rows of an l_comment-like string,
/// an i64 and an i32): 55-59 ns a row a thread, against 62-72 with whole chunks of 16K rows.
pub const ENCODE_TILE: usize = 512;

/// Builds the keys of a batch: analyzes the sort columns once ([`KeyEncoder::try_new`]),
/// then writes the keys ([`KeyEncoder::encode`]).
pub struct KeyEncoder {
    layout: KeyLayout,
    fields: Vec<BuiltField>,
    sort_columns: Vec<SortColumn>,
    num_rows: usize,
}

impl std::fmt::Debug for KeyEncoder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KeyEncoder")
            .field("layout", &self.layout)
            .field("num_rows", &self.num_rows)
            .finish()
    }
}

/// Whether a key of type `data_type` may encode inexactly (a prefix of its values, so that
/// rows with equal keys are ordered by comparing the values): strings and binaries, fixed-size
/// binaries longer than `max_prefix_bytes`, and nested types (sorted as the bytes of Arrow's row
/// format). Whether it does depends on the data: values that differ only in their first
/// `max_prefix_bytes` bytes past their common prefix encode exactly.
pub fn may_encode_inexactly(data_type: &arrow::datatypes::DataType, max_prefix_bytes: usize) -> bool {
    use arrow::datatypes::DataType::*;
    match data_type {
        Utf8 | LargeUtf8 | Utf8View | Binary | LargeBinary | BinaryView => true,
        FixedSizeBinary(n) => usize::try_from(*n).is_ok_and(|n| n > max_prefix_bytes),
        Dictionary(_, _) => false,
        t => t.is_nested(),
    }
}

/// Whether a sort key of type `data_type` can be encoded (every type but a few nested ones
/// Arrow's row format cannot order, and dictionaries with non-integer keys).
pub fn is_sortable(data_type: &arrow::datatypes::DataType) -> bool {
    let empty = arrow::array::new_empty_array(data_type);
    build_field("", &empty, SortOptions::default(), &EncoderOptions::default()).is_ok()
}

impl KeyEncoder {
    /// Analyzes the sort columns of `batch` named by `spec`.
    ///
    /// Fails with [`GpusortError::UnsupportedType`] naming the column for a type that
    /// cannot be sorted.
    pub fn try_new(batch: &RecordBatch, spec: &SortSpec, options: &EncoderOptions) -> Result<Self> {
        spec.validate(batch.num_columns())?;
        let schema = batch.schema();
        let fields = spec
            .keys()
            .iter()
            .map(|k| {
                let name = schema.field(k.column).name();
                build_field(name, batch.column(k.column), k.options, options)
            })
            .collect::<Result<Vec<_>>>()?;
        let layout = KeyLayout::from_parts(
            spec,
            spec.keys().iter().zip(&fields).map(|(k, f)| {
                (
                    f.normalized.as_ref().map_or(k.options, |(_, options)| *options),
                    f.flag.bits(),
                    f.encoder.value_bits(),
                    f.encoder.exact(),
                    f.encoder.encoding(),
                )
            }),
        )?;
        let sort_columns = spec
            .keys()
            .iter()
            .zip(&fields)
            .map(|(k, f)| match &f.normalized {
                Some((values, options)) => SortColumn {
                    values: values.clone(),
                    options: Some(*options),
                },
                None => SortColumn {
                    values: batch.column(k.column).clone(),
                    options: Some(k.options),
                },
            })
            .collect();
        Ok(Self {
            layout,
            fields,
            sort_columns,
            num_rows: batch.num_rows(),
        })
    }

    /// The key's shape.
    pub fn layout(&self) -> &KeyLayout {
        &self.layout
    }

    /// The columns (and options) that order rows exactly, one per field: what rows with
    /// tied inexact keys are compared by.
    pub fn sort_columns(&self) -> &[SortColumn] {
        &self.sort_columns
    }

    /// Writes the keys of all rows.
    pub fn encode(&self) -> EncodedKeys {
        let n = self.num_rows;
        let mut words: Vec<Vec<u32>> = (0..self.layout.num_words()).map(|_| vec![0u32; n]).collect();
        let mut views: Vec<&mut [u32]> = words.iter_mut().map(|w| &mut w[..]).collect();
        self.encode_into(&mut views);
        EncodedKeys { words, num_rows: n }
    }

    /// Writes the keys of all rows into `words` (one slice of at least `num_rows` words per
    /// key word, word 0 most significant; their contents do not matter) and returns, for each
    /// word, the bits that differ between rows (what [`crate::plan::varying_bits`] computes),
    /// found while the rows are in cache: a bit varies when it is set in some row (OR over the
    /// rows) and clear in another (AND over the rows).
    ///
    /// Rows are written in parallel chunks, each cleared first (a tile of [`ENCODE_TILE`] rows
    /// at a time, so that the fields' bits are ORed into words still in the core's first-level
    /// cache), so the destination may be
    /// recycled memory (a pinned buffer of a transfer pool).
    pub fn encode_into(&self, words: &mut [&mut [u32]]) -> Vec<u32> {
        let n = self.num_rows;
        assert_eq!(words.len(), self.layout.num_words(), "one slice per key word");
        assert!(words.iter().all(|w| w.len() >= n), "slices of at least {n} words");
        if words.is_empty() || n == 0 {
            return vec![0; words.len()];
        }
        let writer = KeyWriter::new(words, self.layout.total_bits);
        let num_words = words.len();
        let (or, and) = (0..n.div_ceil(CHUNK))
            .into_par_iter()
            .map(|c| {
                let rows = c * CHUNK..n.min((c + 1) * CHUNK);
                for tile in rows.clone().step_by(ENCODE_TILE) {
                    let tile = tile..rows.end.min(tile + ENCODE_TILE);
                    // SAFETY: each chunk clears and writes its own rows.
                    unsafe { writer.clear(tile.clone()) };
                    for (f, built) in self.layout.fields.iter().zip(&self.fields) {
                        if f.bits() > 0 {
                            built.encoder.encode(tile.clone(), &built.flag, &writer, f.pos);
                        }
                    }
                }
                // SAFETY: as above; the rows were just written.
                let bits = (0..num_words).map(|w| unsafe { writer.or_and(w, rows.clone()) });
                bits.unzip::<u32, u32, Vec<u32>, Vec<u32>>()
            })
            .reduce(
                || (vec![0; num_words], vec![u32::MAX; num_words]),
                |(mut o, mut a), (o2, a2)| {
                    for w in 0..num_words {
                        o[w] |= o2[w];
                        a[w] &= a2[w];
                    }
                    (o, a)
                },
            );
        or.iter().zip(&and).map(|(o, a)| o & !a).collect()
    }
}

#[cfg(test)]
mod tests;
