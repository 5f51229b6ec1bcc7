//! `gpusort info` and `gpusort explain`: what the tool would sort on, and the plan it would
//! run.

use std::fmt::Write as _;
use std::path::Path;

use datafusion::physical_plan::displayable;
use datafusion_gpusort::{DeviceChoice, StrategyChoice};
use gpusort_cuda::device::{self, DeviceInfo, GpuUnavailable};
use gpusort_cuda::tune::{self, PROFILE_VAR};
use gpusort_cuda::{CudaSortError, Gpu, GpuOptions, KernelCache, TuningProfile};

use crate::error::Result;
use crate::plan::{PlanArgs, SortPlan, format_size};
use crate::report::group_digits;
use gpusort_parquet::writer::{Codec, DEFAULT_ROW_GROUP_SIZE};

/// `gpusort info`: the GPUs found (or why none), the driver's and NVRTC's versions, where
/// compiled kernels are cached. Never fails: what is missing is said.
pub fn info() -> String {
    let mut s = String::new();
    let _ = writeln!(s, "gpusort {}", env!("CARGO_PKG_VERSION"));
    match device::device_count() {
        Ok(0) => gpu_none(&mut s, &GpuUnavailable::NoDevice),
        Ok(count) => {
            for ordinal in 0..count {
                match device::probe(ordinal) {
                    Ok(info) => {
                        let options = GpuOptions::for_device(&info, KernelCache::from_env().dir());
                        let _ = writeln!(s, "GPU          {info}");
                        let _ = writeln!(s, "shapes       {}", shapes(&info, &options));
                        let _ = writeln!(s, "tuning       {}", tuning(&options));
                    }
                    Err(why) => {
                        let _ = writeln!(s, "GPU          cuda:{ordinal} is not usable: {why}");
                    }
                }
            }
        }
        Err(why) => gpu_none(&mut s, &why),
    }
    let _ = writeln!(
        s,
        "CUDA driver  {}",
        match device::driver_version() {
            Some(v) => format!("{}.{}", v / 1000, v % 1000 / 10),
            None => "not installed (libcuda)".into(),
        }
    );
    let _ = writeln!(
        s,
        "NVRTC        {}",
        match device::installed_nvrtc_version() {
            Some((major, minor)) => format!("{major}.{minor}"),
            None => "not installed (libnvrtc, which compiles the kernels)".into(),
        }
    );
    let _ = writeln!(s, "kernel cache {}", kernel_cache(KernelCache::from_env().dir()));
    let _ = writeln!(
        s,
        "CPU          {} threads for the CPU backend",
        rayon::current_num_threads()
    );
    s
}

/// The kernels' shapes on the device, under its options (`GPUSORT_SMEM_CAP`, the tile sizes of
/// the `GPUSORT_*` settings and its tuning profile).
fn shapes(info: &DeviceInfo, options: &Result<GpuOptions, CudaSortError>) -> String {
    match options {
        Ok(options) => {
            let cap = options
                .smem_cap
                .map_or(String::new(), |c| format!(" (GPUSORT_SMEM_CAP={} KiB)", c >> 10));
            format!("{}{cap}", Gpu::shapes_for(info, options))
        }
        Err(e) => format!("unknown: {e}"),
    }
}

/// The device's tuning profile (`gpusort tune`): which file, what it sets, its speedup; or none.
fn tuning(options: &Result<GpuOptions, CudaSortError>) -> String {
    let options = match options {
        Ok(o) => o,
        Err(e) => return format!("unknown: {e}"),
    };
    let Some(path) = &options.tuning_profile else {
        let how = if std::env::var(PROFILE_VAR).is_ok_and(|v| v.trim() == "off") {
            "GPUSORT_TUNING=off"
        } else {
            "no profile for this GPU and driver; `gpusort tune` writes one"
        };
        return format!("none: built-in defaults ({how})");
    };
    match TuningProfile::read(path) {
        Ok(p) => format!(
            "{} ({}; {:.3}x over the defaults when tuned; GPUSORT_* variables override it)",
            path.display(),
            tune::describe(&p.settings),
            p.speedup
        ),
        Err(e) => format!("{} ({e})", path.display()),
    }
}

fn gpu_none(s: &mut String, why: &GpuUnavailable) {
    let _ = writeln!(s, "GPU          none: {why}; sorts run on gpusort's CPU backend");
}

/// Where the kernel cache is and what it holds.
fn kernel_cache(dir: Option<&Path>) -> String {
    let Some(dir) = dir else {
        return "off (GPUSORT_KERNEL_CACHE=off): kernels are compiled by every process".into();
    };
    let source = if std::env::var_os("GPUSORT_KERNEL_CACHE").is_some() {
        "from GPUSORT_KERNEL_CACHE"
    } else {
        "set GPUSORT_KERNEL_CACHE to move it, or to off"
    };
    match std::fs::read_dir(dir) {
        Ok(entries) => {
            let (mut files, mut bytes) = (0, 0);
            // Compiled kernels only (the directory holds tuning profiles too).
            for entry in entries.flatten() {
                if let Ok(meta) = entry.metadata()
                    && meta.is_file()
                    && entry.path().extension().is_some_and(|e| e == "cubin")
                {
                    files += 1;
                    bytes += meta.len();
                }
            }
            format!(
                "{} ({files} compiled kernel file{}, {}; {source})",
                dir.display(),
                if files == 1 { "" } else { "s" },
                format_size(bytes)
            )
        }
        Err(_) => format!("{} (not created yet; {source})", dir.display()),
    }
}

/// `gpusort explain`: the inputs, the ORDER BY in full, where the sort would run, the
/// physical plan, and how the output would be written.
pub async fn explain(args: &PlanArgs) -> Result<String> {
    let planned = SortPlan::try_new(args).await?;
    let mut s = String::new();
    let inputs = &planned.inputs;
    let _ = writeln!(
        s,
        "inputs    {}, {} rows, {}",
        inputs.describe_count(),
        group_digits(inputs.rows()),
        format_size(inputs.bytes())
    );
    let _ = writeln!(s, "order by  {}", planned.order_by.to_sql());
    let _ = writeln!(s, "sort on   {}", predicted_device(args, inputs.rows()));
    let _ = writeln!(s, "strategy  {}", strategy(args));
    let _ = writeln!(
        s,
        "memory    {}",
        match &planned.memory_limit {
            Some(limit) => format!(
                "{limit}; beyond it the sort spills to {}",
                args.temp_dir
                    .as_deref()
                    .map(|d| d.display().to_string())
                    .unwrap_or_else(|| "the system's temporary directory".into())
            ),
            None => "no limit (--memory-limit)".into(),
        }
    );
    let _ = writeln!(
        s,
        "\nphysical plan:\n{}",
        displayable(planned.plan.as_ref()).indent(true)
    );
    let _ = writeln!(
        s,
        "then the sorted stream is written to a Parquet file (by default {} rows per row group, {}), \
         with sorting_columns, through a temporary file renamed at the end",
        group_digits(DEFAULT_ROW_GROUP_SIZE as u64),
        Codec::default()
    );
    Ok(s)
}

/// The strategy a sort would use, in words.
fn strategy(args: &PlanArgs) -> String {
    let config = args.gpusort_config();
    if !config.enabled {
        return "DataFusion's SortExec (--no-gpusort)".into();
    }
    match config.strategy {
        StrategyChoice::Auto => {
            "auto: chosen per sort from its rows, key bits and payload (the rule calibrated on the H100); \
             on the CPU a stable LSD radix sort"
                .into()
        }
        StrategyChoice::Cpu => "cpu (--strategy cpu)".into(),
        StrategyChoice::Fixed(s) => format!("{s} (--strategy)"),
    }
}

/// Where a sort of `rows` rows would run with these arguments, and why.
fn predicted_device(args: &PlanArgs, rows: u64) -> String {
    let config = args.gpusort_config();
    if !config.enabled {
        return "the CPU, with DataFusion's SortExec (--no-gpusort)".into();
    }
    if config.strategy == StrategyChoice::Cpu {
        return "gpusort's CPU backend (--strategy cpu)".into();
    }
    let Some(ordinal) = config.device.ordinal() else {
        return "gpusort's CPU backend (--device cpu)".into();
    };
    if rows < config.min_rows as u64 {
        return format!(
            "gpusort's CPU backend: {} rows < gpusort.min_rows = {} (--min-rows)",
            group_digits(rows),
            group_digits(config.min_rows as u64)
        );
    }
    match (device::probe(ordinal), config.device) {
        (Ok(info), _) => format!("the GPU, {info}"),
        (Err(why), DeviceChoice::Auto) => format!("gpusort's CPU backend: no usable GPU ({why})"),
        (Err(why), _) => format!("GPU {ordinal}, which is not usable ({why}): the sort would fail"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `gpusort info`'s shapes line of an H100: today's tiles, every strategy.
    #[test]
    fn shapes_line_of_an_h100() {
        let info = DeviceInfo::h100_example();
        let line = Gpu::shapes_for(&info, &GpuOptions::default()).to_string();
        assert!(
            line.starts_with(
                "227 KiB a block, 228 KiB, 2048 threads and 64 Ki registers an SM: tiles 256 x 16; one sweep 256 x 20 \
                 (3 blocks/SM, compiled for 3: 80 registers a thread)"
            ),
            "{line}"
        );
        let capped = GpuOptions {
            smem_cap: Some(99 << 10),
            ..GpuOptions::default()
        };
        let line = Gpu::shapes_for(&info, &capped).to_string();
        assert!(
            line.starts_with(
                "99 KiB a block, 100 KiB, 2048 threads and 64 Ki registers an SM: tiles 256 x 16; one sweep 256 x 12 \
                 (2 blocks/SM, compiled for 3: 80 registers a thread)"
            ),
            "{line}"
        );
        // Only GPUSORT_* variables the test does not set: the line is there.
        assert!(!shapes(&info, &GpuOptions::from_env()).is_empty());
    }

    /// `gpusort info`'s tuning line: the profile that applies, what it sets and its speedup; or
    /// none, and the built-in defaults.
    #[test]
    fn tuning_line_names_the_profile_or_the_defaults() {
        let line = tuning(&Ok(GpuOptions::default()));
        assert!(line.starts_with("none: built-in defaults ("), "{line}");
        let dir = std::env::temp_dir().join(format!("gpusort-info-tuning-{}", std::process::id()));
        let profile = TuningProfile {
            key: gpusort_cuda::tune::ProfileKey {
                gpu: "NVIDIA H200".into(),
                multiprocessors: 132,
                driver_version: 13000,
            },
            settings: [("GPUSORT_ONESWEEP_IPT".to_string(), "24".to_string())].into(),
            speedup: 1.0346,
            search_seconds: 110.0,
            measured: vec![],
        };
        let path = profile.write_to(&dir).unwrap();
        let options = GpuOptions {
            tuning_profile: Some(path.clone()),
            ..GpuOptions::default()
        };
        let line = tuning(&Ok(options));
        assert_eq!(
            line,
            format!(
                "{} (GPUSORT_ONESWEEP_IPT=24; 1.035x over the defaults when tuned; GPUSORT_* variables override it)",
                path.display()
            )
        );
        let _ = std::fs::remove_dir_all(dir);
        let err = tuning(&Err(CudaSortError::Tuning("x.txt: line 3".into())));
        assert!(err.starts_with("unknown: tuning: x.txt"), "{err}");
    }
}
