//! What the Parquet writer spends per column, and what its settings change: a Parquet file is
//! read into memory, then each of its columns is encoded alone (one thread, one row group of up
//! to `BENCH_ROWS` rows, default 1M) under each variant of the writer's properties. Prints a
//! table of milliseconds per column and variant, and the totals.
//!
//! With `--whole`, the whole file is written instead, by gpusort's own writer
//! (`SortedParquetWriter`, every thread) under each variant of [`whole_variants`]: the wall
//! and CPU seconds of each, the cores it kept busy and the file's size. This is the writer as
//! the tool runs it, where the single-thread figures leave out contention.
//!
//! ```text
//! writer_props-<hash> FILE.parquet [--whole [--only=TEXT ...]] [--timeline]
//! ```

use std::time::Instant;

use arrow::array::RecordBatch;
use arrow::compute::concat_batches;
use parquet::arrow::ArrowWriter;
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use parquet::basic::{Compression, ZstdLevel};
use parquet::file::properties::{EnabledStatistics, WriterProperties};

fn variants() -> Vec<(&'static str, WriterProperties)> {
    let zstd = |l| Compression::ZSTD(ZstdLevel::try_new(l).unwrap());
    let base = || WriterProperties::builder().set_compression(zstd(3));
    vec![
        ("default zstd(3)", base().build()),
        (
            "stats chunk",
            base().set_statistics_enabled(EnabledStatistics::Chunk).build(),
        ),
        ("no dictionary", base().set_dictionary_enabled(false).build()),
        ("zstd(1)", WriterProperties::builder().set_compression(zstd(1)).build()),
        (
            "uncompressed",
            WriterProperties::builder()
                .set_compression(Compression::UNCOMPRESSED)
                .build(),
        ),
        (
            "snappy",
            WriterProperties::builder().set_compression(Compression::SNAPPY).build(),
        ),
    ]
}

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).filter(|a| a != "--bench").collect();
    let path = args
        .iter()
        .find(|a| !a.starts_with("--"))
        .cloned()
        .ok_or("usage: writer_props FILE.parquet [--whole]")?;
    if args.iter().any(|a| a == "--timeline") {
        gpusort_cli::timeline::enable();
    }
    if args.iter().any(|a| a == "--whole") {
        let only: Vec<String> = args
            .iter()
            .filter_map(|a| a.strip_prefix("--only="))
            .map(String::from)
            .collect();
        return whole::run(&path, &only);
    }
    let rows: usize = std::env::var("BENCH_ROWS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1 << 20);
    let reader = ParquetRecordBatchReaderBuilder::try_new(std::fs::File::open(&path)?)?
        .with_batch_size(8192)
        .build()?;
    let mut batches: Vec<RecordBatch> = vec![];
    let mut n = 0;
    for b in reader {
        let b = b?;
        n += b.num_rows();
        batches.push(b);
        if n >= rows {
            break;
        }
    }
    let all = concat_batches(&batches[0].schema(), &batches)?;
    let all = all.slice(0, rows.min(all.num_rows()));
    println!("{} rows of {path}", all.num_rows());
    let variants = variants();
    print!("| column |");
    for (name, _) in &variants {
        print!(" {name} |");
    }
    println!(" gpusort encoder, uncompressed |");
    println!("|---|{}---:|", "---:|".repeat(variants.len()));
    let mut totals = vec![0.0; variants.len() + 1];
    for (i, field) in all.schema().fields().iter().enumerate() {
        let one = all.project(&[i])?;
        print!("| {} |", field.name());
        for (k, (_, props)) in variants.iter().enumerate() {
            let mut best = f64::MAX;
            for _ in 0..3 {
                let start = Instant::now();
                let mut w = ArrowWriter::try_new(Vec::new(), one.schema(), Some(props.clone()))?;
                // As the gpusort writer receives them: batches of 8192 rows.
                for at in (0..one.num_rows()).step_by(8192) {
                    w.write(&one.slice(at, 8192.min(one.num_rows() - at)))?;
                }
                let bytes = w.into_inner()?;
                std::hint::black_box(bytes);
                best = best.min(start.elapsed().as_secs_f64() * 1e3);
            }
            totals[k] += best;
            print!(" {best:.1} |");
        }
        match gpusort_encoder_ms(&one)? {
            Some(ms) => {
                totals[variants.len()] += ms;
                print!(" {ms:.1} |");
            }
            None => print!(" - |"),
        }
        println!();
    }
    print!("| **all** |");
    for t in totals {
        print!(" **{t:.0}** |");
    }
    println!();
    Ok(())
}

/// Milliseconds gpusort's encoder takes for the one column of `one` (best of 3), in slices of
/// 8192 rows, its pages left uncompressed; `None` where it does not take the column.
fn gpusort_encoder_ms(one: &RecordBatch) -> Result<Option<f64>, Box<dyn std::error::Error>> {
    let props = WriterProperties::builder().build();
    let descr = parquet::arrow::ArrowSchemaConverter::new()
        .convert(&one.schema())?
        .column(0);
    if !gpusort_parquet::encoder::encodes(one.schema().field(0), &descr, &props) {
        return Ok(None);
    }
    let slices: Vec<_> = (0..one.num_rows())
        .step_by(8192)
        .map(|at| one.column(0).slice(at, 8192.min(one.num_rows() - at)))
        .collect();
    let mut best = f64::MAX;
    for _ in 0..3 {
        let start = Instant::now();
        std::hint::black_box(gpusort_parquet::encoder::encode(&slices, &descr, &props)?);
        best = best.min(start.elapsed().as_secs_f64() * 1e3);
    }
    Ok(Some(best))
}

/// `--whole`: the whole file through `SortedParquetWriter` under each variant.
mod whole {
    use std::collections::HashSet;
    use std::sync::Arc;
    use std::time::Instant;

    use arrow::array::RecordBatch;
    use arrow::row::{RowConverter, SortField};
    use gpusort_cli::timeline::cpu_seconds;
    use gpusort_cuda::nvcomp::MAX_CHUNK;
    use gpusort_parquet::gpu_pages::{DEFAULT_FRAME_BYTES, NvcompZstd};
    use gpusort_parquet::pages::{CpuZstd, PageCompressor};
    use gpusort_parquet::writer::{Codec, ColumnEncoder, SortedParquetWriter, WriteOptions};
    use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
    use parquet::file::properties::{EnabledStatistics, WriterProperties, WriterPropertiesBuilder};
    use parquet::schema::types::ColumnPath;

    type Variant = (
        &'static str,
        &'static str,
        fn(WriterPropertiesBuilder, &[String]) -> WriterPropertiesBuilder,
    );

    /// (name, codec, properties given the columns a dictionary would not serve).
    fn whole_variants() -> Vec<Variant> {
        fn dict_off(b: WriterPropertiesBuilder, high: &[String]) -> WriterPropertiesBuilder {
            high.iter().fold(b, |b, c| {
                b.set_column_dictionary_enabled(ColumnPath::from(c.as_str()), false)
            })
        }
        vec![
            ("default", "zstd(3)", |b, _| b),
            ("write batch 8192", "zstd(3)", |b, _| b.set_write_batch_size(8192)),
            ("dictionary off where distinct > 1/4", "zstd(3)", dict_off),
            ("both of the above", "zstd(3)", |b, h| {
                dict_off(b.set_write_batch_size(8192), h)
            }),
            ("no dictionary", "zstd(3)", |b, _| b.set_dictionary_enabled(false)),
            ("data pages 8 MiB", "zstd(3)", |b, _| {
                b.set_data_page_size_limit(8 << 20)
            }),
            ("no statistics", "zstd(3)", |b, _| {
                b.set_statistics_enabled(EnabledStatistics::None)
            }),
            ("zstd(1)", "zstd(1)", |b, _| b),
            ("snappy", "snappy", |b, _| b),
            ("uncompressed", "uncompressed", |b, _| b),
            // Pages compressed apart from encoding (gpusort_parquet::pages): on the CPU, then on
            // the GPU through nvCOMP in frames of several sizes, where the encoding settings
            // weigh differently.
            ("default", PAGES_CPU, |b, _| b),
            ("default", "zstd, nvCOMP whole pages", |b, _| b),
            ("default", "zstd, nvCOMP 256 KiB frames", |b, _| b),
            ("default", "zstd, nvCOMP 64 KiB frames", |b, _| b),
            ("default", "zstd, nvCOMP 16 KiB frames", |b, _| b),
            ("default", "zstd, nvCOMP share 0.25", |b, _| b),
            ("default", "zstd, nvCOMP share 0.5", |b, _| b),
            ("default", "zstd, nvCOMP share 0.75", |b, _| b),
            ("no dictionary", "zstd, nvCOMP 64 KiB frames", |b, _| {
                b.set_dictionary_enabled(false)
            }),
            (
                "dictionary off where distinct > 1/4",
                "zstd, nvCOMP 64 KiB frames",
                dict_off,
            ),
            ("no statistics", "zstd, nvCOMP 64 KiB frames", |b, _| {
                b.set_statistics_enabled(EnabledStatistics::None)
            }),
            // gpusort's column encoder (every variant above is the Parquet crate's), its pages
            // compressed on the CPU, not at all, and on the GPU.
            (GPUSORT_ENCODER, "zstd(3)", |b, _| b),
            (GPUSORT_ENCODER, "uncompressed", |b, _| b),
            (GPUSORT_ENCODER, "zstd, nvCOMP 64 KiB frames", |b, _| b),
        ]
    }

    /// The name of the variants whose columns gpusort's encoder writes.
    const GPUSORT_ENCODER: &str = "gpusort encoder";

    /// The codec name of the variant whose pages are compressed apart, on the CPU.
    const PAGES_CPU: &str = "zstd(3), pages.rs CPU";

    /// The writer's options for `codec`: a codec of the Parquet writer, or pages compressed
    /// apart ([`PAGES_CPU`], or "zstd, nvCOMP ..." on the GPU), with the GPU compressor for its
    /// statistics; `Err` with the reason a GPU variant cannot run.
    fn options_for(name: &str, codec: &str) -> Result<(WriteOptions, Option<Arc<NvcompZstd>>), String> {
        let zstd3: Codec = "zstd(3)".parse()?;
        // (frame bytes, GPU share) of an nvCOMP variant.
        let gpu = match codec.strip_prefix("zstd, nvCOMP ") {
            Some("whole pages") => Some((MAX_CHUNK, 1.0)),
            Some(share) if share.starts_with("share ") => Some((
                DEFAULT_FRAME_BYTES,
                share[6..].parse::<f64>().map_err(|e| e.to_string())?,
            )),
            Some(frames) => Some((
                frames
                    .trim_end_matches(" KiB frames")
                    .parse::<usize>()
                    .map_err(|e| e.to_string())?
                    << 10,
                1.0,
            )),
            None => None,
        };
        let gpu = gpu
            .map(|(frame, share)| NvcompZstd::try_new(0, frame, 3).map(|g| Arc::new(g.with_gpu_share(share))))
            .transpose()?;
        let page_compressor: Option<Arc<dyn PageCompressor>> = match (&gpu, codec) {
            (Some(g), _) => Some(Arc::clone(g) as Arc<dyn PageCompressor>),
            (None, PAGES_CPU) => Some(Arc::new(CpuZstd::new(3))),
            _ => None,
        };
        let options = WriteOptions {
            codec: if page_compressor.is_some() {
                zstd3
            } else {
                codec.parse::<Codec>()?
            },
            page_compressor,
            column_encoder: if name == GPUSORT_ENCODER {
                ColumnEncoder::Gpusort
            } else {
                ColumnEncoder::ParquetCrate
            },
            ..WriteOptions::default()
        };
        Ok((options, gpu))
    }

    /// Columns whose first 64Ki rows are more than a quarter distinct values.
    fn high_cardinality(batch: &RecordBatch) -> Result<Vec<String>, Box<dyn std::error::Error>> {
        let sample = batch.slice(0, batch.num_rows().min(1 << 16));
        let mut out = vec![];
        for (i, field) in sample.schema().fields().iter().enumerate() {
            let converter = RowConverter::new(vec![SortField::new(field.data_type().clone())])?;
            let rows = converter.convert_columns(&[Arc::clone(sample.column(i))])?;
            let distinct: HashSet<Vec<u8>> = rows.iter().map(|r| r.as_ref().to_vec()).collect();
            if distinct.len() * 4 > sample.num_rows() {
                out.push(field.name().clone());
            }
        }
        Ok(out)
    }

    /// `only`: the variants to run, each a substring of "NAME CODEC" (the first variant, the
    /// reference, always runs).
    pub fn run(path: &str, only: &[String]) -> Result<(), Box<dyn std::error::Error>> {
        let reader = ParquetRecordBatchReaderBuilder::try_new(std::fs::File::open(path)?)?
            .with_batch_size(8192)
            .build()?;
        let batches: Vec<RecordBatch> = reader.collect::<Result<_, _>>()?;
        let schema = batches[0].schema();
        let rows: usize = batches.iter().map(|b| b.num_rows()).sum();
        let high = high_cardinality(&batches[0])?;
        let threads = rayon::current_num_threads();
        println!(
            "{rows} rows of {path}, {threads} threads; more than 1/4 distinct: {}",
            high.join(", ")
        );
        println!("| variant | codec | wall s | CPU s | cores busy | MiB |\n|---|---|---:|---:|---:|---:|");
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
        let order_by = [gpusort_parquet::SortKey::asc(schema.field(0).name())];
        let out = std::env::temp_dir().join("writer_props_whole.parquet");
        for (i, (name, codec, props)) in whole_variants().into_iter().enumerate() {
            let label = format!("{name} {codec}");
            if i > 0 && !only.is_empty() && !only.iter().any(|o| label.contains(o.as_str())) {
                continue;
            }
            let (options, gpu) = match options_for(name, codec) {
                Ok(options) => options,
                Err(why) => {
                    println!("| {name} | {codec} | not run: {why} | | | |");
                    continue;
                }
            };
            let (start, cpu) = (Instant::now(), cpu_seconds());
            let file = std::fs::File::create(&out)?;
            let builder = props(WriterProperties::builder(), &high).build();
            let mut writer =
                SortedParquetWriter::try_new_with_properties(file, Arc::clone(&schema), &order_by, &options, builder)?;
            runtime.block_on(async {
                for b in &batches {
                    writer.write(b.clone()).await?;
                }
                writer.finish().await
            })?;
            let (wall, cpu) = (start.elapsed().as_secs_f64(), cpu_seconds() - cpu);
            let mib = std::fs::metadata(&out)?.len() as f64 / (1 << 20) as f64;
            let nvcomp = gpu.map_or(String::new(), |g| {
                let s = g.stats();
                format!(
                    " nvCOMP: {} calls of {:.0} buffers, {:.2} GB/s a call, {:.1} s in calls |",
                    s.calls,
                    s.buffers as f64 / s.calls.max(1) as f64,
                    s.bytes_in as f64 / 1e9 / s.call_seconds.max(1e-9),
                    s.call_seconds
                )
            });
            println!(
                "| {name} | {codec} | {wall:.2} | {cpu:.1} | {:.1} | {mib:.0} |{nvcomp}",
                cpu / wall
            );
        }
        std::fs::remove_file(&out)?;
        Ok(())
    }
}
