//! [`GpuSortRule`]: puts [`GpuSortExec`] where DataFusion planned a `SortExec`.

use std::sync::Arc;

use datafusion::common::config::ConfigOptions;
use datafusion::common::tree_node::{Transformed, TransformedResult, TreeNode};
use datafusion::error::Result;
use datafusion::physical_optimizer::PhysicalOptimizerRule;
use datafusion::physical_plan::coalesce_partitions::CoalescePartitionsExec;
use datafusion::physical_plan::sorts::sort::SortExec;
use datafusion::physical_plan::sorts::sort_preserving_merge::SortPreservingMergeExec;
use datafusion::physical_plan::{ExecutionPlan, ExecutionPlanProperties};

use crate::config::GpuSortConfig;
use crate::exec::GpuSortExec;

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
/// and a CPU merge.
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

fn merge_partitions(merge: &SortPreservingMergeExec, options: &GpuSortConfig) -> Result<Option<GpuSortExec>> {
    let Some(sort) = merge.input().downcast_ref::<GpuSortExec>() else {
        return Ok(None);
    };
    if !sort.preserve_partitioning() {
        return Ok(None);
    }
    // SortPreservingMergeExec(fetch = a) over per-partition top-b sorts is the global top a
    // only when each partition keeps at least a rows.
    let fetch = match (merge.fetch(), sort.fetch()) {
        (m, None) => m,
        (Some(m), Some(s)) if s >= m => Some(m),
        _ => return Ok(None),
    };
    let coalesced: Arc<dyn ExecutionPlan> = Arc::new(CoalescePartitionsExec::new(Arc::clone(sort.input())));
    let single = GpuSortExec::try_new(sort.expr().clone(), coalesced)?
        .with_fetch(fetch)
        .with_options(options.clone());
    if !single
        .properties()
        .equivalence_properties()
        .ordering_satisfy(merge.expr().clone())?
    {
        return Ok(None);
    }
    Ok(Some(single))
}

impl PhysicalOptimizerRule for GpuSortRule {
    fn optimize(&self, plan: Arc<dyn ExecutionPlan>, config: &ConfigOptions) -> Result<Arc<dyn ExecutionPlan>> {
        let options = GpuSortConfig::from_config(config);
        if !options.enabled {
            return Ok(plan);
        }
        plan.transform_up(|node| {
            let replaced = if let Some(sort) = node.downcast_ref::<SortExec>() {
                replace_sort(sort, &options)?
            } else if let Some(merge) = node.downcast_ref::<SortPreservingMergeExec>()
                && options.merge_partitions
            {
                merge_partitions(merge, &options)?
            } else {
                None
            };
            Ok(match replaced {
                Some(exec) => Transformed::yes(Arc::new(exec) as Arc<dyn ExecutionPlan>),
                None => Transformed::no(node),
            })
        })
        .data()
    }

    fn name(&self) -> &str {
        "GpuSortRule"
    }

    fn schema_check(&self) -> bool {
        true
    }
}
