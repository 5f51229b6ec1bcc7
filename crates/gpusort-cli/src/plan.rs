//! From the arguments to a DataFusion physical plan: the session (memory pool, spill
//! directory, `gpusort.*` options), the inputs as one listing table, the ORDER BY, and the plan
//! `Parquet scan -> GpuSortExec` that `gpusort sort` streams into the writer and `gpusort
//! explain` prints.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use datafusion::datasource::file_format::options::ReadOptions;
use datafusion::datasource::listing::{ListingTable, ListingTableConfig, ListingTableUrl};
use datafusion::execution::SessionStateBuilder;
use datafusion::execution::runtime_env::RuntimeEnvBuilder;
use datafusion::physical_plan::ExecutionPlan;
use datafusion::prelude::{ParquetReadOptions, SessionConfig, SessionContext};
use datafusion_gpusort::{ByteSize, DeviceChoice, DeviceList, GpuSortConfig, SessionStateBuilderExt, StrategyChoice};

use crate::error::{CliError, Result, one_line};
use crate::inputs::Inputs;
use crate::interrupt::SpillDir;
use crate::narrow::NarrowDecimals;
use crate::order_by::OrderBy;

/// How to sort: what `gpusort sort` and `gpusort explain` share.
#[derive(Debug, Clone, clap::Args)]
pub struct PlanArgs {
    /// Parquet files, directories (their .parquet files, at any depth) or glob patterns
    #[arg(required = true, value_name = "INPUT")]
    pub inputs: Vec<String>,

    /// The ORDER BY list, in SQL: columns with ASC/DESC and NULLS FIRST/LAST, e.g.
    /// "a DESC NULLS LAST, b"
    #[arg(short = 'k', long, value_name = "LIST")]
    pub order_by: String,

    /// Memory the sort and the writer may use together, e.g. 8g, 8GiB, 8GB, 512MiB (more
    /// spills to disk); 0 or none: no limit
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    pub memory_limit: Option<ByteSize>,

    /// Device memory one GPU sort may use, e.g. 20g; larger sorts run on the CPU. 0 or none:
    /// the GPU's free memory
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    pub gpu_memory_limit: Option<ByteSize>,

    /// Disk space the spill files may take, e.g. 100g; 0 or none: no limit (the disk's free
    /// space)
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    pub disk_limit: Option<ByteSize>,

    /// Where to sort: auto (GPU 0 if usable, else the CPU), cpu, or a GPU number (the sort
    /// fails if it is not usable)
    #[arg(long, value_name = "N|cpu|auto", default_value = "auto", value_parser = parse_device)]
    pub device: DeviceChoice,

    /// GPUs one sort splits over by key ranges: one (only --device), all, or GPU numbers
    /// like 0,1
    #[arg(long, value_name = "one|all|N,N", default_value = "one", value_parser = parse_devices)]
    pub devices: DeviceList,

    /// The sort strategy (the help lists them)
    #[arg(long, value_name = "NAME", default_value = "auto", value_parser = parse_strategy,
          help = strategy_help())]
    pub strategy: StrategyChoice,

    /// Sorts of fewer rows run on the CPU (a GPU round trip costs more than it saves);
    /// default: 100000
    #[arg(long, value_name = "ROWS")]
    pub min_rows: Option<usize>,

    /// Directory for spill files; default: the system's temporary directory
    #[arg(long, value_name = "DIR")]
    pub temp_dir: Option<PathBuf>,

    /// Sort with DataFusion's own SortExec instead of gpusort (to compare)
    #[arg(long)]
    pub no_gpusort: bool,
}

impl PlanArgs {
    /// Arguments for sorting `inputs` by `order_by` with every option at its default.
    pub fn new(inputs: Vec<String>, order_by: impl Into<String>) -> Self {
        Self {
            inputs,
            order_by: order_by.into(),
            memory_limit: None,
            gpu_memory_limit: None,
            disk_limit: None,
            device: DeviceChoice::Auto,
            devices: DeviceList::One,
            strategy: StrategyChoice::Auto,
            min_rows: None,
            temp_dir: None,
            no_gpusort: false,
        }
    }

    /// `--memory-limit` in bytes; `None` for no limit (not given, or 0).
    pub fn memory_limit_bytes(&self) -> Option<usize> {
        self.memory_limit.map(|b| b.0).filter(|&b| b > 0)
    }

    /// Whether the sort reads its files on the GPU (`gpusort.device_scan`): it may use a GPU, runs
    /// without `--memory-limit` (its sorted runs, where `--gpu-memory-limit` cuts the files into
    /// runs, are all in memory before they are merged) and `GPUSORT_DEVICE_SCAN` is not `0`.
    /// Where the device cannot, the sort reads them on the host as ever.
    pub fn device_scan(&self) -> bool {
        let unlimited = self.memory_limit_bytes().is_none();
        let gpu = self.device != DeviceChoice::Cpu && self.strategy != StrategyChoice::Cpu && !self.no_gpusort;
        unlimited && gpu && std::env::var("GPUSORT_DEVICE_SCAN").map_or(true, |v| v != "0")
    }

    /// The `gpusort.*` options these arguments ask for.
    pub fn gpusort_config(&self) -> GpuSortConfig {
        let mut config = GpuSortConfig::default();
        config.enabled = !self.no_gpusort;
        config.device = self.device;
        config.devices = self.devices.clone();
        config.strategy = self.strategy;
        // The writer encodes each batch and drops it: views into the sorted columns serve it
        // as well as compacted copies, which cost 6.6 CPU-seconds of TPC-H lineitem SF10
        // (0.4 s on 16 cores) and held the strings twice.
        config.compact_output_views = false;
        // The host's copy of what went to the GPU is released while the input is read
        // (`GPUSORT_RELEASE_INPUT=0` keeps it, for an A/B) where the sort runs without limits:
        // under --memory-limit or --gpu-memory-limit (runs, spills) it is not yet tested.
        let unlimited = self.memory_limit_bytes().is_none() && self.gpu_memory_limit.is_none_or(|l| l.0 == 0);
        config.release_uploaded_input = unlimited && std::env::var("GPUSORT_RELEASE_INPUT").map_or(true, |v| v != "0");
        config.device_scan = self.device_scan();
        // The external sort's merge steps send only their key columns to the GPU and gather the
        // rows on the host (`gpusort.merge_keys_only`) with `GPUSORT_MERGE_KEYS_ONLY=1`, for an A/B.
        config.merge_keys_only = std::env::var("GPUSORT_MERGE_KEYS_ONLY").is_ok_and(|v| v == "1");
        // Runs and merge steps come down in ranges of `GPUSORT_RUN_RANGE_ROWS` rows
        // (`gpusort.run_range_rows`; 0: whole), for an A/B.
        if let Some(rows) = std::env::var("GPUSORT_RUN_RANGE_ROWS")
            .ok()
            .and_then(|v| v.parse().ok())
        {
            config.run_range_rows = rows;
        }
        if let Some(limit) = self.gpu_memory_limit {
            config.gpu_memory_limit = limit;
        }
        if let Some(rows) = self.min_rows {
            config.min_rows = rows;
        }
        config
    }
}

/// A size as every size in gpusort is written ([`gpusort::size`]).
fn parse_size(s: &str) -> std::result::Result<ByteSize, String> {
    ByteSize::parse(s).ok_or_else(|| gpusort::size::size_error(s))
}

fn parse_device(s: &str) -> std::result::Result<DeviceChoice, String> {
    s.parse::<DeviceChoice>()
        .map_err(|_| format!("expected auto, cpu or a GPU number, got '{s}'"))
}

fn parse_devices(s: &str) -> std::result::Result<DeviceList, String> {
    s.parse::<DeviceList>()
        .map_err(|_| format!("expected one, all or GPU numbers like 0,1, got '{s}'"))
}

fn parse_strategy(s: &str) -> std::result::Result<StrategyChoice, String> {
    s.parse::<StrategyChoice>()
        .map_err(|_| format!("expected auto, {} or cpu, got '{s}'", gpusort::Strategy::names()))
}

/// `--strategy`'s help, its list of strategies from [`gpusort::Strategy::ALL`].
fn strategy_help() -> String {
    format!(
        "The sort strategy: auto (the rule calibrated on the H100), {}, or cpu",
        gpusort::Strategy::names()
    )
}

/// A planned sort: the session, the checked inputs, the ORDER BY and the physical plan.
pub struct SortPlan {
    /// The session the plan runs in.
    pub ctx: SessionContext,
    /// The inputs.
    pub inputs: Inputs,
    /// The ORDER BY list.
    pub order_by: OrderBy,
    /// `scan -> sort`, one output partition.
    pub plan: Arc<dyn ExecutionPlan>,
    /// `--memory-limit` as given, for messages (`None`: no limit).
    pub memory_limit: Option<String>,
    /// Where spill files go: a directory of the sort's own in `--temp-dir` (or the system's
    /// temporary directory), removed with its files when the plan is dropped or on a signal.
    /// `None` for a plan that is only shown.
    pub spill_dir: Option<SpillDir>,
}

/// How [`SortPlan::with_options`] sets up the session.
#[derive(Debug, Clone, Copy, Default)]
pub struct SessionOptions {
    /// Make a spill directory of the sort's own ([`SortPlan::spill_dir`]).
    pub spill_dir: bool,
    /// The memory pool's size, when not all of `--memory-limit` (the writer keeps a share).
    pub pool_bytes: Option<usize>,
}

impl SortPlan {
    /// Checks the inputs, parses the ORDER BY list, and plans the sort (to be shown: no spill
    /// directory is made).
    pub async fn try_new(args: &PlanArgs) -> Result<Self> {
        Self::with_options(args, SessionOptions::default()).await
    }

    /// [`Self::try_new`] with a session set up as `options` say.
    pub async fn with_options(args: &PlanArgs, options: SessionOptions) -> Result<Self> {
        let inputs = Inputs::try_new(&args.inputs)?;
        let order_by = OrderBy::try_new(&args.order_by, &inputs.schema)?;
        let spill_dir = if options.spill_dir {
            Some(SpillDir::create(&spill_base(args)?)?)
        } else {
            None
        };
        let pool = options.pool_bytes.or(args.memory_limit_bytes());
        let ctx = session(args, spill_dir.as_ref().map(SpillDir::datafusion_root).as_deref(), pool)?;
        let memory_limit = args.memory_limit_bytes().map(|b| format_size(b as u64));
        let df_err = |e| CliError::from_datafusion(e, memory_limit.as_deref());

        let urls = inputs
            .files
            .iter()
            .map(|f| file_url(&f.path))
            .collect::<Result<Vec<_>>>()?;
        // The files were listed and checked already: no extension filter.
        let options = ParquetReadOptions::default()
            .file_extension("")
            .to_listing_options(&ctx.copied_config(), ctx.copied_table_options());
        let mut config = ListingTableConfig::new_with_multi_paths(urls)
            .with_listing_options(options)
            .infer_schema(&ctx.state())
            .await
            .map_err(df_err)?;
        let narrow = NarrowDecimals::try_new(&inputs, |path| Ok(file_url(path)?.prefix().as_ref().to_string()))?;
        if let Some(schema) = config.file_schema.as_ref().filter(|_| !narrow.is_empty()) {
            let schema = narrow.table_schema(schema);
            config = config.with_schema(schema);
        }
        let table = ListingTable::try_new(config).map_err(df_err)?;
        let plan = ctx
            .read_table(Arc::new(table))
            .and_then(|df| df.sort(order_by.sort_exprs()))
            .map_err(df_err)?
            .create_physical_plan()
            .await
            .map_err(df_err)?;
        let plan = narrow.with_file_schemas(plan)?;
        Ok(Self {
            ctx,
            inputs,
            order_by,
            plan,
            memory_limit,
            spill_dir,
        })
    }
}

/// Where the spill directory goes: `--temp-dir`, else the system's temporary directory.
fn spill_base(args: &PlanArgs) -> Result<PathBuf> {
    let base = args.temp_dir.clone().unwrap_or_else(std::env::temp_dir);
    if !base.is_dir() {
        let what = if args.temp_dir.is_some() {
            "--temp-dir "
        } else {
            "the temporary directory "
        };
        return Err(CliError::Usage(format!("{what}{}: not a directory", base.display())));
    }
    Ok(base)
}

/// The session: DataFusion's defaults (and its `DATAFUSION_*` environment variables, e.g.
/// `DATAFUSION_EXECUTION_BATCH_SIZE`), gpusort's rule and options, a memory pool of `pool`
/// bytes (DataFusion's greedy pool, which names the largest consumers when it runs out), spill
/// files in `spill_dir` (else `--temp-dir`, else the system's temporary directory) up to
/// `--disk-limit`.
pub fn session(args: &PlanArgs, spill_dir: Option<&Path>, pool: Option<usize>) -> Result<SessionContext> {
    let config = SessionConfig::from_env()
        .map_err(|e| {
            CliError::Usage(format!(
                "a DATAFUSION_* environment variable: {}",
                one_line(&e.to_string())
            ))
        })?
        .with_option_extension(args.gpusort_config());
    let mut runtime = RuntimeEnvBuilder::new();
    if let Some(limit) = pool {
        runtime = runtime.with_memory_limit(limit, 1.0);
    }
    match (spill_dir, &args.temp_dir) {
        (Some(dir), _) => runtime = runtime.with_temp_file_path(dir),
        (None, Some(dir)) if !dir.is_dir() => {
            return Err(CliError::Usage(format!(
                "--temp-dir {}: not a directory",
                dir.display()
            )));
        }
        (None, Some(dir)) => runtime = runtime.with_temp_file_path(dir),
        (None, None) => {}
    }
    // DataFusion's default stops spilling at 100 GB; the tool's is the disk's free space.
    let disk_limit = args.disk_limit.map_or(0, |b| b.0 as u64);
    runtime = runtime.with_max_temp_directory_size(if disk_limit == 0 { u64::MAX } else { disk_limit });
    let runtime = runtime.build_arc().map_err(|e| CliError::from_datafusion(e, None))?;
    let state = SessionStateBuilder::new()
        .with_default_features()
        .with_config(config)
        .with_runtime_env(runtime)
        .with_gpusort()
        .build();
    Ok(SessionContext::new_with_state(state))
}

/// A local file as a listing URL (made from the canonical path, so that characters such as
/// `*` or `[` in a file name are not read as a glob, and `..` is gone).
fn file_url(path: &Path) -> Result<ListingTableUrl> {
    let absolute = path
        .canonicalize()
        .map_err(|e| CliError::io(format!("resolving {}", path.display()), e))?;
    let url = url::Url::from_file_path(&absolute)
        .map_err(|_| CliError::Usage(format!("{}: cannot be made a file URL", absolute.display())))?;
    ListingTableUrl::try_new(url, None).map_err(|e| CliError::from_datafusion(e, None))
}

/// `bytes` for people: `512 B`, `4.1 MiB`, `1.02 GiB`.
pub fn format_size(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    match unit {
        0 => format!("{bytes} B"),
        _ if value < 10.0 => format!("{value:.2} {}", UNITS[unit]),
        _ => format!("{value:.1} {}", UNITS[unit]),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_read_well() {
        assert_eq!(format_size(512), "512 B");
        assert_eq!(format_size(4_288_168), "4.09 MiB");
        assert_eq!(format_size(20 << 30), "20.0 GiB");
    }

    #[test]
    fn flags_become_gpusort_options() {
        let mut args = PlanArgs::new(vec!["x".into()], "a");
        args.device = "cpu".parse().unwrap();
        args.gpu_memory_limit = Some("2g".parse().unwrap());
        args.min_rows = Some(5);
        let c = args.gpusort_config();
        assert_eq!(
            (c.device, c.gpu_memory_limit.0, c.min_rows, c.enabled),
            (DeviceChoice::Cpu, 2 << 30, 5, true)
        );
        args.no_gpusort = true;
        assert!(!args.gpusort_config().enabled);
        assert!(parse_device("gpu").unwrap_err().contains("a GPU number"));
        args.devices = parse_devices("all").unwrap();
        assert_eq!(args.gpusort_config().devices, DeviceList::All);
        assert!(parse_devices("0,zero").unwrap_err().contains("GPU numbers"));
        assert!(parse_size("lots").unwrap_err().contains("8g"));
        let err = parse_strategy("quick").unwrap_err();
        for s in gpusort::Strategy::ALL {
            assert!(
                err.contains(&s.to_string()) && strategy_help().contains(&s.to_string()),
                "{err}"
            );
        }
        assert_eq!(parse_size("none").unwrap(), ByteSize(0));
    }

    #[test]
    fn a_spill_directory_removed_by_a_signal_is_not_made_again() {
        let base = tempfile::tempdir().unwrap();
        let args = PlanArgs::new(vec!["x".into()], "a");
        // The session's disk manager makes its directory in the spill directory's child.
        let spill = SpillDir::create(base.path()).unwrap();
        session(&args, Some(&spill.datafusion_root()), None).unwrap();
        assert!(spill.datafusion_root().is_dir());
        // A signal removes the spill directory before the session is made: making it fails and
        // leaves nothing in the base (given the spill directory itself, DataFusion made it again).
        let spill = SpillDir::create(base.path()).unwrap();
        let root = spill.datafusion_root();
        std::fs::remove_dir_all(spill.path()).unwrap();
        assert!(session(&args, Some(&root), None).is_err());
        drop(spill);
        let left: Vec<_> = std::fs::read_dir(base.path())
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect();
        assert_eq!(left.len(), 1, "only the first spill directory: {left:?}");
    }
}
