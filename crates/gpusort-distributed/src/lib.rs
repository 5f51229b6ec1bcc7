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
//! # Setting it up
//!
//! The coordinator's session: [`coordinator_session`]; each worker: [`worker`] (an Arrow Flight
//! service to serve with tonic). Both register [`GpuSortCodec`], the codec of
//! `GpuSortExec` (its sort expressions, `fetch`, partitioning and `gpusort.*` options) and of
//! this crate's nodes.

mod codec;
mod exec;
mod planner;
mod route;

use std::sync::Arc;

use datafusion::execution::SessionStateBuilder;
use datafusion::execution::context::SessionState;
use datafusion_distributed::{
    DistributedExt, SessionStateBuilderExt, Worker, WorkerPlanRewriteEvent, WorkerPlanRewriteEventResponse,
    WorkerQueryContext, WorkerResolver,
};

pub use codec::GpuSortCodec;
pub use exec::{
    OrderedConcatExec, POSITION_COLUMN, ROUTE_COLUMN, RangeRouteExec, RowPositionExec, SampleExec, keep_file_order,
};
pub use planner::{DistributedSortOptions, RangeSortPlanner};
pub use route::route_values;

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

/// The workers on this machine's loopback ports (`http://127.0.0.1:PORT`).
#[derive(Debug, Clone)]
pub struct LoopbackWorkers {
    /// Their ports.
    pub ports: Vec<u16>,
}

impl WorkerResolver for LoopbackWorkers {
    fn get_urls(&self) -> datafusion::error::Result<Vec<url::Url>> {
        self.ports
            .iter()
            .map(|port| {
                url::Url::parse(&format!("http://127.0.0.1:{port}"))
                    .map_err(|e| datafusion::error::DataFusionError::External(Box::new(e)))
            })
            .collect()
    }
}

/// Starts a [`worker`] on a free port of 127.0.0.1, served on the current tokio runtime
/// until the returned task is aborted (or the runtime ends); returns the port.
pub async fn serve_worker_on_loopback() -> std::io::Result<(u16, tokio::task::JoinHandle<()>)> {
    let listener = tokio::net::TcpListener::bind((std::net::Ipv4Addr::LOCALHOST, 0)).await?;
    let port = listener.local_addr()?.port();
    let incoming = tonic::transport::server::TcpIncoming::from(listener);
    let task = tokio::spawn(async move {
        let served = tonic::transport::Server::builder()
            .add_service(worker().into_worker_server())
            .serve_with_incoming(incoming)
            .await;
        if let Err(e) = served {
            log::error!(target: "gpusort::distributed", "worker on port {port}: {e}");
        }
    });
    Ok((port, task))
}
