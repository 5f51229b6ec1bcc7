//! [`RangeSortPlanner`]: plans a full `ORDER BY` as a sample job and a range-partitioned sort.

use std::cmp::Ordering;
use std::fmt;
use std::hash::{Hash, Hasher};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering as AtomicOrdering};

use arrow::array::{ArrayRef, RecordBatch, UInt64Array};
use arrow::compute::{SortOptions, concat_batches};
use async_trait::async_trait;
use datafusion::catalog::Session;
use datafusion::common::{DFSchema, DFSchemaRef};
use datafusion::datasource::listing::PartitionedFile;
use datafusion::datasource::physical_plan::{FileGroup, FileScanConfig};
use datafusion::datasource::source::DataSourceExec;
use datafusion::error::{DataFusionError, Result};
use datafusion::execution::context::{QueryPlanner, SessionState};
use datafusion::logical_expr::{Expr, Extension, LogicalPlan, UserDefinedLogicalNodeCore};
use datafusion::physical_expr::expressions::Column;
use datafusion::physical_expr::{LexOrdering, PhysicalSortExpr};
use datafusion::physical_plan::coalesce_partitions::CoalescePartitionsExec;
use datafusion::physical_plan::execution_plan::{ChildrenPropertiesMode, ReplaceChildrenOptions};
use datafusion::physical_plan::filter::FilterExec;
use datafusion::physical_plan::projection::{ProjectionExec, ProjectionExpr};
use datafusion::physical_plan::repartition::RepartitionExec;
use datafusion::physical_plan::sorts::sort::SortExec;
use datafusion::physical_plan::sorts::sort_preserving_merge::SortPreservingMergeExec;
use datafusion::physical_plan::{ExecutionPlan, Partitioning};
use datafusion::physical_planner::{DefaultPhysicalPlanner, PhysicalPlanner};
use datafusion::prelude::SessionContext;
use datafusion_distributed::{NetworkCoalesceExec, NetworkShuffleExec};
use datafusion_gpusort::{GpuSortConfig, GpuSortExec};
use gpusort::partition::Splitters;

use crate::exec::{OrderedConcatExec, POSITION_COLUMN, ROUTE_COLUMN, RangeRouteExec, RowPositionExec};
use crate::sample::{SampleExec, thin_to_uniform};

/// How [`RangeSortPlanner`] spreads a sort.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DistributedSortOptions {
    /// Tasks of each stage: the workers the input is scanned on and the ranges are sorted on.
    pub workers: usize,
    /// Ranges (partitions, each one `GpuSortExec` sort) per worker.
    pub ranges_per_worker: usize,
    /// Sample rows kept per scanned partition; 0: 20 per range, at least 100, at most 10,000.
    pub sample_per_partition: usize,
}

impl DistributedSortOptions {
    /// `workers` workers, one range each, the default sample.
    pub fn new(workers: usize) -> Self {
        Self {
            workers: workers.max(1),
            ranges_per_worker: 1,
            sample_per_partition: 0,
        }
    }

    /// All the ranges.
    pub fn ranges(&self) -> usize {
        self.workers.max(1) * self.ranges_per_worker.max(1)
    }

    fn sample_capacity(&self) -> usize {
        match self.sample_per_partition {
            0 => (20 * self.ranges()).clamp(100, 10_000),
            n => n,
        }
    }
}

/// A query planner (to put under datafusion-distributed's: register it with
/// `with_query_planner` before `with_distributed_planner`) that plans a query whose result
/// is a full sort of a file scan (with projections and filters between) as a range-partitioned
/// distributed sort with `GpuSortExec` (see the crate's documentation), and every other query
/// as DataFusion does. Its plan contains the network boundaries, which datafusion-distributed
/// then only finalizes.
#[derive(Debug)]
pub struct RangeSortPlanner {
    options: DistributedSortOptions,
}

impl RangeSortPlanner {
    /// A planner with these options.
    pub fn new(options: DistributedSortOptions) -> Self {
        Self { options }
    }
}

/// The parts of a plan ending in a full sort: the projections above it (top first), the sort
/// order and the sort's input.
struct FoundSort {
    above: Vec<Arc<dyn ExecutionPlan>>,
    ordering: LexOrdering,
    input: Arc<dyn ExecutionPlan>,
}

fn find_sort(plan: &Arc<dyn ExecutionPlan>) -> Option<FoundSort> {
    let mut above = vec![];
    let mut node = Arc::clone(plan);
    while let Some(p) = node.downcast_ref::<ProjectionExec>() {
        let next = Arc::clone(p.input());
        above.push(node);
        node = next;
    }
    let full_sort = |n: &Arc<dyn ExecutionPlan>| -> Option<(LexOrdering, Arc<dyn ExecutionPlan>)> {
        if let Some(s) = n.downcast_ref::<GpuSortExec>() {
            return s.fetch().is_none().then(|| (s.expr().clone(), Arc::clone(s.input())));
        }
        if let Some(s) = n.downcast_ref::<SortExec>() {
            return s.fetch().is_none().then(|| (s.expr().clone(), Arc::clone(s.input())));
        }
        None
    };
    let (ordering, input) = if let Some(m) = node.downcast_ref::<SortPreservingMergeExec>() {
        if m.fetch().is_some() {
            return None;
        }
        let (_, input) = full_sort(m.input())?;
        (m.expr().clone(), input)
    } else {
        full_sort(&node)?
    };
    Some(FoundSort { above, ordering, input })
}

/// `plan` with [`POSITION_COLUMN`] appended to its rows, numbered right above its one file
/// scan; `None` for plans other than projections and filters (and the repartitions and
/// coalescing that only spread rows) over one file scan.
fn with_positions(plan: &Arc<dyn ExecutionPlan>) -> Result<Option<Arc<dyn ExecutionPlan>>> {
    if let Some(dse) = plan.downcast_ref::<DataSourceExec>() {
        let Some(config) = dse.data_source().downcast_ref::<FileScanConfig>() else {
            return Ok(None);
        };
        // datafusion-distributed splits a scan it can cut into byte ranges in the order of
        // its files; one declared sorted or partitioned it deals out otherwise.
        if !config.output_ordering.is_empty() || config.output_partitioning.is_some() {
            return Ok(None);
        }
        return Ok(Some(Arc::new(RowPositionExec::new(in_file_order(config)))));
    }
    if let Some(r) = plan.downcast_ref::<RepartitionExec>() {
        if !matches!(r.partitioning(), Partitioning::RoundRobinBatch(_)) {
            return Ok(None);
        }
        return with_positions(r.input());
    }
    if let Some(c) = plan.downcast_ref::<CoalescePartitionsExec>() {
        return with_positions(c.input());
    }
    if let Some(p) = plan.downcast_ref::<ProjectionExec>() {
        let Some(input) = with_positions(p.input())? else {
            return Ok(None);
        };
        let pos = input.schema().fields().len() - 1;
        let mut exprs = p.expr().to_vec();
        exprs.push(ProjectionExpr::new(
            Arc::new(Column::new(POSITION_COLUMN, pos)),
            POSITION_COLUMN,
        ));
        return Ok(Some(Arc::new(ProjectionExec::try_new(exprs, input)?)));
    }
    if let Some(f) = plan.downcast_ref::<FilterExec>() {
        if f.projection().is_some() {
            return Ok(None);
        }
        let Some(input) = with_positions(f.input())? else {
            return Ok(None);
        };
        return Ok(Some(Arc::new(FilterExec::try_new(Arc::clone(f.predicate()), input)?)));
    }
    Ok(None)
}

/// The scan with its files (and byte ranges of files) in path and byte order, dealt into as
/// many groups as it had, contiguously: the order the scan lists its files in (which its
/// statistics collection may shuffle) must not decide positions.
fn in_file_order(config: &FileScanConfig) -> Arc<dyn ExecutionPlan> {
    let mut files: Vec<PartitionedFile> = config.file_groups.iter().flat_map(|g| g.iter().cloned()).collect();
    files.sort_by(|a, b| a.path().cmp(b.path()).then(a.range().0.cmp(&b.range().0)));
    let per_group = files.len().div_ceil(config.file_groups.len().max(1)).max(1);
    let mut config = config.clone();
    config.file_groups = files.chunks(per_group).map(|c| FileGroup::new(c.to_vec())).collect();
    // Each partition reads its own groups, in order (see `keep_file_order`).
    config.preserve_order = true;
    DataSourceExec::from_data_source(config)
}

/// A projection of `input` onto all its columns but the last (the one this planner added).
fn drop_last_column(input: Arc<dyn ExecutionPlan>) -> Result<Arc<dyn ExecutionPlan>> {
    let schema = input.schema();
    let exprs: Vec<ProjectionExpr> = schema
        .fields()
        .iter()
        .enumerate()
        .take(schema.fields().len() - 1)
        .map(|(i, f)| ProjectionExpr::new(Arc::new(Column::new(f.name(), i)), f.name().clone()))
        .collect();
    Ok(Arc::new(ProjectionExec::try_new(exprs, input)?))
}

static SAMPLE_IDS: AtomicU64 = AtomicU64::new(0);

/// The logical node of the sample job: a prebuilt physical plan (the planner's own, so that
/// the job goes through datafusion-distributed's planner and runs on the workers).
#[derive(Debug, Clone)]
struct SampleJob {
    id: u64,
    plan: Arc<dyn ExecutionPlan>,
    schema: DFSchemaRef,
}

impl PartialEq for SampleJob {
    fn eq(&self, other: &Self) -> bool {
        self.id == other.id
    }
}
impl Eq for SampleJob {}
impl Hash for SampleJob {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.id.hash(state)
    }
}
impl PartialOrd for SampleJob {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.id.cmp(&other.id))
    }
}

impl UserDefinedLogicalNodeCore for SampleJob {
    fn name(&self) -> &str {
        "GpusortSampleJob"
    }
    fn inputs(&self) -> Vec<&LogicalPlan> {
        vec![]
    }
    fn schema(&self) -> &DFSchemaRef {
        &self.schema
    }
    fn expressions(&self) -> Vec<Expr> {
        vec![]
    }
    fn fmt_for_explain(&self, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "GpusortSampleJob")
    }
    fn with_exprs_and_inputs(&self, _exprs: Vec<Expr>, _inputs: Vec<LogicalPlan>) -> Result<Self> {
        Ok(self.clone())
    }
}

impl RangeSortPlanner {
    /// The range-partitioned plan for a found sort, or `None` when its input is not one this
    /// planner numbers rows of, or a key type gpusort cannot encode.
    async fn range_sort(&self, found: FoundSort, session: &dyn Session) -> Result<Option<Arc<dyn ExecutionPlan>>> {
        let schema = found.input.schema();
        for e in found.ordering.iter() {
            if !gpusort::keys::is_sortable(&e.expr.data_type(&schema)?) {
                return Ok(None);
            }
        }
        let Some(positioned) = with_positions(&found.input)? else {
            return Ok(None);
        };
        let Some(state) = session.as_any().downcast_ref::<SessionState>() else {
            return Ok(None);
        };
        let position = positioned.schema().fields().len() - 1;
        let keys: Vec<PhysicalSortExpr> = found.ordering.iter().cloned().collect();
        let (workers, ranges) = (self.options.workers.max(1), self.options.ranges());

        // Job 1: the sample, collected on the coordinator.
        let sample = SampleExec::try_new(
            Arc::clone(&positioned),
            keys.clone(),
            position,
            self.options.sample_capacity(),
        )?;
        let sample_schema = sample.schema();
        let sample_plan: Arc<dyn ExecutionPlan> = Arc::new(CoalescePartitionsExec::new(Arc::new(
            NetworkCoalesceExec::try_new(Arc::new(sample), workers, 1)?,
        )));
        let job = SampleJob {
            id: SAMPLE_IDS.fetch_add(1, AtomicOrdering::Relaxed),
            plan: sample_plan,
            schema: Arc::new(DFSchema::try_from(sample_schema.as_ref().clone())?),
        };
        let ctx = SessionContext::new_with_state(state.clone());
        let batches = ctx
            .execute_logical_plan(LogicalPlan::Extension(Extension { node: Arc::new(job) }))
            .await?
            .collect()
            .await?;
        let kept: RecordBatch = concat_batches(&sample_schema, &batches)?;
        let sample = thin_to_uniform(&kept, self.options.sample_capacity())?;
        let n = keys.len();
        let sample_keys: Vec<ArrayRef> = sample.columns()[..n].to_vec();
        let sample_positions = sample
            .column(n)
            .as_any()
            .downcast_ref::<UInt64Array>()
            .ok_or_else(|| DataFusionError::Internal("sample positions are not UInt64".into()))?;
        let options: Vec<SortOptions> = keys.iter().map(|k| k.options).collect();
        let splitters = Splitters::from_sample(&sample_keys, sample_positions.values(), &options, ranges)
            .map_err(|e| DataFusionError::External(Box::new(e)))?;
        log::debug!(
            target: "gpusort::distributed",
            "{} sample rows ({} kept by the partitions), {} ranges on {workers} workers",
            sample.num_rows(),
            kept.num_rows(),
            splitters.num_ranges()
        );

        // Job 2: route each row to its range, sort each range, concatenate.
        let routed = Arc::new(RangeRouteExec::new(
            positioned,
            keys.clone(),
            position,
            Arc::new(splitters),
        ));
        let route = routed.schema().fields().len() - 1;
        debug_assert_eq!(routed.schema().field(route).name(), ROUTE_COLUMN);
        let hashed = Arc::new(RepartitionExec::try_new(
            routed,
            Partitioning::Hash(
                vec![Arc::new(Column::new(ROUTE_COLUMN, route))],
                self.options.ranges_per_worker.max(1),
            ),
        )?);
        let shuffled = Arc::new(NetworkShuffleExec::try_new(hashed, workers)?);
        let unrouted = drop_last_column(shuffled)?;
        let mut sort_keys = keys.clone();
        sort_keys.push(PhysicalSortExpr::new(
            Arc::new(Column::new(POSITION_COLUMN, position)),
            SortOptions {
                descending: false,
                nulls_first: false,
            },
        ));
        let ordering =
            LexOrdering::new(sort_keys).ok_or_else(|| DataFusionError::Internal("empty sort order".into()))?;
        let sorted = Arc::new(
            GpuSortExec::try_new(ordering, unrouted)?
                .with_preserve_partitioning(true)?
                .with_options(GpuSortConfig::from_config(session.config_options())),
        );
        let ranges_sorted = drop_last_column(sorted)?;
        let gathered = Arc::new(NetworkCoalesceExec::try_new(ranges_sorted, workers, 1)?);
        let mut top: Arc<dyn ExecutionPlan> = Arc::new(OrderedConcatExec::new(gathered, found.ordering));
        for node in found.above.into_iter().rev() {
            top = node.replace_children(
                vec![top],
                ReplaceChildrenOptions::new(ChildrenPropertiesMode::Recompute),
            )?;
        }
        Ok(Some(top))
    }
}

#[async_trait]
impl QueryPlanner for RangeSortPlanner {
    async fn create_physical_plan(
        &self,
        logical_plan: &LogicalPlan,
        session: &dyn Session,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        if let LogicalPlan::Extension(ext) = logical_plan
            && let Some(job) = ext.node.as_any().downcast_ref::<SampleJob>()
        {
            return Ok(Arc::clone(&job.plan));
        }
        let planner = DefaultPhysicalPlanner::default();
        let plan = planner.create_physical_plan(logical_plan, session).await?;
        if find_sort(&plan).is_none() {
            return Ok(plan);
        }
        let Some(state) = session.as_any().downcast_ref::<SessionState>() else {
            return Ok(plan);
        };
        // Planned again without DataFusion's sort pushdown into the scan, which may read row
        // groups in reverse: positions number the rows in file order.
        let mut state = state.clone();
        state.config_mut().options_mut().optimizer.enable_sort_pushdown = false;
        let unpushed = planner.create_physical_plan(logical_plan, &state).await?;
        match find_sort(&unpushed) {
            Some(found) => Ok(self.range_sort(found, &state).await?.unwrap_or(plan)),
            None => Ok(plan),
        }
    }
}
