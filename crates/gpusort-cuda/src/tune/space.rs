//! The search space of `gpusort tune`: each parameter is the `GPUSORT_*` variable that sets it
//! ([`GpuOptions::from_vars`](crate::GpuOptions::from_vars)), the values tried besides its
//! default, and whether trying one compiles the kernels (a [`KernelTuning`](crate::KernelTuning)
//! field: the kernels built ahead of time are those of the defaults only, so NVRTC compiles
//! every other value, a few seconds each) or only switches how the passes run.
//!
//! The values are the neighbourhood of the defaults that `kernels/NOTES.md` measured on the H100
//! (Huang, Gao & Li's first stage bounds the range of each parameter before the search): tile
//! sizes a step either side, the one-sweep block of CUB's tile, the occupancy targets, the
//! look-back window halved and doubled, and each switch off.

use std::collections::BTreeMap;

/// The settings of a candidate: `GPUSORT_*` variable -> value, only those that differ from the
/// built-in defaults (an absent variable keeps its default, so the defaults are the empty map
/// and use the kernels built ahead of time).
pub type Settings = BTreeMap<String, String>;

/// One parameter of the search.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TuneParam {
    /// The `GPUSORT_*` variable that sets it.
    pub var: &'static str,
    /// What it is, for the table.
    pub what: &'static str,
    /// Its built-in default, in words.
    pub default: &'static str,
    /// The values tried besides the default.
    pub values: &'static [&'static str],
    /// Trying a value compiles the kernels (a `#define` of every program).
    pub compiles: bool,
    /// It changes only sorts that run the MSD hybrid.
    pub msd_only: bool,
}

/// The parameters in the order the coordinate search takes them: the one-sweep pass (every
/// SRTS pass of 5 to 8 bits, the planner's strategy for keys and records) first, the LSD tiles,
/// then the runtime switches.
pub const SEARCH_SPACE: &[TuneParam] = &[
    TuneParam {
        var: "GPUSORT_ONESWEEP_IPT",
        what: "rows per thread of a one-sweep tile",
        default: "20",
        values: &["16", "24"],
        compiles: true,
        msd_only: false,
    },
    TuneParam {
        var: "GPUSORT_ONESWEEP_BLOCK",
        what: "threads of a one-sweep block",
        default: "256",
        values: &["384"],
        compiles: true,
        msd_only: false,
    },
    TuneParam {
        var: "GPUSORT_ONESWEEP_MIN_BLOCKS",
        what: "one-sweep blocks per SM compiled for",
        default: "768 threads' worth",
        values: &["2", "4"],
        compiles: true,
        msd_only: false,
    },
    TuneParam {
        var: "GPUSORT_ONESWEEP_KEEP_WORDS",
        what: "one-sweep digit words kept (0 read again, 2 shared)",
        default: "2",
        values: &["0"],
        compiles: true,
        msd_only: false,
    },
    TuneParam {
        var: "GPUSORT_ONESWEEP_LOOKBACK_WINDOW",
        what: "look-back words loaded at once",
        default: "8",
        values: &["4", "16"],
        compiles: true,
        msd_only: false,
    },
    TuneParam {
        var: "GPUSORT_IPT",
        what: "rows per thread of a GRS / SRTS / MSD tile",
        default: "16",
        values: &["12", "20"],
        compiles: true,
        msd_only: false,
    },
    TuneParam {
        var: "GPUSORT_RANK_FOLD",
        what: "block start folded into the warps' counters",
        default: "1",
        values: &["0"],
        compiles: true,
        msd_only: false,
    },
    TuneParam {
        var: "GPUSORT_PAIR_LANES",
        what: "4-byte lanes moved in pairs",
        default: "1",
        values: &["0"],
        compiles: false,
        msd_only: false,
    },
    TuneParam {
        var: "GPUSORT_ONESWEEP",
        what: "SRTS passes as one sweep",
        default: "1",
        values: &["0"],
        compiles: false,
        msd_only: false,
    },
    TuneParam {
        var: "GPUSORT_MSD_BITS",
        what: "widest MSD partition digit (bits)",
        default: "11",
        values: &["8"],
        compiles: false,
        msd_only: true,
    },
];

/// Whether `var` is a setting a tuning profile may hold (one of [`SEARCH_SPACE`], or the
/// crossover).
pub fn is_tunable(var: &str) -> bool {
    var == super::crossover::CROSSOVER_VAR || SEARCH_SPACE.iter().any(|p| p.var == var)
}

/// The settings as one line, `VAR=value` comma-separated, `defaults` when empty.
pub fn describe(settings: &Settings) -> String {
    if settings.is_empty() {
        return "defaults".into();
    }
    settings
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(",")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::options::GpuOptions;

    /// Every value of the space is one the options accept, and none is the default written out
    /// (that would compile the default kernels again under another hash).
    #[test]
    fn every_value_of_the_space_is_accepted_and_none_is_the_default() {
        for p in SEARCH_SPACE {
            assert!(!p.values.is_empty(), "{}", p.var);
            assert!(!p.values.contains(&p.default), "{}", p.var);
            for v in p.values {
                let o = GpuOptions::from_vars(|n| (n == p.var).then(|| v.to_string()));
                let o = o.unwrap_or_else(|e| panic!("{}={v}: {e}", p.var));
                assert_ne!(o, GpuOptions::default(), "{}={v} changes nothing", p.var);
            }
        }
        assert!(is_tunable("GPUSORT_IPT") && !is_tunable("GPUSORT_DEVICE_BUDGET"));
        assert!(is_tunable("GPUSORT_DIRECT_MAX_FIELDS"));
        let s: Settings = [("GPUSORT_IPT".to_string(), "12".to_string())].into();
        assert_eq!(describe(&s), "GPUSORT_IPT=12");
        assert_eq!(describe(&Settings::new()), "defaults");
    }
}
