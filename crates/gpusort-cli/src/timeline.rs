//! `gpusort sort --timeline`: the `gpusort::timeline` debug events of the operator and the
//! GPU session, and the tool's own phase marks, printed to stderr as they happen with the
//! seconds since the sort started, the CPU seconds the process has used by then (all its
//! threads: their growth against the wall time says how many cores a phase kept busy), the
//! system seconds among them and the minor page faults (memory touched for the first time); at
//! the end, the plan with every operator's metrics. This is how a slow phase is found on a real
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
            let usage = Usage::now();
            // A closed or full stderr loses the line, nothing more.
            let _ = writeln!(
                std::io::stderr().lock(),
                "[{t:8.3} s, cpu {:8.2} s, sys {:7.2} s, faults {:8}] {}",
                usage.cpu_seconds(),
                usage.system_seconds,
                usage.minor_faults,
                record.args()
            );
        }
    }

    fn flush(&self) {}
}

/// What the whole process has used so far, as `getrusage` says (zeros where it fails).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Usage {
    /// User CPU seconds, all threads.
    pub user_seconds: f64,
    /// System CPU seconds, all threads: on a sort, mostly the kernel zeroing pages that are
    /// touched for the first time.
    pub system_seconds: f64,
    /// Minor page faults: pages mapped at their first touch (a 2 MB huge page counts once).
    pub minor_faults: u64,
}

impl Usage {
    /// The process's usage now.
    pub fn now() -> Self {
        let mut usage = std::mem::MaybeUninit::<libc::rusage>::zeroed();
        // SAFETY: `getrusage` fills the struct it is given; on failure it stays zeroed.
        let usage = unsafe {
            libc::getrusage(libc::RUSAGE_SELF, usage.as_mut_ptr());
            usage.assume_init()
        };
        let seconds = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 * 1e-6;
        Self {
            user_seconds: seconds(usage.ru_utime),
            system_seconds: seconds(usage.ru_stime),
            minor_faults: usage.ru_minflt.max(0) as u64,
        }
    }

    /// User and system seconds together.
    pub fn cpu_seconds(&self) -> f64 {
        self.user_seconds + self.system_seconds
    }
}

/// User and system CPU seconds of the whole process so far (0 where `getrusage` fails).
pub fn cpu_seconds() -> f64 {
    Usage::now().cpu_seconds()
}

static LOGGER: OnceLock<TimelineLogger> = OnceLock::new();

/// Starts printing the timeline (once a process; later calls do nothing).
pub fn enable() {
    let logger = LOGGER.get_or_init(|| TimelineLogger { start: Instant::now() });
    if log::set_logger(logger).is_ok() {
        log::set_max_level(log::LevelFilter::Debug);
        if let Some(age) = process_age_seconds() {
            mark(format_args!("timeline: started {age:.3} s after the process"));
        }
    }
}

/// Seconds since this process started (Linux: `/proc/self/stat`'s start time against
/// `/proc/uptime`, at the clock tick's resolution, 10 ms); `None` elsewhere. What the process
/// did before the timeline (loading, the arguments) is part of the time a user waits.
fn process_age_seconds() -> Option<f64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // The fields after the command name (which may hold spaces) in parentheses; the start
    // time is field 22, the 20th after it.
    let after_name = &stat[stat.rfind(')')? + 2..];
    let start_ticks: f64 = after_name.split(' ').nth(19)?.parse().ok()?;
    let uptime: f64 = std::fs::read_to_string("/proc/uptime")
        .ok()?
        .split(' ')
        .next()?
        .parse()
        .ok()?;
    // SAFETY: sysconf reads a constant of the system.
    let ticks_per_second = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    (ticks_per_second > 0).then(|| uptime - start_ticks / ticks_per_second as f64)
}

/// A mark of the tool's own (reading, writing) on the timeline.
pub fn mark(what: impl std::fmt::Display) {
    log::debug!(target: TARGET, "{what}");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    #[cfg(target_os = "linux")]
    fn process_age_counts_from_the_process_start() {
        let first = process_age_seconds().expect("/proc/self/stat read");
        // The test binary started moments ago (a slow CI machine: minutes at most).
        assert!((0.0..600.0).contains(&first), "{first}");
        std::thread::sleep(std::time::Duration::from_millis(50));
        let later = process_age_seconds().unwrap();
        assert!(later >= first, "{first} then {later}");
    }

    #[test]
    fn usage_grows_with_work_and_first_touches() {
        let before = Usage::now();
        // 64 MiB touched for the first time: at least one fault (a huge page or 4 KiB pages).
        let mut touched = vec![0u8; 64 << 20];
        for page in touched.chunks_mut(4096) {
            page[0] = 1;
        }
        std::hint::black_box(&touched);
        let after = Usage::now();
        assert!(after.minor_faults > before.minor_faults, "{before:?} -> {after:?}");
        assert!(after.cpu_seconds() >= before.cpu_seconds());
        assert!((after.cpu_seconds() - cpu_seconds()).abs() < 1.0);
    }
}
