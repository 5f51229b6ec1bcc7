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

use std::sync::Arc;
use std::time::Instant;

use arrow::array::RecordBatch;
use arrow::datatypes::{DataType, Field, Schema};
use bytes::Bytes;
use gpusort_parquet::gpu_decode::{FileBytes, GpuPageDecoder};
use parquet::arrow::arrow_reader::{ArrowReaderMetadata, ArrowReaderOptions, ParquetRecordBatchReaderBuilder};
use parquet::file::metadata::{ParquetMetaData, ParquetMetaDataReader};
use rayon::prelude::*;

/// The metadata the CPU's readers share (read once, as the tool does): byte arrays as views.
fn cpu_metadata(file: &Bytes) -> ArrowReaderMetadata {
    let plain = ArrowReaderMetadata::load(file, ArrowReaderOptions::new()).unwrap();
    let fields: Vec<Field> = (plain.schema().fields().iter())
        .map(|f| match f.data_type() {
            DataType::Utf8 | DataType::LargeUtf8 => f.as_ref().clone().with_data_type(DataType::Utf8View),
            DataType::Binary | DataType::LargeBinary => f.as_ref().clone().with_data_type(DataType::BinaryView),
            _ => f.as_ref().clone(),
        })
        .collect();
    let options = ArrowReaderOptions::new().with_schema(Arc::new(Schema::new(fields)));
    ArrowReaderMetadata::try_new(Arc::clone(plain.metadata()), options).unwrap()
}

/// Rows of the CPU reader's batches (the tool's DataFusion reads 8,192 by default; the larger
/// batch is the cheaper one here).
const CPU_BATCH_ROWS: usize = 65_536;

/// The row group `g` of `file` read by the Parquet crate, in batches.
fn cpu_row_group(file: &Bytes, meta: &ArrowReaderMetadata, g: usize) -> Vec<RecordBatch> {
    let reader = ParquetRecordBatchReaderBuilder::new_with_metadata(file.clone(), meta.clone())
        .with_row_groups(vec![g])
        .with_batch_size(CPU_BATCH_ROWS)
        .build()
        .unwrap();
    reader.map(|b| b.unwrap()).collect()
}

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
