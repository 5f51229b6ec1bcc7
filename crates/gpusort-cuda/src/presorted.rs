//! Presorted input on the device (`kernels/presorted.cu`): one read of the key before the
//! radix passes says whether the rows are already in order, strictly in reverse order, or a
//! few ascending runs, and such a sort then skips its passes — nothing moves for sorted input;
//! for reversed input every key word, column and record is reversed in place (one launch for
//! all) and the permutation is `n - 1 - i`; runs (at most [`gpusort::cpu::PRESORTED_MAX_RUNS`],
//! where their merge rounds pay against the passes: [`merge_pays`]) are merged (`merge.rs`).
//! Bandyopadhyay & Sahni's sorts (ICPADS 2011, sections V and VI) run every pass whatever the
//! order; this check costs one read of the key words. Non-increasing input (reversed with equal
//! neighbours) gets its groups of equal keys reversed, each group's rows kept in input order:
//! one read of the key for the permutation ([`Gpu::reverse_groups`]), the key words reversed in
//! place and the payload gathered through it (`sort.rs`).
//!
//! **Few distinct keys** (keys of at most two words, at most [`DISTINCT_MAX`] distinct, like
//! the CPU backend's `gpusort::cpu::presorted`): beside the scan, where it stopped (the rows
//! are in no order it finds), one block hashes a sample of the keys and, where it finds few
//! distinct, a second read of the key writes each row's rank among them. Where every key was
//! among them, the ranks become a key word of their own, and one stable 8-bit pass over it sorts
//! the rows (`Gpu::sort_by_ranks`, `sort.rs`): a counting sort in one pass instead of a pass per
//! byte of the key. A key the sample missed stops that read and sends the rows to the passes.
//!
//! The scan is off the sort's critical path: [`Gpu::start_order_scan`] enqueues it (its counts
//! zeroed by an async memset in a buffer the [`Gpu`] keeps, then copied into pinned host memory
//! behind an event) and returns at once; the passes do their host work (lane buffers, lane
//! tables) while it runs, and [`OrderScan::settle`] waits for the event only before their first
//! kernel (`lsd.rs`, `msd`), when the scan is long done for random keys. No allocation, no
//! pageable copy and no stream synchronization remain on the path of a sort that takes its
//! passes.

use std::sync::Mutex;

use cudarc::driver::sys::CUevent_flags;
use cudarc::driver::{
    CudaEvent, CudaSlice, CudaStream, DevicePtr, DeviceRepr, DriverError, LaunchConfig, PinnedHostSlice, PushKernelArg,
};
use gpusort::plan::InputOrder;

use crate::error::Result;
use crate::gpu::{Gpu, rows_u32};
use crate::kernels::{
    DISTINCT_BLOCK, DISTINCT_MAX, Kernels, ORDER_SCAN_MAX_DESCENTS, ORDER_SCAN_MAX_WORDS, REVERSE_GROUPS_BLOCK,
    REVERSE_GROUPS_TILE, REVERSE_ITEMS, REVERSE_MAX_LANES, SCAN_DISTINCT, SCAN_MISSING,
};
use crate::merge::{MergeMethod, merge_pays};
use crate::table::DeviceTable;

/// The device addresses of the key words `order_scan` compares, passed by value (`ScanWords`).
#[repr(C)]
struct ScanWords([u64; ORDER_SCAN_MAX_WORDS]);

// SAFETY: a plain array of device addresses, laid out as the kernel's struct of 8 pointers.
unsafe impl DeviceRepr for ScanWords {}

impl ScanWords {
    /// The addresses of the `words` of `keys` (at most [`ORDER_SCAN_MAX_WORDS`]).
    fn of(keys: &[CudaSlice<u32>], words: &[usize], s: &CudaStream) -> Self {
        let mut ptrs = ScanWords([0; ORDER_SCAN_MAX_WORDS]);
        for (p, &w) in ptrs.0.iter_mut().zip(words) {
            *p = keys[w].device_ptr(s).0;
        }
        ptrs
    }
}

/// The lanes `reverse_lanes` reverses, passed by value (`ReverseLanes`): each one's device
/// address and bytes a row.
#[repr(C)]
struct ReverseLanes {
    data: [u64; REVERSE_MAX_LANES],
    width: [u32; REVERSE_MAX_LANES],
}

// SAFETY: plain arrays, laid out as the kernel's struct (16 pointers, then 16 u32).
unsafe impl DeviceRepr for ReverseLanes {}

/// Words `order_scan` reports: descents, ascents, equal neighbours, the stop flag, and the
/// descents offered to its list of their rows; then the sample's distinct keys
/// ([`SCAN_DISTINCT`]) and the flag of a key missing from them ([`SCAN_MISSING`]).
const SCAN_WORDS: usize = 7;
const _: () = assert!(SCAN_DISTINCT == 5 && SCAN_MISSING == 6);

/// Rows from which a sort looks for few distinct keys unless told otherwise
/// ([`SortSwitches::few_distinct`](crate::SortSwitches::few_distinct)): below, its passes take
/// ~0.1 ms and the sample's kernels would be a tenth of that.
pub const DISTINCT_MIN_ROWS: usize = 1 << 20;

/// The order the counts of `order_scan` (descents, ascents, equal neighbours, the stop flag,
/// descents recorded) say the rows are in, when it lets a sort skip its passes: no descent,
/// sorted; no ascent, non-increasing (reversed: with equal neighbours, groups of equal keys
/// reversed, [`OrderScan::reversed_ties`]); at most
/// [`ORDER_SCAN_MAX_DESCENTS`] descents, all recorded, that many + 1 ascending runs; else (or
/// stopped early) `None`.
pub(crate) fn order_of(counts: [u64; SCAN_WORDS]) -> Option<InputOrder> {
    let [descents, ascents, equal, stopped, recorded, _, _] = counts;
    match (descents, ascents, equal, stopped) {
        (_, _, _, 1..) => None,
        (0, _, _, _) => Some(InputOrder::Sorted),
        (_, 0, _, _) => Some(InputOrder::Reversed),
        (d, _, _, _) if d <= ORDER_SCAN_MAX_DESCENTS as u64 && recorded == d => Some(InputOrder::Runs(d as usize + 1)),
        _ => None,
    }
}

/// The distinct keys the counts say every row's key is one of (few distinct keys), if they do:
/// the sample had at most [`DISTINCT_MAX`], and no key lacked from them.
pub(crate) fn distinct_of(counts: [u64; SCAN_WORDS]) -> Option<usize> {
    let (distinct, missing) = (counts[SCAN_DISTINCT] as usize, counts[SCAN_MISSING]);
    ((1..=DISTINCT_MAX).contains(&distinct) && missing == 0).then_some(distinct)
}

/// The rows of each ascending run of `n` rows whose runs start at the rows `starts` (the
/// descents, in any order; row 0 starts the first run).
pub(crate) fn runs_from(mut starts: Vec<u32>, n: usize) -> Vec<usize> {
    starts.sort_unstable();
    let mut runs = Vec::with_capacity(starts.len() + 1);
    let mut at = 0;
    for s in starts.into_iter().map(|s| s as usize).chain([n]) {
        runs.push(s - at);
        at = s;
    }
    runs
}

/// What one scan reports through: the counts on the device, their copy in pinned host memory
/// and the event recorded after the copy. Kept by the [`Gpu`] ([`ScanBufPool`]) and reused, so
/// a scan allocates nothing.
struct ScanBufs {
    counts: CudaSlice<u64>,
    host: PinnedHostSlice<u64>,
    /// The rows of the first descents, on the device and in pinned host memory.
    descents: CudaSlice<u32>,
    host_descents: PinnedHostSlice<u32>,
    /// The sample's distinct keys, ascending (`distinct_sample`).
    dict: CudaSlice<u64>,
    arrived: CudaEvent,
}

/// The [`ScanBufs`] no scan uses now: one per sort that scans at once on the device (usually
/// one), made when first needed.
#[derive(Default)]
pub(crate) struct ScanBufPool(Mutex<Vec<ScanBufs>>);

impl std::fmt::Debug for ScanBufPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let free = self.0.lock().map_or(0, |v| v.len());
        f.debug_struct("ScanBufPool").field("free", &free).finish()
    }
}

impl ScanBufPool {
    /// A free set, or a new one on `gpu`'s stream.
    fn take(&self, gpu: &Gpu) -> Result<ScanBufs> {
        if let Some(b) = self.0.lock().unwrap_or_else(|p| p.into_inner()).pop() {
            return Ok(b);
        }
        Ok(ScanBufs {
            counts: gpu.stream.alloc_zeros::<u64>(SCAN_WORDS)?,
            // SAFETY: the host words are read only after a copy into them has arrived. Plain
            // page-locked memory (flags 0): write-combined memory is slow to read on the host.
            host: unsafe { gpu.context().alloc_pinned_with_flags::<u64>(SCAN_WORDS, 0) }?,
            descents: gpu.stream.alloc_zeros::<u32>(ORDER_SCAN_MAX_DESCENTS)?,
            // SAFETY: as `host`.
            host_descents: unsafe { gpu.context().alloc_pinned_with_flags::<u32>(ORDER_SCAN_MAX_DESCENTS, 0) }?,
            dict: gpu.stream.alloc_zeros::<u64>(DISTINCT_MAX)?,
            // Not a blocking-sync event: the wait spins, no sleep and wake-up on the sort's path.
            arrived: gpu.context().new_event(Some(CUevent_flags::CU_EVENT_DISABLE_TIMING))?,
        })
    }

    /// Returns a set. Work still queued on it is ordered before the next scan's on the stream.
    fn put(&self, bufs: ScanBufs) {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).push(bufs);
    }
}

/// What a sort's passes did: ran, returning the permutation when the row index moved, or
/// stopped before their first kernel because the order scan found the rows sorted or reversed
/// (every lane back in the table as it came).
pub(crate) enum Passes {
    /// The passes ran.
    Ran(Option<CudaSlice<u32>>),
    /// No pass ran: the rows are already in this order.
    Skipped(InputOrder),
}

/// An order scan under way ([`Gpu::start_order_scan`]), or none (scan off, nothing to scan).
pub(crate) struct OrderScan<'a> {
    /// The scan not yet waited for.
    pending: Option<(&'a Gpu, ScanBufs)>,
    /// Each row's rank among the sample's distinct keys, where they were looked for
    /// ([`Self::take_ranks`]).
    ranks: Option<CudaSlice<u32>>,
    /// Rows scanned, and how runs would be merged with the radix passes they save (`None`:
    /// runs are not merged).
    n: usize,
    merge: Option<(MergeMethod, usize)>,
    /// What it found, once settled.
    found: Option<InputOrder>,
    /// The runs found (their rows) and their merge, when the found order is `Runs`.
    runs: Option<(Vec<usize>, MergeMethod)>,
    /// Whether reversed rows had equal neighbours (groups of equal keys to reverse).
    ties: bool,
}

impl OrderScan<'_> {
    /// No scan: it settles to `None` (the passes run).
    pub(crate) fn off() -> Self {
        Self {
            pending: None,
            ranks: None,
            n: 0,
            merge: None,
            found: None,
            runs: None,
            ties: false,
        }
    }

    /// Waits for the scan's counts (the first time; later calls return the same) and returns
    /// the order they show when it lets the sort skip its passes: runs only where their merge
    /// pays against the passes; else few distinct keys, where every key is among the sample's.
    pub(crate) fn settle(&mut self) -> Result<Option<InputOrder>> {
        if let Some((gpu, bufs)) = self.pending.take() {
            bufs.arrived.synchronize()?;
            let mut counts = [0u64; SCAN_WORDS];
            // The copies have arrived (they are before `arrived` on the stream); the slices'
            // own events were never recorded, so reading them does not wait.
            counts.copy_from_slice(&bufs.host.as_slice()?[..SCAN_WORDS]);
            self.found = order_of(counts);
            self.ties = counts[2] > 0;
            if let Some(InputOrder::Runs(k)) = self.found {
                let starts = bufs.host_descents.as_slice()?[..k - 1].to_vec();
                let runs = runs_from(starts, self.n);
                let method = self
                    .merge
                    .and_then(|(method, passes)| merge_pays(&runs, method, passes));
                self.runs = method.map(|m| (runs, m));
                if self.runs.is_none() {
                    self.found = None;
                }
            }
            if self.found.is_none()
                && self.ranks.is_some()
                && let Some(k) = distinct_of(counts)
            {
                self.found = Some(InputOrder::FewDistinct(k));
            }
            if !matches!(self.found, Some(InputOrder::FewDistinct(_))) {
                self.ranks = None;
            }
            gpu.scan_bufs.put(bufs);
        }
        Ok(self.found)
    }

    /// Each row's rank among the few distinct keys [`Self::settle`] found (`FewDistinct`), one
    /// word a row.
    pub(crate) fn take_ranks(&mut self) -> CudaSlice<u32> {
        self.ranks
            .take()
            .expect("ranks are taken only where few distinct keys were found")
    }

    /// The runs found and how to merge them, once [`Self::settle`] found `Runs`.
    pub(crate) fn take_runs(&mut self) -> Option<(Vec<usize>, MergeMethod)> {
        self.runs.take()
    }

    /// Whether the rows [`Self::settle`] found reversed have equal neighbours: non-increasing,
    /// not strictly decreasing ([`Gpu::reverse_groups`]).
    pub(crate) fn reversed_ties(&self) -> bool {
        self.found == Some(InputOrder::Reversed) && self.ties
    }

    /// What [`Self::settle`] found (`None` before it was called).
    pub(crate) fn found(&self) -> Option<InputOrder> {
        self.found
    }
}

impl Drop for OrderScan<'_> {
    fn drop(&mut self) {
        // Never waited for (an error on the way): the next scan's work follows it on the stream.
        if let Some((gpu, bufs)) = self.pending.take() {
            gpu.scan_bufs.put(bufs);
        }
    }
}

/// The device addresses of the key's first and second varying words (`words` of `keys`; 0
/// for a key of one word).
fn distinct_words(keys: &[CudaSlice<u32>], words: &[usize], s: &CudaStream) -> (u64, u64) {
    let hi = keys[words[0]].device_ptr(s).0;
    let lo = words.get(1).map_or(0, |&w| keys[w].device_ptr(s).0);
    (hi, lo)
}

impl Gpu {
    /// Enqueues the scan of the order of `n` rows by the key `words` of `keys` (the words that
    /// vary, most significant first; the others are equal in every row and may be one-word
    /// stand-ins) and returns without waiting: [`OrderScan::settle`] says whether the rows are
    /// sorted, strictly decreasing, or a few ascending runs that `merge` (the method, and the
    /// radix passes the sort would run) merges, or (with `distinct`, a key of at most two
    /// words) their keys are few distinct values.
    /// Random keys stop the scan within a row or two a thread, and the sample in its first
    /// round.
    pub(crate) fn start_order_scan(
        &self,
        keys: &[CudaSlice<u32>],
        words: &[usize],
        n: usize,
        merge: Option<(MergeMethod, usize)>,
        distinct: bool,
    ) -> Result<OrderScan<'_>> {
        let n32 = rows_u32(n)?;
        if n < 2 || words.is_empty() || words.len() > ORDER_SCAN_MAX_WORDS {
            return Ok(OrderScan::off());
        }
        let s = &self.stream;
        let ptrs = ScanWords::of(keys, words, s);
        let kernels = self.kernels()?;
        let ranks = match distinct && words.len() <= 2 {
            true => Some(self.alloc_words(n)?),
            false => None,
        };
        let mut bufs = self.scan_bufs.take(self)?;
        s.memset_zeros(&mut bufs.counts)?;
        let (counts_p, nwords) = (bufs.counts.device_ptr(s).0, words.len() as u32);
        let descents_p = bufs.descents.device_ptr(s).0;
        // SAFETY: `ptrs` holds `nwords` arrays of n words each (key words that vary hold every
        // row); `counts` holds SCAN_WORDS words, `descents` ORDER_SCAN_MAX_DESCENTS.
        let launched = unsafe {
            s.launch_builder(&kernels.order_scan)
                .arg(&n32)
                .arg(&ptrs)
                .arg(&nwords)
                .arg(&counts_p)
                .arg(&descents_p)
                .launch(self.grid_for(n))
        };
        let launched = launched.and_then(|_| match &ranks {
            Some(r) => self.launch_distinct(kernels, keys, words, n32, &bufs, r.device_ptr(s).0),
            None => Ok(()),
        });
        // The copy goes straight to the pinned words (no wait on, nor record of, their own
        // event: `arrived` stands for it).
        let queued = launched
            .and_then(|_| bufs.host.as_mut_slice())
            // SAFETY: `counts` holds SCAN_WORDS words, the host slice as many; it is read only
            // after `arrived`, recorded after the copy, has completed.
            .and_then(|dst| unsafe { cudarc::driver::result::memcpy_dtoh_async(dst, counts_p, s.cu_stream()) })
            .and_then(|_| bufs.host_descents.as_mut_slice())
            // SAFETY: as above, ORDER_SCAN_MAX_DESCENTS words each side (those past the
            // descents recorded are stale and never read).
            .and_then(|dst| unsafe { cudarc::driver::result::memcpy_dtoh_async(dst, descents_p, s.cu_stream()) })
            .and_then(|_| bufs.arrived.record(s));
        if let Err(e) = queued {
            self.scan_bufs.put(bufs);
            return Err(e.into());
        }
        Ok(OrderScan {
            pending: Some((self, bufs)),
            ranks,
            n,
            merge,
            found: None,
            runs: None,
            ties: false,
        })
    }

    /// The sample of the keys' distinct values (`distinct_sample`, one block) into `bufs`'
    /// dictionary, and every key's rank among them (`distinct_ranks`) into `ranks` (n words),
    /// where they are few; whether they are, and any key missing, in `bufs`' counts.
    fn launch_distinct(
        &self,
        kernels: &Kernels,
        keys: &[CudaSlice<u32>],
        words: &[usize],
        n32: u32,
        bufs: &ScanBufs,
        ranks: u64,
    ) -> std::result::Result<(), DriverError> {
        let s = &self.stream;
        let (hi, lo) = distinct_words(keys, words, s);
        let (dict, counts) = (bufs.dict.device_ptr(s).0, bufs.counts.device_ptr(s).0);
        let one = LaunchConfig {
            grid_dim: (1, 1, 1),
            block_dim: (DISTINCT_BLOCK, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: `hi` (and `lo` unless 0) hold n words; `dict` DISTINCT_MAX keys, `counts`
        // SCAN_WORDS words, `ranks` n words.
        unsafe {
            s.launch_builder(&kernels.distinct_sample)
                .arg(&n32)
                .arg(&hi)
                .arg(&lo)
                .arg(&dict)
                .arg(&counts)
                .launch(one)?;
            s.launch_builder(&kernels.distinct_ranks)
                .arg(&n32)
                .arg(&hi)
                .arg(&lo)
                .arg(&dict)
                .arg(&counts)
                .arg(&ranks)
                .launch(self.grid_for(n32 as usize))?;
        }
        Ok(())
    }

    /// Reverses every key word, column and record of `table` in place; returns the permutation
    /// `n - 1 - i` when `want_perm`.
    pub(crate) fn reverse_table(&self, table: &mut DeviceTable, want_perm: bool) -> Result<Option<CudaSlice<u32>>> {
        self.reverse_in_place(table, true)?;
        let (n, s) = (table.num_rows, self.stream.clone());
        if !want_perm {
            return Ok(None);
        }
        let out = self.alloc_words(n)?;
        let (p, n32) = (out.device_ptr(&s).0, rows_u32(n)?);
        // SAFETY: the kernel writes n words of `out`.
        unsafe {
            s.launch_builder(&self.kernels()?.reverse_iota)
                .arg(&n32)
                .arg(&p)
                .launch(self.grid_for(n))?
        };
        Ok(Some(out))
    }

    /// Every key word of `table` reversed in place, and with `payload` every column and record.
    fn reverse_in_place(&self, table: &mut DeviceTable, payload: bool) -> Result<()> {
        let n = table.num_rows;
        let s = self.stream.clone();
        // Words equal in every row may be one-word stand-ins: nothing to reverse there.
        let mut lanes: Vec<(u64, usize)> = vec![];
        for w in table.keys.iter_mut().filter(|w| w.len() >= n) {
            lanes.push((w.device_ptr(&s).0, 4));
        }
        if payload {
            for c in &mut table.columns {
                lanes.push((c.data.device_ptr(&s).0, c.width));
            }
            if let Some(r) = &mut table.records {
                lanes.push((r.data.device_ptr(&s).0, r.bytes));
            }
        }
        for group in lanes.chunks(REVERSE_MAX_LANES) {
            self.reverse_lanes(group, n)?;
        }
        Ok(())
    }

    /// The permutation that sorts `table`'s non-increasing key `words` (those that vary, at
    /// most [`ORDER_SCAN_MAX_WORDS`]) stably: its groups of equal keys reversed, each group's
    /// rows in input order (`reverse_groups`). The key words are reversed in place (equal
    /// within a group, they are then sorted); the payload is the caller's to gather.
    pub(crate) fn reverse_groups(&self, table: &mut DeviceTable, words: &[usize]) -> Result<CudaSlice<u32>> {
        let n = table.num_rows;
        let s = self.stream.clone();
        let ptrs = ScanWords::of(&table.keys, words, &s);
        let perm = self.alloc_words(n)?;
        let (n32, nwords, out) = (rows_u32(n)?, words.len() as u32, perm.device_ptr(&s).0);
        let cfg = LaunchConfig {
            grid_dim: (n.div_ceil(REVERSE_GROUPS_TILE).max(1) as u32, 1, 1),
            block_dim: (REVERSE_GROUPS_BLOCK, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: `ptrs` holds `nwords` (at most ORDER_SCAN_MAX_WORDS) arrays of n words; the
        // kernel writes each of the n words of `perm` once.
        unsafe {
            s.launch_builder(&self.kernels()?.reverse_groups)
                .arg(&n32)
                .arg(&ptrs)
                .arg(&nwords)
                .arg(&out)
                .launch(cfg)?
        };
        self.reverse_in_place(table, false)?;
        Ok(perm)
    }

    /// Rows `i` and `n - 1 - i` swapped in each of `lanes` (at most [`REVERSE_MAX_LANES`]: the
    /// device address of `n` rows and their width in bytes), in one launch.
    fn reverse_lanes(&self, lanes: &[(u64, usize)], n: usize) -> Result<()> {
        let mut table = ReverseLanes {
            data: [0; REVERSE_MAX_LANES],
            width: [0; REVERSE_MAX_LANES],
        };
        for (l, &(data, width)) in lanes.iter().enumerate() {
            table.data[l] = data;
            table.width[l] = width as u32;
        }
        let n32 = rows_u32(n)?;
        let mut cfg = self.grid_for((n / 2).div_ceil(REVERSE_ITEMS));
        cfg.grid_dim.1 = lanes.len() as u32;
        // SAFETY: each lane's address holds n rows of its width (a table's buffer); the kernel
        // touches only those, each row by one thread.
        unsafe {
            self.stream
                .launch_builder(&self.kernels()?.reverse_lanes)
                .arg(&n32)
                .arg(&table)
                .launch(cfg)?
        };
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_say_sorted_reversed_runs_or_neither() {
        // [descents, ascents, equal neighbours, stopped, descents recorded]
        assert_eq!(order_of([0, 9, 0, 0, 0, 0, 0]), Some(InputOrder::Sorted));
        assert_eq!(order_of([0, 4, 5, 0, 0, 0, 0]), Some(InputOrder::Sorted));
        assert_eq!(order_of([0, 0, 9, 0, 0, 0, 0]), Some(InputOrder::Sorted), "all equal");
        assert_eq!(order_of([9, 0, 0, 0, 9, 0, 0]), Some(InputOrder::Reversed));
        assert_eq!(order_of([80, 0, 0, 0, 70, 0, 0]), Some(InputOrder::Reversed));
        assert_eq!(
            order_of([8, 0, 1, 0, 8, 0, 0]),
            Some(InputOrder::Reversed),
            "non-increasing, with a tie: its groups reversed"
        );
        assert_eq!(order_of([80, 0, 900, 0, 63, 0, 0]), Some(InputOrder::Reversed));
        assert_eq!(order_of([3, 6, 0, 0, 3, 0, 0]), Some(InputOrder::Runs(4)));
        let most = ORDER_SCAN_MAX_DESCENTS as u64;
        assert_eq!(
            order_of([most, 6, 0, 0, most, 0, 0]),
            Some(InputOrder::Runs(most as usize + 1))
        );
        assert_eq!(order_of([most + 1, 6, 0, 0, most + 1, 0, 0]), None, "too many runs");
        assert_eq!(order_of([3, 6, 0, 0, 2, 0, 0]), None, "a descent not recorded");
        assert_eq!(order_of([0, 0, 0, 1, 0, 0, 0]), None, "stopped early");
        assert_eq!(order_of([9, 0, 0, 1, 70, 0, 0]), None, "stopped early");
    }

    #[test]
    fn runs_start_at_the_descents() {
        assert_eq!(runs_from(vec![], 5), vec![5]);
        assert_eq!(runs_from(vec![3], 5), vec![3, 2]);
        assert_eq!(runs_from(vec![4, 1, 2], 6), vec![1, 1, 2, 2]);
    }
}
