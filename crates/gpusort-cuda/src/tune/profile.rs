//! The tuning profile: what `gpusort tune` chose on one GPU, in a small `key = value` text file
//! beside the compiled kernels (the [`KernelCache`](crate::KernelCache) directory), named and
//! keyed by the GPU's name, SM count and driver version ([`ProfileKey`]). The settings are
//! written as the `GPUSORT_*` variables that set them, so that a line can be copied into the
//! environment, and [`GpuOptions`](crate::GpuOptions) reads a profile by treating its lines as
//! defaults under the environment: built-in defaults < profile < `GPUSORT_*` variables.
//!
//! ```text
//! # gpusort tuning profile ...
//! gpu = NVIDIA H100 80GB HBM3
//! multiprocessors = 132
//! driver = 13000
//! speedup = 1.041
//! GPUSORT_ONESWEEP_IPT = 24
//! measured = keys-u32-100M 2.275 2.201
//! ```

use std::path::{Path, PathBuf};

use super::space::{Settings, is_tunable};
use crate::device::DeviceInfo;
use crate::error::{CudaSortError, Result};

/// The variable that names the tuning profile to read (`off`: none; default: the profile of the
/// device in the kernel cache directory).
pub const PROFILE_VAR: &str = "GPUSORT_TUNING";

/// The GPU a profile belongs to: a profile applies only to a device with the same name, SM count
/// and driver version (a new driver may compile and schedule the kernels differently).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProfileKey {
    /// The device's name, e.g. `NVIDIA H100 80GB HBM3`.
    pub gpu: String,
    /// Its streaming multiprocessors.
    pub multiprocessors: u32,
    /// The CUDA driver's version, e.g. 13000.
    pub driver_version: i32,
}

impl ProfileKey {
    /// The key of device `info`.
    pub fn of(info: &DeviceInfo) -> Self {
        Self {
            gpu: info.name.clone(),
            multiprocessors: info.multiprocessors,
            driver_version: info.driver_version,
        }
    }

    /// The profile's file name: `tuning-<gpu>-<sms>sm-driver<version>.txt`, the name in lower
    /// case with every run of other characters than letters and digits one `-`.
    pub fn file_name(&self) -> String {
        let mut slug = String::new();
        for c in self.gpu.chars() {
            if c.is_ascii_alphanumeric() {
                slug.push(c.to_ascii_lowercase());
            } else if !slug.ends_with('-') {
                slug.push('-');
            }
        }
        let slug = slug.trim_matches('-');
        format!(
            "tuning-{slug}-{}sm-driver{}.txt",
            self.multiprocessors, self.driver_version
        )
    }
}

impl std::fmt::Display for ProfileKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}, {} SMs, driver {}.{}",
            self.gpu,
            self.multiprocessors,
            self.driver_version / 1000,
            self.driver_version % 1000 / 10
        )
    }
}

/// One workload's time with the defaults and with the profile's settings.
#[derive(Debug, Clone, PartialEq)]
pub struct MeasuredWorkload {
    /// The workload, e.g. `keys-u32-100M`.
    pub name: String,
    /// Its time with the built-in defaults, in ms.
    pub defaults_ms: f64,
    /// Its time with the settings chosen, in ms.
    pub tuned_ms: f64,
}

/// A tuning profile (see the [module](self)).
#[derive(Debug, Clone, PartialEq)]
pub struct TuningProfile {
    /// The GPU it belongs to.
    pub key: ProfileKey,
    /// The settings chosen, as `GPUSORT_*` variables (only those that differ from the defaults).
    pub settings: Settings,
    /// The defaults' total time over the settings' on the workloads measured.
    pub speedup: f64,
    /// Seconds the search took.
    pub search_seconds: f64,
    /// The workloads' times.
    pub measured: Vec<MeasuredWorkload>,
}

impl TuningProfile {
    /// The value the profile gives variable `var`, if any.
    pub fn setting(&self, var: &str) -> Option<String> {
        self.settings.get(var).cloned()
    }

    /// The profile as text (the [module](self)'s format).
    pub fn to_text(&self) -> String {
        let mut s = String::from(
            "# gpusort tuning profile, written by `gpusort tune`: the settings an empirical search\n\
             # (Huang, Gao & Li) chose on this GPU. Read when a device with this name, SM count and\n\
             # driver opens; a GPUSORT_* variable overrides its line, GPUSORT_TUNING=off the file.\n",
        );
        s.push_str(&format!("gpusort = {}\n", env!("CARGO_PKG_VERSION")));
        s.push_str(&format!("gpu = {}\n", self.key.gpu));
        s.push_str(&format!("multiprocessors = {}\n", self.key.multiprocessors));
        s.push_str(&format!("driver = {}\n", self.key.driver_version));
        s.push_str(&format!("speedup = {:.4}\n", self.speedup));
        s.push_str(&format!("search_seconds = {:.1}\n", self.search_seconds));
        if self.settings.is_empty() {
            s.push_str("# no setting: the built-in defaults were the fastest\n");
        }
        for (var, value) in &self.settings {
            s.push_str(&format!("{var} = {value}\n"));
        }
        s.push_str("# measured = workload, ms with the defaults, ms with the settings above\n");
        for m in &self.measured {
            s.push_str(&format!(
                "measured = {} {:.4} {:.4}\n",
                m.name, m.defaults_ms, m.tuned_ms
            ));
        }
        s
    }

    /// Reads a profile from its text; an unknown line is an error that names it.
    pub fn parse(text: &str) -> Result<Self> {
        let (mut gpu, mut sms, mut driver) = (None, None, None);
        let mut profile = Self {
            key: ProfileKey {
                gpu: String::new(),
                multiprocessors: 0,
                driver_version: 0,
            },
            settings: Settings::new(),
            speedup: 1.0,
            search_seconds: 0.0,
            measured: vec![],
        };
        for (i, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let bad = |why: &str| CudaSortError::Tuning(format!("line {}: {why}: {line}", i + 1));
            let (k, v) = line.split_once('=').ok_or_else(|| bad("not `key = value`"))?;
            let (k, v) = (k.trim(), v.trim());
            let number = |v: &str| v.parse::<f64>().map_err(|_| bad("not a number"));
            match k {
                "gpusort" => {}
                "gpu" => gpu = Some(v.to_string()),
                "multiprocessors" => sms = Some(v.parse::<u32>().map_err(|_| bad("not a count"))?),
                "driver" => driver = Some(v.parse::<i32>().map_err(|_| bad("not a version"))?),
                "speedup" => profile.speedup = number(v)?,
                "search_seconds" => profile.search_seconds = number(v)?,
                "measured" => {
                    let parts: Vec<&str> = v.split_whitespace().collect();
                    let [name, d, t] = parts[..] else {
                        return Err(bad("not `measured = workload ms ms`"));
                    };
                    profile.measured.push(MeasuredWorkload {
                        name: name.to_string(),
                        defaults_ms: number(d)?,
                        tuned_ms: number(t)?,
                    });
                }
                var if is_tunable(var) => {
                    profile.settings.insert(var.to_string(), v.to_string());
                }
                _ => return Err(bad("not a setting a tuning profile holds")),
            }
        }
        let missing = |what: &str| CudaSortError::Tuning(format!("no `{what} =` line"));
        profile.key = ProfileKey {
            gpu: gpu.ok_or_else(|| missing("gpu"))?,
            multiprocessors: sms.ok_or_else(|| missing("multiprocessors"))?,
            driver_version: driver.ok_or_else(|| missing("driver"))?,
        };
        Ok(profile)
    }

    /// Reads the profile in `path`.
    pub fn read(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| CudaSortError::Tuning(format!("reading {}: {e}", path.display())))?;
        Self::parse(&text).map_err(|e| CudaSortError::Tuning(format!("{}: {e}", path.display())))
    }

    /// Writes the profile into `dir` under its [`ProfileKey::file_name`] (through a temporary
    /// file renamed at the end) and returns the path.
    pub fn write_to(&self, dir: &Path) -> Result<PathBuf> {
        let path = dir.join(self.key.file_name());
        let io = |e: std::io::Error| CudaSortError::Tuning(format!("writing {}: {e}", path.display()));
        std::fs::create_dir_all(dir).map_err(io)?;
        let tmp = path.with_extension(format!("tmp{}", std::process::id()));
        std::fs::write(&tmp, self.to_text()).map_err(io)?;
        std::fs::rename(&tmp, &path).map_err(|e| {
            let _ = std::fs::remove_file(&tmp);
            io(e)
        })?;
        Ok(path)
    }

    /// The profile that applies to the GPU of `key`: the file `GPUSORT_TUNING` names (`explicit`;
    /// `off`: none), else its file in `cache_dir` if there is one. A profile of another GPU or
    /// driver is not applied (a warning in the log says so); a file that cannot be read is an
    /// error that names it.
    pub fn find(key: &ProfileKey, cache_dir: Option<&Path>, explicit: Option<&str>) -> Result<Option<(PathBuf, Self)>> {
        let path = match explicit.map(str::trim) {
            Some("off") | Some("0") => return Ok(None),
            Some(p) if !p.is_empty() => PathBuf::from(p),
            _ => match cache_dir.map(|d| d.join(key.file_name())) {
                Some(p) if p.is_file() => p,
                _ => return Ok(None),
            },
        };
        let profile = Self::read(&path)?;
        if profile.key != *key {
            log::warn!(
                "tuning profile {} is of {}, not of this device ({key}): not applied",
                path.display(),
                profile.key
            );
            return Ok(None);
        }
        Ok(Some((path, profile)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h100() -> ProfileKey {
        ProfileKey {
            gpu: "NVIDIA H100 80GB HBM3".into(),
            multiprocessors: 132,
            driver_version: 13000,
        }
    }

    fn profile() -> TuningProfile {
        TuningProfile {
            key: h100(),
            settings: [
                ("GPUSORT_ONESWEEP_IPT".to_string(), "24".to_string()),
                ("GPUSORT_PAIR_LANES".to_string(), "0".to_string()),
            ]
            .into(),
            speedup: 1.0412,
            search_seconds: 97.3,
            measured: vec![MeasuredWorkload {
                name: "keys-u32-100M".into(),
                defaults_ms: 2.275,
                tuned_ms: 2.2011,
            }],
        }
    }

    #[test]
    fn profiles_round_trip_through_their_text() {
        let p = profile();
        let text = p.to_text();
        assert!(text.contains("\nGPUSORT_ONESWEEP_IPT = 24\n"), "{text}");
        assert!(text.contains("\ngpu = NVIDIA H100 80GB HBM3\n"), "{text}");
        assert_eq!(TuningProfile::parse(&text).unwrap(), p);
        let empty = TuningProfile {
            settings: Settings::new(),
            measured: vec![],
            ..p.clone()
        };
        assert_eq!(TuningProfile::parse(&empty.to_text()).unwrap(), empty);
        assert_eq!(p.setting("GPUSORT_PAIR_LANES").as_deref(), Some("0"));
        assert_eq!(p.setting("GPUSORT_IPT"), None);
    }

    #[test]
    fn bad_profiles_are_refused_with_the_line() {
        let text = profile().to_text();
        for (bad, says) in [
            (
                text.replace("GPUSORT_PAIR_LANES", "GPUSORT_DEVICE_BUDGET"),
                "GPUSORT_DEVICE_BUDGET",
            ),
            (text.replace("speedup = 1.0412", "speedup = fast"), "not a number"),
            (
                text.replace("multiprocessors = 132\n", ""),
                "no `multiprocessors =` line",
            ),
            (format!("{text}what\n"), "line"),
            (text.replace("2.2011", ""), "measured"),
        ] {
            let err = TuningProfile::parse(&bad).unwrap_err().to_string();
            assert!(err.contains(says), "{says}: {err}");
        }
    }

    #[test]
    fn profiles_are_keyed_by_gpu_sms_and_driver() {
        let key = h100();
        assert_eq!(key.file_name(), "tuning-nvidia-h100-80gb-hbm3-132sm-driver13000.txt");
        assert_eq!(key.to_string(), "NVIDIA H100 80GB HBM3, 132 SMs, driver 13.0");
        let h200 = ProfileKey {
            gpu: "NVIDIA H200".into(),
            ..key.clone()
        };
        let other_driver = ProfileKey {
            driver_version: 12080,
            ..key.clone()
        };
        let fewer_sms = ProfileKey {
            multiprocessors: 114,
            ..key.clone()
        };
        for other in [&h200, &other_driver, &fewer_sms] {
            assert_ne!(other.file_name(), key.file_name(), "{other}");
        }
        let dir = std::env::temp_dir().join(format!("gpusort-tuning-test-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        // No profile yet: none applies.
        assert_eq!(TuningProfile::find(&key, Some(&dir), None).unwrap(), None);
        let path = profile().write_to(&dir).unwrap();
        assert_eq!(path, dir.join(key.file_name()));
        let (found, p) = TuningProfile::find(&key, Some(&dir), None).unwrap().unwrap();
        assert_eq!((found, p), (path.clone(), profile()));
        // Another GPU or driver finds no file of its own; named explicitly, the H100's is not applied.
        for other in [&h200, &other_driver, &fewer_sms] {
            assert_eq!(TuningProfile::find(other, Some(&dir), None).unwrap(), None);
            let explicit = path.to_str();
            assert_eq!(TuningProfile::find(other, None, explicit).unwrap(), None);
        }
        // GPUSORT_TUNING=off: none; a named file that is not there is an error naming it.
        assert_eq!(TuningProfile::find(&key, Some(&dir), Some("off")).unwrap(), None);
        let missing = dir.join("nothing.txt");
        let err = TuningProfile::find(&key, None, missing.to_str())
            .unwrap_err()
            .to_string();
        assert!(err.contains("nothing.txt"), "{err}");
        // No cache directory: none.
        assert_eq!(TuningProfile::find(&key, None, None).unwrap(), None);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
