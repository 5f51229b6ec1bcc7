//! A Parquet file's rows sorted on the GPU two ways, in the same command (issue 20, step 4):
//!
//! - **host**: what the tool does today, the Parquet crate's reader on every core (a row group
//!   a task) feeding a GPU session batch by batch (staged, uploaded while the next row groups
//!   decode, the host's copy released as in `gpusort sort`);
//! - **device**: as `gpusort sort` reads its input on the GPU: a few row groups a call, their
//!   bytes read into pinned memory ([`FileBytes::read_range`], a block the next call reuses),
//!   decoded on the GPU ([`GpuPageDecoder::decode_at`]) and joined to the session as device
//!   batches, nothing of the input on the host.
//!
//! Each sorts by the ORDER BY lists of TPC-H lineitem named (1: `l_shipdate, l_orderkey,
//! l_linenumber`; 3: `l_comment, l_orderkey, l_linenumber`), and the sorted rows come down in
//! ranges of a million rows as `gpusort sort`'s writer takes them. Round 0 checks that both
//! ways give the same rows, range by range; later rounds time each way's input (reading and
//! pushing), sort (`finish_sorted`) and output (every range down), and print the ratio.
//!
//! ```text
//! cargo bench -p gpusort-parquet --bench device_sort -- lineitem.parquet [lists, e.g. 1,3] [row groups a call]
//! ```
//!
//! Needs a GPU and nvCOMP 6 (`GPUSORT_NVCOMP`).

mod common;

use std::sync::Arc;
use std::time::Instant;

use arrow::array::RecordBatch;
use arrow::datatypes::SchemaRef;
use bytes::Bytes;
use common::{cpu_metadata, cpu_row_group};
use gpusort::{SortKey, SortSpec};
use gpusort_cuda::{CudaBackend, GpuSortSession, SortedRows};
use gpusort_parquet::gpu_decode::{FileBytes, GpuPageDecoder};
use parquet::file::metadata::{ParquetMetaData, ParquetMetaDataReader};
use rayon::prelude::*;

/// Rows of a range coming down (the tool's writer takes ranges of this order).
const RANGE_ROWS: usize = 1 << 20;

/// Row groups the host way reads at once (a task each), while the rows before go up.
const HOST_GROUPS_AT_ONCE: usize = 32;

/// The ORDER BY lists of TPC-H lineitem: (column, descending).
fn order_by(list: &str) -> Vec<(&'static str, bool)> {
    match list {
        "1" => vec![("l_shipdate", false), ("l_orderkey", false), ("l_linenumber", false)],
        "2" => vec![
            ("l_returnflag", false),
            ("l_linestatus", false),
            ("l_extendedprice", true),
            ("l_orderkey", false),
            ("l_linenumber", false),
        ],
        "3" => vec![("l_comment", false), ("l_orderkey", false), ("l_linenumber", false)],
        other => panic!("no ORDER BY list {other} (1, 2 or 3)"),
    }
}

/// Seconds of one way's phases.
#[derive(Debug, Clone, Copy, Default)]
struct Phases {
    input: f64,
    sort: f64,
    output: f64,
}

impl Phases {
    fn total(&self) -> f64 {
        self.input + self.sort + self.output
    }
}

struct Input<'a> {
    path: &'a str,
    file: &'a Bytes,
    meta: &'a ParquetMetaData,
    groups_a_call: usize,
}

/// A session sorting by `list` ((column, descending) by name) on `backend`.
fn session(backend: &CudaBackend, schema: &SchemaRef, list: &[(&str, bool)]) -> GpuSortSession {
    let keys = list
        .iter()
        .map(|&(name, desc)| SortKey::new(schema.index_of(name).expect("a lineitem column"), desc, desc));
    backend
        .begin_sort(Arc::clone(schema), SortSpec::new(keys))
        .unwrap()
        .with_permutation(false)
        .with_output_views(true)
        .with_output_ranges(RANGE_ROWS)
}

/// The host way up to the sorted rows: row groups read on every core, pushed in order.
fn host_way(backend: &CudaBackend, input: &Input, list: &[(&str, bool)]) -> (SortedRows, Phases) {
    let start = Instant::now();
    let arrow_meta = cpu_metadata(input.file);
    let schema = Arc::clone(arrow_meta.schema());
    let mut session = session(backend, &schema, list);
    let rows: i64 = input.meta.row_groups().iter().map(|g| g.num_rows()).sum();
    session = session.with_expected_rows(rows as usize);
    let groups: Vec<usize> = (0..input.meta.num_row_groups()).collect();
    let (tx, rx) = std::sync::mpsc::sync_channel::<Vec<RecordBatch>>(1);
    let arrow_meta = &arrow_meta;
    std::thread::scope(|s| {
        // The sender moves in: the pushes below end when it is dropped.
        s.spawn(move || {
            for chunk in groups.chunks(HOST_GROUPS_AT_ONCE) {
                let batches: Vec<RecordBatch> = chunk
                    .par_iter()
                    .flat_map_iter(|&g| cpu_row_group(input.file, arrow_meta, g))
                    .collect();
                if tx.send(batches).is_err() {
                    return;
                }
            }
        });
        session.release_input();
        for batches in rx {
            for b in batches {
                session.push(&b).expect("a push");
            }
        }
    });
    sorted_in(session, start)
}

/// `session` sorted, the input having started at `start`: the rows and the phases so far.
fn sorted_in(session: GpuSortSession, start: Instant) -> (SortedRows, Phases) {
    let input = start.elapsed().as_secs_f64();
    let start = Instant::now();
    let sorted = session.finish_sorted(None).expect("the sort");
    let sort = start.elapsed().as_secs_f64();
    (
        sorted,
        Phases {
            input,
            sort,
            output: 0.0,
        },
    )
}

/// The device way up to the sorted rows: the file read into pinned memory, row groups decoded
/// on the GPU a call at a time and pushed as device batches.
fn device_way(
    backend: &CudaBackend,
    decoder: &GpuPageDecoder,
    input: &Input,
    list: &[(&str, bool)],
) -> (SortedRows, Phases, f64) {
    let start = Instant::now();
    let file = std::fs::File::open(input.path).expect("the file");
    let groups: Vec<usize> = (0..input.meta.num_row_groups()).collect();
    let mut session: Option<GpuSortSession> = None;
    let mut read = 0.0;
    for call in groups.chunks(input.groups_a_call) {
        let reading = Instant::now();
        let bytes = FileBytes::read_range(&file, GpuPageDecoder::byte_range(input.meta, call)).expect("a range");
        read += reading.elapsed().as_secs_f64();
        let first = session.as_ref().map_or(0, |s| s.device_buffers());
        let decoded = decoder
            .decode_at(&bytes, input.meta, call, first)
            .expect("the GPU's decode");
        let s = session.get_or_insert_with(|| self::session(backend, &decoded.schema(), list));
        if let Some(why) = s.device_batches_refusal() {
            panic!("the session refuses device batches: {why}");
        }
        s.push_device(decoded.into_device_batch()).expect("a device push");
    }
    let (sorted, phases) = sorted_in(session.expect("row groups"), start);
    (sorted, phases, read)
}

/// Every range down; their rows.
fn drain(sorted: &mut SortedRows) -> usize {
    let mut rows = 0;
    while let Some(batches) = sorted.next_batches(RANGE_ROWS, RANGE_ROWS).expect("a range") {
        rows += batches.iter().map(|b| b.num_rows()).sum::<usize>();
    }
    rows
}

/// Both ways' rows equal, range by range.
fn check(host: &mut SortedRows, device: &mut SortedRows) -> usize {
    let mut rows = 0;
    loop {
        let h = host.next_batches(RANGE_ROWS, RANGE_ROWS).expect("a host range");
        let d = device.next_batches(RANGE_ROWS, RANGE_ROWS).expect("a device range");
        match (h, d) {
            (None, None) => return rows,
            (Some(h), Some(d)) => {
                let schema = h[0].schema();
                let h = arrow::compute::concat_batches(&schema, &h).unwrap();
                let d = arrow::compute::concat_batches(&schema, &d).unwrap();
                assert_eq!(h.num_rows(), d.num_rows(), "rows {rows}..: range lengths");
                for (c, (a, b)) in h.columns().iter().zip(d.columns()).enumerate() {
                    assert!(
                        a.as_ref() == b.as_ref(),
                        "rows {rows}..: column {} differs",
                        schema.field(c).name()
                    );
                }
                rows += h.num_rows();
            }
            _ => panic!("one way ended before the other at row {rows}"),
        }
    }
}

fn main() {
    let mut args = std::env::args().skip(1).filter(|a| a != "--bench");
    let Some(path) = args.next() else {
        eprintln!("usage: device_sort FILE.parquet [lists, e.g. 1,3] [row groups a call]");
        return;
    };
    let lists: Vec<String> = args
        .next()
        .unwrap_or_else(|| "1,3".into())
        .split(',')
        .map(str::to_string)
        .collect();
    let groups_a_call: usize = args.next().and_then(|g| g.parse().ok()).unwrap_or(64);
    let file = Bytes::from(std::fs::read(&path).expect("the file"));
    let meta = ParquetMetaDataReader::new()
        .parse_and_finish(&file)
        .expect("a Parquet file");
    let rows: i64 = meta.row_groups().iter().map(|g| g.num_rows()).sum();
    println!(
        "{path}: {} row groups, {rows} rows, {:.1} MB; {} threads; ranges of {RANGE_ROWS} rows",
        meta.num_row_groups(),
        file.len() as f64 / 1e6,
        rayon::current_num_threads()
    );
    let (backend, decoder) = match (CudaBackend::try_new(0), GpuPageDecoder::try_new(0)) {
        (Ok(b), Ok(d)) => {
            let budget = Arc::clone(b.memory_budget());
            (b, d.with_budget(budget))
        }
        (Err(e), _) | (_, Err(e)) => return println!("not run: {e}"),
    };
    let input = Input {
        path: &path,
        file: &file,
        meta: &meta,
        groups_a_call,
    };
    println!("| list | way | round | input s | (read s) | sort s | output s | total s | host / device |");
    println!("|---|---|---:|---:|---:|---:|---:|---:|---:|");
    for list in &lists {
        let keys = order_by(list);
        // Round 0: both ways' rows compared.
        let (mut h, hp) = host_way(&backend, &input, &keys);
        eprintln!("list {list}, round 0: host way sorted ({hp:?})");
        let (mut d, dp, _) = device_way(&backend, &decoder, &input, &keys);
        eprintln!("list {list}, round 0: device way sorted ({dp:?})");
        let checked = check(&mut h, &mut d);
        assert_eq!(checked as i64, rows, "list {list}: rows checked");
        println!("| {list} | both | 0 | {checked} rows equal, range by range | | | | | |");
        drop((h, d));
        for round in 1..=2 {
            let (mut h, mut hp) = host_way(&backend, &input, &keys);
            let start = Instant::now();
            assert_eq!(drain(&mut h) as i64, rows);
            hp.output = start.elapsed().as_secs_f64();
            drop(h);
            let (mut d, mut dp, read) = device_way(&backend, &decoder, &input, &keys);
            let start = Instant::now();
            assert_eq!(drain(&mut d) as i64, rows);
            dp.output = start.elapsed().as_secs_f64();
            drop(d);
            for (way, p, read) in [("host", hp, None), ("device", dp, Some(read))] {
                println!(
                    "| {list} | {way} | {round} | {:.3} | {} | {:.3} | {:.3} | {:.3} | {} |",
                    p.input,
                    read.map_or(String::new(), |r| format!("{r:.3}")),
                    p.sort,
                    p.output,
                    p.total(),
                    match way {
                        "device" => format!("{:.2}x", hp.total() / dp.total()),
                        _ => String::new(),
                    }
                );
            }
        }
    }
}
