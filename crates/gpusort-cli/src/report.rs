//! What a sort did, from the plan's metrics and the clock: rows read so far (for the progress
//! display), and at the end the summary — rows, bytes, time per phase, and where the sort ran
//! (the GPU, or the CPU and why).

use std::fmt::Write as _;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use datafusion::physical_plan::ExecutionPlan;
use datafusion::physical_plan::metrics::MetricsSet;

use crate::plan::format_size;

/// The sort operators of a plan and what their metrics say. Works on a running plan (the
/// metrics are live counters) and on a finished one.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PlanMetrics {
    /// Rows the Parquet scans have produced.
    pub rows_read: u64,
    /// When the last scan partition finished, in nanoseconds since the Unix epoch; `None`
    /// while one is still reading.
    pub read_end_ns: Option<u64>,
    /// `GpuSortExec`s in the plan.
    pub gpu_sort_execs: usize,
    /// DataFusion `SortExec`s in the plan.
    pub datafusion_sorts: usize,
    /// Sorts that ran on the GPU.
    pub gpu_sorts: usize,
    /// Sorts that ran on gpusort's CPU backend.
    pub cpu_sorts: usize,
    /// Where and how they ran, e.g. `gpu cuda:0 grs-direct`, `cpu srts-direct`.
    pub paths: Vec<String>,
    /// Why sorts ran on the CPU.
    pub cpu_fallbacks: Vec<String>,
    /// GPU kernel time, nanoseconds.
    pub kernel_ns: u64,
    /// Bytes copied to the GPU.
    pub bytes_to_device: u64,
    /// Bytes copied back.
    pub bytes_from_device: u64,
    /// Spill files written.
    pub spill_count: u64,
    /// Bytes spilled.
    pub spilled_bytes: u64,
    /// Rows spilled (a row spilled with its run and again by each intermediate merge that
    /// took it counts each time).
    pub spilled_rows: u64,
    /// Merges of some runs into one spilled run (more runs than one merge could read).
    pub intermediate_merges: u64,
    /// Levels of those merges (each row is written at most once per level, besides once with
    /// its run).
    pub merge_levels: u64,
    /// Time merging spilled runs, nanoseconds (gpusort's external sort reports it).
    pub merge_ns: u64,
}

impl PlanMetrics {
    /// Reads the metrics of every node of `plan`.
    pub fn collect(plan: &Arc<dyn ExecutionPlan>) -> Self {
        let mut m = Self::default();
        let mut nodes = vec![Arc::clone(plan)];
        while let Some(node) = nodes.pop() {
            nodes.extend(node.children().into_iter().cloned());
            let name = node.name();
            let metrics = node.metrics().unwrap_or_default();
            match name {
                "DataSourceExec" => m.add_scan(&metrics),
                "GpuSortExec" => {
                    m.gpu_sort_execs += 1;
                    m.add_sort(&metrics);
                }
                "SortExec" => {
                    m.datafusion_sorts += 1;
                    m.add_sort(&metrics);
                }
                _ => {}
            }
        }
        m.paths.sort();
        m.paths.dedup();
        m.cpu_fallbacks.sort();
        m.cpu_fallbacks.dedup();
        m
    }

    fn add_scan(&mut self, metrics: &MetricsSet) {
        let rows = metrics.output_rows().unwrap_or(0) as u64;
        self.rows_read += rows;
        let ends: Vec<usize> = metrics
            .iter()
            .filter(|m| m.value().name() == "end_timestamp")
            .map(|m| m.value().as_usize())
            .collect();
        if rows == 0 && ends.iter().all(|&e| e == 0) {
            // Never executed: the sort read the files itself (its device scan).
            return;
        }
        self.read_end_ns = match (ends.is_empty() || ends.contains(&0), self.read_end_ns) {
            (true, _) => None,
            (false, prev) => Some(prev.unwrap_or(0).max(*ends.iter().max().unwrap_or(&0) as u64)),
        };
    }

    fn add_sort(&mut self, metrics: &MetricsSet) {
        for metric in metrics.aggregate_by_name().iter() {
            let value = metric.value();
            let n = value.as_usize() as u64;
            match value.name() {
                "gpu_sorts" => self.gpu_sorts += n as usize,
                "cpu_sorts" => self.cpu_sorts += n as usize,
                "path" => self.paths.extend(texts(&value.to_string())),
                "cpu_fallback" => self.cpu_fallbacks.extend(texts(&value.to_string())),
                "gpu_kernel_time" => self.kernel_ns += n,
                // Files the sort read on the GPU: its reading ends when the last joined.
                "device_scan_rows" => self.rows_read += n,
                "device_scan_end_ns" if n > 0 => self.read_end_ns = Some(self.read_end_ns.unwrap_or(0).max(n)),
                "bytes_to_device" => self.bytes_to_device += n,
                "bytes_from_device" => self.bytes_from_device += n,
                "spill_count" => self.spill_count += n,
                "spilled_bytes" => self.spilled_bytes += n,
                "spilled_rows" => self.spilled_rows += n,
                "intermediate_merges" => self.intermediate_merges += n,
                "merge_levels" => self.merge_levels += n,
                "merge_time" => self.merge_ns += n,
                _ => {}
            }
        }
    }

    /// Where the sort ran, in a sentence: the GPU, or the CPU and why.
    pub fn where_sorted(&self) -> String {
        let paths = self.paths.join("; ");
        if self.gpu_sort_execs == 0 {
            return if self.datafusion_sorts > 0 {
                "with DataFusion's SortExec (gpusort was off, or cannot encode a key's type)".into()
            } else {
                "nowhere: the inputs are already in this order".into()
            };
        }
        let why = if self.cpu_fallbacks.is_empty() {
            "gpusort.device or gpusort.strategy says so".into()
        } else {
            summarize_reasons(&self.cpu_fallbacks)
        };
        match (self.gpu_sorts, self.cpu_sorts) {
            (0, 0) => "nowhere: there were no rows".into(),
            (_, 0) => format!("on the GPU ({paths})"),
            (0, _) => format!("on the CPU ({paths}) because {why}"),
            (g, c) => format!("{g} sorts on the GPU and {c} on the CPU ({paths}); the CPU because {why}"),
        }
    }
}

/// The CPU fallback reasons, short: the per-run `N rows < gpusort.min_rows = M` of an
/// external sort become one `runs of A to B rows < ...`, and past three reasons the rest are
/// counted.
fn summarize_reasons(reasons: &[String]) -> String {
    const MIN_ROWS: &str = " rows < gpusort.min_rows = ";
    let mut small: Vec<(u64, String)> = vec![];
    let mut other: Vec<String> = vec![];
    for r in reasons {
        match r.split_once(MIN_ROWS).map(|(n, m)| (n.parse::<u64>(), m)) {
            Some((Ok(n), m)) => small.push((n, m.to_string())),
            _ => other.push(r.clone()),
        }
    }
    let mut out = vec![];
    if let [(n, m)] = &small[..] {
        out.push(format!("{n}{MIN_ROWS}{m}"));
    } else if let (Some(lo), Some(hi)) = (small.iter().map(|s| s.0).min(), small.iter().map(|s| s.0).max()) {
        out.push(format!("runs of {lo} to {hi}{MIN_ROWS}{}", small[0].1));
    }
    out.extend(other);
    if out.len() > 3 {
        let more = out.len() - 3;
        out.truncate(3);
        out.push(format!("and {more} more"));
    }
    out.join("; ")
}

/// A `TextMetric`'s value (`a; b`, or `none`) as its texts.
fn texts(value: &str) -> Vec<String> {
    if value == "none" {
        return vec![];
    }
    value.split("; ").map(str::to_string).collect()
}

/// Wall time of each phase of a sort.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PhaseTimes {
    /// Checking the inputs and planning.
    pub planning: Duration,
    /// Until the scans had read every row (the sort takes them in meanwhile, and an external
    /// sort sorts and spills runs).
    pub reading: Duration,
    /// From the last row read to the first sorted row out: sorting, or when runs were spilled
    /// (each sorted as it was cut, while reading), merging them; the summary and the progress
    /// display name it alike.
    pub sorting: Duration,
    /// From the first sorted row out to the file closed and renamed.
    pub writing: Duration,
}

impl PhaseTimes {
    /// All of it.
    pub fn total(&self) -> Duration {
        self.planning + self.reading + self.sorting + self.writing
    }
}

/// What `gpusort sort` did.
#[derive(Debug, Clone)]
pub struct SortReport {
    /// Rows sorted and written.
    pub rows: u64,
    /// Input files.
    pub input_files: usize,
    /// Input bytes.
    pub input_bytes: u64,
    /// The output file.
    pub output: PathBuf,
    /// Its size.
    pub output_bytes: u64,
    /// Its row groups.
    pub row_groups: usize,
    /// Its codec, e.g. `zstd(3)`.
    pub codec: String,
    /// Whether `sorting_columns` was recorded.
    pub sorting_columns: bool,
    /// The ORDER BY list in full.
    pub order_by: String,
    /// Time per phase.
    pub times: PhaseTimes,
    /// The plan's metrics after the run.
    pub metrics: PlanMetrics,
    /// `--memory-limit`, if given.
    pub memory_limit: Option<String>,
    /// The writer's share of it, bytes.
    pub writer_memory: Option<usize>,
}

/// Below this many rows the summary gives no rows/s: the time is the tool's start-up, not
/// the sort.
pub const MIN_ROWS_FOR_RATE: u64 = 100_000;

impl SortReport {
    /// The summary printed at the end, a few lines.
    pub fn summary(&self) -> String {
        let t = &self.times;
        let mut s = String::new();
        let _ = writeln!(
            s,
            "gpusort: sorted {} rows by {}",
            group_digits(self.rows),
            self.order_by
        );
        let files = if self.input_files == 1 {
            "1 file".to_string()
        } else {
            format!("{} files", self.input_files)
        };
        let _ = writeln!(s, "  input    {files}, {}", format_size(self.input_bytes));
        let _ = writeln!(
            s,
            "  output   {}: {}, {} row group{}, {}, {}",
            self.output.display(),
            format_size(self.output_bytes),
            self.row_groups,
            if self.row_groups == 1 { "" } else { "s" },
            self.codec,
            if self.sorting_columns {
                "sorting_columns recorded"
            } else {
                "no sorting_columns (a key is a nested column)"
            }
        );
        // As the progress display names the phase.
        let sorting = if self.metrics.spill_count > 0 {
            "merging"
        } else {
            "sorting"
        };
        let speed = if self.rows >= MIN_ROWS_FOR_RATE {
            format!("  ({} rows/s)", rate(self.rows, t.total()))
        } else {
            String::new()
        };
        let _ = writeln!(
            s,
            "  time     {} = planning {} + reading {} + {sorting} {} + writing {}{speed}",
            seconds(t.total()),
            seconds(t.planning),
            seconds(t.reading),
            seconds(t.sorting),
            seconds(t.writing),
        );
        let _ = writeln!(s, "  sorted   {}", self.metrics.where_sorted());
        let m = &self.metrics;
        if m.gpu_sorts > 0 {
            let _ = writeln!(
                s,
                "  GPU      kernels {}, {} to the device, {} back",
                seconds(Duration::from_nanos(m.kernel_ns)),
                format_size(m.bytes_to_device),
                format_size(m.bytes_from_device)
            );
        }
        if m.spill_count > 0 {
            // How many times each row went to disk on average: once with its run, and again
            // with every intermediate merge that took it (at most once per level).
            let writes = m.spilled_rows as f64 / self.rows.max(1) as f64;
            let _ = writeln!(
                s,
                "  spilled  {} in {} file{}, each row written {writes:.1} time{}{}{} (memory limit {}{})",
                format_size(m.spilled_bytes),
                m.spill_count,
                if m.spill_count == 1 { "" } else { "s" },
                if (writes - 1.0).abs() < 0.05 { "" } else { "s" },
                match (m.intermediate_merges, m.merge_levels) {
                    (0, _) => String::new(),
                    (1, _) => ", 1 intermediate merge".into(),
                    (n, 0 | 1) => format!(", {n} intermediate merges"),
                    (n, levels) => format!(", {n} intermediate merges in {levels} levels"),
                },
                if m.merge_ns > 0 {
                    format!("; merging {}", seconds(Duration::from_nanos(m.merge_ns)))
                } else {
                    String::new()
                },
                self.memory_limit.as_deref().unwrap_or("none"),
                match self.writer_memory {
                    Some(w) => format!(", of which the writer {}", format_size(w as u64)),
                    None => String::new(),
                },
            );
        }
        s
    }
}

/// `1234567` as `1,234,567`.
pub fn group_digits(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// A duration as `0.42 s` or `12.3 ms`.
pub fn seconds(d: Duration) -> String {
    let s = d.as_secs_f64();
    if s >= 1.0 {
        format!("{s:.2} s")
    } else {
        format!("{:.1} ms", s * 1e3)
    }
}

/// `rows` per second of `d` for people: `2.31M`, `845k`, `12`.
pub fn rate(rows: u64, d: Duration) -> String {
    let r = rows as f64 / d.as_secs_f64().max(1e-9);
    if r >= 1e6 {
        format!("{:.2}M", r / 1e6)
    } else if r >= 1e3 {
        format!("{:.0}k", r / 1e3)
    } else {
        format!("{r:.0}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_read_well() {
        assert_eq!(group_digits(0), "0");
        assert_eq!(group_digits(999), "999");
        assert_eq!(group_digits(1_234_567), "1,234,567");
        assert_eq!(seconds(Duration::from_millis(1500)), "1.50 s");
        assert_eq!(seconds(Duration::from_micros(12_345)), "12.3 ms");
        assert_eq!(rate(2_000_000, Duration::from_secs(1)), "2.00M");
        assert_eq!(rate(500, Duration::from_secs(1)), "500");
    }

    #[test]
    fn where_sorted_says_why() {
        let mut m = PlanMetrics {
            gpu_sort_execs: 1,
            cpu_sorts: 1,
            paths: vec!["cpu srts-direct".into()],
            cpu_fallbacks: vec!["no usable GPU: the CUDA driver (libcuda) is not installed".into()],
            ..Default::default()
        };
        assert_eq!(
            m.where_sorted(),
            "on the CPU (cpu srts-direct) because no usable GPU: the CUDA driver (libcuda) is not installed"
        );
        m.cpu_sorts = 0;
        m.gpu_sorts = 1;
        m.paths = vec!["gpu cuda:0 grs-direct".into()];
        assert_eq!(m.where_sorted(), "on the GPU (gpu cuda:0 grs-direct)");
        let stock = PlanMetrics {
            datafusion_sorts: 1,
            ..Default::default()
        };
        assert!(stock.where_sorted().contains("DataFusion's SortExec"));
        assert_eq!(texts("none"), Vec::<String>::new());
        let runs: Vec<String> = ["11584", "16384", "8192"]
            .iter()
            .map(|n| format!("{n} rows < gpusort.min_rows = 100000"))
            .chain(["GPU failed: out of memory".to_string()])
            .collect();
        assert_eq!(
            summarize_reasons(&runs),
            "runs of 8192 to 16384 rows < gpusort.min_rows = 100000; GPU failed: out of memory"
        );
        assert_eq!(summarize_reasons(&runs[..1]), "11584 rows < gpusort.min_rows = 100000");
        let many: Vec<String> = (0..5).map(|i| format!("reason {i}")).collect();
        assert_eq!(summarize_reasons(&many), "reason 0; reason 1; reason 2; and 2 more");
        assert_eq!(texts("a; b"), ["a", "b"]);
    }
}
