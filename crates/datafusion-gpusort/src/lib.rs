//! datafusion-gpusort: gpusort as a DataFusion physical operator — `GpuSortExec`, the
//! `GpuSortRule` that puts it where DataFusion plans a `SortExec`, its config options and
//! metrics, and the external sorter on DataFusion's memory pool and spill manager.
//! No kernels live here.
//!
//! Not built yet: for now this crate holds the benchmark of the CPU backend against
//! DataFusion's own `ORDER BY` (`benches/cpu_backend.rs`).
