//! Sort keys encoded on the device from the sort columns a sort has uploaded anyway
//! (`kernels/keys.cu`), for keys whose columns are all native integers or floats
//! ([`native_ordinal_kind`](gpusort::keys::native_ordinal_kind)) or string and binary views
//! whose data buffers are on the device too.
//!
//! The host encoder ([`gpusort::KeyEncoder`]) needs the whole column on the host: a
//! concatenation of the batches, a pass for the bounds, a pass to write the words, and the
//! words' upload. On the device the same key takes two passes over columns that are already
//! there, and nothing crosses PCIe but a few numbers:
//!
//! 1. [`Gpu::native_key_stats`]: each native sort column's bounds (minimum and maximum
//!    ordinal of its valid rows) and valid row count; a view column's common prefix and
//!    lengths come from the host, which holds the views ([`gpusort::keys::bytes_column_stats`]).
//!    From them the host lays the key out exactly as its own encoder would
//!    ([`KeyLayout::from_column_stats`]);
//! 2. [`Gpu::encode_device_keys`]: every key word of every row, which bits vary (what the
//!    radix passes are planned by) and what the words that do not vary hold.
//!
//! The words are bit for bit those of the host encoder, so both backends sort the same keys.

use cudarc::driver::{CudaSlice, DevicePtr, PushKernelArg};
use gpusort::keys::{FieldEncoding, KeyLayout, NativeColumnStats, OrdinalKind};

use crate::error::{CudaSortError, Result};
use crate::gpu::{Gpu, rows_u32};

pub use crate::kernels::KEY_MAX_WORDS;
use crate::kernels::{KIND_FLOAT, KIND_SIGNED, KIND_UNSIGNED, KIND_VIEW};

/// A sort column on the device: its values and, when it has nulls, its validity bits (row 0
/// at bit 0).
#[derive(Debug, Clone, Copy)]
pub struct DeviceKeyColumn<'a> {
    /// `n` values of the kind's width (views: 16 bytes).
    pub values: &'a CudaSlice<u8>,
    /// The validity bitmap, or `None` when every row is valid.
    pub valid: Option<&'a CudaSlice<u8>>,
    /// What the values are.
    pub kind: DeviceKeyKind<'a>,
}

/// What a sort column on the device holds.
#[derive(Debug, Clone, Copy)]
pub enum DeviceKeyKind<'a> {
    /// Native values, and how they map to ordinals: unsigned, signed or float, 1 to 8 bytes.
    Ordinal(OrdinalKind),
    /// String or binary views (Arrow's layout: a value of up to 12 bytes inline, else its
    /// length, first 4 bytes, data buffer and offset), and the device addresses of the data
    /// buffers the views index.
    Views(&'a CudaSlice<u64>),
}

/// Keys encoded on the device ([`Gpu::encode_device_keys`]).
#[derive(Debug)]
pub struct DeviceEncodedKeys {
    /// Each key word of every row, word 0 most significant.
    pub words: Vec<CudaSlice<u32>>,
    /// Each word's bits that vary between rows.
    pub varying: Vec<u32>,
    /// Each word's bits that every row has set (a word that does not vary: its value).
    pub common: Vec<u32>,
}

/// keys.cu's kind codes and the value width of a native kind.
fn kind_code(kind: OrdinalKind) -> Result<(u32, u32)> {
    match kind {
        OrdinalKind::Unsigned(w) => Ok((KIND_UNSIGNED, w as u32)),
        OrdinalKind::Signed(w) => Ok((KIND_SIGNED, w as u32)),
        OrdinalKind::Float(w) => Ok((KIND_FLOAT, w as u32)),
        other => Err(CudaSortError::Unsupported(format!(
            "device key encoding of {other:?} values"
        ))),
    }
    .and_then(|(code, w)| match w {
        1 | 2 | 4 | 8 => Ok((code, w)),
        _ => Err(CudaSortError::Unsupported(format!(
            "device key encoding of {w}-byte values"
        ))),
    })
}

impl Gpu {
    /// The statistics of `columns` (each of `n` rows) a key layout needs, in one launch per
    /// column and one synchronization.
    pub fn native_key_stats(&self, columns: &[DeviceKeyColumn<'_>], n: usize) -> Result<Vec<NativeColumnStats>> {
        if columns.is_empty() {
            return Ok(vec![]);
        }
        let s = self.stream();
        let init: Vec<u64> = columns.iter().flat_map(|_| [u64::MAX, 0, 0]).collect();
        let out = s.clone_htod(&init)?;
        let base = out.device_ptr(s).0;
        let n32 = rows_u32(n)?;
        for (i, c) in columns.iter().enumerate() {
            let DeviceKeyKind::Ordinal(ordinal) = c.kind else {
                return Err(CudaSortError::Unsupported(
                    "bounds of a view column on the device".into(),
                ));
            };
            let (kind, width) = kind_code(ordinal)?;
            check_len(c, n, width)?;
            let values = c.values.device_ptr(s).0;
            let valid = c.valid.map_or(0, |v| v.device_ptr(s).0);
            let dst = base + (24 * i) as u64;
            // SAFETY: `values` holds n values of `width` bytes and `valid` n bits (checked
            // above); `dst` is this column's three words of `out`.
            unsafe {
                s.launch_builder(&self.kernels()?.key_bounds)
                    .arg(&n32)
                    .arg(&values)
                    .arg(&valid)
                    .arg(&width)
                    .arg(&kind)
                    .arg(&dst)
                    .launch(self.grid_for(n))?
            };
        }
        let host = s.clone_dtoh(&out)?;
        Ok(columns
            .iter()
            .zip(host.chunks(3))
            .map(|(c, v)| NativeColumnStats {
                kind: match c.kind {
                    DeviceKeyKind::Ordinal(k) => k,
                    DeviceKeyKind::Views(_) => unreachable!("refused above"),
                },
                rows: n,
                valid_rows: v[2] as usize,
                bounds: (v[2] > 0).then_some((v[0], v[1])),
            })
            .collect())
    }

    /// The key words of `n` rows of `columns` (one per field of `layout`, in its order), each
    /// a device array of `n` words, word 0 most significant, and for each word the bits that
    /// vary between rows and those every row sets. `layout` comes from
    /// [`KeyLayout::from_column_stats`] over the statistics of the same columns.
    pub fn encode_device_keys(
        &self,
        columns: &[DeviceKeyColumn<'_>],
        layout: &KeyLayout,
        n: usize,
    ) -> Result<DeviceEncodedKeys> {
        let n32 = rows_u32(n)?;
        let num_words = layout.num_words();
        if num_words > KEY_MAX_WORDS {
            return Err(CudaSortError::Unsupported(format!(
                "device key encoding of {num_words} key words (at most {KEY_MAX_WORDS})"
            )));
        }
        if columns.len() != layout.fields().len() {
            return Err(CudaSortError::Unsupported(format!(
                "{} columns for {} key fields",
                columns.len(),
                layout.fields().len()
            )));
        }
        let s = self.stream();
        let words: Vec<CudaSlice<u32>> = (0..num_words).map(|_| self.alloc_words(n)).collect::<Result<_>>()?;
        if num_words == 0 || n == 0 {
            return Ok(DeviceEncodedKeys {
                words,
                varying: vec![0; num_words],
                common: vec![0; num_words],
            });
        }
        // keys.cu's KeyFieldDesc, 8 words per field.
        let mut desc: Vec<u64> = Vec::with_capacity(8 * columns.len());
        for (c, f) in columns.iter().zip(layout.fields()) {
            let (values, valid) = (c.values.device_ptr(s).0, c.valid.map_or(0, |v| v.device_ptr(s).0));
            let pos = layout.pad() + f.pos;
            let (kind, width, min, max, len_base) = match (c.kind, &f.encoding) {
                (DeviceKeyKind::Ordinal(ordinal), FieldEncoding::Ordinal { min, max, .. }) => {
                    let (kind, width) = kind_code(ordinal)?;
                    (kind, width, min.lo as u64, max.lo as u64, 0)
                }
                (DeviceKeyKind::Ordinal(ordinal), FieldEncoding::Constant) => {
                    let (kind, width) = kind_code(ordinal)?;
                    (kind, width, 0, 0, 0)
                }
                (
                    DeviceKeyKind::Views(buffers),
                    FieldEncoding::Bytes {
                        common_prefix,
                        prefix_bytes,
                        len_min,
                        len_max,
                    },
                ) => {
                    let base = if f.options.descending { *len_max } else { *len_min };
                    let shape = *common_prefix as u64 | ((*prefix_bytes as u64) << 32);
                    (KIND_VIEW, 16, buffers.device_ptr(s).0, shape, base)
                }
                (DeviceKeyKind::Views(_), FieldEncoding::Constant) => (KIND_VIEW, 16, 0, 0, 0),
                (_, other) => {
                    return Err(CudaSortError::Unsupported(format!("device key encoding of {other:?}")));
                }
            };
            check_len(c, n, width)?;
            desc.extend([
                values,
                valid,
                min,
                max,
                width as u64 | ((kind as u64) << 32),
                pos as u64 | ((f.null_bits as u64) << 32),
                f.value_bits as u64 | ((f.options.nulls_first as u64) << 32),
                f.options.descending as u64 | ((len_base as u64) << 32),
            ]);
        }
        let desc_dev = s.clone_htod(&desc)?;
        let word_ptrs: Vec<u64> = words.iter().map(|w| w.device_ptr(s).0).collect();
        let ptrs_dev = s.clone_htod(&word_ptrs)?;
        let init: Vec<u32> = (0..num_words).flat_map(|_| [0, u32::MAX]).collect();
        let varying_dev = s.clone_htod(&init)?;
        let (desc_p, ptrs_p, var_p) = (
            desc_dev.device_ptr(s).0,
            ptrs_dev.device_ptr(s).0,
            varying_dev.device_ptr(s).0,
        );
        let (nfields, nwords) = (columns.len() as u32, num_words as u32);
        // SAFETY: every field's column holds n values (and bits), checked above; `ptrs` lists
        // `nwords` arrays of n words; `varying` holds 2 * nwords words.
        unsafe {
            s.launch_builder(&self.kernels()?.encode_keys)
                .arg(&n32)
                .arg(&desc_p)
                .arg(&nfields)
                .arg(&ptrs_p)
                .arg(&nwords)
                .arg(&var_p)
                .launch(self.grid_for(n))?
        };
        // Synchronizes: the tables above outlive the kernel.
        let host = s.clone_dtoh(&varying_dev)?;
        Ok(DeviceEncodedKeys {
            words,
            varying: host.chunks(2).map(|oa| oa[0] & !oa[1]).collect(),
            common: host.chunks(2).map(|oa| oa[1]).collect(),
        })
    }
}

/// Fails unless `column` holds `n` values of `width` bytes (and `n` validity bits).
fn check_len(column: &DeviceKeyColumn<'_>, n: usize, width: u32) -> Result<()> {
    let short = column.values.len() < n * width as usize || column.valid.is_some_and(|v| v.len() < n.div_ceil(8));
    match short {
        true => Err(CudaSortError::Unsupported(format!(
            "a key column shorter than {n} rows of {width} bytes"
        ))),
        false => Ok(()),
    }
}
