//! [`GpuSortExec`]: DataFusion's `SortExec`, sorting on the GPU.

use std::fmt;
use std::sync::Arc;

use arrow::datatypes::SchemaRef;
use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::error::Result;
use datafusion::execution::TaskContext;
use datafusion::execution::memory_pool::{MemoryConsumer, MemoryLimit};
use datafusion::physical_expr::expressions::Column;
use datafusion::physical_expr::{LexOrdering, PhysicalExpr};
use datafusion::physical_plan::execution_plan::{Boundedness, CardinalityEffect, EmissionType, ReplaceChildrenOptions};
use datafusion::physical_plan::metrics::{ExecutionPlanMetricsSet, MetricsSet};
use datafusion::physical_plan::spill::SpillManager;
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, Distribution, ExecutionPlan, ExecutionPlanProperties, Partitioning, PlanProperties,
    SendableRecordBatchStream,
};
use futures::{StreamExt, TryStreamExt};
use gpusort::Strategy;
use gpusort::plan::{Layout, payload_fields};

use crate::config::{DeviceChoice, GpuSortConfig, StrategyChoice};
use crate::device_scan::DeviceScan;
use crate::metrics::GpuSortMetrics;
use crate::sorter::GpuSorter;
use crate::strategy_name;

/// Sorts its input by `expr` on the GPU, keeping the first `fetch` rows — a drop-in for
/// DataFusion's `SortExec` with the same semantics (stable order, `fetch` = TopK,
/// `preserve_partitioning`), put in place by [`GpuSortRule`](crate::GpuSortRule).
///
/// Each partition buffers its input under a memory reservation, turns the sort expressions
/// into order-preserving radix keys and sorts with the strategy of Bandyopadhyay & Sahni that
/// the options or the planner's rule (calibrated on the H100) pick (GRS or SRTS, direct or indirect). Sorts below
/// `gpusort.min_rows`, or with no usable GPU, or whose GPU sort fails, run on gpusort's CPU
/// backend with the same results; the metrics say which path ran and why.
#[derive(Debug, Clone)]
pub struct GpuSortExec {
    input: Arc<dyn ExecutionPlan>,
    expr: LexOrdering,
    fetch: Option<usize>,
    preserve_partitioning: bool,
    options: GpuSortConfig,
    /// The input's files, read and decoded on the GPU by the sort itself ([`DeviceScan`]).
    device_scan: Option<Arc<DeviceScan>>,
    metrics: ExecutionPlanMetricsSet,
    cache: Arc<PlanProperties>,
}

impl GpuSortExec {
    /// Sorts `input` by `expr` (one partition: `input` must have one, or use
    /// [`Self::with_preserve_partitioning`]).
    pub fn try_new(expr: LexOrdering, input: Arc<dyn ExecutionPlan>) -> Result<Self> {
        let cache = Self::compute_properties(&input, expr.clone(), false)?;
        Ok(Self {
            input,
            expr,
            fetch: None,
            preserve_partitioning: false,
            options: GpuSortConfig::default(),
            device_scan: None,
            metrics: ExecutionPlanMetricsSet::new(),
            cache: Arc::new(cache),
        })
    }

    /// Says that the input reads `scan`'s files whole, in order (every row and column, no
    /// filter): a sort of one partition without `fetch` then reads them on the GPU itself
    /// ([`DeviceScan`]), and executes the input only when the device cannot.
    pub fn with_device_scan(mut self, scan: Option<DeviceScan>) -> Self {
        self.device_scan = scan.map(Arc::new);
        self
    }

    /// The files the sort reads on the GPU, when it was told them.
    pub fn device_scan(&self) -> Option<&DeviceScan> {
        self.device_scan.as_deref()
    }

    /// Sorts each input partition on its own (true) or all of them as one (false).
    pub fn with_preserve_partitioning(mut self, preserve_partitioning: bool) -> Result<Self> {
        self.preserve_partitioning = preserve_partitioning;
        self.cache = Arc::new(Self::compute_properties(
            &self.input,
            self.expr.clone(),
            preserve_partitioning,
        )?);
        Ok(self)
    }

    /// Keeps the first `fetch` rows (TopK).
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

    /// Whether each partition is sorted on its own.
    pub fn preserve_partitioning(&self) -> bool {
        self.preserve_partitioning
    }

    /// The options.
    pub fn options(&self) -> &GpuSortConfig {
        &self.options
    }

    /// The strategy a GPU sort will run (the rule calibrated on the H100 unless set): a planned
    /// MSD hybrid is named SRTS where the device's kernel shapes do not hold it, by the
    /// function the sort itself asks ([`gpusort_cuda::shapes::KernelShapes::runnable`]).
    pub fn planned_strategy(&self) -> String {
        match self.options.strategy {
            StrategyChoice::Fixed(s) => match self.options.device {
                DeviceChoice::Cpu => s.to_string(),
                DeviceChoice::Auto => self.strategy_on_device(s, 0),
                DeviceChoice::Gpu(ordinal) => self.strategy_on_device(s, ordinal),
            },
            StrategyChoice::Cpu => "cpu".into(),
            StrategyChoice::Auto => {
                // Sort expressions that are not columns become extra key columns.
                let extra = self.expr.iter().filter(|e| !e.expr.is::<Column>()).count();
                let columns = self.schema().fields().len() + extra;
                let planned = Strategy::calibrated_default(Layout::ByField, payload_fields(columns, self.expr.len()));
                match self.options.device {
                    DeviceChoice::Cpu => planned.to_string(),
                    DeviceChoice::Auto => self.strategy_on_device(planned, 0),
                    DeviceChoice::Gpu(ordinal) => self.strategy_on_device(planned, ordinal),
                }
            }
        }
    }

    /// What `planned` runs on GPU `ordinal` for this sort's key types and columns.
    fn strategy_on_device(&self, planned: Strategy, ordinal: usize) -> String {
        let schema = self.schema();
        let key_types: Option<Vec<_>> = self.expr.iter().map(|e| e.expr.data_type(&schema).ok()).collect();
        match key_types {
            Some(types) => strategy_name::on_device(planned, ordinal, &schema, &types),
            None => planned.to_string(),
        }
    }

    fn compute_properties(
        input: &Arc<dyn ExecutionPlan>,
        expr: LexOrdering,
        preserve_partitioning: bool,
    ) -> Result<PlanProperties> {
        let mut eq = input.equivalence_properties().clone();
        eq.reorder(expr)?;
        let partitioning = if preserve_partitioning {
            input.output_partitioning().clone()
        } else {
            Partitioning::UnknownPartitioning(1)
        };
        let boundedness = match input.boundedness() {
            Boundedness::Unbounded { .. } => Boundedness::Unbounded {
                requires_infinite_memory: true,
            },
            bounded => bounded,
        };
        Ok(PlanProperties::new(eq, partitioning, EmissionType::Final, boundedness))
    }
}

impl DisplayAs for GpuSortExec {
    fn fmt_as(&self, t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        match t {
            DisplayFormatType::Default | DisplayFormatType::Verbose => {
                write!(f, "GpuSortExec: ")?;
                if let Some(fetch) = self.fetch {
                    write!(f, "TopK(fetch={fetch}), ")?;
                }
                write!(
                    f,
                    "expr=[{}], preserve_partitioning=[{}], strategy={}, device={}",
                    self.expr,
                    self.preserve_partitioning,
                    self.planned_strategy(),
                    self.options.device
                )?;
                match &self.device_scan {
                    Some(scan) => write!(f, ", device_scan={} files", scan.files().len()),
                    None => Ok(()),
                }
            }
            DisplayFormatType::TreeRender => {
                writeln!(f, "{}", self.expr)?;
                if let Some(fetch) = self.fetch {
                    writeln!(f, "limit={fetch}")?;
                }
                writeln!(f, "strategy={}", self.planned_strategy())
            }
        }
    }
}

impl ExecutionPlan for GpuSortExec {
    fn name(&self) -> &str {
        "GpuSortExec"
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        &self.cache
    }

    fn required_input_distribution(&self) -> Vec<Distribution> {
        if self.preserve_partitioning {
            vec![Distribution::UnspecifiedDistribution]
        } else {
            vec![Distribution::SinglePartition]
        }
    }

    fn maintains_input_order(&self) -> Vec<bool> {
        vec![false]
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
            datafusion::error::DataFusionError::Internal(format!("GpuSortExec has one child, got {}", c.len()))
        })?;
        let mut new = self.as_ref().clone();
        if !Arc::ptr_eq(&input, &self.input) {
            // The scan named the old input's files: kept where the new input still reads them
            // whole (the same scan, its files' schemas hinted, say), not where it filters.
            let same = |s: &Arc<DeviceScan>| DeviceScan::of_plan(&input).is_some_and(|n| n.files() == s.files());
            new.device_scan = new.device_scan.filter(same);
        }
        new.cache = Arc::new(Self::compute_properties(
            &input,
            new.expr.clone(),
            new.preserve_partitioning,
        )?);
        new.input = input;
        new.metrics = ExecutionPlanMetricsSet::new();
        Ok(Arc::new(new))
    }

    #[allow(deprecated)]
    fn with_new_children(self: Arc<Self>, children: Vec<Arc<dyn ExecutionPlan>>) -> Result<Arc<dyn ExecutionPlan>> {
        self.replace_children(
            children,
            ReplaceChildrenOptions::new(datafusion::physical_plan::execution_plan::ChildrenPropertiesMode::Recompute),
        )
    }

    fn execute(&self, partition: usize, context: Arc<TaskContext>) -> Result<SendableRecordBatchStream> {
        // The files are read on the GPU only where the sort holds all of them at once.
        let scan = (self.device_scan.clone()).filter(|_| !self.preserve_partitioning && self.fetch.is_none());
        let (plan, task) = (Arc::clone(&self.input), Arc::clone(&context));
        let reservation = MemoryConsumer::new(format!("GpuSortExec[{partition}]"))
            .with_can_spill(self.fetch.is_none())
            .register(context.memory_pool());
        let metrics = GpuSortMetrics::new(&self.metrics, partition);
        let spill = spill_manager(&context, &metrics, self.schema());
        let sorter = GpuSorter::new(
            self.schema(),
            self.expr.clone(),
            self.fetch,
            self.options.clone(),
            context.session_config().batch_size(),
            reservation,
            spill,
            context.runtime_env().disk_manager.max_spill_merge_fan_in(),
            match context.memory_pool().memory_limit() {
                MemoryLimit::Finite(limit) => Some(limit),
                _ => None,
            },
            metrics,
        );
        Ok(Box::pin(RecordBatchStreamAdapter::new(
            self.schema(),
            futures::stream::once(async move {
                let mut sorter = sorter;
                if let Some(scan) = scan {
                    log::debug!(target: "gpusort::timeline", "GpuSortExec[{partition}]: reading the files on the GPU");
                    sorter = match sorter.sort_device_scan(scan).await? {
                        Ok(out) => return Ok(out),
                        Err(sorter) => sorter,
                    };
                }
                let mut input = plan.execute(partition, task)?;
                log::debug!(target: "gpusort::timeline", "GpuSortExec[{partition}]: polling the input");
                let mut batches = 0usize;
                while let Some(batch) = input.next().await {
                    if batches == 0 {
                        log::debug!(target: "gpusort::timeline", "GpuSortExec[{partition}]: first input batch");
                    }
                    batches += 1;
                    sorter.insert(batch?).await?;
                }
                drop(input);
                log::debug!(target: "gpusort::timeline", "GpuSortExec[{partition}]: input done ({batches} batches)");
                let out = sorter.finish().await;
                log::debug!(target: "gpusort::timeline", "GpuSortExec[{partition}]: sorted, streaming out");
                out
            })
            .try_flatten(),
        )))
    }

    fn metrics(&self) -> Option<MetricsSet> {
        Some(self.metrics.clone_inner())
    }

    fn with_fetch(&self, limit: Option<usize>) -> Option<Arc<dyn ExecutionPlan>> {
        Some(Arc::new(self.clone().with_fetch(limit)))
    }

    fn fetch(&self) -> Option<usize> {
        self.fetch
    }

    fn cardinality_effect(&self) -> CardinalityEffect {
        if self.fetch.is_none() {
            CardinalityEffect::Equal
        } else {
            CardinalityEffect::LowerEqual
        }
    }
}

/// Calls `f` on each sort expression of `expr` (the plans' `apply_expressions`).
pub(crate) fn apply_sort_expressions(
    expr: &LexOrdering,
    f: &mut dyn FnMut(&Arc<dyn PhysicalExpr>) -> Result<TreeNodeRecursion>,
) -> Result<TreeNodeRecursion> {
    for e in expr.iter() {
        if f(&e.expr)? == TreeNodeRecursion::Stop {
            return Ok(TreeNodeRecursion::Stop);
        }
    }
    Ok(TreeNodeRecursion::Continue)
}

/// The spill manager of an operator's partition: the session's disk manager and spill
/// compression, counted in `metrics`.
pub(crate) fn spill_manager(context: &TaskContext, metrics: &GpuSortMetrics, schema: SchemaRef) -> SpillManager {
    SpillManager::new(context.runtime_env(), metrics.spill.clone(), schema)
        .with_compression_type(context.session_config().spill_compression())
}
