//! [`GpuMeasurer`]: the search's [`Measurer`] on the present GPU. Each candidate opens the device
//! with its settings ([`Gpu::open_with`]: the kernels of a non-default tuning are compiled by
//! NVRTC, or read from the kernel cache, and that time is the candidate's), uploads each
//! workload's inputs, sorts them once to check the output against the CPU's and then `reps` times
//! more from a device copy of the inputs, and keeps each workload's fastest sort (device events
//! around the kernels, as the `paper` bench times them). The crossover's records are sorted the
//! same way, by SRTS-direct and SRTS-indirect.

use std::time::Instant;

use cudarc::driver::CudaSlice;
use gpusort::plan::{Strategy, radix_passes};

use super::crossover::CrossoverPoint;
use super::search::{Measurer, Outcome};
use super::space::{Settings, is_tunable};
use super::workload::{Workload, WorkloadData};
use crate::backend::MAX_DIGIT_BITS;
use crate::error::{CudaSortError, Result};
use crate::gpu::Gpu;
use crate::kernels::KernelCache;
use crate::options::GpuOptions;
use crate::table::{DeviceColumn, DeviceTable, GpuSortPlan};

/// The seed of the workloads' inputs.
const SEED: u64 = 2002;

/// Times candidates on GPU `ordinal` (see the [module](self)).
#[derive(Debug)]
pub struct GpuMeasurer {
    ordinal: usize,
    cache: KernelCache,
    workloads: Vec<Workload>,
    data: Vec<WorkloadData>,
    /// The records of the crossover, made when it is first measured.
    crossover: Option<WorkloadData>,
    reps: usize,
}

impl GpuMeasurer {
    /// A measurer on device `ordinal` with kernels from `cache`, timing `workloads` (their inputs
    /// are made by [`Measurer::prepare`]) `reps` times each a candidate.
    pub fn new(ordinal: usize, cache: KernelCache, workloads: Vec<Workload>, reps: usize) -> Self {
        Self {
            ordinal,
            cache,
            workloads,
            data: vec![],
            crossover: None,
            reps: reps.max(1),
        }
    }

    /// The options of a candidate: its settings over the built-in defaults; the `GPUSORT_*`
    /// variables the search does not tune (the shared-memory cap, the device budget...) as set.
    fn options(settings: &Settings) -> Result<GpuOptions> {
        GpuOptions::from_vars(|name| {
            settings
                .get(name)
                .cloned()
                .or_else(|| (!is_tunable(name)).then(|| std::env::var(name).ok()).flatten())
        })
    }

    /// Opens the device with `settings`, its kernels loaded; `Ok(Err(why))` when the
    /// candidate cannot run (bad settings, a compile error), `Err` when there is no GPU.
    fn open(&self, settings: &Settings) -> Result<Result<Gpu, String>> {
        let options = match Self::options(settings) {
            Ok(o) => o,
            Err(e) => return Ok(Err(e.to_string())),
        };
        let gpu = match Gpu::open_with(self.ordinal, &self.cache, options) {
            Ok(gpu) => gpu,
            Err(e @ CudaSortError::Unavailable(_)) => return Err(e),
            Err(e) => return Ok(Err(e.to_string())),
        };
        Ok(match gpu.kernels() {
            Ok(_) => Ok(gpu),
            Err(e) => Err(e.to_string()),
        })
    }

    /// Sorts `d`'s keys and its first `columns` columns on `gpu` with `strategy`: checked once,
    /// then timed; the fastest time in ms, or what was wrong.
    fn time_sort(
        &self,
        gpu: &Gpu,
        d: &WorkloadData,
        strategy: Strategy,
        columns: usize,
    ) -> Result<std::result::Result<f64, String>> {
        let s = gpu.stream();
        let rows = d.key_words[0].len();
        let keys = d
            .key_words
            .iter()
            .map(|k| s.clone_htod(k))
            .collect::<Result<Vec<_>, _>>()?;
        let cols = d.fields[..columns]
            .iter()
            .map(|f| s.clone_htod(as_bytes(f)))
            .collect::<Result<Vec<_>, _>>()?;
        let plan = GpuSortPlan {
            strategy,
            passes: radix_passes(&d.varying, MAX_DIGIT_BITS),
            keep_keys: columns == 0,
            want_perm: false,
            pack_gathers: true,
            switches: gpu.sort_switches(),
            sorted_runs: vec![],
        };
        let mut best = f64::MAX;
        for rep in 0..=self.reps {
            let mut table = DeviceTable {
                num_rows: rows,
                keys: keys.iter().map(|k| copy(gpu, k)).collect::<Result<_>>()?,
                columns: cols
                    .iter()
                    .map(|c| {
                        Ok(DeviceColumn {
                            data: copy(gpu, c)?,
                            width: 4,
                        })
                    })
                    .collect::<Result<_>>()?,
                records: None,
            };
            s.synchronize()?;
            let result = gpu.sort(&mut table, &plan)?;
            if rep > 0 {
                best = best.min(result.kernel_ms as f64);
                continue;
            }
            let checked = if columns == 0 {
                d.check_keys(
                    &table
                        .keys
                        .iter()
                        .map(|k| s.clone_dtoh(k))
                        .collect::<Result<Vec<_>, _>>()?,
                )
            } else {
                let got = table
                    .columns
                    .iter()
                    .map(|c| s.clone_dtoh(&c.data))
                    .collect::<Result<Vec<_>, _>>()?;
                d.check_first_fields(&got, columns)
            };
            if let Err(wrong) = checked {
                return Ok(Err(wrong));
            }
        }
        Ok(Ok(best))
    }

    /// The records the crossover sorts: as many rows as the records workloads, `fields` columns
    /// (made once).
    fn crossover_data(&mut self, fields: usize) -> Option<&WorkloadData> {
        let rows = self.workloads.iter().filter(|w| w.fields > 0).map(|w| w.rows).max()?;
        if self.crossover.as_ref().is_none_or(|d| d.fields.len() < fields) {
            self.crossover = Some(WorkloadData::generate(&Workload::records(rows, fields), SEED + 1));
        }
        self.crossover.as_ref()
    }
}

/// A device copy of `src`, ordered on the sort stream.
fn copy<T: cudarc::driver::DeviceRepr>(gpu: &Gpu, src: &CudaSlice<T>) -> Result<CudaSlice<T>> {
    // SAFETY: every element is written by the copy before it is read.
    let mut dst = unsafe { gpu.stream().alloc::<T>(src.len().max(1)) }?;
    gpu.stream().memcpy_dtod(src, &mut dst)?;
    Ok(dst)
}

/// The bytes of `words` (little-endian on every CUDA host).
fn as_bytes(words: &[u32]) -> &[u8] {
    // SAFETY: any u32 is four valid bytes; the length and lifetime are the slice's.
    unsafe { std::slice::from_raw_parts(words.as_ptr().cast::<u8>(), std::mem::size_of_val(words)) }
}

impl Measurer for GpuMeasurer {
    fn workloads(&self) -> Vec<String> {
        self.workloads.iter().map(Workload::name).collect()
    }

    fn runs_msd(&self) -> bool {
        self.workloads
            .iter()
            .any(|w| w.strategy(&GpuOptions::default()).algorithm == gpusort::plan::Algorithm::Msd)
    }

    fn prepare(&mut self) -> Result<()> {
        let start = Instant::now();
        self.data = self.workloads.iter().map(|w| WorkloadData::generate(w, SEED)).collect();
        log::debug!(
            "tune: inputs and their CPU reference in {:.2} s",
            start.elapsed().as_secs_f64()
        );
        Ok(())
    }

    fn measure(&mut self, settings: &Settings) -> Result<Outcome> {
        let gpu = match self.open(settings)? {
            Ok(gpu) => gpu,
            Err(why) => return Ok(Outcome::Rejected(why)),
        };
        let mut times = Vec::with_capacity(self.workloads.len());
        for (w, d) in self.workloads.iter().zip(&self.data) {
            match self.time_sort(&gpu, d, w.strategy(gpu.options()), w.fields) {
                Ok(Ok(ms)) => times.push(ms),
                Ok(Err(wrong)) => return Ok(Outcome::Rejected(format!("wrong output: {}: {wrong}", w.name()))),
                Err(e) => return Ok(Outcome::Rejected(format!("{}: {e}", w.name()))),
            }
        }
        Ok(Outcome::Timed(times))
    }

    fn crossover(&mut self, settings: &Settings, fields: &[usize]) -> Result<Option<Vec<CrossoverPoint>>> {
        let Some(&most) = fields.iter().max() else {
            return Ok(None);
        };
        let gpu = match self.open(settings)? {
            Ok(gpu) => gpu,
            Err(why) => {
                log::warn!("tune: no crossover measured: {why}");
                return Ok(None);
            }
        };
        if self.crossover_data(most).is_none() {
            return Ok(None);
        }
        let d = self.crossover.as_ref().expect("made above");
        let mut points = vec![];
        for &m in fields {
            let time = |strategy| match self.time_sort(&gpu, d, strategy, m) {
                Ok(Ok(ms)) => Some(ms),
                Ok(Err(why)) => {
                    log::warn!("tune: {strategy} of {m} fields: wrong output: {why}");
                    None
                }
                Err(e) => {
                    log::warn!("tune: {strategy} of {m} fields: {e}");
                    None
                }
            };
            points.push(CrossoverPoint {
                fields: m,
                direct_ms: time(Strategy::SRTS_DIRECT),
                indirect_ms: time(Strategy::SRTS_INDIRECT),
            });
        }
        Ok(Some(points))
    }
}
