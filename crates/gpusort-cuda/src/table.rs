//! The rows a sort permutes on the device ([`DeviceTable`]: key words ByField, payload columns
//! ByField and/or Hybrid row-major records, the layouts of Bandyopadhyay & Sahni, ICPADS 2011,
//! section II) and what a sort does with them ([`GpuSortPlan`]) and returns ([`GpuSortResult`]).
//! Plain data: no kernel is launched here ([`Gpu::sort`](crate::Gpu::sort) is in `sort.rs`).

use cudarc::driver::CudaSlice;
use gpusort::plan::{InputOrder, RadixPass, Strategy};

/// A fixed-width ByField column on the device: `width` bytes (1, 2, 4, 8 or 16) per row.
#[derive(Debug)]
pub struct DeviceColumn {
    /// The rows.
    pub data: CudaSlice<u8>,
    /// Bytes per row.
    pub width: usize,
}

/// Row-major records on the device (the Hybrid layout): `bytes` per record, a multiple of 4.
#[derive(Debug)]
pub struct DeviceRecords {
    /// The records.
    pub data: CudaSlice<u8>,
    /// Bytes per record.
    pub bytes: usize,
}

/// Rows on the device: key words and payload.
#[derive(Debug)]
pub struct DeviceTable {
    /// Rows.
    pub num_rows: usize,
    /// Key words, ByField, word 0 most significant.
    pub keys: Vec<CudaSlice<u32>>,
    /// ByField payload columns.
    pub columns: Vec<DeviceColumn>,
    /// Hybrid payload: row-major records.
    pub records: Option<DeviceRecords>,
}

/// What a sort does.
#[derive(Debug, Clone, PartialEq)]
pub struct GpuSortPlan {
    /// Algorithm and record move.
    pub strategy: Strategy,
    /// Digit passes, least significant first (digits of at most 8 bits).
    pub passes: Vec<RadixPass>,
    /// Leave every key word that a pass reads in sorted order.
    pub keep_keys: bool,
    /// Return the permutation (sorted position -> input row).
    pub want_perm: bool,
    /// Indirect: gather groups of columns packed into rows ([`Gpu::gather_columns`]), which
    /// holds more device memory ([`gather_bytes_per_row`]).
    pub pack_gathers: bool,
}

/// What a sort returns.
#[derive(Debug)]
pub struct GpuSortResult {
    /// The permutation, when asked for (or when the strategy made one anyway).
    pub perm: Option<CudaSlice<u32>>,
    /// Time between the sort's first and last kernel, from device events.
    pub kernel_ms: f32,
    /// The order the key was found in when that replaced the passes (sorted or reversed).
    pub input_order: Option<InputOrder>,
}
