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

impl DeviceChoice {
    /// The GPU a sort would use: the one named, GPU 0 for `auto`; `None` for `cpu`.
    pub fn ordinal(self) -> Option<usize> {
        match self {
            Self::Auto => Some(0),
            Self::Cpu => None,
            Self::Gpu(n) => Some(n),
        }
    }
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

/// The GPUs one sort may split over (`gpusort.devices`): `one` (the default: the one device
/// `gpusort.device` names), `all` (every GPU of the host), or a list of GPU numbers (`0,1`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum DeviceList {
    /// One device, as `gpusort.device` says.
    #[default]
    One,
    /// Every GPU the driver lists.
    All,
    /// These GPUs, in this order (their key ranges' order).
    List(Vec<usize>),
}

impl fmt::Display for DeviceList {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::One => f.write_str("one"),
            Self::All => f.write_str("all"),
            Self::List(l) => {
                let l: Vec<String> = l.iter().map(|n| n.to_string()).collect();
                f.write_str(&l.join(","))
            }
        }
    }
}

impl FromStr for DeviceList {
    type Err = DataFusionError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let t = s.trim().to_ascii_lowercase();
        match t.as_str() {
            "" | "one" | "none" => return Ok(Self::One),
            "all" => return Ok(Self::All),
            _ => {}
        }
        let mut list = Vec::new();
        for part in t.split(',') {
            let part = part.trim();
            match part.strip_prefix("cuda:").unwrap_or(part).parse::<usize>() {
                Ok(n) if !list.contains(&n) => list.push(n),
                Ok(n) => return config_err!("gpusort.devices: GPU {n} is named twice in '{s}'"),
                Err(_) => return config_err!("gpusort.devices: expected one, all or GPU numbers like 0,1, got '{s}'"),
            }
        }
        Ok(Self::List(list))
    }
}

/// The sort strategy: `auto` (the planner's rule, calibrated on the H100), one of the eight GPU strategies, or
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
                    "gpusort.strategy: expected auto, {} or cpu, got '{s}'",
                    Strategy::names()
                )
            }),
        }
    }
}

/// A byte count, written as DuckDB and datafusion-cli take them ([`gpusort::size`]): `8g`,
/// `8GiB` (binary), `8GB`, `512MB` (decimal), `1073741824`, `1.5g`; `0` or `none` means no limit
/// wherever a limit is set with it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ByteSize(pub usize);

impl fmt::Display for ByteSize {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

impl ByteSize {
    /// Parses `s` with [`gpusort::parse_byte_size`]; `None` when it is not a byte count that
    /// fits a `usize`.
    pub fn parse(s: &str) -> Option<Self> {
        gpusort::parse_byte_size(s).map(Self)
    }
}

impl FromStr for ByteSize {
    type Err = DataFusionError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match Self::parse(s) {
            Some(size) => Ok(size),
            None => config_err!("{}", gpusort::size::size_error(s)),
        }
    }
}

config_field!(DeviceChoice);
config_field!(DeviceList);
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
        /// GPUs one large sort splits over by key ranges, each GPU sorting one range at once
        /// (`gpusort_cuda::MultiGpuBackend`): `one` (only `device`), `all`, or GPU numbers
        /// (`0,1`). Sorts too small for two ranges (~1M rows each) run on the first GPU, as
        /// does everything when `device` is `cpu` or names no GPU.
        pub devices: DeviceList, default = DeviceList::One
        /// The fewest rows of each GPU's key range when `devices` names several GPUs: a sort of
        /// fewer than twice this runs on one GPU.
        pub split_min_rows: usize, default = 1 << 20
        /// `auto` (the planner's rule, calibrated on the H100), one of `gpusort::Strategy::ALL`
        /// (grs-direct, grs-indirect, srts-direct, srts-indirect, msd-direct, msd-indirect,
        /// samplesort-direct, samplesort-indirect; a test checks this list), or `cpu`.
        pub strategy: StrategyChoice, default = StrategyChoice::Auto
        /// Device memory one sort may use, e.g. `2G` or `2GiB`; 0 (or `none`) means the process's device memory budget
        /// (`GPUSORT_DEVICE_BUDGET`, default the GPU's free memory at open less a sixteenth), which all sorts running at
        /// once share: a sort waits for its share (`gpu_wait_time`). A sort that needs more runs on the CPU (the reason
        /// shows in the metrics).
        pub gpu_memory_limit: ByteSize, default = ByteSize(0)
        /// Where DataFusion sorts each partition and merges them (`SortPreservingMergeExec`),
        /// sort all partitions in one `GpuSortExec` instead.
        pub merge_partitions: bool, default = true
        /// Where DataFusion merges partitions that are already sorted (a
        /// `SortPreservingMergeExec` over sorted input, e.g. files declared `WITH ORDER`, without
        /// a `LIMIT` of at most `topk_max_fetch`), merge them in a `GpuSortPreservingMergeExec`:
        /// by key ranges on the GPU or on every core, after reading the whole input.
        pub merge_sorted_partitions: bool, default = true
        /// Most rows of one sorted run of the external sort; 0 sizes runs by the GPU memory
        /// budget (and the memory pool) alone.
        pub max_run_rows: usize, default = 0
        /// A range-merge step of the external sort on the GPU sends only its key columns to
        /// the device, where those are at most half of the rows' bytes: the permutation comes
        /// back and the rows are gathered through it on every core. False (the default) sends
        /// the rows whole, and the device merges them and sends them back sorted: measured on
        /// an H200 with 16 cores (the `external` bench), the host's gather of 690 MB a step
        /// took longer than the rows' round trip over PCIe.
        pub merge_keys_only: bool, default = false
        /// `ORDER BY ... LIMIT n` with `n` (plus any `OFFSET`) at most this stays DataFusion's
        /// TopK: a heap of `n` rows fed as the input streams, with a dynamic filter on the scan,
        /// which for small `n` beats buffering the whole input for a sort. Its cost grows with
        /// `n` (the `topk` bench measures the crossover). Larger `n` sort in `GpuSortExec`; 0
        /// sends every TopK there.
        pub topk_max_fetch: usize, default = 1000
        /// Output batches' string and binary view columns keep only the bytes of their own
        /// rows (a copy: slices of the sorted columns share all their buffers, which operators
        /// that concatenate batches copy again each time). False hands out the slices as they
        /// are, for a consumer that encodes each batch and drops it, e.g. a Parquet writer:
        /// no copy, and the sorted buffers are freed with the last batch.
        pub compact_output_views: bool, default = true
        /// A GPU sort whose buffered rows reach `min_rows`, and stay within what one GPU sort
        /// holds under `gpu_memory_limit` (the run size), keeps on the host only the columns
        /// it still reads there (the sort keys, columns the GPU does not take, string views'
        /// data buffers): the others' memory is freed as soon as they are staged for the GPU
        /// and reused for the next input batches, instead of the whole decoded input staying
        /// in memory the kernel hands out fresh (and zeroes) until the sort ends. The cost:
        /// if the GPU then fails (out of device memory, a driver error), the query fails
        /// instead of sorting those rows on the CPU. False keeps every row on the host.
        pub release_uploaded_input: bool, default = false
        /// A sort of one partition without `LIMIT` whose input only scans local Parquet files
        /// (no filter, no limit; partitions coalesced or repartitioned) reads the files itself
        /// on the GPU: their pages decoded there, the rows never on the host (`DeviceScan`).
        /// Files of more rows than one GPU sort holds are read in runs of whole row groups,
        /// each sorted on the GPU and brought to the host, then merged; not under a memory
        /// pool's limit (the runs are all held before they are merged). Where the device
        /// cannot (no GPU or nvCOMP, a type, codec or encoding it does not decode, a
        /// projection of the files' columns, a sort on the CPU), the input executes as ever
        /// (`device_scan_fallbacks`). On by default: DataFusion's whole slt suite passes with
        /// it, every sort on the GPU (its Parquet scans all fall back: `gpu_sql`'s
        /// `gpu_datafusion_slt_suite_with_device_scans`). The `gpusort` tool turns it off
        /// under `--memory-limit`.
        pub device_scan: bool, default = true
        /// A GPU sort of more rows than this streams its output out of the device this many
        /// rows at a time, two ranges ahead of the consumer, which takes one range while the
        /// next crosses PCIe; the device memory is held until the last range came down. 0
        /// brings the rows down whole, freeing the device memory at once.
        pub output_range_rows: usize, default = 1 << 20
        /// An external sort's runs and merge steps sorted on the GPU come down in ranges of
        /// this many rows, each into pinned blocks of its own that return to the pool as the
        /// merge reads past them, and the next steps' ranges reuse them; a step's ranges go
        /// to the consumer as they come down. 0 (the default) brings each run and step down
        /// in one piece (blocks of its size, pinned anew): on TPC-H lineitem under a 4 GiB GPU
        /// budget, ranges of 1M, 2M and 4M rows took the steps' pinning off their path but
        /// made the device scan's runs 0.5-0.9 s slower to come down, each range's blocks
        /// registered with the driver on their own (H100, stop 54).
        pub run_range_rows: usize, default = 0
        /// Where a sorted output is written to Parquet files through DataFusion's
        /// `ParquetSink` (`COPY (SELECT ... ORDER BY ...) TO 'out.parquet'`), write them with
        /// gpusort's writer instead (`GpuParquetSink`): the same writer properties, row groups
        /// encoded in parallel, zstd pages compressed on the GPU where nvCOMP loads.
        pub parquet_sink: bool, default = true
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
        assert_eq!(c.devices, DeviceList::One);
        c.set("devices", "all").unwrap();
        assert_eq!(c.devices, DeviceList::All);
        c.set("devices", "1, cuda:0").unwrap();
        assert_eq!(c.devices, DeviceList::List(vec![1, 0]));
        assert_eq!(c.devices.to_string(), "1,0");
        assert!(c.set("devices", "0,0").is_err());
        assert!(c.set("devices", "0,x").is_err());
        c.set("devices", "one").unwrap();
        assert_eq!(c.devices, DeviceList::One);
        c.set("strategy", "GRS-indirect").unwrap();
        assert_eq!(c.strategy.to_string(), "grs-indirect");
        assert!(
            c.set("strategy", "quick")
                .unwrap_err()
                .to_string()
                .contains("srts-direct")
        );
        assert_eq!(c.output_range_rows, 1 << 20);
        c.set("output_range_rows", "0").unwrap();
        assert_eq!(c.output_range_rows, 0);
        assert!(c.set("output_range_rows", "-1").is_err());
        c.set("gpu_memory_limit", "1.5G").unwrap();
        assert_eq!(c.gpu_memory_limit.0, 3 << 29);
        c.set("gpu_memory_limit", "64mib").unwrap();
        assert_eq!(c.gpu_memory_limit.0, 64 << 20);
        assert!(c.set("gpu_memory_limit", "lots").is_err());
        c.set("gpu_memory_limit", "none").unwrap();
        assert_eq!(c.gpu_memory_limit.0, 0);
        assert_eq!(ByteSize::parse("8GB"), Some(ByteSize(8_000_000_000)));
        assert!(
            c.set("gpu_memory_limit", "8 gigs")
                .unwrap_err()
                .to_string()
                .contains("8GiB")
        );
        assert!(c.set("min_rows", "-1").is_err());
        c.set("enabled", "FALSE").unwrap();
        assert!(!c.enabled);
        assert!(c.set("no_such_option", "1").is_err());
        let keys: Vec<String> = c.entries().into_iter().map(|e| e.key).collect();
        assert!(keys.contains(&"merge_partitions".to_string()), "{keys:?}");
        c.set("topk_max_fetch", "0").unwrap();
        assert_eq!(c.topk_max_fetch, 0);
    }

    #[test]
    fn strategy_messages_name_every_strategy() {
        let mut c = GpuSortConfig::default();
        let err = c.set("strategy", "quick").unwrap_err().to_string();
        let doc = c
            .entries()
            .into_iter()
            .find(|e| e.key == "strategy")
            .unwrap()
            .description;
        for s in Strategy::ALL {
            assert!(err.contains(&s.to_string()), "{err}");
            assert!(doc.contains(&s.to_string()), "{doc}");
        }
    }
}
