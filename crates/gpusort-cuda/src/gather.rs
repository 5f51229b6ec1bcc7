//! The gathers (`kernels/gather.cu`): the indirect strategy's record move (Bandyopadhyay &
//! Sahni, ICPADS 2011, section III: once the keys and the row index are sorted, every column is
//! gathered once through the permutation), ByField columns packed into rows so that each row
//! is fetched once, Hybrid records by groups of threads (paper Fig. 6), and the plumbing of
//! Arrow validity bitmaps and device copies around the radix passes.

use cudarc::driver::{CudaSlice, DevicePtr, LaunchConfig, PushKernelArg};

use crate::error::{CudaSortError, Result};
use crate::gpu::{Gpu, rows_u32};
use crate::kernels::{GATHER_ROWS, PACK_ROWS};
use crate::lanes::record_piece;
use crate::pinned::{HostBuffer, PinnedPool};
use crate::profile::Profile;
use crate::table::{DeviceColumn, DeviceTable};

/// The widest row of a packed gather group. On the H100 (10M rows of u32 columns, a random
/// permutation) one column gathered alone costs 0.16 ms; 20 columns gathered as 80-byte rows
/// 1.53 ms (0.077 ms a column); rows of 112 bytes are slower per column again (0.10 ms) and
/// 128-byte rows put every thread of a warp on one shared-memory bank.
pub const PACK_MAX_ROW_BYTES: usize = 80;

/// The fewest columns worth packing: two 4-byte columns gather faster one by one (0.32 ms
/// against 0.44 ms packed), four faster packed (0.51 ms against 0.64 ms).
pub const PACK_MIN_COLUMNS: usize = 3;

/// Groups of columns (indices into `widths`) that gather together as packed rows of at most
/// [`PACK_MAX_ROW_BYTES`] bytes, widest columns first so that every value sits at an offset
/// that is a multiple of its width; each group with its columns' offsets and its row width (a
/// multiple of 16). Groups of fewer than [`PACK_MIN_COLUMNS`] columns gather column by column.
pub fn pack_groups(widths: &[usize]) -> Vec<(Vec<(usize, usize)>, usize)> {
    let mut order: Vec<usize> = (0..widths.len()).collect();
    order.sort_by_key(|&k| std::cmp::Reverse(widths[k]));
    let mut groups: Vec<(Vec<(usize, usize)>, usize)> = vec![];
    let mut current: Vec<(usize, usize)> = vec![];
    let mut used = 0;
    for k in order {
        if used + widths[k] > PACK_MAX_ROW_BYTES && !current.is_empty() {
            groups.push((std::mem::take(&mut current), used.div_ceil(16) * 16));
            used = 0;
        }
        current.push((k, used));
        used += widths[k];
    }
    if !current.is_empty() {
        groups.push((current, used.div_ceil(16) * 16));
    }
    groups
}

/// Device bytes per row that a gather of columns of `widths` holds beyond the columns: the
/// widest column gathered alone, or (packed) the widest group's rows and gathered columns.
pub fn gather_bytes_per_row(widths: &[usize], pack: bool) -> usize {
    pack_groups(widths)
        .iter()
        .map(|(group, row_bytes)| {
            let sizes = group.iter().map(|&(k, _)| widths[k]);
            if pack && group.len() >= PACK_MIN_COLUMNS {
                row_bytes + sizes.sum::<usize>()
            } else {
                sizes.max().unwrap_or(0)
            }
        })
        .max()
        .unwrap_or(0)
}

/// Threads of a `views_block_bytes` block (a multiple of 32).
const VIEW_BLOCK_THREADS: u32 = 256;

/// Rows of a tile `views_block_bytes` scans with one thread block: an output block of more rows
/// is scanned in several tiles at once (one thread block scanning a million rows took ~4 ms
/// a column, 20 ms of each range of TPC-H lineitem's five string columns).
const VIEW_TILE_ROWS: usize = 8192;

/// Where each tile's bytes start, among all tiles' (`tile_base`, one more entry: the end) and
/// within its block's (`tile_in_block`), and each block's (`block_base`, with the end), for
/// tiles of `tile_bytes` bytes, `per_block` tiles a block (the last block's may be fewer).
/// `None` when a block's bytes pass 4 GiB.
fn view_tile_layout(tile_bytes: &[u64], per_block: usize) -> Option<(Vec<u64>, Vec<u32>, Vec<u64>)> {
    let mut tile_base = Vec::with_capacity(tile_bytes.len() + 1);
    let mut tile_in_block = Vec::with_capacity(tile_bytes.len());
    let mut block_base = vec![0u64];
    let mut end = 0u64;
    for (block, tiles) in tile_bytes.chunks(per_block.max(1)).enumerate() {
        let start = block_base[block];
        for &t in tiles {
            tile_base.push(end);
            tile_in_block.push(u32::try_from(end - start).ok()?);
            end += t;
        }
        if end - start > u32::MAX as u64 {
            return None;
        }
        block_base.push(end);
    }
    tile_base.push(end);
    Some((tile_base, tile_in_block, block_base))
}

/// Sorted views laid out for output batches of `block_rows` rows ([`Gpu::lay_out_views`]):
/// the views, each long value's naming buffer 0 of its block at its offset there, the blocks'
/// out-of-line bytes one after another, and where each block's bytes start (one more entry:
/// the end).
pub struct CompactedViews {
    /// 16 bytes a row.
    pub views: CudaSlice<u8>,
    /// The blocks' out-of-line bytes (at least one byte, so that the slice exists).
    pub bytes: CudaSlice<u8>,
    /// Block `b`'s bytes are `bytes[bases[b]..bases[b + 1]]`.
    pub bases: Vec<u64>,
}

/// The first step of laying out sorted views ([`Gpu::count_view_bytes`]): each tile's
/// out-of-line bytes on their way to the host, each row's offset in its tile on the device, and
/// what the second step ([`Gpu::lay_out_views`]) needs to know of the range.
pub struct ViewBytes {
    /// A word a tile, read once the stream passed the copy.
    totals: HostBuffer,
    tiles: usize,
    per_block: usize,
    offsets: CudaSlice<u32>,
    /// The range's first view on the device, and its validity bits (0: none).
    src: u64,
    valid: u64,
    rows: usize,
    n32: u32,
    block32: u32,
    tile32: u32,
}

impl Gpu {
    /// The first of two steps that lay out rows `first..first + rows` of the 16-byte views of
    /// a string or binary view column (valid where `valid`'s bits of the range are set, when
    /// given) for output batches of `block_rows` rows, as Arrow's `gc` of each batch would:
    /// every tile of [`VIEW_TILE_ROWS`] rows counts its long values' bytes, and the counts
    /// start down to the host. Then, once the stream has passed the copy (a caller laying
    /// out several columns synchronizes once for all of them), [`Self::lay_out_views`].
    pub fn count_view_bytes(
        &self,
        views: &CudaSlice<u8>,
        first: usize,
        rows: usize,
        valid: Option<&CudaSlice<u8>>,
        block_rows: usize,
    ) -> Result<ViewBytes> {
        assert!(
            16 * (first + rows) <= views.len(),
            "views {first}..{} of {} bytes",
            first + rows,
            views.len()
        );
        let s = &self.stream;
        let (n32, block32) = (rows_u32(rows)?, rows_u32(block_rows.clamp(1, rows.max(1)))?);
        let tile32 = block32.min(VIEW_TILE_ROWS as u32);
        let per_block = (block32 as usize).div_ceil(tile32 as usize);
        let blocks = rows.div_ceil(block32 as usize).max(1);
        let tiles = blocks * per_block;
        let offsets = self.alloc_words(rows.max(1))?;
        let tile_bytes = s.alloc_zeros::<u64>(tiles)?;
        let (src, valid_p, offsets_p, tile_bytes_p) = (
            views.device_ptr(s).0 + 16 * first as u64,
            valid.map_or(0, |v| v.device_ptr(s).0),
            offsets.device_ptr(s).0,
            tile_bytes.device_ptr(s).0,
        );
        let one_a_tile = LaunchConfig {
            grid_dim: (tiles as u32, 1, 1),
            block_dim: (VIEW_BLOCK_THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: `views` holds the range's rows; `valid` (when given) a bit of each;
        // `offsets` a word a row; `tile_bytes` a word a tile.
        unsafe {
            s.launch_builder(&self.kernels()?.views_block_bytes)
                .arg(&src)
                .arg(&valid_p)
                .arg(&n32)
                .arg(&block32)
                .arg(&tile32)
                .arg(&offsets_p)
                .arg(&tile_bytes_p)
                .launch(one_a_tile)?
        };
        let mut totals = PinnedPool::global().alloc(8 * tiles);
        self.context().bind_to_thread()?;
        // SAFETY: `totals` holds a word a tile and is read only after the stream synchronizes
        // (`lay_out_views`' contract); `tile_bytes` is freed in stream order, after the copy.
        unsafe { cudarc::driver::result::memcpy_dtoh_async(totals.as_mut_slice(), tile_bytes_p, s.cu_stream())? };
        Ok(ViewBytes {
            totals,
            tiles,
            per_block,
            offsets,
            src,
            valid: valid_p,
            rows,
            n32,
            block32,
            tile32,
        })
    }

    /// The second step of [`Self::count_view_bytes`], once the stream has passed its copy (the
    /// caller synchronized it): the views, each long value's naming buffer 0 of its block at its
    /// offset there, and the blocks' bytes, read from the data buffers whose device addresses
    /// `buffers` lists by buffer index. `None` when a block's bytes pass 4 GiB (a view's offset
    /// is 32 bits): the caller compacts on the host.
    pub fn lay_out_views(&self, counted: ViewBytes, buffers: &CudaSlice<u64>) -> Result<Option<CompactedViews>> {
        let s = &self.stream;
        let words = &counted.totals.as_slice()[..8 * counted.tiles];
        let totals: Vec<u64> = (words.chunks_exact(8))
            .map(|w| u64::from_le_bytes(w.try_into().expect("8 bytes")))
            .collect();
        let Some((tile_base, tile_in_block, bases)) = view_tile_layout(&totals, counted.per_block) else {
            return Ok(None);
        };
        let total = *bases.last().expect("the end") as usize;
        let tile_base_dev = s.clone_htod(&tile_base)?;
        let tile_in_block_dev = s.clone_htod(&tile_in_block)?;
        let out_views = self.alloc_bytes(16 * counted.rows.max(1))?;
        let bytes = self.alloc_bytes(total.max(1))?;
        let (offsets_p, tile_base_p, tile_in_block_p, buffers_p, out_views_p, bytes_p) = (
            counted.offsets.device_ptr(s).0,
            tile_base_dev.device_ptr(s).0,
            tile_in_block_dev.device_ptr(s).0,
            buffers.device_ptr(s).0,
            out_views.device_ptr(s).0,
            bytes.device_ptr(s).0,
        );
        // SAFETY: as in `count_view_bytes`; `buffers` holds the address of every buffer a valid
        // long view of the range names, `out_views` 16 bytes a row, `bytes` every tile's bytes
        // at its base.
        unsafe {
            s.launch_builder(&self.kernels()?.views_compact)
                .arg(&counted.src)
                .arg(&counted.valid)
                .arg(&counted.n32)
                .arg(&counted.block32)
                .arg(&counted.tile32)
                .arg(&offsets_p)
                .arg(&tile_base_p)
                .arg(&tile_in_block_p)
                .arg(&buffers_p)
                .arg(&out_views_p)
                .arg(&bytes_p)
                .launch(self.grid_for(counted.rows.max(1)))?
        };
        Ok(Some(CompactedViews {
            views: out_views,
            bytes,
            bases,
        }))
    }

    /// `0, 1, ..., n - 1` on the device.
    pub fn iota(&self, n: usize) -> Result<CudaSlice<u32>> {
        let n32 = rows_u32(n)?;
        let out = self.alloc_words(n)?;
        let p = out.device_ptr(&self.stream).0;
        // SAFETY: the kernel writes n words of `out`.
        unsafe {
            self.stream
                .launch_builder(&self.kernels()?.iota)
                .arg(&n32)
                .arg(&p)
                .launch(self.grid_for(n))?
        };
        Ok(out)
    }

    /// Rows `perm[0..rows]` of a column of `width`-byte rows, in a new buffer.
    pub fn gather_column(
        &self,
        src: &CudaSlice<u8>,
        width: usize,
        perm: &CudaSlice<u32>,
        rows: usize,
    ) -> Result<CudaSlice<u8>> {
        let s = &self.stream;
        let f = self
            .kernels()?
            .gather_for(width)
            .ok_or_else(|| CudaSortError::Unsupported(format!("a column of {width} bytes per row")))?;
        let out = self.alloc_bytes(rows * width)?;
        let (src, dst, perm_p, n32) = (
            src.device_ptr(s).0,
            out.device_ptr(s).0,
            perm.device_ptr(s).0,
            rows as u32,
        );
        // SAFETY: `perm` holds at least `rows` indices of rows of `src`; `out` holds `rows` rows.
        unsafe {
            s.launch_builder(f)
                .arg(&n32)
                .arg(&src)
                .arg(&perm_p)
                .arg(&dst)
                .launch(self.grid_for(rows.div_ceil(GATHER_ROWS)))?
        };
        Ok(out)
    }

    /// Bits `offset + perm[i]` of a bitmap for `first <= i < first + rows`, as ceil(rows / 32)
    /// little-endian words (an Arrow bitmap).
    pub fn gather_bitmap(
        &self,
        bits: &CudaSlice<u8>,
        offset: u32,
        perm: &CudaSlice<u32>,
        first: usize,
        rows: usize,
    ) -> Result<CudaSlice<u8>> {
        assert!(
            first + rows <= perm.len(),
            "rows {first}..{} of a permutation of {}",
            first + rows,
            perm.len()
        );
        let s = &self.stream;
        let out = self.alloc_bytes(rows.div_ceil(32) * 4)?;
        let (src, dst, perm_p, n32) = (
            bits.device_ptr(s).0,
            out.device_ptr(s).0,
            perm.device_ptr(s).0 + 4 * first as u64,
            rows as u32,
        );
        // SAFETY: `perm` holds `rows` indices of bits of `bits` from `first` on; `out` holds
        // ceil(rows / 32) words.
        unsafe {
            s.launch_builder(&self.kernels()?.gather_bits)
                .arg(&n32)
                .arg(&src)
                .arg(&offset)
                .arg(&perm_p)
                .arg(&dst)
                .launch(self.grid_for(rows.div_ceil(32) * 32))?
        };
        Ok(out)
    }

    /// Bit `bit` of u32 words `first..first + rows`, as ceil(rows / 32) little-endian words
    /// (an Arrow bitmap).
    pub fn unpack_bits(&self, words: &CudaSlice<u8>, bit: u32, first: usize, rows: usize) -> Result<CudaSlice<u8>> {
        assert!(
            4 * (first + rows) <= words.len(),
            "words {first}..{} of {} bytes",
            first + rows,
            words.len()
        );
        let s = &self.stream;
        let out = self.alloc_bytes(rows.div_ceil(32) * 4)?;
        let (src, dst, n32) = (
            words.device_ptr(s).0 + 4 * first as u64,
            out.device_ptr(s).0,
            rows as u32,
        );
        // SAFETY: `words` holds at least `first + rows` words; `out` holds ceil(rows / 32) words.
        unsafe {
            s.launch_builder(&self.kernels()?.unpack_validity)
                .arg(&n32)
                .arg(&src)
                .arg(&bit)
                .arg(&dst)
                .launch(self.grid_for(rows.div_ceil(32) * 32))?
        };
        Ok(out)
    }

    /// Queues the device-to-device copies `ranges` (source, destination, bytes) on the sort
    /// stream as one kernel launch instead of one copy call each: assembling 21 columns from
    /// 27 segments took 6 ms as 567 copies, most of it per-copy overhead.
    ///
    /// # Safety
    /// Each source holds its bytes, each destination has room for them, and no destination
    /// overlaps another range.
    pub unsafe fn copy_ranges(&self, ranges: &[(u64, u64, usize)]) -> Result<()> {
        if ranges.is_empty() {
            return Ok(());
        }
        let s = &self.stream;
        let table: Vec<u64> = ranges.iter().flat_map(|&(a, b, n)| [a, b, n as u64]).collect();
        // Freed in stream order, after the kernel.
        let table_dev = s.clone_htod(&table)?;
        let largest = ranges.iter().map(|r| r.2).max().unwrap_or(0);
        let threads = 256u32;
        let x = largest.div_ceil(threads as usize * 16 * 4).clamp(1, 64) as u32;
        let y = ranges.len().min(65_535) as u32;
        let (table_p, count) = (table_dev.device_ptr(s).0, ranges.len() as u32);
        // SAFETY: the table lists `count` ranges; the rest is the caller's contract.
        unsafe {
            s.launch_builder(&self.kernels()?.copy_ranges)
                .arg(&table_p)
                .arg(&count)
                .launch(LaunchConfig {
                    grid_dim: (x, y, 1),
                    block_dim: (threads, 1, 1),
                    shared_mem_bytes: 0,
                })?
        };
        Ok(())
    }

    /// One u32 lane of validity words from up to 32 bitmaps `(bytes, bit offset of row 0)`:
    /// bit `j` of word `i` is row `i`'s validity in bitmap `j`.
    pub fn pack_bits(&self, bitmaps: &[(&CudaSlice<u8>, u32)], rows: usize) -> Result<CudaSlice<u8>> {
        assert!(bitmaps.len() <= 32, "at most 32 bitmaps per lane");
        let s = &self.stream;
        let refs: Vec<u64> = bitmaps
            .iter()
            .flat_map(|(b, o)| [b.device_ptr(s).0, *o as u64])
            .collect();
        let refs_dev = s.clone_htod(&refs)?;
        let out = self.alloc_bytes(rows * 4)?;
        let (refs_p, dst, n32, count) = (
            refs_dev.device_ptr(s).0,
            out.device_ptr(s).0,
            rows as u32,
            bitmaps.len() as u32,
        );
        // SAFETY: `refs` lists `count` bitmaps of at least `rows` bits; `out` holds `rows` words.
        unsafe {
            s.launch_builder(&self.kernels()?.pack_validity)
                .arg(&n32)
                .arg(&refs_p)
                .arg(&count)
                .arg(&dst)
                .launch(self.grid_for(rows))?
        };
        // The reference table must outlive the kernel.
        s.synchronize()?;
        Ok(out)
    }

    /// The indirect strategy's record move: every column (and the records) gathered once.
    pub(crate) fn gather_payload(&self, table: &mut DeviceTable, perm: &CudaSlice<u32>, pack: bool) -> Result<()> {
        let n = table.num_rows;
        self.gather_columns(&mut table.columns, n, perm, n, pack)?;
        self.gather_records(table, perm)
    }

    /// Replaces every column of `cols` (each of `src_rows` rows) by its rows `perm[0..rows]`.
    /// Columns gather in the groups of [`pack_groups`]: with `pack`, a group of at least
    /// [`PACK_MIN_COLUMNS`] is packed into row-major rows that are then fetched once per row
    /// (gather.cu's `pack_rows` and `gather_unpack`); the others, and every column when few
    /// rows are kept (a top-k), gather one by one. A group's sources are freed once it is
    /// gathered, so the memory held beyond the columns is [`gather_bytes_per_row`].
    pub fn gather_columns(
        &self,
        cols: &mut [DeviceColumn],
        src_rows: usize,
        perm: &CudaSlice<u32>,
        rows: usize,
        pack: bool,
    ) -> Result<()> {
        let s = &self.stream;
        let prof = Profile::new(self)?;
        let widths: Vec<usize> = cols.iter().map(|c| c.width).collect();
        // Packing reads and writes every source row: not worth it for a few rows kept.
        let pack = pack && rows >= src_rows / 4 && rows > 0;
        for (group, row_bytes) in pack_groups(&widths) {
            if !pack || group.len() < PACK_MIN_COLUMNS {
                for &(k, _) in &group {
                    cols[k].data = self.gather_column(&cols[k].data, cols[k].width, perm, rows)?;
                    prof.mark(self, "gather_column")?;
                }
                continue;
            }
            let packed = self.alloc_bytes(src_rows * row_bytes)?;
            let mut dsts = vec![];
            for &(k, _) in &group {
                dsts.push(self.alloc_bytes(rows * cols[k].width)?);
            }
            let table = |ptrs: Vec<u64>| -> Vec<u64> {
                group
                    .iter()
                    .zip(ptrs)
                    .flat_map(|(&(k, offset), p)| [p, cols[k].width as u64 | (offset as u64) << 32])
                    .collect()
            };
            let srcs = s.clone_htod(&table(
                group.iter().map(|&(k, _)| cols[k].data.device_ptr(s).0).collect(),
            ))?;
            let outs = s.clone_htod(&table(dsts.iter().map(|d| d.device_ptr(s).0).collect()))?;
            let (srcs_p, outs_p, packed_p, perm_p) = (
                srcs.device_ptr(s).0,
                outs.device_ptr(s).0,
                packed.device_ptr(s).0,
                perm.device_ptr(s).0,
            );
            let (num, rb) = (group.len() as u32, row_bytes as u32);
            let cfg = |n: usize| LaunchConfig {
                grid_dim: (
                    n.div_ceil(PACK_ROWS as usize)
                        .clamp(1, self.info.multiprocessors as usize * 8) as u32,
                    1,
                    1,
                ),
                block_dim: (PACK_ROWS, 1, 1),
                // The tile, then the column table (16 bytes a column).
                shared_mem_bytes: PACK_ROWS * rb + 16 * num,
            };
            // SAFETY: every source column holds src_rows rows of its width and every output
            // `rows`; `packed` holds src_rows rows of row_bytes; perm holds `rows` indices
            // below src_rows; the tables list the group's columns with offsets inside a row.
            unsafe {
                s.launch_builder(&self.kernels()?.pack_rows)
                    .arg(&(src_rows as u32))
                    .arg(&srcs_p)
                    .arg(&num)
                    .arg(&rb)
                    .arg(&packed_p)
                    .launch(cfg(src_rows))?;
                prof.mark(self, "pack_rows")?;
                s.launch_builder(&self.kernels()?.gather_unpack)
                    .arg(&(rows as u32))
                    .arg(&packed_p)
                    .arg(&rb)
                    .arg(&perm_p)
                    .arg(&outs_p)
                    .arg(&num)
                    .launch(cfg(rows))?;
            }
            prof.mark(self, "gather_unpack")?;
            // The tables, the rows and the sources are freed in stream order, after the kernels.
            drop((srcs, outs, packed));
            for (&(k, _), d) in group.iter().zip(dsts) {
                cols[k].data = d;
            }
        }
        prof.report()
    }

    /// Hybrid records gathered once through the permutation, a group of threads per record.
    pub(crate) fn gather_records(&self, table: &mut DeviceTable, perm: &CudaSlice<u32>) -> Result<()> {
        let n = table.num_rows;
        let s = &self.stream;
        let perm_p = perm.device_ptr(s).0;
        let n32 = n as u32;
        if let Some(r) = table.records.as_mut() {
            let out = self.alloc_bytes(n * r.bytes)?;
            let piece = record_piece(r.bytes);
            let bytes = r.bytes as u32;
            let (src, dst) = (r.data.device_ptr(s).0, out.device_ptr(s).0);
            let pieces = n * (r.bytes / piece as usize);
            // SAFETY: src and dst hold n records; perm holds n indices below n.
            unsafe {
                s.launch_builder(&self.kernels()?.gather_records)
                    .arg(&n32)
                    .arg(&src)
                    .arg(&perm_p)
                    .arg(&dst)
                    .arg(&bytes)
                    .arg(&piece)
                    .launch(self.grid_for(pieces.div_ceil(GATHER_ROWS)))?
            };
            r.data = out;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Tiles lay out one after another; a tile's place in its block restarts at each block;
    /// a block over 4 GiB is refused, tiles that add up to more in separate blocks are not.
    #[test]
    fn view_tiles_lay_out_block_by_block() {
        let (tile_base, in_block, block_base) = view_tile_layout(&[3, 4, 5, 1, 2, 0, 7], 3).unwrap();
        assert_eq!(tile_base, vec![0, 3, 7, 12, 13, 15, 15, 22]);
        assert_eq!(in_block, vec![0, 3, 7, 0, 1, 3, 0]);
        assert_eq!(block_base, vec![0, 12, 15, 22]);
        let (_, in_block, block_base) = view_tile_layout(&[9, 0, 4], 1).unwrap();
        assert_eq!((in_block, block_base), (vec![0, 0, 0], vec![0, 9, 9, 13]));
        let big = u32::MAX as u64;
        assert!(view_tile_layout(&[big, 1], 2).is_none());
        assert!(view_tile_layout(&[big - 1, 1, 1], 2).is_some());
        assert_eq!(view_tile_layout(&[big, 1], 1).unwrap().2, vec![0, big, big + 1]);
        assert_eq!(view_tile_layout(&[], 4).unwrap(), (vec![0], vec![], vec![0]));
    }

    #[test]
    fn pack_groups_fill_rows_widest_first() {
        // 20 u32 columns: one 80-byte row.
        let g = pack_groups(&[4; 20]);
        assert_eq!(g.len(), 1);
        assert_eq!(g[0].1, 80);
        assert_eq!(
            g[0].0.iter().map(|c| c.1).collect::<Vec<_>>(),
            (0..20).map(|i| 4 * i).collect::<Vec<_>>()
        );
        // Mixed widths: every column once, offsets aligned to the width, rows within bounds.
        let widths = [1, 16, 4, 8, 2, 16, 16, 16, 16, 8, 4, 4, 1, 2];
        let groups = pack_groups(&widths);
        let mut seen: Vec<usize> = groups.iter().flat_map(|g| g.0.iter().map(|c| c.0)).collect();
        seen.sort();
        assert_eq!(seen, (0..widths.len()).collect::<Vec<_>>());
        for (cols, row_bytes) in &groups {
            assert!(*row_bytes <= PACK_MAX_ROW_BYTES && row_bytes % 16 == 0);
            let mut end = 0;
            for &(k, offset) in cols {
                assert_eq!(offset % widths[k], 0, "column {k} at {offset}");
                assert_eq!(offset, end);
                end += widths[k];
            }
            assert!(end <= *row_bytes);
        }
        assert!(pack_groups(&[]).is_empty());
        assert_eq!(pack_groups(&[2]), vec![(vec![(0, 0)], 16)]);
    }

    #[test]
    fn gather_memory_counts_the_packed_rows() {
        // 20 u32 columns: 80-byte rows plus 80 bytes of gathered columns, or one column.
        assert_eq!(gather_bytes_per_row(&[4; 20], true), 160);
        assert_eq!(gather_bytes_per_row(&[4; 20], false), 4);
        // Two columns gather one by one, packed or not.
        assert_eq!(gather_bytes_per_row(&[8, 4], true), 8);
        assert_eq!(gather_bytes_per_row(&[], true), 0);
    }
}
