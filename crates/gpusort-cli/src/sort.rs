//! `gpusort sort`: plan, stream the sorted batches into the writer, rename the finished file
//! into place. The output is written to a hidden temporary file in the output's directory,
//! which is removed on any error (and on Ctrl-C, see [`interrupt`](crate::interrupt)), so a
//! failed sort leaves nothing behind.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use datafusion::physical_plan::display::DisplayableExecutionPlan;
use datafusion::physical_plan::execute_stream;
use futures::StreamExt;
use tempfile::NamedTempFile;

use crate::error::{CliError, Result};
use crate::interrupt;
use crate::plan::{PlanArgs, SortPlan};
use crate::progress::{Monitor, ProgressMode};
use crate::report::{PhaseTimes, PlanMetrics, SortReport};
use crate::timeline;
use crate::writer::{Codec, DEFAULT_ROW_GROUP_SIZE, ORDER_BY_METADATA_KEY, SortedParquetWriter, WriteOptions};

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

    /// Compression of the output: uncompressed, snappy or zstd(LEVEL)
    #[arg(long, value_name = "CODEC", default_value = "zstd(3)")]
    pub compression: Codec,

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
    let (temp, _cleanup) = interrupt::create_removed_on_interrupt(|| create_temp_file(output, args.force))?;

    let planned = SortPlan::try_new(&args.plan).await?;
    let memory_limit = planned.memory_limit.clone();
    let df_err = |e| CliError::from_datafusion(e, memory_limit.as_deref());
    let write_err = |e: parquet::errors::ParquetError| CliError::Write {
        path: output.clone(),
        cause: e.to_string(),
    };
    // The inputs' schema, less a sort order recorded by an earlier gpusort (the writer records
    // this one).
    let mut schema = planned.inputs.schema.as_ref().clone();
    schema.metadata.remove(ORDER_BY_METADATA_KEY);
    let schema = Arc::new(schema);
    check_plan_columns(&planned)?;
    let file = temp
        .reopen()
        .map_err(|e| CliError::io(format!("opening {}", temp.path().display()), e))?;
    let mut writer =
        SortedParquetWriter::try_new(file, schema, &planned.order_by, &args.write_options()).map_err(write_err)?;

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
    let mut stream = execute_stream(Arc::clone(&planned.plan), planned.ctx.task_ctx()).map_err(df_err)?;
    let mut first_output = None;
    while let Some(batch) = stream.next().await {
        let batch = batch.map_err(df_err)?;
        if first_output.is_none() {
            first_output = Some(Instant::now());
            timeline::mark("sort: first sorted batch");
            monitor.writing();
        }
        writer.write(batch).await.map_err(write_err)?;
    }
    drop(stream);
    timeline::mark("sort: last sorted batch handed to the writer");
    let stats = writer.finish().await.map_err(write_err)?;
    timeline::mark("sort: output written");
    let seen_read_done = monitor.finish();

    interrupt::persist(temp, output, args.force)?;
    let end = Instant::now();

    let metrics = PlanMetrics::collect(&planned.plan);
    if args.timeline {
        let plan = DisplayableExecutionPlan::with_metrics(planned.plan.as_ref()).indent(true);
        eprintln!("plan with metrics:\n{plan}");
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
        codec: args.compression.to_string(),
        sorting_columns: stats.sorting_columns,
        order_by: planned.order_by.to_sql(),
        times,
        metrics,
        memory_limit,
    })
}

/// The hidden temporary file the output is written to, in the output's directory (so that the
/// final rename stays on one file system). Fails when the output exists (unless `force`) or
/// its directory cannot be written.
fn create_temp_file(output: &Path, force: bool) -> Result<NamedTempFile> {
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
