//! The differential SQL fuzz test (`support/sql_fuzz.rs`) with every sort on the GPU
//! (`gpusort.min_rows = 0`, `gpusort.device = 0`), on a machine with an NVIDIA GPU:
//!
//! ```text
//! GPUSORT_REQUIRE_GPU=1 cargo test -p datafusion-gpusort --test gpu_sql_fuzz -- --nocapture
//! ```
//!
//! With `GPUSORT_REQUIRE_GPU=1` and no usable GPU the tests fail; without it, on a machine with
//! no GPU, each prints that it did not run and why. `SQL_FUZZ_SEED` and `SQL_FUZZ_CASES` pick
//! the run, `SQL_FUZZ_CASE_SEED` replays one case.

use std::time::Instant;

use datafusion::prelude::SessionConfig;

#[path = "support/sql_fuzz.rs"]
mod sql_fuzz;

mod common;
use common::gpu_present;

fn env_u64(name: &str) -> Option<u64> {
    let v = std::env::var(name).ok()?;
    let v = v.trim();
    Some(match v.strip_prefix("0x") {
        Some(hex) => u64::from_str_radix(hex, 16).unwrap_or_else(|_| panic!("{name}={v}: not a number")),
        None => v.parse().unwrap_or_else(|_| panic!("{name}={v}: not a number")),
    })
}

fn gpu(config: SessionConfig) -> SessionConfig {
    config.set_str("gpusort.min_rows", "0").set_str("gpusort.device", "0")
}

/// A GPU memory budget too small for most sorts: they fall back to the CPU, with the same results.
fn gpu_tiny_budget(config: SessionConfig) -> SessionConfig {
    gpu(config).set_str("gpusort.gpu_memory_limit", "256K")
}

#[tokio::test]
async fn gpu_random_queries_match_stock_datafusion() {
    if !gpu_present() {
        return;
    }
    let start = Instant::now();
    if let Some(case) = env_u64("SQL_FUZZ_CASE_SEED") {
        let report = sql_fuzz::run_sql_fuzz_case(case, gpu).await;
        println!("GPU sql fuzz, case {case:#x}:\n{report}");
        return;
    }
    let seed = env_u64("SQL_FUZZ_SEED").unwrap_or(0x6770_755f_6675_7a7a);
    let cases = env_u64("SQL_FUZZ_CASES").map_or(300, |n| n as usize);
    println!("GPU sql fuzz: seed {seed:#x}, {cases} cases");
    let report = sql_fuzz::run_sql_fuzz(seed, cases, gpu).await;
    println!("GPU sql fuzz ({:.1?}):\n{report}", start.elapsed());
    // (Cases drawing `gpusort.strategy = cpu` sort on the CPU.)
    assert!(
        report.gpu_sorts > report.cpu_sorts,
        "too few sorts ran on the GPU:\n{report}"
    );
}

#[tokio::test]
async fn gpu_fallback_on_a_tiny_budget_matches_stock_datafusion() {
    if !gpu_present() {
        return;
    }
    let start = Instant::now();
    let report = sql_fuzz::run_sql_fuzz(0x7469_6e79, 60, gpu_tiny_budget).await;
    println!("GPU sql fuzz, 256K GPU budget ({:.1?}):\n{report}", start.elapsed());
    assert!(report.cpu_sorts > 0, "no sort fell back to the CPU:\n{report}");
}
