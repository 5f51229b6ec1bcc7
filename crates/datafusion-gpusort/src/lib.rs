//! datafusion-gpusort: gpusort as a DataFusion physical operator — [`GpuSortExec`] and
//! [`GpuSortPreservingMergeExec`], the [`GpuSortRule`] that puts them where DataFusion plans a
//! `SortExec` or a `SortPreservingMergeExec` (and [`GpuParquetSink`] where their output is
//! written to Parquet), their `gpusort.*` config options ([`GpuSortConfig`]) and metrics. No kernels live here: the sorts run on
//! `gpusort-cuda`'s GPU backend or `gpusort`'s CPU backend.
//!
//! One line turns it on:
//!
//! ```no_run
//! use datafusion::execution::SessionStateBuilder;
//! use datafusion::prelude::SessionContext;
//!
//! let state = datafusion_gpusort::register(SessionStateBuilder::new().with_default_features()).build();
//! let ctx = SessionContext::new_with_state(state);
//! // ctx.sql("SELECT * FROM t ORDER BY a DESC LIMIT 10") now sorts on the GPU.
//! ```

mod config;
mod device;
mod device_output;
mod device_scan;
mod error;
mod exec;
mod in_memory;
mod merge;
mod metrics;
mod multi_level_merge;
mod narrow_keys;
mod parquet_sink;
mod partition_runs;
mod range_merge;
mod rule;
mod run;
mod run_store;
mod sort_preserving_merge;
mod sorter;
mod strategy_name;

use std::sync::Arc;

use datafusion::execution::SessionStateBuilder;
use datafusion::physical_optimizer::sanity_checker::SanityCheckPlan;
use datafusion::prelude::SessionConfig;

pub use config::{ByteSize, DeviceChoice, DeviceList, GpuSortConfig, StrategyChoice};
pub use device::gpu_backend;
pub use device_scan::{DeviceScan, ROW_GROUPS_A_CALL};
pub use error::GpuSortExecError;
pub use exec::GpuSortExec;
pub use metrics::{GpuSortMetrics, TextMetric};
pub use parquet_sink::GpuParquetSink;
pub use rule::GpuSortRule;
pub use sort_preserving_merge::GpuSortPreservingMergeExec;

/// Turns gpusort on in a session being built: registers the `gpusort.*` options (unless the
/// config has them already) and appends [`GpuSortRule`], followed by another
/// `SanityCheckPlan` so that the rewritten plan is checked too.
pub fn register(mut builder: SessionStateBuilder) -> SessionStateBuilder {
    let config = builder.config().get_or_insert_with(SessionConfig::new);
    if config.options().extensions.get::<GpuSortConfig>().is_none() {
        config.options_mut().extensions.insert(GpuSortConfig::default());
    }
    builder
        .with_physical_optimizer_rule(Arc::new(GpuSortRule::new()))
        .with_physical_optimizer_rule(Arc::new(SanityCheckPlan::new()))
}

/// [`register`] as a method: `SessionStateBuilder::new().with_default_features().with_gpusort()`.
pub trait SessionStateBuilderExt {
    /// See [`register`].
    fn with_gpusort(self) -> Self;
}

impl SessionStateBuilderExt for SessionStateBuilder {
    fn with_gpusort(self) -> Self {
        register(self)
    }
}
