//! The `gpusort` binary end to end: sorts of `testdata/orders.parquet` and of small tables
//! made here, checked against arrow's `lexsort_to_indices` (the output is sorted by the ORDER
//! BY and is a permutation of the input), the output's metadata, and every error the tool
//! promises a one-line cause for — with exit code 1 and nothing left in the output directory.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use arrow::array::{
    ArrayRef, Float64Array, Int64Array, RecordBatch, StringArray, TimestampMillisecondArray, UInt32Array,
};
use arrow::compute::{SortColumn, SortOptions, concat_batches, lexsort_to_indices, take};
use arrow::datatypes::{DataType, Field, Schema, TimeUnit};
use arrow::row::{RowConverter, SortField};
use assert_cmd::Command;
use parquet::arrow::ArrowWriter;
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use parquet::basic::Compression;
use parquet::file::metadata::{ParquetMetaData, SortingColumn};
use parquet::file::properties::WriterProperties;
use predicates::prelude::*;

fn orders() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testdata/orders.parquet")
}

fn gpusort() -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_gpusort"));
    // Kernels compiled by a GPU run of the tests stay out of the user's cache.
    cmd.env("GPUSORT_KERNEL_CACHE", "off");
    cmd
}

/// A deterministic table of `rows` rows: a unique `id`, a nullable string `name`, a low
/// cardinality `city` with nulls, a nullable float `score` and a nullable timestamp `seen`.
fn people(rows: usize, seed: u64) -> RecordBatch {
    let mut state = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let cities = ["Lisbon", "Oslo", "Lima", "Osaka", "Bern"];
    let mut ids: Vec<i64> = (0..rows as i64).map(|i| i * 3 + seed as i64 * 1_000_000).collect();
    for i in (1..ids.len()).rev() {
        ids.swap(i, (next() % (i as u64 + 1)) as usize);
    }
    let name: StringArray = (0..rows)
        .map(|_| {
            let r = next();
            (r % 10 != 0).then(|| format!("name-{:04}", r % 700))
        })
        .collect();
    let city: StringArray = (0..rows)
        .map(|_| {
            let r = next();
            (r % 7 != 0).then(|| cities[(r % 5) as usize])
        })
        .collect();
    let score: Float64Array = (0..rows)
        .map(|_| {
            let r = next();
            (r % 9 != 0).then(|| (r % 2000) as f64 / 8.0 - 100.0)
        })
        .collect();
    let seen: TimestampMillisecondArray = (0..rows)
        .map(|_| {
            let r = next();
            (r % 5 != 0).then(|| 1_700_000_000_000 + (r % 100_000) as i64 * 1000)
        })
        .collect();
    let schema = Arc::new(Schema::new(vec![
        Field::new("id", DataType::Int64, false),
        Field::new("name", DataType::Utf8, true),
        Field::new("city", DataType::Utf8, true),
        Field::new("score", DataType::Float64, true),
        Field::new("seen", DataType::Timestamp(TimeUnit::Millisecond, None), true),
    ]));
    RecordBatch::try_new(
        schema,
        vec![
            Arc::new(Int64Array::from(ids)),
            Arc::new(name),
            Arc::new(city),
            Arc::new(score),
            Arc::new(seen),
        ],
    )
    .unwrap()
}

fn write_parquet(path: &Path, batch: &RecordBatch) {
    let props = WriterProperties::builder()
        .set_max_row_group_row_count(Some(1000))
        .build();
    let mut w = ArrowWriter::try_new(File::create(path).unwrap(), batch.schema(), Some(props)).unwrap();
    w.write(batch).unwrap();
    w.close().unwrap();
}

/// The file's rows as one batch, and its metadata.
fn read_parquet(path: &Path) -> (RecordBatch, Arc<ParquetMetaData>) {
    let builder = ParquetRecordBatchReaderBuilder::try_new(File::open(path).unwrap()).unwrap();
    let meta = Arc::clone(builder.metadata());
    let schema = Arc::clone(builder.schema());
    let batches: Vec<RecordBatch> = builder.build().unwrap().collect::<Result<_, _>>().unwrap();
    (concat_batches(&schema, &batches).unwrap(), meta)
}

/// One ORDER BY key: column, descending, nulls first.
type Key = (&'static str, bool, bool);

/// `output` is `input` sorted by `keys`: its key columns equal those of the input sorted by
/// arrow's `lexsort_to_indices`, and its rows are the input's rows (as a multiset).
fn assert_sorted_permutation(input: &RecordBatch, output: &RecordBatch, keys: &[Key]) {
    assert_eq!(
        output.schema().fields(),
        input.schema().fields(),
        "the output keeps the input's schema"
    );
    assert_eq!(output.num_rows(), input.num_rows());
    let columns: Vec<SortColumn> = keys
        .iter()
        .map(|&(name, descending, nulls_first)| SortColumn {
            values: Arc::clone(input.column_by_name(name).unwrap()),
            options: Some(SortOptions {
                descending,
                nulls_first,
            }),
        })
        .collect();
    let order = lexsort_to_indices(&columns, None).unwrap();
    for &(name, ..) in keys {
        let expected = take(input.column_by_name(name).unwrap().as_ref(), &order, None).unwrap();
        assert_eq!(
            output.column_by_name(name).unwrap().as_ref(),
            expected.as_ref(),
            "key column {name} is not in ORDER BY order"
        );
    }
    assert_eq!(
        sorted_rows(input),
        sorted_rows(output),
        "the output is not a permutation of the input"
    );
}

/// Every row of `batch` in arrow's row format, sorted: equal for two batches exactly when they
/// hold the same multiset of rows.
fn sorted_rows(batch: &RecordBatch) -> Vec<Vec<u8>> {
    let fields = batch
        .schema()
        .fields()
        .iter()
        .map(|f| SortField::new(f.data_type().clone()))
        .collect();
    let converter = RowConverter::new(fields).unwrap();
    let rows = converter.convert_columns(batch.columns()).unwrap();
    let mut out: Vec<Vec<u8>> = rows.iter().map(|r| r.as_ref().to_vec()).collect();
    out.sort();
    out
}

/// Each row group's `sorting_columns` as (leaf index, descending, nulls first).
fn sorting_columns(meta: &ParquetMetaData) -> Vec<Vec<(i32, bool, bool)>> {
    meta.row_groups()
        .iter()
        .map(|g| {
            g.sorting_columns()
                .map(|s| {
                    s.iter()
                        .map(|c: &SortingColumn| (c.column_idx, c.descending, c.nulls_first))
                        .collect()
                })
                .unwrap_or_default()
        })
        .collect()
}

/// The names in `dir`.
fn listing(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

/// Runs `gpusort` with `args`, which must fail with exit code 1 and exactly one line on
/// stderr, `gpusort: error: ...` containing `message`; and `out_dir` must be as empty as
/// before.
fn assert_fails(args: &[&str], message: &str, out_dir: &Path) {
    let before = listing(out_dir);
    let out = gpusort().args(args).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "args {args:?}, stderr: {stderr}");
    assert!(stderr.starts_with("gpusort: error: "), "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "one line: {stderr}");
    assert!(stderr.contains(message), "{stderr:?} does not say {message:?}");
    assert_eq!(listing(out_dir), before, "something was left in {}", out_dir.display());
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

#[test]
fn sorts_orders_with_metadata_progress_and_summary() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("sorted.parquet");
    let assert = gpusort()
        .args([
            "sort",
            s(&orders()),
            "-o",
            s(&out),
            "--order-by",
            "amount DESC, order_id",
        ])
        .assert()
        .success();
    let stderr = String::from_utf8_lossy(&assert.get_output().stderr).into_owned();
    // Not a terminal: plain progress lines, then the summary.
    assert!(stderr.contains("gpusort: reading "), "{stderr}");
    assert!(stderr.contains("gpusort: writing "), "{stderr}");
    assert!(
        stderr.contains("gpusort: sorted 200,000 rows by amount DESC NULLS FIRST, order_id ASC NULLS LAST"),
        "{stderr}"
    );
    assert!(stderr.contains("  input    1 file, 4.09 MiB"), "{stderr}");
    assert!(
        stderr.contains("1 row group, zstd(3) on the CPU, sorting_columns recorded")
            || stderr.contains("1 row group, zstd on the GPU (nvCOMP 6."),
        "{stderr}"
    );
    assert!(stderr.contains("= planning "), "{stderr}");
    assert!(
        stderr.contains("  sorted   on the GPU (gpu cuda:") || stderr.contains("  sorted   on the CPU (cpu "),
        "{stderr}"
    );
    assert_eq!(listing(dir.path()), ["sorted.parquet"]);
    // Made like any new file, not with a temporary file's owner-only permissions.
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        let plain = dir.path().join("plain");
        File::create(&plain).unwrap();
        assert_eq!(mode(&out), mode(&plain));
        std::fs::remove_file(plain).unwrap();
    }

    let (input, _) = read_parquet(&orders());
    let (output, meta) = read_parquet(&out);
    assert_sorted_permutation(&input, &output, &[("amount", true, true), ("order_id", false, false)]);
    // amount is the fifth column, order_id the first.
    assert_eq!(sorting_columns(&meta), [vec![(4, true, true), (0, false, false)]]);
    let kv = meta.file_metadata().key_value_metadata().unwrap();
    assert!(kv.iter().any(|e| e.key == "gpusort.order_by"
        && e.value.as_deref() == Some("amount DESC NULLS FIRST, order_id ASC NULLS LAST")));
    assert!(matches!(
        meta.row_group(0).column(0).compression(),
        Compression::ZSTD(_)
    ));
}

#[test]
fn nulls_strings_small_row_groups_and_snappy_quietly() {
    let dir = tempfile::tempdir().unwrap();
    let input_path = dir.path().join("people.parquet");
    let input = people(5000, 1);
    write_parquet(&input_path, &input);
    let out = dir.path().join("out.parquet");
    gpusort()
        .args([
            "sort",
            s(&input_path),
            "-o",
            s(&out),
            "--order-by",
            "city NULLS FIRST, score DESC NULLS LAST, seen DESC, id",
            "--row-group-size",
            "1000",
            "--compression",
            "snappy",
            "--device",
            "cpu",
            "--quiet",
        ])
        // DataFusion's variables apply: the input is read in batches of 777 rows.
        .env("DATAFUSION_EXECUTION_BATCH_SIZE", "777")
        .assert()
        .success()
        .stdout("")
        .stderr("");
    // One it cannot read is a usage error that names it.
    gpusort()
        .args([
            "sort",
            s(&input_path),
            "-o",
            s(&dir.path().join("x.parquet")),
            "-k",
            "id",
        ])
        .env("DATAFUSION_EXECUTION_BATCH_SIZE", "many")
        .assert()
        .code(2)
        .stderr(predicate::str::contains("DATAFUSION_").and(predicate::str::contains("many")));
    let (output, meta) = read_parquet(&out);
    let keys = [
        ("city", false, true),
        ("score", true, false),
        ("seen", true, true),
        ("id", false, false),
    ];
    assert_sorted_permutation(&input, &output, &keys);
    assert_eq!(meta.num_row_groups(), 5);
    let expected = vec![(2, false, true), (3, true, false), (4, true, true), (0, false, false)];
    assert_eq!(sorting_columns(&meta), vec![expected; 5]);
    assert_eq!(meta.row_group(3).column(1).compression(), Compression::SNAPPY);
}

#[test]
fn directories_globs_and_files_make_one_table() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    std::fs::create_dir_all(data.join("more")).unwrap();
    let parts: Vec<RecordBatch> = (0..4).map(|i| people(700 + i * 100, 10 + i as u64)).collect();
    write_parquet(&data.join("part-0.parquet"), &parts[0]);
    write_parquet(&data.join("part-1.parquet"), &parts[1]);
    write_parquet(&data.join("more/part-2.parquet"), &parts[2]);
    let single = dir.path().join("single.parquet");
    write_parquet(&single, &parts[3]);
    // Skipped in a directory: markers, hidden files, other extensions.
    std::fs::write(data.join("_SUCCESS"), "").unwrap();
    std::fs::write(data.join(".part-9.parquet"), "junk").unwrap();
    std::fs::write(data.join("notes.txt"), "not data").unwrap();

    let out_dir = tempfile::tempdir().unwrap();
    let out = out_dir.path().join("all.parquet");
    let keys = [("name", false, false), ("id", true, true)];
    // A directory (at any depth) and a file; the file named again through a glob counts once.
    let pattern = format!("{}/single.*", s(dir.path()));
    let assert = gpusort()
        .args([
            "sort",
            s(&data),
            s(&single),
            &pattern,
            "-o",
            s(&out),
            "-k",
            "name, id DESC",
        ])
        .assert()
        .success();
    let stderr = String::from_utf8_lossy(&assert.get_output().stderr).into_owned();
    assert!(stderr.contains("  input    4 files, "), "{stderr}");
    let all = concat_batches(&parts[0].schema(), &parts).unwrap();
    let (output, _) = read_parquet(&out);
    assert_sorted_permutation(&all, &output, &keys);

    // A glob alone.
    let pattern = format!("{}/part-*.parquet", s(&data));
    gpusort()
        .args(["sort", &pattern, "-o", s(&out), "-k", "name, id DESC", "--force", "-q"])
        .assert()
        .success();
    let two = concat_batches(&parts[0].schema(), &parts[..2]).unwrap();
    let (output, _) = read_parquet(&out);
    assert_sorted_permutation(&two, &output, &keys);
    assert_eq!(listing(out_dir.path()), ["all.parquet"]);
}

#[test]
fn sorts_a_file_onto_itself_and_an_empty_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.parquet");
    let input = people(3000, 3);
    write_parquet(&path, &input);
    gpusort()
        .args(["sort", s(&path), "-o", s(&path), "-k", "score, id", "--force", "-q"])
        .assert()
        .success();
    let (output, _) = read_parquet(&path);
    assert_sorted_permutation(&input, &output, &[("score", false, false), ("id", false, false)]);
    assert_eq!(listing(dir.path()), ["t.parquet"]);
    // Sorted again another way: the file's metadata tells the new order only.
    gpusort()
        .args(["sort", s(&path), "-o", s(&path), "-k", "id DESC", "--force", "-q"])
        .assert()
        .success();
    let (output, meta) = read_parquet(&path);
    assert_sorted_permutation(&input, &output, &[("id", true, true)]);
    let recorded: Vec<_> = meta
        .file_metadata()
        .key_value_metadata()
        .unwrap()
        .iter()
        .filter(|kv| kv.key == "gpusort.order_by")
        .map(|kv| kv.value.clone().unwrap_or_default())
        .collect();
    assert_eq!(recorded, ["id DESC NULLS FIRST"]);
    assert_eq!(
        output.schema().metadata().get("gpusort.order_by").map(String::as_str),
        Some("id DESC NULLS FIRST")
    );

    let empty = dir.path().join("empty.parquet");
    write_parquet(&empty, &people(0, 4));
    let out = dir.path().join("empty-sorted.parquet");
    gpusort()
        .args(["sort", s(&empty), "-o", s(&out), "-k", "id"])
        .assert()
        .success()
        .stderr(predicate::str::contains("gpusort: sorted 0 rows by id ASC NULLS LAST"));
    let (output, _) = read_parquet(&out);
    assert_eq!(output.num_rows(), 0);
    assert_eq!(output.schema().fields(), input.schema().fields());
}

#[test]
fn bad_order_by_lists_and_unknown_columns() {
    let out_dir = tempfile::tempdir().unwrap();
    let out = out_dir.path().join("out.parquet");
    let run = |list: &str, message: &str| {
        assert_fails(
            &["sort", s(&orders()), "-o", s(&out), "--order-by", list],
            message,
            out_dir.path(),
        );
    };
    run(
        "amount, nope DESC",
        "--order-by: unknown column nope; the columns are: order_id, customer, city, status, amount, discount, \
         order_date, shipped_at, priority, express",
    );
    run(
        "amount DESC DESC",
        "--order-by \"amount DESC DESC\": expected a comma or the end of the list, found DESC",
    );
    run("amount LIMIT 5", "found LIMIT");
    run("amount; DROP TABLE t", "found ;");
    run("", "the list is empty");
    run("amount,", "--order-by \"amount,\": ");
    run("upper(city)", "upper(city) is not a column name");
    run("2", "sorting by position is not supported");
}

#[test]
fn inputs_that_are_not_parquet_truncated_damaged_missing_or_mismatched() {
    let dir = tempfile::tempdir().unwrap();
    let good = dir.path().join("good.parquet");
    write_parquet(&good, &people(2000, 5));
    let bytes = std::fs::read(&good).unwrap();

    let text = dir.path().join("notes.parquet");
    std::fs::write(&text, "id,name\n1,a\n").unwrap();
    let truncated = dir.path().join("truncated.parquet");
    std::fs::write(&truncated, &bytes[..bytes.len() / 2]).unwrap();
    // The footer's magic is there, but the metadata length points before the file's start.
    let damaged = dir.path().join("damaged.parquet");
    let mut broken = bytes.clone();
    let n = broken.len();
    broken[n - 8..n - 4].copy_from_slice(&u32::MAX.to_le_bytes());
    std::fs::write(&damaged, &broken).unwrap();
    // Another file whose score column is text.
    let other = dir.path().join("other.parquet");
    let p = people(100, 6);
    let score_text: StringArray = (0..100).map(|i| Some(format!("{i}"))).collect();
    let mut fields: Vec<Field> = p.schema().fields().iter().map(|f| f.as_ref().clone()).collect();
    fields[3] = Field::new("score", DataType::Utf8, true);
    let mut columns: Vec<ArrayRef> = p.columns().to_vec();
    columns[3] = Arc::new(score_text);
    write_parquet(
        &other,
        &RecordBatch::try_new(Arc::new(Schema::new(fields)), columns).unwrap(),
    );

    let out_dir = tempfile::tempdir().unwrap();
    let out = out_dir.path().join("out.parquet");
    let run = |inputs: &[&Path], message: &str| {
        let mut args = vec!["sort"];
        args.extend(inputs.iter().map(|p| s(p)));
        args.extend(["-o", s(&out), "-k", "id"]);
        assert_fails(&args, message, out_dir.path());
    };
    run(
        &[&good, &text],
        &format!("{}: not a Parquet file (it does not start with PAR1)", s(&text)),
    );
    run(
        &[&truncated],
        &format!(
            "{}: truncated or damaged Parquet file (it does not end with PAR1",
            s(&truncated)
        ),
    );
    run(
        &[&damaged],
        &format!("{}: truncated or damaged Parquet file (", s(&damaged)),
    );
    run(
        &[&good, &other],
        &format!(
            "inputs have different schemas: column score is Float64 in {} but Utf8 in {}",
            s(&good),
            s(&other)
        ),
    );
    let missing = dir.path().join("missing.parquet");
    run(&[&missing], &format!("{}: no such file or directory", s(&missing)));
    let pattern = dir.path().join("nothing-*.parquet");
    run(&[&pattern], "nothing-*.parquet: no file matches this pattern");
    let empty_dir = dir.path().join("empty");
    std::fs::create_dir(&empty_dir).unwrap();
    run(&[&empty_dir], "the directory holds no .parquet file");
}

#[cfg(unix)]
#[test]
fn outputs_that_exist_or_cannot_be_written() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("in.parquet");
    write_parquet(&input, &people(1500, 7));

    // An output that exists is kept as it is, unless --force.
    let out_dir = tempfile::tempdir().unwrap();
    let out = out_dir.path().join("out.parquet");
    std::fs::write(&out, "precious").unwrap();
    assert_fails(
        &["sort", s(&input), "-o", s(&out), "-k", "id"],
        &format!("{}: the output exists; use --force to replace it", s(&out)),
        out_dir.path(),
    );
    assert_eq!(std::fs::read(&out).unwrap(), b"precious");
    gpusort()
        .args(["sort", s(&input), "-o", s(&out), "-k", "id", "--force", "-q"])
        .assert()
        .success();
    assert_eq!(read_parquet(&out).0.num_rows(), 1500);
    assert_eq!(listing(out_dir.path()), ["out.parquet"]);

    // A directory that does not exist.
    let nowhere = out_dir.path().join("no/such/dir/out.parquet");
    assert_fails(
        &["sort", s(&input), "-o", s(&nowhere), "-k", "id"],
        "cannot write the output here: no such directory",
        out_dir.path(),
    );

    // A directory that cannot be written: read-only, or (as root, who may write there
    // anyway) a "directory" that is a file.
    use std::os::unix::fs::PermissionsExt;
    let locked = out_dir.path().join("locked");
    std::fs::create_dir(&locked).unwrap();
    std::fs::set_permissions(&locked, std::fs::Permissions::from_mode(0o555)).unwrap();
    let root_writes_anyway = File::create(locked.join("probe")).is_ok();
    let (target, message) = if root_writes_anyway {
        std::fs::remove_file(locked.join("probe")).unwrap();
        (
            input.join("out.parquet"),
            "cannot write the output here: not a directory",
        )
    } else {
        (
            locked.join("out.parquet"),
            "cannot write the output here: permission denied",
        )
    };
    assert_fails(&["sort", s(&input), "-o", s(&target), "-k", "id"], message, &locked);
    std::fs::set_permissions(&locked, std::fs::Permissions::from_mode(0o755)).unwrap();
    assert_eq!(listing(dir.path()), ["in.parquet"]);
}

#[test]
fn usage_errors_exit_with_2() {
    for (args, message) in [
        (
            vec![
                "sort",
                "x.parquet",
                "-o",
                "y.parquet",
                "-k",
                "id",
                "--compression",
                "gzip(10)",
            ],
            "gzip(10): the level of gzip must be 0 to 9",
        ),
        (
            vec!["sort", "x.parquet", "-o", "y.parquet", "-k", "id", "--device", "gpu0"],
            "a GPU number",
        ),
        (
            vec![
                "sort",
                "x.parquet",
                "-o",
                "y.parquet",
                "-k",
                "id",
                "--memory-limit",
                "lots",
            ],
            "8g",
        ),
        (
            vec![
                "sort",
                "x.parquet",
                "-o",
                "y.parquet",
                "-k",
                "id",
                "--row-group-size",
                "0",
            ],
            ">= 1",
        ),
        (vec!["sort", "x.parquet", "-k", "id"], "--output"),
    ] {
        gpusort()
            .args(&args)
            .assert()
            .code(2)
            .stderr(predicate::str::contains(message));
    }
}

#[test]
fn explain_prints_the_plan_sort_would_run() {
    let assert = gpusort()
        .args(["explain", s(&orders()), "--order-by", "city NULLS FIRST, amount DESC"])
        .assert()
        .success();
    let stdout = String::from_utf8_lossy(&assert.get_output().stdout).into_owned();
    assert!(stdout.contains("inputs    1 file, 200,000 rows, 4.09 MiB"), "{stdout}");
    assert!(
        stdout.contains("order by  city ASC NULLS FIRST, amount DESC NULLS FIRST"),
        "{stdout}"
    );
    assert!(
        stdout.contains("GpuSortExec: expr=[city@2 ASC, amount@4 DESC]"),
        "{stdout}"
    );
    assert!(stdout.contains("DataSourceExec"), "{stdout}");
    assert!(stdout.contains("sort on   "), "{stdout}");
    // Without a memory limit, the sort may read its input on the GPU (under a GPU budget too,
    // in runs); under one, or on the CPU, not.
    assert!(stdout.contains("device_scan=1 files"), "{stdout}");
    let assert = gpusort()
        .args(["explain", s(&orders()), "-k", "amount", "--gpu-memory-limit", "4g"])
        .assert()
        .success();
    let stdout = String::from_utf8_lossy(&assert.get_output().stdout).into_owned();
    assert!(stdout.contains("device_scan=1 files"), "{stdout}");
    for limits in [["--memory-limit", "1g"], ["--device", "cpu"]] {
        let assert = gpusort()
            .args(["explain", s(&orders()), "-k", "amount"])
            .args(limits)
            .assert()
            .success();
        let stdout = String::from_utf8_lossy(&assert.get_output().stdout).into_owned();
        assert!(
            stdout.contains("GpuSortExec") && !stdout.contains("device_scan"),
            "{stdout}"
        );
    }

    let assert = gpusort()
        .args([
            "explain",
            s(&orders()),
            "-k",
            "amount",
            "--no-gpusort",
            "--memory-limit",
            "1g",
        ])
        .assert()
        .success();
    let stdout = String::from_utf8_lossy(&assert.get_output().stdout).into_owned();
    assert!(stdout.contains("SortExec: expr=[amount@4 ASC NULLS LAST]"), "{stdout}");
    assert!(!stdout.contains("GpuSortExec"), "{stdout}");
    assert!(
        stdout.contains("memory    1.00 GiB; beyond it the sort spills"),
        "{stdout}"
    );
}

#[test]
fn info_says_which_gpu_and_where_kernels_are_kept() {
    let cache = tempfile::tempdir().unwrap();
    let assert = gpusort()
        .arg("info")
        .env("GPUSORT_KERNEL_CACHE", cache.path())
        .assert()
        .success();
    let stdout = String::from_utf8_lossy(&assert.get_output().stdout).into_owned();
    for line in [
        "gpusort ",
        "GPU          ",
        "CUDA driver  ",
        "NVRTC        ",
        "CPU          ",
    ] {
        assert!(stdout.contains(line), "{line:?} missing from {stdout}");
    }
    assert!(
        stdout.contains(&format!("kernel cache {} (0 compiled kernel files", s(cache.path()))),
        "{stdout}"
    );
    gpusort()
        .arg("info")
        .assert()
        .success()
        .stdout(predicate::str::contains("kernel cache off (GPUSORT_KERNEL_CACHE=off)"));
}

/// Whether this build of datafusion-gpusort sorts beyond memory (spills runs and merges them).
fn external_sort_supported() -> bool {
    use datafusion::common::config::ExtensionOptions;
    datafusion_gpusort::GpuSortConfig::default()
        .entries()
        .iter()
        .any(|e| e.key == "max_run_rows")
}

#[test]
fn a_memory_limit_below_the_data_spills_or_says_so() {
    let out_dir = tempfile::tempdir().unwrap();
    let out = out_dir.path().join("out.parquet");
    let orders = orders();
    let args = [
        "sort",
        s(&orders),
        "-o",
        s(&out),
        "-k",
        "customer, order_id",
        "--memory-limit",
        "8m",
    ];
    if external_sort_supported() {
        // The sort spills runs and merges them: the same result as in memory.
        let assert = gpusort().args(args).assert().success();
        let stderr = String::from_utf8_lossy(&assert.get_output().stderr).into_owned();
        assert!(stderr.contains("  spilled  "), "{stderr}");
        let (input, _) = read_parquet(&orders);
        let (output, _) = read_parquet(&out);
        assert_sorted_permutation(
            &input,
            &output,
            &[("customer", false, false), ("order_id", false, false)],
        );
    } else {
        // Without the external sort (before the spill issue landed) the sort must stop with
        // a clear cause and leave nothing.
        // (--quiet: no progress lines before the error line.)
        let mut quiet = args.to_vec();
        quiet.push("--quiet");
        assert_fails(&quiet, "out of memory under --memory-limit 8.00 MiB", out_dir.path());
    }
}

#[test]
fn row_checks_catch_a_wrong_order_and_a_lost_row() {
    // The checks above must be able to fail.
    let input = people(50, 9);
    let by_id = [("id", false, false)];
    let ids = input.column_by_name("id").unwrap();
    let order = arrow::compute::sort_to_indices(ids.as_ref(), None, None).unwrap();
    let sorted = take_rows(&input, &order);
    assert_sorted_permutation(&input, &sorted, &by_id);
    let unsorted = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        assert_sorted_permutation(&input, &input, &by_id)
    }));
    assert!(unsorted.is_err());
    let mut swapped: Vec<u32> = order.values().to_vec();
    swapped[0] = swapped[1];
    let duplicated = take_rows(&input, &UInt32Array::from(swapped));
    let lost = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        assert_sorted_permutation(&input, &duplicated, &[])
    }));
    assert!(lost.is_err());
}

fn take_rows(batch: &RecordBatch, indices: &UInt32Array) -> RecordBatch {
    let columns = batch
        .columns()
        .iter()
        .map(|c| take(c.as_ref(), indices, None).unwrap())
        .collect();
    RecordBatch::try_new(batch.schema(), columns).unwrap()
}

#[cfg(unix)]
#[test]
fn ctrl_c_removes_the_temporary_file_and_exits_130() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("in.parquet");
    write_parquet(&input, &people(300_000, 11));
    let out_dir = tempfile::tempdir().unwrap();
    let out = out_dir.path().join("out.parquet");
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_gpusort"));
    // SIGINT at its default disposition whatever the test runner's (in the background or
    // under nohup it is ignored, and gpusort rightly keeps ignoring it).
    // SAFETY: signal(2) is async-signal-safe, as code between fork and exec must be.
    unsafe {
        std::os::unix::process::CommandExt::pre_exec(&mut child, || {
            libc::signal(libc::SIGINT, libc::SIG_DFL);
            Ok(())
        });
    }
    let mut child = child
        .args(["sort", s(&input), "-o", s(&out), "-k", "name, id", "-q"])
        .env("GPUSORT_KERNEL_CACHE", "off")
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // The temporary file is made before anything is read: interrupt as soon as it is there.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while listing(out_dir.path()).is_empty() {
        assert!(std::time::Instant::now() < deadline, "no temporary file appeared");
        assert!(
            child.try_wait().unwrap().is_none(),
            "gpusort ended before it was interrupted"
        );
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    let temp = listing(out_dir.path());
    assert!(
        temp[0].starts_with(".out.parquet.") && temp[0].ends_with(".gpusort-tmp"),
        "{temp:?}"
    );
    // SAFETY: sends a signal to our own child process.
    assert_eq!(unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGINT) }, 0);
    let output = child.wait_with_output().unwrap();
    assert_eq!(output.status.code(), Some(130));
    assert_eq!(
        String::from_utf8_lossy(&output.stderr),
        "gpusort: error: interrupted by SIGINT\n"
    );
    assert_eq!(listing(out_dir.path()), Vec::<String>::new());
}

/// `rows` rows of decimals as Parquet stores them: `d` decimal(15, 2) as INT64 (which the tool
/// reads as 8-byte decimals), `p` decimal(7, 2) as INT32 and `w` decimal(25, 3) as fixed-length
/// bytes (read as 16-byte decimals), with nulls and ties, and a unique `id`.
fn decimals(rows: usize, seed: i64) -> RecordBatch {
    use arrow::array::Decimal128Array;
    let n = rows as i64;
    let d = Decimal128Array::from_iter(
        (0..n).map(|i| (i % 11 != 3).then_some(((i * 7919 + seed) % 997 - 500) as i128 * 1_000_003)),
    );
    let p = Decimal128Array::from_iter_values((0..n).map(|i| ((i * 31 + seed) % 41 - 20) as i128 * 99_991));
    let w = Decimal128Array::from_iter(
        (0..n).map(|i| (i % 13 != 0).then_some(((i * 104_729 + seed) % 5003) as i128 * -1_000_000_000_007)),
    );
    let schema = Arc::new(Schema::new(vec![
        Field::new("id", DataType::Int64, false),
        Field::new("d", DataType::Decimal128(15, 2), true),
        Field::new("p", DataType::Decimal128(7, 2), false),
        Field::new("w", DataType::Decimal128(25, 3), true),
    ]));
    let ids = Int64Array::from_iter_values((0..n).map(|i| i * 2 + seed * 1_000_000));
    let columns: Vec<ArrayRef> = vec![
        Arc::new(ids),
        Arc::new(d.with_precision_and_scale(15, 2).unwrap()),
        Arc::new(p.with_precision_and_scale(7, 2).unwrap()),
        Arc::new(w.with_precision_and_scale(25, 3).unwrap()),
    ];
    RecordBatch::try_new(schema, columns).unwrap()
}

#[test]
fn decimals_stored_as_int64_are_read_narrow_and_written_as_they_were() {
    use datafusion::datasource::physical_plan::FileScanConfig;
    use datafusion::datasource::source::DataSourceExec;
    use datafusion::physical_plan::ExecutionPlan;
    use gpusort_cli::{PlanArgs, SortPlan};

    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    std::fs::create_dir(&data).unwrap();
    let parts = [decimals(3000, 1), decimals(2000, 2)];
    for (i, b) in parts.iter().enumerate() {
        write_parquet(&data.join(format!("part-{i}.parquet")), b);
    }
    let input = concat_batches(&parts[0].schema(), &parts).unwrap();

    // The plan reads `d` (and only `d`) as Decimal64, and every file of its scan carries its
    // schema so narrowed (the Parquet reader's hint: no cast after the read).
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let planned = runtime
        .block_on(SortPlan::try_new(&PlanArgs::new(
            vec![s(&data).to_string()],
            "d DESC, id",
        )))
        .unwrap();
    let types: Vec<DataType> = planned
        .plan
        .schema()
        .fields()
        .iter()
        .map(|f| f.data_type().clone())
        .collect();
    assert_eq!(
        types,
        [
            DataType::Int64,
            DataType::Decimal64(15, 2),
            DataType::Decimal128(7, 2),
            DataType::Decimal128(25, 3)
        ]
    );
    fn scans(plan: &Arc<dyn ExecutionPlan>, found: &mut Vec<FileScanConfig>) {
        if let Some(c) = plan
            .downcast_ref::<DataSourceExec>()
            .and_then(|s| s.data_source().downcast_ref::<FileScanConfig>())
        {
            found.push(c.clone());
        }
        plan.children().into_iter().for_each(|c| scans(c, found));
    }
    let mut found = vec![];
    scans(&planned.plan, &mut found);
    let files: Vec<_> = found
        .iter()
        .flat_map(|c| c.file_groups.iter().flat_map(|g| g.iter().cloned()))
        .collect();
    assert_eq!(files.len(), 2, "{found:?}");
    // The scans' schemas hinted, the sort is still told its files (it reads them on the GPU).
    let sort = planned
        .plan
        .downcast_ref::<datafusion_gpusort::GpuSortExec>()
        .expect("the sort");
    let scan = sort.device_scan().expect("the files told");
    assert_eq!(scan.files().len(), 2, "{scan:?}");
    for f in &files {
        let hint = f.arrow_schema.as_ref().expect("each file carries its schema");
        assert_eq!(
            hint.field_with_name("d").unwrap().data_type(),
            &DataType::Decimal64(15, 2)
        );
        assert_eq!(
            hint.field_with_name("w").unwrap().data_type(),
            &DataType::Decimal128(25, 3)
        );
    }
    drop(planned);

    // Sorted with and without the narrowing: the same file, of the input's schema and Parquet
    // types, in the reference order.
    for (order_by, keys) in [
        ("d DESC, id", vec![("d", true, true), ("id", false, false)]),
        (
            "p, d NULLS FIRST, w DESC, id",
            vec![
                ("p", false, false),
                ("d", false, true),
                ("w", true, true),
                ("id", false, false),
            ],
        ),
    ] {
        let mut outputs = vec![];
        for narrow in ["1", "0"] {
            let out = dir.path().join(format!("out-{narrow}.parquet"));
            gpusort()
                .env("GPUSORT_DECIMAL64", narrow)
                .args(["sort", s(&data), "-k", order_by, "-o", s(&out), "-f", "-q"])
                .assert()
                .success();
            outputs.push(std::fs::read(&out).unwrap());
            let (output, meta) = read_parquet(&out);
            assert_sorted_permutation(&input, &output, &keys);
            let physical: Vec<_> = meta
                .file_metadata()
                .schema_descr()
                .columns()
                .iter()
                .map(|c| c.physical_type())
                .collect();
            use parquet::basic::Type as T;
            assert_eq!(
                physical,
                [T::INT64, T::INT64, T::INT32, T::FIXED_LEN_BYTE_ARRAY],
                "{order_by}"
            );
        }
        assert!(
            outputs[0] == outputs[1],
            "{order_by}: the narrowed read wrote another file"
        );
    }

    let out = gpusort()
        .env("GPUSORT_DECIMAL64", "yes")
        .args(["sort", s(&data), "-k", "d", "-o", s(&dir.path().join("x.parquet"))])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("GPUSORT_DECIMAL64=yes: expected 0 or 1"));
    assert!(!dir.path().join("x.parquet").exists());
}
