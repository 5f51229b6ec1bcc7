//! DataFusion's whole sqllogictest suite on stock DataFusion and with gpusort, compared record
//! by record ([`suite_differential`]): the CPU tests run it with the default options and with
//! runs of 7 rows (`sqllogictests.rs`), the GPU tests with every sort on the GPU reading its
//! Parquet files there (`gpu_sql.rs`).

use super::slt::{SUITE_WHOLE, full_slt_suite, missing, run_slt_suite_in, with_options};

/// Records of DataFusion's whole suite that fail with gpusort and pass on stock DataFusion, and
/// why: none is a wrong answer.
pub const EXPECTED_DIFFERENCES: &[(&str, u32, &str)] = &[
    (
        "information_schema.slt",
        206,
        "SHOW ALL lists the gpusort.* options too",
    ),
    (
        "information_schema.slt",
        366,
        "SHOW ALL VERBOSE lists the gpusort.* options too",
    ),
    (
        "information_schema.slt",
        860,
        "two rows tie on every ORDER BY key; stock's sort swaps them, GpuSortExec keeps input order",
    ),
];

/// Stock DataFusion's reruns of a file before a record that failed only with gpusort counts:
/// a record that fails in any of them is flaky on stock DataFusion itself and is left out.
const STOCK_RERUNS: usize = 2;

/// gpusort options by name, as a configuration of [`suite_differential`].
pub type Configuration = (String, Vec<(String, String)>);

/// What [`suite_differential`] found.
#[derive(Debug, Default)]
pub struct Differential {
    /// A line for stock DataFusion's run, then one per configuration.
    pub summary: Vec<String>,
    /// `[configuration] test_files/file:line` of each record that passed on stock DataFusion
    /// and failed with gpusort, not expected and not flaky on stock.
    pub unexpected: Vec<String>,
    /// GPU Parquet scans read and fallen back, all configurations
    /// ([`SuiteReport::device_scans`](super::slt::SuiteReport::device_scans)).
    pub device_scans: (usize, usize),
}

impl Differential {
    /// Writes the summary past the harness's capture and fails on any unexpected record.
    pub fn assert_no_unexpected(&self) {
        use std::io::Write as _;
        let _ = writeln!(std::io::stderr().lock(), "{}", self.summary.join("\n"));
        assert!(
            self.unexpected.is_empty(),
            "{} record(s) fail only with gpusort:\n  {}",
            self.unexpected.len(),
            self.unexpected.join("\n  ")
        );
    }
}

/// DataFusion's whole sqllogictest suite (every `.slt` file of the `datafusion-sqllogictest`
/// crate but the Spark functions': about 260 files and 20,000 records; see
/// [`full_slt_suite`]) on stock DataFusion and with gpusort in each of `configurations`: every
/// record that passes on stock DataFusion must pass with gpusort, but the
/// [`EXPECTED_DIFFERENCES`] where `apply_expected` (with options that change the answers'
/// order of ties, a reader judges them). Many files fail on both (data of DataFusion's source
/// tree that is not here, tables its binary registers for some files): those records are
/// counted, not compared. `None` when the suite's files are missing and `GPUSORT_SLT_SKIP`
/// names it (else that panics).
pub async fn suite_differential(configurations: &[Configuration], apply_expected: bool) -> Option<Differential> {
    let (dir, files) = match full_slt_suite() {
        Ok(suite) => suite,
        Err(reason) => {
            missing(SUITE_WHOLE, &reason);
            return None;
        }
    };
    let files: Vec<&str> = files.iter().map(String::as_str).collect();
    let stock = run_slt_suite_in(dir.path(), |builder| builder, &files).await;
    let compared: usize = stock.files.iter().map(|f| f.run - f.failed).sum();
    assert!(
        compared > 5000 || std::env::var_os("GPUSORT_SLT_FILES").is_some(),
        "too few records pass on stock DataFusion to compare: {compared}"
    );
    let (mut unexpected, mut device_scans) = (vec![], (0, 0));
    let mut summary = vec![format!(
        "DataFusion's slt suite, {} files: {} records run, {compared} pass on stock DataFusion (compared), {} fail there",
        stock.files.len(),
        stock.run(),
        stock.failed()
    )];
    for (name, options) in configurations {
        let ours = run_slt_suite_in(
            dir.path(),
            |builder| {
                let options: Vec<(&str, &str)> = options.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
                with_options(datafusion_gpusort::register(builder), &options)
            },
            &files,
        )
        .await;
        assert_eq!(stock.files.len(), ours.files.len());
        let (mut only, mut expected, mut flaky) = (0, 0, 0);
        for (s, o) in stock.files.iter().zip(&ours.files) {
            let only_ours: Vec<u32> = o
                .failed_lines
                .iter()
                .filter(|l| !s.failed_lines.contains(l))
                .copied()
                .collect();
            if only_ours.is_empty() {
                continue;
            }
            only += only_ours.len();
            let mut stock_failed_again = vec![];
            for _ in 0..STOCK_RERUNS {
                let again = run_slt_suite_in(dir.path(), |builder| builder, &[o.file.as_str()]).await;
                stock_failed_again.extend(again.files.iter().flat_map(|f| f.failed_lines.iter().copied()));
            }
            for line in only_ours {
                let known = EXPECTED_DIFFERENCES.iter().find(|(f, l, _)| *f == o.file && *l == line);
                if let (Some((_, _, why)), true) = (known, apply_expected) {
                    println!("[{name}] expected difference {}:{line}: {why}", o.file);
                    expected += 1;
                } else if stock_failed_again.contains(&line) {
                    println!("[{name}] {}:{line} is flaky on stock DataFusion too: left out", o.file);
                    flaky += 1;
                } else {
                    unexpected.push(format!("[{name}] test_files/{}:{line}", o.file));
                }
            }
            println!("[{name}] {}", o.failures.join("\n"));
        }
        let (read, fell_back) = ours.device_scans();
        device_scans = (device_scans.0 + read, device_scans.1 + fell_back);
        summary.push(format!(
            "with gpusort, {name}: {} pass, {} fail; {only} only with gpusort ({expected} expected, {flaky} flaky on stock); {read} GPU scan(s) read, {fell_back} fell back",
            ours.passed(),
            ours.failed(),
        ));
    }
    Some(Differential {
        summary,
        unexpected,
        device_scans,
    })
}
