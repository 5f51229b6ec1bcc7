//! The interface every sorter implements: Arrow columns in, sorted Arrow columns out.

use std::time::Duration;

use arrow::array::{RecordBatch, UInt32Array};

use crate::error::{GpusortError, Result};
use crate::keys::EncoderOptions;
use crate::plan::{InputOrder, Layout, Strategy, payload_fields};
use crate::spec::SortSpec;

/// A sort to run: a batch, what to sort it by, and how.
#[derive(Debug, Clone)]
pub struct SortRequest<'a> {
    /// The rows (every column is moved; the sort columns are named by `spec`).
    pub batch: &'a RecordBatch,
    /// What to sort by.
    pub spec: &'a SortSpec,
    /// The strategy to use; `None` lets the backend's planner choose.
    pub strategy: Option<Strategy>,
    /// Keep only the first `limit` rows of the result (SQL `LIMIT`).
    pub limit: Option<usize>,
    /// Key encoding options.
    pub encoder: EncoderOptions,
}

impl<'a> SortRequest<'a> {
    /// Sorts all of `batch` by `spec` with the planner's strategy.
    pub fn new(batch: &'a RecordBatch, spec: &'a SortSpec) -> Self {
        Self {
            batch,
            spec,
            strategy: None,
            limit: None,
            encoder: EncoderOptions::default(),
        }
    }

    /// Uses `strategy` instead of the planner's choice.
    pub fn with_strategy(mut self, strategy: Option<Strategy>) -> Self {
        self.strategy = strategy;
        self
    }

    /// Keeps the first `limit` rows.
    pub fn with_limit(mut self, limit: Option<usize>) -> Self {
        self.limit = limit;
        self
    }

    /// Uses these key encoding options.
    pub fn with_encoder_options(mut self, encoder: EncoderOptions) -> Self {
        self.encoder = encoder;
        self
    }

    /// The strategy to run: the request's, else the calibrated rule for the ByField layout (the
    /// layout Arrow batches have).
    pub fn strategy(&self) -> Strategy {
        planned_strategy(self.strategy, self.batch.num_columns(), self.spec.len())
    }

    /// Fails when the batch has more rows than a sort's 32-bit row indices can name.
    pub fn check_rows(&self) -> Result<()> {
        check_rows(self.batch.num_rows())
    }
}

/// Fails when `rows` are more than a sort's 32-bit row indices can name.
pub fn check_rows(rows: usize) -> Result<()> {
    if rows > u32::MAX as usize {
        return Err(GpusortError::TooManyRows {
            rows,
            max: u32::MAX as usize,
        });
    }
    Ok(())
}

/// The strategy a sort of `num_columns` columns by `sort_keys` keys runs: `requested`, else
/// the rule calibrated on the H100 for the ByField layout (the layout Arrow batches have;
/// [`Strategy::calibrated_default`]; the paper's own rule is [`Strategy::paper_default`]).
pub fn planned_strategy(requested: Option<Strategy>, num_columns: usize, sort_keys: usize) -> Strategy {
    requested.unwrap_or_else(|| Strategy::calibrated_default(Layout::ByField, payload_fields(num_columns, sort_keys)))
}

/// What a sort did and where its time went.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SortStats {
    /// The strategy that ran.
    pub strategy: Option<Strategy>,
    /// Rows sorted.
    pub rows: usize,
    /// Bits of the encoded key.
    pub key_bits: u32,
    /// Radix passes run (constant digits skipped).
    pub passes: usize,
    /// The presorted shape of the input that replaced the radix passes, if any.
    pub input_order: Option<InputOrder>,
    /// Sorted runs merged instead of the radix passes (a device backend told that its rows
    /// are sorted runs: an external sort's merge step); 0 when the passes ran.
    pub merged_runs: usize,
    /// Groups of rows with tied truncated keys, ordered past the prefix afterwards.
    pub tie_groups: usize,
    /// Of the tie groups, those ordered on the device (the GPU backend, by their bytes past the
    /// prefix, `gpusort_cuda` `ties`).
    pub device_tie_groups: usize,
    /// Columns moved in every pass (direct strategy).
    pub moved_columns: usize,
    /// Columns gathered through the permutation at the end.
    pub gathered_columns: usize,
    /// Of the gathered columns, those gathered on the host (all of them on the CPU backend;
    /// var-width and nested columns on a device backend).
    pub host_gathered_columns: usize,
    /// Time spent concatenating input batches on the host (a device backend's streaming sort
    /// concatenates only the sort key columns).
    pub concat_time: Duration,
    /// Time spent encoding keys.
    pub encode_time: Duration,
    /// Whether a device backend encoded the key on the device (from its native and view
    /// columns there) rather than on the host.
    pub keys_on_device: bool,
    /// Time spent copying input into pinned staging memory on the host (device backends; it
    /// overlaps the input's arrival and the uploads).
    pub stage_time: Duration,
    /// Time host-to-device copies kept the copy engine busy (device backends, from device
    /// events).
    pub upload_time: Duration,
    /// Time spent in the radix passes (and tie resolution; on a device backend, from the
    /// end of the input to the permutation on the host).
    pub sort_time: Duration,
    /// Time device-to-host copies of the sorted columns took (device backends, from device
    /// events; device gathers of the indirect strategy included).
    pub download_time: Duration,
    /// Time spent building the output columns (host gathers included).
    pub gather_time: Duration,
    /// Time a device backend's sort waited for device memory other sorts of the process held
    /// and for the device itself (one sort's device phase at a time).
    pub device_wait: Duration,
    /// Time the device spent in sort kernels (device backends), from device events.
    pub device_time: Option<Duration>,
    /// Bytes copied from host to device.
    pub bytes_to_device: u64,
    /// Of `bytes_to_device`, those a device backend copied from where they lay in pinned host
    /// memory instead of staging them first.
    pub bytes_in_place: u64,
    /// Bytes copied from device to host.
    pub bytes_from_device: u64,
    /// Key ranges the sort was split into, each sorted by a sorter of its own
    /// ([`crate::split`]); 0 for a sort on one sorter.
    pub split_ranges: usize,
}

/// A sorted batch.
#[derive(Debug, Clone)]
pub struct SortOutput {
    /// The sorted rows (at most `limit` of them).
    pub batch: RecordBatch,
    /// The permutation: output row `i` is input row `indices[i]`.
    pub indices: UInt32Array,
    /// What happened.
    pub stats: SortStats,
}

/// A sorter of Arrow record batches. Results are **stable**: rows with equal sort values
/// keep their input order, so every backend returns the same rows in the same order.
pub trait SortBackend: Send + Sync + std::fmt::Debug {
    /// A short name for plans and metrics (`cpu`, `cuda:0`).
    fn name(&self) -> String;

    /// Sorts `request.batch`.
    fn sort(&self, request: &SortRequest<'_>) -> Result<SortOutput>;
}
