//! How fast nvCOMP's zstd compresses Parquet pages by the size of a call, against zstd on every
//! core of the CPU (the peer the writer would otherwise use), in one command.
//!
//! The pages are a file's bytes cut into 1 MiB pages (an uncompressed Parquet file written by
//! the tool is the writer's real input), each page cut into frames of `--frame` bytes as the
//! writer does. Each row compresses all of them in calls of `batch` bytes from `threads`
//! threads at once; the last rows run nvCOMP beside the CPU's zstd on the rayon pool, as the
//! writer shares a row group's pages.
//!
//! ```text
//! nvcomp-<hash> FILE [--bytes=N] [--frame=BYTES] [--level=L]
//! ```

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use gpusort_cuda::ZstdCompressor;
use rayon::prelude::*;

const PAGE: usize = 1 << 20;

fn arg(args: &[String], name: &str, default: usize) -> usize {
    args.iter()
        .find_map(|a| a.strip_prefix(&format!("--{name}=")))
        .map(|v| v.parse().expect("a number"))
        .unwrap_or(default)
}

/// The pages' bytes compressed by `threads` threads calling nvCOMP with about `batch` bytes of
/// frames a call: (seconds, bytes out, calls).
fn nvcomp(gpu: &ZstdCompressor, pages: &[&[u8]], frame: usize, batch: usize, threads: usize) -> (f64, usize, usize) {
    let batches: Vec<&[&[u8]]> = pages.chunks((batch / PAGE).max(1)).collect();
    let next = AtomicUsize::new(0);
    let out = AtomicUsize::new(0);
    let start = Instant::now();
    std::thread::scope(|s| {
        for _ in 0..threads {
            s.spawn(|| {
                while let Some(b) = batches.get(next.fetch_add(1, Ordering::Relaxed)) {
                    let frames: Vec<&[u8]> = b.iter().flat_map(|p| p.chunks(frame)).collect();
                    let z = gpu.compress(&frames).expect("nvCOMP");
                    out.fetch_add(z.iter().map(Vec::len).sum::<usize>(), Ordering::Relaxed);
                }
            });
        }
    });
    (start.elapsed().as_secs_f64(), out.into_inner(), batches.len())
}

/// The pages compressed by zstd at `level` on the rayon pool: (seconds, bytes out).
fn cpu(pages: &[&[u8]], level: i32) -> (f64, usize) {
    let start = Instant::now();
    let out: usize = pages
        .par_iter()
        .map(|p| zstd::bulk::compress(p, level).expect("zstd").len())
        .sum();
    (start.elapsed().as_secs_f64(), out)
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).filter(|a| a != "--bench").collect();
    let Some(path) = args.iter().find(|a| !a.starts_with("--")) else {
        eprintln!("usage: nvcomp FILE [--bytes=N] [--frame=BYTES] [--level=L]");
        std::process::exit(2);
    };
    let bytes = arg(&args, "bytes", 1 << 30);
    let frame = arg(&args, "frame", 64 << 10);
    let level = arg(&args, "level", 3) as i32;
    let mut data = std::fs::read(path).expect("the input file");
    data.truncate(bytes);
    let pages: Vec<&[u8]> = data.chunks(PAGE).collect();
    let gb = data.len() as f64 / 1e9;
    let gpu = match ZstdCompressor::try_new(0) {
        Ok(g) => g,
        Err(e) => {
            eprintln!("nvcomp bench: no nvCOMP on GPU 0: {e}");
            std::process::exit(1);
        }
    };
    println!(
        "{:.2} GB of {path} in 1 MiB pages, {} KiB frames; nvCOMP {}; CPU zstd({level}) on {} threads",
        gb,
        frame >> 10,
        gpu.version(),
        rayon::current_num_threads()
    );
    // Warm both up (nvCOMP's first call loads its kernels).
    let _ = nvcomp(&gpu, &pages[..pages.len().min(8)], frame, 8 * PAGE, 1);
    let (cpu_s, cpu_out) = cpu(&pages, level);
    let cpu_rate = gb / cpu_s;
    println!("| how | call | threads | GB/s | calls | ms a call | ratio out/in | / CPU |");
    println!("|---|---:|---:|---:|---:|---:|---:|---:|");
    println!(
        "| CPU zstd({level}) | 1 MiB page | {} | {cpu_rate:.2} | | | {:.3} | 1.00x |",
        rayon::current_num_threads(),
        cpu_out as f64 / data.len() as f64
    );
    for threads in [1, 4] {
        for batch_mib in [8, 16, 32, 64, 128, 256] {
            let (s, out, calls) = nvcomp(&gpu, &pages, frame, batch_mib * PAGE, threads);
            println!(
                "| nvCOMP | {batch_mib} MiB | {threads} | {:.2} | {calls} | {:.1} | {:.3} | {:.2}x |",
                gb / s,
                s * 1e3 * threads as f64 / calls as f64,
                out as f64 / data.len() as f64,
                gb / s / cpu_rate
            );
        }
    }
    // nvCOMP on one thread beside the CPU on every core, each over all the pages.
    for batch_mib in [8, 64] {
        let ((gs, _, calls), (cs, _)) = rayon::join(
            || nvcomp(&gpu, &pages, frame, batch_mib * PAGE, 1),
            || cpu(&pages, level),
        );
        println!(
            "| nvCOMP beside the CPU | {batch_mib} MiB | 1 | {:.2} | {calls} | {:.1} | | CPU {:.2} GB/s |",
            gb / gs,
            gs * 1e3 / calls as f64,
            gb / cs
        );
    }
}
