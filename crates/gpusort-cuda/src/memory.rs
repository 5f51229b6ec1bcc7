//! Device memory sizing: what a sort of `n` rows holds on the device at its peak, by which
//! [`CudaBackend`](crate::CudaBackend) sizes an external sort's runs and a
//! [`GpuSortSession`](crate::GpuSortSession) refuses a sort that would not fit (and decides
//! whether its gathers may be packed). No kernel: the figures follow the buffers that `lsd.rs`,
//! `msd` and `gather.rs` allocate (two per moved column, the gathers' of
//! [`gather_bytes_per_row`]).

use crate::gather::gather_bytes_per_row;

/// Device bytes a sort of `n` rows holds at its peak: both buffers of the varying key words,
/// and either both buffers of every moved column (direct) or the columns, both buffers of the
/// row index and what the gathers hold beyond the columns (indirect, [`gather_bytes_per_row`]:
/// the widest column, or with `pack` the widest packed group), plus scratch.
pub(crate) fn device_bytes_needed(
    n: usize,
    key_words: usize,
    widths: &[usize],
    nullable: usize,
    direct: bool,
    pack: bool,
) -> usize {
    let keys = 2 * key_words * 4 * n;
    let columns: usize = widths.iter().sum::<usize>() * n + nullable * n.div_ceil(8);
    let records = if direct {
        2 * columns + 2 * nullable.div_ceil(32) * 4 * n
    } else {
        columns + 2 * 4 * n + gather_bytes_per_row(widths, pack) * n
    };
    keys + records + (n / 256 + 1) * 1024 + (16 << 20)
}
