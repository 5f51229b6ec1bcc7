//! The `gpusort` command-line tool: sorts Parquet files by an SQL ORDER BY list, on the GPU.
//! This crate's one job is arguments and progress; the sort is DataFusion's plan (Parquet
//! scan -> `GpuSortExec` from `datafusion-gpusort`) streamed into a Parquet writer.
//!
//! ```text
//! gpusort sort INPUT... -o OUTPUT --order-by "a DESC NULLS LAST, b"   sort into one file
//! gpusort explain INPUT... --order-by "..."                           the plan it would run
//! gpusort info                                                         the GPU, driver, NVRTC, kernel cache
//! gpusort tune [--budget 2m] [--dry-run]                               tune the kernels for this GPU
//! ```
//!
//! The binary (`src/main.rs`) parses [`Cli`] and calls [`run`]; the tests and the
//! `parquet_sort` benchmark call [`sort::sort`] directly.

pub mod error;
pub mod info;
pub mod inputs;
pub mod interrupt;
pub mod narrow;
pub mod order_by;
pub mod plan;
pub mod progress;
pub mod report;
pub mod sort;
pub mod timeline;
pub mod tune;

use clap::{Parser, Subcommand};

pub use error::{CliError, Result};
pub use plan::{PlanArgs, SortPlan};
pub use progress::ProgressMode;
pub use report::{PhaseTimes, PlanMetrics, SortReport};
pub use sort::SortArgs;
pub use tune::TuneArgs;

/// `gpusort`'s command line.
#[derive(Debug, Parser)]
#[command(
    name = "gpusort",
    version,
    about = "Sort Parquet files by an SQL ORDER BY list, on the GPU",
    after_help = "Examples:\n  \
        gpusort sort data/*.parquet -o sorted.parquet --order-by \"ts DESC NULLS LAST, id\"\n  \
        gpusort sort big.parquet -o out.parquet -k \"customer, amount DESC\" --memory-limit 8g --compression 'zstd(3)'\n  \
        gpusort explain data/ --order-by \"id\"\n  \
        gpusort info\n  \
        gpusort tune --budget 2m"
)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// `gpusort`'s subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Sort Parquet files into one Parquet file
    Sort(SortArgs),
    /// Print the plan that `gpusort sort` would run, and where it would sort
    Explain(PlanArgs),
    /// Show the GPU gpusort would use (or why there is none), the driver and NVRTC versions,
    /// and where compiled kernels are cached
    Info,
    /// Search the kernels' settings that sort fastest on this GPU (within a time budget, every
    /// output checked) and write them as a tuning profile that later sorts on it apply
    Tune(TuneArgs),
}

/// Runs `cli`: output on stdout (`info`, `explain`, `tune`'s table), progress and the summary
/// on stderr (`sort`, `tune`). A closed or full stderr loses the progress and the summary, not the sort; a
/// stdout that cannot be written is a [`CliError::Stdout`].
pub async fn run(cli: Cli) -> Result<()> {
    match cli.command {
        Command::Sort(args) => {
            let mode = ProgressMode::detect(args.quiet);
            let report = sort::sort(&args, mode).await?;
            if mode != ProgressMode::Quiet {
                progress::to_stderr(format_args!("{}", report.summary()));
            }
        }
        Command::Explain(args) => to_stdout(&info::explain(&args).await?)?,
        Command::Info => to_stdout(&info::info())?,
        Command::Tune(args) => to_stdout(&tune::tune(&args)?)?,
    }
    Ok(())
}

/// Writes `text` to stdout and flushes it.
fn to_stdout(text: &str) -> Result<()> {
    use std::io::Write as _;
    let mut out = std::io::stdout().lock();
    out.write_all(text.as_bytes())
        .and_then(|()| out.flush())
        .map_err(CliError::Stdout)
}
