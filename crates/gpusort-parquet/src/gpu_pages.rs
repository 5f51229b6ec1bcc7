//! Where the output's pages are compressed: on the GPU through nvCOMP
//! ([`gpusort_cuda::ZstdCompressor`]) when the codec is zstd and a GPU and nvCOMP are there,
//! else by the Parquet writer on the CPU. `--compress-on` chooses; the summary says which ran.

use std::str::FromStr;
use std::sync::Arc;

use gpusort_cuda::ZstdCompressor;
use gpusort_cuda::nvcomp::{CompressStats, MAX_CHUNK};
use parquet::basic::{Compression, ZstdLevel};
use parquet::errors::ParquetError;

use crate::pages::{CpuZstd, PageCompressor};
use crate::writer::Codec;

/// `--compress-on`: where zstd pages are compressed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CompressOn {
    /// The GPU when the codec is zstd, the sort may use a GPU, and nvCOMP loads; else the CPU.
    #[default]
    Auto,
    /// The GPU, or an error saying why not.
    Gpu,
    /// The CPU (the Parquet writer's own codec).
    Cpu,
}

impl FromStr for CompressOn {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim().to_ascii_lowercase().as_str() {
            "auto" => Ok(Self::Auto),
            "gpu" => Ok(Self::Gpu),
            "cpu" => Ok(Self::Cpu),
            _ => Err(format!("expected auto, gpu or cpu, got '{s}'")),
        }
    }
}

/// Bytes of page compressed into one zstd frame on the GPU unless told otherwise: nvCOMP's
/// recommended chunk size. A 1 MiB page is one task of nvCOMP's, and a row group's pages too
/// few tasks to fill the GPU: on TPC-H lineitem SF10, pages compressed whole took longer than
/// the CPU's zstd (`writer_props --whole`, stop 23).
pub const DEFAULT_FRAME_BYTES: usize = 64 << 10;

/// How the GPU takes a row group's pages (see [`share_pages`]): calls of about `bytes` of
/// pages, `calls` of them at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GpuBatches {
    /// Bytes of pages a call of nvCOMP's takes.
    pub bytes: usize,
    /// Calls a row group has in flight at once (each on a thread and stream of its own).
    pub calls: usize,
}

/// nvCOMP's batches unless told otherwise: 64 MiB (1,024 frames of [`DEFAULT_FRAME_BYTES`]),
/// two calls at once.
///
/// A call of nvCOMP's costs ~18 ms however small (packing, copies, the kernels' latency), so
/// its rate grows with its size and with calls in flight: on an H200 (the `nvcomp` bench,
/// lineitem's uncompressed pages) 0.47 GB/s in calls of 8 MiB one at a time, 1.27 GB/s in
/// 64 MiB calls, 3.2-3.8 GB/s with four 64-128 MiB calls in flight, against 2.1 GB/s for zstd(3)
/// on all 16 cores. On TPC-H lineitem SF10 (a row group's pages are ~65 MB), 64 MiB and two
/// calls took the writing phase from 2.8 s (8 MiB, one call) to 1.8 s; 32 MiB and two calls,
/// 64 MiB and four, 128 MiB were within 0.2 s of it (stop 39, runs 2-5).
pub const GPU_BATCHES: GpuBatches = GpuBatches {
    bytes: 64 << 20,
    calls: 2,
};

/// nvCOMP calls one writer has in flight at once, over all its row groups: each holds its
/// pages packed in pinned memory and about twice their bytes on the device, so 16 row groups
/// of two 64 MiB calls each would hold ~2 GiB pinned. Four calls in flight were the bench's
/// fastest (3.8 GB/s, `nvcomp` bench, stop 39); on lineitem a writer had 3-5 in flight for a
/// fifth of its writing phase, more than 4 for 5 ms.
pub const GPU_CALLS_IN_FLIGHT: usize = 4;

/// `GPUSORT_NVCOMP_IN_FLIGHT` (1 to 64): the calls one writer has in flight at once instead of
/// [`GPU_CALLS_IN_FLIGHT`] (`scripts/device-ab.sh` compares them).
pub const NVCOMP_IN_FLIGHT_ENV: &str = "GPUSORT_NVCOMP_IN_FLIGHT";

/// [`NVCOMP_IN_FLIGHT_ENV`]'s value as a number of calls.
fn parse_in_flight(v: &str) -> Result<usize, String> {
    crate::parse_count(NVCOMP_IN_FLIGHT_ENV, v, 1..=64, "calls")
}

/// At most `max` holders at once ([`Self::enter`] waits for a place).
#[derive(Debug)]
struct CallGate {
    max: usize,
    running: std::sync::Mutex<usize>,
    freed: std::sync::Condvar,
}

/// A place in a [`CallGate`], given back when dropped.
struct CallPlace<'a>(&'a CallGate);

impl CallGate {
    fn new(max: usize) -> Self {
        Self {
            max: max.max(1),
            running: std::sync::Mutex::new(0),
            freed: std::sync::Condvar::new(),
        }
    }

    fn enter(&self) -> CallPlace<'_> {
        let mut running = self.running.lock().unwrap_or_else(|p| p.into_inner());
        while *running >= self.max {
            running = self.freed.wait(running).unwrap_or_else(|p| p.into_inner());
        }
        *running += 1;
        CallPlace(self)
    }
}

impl Drop for CallPlace<'_> {
    fn drop(&mut self) {
        *self.0.running.lock().unwrap_or_else(|p| p.into_inner()) -= 1;
        self.0.freed.notify_one();
    }
}

/// `GPUSORT_NVCOMP_BATCHES` (`MiB,calls`, e.g. `32,2`): the batches nvCOMP takes instead of
/// [`GPU_BATCHES`] (`scripts/device-nvcomp-batches.sh` measures them).
pub const NVCOMP_BATCHES_ENV: &str = "GPUSORT_NVCOMP_BATCHES";

/// `MiB,calls` as [`GpuBatches`].
fn parse_batches(v: &str) -> Result<GpuBatches, String> {
    let bad = || format!("{NVCOMP_BATCHES_ENV}={v}: expected MiB,calls such as 32,2");
    let (mib, calls) = v.split_once(',').ok_or_else(bad)?;
    let mib: usize = mib.trim().parse().map_err(|_| bad())?;
    let calls: usize = calls.trim().parse().map_err(|_| bad())?;
    if !(1..=1024).contains(&mib) || !(1..=64).contains(&calls) {
        return Err(bad());
    }
    Ok(GpuBatches {
        bytes: mib << 20,
        calls,
    })
}

/// zstd on the GPU through nvCOMP and on the CPU at once, each taking the pages the other has
/// not (see [`share_pages`]): on the GPU each page is cut into frames of `frame_bytes`,
/// compressed in batches, and its frames concatenated (a zstd stream of several frames, which
/// every zstd decoder reads as one).
#[derive(Debug)]
pub struct NvcompZstd {
    gpu: ZstdCompressor,
    frame_bytes: usize,
    level: i32,
    /// The most of the pages' bytes the GPU takes (0.0 to 1.0, from the first page).
    gpu_share: f64,
    batches: GpuBatches,
    /// Calls in flight over all row groups ([`GPU_CALLS_IN_FLIGHT`]).
    in_flight: CallGate,
    cpu: CpuZstd,
    /// Bytes of pages the CPU compressed.
    cpu_bytes: std::sync::atomic::AtomicU64,
}

/// The most of a row group's page bytes nvCOMP may compress: all of them. What it does take
/// is what it gets through while the CPU's threads compress from the other end (stop 38; with
/// a fixed split, stop 23's `writer_props --whole` on lineitem SF10 took 5.28 s with every page
/// on the GPU, 5.61 s with three quarters, 5.98 s with half, 5.65 s on the CPU alone: nvCOMP's
/// zstd ran at about 2.4 GB/s on the H100, and the parquet crate's encoder kept the cores busy).
pub const DEFAULT_GPU_SHARE: f64 = 1.0;

impl NvcompZstd {
    /// nvCOMP on GPU `ordinal`, with `frame_bytes` a frame (at most nvCOMP's
    /// [`MAX_CHUNK`]); `level` is the level the file's metadata names (nvCOMP has its own).
    pub fn try_new(ordinal: usize, frame_bytes: usize, level: i32) -> Result<Self, String> {
        if !(1..=MAX_CHUNK).contains(&frame_bytes) {
            return Err(format!(
                "a zstd frame on the GPU is 1 to {MAX_CHUNK} bytes, not {frame_bytes}"
            ));
        }
        ZstdLevel::try_new(level).map_err(|e| e.to_string())?;
        let gpu = ZstdCompressor::try_new(ordinal).map_err(|e| e.to_string())?;
        Ok(Self {
            gpu,
            frame_bytes,
            level,
            gpu_share: DEFAULT_GPU_SHARE,
            batches: GPU_BATCHES,
            in_flight: CallGate::new(GPU_CALLS_IN_FLIGHT),
            cpu: CpuZstd::new(level),
            cpu_bytes: Default::default(),
        })
    }

    /// With at most `share` of the pages' bytes compressed on the GPU (clamped to 0..=1), the
    /// rest on the CPU at the same time.
    pub fn with_gpu_share(mut self, share: f64) -> Self {
        self.gpu_share = share.clamp(0.0, 1.0);
        self
    }

    /// With nvCOMP taking the pages in `batches`.
    pub fn with_batches(mut self, batches: GpuBatches) -> Self {
        self.batches = GpuBatches {
            bytes: batches.bytes.max(1),
            calls: batches.calls.max(1),
        };
        self
    }

    /// With at most `calls` nvCOMP calls in flight at once over all row groups.
    pub fn with_calls_in_flight(mut self, calls: usize) -> Self {
        self.in_flight = CallGate::new(calls);
        self
    }

    /// What nvCOMP did so far.
    pub fn stats(&self) -> CompressStats {
        self.gpu.stats()
    }
}

impl PageCompressor for NvcompZstd {
    fn codec(&self) -> Compression {
        Compression::ZSTD(ZstdLevel::try_new(self.level).expect("checked in try_new"))
    }

    fn name(&self) -> String {
        format!("zstd on the GPU (nvCOMP {})", self.gpu.version())
    }

    /// The GPU (from `batches.calls` threads of its own, at most [`GPU_CALLS_IN_FLIGHT`] calls
    /// of this compressor at once) and the CPU's threads share the pages as [`share_pages`]
    /// does, the GPU taking at most its share of the bytes.
    fn compress(&self, pages: &[&[u8]]) -> Result<Vec<Vec<u8>>, ParquetError> {
        // Where the device memory budget has no room now (the sorts hold it), the CPU.
        let gpu = |frames: &[&[u8]]| {
            let compressed = {
                let _place = self.in_flight.enter();
                self.gpu.try_compress(frames)
            };
            match compressed {
                Ok(Some(out)) => Ok(out),
                Ok(None) => {
                    let bytes: usize = frames.iter().map(|f| f.len()).sum();
                    self.cpu_bytes
                        .fetch_add(bytes as u64, std::sync::atomic::Ordering::Relaxed);
                    self.cpu.compress(frames)
                }
                Err(e) => Err(ParquetError::External(Box::new(e))),
            }
        };
        share_pages(
            pages,
            gpu_pages(pages, self.gpu_share),
            self.batches,
            |batch| in_frames(batch, self.frame_bytes, gpu),
            || self.cpu.compressor(),
            |compressor, page| {
                self.cpu_bytes
                    .fetch_add(page.len() as u64, std::sync::atomic::Ordering::Relaxed);
                self.cpu.compress_one(compressor, page)
            },
        )
    }

    /// The GPU's share of the bytes, e.g. `78% of the bytes on the GPU in 61 calls` (batches
    /// the device memory budget refused count as the CPU's).
    fn report(&self) -> Option<String> {
        let gpu = self.stats();
        let cpu = self.cpu_bytes.load(std::sync::atomic::Ordering::Relaxed);
        let total = gpu.bytes_in + cpu;
        (total > 0).then(|| {
            format!(
                "{:.0}% of the bytes on the GPU in {} calls",
                100.0 * gpu.bytes_in as f64 / total as f64,
                gpu.calls
            )
        })
    }
}

/// `pages` compressed by a GPU and the CPU's threads at once, each taking the next pages the
/// other has not: the GPU (`gpu`, called from `batches.calls` threads of its own at once) a
/// batch of about `batches.bytes` from the front, at most the first `gpu_limit` pages in all;
/// the rayon pool's threads (`cpu`, with a state from `init` each) one page at a time from the
/// back; until they meet. Each side's share is what it gets through meanwhile: a GPU contended
/// by other row groups, or CPUs busy encoding, take less. The calling thread waits for the
/// GPU's last batches at most.
pub fn share_pages<S>(
    pages: &[&[u8]],
    gpu_limit: usize,
    batches: GpuBatches,
    gpu: impl Fn(&[&[u8]]) -> Result<Vec<Vec<u8>>, ParquetError> + Sync,
    init: impl Fn() -> S + Sync + Send,
    cpu: impl Fn(&mut S, &[u8]) -> Result<Vec<u8>, ParquetError> + Sync + Send,
) -> Result<Vec<Vec<u8>>, ParquetError> {
    use rayon::prelude::*;
    use std::sync::{Mutex, OnceLock};
    let n = pages.len();
    // The next page the GPU takes, and the first the CPU has taken.
    let ends = Mutex::new((0usize, n));
    let lock = || ends.lock().unwrap_or_else(|p| p.into_inner());
    let out: Vec<OnceLock<Vec<u8>>> = (0..n).map(|_| OnceLock::new()).collect();
    let gpu_side = || -> Result<(), ParquetError> {
        loop {
            let (start, end) = {
                let mut e = lock();
                let (start, mut end, mut bytes) = (e.0, e.0, 0);
                while end < e.1.min(gpu_limit) && (end == start || bytes + pages[end].len() <= batches.bytes) {
                    bytes += pages[end].len();
                    end += 1;
                }
                e.0 = end;
                (start, end)
            };
            if start == end {
                return Ok(());
            }
            let frames = gpu(&pages[start..end])?;
            if frames.len() != end - start {
                return Err(ParquetError::General(format!(
                    "the GPU returned {} frames for {} pages",
                    frames.len(),
                    end - start
                )));
            }
            for (slot, frame) in out[start..end].iter().zip(frames) {
                let _ = slot.set(frame);
            }
        }
    };
    let (gpu_done, cpu_done) = std::thread::scope(|scope| {
        let calls = if gpu_limit > 0 { batches.calls.max(1) } else { 0 };
        let gpu_threads: Vec<_> = (0..calls).map(|_| scope.spawn(gpu_side)).collect();
        let cpu_done = (0..n)
            .into_par_iter()
            .map_init(&init, |state, _| {
                let i = {
                    let mut e = lock();
                    if e.1 <= e.0 {
                        return Ok(());
                    }
                    e.1 -= 1;
                    e.1
                };
                let _ = out[i].set(cpu(state, pages[i])?);
                Ok(())
            })
            .collect::<Result<(), ParquetError>>();
        let gpu_done = gpu_threads.into_iter().try_for_each(|t| {
            t.join()
                .unwrap_or_else(|_| Err(ParquetError::General("an nvCOMP thread panicked".into())))
        });
        (gpu_done, cpu_done)
    });
    gpu_done?;
    cpu_done?;
    out.into_iter()
        .map(|o| {
            o.into_inner()
                .ok_or_else(|| ParquetError::General("a page was not compressed".into()))
        })
        .collect()
}

/// How many of `pages`, from the first, make up `share` of their bytes (at least one page when
/// the share is above 0 and there are pages).
fn gpu_pages(pages: &[&[u8]], share: f64) -> usize {
    let total: usize = pages.iter().map(|p| p.len()).sum();
    let want = (total as f64 * share).ceil() as usize;
    let mut taken = 0;
    let mut n = 0;
    while n < pages.len() && (taken < want || (n == 0 && share > 0.0)) {
        taken += pages[n].len();
        n += 1;
    }
    n
}

/// Each of `pages` cut into pieces of at most `frame_bytes` (an empty page is one empty
/// piece), all pieces compressed by one call of `compress`, and each page's compressed pieces
/// concatenated in order.
pub fn in_frames(
    pages: &[&[u8]],
    frame_bytes: usize,
    compress: impl FnOnce(&[&[u8]]) -> Result<Vec<Vec<u8>>, ParquetError>,
) -> Result<Vec<Vec<u8>>, ParquetError> {
    let mut pieces: Vec<&[u8]> = Vec::with_capacity(pages.len());
    let mut counts = Vec::with_capacity(pages.len());
    for page in pages {
        let before = pieces.len();
        pieces.extend(page.chunks(frame_bytes.max(1)));
        if page.is_empty() {
            pieces.push(page);
        }
        counts.push(pieces.len() - before);
    }
    let frames = compress(&pieces)?;
    if frames.len() != pieces.len() {
        return Err(ParquetError::General(format!(
            "the compressor returned {} frames for {} pieces",
            frames.len(),
            pieces.len()
        )));
    }
    let mut frames = frames.into_iter();
    Ok(counts
        .into_iter()
        .map(|n| match n {
            1 => frames.next().expect("counted"),
            // One allocation of the page's size: gathered a byte at a time, the frames of
            // TPC-H lineitem's pages (~1.4 GB) were the top symbol of the writer's profile.
            _ => frames.by_ref().take(n).collect::<Vec<_>>().concat(),
        })
        .collect())
}

/// Where the pages are compressed, as [`choose`] found.
#[derive(Debug, Clone)]
pub struct PagePath {
    /// nvCOMP's compressor, or `None`: the Parquet writer compresses on the CPU.
    pub compressor: Option<Arc<dyn PageCompressor>>,
    /// The codec and where it runs, for the summary: `zstd on the GPU (nvCOMP 6.0.0)`,
    /// `zstd(3) on the CPU`, `snappy`.
    pub label: String,
    /// Why the CPU compresses zstd pages (`None` on the GPU, or for other codecs).
    pub why_cpu: Option<String>,
}

/// The GPU a sort's pages may be compressed on: `Ok(n)` for GPU `n`, or `Err(why)` where the
/// sort uses none (the reason the summary gives, e.g. `--device cpu`).
pub type PagesGpu = Result<usize, String>;

/// Where `--compress-on` and the codec have the pages compressed, on `gpu`. An error only
/// for `--compress-on gpu` when nvCOMP cannot run.
pub fn choose(on: CompressOn, codec: Codec, gpu: PagesGpu) -> Result<PagePath, String> {
    let Compression::ZSTD(level) = codec.0 else {
        if on == CompressOn::Gpu {
            return Err(format!("--compress-on gpu: nvCOMP is used for zstd only, not {codec}"));
        }
        return Ok(PagePath {
            compressor: None,
            label: codec.to_string(),
            why_cpu: None,
        });
    };
    let opened = match (on, gpu) {
        (CompressOn::Cpu, _) => Err("--compress-on cpu".to_string()),
        (_, Err(why)) => Err(why),
        (_, Ok(n)) => NvcompZstd::try_new(n, DEFAULT_FRAME_BYTES, level.compression_level()).and_then(|z| {
            let z = match std::env::var(NVCOMP_BATCHES_ENV) {
                Ok(v) => z.with_batches(parse_batches(&v)?),
                Err(_) => z,
            };
            match std::env::var(NVCOMP_IN_FLIGHT_ENV) {
                Ok(v) => Ok(z.with_calls_in_flight(parse_in_flight(&v)?)),
                Err(_) => Ok(z),
            }
        }),
    };
    match opened {
        Ok(pages) => Ok(PagePath {
            label: pages.name(),
            compressor: Some(Arc::new(pages)),
            why_cpu: None,
        }),
        Err(why) if on == CompressOn::Gpu => Err(format!("--compress-on gpu: {why}")),
        Err(why) => Ok(PagePath {
            compressor: None,
            label: format!("{codec} on the CPU"),
            why_cpu: Some(why),
        }),
    }
}

/// zstd pages compressed where [`choose`] finds with `--compress-on auto`, chosen on a thread of
/// its own while the sort starts: loading nvCOMP and making its GPU context took 0.19 s on the
/// H100 machine, all of the planning phase (DataFusion's planning took 29 ms), and the first
/// page is compressed seconds later. The first call waits for the choice; where nvCOMP cannot
/// run, the CPU compresses at the codec's level, as the writer does without a compressor.
#[derive(Debug)]
pub struct DeferredZstd {
    codec: Codec,
    level: i32,
    pending: std::sync::Mutex<Option<std::thread::JoinHandle<Result<PagePath, String>>>>,
    chosen: std::sync::OnceLock<(PagePath, Arc<dyn PageCompressor>)>,
}

impl DeferredZstd {
    /// Starts choosing for zstd `codec` (`None` for another codec) on `gpu`.
    pub fn start(codec: Codec, gpu: PagesGpu) -> Option<Self> {
        let Compression::ZSTD(level) = codec.0 else {
            return None;
        };
        let deferred = Self {
            codec,
            level: level.compression_level(),
            pending: Default::default(),
            chosen: Default::default(),
        };
        let gpu_here = gpu.clone();
        let choosing = std::thread::Builder::new()
            .name("gpusort-nvcomp".into())
            .spawn(move || {
                let found = choose(CompressOn::Auto, codec, gpu);
                if let Ok(path) = &found {
                    crate::mark(format_args!("writer: pages chosen: {}", path.label));
                }
                found
            });
        match choosing {
            Ok(thread) => *deferred.pending.lock().unwrap_or_else(|p| p.into_inner()) = Some(thread),
            // No thread: chosen now.
            Err(_) => {
                deferred.settle(choose(CompressOn::Auto, codec, gpu_here));
            }
        }
        Some(deferred)
    }

    /// Where the pages are compressed, waiting for the choice.
    pub fn path(&self) -> &PagePath {
        &self.chosen().0
    }

    fn chosen(&self) -> &(PagePath, Arc<dyn PageCompressor>) {
        if let Some(chosen) = self.chosen.get() {
            return chosen;
        }
        // One caller joins the thread; the others wait here, then find the choice.
        let mut pending = self.pending.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(chosen) = self.chosen.get() {
            return chosen;
        }
        let found = match pending.take() {
            Some(thread) => thread
                .join()
                .unwrap_or_else(|_| Err("choosing where pages are compressed panicked".into())),
            None => Err("choosing where pages are compressed did not start".into()),
        };
        self.settle(found)
    }

    fn settle(&self, found: Result<PagePath, String>) -> &(PagePath, Arc<dyn PageCompressor>) {
        let path = found.unwrap_or_else(|why| PagePath {
            compressor: None,
            label: format!("{} on the CPU", self.codec),
            why_cpu: Some(why),
        });
        if let Some(why) = &path.why_cpu {
            crate::mark(format_args!("writer: {} ({why})", path.label));
        }
        let compressor = path
            .compressor
            .clone()
            .unwrap_or_else(|| Arc::new(CpuZstd::new(self.level)));
        self.chosen.get_or_init(|| (path, compressor))
    }
}

impl PageCompressor for DeferredZstd {
    fn codec(&self) -> Compression {
        self.codec.0
    }

    fn name(&self) -> String {
        self.path().label.clone()
    }

    fn compress(&self, pages: &[&[u8]]) -> Result<Vec<Vec<u8>>, ParquetError> {
        self.chosen().1.compress(pages)
    }

    fn report(&self) -> Option<String> {
        self.chosen.get().and_then(|(_, c)| c.report())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use parquet::file::properties::WriterVersion;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// zstd on the CPU in frames of `.0` bytes: what [`NvcompZstd`] makes, without a GPU.
    #[derive(Debug)]
    struct FramedCpu(usize);

    impl PageCompressor for FramedCpu {
        fn codec(&self) -> Compression {
            Compression::ZSTD(ZstdLevel::try_new(3).unwrap())
        }
        fn name(&self) -> String {
            "zstd in frames on the CPU".into()
        }
        fn compress(&self, pages: &[&[u8]]) -> Result<Vec<Vec<u8>>, ParquetError> {
            in_frames(pages, self.0, |pieces| {
                Ok(pieces.iter().map(|p| zstd::bulk::compress(p, 3).unwrap()).collect())
            })
        }
    }

    #[test]
    fn the_gpu_takes_its_share_of_the_bytes_from_the_first_page() {
        let pages: Vec<Vec<u8>> = vec![vec![0; 10], vec![0; 30], vec![0; 60]];
        let refs: Vec<&[u8]> = pages.iter().map(|p| p.as_slice()).collect();
        assert_eq!(gpu_pages(&refs, 0.0), 0);
        assert_eq!(gpu_pages(&refs, 0.01), 1);
        assert_eq!(gpu_pages(&refs, 0.4), 2);
        assert_eq!(gpu_pages(&refs, 0.41), 3);
        assert_eq!(gpu_pages(&refs, 1.0), 3);
        assert_eq!(gpu_pages(&[], 0.5), 0);
    }

    /// Every page comes back compressed once, in order, whichever side took it; the GPU takes
    /// no page past its limit, and batches of about the bytes asked; an error of either side
    /// is the result.
    #[test]
    fn the_gpu_and_the_cpu_share_the_pages_from_both_ends() {
        use std::sync::Mutex;
        let pages: Vec<Vec<u8>> = (0..200u32)
            .map(|i| vec![(i % 251) as u8; 100 + (i as usize * 37) % 900])
            .collect();
        let refs: Vec<&[u8]> = pages.iter().map(|p| p.as_slice()).collect();
        let cases = [
            (200, 0, 1),
            (200, 2, 1),
            (50, 0, 1),
            (0, 0, 1),
            (1, 5, 1),
            (200, 2, 3),
            (50, 1, 4),
            (0, 0, 2),
        ];
        for (limit, gpu_ms, calls) in cases {
            let batches = Mutex::new(vec![]);
            let (running, most) = (AtomicUsize::new(0), AtomicUsize::new(0));
            let out = share_pages(
                &refs,
                limit,
                GpuBatches { bytes: 2000, calls },
                |batch| {
                    most.fetch_max(running.fetch_add(1, Ordering::SeqCst) + 1, Ordering::SeqCst);
                    batches
                        .lock()
                        .unwrap()
                        .push((batch.len(), batch.iter().map(|p| p.len()).sum::<usize>()));
                    std::thread::sleep(std::time::Duration::from_millis(gpu_ms));
                    running.fetch_sub(1, Ordering::SeqCst);
                    Ok(batch.iter().map(|p| zstd::bulk::compress(p, 1).unwrap()).collect())
                },
                || (),
                |_, page| Ok(zstd::bulk::compress(page, 3).unwrap()),
            )
            .unwrap();
            assert_eq!(out.len(), pages.len());
            for (frame, page) in out.iter().zip(&pages) {
                assert_eq!(&zstd::stream::decode_all(&frame[..]).unwrap(), page);
            }
            let batches = batches.into_inner().unwrap();
            let taken: usize = batches.iter().map(|b| b.0).sum();
            assert!(taken <= limit, "limit {limit}: the GPU took {taken}");
            assert!(batches.iter().all(|&(n, bytes)| n == 1 || bytes <= 2000), "{batches:?}");
            assert!(most.into_inner() <= calls, "more than {calls} calls at once");
            if limit == 0 {
                assert!(batches.is_empty());
            }
        }
        let one = GpuBatches { bytes: 2000, calls: 1 };
        let failing = share_pages(
            &refs,
            200,
            GpuBatches { bytes: 2000, calls: 2 },
            |_| Err(ParquetError::General("no GPU".into())),
            || (),
            // Slow enough that the GPU takes a batch before the CPU has taken every page.
            |_, page| {
                std::thread::sleep(std::time::Duration::from_millis(2));
                Ok(page.to_vec())
            },
        );
        assert!(failing.unwrap_err().to_string().contains("no GPU"));
        let failing = share_pages(
            &refs,
            0,
            one,
            |batch| Ok(batch.iter().map(|p| p.to_vec()).collect()),
            || (),
            |_, _| Err(ParquetError::General("no zstd".into())),
        );
        assert!(failing.unwrap_err().to_string().contains("no zstd"));
        assert!(
            share_pages(&[], 5, one, |_| unreachable!(), || (), |_, _| unreachable!())
                .unwrap()
                .is_empty()
        );
    }

    /// Every caller gets through, never more than the gate's places at once.
    #[test]
    fn the_call_gate_holds_at_most_its_places() {
        let gate = CallGate::new(3);
        let (running, most, done) = (AtomicUsize::new(0), AtomicUsize::new(0), AtomicUsize::new(0));
        std::thread::scope(|s| {
            for _ in 0..12 {
                s.spawn(|| {
                    for _ in 0..5 {
                        let _place = gate.enter();
                        most.fetch_max(running.fetch_add(1, Ordering::SeqCst) + 1, Ordering::SeqCst);
                        std::thread::sleep(std::time::Duration::from_millis(1));
                        running.fetch_sub(1, Ordering::SeqCst);
                        done.fetch_add(1, Ordering::SeqCst);
                    }
                });
            }
        });
        assert_eq!(done.into_inner(), 60);
        let most = most.into_inner();
        assert!((1..=3).contains(&most), "{most} at once");
        assert_eq!(*gate.running.lock().unwrap(), 0);
        assert_eq!(CallGate::new(0).max, 1);
    }

    #[test]
    fn nvcomp_batches_parse() {
        assert_eq!(
            parse_batches("32,2"),
            Ok(GpuBatches {
                bytes: 32 << 20,
                calls: 2
            })
        );
        assert_eq!(parse_batches(" 64 , 2 "), Ok(GPU_BATCHES));
        for bad in ["32", "0,1", "8,0", "x,2", "8,65", "2048,1"] {
            assert!(parse_batches(bad).unwrap_err().contains("MiB,calls"), "{bad}");
        }
        assert_eq!(parse_in_flight(" 8 "), Ok(8));
        for bad in ["0", "65", "x", ""] {
            assert!(parse_in_flight(bad).unwrap_err().contains("1 to 64"), "{bad}");
        }
    }

    #[test]
    fn pages_cut_into_frames_decode_whole() {
        let pages: Vec<Vec<u8>> = vec![vec![], b"abcdefghij".to_vec(), vec![5; 8], b"xyz".to_vec()];
        let refs: Vec<&[u8]> = pages.iter().map(|p| p.as_slice()).collect();
        let mut seen = vec![];
        let out = in_frames(&refs, 4, |pieces| {
            seen = pieces.iter().map(|p| p.len()).collect();
            Ok(pieces.iter().map(|p| zstd::bulk::compress(p, 3).unwrap()).collect())
        })
        .unwrap();
        assert_eq!(seen, vec![0, 4, 4, 2, 4, 4, 3]);
        for (frame, page) in out.iter().zip(&pages) {
            assert_eq!(&zstd::stream::decode_all(&frame[..]).unwrap(), page);
        }
        let short = in_frames(&refs, 4, |pieces| Ok(vec![vec![]; pieces.len() - 1]));
        assert!(short.unwrap_err().to_string().contains("6 frames for 7 pieces"));
    }

    /// nvCOMP's pages (all, half, none of them on the GPU) read back through the Parquet crate
    /// as the crate's own zstd pages do, page by page. Without nvCOMP it says so, and fails
    /// under GPUSORT_REQUIRE_NVCOMP=1.
    #[tokio::test]
    async fn nvcomp_pages_read_as_the_parquet_crates() {
        let dir = tempfile::tempdir().unwrap();
        let expected = dir.path().join("crate.parquet");
        crate::pages::tests::write(&expected, None, WriterVersion::PARQUET_1_0)
            .await
            .unwrap();
        for (share, calls) in [(1.0, 1), (1.0, 3), (0.5, 2), (0.0, 1)] {
            let pages = match NvcompZstd::try_new(0, 512, 3) {
                Ok(p) => p.with_gpu_share(share).with_batches(GpuBatches { bytes: 4096, calls }),
                Err(why) if std::env::var("GPUSORT_REQUIRE_NVCOMP").as_deref() == Ok("1") => {
                    panic!("GPUSORT_REQUIRE_NVCOMP=1 but {why}")
                }
                Err(why)
                    if std::env::var("GPUSORT_REQUIRE_GPU").as_deref() == Ok("1")
                        && gpusort_cuda::probe(0).is_err() =>
                {
                    panic!("GPUSORT_REQUIRE_GPU=1 but no GPU: {why}")
                }
                Err(why) => return eprintln!("nvcomp_pages_read_as_the_parquet_crates did not run: {why}"),
            };
            let pages = Arc::new(pages);
            let actual = dir.path().join(format!("nvcomp-{share}-{calls}.parquet"));
            crate::pages::tests::write(&actual, Some(Arc::clone(&pages) as _), WriterVersion::PARQUET_1_0)
                .await
                .unwrap();
            crate::pages::tests::assert_same_file(&expected, &actual);
            assert_eq!(
                pages.stats().calls > 0,
                share > 0.0,
                "share {share}: {:?}",
                pages.stats()
            );
            let report = pages.report().unwrap();
            assert!(
                report.ends_with(&format!("in {} calls", pages.stats().calls)),
                "{report}"
            );
            if share == 0.0 {
                assert!(report.starts_with("0% of the bytes on the GPU"), "{report}");
            }
        }
    }

    /// Pages of several zstd frames (2 KiB pages in 300-byte frames) read back through the
    /// Parquet crate as the crate's own one-frame pages do, page by page, v1 and v2.
    #[tokio::test]
    async fn a_file_of_framed_pages_reads_as_the_parquet_crates() {
        let dir = tempfile::tempdir().unwrap();
        for version in [WriterVersion::PARQUET_1_0, WriterVersion::PARQUET_2_0] {
            let (expected, actual) = (dir.path().join("crate.parquet"), dir.path().join("framed.parquet"));
            crate::pages::tests::write(&expected, None, version).await.unwrap();
            crate::pages::tests::write(&actual, Some(Arc::new(FramedCpu(300))), version)
                .await
                .unwrap();
            crate::pages::tests::assert_same_file(&expected, &actual);
        }
    }

    #[test]
    fn compress_on_parses() {
        assert_eq!("AUTO".parse::<CompressOn>().unwrap(), CompressOn::Auto);
        assert_eq!("gpu".parse::<CompressOn>().unwrap(), CompressOn::Gpu);
        assert_eq!(" cpu".parse::<CompressOn>().unwrap(), CompressOn::Cpu);
        assert!("disk".parse::<CompressOn>().unwrap_err().contains("auto, gpu or cpu"));
    }

    #[test]
    fn the_cpu_compresses_when_asked_or_when_nvcomp_cannot() {
        let zstd: Codec = "zstd(3)".parse().unwrap();
        let snappy: Codec = "snappy".parse().unwrap();
        let cpu = choose(CompressOn::Cpu, zstd, Ok(0)).unwrap();
        assert!(cpu.compressor.is_none());
        assert_eq!(
            (cpu.label.as_str(), cpu.why_cpu.as_deref()),
            ("zstd(3) on the CPU", Some("--compress-on cpu"))
        );
        let cpu = choose(CompressOn::Auto, zstd, Err("--device cpu".into())).unwrap();
        assert_eq!(cpu.why_cpu.as_deref(), Some("--device cpu"));
        let other = choose(CompressOn::Auto, snappy, Ok(0)).unwrap();
        assert!(other.compressor.is_none() && other.why_cpu.is_none());
        assert_eq!(other.label, "snappy");
        let err = choose(CompressOn::Gpu, snappy, Ok(0)).unwrap_err();
        assert!(err.contains("zstd only, not snappy"), "{err}");
        // Auto with zstd: the GPU where nvCOMP loads, else the CPU with the loader's reason.
        let auto = choose(CompressOn::Auto, zstd, Ok(0)).unwrap();
        match auto.compressor {
            Some(_) => assert!(auto.label.starts_with("zstd on the GPU (nvCOMP 6."), "{}", auto.label),
            None => {
                assert_eq!(auto.label, "zstd(3) on the CPU");
                assert!(!auto.why_cpu.unwrap().is_empty());
            }
        }
    }

    #[test]
    fn deferred_zstd_compresses_where_the_choice_fell_from_every_thread() {
        let snappy: Codec = "snappy".parse().unwrap();
        assert!(DeferredZstd::start(snappy, Ok(0)).is_none());
        let zstd: Codec = "zstd(5)".parse().unwrap();
        let pages: Vec<Vec<u8>> = (0..40u8).map(|i| vec![i; 1000 + 37 * i as usize]).collect();
        let refs: Vec<&[u8]> = pages.iter().map(|p| p.as_slice()).collect();
        for gpu in [Err("--device cpu".to_string()), Ok(0)] {
            let deferred = Arc::new(DeferredZstd::start(zstd, gpu.clone()).unwrap());
            assert_eq!(deferred.codec(), zstd.0);
            // Several threads ask at once; each gets frames of its pages.
            let results: Vec<Vec<Vec<u8>>> = std::thread::scope(|scope| {
                let asks: Vec<_> = (0..4)
                    .map(|_| scope.spawn(|| deferred.compress(&refs).unwrap()))
                    .collect();
                asks.into_iter().map(|a| a.join().unwrap()).collect()
            });
            for frames in results {
                assert_eq!(frames.len(), pages.len());
                for (frame, page) in frames.iter().zip(&pages) {
                    assert_eq!(&zstd::stream::decode_all(frame.as_slice()).unwrap(), page);
                }
            }
            let path = deferred.path();
            match gpu {
                Err(_) => {
                    assert_eq!(path.label, "zstd(5) on the CPU");
                    assert_eq!(path.why_cpu.as_deref(), Some("--device cpu"));
                }
                Ok(_) => assert!(path.label.starts_with("zstd"), "{}", path.label),
            }
            assert_eq!(deferred.name(), path.label);
        }
    }
}
