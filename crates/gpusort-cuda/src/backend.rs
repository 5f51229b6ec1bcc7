//! [`CudaBackend`]: the GPU record sorts behind [`gpusort::SortBackend`]: Arrow columns in,
//! sorted Arrow columns out, the same rows in the same order as the CPU backend.
//!
//! A sort encodes the key on the host ([`gpusort::keys`]), uploads the key words that vary and
//! every fixed-width column of up to 16 bytes (primitives, fixed-size binaries, dictionary
//! keys) through pinned staging, and runs the planned strategy on the device:
//!
//! - **direct**: the columns move with the keys in every pass, their validity bits packed 32
//!   columns to a u32 lane that moves too;
//! - **indirect**: the keys and the row index move; each column and its validity bitmap is
//!   then gathered once through the permutation.
//!
//! Other columns (strings, booleans, nested, 32-byte decimals) are gathered on the host with
//! the downloaded permutation, by the core's parallel gather. Keys with truncated string
//! prefixes sort indirectly: the sorted key words come back, tied rows are ordered on the host
//! ([`gpusort::ties`]), and the corrected permutation goes back up for the gathers.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use arrow::array::{Array, ArrayRef, RecordBatch, RecordBatchOptions, UInt32Array};
use arrow::buffer::{BooleanBuffer, NullBuffer};
use cudarc::driver::CudaSlice;
use gpusort::cpu::gather::{fixed_array, fixed_values, fixed_width, gather_column};
use gpusort::plan::{RecordMove, Strategy, radix_passes, varying_bits};
use gpusort::{KeyEncoder, SortBackend, SortOutput, SortRequest, SortStats};
use rayon::prelude::*;

use crate::engine::{DeviceColumn, DeviceTable, Gpu, GpuSortPlan};
use crate::error::{CudaSortError, Result};
use crate::kernels::KernelCache;
use crate::transfer::Staging;

/// Widest digit the GPU kernels take.
pub const MAX_DIGIT_BITS: u32 = 8;

/// The GPU backend.
#[derive(Debug)]
pub struct CudaBackend {
    gpu: Gpu,
    digit_bits: u32,
    staging: Mutex<Staging>,
}

/// A column the device moves or gathers: its index, width, and whether it has nulls.
#[derive(Debug, Clone, Copy)]
struct GpuColumn {
    index: usize,
    width: usize,
    nullable: bool,
}

impl CudaBackend {
    /// A backend on device `ordinal`, with kernels from the default cache
    /// ([`KernelCache::from_env`]).
    pub fn try_new(ordinal: usize) -> Result<Self> {
        Self::with_cache(ordinal, &KernelCache::from_env())
    }

    /// A backend on device `ordinal` with kernels from `cache`.
    pub fn with_cache(ordinal: usize, cache: &KernelCache) -> Result<Self> {
        let gpu = Gpu::open(ordinal, cache)?;
        let staging = Mutex::new(Staging::new(&gpu)?);
        Ok(Self {
            gpu,
            digit_bits: MAX_DIGIT_BITS,
            staging,
        })
    }

    /// Uses digits of at most `bits` bits (1 to 8; the paper's GRS and SRTS use 4).
    pub fn with_digit_bits(mut self, bits: u32) -> Result<Self> {
        if !(1..=MAX_DIGIT_BITS).contains(&bits) {
            return Err(CudaSortError::Unsupported(format!("digit width {bits} (1 to 8 bits)")));
        }
        self.digit_bits = bits;
        Ok(self)
    }

    /// The device.
    pub fn gpu(&self) -> &Gpu {
        &self.gpu
    }

    /// Sorts like [`SortBackend::sort`], but fails with [`CudaSortError::OutOfMemory`] before
    /// touching the device when the sort would need more than `memory_limit` bytes of device
    /// memory (or more than the device has free).
    pub fn sort_within(&self, request: &SortRequest<'_>, memory_limit: Option<usize>) -> Result<SortOutput> {
        self.run(request, memory_limit)
    }

    /// The most rows of batches like `request.batch` (same columns, same sort) that one sort
    /// can take within `memory_limit` bytes of device memory (or the memory the device has
    /// free): what an external sort sizes its runs by.
    ///
    /// The estimate is conservative: it counts every key word of the sample's layout plus one
    /// more per sort key (other batches may span wider ranges), every fixed-width column as
    /// nullable, and the larger of the direct and indirect footprints.
    pub fn max_rows_within(&self, request: &SortRequest<'_>, memory_limit: Option<usize>) -> Result<usize> {
        let encoder = KeyEncoder::try_new(request.batch, request.spec, &request.encoder)?;
        let words = encoder.layout().num_words() + request.spec.len();
        let widths: Vec<usize> = request
            .batch
            .columns()
            .iter()
            .filter_map(|c| fixed_width(c.data_type()).filter(|w| *w <= 16))
            .collect();
        let bytes = |n: usize| {
            let direct = Self::device_bytes_needed(n, words, &widths, widths.len(), true);
            let indirect = Self::device_bytes_needed(n, words, &widths, widths.len(), false);
            direct.max(indirect)
        };
        const SAMPLE: usize = 1 << 20;
        let fixed = bytes(0);
        let per_row = (bytes(SAMPLE) - fixed).div_ceil(SAMPLE).max(1);
        let free = self.gpu.free_memory()?;
        let available = memory_limit.map_or(free, |l| l.min(free));
        Ok(available.saturating_sub(fixed) / per_row)
    }

    /// Device bytes a sort of `n` rows holds at its peak: both buffers of the varying key
    /// words, and either both buffers of every moved column (direct) or the columns, both
    /// buffers of the row index and the widest gathered column (indirect), plus scratch.
    fn device_bytes_needed(n: usize, key_words: usize, widths: &[usize], nullable: usize, direct: bool) -> usize {
        let keys = 2 * key_words * 4 * n;
        let columns: usize = widths.iter().sum::<usize>() * n + nullable * n.div_ceil(8);
        let records = if direct {
            2 * columns + 2 * nullable.div_ceil(32) * 4 * n
        } else {
            columns + 2 * 4 * n + widths.iter().max().copied().unwrap_or(0) * n
        };
        keys + records + (n / 256 + 1) * 1024 + (16 << 20)
    }

    fn run(&self, request: &SortRequest<'_>, memory_limit: Option<usize>) -> Result<SortOutput> {
        request.check_rows()?;
        let batch = request.batch;
        let n = batch.num_rows();
        let gpu = &self.gpu;
        let stream = gpu.stream();
        let mut staging = self.staging.lock().unwrap_or_else(|p| p.into_inner());
        let (to0, from0) = (staging.to_device, staging.from_device);

        let start = Instant::now();
        let encoder = KeyEncoder::try_new(batch, request.spec, &request.encoder)?;
        let keys = encoder.encode();
        let layout = encoder.layout();
        let encode_time = start.elapsed();

        let start = Instant::now();
        let strategy = request.strategy();
        let inexact = !layout.is_exact();
        // Tie resolution needs the permutation before the columns move: indirect.
        let direct = strategy.record_move == RecordMove::Direct && !inexact;
        let varying = varying_bits(&keys.words);
        let passes = radix_passes(&varying, self.digit_bits);
        let columns: Vec<GpuColumn> = batch
            .columns()
            .iter()
            .enumerate()
            .filter_map(|(index, c)| {
                let width = fixed_width(c.data_type()).filter(|w| *w <= 16)?;
                Some(GpuColumn {
                    index,
                    width,
                    nullable: c.null_count() > 0,
                })
            })
            .collect();
        let needed = Self::device_bytes_needed(
            n,
            varying.iter().filter(|v| **v != 0).count(),
            &columns.iter().map(|c| c.width).collect::<Vec<_>>(),
            columns.iter().filter(|c| c.nullable).count(),
            direct,
        );
        let free = gpu.free_memory()?;
        let available = memory_limit.map_or(free, |l| l.min(free));
        if needed > available {
            return Err(CudaSortError::OutOfMemory { needed, available });
        }
        // Keys: only words that vary go up (no pass reads the others).
        let mut table = DeviceTable {
            num_rows: n,
            keys: keys
                .words
                .iter()
                .zip(&varying)
                .map(|(w, v)| {
                    if *v != 0 {
                        staging.upload_words(gpu, w)
                    } else {
                        gpu.alloc_words(1)
                    }
                })
                .collect::<Result<Vec<_>>>()?,
            columns: vec![],
            records: None,
        };
        // Columns and their validity bitmaps.
        let mut bitmaps: Vec<Option<(CudaSlice<u8>, u32)>> = vec![];
        let mut values: Vec<DeviceColumn> = vec![];
        for c in &columns {
            let col = batch.column(c.index);
            let data = fixed_values(col.as_ref(), c.width);
            values.push(DeviceColumn {
                data: staging.upload(gpu, data.as_slice())?,
                width: c.width,
            });
            bitmaps.push(match col.nulls().filter(|_| c.nullable) {
                Some(nulls) => {
                    let b = nulls.inner();
                    let bytes = &b.values()[b.offset() / 8..(b.offset() + n).div_ceil(8)];
                    Some((staging.upload(gpu, bytes)?, (b.offset() % 8) as u32))
                }
                None => None,
            });
        }
        let nullable: Vec<usize> = (0..columns.len()).filter(|&k| bitmaps[k].is_some()).collect();
        let record_move = if direct {
            RecordMove::Direct
        } else {
            RecordMove::Indirect
        };
        let mut stats = SortStats {
            strategy: Some(Strategy::new(strategy.algorithm, record_move)),
            rows: n,
            key_bits: layout.total_bits(),
            passes: passes.len(),
            moved_columns: if direct { columns.len() } else { 0 },
            gathered_columns: batch.num_columns() - if direct { columns.len() } else { 0 },
            host_gathered_columns: batch.num_columns() - columns.len(),
            encode_time,
            ..Default::default()
        };
        if direct {
            // The columns move with the keys; validity too, 32 columns' bits per u32 lane.
            table.columns = std::mem::take(&mut values);
            for group in nullable.chunks(32) {
                let refs: Vec<(&CudaSlice<u8>, u32)> = group
                    .iter()
                    .map(|&k| bitmaps[k].as_ref().map(|(b, o)| (b, *o)).unwrap())
                    .collect();
                let lane = gpu.pack_bits(&refs, n)?;
                table.columns.push(DeviceColumn { data: lane, width: 4 });
            }
        }
        let plan = GpuSortPlan {
            strategy: Strategy::new(strategy.algorithm, record_move),
            passes,
            keep_keys: inexact,
            want_perm: true,
        };
        let result = gpu.sort(&mut table, &plan)?;
        let mut device_ms = result.kernel_ms;
        let mut perm_dev = result.perm.expect("asked for the permutation");
        let mut perm = vec![0u32; n];
        staging.download_words(stream, &perm_dev, &mut perm)?;
        if inexact && n > 1 {
            let mut sorted_words: Vec<Vec<u32>> = vec![];
            for (w, v) in table.keys.iter().zip(&varying) {
                let mut host = vec![0u32; if *v != 0 { n } else { 0 }];
                staging.download_words(stream, w, &mut host)?;
                sorted_words.push(host);
            }
            // Constant words are sorted in any order.
            let views: Vec<&[u32]> = sorted_words
                .iter()
                .zip(&keys.words)
                .zip(&varying)
                .map(|((sorted, original), v)| if *v != 0 { &sorted[..] } else { &original[..] })
                .collect();
            let ties = gpusort::ties::resolve_ties(layout, encoder.sort_columns(), &views, &mut perm)?;
            stats.tie_groups = ties.len();
            if !ties.is_empty() {
                perm_dev = staging.upload_words(gpu, &perm)?;
            }
        }
        stats.sort_time = start.elapsed();

        // The device's columns come down (indirect: gathered first, only the rows kept);
        // the others are gathered on the host.
        let start = Instant::now();
        let limit = request.limit.unwrap_or(n).min(n);
        let head = &perm[..limit];
        let gathers = gpu.event()?;
        gathers.record(stream)?;
        let mut out: Vec<Option<ArrayRef>> = vec![None; batch.num_columns()];
        for (k, c) in columns.iter().enumerate() {
            let sorted_values = if direct {
                None
            } else {
                Some(gpu.gather_column(&values[k].data, c.width, &perm_dev, limit)?)
            };
            let dev = sorted_values.as_ref().unwrap_or_else(|| &table.columns[k].data);
            let mut host = gpusort::cpu::uninit(limit * c.width);
            staging.download(stream, dev, host.as_slice_mut())?;
            let nulls = match &bitmaps[k] {
                None => None,
                Some((bits, offset)) => {
                    let dev_bits = if direct {
                        let j = nullable.iter().position(|&x| x == k).unwrap();
                        gpu.unpack_bits(&table.columns[columns.len() + j / 32].data, (j % 32) as u32, limit)?
                    } else {
                        gpu.gather_bitmap(bits, *offset, &perm_dev, limit)?
                    };
                    let mut host_bits = gpusort::cpu::uninit(limit.div_ceil(32) * 4);
                    staging.download(stream, &dev_bits, host_bits.as_slice_mut())?;
                    Some(NullBuffer::new(BooleanBuffer::new(host_bits.into(), 0, limit)))
                }
            };
            let col = batch.column(c.index);
            out[c.index] = Some(fixed_array(col.as_ref(), host.into(), nulls, limit));
        }
        if !direct {
            let done = gpu.event()?;
            done.record(stream)?;
            done.synchronize()?;
            // Gathers and downloads interleave here; the device time counts both.
            device_ms += gathers.elapsed_ms(&done)?;
        }
        stats.device_time = Some(Duration::from_secs_f64(device_ms as f64 / 1e3));
        let columns_out = batch
            .columns()
            .par_iter()
            .zip(out)
            .map(|(col, moved)| match moved {
                Some(sorted) => Ok(sorted),
                None => gather_column(col, head),
            })
            .collect::<gpusort::Result<Vec<ArrayRef>>>()?;
        let sorted = RecordBatch::try_new_with_options(
            batch.schema(),
            columns_out,
            &RecordBatchOptions::new().with_row_count(Some(limit)),
        )
        .map_err(gpusort::GpusortError::from)?;
        stats.gather_time = start.elapsed();
        stats.bytes_to_device = staging.to_device - to0;
        stats.bytes_from_device = staging.from_device - from0;
        perm.truncate(limit);
        Ok(SortOutput {
            batch: sorted,
            indices: UInt32Array::from(perm),
            stats,
        })
    }
}

impl SortBackend for CudaBackend {
    fn name(&self) -> String {
        format!("cuda:{}", self.gpu.info().ordinal)
    }

    fn sort(&self, request: &SortRequest<'_>) -> gpusort::Result<SortOutput> {
        self.run(request, None).map_err(Into::into)
    }
}
