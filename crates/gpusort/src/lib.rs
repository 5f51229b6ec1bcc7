//! gpusort core: what to sort by ([`SortSpec`]), order-preserving radix keys ([`keys`]),
//! the sort planner with the cost rule of Bandyopadhyay & Sahni ([`plan`]), the backend
//! trait every sorter implements ([`SortBackend`]), and the multi-threaded CPU radix sort
//! backend ([`cpu::CpuBackend`]) that runs when there is no GPU and is the reference the GPU
//! backend is tested against, and the split of one sort over several sorters by key ranges
//! ([`split`], [`partition`]), and hollow columns for rows that went to a device ([`hollow`]).
//! This crate holds no GPU code.

pub mod backend;
pub mod cpu;
pub mod error;
pub mod hollow;
pub mod keys;
pub mod partition;
pub mod plan;
pub mod size;
pub mod spec;
pub mod split;
pub mod ties;

pub use backend::{SortBackend, SortOutput, SortRequest, SortStats};
pub use cpu::CpuBackend;
pub use error::{GpusortError, Result};
pub use keys::{EncodedKeys, EncoderOptions, KeyEncoder, KeyLayout};
pub use plan::{Algorithm, Layout, RecordMove, Strategy};
pub use size::parse_byte_size;
pub use spec::{SortKey, SortOptions, SortSpec};
pub use split::{SplitBackend, SplitOptions};
