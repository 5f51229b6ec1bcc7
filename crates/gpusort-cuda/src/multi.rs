//! [`MultiGpuBackend`]: one sort over several GPUs of a host, split by key ranges.
//!
//! The split is the core's ([`gpusort::split`]): splitters from a sample of the keys, the
//! rows assigned to key ranges on all cores, one range a GPU; each GPU sorts its range with
//! the one-GPU engine ([`CudaBackend::sort_within`], every strategy, the device's own budget
//! and kernels), all GPUs at once, and the ranges concatenate in order: the stable sort of
//! the input, with no merge. Rows reach each GPU from host memory through its own pinned
//! staging and copy streams (no peer copies: the rows start and end on the host, so a
//! range's rows cross PCIe once each way either way).
//!
//! A sort with fewer rows than two ranges are worth ([`SplitOptions::min_rows_per_range`])
//! runs on the first GPU alone, as does a sort with a single GPU.

use std::sync::Arc;

use gpusort::split::{concat_outputs, sort_split};
use gpusort::{SortBackend, SortOutput, SortRequest, SplitOptions};

use crate::backend::CudaBackend;
use crate::error::{CudaSortError, Result};

/// The GPU backend over several devices (see the module docs).
#[derive(Debug, Clone)]
pub struct MultiGpuBackend {
    gpus: Vec<Arc<CudaBackend>>,
    options: SplitOptions,
}

impl MultiGpuBackend {
    /// A backend over `gpus` (one or more, each used for one key range of a sort).
    pub fn try_new(gpus: Vec<Arc<CudaBackend>>) -> Result<Self> {
        if gpus.is_empty() {
            return Err(CudaSortError::Unsupported(
                "a multi-GPU sort needs one or more GPUs".into(),
            ));
        }
        Ok(Self {
            gpus,
            options: SplitOptions::default(),
        })
    }

    /// Opens GPUs `ordinals` (each with the process's kernel cache).
    pub fn open(ordinals: &[usize]) -> Result<Self> {
        let gpus = ordinals
            .iter()
            .map(|&o| CudaBackend::try_new(o).map(Arc::new))
            .collect::<Result<Vec<_>>>()?;
        Self::try_new(gpus)
    }

    /// Splits sorts with these options.
    pub fn with_options(mut self, options: SplitOptions) -> Self {
        self.options = options;
        self
    }

    /// The GPUs, in range order.
    pub fn gpus(&self) -> &[Arc<CudaBackend>] {
        &self.gpus
    }

    /// The split's options.
    pub fn options(&self) -> &SplitOptions {
        &self.options
    }

    /// Sorts `request` over the GPUs, each range within `memory_limit` bytes of its GPU's
    /// memory (see [`CudaBackend::sort_within`]), and returns the ranges' sorted outputs in
    /// order, their permutations in input rows: concatenated, they are the sorted input (each
    /// range holds at most `request.limit` rows; so may their concatenation, past the limit).
    pub fn sort_ranges_within(
        &self,
        request: &SortRequest<'_>,
        memory_limit: Option<usize>,
    ) -> Result<Vec<SortOutput>> {
        request.check_rows()?;
        sort_split(request, self.gpus.len(), &self.options, |i, range| {
            self.gpus[i].sort_within(range, memory_limit)
        })
    }

    /// Sorts like [`SortBackend::sort`], each range within `memory_limit` bytes of its GPU.
    pub fn sort_within(&self, request: &SortRequest<'_>, memory_limit: Option<usize>) -> Result<SortOutput> {
        let mut outputs = self.sort_ranges_within(request, memory_limit)?;
        if outputs.len() == 1 {
            return Ok(outputs.pop().expect("one output"));
        }
        Ok(concat_outputs(request, outputs)?)
    }
}

impl SortBackend for MultiGpuBackend {
    fn name(&self) -> String {
        let ordinals: Vec<String> = self.gpus.iter().map(|g| g.gpu().info().ordinal.to_string()).collect();
        format!("cuda:{}", ordinals.join("+"))
    }

    fn sort(&self, request: &SortRequest<'_>) -> gpusort::Result<SortOutput> {
        self.sort_within(request, None).map_err(Into::into)
    }
}
