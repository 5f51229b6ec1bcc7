//! [`RunStore`]: the sorted runs of one partition's external sort, in input order, and their
//! writes to disk.
//!
//! # Algorithm
//!
//! A run is kept in memory while the pool allows, or written to disk at once when it was cut
//! because the pool ran short. In-memory runs are written in the **background**: each on a
//! blocking thread of its own ([`RunStore::start_memory_spills`]), its bytes still reserved,
//! while the next run is read and sorted; one writer at a time would bound run generation by
//! its speed. A write is waited for only when its memory is needed
//! ([`RunStore::finish_oldest_spill`], oldest first), and every write before the merge.
//! Until its write ends a run keeps its place in the list as an empty placeholder, so runs
//! stay in input order — which is what keeps the merge stable.
//!
//! Runs are written as Arrow IPC through DataFusion's [`SpillManager`], a large run as several
//! stripes written at once ([`spill_striped`]).

use arrow::array::RecordBatch;
use datafusion::error::Result;
use datafusion::physical_plan::metrics::Time;
use datafusion::physical_plan::spill::SpillManager;

use crate::error::GpuSortExecError;
use crate::in_memory::blocking;
use crate::run::{SortedRun, spill_striped};

/// A run being written to disk on a blocking thread.
type SpillTask = tokio::task::JoinHandle<Result<Option<SortedRun>>>;

/// What the spill files of a sorted run are called.
const RUN_FILE: &str = "GpuSortExec sorted run";

/// Fewest batches of a stripe of a spilled run.
const MIN_STRIPE_BATCHES: usize = 32;

/// Sorted runs in input order, and the ones being written to disk (see the module docs).
pub(crate) struct RunStore {
    runs: Vec<SortedRun>,
    /// Runs being written to disk in the background: their place in `runs` (an empty
    /// placeholder until the write ends), the task, and the bytes held until then.
    spilling: Vec<(usize, SpillTask, usize)>,
    spill: SpillManager,
    /// Time spent writing runs.
    spill_time: Time,
}

impl RunStore {
    /// No runs yet; they will be written through `spill`, timed in `spill_time`.
    pub(crate) fn new(spill: SpillManager, spill_time: Time) -> Self {
        Self {
            runs: vec![],
            spilling: vec![],
            spill,
            spill_time,
        }
    }

    /// `runs` (in input order), none of them being written.
    pub(crate) fn with_runs(runs: Vec<SortedRun>, spill: SpillManager, spill_time: Time) -> Self {
        Self {
            runs,
            ..Self::new(spill, spill_time)
        }
    }

    /// Runs made so far (placeholders of runs being written included).
    pub(crate) fn len(&self) -> usize {
        self.runs.len()
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.runs.is_empty()
    }

    /// Appends a run held in memory (its bytes reserved by the caller).
    pub(crate) fn push_memory(&mut self, run: SortedRun) {
        self.runs.push(run);
    }

    /// Writes `batches` (sorted rows, in order) to disk now, off the async threads, and
    /// appends the run.
    pub(crate) async fn push_spilled(&mut self, batches: Vec<RecordBatch>) -> Result<()> {
        let spill = self.spill.clone();
        let time = self.spill_time.clone();
        let run = blocking(move || {
            let _timer = time.timer();
            spill_striped(&spill, &batches, spill_stripes(batches.len()), RUN_FILE)
        })
        .await
        .map_err(|e| e.context("GpuSortExec could not spill a sorted run"))?;
        self.runs.extend(run);
        Ok(())
    }

    /// Starts writing every in-memory run to disk; whether there was one.
    pub(crate) fn start_memory_spills(&mut self) -> bool {
        let memory: Vec<usize> = (0..self.runs.len())
            .filter(|&i| !self.runs[i].is_spilled() && self.runs[i].rows() > 0)
            .filter(|&i| !self.spilling.iter().any(|(j, ..)| *j == i))
            .collect();
        for &i in &memory {
            self.start_spill(i);
        }
        !memory.is_empty()
    }

    /// Starts writing in-memory run `i` to disk on a blocking thread; its bytes stay reserved
    /// until [`Self::finish_oldest_spill`] sees the write end.
    fn start_spill(&mut self, i: usize) {
        let placeholder = SortedRun::in_memory(vec![], 0);
        let SortedRun::Memory { batches, bytes } = std::mem::replace(&mut self.runs[i], placeholder) else {
            return;
        };
        let spill = self.spill.clone();
        let time = self.spill_time.clone();
        log::debug!(target: "gpusort::timeline", "run {i}: spill started");
        let task = tokio::task::spawn_blocking(move || {
            let _timer = time.timer();
            let out = spill_striped(&spill, &batches, spill_stripes(batches.len()), RUN_FILE);
            log::debug!(target: "gpusort::timeline", "run {i}: spill written");
            out
        });
        self.spilling.push((i, task, bytes));
    }

    /// Waits for the oldest run being written to disk; the bytes it held, which the caller
    /// releases (`None`: no write was in flight). The others keep writing: several spills are
    /// in flight while the pool has room for them, which is what makes a run-generation phase
    /// bound by disk writes go faster than one writer.
    pub(crate) async fn finish_oldest_spill(&mut self) -> Result<Option<usize>> {
        if self.spilling.is_empty() {
            return Ok(None);
        }
        log::debug!(target: "gpusort::timeline", "waiting for the oldest of {} spills", self.spilling.len());
        let (i, task, bytes) = self.spilling.remove(0);
        let run = task
            .await
            .map_err(|e| GpuSortExecError::Task(e.to_string()))?
            .map_err(|e| e.context("GpuSortExec could not spill a sorted run"))?;
        if let Some(run) = run {
            self.runs[i] = run;
        }
        if self.spilling.is_empty() {
            // Placeholders of runs that had no rows (indices of runs being written stay put
            // until then).
            self.runs.retain(|r| r.rows() > 0);
        }
        Ok(Some(bytes))
    }

    /// Waits for every write; the runs, in input order, and the bytes the writes held, which
    /// the caller releases.
    pub(crate) async fn finish(mut self) -> Result<(Vec<SortedRun>, usize)> {
        let mut freed = 0;
        while let Some(bytes) = self.finish_oldest_spill().await? {
            freed += bytes;
        }
        Ok((self.runs, freed))
    }
}

/// Stripes a sorted run of `batches` batches is spilled as (see [`crate::run`]): a writer per
/// four cores, at most four, and none shorter than [`MIN_STRIPE_BATCHES`].
pub(crate) fn spill_stripes(batches: usize) -> usize {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    (cores / 4).clamp(1, 4).min(batches / MIN_STRIPE_BATCHES).max(1)
}
