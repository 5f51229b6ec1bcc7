//! gpusort-distributed: `ORDER BY` with [`GpuSortExec`](datafusion_gpusort::GpuSortExec) on the
//! datafusion-distributed engine (crate `datafusion-distributed` 4.x, its release for
//! DataFusion 55) — a codec that ships gpusort's plan nodes to the workers, and a
//! range-partitioned distributed sort that needs no final merge.
//!
//! # How a distributed `ORDER BY` runs
//!
//! [`RangeSortPlanner`] is a DataFusion query planner put under datafusion-distributed's own.
//! For a query whose result is a full sort (no `LIMIT`) of a Parquet scan with projections and
//! filters above it, it plans two distributed jobs, as Spark's `RangePartitioner` does:
//!
//! 1. **Sample.** Each of the `M` workers scans its share of the input, numbers its rows with
//!    their position in the input ([`RowPositionExec`]: file range, then row) and keeps a
//!    uniform sample of their sort keys ([`SampleExec`], a seeded reservoir); the coordinator
//!    collects the samples and picks `M × P - 1` splitters over gpusort's order-preserving keys
//!    ([`gpusort::partition::Splitters`]), in `(key, position)` order.
//! 2. **Sort.** Each worker scans its share again and sends every row to the range the
//!    splitters give it ([`RangeRouteExec`] through datafusion-distributed's network shuffle);
//!    ties are split across ranges by position, so a key that fills the input (all keys
//!    equal, zipf) still spreads over the workers. Each worker sorts each of its `P` ranges
//!    with `GpuSortExec` (on the GPU, or the CPU) by the keys and then the position, so the
//!    sort is stable; the coordinator reads the ranges one after the other
//!    ([`OrderedConcatExec`]): the result is in order with no merge.
//!
//! Any other plan (a `LIMIT`, a join below the sort, a scan declared sorted or partitioned, no
//! sort) is left to datafusion-distributed, and so is `EXPLAIN` (it shows that plan; the
//! plan of a query, with its stages, is `create_physical_plan`'s).
//!
//! **Which order ties keep.** A row's position is its place in the scan with the files in path
//! order and each file's rows in file order, so rows with equal keys come out as a
//! single-node scan of the files in that order reads them: the result equals a single-node
//! stable sort row for row. Workers read their byte ranges in that order (the coordinator's
//! plan and [`worker`]'s plan rewrite turn off DataFusion's file stealing between scan
//! partitions for these scans).
//!
//! **Splitter quality.** [`RangeRouteExec`] counts the rows it sends to each range; the
//! workers' metrics travel back to the coordinator, and [`RangeSortMetrics`] reads them from
//! the executed plan ([`collect_with_metrics`]): rows per range, largest over mean, and where
//! the range sorts ran. The partitions' key samples are thinned to one uniform sample of the
//! input first ([`thin_to_uniform`]), so a small scan partition does not pull the splitters.
//!
//! # Setting it up
//!
//! The coordinator's session: [`coordinator_session`]; each worker: [`worker`] (an Arrow Flight
//! service to serve with tonic). Both register [`GpuSortCodec`], the codec of
//! `GpuSortExec` (its sort expressions, `fetch`, partitioning and `gpusort.*` options) and of
//! this crate's nodes. [`LoopbackCluster`] starts workers on 127.0.0.1 in this process, for
//! examples, tests and benches on one machine.

mod codec;
mod exec;
mod loopback;
mod metrics;
mod planner;
mod route;
mod sample;

use std::sync::Arc;

use datafusion::execution::SessionStateBuilder;
use datafusion::execution::context::SessionState;
use datafusion_distributed::{
    DistributedExt, SessionStateBuilderExt, Worker, WorkerPlanRewriteEvent, WorkerPlanRewriteEventResponse,
    WorkerQueryContext, WorkerResolver,
};

pub use codec::GpuSortCodec;
pub use exec::{
    OrderedConcatExec, POSITION_COLUMN, RANGE_LABEL, RANGE_ROWS_METRIC, ROUTE_COLUMN, RangeRouteExec, RowPositionExec,
    keep_file_order,
};
pub use loopback::{LoopbackCluster, LoopbackWorkers, serve_worker_on_loopback};
pub use metrics::{RangeSortMetrics, collect_with_metrics, sorts_by_device};
pub use planner::{DistributedSortOptions, RangeSortPlanner};
pub use route::route_values;
pub use sample::{SEEN_COLUMN, SampleExec, thin_to_uniform};

/// The coordinator's session: gpusort's rule and options ([`datafusion_gpusort::register`]),
/// the [`RangeSortPlanner`] under datafusion-distributed's planner, the workers `resolver`
/// names, and [`GpuSortCodec`]. `builder` is the session being built (its config, runtime and
/// features); `options` say how many workers and ranges.
pub fn coordinator_session(
    builder: SessionStateBuilder,
    resolver: impl WorkerResolver + 'static,
    options: DistributedSortOptions,
) -> SessionState {
    datafusion_gpusort::register(builder)
        .with_query_planner(Arc::new(RangeSortPlanner::new(options)))
        .with_distributed_planner()
        .with_distributed_worker_resolver(resolver)
        .with_distributed_user_codec(GpuSortCodec)
        .build()
}

/// A worker that runs plans with gpusort's nodes: datafusion-distributed's [`Worker`] with
/// [`GpuSortCodec`] in its sessions, and a plan rewrite that makes the file scans under a
/// [`RowPositionExec`] read their files in order ([`keep_file_order`]). Serve it with
/// `tonic::transport::Server::builder().add_service(worker().into_worker_server())`.
pub fn worker() -> Worker {
    Worker::from_session_builder(|ctx: WorkerQueryContext| async move {
        Ok(datafusion_gpusort::register(ctx.builder)
            .with_distributed_user_codec(GpuSortCodec)
            .with_distributed_worker_plan_rewrite_handler(|ev: WorkerPlanRewriteEvent<'_>| {
                Ok(WorkerPlanRewriteEventResponse::new(keep_file_order(ev.plan)?))
            })
            .build())
    })
}
