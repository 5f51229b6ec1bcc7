//! [`GpuOptions`]: every setting of the GPU backend that the `GPUSORT_*` environment variables
//! choose, read once when a device is opened ([`Gpu::open`](crate::Gpu::open), which
//! [`CudaBackend`](crate::CudaBackend) calls) instead of wherever each was needed. The README's
//! table lists them. No kernel: the kernels' compile-time settings are [`KernelTuning`].

use gpusort::parse_byte_size;

use crate::error::{CudaSortError, Result};
use crate::kernels::{KernelTuning, MSD_MAX_DIGIT_BITS};

/// The GPU backend's settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuOptions {
    /// The kernels' compile-time settings (`GPUSORT_IPT`, `GPUSORT_ONESWEEP_*`,
    /// `GPUSORT_RANK_FOLD`).
    pub tuning: KernelTuning,
    /// Per-kernel device times of every sort printed to stderr (`GPUSORT_PROFILE=1`).
    pub profile: bool,
    /// The widest MSD partition digit, 1 to [`MSD_MAX_DIGIT_BITS`] (`GPUSORT_MSD_BITS`).
    pub msd_max_bits: u32,
    /// SRTS's passes run as one sweep where they can (off with `GPUSORT_ONESWEEP=0`).
    pub onesweep: bool,
    /// The scatters move plain 4-byte lanes in pairs (off with `GPUSORT_PAIR_LANES=0`).
    pub pair_lanes: bool,
    /// Keys of native columns are encoded on the device (off with `GPUSORT_DEVICE_KEYS=0`:
    /// on the host).
    pub device_keys: bool,
    /// Shared memory a block may use at most, in bytes, below the device's own limit
    /// (`GPUSORT_SMEM_CAP`, 16 KiB to 1 MiB; `K` / `KiB` suffixes are read too): the kernels get
    /// the shapes of a GPU with that much ([`crate::shapes`]), e.g. `96K` (V100), `99K` (A10, L4,
    /// RTX 3090/4090), `163K` (A100) on an H100.
    pub smem_cap: Option<usize>,
    /// A sort first reads its key once to find input already in order or reversed
    /// (`presorted.rs`; off with `GPUSORT_PRESORTED=0`).
    pub presorted: bool,
    /// Device memory all sorts of the process together may hold on the device, in bytes
    /// (`GPUSORT_DEVICE_BUDGET`, e.g. `40g`; default: the free memory when the device opens,
    /// less a sixteenth; see [`crate::memory::DeviceBudget`]).
    pub device_budget: Option<usize>,
}

impl Default for GpuOptions {
    fn default() -> Self {
        Self {
            tuning: KernelTuning::default(),
            profile: false,
            msd_max_bits: MSD_MAX_DIGIT_BITS,
            onesweep: true,
            pair_lanes: true,
            device_keys: true,
            smem_cap: None,
            presorted: true,
            device_budget: None,
        }
    }
}

impl GpuOptions {
    /// The defaults, with what the `GPUSORT_*` variables set. A value out of range is an error
    /// that names the variable.
    pub fn from_env() -> Result<Self> {
        Self::from_vars(|name| std::env::var(name).ok())
    }

    /// As [`Self::from_env`], reading variables through `var`.
    pub fn from_vars(var: impl Fn(&str) -> Option<String>) -> Result<Self> {
        let msd_max_bits = match var("GPUSORT_MSD_BITS") {
            Some(v) => v
                .parse::<u32>()
                .ok()
                .filter(|b| (1..=MSD_MAX_DIGIT_BITS).contains(b))
                .ok_or_else(|| {
                    CudaSortError::Unsupported(format!("GPUSORT_MSD_BITS={v} (1 to {MSD_MAX_DIGIT_BITS} bits)"))
                })?,
            None => MSD_MAX_DIGIT_BITS,
        };
        let smem_cap = match var("GPUSORT_SMEM_CAP") {
            None => None,
            Some(v) => Some(
                parse_byte_size(&v)
                    .filter(|b| (16 << 10..=1 << 20).contains(b))
                    .ok_or_else(|| {
                        CudaSortError::Unsupported(format!(
                            "GPUSORT_SMEM_CAP={v} (bytes of shared memory a block, 16K to 1024K, e.g. 99K)"
                        ))
                    })?,
            ),
        };
        let device_budget = match var("GPUSORT_DEVICE_BUDGET") {
            None => None,
            Some(v) => match parse_byte_size(&v) {
                Some(0) => None,
                Some(b) => Some(b),
                None => {
                    return Err(CudaSortError::Unsupported(format!(
                        "GPUSORT_DEVICE_BUDGET={v} ({})",
                        gpusort::size::size_error(&v)
                    )));
                }
            },
        };
        Ok(Self {
            tuning: KernelTuning::from_vars(&var)?,
            profile: var("GPUSORT_PROFILE").as_deref() == Some("1"),
            msd_max_bits,
            onesweep: var("GPUSORT_ONESWEEP").as_deref() != Some("0"),
            pair_lanes: var("GPUSORT_PAIR_LANES").as_deref() != Some("0"),
            device_keys: var("GPUSORT_DEVICE_KEYS").as_deref() != Some("0"),
            smem_cap,
            presorted: var("GPUSORT_PRESORTED").as_deref() != Some("0"),
            device_budget,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_are_read_from_the_variables_once() {
        let vars = |pairs: &'static [(&'static str, &'static str)]| {
            move |name: &str| pairs.iter().find(|(k, _)| *k == name).map(|(_, v)| v.to_string())
        };
        assert_eq!(GpuOptions::from_vars(vars(&[])).unwrap(), GpuOptions::default());
        let o = GpuOptions::from_vars(vars(&[
            ("GPUSORT_PROFILE", "1"),
            ("GPUSORT_MSD_BITS", "8"),
            ("GPUSORT_ONESWEEP", "0"),
            ("GPUSORT_PAIR_LANES", "0"),
            ("GPUSORT_DEVICE_KEYS", "0"),
            ("GPUSORT_PRESORTED", "0"),
            ("GPUSORT_IPT", "12"),
        ]))
        .unwrap();
        assert!(o.profile && !o.onesweep && !o.pair_lanes && !o.device_keys && !o.presorted);
        assert_eq!((o.msd_max_bits, o.tuning.ipt), (8, 12));
        // Only "1" turns profiling on; anything but "0" leaves the others on, as before.
        let o = GpuOptions::from_vars(vars(&[("GPUSORT_PROFILE", "yes"), ("GPUSORT_ONESWEEP", "1")])).unwrap();
        assert!(!o.profile && o.onesweep);
        for bad in ["0", "12", "x"] {
            let err = GpuOptions::from_vars(|n: &str| (n == "GPUSORT_MSD_BITS").then(|| bad.to_string())).unwrap_err();
            assert!(err.to_string().contains(&format!("GPUSORT_MSD_BITS={bad}")), "{err}");
        }
        for (v, bytes) in [("40g", Some(40usize << 30)), ("512MiB", Some(512 << 20)), ("0", None)] {
            let o = GpuOptions::from_vars(|n: &str| (n == "GPUSORT_DEVICE_BUDGET").then(|| v.to_string())).unwrap();
            assert_eq!(o.device_budget, bytes, "{v}");
        }
        let err =
            GpuOptions::from_vars(|n: &str| (n == "GPUSORT_DEVICE_BUDGET").then(|| "lots".to_string())).unwrap_err();
        assert!(err.to_string().contains("GPUSORT_DEVICE_BUDGET=lots"), "{err}");
        for (v, bytes) in [("99K", 99 << 10), ("163KiB", 163 << 10), ("98304", 98304)] {
            let o = GpuOptions::from_vars(|n: &str| (n == "GPUSORT_SMEM_CAP").then(|| v.to_string())).unwrap();
            assert_eq!(o.smem_cap, Some(bytes), "{v}");
        }
        for bad in ["8K", "2000K", "x", "99M"] {
            let err = GpuOptions::from_vars(|n: &str| (n == "GPUSORT_SMEM_CAP").then(|| bad.to_string())).unwrap_err();
            assert!(err.to_string().contains(&format!("GPUSORT_SMEM_CAP={bad}")), "{err}");
        }
        let err = GpuOptions::from_vars(vars(&[("GPUSORT_IPT", "0")])).unwrap_err();
        assert!(err.to_string().contains("GPUSORT_IPT=0"), "{err}");
    }
}
