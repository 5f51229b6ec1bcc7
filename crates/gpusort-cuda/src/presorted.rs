//! Presorted input on the device (`kernels/presorted.cu`): one read of the key before the
//! radix passes says whether the rows are already in order or strictly in reverse order, and
//! such a sort then skips its passes — nothing moves for sorted input; for reversed input every
//! key word, column and record is reversed in place and the permutation is `n - 1 - i`.
//! Bandyopadhyay & Sahni's sorts (ICPADS 2011, sections V and VI) run every pass whatever the
//! order; this check costs one read of the key words. Reversed input with equal neighbours,
//! a few sorted runs and few distinct keys take the radix passes on the device (the CPU
//! backend finishes those shapes too, see `gpusort::cpu`).

use cudarc::driver::{CudaSlice, DevicePtr, DeviceRepr, PushKernelArg};
use gpusort::plan::InputOrder;

use crate::error::Result;
use crate::gpu::{Gpu, rows_u32};
use crate::kernels::ORDER_SCAN_MAX_WORDS;
use crate::table::DeviceTable;

/// The device addresses of the key words `order_scan` compares, passed by value (`ScanWords`).
#[repr(C)]
struct ScanWords([u64; ORDER_SCAN_MAX_WORDS]);

// SAFETY: a plain array of device addresses, laid out as the kernel's struct of 8 pointers.
unsafe impl DeviceRepr for ScanWords {}

impl Gpu {
    /// The order of `n` rows by the key `words` of `keys` (the words that vary, most
    /// significant first; the others are equal in every row and may be one-word stand-ins)
    /// when it lets a sort skip its passes: sorted, or strictly decreasing (reversed).
    /// Synchronizes the stream to read four counts; random keys stop the scan within a row or
    /// two a thread.
    pub(crate) fn input_order(&self, keys: &[CudaSlice<u32>], words: &[usize], n: usize) -> Result<Option<InputOrder>> {
        let n32 = rows_u32(n)?;
        if n < 2 || words.is_empty() || words.len() > ORDER_SCAN_MAX_WORDS {
            return Ok(None);
        }
        let s = &self.stream;
        let mut ptrs = ScanWords([0; ORDER_SCAN_MAX_WORDS]);
        for (p, &w) in ptrs.0.iter_mut().zip(words) {
            *p = keys[w].device_ptr(s).0;
        }
        let counts = s.alloc_zeros::<u64>(4)?;
        let (counts_p, nwords) = (counts.device_ptr(s).0, words.len() as u32);
        // SAFETY: `ptrs` holds `nwords` arrays of n words each (key words that vary hold every
        // row); `counts` holds 4 words.
        unsafe {
            s.launch_builder(&self.kernels()?.order_scan)
                .arg(&n32)
                .arg(&ptrs)
                .arg(&nwords)
                .arg(&counts_p)
                .launch(self.grid_for(n))?
        };
        let c = s.clone_dtoh(&counts)?;
        let (descents, ascents, equal, unordered) = (c[0], c[1], c[2], c[3]);
        Ok(match (descents, ascents, equal, unordered) {
            (_, _, _, 1..) => None,
            (0, _, _, _) => Some(InputOrder::Sorted),
            (_, 0, 0, _) => Some(InputOrder::Reversed),
            _ => None,
        })
    }

    /// Reverses every key word, column and record of `table` in place; returns the permutation
    /// `n - 1 - i` when `want_perm`.
    pub(crate) fn reverse_table(&self, table: &mut DeviceTable, want_perm: bool) -> Result<Option<CudaSlice<u32>>> {
        let n = table.num_rows;
        let s = self.stream.clone();
        // Words equal in every row may be one-word stand-ins: nothing to reverse there.
        for w in table.keys.iter_mut().filter(|w| w.len() >= n) {
            let p = w.device_ptr(&s).0;
            self.reverse_rows(p, n, 4)?;
        }
        for c in &mut table.columns {
            let p = c.data.device_ptr(&s).0;
            self.reverse_rows(p, n, c.width)?;
        }
        if let Some(r) = &mut table.records {
            let p = r.data.device_ptr(&s).0;
            self.reverse_rows(p, n, r.bytes)?;
        }
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

    /// Rows `i` and `n - 1 - i` of the `width`-byte rows at device address `data` swapped.
    fn reverse_rows(&self, data: u64, n: usize, width: usize) -> Result<()> {
        let (n32, w32) = (rows_u32(n)?, width as u32);
        // SAFETY: `data` holds n rows of `width` bytes (a table's buffer); the kernel touches
        // only those.
        unsafe {
            self.stream
                .launch_builder(&self.kernels()?.reverse_rows)
                .arg(&data)
                .arg(&n32)
                .arg(&w32)
                .launch(self.grid_for(n / 2))?
        };
        Ok(())
    }
}
