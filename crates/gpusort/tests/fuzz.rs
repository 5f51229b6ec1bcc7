//! Differential fuzz test of the CPU backend against Arrow's `lexsort_to_indices` + `take`
//! (made stable), in the style of arrow-rs's row format `fuzz_test`: seeded random tables
//! with 1-4 sort columns of every sortable type, random directions and null placements,
//! nulls, NaN, -0.0, extremes, empty and long strings sharing long prefixes,
//! dictionaries, sizes at tile and chunk edges, and payload of mixed types; every
//! strategy, digit width and string prefix length.
//!
//! `GPUSORT_FUZZ_SEED` and `GPUSORT_FUZZ_CASES` change the seed and the number of cases;
//! `GPUSORT_FUZZ_ONLY=N` runs only case `N` (to reproduce a failure).

use gpusort::{CpuBackend, EncoderOptions, SortBackend, SortRequest, Strategy};
use gpusort_testing::{EDGE_SIZES, assert_matches_reference, random_case, rng_from_env};
use rand::Rng;

fn cases(default: usize) -> usize {
    std::env::var("GPUSORT_FUZZ_CASES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default)
}

fn run(seed_default: u64, num_cases: usize, size: impl Fn(&mut rand::rngs::SmallRng, usize) -> usize) {
    let (mut rng, seed) = rng_from_env(seed_default);
    let backends: Vec<CpuBackend> = [4, 8, 11, 16]
        .into_iter()
        .map(|bits| CpuBackend::new().with_digit_bits(bits).unwrap())
        .collect();
    let mut presorted = 0;
    for case in 0..num_cases {
        let n = size(&mut rng, case);
        let c = random_case(&mut rng, n);
        let strategy = Strategy::ALL[rng.random_range(0..Strategy::ALL.len())];
        let limit = rng.random_bool(0.2).then(|| rng.random_range(0..=n + 1));
        let max_prefix_bytes = [0, 1, 3, 8, 8, 16][rng.random_range(0..6)];
        // Values whole up to some length, past the prefix (as GPU sorts take them).
        let whole_values_up_to = [0, 0, 4, 64][rng.random_range(0..4)];
        let backend = &backends[rng.random_range(0..backends.len())];
        let request = SortRequest::new(&c.batch, &c.spec)
            .with_strategy(Some(strategy))
            .with_limit(limit)
            .with_encoder_options(EncoderOptions {
                max_prefix_bytes,
                whole_values_up_to,
            });
        if std::env::var("GPUSORT_FUZZ_ONLY").is_ok_and(|only| only != case.to_string()) {
            continue;
        }
        let what = format!(
            "seed {seed} case {case}: {n} rows, {strategy}, limit {limit:?}, prefix {max_prefix_bytes}, whole {whole_values_up_to}, {backend:?}"
        );
        let out = backend.sort(&request).unwrap_or_else(|e| panic!("{what}: {e}"));
        assert_matches_reference(&c.batch, &c.spec, limit, &out, &what);
        presorted += out.stats.input_order.is_some() as usize;
    }
    // A quarter of the cases are drawn presorted: some must take the shortcut.
    assert!(num_cases < 40 || presorted > 0, "no case was recognised as presorted");
    eprintln!("{presorted} of {num_cases} cases recognised as presorted");
}

/// Thousands of small and medium cases, sizes at tile and chunk edges.
#[test]
fn cpu_backend_matches_stable_lexsort() {
    run(0x5eed, cases(3000), |rng, case| {
        if case % 3 == 0 {
            EDGE_SIZES[rng.random_range(0..EDGE_SIZES.len())]
        } else if rng.random_bool(0.8) {
            rng.random_range(0..2000)
        } else {
            rng.random_range(2000..70_000)
        }
    });
}

/// A few large cases, up to a million rows.
#[test]
fn cpu_backend_matches_stable_lexsort_large() {
    run(0xb16, cases(3000).div_ceil(500), |rng, _| {
        rng.random_range(200_000..=1_000_000)
    });
}
