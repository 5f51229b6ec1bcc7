//! The evaluation of Bandyopadhyay & Sahni (Figs. 7-14) on this GPU: 10M records of a u32 key
//! and m u32 fields (m = 2..20), ByField and Hybrid, GRS and SRTS (and gpusort's MSD hybrid),
//! direct and indirect, with the data already in GPU memory; and keys-only sorts of 10M and
//! 100M u32 and u64 keys; and 10M records of a u64 key and 2 u32 fields whose keys are random,
//! presorted (sorted, reversed, a few sorted runs, few distinct) or neither (zipf, nearly sorted),
//! each against a device copy of the same bytes; and keys that are sorted runs (an external
//! sort's merge step) merged on the device — the tree of merges and seed 003's odd-even
//! merge-split — against radix-sorting them.
//! Prints tables (and the ratio to CUB when `--cub` names the JSON that the CUB baselines beside
//! this file write: `cub_baseline.py --json`, CUB through CuPy, or `cub_native --json`, CUB
//! called from CUDA C++), writes every timing as CSV and draws the record figures as an SVG.
//!
//! ```text
//! paper [--rows N] [--reps R] [--bits B] [--fields 2,4,..] [--cub cub.json] [--csv out.csv] [--svg out.svg] [--pack 0|1]
//!       [--dist-rows N] [--merge-runs 2,16,..] [--only records|keys|dist|merge]
//! ```
//!
//! Each timing is one call of `Gpu::sort` (device events around its kernels) after the inputs
//! are restored by a device copy; the table shows the minimum (CUB's script reports minima)
//! and the median over `R` runs after a warm-up.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use cudarc::driver::CudaSlice;
use gpusort::plan::{Algorithm, RadixPass, RecordMove, Strategy, radix_passes, varying_bits};
use gpusort_cuda::{DeviceColumn, DeviceRecords, DeviceTable, Gpu, GpuSortPlan, KernelCache, MergeMethod};
use gpusort_testing::KeyDistribution;
use rand::prelude::*;
use rand::rngs::SmallRng;
use rayon::prelude::*;

struct Args {
    rows: usize,
    reps: usize,
    bits: Vec<u32>,
    fields: Vec<usize>,
    key_rows: Vec<usize>,
    cub: Option<String>,
    csv: Option<String>,
    svg: Option<String>,
    only: Option<String>,
    /// Indirect gathers packed into rows (`--pack 0`: column by column).
    pack: bool,
    /// Rows of the key-distribution table (0: none).
    dist_rows: usize,
    /// Run counts of the merge table (keys of `key_rows` rows cut into that many sorted runs).
    merge_runs: Vec<usize>,
}

fn args() -> Args {
    let mut a = Args {
        rows: 10_000_000,
        reps: 7,
        bits: vec![8, 4],
        fields: (1..=10).map(|i| 2 * i).collect(),
        key_rows: vec![10_000_000, 100_000_000],
        cub: None,
        csv: None,
        svg: None,
        only: None,
        pack: true,
        dist_rows: 10_000_000,
        merge_runs: vec![2, 4, 16, 64],
    };
    let v: Vec<String> = std::env::args().skip(1).filter(|s| s != "--bench").collect();
    let list = |s: &str| {
        s.split(',')
            .map(|x| x.trim().parse().expect("a number"))
            .collect::<Vec<usize>>()
    };
    let mut i = 0;
    while i < v.len() {
        let val = v.get(i + 1).cloned().unwrap_or_default();
        match v[i].as_str() {
            "--rows" => a.rows = val.parse().expect("--rows N"),
            "--reps" => a.reps = val.parse().expect("--reps N"),
            "--bits" => a.bits = list(&val).into_iter().map(|b| b as u32).collect(),
            "--fields" => a.fields = list(&val),
            "--key-rows" => a.key_rows = list(&val),
            "--cub" => a.cub = Some(val),
            "--csv" => a.csv = Some(val),
            "--svg" => a.svg = Some(val),
            "--only" => a.only = Some(val),
            "--pack" => a.pack = val != "0",
            "--dist-rows" => a.dist_rows = val.parse().expect("--dist-rows N"),
            "--merge-runs" => a.merge_runs = list(&val),
            other => panic!("unknown argument {other}"),
        }
        i += 2;
    }
    a
}

fn random_words(rng: &mut SmallRng, n: usize) -> Vec<u32> {
    (0..n).map(|_| rng.random()).collect()
}

/// A device copy of the words `src`.
fn copy_words(gpu: &Gpu, src: &CudaSlice<u32>) -> CudaSlice<u32> {
    let mut d = gpu.alloc_words(src.len()).unwrap();
    gpu.stream().memcpy_dtod(src, &mut d).unwrap();
    d
}

/// The minimum and the median of `times`.
fn min_median(mut times: Vec<f64>) -> (f64, f64) {
    times.sort_by(|a, b| a.total_cmp(b));
    (times[0], times[times.len() / 2])
}

/// u64 keys as two ByField words, the high one first.
fn u64_words(keys: &[u64]) -> Vec<Vec<u32>> {
    vec![
        keys.iter().map(|k| (k >> 32) as u32).collect(),
        keys.iter().map(|&k| k as u32).collect(),
    ]
}

/// Minimum and median of the sort's kernel time over `reps` runs, inputs restored each time.
fn time_sort(gpu: &Gpu, pristine: &DeviceTable, plan: &GpuSortPlan, reps: usize) -> (f64, f64) {
    let s = gpu.stream();
    let copy = |src: &CudaSlice<u8>| {
        let mut d = gpu.alloc_bytes(src.len()).unwrap();
        s.memcpy_dtod(src, &mut d).unwrap();
        d
    };
    let mut times = vec![];
    for r in 0..=reps {
        let mut t = DeviceTable {
            num_rows: pristine.num_rows,
            keys: pristine.keys.iter().map(|k| copy_words(gpu, k)).collect(),
            columns: pristine
                .columns
                .iter()
                .map(|c| DeviceColumn {
                    data: copy(&c.data),
                    width: c.width,
                })
                .collect(),
            records: pristine.records.as_ref().map(|r| DeviceRecords {
                data: copy(&r.data),
                bytes: r.bytes,
            }),
        };
        s.synchronize().unwrap();
        let res = gpu.sort(&mut t, plan).unwrap();
        if r > 0 {
            times.push(res.kernel_ms as f64);
        }
        drop(t);
        s.synchronize().unwrap();
    }
    min_median(times)
}

/// Minimum over `reps` of a device copy of every byte of `table` (keys, columns, records): the
/// floor of a sort that finds its input already in order.
fn time_copy(gpu: &Gpu, table: &DeviceTable, reps: usize) -> f64 {
    let s = gpu.stream();
    let mut bufs: Vec<CudaSlice<u8>> = vec![];
    let srcs: Vec<CudaSlice<u8>> = table
        .keys
        .iter()
        .map(|k| {
            let view = unsafe { k.transmute::<u8>(k.len() * 4) }.unwrap();
            let mut d = gpu.alloc_bytes(k.len() * 4).unwrap();
            s.memcpy_dtod(&view, &mut d).unwrap();
            d
        })
        .chain(table.columns.iter().map(|c| c.data.clone()))
        .collect();
    for src in &srcs {
        bufs.push(gpu.alloc_bytes(src.len()).unwrap());
    }
    let (start, end) = (gpu.event().unwrap(), gpu.event().unwrap());
    let mut best = f64::MAX;
    for _ in 0..=reps {
        start.record(s).unwrap();
        for (src, dst) in srcs.iter().zip(bufs.iter_mut()) {
            s.memcpy_dtod(src, dst).unwrap();
        }
        end.record(s).unwrap();
        end.synchronize().unwrap();
        best = best.min(start.elapsed_ms(&end).unwrap() as f64);
    }
    best
}

/// The key-distribution table: `--dist-rows` records of a u64 key and 2 u32 fields (ByField),
/// sorted directly by SRTS and MSD, each distribution against random keys and a device copy.
fn distributions(gpu: &Gpu, a: &Args, csv: &mut String) {
    let s = gpu.stream();
    let n = a.dist_rows;
    let mut rng = SmallRng::seed_from_u64(2011);
    println!("\nkey distributions: {n} rows, u64 key + 2 u32 fields (ByField, direct); minimum (median) ms");
    println!("| keys | SRTS-direct | MSD-direct | best | device copy | best / copy | best / random |");
    println!("|---|---:|---:|---:|---:|---:|---:|");
    let fields: Vec<Vec<u8>> = (0..2)
        .map(|_| random_words(&mut rng, n).iter().flat_map(|w| w.to_le_bytes()).collect())
        .collect();
    let mut random_ms = None;
    for dist in KeyDistribution::ALL {
        let keys = dist.keys(n, 2011);
        let words = u64_words(&keys);
        let varying = varying_bits(&words);
        let pristine = DeviceTable {
            num_rows: n,
            keys: words.iter().map(|w| s.clone_htod(w).unwrap()).collect(),
            columns: fields
                .iter()
                .map(|f| DeviceColumn {
                    data: s.clone_htod(f).unwrap(),
                    width: 4,
                })
                .collect(),
            records: None,
        };
        let passes = radix_passes(&varying, 8);
        let cells: Vec<(f64, f64)> = [Strategy::SRTS_DIRECT, Strategy::MSD_DIRECT]
            .into_iter()
            .map(|strategy| {
                let plan = GpuSortPlan {
                    strategy,
                    passes: passes.clone(),
                    keep_keys: false,
                    want_perm: false,
                    pack_gathers: a.pack,
                    switches: gpu.sort_switches(),
                    sorted_runs: vec![],
                };
                let (min, med) = time_sort(gpu, &pristine, &plan, a.reps);
                let _ = writeln!(
                    csv,
                    "dist,{},2,{n},8,{},{min:.4},{med:.4}",
                    dist.name(),
                    label(strategy)
                );
                (min, med)
            })
            .collect();
        let best = cells.iter().map(|c| c.0).fold(f64::MAX, f64::min);
        let copy = time_copy(gpu, &pristine, a.reps);
        let random = *random_ms.get_or_insert(best);
        println!(
            "| {} | {:.3} ({:.3}) | {:.3} ({:.3}) | {best:.3} | {copy:.3} | {:.2} | {:.2} |",
            dist.name(),
            cells[0].0,
            cells[0].1,
            cells[1].0,
            cells[1].1,
            best / copy,
            best / random,
        );
    }
}

/// Minimum and median over `reps` of [`Gpu::merge_runs`] of `pristine`'s key words (copied
/// first, outside the timing) as sorted runs of `runs` rows, by `method`.
fn time_merge(gpu: &Gpu, pristine: &DeviceTable, runs: &[usize], method: MergeMethod, reps: usize) -> (f64, f64) {
    let s = gpu.stream();
    let (start, end) = (gpu.event().unwrap(), gpu.event().unwrap());
    let words: Vec<usize> = (0..pristine.keys.len()).collect();
    let mut times = vec![];
    for r in 0..=reps {
        let mut keys: Vec<CudaSlice<u32>> = pristine.keys.iter().map(|k| copy_words(gpu, k)).collect();
        start.record(s).unwrap();
        let perm = gpu
            .merge_runs(&mut keys, &words, pristine.num_rows, runs, method)
            .unwrap();
        end.record(s).unwrap();
        end.synchronize().unwrap();
        if r > 0 {
            times.push(start.elapsed_ms(&end).unwrap() as f64);
        }
        drop((perm, keys));
        s.synchronize().unwrap();
    }
    min_median(times)
}

/// The merge table: random u32 and u64 keys of each `--key-rows` size cut into `--merge-runs`
/// equal sorted runs, merged by the tree and (up to 16 runs) by the paper's odd-even
/// merge-split, against the best radix sort of the same keys (SRTS, MSD; with the permutation,
/// as a merge step needs it) and CUB's sort of random keys when `cub` has it.
fn merges(gpu: &Gpu, a: &Args, cub: Option<&CubFigures>, csv: &mut String) {
    let s = gpu.stream();
    let mut rng = SmallRng::seed_from_u64(2012);
    println!("\nsorted runs merged (keys and the permutation): minimum (median) ms");
    println!("| keys | n | runs | tree | odd-even | radix sort | radix / tree | CUB sort (random keys) | CUB / tree |");
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|");
    for &kn in &a.key_rows {
        for ty in ["u32", "u64"] {
            let words = if ty == "u32" { 1 } else { 2 };
            let values: Vec<u64> = (0..kn)
                .map(|_| {
                    if words == 1 {
                        rng.random::<u32>() as u64
                    } else {
                        rng.random()
                    }
                })
                .collect();
            for &k in &a.merge_runs {
                let len = kn.div_ceil(k);
                let runs: Vec<usize> = (0..k).map(|i| len.min(kn.saturating_sub(i * len))).collect();
                let mut sorted = values.clone();
                sorted.par_chunks_mut(len).for_each(|c| c.sort_unstable());
                let host: Vec<Vec<u32>> = if words == 1 {
                    vec![sorted.iter().map(|&v| v as u32).collect()]
                } else {
                    u64_words(&sorted)
                };
                let varying = varying_bits(&host);
                let pristine = DeviceTable {
                    num_rows: kn,
                    keys: host.iter().map(|w| s.clone_htod(w).unwrap()).collect(),
                    columns: vec![],
                    records: None,
                };
                drop((sorted, host));
                let tree = time_merge(gpu, &pristine, &runs, MergeMethod::Tree, a.reps);
                let odd_even = (k <= 16).then(|| time_merge(gpu, &pristine, &runs, MergeMethod::OddEven, a.reps));
                let radix = [Strategy::SRTS_DIRECT, Strategy::MSD_DIRECT]
                    .into_iter()
                    .map(|strategy| {
                        let plan = GpuSortPlan {
                            strategy,
                            passes: radix_passes(&varying, 8),
                            keep_keys: true,
                            want_perm: true,
                            pack_gathers: a.pack,
                            switches: gpu.sort_switches(),
                            sorted_runs: vec![],
                        };
                        time_sort(gpu, &pristine, &plan, a.reps)
                    })
                    .fold((f64::MAX, f64::MAX), |b, c| if c.0 < b.0 { c } else { b });
                for (label, t) in [("tree", Some(tree)), ("odd-even", odd_even), ("radix", Some(radix))] {
                    if let Some((min, med)) = t {
                        let _ = writeln!(csv, "merge,{ty},{k},{kn},8,{label},{min:.4},{med:.4}");
                    }
                }
                let cub_ms = cub.and_then(|c| c.1.get(&(kn, ty.to_string())).copied());
                println!(
                    "| {ty} | {kn} | {k} | {:.3} ({:.3}) | {} | {:.3} ({:.3}) | {:.2}x | {} | {} |",
                    tree.0,
                    tree.1,
                    odd_even.map_or("-".into(), |o| format!("{:.3} ({:.3})", o.0, o.1)),
                    radix.0,
                    radix.1,
                    radix.0 / tree.0,
                    cub_ms.map_or("-".into(), |c| format!("{c:.3}")),
                    cub_ms.map_or("-".into(), |c| format!("{:.2}x", c / tree.0)),
                );
            }
        }
    }
}

fn label(s: Strategy) -> String {
    let a = match s.algorithm {
        Algorithm::Grs => "GRS",
        Algorithm::Srts => "SRTS",
        Algorithm::Msd => "MSD",
        Algorithm::Sample => "SampleSort",
    };
    let m = match s.record_move {
        RecordMove::Direct => "direct",
        RecordMove::Indirect => "indirect",
    };
    format!("{a}-{m}")
}

/// CUB's figures from `cub_baseline.py --json` or `cub_native --json` (benches/): (records by
/// (layout, fields), keys by (n, type)).
type CubFigures = (BTreeMap<(String, usize), f64>, BTreeMap<(usize, String), f64>);

fn read_cub(path: &str) -> CubFigures {
    // A minimal reader for the script's JSON: numbers after known keys, record by record.
    let text = std::fs::read_to_string(path).expect("the CUB JSON");
    let mut records = BTreeMap::new();
    let mut keys = BTreeMap::new();
    let num = |obj: &str, key: &str| -> Option<f64> {
        let at = obj.find(&format!("\"{key}\""))?;
        let rest = &obj[at + key.len() + 2..];
        let rest = rest[rest.find(':')? + 1..].trim_start();
        let end = rest.find([',', '}', '\n']).unwrap_or(rest.len());
        rest[..end].trim().parse().ok()
    };
    for obj in text.split('{').skip(1) {
        if let (Some(m), Some(bf), Some(hy)) = (num(obj, "fields"), num(obj, "byfield_ms"), num(obj, "hybrid_ms")) {
            records.insert(("ByField".to_string(), m as usize), bf);
            records.insert(("Hybrid".to_string(), m as usize), hy);
        } else if let (Some(n), Some(s32), Some(s64)) =
            (num(obj, "n"), num(obj, "sort_u32_ms"), num(obj, "sort_u64_ms"))
        {
            keys.insert((n as usize, "u32".to_string()), s32);
            keys.insert((n as usize, "u64".to_string()), s64);
            if let Some(a) = num(obj, "argsort_u32_ms") {
                keys.insert((n as usize, "argsort u32".to_string()), a);
            }
        }
    }
    (records, keys)
}

fn svg(results: &[(String, u32, String, usize, f64)], fields: &[usize]) -> String {
    // Two panels (ByField, Hybrid) of time against fields, one line per strategy (8-bit digits
    // if measured, else the first width).
    let (w, h, pad) = (520.0, 360.0, 55.0);
    let bits = results.iter().map(|r| r.1).max().unwrap_or(8);
    let mut out = String::new();
    let _ = write!(
        out,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{}" height="{}" font-family="sans-serif" font-size="12">"#,
        2.0 * w,
        h + 30.0
    );
    let colors = [
        "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
    ];
    for (panel, layout) in ["ByField", "Hybrid"].iter().enumerate() {
        let x0 = panel as f64 * w;
        let rows: Vec<_> = results.iter().filter(|r| r.2 == *layout && r.1 == bits).collect();
        let ymax = rows.iter().map(|r| r.4).fold(0.0, f64::max).max(1e-3) * 1.1;
        let (fmin, fmax) = (*fields.first().unwrap() as f64, *fields.last().unwrap() as f64);
        let px = |m: f64| x0 + pad + (m - fmin) / (fmax - fmin).max(1.0) * (w - 2.0 * pad);
        let py = |t: f64| h - pad + 20.0 - t / ymax * (h - 2.0 * pad);
        let _ = write!(
            out,
            r#"<text x="{}" y="18" font-size="14">{layout}: 10M records, {bits}-bit digits (ms)</text>"#,
            x0 + pad
        );
        let _ = write!(
            out,
            r#"<line x1="{0}" y1="{1}" x2="{2}" y2="{1}" stroke="black"/><line x1="{0}" y1="{1}" x2="{0}" y2="{3}" stroke="black"/>"#,
            px(fmin),
            py(0.0),
            px(fmax),
            py(ymax)
        );
        for &m in fields {
            let _ = write!(
                out,
                r#"<text x="{}" y="{}" text-anchor="middle">{m}</text>"#,
                px(m as f64),
                py(0.0) + 15.0
            );
        }
        for k in 0..=4 {
            let t = ymax * k as f64 / 4.0;
            let _ = write!(
                out,
                r#"<text x="{}" y="{}" text-anchor="end">{t:.2}</text>"#,
                px(fmin) - 5.0,
                py(t) + 4.0
            );
        }
        for (si, s) in Strategy::ALL.iter().enumerate() {
            let pts: Vec<String> = rows
                .iter()
                .filter(|r| r.0 == label(*s))
                .map(|r| format!("{:.1},{:.1}", px(r.3 as f64), py(r.4)))
                .collect();
            let _ = write!(
                out,
                r#"<polyline fill="none" stroke="{}" stroke-width="2" points="{}"/>"#,
                colors[si],
                pts.join(" ")
            );
            let _ = write!(
                out,
                r#"<text x="{}" y="{}" fill="{}">{}</text>"#,
                x0 + pad + 10.0,
                40.0 + 15.0 * si as f64,
                colors[si],
                label(*s)
            );
        }
        let _ = write!(
            out,
            r#"<text x="{}" y="{}" text-anchor="middle">fields besides the key (m)</text>"#,
            x0 + w / 2.0,
            h + 25.0
        );
    }
    out.push_str("</svg>\n");
    out
}

fn main() {
    let a = args();
    let gpu = Gpu::open(0, &KernelCache::from_env()).expect("a GPU");
    let s = gpu.stream().clone();
    println!(
        "# {} | {} rows, {} reps, digits of {:?} bits | {}",
        gpu.info(),
        a.rows,
        a.reps,
        a.bits,
        gpu.tuning()
    );
    // The shapes (GPUSORT_SMEM_CAP): a strategy that does not fit runs as SRTS under its name.
    println!("# shapes: {}", gpu.shapes());
    let cub = a.cub.as_deref().map(read_cub);
    let mut rng = SmallRng::seed_from_u64(2010);
    let mut csv = String::from("kind,layout,fields,rows,digit_bits,strategy,min_ms,median_ms\n");
    let mut fig: Vec<(String, u32, String, usize, f64)> = vec![];

    // Records: u32 key + m u32 fields.
    let n = if matches!(a.only.as_deref(), Some("keys" | "dist" | "merge")) {
        0
    } else {
        a.rows
    };
    let key = random_words(&mut rng, n);
    let varying = varying_bits(std::slice::from_ref(&key));
    let key_dev = s.clone_htod(&key).unwrap();
    let max_fields = *a.fields.iter().max().unwrap_or(&0);
    let fields_host: Vec<Vec<u32>> = (0..max_fields).map(|_| random_words(&mut rng, n)).collect();
    let fields_dev: Vec<CudaSlice<u32>> = fields_host.iter().map(|f| s.clone_htod(f).unwrap()).collect();
    let to_bytes = |v: &CudaSlice<u32>| {
        let mut d = gpu.alloc_bytes(v.len() * 4).unwrap();
        let view = unsafe { v.transmute::<u8>(v.len() * 4) }.unwrap();
        s.memcpy_dtod(&view, &mut d).unwrap();
        d
    };
    let mut best: BTreeMap<(String, usize), (f64, String)> = BTreeMap::new();
    let fields_list = if matches!(a.only.as_deref(), Some("keys" | "dist" | "merge")) {
        vec![]
    } else {
        a.fields.clone()
    };
    println!("\nrecords: {n} rows, u32 key + m u32 fields; minimum (median) ms");
    println!(
        "| layout | m | bits | {} | best | CUB argsort+gather | CUB / best |",
        Strategy::ALL.map(label).join(" | ")
    );
    println!("|---|---:|---:|{}---|---:|---:|", "---:|".repeat(Strategy::ALL.len()));
    for &m in &fields_list {
        for layout in ["ByField", "Hybrid"] {
            let pristine = DeviceTable {
                num_rows: n,
                keys: vec![{
                    let mut d = gpu.alloc_words(n).unwrap();
                    s.memcpy_dtod(&key_dev, &mut d).unwrap();
                    d
                }],
                columns: if layout == "ByField" {
                    fields_dev[..m]
                        .iter()
                        .map(|f| DeviceColumn {
                            data: to_bytes(f),
                            width: 4,
                        })
                        .collect()
                } else {
                    vec![]
                },
                records: (layout == "Hybrid").then(|| {
                    let mut rows = vec![0u32; n * m];
                    for (j, f) in fields_host[..m].iter().enumerate() {
                        for (i, v) in f.iter().enumerate() {
                            rows[i * m + j] = *v;
                        }
                    }
                    let dev = s.clone_htod(&rows).unwrap();
                    DeviceRecords {
                        data: to_bytes(&dev),
                        bytes: 4 * m,
                    }
                }),
            };
            for &bits in &a.bits {
                let passes: Vec<RadixPass> = radix_passes(&varying, bits);
                let mut cells = vec![];
                for strategy in Strategy::ALL {
                    let plan = GpuSortPlan {
                        strategy,
                        passes: passes.clone(),
                        keep_keys: false,
                        want_perm: false,
                        pack_gathers: a.pack,
                        switches: gpu.sort_switches(),
                        sorted_runs: vec![],
                    };
                    let (min, med) = time_sort(&gpu, &pristine, &plan, a.reps);
                    let _ = writeln!(
                        csv,
                        "records,{layout},{m},{n},{bits},{},{min:.4},{med:.4}",
                        label(strategy)
                    );
                    fig.push((label(strategy), bits, layout.to_string(), m, min));
                    cells.push((min, med, label(strategy)));
                    let e = best.entry((layout.to_string(), m)).or_insert((f64::MAX, String::new()));
                    if min < e.0 {
                        *e = (min, format!("{} ({bits}-bit)", label(strategy)));
                    }
                }
                let b = cells.iter().min_by(|x, y| x.0.total_cmp(&y.0)).unwrap();
                let cub_ms = cub.as_ref().and_then(|c| c.0.get(&(layout.to_string(), m)).copied());
                let times: Vec<String> = cells.iter().map(|c| format!("{:.3} ({:.3})", c.0, c.1)).collect();
                println!(
                    "| {layout} | {m} | {bits} | {} | {} | {} | {} |",
                    times.join(" | "),
                    b.2,
                    cub_ms.map_or("-".into(), |c| format!("{c:.3}")),
                    cub_ms.map_or("-".into(), |c| format!("{:.2}x", c / b.0)),
                );
            }
        }
    }
    drop((key_dev, fields_dev, fields_host));

    // Keys only.
    println!("\nkeys only: minimum (median) ms");
    println!("| keys | n | bits | GRS | SRTS | MSD | SampleSort | CUB sort | CUB / best |");
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|");
    let key_rows = if matches!(a.only.as_deref(), Some("records" | "dist" | "merge")) {
        vec![]
    } else {
        a.key_rows.clone()
    };
    for &kn in &key_rows {
        for ty in ["u32", "u64"] {
            let words: Vec<Vec<u32>> = (0..if ty == "u32" { 1 } else { 2 })
                .map(|_| random_words(&mut rng, kn))
                .collect();
            let varying = varying_bits(&words);
            let pristine = DeviceTable {
                num_rows: kn,
                keys: words.iter().map(|w| s.clone_htod(w).unwrap()).collect(),
                columns: vec![],
                records: None,
            };
            drop(words);
            for &bits in &a.bits {
                let passes = radix_passes(&varying, bits);
                let mut cells = vec![];
                for strategy in [
                    Strategy::GRS_DIRECT,
                    Strategy::SRTS_DIRECT,
                    Strategy::MSD_DIRECT,
                    Strategy::SAMPLE_DIRECT,
                ] {
                    let plan = GpuSortPlan {
                        strategy,
                        passes: passes.clone(),
                        keep_keys: true,
                        want_perm: false,
                        pack_gathers: a.pack,
                        switches: gpu.sort_switches(),
                        sorted_runs: vec![],
                    };
                    let (min, med) = time_sort(&gpu, &pristine, &plan, a.reps);
                    let _ = writeln!(csv, "keys,{ty},0,{kn},{bits},{},{min:.4},{med:.4}", label(strategy));
                    cells.push((min, med));
                }
                let b = cells.iter().map(|c| c.0).fold(f64::MAX, f64::min);
                let cub_ms = cub.as_ref().and_then(|c| c.1.get(&(kn, ty.to_string())).copied());
                let times: Vec<String> = cells.iter().map(|c| format!("{:.3} ({:.3})", c.0, c.1)).collect();
                println!(
                    "| {ty} | {kn} | {bits} | {} | {} | {} |",
                    times.join(" | "),
                    cub_ms.map_or("-".into(), |c| format!("{c:.3}")),
                    cub_ms.map_or("-".into(), |c| format!("{:.2}x", c / b)),
                );
            }
        }
    }
    if matches!(a.only.as_deref(), None | Some("dist")) && a.dist_rows > 0 {
        distributions(&gpu, &a, &mut csv);
    }
    if matches!(a.only.as_deref(), None | Some("merge")) {
        merges(&gpu, &a, cub.as_ref(), &mut csv);
    }
    if !fig.is_empty() {
        print_crossovers(&fig, &a.fields);
    }
    println!("\nbest strategy per m:");
    for ((layout, m), (t, who)) in &best {
        println!("  {layout:7} m = {m:2}: {who} {t:.3} ms");
    }
    if let Some(p) = &a.csv {
        std::fs::write(p, &csv).expect("write CSV");
    }
    if let Some(p) = &a.svg
        && !fig.is_empty()
    {
        std::fs::write(p, svg(&fig, &a.fields)).expect("write SVG");
    }
}

/// The smallest m from which one family or move beats the other, from the records rows of `fig`.
fn print_crossovers(fig: &[(String, u32, String, usize, f64)], fields: &[usize]) {
    println!("\ncrossovers (minimum times, all digit widths measured):");
    for layout in ["ByField", "Hybrid"] {
        let at = |lab: &str, m: usize| {
            fig.iter()
                .filter(|r| r.0 == lab && r.2 == layout && r.3 == m)
                .map(|r| r.4)
                .fold(f64::MAX, f64::min)
        };
        let cross = |x: &str, y: &str| fields.iter().copied().find(|&m| at(x, m) < at(y, m));
        println!(
            "  {layout}: GRS-direct beats SRTS-direct from m = {:?}; indirect beats direct (best of each) from m = {:?}",
            cross("GRS-direct", "SRTS-direct"),
            fields
                .iter()
                .copied()
                .find(|&m| at("GRS-indirect", m).min(at("SRTS-indirect", m))
                    < at("GRS-direct", m).min(at("SRTS-direct", m)))
        );
        let lsd_best = |m: usize| {
            ["GRS-direct", "GRS-indirect", "SRTS-direct", "SRTS-indirect"]
                .iter()
                .map(|l| at(l, m))
                .fold(f64::MAX, f64::min)
        };
        let msd_best = |m: usize| at("MSD-direct", m).min(at("MSD-indirect", m));
        println!(
            "  {layout}: MSD (best move) beats the best of the paper's four at m = {:?}; MSD-indirect beats MSD-direct from m = {:?}",
            fields
                .iter()
                .copied()
                .filter(|&m| msd_best(m) < lsd_best(m))
                .collect::<Vec<_>>(),
            cross("MSD-indirect", "MSD-direct"),
        );
        let sample_best = |m: usize| at("SampleSort-direct", m).min(at("SampleSort-indirect", m));
        println!(
            "  {layout}: sample sort (best move) against the best radix sort (GRS, SRTS, MSD): {}; \
             SampleSort-indirect beats SampleSort-direct from m = {:?}",
            fields
                .iter()
                .map(|&m| format!("m = {m}: {:.2}x", sample_best(m) / lsd_best(m).min(msd_best(m))))
                .collect::<Vec<_>>()
                .join(", "),
            cross("SampleSort-indirect", "SampleSort-direct"),
        );
    }
}
