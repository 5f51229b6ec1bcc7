//! The `gpusort` binary under bad conditions (issue 21): signals in the middle of a spilling
//! sort, closed and full standard streams, damaged data pages, a full spill directory, bad
//! options; each case asserts the exit code, a one-line `gpusort: error: ...` (or nothing),
//! no panic, and nothing left in the output directory and the spill directory. Also: codecs,
//! sizes, the summary's wording, the peak memory under `--memory-limit`, and one feature set
//! for the examples and the tool.

#![cfg(unix)]

use std::fs::File;
use std::io::{BufRead, BufReader};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use arrow::array::{Int64Array, RecordBatch, StringArray};
use arrow::datatypes::{DataType, Field, Schema};
use parquet::arrow::ArrowWriter;
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use parquet::basic::Compression;
use parquet::file::properties::WriterProperties;

fn orders() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testdata/orders.parquet")
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// `gpusort` with `args`, its kernel cache off, its system temporary directory `tmp`, and the
/// stop signals at their default disposition whatever the test runner's: a runner started in
/// the background or under `nohup` ignores SIGINT or SIGHUP, which gpusort then rightly keeps
/// ignoring.
fn gpusort(args: &[&str], tmp: &Path) -> Command {
    use std::os::unix::process::CommandExt as _;
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_gpusort"));
    cmd.args(args)
        .env("GPUSORT_KERNEL_CACHE", "off")
        .env("TMPDIR", tmp)
        .stdin(Stdio::null());
    // SAFETY: signal(2) is async-signal-safe, as code between fork and exec must be.
    unsafe {
        cmd.pre_exec(|| {
            for signal in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
                libc::signal(signal, libc::SIG_DFL);
            }
            Ok(())
        });
    }
    cmd
}

/// Every file and directory under `dir`, as paths relative to it.
/// Each of `dirs` is empty: the run left nothing behind in it.
fn assert_nothing_left(dirs: &[&Path]) {
    for dir in dirs {
        assert_eq!(everything_under(dir), Vec::<String>::new(), "{}", dir.display());
    }
}

fn everything_under(dir: &Path) -> Vec<String> {
    let mut out = vec![];
    let mut dirs = vec![dir.to_path_buf()];
    while let Some(d) = dirs.pop() {
        for entry in std::fs::read_dir(&d).unwrap() {
            let path = entry.unwrap().path();
            out.push(path.strip_prefix(dir).unwrap().display().to_string());
            if path.is_dir() {
                dirs.push(path);
            }
        }
    }
    out.sort();
    out
}

/// Bytes of the files under `dir`.
fn bytes_under(dir: &Path) -> u64 {
    let mut total = 0;
    let mut dirs = vec![dir.to_path_buf()];
    while let Some(d) = dirs.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else { continue };
        for entry in entries.flatten() {
            let path = entry.path();
            if path.is_dir() {
                dirs.push(path);
            } else if let Ok(meta) = entry.metadata() {
                total += meta.len();
            }
        }
    }
    total
}

/// The process failed as promised: `code`, exactly one stderr line starting with
/// `gpusort: error: ` and containing `message`, no panic.
fn assert_one_line_error(out: &Output, code: i32, message: &str) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(code), "stderr: {stderr}");
    assert!(stderr.starts_with("gpusort: error: "), "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "one line: {stderr}");
    assert!(stderr.contains(message), "{stderr:?} does not say {message:?}");
    assert!(!stderr.contains("panicked"), "{stderr}");
}

/// A spill-heavy input: `testdata/orders.parquet` copied `copies` times into `dir` (200,000 rows
/// each).
fn many_orders(dir: &Path, copies: usize) -> PathBuf {
    let inputs = dir.join("inputs");
    std::fs::create_dir(&inputs).unwrap();
    for i in 0..copies {
        std::fs::copy(orders(), inputs.join(format!("orders-{i}.parquet"))).unwrap();
    }
    inputs
}

/// Waits until `ready` holds, while `child` runs.
fn wait_for(child: &mut Child, what: &str, ready: impl Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(120);
    while !ready() {
        assert!(Instant::now() < deadline, "{what} did not happen");
        assert!(child.try_wait().unwrap().is_none(), "gpusort ended before {what}");
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// Sends `signal` to a spilling sort once `moment` holds (given the output and spill
/// directories), and checks it exits with 128 + `signal` and leaves nothing behind.
fn stop_a_spilling_sort(signal: libc::c_int, name: &str, moment: impl Fn(&Path, &Path) -> bool) {
    let dir = tempfile::tempdir().unwrap();
    let inputs = many_orders(dir.path(), 4);
    let (out_dir, spill, tmp) = (dir.path().join("out"), dir.path().join("spill"), dir.path().join("tmp"));
    for d in [&out_dir, &spill, &tmp] {
        std::fs::create_dir(d).unwrap();
    }
    let out = out_dir.join("sorted.parquet");
    let mut child = gpusort(
        &[
            "sort",
            s(&inputs),
            "-o",
            s(&out),
            "-k",
            "customer DESC, order_id",
            "--memory-limit",
            "8m",
            "--temp-dir",
            s(&spill),
            "--device",
            "cpu",
        ],
        &tmp,
    )
    .stdout(Stdio::null())
    .stderr(Stdio::piped())
    .spawn()
    .unwrap();
    wait_for(&mut child, "the moment to stop it", || moment(&out_dir, &spill));
    // SAFETY: sends a signal to our own child process.
    assert_eq!(unsafe { libc::kill(child.id() as libc::pid_t, signal) }, 0);
    let output = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(128 + signal), "{stderr}");
    assert_eq!(
        stderr.lines().last(),
        Some(format!("gpusort: error: interrupted by {name}").as_str()),
        "{stderr}"
    );
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert_nothing_left(&[&out_dir, &spill, &tmp]);
}

#[test]
fn ctrl_c_while_spilling_removes_the_spill_files() {
    // Stopped once a megabyte of spill files is there.
    stop_a_spilling_sort(libc::SIGINT, "SIGINT", |_, spill| bytes_under(spill) > 1 << 20);
}

#[test]
fn sigterm_while_writing_removes_the_partial_output_and_the_spill_files() {
    // Stopped once the hidden output holds some rows (the spill files are there until the
    // end).
    stop_a_spilling_sort(libc::SIGTERM, "SIGTERM", |out, spill| {
        bytes_under(out) > 64 << 10 && bytes_under(spill) > 0
    });
}

#[test]
fn sighup_while_reading_leaves_nothing() {
    stop_a_spilling_sort(libc::SIGHUP, "SIGHUP", |out, _| !everything_under(out).is_empty());
}

#[test]
fn an_ignored_sighup_stays_ignored() {
    // As under nohup: the sort goes on to the end.
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("sorted.parquet");
    let mut cmd = gpusort(
        &["sort", s(&orders()), "-o", s(&out), "-k", "order_id", "-q"],
        dir.path(),
    );
    // SAFETY: only sets a signal disposition between fork and exec.
    unsafe {
        cmd.pre_exec(|| {
            libc::signal(libc::SIGHUP, libc::SIG_IGN);
            Ok(())
        });
    }
    let mut child = cmd.spawn().unwrap();
    std::thread::sleep(Duration::from_millis(50));
    // SAFETY: sends a signal to our own child process.
    unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGHUP) };
    assert_eq!(child.wait().unwrap().code(), Some(0));
    assert_eq!(everything_under(dir.path()), ["sorted.parquet"]);
}

#[test]
fn a_closed_stderr_loses_the_progress_not_the_sort() {
    // `gpusort sort ... 2>&1 | head -1`
    let dir = tempfile::tempdir().unwrap();
    let inputs = many_orders(dir.path(), 2);
    let out = dir.path().join("sorted.parquet");
    let mut child = gpusort(&["sort", s(&inputs), "-o", s(&out), "-k", "amount"], dir.path())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut first = String::new();
    BufReader::new(child.stderr.take().unwrap())
        .read_line(&mut first)
        .unwrap();
    assert!(first.starts_with("gpusort: reading"), "{first}");
    // The reading end is closed here: later progress lines and the summary go nowhere.
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(0));
    let rows: usize = ParquetRecordBatchReaderBuilder::try_new(File::open(&out).unwrap())
        .unwrap()
        .metadata()
        .row_groups()
        .iter()
        .map(|g| g.num_rows() as usize)
        .sum();
    assert_eq!(rows, 400_000);
}

#[test]
fn explain_into_a_closed_pipe_ends_quietly() {
    // `gpusort explain ... | head -0`: the reader is gone before anything is written.
    let dir = tempfile::tempdir().unwrap();
    let mut child = gpusort(&["explain", s(&orders()), "-k", "amount"], dir.path())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdout.take());
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(141), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(String::from_utf8_lossy(&out.stderr), "");
    // Help into a closed pipe too.
    let mut child = gpusort(&["--help"], dir.path())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdout.take());
    let out = child.wait_with_output().unwrap();
    assert!(!String::from_utf8_lossy(&out.stderr).contains("panicked"));
}

#[cfg(target_os = "linux")]
#[test]
fn a_full_stdout_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    for args in [vec!["info"], vec!["explain", s(&orders()), "-k", "amount"]] {
        let out = gpusort(&args, dir.path())
            .stdout(File::create("/dev/full").unwrap())
            .output()
            .unwrap();
        assert_one_line_error(&out, 1, "writing to standard output: No space left on device");
    }
}

/// `good` and a copy of it whose column `name`, in row group 1, has a data page damaged: bytes
/// in the middle of its snappy data are overwritten until the parquet crate fails to read it.
fn damaged_copy(dir: &Path) -> (PathBuf, PathBuf) {
    let rows = 30_000;
    let schema = Arc::new(Schema::new(vec![
        Field::new("id", DataType::Int64, false),
        Field::new("name", DataType::Utf8, false),
    ]));
    let batch = RecordBatch::try_new(
        Arc::clone(&schema),
        vec![
            Arc::new(Int64Array::from_iter_values((0..rows).map(|i| (i * 7919) % rows))),
            Arc::new(StringArray::from_iter_values(
                (0..rows).map(|i| format!("name-{:08}-{}", (i * 104_729) % 1_000_003, i % 13)),
            )),
        ],
    )
    .unwrap();
    let props = WriterProperties::builder()
        .set_compression(Compression::SNAPPY)
        .set_dictionary_enabled(false)
        .set_max_row_group_row_count(Some(10_000))
        .build();
    let good = dir.join("good.parquet");
    let mut w = ArrowWriter::try_new(File::create(&good).unwrap(), schema, Some(props)).unwrap();
    w.write(&batch).unwrap();
    w.close().unwrap();

    let bytes = std::fs::read(&good).unwrap();
    let meta = ParquetRecordBatchReaderBuilder::try_new(File::open(&good).unwrap())
        .unwrap()
        .metadata()
        .clone();
    let chunk = meta.row_group(1).column(1);
    let (start, len) = (chunk.data_page_offset() as usize, chunk.compressed_size() as usize);
    let bad = dir.join("bad.parquet");
    for at in (start + len / 2..start + len - 64).step_by(97) {
        let mut broken = bytes.clone();
        broken[at..at + 48].fill(0xff);
        std::fs::write(&bad, &broken).unwrap();
        let reads = ParquetRecordBatchReaderBuilder::try_new(File::open(&bad).unwrap())
            .and_then(|b| b.build())
            .map(|r| r.collect::<Result<Vec<_>, _>>().is_ok())
            .unwrap_or(false);
        if !reads {
            return (good, bad);
        }
    }
    panic!("no damage the parquet crate notices");
}

#[test]
fn a_damaged_data_page_names_the_file_row_group_and_column() {
    let dir = tempfile::tempdir().unwrap();
    let (good, bad) = damaged_copy(dir.path());
    let out_dir = dir.path().join("out");
    let (spill, tmp) = (dir.path().join("spill"), dir.path().join("tmp"));
    for d in [&out_dir, &spill, &tmp] {
        std::fs::create_dir(d).unwrap();
    }
    let out = out_dir.join("sorted.parquet");
    let output = gpusort(
        &[
            "sort",
            s(&good),
            s(&bad),
            "-o",
            s(&out),
            "-k",
            "name",
            "-q",
            "--temp-dir",
            s(&spill),
        ],
        &tmp,
    )
    .output()
    .unwrap();
    assert_one_line_error(
        &output,
        1,
        &format!(
            "{}: truncated or damaged Parquet file (row group 1, column name: ",
            s(&bad)
        ),
    );
    let stderr = String::from_utf8_lossy(&output.stderr);
    for noise in ["External", "IO error", "Io error", "Parquet argument error"] {
        assert!(!stderr.contains(noise), "{stderr}");
    }
    assert_nothing_left(&[&out_dir, &spill, &tmp]);
}

#[test]
fn a_full_spill_directory_says_which_it_is() {
    let dir = tempfile::tempdir().unwrap();
    let inputs = many_orders(dir.path(), 2);
    let out_dir = dir.path().join("out");
    let (spill, tmp) = (dir.path().join("spill"), dir.path().join("tmp"));
    for d in [&out_dir, &spill, &tmp] {
        std::fs::create_dir(d).unwrap();
    }
    let out = out_dir.join("sorted.parquet");
    let sort = |extra: &[&str]| {
        let mut args = vec![
            "sort",
            s(&inputs),
            "-o",
            s(&out),
            "-k",
            "customer, order_id",
            "--memory-limit",
            "8m",
            "--temp-dir",
            s(&spill),
            "-q",
        ];
        args.extend(extra);
        gpusort(&args, &tmp)
    };
    // DataFusion's disk manager stops at --disk-limit.
    let output = sort(&["--disk-limit", "1MiB"]).output().unwrap();
    assert_one_line_error(&output, 1, &format!("the spill directory {}/gpusort-", s(&spill)));
    assert!(
        String::from_utf8_lossy(&output.stderr).contains("is full (the spill files reached --disk-limit 1.00 MiB)"),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    // A disk that is full: files may not grow past 2 MiB (SIGXFSZ ignored, so writes fail
    // with EFBIG as on a full disk).
    let mut cmd = sort(&[]);
    // SAFETY: only sets a resource limit and a signal disposition between fork and exec.
    unsafe {
        cmd.pre_exec(|| {
            libc::signal(libc::SIGXFSZ, libc::SIG_IGN);
            let limit = libc::rlimit {
                rlim_cur: 2 << 20,
                rlim_max: 2 << 20,
            };
            libc::setrlimit(libc::RLIMIT_FSIZE, &limit);
            Ok(())
        });
    }
    let output = cmd.output().unwrap();
    assert_one_line_error(&output, 1, &format!("the spill directory {}/gpusort-", s(&spill)));
    assert!(String::from_utf8_lossy(&output.stderr).contains("File too large"));
    assert_nothing_left(&[&out_dir, &spill, &tmp]);
}

#[test]
fn bad_usage_is_one_line_with_exit_2() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out.parquet");
    let orders = orders();
    let o = s(&orders);
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (vec![], "no command given: sort, explain or info; try --help"),
        (vec!["srot"], "unrecognized subcommand 'srot'"),
        (
            vec!["sort", o, "-k", "id"],
            "the following required arguments were not provided: --output <OUTPUT>",
        ),
        (
            vec!["sort", o, "-o", s(&out), "-k", "id", "--bogus"],
            "unexpected argument '--bogus' found",
        ),
        (
            vec!["sort", o, "-o", s(&out), "-k", "id", "--memory-limit", "lots"],
            "invalid value 'lots' for '--memory-limit <SIZE>'",
        ),
        (
            vec!["sort", o, "-o", s(&out), "-k", "id", "--compression", "zstd(23)"],
            "zstd(23): the level of zstd must be 1 to 22",
        ),
        (
            vec!["sort", o, "-o", s(&out), "-k", "id", "--compression", "brotli(12)"],
            "brotli(12): the level of brotli must be 0 to 11",
        ),
        (
            vec!["sort", o, "-o", s(&out), "-k", "id", "--strategy", "quick"],
            "msd-indirect",
        ),
        // A GPU that is not there fails before anything runs, even for a few rows.
        (
            vec!["sort", o, "-o", s(&out), "-k", "amount", "--device", "7"],
            "--device 7: GPU 7 is not usable",
        ),
    ];
    for (args, message) in cases {
        let output = gpusort(&args, dir.path()).output().unwrap();
        assert_one_line_error(&output, 2, message);
        assert_eq!(everything_under(dir.path()), Vec::<String>::new(), "{args:?}");
    }
    // An output that names a directory, existing or not, is refused before the sort.
    let newdir = format!("{}/newdir/", s(dir.path()));
    for target in [newdir.as_str(), s(dir.path())] {
        let output = gpusort(&["sort", o, "-o", target, "-k", "amount"], dir.path())
            .output()
            .unwrap();
        assert_eq!(
            output.status.code(),
            Some(2),
            "{}",
            String::from_utf8_lossy(&output.stderr)
        );
        assert_one_line_error(&output, 2, "directory");
        assert_nothing_left(&[dir.path()]);
    }
}

#[test]
fn sizes_as_duckdb_and_datafusion_cli_write_them() {
    let dir = tempfile::tempdir().unwrap();
    for (size, shown) in [
        ("8GiB", "memory    8.00 GiB;"),
        ("8g", "memory    8.00 GiB;"),
        ("8GB", "memory    7.45 GiB;"),
        ("512MiB", "memory    512.0 MiB;"),
        ("0", "memory    no limit"),
    ] {
        let out = gpusort(
            &["explain", s(&orders()), "-k", "amount", "--memory-limit", size],
            dir.path(),
        )
        .output()
        .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(stdout.contains(shown), "{size}: {stdout}");
    }
    // 0: no limit for both limits.
    let out_path = dir.path().join("o.parquet");
    let out = gpusort(
        &[
            "sort",
            s(&orders()),
            "-o",
            s(&out_path),
            "-k",
            "amount",
            "--memory-limit",
            "0",
            "--gpu-memory-limit",
            "0",
        ],
        dir.path(),
    )
    .output()
    .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
}

#[test]
fn every_codec_the_parquet_crate_writes() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("o.parquet");
    for (codec, expected) in [
        ("none", Compression::UNCOMPRESSED),
        ("snappy", Compression::SNAPPY),
        ("lz4_raw", Compression::LZ4_RAW),
        ("lz4", Compression::LZ4),
        (
            "gzip(9)",
            Compression::GZIP(parquet::basic::GzipLevel::try_new(9).unwrap()),
        ),
        (
            "brotli(5)",
            Compression::BROTLI(parquet::basic::BrotliLevel::try_new(5).unwrap()),
        ),
        (
            "zstd(19)",
            Compression::ZSTD(parquet::basic::ZstdLevel::try_new(19).unwrap()),
        ),
    ] {
        let output = gpusort(
            &[
                "sort",
                s(&orders()),
                "-o",
                s(&out),
                "-k",
                "order_id",
                "--compression",
                codec,
                "--force",
            ],
            dir.path(),
        )
        .output()
        .unwrap();
        assert_eq!(
            output.status.code(),
            Some(0),
            "{codec}: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        let stderr = String::from_utf8_lossy(&output.stderr);
        let reader = ParquetRecordBatchReaderBuilder::try_new(File::open(&out).unwrap()).unwrap();
        let got = reader.metadata().row_group(0).column(0).compression();
        // The file records the codec, not its level.
        assert_eq!(
            std::mem::discriminant(&got),
            std::mem::discriminant(&expected),
            "{codec}"
        );
        let rows: usize = reader.build().unwrap().map(|b| b.unwrap().num_rows()).sum();
        assert_eq!(rows, 200_000, "{codec}");
        let shown = if codec == "none" { "uncompressed" } else { codec };
        // zstd says where its pages were compressed (nvCOMP where a GPU and nvCOMP are there).
        let said = if codec.starts_with("zstd") {
            stderr.contains(&format!(", {shown} on the CPU, sorting_columns"))
                || stderr.contains(", zstd on the GPU (nvCOMP 6.")
        } else {
            stderr.contains(&format!(", {shown}, sorting_columns"))
        };
        assert!(said, "{codec}: {stderr}");
    }
}

#[test]
fn the_summary_and_explain_say_what_happened() {
    let dir = tempfile::tempdir().unwrap();
    let tiny = dir.path().join("tiny.parquet");
    let schema = Arc::new(Schema::new(vec![Field::new("x", DataType::Int64, false)]));
    let batch = RecordBatch::try_new(
        Arc::clone(&schema),
        vec![Arc::new(Int64Array::from(vec![5, 3, 1, 4, 2]))],
    )
    .unwrap();
    let mut w = ArrowWriter::try_new(File::create(&tiny).unwrap(), schema, None).unwrap();
    w.write(&batch).unwrap();
    w.close().unwrap();
    let out = dir.path().join("o.parquet");
    let output = gpusort(&["sort", s(&tiny), "-o", s(&out), "-k", "x"], dir.path())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(0), "{stderr}");
    // Five rows have no meaningful rate.
    assert!(!stderr.contains("rows/s"), "{stderr}");

    // A spilled sort: the phase after reading is "merging" in the summary as in the progress,
    // and the summary gives the bytes spilled and how many times each row was written.
    let output = gpusort(
        &[
            "sort",
            s(&orders()),
            "-o",
            s(&out),
            "-k",
            "customer, order_id",
            "--memory-limit",
            "8m",
            "--force",
        ],
        dir.path(),
    )
    .output()
    .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(0), "{stderr}");
    assert!(stderr.contains("gpusort: merging "), "{stderr}");
    assert!(stderr.contains(" + merging "), "{stderr}");
    assert!(!stderr.contains("sorting+merging"), "{stderr}");
    assert!(stderr.contains("  spilled  "), "{stderr}");
    assert!(stderr.contains(" files, each row written "), "{stderr}");
    assert!(
        stderr.contains("(memory limit 8.00 MiB, of which the writer 1.00 MiB)"),
        "{stderr}"
    );
    assert!(stderr.contains(" rows/s)"), "{stderr}");

    let output = gpusort(
        &["explain", s(&orders()), "-k", "amount", "--device", "cpu"],
        dir.path(),
    )
    .output()
    .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        stdout.contains("sort on   gpusort's CPU backend (--device cpu)"),
        "{stdout}"
    );
    assert!(stdout.contains("strategy  auto: "), "{stdout}");
}

/// The child's peak resident size, bytes (`wait4`'s `ru_maxrss`), and its exit code.
#[allow(clippy::zombie_processes, reason = "wait4 reaps the child")]
fn peak_rss(mut cmd: Command) -> (u64, Option<i32>) {
    let child = cmd.stdout(Stdio::null()).stderr(Stdio::null()).spawn().unwrap();
    let mut status = 0;
    // SAFETY: a zeroed rusage for wait4 to fill.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: waits for our own child, filling `status` and `usage`.
    let pid = unsafe { libc::wait4(child.id() as libc::pid_t, &mut status, 0, &mut usage) };
    assert_eq!(pid, child.id() as libc::pid_t);
    let code = libc::WIFEXITED(status).then(|| libc::WEXITSTATUS(status));
    (usage.ru_maxrss as u64 * 1024, code)
}

/// What the process holds beyond `--memory-limit`: the binary (a debug build's: ~80 MiB
/// resident before it reads a row), threads and their stacks, DataFusion's Parquet scan
/// buffers (outside its memory pool) and what the allocator has not returned yet. Measured
/// 150 to 200 MiB over the limit for the debug binary at 16 to 256 MiB limits, while the tests
/// run beside it.
const FIXED_OVERHEAD: u64 = 256 << 20;

#[test]
fn peak_memory_follows_the_limit() {
    let dir = tempfile::tempdir().unwrap();
    let inputs = many_orders(dir.path(), 8);
    let out = dir.path().join("o.parquet");
    let limit: u64 = 32 << 20;
    let sort = |extra: &[&str]| {
        let mut args = vec![
            "sort",
            s(&inputs),
            "-o",
            s(&out),
            "-k",
            "customer DESC, order_id",
            "-q",
            "--force",
        ];
        args.extend(extra);
        gpusort(&args, dir.path())
    };
    let (unbounded, code) = peak_rss(sort(&[]));
    assert_eq!(code, Some(0));
    let (bounded, code) = peak_rss(sort(&["--memory-limit", "32MiB"]));
    assert_eq!(code, Some(0));
    eprintln!(
        "peak resident: {} MiB with no limit, {} MiB at --memory-limit 32MiB",
        unbounded >> 20,
        bounded >> 20
    );
    assert!(bounded < unbounded / 2, "the limit should matter");
    assert!(
        bounded <= limit + FIXED_OVERHEAD,
        "{} MiB at --memory-limit 32MiB: more than the limit and {} MiB",
        bounded >> 20,
        FIXED_OVERHEAD >> 20
    );
}

#[test]
fn one_build_makes_the_examples_and_the_tool() {
    // Every package both need is built with the same features: a release build of the
    // examples leaves nothing for `cargo build --release -p gpusort-cli` to rebuild but the
    // tool's own dependencies.
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    type Features = std::collections::BTreeMap<String, std::collections::BTreeSet<String>>;
    let features = |package: &str| -> Features {
        let out = Command::new(&cargo)
            .args([
                "tree",
                "--offline",
                "-p",
                package,
                "-e",
                "normal,build",
                "--prefix",
                "none",
                "-f",
                "{p}|{f}",
            ])
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let mut features = Features::new();
        for line in String::from_utf8_lossy(&out.stdout).lines() {
            if let Some((p, f)) = line.trim_end_matches(" (*)").split_once('|') {
                let name = p.split(" (").next().unwrap().to_string();
                features.entry(name).or_default().insert(f.to_string());
            }
        }
        features
    };
    let (examples, tool) = (features("gpusort-examples"), features("gpusort-cli"));
    let differ: Vec<String> = examples
        .iter()
        .filter_map(|(p, f)| tool.get(p).filter(|g| *g != f).map(|g| format!("{p}: {f:?} / {g:?}")))
        .collect();
    assert!(differ.is_empty(), "features differ: {differ:#?}");
}
