//! Progress while a sort runs: a bar (indicatif) with the phase, rows, rows/s and time when
//! stderr is a terminal; plain lines now and then when it is not; nothing with `--quiet`.
//!
//! A monitor thread reads the running plan's metrics (rows the scans produced, spills) and the
//! writer's progress (rows encoded) a few times a second; the sort loop tells it when the
//! first sorted batch arrives.

use std::io::IsTerminal;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use datafusion::physical_plan::ExecutionPlan;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

use crate::report::{PlanMetrics, group_digits, rate};
use gpusort_parquet::writer::WriteProgress;

/// Writes `text` to stderr, losing it when stderr is closed or full (`gpusort sort ... 2>&1 |
/// head -1`): progress and the summary are not worth stopping a sort for.
pub fn to_stderr(text: std::fmt::Arguments<'_>) {
    use std::io::Write as _;
    let _ = std::io::stderr().lock().write_fmt(text);
}

/// How often the monitor reads the metrics.
const TICK: Duration = Duration::from_millis(50);

/// How often a plain progress line is printed (besides one per phase).
const LINE_EVERY: Duration = Duration::from_secs(5);

/// What the sort is doing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
#[repr(u8)]
pub enum Phase {
    /// The scans are reading the inputs; the sort takes the rows in (and sorts and spills runs
    /// when memory is short).
    Reading = 0,
    /// Every row is read; the sort runs.
    Sorting = 1,
    /// Every row is read and runs were spilled: they are being merged.
    Merging = 2,
    /// Sorted rows are coming out and going into the file.
    Writing = 3,
}

impl Phase {
    fn from_u8(v: u8) -> Self {
        match v {
            0 => Self::Reading,
            1 => Self::Sorting,
            2 => Self::Merging,
            _ => Self::Writing,
        }
    }

    /// Its name, as shown.
    pub fn name(self) -> &'static str {
        match self {
            Self::Reading => "reading",
            Self::Sorting => "sorting",
            Self::Merging => "merging",
            Self::Writing => "writing",
        }
    }
}

/// Where progress goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProgressMode {
    /// A progress bar on stderr (a terminal).
    Bar,
    /// A plain line on stderr at each phase and every few seconds (stderr is a file or pipe).
    Lines,
    /// Nothing.
    Quiet,
}

impl ProgressMode {
    /// `Quiet` when asked, else a bar if stderr is a terminal, else lines.
    pub fn detect(quiet: bool) -> Self {
        if quiet {
            Self::Quiet
        } else if std::io::stderr().is_terminal() {
            Self::Bar
        } else {
            Self::Lines
        }
    }
}

/// State the sort loop and the monitor thread share.
#[derive(Debug, Default)]
struct Shared {
    phase: AtomicU8,
    stop: AtomicBool,
    /// When the monitor saw the last input row read.
    read_done: Mutex<Option<Instant>>,
}

/// Watches a running plan and shows its progress; see the module doc.
#[derive(Debug)]
pub struct Monitor {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

impl Monitor {
    /// Starts watching `plan`, which reads `total_rows` rows, and the writer of its output;
    /// `start` is when the plan started.
    pub fn start(
        plan: Arc<dyn ExecutionPlan>,
        writer: WriteProgress,
        total_rows: u64,
        start: Instant,
        mode: ProgressMode,
    ) -> Self {
        let shared = Arc::new(Shared::default());
        let thread_shared = Arc::clone(&shared);
        let thread = std::thread::Builder::new()
            .name("gpusort-progress".into())
            .spawn(move || watch(plan, writer, total_rows, start, mode, thread_shared))
            .ok();
        Self { shared, thread }
    }

    /// The first sorted batch came out: the writing phase begins.
    pub fn writing(&self) {
        self.shared.phase.store(Phase::Writing as u8, Ordering::Relaxed);
    }

    /// The current phase.
    pub fn phase(&self) -> Phase {
        Phase::from_u8(self.shared.phase.load(Ordering::Relaxed))
    }

    /// Stops the display (clearing the bar). Returns when the monitor saw the last row read,
    /// if it did.
    pub fn finish(mut self) -> Option<Instant> {
        self.stop();
        *self.shared.read_done.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn stop(&mut self) {
        self.shared.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for Monitor {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The monitor thread.
fn watch(
    plan: Arc<dyn ExecutionPlan>,
    writer: WriteProgress,
    total: u64,
    start: Instant,
    mode: ProgressMode,
    shared: Arc<Shared>,
) {
    let bar = (mode == ProgressMode::Bar).then(|| {
        let bar = ProgressBar::with_draw_target(Some(total), ProgressDrawTarget::stderr());
        bar.set_style(
            ProgressStyle::with_template("{prefix:>8.bold} [{bar:32.cyan/blue}] {msg}")
                .expect("a valid template")
                .progress_chars("=> "),
        );
        bar
    });
    let mut shown_phase = None;
    let mut last_line = start;
    // Rows/s over the last second or so.
    let mut window: std::collections::VecDeque<(Instant, u64)> = Default::default();
    loop {
        let stopping = shared.stop.load(Ordering::Relaxed);
        let metrics = PlanMetrics::collect(&plan);
        let now = Instant::now();
        let phase = advance_phase(&shared, &metrics, total, now);
        let rows = match phase {
            Phase::Writing => writer.rows(),
            _ => metrics.rows_read.min(total),
        };
        if shown_phase != Some(phase) {
            window.clear();
        }
        window.push_back((now, rows));
        while window.len() > 2 && now.duration_since(window[0].0) > Duration::from_secs(1) {
            window.pop_front();
        }
        // Rows move while reading and writing; sorting and merging show time only.
        let speed = match (phase, window.front(), window.back()) {
            (Phase::Reading | Phase::Writing, Some(a), Some(b)) if b.0 > a.0 => {
                format!("{} rows/s", rate(b.1.saturating_sub(a.1), b.0 - a.0))
            }
            _ => String::new(),
        };
        let message = status_message(
            phase,
            rows,
            total,
            speed,
            now.duration_since(start),
            metrics.spill_count,
        );
        match (&bar, mode) {
            (Some(bar), _) => {
                bar.set_prefix(phase.name());
                bar.set_position(rows);
                bar.set_message(message);
            }
            (None, ProgressMode::Lines)
                if shown_phase != Some(phase) || (!stopping && now.duration_since(last_line) >= LINE_EVERY) =>
            {
                to_stderr(format_args!("gpusort: {:<8} {message}\n", phase.name()));
                last_line = now;
            }
            _ => {}
        }
        shown_phase = Some(phase);
        if stopping {
            break;
        }
        std::thread::sleep(TICK);
    }
    if let Some(bar) = bar {
        bar.finish_and_clear();
    }
}

/// The phase the monitor shows now: reading ends when every row was read or the scans say so
/// (then sorting, or merging once runs were spilled), unless the sort loop moved on to writing
/// meanwhile.
fn advance_phase(shared: &Shared, metrics: &PlanMetrics, total: u64, now: Instant) -> Phase {
    let moved = |from: Phase, to: Phase| {
        let _ = (shared.phase).compare_exchange(from as u8, to as u8, Ordering::Relaxed, Ordering::Relaxed);
    };
    let phase = Phase::from_u8(shared.phase.load(Ordering::Relaxed));
    if phase == Phase::Reading && (metrics.rows_read >= total || metrics.read_end_ns.is_some()) {
        *shared.read_done.lock().unwrap_or_else(|p| p.into_inner()) = Some(now);
        let next = if metrics.spill_count > 0 {
            Phase::Merging
        } else {
            Phase::Sorting
        };
        moved(Phase::Reading, next);
    } else if phase == Phase::Sorting && metrics.spill_count > 0 {
        moved(Phase::Sorting, Phase::Merging);
    }
    Phase::from_u8(shared.phase.load(Ordering::Relaxed))
}

/// The monitor's line: rows so far of `total` (read, or written while writing), the speed where
/// rows move, the time since the start and the runs spilled.
fn status_message(phase: Phase, rows: u64, total: u64, speed: String, elapsed: Duration, spilled: u64) -> String {
    let what = match phase {
        Phase::Writing => "written",
        Phase::Reading | Phase::Sorting | Phase::Merging => "read",
    };
    let spilled = if spilled > 0 {
        format!(", {spilled} runs spilled")
    } else {
        String::new()
    };
    [
        format!("{}/{} rows {what}", group_digits(rows), group_digits(total)),
        speed,
        format!("{:.1} s{spilled}", elapsed.as_secs_f64()),
    ]
    .into_iter()
    .filter(|part| !part.is_empty())
    .collect::<Vec<_>>()
    .join("  ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn phases_round_trip_and_order() {
        for p in [Phase::Reading, Phase::Sorting, Phase::Merging, Phase::Writing] {
            assert_eq!(Phase::from_u8(p as u8), p);
        }
        assert!(Phase::Reading < Phase::Writing);
        assert_eq!(ProgressMode::detect(true), ProgressMode::Quiet);
    }

    #[test]
    fn reading_ends_into_sorting_or_merging_and_writing_stays() {
        let shared = Shared {
            phase: AtomicU8::new(Phase::Reading as u8),
            stop: AtomicBool::new(false),
            read_done: Mutex::new(None),
        };
        let now = Instant::now();
        let metrics = |rows_read, spill_count| PlanMetrics {
            rows_read,
            spill_count,
            ..Default::default()
        };
        assert_eq!(advance_phase(&shared, &metrics(5, 0), 10, now), Phase::Reading);
        assert_eq!(*shared.read_done.lock().unwrap(), None);
        assert_eq!(advance_phase(&shared, &metrics(10, 0), 10, now), Phase::Sorting);
        assert_eq!(*shared.read_done.lock().unwrap(), Some(now));
        // Runs spilled while sorting: the merge.
        assert_eq!(advance_phase(&shared, &metrics(10, 2), 10, now), Phase::Merging);
        // Reading straight into the merge when runs were spilled already.
        shared.phase.store(Phase::Reading as u8, Ordering::Relaxed);
        assert_eq!(advance_phase(&shared, &metrics(10, 1), 10, now), Phase::Merging);
        // The sort loop's writing is never taken back.
        shared.phase.store(Phase::Writing as u8, Ordering::Relaxed);
        assert_eq!(advance_phase(&shared, &metrics(10, 3), 10, now), Phase::Writing);
    }

    #[test]
    fn the_status_line_says_rows_speed_time_and_spills() {
        let second = Duration::from_millis(1500);
        assert_eq!(
            status_message(Phase::Reading, 1_234_567, 2_000_000, "5 rows/s".into(), second, 0),
            "1,234,567/2,000,000 rows read  5 rows/s  1.5 s"
        );
        assert_eq!(
            status_message(Phase::Merging, 10, 10, String::new(), second, 3),
            "10/10 rows read  1.5 s, 3 runs spilled"
        );
        assert!(status_message(Phase::Writing, 1, 10, String::new(), second, 0).starts_with("1/10 rows written"));
    }
}
