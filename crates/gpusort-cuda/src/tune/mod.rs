//! `gpusort tune`: empirical tuning of the kernels on the present GPU, after Huang, Gao & Li,
//! "An Empirically Optimized Radix Sort for GPU" (seed 002). Their section 3.3 names the
//! parameters of a GPU radix sort that the best values of depend on the GPU (blocks, threads a
//! block, elements a thread, and the digit width of each pass), section 4 finds them by a
//! two-stage empirical search: a range for each parameter bounded from what is known of the
//! GPU, then the points of that range timed on the machine itself.
//!
//! Here the parameters are the kernels' compile-time settings ([`KernelTuning`]: tile rows per
//! thread, the one-sweep block and its occupancy target, the look-back window, where the digit
//! words are kept, the rank fold) and the runtime switches ([`GpuOptions`]: one sweep, lane
//! pairs, the MSD digit width), each with a neighbourhood of its default ([`SEARCH_SPACE`]);
//! then the planner's direct/indirect crossover by field count is measured with them.
//! The search ([`TuneSearch`]) is a coordinate search from the defaults within a time budget
//! (two minutes by default): each candidate sorts a few representative workloads
//! ([`Workload::defaults`]) on the GPU ([`GpuMeasurer`]), every output checked against the
//! CPU's, and is kept when it is faster in total. What it chose is written as a
//! [`TuningProfile`] beside the kernel cache, keyed by the GPU's name, SM count and driver, and
//! [`GpuOptions::for_device`] applies it whenever that device opens (under the `GPUSORT_*`
//! variables).
//!
//! | module | what |
//! | --- | --- |
//! | `space` | the parameters, their values, the settings of a candidate |
//! | `search` | the coordinate search and the [`Measurer`] it times candidates with (no GPU) |
//! | `crossover` | the planner's direct/indirect crossover from measured times (no GPU) |
//! | `workload` | the sorts timed, their inputs and the CPU's answer (no GPU) |
//! | `measurer` | [`GpuMeasurer`]: candidates timed on the GPU |
//! | `profile` | [`TuningProfile`]: the file, its key, where it is found |
//! | `report` | the tables `gpusort tune` prints |

mod crossover;
mod measurer;
mod profile;
mod report;
mod search;
mod space;
mod workload;

use std::path::PathBuf;
use std::time::{Duration, Instant};

pub use crossover::{CROSSOVER_FIELDS, CROSSOVER_VAR, CrossoverPoint, direct_max_fields};
pub use measurer::GpuMeasurer;
pub use profile::{MeasuredWorkload, PROFILE_VAR, ProfileKey, TuningProfile};
pub use search::{DEFAULT_BUDGET, Measurer, Outcome, SearchResult, Trial, TuneEvent, TuneSearch};
pub use space::{SEARCH_SPACE, Settings, TuneParam, describe};
pub use workload::{Workload, WorkloadData};

use crate::device::{self, DeviceInfo};
use crate::error::{CudaSortError, Result};
use crate::kernels::KernelCache;
#[cfg(doc)]
use crate::{GpuOptions, KernelTuning};

/// Timed sorts of each workload a candidate (after one checked sort).
pub const DEFAULT_REPS: usize = 3;

/// A tuning run on one GPU: the search, its workloads, where the profile goes.
#[derive(Debug, Clone)]
pub struct Tuner {
    ordinal: usize,
    search: TuneSearch,
    scale: Option<f64>,
    reps: usize,
    output_dir: Option<PathBuf>,
}

/// What a tuning run did.
#[derive(Debug, Clone)]
pub struct TuneOutcome {
    /// The device tuned.
    pub device: DeviceInfo,
    /// The workloads.
    pub workloads: Vec<Workload>,
    /// The search.
    pub result: SearchResult,
    /// The profile made of it.
    pub profile: TuningProfile,
    /// Where the profile was written.
    pub written: PathBuf,
}

impl Tuner {
    /// A run on device `ordinal` over [`SEARCH_SPACE`] with the default budget, the profile
    /// written into the kernel cache directory.
    pub fn new(ordinal: usize) -> Self {
        Self {
            ordinal,
            search: TuneSearch::new(SEARCH_SPACE),
            scale: None,
            reps: DEFAULT_REPS,
            output_dir: None,
        }
    }

    /// With `budget` for the whole run.
    pub fn with_budget(mut self, budget: Duration) -> Self {
        self.search = self.search.with_budget(budget);
        self
    }

    /// Workloads at `scale` of their full size (default: full size for a budget of 90 s or
    /// more, smaller in proportion below, at least 5%).
    pub fn with_scale(mut self, scale: f64) -> Self {
        self.scale = Some(scale.clamp(1e-3, 1.0));
        self
    }

    /// `reps` timed sorts of each workload a candidate.
    pub fn with_reps(mut self, reps: usize) -> Self {
        self.reps = reps.max(1);
        self
    }

    /// Writes the profile into `dir` instead of the kernel cache directory.
    pub fn with_output_dir(mut self, dir: Option<PathBuf>) -> Self {
        self.output_dir = dir;
        self
    }

    /// The workloads each candidate sorts.
    pub fn workloads(&self) -> Vec<Workload> {
        let scale = self
            .scale
            .unwrap_or_else(|| (self.search.budget().as_secs_f64() / 90.0).clamp(0.05, 1.0));
        Workload::defaults(scale)
    }

    /// The search's plan as a table: what `gpusort tune --dry-run` prints.
    pub fn plan(&self) -> String {
        report::plan_table(
            self.search.params(),
            &self.workloads(),
            self.search.budget().as_secs_f64(),
            self.reps,
        )
    }

    /// Where the profile will be written: the output directory, else the kernel cache's.
    pub fn profile_dir(&self, cache: &KernelCache) -> Result<PathBuf> {
        self.output_dir
            .clone()
            .or_else(|| cache.dir().map(PathBuf::from))
            .ok_or_else(|| {
                CudaSortError::Tuning(
                    "no directory for the profile: the kernel cache is off (GPUSORT_KERNEL_CACHE=off); name one".into(),
                )
            })
    }

    /// Searches on the GPU, kernels from `cache`, and writes the profile; `progress` hears
    /// each step.
    pub fn run(&self, cache: &KernelCache, progress: &mut dyn FnMut(&TuneEvent)) -> Result<TuneOutcome> {
        let dir = self.profile_dir(cache)?;
        let start = Instant::now();
        // The context stays open for the whole run: each candidate's device opens on it
        // instead of creating it again.
        let (_ctx, info) = device::open(self.ordinal)?;
        let workloads = self.workloads();
        let mut measurer = GpuMeasurer::new(self.ordinal, cache.clone(), workloads.clone(), self.reps);
        let result = self.search.run(&mut measurer, &|| start.elapsed(), progress)?;
        let profile = TuningProfile {
            key: ProfileKey::of(&info),
            settings: result.chosen.clone(),
            speedup: result.speedup(),
            search_seconds: result.elapsed.as_secs_f64(),
            measured: result
                .workloads
                .iter()
                .zip(result.defaults_ms.iter().zip(&result.chosen_ms))
                .map(|(name, (d, t))| MeasuredWorkload {
                    name: name.clone(),
                    defaults_ms: *d,
                    tuned_ms: *t,
                })
                .collect(),
        };
        let written = profile.write_to(&dir)?;
        Ok(TuneOutcome {
            device: info,
            workloads,
            result,
            profile,
            written,
        })
    }
}

impl TuneOutcome {
    /// The table of the settings chosen and the speedup over the defaults.
    pub fn table(&self) -> String {
        report::result_table(SEARCH_SPACE, &self.workloads, &self.result)
    }
}

#[cfg(test)]
mod tests;
