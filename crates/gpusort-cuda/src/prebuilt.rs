//! Kernels built ahead of time and embedded in the binary, so that the first sort on a new
//! machine does not wait for NVRTC (compiling every family took ~5 s on the H100 machine,
//! beside the reading of the input).
//!
//! They are the programs of the default tuning ([`KernelTuning::programs`]) compiled for the
//! architectures in [`ARCHS`] with the same options as at run time, by
//!
//! ```text
//! LD_LIBRARY_PATH=<a folder with libnvrtc> cargo run -p gpusort-cuda --example prebuild_kernels
//! ```
//!
//! (NVRTC needs no GPU; the `nvidia-cuda-nvrtc` wheel from PyPI has the library), which writes
//! `prebuilt/<arch>/<family>.cubin` and `prebuilt/manifest.txt`: each program's source hash.
//! A prebuilt kernel is used only while its hash is that of the source this build compiles:
//! a kernel edited since (or another tuning) is compiled by NVRTC and cached as before, and
//! the test `prebuilt_kernels_match_the_sources` fails until they are built again.

use crate::kernels::{KernelTuning, OPTIONS, fnv1a128};

/// The architectures kernels are built ahead for: Hopper (H100, H200).
pub const ARCHS: &[&str] = &["sm_90"];

/// Each program's source hash, a line `arch family hash` each.
const MANIFEST: &str = include_str!("../prebuilt/manifest.txt");

macro_rules! cubins {
    ($($arch:literal / $family:literal),* $(,)?) => {
        &[$(($arch, $family, include_bytes!(concat!("../prebuilt/", $arch, "/", $family, ".cubin")).as_slice())),*]
    };
}

/// The CUBIN of each (architecture, family).
const CUBINS: &[(&str, &str, &[u8])] = cubins![
    "sm_90" / "grs.cu",
    "sm_90" / "srts.cu",
    "sm_90" / "gather.cu",
    "sm_90" / "msd.cu",
    "sm_90" / "onesweep.cu",
    "sm_90" / "keys.cu",
    "sm_90" / "presorted.cu",
    "sm_90" / "ties.cu",
    "sm_90" / "merge.cu",
    "sm_90" / "sample.cu",
    "sm_90" / "parquet.cu",
];

/// The hash of a program's source as built for `arch` (the options included).
pub fn source_hash(source: &str, arch: &str) -> String {
    format!(
        "{:032x}",
        fnv1a128(&[source.as_bytes(), arch.as_bytes(), OPTIONS.join(" ").as_bytes()])
    )
}

/// The prebuilt CUBIN of `source` for `arch`, if one was built from this very source.
pub fn find(source: &str, arch: &str) -> Option<&'static [u8]> {
    let hash = source_hash(source, arch);
    let family = MANIFEST.lines().find_map(|line| {
        let mut parts = line.split_whitespace();
        let (a, f, h) = (parts.next()?, parts.next()?, parts.next()?);
        (a == arch && h == hash).then_some(f)
    })?;
    CUBINS
        .iter()
        .find(|(a, f, _)| *a == arch && *f == family)
        .map(|(_, _, cubin)| *cubin)
        .filter(|c| !c.is_empty())
}

/// The manifest the prebuilt kernels of the default tuning would have: for `prebuild_kernels`.
pub fn manifest_for(archs: &[&str]) -> String {
    let mut out = String::new();
    for arch in archs {
        for (family, source) in KernelTuning::default().programs() {
            out.push_str(&format!("{arch} {family} {}\n", source_hash(&source, arch)));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::FAMILIES;

    /// Fails when a kernel source changed after the prebuilt kernels were built: run the
    /// `prebuild_kernels` example (see the module doc) and commit what it writes.
    #[test]
    fn prebuilt_kernels_match_the_sources() {
        assert_eq!(
            MANIFEST,
            manifest_for(ARCHS),
            "the prebuilt kernels are stale: run `cargo run -p gpusort-cuda --example prebuild_kernels` \
             with libnvrtc on LD_LIBRARY_PATH"
        );
        for arch in ARCHS {
            for (family, source) in KernelTuning::default().programs() {
                let cubin = find(&source, arch).unwrap_or_else(|| panic!("no prebuilt {arch} {family}"));
                assert!(cubin.starts_with(b"\x7fELF"), "{arch} {family} is a CUBIN");
            }
        }
        assert_eq!(CUBINS.len(), ARCHS.len() * FAMILIES.len());
        // Another tuning is another source: compiled at run time.
        let other = KernelTuning {
            ipt: 12,
            ..KernelTuning::default()
        };
        assert!(find(&other.programs()[0].1, "sm_90").is_none());
        assert!(find(&KernelTuning::default().programs()[0].1, "sm_80").is_none());
    }
}
