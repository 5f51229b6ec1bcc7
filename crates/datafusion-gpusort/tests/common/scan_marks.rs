//! Counts the GPU Parquet scans the sorts of this process made, from their timeline marks
//! (`gpusort::timeline` debug records): a suite run with `gpusort.device_scan` says how many of
//! its sorts read their files on the device and how many read them on the host instead, so
//! that a suite that passes because every scan fell back is seen as such.
//!
//! The counts are the process's: a test that asserts on them runs with `--test-threads=1` (as
//! the GPU tests do), or another test's scans count too.

use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Marks of a scan that read all its files on the device (one a scan, once every run is read
/// and sorted: a scan that fails part way counts as a fallback alone).
static READ: AtomicUsize = AtomicUsize::new(0);
/// Marks of a scan that fell back to reading its input on the host.
static FELL_BACK: AtomicUsize = AtomicUsize::new(0);
/// The first reasons of the fallbacks.
static REASONS: Mutex<Vec<String>> = Mutex::new(vec![]);
const REASONS_KEPT: usize = 20;

struct ScanMarks;

impl log::Log for ScanMarks {
    fn enabled(&self, metadata: &log::Metadata) -> bool {
        metadata.target() == "gpusort::timeline"
    }

    fn log(&self, record: &log::Record) {
        if !self.enabled(record.metadata()) {
            return;
        }
        let text = record.args().to_string();
        if text.starts_with("device scan: ") && text.ends_with(" read on the device") {
            READ.fetch_add(1, Ordering::Relaxed);
        } else if let Some(why) = text.strip_prefix("GpuSortExec: the input is read on the host: ") {
            FELL_BACK.fetch_add(1, Ordering::Relaxed);
            let mut reasons = REASONS.lock().unwrap_or_else(|p| p.into_inner());
            if reasons.len() < REASONS_KEPT {
                reasons.push(why.to_string());
            }
        }
    }

    fn flush(&self) {}
}

/// Starts counting (once a process; a no-op where another logger was installed first).
pub fn install() {
    static LOGGER: ScanMarks = ScanMarks;
    if log::set_logger(&LOGGER).is_ok() {
        log::set_max_level(log::LevelFilter::Debug);
    }
}

/// Scans read on the device and scans that fell back, so far.
pub fn counts() -> (usize, usize) {
    (READ.load(Ordering::Relaxed), FELL_BACK.load(Ordering::Relaxed))
}

/// The first reasons scans fell back for.
pub fn fallback_reasons() -> Vec<String> {
    REASONS.lock().unwrap_or_else(|p| p.into_inner()).clone()
}
