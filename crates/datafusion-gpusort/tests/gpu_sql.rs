//! GpuSortExec on the GPU, run on a machine with an NVIDIA GPU:
//!
//! ```text
//! GPUSORT_REQUIRE_GPU=1 cargo test -p datafusion-gpusort --test gpu_sql -- --test-threads=1
//! ```
//!
//! With `GPUSORT_REQUIRE_GPU=1` and no usable GPU every test fails; without it, on a machine
//! with no GPU, each test prints that it did not run and why. Every sort here runs on the GPU
//! (`gpusort.min_rows = 0`, `gpusort.device = 0`), and the tests check that it did.

use datafusion::prelude::SessionContext;

#[path = "support/tables.rs"]
mod tables;
use tables::{compare_with_stock, context, context_with_memory_limit, rows};

#[path = "support/sql_fuzz.rs"]
mod sql_fuzz;

#[path = "support/external.rs"]
mod external;

#[path = "support/sorted.rs"]
mod sorted;

#[path = "support/device_scan.rs"]
mod device_scan;
use device_scan::{
    DEVICE_SCAN_ORDERS, check_device_scan, check_device_scan_of, sort_metric, t_as_parquet, t_as_row_groups,
};

mod common;
use common::differential::suite_differential;
use common::gpu_present;
use common::scan_marks::fallback_reasons;
use common::slt::{SORT_SLT_FILES, run_slt_suite, with_options};

/// gpusort on GPU 0 for every sort, whatever its size.
const ON_GPU: &[(&str, &str)] = &[("gpusort.min_rows", "0"), ("gpusort.device", "0")];

async fn set(ctx: &SessionContext, settings: &[(&str, &str)]) {
    for (k, v) in settings {
        ctx.sql(&format!("SET gpusort.{k} = '{v}'")).await.unwrap();
    }
}

async fn analyze(ctx: &SessionContext, sql: &str) -> String {
    rows(ctx, &format!("EXPLAIN ANALYZE {sql}")).await.0
}

#[tokio::test]
async fn gpu_order_by_matches_stock_datafusion_for_every_strategy() {
    if !gpu_present() {
        return;
    }
    let strategies = std::iter::once("auto".to_string()).chain(gpusort::Strategy::ALL.iter().map(|s| s.to_string()));
    for strategy in strategies {
        let strategy = strategy.as_str();
        let sizes: &[(usize, usize)] = if strategy == "auto" {
            &[(1, 1), (1000, 1), (50_000, 3), (300_000, 4)]
        } else {
            &[(1, 1), (1000, 1), (50_000, 3)]
        };
        for &(rows_n, partitions) in sizes {
            let stock = context(false, rows_n, partitions);
            let ours = context(true, rows_n, partitions);
            set(&ours, &[("min_rows", "0"), ("device", "0"), ("strategy", strategy)]).await;
            compare_with_stock(&stock, &ours, &format!("{strategy}, {rows_n} rows")).await;
            let text = analyze(&ours, "SELECT * FROM t ORDER BY b, a, c").await;
            assert!(
                text.contains("gpu_sorts=1") && !text.contains("cpu_fallback=GPU"),
                "{text}"
            );
            if strategy != "auto" {
                // Keys with string prefixes sort indirectly whatever the strategy asked for.
                let text = analyze(&ours, "SELECT * FROM t ORDER BY a, c").await;
                assert!(text.contains(&format!("path=gpu cuda:0 {strategy}")), "{text}");
            }
        }
    }
}

/// A direct sort over a string key runs indirectly where the key's values are longer than its
/// key holds whole (48 bytes; past that the device's 32-byte prefixes tie, ordered by the
/// permutation), and the plan names both; with strings of up to 48 bytes it stays direct.
#[tokio::test]
async fn gpu_direct_sorts_of_long_strings_run_indirect_as_the_plan_says() {
    if !gpu_present() {
        return;
    }
    let ours = context(true, 20_000, 2);
    set(
        &ours,
        &[("min_rows", "0"), ("device", "0"), ("strategy", "srts-direct")],
    )
    .await;
    let tables = [
        (
            "long",
            "CAST(a AS VARCHAR) || repeat('y', 60) || CAST(c AS VARCHAR)",
            "srts-indirect",
        ),
        (
            "whole",
            "CAST(a AS VARCHAR) || repeat('y', 30) || CAST(c AS VARCHAR)",
            "srts-direct",
        ),
        ("short", "CAST(a AS VARCHAR)", "srts-direct"),
    ];
    for (name, s, runs) in tables {
        let create = format!("CREATE TABLE {name} AS SELECT {s} AS s, a, c FROM t");
        ours.sql(&create).await.unwrap().collect().await.unwrap();
        let text = analyze(&ours, &format!("SELECT * FROM {name} ORDER BY s DESC, a")).await;
        assert!(
            text.contains(
                "strategy=srts-direct; srts-indirect where a key's values are longer than its key holds whole (up to 48 bytes)"
            ),
            "{name}: {text}"
        );
        assert!(text.contains(&format!("path=gpu cuda:0 {runs}")), "{name}: {text}");
    }
}

/// `gpusort.devices = all`: on a machine of several GPUs each sort of enough rows splits over
/// them by key ranges (the plan's path names them all); on one GPU it runs there. Either way
/// the rows equal stock DataFusion's.
#[tokio::test]
async fn gpu_devices_all_splits_over_the_gpus() {
    if !gpu_present() {
        return;
    }
    let gpus = gpusort_cuda::device::device_count().unwrap();
    let stock = context(false, 60_000, 3);
    let ours = context(true, 60_000, 3);
    set(
        &ours,
        &[
            ("min_rows", "0"),
            ("device", "0"),
            ("devices", "all"),
            ("split_min_rows", "5000"),
        ],
    )
    .await;
    compare_with_stock(&stock, &ours, &format!("devices = all, {gpus} GPUs")).await;
    let text = analyze(&ours, "SELECT * FROM t ORDER BY c DESC, a").await;
    let names: Vec<String> = (0..gpus).map(|g| g.to_string()).collect();
    let path = format!("path=gpu cuda:{} ", names.join("+"));
    assert!(text.contains(&path) && text.contains("gpu_sorts=1"), "{path}: {text}");
}

#[tokio::test]
async fn gpu_out_of_memory_falls_back_to_the_cpu() {
    if !gpu_present() {
        return;
    }
    let stock = context(false, 100_000, 2);
    let ours = context(true, 100_000, 2);
    set(
        &ours,
        &[("min_rows", "0"), ("device", "0"), ("gpu_memory_limit", "64K")],
    )
    .await;
    compare_with_stock(&stock, &ours, "64K GPU budget").await;
    let text = analyze(&ours, "SELECT * FROM t ORDER BY a, b, c").await;
    assert!(text.contains("cpu_fallback=GPU failed: the sort needs"), "{text}");
    assert!(text.contains("cpu_sorts=1") && text.contains("gpu_sorts=0"), "{text}");
}

/// A GPU budget that holds fewer rows than a run takes (`MIN_GPU_RUN_ROWS`) does not cut the
/// input into runs of what it holds: one sort, on the CPU after the GPU refused it. With runs
/// of the one row 64K held, each 100-row batch was a run and this did not finish in 240 s.
#[tokio::test]
async fn gpu_budget_too_small_for_a_run_sorts_once_on_the_cpu() {
    if !gpu_present() {
        return;
    }
    let stock = context(false, 300_000, 1);
    for budget in ["64K", "2M"] {
        let ours = context(true, 300_000, 1);
        set(
            &ours,
            &[("min_rows", "0"), ("device", "0"), ("gpu_memory_limit", budget)],
        )
        .await;
        compare_with_stock(&stock, &ours, &format!("{budget} GPU budget, one partition")).await;
        let text = analyze(&ours, "SELECT * FROM t ORDER BY c DESC, a").await;
        let count = |name: &str| {
            let after = text.split(&format!("{name}=")).nth(1)?;
            after.split(|c: char| !c.is_ascii_digit()).next()?.parse::<usize>().ok()
        };
        assert_eq!(
            (count("cpu_sorts"), count("gpu_sorts")),
            (Some(1), Some(0)),
            "{budget}: {text}"
        );
    }
}

/// `gpusort.release_uploaded_input`: the host keeps only the columns the sort reads there, from
/// the first batch (`min_rows` 0) or once `min_rows` rows came; the rows equal stock
/// DataFusion's. A failure after the release is the unit test
/// `rows_released_to_a_failed_gpu_fail_the_sort_instead_of_sorting_hollow_on_the_cpu`.
#[tokio::test]
async fn gpu_released_input_matches_stock() {
    if !gpu_present() {
        return;
    }
    // One partition: one sort of every row, past `min_rows` part way through.
    let stock = context(false, 300_000, 1);
    // A budget that holds no run (64K): nothing is released, the CPU sorts.
    let cases = [("0", "0", "true"), ("200000", "0", "true"), ("0", "64K", "true")];
    for (min_rows, budget, release) in cases {
        let start = std::time::Instant::now();
        eprintln!("released input: min_rows {min_rows}, budget {budget}, release {release}");
        let ours = context(true, 300_000, 1);
        let settings = [
            ("min_rows", min_rows),
            ("device", "0"),
            ("gpu_memory_limit", budget),
            ("release_uploaded_input", release),
        ];
        set(&ours, &settings).await;
        compare_with_stock(&stock, &ours, &format!("released input, {settings:?}")).await;
        if budget == "0" {
            let text = analyze(&ours, "SELECT * FROM t ORDER BY c DESC, a").await;
            assert!(
                text.contains("gpu_sorts=1") && text.contains("cpu_fallback=none"),
                "{text}"
            );
        }
        eprintln!("  {:.1} s", start.elapsed().as_secs_f64());
    }
}

#[tokio::test]
async fn gpu_metrics_count_bytes_and_kernel_time() {
    if !gpu_present() {
        return;
    }
    let ours = context(true, 200_000, 4);
    set(&ours, &[("min_rows", "0"), ("device", "0")]).await;
    let text = analyze(&ours, "SELECT * FROM t ORDER BY c DESC, a").await;
    assert!(text.contains("GpuSortExec") && text.contains("gpu_sorts=1"), "{text}");
    assert!(
        !text.contains("bytes_to_device=0,") && !text.contains("bytes_from_device=0,"),
        "{text}"
    );
    assert!(text.contains("gpu_kernel_time="), "{text}");
}

/// DataFusion's own sort `.slt` files with every sort on the GPU (but the small `LIMIT`s that stay
/// DataFusion's TopK, `gpusort.topk_max_fetch`).
#[tokio::test(flavor = "multi_thread")]
async fn gpu_datafusion_sort_slt_files_pass() {
    if !gpu_present() {
        return;
    }
    let report = run_slt_suite(
        |b| with_options(datafusion_gpusort::register(b), ON_GPU),
        SORT_SLT_FILES,
    )
    .await;
    report.assert_all_passed();
}

/// DataFusion's whole slt suite with every sort on the GPU and `gpusort.device_scan` on
/// (`common::differential`): every record that passes on stock DataFusion passes (but the
/// expected differences), and the sorts of whole Parquet scans were told their files (the
/// count is the process's: run with `--test-threads=1`); with nvCOMP, some read on the GPU.
/// On DataFusion 55.2's suite (H200, stop 52) 22 such scans read on the GPU (zstd and snappy
/// pages, projections of the files' columns) and 48 fall back to the host (partition columns,
/// columns the scan computes, nested columns).
#[tokio::test(flavor = "multi_thread")]
async fn gpu_datafusion_slt_suite_with_device_scans() {
    if !gpu_present() {
        return;
    }
    let mut options: Vec<(String, String)> = (ON_GPU.iter()).map(|(k, v)| (k.to_string(), v.to_string())).collect();
    options.push(("gpusort.device_scan".into(), "true".into()));
    let name = "every sort on the GPU, its Parquet files read there".to_string();
    let Some(differential) = suite_differential(&[(name, options)], true).await else {
        return;
    };
    differential.assert_no_unexpected();
    let (read, fell_back) = differential.device_scans;
    println!(
        "GPU scans: {read} read, {fell_back} fell back: {:?}",
        fallback_reasons()
    );
    assert!(read + fell_back > 0, "no sort of the suite was told its Parquet files");
    if decoder_present() {
        assert!(read > 0, "nvCOMP is here, but every scan fell back ({fell_back})");
    }
}

/// The differential SQL fuzz test (see `sql_fuzz.rs`) with every sort on the GPU.
#[tokio::test(flavor = "multi_thread")]
async fn gpu_sql_fuzz_matches_stock_datafusion() {
    if !gpu_present() {
        return;
    }
    let cases = std::env::var("SQL_FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(300);
    let report = sql_fuzz::run_sql_fuzz(0x6770_7573_6f72_7447, cases, |config| {
        ON_GPU.iter().fold(config, |c, (k, v)| c.set_str(k, v))
    })
    .await;
    println!("{report:?}");
    assert!(report.gpu_sorts > 0, "no sort ran on the GPU: {report:?}");
    // A mismatch panics inside run_sql_fuzz; failure_samples lists queries both engines reject.
    assert_eq!(report.cases, cases, "{report:?}");
}

/// The external sort on the GPU: a GPU memory budget far below the input cuts it into runs
/// (at least 8), each sorted on the GPU; with a small memory pool too, runs spill and their keys
/// sort on the GPU. Results equal stock DataFusion's stable order, the pool returns to zero and
/// no spill file is left. With 2 runs in memory (`gpusort.max_run_rows`), the merge steps merge
/// their runs on the GPU (`merge.cu`: 1 round, which pays against any radix pass) rather than
/// sort them; with ~20 runs a step (5 rounds against the keys' ~4 passes) the radix passes are
/// cheaper and run. Steps whose keys are under half a row's bytes send the keys alone and
/// gather the rows on the host (`gpu_key_steps`) with `gpusort.merge_keys_only`.
#[tokio::test]
async fn gpu_external_sort_in_budget_sized_runs() {
    if !gpu_present() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let stock = external::session(false, None, external::disk_in(tmp.path()), &[]);
    // ~72 bytes of device memory per row plus 16 MiB of scratch: runs of about 14K rows.
    // The small pool spills every run and merges them row by row (no step fits): keys alone
    // are tried where runs stay in memory and merge in steps.
    for (pool, keys_only) in [(None, "false"), (None, "true"), (Some(3 << 20), "false")] {
        let budget = [
            ("gpusort.device", "0"),
            ("gpusort.min_rows", "0"),
            ("gpusort.gpu_memory_limit", "17M"),
            ("gpusort.merge_keys_only", keys_only),
        ];
        let ours = external::session(true, pool, external::disk_in(tmp.path()), &budget);
        for (i, (q, stable)) in external::QUERIES.iter().enumerate() {
            let (expected, _) = external::run(&stock, stable).await.unwrap();
            let (actual, m) = external::run(&ours, q).await.unwrap();
            assert_eq!(
                external::render(&actual),
                external::render(&expected),
                "{q}, pool {pool:?}"
            );
            let (runs, gpu_sorts) = (external::metric(&m, "runs"), external::metric(&m, "gpu_sorts"));
            println!(
                "{q}, pool {pool:?}, keys only {keys_only}: {runs} runs ({} for the GPU budget), {gpu_sorts} GPU sorts, {} spill files, {} of {} merge steps merged on the GPU, {} by their keys alone, path {}",
                external::metric(&m, "budget_runs"),
                external::metric(&m, "spill_count"),
                external::metric(&m, "gpu_merged_steps"),
                external::metric(&m, "range_merge_steps"),
                external::metric(&m, "gpu_key_steps"),
                m.iter()
                    .filter(|x| x.value().name() == "path")
                    .map(|x| x.value().to_string())
                    .collect::<Vec<_>>()
                    .join(" / ")
            );
            assert!(runs >= 8, "{q}: {runs} runs");
            assert!(gpu_sorts >= runs, "{q}: {gpu_sorts} GPU sorts for {runs} runs: {m}");
            if pool.is_some() {
                assert!(external::metric(&m, "spill_count") >= 2, "{q}: {m}");
            }
            // `k, id` is 16 of ~44 bytes a row: its steps send the keys alone when asked to.
            let key_steps = external::metric(&m, "gpu_key_steps");
            match (i, keys_only) {
                (_, "false") => assert_eq!(key_steps, 0, "{q}: {m}"),
                (0, _) => assert!(
                    key_steps > 0 && key_steps <= external::metric(&m, "range_merge_steps"),
                    "{q}: {m}"
                ),
                _ => {}
            }
            assert_eq!(ours.runtime_env().memory_pool.reserved(), 0, "{q}");
            assert_eq!(external::files_under(tmp.path()), 0, "{q}");
        }
    }
    // Both ways of a step on the GPU: the keys alone (`k, id` and `k` are under half the
    // bytes of a row) and the rows whole. The runs (120,000 and 80,000 rows) and the steps
    // sorted whole come down in ranges of 10,000 rows, whose blocks the merge gives back as it
    // reads on.
    for keys_only in ["false", "true"] {
        let two_runs = [
            ("gpusort.device", "0"),
            ("gpusort.min_rows", "0"),
            ("gpusort.max_run_rows", "120000"),
            ("gpusort.merge_keys_only", keys_only),
            ("gpusort.run_range_rows", "10000"),
        ];
        let ours = external::session(true, None, external::disk_in(tmp.path()), &two_runs);
        for (q, stable) in &external::QUERIES[..2] {
            let (expected, _) = external::run(&stock, stable).await.unwrap();
            let (actual, m) = external::run(&ours, q).await.unwrap();
            assert_eq!(external::render(&actual), external::render(&expected), "{q}, 2 runs");
            let (runs, steps) = (external::metric(&m, "runs"), external::metric(&m, "range_merge_steps"));
            let merged = external::metric(&m, "gpu_merged_steps");
            let key_steps = external::metric(&m, "gpu_key_steps");
            println!(
                "{q}, 2 runs, keys only {keys_only}: {runs} runs, {merged} of {steps} merge steps merged on the GPU, {key_steps} by their keys alone"
            );
            assert_eq!(runs, 2, "{q}: {m}");
            assert!(
                merged > 0 && merged <= steps,
                "{q}: {merged} of {steps} steps merged: {m}"
            );
            let expected_key_steps = if keys_only == "true" { merged } else { 0 };
            assert_eq!(key_steps, expected_key_steps, "{q}: {m}");
            let ranges = external::metric(&m, "device_ranges");
            assert!(ranges >= 20, "{q}: {ranges} ranges came down: {m}");
            assert_eq!(ours.runtime_env().memory_pool.reserved(), 0, "{q}");
        }
    }
}

/// A merge of sorted partitions (`GpuSortPreservingMergeExec`) on the GPU: rows equal stock
/// DataFusion's merge (a total order, with and without a `LIMIT`) and, ordered by `k` alone,
/// come out stably (ties partition by partition); a small pool makes it spill (and merge row by
/// row when no step fits); the pool returns to zero. A step's runs merge on the GPU (`merge.cu`) where the
/// rounds are at most the radix passes: `k` (41 values and nulls) takes one pass, so 2
/// partitions (one round) merge and 6 (three) sort.
#[tokio::test]
async fn gpu_merges_sorted_partitions() {
    use datafusion::execution::memory_pool::{FairSpillPool, MemoryPool};
    use std::sync::Arc;
    if !gpu_present() {
        return;
    }
    for partitions in [2, 6] {
        // Batches of the session's 100 rows: DataFusion counts a slice of a larger batch as
        // the whole batch, which would cut runs of a few thousand rows under the pool.
        let table = sorted::sorted_table(300_000, partitions, 100);
        let expected_ties = sorted::partitions_then_k(&table).await;
        let stock = sorted::session(false, Arc::clone(&table), None);
        let total = format!("SELECT * FROM t ORDER BY {}", sorted::ORDER);
        let (expected, _) = rows(&stock, &total).await;
        for pool in [None, Some(4 << 20)] {
            let pool_impl: Option<Arc<dyn MemoryPool>> = pool.map(|p| Arc::new(FairSpillPool::new(p)) as _);
            let ours = sorted::session(true, Arc::clone(&table), pool_impl.clone());
            set(&ours, &[("min_rows", "0"), ("device", "0")]).await;
            let what = format!("{partitions} partitions, pool {pool:?}");
            let (batches, m) = sorted::run_merge(&ours, &total).await.unwrap();
            let actual = arrow::util::pretty::pretty_format_batches(&batches)
                .unwrap()
                .to_string();
            assert!(actual == expected, "{what}: rows differ from DataFusion's merge");
            // A LIMIT above gpusort.topk_max_fetch merges here too.
            let limited = format!("{total} LIMIT 2500");
            let (want, _) = rows(&stock, &limited).await;
            let (got, _) = rows(&ours, &limited).await;
            assert!(got == want, "{what}: LIMIT 2500 differs from DataFusion's merge");
            let count = |m: &datafusion::physical_plan::metrics::MetricsSet| {
                [
                    "runs",
                    "gpu_sorts",
                    "gpu_merged_steps",
                    "range_merge_steps",
                    "spill_count",
                ]
                .map(|n| sorted::metric(m, n))
            };
            println!(
                "{what}, {}: [runs, GPU sorts, merged steps, steps, spill files] = {:?}",
                sorted::ORDER,
                count(&m)
            );
            let (batches, m) = sorted::run_merge(&ours, "SELECT k, id FROM t ORDER BY k NULLS FIRST")
                .await
                .unwrap();
            assert!(
                sorted::k_id(&batches, 0, 1) == expected_ties,
                "{what}: ties out of partition order"
            );
            let [_, gpu, merged, steps, spills] = count(&m);
            println!(
                "{what}, k: [runs, GPU sorts, merged steps, steps, spill files] = {:?}",
                count(&m)
            );
            assert!(merged <= steps && gpu >= merged, "{what}: {m}");
            if pool.is_some() {
                assert!(spills > 0, "{what}: {m}");
            } else {
                assert!(gpu > 0 && (merged > 0) == (partitions == 2), "{what}: {m}");
            }
            if let Some(p) = &pool_impl {
                assert_eq!(p.reserved(), 0, "{what}");
            }
        }
    }
}

/// `COPY (SELECT ... ORDER BY ...) TO 'x.parquet'`: sorted on the GPU, written by
/// `GpuParquetSink` (zstd pages on the GPU where nvCOMP loads), read back equal to the file
/// stock DataFusion writes.
/// A sort of more rows than one output range comes down from the device a range at a time
/// while the consumer takes the earlier ones: the same rows as stock DataFusion, in
/// `batch_size` batches, and a `COPY` of them writes the same file.
#[tokio::test(flavor = "multi_thread")]
async fn gpu_sorts_of_many_rows_come_down_in_ranges() {
    if !gpu_present() {
        return;
    }
    let rows_n = 2_600_000;
    let (stock, ours) = (context(false, rows_n, 1), context(true, rows_n, 1));
    for ctx in [&stock, &ours] {
        ctx.sql("SET datafusion.execution.batch_size = 8192").await.unwrap();
    }
    set(&ours, &[("min_rows", "0"), ("device", "0")]).await;
    let all = |batches: Vec<arrow::array::RecordBatch>| {
        arrow::compute::concat_batches(&batches[0].schema(), &batches).unwrap()
    };
    for q in [
        "SELECT * FROM t ORDER BY a, b, c",
        "SELECT * FROM t ORDER BY c DESC, a, b",
    ] {
        let text = analyze(&ours, q).await;
        assert!(
            text.contains("gpu_sorts=1") && text.contains("device_ranges=3"),
            "{text}"
        );
        let expected = stock.sql(q).await.unwrap().collect().await.unwrap();
        let actual = ours.sql(q).await.unwrap().collect().await.unwrap();
        assert!(actual.iter().all(|b| b.num_rows() <= 8192), "{q}: batch_size respected");
        assert!(all(actual) == all(expected), "{q}: differs from stock DataFusion");
    }
    // The range size is an option; 0 brings the rows down whole.
    let q = "SELECT * FROM t ORDER BY c DESC, a, b";
    let expected = all(stock.sql(q).await.unwrap().collect().await.unwrap());
    for (range_rows, ranges) in [("500000", "device_ranges=6"), ("0", "device_ranges=0")] {
        set(&ours, &[("output_range_rows", range_rows)]).await;
        let text = analyze(&ours, q).await;
        assert!(
            text.contains("gpu_sorts=1") && text.contains(ranges),
            "{range_rows}: {text}"
        );
        let actual = ours.sql(q).await.unwrap().collect().await.unwrap();
        assert!(
            all(actual) == expected,
            "{q}, ranges of {range_rows}: differs from stock DataFusion"
        );
    }
    set(&ours, &[("output_range_rows", "1048576")]).await;
    let dir = tempfile::tempdir().unwrap();
    let path = |who: &str| dir.path().join(format!("{who}.parquet")).display().to_string();
    for (who, ctx) in [("ours", &ours), ("stock", &stock)] {
        let copy = format!(
            "COPY (SELECT * FROM t ORDER BY b NULLS FIRST, a DESC, c) TO '{}'",
            path(who)
        );
        rows(ctx, &copy).await;
    }
    let read = |p: String| async move {
        let file = SessionContext::new().read_parquet(p, Default::default()).await.unwrap();
        all(file.collect().await.unwrap())
    };
    assert!(
        read(path("ours")).await == read(path("stock")).await,
        "COPY: the files differ"
    );
}

#[tokio::test]
async fn gpu_copy_to_parquet_writes_what_datafusion_writes() {
    if !gpu_present() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (stock, ours) = (context(false, 300_000, 4), context(true, 300_000, 4));
    set(&ours, &[("min_rows", "0"), ("device", "0")]).await;
    for (i, order) in ["b NULLS FIRST, a DESC, c", "c, b, a", "a, b, c"].iter().enumerate() {
        let path = |who: &str| dir.path().join(format!("{who}{i}.parquet")).display().to_string();
        let copy = |who: &str| {
            format!(
                "COPY (SELECT * FROM t ORDER BY {order}) TO '{}' STORED AS PARQUET",
                path(who)
            )
        };
        let plan = rows(&ours, &format!("EXPLAIN {}", copy("ours"))).await.0;
        assert!(
            plan.contains("GpuParquetSink") && plan.contains("GpuSortExec"),
            "{plan}"
        );
        rows(&ours, &copy("ours")).await;
        rows(&stock, &copy("stock")).await;
        let read = |p: String| async move {
            let file = SessionContext::new().read_parquet(p, Default::default()).await.unwrap();
            arrow::util::pretty::pretty_format_batches(&file.collect().await.unwrap())
                .unwrap()
                .to_string()
        };
        let (actual, expected) = (read(path("ours")).await, read(path("stock")).await);
        assert!(actual == expected, "COPY ... ORDER BY {order}: the files differ");
    }
}

/// A key of short string views, a decimal of 15 digits and integers (TPC-H lineitem's
/// `l_returnflag, l_linestatus, l_extendedprice DESC, l_orderkey, l_linenumber`): the decimal
/// sorts through a narrowed copy, so the device encodes the key (`device_key_sorts`), in stock
/// DataFusion's order, the copy not in the output. With a 20-digit decimal instead the host
/// encodes it.
#[tokio::test]
async fn gpu_decimal_keys_narrow_for_the_device_key() {
    use std::sync::Arc;

    use arrow::array::{ArrayRef, Decimal128Array, Int32Array, Int64Array, RecordBatch, StringViewArray};
    use arrow::datatypes::{DataType, Field, Schema};
    use datafusion::datasource::MemTable;
    use datafusion::execution::SessionStateBuilder;
    use datafusion::prelude::SessionConfig;
    use datafusion_gpusort::SessionStateBuilderExt;

    if !gpu_present() {
        return;
    }
    let (n, partitions) = (120_000usize, 4usize);
    let per = n / partitions;
    let schema = Arc::new(Schema::new(vec![
        Field::new("flag", DataType::Utf8View, true),
        Field::new("status", DataType::Utf8View, false),
        Field::new("price", DataType::Decimal128(15, 2), true),
        Field::new("wide", DataType::Decimal128(20, 2), false),
        Field::new("orderkey", DataType::Int64, false),
        Field::new("line", DataType::Int32, false),
    ]));
    let parts: Vec<Vec<RecordBatch>> = (0..partitions)
        .map(|p| {
            let range = p * per..(p + 1) * per;
            let flag = StringViewArray::from_iter(
                range
                    .clone()
                    .map(|i| (i % 97 != 5).then_some(["A", "N", "R"][i * 7 % 3])),
            );
            let status = StringViewArray::from_iter_values(range.clone().map(|i| ["F", "O"][i * 13 % 2]));
            let price = Decimal128Array::from_iter(
                range
                    .clone()
                    .map(|i| (i % 89 != 1).then_some((i * 7919 % 100_003) as i128 * 101)),
            );
            let wide = Decimal128Array::from_iter_values(range.clone().map(|i| (i * 104_729 % 5003) as i128 - 2500));
            let columns: Vec<ArrayRef> = vec![
                Arc::new(flag),
                Arc::new(status),
                Arc::new(price.with_precision_and_scale(15, 2).unwrap()),
                Arc::new(wide.with_precision_and_scale(20, 2).unwrap()),
                Arc::new(Int64Array::from_iter_values(range.clone().map(|i| (i / 4) as i64))),
                Arc::new(Int32Array::from_iter_values(range.map(|i| (i % 4) as i32 + 1))),
            ];
            vec![RecordBatch::try_new(Arc::clone(&schema), columns).unwrap()]
        })
        .collect();
    let make = |gpusort: bool| {
        let config = SessionConfig::new().with_target_partitions(4).with_batch_size(4096);
        let mut builder = SessionStateBuilder::new().with_config(config).with_default_features();
        if gpusort {
            builder = builder.with_gpusort();
        }
        let ctx = SessionContext::new_with_state(builder.build());
        let table = MemTable::try_new(Arc::clone(&schema), parts.clone()).unwrap();
        ctx.register_table("l", Arc::new(table)).unwrap();
        ctx
    };
    let (stock, ours) = (make(false), make(true));
    set(&ours, &[("min_rows", "0"), ("device", "0")]).await;
    for (order, on_device) in [
        ("flag, status, price DESC, orderkey, line", true),
        ("price NULLS FIRST, status DESC, orderkey, line", true),
        ("flag, wide DESC, price, orderkey, line", false),
    ] {
        let sql = format!("SELECT * FROM l ORDER BY {order}");
        let (expected, _) = rows(&stock, &sql).await;
        let (actual, batches) = rows(&ours, &sql).await;
        assert!(actual == expected, "ORDER BY {order}: differs from stock DataFusion");
        assert_eq!(
            batches[0].schema(),
            schema,
            "ORDER BY {order}: the narrowed copy is not output"
        );
        let text = analyze(&ours, &sql).await;
        assert!(
            text.contains("gpu_sorts=1") && !text.contains("cpu_fallback=GPU"),
            "{text}"
        );
        assert_eq!(
            text.contains("device_key_sorts=1"),
            on_device,
            "ORDER BY {order}: {text}"
        );
    }
}

/// Whether the GPU's Parquet decoder can run: nvCOMP (GPUSORT_NVCOMP) beside the GPU. Without
/// it the test says so and passes, unless GPUSORT_REQUIRE_NVCOMP=1.
fn decoder_present() -> bool {
    match gpusort_parquet::gpu_decode::GpuPageDecoder::try_new(0) {
        Ok(_) => true,
        Err(why) => {
            assert!(
                std::env::var("GPUSORT_REQUIRE_NVCOMP").as_deref() != Ok("1"),
                "GPUSORT_REQUIRE_NVCOMP=1 but {why}"
            );
            eprintln!("GPU TEST NOT RUN: {why}");
            false
        }
    }
}

/// A sort told its Parquet input's file reads it on the GPU (pages decoded there, the rows
/// joining the session as device batches): stock DataFusion's rows, the file counted, nothing
/// executed on the host, also of a projection of its columns (decoded alone, by name); an
/// ORDER BY of an expression executes its input instead. Needs
/// nvCOMP (GPUSORT_NVCOMP) beside the GPU; without it the test says so and passes unless
/// GPUSORT_REQUIRE_NVCOMP=1.
#[tokio::test]
async fn gpu_device_scan_reads_parquet_on_the_gpu_as_stock_reads_it() {
    if !gpu_present() || !decoder_present() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (stock, ours) = (context(false, 200_003, 4), context(true, 200_003, 4));
    set(&ours, &[("min_rows", "0"), ("device", "0")]).await;
    let file = t_as_parquet(&stock, dir.path()).await;
    for order in DEVICE_SCAN_ORDERS {
        check_device_scan(&stock, &ours, &file, order, (1, 0)).await;
    }
    check_device_scan(&stock, &ours, &file, "a + 1, b, c", (0, 1)).await;
    for (select, order) in [("c, a", "c DESC, a"), ("b", "b NULLS FIRST")] {
        check_device_scan_of(&stock, &ours, &file, select, order, (1, 0)).await;
    }
}

/// A file of more rows than one GPU sort holds (here `gpusort.max_run_rows`) read on the GPU in
/// runs of whole row groups (11 of 20,000 rows, runs of 3), each sorted in a session of its
/// own, then merged: stock DataFusion's rows, nothing read on the host. Its pages are zstd
/// (DataFusion's default), the test above's snappy. Under a memory limit the
/// runs are not held: the input is executed instead. Needs nvCOMP as the test above.
#[tokio::test]
async fn gpu_device_scan_in_runs_merges_them_as_stock_sorts() {
    if !gpu_present() || !decoder_present() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (stock, ours) = (context(false, 200_003, 4), context(true, 200_003, 4));
    set(&ours, &[("min_rows", "0"), ("device", "0"), ("max_run_rows", "60000")]).await;
    let file = t_as_row_groups(&stock, dir.path(), 20_000, "zstd(3)").await;
    for order in DEVICE_SCAN_ORDERS {
        let plan = check_device_scan(&stock, &ours, &file, order, (1, 0)).await;
        assert_eq!(sort_metric(&plan, "runs"), 4, "ORDER BY {order}");
        assert_eq!(sort_metric(&plan, "device_scan_rows"), 200_003, "ORDER BY {order}");
    }
    // Runs and merge steps in ranges of 9,000 rows (not a multiple of the batch size): the
    // runs (60,000 rows thrice, 20,003) alone come down in 24.
    set(&ours, &[("run_range_rows", "9000")]).await;
    for order in DEVICE_SCAN_ORDERS {
        let plan = check_device_scan(&stock, &ours, &file, order, (1, 0)).await;
        assert_eq!(sort_metric(&plan, "runs"), 4, "ORDER BY {order}");
        let ranges = sort_metric(&plan, "device_ranges");
        assert!(ranges >= 24, "ORDER BY {order}: {ranges} ranges came down");
    }
    let limited = context_with_memory_limit(true, 200_003, 4, 1 << 30);
    set(
        &limited,
        &[("min_rows", "0"), ("device", "0"), ("max_run_rows", "60000")],
    )
    .await;
    check_device_scan(&stock, &limited, &file, DEVICE_SCAN_ORDERS[0], (0, 1)).await;
}
