//! Runs DataFusion 55.2's own sort-related sqllogictest (`.slt`) files against a session that a
//! test target configures (e.g. with [`datafusion_gpusort::register`]), using DataFusion's
//! runner library (`datafusion-sqllogictest`) the way its `sqllogictests` binary does: the
//! same engine ([`DataFusion`]), the same label, column validator, normalizer and validator,
//! the same scratch directory, and the same check that a file leaves the session's
//! configuration as it found it.
//!
//! Differences from DataFusion's binary:
//! - `EXPLAIN` records are skipped (not run) and counted: their expected plans name DataFusion's
//!   own operators and print data paths relative to the runner crate's build directory, neither
//!   of which holds for a plan rewritten by our optimizer rule.
//! - Records run one at a time and a failing record does not stop its file; the report counts
//!   run / passed / failed / skipped per file. A panic in a record counts as its failure.
//! - The session is built like `TestContext::try_new_for_test_file` builds it (4 target
//!   partitions, a default `RuntimeEnv`, `with_default_features`), then passed through the
//!   caller's `configure`. TestContext's per-file extras (special tables for `joins.slt`,
//!   `map.slt`, ...) are not registered; none of [`SORT_SLT_FILES`] needs them.
//!
//! Where the files come from (nothing outside the repository and cargo's registry):
//! - the `.slt` files and the crate's `data/` folder: the `datafusion-sqllogictest` crate this
//!   workspace builds against, as cargo unpacked it when it built this test
//!   (`$CARGO_HOME/registry/src/*/datafusion-sqllogictest-<version>`; the env var
//!   `GPUSORT_SLT_CRATE_DIR` overrides it);
//! - the data they read from DataFusion's source tree, arrow-testing and parquet-testing:
//!   `testdata/datafusion-slt/` in this repository (see its README; `GPUSORT_SLT_DATA_DIR`
//!   overrides it, e.g. on a machine where the test binary runs away from its checkout).
//!
//! Both are assembled into a temporary directory laid out like DataFusion's source tree, and the
//! process's working directory is set to `<temp>/datafusion/sqllogictest` while the suite runs
//! (the files read their data through paths relative to it). Suites in one test binary therefore
//! run one at a time, and no other test of that binary should rely on the working directory.
//!
//! A suite whose files or data are missing **fails**, saying what is missing, unless it is
//! named in `GPUSORT_SLT_SKIP` (a comma-separated list of [`SUITE_SORT_FILES`] and
//! [`SUITE_WHOLE`]), which skips it with a line on stderr. Every run ends with a line on
//! stderr, written past the test harness's capture, `sqllogictest: N files, M records ran, K
//! passed, ...`, and a run of fewer records than its suite's minimum fails. `GPUSORT_SLT_FILES=
//! order,topk` runs only the listed files (substring match; the minimum is then one record).

use std::any::Any;
use std::fmt::Write as _;
use std::io::{self, Write as _};
use std::panic::AssertUnwindSafe;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use std::{env, fs};

use datafusion::execution::SessionStateBuilder;
use datafusion::execution::runtime_env::RuntimeEnv;
use datafusion::prelude::{SessionConfig, SessionContext};
use datafusion_sqllogictest::{
    DFColumnType, DFSqlLogicTestError, DataFusion, df_value_validator, setup_scratch_dir, value_normalizer,
};
use futures::FutureExt;
use indicatif::ProgressBar;
use sqllogictest::{Condition, Location, Record, Runner, parse_file, strict_column_validator};

use super::scan_marks;

/// DataFusion 55.2's sort-related `.slt` files (in `test_files/`).
pub const SORT_SLT_FILES: &[&str] = &[
    "order.slt",
    "topk.slt",
    "limit.slt",
    "sort_pushdown.slt",
    "subquery_sort.slt",
    "window.slt",
];

/// The name of the suite of [`SORT_SLT_FILES`] in `GPUSORT_SLT_SKIP`.
pub const SUITE_SORT_FILES: &str = "sort-files";
/// The name of DataFusion's whole suite ([`full_slt_suite`]) in `GPUSORT_SLT_SKIP`.
pub const SUITE_WHOLE: &str = "whole-suite";
/// The env var that names the suites to skip when their files or data are missing.
pub const SKIP_VAR: &str = "GPUSORT_SLT_SKIP";
/// Records [`SORT_SLT_FILES`] must run, all files (DataFusion 55.2's six files run 1,079 besides
/// their `EXPLAIN`s): fewer means files or records went missing.
pub const SORT_FILES_MIN_RECORDS: usize = 1000;

/// The vendored data, relative to this crate's manifest directory (inside the repository).
const DEFAULT_DATA_DIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../testdata/datafusion-slt");
/// The runner directory inside the assembled tree; the `.slt` files' relative paths start here.
const RUNNER_DIR: &str = "datafusion/sqllogictest";
/// Labels the runner matches `onlyif`/`skipif` conditions against: DataFusion's binary adds
/// `Datafusion`, and the runner adds the engine's name.
const LABELS: [&str; 2] = ["Datafusion", "DataFusion"];
/// Failure messages kept per file (DataFusion's binary shows 10 too).
const FAILURES_KEPT: usize = 10;
/// Failure messages longer than this are cut.
const FAILURE_MESSAGE_MAX: usize = 4000;
/// Slowest records kept per file.
const SLOWEST_KEPT: usize = 3;

/// Only one suite at a time may hold the process's working directory.
static SUITE_LOCK: futures::lock::Mutex<()> = futures::lock::Mutex::new(());

/// What one `.slt` file did.
#[derive(Debug, Clone, Default)]
pub struct FileReport {
    /// The file's name, e.g. `order.slt`.
    pub file: String,
    /// `statement` and `query` records run.
    pub run: usize,
    /// Records run that passed.
    pub passed: usize,
    /// Records run that failed (a wrong result, an unexpected error or a panic).
    pub failed: usize,
    /// `EXPLAIN` records, not run.
    pub skipped_explain: usize,
    /// Records an `onlyif`/`skipif` condition excludes for DataFusion, not run.
    pub skipped_condition: usize,
    /// Errors outside the records: the file could not be read or parsed, a control record
    /// failed, or the file left the session's configuration changed. Each fails the suite.
    pub file_errors: Vec<String>,
    /// The line of every failed record.
    pub failed_lines: Vec<u32>,
    /// The first failure messages (`file:line: message`), at most [`FAILURES_KEPT`].
    pub failures: Vec<String>,
    /// The slowest records run (`file:line`), slowest first, at most [`SLOWEST_KEPT`].
    pub slowest: Vec<(Duration, String)>,
    /// Wall time of the file.
    pub elapsed: Duration,
    /// Sorts that read their Parquet files on the GPU (`gpusort.device_scan`), and those that
    /// fell back to reading them on the host ([`super::scan_marks`]).
    pub device_scans: (usize, usize),
}

impl FileReport {
    fn new(file: &str) -> Self {
        Self {
            file: file.to_string(),
            ..Self::default()
        }
    }

    /// Failed records plus file-level errors.
    pub fn problems(&self) -> usize {
        self.failed + self.file_errors.len()
    }

    fn record_time(&mut self, loc: &Location, took: Duration) {
        if self.slowest.len() < SLOWEST_KEPT || self.slowest.last().is_some_and(|(d, _)| *d < took) {
            self.slowest.push((took, format!("{}:{}", loc.file(), loc.line())));
            self.slowest.sort_by_key(|e| std::cmp::Reverse(e.0));
            self.slowest.truncate(SLOWEST_KEPT);
        }
    }

    fn record_failure(&mut self, loc: &Location, message: &str) {
        self.failed += 1;
        self.failed_lines.push(loc.line());
        if self.failures.len() < FAILURES_KEPT {
            let mut message = message.trim_end().to_string();
            if message.len() > FAILURE_MESSAGE_MAX {
                let mut cut = FAILURE_MESSAGE_MAX;
                while !message.is_char_boundary(cut) {
                    cut -= 1;
                }
                message.truncate(cut);
                message.push_str(" [...]");
            }
            self.failures.push(format!("{}:{}: {message}", loc.file(), loc.line()));
        }
    }
}

/// What a whole suite did.
#[derive(Debug, Clone, Default)]
pub struct SuiteReport {
    /// False when the suite was skipped (its files or data are missing and `GPUSORT_SLT_SKIP`
    /// names it): nothing ran.
    pub ran: bool,
    /// Why the suite was skipped.
    pub skipped_reason: Option<String>,
    /// Records the suite must run for [`SuiteReport::assert_all_passed`] to pass.
    pub min_records: usize,
    /// One entry per file, in the order run.
    pub files: Vec<FileReport>,
    /// Wall time of the suite, copying the folder included.
    pub elapsed: Duration,
}

impl SuiteReport {
    fn skipped(reason: String) -> Self {
        Self {
            ran: false,
            skipped_reason: Some(reason),
            ..Self::default()
        }
    }

    /// The one-line summary written to stderr at the end of every run.
    pub fn summary(&self) -> String {
        format!(
            "sqllogictest: {} files, {} records ran, {} passed, {} failed, {} file error(s) \
             ({} EXPLAIN and {} onlyif/skipif records not run) in {:.1}s",
            self.files.len(),
            self.run(),
            self.passed(),
            self.failed(),
            self.files.iter().map(|f| f.file_errors.len()).sum::<usize>(),
            self.skipped_explain(),
            self.skipped_condition(),
            self.elapsed.as_secs_f64()
        )
    }

    /// Records run, all files.
    pub fn run(&self) -> usize {
        self.files.iter().map(|f| f.run).sum()
    }

    /// Records passed, all files.
    pub fn passed(&self) -> usize {
        self.files.iter().map(|f| f.passed).sum()
    }

    /// GPU scans read and fallen back, all files ([`FileReport::device_scans`]).
    pub fn device_scans(&self) -> (usize, usize) {
        (self.files.iter()).fold((0, 0), |(r, f), file| {
            (r + file.device_scans.0, f + file.device_scans.1)
        })
    }

    /// Records failed, all files.
    pub fn failed(&self) -> usize {
        self.files.iter().map(|f| f.failed).sum()
    }

    /// `EXPLAIN` records skipped, all files.
    pub fn skipped_explain(&self) -> usize {
        self.files.iter().map(|f| f.skipped_explain).sum()
    }

    /// Records skipped by `onlyif`/`skipif`, all files.
    pub fn skipped_condition(&self) -> usize {
        self.files.iter().map(|f| f.skipped_condition).sum()
    }

    /// Failed records plus file-level errors, all files.
    pub fn problems(&self) -> usize {
        self.files.iter().map(FileReport::problems).sum()
    }

    /// The per-file table and the total, as printed by [`run_slt_suite`].
    pub fn table(&self) -> String {
        let mut out = String::new();
        let header = ["file", "run", "passed", "failed", "skipped(EXPLAIN)", "time"];
        let width = self
            .files
            .iter()
            .map(|f| f.file.len())
            .max()
            .unwrap_or(0)
            .max(header[0].len())
            .max(5);
        let line = |out: &mut String, cells: [&str; 6]| {
            let _ = writeln!(
                out,
                "{:<width$} | {:>6} | {:>6} | {:>6} | {:>16} | {:>8}",
                cells[0], cells[1], cells[2], cells[3], cells[4], cells[5]
            );
        };
        line(&mut out, header);
        let _ = writeln!(out, "{}", "-".repeat(width + 58));
        for f in &self.files {
            line(
                &mut out,
                [
                    &f.file,
                    &f.run.to_string(),
                    &f.passed.to_string(),
                    &f.failed.to_string(),
                    &f.skipped_explain.to_string(),
                    &format!("{:.1}s", f.elapsed.as_secs_f64()),
                ],
            );
        }
        let _ = writeln!(out, "{}", "-".repeat(width + 58));
        line(
            &mut out,
            [
                "TOTAL",
                &self.run().to_string(),
                &self.passed().to_string(),
                &self.failed().to_string(),
                &self.skipped_explain().to_string(),
                &format!("{:.1}s", self.elapsed.as_secs_f64()),
            ],
        );
        if self.skipped_condition() > 0 {
            let _ = writeln!(out, "(also skipped by onlyif/skipif: {})", self.skipped_condition());
        }
        let mut slowest: Vec<&(Duration, String)> = self.files.iter().flat_map(|f| &f.slowest).collect();
        slowest.sort_by_key(|e| std::cmp::Reverse(e.0));
        if !slowest.is_empty() {
            let list: Vec<String> = slowest
                .iter()
                .take(SLOWEST_KEPT)
                .map(|(d, at)| format!("{at} ({:.2}s)", d.as_secs_f64()))
                .collect();
            let _ = writeln!(out, "slowest records: {}", list.join(", "));
        }
        out
    }

    /// Every failure message and file-level error kept, grouped by file.
    pub fn failure_details(&self) -> String {
        let mut out = String::new();
        for f in self.files.iter().filter(|f| f.problems() > 0) {
            let _ = writeln!(
                out,
                "==== {}: {} failed record(s), {} file error(s)",
                f.file,
                f.failed,
                f.file_errors.len()
            );
            for e in &f.file_errors {
                let _ = writeln!(out, "[file error] {e}\n");
            }
            for (i, e) in f.failures.iter().enumerate() {
                let _ = writeln!(out, "{}. {e}\n", i + 1);
            }
            if f.failed > f.failures.len() {
                let _ = writeln!(
                    out,
                    "... {} more failed record(s) not shown\n",
                    f.failed - f.failures.len()
                );
            }
        }
        out
    }

    /// Panics unless every record run passed, no file had an error, and at least
    /// [`SuiteReport::min_records`] (and at least one) records ran. A suite skipped through
    /// `GPUSORT_SLT_SKIP` passes (the skip is on stderr).
    pub fn assert_all_passed(&self) {
        if !self.ran {
            return;
        }
        assert!(
            self.run() >= self.min_records.max(1),
            "the sqllogictest suite ran {} records, fewer than the {} it must run:\n{}",
            self.run(),
            self.min_records.max(1),
            self.table()
        );
        let mut unexpected = Vec::new();
        for f in &self.files {
            unexpected.extend(
                f.file_errors
                    .iter()
                    .map(|e| format!("{}: {}", f.file, e.lines().next().unwrap_or(""))),
            );
            unexpected.extend(
                f.failed_lines
                    .iter()
                    .map(|line| format!("test_files/{}:{line}", f.file)),
            );
        }
        if !unexpected.is_empty() {
            panic!(
                "{} sqllogictest failure(s) (details and table in the test's stdout):\n  {}",
                unexpected.len(),
                unexpected.join("\n  ")
            );
        }
    }
}

/// Sets DataFusion config options (including extension ones such as `gpusort.min_rows`, once
/// the extension is registered) on the builder's `SessionConfig`. Panics on an unknown key or
/// bad value. Example: `|b| with_options(register(b), &[("gpusort.min_rows", "0")])`.
pub fn with_options(mut builder: SessionStateBuilder, options: &[(&str, &str)]) -> SessionStateBuilder {
    let config = builder.config().get_or_insert_with(SessionConfig::new);
    for (key, value) in options {
        config
            .options_mut()
            .set(key, value)
            .unwrap_or_else(|e| panic!("cannot set {key} = {value}: {e}"));
    }
    builder
}

/// The data files the [`SORT_SLT_FILES`] read that the `datafusion-sqllogictest` crate does not
/// ship, relative to the data folder (`testdata/datafusion-slt`).
pub const VENDORED_DATA_FILES: &[&str] = &[
    "datafusion/core/tests/data/aggregate_agg_multi_order.csv",
    "datafusion/core/tests/data/null_cases.csv",
    "datafusion/core/tests/data/partitioned_csv/partition-0.csv",
    "datafusion/core/tests/data/partitioned_csv/partition-1.csv",
    "datafusion/core/tests/data/partitioned_csv/partition-2.csv",
    "datafusion/core/tests/data/partitioned_csv/partition-3.csv",
    "datafusion/core/tests/data/timestamps.csv",
    "datafusion/core/tests/data/window_1.csv",
    "datafusion/core/tests/data/window_2.csv",
    "datafusion/core/tests/tpch-csv/orders.csv",
    "testing/data/csv/aggregate_test_100.csv",
    "parquet-testing/data/alltypes_plain.parquet",
];

/// Where a suite's files come from.
#[derive(Debug, Clone)]
pub struct SltSources {
    /// The `datafusion-sqllogictest` crate's folder: its `test_files/` and `data/`.
    pub krate: PathBuf,
    /// The vendored data, laid out like DataFusion's source tree (`testdata/datafusion-slt`).
    pub data: PathBuf,
}

impl SltSources {
    /// Finds the crate and the data, or says what is missing and where it was looked for.
    pub fn find() -> Result<Self, String> {
        let data = match env::var_os("GPUSORT_SLT_DATA_DIR") {
            Some(dir) => PathBuf::from(dir),
            None => PathBuf::from(DEFAULT_DATA_DIR),
        };
        let missing: Vec<&str> = VENDORED_DATA_FILES
            .iter()
            .copied()
            .filter(|f| !data.join(f).is_file())
            .collect();
        if !missing.is_empty() {
            return Err(format!(
                "the data folder {} lacks {} of the {} data files the .slt files read ({}, ...)",
                data.display(),
                missing.len(),
                VENDORED_DATA_FILES.len(),
                missing[0]
            ));
        }
        let krate = sqllogictest_crate_dir()?;
        if !krate.join("test_files").is_dir() {
            return Err(format!("{} has no test_files folder", krate.display()));
        }
        Ok(Self { krate, data })
    }

    /// A temporary tree laid out like DataFusion's source tree: the data at its root, the crate's
    /// `test_files/` and `data/` in `datafusion/sqllogictest/`.
    pub fn assemble(&self) -> Result<tempfile::TempDir, String> {
        let temp = tempfile::Builder::new()
            .prefix("gpusort-slt-")
            .tempdir()
            .map_err(|e| format!("cannot create a temporary directory: {e}"))?;
        let runner = temp.path().join(RUNNER_DIR);
        let copy = |from: &Path, to: &Path| {
            copy_dir(from, to).map_err(|e| format!("cannot copy {} to {}: {e}", from.display(), to.display()))
        };
        copy(&self.data, temp.path())?;
        copy(&self.krate.join("test_files"), &runner.join("test_files"))?;
        let data = self.krate.join("data");
        if data.is_dir() {
            copy(&data, &runner.join("data"))?;
        }
        Ok(temp)
    }
}

/// Called when `suite`'s files or data are missing: returns (after a line on stderr) when
/// `GPUSORT_SLT_SKIP` names the suite, else panics with `reason` and what to do.
pub fn missing(suite: &str, reason: &str) {
    let skipped = env::var(SKIP_VAR)
        .unwrap_or_default()
        .split(',')
        .any(|name| name.trim() == suite);
    if skipped {
        to_stderr(&format!("sqllogictest: suite {suite} SKIPPED ({SKIP_VAR}): {reason}"));
        return;
    }
    panic!(
        "sqllogictest suite {suite} cannot run: {reason}. The .slt files come from the \
         datafusion-sqllogictest crate in cargo's registry (GPUSORT_SLT_CRATE_DIR overrides it), \
         their data from testdata/datafusion-slt (GPUSORT_SLT_DATA_DIR overrides it). \
         {SKIP_VAR}={suite} skips this suite instead of failing."
    );
}

/// Writes a line to the process's stderr past the test harness's capture (which takes only what
/// `print!`/`eprint!` write), so that it shows without `--nocapture`.
fn to_stderr(line: &str) {
    let _ = writeln!(io::stderr().lock(), "{line}");
}

/// Runs `files` (names in `test_files/`, with or without `.slt`) with a session built like
/// DataFusion's sqllogictest runner builds one and then passed through `configure`. Prints a
/// per-file table and the summary line; returns the counts. Panics when the files or data are
/// missing (unless `GPUSORT_SLT_SKIP` names [`SUITE_SORT_FILES`]), never on a failing record:
/// check the report (e.g. [`SuiteReport::assert_all_passed`]).
pub async fn run_slt_suite(
    configure: impl Fn(SessionStateBuilder) -> SessionStateBuilder,
    files: &[&str],
) -> SuiteReport {
    let start = Instant::now();
    let tree = match SltSources::find().and_then(|sources| sources.assemble()) {
        Ok(tree) => tree,
        Err(reason) => {
            missing(SUITE_SORT_FILES, &reason);
            return SuiteReport::skipped(reason);
        }
    };
    let mut report = run_in_tree(tree.path(), configure, files, start).await;
    if files == SORT_SLT_FILES && env::var_os("GPUSORT_SLT_FILES").is_none() {
        report.min_records = SORT_FILES_MIN_RECORDS;
    }
    report
}

/// [`run_slt_suite`] on a copy of `tree` (laid out as [`SltSources::assemble`] lays it out),
/// which the run leaves as it found it.
pub async fn run_slt_suite_in(
    tree: &Path,
    configure: impl Fn(SessionStateBuilder) -> SessionStateBuilder,
    files: &[&str],
) -> SuiteReport {
    let start = Instant::now();
    let temp = tempfile::Builder::new()
        .prefix("gpusort-slt-")
        .tempdir()
        .expect("cannot create a temporary directory");
    copy_dir(tree, temp.path())
        .unwrap_or_else(|e| panic!("cannot copy {} to {}: {e}", tree.display(), temp.path().display()));
    run_in_tree(temp.path(), configure, files, start).await
}

/// Runs `files` with the working directory in `tree`'s runner directory; the tree receives the
/// files' scratch output. `start` is when the suite started (assembling the tree included).
async fn run_in_tree(
    tree: &Path,
    configure: impl Fn(SessionStateBuilder) -> SessionStateBuilder,
    files: &[&str],
    start: Instant,
) -> SuiteReport {
    let _lock = SUITE_LOCK.lock().await;
    let _cwd = CwdGuard::enter(&tree.join(RUNNER_DIR));
    scan_marks::install();

    let filter: Option<Vec<String>> = env::var("GPUSORT_SLT_FILES").ok().map(|v| {
        v.split(',')
            .map(|s| s.trim().to_string())
            .filter(|s| !s.is_empty())
            .collect()
    });
    let mut report = SuiteReport {
        ran: true,
        ..SuiteReport::default()
    };
    for file in files {
        let name = if file.ends_with(".slt") {
            (*file).to_string()
        } else {
            format!("{file}.slt")
        };
        if let Some(filter) = &filter
            && !filter.iter().any(|f| name.contains(f.as_str()))
        {
            continue;
        }
        println!("sqllogictest: running {name} ...");
        let before = scan_marks::counts();
        let mut file_report = run_file(&configure, &name).await;
        let after = scan_marks::counts();
        file_report.device_scans = (after.0 - before.0, after.1 - before.1);
        let scans = match file_report.device_scans {
            (0, 0) => String::new(),
            (read, fell_back) => format!(", {read} GPU scan(s) read, {fell_back} fell back"),
        };
        println!(
            "sqllogictest: {name}: {} run, {} passed, {} failed, {} EXPLAIN skipped, {} file error(s) in {:.1}s{scans}",
            file_report.run,
            file_report.passed,
            file_report.failed,
            file_report.skipped_explain,
            file_report.file_errors.len(),
            file_report.elapsed.as_secs_f64()
        );
        report.files.push(file_report);
    }
    report.elapsed = start.elapsed();

    println!("\n{}", report.table());
    if report.problems() > 0 {
        println!("{}", report.failure_details());
    }
    to_stderr(&report.summary());
    report
}

/// DataFusion's whole sqllogictest suite: a temporary tree ([`SltSources::assemble`]) with every
/// file of the `datafusion-sqllogictest` crate this workspace builds against over the vendored
/// data of the sort files (so those files, and every other file that reads only that data, run),
/// and the names of its `.slt` files, sorted. The Spark-compatible functions' files (`spark/`)
/// are left out: the runner registers those functions only for them. Files whose data is not
/// vendored fail the same way with and without gpusort.
pub fn full_slt_suite() -> Result<(tempfile::TempDir, Vec<String>), String> {
    let temp = SltSources::find()?.assemble()?;
    let mut files = vec![];
    list_slt_files(
        &temp.path().join(RUNNER_DIR).join("test_files"),
        Path::new(""),
        &mut files,
    )
    .map_err(|e| format!("cannot list the .slt files: {e}"))?;
    files.retain(|f| !f.starts_with("spark/"));
    files.sort();
    Ok((temp, files))
}

/// The `datafusion-sqllogictest` crate's folder: `GPUSORT_SLT_CRATE_DIR`, else the crate of
/// DataFusion's version (the lock file pins both to one release) in cargo's registry sources.
fn sqllogictest_crate_dir() -> Result<PathBuf, String> {
    if let Some(dir) = env::var_os("GPUSORT_SLT_CRATE_DIR") {
        return Ok(PathBuf::from(dir));
    }
    registry_crate_dir(&format!("datafusion-sqllogictest-{}", datafusion::DATAFUSION_VERSION))
}

/// The folder of crate `name_version` in cargo's registry sources
/// (`$CARGO_HOME/registry/src/<registry>/<name_version>`, `CARGO_HOME` defaulting to `~/.cargo`).
fn registry_crate_dir(name_version: &str) -> Result<PathBuf, String> {
    let cargo_home = env::var_os("CARGO_HOME")
        .map(PathBuf::from)
        .or_else(|| env::var_os("HOME").map(|h| PathBuf::from(h).join(".cargo")))
        .ok_or("neither CARGO_HOME nor HOME is set")?;
    let src = cargo_home.join("registry").join("src");
    let entries = fs::read_dir(&src).map_err(|e| format!("cannot read {}: {e}", src.display()))?;
    entries
        .filter_map(|e| e.ok())
        .map(|e| e.path().join(name_version))
        .find(|p| p.is_dir())
        .ok_or_else(|| format!("no {name_version} in {}", src.display()))
}

/// Appends the `.slt` files below `dir` (as paths relative to the top folder, `/`-separated).
fn list_slt_files(dir: &Path, prefix: &Path, out: &mut Vec<String>) -> io::Result<()> {
    for entry in fs::read_dir(dir)? {
        let path = entry?.path();
        let name = prefix.join(path.file_name().expect("a directory entry has a name"));
        if path.is_dir() {
            list_slt_files(&path, &name, out)?;
        } else if path.extension().is_some_and(|e| e == "slt") {
            out.push(name.to_string_lossy().replace('\\', "/"));
        }
    }
    Ok(())
}

/// Runs one file; the working directory is the runner directory.
async fn run_file(configure: &impl Fn(SessionStateBuilder) -> SessionStateBuilder, name: &str) -> FileReport {
    let start = Instant::now();
    let mut report = FileReport::new(name);
    let relative_path = PathBuf::from(name);
    let path = Path::new("test_files").join(name);

    let records = match parse_file::<DFColumnType>(&path) {
        Ok(records) => records,
        Err(e) => {
            report.file_errors.push(format!("cannot parse {}: {e}", path.display()));
            report.elapsed = start.elapsed();
            return report;
        }
    };
    if let Err(e) = setup_scratch_dir(&relative_path) {
        report
            .file_errors
            .push(format!("cannot set up the scratch directory for {name}: {e}"));
        report.elapsed = start.elapsed();
        return report;
    }

    // As `TestContext::try_new_for_test_file` builds the session, then the caller's changes.
    let config = SessionConfig::new().with_target_partitions(4);
    let builder = SessionStateBuilder::new()
        .with_config(config)
        .with_runtime_env(Arc::new(RuntimeEnv::default()))
        .with_default_features();
    let ctx = SessionContext::new_with_state(configure(builder).build());

    // As DataFusion's binary sets up its runner.
    let config_change_errors = Arc::new(Mutex::new(Vec::new()));
    let mut runner = Runner::new(|| {
        let engine = DataFusion::new(ctx.clone(), relative_path.clone(), ProgressBar::hidden())
            .with_config_change_errors(Arc::clone(&config_change_errors));
        async move { Ok::<_, DFSqlLogicTestError>(engine) }
    });
    runner.add_label(LABELS[0]);
    runner.with_column_validator(strict_column_validator);
    runner.with_normalizer(value_normalizer);
    runner.with_validator(df_value_validator);

    for record in records {
        let counted = match &record {
            Record::Halt { .. } => break,
            Record::Statement {
                sql, conditions, loc, ..
            }
            | Record::Query {
                sql, conditions, loc, ..
            } => {
                if skipped_by_condition(conditions) {
                    report.skipped_condition += 1;
                    continue;
                }
                if is_explain(sql) {
                    report.skipped_explain += 1;
                    continue;
                }
                Some(loc.clone())
            }
            _ => None,
        };
        let loc = counted;
        let record_start = Instant::now();
        let outcome = AssertUnwindSafe(runner.run_async(record)).catch_unwind().await;
        if let Some(loc) = &loc {
            report.record_time(loc, record_start.elapsed());
        }
        let error = match outcome {
            Ok(Ok(_)) => None,
            Ok(Err(e)) => Some(e.display(false).to_string()),
            Err(panic) => Some(format!("panicked: {}", panic_message(&*panic))),
        };
        match (loc, error) {
            (Some(_), None) => {
                report.run += 1;
                report.passed += 1;
            }
            (Some(loc), Some(error)) => {
                report.run += 1;
                report.record_failure(&loc, &error);
            }
            (None, None) => {}
            (None, Some(error)) => report.file_errors.push(format!("control record: {error}")),
        }
    }

    // As DataFusion's binary does: the file must leave the configuration as it found it.
    runner.shutdown_async().await;
    report
        .file_errors
        .extend(config_change_errors.lock().unwrap_or_else(|e| e.into_inner()).drain(..));
    report.elapsed = start.elapsed();
    report
}

/// Whether an `onlyif`/`skipif` condition excludes the record for DataFusion, as the runner
/// decides it.
fn skipped_by_condition(conditions: &[Condition]) -> bool {
    conditions.iter().any(|c| match c {
        Condition::OnlyIf { label } => !LABELS.contains(&label.as_str()),
        Condition::SkipIf { label } => LABELS.contains(&label.as_str()),
    })
}

/// Whether the SQL is an `EXPLAIN` (any form: `EXPLAIN ANALYZE`, `EXPLAIN VERBOSE`,
/// `EXPLAIN FORMAT ...`), ignoring case, leading whitespace and leading SQL comments.
pub fn is_explain(sql: &str) -> bool {
    let mut s = sql;
    loop {
        s = s.trim_start();
        if let Some(rest) = s.strip_prefix("--") {
            s = rest.split_once('\n').map_or("", |(_, after)| after);
        } else if let Some(rest) = s.strip_prefix("/*") {
            s = rest.split_once("*/").map_or("", |(_, after)| after);
        } else {
            break;
        }
    }
    const KEYWORD: &str = "explain";
    s.get(..KEYWORD.len()).is_some_and(|w| w.eq_ignore_ascii_case(KEYWORD))
        && s[KEYWORD.len()..]
            .chars()
            .next()
            .is_none_or(|c| !(c.is_alphanumeric() || c == '_'))
}

fn panic_message(panic: &(dyn Any + Send)) -> String {
    if let Some(s) = panic.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = panic.downcast_ref::<String>() {
        s.clone()
    } else {
        "(a non-string panic payload)".to_string()
    }
}

/// Copies a folder recursively (following symbolic links).
fn copy_dir(src: &Path, dst: &Path) -> io::Result<()> {
    fs::create_dir_all(dst)?;
    for entry in fs::read_dir(src)? {
        let from = entry?.path();
        let to = dst.join(from.file_name().expect("a directory entry has a name"));
        if from.is_dir() {
            copy_dir(&from, &to)?;
        } else {
            fs::copy(&from, &to)?;
        }
    }
    Ok(())
}

/// Sets the process's working directory and puts the previous one back when dropped.
struct CwdGuard {
    previous: PathBuf,
}

impl CwdGuard {
    fn enter(dir: &Path) -> Self {
        let previous = env::current_dir().expect("cannot read the working directory");
        env::set_current_dir(dir).unwrap_or_else(|e| panic!("cannot change directory to {}: {e}", dir.display()));
        Self { previous }
    }
}

impl Drop for CwdGuard {
    fn drop(&mut self) {
        if let Err(e) = env::set_current_dir(&self.previous) {
            eprintln!("cannot change directory back to {}: {e}", self.previous.display());
        }
    }
}
