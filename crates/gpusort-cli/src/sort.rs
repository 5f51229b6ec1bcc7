//! `gpusort sort`: plan, stream the sorted batches into the writer, rename the finished file
//! into place. The output is written to a hidden temporary file in the output's directory,
//! which is removed on any error (and on Ctrl-C, see [`interrupt`](crate::interrupt)), so a
//! failed sort leaves nothing behind.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use arrow::error::ArrowError;
use datafusion::error::DataFusionError;
use datafusion::physical_plan::display::DisplayableExecutionPlan;
use datafusion::physical_plan::execute_stream;
use datafusion_gpusort::{DeviceChoice, StrategyChoice};
use futures::StreamExt;
use tempfile::NamedTempFile;

use crate::error::{self, CliError, Result};
use crate::interrupt;
use crate::plan::{PlanArgs, SessionOptions, SortPlan, format_size};
use crate::progress::{Monitor, ProgressMode};
use crate::report::{PhaseTimes, PlanMetrics, SortReport};
use crate::timeline;
use gpusort_parquet::gpu_pages::{self, CompressOn};
use gpusort_parquet::pages::PageCompressor;
use gpusort_parquet::writer::{
    Codec, ColumnEncoder, DEFAULT_ROW_GROUP_SIZE, ORDER_BY_METADATA_KEY, SortedParquetWriter, WriteOptions,
    writer_share,
};

/// `gpusort sort`'s arguments.
#[derive(Debug, Clone, clap::Args)]
pub struct SortArgs {
    #[command(flatten)]
    pub plan: PlanArgs,

    /// The output Parquet file
    #[arg(short, long, value_name = "OUTPUT")]
    pub output: PathBuf,

    /// Rows per row group of the output
    #[arg(long, value_name = "ROWS", default_value_t = DEFAULT_ROW_GROUP_SIZE, value_parser = parse_row_group_size)]
    pub row_group_size: usize,

    /// Compression of the output: uncompressed (or none), snappy, lz4_raw, lz4, gzip(0..9),
    /// brotli(0..11) or zstd(1..22); a codec with levels alone takes its default level
    #[arg(long, value_name = "CODEC", default_value = "zstd(3)")]
    pub compression: Codec,

    /// Where zstd pages are compressed: auto (the GPU through nvCOMP when the sort may use a
    /// GPU and nvCOMP loads, from GPUSORT_NVCOMP or libnvcomp.so.6; else the CPU), gpu (or an
    /// error), cpu. nvCOMP's zstd has one level of its own: --compression's level applies on
    /// the CPU
    #[arg(long, value_name = "WHERE", default_value = "auto")]
    pub compress_on: CompressOn,

    /// What encodes the output's columns: gpusort (its own encoder for integer, date, decimal,
    /// string and binary columns, the Parquet crate's for the rest; with zstd or uncompressed
    /// output) or parquet (the Parquet crate's for every column)
    #[arg(long, value_name = "ENCODER", default_value_t = ColumnEncoder::Gpusort)]
    pub column_encoder: ColumnEncoder,

    /// Replace OUTPUT if it exists
    #[arg(short, long)]
    pub force: bool,

    /// Print nothing but errors
    #[arg(short, long)]
    pub quiet: bool,

    /// Print a timeline of the sort's steps to stderr as they happen, and the plan with every
    /// operator's metrics at the end
    #[arg(long)]
    pub timeline: bool,
}

impl SortArgs {
    /// Arguments for sorting `plan`'s inputs into `output`, other options at their defaults.
    pub fn new(plan: PlanArgs, output: impl Into<PathBuf>) -> Self {
        Self {
            plan,
            output: output.into(),
            row_group_size: DEFAULT_ROW_GROUP_SIZE,
            compression: Codec::default(),
            compress_on: CompressOn::default(),
            column_encoder: ColumnEncoder::default(),
            force: false,
            quiet: false,
            timeline: false,
        }
    }

    /// The writer's options.
    pub fn write_options(&self) -> WriteOptions {
        WriteOptions {
            row_group_size: self.row_group_size,
            codec: self.compression,
            memory_budget: self.plan.memory_limit_bytes().map(writer_share),
            page_compressor: None,
            column_encoder: self.column_encoder,
        }
    }
}

fn parse_row_group_size(s: &str) -> std::result::Result<usize, String> {
    match s.parse::<usize>() {
        Ok(n) if n > 0 => Ok(n),
        _ => Err(format!("expected a number of rows >= 1, got '{s}'")),
    }
}

/// Sorts the inputs into the output; see the module doc. Progress goes to stderr as `mode`
/// says; the summary is the caller's to print.
pub async fn sort(args: &SortArgs, mode: ProgressMode) -> Result<SortReport> {
    let start = Instant::now();
    if args.timeline {
        timeline::enable();
    }
    let output = &args.output;
    check_device(&args.plan)?;
    let (temp, _cleanup) = interrupt::create_removed_on_interrupt(|| create_temp_file(output, args.force))?;

    let pages = Pages::start(args)?;
    // --memory-limit covers the sort and the writer: the writer keeps its share, DataFusion's
    // pool has the rest.
    let mut write_options = args.write_options();
    let session = SessionOptions {
        spill_dir: true,
        pool_bytes: write_options.memory_budget.map(|writer| {
            let limit = args.plan.memory_limit_bytes().unwrap_or(0);
            limit.saturating_sub(writer).max(1)
        }),
    };
    let planned = SortPlan::with_options(&args.plan, session).await?;
    write_options.page_compressor = pages.compressor();
    let memory_limit = planned.memory_limit.clone();
    let mut writer = open_writer(&temp, &planned, &write_options, output)?;

    let total_rows = planned.inputs.rows();
    let run_start = Instant::now();
    let run_start_ns = unix_ns(SystemTime::now());
    let monitor = Monitor::start(
        Arc::clone(&planned.plan),
        writer.progress(),
        total_rows,
        run_start,
        mode,
    );
    timeline::mark("sort: planned");
    let first_output = write_sorted(&planned, args, &mut writer, &monitor).await?;
    let stats = writer.finish().await.map_err(|e| write_error(e, output))?;
    timeline::mark("sort: output written");
    let seen_read_done = monitor.finish();

    interrupt::persist(temp, output, args.force)?;
    let end = Instant::now();

    let metrics = PlanMetrics::collect(&planned.plan);
    if args.timeline {
        let plan = DisplayableExecutionPlan::with_metrics(planned.plan.as_ref()).indent(true);
        crate::progress::to_stderr(format_args!("plan with metrics:\n{plan}\n"));
    }
    let first_output = first_output.unwrap_or(end);
    // The scans' own end time, else when the monitor saw the last row read; never after the
    // first sorted row.
    let read_end = metrics
        .read_end_ns
        .map(|ns| run_start + Duration::from_nanos(ns.saturating_sub(run_start_ns)))
        .or(seen_read_done)
        .unwrap_or(first_output)
        .min(first_output);
    let times = PhaseTimes {
        planning: run_start - start,
        reading: read_end - run_start,
        sorting: first_output - read_end,
        writing: end - first_output,
    };
    let output_bytes = std::fs::metadata(output)
        .map_err(|e| CliError::io(format!("reading {}", output.display()), e))?
        .len();
    Ok(SortReport {
        rows: stats.rows,
        input_files: planned.inputs.files.len(),
        input_bytes: planned.inputs.bytes(),
        output: output.clone(),
        output_bytes,
        row_groups: stats.row_groups,
        codec: pages.label(),
        sorting_columns: stats.sorting_columns,
        order_by: planned.order_by.to_sql(),
        times,
        metrics,
        memory_limit,
        writer_memory: write_options.memory_budget,
    })
}

/// The writer of the sorted rows into `temp`: the inputs' schema, less a sort order recorded by
/// an earlier gpusort (the writer records this one).
fn open_writer(
    temp: &NamedTempFile,
    planned: &SortPlan,
    write_options: &WriteOptions,
    output: &Path,
) -> Result<SortedParquetWriter> {
    let mut schema = planned.inputs.schema.as_ref().clone();
    schema.metadata.remove(ORDER_BY_METADATA_KEY);
    check_plan_columns(planned)?;
    let file = temp
        .reopen()
        .map_err(|e| CliError::io(format!("opening {}", temp.path().display()), e))?;
    SortedParquetWriter::try_new(file, Arc::new(schema), planned.order_by.keys(), write_options)
        .map_err(|e| write_error(e, output))
}

/// Runs the plan and hands its sorted batches to `writer`; returns when the first one came.
async fn write_sorted(
    planned: &SortPlan,
    args: &SortArgs,
    writer: &mut SortedParquetWriter,
    monitor: &Monitor,
) -> Result<Option<Instant>> {
    let run_err = |e| run_error(e, planned, args);
    let mut stream = execute_stream(Arc::clone(&planned.plan), planned.ctx.task_ctx()).map_err(run_err)?;
    let mut first_output = None;
    while let Some(batch) = stream.next().await {
        let batch = batch.map_err(run_err)?;
        if first_output.is_none() {
            first_output = Some(Instant::now());
            timeline::mark("sort: first sorted batch");
            monitor.writing();
        }
        writer.write(batch).await.map_err(|e| write_error(e, &args.output))?;
    }
    drop(stream);
    timeline::mark("sort: last sorted batch handed to the writer");
    Ok(first_output)
}

/// Where the pages are compressed: with `--compress-on auto`, zstd and gpusort's encoder, chosen
/// while the sort starts ([`gpu_pages::DeferredZstd`]); else now ([`gpu_pages::choose`]), so
/// that `--compress-on gpu` without nvCOMP fails before anything runs.
enum Pages {
    Deferred(Arc<gpu_pages::DeferredZstd>),
    Now(gpu_pages::PagePath),
}

impl Pages {
    fn start(args: &SortArgs) -> Result<Self> {
        // The GPU the sort may use compresses its pages.
        let device = args
            .plan
            .gpusort_config()
            .device
            .ordinal()
            .ok_or_else(|| "--device cpu".to_string());
        if args.compress_on == CompressOn::Auto
            && args.column_encoder == ColumnEncoder::Gpusort
            && let Some(deferred) = gpu_pages::DeferredZstd::start(args.compression, device.clone())
        {
            return Ok(Self::Deferred(Arc::new(deferred)));
        }
        let path = gpu_pages::choose(args.compress_on, args.compression, device).map_err(CliError::Usage)?;
        if let Some(why) = &path.why_cpu {
            timeline::mark(format_args!("writer: {} ({why})", path.label));
        }
        Ok(Self::Now(path))
    }

    /// The writer's page compressor (`None`: the writer's own, see `WriteOptions`).
    fn compressor(&self) -> Option<Arc<dyn PageCompressor>> {
        match self {
            Self::Deferred(d) => Some(Arc::clone(d) as Arc<dyn PageCompressor>),
            Self::Now(path) => path.compressor.clone(),
        }
    }

    /// The codec and where it ran, for the summary (with the GPU's share of the bytes).
    fn label(&self) -> String {
        let label = match self {
            Self::Deferred(d) => d.name(),
            Self::Now(path) => path.label.clone(),
        };
        match self.compressor().and_then(|c| c.report()) {
            Some(report) => format!("{label}: {report}"),
            None => label,
        }
    }
}

/// `--device N` names a GPU that must be usable: checked before anything runs (a small input
/// sorts on the CPU and would not notice).
fn check_device(args: &PlanArgs) -> Result<()> {
    let config = args.gpusort_config();
    let DeviceChoice::Gpu(ordinal) = config.device else {
        return Ok(());
    };
    if !config.enabled || config.strategy == StrategyChoice::Cpu {
        return Ok(());
    }
    match gpusort_cuda::device::probe(ordinal) {
        Ok(_) => Ok(()),
        Err(why) => Err(CliError::Usage(format!(
            "--device {ordinal}: GPU {ordinal} is not usable: {why}"
        ))),
    }
}

/// An error of the running plan, with its culprit: a full spill directory, a damaged input
/// file (found by reading the inputs again, so it names the file, row group and column), or
/// else DataFusion's cause.
fn run_error(e: DataFusionError, planned: &SortPlan, args: &SortArgs) -> CliError {
    let text = e.to_string();
    if error::says_disk_full(&text) {
        let dir = planned
            .spill_dir
            .as_ref()
            .map(|d| d.path().to_path_buf())
            .or_else(|| args.plan.temp_dir.clone())
            .unwrap_or_else(std::env::temp_dir);
        let cause = match args.plan.disk_limit {
            Some(limit) if limit.0 > 0 && text.contains("exceeded the allowable limit") => {
                format!("the spill files reached --disk-limit {}", format_size(limit.0 as u64))
            }
            _ => error::one_line(&error::strip_prefixes(&e.find_root().to_string())),
        };
        return CliError::SpillFull { dir, cause };
    }
    if reads_input(&e)
        && let Some(damage) = planned.inputs.find_damage()
    {
        return damage;
    }
    CliError::from_datafusion(e, planned.memory_limit.as_deref())
}

/// Whether `e` could come from reading an input: a Parquet, Arrow or I/O error.
fn reads_input(e: &DataFusionError) -> bool {
    match e.find_root() {
        DataFusionError::ParquetError(_) | DataFusionError::IoError(_) | DataFusionError::ObjectStore(_) => true,
        DataFusionError::ArrowError(inner, _) => matches!(
            inner.as_ref(),
            ArrowError::ParquetError(_) | ArrowError::ExternalError(_) | ArrowError::IoError(..)
        ),
        DataFusionError::External(inner) => {
            inner.downcast_ref::<parquet::errors::ParquetError>().is_some()
                || inner.downcast_ref::<ArrowError>().is_some()
                || inner.downcast_ref::<std::io::Error>().is_some()
        }
        _ => false,
    }
}

/// A failure of the writer: a full disk names the output's directory.
fn write_error(e: parquet::errors::ParquetError, output: &Path) -> CliError {
    CliError::Write {
        path: output.to_path_buf(),
        cause: error::one_line(&error::strip_prefixes(&e.to_string())),
    }
}

/// The hidden temporary file the output is written to, in the output's directory (so that the
/// final rename stays on one file system). Fails when the output exists (unless `force`) or
/// its directory cannot be written.
fn create_temp_file(output: &Path, force: bool) -> Result<NamedTempFile> {
    let text = output.as_os_str().to_string_lossy();
    if text.is_empty() || text.ends_with(std::path::MAIN_SEPARATOR) || output.file_name().is_none() {
        return Err(CliError::Usage(format!(
            "-o {text:?}: names a directory; name the output file, e.g. {}",
            Path::new(&*text).join("sorted.parquet").display()
        )));
    }
    if output.is_dir() {
        return Err(CliError::Usage(format!(
            "{}: is a directory; name the output file",
            output.display()
        )));
    }
    if output.exists() && !force {
        return Err(CliError::OutputExists(output.to_path_buf()));
    }
    let dir = match output.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let unwritable = |cause: String| CliError::OutputDirectory {
        dir: dir.clone(),
        cause,
    };
    if !dir.exists() {
        return Err(unwritable("no such directory".into()));
    }
    if !dir.is_dir() {
        return Err(unwritable("not a directory".into()));
    }
    let name = output
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let prefix = format!(".{name}.");
    let mut builder = tempfile::Builder::new();
    builder.prefix(&prefix).suffix(".gpusort-tmp");
    // The permissions of a file made by `File::create` (0666 less the umask), not a temporary
    // file's 0600.
    #[cfg(unix)]
    builder.permissions(std::os::unix::fs::PermissionsExt::from_mode(0o666));
    builder.tempfile_in(&dir).map_err(|e| unwritable(e.kind().to_string()))
}

/// The plan's columns must be the file schema's, in order (the writer takes them by
/// position).
fn check_plan_columns(planned: &SortPlan) -> Result<()> {
    let plan_schema = planned.plan.schema();
    let names = |s: &arrow::datatypes::Schema| s.fields().iter().map(|f| f.name().clone()).collect::<Vec<_>>();
    let (got, want) = (names(&plan_schema), names(&planned.inputs.schema));
    if got != want {
        return Err(CliError::Engine(format!(
            "the plan's columns [{}] are not the inputs' [{}]",
            got.join(", "),
            want.join(", ")
        )));
    }
    Ok(())
}

fn unix_ns(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(0)
}
