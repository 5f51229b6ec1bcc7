//! [`GpuOptions`]: every setting of the GPU backend that the `GPUSORT_*` environment variables
//! choose, read once when a device is opened ([`Gpu::open`](crate::Gpu::open), which
//! [`CudaBackend`](crate::CudaBackend) calls) instead of wherever each was needed. The README's
//! table lists them. No kernel: the kernels' compile-time settings are [`KernelTuning`].

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
        Ok(Self {
            tuning: KernelTuning::from_vars(&var)?,
            profile: var("GPUSORT_PROFILE").as_deref() == Some("1"),
            msd_max_bits,
            onesweep: var("GPUSORT_ONESWEEP").as_deref() != Some("0"),
            pair_lanes: var("GPUSORT_PAIR_LANES").as_deref() != Some("0"),
            device_keys: var("GPUSORT_DEVICE_KEYS").as_deref() != Some("0"),
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
            ("GPUSORT_IPT", "12"),
        ]))
        .unwrap();
        assert!(o.profile && !o.onesweep && !o.pair_lanes && !o.device_keys);
        assert_eq!((o.msd_max_bits, o.tuning.ipt), (8, 12));
        // Only "1" turns profiling on; anything but "0" leaves the others on, as before.
        let o = GpuOptions::from_vars(vars(&[("GPUSORT_PROFILE", "yes"), ("GPUSORT_ONESWEEP", "1")])).unwrap();
        assert!(!o.profile && o.onesweep);
        for bad in ["0", "12", "x"] {
            let err = GpuOptions::from_vars(|n: &str| (n == "GPUSORT_MSD_BITS").then(|| bad.to_string())).unwrap_err();
            assert!(err.to_string().contains(&format!("GPUSORT_MSD_BITS={bad}")), "{err}");
        }
        let err = GpuOptions::from_vars(vars(&[("GPUSORT_IPT", "0")])).unwrap_err();
        assert!(err.to_string().contains("GPUSORT_IPT=0"), "{err}");
    }
}
