//! Helpers shared by the integration test targets: each target that needs them declares
//! `mod common;`. Not every target uses every helper, hence the `dead_code` allowance.
#![allow(dead_code)]

pub mod differential;
pub mod scan_marks;
pub mod slt;

/// Whether GPU 0 is usable; panics when `GPUSORT_REQUIRE_GPU=1` and it is not, else says the
/// test did not run and why.
pub fn gpu_present() -> bool {
    match datafusion_gpusort::gpu_backend(0) {
        Ok(_) => true,
        Err(reason) => {
            if std::env::var("GPUSORT_REQUIRE_GPU").as_deref() == Ok("1") {
                panic!("GPUSORT_REQUIRE_GPU=1 but the GPU backend is unavailable: {reason}");
            }
            eprintln!("GPU TEST NOT RUN: {reason} (set GPUSORT_REQUIRE_GPU=1 to make this a failure)");
            false
        }
    }
}
