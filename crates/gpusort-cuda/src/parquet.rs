//! Parquet data pages decoded on the device (`kernels/parquet.cu`): the third step of the plan
//! in `kernels/NOTES.md`, "Parquet decode on the GPU: the plan". The pages lie decompressed in
//! device memory ([`crate::PageDecompressor`]); the caller (`gpusort_parquet`, which reads the
//! file's metadata) describes each with a [`ParquetPage`], and [`Gpu::parquet_decode`] writes
//! every page's rows into its column's Arrow buffers in one launch: fixed-width values widened
//! or narrowed to the Arrow width, byte arrays as 16-byte views into the pages' bytes, a
//! validity bitmap for optional columns. PLAIN byte arrays become views first
//! ([`Gpu::parquet_plain_views`]): the dictionaries of byte-array columns, and their PLAIN data
//! pages. This crate knows nothing of Parquet's metadata: only the pages' bytes.

use cudarc::driver::{DeviceRepr, LaunchConfig, PushKernelArg};

use crate::error::{CudaSortError, Result};
use crate::gpu::Gpu;
use crate::kernels::{PARQUET_BLOCK, PARQUET_VIEWS_BLOCK};

/// A page's values are PLAIN (`PARQUET_PLAIN`).
pub const PAGE_PLAIN: u32 = 0;
/// A page's values are indices into the column chunk's dictionary, RLE / bit-packed with their
/// bit width first (`PARQUET_DICT`; Parquet's RLE_DICTIONARY and PLAIN_DICTIONARY).
pub const PAGE_DICT: u32 = 1;
/// A v1 data page of an optional column: its decompressed bytes begin with the definition
/// levels' length (4 bytes) and the levels (`PARQUET_V1_LEVELS`).
pub const PAGE_V1_LEVELS: u32 = 1;
/// An optional column: rows whose definition level is 0 are null (`PARQUET_OPTIONAL`).
pub const PAGE_OPTIONAL: u32 = 2;

/// One data page of a column, for `parquet_decode` (its `ParquetPage`; device addresses as
/// `u64`). Flat columns only: a column's definition levels are 0 or 1.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ParquetPage {
    /// The page's decompressed bytes: with [`PAGE_V1_LEVELS`] the levels' length and levels
    /// first, then the values.
    pub data: u64,
    /// A v2 page of an optional column: its definition levels (RLE, no length); else 0.
    pub levels: u64,
    /// [`PAGE_DICT`]: the dictionary's PLAIN values (fixed width) or its views (byte arrays);
    /// PLAIN byte arrays: this page's views ([`Gpu::parquet_plain_views`]); else 0.
    pub dict: u64,
    /// The column's output values: `out_width` bytes a row.
    pub out: u64,
    /// The column's validity bitmap (Arrow's, zeroed before), or 0 for a required column.
    pub validity: u64,
    /// The output row of the page's first value.
    pub row: u64,
    /// Bytes of `data`.
    pub data_len: u32,
    /// Bytes of `levels`.
    pub levels_len: u32,
    /// Rows of the page, nulls included.
    pub num_values: u32,
    /// Entries of `dict`.
    pub dict_len: u32,
    /// [`PAGE_PLAIN`] or [`PAGE_DICT`].
    pub encoding: u32,
    /// [`PAGE_V1_LEVELS`], [`PAGE_OPTIONAL`].
    pub flags: u32,
    /// Bytes of a stored value: 4 (INT32, FLOAT) or 8 (INT64, DOUBLE); 0 for byte arrays.
    pub in_width: u32,
    /// Bytes of an output value: 1, 2, 4, 8 or 16 (byte arrays: 16, views).
    pub out_width: u32,
    /// 1: widen with the sign (INT32 to 64 or 128 bits, INT64 to 128).
    pub sign: u32,
    pub pad: u32,
}

// SAFETY: plain integers, laid out as parquet.cu's `ParquetPage` (88 bytes, checked there).
unsafe impl DeviceRepr for ParquetPage {}

/// PLAIN byte arrays made views, for `parquet_plain_views` (its `ViewRegion`): at most `count`
/// values in `len` bytes at `data` (a v1 page's levels first with [`PAGE_V1_LEVELS`]), their
/// 16-byte views written to `views`; a value longer than 12 bytes is viewed in buffer `buffer`
/// at its offset from `base`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ViewRegion {
    pub data: u64,
    pub views: u64,
    pub base: u64,
    pub len: u32,
    pub count: u32,
    pub buffer: u32,
    pub flags: u32,
}

// SAFETY: plain integers, laid out as parquet.cu's `ViewRegion` (40 bytes, checked there).
unsafe impl DeviceRepr for ViewRegion {}

/// What parquet.cu's error codes say.
fn describe(code: u32) -> &'static str {
    match code {
        1 => "a run header or run value past the end of its bytes",
        2 => "bit-packed values past the end of their bytes",
        3 => "a dictionary index outside the dictionary",
        4 => "PLAIN values past the end of the page",
        5 => "a bit width above 32",
        6 => "a definition level above 1",
        7 => "definition levels longer than the page",
        _ => "an unknown error",
    }
}

impl Gpu {
    /// Writes the views of every region's PLAIN byte arrays (one block a region); an error
    /// names a region whose bytes end inside a value.
    pub fn parquet_plain_views(&self, regions: &[ViewRegion]) -> Result<()> {
        self.parquet_launch("region", regions, |k| &k.parquet_plain_views, PARQUET_VIEWS_BLOCK)
    }

    /// Decodes every page of `pages` into its column (one block a page), then waits for them;
    /// an error names a page that is corrupt (`kernels/parquet.cu` says what is checked).
    pub fn parquet_decode(&self, pages: &[ParquetPage]) -> Result<()> {
        self.parquet_launch("page", pages, |k| &k.parquet_decode, PARQUET_BLOCK)
    }

    /// Uploads `items`, launches `kernel` over them (one block of `block` threads an item) with
    /// an error word pair, waits, and turns a code the kernel left into an error naming the
    /// `what` it was found in.
    fn parquet_launch<T: DeviceRepr + Unpin>(
        &self,
        what: &str,
        items: &[T],
        kernel: impl Fn(&crate::kernels::Kernels) -> &cudarc::driver::CudaFunction,
        block: u32,
    ) -> Result<()> {
        if items.is_empty() {
            return Ok(());
        }
        let n = u32::try_from(items.len())
            .map_err(|_| CudaSortError::Decode(format!("{} {what}s in one launch", items.len())))?;
        let cfg = LaunchConfig {
            grid_dim: (n, 1, 1),
            block_dim: (block, 1, 1),
            shared_mem_bytes: 0,
        };
        let kernels = self.kernels()?;
        let s = self.stream();
        let d_items = s.clone_htod(items)?;
        let mut error = s.alloc_zeros::<u32>(2)?;
        let mut launch = s.launch_builder(kernel(kernels));
        launch.arg(&d_items).arg(&mut error);
        // SAFETY: the caller's descriptors name device memory as large as their counts say
        // (the kernels check every read against them); `error` holds two words.
        unsafe { launch.launch(cfg) }?;
        let found = s.clone_dtoh(&error)?;
        s.synchronize()?;
        match found[..] {
            [0, _] => Ok(()),
            [code, at] => Err(CudaSortError::Decode(format!(
                "{what} {at} of {}: {}",
                items.len(),
                describe(code)
            ))),
            _ => unreachable!("two words"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn descriptors_are_laid_out_as_the_kernels_read_them() {
        assert_eq!(std::mem::size_of::<ParquetPage>(), 88);
        assert_eq!(std::mem::size_of::<ViewRegion>(), 40);
        assert_eq!(std::mem::offset_of!(ParquetPage, row), 40);
        assert_eq!(std::mem::offset_of!(ParquetPage, pad), 84);
        assert_eq!(std::mem::offset_of!(ViewRegion, flags), 36);
    }
}
