//! Parquet decode on the GPU, measured (`gpusort_parquet::gpu_decode`; issue 20's reading
//! phase): a file's row groups decoded into Arrow columns in device memory, a few row groups a
//! call, against the peer a user has, the Parquet crate's Arrow reader on every core (a row
//! group a task, byte arrays read as views as the GPU's are). Round 0 downloads every column
//! the GPU decoded and checks it against the CPU's.
//!
//! ```text
//! cargo bench -p gpusort-parquet --bench gpu_decode -- lineitem.parquet [row groups a call]
//! ```
//!
//! Needs a GPU and nvCOMP 6 (`GPUSORT_NVCOMP`); without them it says so after the CPU's run.

mod common;

use std::time::Instant;

use arrow::array::RecordBatch;
use bytes::Bytes;
use common::{CPU_BATCH_ROWS, cpu_metadata, cpu_row_group};
use gpusort_parquet::gpu_decode::{FileBytes, GpuPageDecoder};
use parquet::file::metadata::{ParquetMetaData, ParquetMetaDataReader};
use rayon::prelude::*;

fn main() {
    let mut args = std::env::args().skip(1).filter(|a| a != "--bench");
    let Some(path) = args.next() else {
        eprintln!("usage: gpu_decode FILE.parquet [row groups a call]");
        return;
    };
    let groups_a_call: usize = args.next().and_then(|g| g.parse().ok()).unwrap_or(32);
    let file = Bytes::from(std::fs::read(&path).expect("the file"));
    let meta = ParquetMetaDataReader::new()
        .parse_and_finish(&file)
        .expect("a Parquet file");
    let groups = meta.num_row_groups();
    let rows: i64 = meta.row_groups().iter().map(|g| g.num_rows()).sum();
    println!(
        "{path}: {groups} row groups, {rows} rows, {:.1} MB",
        file.len() as f64 / 1e6
    );
    if let Err(why) = GpuPageDecoder::plan(&meta) {
        return println!("the GPU does not decode this file: {why}");
    }

    let arrow_meta = cpu_metadata(&file);
    let mut cpu_s = f64::MAX;
    let mut cpu = vec![];
    for round in 0..2 {
        let start = Instant::now();
        cpu = (0..groups)
            .into_par_iter()
            .map(|g| cpu_row_group(&file, &arrow_meta, g))
            .collect();
        let s = start.elapsed().as_secs_f64();
        cpu_s = cpu_s.min(s);
        println!(
            "CPU, the Parquet crate's Arrow reader, {} threads, batches of {CPU_BATCH_ROWS} rows, round {round}: \
             {:.1} ms",
            rayon::current_num_threads(),
            s * 1e3
        );
    }

    let decoder = match GpuPageDecoder::try_new(0) {
        Ok(d) => d,
        Err(e) => return println!("GPU: not run ({e})"),
    };
    let pageable = FileBytes::from(file.clone());
    gpu_rounds(
        &decoder,
        "file in pageable memory",
        &pageable,
        &meta,
        groups_a_call,
        &cpu,
        cpu_s,
    );
    let pinned = FileBytes::read_pinned(std::path::Path::new(&path)).expect("the file");
    let label = if pinned.pinned {
        "file in pinned memory"
    } else {
        "file in the pool's pageable memory (no pinned memory)"
    };
    gpu_rounds(&decoder, label, &pinned, &meta, groups_a_call, &cpu, cpu_s);
}

/// Decodes `file` on the GPU, `groups_a_call` row groups a call, four rounds, round 0 checking
/// every column against the CPU's reading (`cpu`, a row group's batches each).
fn gpu_rounds(
    decoder: &GpuPageDecoder,
    label: &str,
    file: &FileBytes,
    meta: &ParquetMetaData,
    groups_a_call: usize,
    cpu: &[Vec<RecordBatch>],
    cpu_s: f64,
) {
    let calls: Vec<Vec<usize>> = (0..meta.num_row_groups())
        .collect::<Vec<_>>()
        .chunks(groups_a_call)
        .map(|c| c.to_vec())
        .collect();
    for round in 0..4 {
        let start = Instant::now();
        let (mut list, mut pages, mut kernels) = (0.0, 0.0, 0.0);
        let mut checked = 0;
        for call in &calls {
            let decoded = decoder.decode(file, meta, call).expect("the GPU's decode");
            (list, pages, kernels) = (
                list + decoded.times.list,
                pages + decoded.times.pages,
                kernels + decoded.times.kernels,
            );
            if round == 0 {
                let got = decoded.download(decoder.gpu()).expect("a download");
                let parts: Vec<&RecordBatch> = call.iter().flat_map(|&g| &cpu[g]).collect();
                let expected = arrow::compute::concat_batches(&parts[0].schema(), parts).unwrap();
                for (c, (g, e)) in got.columns().iter().zip(expected.columns()).enumerate() {
                    assert!(
                        g.as_ref() == e.as_ref(),
                        "column {c} of row groups {call:?} differs from the CPU's"
                    );
                }
                checked += got.num_columns();
            }
        }
        let s = start.elapsed().as_secs_f64();
        println!(
            "GPU, {label}, {groups_a_call} row groups a call, round {round}: {:.1} ms (list {:.1}, pages {:.1}, \
             kernels {:.1}){}; CPU / GPU {:.2}x",
            s * 1e3,
            list * 1e3,
            pages * 1e3,
            kernels * 1e3,
            if round == 0 {
                format!(", {checked} column chunks checked, with their download")
            } else {
                String::new()
            },
            cpu_s / s
        );
    }
}
