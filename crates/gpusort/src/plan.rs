//! Sort strategies and the planner.
//!
//! Bandyopadhyay & Sahni ("Sorting Large Multifield Records on a GPU", section III) name two
//! ways of sorting records by key: **direct**, where every record moves with its key in
//! every radix pass, and **indirect**, where `(key, row index)` pairs are sorted and each
//! payload column is then gathered once through the index. They extend two GPU radix
//! sorts, **GRS** (section VI) and **SRTS** (section V), both ways, and find (section VII)
//! for 32-bit keys:
//!
//! | layout  | best                                               |
//! |---------|----------------------------------------------------|
//! | ByField | GRS-direct with >= 12 payload fields, else SRTS-direct |
//! | Hybrid  | SRTS-indirect                                      |
//!
//! [`Strategy::paper_default`] is that rule. The paper's third family, **sample sort**
//! (section IV), is [`Algorithm::Sample`]: rows split into buckets by splitters drawn from a
//! sample, then each bucket sorted in shared memory (see `kernels/sample.cu`). Beside them there
//! is gpusort's own [`Algorithm::Msd`]: most-significant-digit partitioning into segments that
//! one GPU block sorts in shared memory, which moves the payload about twice whatever the key's
//! length (see `kernels/msd.cu`). [`radix_passes`] splits a key into the digits of an LSD radix sort,
//! skipping bits that are equal in every row.

use std::fmt;
use std::str::FromStr;

use crate::error::GpusortError;

/// How records are laid out in memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Layout {
    /// One array per column (what Arrow gives).
    #[default]
    ByField,
    /// The key in one array, the other fields of each record together in a second,
    /// row-major array.
    Hybrid,
}

/// The radix sort family.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Algorithm {
    /// GRS: per-tile histogram and ranks, a scan of tile histograms, then each tile's
    /// records placed by rank in shared memory and written out coalesced.
    Grs,
    /// SRTS: a persistent grid; bottom-level reduction, top-level scan, bottom-level scan
    /// with a local scatter before the coalesced write.
    Srts,
    /// MSD hybrid: partition passes on the most significant digits (up to 11 bits) until
    /// every segment fits one block's shared memory, then a block-local sort of each segment
    /// on its remaining digits. Not in the paper; on the CPU backend it is the same radix sort.
    Msd,
    /// Sample sort (the paper's section IV, after Leischner, Osipov & Sanders): splitters from a
    /// sample of the keys, every row put in the bucket between two splitters (or the bucket of
    /// keys equal to one), recursively until each bucket fits one block, then each bucket sorted
    /// in shared memory. The paper's comparison sort; on the CPU backend it is the same radix sort.
    Sample,
}

impl Algorithm {
    /// Whether the family ends in block-local sorts of segments ([`Self::Msd`] and
    /// [`Self::Sample`]): on the GPU these hold the key in shared memory, so they take only keys
    /// of a few words.
    pub fn sorts_in_blocks(self) -> bool {
        matches!(self, Self::Msd | Self::Sample)
    }
}

/// The order a sort found its input in, when that let it skip the radix passes (see
/// `cpu::presorted`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum InputOrder {
    /// Already in key order: the rows stay where they are.
    Sorted,
    /// In reverse key order: groups of equal keys are reversed, each kept in input order.
    Reversed,
    /// This many ascending runs, merged.
    Runs(usize),
    /// This many distinct keys, counted.
    FewDistinct(usize),
}

impl fmt::Display for InputOrder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Sorted => write!(f, "sorted"),
            Self::Reversed => write!(f, "reversed"),
            Self::Runs(k) => write!(f, "{k} sorted runs"),
            Self::FewDistinct(k) => write!(f, "{k} distinct keys"),
        }
    }
}

/// How payload moves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RecordMove {
    /// Payload moves with the key in every pass.
    Direct,
    /// `(key, index)` is sorted, then each payload column is gathered once.
    Indirect,
}

/// An algorithm and a way of moving records.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Strategy {
    /// The radix sort family (the CPU backend has one radix sort and ignores it).
    pub algorithm: Algorithm,
    /// Direct or indirect.
    pub record_move: RecordMove,
}

impl Strategy {
    /// GRS, direct.
    pub const GRS_DIRECT: Self = Self::new(Algorithm::Grs, RecordMove::Direct);
    /// GRS, indirect.
    pub const GRS_INDIRECT: Self = Self::new(Algorithm::Grs, RecordMove::Indirect);
    /// SRTS, direct.
    pub const SRTS_DIRECT: Self = Self::new(Algorithm::Srts, RecordMove::Direct);
    /// SRTS, indirect.
    pub const SRTS_INDIRECT: Self = Self::new(Algorithm::Srts, RecordMove::Indirect);
    /// MSD hybrid, direct.
    pub const MSD_DIRECT: Self = Self::new(Algorithm::Msd, RecordMove::Direct);
    /// MSD hybrid, indirect.
    pub const MSD_INDIRECT: Self = Self::new(Algorithm::Msd, RecordMove::Indirect);
    /// Sample sort, direct.
    pub const SAMPLE_DIRECT: Self = Self::new(Algorithm::Sample, RecordMove::Direct);
    /// Sample sort, indirect.
    pub const SAMPLE_INDIRECT: Self = Self::new(Algorithm::Sample, RecordMove::Indirect);
    /// The paper's four.
    pub const PAPER: [Self; 4] = [
        Self::GRS_DIRECT,
        Self::GRS_INDIRECT,
        Self::SRTS_DIRECT,
        Self::SRTS_INDIRECT,
    ];
    /// All eight.
    pub const ALL: [Self; 8] = [
        Self::GRS_DIRECT,
        Self::GRS_INDIRECT,
        Self::SRTS_DIRECT,
        Self::SRTS_INDIRECT,
        Self::MSD_DIRECT,
        Self::MSD_INDIRECT,
        Self::SAMPLE_DIRECT,
        Self::SAMPLE_INDIRECT,
    ];

    /// The names of [`Self::ALL`], comma-separated (`grs-direct, grs-indirect, ...`): for
    /// messages and help texts that list the strategies.
    pub fn names() -> String {
        Self::ALL.map(|s| s.to_string()).join(", ")
    }

    /// A strategy.
    pub const fn new(algorithm: Algorithm, record_move: RecordMove) -> Self {
        Self { algorithm, record_move }
    }

    /// The paper's cost rule: ByField with at least 12 payload fields -> GRS-direct, other
    /// ByField -> SRTS-direct, Hybrid -> SRTS-indirect. `payload_fields` counts the fields
    /// besides the key (see [`payload_fields`]).
    pub fn paper_default(layout: Layout, payload_fields: usize) -> Self {
        match layout {
            Layout::ByField if payload_fields >= 12 => Self::GRS_DIRECT,
            Layout::ByField => Self::SRTS_DIRECT,
            Layout::Hybrid => Self::SRTS_INDIRECT,
        }
    }
}

impl Strategy {
    /// gpusort's default (`auto`): the paper's benchmark re-run on an H100 (`paper` bench of
    /// gpusort-cuda, 10M rows, u32 key + m u32 fields, 8-bit digits,
    /// docs/results/h100-stop19-lanes-in-flight-v11/). There the paper's C1060 rule is off by
    /// up to 3.1x: an LSD pass that moves m narrow columns scatters each of them, while the
    /// indirect strategy sorts only key and index and then gathers the columns once, packed
    /// into rows (gather.cu). SRTS's 8-bit passes run as one sweep (onesweep.cu), so SRTS leads GRS
    /// everywhere it matters: SRTS-direct at m <= 2 (ByField m = 2: 0.723 ms, SRTS-indirect
    /// 0.788, GRS-direct 0.958) and SRTS-indirect beyond in the ByField layout (m = 4: 1.022
    /// against SRTS-direct's 1.240); SRTS-direct up to m = 3 in the Hybrid one (direct wins at
    /// m = 2, indirect at m = 4; m = 3 is not measured).
    pub fn calibrated_default(layout: Layout, payload_fields: usize) -> Self {
        match layout {
            Layout::ByField if payload_fields <= 2 => Self::SRTS_DIRECT,
            Layout::ByField => Self::SRTS_INDIRECT,
            Layout::Hybrid if payload_fields <= 3 => Self::SRTS_DIRECT,
            Layout::Hybrid => Self::SRTS_INDIRECT,
        }
    }
}

/// The paper's `m`: fields of a record besides its key. A table of `columns` columns sorted
/// by `sort_keys` of them has `columns - sort_keys` (the key columns travel as the key).
pub fn payload_fields(columns: usize, sort_keys: usize) -> usize {
    columns.saturating_sub(sort_keys)
}

impl fmt::Display for Strategy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let a = match self.algorithm {
            Algorithm::Grs => "grs",
            Algorithm::Srts => "srts",
            Algorithm::Msd => "msd",
            Algorithm::Sample => "samplesort",
        };
        let m = match self.record_move {
            RecordMove::Direct => "direct",
            RecordMove::Indirect => "indirect",
        };
        write!(f, "{a}-{m}")
    }
}

impl FromStr for Strategy {
    type Err = GpusortError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::ALL
            .into_iter()
            .find(|x| x.to_string().eq_ignore_ascii_case(s.trim()))
            .ok_or_else(|| {
                GpusortError::InvalidOption(format!("unknown strategy '{s}': expected one of {}", Self::names()))
            })
    }
}

/// One pass of an LSD radix sort: bits `shift .. shift + bits` of key word `word`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RadixPass {
    /// The key word (0 = most significant).
    pub word: usize,
    /// The digit's lowest bit in the word.
    pub shift: u32,
    /// The digit's width.
    pub bits: u32,
}

impl RadixPass {
    /// The digit of `word_value`.
    #[inline(always)]
    pub fn digit(&self, word_value: u32) -> usize {
        ((word_value >> self.shift) & ((1u32 << self.bits) - 1)) as usize
    }

    /// Buckets of the digit.
    pub fn buckets(&self) -> usize {
        1 << self.bits
    }
}

/// The passes of an LSD radix sort, least significant first, over key words whose bits
/// that differ between rows are `varying[w]` (see [`varying_bits`]). Each word's span of
/// varying bits is cut into as few digits of at most `max_digit_bits` as possible, of
/// near-equal width; words (and low or high bits of words) equal in every row get no pass.
pub fn radix_passes(varying: &[u32], max_digit_bits: u32) -> Vec<RadixPass> {
    assert!((1..=16).contains(&max_digit_bits), "digit width must be 1..=16 bits");
    let mut passes = vec![];
    for (word, &v) in varying.iter().enumerate().rev() {
        if v == 0 {
            continue;
        }
        let lo = v.trailing_zeros();
        let width = 32 - v.leading_zeros() - lo;
        let n = width.div_ceil(max_digit_bits);
        let (base, extra) = (width / n, width % n);
        let mut shift = lo;
        for d in 0..n {
            let bits = base + (d < extra) as u32;
            let pass = RadixPass { word, shift, bits };
            // A digit with no varying bit (inside a wide span) is equal in every row.
            if v & (((1u64 << bits) - 1) << shift) as u32 != 0 {
                passes.push(pass);
            }
            shift += bits;
        }
    }
    passes
}

/// For each key word, the bits that are not equal in every row (`OR ^ AND` over rows).
pub fn varying_bits(words: &[Vec<u32>]) -> Vec<u32> {
    use rayon::prelude::*;
    words
        .iter()
        .map(|w| {
            let Some(&first) = w.first() else { return 0 };
            w.par_chunks(1 << 16)
                .map(|c| c.iter().fold(0u32, |acc, &x| acc | (x ^ first)))
                .reduce(|| 0, |a, b| a | b)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paper_rule() {
        assert_eq!(Strategy::paper_default(Layout::ByField, 2), Strategy::SRTS_DIRECT);
        assert_eq!(Strategy::paper_default(Layout::ByField, 11), Strategy::SRTS_DIRECT);
        assert_eq!(Strategy::paper_default(Layout::ByField, 12), Strategy::GRS_DIRECT);
        assert_eq!(Strategy::paper_default(Layout::ByField, 20), Strategy::GRS_DIRECT);
        assert_eq!(Strategy::paper_default(Layout::Hybrid, 2), Strategy::SRTS_INDIRECT);
        assert_eq!(Strategy::paper_default(Layout::Hybrid, 20), Strategy::SRTS_INDIRECT);
        assert_eq!(payload_fields(21, 1), 20);
        assert_eq!(payload_fields(1, 3), 0);
    }

    #[test]
    fn calibrated_rule() {
        let by_field = |m| Strategy::calibrated_default(Layout::ByField, m);
        assert_eq!(by_field(0), Strategy::SRTS_DIRECT);
        assert_eq!(by_field(2), Strategy::SRTS_DIRECT);
        assert_eq!(by_field(3), Strategy::SRTS_INDIRECT);
        assert_eq!(by_field(20), Strategy::SRTS_INDIRECT);
        let hybrid = |m| Strategy::calibrated_default(Layout::Hybrid, m);
        assert_eq!(hybrid(2), Strategy::SRTS_DIRECT);
        assert_eq!(hybrid(3), Strategy::SRTS_DIRECT);
        assert_eq!(hybrid(4), Strategy::SRTS_INDIRECT);
    }

    #[test]
    fn strategies_parse_and_print() {
        for s in Strategy::ALL {
            assert_eq!(s.to_string().parse::<Strategy>().unwrap(), s);
        }
        assert_eq!("GRS-Direct".parse::<Strategy>().unwrap(), Strategy::GRS_DIRECT);
        let err = "quick".parse::<Strategy>().unwrap_err().to_string();
        assert!(err.contains("quick") && err.contains("srts-indirect"), "{err}");
        assert_eq!(
            Strategy::names(),
            "grs-direct, grs-indirect, srts-direct, srts-indirect, msd-direct, msd-indirect, \
             samplesort-direct, samplesort-indirect"
        );
    }

    #[test]
    fn passes_cover_varying_bits_only() {
        // A full 32-bit word with 8-bit digits: 4 passes.
        let p = radix_passes(&[u32::MAX], 8);
        assert_eq!(p.len(), 4);
        assert_eq!((p[0].shift, p[0].bits), (0, 8));
        assert_eq!((p[3].shift, p[3].bits), (24, 8));
        // 11-bit digits: 3 passes of 11, 11, 10.
        let p = radix_passes(&[u32::MAX], 11);
        assert_eq!(p.iter().map(|p| p.bits).collect::<Vec<_>>(), vec![11, 11, 10]);
        // Constant words and low bits are skipped; least significant word first.
        let p = radix_passes(&[0x0000_0F00, 0, 0xFFFF_0000], 8);
        assert_eq!(
            p,
            vec![
                RadixPass {
                    word: 2,
                    shift: 16,
                    bits: 8
                },
                RadixPass {
                    word: 2,
                    shift: 24,
                    bits: 8
                },
                RadixPass {
                    word: 0,
                    shift: 8,
                    bits: 4
                },
            ]
        );
        assert!(radix_passes(&[0, 0], 8).is_empty());
        // Digits with no varying bit inside a wide span are skipped.
        let p = radix_passes(&[0x8000_0001], 8);
        assert_eq!(
            p,
            vec![
                RadixPass {
                    word: 0,
                    shift: 0,
                    bits: 8
                },
                RadixPass {
                    word: 0,
                    shift: 24,
                    bits: 8
                }
            ]
        );
        // 20 varying bits in 16-bit digits: two passes of 10.
        let p = radix_passes(&[0x000F_FFFF], 16);
        assert_eq!(p.iter().map(|p| p.bits).collect::<Vec<_>>(), vec![10, 10]);
    }

    #[test]
    fn varying_bits_of_words() {
        let words = [vec![5u32, 5, 5], vec![0b100, 0b110, 0b101], vec![]];
        assert_eq!(varying_bits(&words[..2]), vec![0, 0b011]);
        assert_eq!(varying_bits(&words[2..]), vec![0]);
    }
}
