//! GPU tests, run on a machine with an NVIDIA GPU:
//!
//! ```text
//! GPUSORT_REQUIRE_GPU=1 cargo test -p gpusort-cuda --test gpu -- --test-threads=1
//! ```
//!
//! With `GPUSORT_REQUIRE_GPU=1` and no usable GPU every test fails. Without it, on a machine
//! with no GPU, each test prints that it did not run and why.
//!
//! - `engine_*`: the device radix sorts and merges of sorted runs (GRS, SRTS and MSD, direct and indirect, ByField columns
//!   of every width and Hybrid records, 4- and 8-bit digits, 1- to 3-word keys) against a stable
//!   sort on the host, at sizes around tile edges, on adversarial key distributions, at forced
//!   MSD partition depths, SRTS as one sweep and as three kernels around whole rounds of the
//!   one-sweep grid, and on 100M rows;
//! - `backend_*`: the Arrow backend against the stable reference on random tables (every
//!   sortable type, nulls, strings, limits), as the CPU backend's fuzz test does;
//! - `device_key_encoding_*`: keys of native columns encoded on the device, bit for bit against
//!   the host encoder;
//! - `sanitize_*`: every kernel on small inputs, for `compute-sanitizer`;
//! - `shapes_fit_the_device`: the kernels' shapes (crate `shapes`) against the loaded kernels.
//!
//! Every test runs under `GPUSORT_SMEM_CAP` too (the shapes of a GPU with less shared memory:
//! `STEPS=caps scripts/device-run.sh` runs them at 96, 99 and 163 KiB).

use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

use arrow::array::{ArrayRef, RecordBatch, UInt32Array};
use arrow::datatypes::{DataType, Field, Schema};
use cudarc::driver::CudaSlice;
use gpusort::plan::{InputOrder, RadixPass, Strategy, radix_passes, varying_bits};
use gpusort::{CpuBackend, EncoderOptions, KeyEncoder, SortBackend, SortKey, SortRequest, SortSpec, SplitOptions};
use gpusort_cuda::kernels::{DISTINCT_SAMPLE, MERGE_TILE};
use gpusort_cuda::{
    CudaBackend, DeviceColumn, DeviceRecords, DeviceTable, DeviceTies, Gpu, GpuOptions, GpuSortPlan, KernelCache,
    MergeMethod, MultiGpuBackend, SortSwitches, odd_even_applies,
};
use gpusort_testing::{EDGE_SIZES, assert_matches_reference, random_case, rng_from_env};
use rand::prelude::*;
use rand::rngs::SmallRng;

fn backend() -> Option<MutexGuard<'static, CudaBackend>> {
    static B: OnceLock<Result<Mutex<CudaBackend>, String>> = OnceLock::new();
    match B.get_or_init(|| CudaBackend::try_new(0).map(Mutex::new).map_err(|e| e.to_string())) {
        Ok(b) => Some(b.lock().unwrap_or_else(|p| p.into_inner())),
        Err(reason) => {
            if std::env::var("GPUSORT_REQUIRE_GPU").as_deref() == Ok("1") {
                panic!("GPUSORT_REQUIRE_GPU=1 but the GPU backend is unavailable: {reason}");
            }
            eprintln!("GPU TEST NOT RUN: {reason} (set GPUSORT_REQUIRE_GPU=1 to make this a failure)");
            None
        }
    }
}

/// Host data of an engine case.
struct Case {
    keys: Vec<Vec<u32>>,
    columns: Vec<(Vec<u8>, usize)>,
    records: Option<(Vec<u8>, usize)>,
}

fn random_bytes(rng: &mut SmallRng, len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len];
    rng.fill(&mut v[..]);
    v
}

/// Uploads, sorts with `strategy` and `bits`-bit digits, downloads, and compares with a stable
/// sort on the host; returns the input order the sort found.
fn check_engine(gpu: &Gpu, case: &Case, strategy: Strategy, bits: u32, what: &str) -> Option<InputOrder> {
    check_engine_with(gpu, case, strategy, bits, gpu.sort_switches(), what)
}

/// As [`check_engine`], with the plan's `switches`.
fn check_engine_with(
    gpu: &Gpu,
    case: &Case,
    strategy: Strategy,
    bits: u32,
    switches: SortSwitches,
    what: &str,
) -> Option<InputOrder> {
    check_engine_runs(gpu, case, strategy, bits, switches, &[], what).0
}

/// As [`check_engine_with`], the plan saying that the rows are sorted runs of `runs` rows;
/// returns the input order found and the runs merged.
fn check_engine_runs(
    gpu: &Gpu,
    case: &Case,
    strategy: Strategy,
    bits: u32,
    switches: SortSwitches,
    runs: &[usize],
    what: &str,
) -> (Option<InputOrder>, usize) {
    let n = case.keys.first().map_or(0, |w| w.len());
    let s = gpu.stream();
    let mut table = DeviceTable {
        num_rows: n,
        keys: case.keys.iter().map(|w| s.clone_htod(&pad(w)).unwrap()).collect(),
        columns: case
            .columns
            .iter()
            .map(|(v, width)| DeviceColumn {
                data: s.clone_htod(&pad(v)).unwrap(),
                width: *width,
            })
            .collect(),
        records: case.records.as_ref().map(|(v, bytes)| DeviceRecords {
            data: s.clone_htod(&pad(v)).unwrap(),
            bytes: *bytes,
        }),
    };
    let varying = varying_bits(&case.keys);
    let passes: Vec<RadixPass> = radix_passes(&varying, bits);
    let plan = GpuSortPlan {
        strategy,
        passes,
        keep_keys: true,
        want_perm: true,
        // Both ways of gathering (indirect): packed groups and column by column.
        pack_gathers: n.is_multiple_of(2),
        switches,
        sorted_runs: runs.to_vec(),
    };
    let result = gpu.sort(&mut table, &plan).unwrap_or_else(|e| panic!("{what}: {e}"));
    let want = reference_order(&case.keys, n);
    let perm: Vec<u32> = down(s, result.perm.as_ref().unwrap(), n);
    if perm != want {
        let at = perm.iter().zip(&want).position(|(a, b)| a != b).unwrap();
        panic!(
            "{what}: permutation differs at {at} of {n}: got {} want {}",
            perm[at], want[at]
        );
    }
    for (w, dev) in table.keys.iter().enumerate() {
        if varying[w] != 0 {
            let got: Vec<u32> = down(s, dev, n);
            let expected: Vec<u32> = want.iter().map(|&i| case.keys[w][i as usize]).collect();
            assert!(got == expected, "{what}: key word {w} not sorted with the rows");
        }
    }
    for (c, ((host, width), dev)) in case.columns.iter().zip(&table.columns).enumerate() {
        let got: Vec<u8> = down(s, &dev.data, n * width);
        let expected: Vec<u8> = want
            .iter()
            .flat_map(|&i| host[i as usize * width..(i as usize + 1) * width].iter().copied())
            .collect();
        assert!(
            got == expected,
            "{what}: column {c} ({width} bytes) not moved with the keys"
        );
    }
    if let (Some((host, bytes)), Some(dev)) = (&case.records, &table.records) {
        let got: Vec<u8> = down(s, &dev.data, n * bytes);
        let expected: Vec<u8> = want
            .iter()
            .flat_map(|&i| host[i as usize * bytes..(i as usize + 1) * bytes].iter().copied())
            .collect();
        assert!(
            got == expected,
            "{what}: records ({bytes} bytes) not moved with the keys"
        );
    }
    (result.input_order, result.merged_runs)
}

/// A keys-only sort (no columns, no records, no permutation asked for) against the host: the key
/// words come back sorted. With one key word and a direct strategy, the digit word is all a pass
/// moves: the scatter's keys-only path (no slot positions, no last barrier).
fn check_engine_keys_only(gpu: &Gpu, keys: &[Vec<u32>], strategy: Strategy, bits: u32, what: &str) {
    let n = keys.first().map_or(0, |w| w.len());
    let s = gpu.stream();
    let mut table = DeviceTable {
        num_rows: n,
        keys: keys.iter().map(|w| s.clone_htod(&pad(w)).unwrap()).collect(),
        columns: vec![],
        records: None,
    };
    let varying = varying_bits(keys);
    let plan = GpuSortPlan {
        strategy,
        passes: radix_passes(&varying, bits),
        keep_keys: true,
        want_perm: false,
        pack_gathers: false,
        switches: gpu.sort_switches(),
        sorted_runs: vec![],
    };
    let result = gpu.sort(&mut table, &plan).unwrap_or_else(|e| panic!("{what}: {e}"));
    assert!(result.perm.is_none(), "{what}: a permutation nobody asked for");
    let want = reference_order(keys, n);
    for (w, dev) in table.keys.iter().enumerate() {
        if varying[w] != 0 {
            let got: Vec<u32> = down(s, dev, n);
            let expected: Vec<u32> = want.iter().map(|&i| keys[w][i as usize]).collect();
            if got != expected {
                let at = got.iter().zip(&expected).position(|(a, b)| a != b).unwrap();
                panic!(
                    "{what}: key word {w} differs at {at} of {n}: got {:#x} want {:#x}",
                    got[at], expected[at]
                );
            }
        }
    }
}

/// The stable order of rows by their key words: (key words..., row) sorted in parallel.
fn reference_order(keys: &[Vec<u32>], n: usize) -> Vec<u32> {
    use rayon::prelude::*;
    let word = |w: usize, i: usize| keys.get(w).map_or(0, |k| k[i]) as u64;
    let mut rows: Vec<(u64, u64, u32)> = (0..n)
        .into_par_iter()
        .map(|i| {
            (
                (word(0, i) << 32) | word(1, i),
                (word(2, i) << 32) | word(3, i),
                i as u32,
            )
        })
        .collect();
    assert!(keys.len() <= 4);
    rows.par_sort_unstable();
    rows.into_iter().map(|r| r.2).collect()
}

/// A host vector, or one element for an empty one (device buffers are never empty).
fn pad<T: Copy + Default>(v: &[T]) -> Vec<T> {
    if v.is_empty() { vec![T::default()] } else { v.to_vec() }
}

fn down<T: cudarc::driver::DeviceRepr + Default + Clone>(
    s: &std::sync::Arc<cudarc::driver::CudaStream>,
    d: &CudaSlice<T>,
    len: usize,
) -> Vec<T> {
    let mut out = s.clone_dtoh(d).unwrap();
    out.truncate(len);
    out
}

fn keys_of(rng: &mut SmallRng, n: usize, words: usize, kind: &str) -> Vec<Vec<u32>> {
    (0..words)
        .map(|w| {
            (0..n)
                .map(|i| match kind {
                    "random" => rng.random(),
                    "equal" => 7,
                    "sorted" => i as u32,
                    "reverse" => (n - i) as u32,
                    "reverse_ties" => ((n - i) / 3) as u32,
                    "runs" => (i % (n / 3 + 1)) as u32,
                    "two" => rng.random_range(0..2) * 0x8000_0000,
                    "low" => rng.random_range(0..16),
                    "top" => rng.random::<u32>() & 0xF000_0000,
                    "dups" => rng.random_range(0..100) << (w * 3),
                    // Nearly every row in one bin of every digit, a few anywhere.
                    "skew" => {
                        if rng.random_range(0..100) == 0 {
                            rng.random()
                        } else {
                            0x1234_5678
                        }
                    }
                    _ => unreachable!(),
                })
                .collect()
        })
        .collect()
}

fn case(rng: &mut SmallRng, n: usize, words: usize, kind: &str, hybrid: bool) -> Case {
    let keys = keys_of(rng, n, words, kind);
    let (columns, records) = if hybrid {
        let bytes = [4usize, 20, 48, 64][rng.random_range(0..4)];
        (vec![], Some((random_bytes(rng, n * bytes), bytes)))
    } else {
        (
            [1usize, 2, 4, 8, 16]
                .iter()
                .map(|&w| (random_bytes(rng, n * w), w))
                .collect(),
            None,
        )
    };
    Case { keys, columns, records }
}

#[test]
fn engine_every_strategy_layout_and_width() {
    let Some(b) = backend() else { return };
    let gpu = b.gpu();
    let mut rng = SmallRng::seed_from_u64(11);
    let tile = gpu.tile();
    let sizes = [0, 1, 2, 31, tile - 1, tile, tile + 1, 3 * tile + 5, 200_003];
    for &n in &sizes {
        for words in 1..=3 {
            for hybrid in [false, true] {
                let c = case(&mut rng, n, words, "random", hybrid);
                for strategy in Strategy::ALL {
                    for bits in [4, 8] {
                        let what = format!("n {n} words {words} hybrid {hybrid} {strategy} {bits}-bit digits");
                        check_engine(gpu, &c, strategy, bits, &what);
                    }
                }
            }
        }
    }
}

#[test]
fn engine_adversarial_keys() {
    let Some(b) = backend() else { return };
    let gpu = b.gpu();
    let mut rng = SmallRng::seed_from_u64(12);
    for kind in ["equal", "sorted", "reverse", "two", "low", "top", "dups"] {
        for &n in &[1usize, gpu.tile() + 1, 100_000] {
            for words in [1, 2] {
                let c = case(&mut rng, n, words, kind, kind == "dups");
                for strategy in Strategy::ALL {
                    check_engine(gpu, &c, strategy, 8, &format!("{kind} n {n} words {words} {strategy}"));
                }
            }
        }
    }
    // Digits of every width from 1 to 8 bits.
    let c = case(&mut rng, 50_000, 1, "random", false);
    for bits in 1..=8 {
        check_engine(gpu, &c, Strategy::SRTS_DIRECT, bits, &format!("{bits}-bit digits"));
        check_engine(gpu, &c, Strategy::GRS_INDIRECT, bits, &format!("{bits}-bit digits"));
    }
}

/// The benches' key distributions (`gpusort_testing::KeyDistribution`: random, sorted, reversed,
/// 8 sorted runs, 16 distinct, zipf, nearly sorted) as 64-bit keys with a 4- and an 8-byte
/// column, every strategy: the rows against the reference, the order found against the test's
/// own scan.
#[test]
fn engine_key_distributions() {
    let Some(b) = backend() else { return };
    let gpu = b.gpu();
    let mut rng = SmallRng::seed_from_u64(29);
    let merge = gpu.sort_switches().merge;
    for dist in gpusort_testing::KeyDistribution::ALL {
        for n in [gpu.tile() + 1, 100_000] {
            let keys = dist.keys(n, 29);
            let words = vec![
                keys.iter().map(|k| (k >> 32) as u32).collect::<Vec<u32>>(),
                keys.iter().map(|&k| k as u32).collect(),
            ];
            let passes = radix_passes(&varying_bits(&words), 8).len();
            let (_, want) = scan_order(&words, passes, merge);
            let c = case_with_columns(&mut rng, words, &[4, 8]);
            for strategy in Strategy::ALL {
                let what = format!("{} n {n} {strategy}", dist.name());
                assert_eq!(check_engine(gpu, &c, strategy, 8, &what), want, "{what}");
            }
        }
    }
}

/// Input already in order skips the passes and moves nothing; strictly reversed input is
/// reversed in place; non-increasing input (reversed with ties) gets its groups of equal keys
/// reversed, each group's rows in input order; up to 64 ascending runs are merged where that
/// pays, else they take the passes. Every strategy, ByField and Hybrid, one to three
/// key words, sizes around a tile.
#[test]
fn engine_presorted_input() {
    let Some(b) = backend() else { return };
    let gpu = b.gpu();
    let mut rng = SmallRng::seed_from_u64(22);
    // (`None`: as the scan says; reversed with ties and three runs are merged runs where they
    // are few enough and the merge pays against the passes.)
    let shortcut = [
        ("sorted", Some(InputOrder::Sorted)),
        ("reverse", Some(InputOrder::Reversed)),
        ("reverse_ties", None),
        ("runs", None),
    ];
    let merge = gpu.sort_switches().merge;
    for (kind, order) in shortcut {
        for &n in &[2usize, 3, gpu.tile() - 1, gpu.tile() + 1, 100_001] {
            for words in 1..=3 {
                for hybrid in [false, true] {
                    let c = case(&mut rng, n, words, kind, hybrid);
                    let passes = radix_passes(&varying_bits(&c.keys), 8).len();
                    let (runs, scanned) = scan_order(&c.keys, passes, merge);
                    if order.is_some() {
                        assert_eq!(scanned, order, "{kind} n {n}: the test's own scan");
                    }
                    for strategy in Strategy::ALL {
                        let what = format!(
                            "{kind} n {n} words {words} hybrid {hybrid} {strategy}: {} runs",
                            runs.len()
                        );
                        // (Two rows of "reverse_ties" and "runs" are equal: no pass, no scan.)
                        assert_eq!(check_engine(gpu, &c, strategy, 8, &what), scanned, "{what}");
                    }
                }
            }
        }
    }
    // Runs of random keys (8 passes): merged up to the scan's 64 runs (6 rounds), sorted past
    // them or without a merge method.
    let most = gpusort::cpu::PRESORTED_MAX_RUNS;
    for k in [2, 3, 17, most, most + 1, 200] {
        let n = 150_000 + k;
        let mut c = case(&mut rng, n, 2, "random", k % 2 == 0);
        let runs: Vec<usize> = (0..k).map(|i| n / k + usize::from(i < n % k)).collect();
        sort_runs(&mut c.keys, &runs);
        let want = (k <= most).then_some(InputOrder::Runs(k));
        assert_eq!(scan_order(&c.keys, 8, merge).1, want, "{k} runs: the test's own scan");
        for strategy in [Strategy::SRTS_DIRECT, Strategy::MSD_INDIRECT, Strategy::GRS_INDIRECT] {
            let what = format!("{k} runs of random keys, {strategy}");
            let switches = gpu.sort_switches();
            let (order, merged) = check_engine_runs(gpu, &c, strategy, 8, switches, &[], &what);
            assert_eq!((order, merged), (want, if k <= most { k } else { 0 }), "{what}");
            let off = SortSwitches {
                merge: None,
                ..switches
            };
            let (order, merged) = check_engine_runs(gpu, &c, strategy, 8, off, &[], &what);
            assert_eq!((order, merged), (None, 0), "{what}, no merge method");
        }
    }
    // With the scan off, sorted input takes the passes.
    let c = case(&mut rng, 5_000, 2, "sorted", false);
    let off = SortSwitches {
        presorted: false,
        ..gpu.sort_switches()
    };
    assert_eq!(
        check_engine_with(gpu, &c, Strategy::SRTS_DIRECT, 8, off, "sorted, scan off"),
        None
    );
    // Keys only, no permutation asked for: the key words come back reversed.
    let keys = keys_of(&mut rng, 70_000, 2, "reverse");
    check_engine_keys_only(gpu, &keys, Strategy::SRTS_DIRECT, 8, "reversed keys only");
    check_engine_keys_only(gpu, &keys, Strategy::MSD_DIRECT, 8, "reversed keys only");
    // Non-increasing keys of every group size: one row, a few, groups larger than a tile
    // (REVERSE_GROUPS_TILE is 4,096 rows), one group across the whole input but its last row;
    // every strategy, ByField and Hybrid, the keys only too.
    for (groups, n) in [(3_000, 9_001), (40, 100_003), (2, 70_000), (1_000_000, 50_000)] {
        for words in [1, 2] {
            // One word: the values fit the low word; two: they span both.
            let shift = if words == 1 { 8 } else { 28 };
            let mut keys: Vec<u64> = (0..n).map(|_| rng.random_range(0..groups as u64) << shift).collect();
            keys.sort_unstable_by(|a, b| b.cmp(a));
            let mut c = case(&mut rng, n, 1, "random", words == 2);
            c.keys = words_of_u64(&keys);
            for strategy in Strategy::ALL {
                let what = format!("non-increasing, {groups} values, n {n}, words {words}, {strategy}");
                assert_eq!(
                    check_engine(gpu, &c, strategy, 8, &what),
                    Some(InputOrder::Reversed),
                    "{what}"
                );
            }
            check_engine_keys_only(gpu, &c.keys, Strategy::SRTS_DIRECT, 8, "non-increasing keys only");
        }
    }
    let mut keys: Vec<u64> = vec![9; 30_000];
    keys[29_999] = 1;
    let c = case_with_columns(&mut rng, words_of_u64(&keys), &[4, 8]);
    assert_eq!(
        check_engine(gpu, &c, Strategy::SRTS_DIRECT, 8, "one group of 29,999 rows"),
        Some(InputOrder::Reversed)
    );
}

/// The words of 64-bit keys, most significant first.
fn words_of_u64(keys: &[u64]) -> Vec<Vec<u32>> {
    vec![
        keys.iter().map(|k| (k >> 32) as u32).collect(),
        keys.iter().map(|&k| k as u32).collect(),
    ]
}

/// Keys of few distinct values (at most 256, of one or two words) are sorted by one pass over
/// each row's rank among them, where the sample found them all; every strategy (the pass is
/// SRTS's whatever the plan), ByField columns of every width and Hybrid records, keys kept or
/// not, the permutation or none. Where a value is missing from the sample, or there are more than
/// 256, or the key has three words, or the switch is off, the rows take the passes.
#[test]
fn engine_few_distinct_keys() {
    let Some(b) = backend() else { return };
    let gpu = b.gpu();
    let mut rng = SmallRng::seed_from_u64(44);
    let n = gpusort_cuda::DISTINCT_MIN_ROWS + 3;
    // Values spread over the whole 64 bits, the largest (all ones) and 0 among them.
    let pick = |rng: &mut SmallRng, k: usize| -> Vec<u64> {
        let mut v: Vec<u64> = (0..k).map(|_| rng.random()).collect();
        v[0] = u64::MAX;
        if k > 1 {
            v[1] = 0;
        }
        v
    };
    for (k, hybrid) in [(16, false), (3, false), (2, true), (200, false), (256, true)] {
        let values = pick(&mut rng, k);
        let mut keys: Vec<u64> = (0..n).map(|_| values[rng.random_range(0..k)]).collect();
        // Every value where the sample looks, so that it finds them all.
        for s in 0..DISTINCT_SAMPLE {
            keys[s * n / DISTINCT_SAMPLE] = values[s % k];
        }
        let want = InputOrder::FewDistinct(k);
        let mut c = case(&mut rng, n, 1, "random", hybrid);
        c.keys = words_of_u64(&keys);
        for strategy in Strategy::ALL {
            let what = format!("{k} distinct, hybrid {hybrid}, {strategy}");
            assert_eq!(check_engine(gpu, &c, strategy, 8, &what), Some(want), "{what}");
        }
    }
    // One word, three values, ByField u32 and u64 columns; keys only.
    let keys: Vec<u32> = (0..n).map(|_| [7u32, 0, u32::MAX][rng.random_range(0..3)]).collect();
    let c = case_with_columns(&mut rng, vec![keys.clone()], &[4, 8]);
    for strategy in [Strategy::SRTS_DIRECT, Strategy::GRS_INDIRECT, Strategy::MSD_DIRECT] {
        let what = format!("3 distinct u32, {strategy}");
        assert_eq!(
            check_engine(gpu, &c, strategy, 8, &what),
            Some(InputOrder::FewDistinct(3)),
            "{what}"
        );
        check_engine_keys_only(gpu, std::slice::from_ref(&keys), strategy, 8, &what);
    }
    // Where the rows take the passes: a value the sample cannot see (row 1 lies between its
    // rows), 257 values, three varying words, the switch off.
    let mut keys: Vec<u64> = (0..n).map(|_| rng.random_range(0..15u64) << 40).collect();
    keys[1] = 99;
    let unseen = case_with_columns(&mut rng, words_of_u64(&keys), &[4]);
    let values = pick(&mut rng, 257);
    let keys: Vec<u64> = (0..n).map(|_| values[rng.random_range(0..257)]).collect();
    let many = case_with_columns(&mut rng, words_of_u64(&keys), &[4]);
    let mut three = case_with_columns(&mut rng, words_of_u64(&keys), &[4]);
    three.keys.push((0..n).map(|_| rng.random_range(0..2)).collect());
    let off = SortSwitches {
        few_distinct: None,
        ..gpu.sort_switches()
    };
    let twelve = case_with_columns(
        &mut rng,
        words_of_u64(&keys.iter().map(|k| k % 12).collect::<Vec<_>>()),
        &[4],
    );
    for (c, switches, what) in [
        (&unseen, gpu.sort_switches(), "a value missing from the sample"),
        (&many, gpu.sort_switches(), "257 distinct"),
        (&three, gpu.sort_switches(), "three key words"),
        (&twelve, off, "12 distinct, the switch off"),
    ] {
        for strategy in [Strategy::SRTS_DIRECT, Strategy::SRTS_INDIRECT] {
            let what = format!("{what}, {strategy}");
            assert_eq!(check_engine_with(gpu, c, strategy, 8, switches, &what), None, "{what}");
        }
    }
    // Below the switch's rows, nothing is looked for; at them, it is.
    let small = case_with_columns(&mut rng, twelve.keys.iter().map(|w| w[..5000].to_vec()).collect(), &[4]);
    let from = |rows| SortSwitches {
        few_distinct: Some(rows),
        ..gpu.sort_switches()
    };
    assert_eq!(
        check_engine_with(gpu, &small, Strategy::SRTS_DIRECT, 8, from(5001), "5000 rows"),
        None
    );
    assert_eq!(
        check_engine_with(gpu, &small, Strategy::SRTS_DIRECT, 8, from(5000), "5000 rows"),
        Some(InputOrder::FewDistinct(12))
    );
}

/// Each run's rows of `keys` (runs of `runs` rows, one after the other) sorted by the key.
fn sort_runs(keys: &mut [Vec<u32>], runs: &[usize]) {
    let mut at = 0;
    for &r in runs {
        let mut rows: Vec<Vec<u32>> = (at..at + r).map(|i| keys.iter().map(|w| w[i]).collect()).collect();
        rows.sort();
        for (j, row) in rows.into_iter().enumerate() {
            for (w, v) in row.into_iter().enumerate() {
                keys[w][at + j] = v;
            }
        }
        at += r;
    }
}

/// The ascending runs of the rows of `keys` (rows of each) and the order the device's scan
/// reports for them before `passes` radix passes whose runs `merge` merges: sorted, strictly
/// non-increasing (reversed, with or without ties), or at most `PRESORTED_MAX_RUNS` runs whose merge rounds are at most the passes
/// (`None` besides, and without passes, where no scan runs).
fn scan_order(keys: &[Vec<u32>], passes: usize, merge: Option<MergeMethod>) -> (Vec<usize>, Option<InputOrder>) {
    use std::cmp::Ordering::{Equal, Greater, Less};
    let n = keys.first().map_or(0, |w| w.len());
    let (mut descents, mut ascents) = (0, 0);
    let (mut runs, mut start) = (vec![], 0);
    for i in 1..n {
        match keys
            .iter()
            .map(|w| w[i - 1].cmp(&w[i]))
            .find(|o| o.is_ne())
            .unwrap_or(Equal)
        {
            Greater => {
                descents += 1;
                runs.push(i - start);
                start = i;
            }
            Less => ascents += 1,
            Equal => {}
        }
    }
    runs.push(n - start);
    let order = if n < 2 || passes == 0 {
        None
    } else if descents == 0 {
        Some(InputOrder::Sorted)
    } else if ascents == 0 {
        Some(InputOrder::Reversed)
    } else if runs.len() <= gpusort::cpu::PRESORTED_MAX_RUNS
        && merge.is_some_and(|m| merge_rounds_of(&runs, m) <= passes)
    {
        Some(InputOrder::Runs(runs.len()))
    } else {
        None
    };
    (runs, order)
}

/// Rounds of merges of `runs` by `method`: ceil(log2 k) for the tree, k for odd-even where it
/// applies, else the tree's (k the runs that are not empty; none for one).
fn merge_rounds_of(runs: &[usize], method: MergeMethod) -> usize {
    let k = runs.iter().filter(|&&r| r > 0).count();
    match (k, method) {
        (0 | 1, _) => 0,
        (k, MergeMethod::OddEven) if odd_even_applies(runs) => k,
        (k, _) => k.next_power_of_two().trailing_zeros() as usize,
    }
}

/// The first position where `got` and `want` differ, said briefly (the vectors are long).
fn first_difference(got: &[u32], want: &[u32]) -> Option<String> {
    if got.len() != want.len() {
        return Some(format!("{} values, {} wanted", got.len(), want.len()));
    }
    let at = got.iter().zip(want).position(|(a, b)| a != b)?;
    Some(format!(
        "differs at {at} of {}: got {} want {}",
        got.len(),
        got[at],
        want[at]
    ))
}

/// Rows that are sorted runs, merged on the device instead of radix-sorted (merge.rs): the
/// permutation, key words and moved columns against a stable sort, with tiles cut at run edges
/// and inside runs, empty runs, one run, many small runs and runs of equal keys; the merge runs
/// exactly where its rounds are at most the radix passes (`merge_pays`), by the tree where
/// the paper's odd-even schedule does not apply (runs of different lengths).
#[test]
fn engine_merges_sorted_runs() {
    let Some(b) = backend() else { return };
    let gpu = b.gpu();
    let mut rng = SmallRng::seed_from_u64(24);
    let t = MERGE_TILE;
    let mut shapes: Vec<Vec<usize>> = vec![
        vec![1, 1],
        vec![5, 0, 3],
        vec![70_000],
        vec![t - 1, t + 1, 1, 2 * t, 0],
        vec![100_000, 0, 100_000, 100_000, 99_999, 100_001],
        vec![3; 40],
        vec![300_001, 17],
        vec![1000, 4096, 4096, 4096, 77],
    ];
    shapes.push((0..23).map(|_| rng.random_range(0..20_000)).collect());
    for runs in &shapes {
        let n: usize = runs.iter().sum();
        for kind in ["random", "dups", "equal", "low"] {
            for words in 1..=3 {
                let hybrid = words == 2;
                let mut c = case(&mut rng, n, words, kind, hybrid);
                sort_runs(&mut c.keys, runs);
                let passes = radix_passes(&varying_bits(&c.keys), 8).len();
                for method in [MergeMethod::Tree, MergeMethod::OddEven] {
                    let switches = SortSwitches {
                        merge: Some(method),
                        ..gpu.sort_switches()
                    };
                    for strategy in [Strategy::SRTS_DIRECT, Strategy::MSD_INDIRECT] {
                        let what = format!(
                            "runs {:?} {kind} words {words} {} {strategy}",
                            &runs[..runs.len().min(6)],
                            method.name()
                        );
                        let (_, merged) = check_engine_runs(gpu, &c, strategy, 8, switches, runs, &what);
                        let rounds = merge_rounds_of(runs, method);
                        // Not merged as told: the scan may find fewer runs, whose merge pays.
                        let want = if n > 1 && rounds > 0 && rounds <= passes {
                            runs.iter().filter(|&&r| r > 0).count()
                        } else {
                            match scan_order(&c.keys, passes, Some(method)) {
                                (found, Some(InputOrder::Runs(k))) => {
                                    assert_eq!(found.len(), k);
                                    k
                                }
                                _ => 0,
                            }
                        };
                        assert_eq!(merged, want, "{what}: runs merged ({rounds} rounds, {passes} passes)");
                    }
                }
            }
        }
    }
}

/// `Gpu::merge_runs` itself, by keys of 1 to 8 words (the most merge.cu takes), both schedules:
/// the merged words and the permutation against a stable sort of the rows.
#[test]
fn engine_merge_runs_by_long_keys() {
    let Some(b) = backend() else { return };
    let gpu = b.gpu();
    let s = gpu.stream();
    let mut rng = SmallRng::seed_from_u64(25);
    for words in [1usize, 4, 8] {
        // Odd-even takes runs of one length (the first and last may be shorter), the tree any.
        let len = rng.random_range(1..3 * MERGE_TILE);
        let mut runs: Vec<usize> = vec![len; 9];
        runs[0] = rng.random_range(0..len);
        runs[8] = rng.random_range(0..len);
        if words == 4 {
            runs = (0..9).map(|_| rng.random_range(0..3 * MERGE_TILE)).collect();
        }
        let n: usize = runs.iter().sum();
        let mut keys: Vec<Vec<u32>> = (0..words)
            .map(|_| (0..n).map(|_| rng.random_range(0..4)).collect())
            .collect();
        sort_runs(&mut keys, &runs);
        let mut want: Vec<u32> = (0..n as u32).collect();
        want.sort_by_key(|&i| keys.iter().map(|w| w[i as usize]).collect::<Vec<_>>());
        for method in [MergeMethod::Tree, MergeMethod::OddEven] {
            let mut dev: Vec<CudaSlice<u32>> = keys.iter().map(|w| s.clone_htod(&pad(w)).unwrap()).collect();
            let all: Vec<usize> = (0..words).collect();
            let what = format!("{words} words {} runs {runs:?}", method.name());
            if method == MergeMethod::OddEven && !odd_even_applies(&runs) {
                assert!(gpu.merge_runs(&mut dev, &all, n, &runs, method).is_err(), "{what}");
                continue;
            }
            let perm = gpu.merge_runs(&mut dev, &all, n, &runs, method).unwrap();
            if let Some(d) = first_difference(&down(s, &perm, n), &want) {
                panic!("{what}: permutation {d}");
            }
            for (w, dev) in dev.iter().enumerate() {
                let expected: Vec<u32> = want.iter().map(|&i| keys[w][i as usize]).collect();
                if let Some(d) = first_difference(&down(s, dev, n), &expected) {
                    panic!("{what}: word {w} {d}");
                }
            }
        }
    }
    // Wrong run lengths and too many words are refused.
    let mut dev = vec![s.clone_htod(&[1u32, 2, 3]).unwrap()];
    assert!(gpu.merge_runs(&mut dev, &[0], 3, &[1, 1], MergeMethod::Tree).is_err());
    let mut nine: Vec<CudaSlice<u32>> = (0..9).map(|_| s.clone_htod(&[1u32, 2, 3]).unwrap()).collect();
    let all: Vec<usize> = (0..9).collect();
    assert!(gpu.merge_runs(&mut nine, &all, 3, &[1, 2], MergeMethod::Tree).is_err());
    // A plan whose runs do not add up to the rows is refused, merged or not (no passes here).
    let mut table = DeviceTable {
        num_rows: 3,
        keys: vec![s.clone_htod(&[3u32, 1, 2]).unwrap()],
        columns: vec![],
        records: None,
    };
    let plan = GpuSortPlan {
        strategy: Strategy::SRTS_DIRECT,
        passes: vec![],
        keep_keys: true,
        want_perm: true,
        pack_gathers: false,
        switches: gpu.sort_switches(),
        sorted_runs: vec![1, 1],
    };
    let err = gpu.sort(&mut table, &plan).unwrap_err();
    assert!(err.to_string().contains("sorted runs"), "{err}");
}

/// The MSD sort with small block-local sorts and narrow partition digits: many partition
/// levels, batches of many segments, keys used up before the segments are small (equal keys),
/// finals in both buffers.
#[test]
fn engine_msd_partition_depths() {
    let Some(b) = backend() else { return };
    let gpu = b.gpu();
    let mut rng = SmallRng::seed_from_u64(16);
    for (local, max_bits) in [(1, 11), (3, 1), (40, 4), (700, 8), (3000, 11), (8192, 2)] {
        let switches = SortSwitches {
            msd_local_rows: local,
            msd_max_bits: max_bits,
            ..gpu.sort_switches()
        };
        for kind in ["random", "equal", "two", "low", "dups", "sorted"] {
            for &n in &[2usize, 100, 5_000, 60_000] {
                let words = 1 + n % 3;
                let c = case(&mut rng, n, words, kind, n == 5_000);
                for strategy in [Strategy::MSD_DIRECT, Strategy::MSD_INDIRECT] {
                    for bits in [3, 8] {
                        let what = format!(
                            "local {local} max {max_bits}: {kind} n {n} words {words} {strategy} {bits}-bit digits"
                        );
                        check_engine_with(gpu, &c, strategy, bits, switches, &what);
                    }
                }
            }
        }
    }
}

/// Sample sort's levels: buckets split again by splitters of their own (small blocks force
/// several levels), buckets of keys equal to a splitter ended early (equal, two-valued,
/// duplicated and zipf keys), keys of one to four words, ByField and Hybrid, direct and
/// indirect; the rows and the permutation against the stable reference.
#[test]
fn engine_sample_sort_levels() {
    let Some(b) = backend() else { return };
    let gpu = b.gpu();
    let mut rng = SmallRng::seed_from_u64(17);
    for local in [1, 40, 700, 8192] {
        let switches = SortSwitches {
            msd_local_rows: local,
            ..gpu.sort_switches()
        };
        for kind in ["random", "equal", "two", "low", "top", "dups", "skew"] {
            for &n in &[2usize, 100, 5_000, 60_003, 300_001] {
                if local == 1 && n > 5_000 {
                    continue;
                }
                let words = 1 + n % 4;
                let c = case(&mut rng, n, words, kind, n == 5_000);
                for strategy in [Strategy::SAMPLE_DIRECT, Strategy::SAMPLE_INDIRECT] {
                    let what = format!("local {local}: {kind} n {n} words {words} {strategy}");
                    check_engine_with(gpu, &c, strategy, 8, switches, &what);
                }
            }
        }
    }
    let keys: Vec<u64> = gpusort_testing::KeyDistribution::Zipf.keys(400_000, 3);
    let words = vec![
        keys.iter().map(|k| (k >> 32) as u32).collect::<Vec<u32>>(),
        keys.iter().map(|&k| k as u32).collect(),
    ];
    let c = case_with_columns(&mut rng, words, &[1, 2, 4, 8, 16]);
    for strategy in [Strategy::SAMPLE_DIRECT, Strategy::SAMPLE_INDIRECT] {
        check_engine(gpu, &c, strategy, 8, &format!("zipf 400000 {strategy}"));
    }
}

/// The kernels' shapes fit the device (or `GPUSORT_SMEM_CAP`): the static shared memory the
/// shape function estimates covers each loaded kernel's, and every strategy the shapes promise
/// gets the dynamic shared memory it needs at 8-byte staging (so it is really used), none more
/// than the block limit. Run under each cap by `STEPS=caps scripts/device-run.sh`.
#[test]
fn shapes_fit_the_device() {
    use gpusort_cuda::kernels::BLOCK;
    use gpusort_cuda::shapes::{
        MSD_LOCAL_STATIC_SMEM, SCATTER_STATIC_SMEM, msd_local_smem, msd_scatter_smem, onesweep_static_smem,
    };
    let Some(b) = backend() else { return };
    let gpu = b.gpu();
    let (shapes, info) = (gpu.shapes(), gpu.info());
    eprintln!("{}: {shapes}", info.name);
    assert_eq!(*shapes, Gpu::shapes_for(info, gpu.options()));
    assert!(shapes.limits.per_block <= info.smem_per_block && shapes.limits.per_sm <= info.smem_per_sm);
    if let Some(cap) = gpu.options().smem_cap {
        assert!(shapes.limits.per_block <= cap, "{shapes}");
    }
    let k = gpu.kernels().unwrap();
    let fixed = |f: &cudarc::driver::CudaFunction| f.shared_size_bytes().unwrap() as usize;
    for f in [&k.grs_scatter.b8, &k.srts_downsweep.b8] {
        assert!(
            fixed(f) <= SCATTER_STATIC_SMEM,
            "scatter static {} > {SCATTER_STATIC_SMEM}",
            fixed(f)
        );
    }
    let os = onesweep_static_smem(gpu.tuning().onesweep_block() as usize);
    assert!(
        fixed(&k.onesweep_pass) <= os,
        "one-sweep static {} > {os}",
        fixed(&k.onesweep_pass)
    );
    assert!(
        fixed(&k.msd_local) <= MSD_LOCAL_STATIC_SMEM,
        "msd_local static {}",
        fixed(&k.msd_local)
    );
    let per_block = shapes.limits.per_block as u32;
    let smem = k.smem;
    for (what, v, f) in [
        ("scatter", smem.scatter, &k.srts_downsweep.b8),
        ("one sweep", smem.onesweep, &k.onesweep_pass),
        ("msd scatter b8", smem.msd_scatter[0], &k.msd_scatter[0]),
        ("msd scatter b11", smem.msd_scatter[1], &k.msd_scatter[1]),
        ("msd local", smem.msd_local, &k.msd_local),
    ] {
        assert!(
            v + fixed(f) as u32 <= per_block,
            "{what}: {v} + {} > {per_block}",
            fixed(f)
        );
    }
    let tile = BLOCK as usize * shapes.ipt;
    assert_eq!(gpu.tile(), tile);
    assert!(tile * 12 <= smem.scatter as usize, "{shapes}: {smem:?}");
    if let Some(o) = shapes.onesweep {
        assert_eq!(gpu.onesweep_tile(), o.block as usize * o.ipt);
        assert!(gpu.onesweep_tile() * 12 <= smem.onesweep as usize, "{shapes}: {smem:?}");
    }
    assert!(msd_scatter_smem(false, tile, 8) <= smem.msd_scatter[0] as usize);
    if shapes.msd_wide {
        assert!(msd_scatter_smem(true, tile, 8) <= smem.msd_scatter[1] as usize);
    }
    for (i, stage) in [4, 8].into_iter().enumerate() {
        let w = shapes.msd_local_words[i];
        if w > 0 {
            assert!(
                msd_local_smem(w, stage) <= smem.msd_local as usize,
                "{shapes}: {smem:?}"
            );
        }
    }
}

/// Keys-only sorts (one and two key words, no payload, no permutation) of every strategy, at the
/// tile edges of both tile sizes and around whole rounds of the one-sweep grid, random and
/// adversarial keys.
#[test]
fn engine_keys_only() {
    let Some(b) = backend() else { return };
    let gpu = b.gpu();
    let mut rng = SmallRng::seed_from_u64(19);
    let (tile, os_tile, sms) = (gpu.tile(), gpu.onesweep_tile(), gpu.info().multiprocessors as usize);
    let mut sizes = vec![
        0,
        1,
        2,
        31,
        tile - 1,
        tile + 1,
        os_tile - 1,
        os_tile,
        os_tile + 1,
        100_003,
    ];
    sizes.extend([sms * 3 * os_tile - 1, sms * 3 * os_tile + 1]);
    let mut cases = 0;
    for &n in &sizes {
        for (words, kind) in [(1, "random"), (2, "random"), (1, "two"), (1, "equal"), (1, "reverse")] {
            let keys = keys_of(&mut rng, n, words, kind);
            for strategy in Strategy::ALL {
                for bits in [4, 8] {
                    let what = format!("keys only: n {n} words {words} {kind} {strategy} {bits}-bit digits");
                    check_engine_keys_only(gpu, &keys, strategy, bits, &what);
                    cases += 1;
                }
            }
        }
    }
    eprintln!("keys only: {cases} sorts equal to the host");
}

/// Rows of `keys` with ByField columns of the given widths.
fn case_with_columns(rng: &mut SmallRng, keys: Vec<Vec<u32>>, widths: &[usize]) -> Case {
    let n = keys.first().map_or(0, |w| w.len());
    let columns = widths.iter().map(|&w| (random_bytes(rng, n * w), w)).collect();
    Case {
        keys,
        columns,
        records: None,
    }
}

/// Plain 4-byte lanes side by side (u32 columns, the row index after the first pass, the key word
/// that is not the digit's) move in pairs through 8-byte staging: every strategy, with pairing on
/// and off, odd and even runs of u32 columns, a u32 run broken by other widths, 1 and 2 key words,
/// at tile edges of both tile sizes.
#[test]
fn engine_four_byte_lanes_in_pairs() {
    let Some(b) = backend() else { return };
    let gpu = b.gpu();
    let mut rng = SmallRng::seed_from_u64(23);
    let (tile, os_tile) = (gpu.tile(), gpu.onesweep_tile());
    let layouts: [&[usize]; 4] = [&[4, 4], &[4, 4, 4], &[4, 8, 4, 4, 2, 4, 4, 4, 4, 1], &[4]];
    for n in [1, tile - 1, tile + 1, os_tile + 1, 250_001] {
        for words in [1, 2] {
            for widths in layouts {
                let keys = keys_of(&mut rng, n, words, "random");
                let c = case_with_columns(&mut rng, keys, widths);
                for pair in [true, false] {
                    let switches = SortSwitches {
                        pair_lanes: pair,
                        ..gpu.sort_switches()
                    };
                    for strategy in Strategy::ALL {
                        let what = format!("pairs {pair}: n {n} words {words} widths {widths:?} {strategy}");
                        check_engine_with(gpu, &c, strategy, 8, switches, &what);
                    }
                }
            }
        }
    }
}

/// SRTS's one-sweep pass (digits of 5 to 8 bits) and its three-kernel pass (the same digits,
/// with one sweep turned off) against the host: sizes just under and over whole rounds of the
/// persistent grid (SMs x 2 to 4 blocks), where blocks take several tiles and the last tile is
/// partial; skewed digits (nearly every row in one bin: long look-backs over aggregates);
/// 5- and 6-bit digits (more than four digit positions of a word, masks that differ within one
/// histogram launch); 3-word keys; digits of 3 bits beside 8-bit ones (both kinds of pass in
/// one sort).
#[test]
fn engine_srts_one_sweep_and_three_kernels() {
    let Some(b) = backend() else { return };
    let gpu = b.gpu();
    let mut rng = SmallRng::seed_from_u64(17);
    // The one-sweep pass has a tile size of its own (GPUSORT_ONESWEEP_IPT); the three kernels'
    // tile gets its edge cases too.
    let (tile, sms) = (gpu.onesweep_tile(), gpu.info().multiprocessors as usize);
    let mut cases: Vec<(usize, usize, &str, u32)> = vec![];
    if gpu.tile() != tile {
        cases.extend([(gpu.tile() - 1, 1, "random", 8), (gpu.tile() + 1, 2, "random", 8)]);
    }
    for blocks in [2, 3, 4] {
        let round = sms * blocks * tile;
        cases.extend([
            (round - 1, 1, "random", 8),
            (round + 1, 1, "random", 8),
            (2 * round + 1, 2, "skew", 8),
        ]);
    }
    cases.extend([
        (300_001, 3, "random", 6),
        (300_001, 1, "random", 5),
        (100_000, 3, "random", 7),
        (200_000, 2, "skew", 8),
        (tile + 1, 2, "dups", 8),
    ]);
    for (n, words, kind, bits) in cases {
        let c = case(&mut rng, n, words, kind, n % 2 == 1 && words == 2);
        for onesweep in [true, false] {
            let switches = SortSwitches {
                onesweep,
                ..gpu.sort_switches()
            };
            for strategy in [Strategy::SRTS_DIRECT, Strategy::SRTS_INDIRECT] {
                let what = format!("one sweep {onesweep}: {kind} n {n} words {words} {strategy} {bits}-bit digits");
                check_engine_with(gpu, &c, strategy, bits, switches, &what);
            }
        }
    }
    // 8-bit digits of word 1 and one 3-bit digit of word 0 (its 3 random low bits): one-sweep
    // and three-kernel passes in one sort.
    let mut c = case(&mut rng, 70_001, 2, "random", false);
    for v in c.keys[0].iter_mut() {
        *v &= 7;
    }
    check_engine(gpu, &c, Strategy::SRTS_DIRECT, 8, "8-bit and 3-bit digits in one sort");
    check_engine(
        gpu,
        &c,
        Strategy::SRTS_INDIRECT,
        8,
        "8-bit and 3-bit digits in one sort",
    );
}

#[test]
fn engine_100m_rows() {
    let Some(b) = backend() else { return };
    let gpu = b.gpu();
    let mut rng = SmallRng::seed_from_u64(13);
    let n = 100_000_000;
    let c = Case {
        keys: keys_of(&mut rng, n, 1, "random"),
        columns: vec![(random_bytes(&mut rng, n * 4), 4)],
        records: None,
    };
    check_engine(gpu, &c, Strategy::SRTS_DIRECT, 8, "100M rows srts-direct");
    check_engine(gpu, &c, Strategy::GRS_INDIRECT, 8, "100M rows grs-indirect");
    check_engine(gpu, &c, Strategy::MSD_DIRECT, 8, "100M rows msd-direct");
    check_engine(gpu, &c, Strategy::MSD_INDIRECT, 8, "100M rows msd-indirect");
    check_engine(gpu, &c, Strategy::SAMPLE_DIRECT, 8, "100M rows samplesort-direct");
}

#[test]
fn backend_matches_reference_on_random_tables() {
    let Some(b) = backend() else { return };
    let (mut rng, seed) = rng_from_env(0x6c0de);
    let cpu = CpuBackend::new();
    let cases = std::env::var("GPUSORT_GPU_CASES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(400);
    for i in 0..cases {
        let n = if i % 3 == 0 {
            EDGE_SIZES[rng.random_range(0..EDGE_SIZES.len())]
        } else {
            rng.random_range(0..30_000)
        };
        let c = random_case(&mut rng, n);
        let strategy = Strategy::ALL[rng.random_range(0..Strategy::ALL.len())];
        let limit = rng.random_bool(0.2).then(|| rng.random_range(0..=n + 1));
        let max_prefix_bytes = [0, 2, 8][rng.random_range(0..3)];
        // Values whole up to some length, past the prefix (as GPU sorts take them).
        let whole_values_up_to = [0, 0, 4, 64][rng.random_range(0..4)];
        let request = SortRequest::new(&c.batch, &c.spec)
            .with_strategy(Some(strategy))
            .with_limit(limit)
            .with_encoder_options(EncoderOptions {
                max_prefix_bytes,
                whole_values_up_to,
            });
        let what = format!(
            "seed {seed} case {i}: {n} rows, {strategy}, limit {limit:?}, prefix {max_prefix_bytes}, whole {whole_values_up_to}"
        );
        let out = b.sort(&request).unwrap_or_else(|e| panic!("{what}: {e}"));
        assert_matches_reference(&c.batch, &c.spec, limit, &out, &what);
        let on_cpu = cpu.sort(&request).unwrap();
        assert_eq!(out.batch, on_cpu.batch, "{what}: GPU and CPU backends differ");
    }
}

#[test]
fn backend_large_batch_both_strategies() {
    let Some(b) = backend() else { return };
    let mut rng = SmallRng::seed_from_u64(14);
    let c = random_case(&mut rng, 2_000_000);
    for strategy in Strategy::ALL {
        let request = SortRequest::new(&c.batch, &c.spec).with_strategy(Some(strategy));
        let out = b.sort(&request).unwrap();
        assert_matches_reference(&c.batch, &c.spec, None, &out, &format!("2M rows {strategy}"));
        assert!(out.stats.bytes_to_device > 0 && out.stats.bytes_from_device > 0);
    }
}

/// One sort split by key ranges over several GPUs ([`MultiGpuBackend`]): over every GPU of
/// the machine, or two backends of GPU 0 where it has one (the split, the sorts at once and the
/// concatenation are the same). Random tables of every type, limits and strategies, against
/// the stable reference and the CPU backend.
#[test]
fn backend_split_over_gpus_matches_reference() {
    let Some(b) = backend() else { return };
    drop(b);
    let count = gpusort_cuda::device::device_count().unwrap();
    let ordinals: Vec<usize> = if count >= 2 { (0..count).collect() } else { vec![0, 0] };
    let gpus = ordinals
        .iter()
        .map(|&o| CudaBackend::try_new(o).map(Arc::new))
        .collect::<Result<Vec<_>, _>>()
        .unwrap();
    let ranges = gpus.len();
    let multi = MultiGpuBackend::try_new(gpus).unwrap().with_options(SplitOptions {
        sample_rows: 2048,
        min_rows_per_range: 500,
        seed: 11,
        pool_per_range: true,
    });
    let (mut rng, seed) = rng_from_env(0x5b117);
    let cpu = CpuBackend::new();
    for i in 0..60 {
        let n = [0, 1, 999, 1000, 4096, 30_000, 250_000][i % 7];
        let c = random_case(&mut rng, n);
        let strategy = Strategy::ALL[rng.random_range(0..Strategy::ALL.len())];
        let limit = rng.random_bool(0.2).then(|| rng.random_range(0..=n + 1));
        let request = SortRequest::new(&c.batch, &c.spec)
            .with_strategy(Some(strategy))
            .with_limit(limit);
        let what = format!("seed {seed} case {i}: {n} rows, {strategy}, limit {limit:?}, GPUs {ordinals:?}");
        let out = multi.sort(&request).unwrap_or_else(|e| panic!("{what}: {e}"));
        assert_matches_reference(&c.batch, &c.spec, limit, &out, &what);
        let on_cpu = cpu.sort(&request).unwrap();
        assert_eq!(out.batch, on_cpu.batch, "{what}: split GPUs and CPU differ");
        if limit.is_none() {
            assert_eq!(out.indices, on_cpu.indices, "{what}: permutations differ");
        }
        let expected = multi.options().ranges_for(n, ranges);
        let split = if expected > 1 { expected } else { 0 };
        assert_eq!(out.stats.split_ranges, split, "{what}");
    }
}

/// Uploads the columns of `spec`'s keys as a session holds them (values, validity bits when
/// there are nulls; views with their data buffers and the table of their device addresses),
/// encodes the key on the device with `opts`, and checks the layout, the words, the varying
/// bits and the value of the words that do not vary against the host encoder.
fn check_device_keys(gpu: &Gpu, batch: &RecordBatch, spec: &SortSpec, opts: &EncoderOptions, what: &str) {
    use arrow::array::AsArray;
    use cudarc::driver::DevicePtr;
    use gpusort::cpu::gather::{fixed_values, view_data_buffers};
    use gpusort::keys::{ColumnStats, KeyLayout, bytes_column_stats, native_ordinal_kind};
    use gpusort_cuda::encode::{DeviceKeyColumn, DeviceKeyKind};
    let n = batch.num_rows();
    let s = gpu.stream();
    let host = KeyEncoder::try_new(batch, spec, opts).unwrap();
    let expected = host.encode();
    struct Uploaded {
        values: CudaSlice<u8>,
        valid: Option<CudaSlice<u8>>,
        buffers: Vec<CudaSlice<u8>>,
        table: Option<CudaSlice<u64>>,
    }
    let uploaded: Vec<Uploaded> = spec
        .keys()
        .iter()
        .map(|k| {
            let col = batch.column(k.column);
            let is_view = matches!(col.data_type(), DataType::Utf8View | DataType::BinaryView);
            let values = if is_view {
                let views: &[u128] = match col.data_type() {
                    DataType::Utf8View => col.as_string_view().views(),
                    _ => col.as_binary_view().views(),
                };
                let bytes: Vec<u8> = views.iter().flat_map(|v| v.to_le_bytes()).collect();
                s.clone_htod(&pad(&bytes)).unwrap()
            } else {
                let width = col.data_type().primitive_width().unwrap();
                s.clone_htod(&pad(fixed_values(col.as_ref(), width).as_slice()))
                    .unwrap()
            };
            let valid = col
                .nulls()
                .filter(|nb| nb.null_count() > 0)
                .map(|nb| s.clone_htod(&pad(nb.inner().sliced().as_slice())).unwrap());
            let buffers: Vec<CudaSlice<u8>> = match is_view {
                true => view_data_buffers(col.as_ref())
                    .iter()
                    .map(|b| s.clone_htod(&pad(b.as_slice())).unwrap())
                    .collect(),
                false => vec![],
            };
            let table = is_view.then(|| {
                let mut addresses: Vec<u64> = buffers.iter().map(|b| b.device_ptr(s).0).collect();
                addresses.push(0);
                s.clone_htod(&addresses).unwrap()
            });
            Uploaded {
                values,
                valid,
                buffers,
                table,
            }
        })
        .collect();
    let columns: Vec<DeviceKeyColumn<'_>> = spec
        .keys()
        .iter()
        .zip(&uploaded)
        .map(|(k, u)| DeviceKeyColumn {
            values: &u.values,
            valid: u.valid.as_ref(),
            kind: match &u.table {
                Some(table) => DeviceKeyKind::Views(table),
                None => {
                    DeviceKeyKind::Ordinal(native_ordinal_kind(batch.schema().field(k.column).data_type()).unwrap())
                }
            },
        })
        .collect();
    let native: Vec<DeviceKeyColumn<'_>> = columns
        .iter()
        .filter(|c| matches!(c.kind, DeviceKeyKind::Ordinal(_)))
        .copied()
        .collect();
    let mut native_stats = gpu.native_key_stats(&native, n).unwrap().into_iter();
    let stats: Vec<ColumnStats> = spec
        .keys()
        .iter()
        .zip(&uploaded)
        .map(|(k, u)| match u.table {
            Some(_) => ColumnStats::Bytes(bytes_column_stats(&[batch.column(k.column).as_ref()]).unwrap()),
            None => ColumnStats::Native(native_stats.next().unwrap()),
        })
        .collect();
    let layout = KeyLayout::from_column_stats(spec, &stats, opts).unwrap();
    assert_eq!(&layout, host.layout(), "{what}: layout from the statistics");
    let encoded = gpu.encode_device_keys(&columns, &layout, n).unwrap();
    let varying = varying_bits(&expected.words);
    assert_eq!(encoded.varying, varying, "{what}: varying bits");
    for (w, (dev, want)) in encoded.words.iter().zip(&expected.words).enumerate() {
        let got = down(s, dev, n);
        if let Some(row) = (0..n).find(|&i| got[i] != want[i]) {
            panic!(
                "{what}: word {w} of row {row}: device {:#010x}, host {:#010x} (layout {layout:?})",
                got[row], want[row]
            );
        }
        if varying[w] == 0 && n > 0 {
            assert_eq!(encoded.common[w], want[0], "{what}: the value of constant word {w}");
        }
    }
    drop(uploaded.into_iter().map(|u| u.buffers).collect::<Vec<_>>());
}

/// String and binary view columns' keys encoded on the device equal the host encoder's, bit
/// for bit: values inline and out of line in several data buffers, sliced arrays, nulls first
/// and last, all null, all equal, empty values, long shared prefixes and embedded zero bytes,
/// both directions, prefixes of 0 to 32 bytes (cut values and whole ones), alone and between
/// native fields.
#[test]
fn device_key_encoding_of_views_matches_the_host_encoder() {
    use arrow::array::{BinaryViewBuilder, Int32Array, StringViewBuilder};
    use gpusort::keys::KeyLayout;
    use gpusort_cuda::encode::KEY_MAX_WORDS;
    let Some(b) = backend() else { return };
    let gpu = b.gpu();
    let mut rng = SmallRng::seed_from_u64(23);
    let long = "https://example.com/a/very/long/shared/path/of/sixty/bytes/";
    let value = |rng: &mut SmallRng, kind: usize| -> Option<String> {
        let i: u32 = rng.random_range(0..1000);
        match kind {
            0 => None,
            1 => Some(String::new()),
            2 => Some(format!("{long}{i}")),
            3 => Some(format!("{long}{}", i % 7)),
            4 => Some(format!("s{i}")),
            5 => Some(format!("ab\0{i}\0")),
            6 => Some("same value".into()),
            _ => Some(format!("{:x}", rng.random::<u64>())),
        }
    };
    let mut cases = 0;
    for n in [1, 2, 100, gpu.tile() + 1, 2 * gpu.tile() + 77] {
        for mix in 0..6 {
            let kinds: &[usize] = match mix {
                0 => &[0, 1, 2, 3, 4, 5, 6, 7],
                1 => &[2, 3],
                2 => &[6],
                3 => &[0],
                4 => &[1, 4, 7],
                _ => &[0, 5, 6],
            };
            let strings: Vec<Option<String>> = (0..n + 3)
                .map(|_| {
                    let k = kinds[rng.random_range(0..kinds.len())];
                    value(&mut rng, k)
                })
                .collect();
            // Small blocks: the out-of-line values spread over several data buffers.
            let mut sb = StringViewBuilder::new().with_fixed_block_size(256);
            let mut bb = BinaryViewBuilder::new().with_fixed_block_size(512);
            for v in &strings {
                sb.append_option(v.as_deref());
                bb.append_option(v.as_deref().map(str::as_bytes));
            }
            // Sliced: views of a slice keep their buffers and offsets.
            let sv: ArrayRef = Arc::new(sb.finish().slice(2, n));
            let bv: ArrayRef = Arc::new(bb.finish().slice(1, n));
            let ints: ArrayRef = Arc::new(Int32Array::from_iter(
                (0..n).map(|_| rng.random_bool(0.9).then(|| rng.random_range(0..5))),
            ));
            let batch = RecordBatch::try_new(
                Arc::new(Schema::new(vec![
                    Field::new("s", DataType::Utf8View, true),
                    Field::new("b", DataType::BinaryView, true),
                    Field::new("i", DataType::Int32, true),
                ])),
                vec![sv, bv, ints],
            )
            .unwrap();
            for max_prefix_bytes in [0, 3, 8, 32] {
                let opts = EncoderOptions {
                    max_prefix_bytes,
                    ..Default::default()
                };
                for mask in 0..4u32 {
                    let (desc, nulls_first) = (mask & 1 == 1, mask & 2 == 2);
                    let what =
                        format!("n={n} mix {mix} prefix {max_prefix_bytes} desc={desc} nulls_first={nulls_first}");
                    let alone = SortSpec::new([SortKey::new(0, desc, nulls_first)]);
                    check_device_keys(gpu, &batch, &alone, &opts, &format!("{what}, string alone"));
                    let binary = SortSpec::new([SortKey::new(1, desc, nulls_first)]);
                    check_device_keys(gpu, &batch, &binary, &opts, &format!("{what}, binary alone"));
                    let three = SortSpec::new([
                        SortKey::new(2, !desc, nulls_first),
                        SortKey::new(0, desc, nulls_first),
                        SortKey::new(1, desc, !nulls_first),
                    ]);
                    if KeyLayout::device_max_words(&three, batch.schema().as_ref(), &opts).unwrap() <= KEY_MAX_WORDS {
                        check_device_keys(gpu, &batch, &three, &opts, &format!("{what}, int string binary"));
                        cases += 1;
                    }
                    cases += 2;
                }
            }
        }
    }
    eprintln!("device key encoding of views: {cases} cases equal to the host encoder");
}

/// Keys of native columns encoded on the device equal the host encoder's, bit for bit: every
/// native type, extremes, NaN and signed zeros, nulls first and last, all-null and constant
/// columns, both directions, several fields straddling words, 0 to 2 tiles of rows.
#[test]
fn device_key_encoding_matches_the_host_encoder() {
    use gpusort_testing::{ColumnShape, random_array};
    let Some(b) = backend() else { return };
    let gpu = b.gpu();
    let mut rng = SmallRng::seed_from_u64(16);
    let types: Vec<DataType> = gpusort_testing::sortable_types()
        .into_iter()
        .filter(|t| gpusort::keys::native_ordinal_kind(t).is_some())
        .collect();
    assert!(types.len() >= 20, "native types to test: {types:?}");
    let shapes = [
        ColumnShape {
            null_fraction: 0.0,
            distinct: None,
        },
        ColumnShape {
            null_fraction: 0.3,
            distinct: None,
        },
        ColumnShape {
            null_fraction: 0.2,
            distinct: Some(3),
        },
        ColumnShape {
            null_fraction: 1.0,
            distinct: None,
        },
        ColumnShape {
            null_fraction: 0.0,
            distinct: Some(1),
        },
    ];
    let mut cases = 0;
    for n in [0, 1, 2, 100, gpu.tile() + 1, 2 * gpu.tile() + 77] {
        for t in &types {
            for shape in shapes {
                let col = random_array(&mut rng, t, n, shape);
                let (t1, t2) = (rng.random_range(0..types.len()), rng.random_range(0..types.len()));
                let other = random_array(&mut rng, &types[t1], n, shapes[1]);
                let third = random_array(&mut rng, &types[t2], n, shapes[0]);
                let batch = RecordBatch::try_new(
                    std::sync::Arc::new(Schema::new(vec![
                        Field::new("a", col.data_type().clone(), true),
                        Field::new("b", other.data_type().clone(), true),
                        Field::new("c", third.data_type().clone(), true),
                    ])),
                    vec![col, other, third],
                )
                .unwrap();
                let desc = rng.random_bool(0.5);
                let nulls_first = rng.random_bool(0.5);
                let alone = SortSpec::new([SortKey::new(0, desc, nulls_first)]);
                let opts = EncoderOptions::default();
                check_device_keys(gpu, &batch, &alone, &opts, &format!("{t} n={n} {shape:?} desc={desc}"));
                let three = SortSpec::new([
                    SortKey::new(1, rng.random_bool(0.5), rng.random_bool(0.5)),
                    SortKey::new(0, desc, nulls_first),
                    SortKey::new(2, rng.random_bool(0.5), rng.random_bool(0.5)),
                ]);
                check_device_keys(gpu, &batch, &three, &opts, &format!("{t} n={n} {shape:?} three fields"));
                cases += 2;
            }
        }
    }
    eprintln!("device key encoding: {cases} cases equal to the host encoder");
}

/// Every kernel once on small inputs: run under `compute-sanitizer --tool memcheck` and
/// `--tool racecheck`.
#[test]
fn sanitize_every_kernel() {
    let Some(b) = backend() else { return };
    let gpu = b.gpu();
    let mut rng = SmallRng::seed_from_u64(15);
    let n = 2 * gpu.tile() + 77;
    for hybrid in [false, true] {
        let c = case(&mut rng, n, 2, "random", hybrid);
        for strategy in Strategy::ALL {
            for bits in [4, 8] {
                check_engine(
                    gpu,
                    &c,
                    strategy,
                    bits,
                    &format!("sanitize {strategy} {bits} hybrid {hybrid}"),
                );
            }
        }
    }
    // u32 columns in pairs (stage_lane_pair).
    let keys = keys_of(&mut rng, n, 2, "random");
    let c = case_with_columns(&mut rng, keys, &[4, 4, 4, 8, 4, 4]);
    for strategy in Strategy::ALL {
        check_engine(gpu, &c, strategy, 8, &format!("sanitize u32 pairs {strategy}"));
    }
    // Keys only: the scatter's keys-only path (one key word, direct) in every strategy.
    let keys = keys_of(&mut rng, n, 1, "random");
    for strategy in Strategy::ALL {
        check_engine_keys_only(gpu, &keys, strategy, 8, &format!("sanitize keys only {strategy}"));
    }
    // Presorted input (presorted.cu): the order scan, rows reversed in place (odd and even
    // counts, ByField columns of every width and Hybrid records), the reversed permutation, and
    // three runs the scan finds, merged (merge.cu).
    for (kind, rows, hybrid) in [
        ("sorted", n, false),
        ("reverse", n, false),
        ("reverse", n + 1, true),
        ("reverse_ties", n, true),
        ("reverse_ties", n + 1, false),
        ("runs", n, false),
    ] {
        let c = case(&mut rng, rows, 2, kind, hybrid);
        check_engine(gpu, &c, Strategy::SRTS_INDIRECT, 8, &format!("sanitize {kind} {rows}"));
    }
    // Few distinct keys (distinct_sample, distinct_ranks), direct and indirect, and a key the
    // sample misses (the check stops every thread).
    let low = SortSwitches {
        few_distinct: Some(2),
        ..gpu.sort_switches()
    };
    let mut c = case(&mut rng, n, 2, "low", true);
    c.keys[1].fill(0);
    check_engine_with(gpu, &c, Strategy::SRTS_DIRECT, 8, low, "sanitize few distinct");
    check_engine_with(gpu, &c, Strategy::MSD_INDIRECT, 8, low, "sanitize few distinct");
    c.keys[1][1] = 1 << 30;
    check_engine_with(
        gpu,
        &c,
        Strategy::SRTS_DIRECT,
        8,
        low,
        "sanitize a key the sample misses",
    );
    // An even row count: the indirect gathers go through packed rows (pack_rows, gather_unpack).
    let c = case(&mut rng, n + 1, 2, "random", false);
    check_engine(gpu, &c, Strategy::GRS_INDIRECT, 8, "sanitize packed gathers");
    // SRTS's 8-bit passes as the three kernels (with one sweep, above, they run onesweep.cu).
    let three = SortSwitches {
        onesweep: false,
        ..gpu.sort_switches()
    };
    check_engine_with(gpu, &c, Strategy::SRTS_DIRECT, 8, three, "sanitize srts three kernels");
    // MSD with three partition depths and multi-segment batches.
    let deep = SortSwitches {
        msd_local_rows: 50,
        msd_max_bits: 3,
        ..gpu.sort_switches()
    };
    let c = case(&mut rng, 3000, 2, "dups", false);
    for strategy in [Strategy::MSD_DIRECT, Strategy::MSD_INDIRECT] {
        check_engine_with(gpu, &c, strategy, 8, deep, &format!("sanitize {strategy} deep"));
    }
    // Sample sort over two levels, with buckets of equal keys, and a key of four words.
    let c = case(&mut rng, 20_000, 2, "dups", false);
    let c4 = case(&mut rng, 20_000, 4, "random", true);
    for strategy in [Strategy::SAMPLE_DIRECT, Strategy::SAMPLE_INDIRECT] {
        check_engine_with(gpu, &c, strategy, 8, deep, &format!("sanitize {strategy} two levels"));
        check_engine_with(gpu, &c4, strategy, 8, deep, &format!("sanitize {strategy} four words"));
    }
    // Validity packing and unpacking, bitmap gathers: through the backend.
    let n = 5000;
    let v: ArrayRef = std::sync::Arc::new(UInt32Array::from_iter(
        (0..n).map(|i| (i % 3 != 0).then_some(i * 7 % 1000)),
    ));
    let k: ArrayRef = std::sync::Arc::new(UInt32Array::from_iter_values((0..n).map(|i| i * 2654435761 % 977)));
    let batch = RecordBatch::try_new(
        std::sync::Arc::new(Schema::new(vec![
            Field::new("k", DataType::UInt32, false),
            Field::new("v", DataType::UInt32, true),
        ])),
        vec![k, v],
    )
    .unwrap();
    let spec = SortSpec::new([SortKey::sql(0, false)]);
    for strategy in Strategy::ALL {
        let out = b
            .sort(&SortRequest::new(&batch, &spec).with_strategy(Some(strategy)))
            .unwrap();
        assert_matches_reference(&batch, &spec, None, &out, &format!("sanitize validity {strategy}"));
    }
    // Sorted runs merged (merge.cu): tiles cut inside runs, a run left over, both schedules.
    // Odd-even: runs of one length but a shorter first and last.
    let runs = [3, 0, 2 * MERGE_TILE + 1, 2 * MERGE_TILE + 1, 1];
    let mut c = case(&mut rng, runs.iter().sum(), 2, "random", false);
    sort_runs(&mut c.keys, &runs);
    for method in [MergeMethod::Tree, MergeMethod::OddEven] {
        let switches = SortSwitches {
            merge: Some(method),
            ..gpu.sort_switches()
        };
        let what = format!("sanitize merge {}", method.name());
        let (_, merged) = check_engine_runs(gpu, &c, Strategy::SRTS_DIRECT, 8, switches, &runs, &what);
        assert_eq!(merged, 4, "{what}");
    }
    // Keys encoded on the device (key_bounds, encode_keys): a nullable field and a plain one;
    // then a view column with values inline and in several data buffers, nulls, cut at 8 bytes.
    check_device_keys(
        gpu,
        &batch,
        &SortSpec::new([SortKey::new(1, true, true), SortKey::new(0, false, false)]),
        &EncoderOptions::default(),
        "sanitize device keys",
    );
    let mut views = arrow::array::StringViewBuilder::new().with_fixed_block_size(128);
    for i in 0..n {
        views.append_option((i % 5 != 0).then(|| format!("{}{}", "x".repeat(i as usize % 23), i)));
    }
    let views = RecordBatch::try_new(
        Arc::new(Schema::new(vec![Field::new("s", DataType::Utf8View, true)])),
        vec![Arc::new(views.finish())],
    )
    .unwrap();
    check_device_keys(
        gpu,
        &views,
        &SortSpec::new([SortKey::new(0, true, false)]),
        &EncoderOptions::default(),
        "sanitize device keys of views",
    );
}

/// Strings for the tie tests: `shape` says how their bytes past a short prefix tie.
fn tie_strings(rng: &mut SmallRng, n: usize, shape: &str) -> Vec<Option<Vec<u8>>> {
    let word =
        |rng: &mut SmallRng, len: usize| -> Vec<u8> { (0..len).map(|_| b"abc"[rng.random_range(0..3)]).collect() };
    (0..n)
        .map(|i| {
            let v = match shape {
                // 300 equal bytes after the first: more rounds than the device takes, in a group
                // larger than a batch ('a') and in batches ('b', 'c'). A tenth of the rows
                // differ right after the second byte, so that a 2-byte prefix's groups share
                // nothing past it (the rounds run out, the host finishes), while an 8-byte
                // prefix's groups share 293 more bytes (skipped, one round).
                "equal" => {
                    let first = if rng.random_bool(0.8) {
                        b'a'
                    } else {
                        b"bc"[rng.random_range(0..2)]
                    };
                    if rng.random_bool(0.1) {
                        [vec![first, b'q', b'r'], word(rng, 4)].concat()
                    } else {
                        [vec![first], vec![b'q'; 300], word(rng, 1)].concat()
                    }
                }
                // 60 shared bytes, then a few letters of three: long runs, many rounds.
                "url" => {
                    let len = rng.random_range(0..12);
                    [
                        b"https://example.com/a/very/long/path/that/everyone/shares/".as_slice(),
                        &word(rng, len),
                    ]
                    .concat()
                }
                // Zero bytes: "ab\0" after "ab", the padding must not make them equal.
                "zeros" => {
                    let mut v = b"prefix00".to_vec();
                    v.extend((0..rng.random_range(0..6)).map(|_| [0u8, 1, b'a'][rng.random_range(0..3)]));
                    v
                }
                // Inline views (at most 12 bytes) beside out-of-line ones.
                "short" => {
                    let len = rng.random_range(0..16);
                    word(rng, len)
                }
                // Many small groups of the 8-byte prefix: comment-like words.
                "words" => {
                    let words = [
                        "carefully ",
                        "furiously ",
                        "quickly ",
                        "slyly ",
                        "ironic ",
                        "final ",
                        "pending ",
                    ];
                    (0..rng.random_range(1..6))
                        .flat_map(|_| words[rng.random_range(0..words.len())].bytes())
                        .collect()
                }
                // A few values of 1 MB that differ at their end.
                "huge" if i < 4 => [vec![b'h'; 1 << 20], word(rng, 2)].concat(),
                "huge" => word(rng, 20),
                _ => unreachable!("{shape}"),
            };
            (i % 17 != 5).then_some(v)
        })
        .collect()
}

/// The values as an array of `data_type` (strings are made of the values' bytes, all ASCII).
fn tie_array(values: &[Option<Vec<u8>>], data_type: &DataType) -> ArrayRef {
    use arrow::array::{BinaryArray, BinaryViewArray, FixedSizeBinaryArray, LargeBinaryArray};
    use arrow::array::{LargeStringArray, StringArray, StringViewArray};
    use std::sync::Arc;
    let strs: Vec<Option<&str>> = values
        .iter()
        .map(|v| v.as_deref().map(|b| std::str::from_utf8(b).unwrap()))
        .collect();
    let bytes: Vec<Option<&[u8]>> = values.iter().map(|v| v.as_deref()).collect();
    match data_type {
        DataType::Utf8 => Arc::new(StringArray::from(strs)),
        DataType::LargeUtf8 => Arc::new(LargeStringArray::from(strs)),
        DataType::Utf8View => Arc::new(StringViewArray::from(strs)),
        DataType::Binary => Arc::new(BinaryArray::from(bytes)),
        DataType::LargeBinary => Arc::new(LargeBinaryArray::from(bytes)),
        DataType::BinaryView => Arc::new(BinaryViewArray::from(bytes)),
        DataType::FixedSizeBinary(w) => {
            let fixed: Vec<Option<Vec<u8>>> = values
                .iter()
                .map(|v| {
                    v.as_ref()
                        .map(|b| (0..*w as usize).map(|i| b.get(i).copied().unwrap_or(b'.')).collect())
                })
                .collect();
            Arc::new(FixedSizeBinaryArray::try_from_sparse_iter_with_size(fixed.into_iter(), *w).unwrap())
        }
        other => unreachable!("{other}"),
    }
}

/// Rows tied on a truncated string or binary prefix, with every later field exact, are ordered
/// on the device (`ties.rs`): every byte layout, both directions and null placements, groups
/// small and larger than a batch, shared prefixes of 60 bytes, zero bytes, inline views, 1 MB
/// values and values equal for longer than the device's rounds (finished on the host); the
/// result equals the stable reference and the CPU backend's, and the device says it ordered
/// the groups.
#[test]
fn backend_orders_tied_string_prefixes_on_the_device() {
    let Some(shared) = backend() else { return };
    // Every group on the device, however few rows it holds (`DeviceTies::Auto` leaves groups of
    // a few rows to the host).
    let options = GpuOptions {
        device_ties: DeviceTies::Always,
        ..shared.gpu().options().clone()
    };
    drop(shared);
    let b = CudaBackend::with_options(0, &KernelCache::from_env(), options).unwrap();
    let cpu = CpuBackend::new();
    let mut rng = SmallRng::seed_from_u64(23);
    // Under the sanitizers: one direction, one spec and one prefix of each shape and type.
    let take = |all: usize| {
        if std::env::var("GPUSORT_TIES_QUICK").as_deref() == Ok("1") {
            1
        } else {
            all
        }
    };
    let types = [
        DataType::Utf8,
        DataType::LargeUtf8,
        DataType::Utf8View,
        DataType::Binary,
        DataType::LargeBinary,
        DataType::BinaryView,
        DataType::FixedSizeBinary(24),
    ];
    for (s, shape) in ["words", "url", "zeros", "short", "equal", "huge"]
        .into_iter()
        .enumerate()
    {
        // Groups larger than a batch (TIES_CAP rows) where there are few distinct prefixes.
        let n = match shape {
            "huge" => 3_000,
            "equal" => 20_000,
            _ => [1_000, 20_000, 70_000][s % 3],
        };
        let values = tie_strings(&mut rng, n, shape);
        for (t, data_type) in types.iter().enumerate() {
            // Fixed-width values cut to 24 bytes: the shapes that still tie there.
            if matches!(data_type, DataType::FixedSizeBinary(_)) && !["words", "zeros", "short"].contains(&shape) {
                continue;
            }
            let strings = tie_array(&values, data_type);
            let few: ArrayRef =
                std::sync::Arc::new(arrow::array::Int32Array::from_iter_values((0..n as i32).map(|i| i % 3)));
            let ids: ArrayRef = std::sync::Arc::new(arrow::array::Int64Array::from_iter_values(
                (0..n as i64).map(|i| (i * 7919) % 1000),
            ));
            let schema = Schema::new(vec![
                Field::new("few", DataType::Int32, false),
                Field::new("s", data_type.clone(), true),
                Field::new("id", DataType::Int64, false),
            ]);
            let batch = RecordBatch::try_new(schema.into(), vec![few, strings, ids]).unwrap();
            for (descending, nulls_first) in [(false, false), (true, true), (true, false)].into_iter().take(take(3)) {
                for spec in [
                    SortSpec::new([SortKey::new(1, descending, nulls_first), SortKey::sql(2, false)]),
                    SortSpec::new([
                        SortKey::sql(0, false),
                        SortKey::new(1, descending, nulls_first),
                        SortKey::sql(2, true),
                    ]),
                ]
                .into_iter()
                .take(take(2))
                {
                    for max_prefix_bytes in [2, 8].into_iter().take(take(2)) {
                        let request = SortRequest::new(&batch, &spec)
                            .with_strategy(Some([Strategy::SRTS_DIRECT, Strategy::SRTS_INDIRECT][t % 2]))
                            .with_encoder_options(EncoderOptions {
                                max_prefix_bytes,
                                ..Default::default()
                            });
                        let what = format!(
                            "{shape} {data_type} desc {descending} nulls first {nulls_first} {spec:?} prefix {max_prefix_bytes}"
                        );
                        let out = b.sort(&request).unwrap_or_else(|e| panic!("{what}: {e}"));
                        assert_matches_reference(&batch, &spec, None, &out, &what);
                        // Two bytes past the common prefix tie in every shape.
                        assert!(
                            out.stats.tie_groups > 0 || max_prefix_bytes > 2,
                            "{what}: no tie groups"
                        );
                        assert_eq!(
                            out.stats.device_tie_groups, out.stats.tie_groups,
                            "{what}: groups ordered on the host"
                        );
                        let on_cpu = cpu.sort(&request).unwrap();
                        assert_eq!(out.batch, on_cpu.batch, "{what}: GPU and CPU backends differ");
                    }
                }
            }
        }
    }
}
