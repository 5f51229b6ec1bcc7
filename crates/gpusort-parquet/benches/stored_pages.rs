//! The first step of Parquet decode on the GPU, measured: a file's pages listed as stored
//! (`gpusort_parquet::stored_pages`) and their snappy decompressed by nvCOMP on the GPU, against
//! the peer a user has, the CPU's snappy on every core (what the Parquet crate's reader runs).
//! Every page the GPU decompressed is checked against the CPU's.
//!
//! ```text
//! cargo bench -p gpusort-parquet --bench stored_pages -- lineitem.parquet [row groups a call]
//! ```
//!
//! Needs a GPU and nvCOMP 6 (`GPUSORT_NVCOMP`); without them it says so and lists the pages only.

use std::time::Instant;

use bytes::Bytes;
use gpusort_cuda::{PageCodec, PageDecompressor};
use gpusort_parquet::stored_pages::{ColumnChunkPages, column_chunk_pages};
use parquet::basic::Compression;
use parquet::file::reader::{FileReader, SerializedFileReader};
use rayon::prelude::*;

fn main() {
    let mut args = std::env::args().skip(1).filter(|a| a != "--bench");
    let Some(path) = args.next() else {
        eprintln!("usage: stored_pages FILE.parquet [row groups a call]");
        return;
    };
    let groups_a_call: usize = args.next().and_then(|g| g.parse().ok()).unwrap_or(16);
    let bytes = Bytes::from(std::fs::read(&path).expect("the file"));
    let reader = SerializedFileReader::new(bytes.clone()).expect("a Parquet file");
    let start = Instant::now();
    let groups: Vec<Vec<ColumnChunkPages>> = (reader.metadata().row_groups().par_iter())
        .map(|g| {
            (g.columns().iter())
                .map(|c| column_chunk_pages(&bytes, c, g.num_rows() as usize).expect("pages"))
                .collect()
        })
        .collect();
    let listed = start.elapsed();
    let pages: Vec<Vec<(&[u8], usize)>> = (groups.iter())
        .map(|g| {
            (g.iter().flat_map(|c| c.dictionary.iter().chain(&c.data)))
                .filter(|p| p.compressed)
                .map(|p| (p.bytes.as_ref(), p.uncompressed_bytes.expect("snappy says its size")))
                .collect()
        })
        .collect();
    let codecs: Vec<Compression> = groups.iter().flatten().map(|c| c.codec).collect();
    assert!(
        codecs.iter().all(|c| *c == Compression::SNAPPY),
        "a file of snappy pages only"
    );
    let n: usize = pages.iter().map(|g| g.len()).sum();
    let (stored, plain): (usize, usize) = (pages.iter().flatten()).fold((0, 0), |(s, p), (b, u)| (s + b.len(), p + u));
    println!(
        "{path}: {} row groups, {n} snappy pages, {:.1} MB stored, {:.1} MB decompressed; listed in {:.1} ms",
        groups.len(),
        stored as f64 / 1e6,
        plain as f64 / 1e6,
        listed.as_secs_f64() * 1e3
    );

    // The peer: snappy on every core, a page a task.
    let start = Instant::now();
    let cpu: Vec<Vec<Vec<u8>>> = (pages.par_iter())
        .map(|g| {
            g.par_iter()
                .map(|(b, _)| snap::raw::Decoder::new().decompress_vec(b).unwrap())
                .collect()
        })
        .collect();
    let cpu_s = start.elapsed().as_secs_f64();
    println!(
        "CPU snappy, {} threads: {:.1} ms, {:.2} GB/s decompressed",
        rayon::current_num_threads(),
        cpu_s * 1e3,
        plain as f64 / cpu_s / 1e9
    );

    let gpu = match PageDecompressor::try_new(0) {
        Ok(g) => g,
        Err(e) => return println!("GPU: not run ({e})"),
    };
    for round in 0..3 {
        let start = Instant::now();
        let mut checked = 0;
        for (calls, chunk) in pages.chunks(groups_a_call).zip(cpu.chunks(groups_a_call)) {
            let refs: Vec<&[u8]> = calls.iter().flatten().map(|(b, _)| *b).collect();
            let sizes: Vec<usize> = calls.iter().flatten().map(|(_, u)| *u).collect();
            let out = gpu
                .decompress_to_device(PageCodec::Snappy, &refs, &sizes)
                .expect("nvCOMP");
            if round == 0 {
                let mut host = vec![0u8; out.data.len()];
                gpu.stream().memcpy_dtoh(&out.data, &mut host).unwrap();
                gpu.stream().synchronize().unwrap();
                for ((&at, &len), expected) in out.offsets.iter().zip(&out.sizes).zip(chunk.iter().flatten()) {
                    assert!(
                        &host[at..at + len] == expected.as_slice(),
                        "a page differs from the CPU's"
                    );
                    checked += 1;
                }
            }
        }
        let s = start.elapsed().as_secs_f64();
        println!(
            "GPU nvCOMP snappy, {groups_a_call} row groups a call, round {round}: {:.1} ms, {:.2} GB/s \
             (pack, upload, decompress){}; CPU / GPU {:.2}x",
            s * 1e3,
            plain as f64 / s / 1e9,
            if round == 0 {
                format!(", {checked} pages checked, with their download")
            } else {
                String::new()
            },
            cpu_s / s
        );
    }
}
