//! `gpusort sort --timeline`: the `gpusort::timeline` debug events of the operator and the
//! GPU session, and the tool's own phase marks, printed to stderr as they happen with the
//! seconds since the sort started and the CPU seconds the process has used by then (all its
//! threads: their growth against the wall time says how many cores a phase kept busy); at the
//! end, the plan with every operator's metrics. This is how a slow phase is found on a real
//! input (which step of the sort, which writer stage, and whether it used the machine).

use std::io::Write as _;
use std::sync::OnceLock;
use std::time::Instant;

/// The `log` target whose debug events make up the timeline.
pub const TARGET: &str = "gpusort::timeline";

struct TimelineLogger {
    start: Instant,
}

impl log::Log for TimelineLogger {
    fn enabled(&self, metadata: &log::Metadata) -> bool {
        metadata.target() == TARGET && metadata.level() <= log::Level::Debug
    }

    fn log(&self, record: &log::Record) {
        if self.enabled(record.metadata()) {
            let t = self.start.elapsed().as_secs_f64();
            let cpu = cpu_seconds();
            // A closed or full stderr loses the line, nothing more.
            let _ = writeln!(
                std::io::stderr().lock(),
                "[{t:8.3} s, cpu {cpu:8.2} s] {}",
                record.args()
            );
        }
    }

    fn flush(&self) {}
}

/// User and system CPU seconds of the whole process so far (0 where `getrusage` fails).
pub fn cpu_seconds() -> f64 {
    let mut usage = std::mem::MaybeUninit::<libc::rusage>::zeroed();
    // SAFETY: `getrusage` fills the struct it is given; on failure it stays zeroed.
    let usage = unsafe {
        libc::getrusage(libc::RUSAGE_SELF, usage.as_mut_ptr());
        usage.assume_init()
    };
    let seconds = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 * 1e-6;
    seconds(usage.ru_utime) + seconds(usage.ru_stime)
}

static LOGGER: OnceLock<TimelineLogger> = OnceLock::new();

/// Starts printing the timeline (once a process; later calls do nothing).
pub fn enable() {
    let logger = LOGGER.get_or_init(|| TimelineLogger { start: Instant::now() });
    if log::set_logger(logger).is_ok() {
        log::set_max_level(log::LevelFilter::Debug);
    }
}

/// A mark of the tool's own (reading, writing) on the timeline.
pub fn mark(what: impl std::fmt::Display) {
    log::debug!(target: TARGET, "{what}");
}
