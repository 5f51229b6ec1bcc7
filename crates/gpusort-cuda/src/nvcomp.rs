//! zstd compression of many buffers at once on the GPU, through nvCOMP's batched API.
//!
//! The Parquet writer of the `gpusort` tool spends a third of its CPU time compressing pages
//! with zstd. [`ZstdCompressor`] hands a whole row group's pages (about a thousand buffers of
//! up to 1 MiB) to nvCOMP in one call: the pages are packed into one pinned buffer, cross PCIe
//! in one copy, are compressed by `nvcompBatchedZstdCompressAsync` into slots sized by nvCOMP's
//! bound for each page, and come back in one copy. Each output is one standard zstd frame: any
//! zstd decoder (DuckDB, pyarrow, arrow-rs) reads it.
//!
//! Reading goes the other way: [`PageDecompressor`] decompresses a call's snappy or zstd pages
//! (`nvcompBatched{Snappy,Zstd}DecompressAsync`) into one device buffer.
//!
//! nvCOMP is not linked: like the CUDA driver it is loaded at run time, from the path in
//! `GPUSORT_NVCOMP` (the library, or a folder holding it) or else by the name
//! `libnvcomp.so.6` (the `nvidia-libnvcomp-cu13` wheel ships it; put its `lib64` folder on
//! `LD_LIBRARY_PATH`). Only nvCOMP 6 is accepted: the batched API's signatures changed between
//! major versions. Without it, [`ZstdCompressor::try_new`] says why, and the caller compresses
//! on the CPU.
//!
//! The device memory of a call (its inputs, outputs and nvCOMP's scratch: about twice the
//! pages' bytes) is allocated on the call's stream and freed when it returns, and held of the
//! process's [`DeviceBudget`] of the device meanwhile, as a sort's is: where the budget has no
//! room now (the sorts hold it), [`ZstdCompressor::try_compress`] compresses nothing and says
//! so, and the caller compresses on the CPU.

use std::ffi::{CStr, c_char, c_void};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};

use cudarc::driver::sys::{CUdeviceptr, CUstream};
use cudarc::driver::{CudaContext, CudaSlice, CudaStream, DevicePtr, result};

use crate::error::{CudaSortError, Result};
use crate::memory::{DeviceBudget, DeviceReservation};
use crate::options::GpuOptions;
use crate::pinned::{HostBuffer, PinnedPool};
use crate::zstd_frames::zstd_frames;

/// The library's file name.
pub const NVCOMP_LIBRARY: &str = "libnvcomp.so.6";
/// The environment variable naming the library (or its folder).
pub const NVCOMP_ENV: &str = "GPUSORT_NVCOMP";
/// The largest buffer nvCOMP's zstd compresses (its documented limit: 16 MB).
pub const MAX_CHUNK: usize = 16 << 20;

/// The zstd frame of no bytes: magic number, a frame header with a one-byte content size
/// of 0, and one last raw block of 0 bytes.
const EMPTY_FRAME: [u8; 9] = [0x28, 0xb5, 0x2f, 0xfd, 0x20, 0x00, 0x01, 0x00, 0x00];

/// `nvcompStatus_t`.
type Status = i32;
const SUCCESS: Status = 0;

/// `nvcompBatchedZstdCompressOpts_t`: reserved bytes, zeroed.
#[repr(C)]
#[derive(Clone, Copy)]
struct CompressOpts {
    reserved: [u8; 64],
}
const OPTS: CompressOpts = CompressOpts { reserved: [0; 64] };

/// `nvcompAlignmentRequirements_t`.
#[repr(C)]
#[derive(Default, Clone, Copy)]
struct Alignments {
    input: usize,
    output: usize,
    temp: usize,
}

/// `nvcompProperties_t`.
#[repr(C)]
#[derive(Default)]
struct Properties {
    version: u32,
    cudart_version: u32,
}

type GetProperties = unsafe extern "C" fn(*mut Properties) -> Status;
type StatusString = unsafe extern "C" fn(Status) -> *const c_char;
type GetAlignments = unsafe extern "C" fn(CompressOpts, *mut Alignments) -> Status;
type GetTempSize = unsafe extern "C" fn(usize, usize, CompressOpts, *mut usize, usize, CUstream) -> Status;
type GetMaxOutput = unsafe extern "C" fn(usize, CompressOpts, *mut usize) -> Status;
type CompressAsync = unsafe extern "C" fn(
    *const *const c_void,
    *const usize,
    usize,
    usize,
    *mut c_void,
    usize,
    *const *mut c_void,
    *mut usize,
    CompressOpts,
    *mut Status,
    CUstream,
) -> Status;

/// `nvcompBatched{Snappy,Zstd}DecompressOpts_t`: the backend and reserved bytes, zeroed: the
/// default backend (the decompression engine where the GPU has one, else the SMs).
#[repr(C)]
#[derive(Clone, Copy)]
struct DecompressOpts {
    reserved: [u8; 64],
}
const DECOMPRESS_OPTS: DecompressOpts = DecompressOpts { reserved: [0; 64] };

type GetDecompressAlignments = unsafe extern "C" fn(DecompressOpts, *mut Alignments) -> Status;
type DecompressTempSize = unsafe extern "C" fn(usize, usize, DecompressOpts, *mut usize, usize, CUstream) -> Status;
type DecompressAsync = unsafe extern "C" fn(
    *const *const c_void,
    *const usize,
    *const usize,
    *mut usize,
    usize,
    *mut c_void,
    usize,
    *const *mut c_void,
    DecompressOpts,
    *mut Status,
    CUstream,
) -> Status;

/// The entry points gpusort calls, resolved once.
struct Api {
    /// Keeps the entry points valid.
    _library: libloading::Library,
    path: PathBuf,
    version: u32,
    status_string: StatusString,
    alignments: Alignments,
    temp_size: GetTempSize,
    max_output: GetMaxOutput,
    compress: CompressAsync,
    /// Snappy's entry points, then zstd's ([`PageCodec`]'s order).
    decompressors: [DecompressEntries; 2],
}

/// The entry points of one codec's batched decompression, and its buffers' alignments.
struct DecompressEntries {
    temp_size: DecompressTempSize,
    decompress: DecompressAsync,
    alignments: Alignments,
}

/// The codec of the pages a [`PageDecompressor`] call decompresses (Parquet's names).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PageCodec {
    Snappy,
    Zstd,
}

impl PageCodec {
    /// Its name in messages.
    pub fn name(self) -> &'static str {
        match self {
            PageCodec::Snappy => "snappy",
            PageCodec::Zstd => "zstd",
        }
    }
}

impl Api {
    /// The library, loaded once per process (the error, if any, too).
    fn get() -> std::result::Result<&'static Api, String> {
        static API: OnceLock<std::result::Result<Api, String>> = OnceLock::new();
        API.get_or_init(Api::load).as_ref().map_err(Clone::clone)
    }

    fn load() -> std::result::Result<Api, String> {
        let path = library_path(std::env::var_os(NVCOMP_ENV).map(PathBuf::from));
        // SAFETY: loading a library runs its initializers; nvCOMP's only set up its own state.
        let library = unsafe { libloading::Library::new(&path) }.map_err(|e| {
            format!(
                "nvCOMP is not installed ({} could not be loaded: {e}; install the \
                 nvidia-libnvcomp-cu13 wheel and set {NVCOMP_ENV} to its libnvcomp.so.6)",
                path.display()
            )
        })?;
        let symbol = |name: String| format!("{}: no {name}", path.display());
        // SAFETY: each symbol is typed with the signature of nvCOMP 6's headers, and the
        // version is checked before any other is called.
        unsafe {
            let get_properties: GetProperties = entry(&library, "nvcompGetProperties").map_err(symbol)?;
            let mut props = Properties::default();
            check_launch(get_properties(&mut props), "nvcompGetProperties", None)?;
            if props.version / 1000 != 6 {
                return Err(format!(
                    "{} is nvCOMP {}.{}: gpusort needs nvCOMP 6",
                    path.display(),
                    props.version / 1000,
                    props.version % 1000 / 100
                ));
            }
            let get_alignments: GetAlignments =
                entry(&library, "nvcompBatchedZstdCompressGetRequiredAlignments").map_err(symbol)?;
            let mut alignments = Alignments::default();
            check_launch(get_alignments(OPTS, &mut alignments), "alignments", None)?;
            let decompressor = |codec: &str| -> std::result::Result<DecompressEntries, String> {
                let named = |what: &str| format!("nvcompBatched{codec}Decompress{what}");
                let get_alignments: GetDecompressAlignments =
                    entry(&library, &named("GetRequiredAlignments")).map_err(symbol)?;
                let mut alignments = Alignments::default();
                check_launch(get_alignments(DECOMPRESS_OPTS, &mut alignments), "alignments", None)?;
                Ok(DecompressEntries {
                    temp_size: entry(&library, &named("GetTempSize")).map_err(symbol)?,
                    decompress: entry(&library, &named("Async")).map_err(symbol)?,
                    alignments,
                })
            };
            Ok(Api {
                decompressors: [decompressor("Snappy")?, decompressor("Zstd")?],
                status_string: entry(&library, "nvcompGetStatusString").map_err(symbol)?,
                temp_size: entry(&library, "nvcompBatchedZstdCompressGetTempSize").map_err(symbol)?,
                max_output: entry(&library, "nvcompBatchedZstdCompressGetMaxOutputChunkSize").map_err(symbol)?,
                compress: entry(&library, "nvcompBatchedZstdCompressAsync").map_err(symbol)?,
                alignments,
                version: props.version,
                path,
                _library: library,
            })
        }
    }

    /// `Ok` for success, else the call and nvCOMP's words for `status`.
    fn check(&self, status: Status, call: &str) -> Result<()> {
        check_launch(status, call, Some(self.status_string)).map_err(CudaSortError::Compression)
    }
}

/// The entry point `name` of `library`, as a function of type `F`.
///
/// # Safety
/// `F` must be the symbol's true signature.
unsafe fn entry<F: Copy>(library: &libloading::Library, name: &str) -> std::result::Result<F, String> {
    // SAFETY: the caller vouches for the type.
    unsafe { library.get::<F>(name.as_bytes()) }
        .map(|s| *s)
        .map_err(|_| name.to_owned())
}

fn check_launch(status: Status, call: &str, words: Option<StatusString>) -> std::result::Result<(), String> {
    if status == SUCCESS {
        return Ok(());
    }
    let text = words
        // SAFETY: nvCOMP returns a static NUL-terminated string for every status.
        .map(|f| unsafe { CStr::from_ptr(f(status)) }.to_string_lossy().into_owned())
        .unwrap_or_default();
    Err(format!("nvCOMP {call} failed: status {status} {text}"))
}

/// Where to load nvCOMP from: `configured` (a file, or a folder holding the library), else the
/// library's name for the dynamic loader to find.
fn library_path(configured: Option<PathBuf>) -> PathBuf {
    match configured {
        Some(p) if p.is_dir() => p.join(NVCOMP_LIBRARY),
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => PathBuf::from(NVCOMP_LIBRARY),
    }
}

/// Rounds `n` up to a multiple of `to` (a power of two or any positive number).
fn align_up(n: usize, to: usize) -> usize {
    n.div_ceil(to.max(1)) * to.max(1)
}

/// Where each output goes: as [`pack`] places them (at multiples of `align`), but an output
/// `joined` to the one before right after it (the frames of one page); `None` where that is not
/// at a multiple of `joined_align`.
fn place(sizes: &[usize], joined: &[bool], align: usize, joined_align: usize) -> Option<(Vec<usize>, usize)> {
    let mut end = 0;
    let offsets = (sizes.iter().zip(joined))
        .map(|(&len, &joined)| {
            let at = if joined { end } else { align_up(end, align) };
            end = at + len;
            (at % joined_align.max(1) == 0).then_some(at)
        })
        .collect::<Option<Vec<usize>>>()?;
    Some((offsets, end))
}

/// Where each buffer goes in a packed region: offsets aligned to `align`, and the total.
fn pack(lens: impl IntoIterator<Item = usize>, align: usize) -> (Vec<usize>, usize) {
    let mut end = 0;
    let offsets = lens
        .into_iter()
        .map(|len| {
            let at = align_up(end, align);
            end = at + len;
            at
        })
        .collect();
    (offsets, end)
}

/// Compresses batches of buffers with zstd on one GPU; see the module doc. Calls from several
/// threads run at once, each on a stream of its own.
pub struct ZstdCompressor {
    device: NvcompDevice,
    /// Streams of finished calls, for the next ones.
    streams: Mutex<Vec<Arc<CudaStream>>>,
    stats: Mutex<CompressStats>,
}

/// nvCOMP on one GPU, its calls' device memory held of the process's budget of the device.
struct NvcompDevice {
    api: &'static Api,
    ctx: Arc<CudaContext>,
    ordinal: usize,
    /// `GPUSORT_DEVICE_BUDGET`, for the process's budget if this device makes it.
    configured_budget: Option<usize>,
    /// The process's budget of the device, taken at the first call (by then a sort has
    /// usually made it, with its options).
    budget: OnceLock<Arc<DeviceBudget>>,
}

impl NvcompDevice {
    /// GPU `ordinal` with nvCOMP; an error says why not (no nvCOMP, no GPU).
    fn open(ordinal: usize) -> Result<Self> {
        let api = Api::get().map_err(CudaSortError::Compression)?;
        let ctx = CudaContext::new(ordinal)?;
        PinnedPool::global().attach(&ctx);
        Ok(Self {
            api,
            ctx,
            ordinal,
            configured_budget: GpuOptions::from_env().ok().and_then(|o| o.device_budget),
            budget: OnceLock::new(),
        })
    }

    /// The process's device memory budget of the device (made here with the device's free
    /// memory when no sort has made it).
    fn budget(&self) -> &Arc<DeviceBudget> {
        self.budget.get_or_init(|| {
            DeviceBudget::for_device(self.ordinal, self.configured_budget, || {
                let _ = self.ctx.bind_to_thread();
                result::mem_get_info().map_or(0, |(free, _)| free)
            })
        })
    }
}

/// What a [`ZstdCompressor`] did so far.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct CompressStats {
    /// Calls that compressed at least one buffer.
    pub calls: u64,
    /// Buffers compressed.
    pub buffers: u64,
    /// Bytes in.
    pub bytes_in: u64,
    /// Bytes out.
    pub bytes_out: u64,
    /// Seconds spent in calls, summed over the threads that made them.
    pub call_seconds: f64,
    /// Calls that compressed nothing: the device memory budget had no room for them.
    pub refused: u64,
}

impl std::fmt::Debug for ZstdCompressor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ZstdCompressor")
            .field("library", &self.device.api.path)
            .field("version", &self.version())
            .finish_non_exhaustive()
    }
}

impl ZstdCompressor {
    /// A compressor on GPU `ordinal`; an error says why there is none (no nvCOMP, no GPU).
    pub fn try_new(ordinal: usize) -> Result<Self> {
        Ok(Self {
            device: NvcompDevice::open(ordinal)?,
            streams: Mutex::default(),
            stats: Mutex::default(),
        })
    }

    /// Holds its device memory of `budget` instead of the process's budget of the device.
    pub fn with_budget(self, budget: Arc<DeviceBudget>) -> Self {
        let _ = self.device.budget.set(budget);
        self
    }

    /// What it did so far.
    pub fn stats(&self) -> CompressStats {
        *self.stats.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// nvCOMP's version, as "major.minor.patch".
    pub fn version(&self) -> String {
        let v = self.device.api.version;
        format!("{}.{}.{}", v / 1000, v % 1000 / 100, v % 100)
    }

    /// The library file loaded.
    pub fn library(&self) -> &Path {
        &self.device.api.path
    }

    /// One zstd frame for each of `inputs`, in order; an error where the device memory budget
    /// has no room for the call now. Every input must be at most [`MAX_CHUNK`] bytes.
    pub fn compress(&self, inputs: &[&[u8]]) -> Result<Vec<Vec<u8>>> {
        self.try_compress(inputs)?
            .ok_or_else(|| CudaSortError::Compression("the device memory budget has no room for the call now".into()))
    }

    /// As [`Self::compress`], but `None` where the device memory budget has no room for the
    /// call now (its sorts hold it): nothing was compressed.
    pub fn try_compress(&self, inputs: &[&[u8]]) -> Result<Option<Vec<Vec<u8>>>> {
        if let Some(big) = inputs.iter().find(|i| i.len() > MAX_CHUNK) {
            return Err(CudaSortError::Compression(format!(
                "a buffer of {} bytes is over nvCOMP's zstd limit of {MAX_CHUNK}",
                big.len()
            )));
        }
        // Empty buffers get the empty frame here; nvCOMP compresses the rest.
        let full: Vec<&[u8]> = inputs.iter().copied().filter(|i| !i.is_empty()).collect();
        let mut frames = if full.is_empty() {
            vec![]
        } else {
            let start = std::time::Instant::now();
            let stream = self.take_stream()?;
            let out = self.compress_on(&stream, &full)?;
            self.streams.lock().unwrap_or_else(|p| p.into_inner()).push(stream);
            let mut stats = self.stats.lock().unwrap_or_else(|p| p.into_inner());
            let Some(out) = out else {
                stats.refused += 1;
                return Ok(None);
            };
            stats.calls += 1;
            stats.buffers += full.len() as u64;
            stats.bytes_in += full.iter().map(|b| b.len() as u64).sum::<u64>();
            stats.bytes_out += out.iter().map(|b| b.len() as u64).sum::<u64>();
            stats.call_seconds += start.elapsed().as_secs_f64();
            out
        }
        .into_iter();
        Ok(Some(
            inputs
                .iter()
                .map(|i| match i.is_empty() {
                    true => EMPTY_FRAME.to_vec(),
                    false => frames.next().expect("a frame for each non-empty input"),
                })
                .collect(),
        ))
    }

    fn take_stream(&self) -> Result<Arc<CudaStream>> {
        let free = self.streams.lock().unwrap_or_else(|p| p.into_inner()).pop();
        match free {
            Some(s) => Ok(s),
            None => Ok(self.device.ctx.new_stream()?),
        }
    }

    /// [`Self::try_compress`] on `stream`: hold its device memory of the budget (else `None`),
    /// pack, upload, compress, download the sizes and then the frames.
    fn compress_on(&self, stream: &Arc<CudaStream>, inputs: &[&[u8]]) -> Result<Option<Vec<Vec<u8>>>> {
        let t0 = std::time::Instant::now();
        let api = self.device.api;
        let n = inputs.len();
        let max_in = inputs.iter().map(|i| i.len()).max().unwrap_or(1);
        let (in_at, in_total) = pack(inputs.iter().map(|i| i.len()), api.alignments.input.max(8));
        let bounds = inputs
            .iter()
            .map(|i| {
                let mut bound = 0;
                // SAFETY: a plain query of nvCOMP's bound for a buffer of this size.
                api.check(
                    unsafe { (api.max_output)(i.len(), OPTS, &mut bound) },
                    "max output size",
                )?;
                Ok(bound)
            })
            .collect::<Result<Vec<usize>>>()?;
        let (out_at, out_total) = pack(bounds.iter().copied(), api.alignments.output.max(8));
        let mut temp_bytes = 0;
        // SAFETY: a query; it enqueues nothing on the stream.
        api.check(
            unsafe { (api.temp_size)(n, max_in, OPTS, &mut temp_bytes, in_total, stream.cu_stream()) },
            "temp size",
        )?;

        let temp_total = align_up(temp_bytes.max(1), api.alignments.temp.max(8));
        let mut held = self.device.budget().reservation();
        let needed = in_total + out_total + temp_total + 8 * 5 * n;
        if !held.try_grow_to(needed) {
            log::debug!(
                target: "gpusort::timeline",
                "nvCOMP zstd: the device memory budget has no room for {:.1} MB now: {n} buffers left to the CPU",
                needed as f64 / 1e6
            );
            return Ok(None);
        }
        // Device memory: inputs, outputs, scratch, and the per-buffer tables.
        let d_in = alloc(stream, in_total)?;
        let d_out = alloc(stream, out_total)?;
        let d_temp = alloc(stream, temp_total)?;
        // Tables: input pointers, input sizes, output pointers (uploaded); output sizes and
        // statuses (downloaded).
        let d_tables = alloc(stream, 8 * 5 * n)?;
        let (in_base, out_base, tables) = (ptr(&d_in, stream), ptr(&d_out, stream), ptr(&d_tables, stream));

        let t_alloc = t0.elapsed();
        let table: Vec<u64> = (in_at.iter().map(|&a| in_base + a as u64))
            .chain(inputs.iter().map(|i| i.len() as u64))
            .chain(out_at.iter().map(|&a| out_base + a as u64))
            .collect();
        let staged = stage(inputs, &in_at, in_total, &table);
        let staged_pinned = staged.is_pinned();
        let t_pack = t0.elapsed();
        let s = stream.cu_stream();
        // SAFETY: the device buffers are as large as the copies; `staged` outlives the
        // stream's work (it is synchronized below before `staged` drops).
        unsafe {
            if in_total > 0 {
                result::memcpy_htod_async(in_base, &staged.as_slice()[..in_total], s)?;
            }
            result::memcpy_htod_async(tables, &staged.as_slice()[in_total..], s)?;
        }
        let (in_ptrs, in_sizes, out_ptrs) = (tables, tables + 8 * n as u64, tables + 16 * n as u64);
        let (out_sizes, statuses) = (tables + 24 * n as u64, tables + 32 * n as u64);
        // SAFETY: every pointer is a device buffer of the sizes nvCOMP asked for above.
        let launched = unsafe {
            (api.compress)(
                in_ptrs as *const *const c_void,
                in_sizes as *const usize,
                max_in,
                n,
                ptr(&d_temp, stream) as *mut c_void,
                temp_bytes,
                out_ptrs as *const *mut c_void,
                out_sizes as *mut usize,
                OPTS,
                statuses as *mut Status,
                s,
            )
        };
        api.check(launched, "zstd compression")?;
        let frames = self.download(stream, out_base, &out_at, out_sizes, n);
        // The copies from `staged` are done (download synchronized) or failed.
        stream.synchronize()?;
        drop((staged, d_in, d_out, d_temp, d_tables, held));
        log::debug!(
            target: "gpusort::timeline",
            "nvCOMP zstd: {n} buffers, {:.1} MB in {:.1} ms (device alloc {:.1}, pinned pack {:.1}, \
             upload, compress, download {:.1}; {} pinned)",
            in_total as f64 / 1e6,
            t0.elapsed().as_secs_f64() * 1e3,
            t_alloc.as_secs_f64() * 1e3,
            (t_pack - t_alloc).as_secs_f64() * 1e3,
            (t0.elapsed() - t_pack).as_secs_f64() * 1e3,
            if staged_pinned { "was" } else { "was not" }
        );
        frames.map(Some)
    }

    /// The compressed frames: their sizes and statuses first, then the frames in one copy of
    /// the packed output region up to the end of the last frame.
    fn download(
        &self,
        stream: &Arc<CudaStream>,
        out_base: CUdeviceptr,
        out_at: &[usize],
        out_sizes: CUdeviceptr,
        n: usize,
    ) -> Result<Vec<Vec<u8>>> {
        let mut meta = vec![0u64; 2 * n];
        let s = stream.cu_stream();
        // SAFETY: the tables hold 2n words after `out_sizes` (sizes, then 4-byte statuses).
        unsafe { result::memcpy_dtoh_async(&mut meta[..], out_sizes, s)? };
        stream.synchronize()?;
        let sizes = &meta[..n];
        let statuses = unpack_statuses(&meta[n..], n);
        if let Some((i, &bad)) = statuses.iter().enumerate().find(|(_, s)| **s != SUCCESS) {
            return Err(CudaSortError::Compression(format!(
                "nvCOMP could not compress buffer {i} of {n}: {}",
                check_launch(bad, "zstd", Some(self.device.api.status_string)).unwrap_err()
            )));
        }
        let end = out_at
            .iter()
            .zip(sizes)
            .map(|(&a, &len)| a + len as usize)
            .max()
            .unwrap_or(0);
        let mut host = PinnedPool::global().alloc(end);
        // SAFETY: the output region holds at least `end` bytes; synchronized before reading.
        unsafe { result::memcpy_dtoh_async(host.as_mut_slice(), out_base, s)? };
        stream.synchronize()?;
        let bytes = host.as_slice();
        Ok(out_at
            .iter()
            .zip(sizes)
            .map(|(&a, &len)| bytes[a..a + len as usize].to_vec())
            .collect())
    }
}

/// Snappy or zstd buffers ([`PageCodec`]) decompressed on one GPU, all of a batch in one nvCOMP
/// call, into one device buffer: the first step of Parquet decode on the GPU (the pages as
/// `gpusort_parquet::stored_pages` lists them; `kernels/NOTES.md`, "Parquet decode on the GPU:
/// the plan"). The inputs are packed into pinned memory and cross PCIe in one copy; the call's
/// device memory is held of the process's budget of the device, the output's for as long as
/// the [`DeviceBuffers`] live.
pub struct PageDecompressor {
    device: NvcompDevice,
    stream: Arc<CudaStream>,
}

/// Buffers decompressed into one device buffer: buffer `i` is `sizes[i]` bytes at
/// `offsets[i]` of `data`.
pub struct DeviceBuffers {
    pub data: CudaSlice<u8>,
    pub offsets: Vec<usize>,
    pub sizes: Vec<usize>,
    _held: DeviceReservation,
}

impl DeviceBuffers {
    /// The device memory, and the budget's reservation that holds it.
    pub fn into_parts(self) -> (CudaSlice<u8>, DeviceReservation) {
        (self.data, self._held)
    }
}

/// What nvCOMP takes for a call's pages ([`PageDecompressor::buffers`]): the buffers, what
/// each decompresses to, whether each is written right after the one before it (a later frame
/// of a page), and the index of each page's first buffer.
struct Buffers<'a> {
    inputs: Inputs<'a>,
    sizes: Vec<usize>,
    joined: Vec<bool>,
    first: Vec<usize>,
}

/// The compressed buffers of a call: in host memory (packed into pinned memory and uploaded by
/// the call), or on the device already (an address each, in memory that outlives the call,
/// and the same bytes on the host, where a zstd page's frames are read).
#[derive(Debug, Clone)]
enum Inputs<'a> {
    Host(Vec<&'a [u8]>),
    Device(Vec<(u64, &'a [u8])>),
}

impl<'a> Inputs<'a> {
    fn len(&self) -> usize {
        match self {
            Inputs::Host(v) => v.len(),
            Inputs::Device(v) => v.len(),
        }
    }

    /// Buffer `i`'s bytes on the host.
    fn host(&self, i: usize) -> &'a [u8] {
        match self {
            Inputs::Host(v) => v[i],
            Inputs::Device(v) => v[i].1,
        }
    }

    /// The inputs `keep` lists, in its order.
    fn select(&self, keep: &[usize]) -> Self {
        match self {
            Inputs::Host(v) => Inputs::Host(keep.iter().map(|&i| v[i]).collect()),
            Inputs::Device(v) => Inputs::Device(keep.iter().map(|&i| v[i]).collect()),
        }
    }

    /// The pieces `(buffer, offset, length)` of these buffers, where they are; on the host
    /// where one on the device is not at a multiple of `align`.
    fn pieces(&self, pieces: &[(usize, usize, usize)], align: u64) -> Self {
        let host = || Inputs::Host(pieces.iter().map(|&(i, at, n)| &self.host(i)[at..at + n]).collect());
        match self {
            Inputs::Host(_) => host(),
            Inputs::Device(v) => {
                let device: Vec<(u64, &'a [u8])> = (pieces.iter())
                    .map(|&(i, at, n)| (v[i].0 + at as u64, &v[i].1[at..at + n]))
                    .collect();
                match device.iter().all(|(a, _)| a % align.max(1) == 0) {
                    true => Inputs::Device(device),
                    false => host(),
                }
            }
        }
    }
}

impl std::fmt::Debug for PageDecompressor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PageDecompressor")
            .field("library", &self.device.api.path)
            .finish_non_exhaustive()
    }
}

impl PageDecompressor {
    /// A decompressor on GPU `ordinal`; an error says why there is none (no nvCOMP, no GPU).
    pub fn try_new(ordinal: usize) -> Result<Self> {
        let device = NvcompDevice::open(ordinal)?;
        let stream = device.ctx.new_stream()?;
        Ok(Self { device, stream })
    }

    /// Holds its device memory of `budget` instead of the process's budget of the device.
    pub fn with_budget(self, budget: Arc<DeviceBudget>) -> Self {
        let _ = self.device.budget.set(budget);
        self
    }

    /// An empty reservation of the budget its calls hold their device memory of: what a caller
    /// holds of the same budget for the memory it allocates beside them (the decoded columns).
    pub fn reservation(&self) -> DeviceReservation {
        self.device.budget().reservation()
    }

    /// The stream the output is written on (synchronized before [`Self::decompress_to_device`]
    /// returns).
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    /// The alignment `codec`'s calls need of each compressed buffer's address on the device
    /// (1: any): [`Self::decompress_on_device`] takes only buffers at such addresses.
    pub fn input_alignment(&self, codec: PageCodec) -> usize {
        self.device.api.decompressors[codec as usize].alignments.input.max(1)
    }

    /// Each of `compressed` (raw snappy, or zstd frames) decompressed on the host, in order:
    /// the device's work downloaded (tests, and checks against the CPU's codecs).
    pub fn decompress(&self, codec: PageCodec, compressed: &[&[u8]], sizes: &[usize]) -> Result<Vec<Vec<u8>>> {
        let out = self.decompress_to_device(codec, compressed, sizes)?;
        let mut host = vec![0u8; out.data.len()];
        self.stream.memcpy_dtoh(&out.data, &mut host)?;
        self.stream.synchronize()?;
        Ok(out
            .offsets
            .iter()
            .zip(&out.sizes)
            .map(|(&a, &n)| host[a..a + n].to_vec())
            .collect())
    }

    /// Each of `compressed` (pages of `codec` as Parquet holds them: raw snappy, or zstd
    /// frames) decompressed into one device buffer; `sizes[i]` is what buffer `i` decompresses
    /// to (the page header says it). An error where the device memory budget has no room now,
    /// or where nvCOMP finds a buffer corrupt or of another size than `sizes` says.
    pub fn decompress_to_device(
        &self,
        codec: PageCodec,
        compressed: &[&[u8]],
        sizes: &[usize],
    ) -> Result<DeviceBuffers> {
        self.decompress_inputs(codec, Inputs::Host(compressed.to_vec()), sizes)
    }

    /// As [`Self::decompress_to_device`], of buffers on the device already: `compressed[i]` is
    /// the address of buffer `i` (in device memory that outlives the call; a file's range
    /// uploaded whole by [`Self::upload_range`], say) and its bytes on the host: nothing is
    /// packed or copied, unless a buffer (or a zstd frame) is not at a multiple of
    /// [`Self::input_alignment`]: then the call's buffers are packed from the host.
    pub fn decompress_on_device(
        &self,
        codec: PageCodec,
        compressed: &[(u64, &[u8])],
        sizes: &[usize],
    ) -> Result<DeviceBuffers> {
        self.decompress_inputs(codec, Inputs::Device(compressed.to_vec()), sizes)
    }

    fn decompress_inputs(&self, codec: PageCodec, compressed: Inputs<'_>, sizes: &[usize]) -> Result<DeviceBuffers> {
        if compressed.len() != sizes.len() {
            return Err(CudaSortError::Compression(format!(
                "{} {} buffers with {} sizes",
                compressed.len(),
                codec.name(),
                sizes.len()
            )));
        }
        // Empty outputs are made here (nvCOMP failed the call that held one, on the H200);
        // they sit at offset 0 with no bytes.
        let full: Vec<usize> = (0..sizes.len()).filter(|&i| sizes[i] > 0).collect();
        if full.is_empty() {
            return Ok(DeviceBuffers {
                data: alloc(&self.stream, 0)?,
                offsets: vec![0; sizes.len()],
                sizes: sizes.to_vec(),
                _held: self.device.budget().reservation(),
            });
        }
        let lens: Vec<usize> = full.iter().map(|&i| sizes[i]).collect();
        let buffers = self.buffers(codec, compressed.select(&full), &lens)?;
        let mut out = self.decompress_full(codec, &buffers.inputs, &buffers.sizes, &buffers.joined)?;
        let mut at = vec![0; sizes.len()];
        for (&i, &b) in full.iter().zip(&buffers.first) {
            at[i] = out.offsets[b];
        }
        (out.offsets, out.sizes) = (at, sizes.to_vec());
        Ok(out)
    }

    /// The buffers nvCOMP takes for `pages` (`sizes[i]` bytes decompressed): each page as it
    /// is, or, of a zstd page of several frames, each frame ([`zstd_frames`]: nvCOMP
    /// decompresses one frame a buffer), written right after the frame before it (`joined`).
    fn buffers<'a>(&self, codec: PageCodec, pages: Inputs<'a>, sizes: &[usize]) -> Result<Buffers<'a>> {
        let (mut pieces, mut lens, mut joined, mut first) = (vec![], vec![], vec![], vec![]);
        for (k, &size) in sizes.iter().enumerate() {
            first.push(pieces.len());
            let bytes = pages.host(k);
            let frames = match codec {
                PageCodec::Snappy => vec![],
                PageCodec::Zstd => zstd_frames(bytes).map_err(CudaSortError::Compression)?,
            };
            if frames.len() < 2 {
                pieces.push((k, 0, bytes.len()));
                lens.push(size);
                joined.push(false);
                continue;
            }
            let content: Option<Vec<u64>> = frames.iter().map(|f| f.content).collect();
            let content = content
                .filter(|c| c.iter().sum::<u64>() == size as u64)
                .ok_or_else(|| {
                    CudaSortError::Compression(format!(
                        "a zstd page of {} frames whose sizes are not given, or do not add up to its {size} bytes",
                        frames.len()
                    ))
                })?;
            for (j, (f, c)) in frames.iter().zip(content).enumerate() {
                pieces.push((k, f.at, f.len));
                lens.push(c as usize);
                joined.push(j > 0);
            }
        }
        let align = self.input_alignment(codec) as u64;
        Ok(Buffers {
            inputs: pages.pieces(&pieces, align),
            sizes: lens,
            joined,
            first,
        })
    }

    /// `bytes` (a file's range, say) copied to one device buffer, held of the decompressor's
    /// budget: the inputs of [`Self::decompress_on_device`]. Its pieces are `pieces` (offsets
    /// and lengths in `bytes`), which the output lists as its buffers. Unless `pinned` says that
    /// `bytes` are in pinned memory, they are copied into pinned memory first on a few threads:
    /// a copy from pageable memory ran at ~5.5 GB/s on the H200 (lineitem SF10's 2.4 GB of
    /// pages: 451 ms, against 217 ms packed into pinned memory and 129 ms straight from it).
    pub fn upload_range(&self, bytes: &[u8], pieces: &[(usize, usize)], pinned: bool) -> Result<DeviceBuffers> {
        if let Some(&(at, n)) = pieces.iter().find(|&&(at, n)| at + n > bytes.len()) {
            return Err(CudaSortError::Compression(format!(
                "a piece of {n} bytes at {at} of a range of {}",
                bytes.len()
            )));
        }
        let mut held = self.device.budget().reservation();
        if !held.try_grow_to(bytes.len()) {
            return Err(CudaSortError::Compression(format!(
                "the device memory budget has no room for {:.1} MB of pages now",
                bytes.len() as f64 / 1e6
            )));
        }
        let data = alloc(&self.stream, bytes.len())?;
        if !bytes.is_empty() {
            let staged = (!pinned).then(|| {
                let parts: Vec<&[u8]> = bytes.chunks(PACK_BYTES_A_THREAD).collect();
                let at: Vec<usize> = (0..parts.len()).map(|i| i * PACK_BYTES_A_THREAD).collect();
                stage(&parts, &at, bytes.len(), &[])
            });
            let from = staged.as_ref().map_or(bytes, |s| s.as_slice());
            // SAFETY: `data` holds `bytes.len()` bytes; `from` outlives the copy (synchronized).
            unsafe {
                result::memcpy_htod_async(ptr(&data, &self.stream), from, self.stream.cu_stream())?;
            }
            self.stream.synchronize()?;
        }
        Ok(DeviceBuffers {
            data,
            offsets: pieces.iter().map(|p| p.0).collect(),
            sizes: pieces.iter().map(|p| p.1).collect(),
            _held: held,
        })
    }

    /// [`Self::decompress_to_device`] of buffers that are none of them empty: hold the call's
    /// device memory of the budget, pack, upload, decompress, check each size and status.
    fn decompress_full(
        &self,
        codec: PageCodec,
        compressed: &Inputs<'_>,
        sizes: &[usize],
        joined: &[bool],
    ) -> Result<DeviceBuffers> {
        let (api, stream, s) = (self.device.api, &self.stream, self.stream.cu_stream());
        let entries = &api.decompressors[codec as usize];
        let n = compressed.len();
        let host = match compressed {
            Inputs::Host(h) => &h[..],
            Inputs::Device(_) => &[],
        };
        let (in_at, in_total) = pack(host.iter().map(|c| c.len()), entries.alignments.input.max(8));
        let (out_at, out_total) = place(
            sizes,
            joined,
            entries.alignments.output.max(8),
            entries.alignments.output,
        )
        .ok_or_else(|| CudaSortError::Compression(format!("a {} frame's output is not aligned", codec.name())))?;
        let max_out = sizes.iter().copied().max().unwrap_or(0).max(1);
        let mut temp_bytes = 0;
        // SAFETY: a query; it enqueues nothing on the stream.
        api.check(
            unsafe { (entries.temp_size)(n, max_out, DECOMPRESS_OPTS, &mut temp_bytes, out_total, s) },
            &format!("{} temp size", codec.name()),
        )?;
        let mut held = self.device.budget().reservation();
        // Tables: input pointers and sizes, output sizes and pointers (uploaded); the sizes
        // written and the statuses (downloaded).
        let table_bytes = 8 * 6 * n;
        if !held.try_grow_to(in_total + out_total + temp_bytes + table_bytes) {
            return Err(CudaSortError::Compression(format!(
                "the device memory budget has no room for {:.1} MB of {} pages now",
                (in_total + out_total) as f64 / 1e6,
                codec.name()
            )));
        }
        let (d_in, data) = (alloc(stream, in_total)?, alloc(stream, out_total)?);
        let (d_temp, d_tables) = (alloc(stream, temp_bytes)?, alloc(stream, table_bytes)?);
        let (in_base, out_base, tables) = (ptr(&d_in, stream), ptr(&data, stream), ptr(&d_tables, stream));
        let addresses: Vec<u64> = match compressed {
            Inputs::Host(_) => in_at.iter().map(|&a| in_base + a as u64).collect(),
            Inputs::Device(d) => d.iter().map(|&(a, _)| a).collect(),
        };
        let table: Vec<u64> = (addresses.into_iter())
            .chain((0..n).map(|i| compressed.host(i).len() as u64))
            .chain(sizes.iter().map(|&n| n as u64))
            .chain(out_at.iter().map(|&a| out_base + a as u64))
            .collect();
        let staged = stage(host, &in_at, in_total, &table);
        let word = |k: usize| tables + (8 * k * n) as u64;
        let mut done = vec![0u64; 2 * n];
        // SAFETY: the device buffers are as large as the copies and the tables nvCOMP reads;
        // `staged` and `done` outlive the stream's work (synchronized below).
        unsafe {
            if in_total > 0 {
                result::memcpy_htod_async(in_base, &staged.as_slice()[..in_total], s)?;
            }
            result::memcpy_htod_async(tables, &staged.as_slice()[in_total..], s)?;
            api.check(
                (entries.decompress)(
                    word(0) as *const *const c_void,
                    word(1) as *const usize,
                    word(2) as *const usize,
                    word(4) as *mut usize,
                    n,
                    ptr(&d_temp, stream) as *mut c_void,
                    temp_bytes,
                    word(3) as *const *mut c_void,
                    DECOMPRESS_OPTS,
                    word(5) as *mut Status,
                    s,
                ),
                &format!("{} decompression", codec.name()),
            )?;
            result::memcpy_dtoh_async(&mut done[..], word(4), s)?;
        }
        stream.synchronize()?;
        drop((staged, d_in, d_temp, d_tables));
        let statuses = unpack_statuses(&done[n..], n);
        for (i, (status, (&written, &size))) in statuses.into_iter().zip(done[..n].iter().zip(sizes)).enumerate() {
            if status != SUCCESS || written as usize != size {
                return Err(CudaSortError::Compression(format!(
                    "nvCOMP could not decompress {} buffer {i} of {n} to its {size} bytes ({written} \
                     written): {}",
                    codec.name(),
                    check_launch(status, codec.name(), Some(api.status_string))
                        .err()
                        .unwrap_or_default()
                )));
            }
        }
        held.shrink_to(out_total);
        Ok(DeviceBuffers {
            data,
            offsets: out_at,
            sizes: sizes.to_vec(),
            _held: held,
        })
    }
}

/// One pinned buffer holding `inputs` packed at their offsets `at` (`total` bytes), then
/// `table`'s words: what a call's two host-to-device copies read.
fn stage(inputs: &[&[u8]], at: &[usize], total: usize, table: &[u64]) -> HostBuffer {
    let mut staged = PinnedPool::global().alloc(total + 8 * table.len());
    let (packed, words) = staged.as_mut_slice().split_at_mut(total);
    pack_in_parallel(packed, inputs, at);
    for (w, v) in words.chunks_exact_mut(8).zip(table) {
        w.copy_from_slice(&v.to_le_bytes());
    }
    staged
}

/// The `n` 4-byte statuses nvCOMP wrote into `words` (downloaded as 8-byte words).
fn unpack_statuses(words: &[u64], n: usize) -> Vec<Status> {
    (words.iter())
        .flat_map(|w| [*w as u32 as i32, (*w >> 32) as u32 as i32])
        .take(n)
        .collect()
}

/// Bytes of inputs one thread packs: a call's ~65 MB of TPC-H lineitem's pages took one thread
/// 13-41 ms to pack (an H200, stop 40), a fifth to a half of the call.
const PACK_BYTES_A_THREAD: usize = 8 << 20;

/// Threads packing one call at most.
const PACK_THREADS: usize = 8;

/// Copies each of `inputs` to `packed` at its offset of `at` (increasing), on up to
/// [`PACK_THREADS`] threads, each taking a run of inputs of about the same bytes.
fn pack_in_parallel(packed: &mut [u8], inputs: &[&[u8]], at: &[usize]) {
    let total: usize = inputs.iter().map(|i| i.len()).sum();
    let threads = total.div_ceil(PACK_BYTES_A_THREAD).clamp(1, PACK_THREADS);
    let copy = |dst: &mut [u8], base: usize, range: std::ops::Range<usize>| {
        for i in range {
            let start = at[i] - base;
            dst[start..start + inputs[i].len()].copy_from_slice(inputs[i]);
        }
    };
    if threads == 1 {
        return copy(packed, 0, 0..inputs.len());
    }
    // Cut the inputs where each run passes its share of the bytes.
    let mut cuts = vec![0];
    let mut seen = 0;
    for (i, input) in inputs.iter().enumerate() {
        seen += input.len();
        if seen * threads >= total * cuts.len() && cuts.len() < threads {
            cuts.push(i + 1);
        }
    }
    cuts.push(inputs.len());
    cuts.dedup();
    std::thread::scope(|scope| {
        let mut rest = packed;
        let mut base = 0;
        for run in cuts.windows(2) {
            let (first, end) = (run[0], run[1]);
            // This run's bytes end where the next run's first input starts.
            let stop = if end < inputs.len() { at[end] } else { base + rest.len() };
            let (mine, after) = std::mem::take(&mut rest).split_at_mut(stop - base);
            let start = base;
            scope.spawn(move || copy(mine, start, first..end));
            rest = after;
            base = stop;
        }
    });
}

/// `bytes` (at least one) of device memory on `stream`.
fn alloc(stream: &Arc<CudaStream>, bytes: usize) -> Result<CudaSlice<u8>> {
    // SAFETY: every byte read from it is written first (inputs, tables) or by nvCOMP.
    Ok(unsafe { stream.alloc::<u8>(bytes.max(1)) }?)
}

fn ptr(slice: &CudaSlice<u8>, stream: &Arc<CudaStream>) -> CUdeviceptr {
    slice.device_ptr(stream).0
}

#[cfg(test)]
mod tests {
    use super::*;

    /// nvCOMP on GPU 0, or `None` with a note that `test` did not run. nvCOMP is optional (the
    /// CPU compresses without it): its absence fails the test only under
    /// GPUSORT_REQUIRE_NVCOMP=1 (device-unpack.sh sets it where it carried nvCOMP); a missing GPU
    /// fails it under GPUSORT_REQUIRE_GPU=1 whether nvCOMP is there or not.
    fn compressor_for_test(test: &str) -> Option<ZstdCompressor> {
        nvcomp_for_test(test, || ZstdCompressor::try_new(0))
    }

    /// As [`compressor_for_test`], for whatever `open` makes on GPU 0 with nvCOMP.
    fn nvcomp_for_test<T>(test: &str, open: impl FnOnce() -> Result<T>) -> Option<T> {
        match open() {
            Ok(c) => Some(c),
            Err(e @ CudaSortError::Compression(_)) if std::env::var("GPUSORT_REQUIRE_NVCOMP").as_deref() != Ok("1") => {
                if let Err(no_gpu) = crate::device::probe(0) {
                    crate::test_support::not_run(test, no_gpu);
                }
                eprintln!("{test} did not run: {e}");
                None
            }
            Err(e) => {
                crate::test_support::not_run(test, e);
                None
            }
        }
    }

    /// Buffers of every shape (empty, one byte, runs, noise, up to 1 MiB as Parquet pages are),
    /// snappy and zstd (one frame, and several frames joined, as the tool's writer makes a
    /// page), decompress on the GPU to what the CPU's codecs made them from; a corrupt buffer
    /// or a wrong size is an error, and a budget without room refuses the call.
    #[test]
    fn pages_decompress_on_the_gpu_as_on_the_cpu() {
        let test = "pages_decompress_on_the_gpu_as_on_the_cpu";
        let Some(gpu) = nvcomp_for_test(test, || PageDecompressor::try_new(0)) else {
            return;
        };
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        let plain: Vec<Vec<u8>> = (0..300)
            .map(|i| {
                let len = match i % 6 {
                    _ if i % 50 == 0 => 0,
                    0 => (next() % 64) as usize,
                    1 => (next() % (1 << 20)) as usize,
                    _ => (next() % 70_000) as usize,
                };
                let noisy = i % 3 == 0;
                (0..len)
                    .map(|j| if noisy { next() as u8 } else { (j / 7 % 13) as u8 + b'a' })
                    .collect()
            })
            .collect();
        // zstd: every fourth buffer as two frames joined.
        let zstd_of = |i: usize, p: &[u8]| {
            if i % 4 == 1 && p.len() > 1 {
                let (a, b) = p.split_at(p.len() / 3);
                [zstd::bulk::compress(a, 3).unwrap(), zstd::bulk::compress(b, 3).unwrap()].concat()
            } else {
                zstd::bulk::compress(p, 3).unwrap()
            }
        };
        for codec in [PageCodec::Snappy, PageCodec::Zstd] {
            let compressed: Vec<Vec<u8>> = (plain.iter().enumerate())
                .map(|(i, p)| match codec {
                    PageCodec::Snappy => snap::raw::Encoder::new().compress_vec(p).unwrap(),
                    PageCodec::Zstd => zstd_of(i, p),
                })
                .collect();
            let refs: Vec<&[u8]> = compressed.iter().map(|c| c.as_slice()).collect();
            let sizes: Vec<usize> = plain.iter().map(|p| p.len()).collect();
            // Without the empty buffers first, then with them (made on the host).
            let (some, some_sizes): (Vec<&[u8]>, Vec<usize>) = refs
                .iter()
                .zip(&sizes)
                .filter(|(_, n)| **n > 0)
                .map(|(r, n)| (*r, *n))
                .unzip();
            assert!(some.len() < refs.len(), "the test has empty buffers");
            let out = gpu.decompress(codec, &some, &some_sizes).unwrap();
            assert!(
                out.iter()
                    .zip(plain.iter().filter(|p| !p.is_empty()))
                    .all(|(o, p)| o == p),
                "{codec:?}"
            );
            let out = gpu.decompress(codec, &refs, &sizes).unwrap();
            for (i, (o, p)) in out.iter().zip(&plain).enumerate() {
                assert!(o == p, "{codec:?} buffer {i} ({} bytes) differs", p.len());
            }
            let mut wrong = sizes.clone();
            wrong[7] += 1;
            assert!(gpu.decompress(codec, &refs, &wrong).is_err(), "{codec:?}: a wrong size");
            let cut = &compressed[1][..compressed[1].len() / 2];
            let cut = gpu.decompress(codec, &[refs[0], cut], &sizes[..2]);
            assert!(cut.is_err(), "{codec:?}: a cut buffer");
            assert_eq!(gpu.decompress(codec, &[], &[]).unwrap().len(), 0);
            assert_eq!(
                gpu.decompress(codec, &[&[0u8][..]], &[0]).unwrap(),
                vec![Vec::<u8>::new()]
            );
            // A budget is taken at the first call: a new decompressor for the one without room.
            let Some(fresh) = nvcomp_for_test(test, || PageDecompressor::try_new(0)) else {
                return;
            };
            let refused = fresh.with_budget(DeviceBudget::new(64 << 10));
            let no_room = refused.decompress(codec, &refs, &sizes).unwrap_err().to_string();
            assert!(no_room.contains("no room"), "{no_room}");
        }
        eprintln!(
            "{test}: input alignment snappy {}, zstd {}",
            gpu.input_alignment(PageCodec::Snappy),
            gpu.input_alignment(PageCodec::Zstd)
        );
    }

    /// Outputs go at aligned offsets, but a page's later frames right after the frame before
    /// them, unless the codec needs those aligned too and they are not.
    #[test]
    fn frames_of_a_page_are_placed_end_to_end() {
        let (sizes, joined) = ([5, 3, 4, 9, 2], [false, true, true, false, true]);
        assert_eq!(place(&sizes, &joined, 8, 1), Some((vec![0, 5, 8, 16, 25], 27)));
        assert_eq!(place(&sizes, &[false; 5], 8, 1), Some((vec![0, 8, 16, 24, 40], 42)));
        assert_eq!(place(&sizes, &joined, 8, 4), None);
        assert_eq!(
            place(&[8, 8, 3], &[false, true, true], 8, 8),
            Some((vec![0, 8, 16], 19))
        );
    }

    /// A call's staging: the inputs at their offsets, then the table's words, little-endian;
    /// statuses come back two to a downloaded word, low half first.
    #[test]
    fn calls_stage_inputs_then_tables_and_read_statuses_two_to_a_word() {
        let inputs: [&[u8]; 3] = [b"abc", b"", b"defgh"];
        let (at, total) = pack(inputs.iter().map(|i| i.len()), 8);
        let staged = stage(&inputs, &at, total, &[7, u64::MAX - 1]);
        let bytes = staged.as_slice();
        assert_eq!(bytes.len(), total + 16);
        assert_eq!(
            (&bytes[at[0]..at[0] + 3], &bytes[at[2]..at[2] + 5]),
            (&b"abc"[..], &b"defgh"[..])
        );
        assert_eq!(&bytes[total..total + 8], &7u64.to_le_bytes());
        assert_eq!(&bytes[total + 8..], &(u64::MAX - 1).to_le_bytes());
        let words = [5u64 << 32, 1000];
        assert_eq!(unpack_statuses(&words, 3), vec![0, 5, 1000]);
    }

    /// Inputs packed on several threads land where one thread puts them, gaps untouched.
    #[test]
    fn inputs_pack_alike_on_several_threads() {
        for (sizes, align) in [
            (vec![3usize << 20; 40], 8),
            (vec![1, 0, 17 << 20, 5, 0, 9 << 20, 33], 64),
            (vec![24 << 20], 8),
            (vec![], 8),
        ] {
            let inputs: Vec<Vec<u8>> = (sizes.iter().enumerate())
                .map(|(i, &n)| (0..n).map(|j| (i * 31 + j % 251) as u8).collect())
                .collect();
            let refs: Vec<&[u8]> = inputs.iter().map(|i| i.as_slice()).collect();
            let (at, total) = pack(refs.iter().map(|i| i.len()), align);
            let mut expected = vec![0xeeu8; total];
            for (input, &a) in refs.iter().zip(&at) {
                expected[a..a + input.len()].copy_from_slice(input);
            }
            let mut packed = vec![0xeeu8; total];
            pack_in_parallel(&mut packed, &refs, &at);
            assert!(packed == expected, "sizes {sizes:?}");
        }
    }

    /// A call the device memory budget has no room for compresses nothing, and says so; with
    /// room it compresses, and its memory is back in the budget after.
    #[test]
    fn calls_hold_their_device_memory_of_the_budget() {
        let open = || compressor_for_test("calls_hold_their_device_memory_of_the_budget");
        let Some(compressor) = open() else { return };
        let page = vec![7u8; 1 << 20];
        let tiny = DeviceBudget::new(64 << 10);
        let refused = compressor.with_budget(Arc::clone(&tiny));
        assert!(refused.try_compress(&[&page]).unwrap().is_none());
        assert!(refused.compress(&[&page]).is_err());
        assert_eq!(refused.stats().refused, 2);
        assert_eq!(refused.stats().calls, 0);
        let Some(compressor) = open() else { return };
        let room = DeviceBudget::new(usize::MAX / 2);
        let fits = compressor.with_budget(Arc::clone(&room));
        let frames = fits.try_compress(&[&page]).unwrap().expect("room in the budget");
        assert_eq!(zstd::stream::decode_all(&frames[0][..]).unwrap(), page);
        eprintln!(
            "a call compressing 1 MiB held {} bytes of device memory",
            room.stats().peak
        );
        assert!(
            room.stats().peak > 0 && room.stats().reserved == 0,
            "{:?}",
            room.stats()
        );
    }

    #[test]
    fn packing_aligns_every_buffer() {
        let (at, total) = pack([3, 0, 9, 8], 8);
        assert_eq!(at, vec![0, 8, 8, 24]);
        assert_eq!(total, 32);
        assert_eq!(align_up(0, 8), 0);
        assert_eq!(align_up(17, 4), 20);
    }

    #[test]
    fn the_library_path_comes_from_the_setting() {
        assert_eq!(library_path(None), PathBuf::from(NVCOMP_LIBRARY));
        assert_eq!(library_path(Some(PathBuf::new())), PathBuf::from(NVCOMP_LIBRARY));
        let dir = std::env::temp_dir();
        assert_eq!(library_path(Some(dir.clone())), dir.join(NVCOMP_LIBRARY));
        assert_eq!(
            library_path(Some("/x/libnvcomp.so.6".into())),
            PathBuf::from("/x/libnvcomp.so.6")
        );
    }

    /// Frames from the GPU decode with the reference zstd decoder to the inputs: empty,
    /// tiny, incompressible, very compressible, and a full 1 MiB page.
    #[test]
    fn gpu_frames_decode_to_their_inputs() {
        // nvCOMP is optional (the CPU compresses without it): its absence fails the test only
        // under GPUSORT_REQUIRE_NVCOMP=1 (device-unpack.sh sets it where it carried nvCOMP).
        let Some(compressor) = compressor_for_test("gpu_frames_decode_to_their_inputs") else {
            return;
        };
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        let mut noise = |n: usize| -> Vec<u8> {
            (0..n)
                .map(|_| {
                    state ^= state << 13;
                    state ^= state >> 7;
                    state ^= state << 17;
                    state as u8
                })
                .collect()
        };
        let text: Vec<u8> = b"l_comment: furiously regular deposits ".repeat(30_000);
        let inputs: Vec<Vec<u8>> = vec![vec![], vec![7], noise(100_003), text, noise(1 << 20), vec![0; 4096]];
        let refs: Vec<&[u8]> = inputs.iter().map(|v| v.as_slice()).collect();
        for _ in 0..2 {
            let frames = compressor.compress(&refs).expect("compress");
            assert_eq!(frames.len(), inputs.len());
            for (frame, input) in frames.iter().zip(&inputs) {
                let back = zstd::stream::decode_all(&frame[..]).expect("a standard zstd frame");
                assert_eq!(&back, input);
            }
            assert!(frames[3].len() < inputs[3].len() / 10, "repeated text compresses");
        }
        assert!(compressor.compress(&[]).unwrap().is_empty());
        assert_eq!(compressor.stats().refused, 0);
        let too_big = vec![0u8; MAX_CHUNK + 1];
        assert!(compressor.compress(&[&too_big]).is_err());
    }
}
