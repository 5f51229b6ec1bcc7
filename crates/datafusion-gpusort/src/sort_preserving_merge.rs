//! [`GpuSortPreservingMergeExec`]: DataFusion's `SortPreservingMergeExec`, merging the sorted
//! partitions by key ranges on the GPU (or on every core) instead of row by row on one.

use std::fmt;
use std::sync::Arc;

use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::error::{DataFusionError, Result};
use datafusion::execution::TaskContext;
use datafusion::execution::memory_pool::MemoryConsumer;
use datafusion::physical_expr::{LexOrdering, OrderingRequirements, PhysicalExpr};
use datafusion::physical_plan::execution_plan::{
    CardinalityEffect, ChildrenPropertiesMode, EmissionType, ReplaceChildrenOptions,
};
use datafusion::physical_plan::metrics::{ExecutionPlanMetricsSet, MetricsSet};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, Distribution, ExecutionPlan, ExecutionPlanProperties, Partitioning, PlanProperties,
    SendableRecordBatchStream,
};
use futures::TryStreamExt;

use crate::config::GpuSortConfig;
use crate::exec::{apply_sort_expressions, spill_manager};
use crate::in_memory::InMemorySorter;
use crate::metrics::GpuSortMetrics;
use crate::partition_runs::PartitionRuns;

/// Merges input partitions that are each sorted by `expr` into one sorted partition, keeping
/// the first `fetch` rows — what DataFusion's `SortPreservingMergeExec` does, put in its place
/// by [`GpuSortRule`](crate::GpuSortRule) when the merge keeps every row or more than
/// `gpusort.topk_max_fetch` of them.
///
/// # Algorithm
///
/// Each input partition is a sorted run (`PartitionRuns`: read on its own task, held under a
/// memory reservation, written to disk in pieces when the pool runs short). The runs are then
/// merged as an external sort merges its runs: by key ranges, each range's rows of every run
/// merged on the GPU (`merge.cu`, seed 003's merge of sorted runs; the rows are told to be
/// sorted runs) or sorted by their keys on every core, with the output streamed a range at a
/// time; with too little memory, by levels of heap merges.
///
/// DataFusion's merge streams rows out as its inputs produce them, reading a batch ahead of
/// each; this one reads its whole input first (like a sort), in exchange for merging on the
/// GPU and on every core. Rows with equal keys come out partition by partition (DataFusion's
/// merge may alternate between partitions there).
#[derive(Debug, Clone)]
pub struct GpuSortPreservingMergeExec {
    input: Arc<dyn ExecutionPlan>,
    expr: LexOrdering,
    fetch: Option<usize>,
    options: GpuSortConfig,
    metrics: ExecutionPlanMetricsSet,
    cache: Arc<PlanProperties>,
}

impl GpuSortPreservingMergeExec {
    /// Merges the partitions of `input`, each sorted by `expr`.
    pub fn try_new(expr: LexOrdering, input: Arc<dyn ExecutionPlan>) -> Result<Self> {
        let cache = Arc::new(Self::compute_properties(&input, expr.clone()));
        Ok(Self {
            input,
            expr,
            fetch: None,
            options: GpuSortConfig::default(),
            metrics: ExecutionPlanMetricsSet::new(),
            cache,
        })
    }

    /// Keeps the first `fetch` rows.
    pub fn with_fetch(mut self, fetch: Option<usize>) -> Self {
        self.fetch = fetch;
        self
    }

    /// Uses these options (device, strategy, thresholds).
    pub fn with_options(mut self, options: GpuSortConfig) -> Self {
        self.options = options;
        self
    }

    /// The input.
    pub fn input(&self) -> &Arc<dyn ExecutionPlan> {
        &self.input
    }

    /// The sort expressions.
    pub fn expr(&self) -> &LexOrdering {
        &self.expr
    }

    fn compute_properties(input: &Arc<dyn ExecutionPlan>, expr: LexOrdering) -> PlanProperties {
        let mut eq = input.equivalence_properties().clone();
        eq.clear_per_partition_constants();
        eq.add_ordering(expr);
        PlanProperties::new(
            eq,
            Partitioning::UnknownPartitioning(1),
            EmissionType::Final,
            input.boundedness(),
        )
    }
}

impl DisplayAs for GpuSortPreservingMergeExec {
    fn fmt_as(&self, t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        match t {
            DisplayFormatType::Default | DisplayFormatType::Verbose => {
                write!(f, "GpuSortPreservingMergeExec: [{}]", self.expr)?;
                if let Some(fetch) = self.fetch {
                    write!(f, ", fetch={fetch}")?;
                }
                write!(f, ", device={}", self.options.device)
            }
            DisplayFormatType::TreeRender => {
                writeln!(f, "{}", self.expr)?;
                match self.fetch {
                    Some(fetch) => writeln!(f, "limit={fetch}"),
                    None => Ok(()),
                }
            }
        }
    }
}

impl ExecutionPlan for GpuSortPreservingMergeExec {
    fn name(&self) -> &str {
        "GpuSortPreservingMergeExec"
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        &self.cache
    }

    fn required_input_distribution(&self) -> Vec<Distribution> {
        vec![Distribution::UnspecifiedDistribution]
    }

    fn required_input_ordering(&self) -> Vec<Option<OrderingRequirements>> {
        vec![Some(OrderingRequirements::from(self.expr.clone()))]
    }

    fn maintains_input_order(&self) -> Vec<bool> {
        vec![true]
    }

    fn benefits_from_input_partitioning(&self) -> Vec<bool> {
        vec![false]
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![&self.input]
    }

    fn apply_expressions(
        &self,
        f: &mut dyn FnMut(&Arc<dyn PhysicalExpr>) -> Result<TreeNodeRecursion>,
    ) -> Result<TreeNodeRecursion> {
        apply_sort_expressions(&self.expr, f)
    }

    fn replace_children(
        self: Arc<Self>,
        children: Vec<Arc<dyn ExecutionPlan>>,
        _options: ReplaceChildrenOptions,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let [input] = <[_; 1]>::try_from(children).map_err(|c| {
            DataFusionError::Internal(format!("GpuSortPreservingMergeExec has one child, got {}", c.len()))
        })?;
        let mut new = self.as_ref().clone();
        new.cache = Arc::new(Self::compute_properties(&input, new.expr.clone()));
        new.input = input;
        new.metrics = ExecutionPlanMetricsSet::new();
        Ok(Arc::new(new))
    }

    #[allow(deprecated)]
    fn with_new_children(self: Arc<Self>, children: Vec<Arc<dyn ExecutionPlan>>) -> Result<Arc<dyn ExecutionPlan>> {
        self.replace_children(children, ReplaceChildrenOptions::new(ChildrenPropertiesMode::Recompute))
    }

    fn execute(&self, partition: usize, context: Arc<TaskContext>) -> Result<SendableRecordBatchStream> {
        if partition != 0 {
            return Err(DataFusionError::Internal(format!(
                "GpuSortPreservingMergeExec has one output partition, asked for {partition}"
            )));
        }
        let partitions = self.input.output_partitioning().partition_count();
        let inputs = (0..partitions)
            .map(|i| self.input.execute(i, Arc::clone(&context)))
            .collect::<Result<Vec<_>>>()?;
        let reservation = MemoryConsumer::new("GpuSortPreservingMergeExec")
            .with_can_spill(true)
            .register(context.memory_pool());
        let metrics = GpuSortMetrics::new(&self.metrics, partition);
        let spill = spill_manager(&context, &metrics, self.schema());
        let sorter = InMemorySorter::new(
            self.schema(),
            self.expr.clone(),
            self.options.clone(),
            context.session_config().batch_size(),
            metrics,
        );
        let fan_in = context.runtime_env().disk_manager.max_spill_merge_fan_in();
        let mut runs = PartitionRuns::new(partitions, sorter, reservation, spill, fan_in).with_fetch(self.fetch);
        Ok(Box::pin(RecordBatchStreamAdapter::new(
            self.schema(),
            futures::stream::once(async move {
                runs.read(inputs).await?;
                runs.merge().await
            })
            .try_flatten(),
        )))
    }

    fn metrics(&self) -> Option<MetricsSet> {
        Some(self.metrics.clone_inner())
    }

    fn fetch(&self) -> Option<usize> {
        self.fetch
    }

    fn with_fetch(&self, limit: Option<usize>) -> Option<Arc<dyn ExecutionPlan>> {
        Some(Arc::new(self.clone().with_fetch(limit)))
    }

    fn cardinality_effect(&self) -> CardinalityEffect {
        match self.fetch {
            None => CardinalityEffect::Equal,
            Some(_) => CardinalityEffect::LowerEqual,
        }
    }
}
