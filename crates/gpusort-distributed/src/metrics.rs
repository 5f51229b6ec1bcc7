//! [`RangeSortMetrics`]: what a range-partitioned sort that ran says of itself, from the
//! metrics its workers sent back to the coordinator.

use std::sync::Arc;

use arrow::array::RecordBatch;
use datafusion::common::tree_node::{TreeNode, TreeNodeRecursion};
use datafusion::dataframe::DataFrame;
use datafusion::error::{DataFusionError, Result};
use datafusion::physical_plan::metrics::MetricValue;
use datafusion::physical_plan::{ExecutionPlan, collect};
use datafusion_distributed::{DistributedMetricsFormat, rewrite_distributed_plan_with_metrics};
use datafusion_gpusort::GpuSortExec;
use gpusort::partition::{Splitters, imbalance};

use crate::exec::{RANGE_LABEL, RANGE_ROWS_METRIC, RangeRouteExec};

/// The rows each range of a distributed sort got and where its sorts ran, read after the
/// query ran from the metrics datafusion-distributed collects from the workers (the
/// coordinator's session collects them by default: `distributed.collect_metrics`).
#[derive(Debug, Clone)]
pub struct RangeSortMetrics {
    /// Rows routed to each range, in range (and output) order.
    pub range_rows: Vec<usize>,
    /// The splitters the rows were routed by.
    pub splitters: Arc<Splitters>,
    /// Sorts that ran on the GPU, summed over the plan's `GpuSortExec`s.
    pub gpu_sorts: usize,
    /// Sorts that ran on the CPU backend.
    pub cpu_sorts: usize,
}

impl RangeSortMetrics {
    /// The metrics of `plan` (the physical plan of a distributed query, executed to its end);
    /// `None` when the plan has no range-partitioned sort. Waits for the workers' metrics.
    pub async fn try_from_executed(plan: Arc<dyn ExecutionPlan>) -> Result<Option<Self>> {
        let plan = rewrite_distributed_plan_with_metrics(plan, DistributedMetricsFormat::Aggregated).await?;
        let mut route = None;
        plan.apply(|node| {
            if node.is::<RangeRouteExec>() {
                route = Some(Arc::clone(node));
                return Ok(TreeNodeRecursion::Stop);
            }
            Ok(TreeNodeRecursion::Continue)
        })?;
        let Some(route) = route else {
            return Ok(None);
        };
        let splitters = route
            .downcast_ref::<RangeRouteExec>()
            .map(|r| Arc::new(r.splitters().clone()))
            .ok_or_else(|| DataFusionError::Internal("RangeRouteExec expected".into()))?;
        let mut range_rows = vec![0; splitters.num_ranges()];
        for metric in route.metrics().unwrap_or_default().iter() {
            let MetricValue::Count { name, count } = metric.value() else {
                continue;
            };
            if name != RANGE_ROWS_METRIC {
                continue;
            }
            let range = metric.labels().iter().find(|l| l.name() == RANGE_LABEL);
            let slot = range
                .and_then(|l| l.value().parse::<usize>().ok())
                .and_then(|r| range_rows.get_mut(r))
                .ok_or_else(|| DataFusionError::Internal(format!("{RANGE_ROWS_METRIC} of no known range")))?;
            *slot += count.value();
        }
        let (gpu_sorts, cpu_sorts) = sorts_by_device(&plan)?;
        Ok(Some(Self {
            range_rows,
            splitters,
            gpu_sorts,
            cpu_sorts,
        }))
    }

    /// All the rows routed.
    pub fn rows(&self) -> usize {
        self.range_rows.iter().sum()
    }

    /// The splitters' quality: the largest range's rows over the mean (1.0 is even).
    pub fn imbalance(&self) -> f64 {
        imbalance(&self.range_rows)
    }
}

/// The sorts of `plan`'s `GpuSortExec`s (their `gpu_sorts` and `cpu_sorts` counters) that ran
/// on the GPU and on the CPU; for a distributed plan, one that
/// [`rewrite_distributed_plan_with_metrics`] gave the workers' metrics.
pub fn sorts_by_device(plan: &Arc<dyn ExecutionPlan>) -> Result<(usize, usize)> {
    let (mut gpu, mut cpu) = (0, 0);
    plan.apply(|node| {
        if node.is::<GpuSortExec>() {
            for metric in node.metrics().unwrap_or_default().iter() {
                match metric.value() {
                    MetricValue::Count { name, count } if name == "gpu_sorts" => gpu += count.value(),
                    MetricValue::Count { name, count } if name == "cpu_sorts" => cpu += count.value(),
                    _ => {}
                }
            }
        }
        Ok(TreeNodeRecursion::Continue)
    })?;
    Ok((gpu, cpu))
}

/// Runs `df` (a query of a distributed session) to its end: its batches, and the metrics of
/// its range-partitioned sort where it has one.
pub async fn collect_with_metrics(df: DataFrame) -> Result<(Vec<RecordBatch>, Option<RangeSortMetrics>)> {
    let task = Arc::new(df.task_ctx());
    let plan = df.create_physical_plan().await?;
    let batches = collect(Arc::clone(&plan), task).await?;
    Ok((batches, RangeSortMetrics::try_from_executed(plan).await?))
}
