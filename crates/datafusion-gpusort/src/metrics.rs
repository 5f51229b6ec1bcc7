//! What `EXPLAIN ANALYZE` shows of a `GpuSortExec`: rows, the path and strategy that ran, the
//! CPU fallback reason, GPU kernel time and the bytes that crossed PCIe.

use std::any::Any;
use std::collections::BTreeSet;
use std::fmt;
use std::sync::{Arc, Mutex};

use datafusion::common::format::MetricType;
use datafusion::physical_plan::metrics::{
    BaselineMetrics, Count, CustomMetricValue, ExecutionPlanMetricsSet, Gauge, MetricBuilder, MetricValue,
    SpillMetrics, Time,
};
use gpusort::SortStats;

/// A metric whose value is a set of short texts (the strategies that ran, fallback reasons);
/// partitions' values merge into their union.
#[derive(Debug, Default)]
pub struct TextMetric(Mutex<BTreeSet<String>>);

impl TextMetric {
    /// Adds `text` to the set.
    pub fn add(&self, text: impl Into<String>) {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).insert(text.into());
    }

    /// The texts, sorted.
    pub fn values(&self) -> Vec<String> {
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .cloned()
            .collect()
    }
}

impl fmt::Display for TextMetric {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let v = self.values();
        if v.is_empty() {
            f.write_str("none")
        } else {
            f.write_str(&v.join("; "))
        }
    }
}

impl CustomMetricValue for TextMetric {
    fn new_empty(&self) -> Arc<dyn CustomMetricValue> {
        Arc::new(TextMetric::default())
    }

    fn aggregate(&self, other: Arc<dyn CustomMetricValue + 'static>) {
        if let Some(other) = other.as_any().downcast_ref::<TextMetric>() {
            for v in other.values() {
                self.add(v);
            }
        }
    }

    fn as_any(&self) -> &dyn Any {
        self
    }

    fn is_eq(&self, other: &Arc<dyn CustomMetricValue>) -> bool {
        other
            .as_any()
            .downcast_ref::<TextMetric>()
            .is_some_and(|o| o.values() == self.values())
    }
}

/// The metrics of one partition of a `GpuSortExec`.
#[derive(Debug, Clone)]
pub struct GpuSortMetrics {
    /// Output rows and elapsed compute.
    pub baseline: BaselineMetrics,
    /// Memory of the output batches, where the operator counts it itself
    /// ([`GpuSortMetrics::record_output_slice`]); shown as `output_bytes` with the baseline's.
    pub output_bytes: Count,
    /// Sorts that ran on the GPU.
    pub gpu_sorts: Count,
    /// Sorts that ran on the CPU backend.
    pub cpu_sorts: Count,
    /// Where and how the sorts ran, e.g. `gpu cuda:0 grs-direct` or `cpu srts-indirect`.
    pub path: Arc<TextMetric>,
    /// Why a sort ran on the CPU instead of the GPU.
    pub cpu_fallback: Arc<TextMetric>,
    /// Time the GPU spent in sort and gather kernels.
    pub kernel_time: Time,
    /// Time GPU sorts waited for device memory other sorts of the process held (the device
    /// memory budget) and for the device (one sort's device phase at a time).
    pub device_wait: Time,
    /// Time spent taking input batches in (reserving memory, handing them to the GPU session).
    pub input_time: Time,
    /// Time spent copying input into pinned staging memory (GPU path; overlaps the input).
    pub stage_time: Time,
    /// Time host-to-device copies kept the copy engine busy (GPU path; overlaps the input).
    pub upload_time: Time,
    /// Time spent concatenating batches on the host (on the GPU path, the key columns only).
    pub concat_time: Time,
    /// Time spent encoding sort keys.
    pub encode_time: Time,
    /// Time spent in the radix passes (on the GPU path: from the end of the input to the
    /// permutation on the host, kernels included).
    pub sort_time: Time,
    /// Time device-to-host copies of the sorted columns took (GPU path).
    pub download_time: Time,
    /// Time spent building the sorted output columns (host gathers included).
    pub gather_time: Time,
    /// Time spent cutting the sorted rows into output batches.
    pub output_time: Time,
    /// Bytes copied host -> device.
    pub bytes_to_device: Count,
    /// Bytes copied device -> host.
    pub bytes_from_device: Count,
    /// Columns moved or gathered on the GPU.
    pub device_columns: Count,
    /// GPU sorts whose key the device encoded from the sort columns it held (the others'
    /// keys were encoded on the host and uploaded).
    pub device_key_sorts: Count,
    /// Columns gathered on the host through the permutation (var-width and nested columns,
    /// and everything on the CPU path).
    pub host_gathered_columns: Count,
    /// Ranges of sorted rows brought down from the device one after another: while the
    /// consumer took the earlier ones, or, for an external sort's runs and merge steps, each
    /// into pinned blocks of its own (0 when the sorted rows came down whole).
    pub device_ranges: Count,
    /// Times the buffered input of a `LIMIT` sort was cut down to its best rows.
    pub topk_compactions: Count,
    /// Sorted runs made by the external sort (0 when the input was sorted in one piece).
    pub runs: Count,
    /// Of those, runs cut because the next batch would pass the run size (what one GPU sort
    /// holds within its memory budget, or `gpusort.max_run_rows`); the others were cut because
    /// the memory pool ran short.
    pub budget_runs: Count,
    /// Input files read and decoded on the GPU by the sort itself ([`DeviceScan`](crate::DeviceScan)).
    pub device_scan_files: Count,
    /// Rows those files held.
    pub device_scan_rows: Count,
    /// When the last of them joined the GPU session: nanoseconds since the Unix epoch (the
    /// end of the sort's reading, as a scan's `end_timestamp` is).
    pub device_scan_end_ns: Gauge,
    /// Sorts given a device scan that executed their input instead (the device could not
    /// read the files, or sort their rows; the timeline says why).
    pub device_scan_fallbacks: Count,
    /// Merges of some runs into one spilled run, when there were more runs than the merge
    /// could read at once.
    pub intermediate_merges: Count,
    /// Levels of intermediate merges (each merges groups of runs into fewer, longer runs; see
    /// the multi-level merge's bound on the spill volume).
    pub merge_levels: Count,
    /// Steps of the final merge by key ranges (each a sort of one key range of all runs); 0
    /// when the row-by-row heap merge ran instead (too little memory for a step).
    pub range_merge_steps: Count,
    /// Of those steps, the ones whose runs the GPU merged (`merge.cu`) instead of sorting
    /// their rows.
    pub gpu_merged_steps: Count,
    /// Of those steps, the ones emitted as they are, with no sort: the runs' shares did not
    /// overlap (runs of disjoint key ranges, as presorted or reversed input makes them), or
    /// the step's rows were all equal.
    pub in_order_steps: Count,
    /// Of those steps, the ones that sent only their key columns to the GPU and gathered
    /// their rows on the host through the permutation it sent back
    /// (`gpusort.merge_keys_only`).
    pub gpu_key_steps: Count,
    /// Time spent writing runs to disk (sorting them is in `sort_time`).
    pub spill_time: Time,
    /// Time spent merging runs (the final merge is also in `elapsed_compute`).
    pub merge_time: Time,
    /// Spill files, bytes and rows written (DataFusion's `spill_count`, `spilled_bytes`,
    /// `spilled_rows`).
    pub spill: SpillMetrics,
}

impl GpuSortMetrics {
    /// Registers the metrics of `partition` in `set`.
    pub fn new(set: &ExecutionPlanMetricsSet, partition: usize) -> Self {
        let summary = || MetricBuilder::new(set).with_type(MetricType::Summary);
        let dev = || MetricBuilder::new(set);
        let text = |name: &'static str| {
            let value = Arc::new(TextMetric::default());
            summary().with_partition(partition).build(MetricValue::Custom {
                name: name.into(),
                value: value.clone(),
            });
            value
        };
        Self {
            baseline: BaselineMetrics::new(set, partition),
            output_bytes: summary().output_bytes(partition),
            gpu_sorts: summary().counter("gpu_sorts", partition),
            cpu_sorts: summary().counter("cpu_sorts", partition),
            path: text("path"),
            cpu_fallback: text("cpu_fallback"),
            kernel_time: summary().subset_time("gpu_kernel_time", partition),
            device_wait: summary().subset_time("gpu_wait_time", partition),
            input_time: dev().subset_time("input_time", partition),
            stage_time: dev().subset_time("stage_time", partition),
            upload_time: dev().subset_time("upload_time", partition),
            concat_time: dev().subset_time("concat_time", partition),
            encode_time: dev().subset_time("encode_time", partition),
            sort_time: dev().subset_time("sort_time", partition),
            download_time: dev().subset_time("download_time", partition),
            gather_time: dev().subset_time("gather_time", partition),
            output_time: dev().subset_time("output_time", partition),
            bytes_to_device: summary().counter("bytes_to_device", partition),
            bytes_from_device: summary().counter("bytes_from_device", partition),
            device_columns: dev().counter("device_columns", partition),
            device_key_sorts: dev().counter("device_key_sorts", partition),
            host_gathered_columns: dev().counter("host_gathered_columns", partition),
            device_ranges: dev().counter("device_ranges", partition),
            topk_compactions: dev().counter("topk_compactions", partition),
            runs: summary().counter("runs", partition),
            budget_runs: dev().counter("budget_runs", partition),
            device_scan_files: dev().counter("device_scan_files", partition),
            device_scan_rows: dev().counter("device_scan_rows", partition),
            device_scan_end_ns: dev().gauge("device_scan_end_ns", partition),
            device_scan_fallbacks: dev().counter("device_scan_fallbacks", partition),
            intermediate_merges: dev().counter("intermediate_merges", partition),
            merge_levels: dev().counter("merge_levels", partition),
            range_merge_steps: dev().counter("range_merge_steps", partition),
            gpu_merged_steps: dev().counter("gpu_merged_steps", partition),
            gpu_key_steps: dev().counter("gpu_key_steps", partition),
            in_order_steps: dev().counter("in_order_steps", partition),
            spill_time: dev().subset_time("spill_time", partition),
            merge_time: summary().subset_time("merge_time", partition),
            spill: SpillMetrics::new(set, partition),
        }
    }

    /// Records an output batch of `rows` rows that is a slice of a sorted batch of `of_rows`
    /// rows holding `of_bytes`: DataFusion's `record_output` would walk every column of every
    /// slice and count the whole shared buffers each time (apache/datafusion#16841); slices of
    /// one sorted batch count their share of its bytes instead, which sums to its size.
    pub fn record_output_slice(&self, rows: usize, of_rows: usize, of_bytes: usize) {
        self.baseline.record_output(rows);
        self.baseline.output_batches().add(1);
        self.output_bytes
            .add((of_bytes as u128 * rows as u128 / of_rows.max(1) as u128) as usize);
    }

    /// Records what one sort did.
    pub fn record(&self, stats: &SortStats, gpu: Option<&str>) {
        let strategy = stats.strategy.map(|s| s.to_string()).unwrap_or_else(|| "-".into());
        match gpu {
            Some(device) => {
                self.gpu_sorts.add(1);
                self.path.add(format!("gpu {device} {strategy}"));
                let on_device = stats.moved_columns + stats.gathered_columns - stats.host_gathered_columns;
                self.device_columns.add(on_device);
                if stats.keys_on_device {
                    self.device_key_sorts.add(1);
                }
                self.host_gathered_columns.add(stats.host_gathered_columns);
            }
            None => {
                self.cpu_sorts.add(1);
                self.path.add(format!("cpu {strategy}"));
                self.host_gathered_columns.add(stats.host_gathered_columns);
            }
        }
        if let Some(t) = stats.device_time {
            self.kernel_time.add_duration(t);
        }
        if stats.merged_runs > 0 {
            self.gpu_merged_steps.add(1);
        }
        self.device_wait.add_duration(stats.device_wait);
        self.stage_time.add_duration(stats.stage_time);
        self.upload_time.add_duration(stats.upload_time);
        self.concat_time.add_duration(stats.concat_time);
        self.encode_time.add_duration(stats.encode_time);
        self.sort_time.add_duration(stats.sort_time);
        self.download_time.add_duration(stats.download_time);
        self.gather_time.add_duration(stats.gather_time);
        self.bytes_to_device.add(stats.bytes_to_device as usize);
        self.bytes_from_device.add(stats.bytes_from_device as usize);
    }
}
