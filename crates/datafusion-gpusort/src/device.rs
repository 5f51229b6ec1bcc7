//! Which backend sorts: the process's GPU backends, opened once and shared by every query
//! (a CUDA context and the kernels cost ~0.7 s to set up), or the CPU backend.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use gpusort::CpuBackend;
use gpusort_cuda::CudaBackend;

type Opened = Result<Arc<CudaBackend>, String>;

fn opened() -> &'static Mutex<HashMap<usize, Opened>> {
    static GPUS: OnceLock<Mutex<HashMap<usize, Opened>>> = OnceLock::new();
    GPUS.get_or_init(Default::default)
}

/// The backend of GPU `ordinal`, opened on first use; or why there is none (no driver, no
/// NVRTC, no such device...). The answer is kept for the life of the process.
pub fn gpu_backend(ordinal: usize) -> Result<Arc<CudaBackend>, String> {
    let mut gpus = opened().lock().unwrap_or_else(|p| p.into_inner());
    gpus.entry(ordinal)
        .or_insert_with(|| match CudaBackend::try_new(ordinal) {
            Ok(b) => Ok(Arc::new(b)),
            Err(e) => Err(e.to_string()),
        })
        .clone()
}

/// The process's CPU backend.
pub fn cpu_backend() -> &'static CpuBackend {
    static CPU: OnceLock<CpuBackend> = OnceLock::new();
    CPU.get_or_init(CpuBackend::new)
}
