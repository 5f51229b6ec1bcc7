//! `gpusort.*` session options: a DataFusion config extension, so `SET gpusort.enabled = false`
//! works in SQL and the options travel with the session.

use std::fmt;
use std::str::FromStr;

use datafusion::common::config::{ConfigExtension, ConfigOptions};
use datafusion::common::{config_err, config_field, extensions_options};
use datafusion::error::DataFusionError;
use gpusort::Strategy;

/// Which device sorts: `auto` (the first GPU, else the CPU), `cpu`, or a GPU's ordinal.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DeviceChoice {
    /// GPU 0 when one is usable, else the CPU (the reason shows in the metrics).
    #[default]
    Auto,
    /// Always the CPU backend.
    Cpu,
    /// This GPU; a query fails when it is not usable.
    Gpu(usize),
}

impl fmt::Display for DeviceChoice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Auto => f.write_str("auto"),
            Self::Cpu => f.write_str("cpu"),
            Self::Gpu(n) => write!(f, "{n}"),
        }
    }
}

impl FromStr for DeviceChoice {
    type Err = DataFusionError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let t = s.trim().to_ascii_lowercase();
        match t.as_str() {
            "auto" | "" => Ok(Self::Auto),
            "cpu" => Ok(Self::Cpu),
            _ => match t.strip_prefix("cuda:").unwrap_or(&t).parse::<usize>() {
                Ok(n) => Ok(Self::Gpu(n)),
                Err(_) => config_err!("gpusort.device: expected auto, cpu or a GPU number, got '{s}'"),
            },
        }
    }
}

/// The sort strategy: `auto` (the planner's rule, calibrated on the H100), one of the six GPU strategies, or
/// `cpu` (the CPU backend).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum StrategyChoice {
    /// The planner's choice (`Strategy::calibrated_default` for the ByField layout).
    #[default]
    Auto,
    /// This strategy.
    Fixed(Strategy),
    /// The CPU backend, whatever the device.
    Cpu,
}

impl StrategyChoice {
    /// The strategy to ask the backend for (`None`: its planner decides).
    pub fn strategy(&self) -> Option<Strategy> {
        match self {
            Self::Fixed(s) => Some(*s),
            _ => None,
        }
    }
}

impl fmt::Display for StrategyChoice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Auto => f.write_str("auto"),
            Self::Fixed(s) => write!(f, "{s}"),
            Self::Cpu => f.write_str("cpu"),
        }
    }
}

impl FromStr for StrategyChoice {
    type Err = DataFusionError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim().to_ascii_lowercase().as_str() {
            "auto" | "" => Ok(Self::Auto),
            "cpu" => Ok(Self::Cpu),
            other => other.parse::<Strategy>().map(Self::Fixed).or_else(|_| {
                config_err!(
                    "gpusort.strategy: expected auto, grs-direct, grs-indirect, srts-direct, srts-indirect, msd-direct, msd-indirect or cpu, got '{s}'"
                )
            }),
        }
    }
}

/// A byte count, written as DuckDB and datafusion-cli take them: `1073741824`, `512k`, `512m`,
/// `8g`, `1t` (binary: 2^10, 2^20, ...), `512KiB`, `512MiB`, `8GiB`, `1TiB` (binary too),
/// `512KB`, `512MB`, `8GB`, `1TB` (decimal: 10^3, 10^6, ...), `100B`; fractions such as `1.5g`;
/// case and spaces do not matter. `0` means no limit wherever a limit is set with it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ByteSize(pub usize);

impl fmt::Display for ByteSize {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

impl ByteSize {
    /// Parses `s` (see the type's doc); `None` when it is not a byte count that fits a
    /// `usize`.
    pub fn parse(s: &str) -> Option<Self> {
        let t = s.trim().to_ascii_lowercase();
        let split = t
            .char_indices()
            .find(|(_, c)| c.is_ascii_alphabetic())
            .map_or(t.len(), |(i, _)| i);
        let (digits, unit) = t.split_at(split);
        let multiplier: f64 = match unit.trim() {
            "" | "b" | "byte" | "bytes" => 1.0,
            "k" | "kib" => (1u64 << 10) as f64,
            "m" | "mib" => (1u64 << 20) as f64,
            "g" | "gib" => (1u64 << 30) as f64,
            "t" | "tib" => (1u64 << 40) as f64,
            "kb" => 1e3,
            "mb" => 1e6,
            "gb" => 1e9,
            "tb" => 1e12,
            _ => return None,
        };
        let digits = digits.trim();
        if digits.is_empty() || !digits.chars().all(|c| c.is_ascii_digit() || c == '.') {
            return None;
        }
        if multiplier == 1.0 && !digits.contains('.') {
            return digits.parse::<usize>().ok().map(Self);
        }
        let n: f64 = digits.parse().ok()?;
        let bytes = (n * multiplier).round();
        (bytes.is_finite() && bytes < usize::MAX as f64).then_some(Self(bytes as usize))
    }
}

impl FromStr for ByteSize {
    type Err = DataFusionError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match Self::parse(s) {
            Some(size) => Ok(size),
            None => config_err!("expected a byte count like 512M, 512MiB, 8G, 8GiB or 8GB, got '{s}'"),
        }
    }
}

config_field!(DeviceChoice);
config_field!(StrategyChoice);
config_field!(ByteSize);

extensions_options! {
    /// Options of gpusort's sort operator, set with `SET gpusort.<name> = <value>` or on the
    /// [`SessionConfig`](datafusion::prelude::SessionConfig).
    pub struct GpuSortConfig {
        /// Replace DataFusion's `SortExec` with `GpuSortExec` (plans made while false keep
        /// DataFusion's sort).
        pub enabled: bool, default = true
        /// Sorts of fewer rows run on the CPU backend (a GPU round trip costs more than it saves).
        pub min_rows: usize, default = 100_000
        /// `auto` (GPU 0 if usable, else the CPU), `cpu`, or a GPU number (must be usable).
        pub device: DeviceChoice, default = DeviceChoice::Auto
        /// `auto` (the planner's rule, calibrated on the H100), `grs-direct`, `grs-indirect`,
        /// `srts-direct`, `srts-indirect`, `msd-direct`, `msd-indirect`, or `cpu`.
        pub strategy: StrategyChoice, default = StrategyChoice::Auto
        /// Device memory one sort may use, e.g. `2G`; 0 means the GPU's free memory. A sort that
        /// needs more runs on the CPU (the reason shows in the metrics).
        pub gpu_memory_limit: ByteSize, default = ByteSize(0)
        /// Where DataFusion sorts each partition and merges them (`SortPreservingMergeExec`),
        /// sort all partitions in one `GpuSortExec` instead.
        pub merge_partitions: bool, default = true
        /// Most rows of one sorted run of the external sort; 0 sizes runs by the GPU memory
        /// budget (and the memory pool) alone.
        pub max_run_rows: usize, default = 0
        /// `ORDER BY ... LIMIT n` with `n` (plus any `OFFSET`) at most this stays DataFusion's
        /// TopK: a heap of `n` rows fed as the input streams, with a dynamic filter on the scan,
        /// which for small `n` beats buffering the whole input for a sort. Its cost grows with
        /// `n` (the `topk` bench measures the crossover). Larger `n` sort in `GpuSortExec`; 0
        /// sends every TopK there.
        pub topk_max_fetch: usize, default = 1000
    }
}

impl ConfigExtension for GpuSortConfig {
    const PREFIX: &'static str = "gpusort";
}

impl GpuSortConfig {
    /// The options set in `config`, or the defaults when the extension is not registered.
    pub fn from_config(config: &ConfigOptions) -> Self {
        config.extensions.get::<GpuSortConfig>().cloned().unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::common::config::ExtensionOptions;

    #[test]
    fn options_parse_and_reject_bad_values() {
        let mut c = GpuSortConfig::default();
        c.set("device", "cuda:1").unwrap();
        assert_eq!(c.device, DeviceChoice::Gpu(1));
        c.set("device", "CPU").unwrap();
        assert_eq!(c.device, DeviceChoice::Cpu);
        assert!(c.set("device", "gpu-zero").is_err());
        c.set("strategy", "GRS-indirect").unwrap();
        assert_eq!(c.strategy.to_string(), "grs-indirect");
        assert!(
            c.set("strategy", "quick")
                .unwrap_err()
                .to_string()
                .contains("srts-direct")
        );
        c.set("gpu_memory_limit", "1.5G").unwrap();
        assert_eq!(c.gpu_memory_limit.0, 3 << 29);
        c.set("gpu_memory_limit", "64mib").unwrap();
        assert_eq!(c.gpu_memory_limit.0, 64 << 20);
        assert!(c.set("gpu_memory_limit", "lots").is_err());
        for (text, bytes) in [
            ("8GiB", 8usize << 30),
            ("8g", 8 << 30),
            ("8 G", 8 << 30),
            ("8GB", 8_000_000_000),
            ("512MiB", 512 << 20),
            ("512mb", 512_000_000),
            ("1.5k", 1536),
            ("100B", 100),
            ("0", 0),
            ("1073741824", 1 << 30),
        ] {
            assert_eq!(ByteSize::parse(text), Some(ByteSize(bytes)), "{text}");
        }
        for bad in ["", "g", "-1g", "8 gigs", "1e3", "8xb", "99999999999999999999t"] {
            assert_eq!(ByteSize::parse(bad), None, "{bad}");
        }
        assert!(c.set("min_rows", "-1").is_err());
        c.set("enabled", "FALSE").unwrap();
        assert!(!c.enabled);
        assert!(c.set("no_such_option", "1").is_err());
        let keys: Vec<String> = c.entries().into_iter().map(|e| e.key).collect();
        assert!(keys.contains(&"merge_partitions".to_string()), "{keys:?}");
        c.set("topk_max_fetch", "0").unwrap();
        assert_eq!(c.topk_max_fetch, 0);
    }
}
