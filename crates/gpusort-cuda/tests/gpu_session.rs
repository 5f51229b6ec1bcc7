//! GPU tests of the streaming sort ([`GpuSortSession`]) and the pinned pool, run on a machine
//! with an NVIDIA GPU:
//!
//! ```text
//! GPUSORT_REQUIRE_GPU=1 cargo test -p gpusort-cuda --test gpu_session
//! ```
//!
//! With `GPUSORT_REQUIRE_GPU=1` and no usable GPU every test fails. Without it, on a machine
//! with no GPU, each test prints that it did not run and why.
//!
//! Random tables (every sortable type, nulls, strings, payload of mixed types) are cut into
//! batches of random sizes and pushed into a session whose segments are made small, so a sort
//! spans many segments and batches straddle them; the result must equal the CPU backend's (and
//! the stable reference) row for row, with and without a limit.

use std::sync::{Arc, OnceLock, RwLock, RwLockReadGuard, RwLockWriteGuard};

use arrow::array::{Array, ArrayRef, RecordBatch, UInt32Array};
use arrow::datatypes::{DataType, Field, Schema};
use gpusort::{CpuBackend, SortBackend, SortKey, SortOutput, SortRequest, SortSpec};
use gpusort_cuda::{CudaBackend, CudaSortError, PinnedPool};
use gpusort_testing::{EDGE_SIZES, assert_matches_reference, random_case, rng_from_env};
use rand::prelude::*;
use rand::rngs::SmallRng;

/// The backend, shared by the tests, and the test's turn with it: tests that count what the
/// pinned pool or the backend's budget hold run alone ([`backend_alone`]), the others side by
/// side, so the counts hold with any `--test-threads`.
struct TestGpu {
    backend: &'static CudaBackend,
    _turn: Turn,
}

#[allow(dead_code)] // held for its drop
enum Turn {
    Shared(RwLockReadGuard<'static, ()>),
    Alone(RwLockWriteGuard<'static, ()>),
}

static TURNS: RwLock<()> = RwLock::new(());

impl std::ops::Deref for TestGpu {
    type Target = CudaBackend;
    fn deref(&self) -> &CudaBackend {
        self.backend
    }
}

fn backend() -> Option<TestGpu> {
    let turn = Turn::Shared(TURNS.read().unwrap_or_else(|e| e.into_inner()));
    opened().map(|backend| TestGpu { backend, _turn: turn })
}

/// As [`backend`], with no other test using the GPU meanwhile.
fn backend_alone() -> Option<TestGpu> {
    let turn = Turn::Alone(TURNS.write().unwrap_or_else(|e| e.into_inner()));
    opened().map(|backend| TestGpu { backend, _turn: turn })
}

fn opened() -> Option<&'static CudaBackend> {
    static B: OnceLock<Result<CudaBackend, String>> = OnceLock::new();
    match B.get_or_init(|| CudaBackend::try_new(0).map_err(|e| e.to_string())) {
        Ok(b) => Some(b),
        Err(reason) => {
            if std::env::var("GPUSORT_REQUIRE_GPU").as_deref() == Ok("1") {
                panic!("GPUSORT_REQUIRE_GPU=1 but the GPU backend is unavailable: {reason}");
            }
            eprintln!("GPU TEST NOT RUN: {reason} (set GPUSORT_REQUIRE_GPU=1 to make this a failure)");
            None
        }
    }
}

/// `batch` cut into consecutive batches of random sizes (some empty).
fn split(rng: &mut SmallRng, batch: &RecordBatch, max: usize) -> Vec<RecordBatch> {
    let mut out = vec![];
    let mut at = 0;
    while at < batch.num_rows() {
        let len = rng.random_range(0..=max).min(batch.num_rows() - at);
        out.push(batch.slice(at, len));
        at += len;
    }
    out
}

/// Sorts `parts` through a session (segments of about `segment_rows` rows) and checks the
/// result against the CPU backend and the stable reference.
fn check_session(
    gpu: &CudaBackend,
    batch: &RecordBatch,
    spec: &SortSpec,
    parts: &[RecordBatch],
    segment_rows: usize,
    limit: Option<usize>,
    what: &str,
) -> SortOutput {
    let mut session = gpu
        .begin_sort(batch.schema(), spec.clone())
        .unwrap()
        .with_expected_rows(segment_rows);
    for p in parts {
        session.push(p).unwrap();
    }
    assert_eq!(session.num_rows(), batch.num_rows(), "{what}");
    let out = session.finish(limit).unwrap_or_else(|e| panic!("{what}: {e}"));
    let cpu = CpuBackend::new()
        .sort(&SortRequest::new(batch, spec).with_limit(limit))
        .unwrap();
    assert_eq!(
        out.indices, cpu.indices,
        "{what}: permutation differs from the CPU backend's"
    );
    assert_eq!(out.batch.num_rows(), cpu.batch.num_rows(), "{what}");
    for (c, (g, h)) in out.batch.columns().iter().zip(cpu.batch.columns()).enumerate() {
        assert!(
            g.to_data() == h.to_data(),
            "{what}: column {c} ({}) differs",
            g.data_type()
        );
    }
    assert_matches_reference(batch, spec, limit, &out, what);
    out
}

#[test]
fn session_matches_the_cpu_backend_on_random_tables_in_many_batches() {
    let Some(ref gpu) = backend() else { return };
    let (mut rng, seed) = rng_from_env(0x5e55_1011);
    for case in 0..120 {
        let len = match case % 4 {
            0 => EDGE_SIZES[rng.random_range(0..EDGE_SIZES.len())],
            1 => rng.random_range(0..2_000),
            2 => rng.random_range(2_000..60_000),
            _ => rng.random_range(60_000..300_000),
        };
        let c = random_case(&mut rng, len);
        let max = rng.random_range(1..20_000);
        let parts = split(&mut rng, &c.batch, max);
        let segment_rows = [64, 1000, 4096, 100_000, 1 << 22][rng.random_range(0..5)];
        let limit = match rng.random_range(0..4) {
            0 => Some(rng.random_range(0..=len + 1)),
            1 => Some(1),
            _ => None,
        };
        check_session(
            gpu,
            &c.batch,
            &c.spec,
            &parts,
            segment_rows,
            limit,
            &format!(
                "seed {seed} case {case}: {len} rows in {} batches, segments of {segment_rows}, limit {limit:?}",
                parts.len()
            ),
        );
    }
}

/// A table the device moves whole: a u32 key and u32/i64/f64 payload, with nulls in some
/// batches only (segments without nulls get all-valid bits on the device).
fn fixed_table(rng: &mut SmallRng, n: usize) -> RecordBatch {
    let key: ArrayRef = Arc::new(UInt32Array::from_iter_values((0..n).map(|_| rng.random_range(0..1000))));
    let a: ArrayRef = Arc::new(arrow::array::Int64Array::from_iter(
        (0..n).map(|i| (!(20_000..20_100).contains(&i) || i % 3 != 0).then_some(i as i64)),
    ));
    let b: ArrayRef = Arc::new(arrow::array::Float64Array::from_iter_values(
        (0..n).map(|i| i as f64 * 0.5),
    ));
    let c: ArrayRef = Arc::new(UInt32Array::from_iter(
        (0..n).map(|i| (i % 7777 != 0).then_some(i as u32)),
    ));
    RecordBatch::try_new(
        Arc::new(Schema::new(vec![
            Field::new("k", DataType::UInt32, false),
            Field::new("a", DataType::Int64, true),
            Field::new("b", DataType::Float64, false),
            Field::new("c", DataType::UInt32, true),
        ])),
        vec![key, a, b, c],
    )
    .unwrap()
}

#[test]
fn session_moves_every_strategy_across_segments() {
    let Some(ref gpu) = backend() else { return };
    let (mut rng, seed) = rng_from_env(0x5e55_1012);
    let batch = fixed_table(&mut rng, 200_003);
    for strategy in gpusort::Strategy::ALL {
        for desc in [false, true] {
            let spec = SortSpec::new([SortKey::new(0, desc, false)]);
            let parts = split(&mut rng, &batch, 9000);
            let mut session = gpu
                .begin_sort(batch.schema(), spec.clone())
                .unwrap()
                .with_strategy(Some(strategy))
                .with_expected_rows(4096);
            for p in &parts {
                session.push(p).unwrap();
            }
            let out = session.finish(None).unwrap();
            assert_eq!(out.stats.strategy, Some(strategy), "{strategy}");
            assert_eq!(out.stats.moved_columns + out.stats.gathered_columns, 4);
            assert_eq!(out.stats.host_gathered_columns, 0, "every column moves on the device");
            assert!(out.stats.bytes_to_device > 0 && out.stats.bytes_from_device > 0);
            assert_matches_reference(
                &batch,
                &spec,
                None,
                &out,
                &format!("seed {seed}, {strategy}, desc {desc}"),
            );
        }
    }
}

#[test]
fn session_sorts_no_rows_and_one_row() {
    let Some(ref gpu) = backend() else { return };
    let (mut rng, _) = rng_from_env(7);
    let batch = fixed_table(&mut rng, 10);
    let spec = SortSpec::new([SortKey::sql(1, true)]);
    // No push at all, and only empty batches.
    for pushes in [0, 3] {
        let mut s = gpu.begin_sort(batch.schema(), spec.clone()).unwrap();
        for _ in 0..pushes {
            s.push(&batch.slice(0, 0)).unwrap();
        }
        let out = s.finish(None).unwrap();
        assert_eq!(out.batch.num_rows(), 0);
        assert_eq!(out.batch.schema(), batch.schema());
        assert!(out.indices.is_empty());
    }
    for limit in [None, Some(0), Some(1), Some(5)] {
        let one = batch.slice(3, 1);
        check_session(
            gpu,
            &one,
            &spec,
            std::slice::from_ref(&one),
            64,
            limit,
            &format!("one row, limit {limit:?}"),
        );
    }
    check_session(gpu, &batch, &spec, &split(&mut rng, &batch, 3), 64, Some(0), "limit 0");
}

#[test]
fn session_rejects_batches_of_another_schema() {
    let Some(ref gpu) = backend() else { return };
    let (mut rng, _) = rng_from_env(8);
    let batch = fixed_table(&mut rng, 100);
    let mut s = gpu
        .begin_sort(batch.schema(), SortSpec::new([SortKey::sql(0, false)]))
        .unwrap();
    let other = batch.project(&[1, 0, 2, 3]).unwrap();
    assert!(matches!(s.push(&other), Err(CudaSortError::Unsupported(_))));
}

#[test]
fn sorted_columns_live_in_pinned_pool_buffers_that_return_when_dropped() {
    let Some(ref gpu) = backend_alone() else { return };
    let pool = PinnedPool::global();
    let (mut rng, _) = rng_from_env(9);
    let batch = fixed_table(&mut rng, 1 << 20);
    let spec = SortSpec::new([SortKey::sql(0, false)]);
    let sort = || {
        let mut s = gpu.begin_sort(batch.schema(), spec.clone()).unwrap();
        for p in split(&mut SmallRng::seed_from_u64(1), &batch, 8192) {
            s.push(&p).unwrap();
        }
        s.finish(None).unwrap()
    };
    let in_use = |p: &PinnedPool| {
        let s = p.stats();
        s.pinned_bytes - s.free_bytes
    };
    drop(sort());
    let before = in_use(pool);
    let stats = pool.stats();
    let out = sort();
    // The output's values and the permutation are pool memory while the output lives.
    let held = in_use(pool) - before;
    let output_bytes: usize = out.batch.columns().iter().map(|c| c.to_data().buffers()[0].len()).sum();
    assert!(
        held >= output_bytes + 4 * batch.num_rows(),
        "{held} bytes held, output {output_bytes}"
    );
    // The second sort of the same shape reuses the first one's blocks.
    let after = pool.stats();
    assert!(after.reused > stats.reused, "{stats:?} -> {after:?}");
    assert_eq!(
        after.allocated, stats.allocated,
        "no new pinned block: {stats:?} -> {after:?}"
    );
    let slice = out.batch.slice(100, 10);
    drop(out);
    assert!(in_use(pool) > before, "a slice keeps its blocks");
    drop(slice);
    assert_eq!(in_use(pool), before, "every block came back");
}

#[test]
fn session_out_of_device_memory_fails_before_or_at_finish() {
    let Some(ref gpu) = backend() else { return };
    let (mut rng, _) = rng_from_env(10);
    let batch = fixed_table(&mut rng, 1 << 20);
    let spec = SortSpec::new([SortKey::sql(0, false)]);
    // The payload passes the budget while it is uploaded: a push or the finish says so.
    let mut s = gpu
        .begin_sort(batch.schema(), spec.clone())
        .unwrap()
        .with_memory_limit(Some(256 << 10))
        .with_expected_rows(1024);
    let mut failed = None;
    for p in split(&mut rng, &batch, 8192) {
        if let Err(e) = s.push(&p) {
            failed = Some(e);
            break;
        }
    }
    let e = match failed {
        Some(e) => e,
        None => s.finish(None).unwrap_err(),
    };
    assert!(matches!(e, CudaSortError::OutOfMemory { .. }), "{e}");
    // The payload fits but the sort does not: finish says so before sorting.
    let small = batch.slice(0, 1000);
    let mut s = gpu
        .begin_sort(batch.schema(), spec.clone())
        .unwrap()
        .with_memory_limit(Some(1 << 20));
    s.push(&small).unwrap();
    let e = s.finish(None).unwrap_err();
    assert!(matches!(e, CudaSortError::OutOfMemory { .. }), "{e}");
    // And the device is fine afterwards.
    check_session(
        gpu,
        &small,
        &spec,
        std::slice::from_ref(&small),
        1024,
        None,
        "after out of memory",
    );
}

#[test]
fn dropped_sessions_free_their_uploads() {
    let Some(ref gpu) = backend_alone() else { return };
    let (mut rng, _) = rng_from_env(11);
    let batch = fixed_table(&mut rng, 1 << 20);
    let spec = SortSpec::new([SortKey::sql(0, false)]);
    let free = gpu.gpu().free_memory().unwrap();
    for _ in 0..20 {
        let mut s = gpu
            .begin_sort(batch.schema(), spec.clone())
            .unwrap()
            .with_expected_rows(1 << 16);
        for p in split(&mut rng, &batch, 50_000) {
            s.push(&p).unwrap();
        }
        drop(s);
    }
    gpu.gpu().stream().synchronize().unwrap();
    let now = gpu.gpu().free_memory().unwrap();
    // The stream-ordered pool may keep some memory; 20 leaked payloads (~20 MB each) would not fit.
    assert!(now + (64 << 20) >= free, "free memory {free} -> {now}");
}

#[test]
fn columns_over_the_fresh_pin_limit_cross_through_the_ring() {
    let Some(ref gpu) = backend_alone() else { return };
    // A u64 key (two varying words of 4n bytes each) and a u64 payload of 8n bytes: every one
    // over FRESH_PIN_MAX, so each crosses as heap memory through the pinned ring, in both
    // directions, with a partial last chunk.
    let n = gpusort_cuda::FRESH_PIN_MAX / 4 + 12_345;
    let (mut rng, seed) = rng_from_env(0x5e55_1013);
    let key: ArrayRef = Arc::new(arrow::array::UInt64Array::from_iter_values(
        (0..n).map(|_| rng.random::<u64>() >> rng.random_range(0..40)),
    ));
    let payload: ArrayRef = Arc::new(arrow::array::Int64Array::from_iter_values((0..n as i64).map(|i| i * 3)));
    let batch = RecordBatch::try_new(
        Arc::new(Schema::new(vec![
            Field::new("k", DataType::UInt64, false),
            Field::new("v", DataType::Int64, false),
        ])),
        vec![key, payload],
    )
    .unwrap();
    let spec = SortSpec::new([SortKey::new(0, true, false)]);
    let pool = PinnedPool::global();
    let unpinned = pool.stats().unpinned;
    let mut session = gpu.begin_sort(batch.schema(), spec.clone()).unwrap();
    for p in split(&mut rng, &batch, 1 << 20) {
        session.push(&p).unwrap();
    }
    let out = session.finish(None).unwrap();
    assert_matches_reference(&batch, &spec, None, &out, &format!("seed {seed}, {n} rows"));
    assert!(
        pool.stats().unpinned > unpinned,
        "the large buffers were heap memory: {:?}",
        pool.stats()
    );
}

/// Without the permutation the rows are the same, no indices come back and the permutation
/// does not cross PCIe (the host gathers no column of this table).
#[test]
fn sessions_without_the_permutation_return_the_same_rows() {
    let Some(ref gpu) = backend() else { return };
    let (mut rng, _) = rng_from_env(21);
    let n = 50_000;
    let batch = fixed_table(&mut rng, n);
    let spec = SortSpec::new([SortKey::sql(0, false), SortKey::sql(1, true)]);
    let parts = split(&mut rng, &batch, 3000);
    let with = check_session(gpu, &batch, &spec, &parts, 4096, None, "with the permutation");
    let mut session = gpu
        .begin_sort(batch.schema(), spec.clone())
        .unwrap()
        .with_expected_rows(4096)
        .with_permutation(false);
    for p in &parts {
        session.push(p).unwrap();
    }
    let without = session.finish(None).unwrap();
    assert!(without.indices.is_empty());
    assert_eq!(without.batch, with.batch);
    assert_eq!(
        with.stats.bytes_from_device - without.stats.bytes_from_device,
        4 * n as u64,
        "only the permutation's bytes are saved"
    );
}

/// Batches built one by one, as a Parquet reader hands them out: each has data buffers of its
/// own (several, from small blocks), so the device's views must be rebased to index them all.
/// Columns: an i32 key with many ties, a string view (short inline and long values, nulls), a
/// binary view, and a u64.
fn view_batches(rng: &mut SmallRng, batches: usize) -> Vec<RecordBatch> {
    let schema = Arc::new(Schema::new(vec![
        Field::new("k", DataType::Int32, false),
        Field::new("s", DataType::Utf8View, true),
        Field::new("b", DataType::BinaryView, true),
        Field::new("u", DataType::UInt64, false),
    ]));
    (0..batches)
        .flat_map(|i| {
            let n = rng.random_range(0..3000);
            let mut s = arrow::array::StringViewBuilder::new().with_fixed_block_size(256);
            let mut b = arrow::array::BinaryViewBuilder::new().with_fixed_block_size(512);
            for r in 0..n {
                match rng.random_range(0..10) {
                    0 => s.append_null(),
                    1..=4 => s.append_value(format!("s{}", rng.random_range(0..50))),
                    // Longer than a GPU sort's key holds whole (GPU_WHOLE_STRING_BYTES).
                    _ => s.append_value(format!(
                        "a long value shared by many rows, longer than a key holds whole: {:04} of {i}",
                        rng.random_range(0..300)
                    )),
                }
                match r % 7 {
                    0 => b.append_null(),
                    _ => b.append_value(vec![(r % 251) as u8; rng.random_range(0..40)]),
                }
            }
            let k = arrow::array::Int32Array::from_iter_values((0..n).map(|_| rng.random_range(0..40)));
            let u = arrow::array::UInt64Array::from_iter_values((0..n).map(|r| (i * 10_000 + r) as u64));
            let cols: Vec<ArrayRef> = vec![Arc::new(k), Arc::new(s.finish()), Arc::new(b.finish()), Arc::new(u)];
            let batch = RecordBatch::try_new(Arc::clone(&schema), cols).unwrap();
            // Some batches come sliced; some in two, the second with the same data buffers in
            // lists of its own (as a Parquet reader's batches share its pages).
            match i % 5 {
                0 if n > 10 => vec![batch.slice(3, n - 7)],
                1 if n > 20 => vec![batch.slice(0, n / 2), relisted(&batch.slice(n / 2, n - n / 2))],
                _ => vec![batch],
            }
        })
        .collect()
}

/// `batch` with each view column's data buffers in a new list (the same buffers).
fn relisted(batch: &RecordBatch) -> RecordBatch {
    use arrow::array::AsArray;
    let columns: Vec<ArrayRef> = (batch.columns().iter())
        .map(|c| -> ArrayRef {
            match c.data_type() {
                DataType::Utf8View => {
                    let (views, buffers, nulls) = c.as_string_view().clone().into_parts();
                    Arc::new(arrow::array::StringViewArray::try_new(views, buffers.to_vec(), nulls).unwrap())
                }
                DataType::BinaryView => {
                    let (views, buffers, nulls) = c.as_binary_view().clone().into_parts();
                    Arc::new(arrow::array::BinaryViewArray::try_new(views, buffers.to_vec(), nulls).unwrap())
                }
                _ => Arc::clone(c),
            }
        })
        .collect();
    RecordBatch::try_new(batch.schema(), columns).unwrap()
}

#[test]
fn view_columns_move_on_the_device_with_the_data_buffers_of_every_batch() {
    let Some(ref gpu) = backend() else { return };
    let views = gpusort_cuda::GpuOptions::from_env().unwrap().device_views;
    assert!(
        views,
        "GPUSORT_DEVICE_VIEWS=0 is set: this test needs views on the device"
    );
    let ties_on_device = gpusort_cuda::GpuOptions::from_env().unwrap().device_ties != gpusort_cuda::DeviceTies::Never;
    assert!(
        gpusort_cuda::GpuOptions::from_env().unwrap().tie_views,
        "GPUSORT_TIE_VIEWS=0 is set: this test orders ties through the views"
    );
    let mut device_tie_groups = 0;
    let (mut rng, seed) = rng_from_env(0x71e3_5001);
    for case in 0..12 {
        let batches = rng.random_range(1..60);
        let parts = view_batches(&mut rng, batches);
        let schema = parts[0].schema();
        let batch = arrow::compute::concat_batches(&schema, &parts).unwrap();
        let specs = [
            SortSpec::new([SortKey::sql(0, false)]),
            SortSpec::new([SortKey::new(0, true, false), SortKey::sql(3, true)]),
            SortSpec::new([SortKey::sql(1, false), SortKey::sql(3, false)]),
            SortSpec::new([SortKey::new(2, true, true), SortKey::sql(0, false)]),
        ];
        let spec = &specs[case % specs.len()];
        let limit = (case % 3 == 2).then(|| rng.random_range(0..=batch.num_rows()));
        let segment_rows = [64, 1000, 1 << 20][case % 3];
        let what = format!(
            "seed {seed} case {case}: {} rows in {} batches, {spec:?}, limit {limit:?}",
            batch.num_rows(),
            parts.len()
        );
        let out = check_session(gpu, &batch, spec, &parts, segment_rows, limit, &what);
        if batch.num_rows() > 0 {
            assert_eq!(
                out.stats.host_gathered_columns, 0,
                "{what}: every column moves on the device"
            );
            assert!(
                out.stats.keys_on_device,
                "{what}: the key (views and integers) encoded on the device"
            );
            // The long values tie on the key's prefix in large groups, every later field
            // exact: ordered on the device, their tails read through the views there.
            device_tie_groups += out.stats.device_tie_groups;
        }
        // The sorted views index the input's data buffers, shared, not copied.
        let input: std::collections::HashSet<usize> = parts
            .iter()
            .flat_map(|p| {
                p.column(1)
                    .as_any()
                    .downcast_ref::<arrow::array::StringViewArray>()
                    .unwrap()
                    .data_buffers()
            })
            .map(|b| b.as_ptr() as usize)
            .collect();
        if let Some(s) = out
            .batch
            .column(1)
            .as_any()
            .downcast_ref::<arrow::array::StringViewArray>()
        {
            let copied = (s.data_buffers().iter())
                .filter(|b| !input.contains(&(b.as_ptr() as usize)))
                .count();
            assert_eq!(copied, 0, "{what}: data buffers not of the input");
        }
        // Under a device memory limit the views stay on the host: the same rows.
        let mut limited = gpu
            .begin_sort(schema.clone(), spec.clone())
            .unwrap()
            .with_memory_limit(Some(1 << 30))
            .with_expected_rows(segment_rows);
        for p in &parts {
            limited.push(p).unwrap();
        }
        let host = limited.finish(limit).unwrap();
        assert_eq!(host.indices, out.indices, "{what}, under a memory limit");
        assert_eq!(host.batch, out.batch, "{what}, under a memory limit");
        if batch.num_rows() > 0 {
            assert_eq!(host.stats.host_gathered_columns, 2, "{what}: the views on the host");
            let views_in_key = spec.keys().iter().any(|k| k.column == 1 || k.column == 2);
            assert_eq!(
                host.stats.keys_on_device, !views_in_key,
                "{what}: views on the host, keys of views too"
            );
        }
    }
    assert!(
        !ties_on_device || device_tie_groups > 0,
        "seed {seed}: no case ordered tie groups on the device"
    );
}

/// String keys of 33 to 48 bytes past their common prefix go into a GPU sort's key whole
/// (`GPU_WHOLE_STRING_BYTES`): no rows tie on a truncated prefix, and the order is the CPU's;
/// one value longer than that and the prefix is 32 bytes again, the ties ordered after.
#[test]
fn string_keys_of_up_to_48_bytes_go_into_the_key_whole() {
    let Some(ref gpu) = backend() else { return };
    let (mut rng, seed) = rng_from_env(0x3e1e_0064);
    let schema = Arc::new(Schema::new(vec![
        Field::new("s", DataType::Utf8View, true),
        Field::new("u", DataType::UInt64, false),
    ]));
    for (case, longest) in [(0, 40), (1, 48), (2, 49)] {
        let n = 20_000;
        let values: Vec<Option<String>> = (0..n)
            .map(|r| {
                (r % 97 != 0).then(|| {
                    // Values that share their first 36 bytes in groups, and differ after.
                    let head = format!("{:02}", rng.random_range(0..20));
                    let len = rng.random_range(34..=longest);
                    let tail: String = (head.len()..len)
                        .map(|j| {
                            if j < 36 {
                                'x'
                            } else {
                                (b'a' + rng.random_range(0..3u8)) as char
                            }
                        })
                        .collect();
                    format!("{head}{tail}")
                })
            })
            .collect();
        let s = arrow::array::StringViewArray::from_iter(values.iter().map(|v| v.as_deref()));
        let u = arrow::array::UInt64Array::from_iter_values((0..n as u64).map(|r| r % 7));
        let batch = RecordBatch::try_new(Arc::clone(&schema), vec![Arc::new(s), Arc::new(u)]).unwrap();
        let parts: Vec<RecordBatch> = (0..n).step_by(4096).map(|o| batch.slice(o, 4096.min(n - o))).collect();
        for spec in [
            SortSpec::new([SortKey::sql(0, false), SortKey::sql(1, false)]),
            SortSpec::new([SortKey::new(0, true, true), SortKey::sql(1, true)]),
        ] {
            let what = format!("seed {seed} case {case}: values of up to {longest} bytes, {spec:?}");
            let out = check_session(gpu, &batch, &spec, &parts, 1 << 20, None, &what);
            assert!(out.stats.keys_on_device, "{what}: the key encoded on the device");
            if longest <= gpusort_cuda::GPU_WHOLE_STRING_BYTES {
                assert_eq!(out.stats.tie_groups, 0, "{what}: no ties on a truncated prefix");
            } else {
                assert!(out.stats.tie_groups > 0, "{what}: prefixes of 32 bytes tie");
            }
        }
    }
}

/// Two string keys of one byte and three native keys (TPC-H lineitem's `l_returnflag,
/// l_linestatus, l_extendedprice DESC, l_orderkey, l_linenumber`): their prefixes' bound passes
/// the device's key words, their values whole do not, and the key is encoded on the device in
/// the CPU's order. Three long string keys pass the words either way: the host encodes them.
#[test]
fn short_string_keys_past_the_prefix_bound_are_encoded_on_the_device() {
    use arrow::array::{Decimal64Array, Int32Array, Int64Array, StringViewArray};
    let Some(ref gpu) = backend() else { return };
    let (mut rng, seed) = rng_from_env(0x5e55_0017);
    let n = 30_000;
    let pick = |rng: &mut SmallRng, from: &[&'static str]| from[rng.random_range(0..from.len())];
    let flags: Vec<Option<&str>> = (0..n)
        .map(|r| (r % 101 != 0).then(|| pick(&mut rng, &["A", "N", "R"])))
        .collect();
    let status: Vec<&str> = (0..n).map(|_| pick(&mut rng, &["F", "O"])).collect();
    let long = |rng: &mut SmallRng| -> String {
        (0..rng.random_range(40..60))
            .map(|_| (b'a' + rng.random_range(0..2u8)) as char)
            .collect()
    };
    let texts: Vec<Vec<String>> = (0..3).map(|_| (0..n).map(|_| long(&mut rng)).collect()).collect();
    let price = Decimal64Array::from_iter_values((0..n).map(|_| rng.random_range(90_000..10_500_000i64)));
    let columns: Vec<ArrayRef> = vec![
        Arc::new(StringViewArray::from_iter(flags)),
        Arc::new(StringViewArray::from_iter_values(status)),
        Arc::new(price.with_precision_and_scale(15, 2).unwrap()),
        Arc::new(Int64Array::from_iter_values((0..n as i64).map(|r| r / 4))),
        Arc::new(Int32Array::from_iter_values((0..n as i32).map(|r| r % 4 + 1))),
        Arc::new(StringViewArray::from_iter_values(&texts[0])),
        Arc::new(StringViewArray::from_iter_values(&texts[1])),
        Arc::new(StringViewArray::from_iter_values(&texts[2])),
    ];
    let fields = ["f", "s", "p", "k", "l", "t0", "t1", "t2"]
        .iter()
        .zip(&columns)
        .map(|(name, c)| Field::new(*name, c.data_type().clone(), c.null_count() > 0));
    let batch = RecordBatch::try_new(Arc::new(Schema::new(fields.collect::<Vec<_>>())), columns).unwrap();
    let parts: Vec<RecordBatch> = (0..n).step_by(4096).map(|o| batch.slice(o, 4096.min(n - o))).collect();
    let short = SortSpec::new([
        SortKey::sql(0, false),
        SortKey::sql(1, false),
        SortKey::sql(2, true),
        SortKey::sql(3, false),
        SortKey::sql(4, false),
    ]);
    let long = SortSpec::new([SortKey::sql(5, false), SortKey::sql(6, true), SortKey::sql(7, false)]);
    for (spec, on_device) in [(short, true), (long, false)] {
        let what = format!("seed {seed}: {spec:?}");
        let out = check_session(gpu, &batch, &spec, &parts, 1 << 20, None, &what);
        assert_eq!(out.stats.keys_on_device, on_device, "{what}: where the key was encoded");
    }
}

/// Sorts `parts` through a session and hands the rows out in ranges of the sizes `sizes` (in
/// turn, over and over), concatenated.
fn sorted_in_ranges(
    gpu: &CudaBackend,
    schema: arrow::datatypes::SchemaRef,
    spec: &SortSpec,
    strategy: Option<gpusort::Strategy>,
    parts: &[RecordBatch],
    limit: Option<usize>,
    sizes: &[usize],
) -> (RecordBatch, usize, gpusort::SortStats) {
    let mut session = gpu
        .begin_sort(Arc::clone(&schema), spec.clone())
        .unwrap()
        .with_strategy(strategy)
        .with_expected_rows(4096);
    for p in parts {
        session.push(p).unwrap();
    }
    let mut rows = session.finish_sorted(limit).unwrap();
    let mut ranges = vec![];
    for &size in sizes.iter().cycle() {
        let left = rows.rows_left();
        match rows.next_batch(size).unwrap() {
            Some(b) => {
                assert_eq!(b.num_rows(), size.max(1).min(left), "a range of {size} rows");
                ranges.push(b);
            }
            None => break,
        }
    }
    assert_eq!(rows.rows_left(), 0);
    assert!(rows.next_batch(10).unwrap().is_none(), "nothing after the last range");
    let stats = rows.stats().clone();
    (
        arrow::compute::concat_batches(&schema, &ranges).unwrap(),
        ranges.len(),
        stats,
    )
}

#[test]
fn ranges_of_the_sorted_rows_are_the_whole_sort_in_pieces() {
    let Some(ref gpu) = backend() else { return };
    let (mut rng, seed) = rng_from_env(0x5a4e_6e01);
    // Random tables of every type (nulls; strings the host or the device gathers), each
    // strategy, with and without limits, in ranges of 1 row up to more than all rows.
    for case in 0..24 {
        let len = [0, 1, 63, 64, 65, 5_000, 70_001][case % 7];
        let c = random_case(&mut rng, len);
        let parts = split(&mut rng, &c.batch, 7000);
        let strategy = match case % 3 {
            0 => None,
            _ => Some(gpusort::Strategy::ALL[rng.random_range(0..gpusort::Strategy::ALL.len())]),
        };
        let limit = (case % 4 == 3).then(|| rng.random_range(0..=len + 1));
        let sizes: &[usize] = match case % 5 {
            0 => &[1, 7, 1000],
            1 => &[4096],
            2 => &[33, 64, 65],
            3 => &[usize::MAX],
            _ => &[0, 20_000],
        };
        let what = format!("seed {seed} case {case}: {len} rows, {strategy:?}, limit {limit:?}, ranges {sizes:?}");
        let (ranged, count, stats) = sorted_in_ranges(gpu, c.batch.schema(), &c.spec, strategy, &parts, limit, sizes);
        let whole = check_session(gpu, &c.batch, &c.spec, &parts, 4096, limit, &what);
        assert_same_rows(&ranged, &whole.batch, &what);
        let largest = sizes.iter().map(|&s| s.max(1)).max().unwrap();
        assert!(
            count >= whole.batch.num_rows().div_ceil(largest),
            "{what}: {count} ranges"
        );
        if whole.batch.num_rows() > 0 && whole.stats.host_gathered_columns < c.batch.num_columns() {
            assert!(stats.bytes_from_device > 0, "{what}: the device's columns came down");
        }
    }
    // Views the device moves: every range's views index the input's data buffers.
    for case in 0..6 {
        let parts = view_batches(&mut rng, 40);
        let schema = parts[0].schema();
        let batch = arrow::compute::concat_batches(&schema, &parts).unwrap();
        let spec = [
            SortSpec::new([SortKey::sql(0, false)]),
            SortSpec::new([SortKey::sql(1, false), SortKey::sql(3, false)]),
        ][case % 2]
            .clone();
        let limit = (case % 3 == 2).then(|| batch.num_rows() / 2);
        let what = format!(
            "seed {seed} view case {case}: {} rows, limit {limit:?}",
            batch.num_rows()
        );
        let (ranged, _, stats) = sorted_in_ranges(gpu, Arc::clone(&schema), &spec, None, &parts, limit, &[999, 5000]);
        let whole = check_session(gpu, &batch, &spec, &parts, 4096, limit, &what);
        assert_eq!(ranged, whole.batch, "{what}");
        if batch.num_rows() > 0 {
            assert_eq!(
                stats.host_gathered_columns, 0,
                "{what}: every column moves on the device"
            );
        }
    }
}

#[test]
fn views_compacted_on_the_device_hold_only_their_own_batch_bytes() {
    use arrow::array::AsArray;
    let Some(ref gpu) = backend() else { return };
    let options = gpusort_cuda::GpuOptions::from_env().unwrap();
    assert!(
        options.device_views && options.compact_views,
        "GPUSORT_DEVICE_VIEWS=0 or GPUSORT_COMPACT_VIEWS=0 is set: this test compacts views on the device"
    );
    let (mut rng, seed) = rng_from_env(0xc0_4ac7);
    let mut compacted_batches = 0;
    for case in 0..14 {
        let parts = view_batches(&mut rng, 40);
        let schema = parts[0].schema();
        let batch = arrow::compute::concat_batches(&schema, &parts).unwrap();
        let (spec, keyed) = [
            (SortSpec::new([SortKey::sql(1, false), SortKey::sql(3, false)]), vec![1]),
            (
                SortSpec::new([SortKey::new(2, true, true), SortKey::sql(0, false)]),
                vec![2],
            ),
            (SortSpec::new([SortKey::sql(0, false)]), vec![]),
        ][case % 3]
            .clone();
        let limit = (case % 4 == 3).then(|| batch.num_rows() / 3);
        // Batches of over 8,192 rows are laid out in several tiles each (`VIEW_TILE_ROWS`).
        let (range_rows, batch_rows) = [
            (999, 37),
            (5000, 1000),
            (4096, 1),
            (70_000, 8192),
            (3000, 3000),
            (70_000, 20_000),
            (30_000, 30_000),
        ][case % 7];
        let what = format!(
            "seed {seed} case {case}: {} rows, {spec:?}, limit {limit:?}, ranges of {range_rows}, batches of {batch_rows}",
            batch.num_rows()
        );
        let whole = check_session(gpu, &batch, &spec, &parts, 4096, limit, &what);
        // Every other case lays out every view column's values on the device, not only the
        // key's.
        let every_view = case % 2 == 1;
        // Most cases tell the session their ranges (their blocks pinned while it sorts); every
        // fifth learns them from the first range.
        let told = if case % 5 == 4 { 0 } else { range_rows };
        let mut session = (gpu.begin_sort(Arc::clone(&schema), spec.clone()).unwrap())
            .with_output_views(every_view)
            .with_output_ranges(told);
        for p in &parts {
            session.push(p).unwrap();
        }
        let mut rows = session.finish_sorted(limit).unwrap();
        let compacted = rows.compacted_columns();
        if whole.batch.num_rows() > 0 {
            let expected = if every_view { vec![1, 2] } else { keyed };
            assert_eq!(compacted, expected, "{what}: the columns compacted on the device");
        }
        let mut batches = vec![];
        while let Some(range) = rows.next_batches(range_rows, batch_rows).unwrap() {
            let range_len: usize = range.iter().map(|b| b.num_rows()).sum();
            assert!(range_len <= range_rows, "{what}: a range of {range_len} rows");
            for (i, b) in range.iter().enumerate() {
                if i + 1 < range.len() {
                    assert_eq!(b.num_rows(), batch_rows, "{what}: batch {i} of a range");
                }
                for &c in &compacted {
                    let column = b.column(c);
                    column.to_data().validate_full().unwrap();
                    let (lengths, buffers): (Vec<usize>, Vec<usize>) = match column.data_type() {
                        DataType::Utf8View => {
                            let a = column.as_string_view();
                            (
                                a.iter().map(|v| v.map_or(0, str::len)).collect(),
                                a.data_buffers().iter().map(|d| d.len()).collect(),
                            )
                        }
                        _ => {
                            let a = column.as_binary_view();
                            (
                                a.iter().map(|v| v.map_or(0, <[u8]>::len)).collect(),
                                a.data_buffers().iter().map(|d| d.len()).collect(),
                            )
                        }
                    };
                    let own: usize = lengths.iter().filter(|&&l| l > 12).sum();
                    assert!(buffers.len() <= 1, "{what}: column {c} holds {} buffers", buffers.len());
                    assert_eq!(
                        buffers.iter().sum::<usize>(),
                        own,
                        "{what}: column {c}'s bytes are its rows'"
                    );
                    compacted_batches += 1;
                }
            }
            batches.extend(range);
        }
        assert_eq!(rows.rows_left(), 0, "{what}");
        let ranged = arrow::compute::concat_batches(&schema, &batches).unwrap();
        assert_eq!(ranged, whole.batch, "{what}");
    }
    assert!(compacted_batches > 0, "seed {seed}: no batch compacted on the device");
}

#[test]
fn sorted_rows_dropped_part_way_release_their_device_memory() {
    let Some(ref gpu) = backend_alone() else { return };
    let (mut rng, _) = rng_from_env(0x5a4e_6e02);
    let batch = fixed_table(&mut rng, 300_000);
    let spec = SortSpec::new([SortKey::sql(0, false)]);
    let before = gpu.memory_budget().stats().reserved;
    for _ in 0..3 {
        let mut session = gpu.begin_sort(batch.schema(), spec.clone()).unwrap();
        session.push(&batch).unwrap();
        let mut rows = session.finish_sorted(None).unwrap();
        assert!(
            gpu.memory_budget().stats().reserved > before,
            "the sorted rows hold device memory"
        );
        let first = rows.next_batch(1000).unwrap().unwrap();
        assert_eq!(first.num_rows(), 1000);
        drop(rows);
        assert_eq!(
            gpu.memory_budget().stats().reserved,
            before,
            "released when dropped part way"
        );
    }
}

#[test]
fn released_input_sorts_the_same_rows_from_the_columns_left_on_the_host() {
    let Some(ref gpu) = backend() else { return };
    let (mut rng, seed) = rng_from_env(0x4e1e_a5ed);
    // Random tables of every type (nulls, strings, host and device columns), released from
    // the first batch or part way, sorted whole or in ranges with the views laid out on the
    // device: the rows equal a session that kept every batch.
    let mut released_any = false;
    for case in 0..24 {
        let len = [1, 64, 5_000, 70_001][case % 4];
        let c = random_case(&mut rng, len);
        let parts = split(&mut rng, &c.batch, 7000);
        let from = if case % 2 == 0 { 0 } else { parts.len() / 2 };
        let limit = (case % 5 == 4).then(|| rng.random_range(0..=len + 1));
        let ranges = [0, 999][case % 3 % 2];
        let what = format!(
            "seed {seed} case {case}: {len} rows in {} batches, released from batch {from}, limit {limit:?}, ranges {ranges}",
            parts.len()
        );
        let mut session = gpu
            .begin_sort(c.batch.schema(), c.spec.clone())
            .unwrap()
            .with_expected_rows(4096)
            .with_output_views(ranges > 0)
            .with_output_ranges(ranges);
        for (i, p) in parts.iter().enumerate() {
            if i == from {
                session.release_input();
            }
            session.push(p).unwrap();
        }
        let keys: Vec<usize> = c.spec.keys().iter().map(|k| k.column).collect();
        assert!(
            session.released_columns().iter().all(|col| !keys.contains(col)),
            "{what}: a key column released"
        );
        released_any |= session.released_bytes() > 0;
        let mut rows = session.finish_sorted(limit).unwrap_or_else(|e| panic!("{what}: {e}"));
        let mut got = vec![];
        while let Some(b) = rows.next_batch(if ranges > 0 { ranges } else { usize::MAX }).unwrap() {
            got.push(b);
        }
        let got = arrow::compute::concat_batches(&c.batch.schema(), &got).unwrap();
        let whole = check_session(gpu, &c.batch, &c.spec, &parts, 4096, limit, &what);
        assert_same_rows(&got, &whole.batch, &what);
    }
    // Views, every column on the device: the payload's views are hollow in the batches kept,
    // their data buffers not.
    for case in 0..4 {
        let parts = view_batches(&mut rng, 40);
        let schema = parts[0].schema();
        let batch = arrow::compute::concat_batches(&schema, &parts).unwrap();
        let spec = SortSpec::new([SortKey::sql(1, false), SortKey::sql(3, false)]);
        let what = format!("seed {seed} view case {case}: {} rows", batch.num_rows());
        let mut session = gpu
            .begin_sort(Arc::clone(&schema), spec.clone())
            .unwrap()
            .with_expected_rows(4096)
            .with_output_views(case % 2 == 0)
            .with_output_ranges(5000);
        session.release_input();
        for p in &parts {
            session.push(p).unwrap();
        }
        assert!(session.released_bytes() > 0, "{what}: nothing released");
        let mut rows = session.finish_sorted(None).unwrap();
        let mut got = vec![];
        while let Some(b) = rows.next_batch(5000).unwrap() {
            got.push(b);
        }
        let got = arrow::compute::concat_batches(&schema, &got).unwrap();
        let whole = check_session(gpu, &batch, &spec, &parts, 4096, None, &what);
        assert_eq!(got, whole.batch, "{what}");
    }
    assert!(released_any, "no random case released a column");
}

/// `got` holds `expected`'s rows, column for column (their Arrow data equal).
fn assert_same_rows(got: &RecordBatch, expected: &RecordBatch, what: &str) {
    assert_eq!(got.num_rows(), expected.num_rows(), "{what}");
    for (k, (a, b)) in got.columns().iter().zip(expected.columns()).enumerate() {
        assert!(
            a.to_data() == b.to_data(),
            "{what}: column {k} ({}) differs",
            a.data_type()
        );
    }
}

/// Sorted runs whose columns came down into the pinned pool, sorted again as a range merge
/// pushes them (each run's share in slices, run after run, a heap batch among them): the
/// device copies their values from where they lie (`bytes_in_place`), stages the rest (the
/// heap batch, views whose buffer indices rise, validity bits), and the rows are the CPU
/// backend's, with segments that cut the slices anywhere.
#[test]
fn pinned_runs_upload_from_where_they_lie() {
    let Some(ref gpu) = backend() else { return };
    assert!(
        gpusort_cuda::GpuOptions::from_env().unwrap().direct_uploads,
        "GPUSORT_DIRECT_UPLOADS=0 is set: this test needs uploads in place"
    );
    let (mut rng, seed) = rng_from_env(0x5e55_1014);
    for case in 0..8 {
        let table = match case % 2 {
            0 => {
                let n = rng.random_range(1_000..200_000);
                fixed_table(&mut rng, n)
            }
            _ => {
                let batches = view_batches(&mut rng, 30);
                arrow::compute::concat_batches(&batches[0].schema(), &batches).unwrap()
            }
        };
        let spec = SortSpec::new([SortKey::sql(0, false)]);
        // Three runs, each sorted on the GPU: their columns are pinned pool buffers.
        let n = table.num_rows();
        let runs: Vec<RecordBatch> = [(0, n / 3), (n / 3, n / 2 - n / 3), (n / 2, n - n / 2)]
            .into_iter()
            .map(|(offset, len)| {
                let mut s = gpu.begin_sort(table.schema(), spec.clone()).unwrap();
                s.push(&table.slice(offset, len)).unwrap();
                s.finish(None).unwrap().batch
            })
            .collect();
        let mut parts = vec![];
        for (r, run) in runs.iter().enumerate() {
            parts.extend(split(&mut rng, run, 5_000));
            if r == 0 && run.num_rows() > 10 {
                // A batch of heap memory (a copy), as a spilled run reads back.
                let rows = UInt32Array::from_iter_values(1..run.num_rows() as u32 / 2);
                let copy = arrow::compute::take_record_batch(run, &rows).unwrap();
                parts.push(copy);
            }
        }
        let batch = arrow::compute::concat_batches(&table.schema(), &parts).unwrap();
        let segment_rows = [64, 1000, 1 << 20][case % 3];
        let what = format!(
            "seed {seed} case {case}: {} rows in {} slices of 3 runs, segments of {segment_rows}",
            batch.num_rows(),
            parts.len()
        );
        let out = check_session(gpu, &batch, &spec, &parts, segment_rows, None, &what);
        let stats = &out.stats;
        assert!(
            stats.bytes_in_place > 0 && stats.bytes_in_place < stats.bytes_to_device,
            "{what}: {} of {} bytes copied in place",
            stats.bytes_in_place,
            stats.bytes_to_device
        );
    }
}
