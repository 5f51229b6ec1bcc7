//! [`CudaBackend`]: the GPU record sorts behind [`gpusort::SortBackend`]: Arrow columns in,
//! sorted Arrow columns out, the same rows in the same order as the CPU backend.
//!
//! A sort uploads every fixed-width column of up to 16 bytes (primitives, fixed-size binaries)
//! from pinned memory, encodes the key on the device from its columns when they are all native
//! integers or floats ([`crate::encode`]) or else on the host ([`gpusort::keys`], uploading the
//! key words that vary), and runs the planned strategy on the device:
//!
//! - **direct**: the columns move with the keys in every pass, their validity bits packed 32
//!   columns to a u32 lane that moves too;
//! - **indirect**: the keys and the row index move; each column and its validity bitmap is
//!   then gathered once through the permutation.
//!
//! Other columns (strings, booleans, dictionaries, nested, 32-byte decimals) are gathered on
//! the host with the downloaded permutation, by the core's parallel gather. Keys with truncated
//! string prefixes sort indirectly: the sorted key words come back, tied rows are ordered on
//! the host ([`gpusort::ties`]), and the corrected permutation goes back up for the gathers.
//!
//! Every sort is a [`GpuSortSession`]: [`CudaBackend::begin_sort`] starts one that takes the
//! input batch by batch and moves it to the device while it arrives;
//! [`SortBackend::sort`] and [`CudaBackend::sort_within`] push their one batch through one.
//!
//! # Sorts at once
//!
//! One backend serves every sort of the process on its device (one context, one kernel cache):
//! sorts stage and upload their input at the same time, each on a copy stream of its own, so
//! one sort's uploads overlap another's kernels; their device phases (sort, gathers, downloads)
//! take turns on the device's sort stream. Every byte a sort holds on the device is reserved
//! first from the process's [`DeviceBudget`] for the device: a sort waits for memory another
//! one will release, and is refused (the caller sorts on the CPU, with the reason) only when
//! it needs more than the budget or every other holder waits too. The pinned host memory
//! comes from the process's [`PinnedPool`], bounded across sorts.

use std::sync::{Arc, Mutex};

use arrow::datatypes::{DataType, SchemaRef};
use gpusort::{KeyEncoder, KeyLayout, SortBackend, SortOutput, SortRequest, SortSpec};

use crate::error::{CudaSortError, Result};
use crate::gpu::Gpu;
use crate::kernels::KernelCache;
use crate::memory::{DeviceBudget, device_bytes_needed};
use crate::options::GpuOptions;
use crate::pinned::PinnedPool;
use crate::session::{GpuSortSession, device_columns, views_on_device};

/// Widest digit the GPU kernels take.
pub const MAX_DIGIT_BITS: u32 = 8;

/// The GPU backend.
#[derive(Debug)]
pub struct CudaBackend {
    gpu: Arc<Gpu>,
    digit_bits: u32,
    /// Held by a sort while it uses the device's sort stream.
    device: Arc<Mutex<()>>,
    /// The device memory every sort of the process reserves from.
    budget: Arc<DeviceBudget>,
}

impl CudaBackend {
    /// A backend on device `ordinal`, with kernels from the default cache
    /// ([`KernelCache::from_env`]).
    pub fn try_new(ordinal: usize) -> Result<Self> {
        Self::with_cache(ordinal, &KernelCache::from_env())
    }

    /// A backend on device `ordinal` with kernels from `cache`. The process's
    /// [`PinnedPool`] pins host memory with this device's driver from now on.
    pub fn with_cache(ordinal: usize, cache: &KernelCache) -> Result<Self> {
        Self::with_gpu(Gpu::open(ordinal, cache)?, ordinal)
    }

    /// A backend on device `ordinal` with kernels from `cache` and `options` instead of those
    /// the device's tuning profile and the `GPUSORT_*` variables give.
    pub fn with_options(ordinal: usize, cache: &KernelCache, options: GpuOptions) -> Result<Self> {
        Self::with_gpu(Gpu::open_with(ordinal, cache, options)?, ordinal)
    }

    fn with_gpu(gpu: Gpu, ordinal: usize) -> Result<Self> {
        PinnedPool::global().attach(gpu.context());
        let budget = DeviceBudget::for_device(ordinal, gpu.options().device_budget, || gpu.free_memory().unwrap_or(0));
        Ok(Self {
            gpu: Arc::new(gpu),
            digit_bits: MAX_DIGIT_BITS,
            device: Arc::new(Mutex::new(())),
            budget,
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

    /// The device memory budget every sort of the process on this device reserves from.
    pub fn memory_budget(&self) -> &Arc<DeviceBudget> {
        &self.budget
    }

    /// Starts a sort of batches of `schema` by `spec`, fed with [`GpuSortSession::push`] and
    /// ended by [`GpuSortSession::finish`].
    pub fn begin_sort(&self, schema: SchemaRef, spec: SortSpec) -> Result<GpuSortSession> {
        GpuSortSession::new(
            Arc::clone(&self.gpu),
            Arc::clone(&self.device),
            Arc::clone(&self.budget),
            self.digit_bits,
            schema,
            spec,
        )
    }

    /// Sorts like [`SortBackend::sort`], but fails with [`CudaSortError::OutOfMemory`] before
    /// the sort starts when it would need more than `memory_limit` bytes of device memory (or
    /// more than the process's budget), and with [`CudaSortError::Busy`] when other sorts hold
    /// the memory it needs and wait themselves.
    pub fn sort_within(&self, request: &SortRequest<'_>, memory_limit: Option<usize>) -> Result<SortOutput> {
        request.check_rows()?;
        let mut session = self
            .begin_sort(request.batch.schema(), request.spec.clone())?
            .with_strategy(request.strategy)
            .with_encoder_options(request.encoder.clone())
            .with_memory_limit(memory_limit)
            .with_expected_rows(request.batch.num_rows());
        session.push(request.batch)?;
        session.finish(request.limit)
    }

    /// The most rows of batches like `request.batch` (same columns, same sort) that one sort
    /// can take within `memory_limit` bytes of device memory (or the process's budget, or less
    /// when another process holds device memory): what an external sort sizes its runs by.
    /// Sorts running at once do not shrink it: a run that fits waits for its share.
    ///
    /// The estimate is conservative: it counts every key word of the sample's layout plus one
    /// more per sort key (other batches may span wider ranges), or every word a key encoded on
    /// the device can take when that is more, every column the device moves as
    /// nullable, and the larger of the direct and indirect footprints.
    pub fn max_rows_within(&self, request: &SortRequest<'_>, memory_limit: Option<usize>) -> Result<usize> {
        let f = self.footprint_within(request, memory_limit, false)?;
        Ok(f.available.saturating_sub(f.fixed) / f.per_row)
    }

    /// What one sort of batches like `request.batch` takes of device memory, as
    /// [`Self::max_rows_within`] estimates it, and what one sort may take under `memory_limit`.
    /// `device_batches`: rows that join the session already on the device
    /// ([`GpuSortSession::push_device`]), whose view columns are there whatever the limit
    /// (rows from the host keep them on the host under a limit).
    pub fn footprint_within(
        &self,
        request: &SortRequest<'_>,
        memory_limit: Option<usize>,
        device_batches: bool,
    ) -> Result<SortFootprint> {
        let encoder = KeyEncoder::try_new(request.batch, request.spec, &request.encoder)?;
        let schema = request.batch.schema();
        let views = device_batches || views_on_device(self.gpu.options().device_views, memory_limit);
        // Keys encoded on the device hold every word their types can take while they encode,
        // and a key of views the data buffers its values are in (the sample's bytes per row of
        // values out of line: its buffers may be shared with many more rows).
        let device_words = match views {
            true => KeyLayout::device_max_words(request.spec, &schema, &request.encoder),
            false => KeyLayout::native_max_words(request.spec, &schema),
        };
        let words = (encoder.layout().num_words() + request.spec.len()).max(device_words.unwrap_or(0));
        let key_buffer_bytes: usize = match (views, device_words) {
            (true, Some(_)) => (request.spec.keys().iter())
                .map(|k| long_view_bytes(request.batch.column(k.column).as_ref()))
                .sum(),
            _ => 0,
        };
        let buffer_bytes_per_row = key_buffer_bytes.div_ceil(request.batch.num_rows().max(1));
        let (columns, _) = device_columns(&schema, views);
        let widths: Vec<usize> = columns.iter().map(|&(_, w)| w).collect();
        let bytes = |n: usize| {
            // Without packed gathers: a sort packs its gathers only where the memory allows.
            let direct = device_bytes_needed(n, words, &widths, widths.len(), true, false);
            let indirect = device_bytes_needed(n, words, &widths, widths.len(), false, false);
            direct.max(indirect) + n * buffer_bytes_per_row
        };
        const SAMPLE: usize = 1 << 20;
        let fixed = bytes(0);
        let per_row = (bytes(SAMPLE) - fixed).div_ceil(SAMPLE).max(1);
        let available = self.budget.per_sort(self.gpu.free_memory()?, memory_limit);
        Ok(SortFootprint {
            fixed,
            per_row,
            available,
        })
    }
}

/// The device memory of one sort ([`CudaBackend::footprint_within`]): `fixed + rows * per_row`
/// bytes for `rows` rows, of `available`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SortFootprint {
    /// Bytes whatever the rows.
    pub fixed: usize,
    /// Bytes a row.
    pub per_row: usize,
    /// Bytes one sort may take.
    pub available: usize,
}

impl SortFootprint {
    /// Whether a sort of `rows` rows fits beside `kept` more bytes it holds to its end (the
    /// page buffers of device batches: `DeviceBatch::with_reservations`).
    pub fn fits(&self, rows: usize, kept: usize) -> bool {
        self.fixed
            .saturating_add(rows.saturating_mul(self.per_row))
            .saturating_add(kept)
            <= self.available
    }
}

impl SortBackend for CudaBackend {
    fn name(&self) -> String {
        format!("cuda:{}", self.gpu.info().ordinal)
    }

    fn sort(&self, request: &SortRequest<'_>) -> gpusort::Result<SortOutput> {
        self.sort_within(request, None).map_err(Into::into)
    }
}

/// Bytes of the values of a string or binary view column that are not inline (over 12
/// bytes); 0 for a column of another type.
fn long_view_bytes(array: &dyn arrow::array::Array) -> usize {
    use arrow::array::AsArray;
    let views = match array.data_type() {
        DataType::Utf8View => array.as_string_view().views(),
        DataType::BinaryView => array.as_binary_view().views(),
        _ => return 0,
    };
    views.iter().map(|v| *v as u32 as usize).filter(|&len| len > 12).sum()
}
