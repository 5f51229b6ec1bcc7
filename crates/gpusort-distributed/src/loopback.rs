//! Workers on loopback (127.0.0.1) in this process: for examples, tests and benches that run
//! a distributed query on one machine (the workers share its cores and its GPU).

use datafusion::error::{DataFusionError, Result};
use datafusion::execution::SessionStateBuilder;
use datafusion::prelude::{SessionConfig, SessionContext};
use datafusion_distributed::WorkerResolver;
use tokio::task::JoinHandle;

use crate::{DistributedSortOptions, coordinator_session, worker};

/// The workers on this machine's loopback ports (`http://127.0.0.1:PORT`).
#[derive(Debug, Clone)]
pub struct LoopbackWorkers {
    /// Their ports.
    pub ports: Vec<u16>,
}

impl WorkerResolver for LoopbackWorkers {
    fn get_urls(&self) -> Result<Vec<url::Url>> {
        self.ports
            .iter()
            .map(|port| {
                url::Url::parse(&format!("http://127.0.0.1:{port}")).map_err(|e| DataFusionError::External(Box::new(e)))
            })
            .collect()
    }
}

/// Starts a [`worker`] on a free port of 127.0.0.1, served on the current tokio runtime
/// until the returned task is aborted (or the runtime ends); returns the port.
pub async fn serve_worker_on_loopback() -> std::io::Result<(u16, JoinHandle<()>)> {
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

/// `N` [`worker`]s served on loopback by the current tokio runtime, stopped when this is
/// dropped, and coordinator sessions that use them.
#[derive(Debug)]
pub struct LoopbackCluster {
    workers: LoopbackWorkers,
    tasks: Vec<JoinHandle<()>>,
}

impl LoopbackCluster {
    /// Starts `workers` workers (at least one), each on a free port.
    pub async fn try_new(workers: usize) -> Result<Self> {
        let mut ports = vec![];
        let mut tasks = vec![];
        for _ in 0..workers.max(1) {
            let (port, task) = serve_worker_on_loopback().await?;
            ports.push(port);
            tasks.push(task);
        }
        Ok(Self {
            workers: LoopbackWorkers { ports },
            tasks,
        })
    }

    /// The workers' resolver (their ports).
    pub fn workers(&self) -> &LoopbackWorkers {
        &self.workers
    }

    /// A coordinator's context ([`coordinator_session`]) with `config`, whose sorts spread
    /// over all the workers, `ranges_per_worker` ranges each.
    pub fn context(&self, config: SessionConfig, ranges_per_worker: usize) -> SessionContext {
        let options = DistributedSortOptions {
            ranges_per_worker,
            ..DistributedSortOptions::new(self.workers.ports.len())
        };
        let builder = SessionStateBuilder::new().with_default_features().with_config(config);
        SessionContext::new_with_state(coordinator_session(builder, self.workers.clone(), options))
    }
}

impl Drop for LoopbackCluster {
    fn drop(&mut self) {
        self.tasks.iter().for_each(|t| t.abort());
    }
}
