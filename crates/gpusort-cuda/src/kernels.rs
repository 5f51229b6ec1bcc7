//! The CUDA kernels: their sources (embedded from `kernels/`), compilation with NVRTC for the
//! device's architecture, and an on-disk cache of the compiled CUBIN keyed by the source hash,
//! the architecture, the compile options and the NVRTC version.

use std::ffi::CStr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use cudarc::driver::{CudaContext, CudaFunction, CudaModule, sys::CUfunction_attribute};
use cudarc::nvrtc::{Ptx, result as nvrtc, sys as nvrtc_sys};

use crate::error::{CudaSortError, Result};
use crate::shapes::DynSmem;

/// The shared header every family's program starts with.
pub const COMMON: (&str, &str) = ("common.cuh", include_str!("../kernels/common.cuh"));

/// The kernel families, one source file each (`kernels/`): each is compiled by NVRTC as a
/// program of its own (the defines, [`COMMON`], the family), all at once on threads of their
/// own, and loaded as a module of its own. One program of every source took ~10 s to compile
/// on the H100 machine, one thread; the largest family alone (onesweep.cu) takes about a
/// quarter of that.
pub const FAMILIES: &[(&str, &str)] = &[
    ("grs.cu", include_str!("../kernels/grs.cu")),
    ("srts.cu", include_str!("../kernels/srts.cu")),
    ("gather.cu", include_str!("../kernels/gather.cu")),
    ("msd.cu", include_str!("../kernels/msd.cu")),
    ("onesweep.cu", include_str!("../kernels/onesweep.cu")),
    ("keys.cu", include_str!("../kernels/keys.cu")),
    ("presorted.cu", include_str!("../kernels/presorted.cu")),
    ("ties.cu", include_str!("../kernels/ties.cu")),
    ("merge.cu", include_str!("../kernels/merge.cu")),
    ("sample.cu", include_str!("../kernels/sample.cu")),
    ("parquet.cu", include_str!("../kernels/parquet.cu")),
];

/// The family (source file of [`FAMILIES`]) that defines kernel `name`.
pub fn family_of(name: &str) -> &'static str {
    match name {
        n if n.starts_with("grs_") || n.starts_with("scan_") => "grs.cu",
        n if n.starts_with("srts_") => "srts.cu",
        n if n.starts_with("onesweep_") => "onesweep.cu",
        n if n.starts_with("msd_") => "msd.cu",
        "key_bounds" | "encode_keys" => "keys.cu",
        "order_scan" | "reverse_lanes" | "reverse_iota" | "reverse_groups" | "distinct_sample" | "distinct_ranks" => {
            "presorted.cu"
        }
        n if n.starts_with("ties_") => "ties.cu",
        n if n.starts_with("merge_") => "merge.cu",
        n if n.starts_with("sample_") => "sample.cu",
        n if n.starts_with("parquet_") => "parquet.cu",
        _ => "gather.cu",
    }
}

/// NVRTC options besides the architecture.
pub const OPTIONS: &[&str] = &["-std=c++17", "-lineinfo"];

/// The program of one family: [`COMMON`], then the family's source.
pub fn family_source(family: &str, text: &str) -> String {
    format!(
        "// ---- {} ----\n{}\n// ---- {family} ----\n{text}\n",
        COMMON.0, COMMON.1
    )
}

/// The kernels' compile-time settings the host may choose: each is a `#define` put before the
/// sources, so it is part of the source hash and the cache key. `None` keeps the default: the
/// host's for the tile sizes ([`DEFAULT_ONESWEEP_IPT`], [`BLOCK`]), the sources' for the others.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KernelTuning {
    /// Rows per thread of a GRS / SRTS / MSD tile (`IPT`; `GPUSORT_IPT`).
    pub ipt: usize,
    /// Rows per thread of a one-sweep tile (`ONESWEEP_IPT`, default [`DEFAULT_ONESWEEP_IPT`];
    /// `GPUSORT_ONESWEEP_IPT`).
    pub onesweep_ipt: Option<usize>,
    /// Threads of a one-sweep block (`ONESWEEP_BLOCK`, default [`BLOCK`]; 256 to 512, whole
    /// warps; `GPUSORT_ONESWEEP_BLOCK`).
    pub onesweep_block: Option<u32>,
    /// Blocks per SM the one-sweep pass is compiled for (`ONESWEEP_MIN_BLOCKS`, default 768
    /// threads' worth: 3 blocks of 256, 2 of 384, 1 of 512; at most 2048 threads in all;
    /// `GPUSORT_ONESWEEP_MIN_BLOCKS`).
    pub onesweep_min_blocks: Option<u32>,
    /// Where the one-sweep scatter's digit words come from: 0 read again, 1 registers, 2 shared
    /// memory (`ONESWEEP_KEEP_WORDS`, default 2; `GPUSORT_ONESWEEP_KEEP_WORDS`).
    pub onesweep_keep_words: Option<u32>,
    /// Look-back words loaded at once (`ONESWEEP_LOOKBACK_WINDOW`;
    /// `GPUSORT_ONESWEEP_LOOKBACK_WINDOW`).
    pub onesweep_lookback_window: Option<u32>,
    /// Whether the tile rank folds each digit's block start into the warps' counters, so that
    /// an item reads one shared counter instead of two (`RANK_FOLD`, default 1;
    /// `GPUSORT_RANK_FOLD`).
    pub rank_fold: Option<u32>,
}

/// Rows per thread of a tile by default (`IPT`).
pub const DEFAULT_IPT: usize = 16;

/// Rows per thread of a one-sweep tile by default (`ONESWEEP_IPT`).
pub const DEFAULT_ONESWEEP_IPT: usize = 20;

/// Threads per block of every sort kernel (`BLOCK` in the kernels), and of the one-sweep pass
/// unless [`KernelTuning::onesweep_block`] says otherwise.
pub const BLOCK: u32 = 256;

/// A lane's values are the row indices themselves, no source (`LANE_IOTA`).
pub(crate) const LANE_IOTA: u32 = 1;
/// A lane is the key word of the pass's digit (`LANE_DIGIT`).
pub(crate) const LANE_DIGIT: u32 = 2;
/// A lane the MSD block-local sort leaves unwritten (`LANE_SKIP`).
pub(crate) const LANE_SKIP: u32 = 4;
/// A lane and the next move as a pair (`LANE_PAIR`; lanes.rs `mark_lane_pairs`).
pub(crate) const LANE_PAIR: u32 = 8;

/// Rows each thread of the gather kernels moves at once (`GATHER_ROWS`).
pub(crate) const GATHER_ROWS: usize = 8;
/// Rows of a `pack_rows` / `gather_unpack` tile (`PACK_ROWS`): one per thread.
pub(crate) const PACK_ROWS: u32 = 256;

/// Most key words `encode_keys` writes (`KEY_MAX_WORDS`; the host encodes longer keys itself).
pub const KEY_MAX_WORDS: usize = 16;
/// keys.cu's code of an unsigned ordinal (`KIND_UNSIGNED`; `gpusort::keys::OrdinalKind`).
pub(crate) const KIND_UNSIGNED: u32 = 0;
/// keys.cu's code of a signed ordinal (`KIND_SIGNED`).
pub(crate) const KIND_SIGNED: u32 = 1;
/// keys.cu's code of a floating-point ordinal (`KIND_FLOAT`).
pub(crate) const KIND_FLOAT: u32 = 2;
/// keys.cu's code of a string or binary view field (`KIND_VIEW`: a prefix and a capped length).
pub(crate) const KIND_VIEW: u32 = 3;

/// Constants the host and the kernels share, by the kernels' names, each with whether the
/// kernels use it as an unsigned literal (`1u`): [`KernelTuning::defines`] puts them before every
/// program, so no source defines them (each checks with `#error` that they are there) and the
/// two sides cannot differ. The tile sizes ([`KernelTuning`]) are emitted beside them.
pub const SHARED_CONSTANTS: &[(&str, u64, bool)] = &[
    ("BLOCK", BLOCK as u64, false),
    ("LANE_IOTA", LANE_IOTA as u64, true),
    ("LANE_DIGIT", LANE_DIGIT as u64, true),
    ("LANE_SKIP", LANE_SKIP as u64, true),
    ("LANE_PAIR", LANE_PAIR as u64, true),
    ("GATHER_ROWS", GATHER_ROWS as u64, true),
    ("PACK_ROWS", PACK_ROWS as u64, false),
    ("KEY_MAX_WORDS", KEY_MAX_WORDS as u64, false),
    ("KIND_UNSIGNED", KIND_UNSIGNED as u64, true),
    ("KIND_SIGNED", KIND_SIGNED as u64, true),
    ("KIND_FLOAT", KIND_FLOAT as u64, true),
    ("KIND_VIEW", KIND_VIEW as u64, true),
    ("MSD_BINS_B8", MSD_BINS[0] as u64, false),
    ("MSD_BINS_B11", MSD_BINS[1] as u64, false),
    ("MSD_RANK_SMEM_B8", MSD_RANK_SMEM[0] as u64, false),
    ("MSD_RANK_SMEM_B11", MSD_RANK_SMEM[1] as u64, false),
    ("LOCAL_BLOCK", MSD_LOCAL_BLOCK as u64, false),
    ("LOCAL_CAP", MSD_LOCAL_CAP as u64, false),
    ("LOCAL_MAX_WORDS", MSD_LOCAL_MAX_WORDS as u64, false),
    ("LOCAL_MAX_SEGS", MSD_LOCAL_MAX_SEGS as u64, false),
    ("ONESWEEP_MAX_DIGITS", ONESWEEP_MAX_DIGITS as u64, false),
    ("ONESWEEP_HIST_IPT", ONESWEEP_HIST_IPT as u64, false),
    ("ONESWEEP_VALUE", ONESWEEP_MAX_ROWS as u64, true),
    ("ORDER_SCAN_MAX_WORDS", ORDER_SCAN_MAX_WORDS as u64, false),
    ("ORDER_SCAN_MAX_DESCENTS", ORDER_SCAN_MAX_DESCENTS as u64, false),
    ("REVERSE_MAX_LANES", REVERSE_MAX_LANES as u64, false),
    ("REVERSE_ITEMS", REVERSE_ITEMS as u64, true),
    ("REVERSE_GROUPS_BLOCK", REVERSE_GROUPS_BLOCK as u64, false),
    ("REVERSE_GROUPS_IPT", REVERSE_GROUPS_IPT as u64, false),
    ("REVERSE_GROUPS_TILE", REVERSE_GROUPS_TILE as u64, true),
    ("DISTINCT_MAX", DISTINCT_MAX as u64, true),
    ("DISTINCT_SAMPLE", DISTINCT_SAMPLE as u64, true),
    ("DISTINCT_SLOTS", DISTINCT_SLOTS as u64, true),
    ("DISTINCT_BLOCK", DISTINCT_BLOCK as u64, false),
    ("SCAN_DISTINCT", SCAN_DISTINCT as u64, false),
    ("SCAN_MISSING", SCAN_MISSING as u64, false),
    ("TIES_CAP", TIES_CAP as u64, false),
    ("TIES_BLOCK", TIES_BLOCK as u64, false),
    ("TIES_MAX_ROUNDS", TIES_MAX_ROUNDS as u64, false),
    ("MERGE_BLOCK", MERGE_BLOCK as u64, false),
    ("MERGE_IPT", MERGE_IPT as u64, false),
    ("MERGE_MAX_WORDS", MERGE_MAX_WORDS as u64, false),
    ("SAMPLE_SPLITTERS", SAMPLE_SPLITTERS as u64, false),
    ("SAMPLE_OVERSAMPLE", SAMPLE_OVERSAMPLE as u64, false),
    ("SAMPLE_SIZE", SAMPLE_SIZE as u64, false),
    ("PARQUET_BLOCK", PARQUET_BLOCK as u64, false),
    ("PARQUET_TILE", PARQUET_TILE as u64, false),
    ("PARQUET_VIEWS_BLOCK", PARQUET_VIEWS_BLOCK as u64, false),
    ("PARQUET_VIEWS_CHUNK", PARQUET_VIEWS_CHUNK as u64, false),
    ("PARQUET_PLAIN", crate::parquet::PAGE_PLAIN as u64, true),
    ("PARQUET_DICT", crate::parquet::PAGE_DICT as u64, true),
    ("PARQUET_V1_LEVELS", crate::parquet::PAGE_V1_LEVELS as u64, true),
    ("PARQUET_OPTIONAL", crate::parquet::PAGE_OPTIONAL as u64, true),
];

/// Threads of a `parquet_decode` block (`PARQUET_BLOCK`): one block a page.
pub(crate) const PARQUET_BLOCK: u32 = 256;
/// Values of a page one `parquet_decode` tile takes (`PARQUET_TILE`): two a thread; the runs of
/// the hybrid encoding covering a tile, two tables of as many, fill 16 KiB of shared memory.
pub(crate) const PARQUET_TILE: u32 = 2 * PARQUET_BLOCK;
/// Threads of a `parquet_plain_views` block (`PARQUET_VIEWS_BLOCK`): one block a region.
pub(crate) const PARQUET_VIEWS_BLOCK: u32 = 128;
/// Bytes of a region `parquet_plain_views` copies to shared memory at a time
/// (`PARQUET_VIEWS_CHUNK`), with two words a value it may hold (values take 4 bytes at least):
/// 16 KiB in all.
pub(crate) const PARQUET_VIEWS_CHUNK: u32 = 4096;

/// Splitters a segment of a sample sort is split by (`SAMPLE_SPLITTERS` in kernels/sample.cu):
/// with the buckets of keys equal to a splitter, `2 * 127 + 1 = 255` buckets, which the 256-bin
/// MSD partition scatter moves.
pub const SAMPLE_SPLITTERS: usize = 127;
/// Sample keys drawn for each splitter (`SAMPLE_OVERSAMPLE`): the paper's oversampling, which
/// evens out the buckets.
pub const SAMPLE_OVERSAMPLE: usize = 16;
/// Keys sampled from a segment (`SAMPLE_SIZE`), sorted in one block's shared memory.
pub const SAMPLE_SIZE: usize = (SAMPLE_SPLITTERS + 1) * SAMPLE_OVERSAMPLE;

/// Threads of a `merge_tiles` block (`MERGE_BLOCK`).
pub const MERGE_BLOCK: u32 = 128;
/// Rows a thread of `merge_tiles` merges (`MERGE_IPT`): a tile is [`MERGE_TILE`] rows.
pub const MERGE_IPT: usize = 8;
/// Output rows of one `merge_tiles` block.
pub const MERGE_TILE: usize = MERGE_BLOCK as usize * MERGE_IPT;
/// The most key words merge.cu compares (`MERGE_MAX_WORDS`): a tile's words and row indices
/// take `(words + 1) * MERGE_TILE * 4` bytes of shared memory, 36 KiB at 8 words, within the
/// 48 KiB every block may have without asking.
pub const MERGE_MAX_WORDS: usize = 8;
const _: () = assert!((MERGE_MAX_WORDS + 1) * MERGE_TILE * 4 + MERGE_TILE * 2 <= 48 * 1024);

/// The most key words presorted.cu's `order_scan` compares (`ORDER_SCAN_MAX_WORDS`); a longer
/// key takes the radix passes unscanned.
pub(crate) const ORDER_SCAN_MAX_WORDS: usize = 8;

/// The descents `order_scan` records the rows of (`ORDER_SCAN_MAX_DESCENTS`): input of at most
/// that many + 1 ascending runs (the CPU backend's limit too) is merged instead of sorted.
pub(crate) const ORDER_SCAN_MAX_DESCENTS: usize = gpusort::cpu::PRESORTED_MAX_RUNS - 1;

/// The most lanes (key words, columns, records) one `reverse_lanes` launch reverses
/// (`REVERSE_MAX_LANES`); a table of more takes several launches.
pub(crate) const REVERSE_MAX_LANES: usize = 16;
/// Rows a thread of `reverse_lanes` swaps with their mirrors at once (`REVERSE_ITEMS`).
pub(crate) const REVERSE_ITEMS: usize = 4;
/// Threads of a `reverse_groups` block (`REVERSE_GROUPS_BLOCK`).
pub(crate) const REVERSE_GROUPS_BLOCK: u32 = 256;
/// Consecutive rows a `reverse_groups` thread takes (`REVERSE_GROUPS_IPT`, at most 32: a bit
/// each in a word).
pub(crate) const REVERSE_GROUPS_IPT: usize = 16;
const _: () = assert!(REVERSE_GROUPS_IPT <= 32);
/// Rows of a `reverse_groups` tile (`REVERSE_GROUPS_TILE`).
pub(crate) const REVERSE_GROUPS_TILE: usize = REVERSE_GROUPS_BLOCK as usize * REVERSE_GROUPS_IPT;

/// The most distinct keys a sort counts instead of sorting (`DISTINCT_MAX`): their rank is one
/// 8-bit digit. The CPU backend's limit too.
pub(crate) const DISTINCT_MAX: usize = gpusort::cpu::PRESORTED_MAX_DISTINCT;
const _: () = assert!(DISTINCT_MAX <= 256);
/// Rows whose keys `distinct_sample` hashes (`DISTINCT_SAMPLE`), spread over the input.
pub const DISTINCT_SAMPLE: usize = 2048;
/// Its hash table's slots (`DISTINCT_SLOTS`, a power of two, twice the sample: probes stay
/// short and a free slot always exists); with the sorted list, 34 KiB of shared memory.
pub(crate) const DISTINCT_SLOTS: usize = 2 * DISTINCT_SAMPLE;
const _: () = assert!(DISTINCT_SLOTS.is_power_of_two() && (DISTINCT_SLOTS + DISTINCT_MAX) * 8 <= 48 * 1024);
/// Threads of the one `distinct_sample` block (`DISTINCT_BLOCK`), at least [`DISTINCT_MAX`]:
/// a thread places each distinct key.
pub(crate) const DISTINCT_BLOCK: u32 = 1024;
const _: () = assert!(DISTINCT_BLOCK as usize >= DISTINCT_MAX);
/// Where the order scan's counts hold the sample's distinct keys (`SCAN_DISTINCT`, 0: more
/// than [`DISTINCT_MAX`]) and the flag of a key missing from them (`SCAN_MISSING`).
pub(crate) const SCAN_DISTINCT: usize = 5;
pub(crate) const SCAN_MISSING: usize = 6;

impl Default for KernelTuning {
    fn default() -> Self {
        Self {
            ipt: DEFAULT_IPT,
            onesweep_ipt: None,
            onesweep_block: None,
            onesweep_min_blocks: None,
            onesweep_keep_words: None,
            onesweep_lookback_window: None,
            rank_fold: None,
        }
    }
}

impl KernelTuning {
    /// The defaults, with what the `GPUSORT_*` variables above set (tuning knobs, like the
    /// per-GPU parameter search of Huang, Gao & Li). A value out of range is an error that
    /// names the variable.
    pub fn from_env() -> Result<Self> {
        Self::from_vars(|name| std::env::var(name).ok())
    }

    /// As [`Self::from_env`], reading variables through `var`.
    pub fn from_vars(var: impl Fn(&str) -> Option<String>) -> Result<Self> {
        let get = |name: &str, lo: u64, hi: u64, what: &str| -> Result<Option<u64>> {
            match var(name) {
                None => Ok(None),
                Some(v) => v
                    .trim()
                    .parse::<u64>()
                    .ok()
                    .filter(|x| (lo..=hi).contains(x))
                    .map(Some)
                    .ok_or_else(|| CudaSortError::Unsupported(format!("{name}={v} ({lo} to {hi} {what})"))),
            }
        };
        let t = Self {
            ipt: get("GPUSORT_IPT", 1, 32, "rows per thread")?.map_or(DEFAULT_IPT, |v| v as usize),
            onesweep_ipt: get("GPUSORT_ONESWEEP_IPT", 1, 32, "rows per thread")?.map(|v| v as usize),
            onesweep_block: match get("GPUSORT_ONESWEEP_BLOCK", 256, 512, "threads, whole warps")? {
                Some(b) if b % 32 != 0 => {
                    return Err(CudaSortError::Unsupported(format!(
                        "GPUSORT_ONESWEEP_BLOCK={b} (256 to 512 threads, whole warps)"
                    )));
                }
                b => b.map(|b| b as u32),
            },
            onesweep_min_blocks: get("GPUSORT_ONESWEEP_MIN_BLOCKS", 1, 8, "blocks per SM")?.map(|v| v as u32),
            onesweep_keep_words: get(
                "GPUSORT_ONESWEEP_KEEP_WORDS",
                0,
                2,
                "(0 read again, 1 registers, 2 shared)",
            )?
            .map(|v| v as u32),
            onesweep_lookback_window: get("GPUSORT_ONESWEEP_LOOKBACK_WINDOW", 1, 32, "words")?.map(|v| v as u32),
            rank_fold: get("GPUSORT_RANK_FOLD", 0, 1, "(0 off, 1 on)")?.map(|v| v as u32),
        };
        // An SM runs at most 2048 threads: ptxas ignores a minimum beyond that.
        if let Some(m) = t.onesweep_min_blocks {
            let block = t.onesweep_block.unwrap_or(BLOCK);
            if block * m > 2048 {
                return Err(CudaSortError::Unsupported(format!(
                    "GPUSORT_ONESWEEP_MIN_BLOCKS={m} with {block}-thread blocks (at most 2048 threads per SM)"
                )));
            }
        }
        // The pass's dynamic shared memory at its widest (the largest tile, 8-byte staging) fits
        // what Kernels::load allows it.
        const { assert!(512 * 32 * (4 + 8) <= ONESWEEP_MAX_DYNAMIC_SMEM as usize) };
        Ok(t)
    }

    /// Rows per thread of a one-sweep tile.
    pub fn onesweep_ipt(&self) -> usize {
        self.onesweep_ipt.unwrap_or(DEFAULT_ONESWEEP_IPT)
    }

    /// Threads of a one-sweep block.
    pub fn onesweep_block(&self) -> u32 {
        self.onesweep_block.unwrap_or(BLOCK)
    }

    /// Rows of a one-sweep tile.
    pub fn onesweep_tile(&self) -> usize {
        self.onesweep_block() as usize * self.onesweep_ipt()
    }

    /// The `#define`s put before every program: the [`SHARED_CONSTANTS`], the tile sizes, then
    /// the settings chosen (the others keep the sources' defaults).
    pub fn defines(&self) -> String {
        let mut s = String::new();
        for (name, value, unsigned) in SHARED_CONSTANTS {
            s.push_str(&format!("#define {name} {value}{}\n", if *unsigned { "u" } else { "" }));
        }
        s.push_str(&format!(
            "#define IPT {}\n#define ONESWEEP_IPT {}\n#define ONESWEEP_BLOCK {}\n",
            self.ipt,
            self.onesweep_ipt(),
            self.onesweep_block()
        ));
        for (name, value) in [
            ("ONESWEEP_MIN_BLOCKS", self.onesweep_min_blocks.map(u64::from)),
            ("ONESWEEP_KEEP_WORDS", self.onesweep_keep_words.map(u64::from)),
            ("ONESWEEP_LOOKBACK_WINDOW", self.onesweep_lookback_window.map(u64::from)),
            ("RANK_FOLD", self.rank_fold.map(u64::from)),
        ] {
            if let Some(v) = value {
                s.push_str(&format!("#define {name} {v}\n"));
            }
        }
        s
    }

    /// The programs, one per family ([`FAMILIES`]): its name and its source, the defines first.
    pub fn programs(&self) -> Vec<(&'static str, String)> {
        let defines = self.defines();
        FAMILIES
            .iter()
            .map(|(name, text)| (*name, defines.clone() + &family_source(name, text)))
            .collect()
    }
}

impl std::fmt::Display for KernelTuning {
    /// The settings as a bench header shows them: what the sources' defaults leave is "default".
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let or_default = |v: Option<u32>| v.map_or("default".to_string(), |v| v.to_string());
        write!(
            f,
            "tiles of {} x {}; one sweep {} x {}, min blocks/SM {}, keep words {}, look-back window {}, rank fold {}",
            BLOCK,
            self.ipt,
            self.onesweep_block(),
            self.onesweep_ipt(),
            or_default(self.onesweep_min_blocks),
            or_default(self.onesweep_keep_words),
            or_default(self.onesweep_lookback_window),
            or_default(self.rank_fold),
        )
    }
}

/// 128-bit FNV-1a: a stable hash (unlike std's `DefaultHasher`) for cache file names.
pub(crate) fn fnv1a128(parts: &[&[u8]]) -> u128 {
    const OFFSET: u128 = 0x6c62272e07bb014262b821756295c58d;
    const PRIME: u128 = 0x0000000001000000000000000000013b;
    let mut h = OFFSET;
    for part in parts {
        for &b in part.iter() {
            h ^= b as u128;
            h = h.wrapping_mul(PRIME);
        }
        h ^= 0xff;
        h = h.wrapping_mul(PRIME);
    }
    h
}

/// The cache key of a compiled program.
pub fn cache_key(source: &str, arch: &str, options: &[&str], nvrtc_version: (i32, i32)) -> String {
    let version = format!("{}.{}", nvrtc_version.0, nvrtc_version.1);
    let opts = options.join(" ");
    let h = fnv1a128(&[source.as_bytes(), arch.as_bytes(), opts.as_bytes(), version.as_bytes()]);
    format!("gpusort-{arch}-{h:032x}")
}

/// Where compiled kernels are kept.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KernelCache {
    dir: Option<PathBuf>,
    /// Whether the kernels built ahead of time ([`crate::prebuilt`]) are used where they match.
    prebuilt: bool,
}

/// How kernels were obtained.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CacheOutcome {
    /// Built ahead of time and embedded in the binary ([`crate::prebuilt`]).
    Prebuilt,
    /// Read from the cache.
    Hit,
    /// Compiled (and stored, if the cache is on).
    Compiled,
}

impl KernelCache {
    /// A cache in `dir`, or none.
    pub fn new(dir: Option<PathBuf>) -> Self {
        Self { dir, prebuilt: true }
    }

    /// Whether kernels built ahead of time are used where they match the sources (default:
    /// yes; off, every program is read from the cache or compiled).
    pub fn with_prebuilt(mut self, prebuilt: bool) -> Self {
        self.prebuilt = prebuilt;
        self
    }

    /// The cache named by `GPUSORT_KERNEL_CACHE` (`off` disables it), else
    /// `$XDG_CACHE_HOME/gpusort/kernels`, else `~/.cache/gpusort/kernels`, else none.
    pub fn from_env() -> Self {
        Self::resolve(
            std::env::var_os("GPUSORT_KERNEL_CACHE").map(PathBuf::from),
            std::env::var_os("XDG_CACHE_HOME").map(PathBuf::from),
            std::env::var_os("HOME").map(PathBuf::from),
        )
    }

    fn resolve(explicit: Option<PathBuf>, xdg: Option<PathBuf>, home: Option<PathBuf>) -> Self {
        let dir = match explicit {
            Some(p) if p.as_os_str() == "off" => None,
            Some(p) => Some(p),
            None => xdg
                .map(|x| x.join("gpusort/kernels"))
                .or_else(|| home.map(|h| h.join(".cache/gpusort/kernels"))),
        };
        Self { dir, prebuilt: true }
    }

    /// The cache directory, if caching is on.
    pub fn dir(&self) -> Option<&Path> {
        self.dir.as_deref()
    }

    /// The CUBIN of each of `programs` for `arch` (in their order), each from the cache or
    /// compiled by NVRTC, the compiles on threads of their own; the outcome is the slowest way
    /// any of them came.
    pub fn load_or_compile_all(
        &self,
        programs: &[(&str, String)],
        arch: &str,
        nvrtc_version: (i32, i32),
    ) -> Result<(Vec<Vec<u8>>, CacheOutcome)> {
        let results: Vec<Result<(Vec<u8>, CacheOutcome)>> = std::thread::scope(|scope| {
            let handles: Vec<_> = programs
                .iter()
                .map(|(name, source)| {
                    std::thread::Builder::new()
                        .name(format!("gpusort-nvrtc-{name}"))
                        .spawn_scoped(scope, move || {
                            self.load_or_compile(source, arch, nvrtc_version)
                                .map_err(|e| CudaSortError::Compile(format!("{name}: {e}")))
                        })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| match h {
                    Ok(h) => h
                        .join()
                        .unwrap_or_else(|_| Err(CudaSortError::Compile("an NVRTC thread panicked".into()))),
                    Err(e) => Err(CudaSortError::Compile(format!("starting an NVRTC thread: {e}"))),
                })
                .collect()
        });
        let mut cubins = Vec::with_capacity(results.len());
        // The slowest way any program came: compiled, else read from the cache, else prebuilt.
        let mut outcome = CacheOutcome::Prebuilt;
        for r in results {
            let (cubin, o) = r?;
            outcome = match (outcome, o) {
                (_, CacheOutcome::Compiled) | (CacheOutcome::Compiled, _) => CacheOutcome::Compiled,
                (_, CacheOutcome::Hit) | (CacheOutcome::Hit, _) => CacheOutcome::Hit,
                _ => CacheOutcome::Prebuilt,
            };
            cubins.push(cubin);
        }
        Ok((cubins, outcome))
    }

    /// The CUBIN of `source` for `arch`, from the cache or compiled by NVRTC (and then stored).
    /// A cache that cannot be read or written is skipped, not an error.
    pub fn load_or_compile(
        &self,
        source: &str,
        arch: &str,
        nvrtc_version: (i32, i32),
    ) -> Result<(Vec<u8>, CacheOutcome)> {
        if let Some(cubin) = self.prebuilt.then(|| crate::prebuilt::find(source, arch)).flatten() {
            return Ok((cubin.to_vec(), CacheOutcome::Prebuilt));
        }
        let key = cache_key(source, arch, OPTIONS, nvrtc_version);
        let path = self.dir.as_ref().map(|d| d.join(format!("{key}.cubin")));
        if let Some(bytes) = path.as_ref().and_then(|p| std::fs::read(p).ok()) {
            return Ok((bytes, CacheOutcome::Hit));
        }
        let cubin = compile_cubin(source, arch)?;
        if let Some(path) = path {
            // Write then rename: readers never see a partial file.
            let tmp = path.with_extension(format!("tmp{}", std::process::id()));
            let stored = path
                .parent()
                .map(|d| std::fs::create_dir_all(d).is_ok())
                .unwrap_or(false)
                && std::fs::write(&tmp, &cubin).is_ok()
                && std::fs::rename(&tmp, &path).is_ok();
            if !stored {
                let _ = std::fs::remove_file(&tmp);
            }
        }
        Ok((cubin, CacheOutcome::Compiled))
    }
}

/// Compiles `source` to a CUBIN for `arch` (e.g. `sm_90`) with NVRTC.
pub fn compile_cubin(source: &str, arch: &str) -> Result<Vec<u8>> {
    let c_src = std::ffi::CString::new(source).map_err(|e| CudaSortError::Compile(e.to_string()))?;
    let prog =
        nvrtc::create_program(&c_src, Some(c"gpusort.cu")).map_err(|e| CudaSortError::Compile(format!("{e:?}")))?;
    let mut options: Vec<String> = OPTIONS.iter().map(|s| s.to_string()).collect();
    options.push(format!("--gpu-architecture={arch}"));
    // SAFETY: `prog` is a live program; options are valid strings.
    let compiled = unsafe { nvrtc::compile_program(prog, &options) };
    let result = match compiled {
        Err(e) => {
            // SAFETY: as above.
            let log = unsafe { nvrtc::get_program_log(prog) }
                .map(|l| unsafe { CStr::from_ptr(l.as_ptr()) }.to_string_lossy().into_owned())
                .unwrap_or_default();
            Err(CudaSortError::Compile(format!("{e:?}: {log}")))
        }
        Ok(()) => {
            let mut size = 0usize;
            // SAFETY: a compiled program; the buffer has the size NVRTC reports.
            unsafe { nvrtc_sys::nvrtcGetCUBINSize(prog, &mut size) }
                .result()
                .map_err(|e| CudaSortError::Compile(format!("{e:?}")))?;
            let mut cubin = vec![0u8; size];
            // SAFETY: as above.
            unsafe { nvrtc_sys::nvrtcGetCUBIN(prog, cubin.as_mut_ptr() as *mut _) }
                .result()
                .map_err(|e| CudaSortError::Compile(format!("{e:?}")))?;
            Ok(cubin)
        }
    };
    // SAFETY: the program is not used after this.
    let _ = unsafe { nvrtc::destroy_program(prog) };
    result
}

/// A kernel for digits of up to 4 bits (16 bins) and one for up to 8 bits (256 bins).
#[derive(Debug, Clone)]
pub struct ByBins {
    /// The 16-bin instance.
    pub b4: CudaFunction,
    /// The 256-bin instance.
    pub b8: CudaFunction,
}

impl ByBins {
    /// The instance for a digit of `bits` bits, and its bin count.
    pub fn for_bits(&self, bits: u32) -> (&CudaFunction, u32) {
        if bits <= 4 { (&self.b4, 16) } else { (&self.b8, 256) }
    }
}

/// What a context's kernels need to be compiled and loaded.
struct KernelSources {
    ctx: Arc<CudaContext>,
    cache: KernelCache,
    programs: Vec<(&'static str, String)>,
    arch: String,
    nvrtc_version: (i32, i32),
    /// Shared memory a block may use (the device's, or `GPUSORT_SMEM_CAP`).
    smem_per_block: usize,
}

/// A context's kernels, compiled (or read from the cache) and loaded on a thread of their own
/// from the moment the GPU is opened, so that a sort's input is read and uploaded while NVRTC
/// works: only the first kernel launch waits for them. A failure is kept and returned to each
/// caller (the sort then runs on the CPU, with the reason).
#[derive(Clone)]
pub struct LoadingKernels {
    sources: Arc<KernelSources>,
    cell: Arc<OnceLock<std::result::Result<(Kernels, CacheOutcome), String>>>,
}

impl std::fmt::Debug for LoadingKernels {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let state = match self.cell.get() {
            None => "loading",
            Some(Ok(_)) => "loaded",
            Some(Err(_)) => "failed",
        };
        f.debug_struct("LoadingKernels")
            .field("arch", &self.sources.arch)
            .field("state", &state)
            .finish()
    }
}

impl LoadingKernels {
    /// Starts compiling and loading `programs` for `ctx` on a thread of its own; no kernel's
    /// shared memory will pass `smem_per_block`.
    pub fn start(
        ctx: Arc<CudaContext>,
        cache: KernelCache,
        programs: Vec<(&'static str, String)>,
        arch: String,
        nvrtc_version: (i32, i32),
        smem_per_block: usize,
    ) -> Self {
        let this = Self {
            sources: Arc::new(KernelSources {
                ctx,
                cache,
                programs,
                arch,
                nvrtc_version,
                smem_per_block,
            }),
            cell: Arc::new(OnceLock::new()),
        };
        let background = this.clone();
        // Without a thread, the first wait compiles instead.
        let _ = std::thread::Builder::new()
            .name("gpusort-kernels".into())
            .spawn(move || {
                let _ = background.wait();
            });
        this
    }

    /// The kernels, once they are loaded (waiting for them until then).
    pub fn wait(&self) -> Result<&Kernels> {
        self.loaded().map(|(k, _)| k)
    }

    /// Whether the kernels came from the cache (waiting for them until they are loaded).
    pub fn outcome(&self) -> Result<CacheOutcome> {
        self.loaded().map(|(_, o)| *o)
    }

    fn loaded(&self) -> Result<&(Kernels, CacheOutcome)> {
        let s = &self.sources;
        self.cell
            .get_or_init(|| {
                let start = std::time::Instant::now();
                let (cubins, outcome) = s
                    .cache
                    .load_or_compile_all(&s.programs, &s.arch, s.nvrtc_version)
                    .map_err(|e| e.to_string())?;
                let kernels = Kernels::load(&s.ctx, cubins, s.smem_per_block).map_err(|e| e.to_string())?;
                log::debug!(
                    target: "gpusort::timeline",
                    "kernels {} and loaded in {:.2} s",
                    match outcome {
                        CacheOutcome::Prebuilt => "built ahead of time",
                        CacheOutcome::Hit => "read from the cache",
                        CacheOutcome::Compiled => "compiled",
                    },
                    start.elapsed().as_secs_f64()
                );
                Ok((kernels, outcome))
            })
            .as_ref()
            .map_err(|e| CudaSortError::Compile(e.clone()))
    }
}

/// Every kernel of the families' modules.
#[derive(Debug, Clone)]
pub struct Kernels {
    /// The loaded modules, one per family.
    pub modules: Vec<Arc<CudaModule>>,
    /// GRS phase 1.
    pub grs_rank: ByBins,
    /// GRS phase 3.
    pub grs_scatter: ByBins,
    /// GRS phase 2: chunk sums, one-block scan of sums, chunk scans.
    pub scan_reduce: CudaFunction,
    /// As above.
    pub scan_spine: CudaFunction,
    /// As above.
    pub scan_down: CudaFunction,
    /// SRTS bottom-level reduction.
    pub srts_upsweep: ByBins,
    /// SRTS top-level scan.
    pub srts_spine: CudaFunction,
    /// SRTS bottom-level scan and scatter.
    pub srts_downsweep: ByBins,
    /// One-sweep SRTS: the digit counts of up to four digit positions of a key word in one read.
    pub onesweep_histogram: CudaFunction,
    /// One-sweep SRTS: each digit position's counts into the digits' first positions.
    pub onesweep_scan: CudaFunction,
    /// One-sweep SRTS: one pass over a digit of up to 8 bits (256 bins; there is no 16-bin
    /// instance), rank, decoupled look-back and scatter in one kernel.
    pub onesweep_pass: CudaFunction,
    /// Gathers of 1, 2, 4, 8 and 16-byte columns.
    pub gather: [CudaFunction; 5],
    /// Gather of row-major records.
    pub gather_records: CudaFunction,
    /// Gather of a bitmap.
    pub gather_bits: CudaFunction,
    /// A group of ByField columns into row-major rows.
    pub pack_rows: CudaFunction,
    /// Rows through a permutation, back out as the group's columns.
    pub gather_unpack: CudaFunction,
    /// Bitmaps to a lane of validity words.
    pub pack_validity: CudaFunction,
    /// A bit of a validity-word lane to a bitmap.
    pub unpack_validity: CudaFunction,
    /// Many device-to-device copies in one launch.
    pub copy_ranges: CudaFunction,
    /// 0, 1, 2, ...
    pub iota: CudaFunction,
    /// Each output block's out-of-line view bytes, and each value's offset among them.
    pub views_block_bytes: CudaFunction,
    /// Views rewritten for their block's own buffer, and their values' bytes copied there.
    pub views_compact: CudaFunction,
    /// MSD partition: chunk digit counts, for digits of up to 8 and up to 11 bits.
    pub msd_count: [CudaFunction; 2],
    /// MSD partition: chunk scatter, for digits of up to 8 and up to 11 bits.
    pub msd_scatter: [CudaFunction; 2],
    /// MSD partition: where each new segment starts.
    pub msd_subsegments: CudaFunction,
    /// The block-local sorts of small segments.
    pub msd_local: CudaFunction,
    /// Bounds and valid rows of a native sort column.
    pub key_bounds: CudaFunction,
    /// The key words of native sort columns, and the bits that vary.
    pub encode_keys: CudaFunction,
    /// Descents, ascents and equal neighbours of a key.
    pub order_scan: CudaFunction,
    /// Rows `i` and `n - 1 - i` swapped in place, in every lane of a table at once.
    pub reverse_lanes: CudaFunction,
    /// n - 1, n - 2, ..., 0.
    pub reverse_iota: CudaFunction,
    /// The permutation of non-increasing keys: groups of equal keys reversed, rows kept.
    pub reverse_groups: CudaFunction,
    /// The distinct keys of a sample, sorted, where they are few.
    pub distinct_sample: CudaFunction,
    /// Every key looked up among the sample's distinct keys: found or not, and its rank.
    pub distinct_ranks: CudaFunction,
    /// Batches of small tie groups sorted by their bytes in shared memory (BMCS).
    pub ties_bmcs: CudaFunction,
    /// The rows of large tie groups with their group and next 8 bytes as key words.
    pub ties_keys: CudaFunction,
    /// Sorted rows of large tie groups back at their positions.
    pub ties_scatter: CudaFunction,
    /// Ordered tails' input rows at their groups' positions in the permutation.
    pub ties_place: CudaFunction,
    /// Bytes each tie group's rows share past the key's prefix, read through views.
    pub ties_shared: CudaFunction,
    /// Bitmaps of the sorted rows equal to the row before, and of those whose value was cut.
    pub ties_marks: CudaFunction,
    /// Where each tile of a round of merges of sorted runs starts in its pair's first run.
    pub merge_partition: CudaFunction,
    /// Sample sort: the splitters of each segment, from a sorted sample of its keys.
    pub sample_splitters: CudaFunction,
    /// Sample sort: each row's bucket by the splitters, and each chunk's bucket counts.
    pub sample_classify: CudaFunction,
    /// Parquet: data pages decoded into Arrow's layout, one block a page.
    pub parquet_decode: CudaFunction,
    /// Parquet: PLAIN byte arrays as views into their pages.
    pub parquet_plain_views: CudaFunction,
    /// A tile of a round of merges of sorted runs.
    pub merge_tiles: CudaFunction,
    /// The dynamic shared memory the scatters, the one-sweep pass and the MSD kernels may use
    /// (their `MAX_DYNAMIC_SHARED_SIZE_BYTES`): a sort needing more does not use them.
    pub smem: DynSmem,
}

/// Widest partition digit of the MSD sort (`msd_*_b11`).
pub const MSD_MAX_DIGIT_BITS: u32 = 11;

/// Bins of the MSD partition kernels `msd_*_b8` and `msd_*_b11`.
pub const MSD_BINS: [usize; 2] = [256, 2048];

/// Bytes of `RankSmem<BINS, C>` (kernels/common.cuh) of the MSD scatters: per-warp counters
/// (u32 for 256 bins, u16 for 2048), three u32 arrays of the bins and 32 scan words; msd.cu
/// checks these figures (`MSD_RANK_SMEM_B8`, `MSD_RANK_SMEM_B11`) with static_assert.
pub const MSD_RANK_SMEM: [usize; 2] = [8 * 257 * 4 + 3 * 256 * 4 + 32 * 4, 8 * 2049 * 2 + 3 * 2048 * 4 + 32 * 4];

/// Most rows of one batch of small tie groups (`TIES_CAP` in kernels/ties.cu); a larger group
/// is sorted by the radix sort first.
pub const TIES_CAP: usize = 2048;
/// Threads of a `ties_bmcs` block (`TIES_BLOCK`).
pub(crate) const TIES_BLOCK: u32 = 256;
/// Rounds of 8 bytes a tie group takes on the device, in a batch or as a large group, before
/// the host orders what is still equal (`TIES_MAX_ROUNDS`): 256 bytes past the prefix.
pub const TIES_MAX_ROUNDS: usize = 32;

/// Most rows of one block-local sort (`LOCAL_CAP` in kernels/msd.cu).
pub const MSD_LOCAL_CAP: usize = 8192;
/// Threads of a block-local sort (`LOCAL_BLOCK`).
pub(crate) const MSD_LOCAL_BLOCK: u32 = 512;
/// Most key words one block-local sort holds in shared memory (`LOCAL_MAX_WORDS`).
pub const MSD_LOCAL_MAX_WORDS: usize = 4;
/// Most segments of one block-local batch (`LOCAL_MAX_SEGS`).
pub const MSD_LOCAL_MAX_SEGS: usize = 256;
/// Dynamic shared memory the MSD scatters may use: the rank's, the slots' positions and 8-byte
/// staging for a tile of 4096 rows (16 rows per thread; more with a larger `GPUSORT_IPT`).
pub const MSD_SCATTER_MAX_DYNAMIC_SMEM: i32 = 200 * 1024;
/// Dynamic shared memory the block-local sort may use: `LOCAL_MAX_WORDS` key words and two
/// 16-bit index arrays per row.
pub const MSD_LOCAL_MAX_DYNAMIC_SMEM: i32 = (MSD_LOCAL_CAP * (4 * MSD_LOCAL_MAX_WORDS + 4)) as i32;

/// Digit positions one `onesweep_histogram` launch counts (`ONESWEEP_MAX_DIGITS` in onesweep.cu).
pub const ONESWEEP_MAX_DIGITS: usize = 4;
/// Keys each thread of `onesweep_histogram` loads per chunk (`ONESWEEP_HIST_IPT`).
pub const ONESWEEP_HIST_IPT: usize = 16;
/// The look-back words hold values below 2^30 (`ONESWEEP_VALUE`): one-sweep passes need fewer rows.
pub const ONESWEEP_MAX_ROWS: usize = (1 << 30) - 1;

/// Dynamic shared memory the scatter kernels may use (more than the default 48 KiB).
pub const SCATTER_MAX_DYNAMIC_SMEM: i32 = 96 * 1024;
/// Dynamic shared memory the one-sweep pass may use: tiles of up to 16K rows
/// ([`KernelTuning::onesweep_tile`]) with 8-byte staging.
pub const ONESWEEP_MAX_DYNAMIC_SMEM: i32 = 192 * 1024;

impl Kernels {
    /// Loads the families' `cubins` into `ctx` and looks up every kernel (in whichever module
    /// has it); each kernel with dynamic shared memory may use what it needs at most
    /// ([`SCATTER_MAX_DYNAMIC_SMEM`] and the like), at most what `smem_per_block` leaves beside
    /// its static shared memory ([`DynSmem`]).
    pub fn load(ctx: &Arc<CudaContext>, cubins: Vec<Vec<u8>>, smem_per_block: usize) -> Result<Self> {
        let modules = cubins
            .into_iter()
            .map(|cubin| ctx.load_module(Ptx::from_binary(cubin)))
            .collect::<std::result::Result<Vec<_>, _>>()?;
        // Each kernel from its own family's module (asking the others would be failed driver
        // calls, which compute-sanitizer reports).
        let f = |name: &str| -> Result<CudaFunction> {
            let family = family_of(name);
            let module = FAMILIES
                .iter()
                .position(|(f, _)| *f == family)
                .and_then(|i| modules.get(i))
                .ok_or_else(|| CudaSortError::Compile(format!("no module of {family} for kernel {name}")))?;
            Ok(module.load_function(name)?)
        };
        let bins = |name: &str| -> Result<ByBins> {
            Ok(ByBins {
                b4: f(&format!("{name}_b4"))?,
                b8: f(&format!("{name}_b8"))?,
            })
        };
        let mut k = Kernels {
            grs_rank: bins("grs_rank")?,
            grs_scatter: bins("grs_scatter")?,
            scan_reduce: f("scan_reduce")?,
            scan_spine: f("scan_spine")?,
            scan_down: f("scan_down")?,
            srts_upsweep: bins("srts_upsweep")?,
            srts_spine: f("srts_spine")?,
            srts_downsweep: bins("srts_downsweep")?,
            onesweep_histogram: f("onesweep_histogram")?,
            onesweep_scan: f("onesweep_scan")?,
            onesweep_pass: f("onesweep_pass_b8")?,
            gather: [
                f("gather_w1")?,
                f("gather_w2")?,
                f("gather_w4")?,
                f("gather_w8")?,
                f("gather_w16")?,
            ],
            gather_records: f("gather_records")?,
            gather_bits: f("gather_bits")?,
            pack_rows: f("pack_rows")?,
            gather_unpack: f("gather_unpack")?,
            pack_validity: f("pack_validity")?,
            unpack_validity: f("unpack_validity")?,
            copy_ranges: f("copy_ranges")?,
            iota: f("iota")?,
            views_block_bytes: f("views_block_bytes")?,
            views_compact: f("views_compact")?,
            msd_count: [f("msd_count_b8")?, f("msd_count_b11")?],
            msd_scatter: [f("msd_scatter_b8")?, f("msd_scatter_b11")?],
            msd_subsegments: f("msd_subsegments")?,
            msd_local: f("msd_local")?,
            key_bounds: f("key_bounds")?,
            encode_keys: f("encode_keys")?,
            order_scan: f("order_scan")?,
            reverse_lanes: f("reverse_lanes")?,
            reverse_iota: f("reverse_iota")?,
            reverse_groups: f("reverse_groups")?,
            distinct_sample: f("distinct_sample")?,
            distinct_ranks: f("distinct_ranks")?,
            ties_bmcs: f("ties_bmcs")?,
            ties_keys: f("ties_keys")?,
            ties_scatter: f("ties_scatter")?,
            ties_place: f("ties_place")?,
            ties_shared: f("ties_shared")?,
            ties_marks: f("ties_marks")?,
            merge_partition: f("merge_partition")?,
            merge_tiles: f("merge_tiles")?,
            sample_splitters: f("sample_splitters")?,
            sample_classify: f("sample_classify")?,
            parquet_decode: f("parquet_decode")?,
            parquet_plain_views: f("parquet_plain_views")?,
            modules: modules.clone(),
            smem: DynSmem::default(),
        };
        // What a block may use beside `func`'s static shared memory, at most `want`; set as its
        // limit of dynamic shared memory.
        let allow = |func: &CudaFunction, want: i32| -> Result<u32> {
            let fixed = func.shared_size_bytes()?.max(0) as usize;
            let v = want.min(smem_per_block.saturating_sub(fixed).min(i32::MAX as usize) as i32);
            func.set_attribute(CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, v)?;
            Ok(v as u32)
        };
        let mut scatter = u32::MAX;
        for func in [
            &k.grs_scatter.b4,
            &k.grs_scatter.b8,
            &k.srts_downsweep.b4,
            &k.srts_downsweep.b8,
        ] {
            scatter = scatter.min(allow(func, SCATTER_MAX_DYNAMIC_SMEM)?);
        }
        k.smem = DynSmem {
            scatter,
            onesweep: allow(&k.onesweep_pass, ONESWEEP_MAX_DYNAMIC_SMEM)?,
            msd_scatter: [
                allow(&k.msd_scatter[0], MSD_SCATTER_MAX_DYNAMIC_SMEM)?,
                allow(&k.msd_scatter[1], MSD_SCATTER_MAX_DYNAMIC_SMEM)?,
            ],
            msd_local: allow(&k.msd_local, MSD_LOCAL_MAX_DYNAMIC_SMEM)?,
        };
        Ok(k)
    }

    /// The gather kernel for `width`-byte rows.
    pub fn gather_for(&self, width: usize) -> Option<&CudaFunction> {
        let i = match width {
            1 => 0,
            2 => 1,
            4 => 2,
            8 => 3,
            16 => 4,
            _ => return None,
        };
        Some(&self.gather[i])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn program_defines_come_first() {
        let t = KernelTuning {
            ipt: 12,
            onesweep_min_blocks: Some(4),
            ..KernelTuning::default()
        };
        let shared = KernelTuning::default().defines();
        let shared = &shared[..shared.find("#define IPT ").unwrap()];
        for (name, source) in t.programs() {
            let tuned =
                "#define IPT 12\n#define ONESWEEP_IPT 20\n#define ONESWEEP_BLOCK 256\n#define ONESWEEP_MIN_BLOCKS 4\n";
            assert!(
                source.starts_with(&format!("{shared}{tuned}// ---- common.cuh")),
                "{name}"
            );
        }
        assert!(KernelTuning::default().programs()[0].1.starts_with(&format!(
            "{shared}#define IPT 16\n#define ONESWEEP_IPT 20\n#define ONESWEEP_BLOCK 256\n// ---- common.cuh"
        )));
        let all = KernelTuning {
            ipt: 16,
            onesweep_ipt: Some(24),
            onesweep_block: Some(384),
            onesweep_min_blocks: Some(2),
            onesweep_keep_words: Some(1),
            onesweep_lookback_window: Some(4),
            rank_fold: Some(0),
        };
        assert_eq!(
            all.defines(),
            format!(
                "{shared}#define IPT 16\n#define ONESWEEP_IPT 24\n#define ONESWEEP_BLOCK 384\n#define ONESWEEP_MIN_BLOCKS 2\n\
                 #define ONESWEEP_KEEP_WORDS 1\n#define ONESWEEP_LOOKBACK_WINDOW 4\n#define RANK_FOLD 0\n"
            )
        );
        assert_eq!(
            (all.onesweep_ipt(), all.onesweep_block(), all.onesweep_tile()),
            (24, 384, 9216)
        );
        assert_eq!(KernelTuning::default().onesweep_ipt(), DEFAULT_ONESWEEP_IPT);
        assert_eq!(
            all.to_string(),
            "tiles of 256 x 16; one sweep 384 x 24, min blocks/SM 2, keep words 1, look-back window 4, \
             rank fold 0"
        );
        assert_eq!(
            KernelTuning::default().to_string(),
            "tiles of 256 x 16; one sweep 256 x 20, min blocks/SM default, keep words default, \
             look-back window default, rank fold default"
        );
    }

    /// The constants both sides use come from the host: the defines hold every one with the
    /// host's value, each name a source checks for (`#if !defined(NAME) ...` before an `#error`)
    /// is among the defines, and no source defines one itself.
    #[test]
    fn the_defines_hold_every_constant_shared_with_the_kernels() {
        let defines = KernelTuning::default().defines();
        let has = |name: &str, value: String| defines.lines().any(|l| l == format!("#define {name} {value}"));
        for (name, value) in [
            ("BLOCK", BLOCK.to_string()),
            ("IPT", DEFAULT_IPT.to_string()),
            ("ONESWEEP_IPT", DEFAULT_ONESWEEP_IPT.to_string()),
            ("ONESWEEP_BLOCK", BLOCK.to_string()),
            ("LANE_IOTA", format!("{LANE_IOTA}u")),
            ("LANE_DIGIT", format!("{LANE_DIGIT}u")),
            ("LANE_SKIP", format!("{LANE_SKIP}u")),
            ("LANE_PAIR", format!("{LANE_PAIR}u")),
            ("GATHER_ROWS", format!("{GATHER_ROWS}u")),
            ("PACK_ROWS", PACK_ROWS.to_string()),
            ("KEY_MAX_WORDS", KEY_MAX_WORDS.to_string()),
            ("KIND_UNSIGNED", format!("{KIND_UNSIGNED}u")),
            ("KIND_SIGNED", format!("{KIND_SIGNED}u")),
            ("KIND_FLOAT", format!("{KIND_FLOAT}u")),
            ("MSD_BINS_B8", MSD_BINS[0].to_string()),
            ("MSD_BINS_B11", MSD_BINS[1].to_string()),
            ("MSD_RANK_SMEM_B8", MSD_RANK_SMEM[0].to_string()),
            ("MSD_RANK_SMEM_B11", MSD_RANK_SMEM[1].to_string()),
            ("LOCAL_BLOCK", MSD_LOCAL_BLOCK.to_string()),
            ("LOCAL_CAP", MSD_LOCAL_CAP.to_string()),
            ("LOCAL_MAX_WORDS", MSD_LOCAL_MAX_WORDS.to_string()),
            ("LOCAL_MAX_SEGS", MSD_LOCAL_MAX_SEGS.to_string()),
            ("ONESWEEP_MAX_DIGITS", ONESWEEP_MAX_DIGITS.to_string()),
            ("ONESWEEP_HIST_IPT", ONESWEEP_HIST_IPT.to_string()),
            ("ONESWEEP_VALUE", format!("{ONESWEEP_MAX_ROWS}u")),
            ("SAMPLE_SPLITTERS", SAMPLE_SPLITTERS.to_string()),
            ("SAMPLE_SIZE", SAMPLE_SIZE.to_string()),
        ] {
            assert!(
                has(name, value.clone()),
                "#define {name} {value} missing from:\n{defines}"
            );
        }
        assert_eq!(ONESWEEP_MAX_ROWS, 0x3fff_ffff, "the look-back words' 30 value bits");
        let sources = std::iter::once(&COMMON).chain(FAMILIES);
        let mut checked = std::collections::BTreeSet::new();
        for (file, text) in sources {
            let mut lines = text.lines().peekable();
            while let Some(line) = lines.next() {
                if line.starts_with("#if !defined(") {
                    // The condition may go on over lines ending in a backslash.
                    let mut cond = line.to_string();
                    while cond.ends_with('\\') {
                        cond.push_str(lines.next().unwrap());
                    }
                    assert!(lines.peek().unwrap().starts_with("#error"), "{file}: {cond}");
                    for name in cond.split("defined(").skip(1).map(|s| &s[..s.find(')').unwrap()]) {
                        assert!(
                            defines.contains(&format!("#define {name} ")),
                            "{file} expects {name} from the host"
                        );
                        checked.insert(name.to_string());
                    }
                }
                if let Some(rest) = line.trim_start().strip_prefix("#define ") {
                    let name = rest.split_whitespace().next().unwrap();
                    assert!(
                        !defines.contains(&format!("#define {name} ")),
                        "{file} defines {name}, which the host defines"
                    );
                }
            }
        }
        // Every shared constant and tile size is checked for by a source.
        assert_eq!(checked.len(), SHARED_CONSTANTS.len() + 3);
    }

    #[test]
    fn tuning_variables_are_read_and_checked() {
        let vars = |pairs: &'static [(&'static str, &'static str)]| {
            move |name: &str| pairs.iter().find(|(k, _)| *k == name).map(|(_, v)| v.to_string())
        };
        assert_eq!(KernelTuning::from_vars(vars(&[])).unwrap(), KernelTuning::default());
        let t = KernelTuning::from_vars(vars(&[
            ("GPUSORT_IPT", "12"),
            ("GPUSORT_ONESWEEP_IPT", "20"),
            ("GPUSORT_ONESWEEP_KEEP_WORDS", "2"),
            ("GPUSORT_ONESWEEP_LOOKBACK_WINDOW", "1"),
            ("GPUSORT_RANK_FOLD", "0"),
        ]))
        .unwrap();
        assert_eq!(t.rank_fold, Some(0));
        assert_eq!((t.ipt, t.onesweep_ipt(), t.onesweep_min_blocks), (12, 20, None));
        assert_eq!((t.onesweep_keep_words, t.onesweep_lookback_window), (Some(2), Some(1)));
        let t = KernelTuning::from_vars(vars(&[
            ("GPUSORT_ONESWEEP_BLOCK", "512"),
            ("GPUSORT_ONESWEEP_IPT", "32"),
        ]));
        assert_eq!(t.unwrap().onesweep_tile(), 16384);
        for (name, bad) in [
            ("GPUSORT_IPT", "0"),
            ("GPUSORT_ONESWEEP_BLOCK", "300"),
            ("GPUSORT_ONESWEEP_BLOCK", "128"),
            ("GPUSORT_ONESWEEP_BLOCK", "544"),
            ("GPUSORT_ONESWEEP_IPT", "33"),
            ("GPUSORT_ONESWEEP_KEEP_WORDS", "3"),
            ("GPUSORT_RANK_FOLD", "2"),
            ("GPUSORT_ONESWEEP_MIN_BLOCKS", "x"),
        ] {
            let err = KernelTuning::from_vars(|n: &str| (n == name).then(|| bad.to_string())).unwrap_err();
            assert!(err.to_string().contains(&format!("{name}={bad}")), "{err}");
        }
        // Blocks a SM is compiled for times their threads: at most 2048.
        let t = KernelTuning::from_vars(vars(&[("GPUSORT_ONESWEEP_MIN_BLOCKS", "8")]));
        assert_eq!(t.unwrap().onesweep_min_blocks, Some(8));
        let t = KernelTuning::from_vars(vars(&[
            ("GPUSORT_ONESWEEP_BLOCK", "512"),
            ("GPUSORT_ONESWEEP_MIN_BLOCKS", "4"),
        ]));
        assert_eq!(t.unwrap().onesweep_min_blocks, Some(4));
        let err = KernelTuning::from_vars(vars(&[
            ("GPUSORT_ONESWEEP_BLOCK", "512"),
            ("GPUSORT_ONESWEEP_MIN_BLOCKS", "5"),
        ]))
        .unwrap_err();
        assert!(
            err.to_string()
                .contains("GPUSORT_ONESWEEP_MIN_BLOCKS=5 with 512-thread blocks"),
            "{err}"
        );
    }

    #[test]
    fn cache_keys_change_with_every_input() {
        let base = cache_key("src", "sm_90", OPTIONS, (13, 0));
        assert_eq!(base, cache_key("src", "sm_90", OPTIONS, (13, 0)));
        assert!(base.starts_with("gpusort-sm_90-"));
        assert_ne!(base, cache_key("src2", "sm_90", OPTIONS, (13, 0)));
        assert_ne!(base, cache_key("src", "sm_80", OPTIONS, (13, 0)));
        assert_ne!(base, cache_key("src", "sm_90", &["-O0"], (13, 0)));
        assert_ne!(base, cache_key("src", "sm_90", OPTIONS, (13, 1)));
        // Concatenation boundaries count: ("ab", "c") differs from ("a", "bc").
        assert_ne!(fnv1a128(&[b"ab", b"c"]), fnv1a128(&[b"a", b"bc"]));
    }

    #[test]
    fn cache_location_follows_the_environment() {
        let p = PathBuf::from;
        assert_eq!(
            KernelCache::resolve(Some(p("off")), Some(p("/x")), Some(p("/h"))).dir(),
            None
        );
        assert_eq!(
            KernelCache::resolve(Some(p("/c")), Some(p("/x")), None).dir(),
            Some(Path::new("/c"))
        );
        assert_eq!(
            KernelCache::resolve(None, Some(p("/x")), Some(p("/h"))).dir(),
            Some(Path::new("/x/gpusort/kernels"))
        );
        assert_eq!(
            KernelCache::resolve(None, None, Some(p("/h"))).dir(),
            Some(Path::new("/h/.cache/gpusort/kernels"))
        );
        assert_eq!(KernelCache::resolve(None, None, None).dir(), None);
    }

    /// NVRTC needs no GPU: where it is installed, the kernels must compile for the H100.
    #[test]
    fn kernels_compile_with_nvrtc_for_sm90() {
        if !crate::device::nvrtc_present() {
            return crate::test_support::not_run("NVRTC COMPILE TEST", "NVRTC (libnvrtc) is not installed");
        }
        let programs = KernelTuning::default().programs();
        let cubin = compile_cubin(&programs[0].1, "sm_90").unwrap();
        assert!(cubin.starts_with(b"\x7fELF"), "a CUBIN is an ELF file");
        let dir = std::env::temp_dir().join(format!("gpusort-cache-test-{}", std::process::id()));
        let cache = KernelCache::new(Some(dir.clone())).with_prebuilt(false);
        let (first, outcome) = cache
            .load_or_compile_all(&programs, "sm_90", crate::device::nvrtc_version())
            .unwrap();
        assert_eq!((outcome, first.len()), (CacheOutcome::Compiled, FAMILIES.len()));
        assert!(first.iter().all(|c| c.starts_with(b"\x7fELF")));
        let (again, outcome) = cache
            .load_or_compile_all(&programs, "sm_90", crate::device::nvrtc_version())
            .unwrap();
        assert_eq!((outcome, again == first), (CacheOutcome::Hit, true));
        let _ = std::fs::remove_dir_all(dir);
        let err = compile_cubin("this is not CUDA", "sm_90").unwrap_err().to_string();
        assert!(err.contains("error"), "{err}");
    }

    /// The architectures every kernel family must compile for (compile only; NVRTC needs no GPU):
    /// Volta to Blackwell.
    const EVERY_ARCH: &[u32] = &[70, 75, 80, 86, 89, 90, 100, 120];

    /// Every family compiles with NVRTC for every architecture of [`EVERY_ARCH`] that the
    /// installed NVRTC offers; one it does not offer (NVRTC 13 offers no sm_70: CUDA 13 dropped
    /// Volta) is named on stderr, and the architectures from sm_75 on must be offered. Fails when
    /// `GPUSORT_REQUIRE_GPU=1` and NVRTC is missing; says it did not run otherwise.
    #[test]
    fn kernels_compile_with_nvrtc_for_every_architecture() {
        let Some(offered) = crate::device::nvrtc_supported_archs() else {
            return crate::test_support::not_run(
                "NVRTC EVERY-ARCHITECTURE COMPILE TEST",
                "NVRTC (libnvrtc) is not installed",
            );
        };
        let version = crate::device::nvrtc_version();
        let programs = KernelTuning::default().programs();
        let mut compiled = Vec::new();
        let mut failures = Vec::new();
        for &cc in EVERY_ARCH {
            let arch = format!("sm_{cc}");
            if !offered.contains(&(cc as i32)) {
                assert!(
                    cc < 75,
                    "NVRTC {version:?} does not offer {arch} (it offers {offered:?})"
                );
                eprintln!(
                    "{arch}: not offered by NVRTC {}.{} (it offers {offered:?})",
                    version.0, version.1
                );
                continue;
            }
            let results: Vec<_> = std::thread::scope(|scope| {
                let arch = &arch;
                let handles: Vec<_> = programs
                    .iter()
                    .map(|(family, source)| scope.spawn(move || (*family, compile_cubin(source, arch))))
                    .collect();
                handles.into_iter().map(|h| h.join().unwrap()).collect()
            });
            for (family, result) in results {
                match result {
                    Ok(cubin) => assert!(cubin.starts_with(b"\x7fELF"), "{arch} {family}"),
                    Err(e) => failures.push(format!("{arch} {family}: {e}")),
                }
            }
            compiled.push(arch);
        }
        eprintln!("kernels compiled by NVRTC {}.{} for {compiled:?}", version.0, version.1);
        assert!(failures.is_empty(), "{}", failures.join("\n"));
    }

    #[test]
    fn every_family_is_a_program_with_the_common_header() {
        let programs = KernelTuning::default().programs();
        assert_eq!(programs.len(), FAMILIES.len());
        for (name, source) in &programs {
            let common = source.find("// ---- common.cuh ----").unwrap();
            let own = source.find(&format!("// ---- {name} ----")).unwrap();
            assert!(common < own, "{name}");
            // No family's program holds another family's source.
            for (other, _) in FAMILIES.iter().filter(|(o, _)| o != name) {
                assert!(
                    !source.contains(&format!("// ---- {other} ----")),
                    "{name} holds {other}"
                );
            }
        }
        let kernels: &[(&str, &[&str])] = &[
            ("grs.cu", &["grs_rank_b8", "grs_scatter_b4", "scan_spine"]),
            ("srts.cu", &["srts_upsweep_b8", "srts_downsweep_b4"]),
            (
                "gather.cu",
                &[
                    "gather_records",
                    "pack_rows",
                    "gather_unpack",
                    "copy_ranges",
                    "iota",
                    "views_block_bytes",
                    "views_compact",
                ],
            ),
            (
                "msd.cu",
                &["msd_count_b11", "msd_scatter_b8", "msd_subsegments", "msd_local"],
            ),
            (
                "onesweep.cu",
                &["onesweep_histogram", "onesweep_scan", "onesweep_pass_b8"],
            ),
            ("keys.cu", &["key_bounds", "encode_keys"]),
            (
                "presorted.cu",
                &[
                    "order_scan",
                    "reverse_lanes",
                    "reverse_iota",
                    "reverse_groups",
                    "distinct_sample",
                    "distinct_ranks",
                ],
            ),
            (
                "ties.cu",
                &[
                    "ties_bmcs",
                    "ties_keys",
                    "ties_scatter",
                    "ties_place",
                    "ties_shared",
                    "ties_marks",
                ],
            ),
            ("merge.cu", &["merge_partition", "merge_tiles"]),
        ];
        for (family, names) in kernels {
            let (_, source) = programs.iter().find(|(n, _)| n == family).unwrap();
            for name in *names {
                assert!(source.contains(name), "{family}: {name}");
                assert_eq!(family_of(name), *family, "{name}");
            }
        }
        // Every kernel Kernels::load looks up is defined in the family family_of names.
        for name in [
            "grs_rank_b4",
            "grs_scatter_b8",
            "scan_reduce",
            "scan_down",
            "srts_upsweep_b4",
            "srts_spine",
            "srts_downsweep_b8",
            "gather_w1",
            "gather_w16",
            "gather_bits",
            "pack_validity",
            "unpack_validity",
            "msd_count_b8",
            "msd_scatter_b11",
        ] {
            let (_, source) = programs.iter().find(|(n, _)| *n == family_of(name)).unwrap();
            assert!(source.contains(&format!(" {name}(")) || source.contains(name), "{name}");
        }
    }
}
