//! [`GpuSortRule`]: puts [`GpuSortExec`] where DataFusion planned a `SortExec`.

use std::sync::Arc;

use datafusion::common::config::ConfigOptions;
use datafusion::common::tree_node::{Transformed, TransformedResult, TreeNode, TreeNodeRecursion};
use datafusion::datasource::file_format::parquet::ParquetSink;
use datafusion::datasource::physical_plan::FileSink;
use datafusion::datasource::sink::DataSinkExec;
use datafusion::error::Result;
use datafusion::physical_optimizer::PhysicalOptimizerRule;
use datafusion::physical_plan::coalesce_partitions::CoalescePartitionsExec;
use datafusion::physical_plan::execution_plan::{ChildrenPropertiesMode, ReplaceChildrenOptions};
use datafusion::physical_plan::filter::FilterExec;
use datafusion::physical_plan::projection::ProjectionExec;
use datafusion::physical_plan::sorts::sort::SortExec;
use datafusion::physical_plan::sorts::sort_preserving_merge::SortPreservingMergeExec;
use datafusion::physical_plan::{ExecutionPlan, ExecutionPlanProperties};

use crate::config::GpuSortConfig;
use crate::device_scan::DeviceScan;
use crate::exec::GpuSortExec;
use crate::parquet_sink::GpuParquetSink;
use crate::sort_preserving_merge::GpuSortPreservingMergeExec;

/// A physical optimizer rule that replaces each `SortExec` with a [`GpuSortExec`] of the same
/// semantics (sort expressions, `fetch`, `preserve_partitioning`), configured by the session's
/// `gpusort.*` options. It leaves a `SortExec` alone when `gpusort.enabled` is false, when its
/// input is already sorted (DataFusion's sort then passes rows through), when a sort key
/// has a type gpusort cannot encode, or when it is a TopK of at most `gpusort.topk_max_fetch`
/// rows.
///
/// That last case is DataFusion's better plan, not a fallback: its TopK streams the input
/// through a heap of `fetch` rows and publishes the heap's bound as a dynamic filter (which a
/// Parquet scan uses to skip data), while a sort must first buffer every input row; the `topk`
/// bench measures where that stops paying. The results are DataFusion's own, including which
/// of several rows tied at the `LIMIT` boundary come out and in what order (DataFusion's
/// sqllogictest files expect its heap's order there).
///
/// With `gpusort.merge_partitions` (the default), a `SortPreservingMergeExec` over
/// per-partition sorts becomes one `GpuSortExec` over all partitions
/// (`CoalescePartitionsExec` below it): one large sort on the GPU instead of many small ones
/// and a CPU merge. Projections and filters planned between the merge and the sorts move
/// above the one sort.
///
/// With `gpusort.merge_sorted_partitions` (the default), any other `SortPreservingMergeExec`
/// — one over partitions that were already sorted, e.g. files declared `WITH ORDER` — becomes
/// a [`GpuSortPreservingMergeExec`], which merges the sorted partitions on the GPU. One with a
/// `fetch` of at most `gpusort.topk_max_fetch` stays, as a small TopK does: it stops reading
/// after `fetch` rows of each partition, where ours reads every row first.
///
/// With `gpusort.parquet_sink` (the default), a `DataSinkExec` writing such a sort's output
/// through DataFusion's `ParquetSink` writes it through a [`GpuParquetSink`] instead, where that
/// writes the files as DataFusion's would ([`GpuParquetSink::unsupported`] finds nothing).
///
/// Run it last, before `SanityCheckPlan` ([`register`](crate::register) does).
#[derive(Debug, Default, Clone)]
pub struct GpuSortRule {}

impl GpuSortRule {
    /// The rule.
    pub fn new() -> Self {
        Self {}
    }
}

fn replace_sort(sort: &SortExec, options: &GpuSortConfig) -> Result<Option<GpuSortExec>> {
    if sort.fetch().is_some_and(|fetch| fetch <= options.topk_max_fetch) {
        return Ok(None);
    }
    let input = sort.input();
    if input.equivalence_properties().ordering_satisfy(sort.expr().clone())? {
        return Ok(None);
    }
    let schema = input.schema();
    for e in sort.expr().iter() {
        if !gpusort::keys::is_sortable(&e.expr.data_type(&schema)?) {
            return Ok(None);
        }
    }
    Ok(Some(
        GpuSortExec::try_new(sort.expr().clone(), Arc::clone(input))?
            .with_preserve_partitioning(sort.preserve_partitioning())?
            .with_fetch(sort.fetch())
            .with_options(options.clone()),
    ))
}

/// Whether `node` passes its one input's rows through in order, partition by partition, and
/// can be put above a single sort instead of per-partition ones: projections and filters.
/// `keeps_rows`: it also passes every row (a `LIMIT` above it may move
/// below it).
fn order_preserving(node: &Arc<dyn ExecutionPlan>) -> Option<(bool, &Arc<dyn ExecutionPlan>)> {
    let keeps_rows = node.downcast_ref::<ProjectionExec>().is_some();
    let passes = keeps_rows || node.downcast_ref::<FilterExec>().is_some();
    let [child] = node.children()[..] else { return None };
    (passes && node.maintains_input_order() == [true]).then_some((keeps_rows, child))
}

/// A `SortPreservingMergeExec` over per-partition `GpuSortExec`s, with projections and filters
/// between the two (`order_preserving`), as one `GpuSortExec` over all partitions with those
/// nodes above it: `SPM > Projection > GpuSortExec(per partition) > input` becomes
/// `Projection > GpuSortExec > CoalescePartitionsExec > input`.
fn merge_partitions(
    merge: &SortPreservingMergeExec,
    options: &GpuSortConfig,
) -> Result<Option<Arc<dyn ExecutionPlan>>> {
    let mut between = vec![];
    let mut keeps_rows = true;
    let mut node = merge.input();
    while let Some((keeps, child)) = order_preserving(node) {
        between.push(Arc::clone(node));
        keeps_rows &= keeps;
        node = child;
    }
    let Some(sort) = node.downcast_ref::<GpuSortExec>() else {
        return Ok(None);
    };
    if !sort.preserve_partitioning() {
        return Ok(None);
    }
    // SortPreservingMergeExec(fetch = a) over per-partition top-b sorts is the global top a
    // only when each partition keeps at least a rows, and moves below the nodes between only
    // when they keep every row.
    let fetch = match (merge.fetch(), sort.fetch()) {
        (None, s) if between.is_empty() => s,
        (None, None) => None,
        (Some(m), None) if keeps_rows => Some(m),
        (Some(m), Some(s)) if s >= m && keeps_rows => Some(m),
        _ => return Ok(None),
    };
    let coalesced: Arc<dyn ExecutionPlan> = Arc::new(CoalescePartitionsExec::new(Arc::clone(sort.input())));
    let mut top: Arc<dyn ExecutionPlan> = Arc::new(
        GpuSortExec::try_new(sort.expr().clone(), coalesced)?
            .with_fetch(fetch)
            .with_options(options.clone()),
    );
    for node in between.into_iter().rev() {
        top = Arc::clone(&node).replace_children(
            vec![top],
            ReplaceChildrenOptions::new(ChildrenPropertiesMode::Recompute),
        )?;
    }
    if !top.equivalence_properties().ordering_satisfy(merge.expr().clone())? {
        return Ok(None);
    }
    Ok(Some(top))
}

/// A `SortPreservingMergeExec` over sorted partitions as a [`GpuSortPreservingMergeExec`],
/// when it keeps every row or more than `gpusort.topk_max_fetch` of a bounded input of several
/// partitions whose sort keys gpusort encodes.
fn merge_sorted(merge: &SortPreservingMergeExec, options: &GpuSortConfig) -> Result<Option<Arc<dyn ExecutionPlan>>> {
    let input = merge.input();
    if merge.fetch().is_some_and(|fetch| fetch <= options.topk_max_fetch)
        || input.output_partitioning().partition_count() < 2
        || input.boundedness().is_unbounded()
    {
        return Ok(None);
    }
    let schema = input.schema();
    for e in merge.expr().iter() {
        if !gpusort::keys::is_sortable(&e.expr.data_type(&schema)?) {
            return Ok(None);
        }
    }
    Ok(Some(Arc::new(
        GpuSortPreservingMergeExec::try_new(merge.expr().clone(), Arc::clone(input))?
            .with_fetch(merge.fetch())
            .with_options(options.clone()),
    )))
}

impl PhysicalOptimizerRule for GpuSortRule {
    fn optimize(&self, plan: Arc<dyn ExecutionPlan>, config: &ConfigOptions) -> Result<Arc<dyn ExecutionPlan>> {
        let options = GpuSortConfig::from_config(config);
        if !options.enabled {
            return Ok(plan);
        }
        plan.transform_up(|node| {
            let replaced = if let Some(sort) = node.downcast_ref::<SortExec>() {
                replace_sort(sort, &options)?.map(|exec| Arc::new(exec) as Arc<dyn ExecutionPlan>)
            } else if let Some(merge) = node.downcast_ref::<SortPreservingMergeExec>() {
                let one_sort = match options.merge_partitions {
                    true => merge_partitions(merge, &options)?,
                    false => None,
                };
                match one_sort {
                    None if options.merge_sorted_partitions => merge_sorted(merge, &options)?,
                    plan => plan,
                }
            } else if let Some(sink) = node.downcast_ref::<DataSinkExec>()
                && options.parquet_sink
            {
                replace_parquet_sink(sink, &options)?
            } else {
                None
            };
            Ok(match replaced {
                Some(exec) => Transformed::yes(exec),
                None => Transformed::no(node),
            })
        })
        .data()
        .and_then(|plan| match options.device_scan {
            true => with_device_scans(plan),
            false => Ok(plan),
        })
    }

    fn name(&self) -> &str {
        "GpuSortRule"
    }

    fn schema_check(&self) -> bool {
        true
    }
}

/// `plan` with each sort of one partition and no `fetch` whose input only scans local Parquet
/// files told them ([`GpuSortExec::with_device_scan`]): it reads them on the GPU itself.
fn with_device_scans(plan: Arc<dyn ExecutionPlan>) -> Result<Arc<dyn ExecutionPlan>> {
    plan.transform_down(|node| {
        let Some(sort) = node.downcast_ref::<GpuSortExec>() else {
            return Ok(Transformed::no(node));
        };
        let scan = DeviceScan::of_plan(sort.input());
        if sort.preserve_partitioning() || sort.fetch().is_some() || scan.is_none() {
            return Ok(Transformed::no(node));
        }
        let sort = sort.clone().with_device_scan(scan);
        Ok(Transformed::new(Arc::new(sort), true, TreeNodeRecursion::Jump))
    })
    .data()
}

/// A `DataSinkExec` writing a sorted input with DataFusion's `ParquetSink` as one writing it
/// with a [`GpuParquetSink`]: where the input is one [`GpuSortExec`] (or
/// [`GpuSortPreservingMergeExec`]) under projections and filters, and the sink's options are
/// ones gpusort's writer follows. The sort then hands out its batches as they are
/// (`compact_output_views` off): the writer encodes each and drops it.
fn replace_parquet_sink(exec: &DataSinkExec, options: &GpuSortConfig) -> Result<Option<Arc<dyn ExecutionPlan>>> {
    let Some(parquet) = exec.sink().downcast_ref::<ParquetSink>() else {
        return Ok(None);
    };
    if GpuParquetSink::unsupported(parquet.config(), parquet.parquet_options()).is_some() {
        return Ok(None);
    }
    let Some(input) = sorted_for_writing(exec.input())? else {
        return Ok(None);
    };
    let sink = GpuParquetSink::new(
        parquet.config().clone(),
        parquet.parquet_options().clone(),
        input.output_ordering(),
        options,
    );
    Ok(Some(Arc::new(DataSinkExec::new(
        input,
        Arc::new(sink),
        exec.sort_order().clone(),
    ))))
}

/// `plan` with the one sort under its projections and filters handing out its batches
/// uncompacted; `None` where `plan` is not such a sort's single sorted partition.
fn sorted_for_writing(plan: &Arc<dyn ExecutionPlan>) -> Result<Option<Arc<dyn ExecutionPlan>>> {
    if plan.output_partitioning().partition_count() != 1 {
        return Ok(None);
    }
    if let Some(sort) = plan.downcast_ref::<GpuSortExec>() {
        let mut options = sort.options().clone();
        options.compact_output_views = false;
        return Ok(Some(Arc::new(sort.clone().with_options(options))));
    }
    if plan.downcast_ref::<GpuSortPreservingMergeExec>().is_some() {
        return Ok(Some(Arc::clone(plan)));
    }
    let Some((_, child)) = order_preserving(plan) else {
        return Ok(None);
    };
    let Some(child) = sorted_for_writing(child)? else {
        return Ok(None);
    };
    Ok(Some(Arc::clone(plan).replace_children(
        vec![child],
        ReplaceChildrenOptions::new(ChildrenPropertiesMode::Recompute),
    )?))
}
