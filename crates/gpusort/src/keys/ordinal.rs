//! Order-preserving unsigned images ("ordinals") of Arrow's fixed-width native types.
//!
//! Every sortable fixed-width value maps to an unsigned integer whose natural order equals
//! the order Arrow's sort kernels use for the type:
//! - unsigned integers: themselves;
//! - signed integers (and decimals, dates, times, timestamps, durations): the sign bit flipped;
//! - floats: IEEE 754 `totalOrder` (what [`f32::total_cmp`] implements and what Arrow sorts
//!   by): negative values have every bit flipped, others only the sign bit, so
//!   `-NaN < -inf < ... < -0.0 < +0.0 < ... < +inf < +NaN`;
//! - intervals: their fields, each as a signed integer, concatenated most significant first
//!   (Arrow compares intervals field by field).

use arrow::array::types::{IntervalDayTime, IntervalMonthDayNano};
use arrow::datatypes::i256;
use half::f16;

/// An unsigned integer key image: the arithmetic and bit output the encoder needs.
pub trait Ordinal: Copy + Ord + Default + Send + Sync + std::fmt::Debug + 'static {
    /// Width of the type in bits.
    const BITS: u32;
    /// `self - rhs`, wrapping (callers only subtract smaller values).
    fn sub(self, rhs: Self) -> Self;
    /// The number of bits needed to write `self` (0 for zero).
    fn bit_len(self) -> u32;
    /// Calls `put(chunk, chunk_bits)` with the low `bits` bits of `self`, most significant
    /// chunk first, in chunks of at most 64 bits.
    fn for_each_chunk(self, bits: u32, put: impl FnMut(u64, u32));
    /// The low 64 bits.
    fn low_u64(self) -> u64;
    /// Widens to [`U256`].
    fn to_u256(self) -> U256;
    /// Narrows from [`U256`] (the value must fit).
    fn from_u256(v: U256) -> Self;
}

macro_rules! ordinal_uint {
    ($($t:ty),*) => {$(
        impl Ordinal for $t {
            const BITS: u32 = <$t>::BITS;
            #[inline(always)]
            fn sub(self, rhs: Self) -> Self {
                self.wrapping_sub(rhs)
            }
            #[inline(always)]
            fn bit_len(self) -> u32 {
                <$t>::BITS - self.leading_zeros()
            }
            #[inline(always)]
            fn for_each_chunk(self, bits: u32, mut put: impl FnMut(u64, u32)) {
                let v = self as u128;
                if bits > 64 {
                    put((v >> 64) as u64, bits - 64);
                    put(v as u64, 64);
                } else if bits > 0 {
                    put(v as u64, bits);
                }
            }
            #[inline(always)]
            fn low_u64(self) -> u64 {
                self as u64
            }
            #[inline(always)]
            fn to_u256(self) -> U256 {
                U256 { hi: 0, lo: self as u128 }
            }
            #[inline(always)]
            fn from_u256(v: U256) -> Self {
                v.lo as $t
            }
        }
    )*};
}
ordinal_uint!(u8, u16, u32, u64, u128);

/// A 256-bit unsigned integer, the ordinal of `Decimal256`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Default, Hash)]
pub struct U256 {
    /// High 128 bits (compared first).
    pub hi: u128,
    /// Low 128 bits.
    pub lo: u128,
}

impl Ordinal for U256 {
    const BITS: u32 = 256;
    #[inline(always)]
    fn sub(self, rhs: Self) -> Self {
        let (lo, borrow) = self.lo.overflowing_sub(rhs.lo);
        let hi = self.hi.wrapping_sub(rhs.hi).wrapping_sub(borrow as u128);
        U256 { hi, lo }
    }
    #[inline(always)]
    fn bit_len(self) -> u32 {
        if self.hi != 0 {
            256 - self.hi.leading_zeros()
        } else {
            128 - self.lo.leading_zeros()
        }
    }
    #[inline(always)]
    fn for_each_chunk(self, bits: u32, mut put: impl FnMut(u64, u32)) {
        let limbs = [
            (self.hi >> 64) as u64,
            self.hi as u64,
            (self.lo >> 64) as u64,
            self.lo as u64,
        ];
        let mut remaining = bits;
        while remaining > 0 {
            let limb = (remaining - 1) / 64; // counted from the least significant limb
            let take = remaining - limb * 64;
            put(limbs[3 - limb as usize], take);
            remaining -= take;
        }
    }
    fn low_u64(self) -> u64 {
        self.lo as u64
    }
    fn to_u256(self) -> U256 {
        self
    }
    fn from_u256(v: U256) -> Self {
        v
    }
}

/// How a fixed-width native value maps to its ordinal: what a GPU encoder must do to the
/// raw bits it uploads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum OrdinalKind {
    /// An unsigned integer of this many bytes: the bits themselves.
    Unsigned(u8),
    /// A two's complement integer of this many bytes: the sign bit flipped.
    Signed(u8),
    /// An IEEE float of this many bytes: `totalOrder`.
    Float(u8),
    /// A bit of a boolean bitmap.
    Boolean,
    /// `IntervalDayTime`: two signed 32-bit fields.
    IntervalDayTime,
    /// `IntervalMonthDayNano`: signed 32, 32 and 64-bit fields.
    IntervalMonthDayNano,
    /// A dense rank looked up through a dictionary key.
    DictionaryRank,
}

impl OrdinalKind {
    /// Bytes of a value of an unsigned, signed or float kind (`None` for the others).
    pub fn native_width(self) -> Option<u8> {
        match self {
            OrdinalKind::Unsigned(w) | OrdinalKind::Signed(w) | OrdinalKind::Float(w) => Some(w),
            _ => None,
        }
    }
}

/// A native value with an order-preserving [`Ordinal`] image.
pub trait ToOrdinal: Copy {
    /// The ordinal type.
    type Ord: Ordinal;
    /// How the mapping is done.
    const KIND: OrdinalKind;
    /// The ordinal of `self`.
    fn ordinal(self) -> Self::Ord;
}

macro_rules! to_ordinal_unsigned {
    ($($t:ty),*) => {$(
        impl ToOrdinal for $t {
            type Ord = $t;
            const KIND: OrdinalKind = OrdinalKind::Unsigned(std::mem::size_of::<$t>() as u8);
            #[inline(always)]
            fn ordinal(self) -> $t { self }
        }
    )*};
}
to_ordinal_unsigned!(u8, u16, u32, u64);

macro_rules! to_ordinal_signed {
    ($($t:ty => $u:ty),*) => {$(
        impl ToOrdinal for $t {
            type Ord = $u;
            const KIND: OrdinalKind = OrdinalKind::Signed(std::mem::size_of::<$t>() as u8);
            #[inline(always)]
            fn ordinal(self) -> $u { (self as $u) ^ (1 << (<$u>::BITS - 1)) }
        }
    )*};
}
to_ordinal_signed!(i8 => u8, i16 => u16, i32 => u32, i64 => u64, i128 => u128);

macro_rules! to_ordinal_float {
    ($($t:ty => $u:ty),*) => {$(
        impl ToOrdinal for $t {
            type Ord = $u;
            const KIND: OrdinalKind = OrdinalKind::Float(std::mem::size_of::<$t>() as u8);
            #[inline(always)]
            fn ordinal(self) -> $u {
                let bits = self.to_bits();
                let sign = 1 << (<$u>::BITS - 1);
                // Negative: flip all bits; non-negative: flip the sign bit.
                bits ^ ((((bits as $u) >> (<$u>::BITS - 1)).wrapping_neg()) | sign)
            }
        }
    )*};
}
to_ordinal_float!(f32 => u32, f64 => u64, f16 => u16);

impl ToOrdinal for i256 {
    type Ord = U256;
    const KIND: OrdinalKind = OrdinalKind::Signed(32);
    #[inline(always)]
    fn ordinal(self) -> U256 {
        let (lo, hi) = self.to_parts();
        U256 {
            hi: (hi as u128) ^ (1 << 127),
            lo,
        }
    }
}

impl ToOrdinal for IntervalDayTime {
    type Ord = u64;
    const KIND: OrdinalKind = OrdinalKind::IntervalDayTime;
    #[inline(always)]
    fn ordinal(self) -> u64 {
        ((self.days.ordinal() as u64) << 32) | self.milliseconds.ordinal() as u64
    }
}

impl ToOrdinal for IntervalMonthDayNano {
    type Ord = u128;
    const KIND: OrdinalKind = OrdinalKind::IntervalMonthDayNano;
    #[inline(always)]
    fn ordinal(self) -> u128 {
        ((self.months.ordinal() as u128) << 96)
            | ((self.days.ordinal() as u128) << 64)
            | self.nanoseconds.ordinal() as u128
    }
}

impl ToOrdinal for bool {
    type Ord = u8;
    const KIND: OrdinalKind = OrdinalKind::Boolean;
    #[inline(always)]
    fn ordinal(self) -> u8 {
        self as u8
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check_order<T: ToOrdinal + std::fmt::Debug>(sorted: &[T]) {
        for w in sorted.windows(2) {
            assert!(w[0].ordinal() < w[1].ordinal(), "{:?} !< {:?} as ordinals", w[0], w[1]);
        }
    }

    #[test]
    fn integers_keep_order_at_extremes() {
        check_order(&[i8::MIN, -1, 0, 1, i8::MAX]);
        check_order(&[i16::MIN, -300, 0, 300, i16::MAX]);
        check_order(&[i32::MIN, i32::MIN + 1, -1, 0, 1, i32::MAX - 1, i32::MAX]);
        check_order(&[i64::MIN, -1, 0, i64::MAX]);
        check_order(&[i128::MIN, -1, 0, 1, i128::MAX]);
        check_order(&[0u8, 1, 200, u8::MAX]);
        check_order(&[0u64, 1, u64::MAX - 1, u64::MAX]);
    }

    #[test]
    fn floats_follow_total_order() {
        let neg_nan = f64::from_bits(f64::NAN.to_bits() | (1 << 63));
        let vals = [
            neg_nan,
            f64::NEG_INFINITY,
            f64::MIN,
            -1.0,
            -f64::MIN_POSITIVE,
            -0.0,
            0.0,
            f64::MIN_POSITIVE,
            1.0,
            f64::MAX,
            f64::INFINITY,
            f64::NAN,
            f64::from_bits(0x7fff_ffff_ffff_ffff), // NaN with the largest payload
        ];
        check_order(&vals);
        for a in vals {
            for b in vals {
                assert_eq!(a.total_cmp(&b), a.ordinal().cmp(&b.ordinal()), "{a} {b}");
            }
        }
        let f32s = [f32::NEG_INFINITY, -1.5, -0.0, 0.0, 1e-40, 2.0, f32::INFINITY, f32::NAN];
        check_order(&f32s);
        let halves: Vec<f16> = [-65504.0f32, -1.0, -0.0, 0.0, 0.5, 65504.0]
            .iter()
            .map(|v| f16::from_f32(*v))
            .chain([f16::INFINITY, f16::NAN])
            .collect();
        check_order(&halves);
    }

    #[test]
    fn i256_and_intervals() {
        check_order(&[
            i256::MIN,
            i256::from_i128(i128::MIN),
            i256::MINUS_ONE,
            i256::ZERO,
            i256::ONE,
            i256::from_i128(i128::MAX),
            i256::MAX,
        ]);
        check_order(&[
            IntervalDayTime::new(-1, 5),
            IntervalDayTime::new(0, i32::MIN),
            IntervalDayTime::new(0, -1),
            IntervalDayTime::new(0, 0),
            IntervalDayTime::new(1, -100),
        ]);
        check_order(&[
            IntervalMonthDayNano::new(-1, 100, 0),
            IntervalMonthDayNano::new(0, -5, i64::MAX),
            IntervalMonthDayNano::new(0, 0, i64::MIN),
            IntervalMonthDayNano::new(0, 0, 0),
            IntervalMonthDayNano::new(1, -100, -100),
        ]);
    }

    #[test]
    fn u256_arithmetic_and_chunks() {
        let a = U256 { hi: 1, lo: 0 };
        let b = U256 { hi: 0, lo: 1 };
        assert_eq!(a.sub(b), U256 { hi: 0, lo: u128::MAX });
        assert_eq!(a.bit_len(), 129);
        assert_eq!(U256::default().bit_len(), 0);
        let mut chunks = vec![];
        U256 {
            hi: 0x3,
            lo: (7u128 << 64) | 9,
        }
        .for_each_chunk(130, |v, n| chunks.push((v, n)));
        assert_eq!(chunks, vec![(3, 2), (7, 64), (9, 64)]);
        let mut chunks = vec![];
        0xABCDu128.for_each_chunk(16, |v, n| chunks.push((v, n)));
        assert_eq!(chunks, vec![(0xABCD, 16)]);
    }
}
