//! [`GpuOptions`]: every setting of the GPU backend that the `GPUSORT_*` environment variables
//! choose, read once when a device is opened ([`Gpu::open`](crate::Gpu::open), which
//! [`CudaBackend`](crate::CudaBackend) calls) instead of wherever each was needed. The README's
//! table lists them. No kernel: the kernels' compile-time settings are [`KernelTuning`].
//!
//! When a device opens, the tuning profile `gpusort tune` wrote for it ([`crate::tune`]) gives
//! the settings it chose: built-in defaults < the device's profile < `GPUSORT_*` variables.

use std::path::{Path, PathBuf};

use gpusort::parse_byte_size;
use gpusort::plan::{Layout, Strategy, payload_fields};

use crate::device::DeviceInfo;
use crate::error::{CudaSortError, Result};
use crate::kernels::{KernelTuning, MSD_MAX_DIGIT_BITS};
use crate::merge::MergeMethod;
use crate::tune::{PROFILE_VAR, ProfileKey, TuningProfile};

/// The GPU backend's settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuOptions {
    /// The kernels' compile-time settings (`GPUSORT_IPT`, `GPUSORT_ONESWEEP_*`,
    /// `GPUSORT_RANK_FOLD`).
    pub tuning: KernelTuning,
    /// Per-kernel device times of every sort printed to stderr (`GPUSORT_PROFILE=1`).
    pub profile: bool,
    /// The widest MSD partition digit, 1 to [`MSD_MAX_DIGIT_BITS`] (`GPUSORT_MSD_BITS`).
    pub msd_max_bits: u32,
    /// SRTS's passes run as one sweep where they can (off with `GPUSORT_ONESWEEP=0`).
    pub onesweep: bool,
    /// The scatters move plain 4-byte lanes in pairs (off with `GPUSORT_PAIR_LANES=0`).
    pub pair_lanes: bool,
    /// Keys of native columns are encoded on the device (off with `GPUSORT_DEVICE_KEYS=0`:
    /// on the host).
    pub device_keys: bool,
    /// String and binary view columns (`Utf8View`, `BinaryView`) move on the device as 16-byte
    /// rows, their long views' buffer indices raised as they are staged (off with
    /// `GPUSORT_DEVICE_VIEWS=0`: the host concatenates and gathers them).
    pub device_views: bool,
    /// Shared memory a block may use at most, in bytes, below the device's own limit
    /// (`GPUSORT_SMEM_CAP`, 16 KiB to 1 MiB; `K` / `KiB` suffixes are read too): the kernels get
    /// the shapes of a GPU with that much ([`crate::shapes`]), e.g. `96K` (V100), `99K` (A10, L4,
    /// RTX 3090/4090), `163K` (A100) on an H100.
    pub smem_cap: Option<usize>,
    /// A sort first reads its key once to find input already in order or reversed
    /// (`presorted.rs`; off with `GPUSORT_PRESORTED=0`).
    pub presorted: bool,
    /// That scan also looks for few distinct keys (at most 256, keys of at most 64 bits) and
    /// sorts them by one pass over each row's rank among them (`presorted.rs`; off with
    /// `GPUSORT_FEW_DISTINCT=0`).
    pub few_distinct: bool,
    /// How rows known to be sorted runs (an external sort's merge steps) are merged
    /// (`merge.rs`; `GPUSORT_MERGE`: `tree`, the default, `odd-even`, or `0`: radix-sorted).
    pub merge: Option<MergeMethod>,
    /// Where rows tied on a truncated string prefix are ordered (`ties.rs`;
    /// `GPUSORT_DEVICE_TIES`: `auto`, `1` on the device, `0` on the host).
    pub device_ties: DeviceTies,
    /// Device memory all sorts of the process together may hold on the device, in bytes
    /// (`GPUSORT_DEVICE_BUDGET`, e.g. `40g`; default: the free memory when the device opens,
    /// less a sixteenth; see [`crate::memory::DeviceBudget`]).
    pub device_budget: Option<usize>,
    /// The tuning profile whose settings apply ([`Self::for_device`]; `GPUSORT_TUNING` names
    /// another file, or `off`), if any.
    pub tuning_profile: Option<PathBuf>,
    /// Most fields besides the key a sort moves directly, with every pass; beyond, it sorts key
    /// and index and gathers the fields once (`GPUSORT_DIRECT_MAX_FIELDS`; the H100's crossover
    /// [`DIRECT_MAX_FIELDS`] by default, `gpusort tune` measures the device's).
    pub direct_max_fields: usize,
    /// Tie groups ordered on the device read their tails through the views and data buffers
    /// a view key's encoding put there, instead of tails gathered on the host and sent up
    /// (off with `GPUSORT_TIE_VIEWS=0`).
    pub tie_views: bool,
    /// Output batches' view key columns are compacted on the device, where the key's data
    /// buffers are ([`SortedRows::next_batches`](crate::SortedRows::next_batches)), instead of
    /// by the caller on the host (off with `GPUSORT_COMPACT_VIEWS=0`).
    pub compact_views: bool,
    /// The pinned host blocks of sorted rows handed out in ranges are pinned ahead of the
    /// ranges, on a thread of their own (`session/range_blocks.rs`; off with
    /// `GPUSORT_PIN_AHEAD=0`: each range pins what the pool lacks on its way down).
    pub pin_ahead: bool,
    /// Sorts run on a stream of the device's highest priority, so that their kernels (a sorted
    /// range's views laid out as it comes down) take SMs before those of nvCOMP's compression
    /// sharing the device (off with `GPUSORT_STREAM_PRIORITY=0`: the default priority).
    pub stream_priority: bool,
    /// Uploaded segments staged into pinned memory at once, each on a thread of its own over
    /// rayon's pool (`GPUSORT_STAGE_AHEAD`, 1 to 16; see `session/upload.rs`): while the input
    /// is read, one segment at a time fell behind the readers.
    pub stage_ahead: usize,
    /// Uploaded rows whose values lie in pinned host memory already (sorted runs that came
    /// down into the pinned pool, merged again) are copied to the device from where they are,
    /// not staged first (`session/upload.rs`; off with `GPUSORT_DIRECT_UPLOADS=0`).
    pub direct_uploads: bool,
}

/// Segments staged at once unless `GPUSORT_STAGE_AHEAD` says otherwise
/// ([`GpuOptions::stage_ahead`]).
pub const STAGE_AHEAD: usize = 3;

/// Where a GPU sort orders the rows whose keys tie on a truncated string prefix (when every
/// later sort field is exact; otherwise the host compares whole values).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeviceTies {
    /// On the device where the groups hold [`DEVICE_TIES_MIN_MEAN_ROWS`] rows or more on
    /// average, else on the host.
    Auto,
    /// On the device.
    Always,
    /// On the host, as the CPU backend does.
    Never,
}

/// Mean rows per tie group from which [`DeviceTies::Auto`] orders the groups on the device.
/// Measured on the H100 (stop 26): TPC-H SF10 `l_comment` leaves 2.8M groups of 3.6 rows (tails
/// of a few bytes), which the host's cores order in ~0.25 s and the device path (gathering the
/// tails, sending them up, the batches) in ~0.4 s; 10M URLs in 3 groups of 3.3M rows with 50-byte
/// tails took the host 2.6 s and the device 0.87 s.
pub const DEVICE_TIES_MIN_MEAN_ROWS: usize = 64;

impl DeviceTies {
    /// Whether `groups` of `rows` rows in all are ordered on the device.
    pub fn on_device(self, groups: usize, rows: usize) -> bool {
        match self {
            Self::Auto => rows >= DEVICE_TIES_MIN_MEAN_ROWS * groups,
            Self::Always => true,
            Self::Never => false,
        }
    }
}

/// The ByField crossover of [`Strategy::calibrated_default`], measured on the H100: direct up
/// to 2 payload fields.
pub const DIRECT_MAX_FIELDS: usize = 2;

impl Default for GpuOptions {
    fn default() -> Self {
        Self {
            tuning: KernelTuning::default(),
            profile: false,
            msd_max_bits: MSD_MAX_DIGIT_BITS,
            onesweep: true,
            pair_lanes: true,
            device_keys: true,
            device_views: true,
            smem_cap: None,
            presorted: true,
            few_distinct: true,
            merge: Some(MergeMethod::Tree),
            device_ties: DeviceTies::Auto,
            device_budget: None,
            tuning_profile: None,
            direct_max_fields: DIRECT_MAX_FIELDS,
            tie_views: true,
            compact_views: true,
            pin_ahead: true,
            stream_priority: true,
            stage_ahead: STAGE_AHEAD,
            direct_uploads: true,
        }
    }
}

/// Variable `name`'s `value` as a count within `range` of `what`; `default` when it is unset.
fn count(
    name: &str,
    value: Option<String>,
    default: usize,
    range: std::ops::RangeInclusive<usize>,
    what: &str,
) -> Result<usize> {
    let Some(v) = value else { return Ok(default) };
    v.trim()
        .parse::<usize>()
        .ok()
        .filter(|n| range.contains(n))
        .ok_or_else(|| CudaSortError::Unsupported(format!("{name}={v} ({} to {} {what})", range.start(), range.end())))
}

impl GpuOptions {
    /// The defaults, with what the `GPUSORT_*` variables set. A value out of range is an error
    /// that names the variable.
    pub fn from_env() -> Result<Self> {
        Self::from_vars(|name| std::env::var(name).ok())
    }

    /// As [`Self::from_env`], reading variables through `var`.
    pub fn from_vars(var: impl Fn(&str) -> Option<String>) -> Result<Self> {
        let msd_max_bits = match var("GPUSORT_MSD_BITS") {
            Some(v) => v
                .parse::<u32>()
                .ok()
                .filter(|b| (1..=MSD_MAX_DIGIT_BITS).contains(b))
                .ok_or_else(|| {
                    CudaSortError::Unsupported(format!("GPUSORT_MSD_BITS={v} (1 to {MSD_MAX_DIGIT_BITS} bits)"))
                })?,
            None => MSD_MAX_DIGIT_BITS,
        };
        let smem_cap = match var("GPUSORT_SMEM_CAP") {
            None => None,
            Some(v) => Some(
                parse_byte_size(&v)
                    .filter(|b| (16 << 10..=1 << 20).contains(b))
                    .ok_or_else(|| {
                        CudaSortError::Unsupported(format!(
                            "GPUSORT_SMEM_CAP={v} (bytes of shared memory a block, 16K to 1024K, e.g. 99K)"
                        ))
                    })?,
            ),
        };
        let device_budget = match var("GPUSORT_DEVICE_BUDGET") {
            None => None,
            Some(v) => match parse_byte_size(&v) {
                Some(0) => None,
                Some(b) => Some(b),
                None => {
                    return Err(CudaSortError::Unsupported(format!(
                        "GPUSORT_DEVICE_BUDGET={v} ({})",
                        gpusort::size::size_error(&v)
                    )));
                }
            },
        };
        Ok(Self {
            tuning: KernelTuning::from_vars(&var)?,
            profile: var("GPUSORT_PROFILE").as_deref() == Some("1"),
            msd_max_bits,
            onesweep: var("GPUSORT_ONESWEEP").as_deref() != Some("0"),
            pair_lanes: var("GPUSORT_PAIR_LANES").as_deref() != Some("0"),
            device_keys: var("GPUSORT_DEVICE_KEYS").as_deref() != Some("0"),
            device_views: var("GPUSORT_DEVICE_VIEWS").as_deref() != Some("0"),
            smem_cap,
            presorted: var("GPUSORT_PRESORTED").as_deref() != Some("0"),
            few_distinct: var("GPUSORT_FEW_DISTINCT").as_deref() != Some("0"),
            merge: match var("GPUSORT_MERGE").as_deref() {
                None | Some("tree") => Some(MergeMethod::Tree),
                Some("odd-even") => Some(MergeMethod::OddEven),
                Some("0") => None,
                Some(v) => {
                    return Err(CudaSortError::Unsupported(format!(
                        "GPUSORT_MERGE={v} (tree, odd-even or 0)"
                    )));
                }
            },
            device_ties: match var("GPUSORT_DEVICE_TIES").as_deref() {
                None | Some("auto") => DeviceTies::Auto,
                Some("1") => DeviceTies::Always,
                Some("0") => DeviceTies::Never,
                Some(v) => {
                    return Err(CudaSortError::Unsupported(format!(
                        "GPUSORT_DEVICE_TIES={v} (auto, 1 or 0)"
                    )));
                }
            },
            device_budget,
            tuning_profile: None,
            direct_max_fields: count(
                "GPUSORT_DIRECT_MAX_FIELDS",
                var("GPUSORT_DIRECT_MAX_FIELDS"),
                DIRECT_MAX_FIELDS,
                0..=1024,
                "fields",
            )?,
            tie_views: var("GPUSORT_TIE_VIEWS").as_deref() != Some("0"),
            compact_views: var("GPUSORT_COMPACT_VIEWS").as_deref() != Some("0"),
            pin_ahead: var("GPUSORT_PIN_AHEAD").as_deref() != Some("0"),
            stream_priority: var("GPUSORT_STREAM_PRIORITY").as_deref() != Some("0"),
            stage_ahead: count(
                "GPUSORT_STAGE_AHEAD",
                var("GPUSORT_STAGE_AHEAD"),
                STAGE_AHEAD,
                1..=16,
                "segments",
            )?,
            direct_uploads: var("GPUSORT_DIRECT_UPLOADS").as_deref() != Some("0"),
        })
    }

    /// The strategy of a sort of `num_columns` columns by `sort_keys` keys (ByField, as Arrow
    /// batches are): `requested`, else SRTS-direct up to [`Self::direct_max_fields`] fields
    /// besides the key and SRTS-indirect beyond: [`Strategy::calibrated_default`] with this
    /// device's crossover.
    pub fn planned_strategy(&self, requested: Option<Strategy>, num_columns: usize, sort_keys: usize) -> Strategy {
        requested.unwrap_or_else(|| {
            let m = payload_fields(num_columns, sort_keys);
            match Strategy::calibrated_default(Layout::ByField, m) {
                s if s == Strategy::SRTS_DIRECT || s == Strategy::SRTS_INDIRECT => {
                    if m <= self.direct_max_fields {
                        Strategy::SRTS_DIRECT
                    } else {
                        Strategy::SRTS_INDIRECT
                    }
                }
                s => s,
            }
        })
    }

    /// The options of device `info`: its tuning profile's settings (the file `GPUSORT_TUNING`
    /// names, else the device's in `cache_dir`, the kernel cache; [`TuningProfile::find`]) under
    /// the `GPUSORT_*` variables. Without a profile for this GPU and driver, [`Self::from_env`].
    pub fn for_device(info: &DeviceInfo, cache_dir: Option<&Path>) -> Result<Self> {
        Self::for_device_with_vars(info, cache_dir, |name| std::env::var(name).ok())
    }

    /// As [`Self::for_device`], reading variables through `var`.
    pub fn for_device_with_vars(
        info: &DeviceInfo,
        cache_dir: Option<&Path>,
        var: impl Fn(&str) -> Option<String>,
    ) -> Result<Self> {
        let key = ProfileKey::of(info);
        let Some((path, profile)) = TuningProfile::find(&key, cache_dir, var(PROFILE_VAR).as_deref())? else {
            return Self::from_vars(var);
        };
        // The variables' own errors first, so that a bad variable is not blamed on the file.
        Self::from_vars(&var)?;
        let mut options = Self::from_vars(|name| var(name).or_else(|| profile.setting(name)))
            .map_err(|e| CudaSortError::Tuning(format!("{}: {e}", path.display())))?;
        options.tuning_profile = Some(path);
        Ok(options)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_are_read_from_the_variables_once() {
        let vars = |pairs: &'static [(&'static str, &'static str)]| {
            move |name: &str| pairs.iter().find(|(k, _)| *k == name).map(|(_, v)| v.to_string())
        };
        assert_eq!(GpuOptions::from_vars(vars(&[])).unwrap(), GpuOptions::default());
        let o = GpuOptions::from_vars(vars(&[
            ("GPUSORT_PROFILE", "1"),
            ("GPUSORT_MSD_BITS", "8"),
            ("GPUSORT_ONESWEEP", "0"),
            ("GPUSORT_PAIR_LANES", "0"),
            ("GPUSORT_DEVICE_KEYS", "0"),
            ("GPUSORT_DEVICE_VIEWS", "0"),
            ("GPUSORT_PRESORTED", "0"),
            ("GPUSORT_FEW_DISTINCT", "0"),
            ("GPUSORT_MERGE", "odd-even"),
            ("GPUSORT_DEVICE_TIES", "0"),
            ("GPUSORT_IPT", "12"),
            ("GPUSORT_PIN_AHEAD", "0"),
            ("GPUSORT_STREAM_PRIORITY", "0"),
            ("GPUSORT_STAGE_AHEAD", "1"),
            ("GPUSORT_DIRECT_UPLOADS", "0"),
        ]))
        .unwrap();
        assert_eq!(o.stage_ahead, 1);
        for bad in ["0", "17", "x"] {
            assert!(GpuOptions::from_vars(|n: &str| (n == "GPUSORT_STAGE_AHEAD").then(|| bad.to_string())).is_err());
        }
        assert!(o.profile && !o.onesweep && !o.pair_lanes && !o.device_keys && !o.device_views && !o.presorted);
        assert!(!o.few_distinct);
        assert!(!o.pin_ahead && !o.stream_priority && !o.direct_uploads);
        assert_eq!(o.device_ties, DeviceTies::Never);
        assert_eq!(o.merge, Some(MergeMethod::OddEven));
        assert_eq!(
            GpuOptions::from_vars(vars(&[("GPUSORT_MERGE", "0")])).unwrap().merge,
            None
        );
        assert!(GpuOptions::from_vars(vars(&[("GPUSORT_MERGE", "heap")])).is_err());
        assert!(GpuOptions::from_vars(|n: &str| (n == "GPUSORT_DEVICE_TIES").then(|| "yes".to_string())).is_err());
        assert_eq!((o.msd_max_bits, o.tuning.ipt), (8, 12));
        // Only "1" turns profiling on; anything but "0" leaves the others on, as before.
        let o = GpuOptions::from_vars(vars(&[("GPUSORT_PROFILE", "yes"), ("GPUSORT_ONESWEEP", "1")])).unwrap();
        assert!(!o.profile && o.onesweep);
        for bad in ["0", "12", "x"] {
            let err = GpuOptions::from_vars(|n: &str| (n == "GPUSORT_MSD_BITS").then(|| bad.to_string())).unwrap_err();
            assert!(err.to_string().contains(&format!("GPUSORT_MSD_BITS={bad}")), "{err}");
        }
        for (v, bytes) in [("40g", Some(40usize << 30)), ("512MiB", Some(512 << 20)), ("0", None)] {
            let o = GpuOptions::from_vars(|n: &str| (n == "GPUSORT_DEVICE_BUDGET").then(|| v.to_string())).unwrap();
            assert_eq!(o.device_budget, bytes, "{v}");
        }
        let err =
            GpuOptions::from_vars(|n: &str| (n == "GPUSORT_DEVICE_BUDGET").then(|| "lots".to_string())).unwrap_err();
        assert!(err.to_string().contains("GPUSORT_DEVICE_BUDGET=lots"), "{err}");
        for (v, bytes) in [("99K", 99 << 10), ("163KiB", 163 << 10), ("98304", 98304)] {
            let o = GpuOptions::from_vars(|n: &str| (n == "GPUSORT_SMEM_CAP").then(|| v.to_string())).unwrap();
            assert_eq!(o.smem_cap, Some(bytes), "{v}");
        }
        for bad in ["8K", "2000K", "x", "99M"] {
            let err = GpuOptions::from_vars(|n: &str| (n == "GPUSORT_SMEM_CAP").then(|| bad.to_string())).unwrap_err();
            assert!(err.to_string().contains(&format!("GPUSORT_SMEM_CAP={bad}")), "{err}");
        }
        let err = GpuOptions::from_vars(vars(&[("GPUSORT_IPT", "0")])).unwrap_err();
        assert!(err.to_string().contains("GPUSORT_IPT=0"), "{err}");
    }

    fn h100() -> DeviceInfo {
        DeviceInfo::h100_example()
    }

    /// By default the planned strategy is the calibrated rule's; a device's crossover moves it.
    #[test]
    fn the_planned_strategy_follows_the_device_s_crossover() {
        let d = GpuOptions::default();
        for m in 0..40 {
            assert_eq!(
                d.planned_strategy(None, m + 1, 1),
                Strategy::calibrated_default(Layout::ByField, m),
                "{m}"
            );
        }
        let o = GpuOptions::from_vars(|n| (n == "GPUSORT_DIRECT_MAX_FIELDS").then(|| "5".to_string())).unwrap();
        assert_eq!(o.direct_max_fields, 5);
        assert_eq!(o.planned_strategy(None, 6, 1), Strategy::SRTS_DIRECT);
        assert_eq!(o.planned_strategy(None, 7, 1), Strategy::SRTS_INDIRECT);
        assert_eq!(
            o.planned_strategy(Some(Strategy::GRS_DIRECT), 7, 1),
            Strategy::GRS_DIRECT
        );
        let err = GpuOptions::from_vars(|n| (n == "GPUSORT_DIRECT_MAX_FIELDS").then(|| "x".to_string())).unwrap_err();
        assert!(err.to_string().contains("GPUSORT_DIRECT_MAX_FIELDS=x"), "{err}");
    }

    /// Built-in defaults < the device's tuning profile < `GPUSORT_*` variables; a profile of
    /// another GPU or driver, or `GPUSORT_TUNING=off`, leaves the defaults.
    #[test]
    fn a_device_s_tuning_profile_sits_between_the_defaults_and_the_variables() {
        let dir = std::env::temp_dir().join(format!("gpusort-options-profile-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let info = h100();
        let vars = |pairs: &'static [(&'static str, &'static str)]| {
            move |name: &str| pairs.iter().find(|(k, _)| *k == name).map(|(_, v)| v.to_string())
        };
        // No profile yet: the defaults.
        let o = GpuOptions::for_device_with_vars(&info, Some(&dir), vars(&[])).unwrap();
        assert_eq!(o, GpuOptions::default());
        let profile = TuningProfile {
            key: ProfileKey::of(&info),
            settings: [
                ("GPUSORT_ONESWEEP_IPT".to_string(), "24".to_string()),
                ("GPUSORT_PAIR_LANES".to_string(), "0".to_string()),
            ]
            .into(),
            speedup: 1.05,
            search_seconds: 100.0,
            measured: vec![],
        };
        let path = profile.write_to(&dir).unwrap();
        let o = GpuOptions::for_device_with_vars(&info, Some(&dir), vars(&[])).unwrap();
        assert_eq!((o.tuning.onesweep_ipt, o.pair_lanes), (Some(24), false));
        assert_eq!(o.tuning_profile.as_ref(), Some(&path));
        assert_eq!((o.tuning.ipt, o.onesweep), (KernelTuning::default().ipt, true));
        // A variable overrides its line of the profile; the profile's other lines still apply.
        let o = GpuOptions::for_device_with_vars(&info, Some(&dir), vars(&[("GPUSORT_ONESWEEP_IPT", "16")])).unwrap();
        assert_eq!((o.tuning.onesweep_ipt, o.pair_lanes), (Some(16), false));
        // Off: none.
        let o = GpuOptions::for_device_with_vars(&info, Some(&dir), vars(&[("GPUSORT_TUNING", "off")])).unwrap();
        assert_eq!(o, GpuOptions::default());
        // Another driver or GPU: the H100's profile is not theirs.
        for other in [
            DeviceInfo {
                driver_version: 12080,
                ..info.clone()
            },
            DeviceInfo {
                name: "NVIDIA H200".into(),
                multiprocessors: 132,
                ..info.clone()
            },
        ] {
            let o = GpuOptions::for_device_with_vars(&other, Some(&dir), vars(&[])).unwrap();
            assert_eq!(o, GpuOptions::default(), "{}", other.name);
            let named = |n: &str| (n == "GPUSORT_TUNING").then(|| path.display().to_string());
            assert_eq!(
                GpuOptions::for_device_with_vars(&other, None, named).unwrap(),
                GpuOptions::default()
            );
        }
        // A bad value in the profile is an error that names the file; a bad variable names the variable.
        let bad = TuningProfile {
            settings: [("GPUSORT_IPT".to_string(), "0".to_string())].into(),
            ..profile
        };
        bad.write_to(&dir).unwrap();
        let err = GpuOptions::for_device_with_vars(&info, Some(&dir), vars(&[]))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains(&path.display().to_string()) && err.contains("GPUSORT_IPT=0"),
            "{err}"
        );
        let err = GpuOptions::for_device_with_vars(&info, Some(&dir), vars(&[("GPUSORT_MSD_BITS", "99")]))
            .unwrap_err()
            .to_string();
        assert!(err.contains("GPUSORT_MSD_BITS=99") && !err.contains("tuning"), "{err}");
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn tie_groups_go_to_the_device_by_their_mean_size() {
        assert!(DeviceTies::Auto.on_device(3, 10_000_000));
        assert!(DeviceTies::Auto.on_device(1, DEVICE_TIES_MIN_MEAN_ROWS));
        assert!(!DeviceTies::Auto.on_device(2_777_761, 10_000_000));
        assert!(!DeviceTies::Auto.on_device(2, 2 * DEVICE_TIES_MIN_MEAN_ROWS - 1));
        assert!(DeviceTies::Always.on_device(1_000, 2_000) && !DeviceTies::Never.on_device(1, 1 << 30));
    }
}
