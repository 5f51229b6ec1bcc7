//! Which backend sorts: the process's GPU backends, opened once and shared by every query
//! (a CUDA context and the kernels cost ~0.7 s to set up), or the CPU backend.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use gpusort::CpuBackend;
use gpusort_cuda::CudaBackend;

use crate::config::DeviceList;

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

/// The backends of the GPUs `devices` names (`gpusort.devices`), opened on first use; `None`
/// for [`DeviceList::One`]; or why one of them is not usable.
pub fn gpu_backends(devices: &DeviceList) -> Option<Result<Vec<Arc<CudaBackend>>, String>> {
    let ordinals: Vec<usize> = match devices {
        DeviceList::One => return None,
        DeviceList::All => match gpusort_cuda::device::device_count() {
            Ok(n) => (0..n).collect(),
            Err(e) => return Some(Err(gpusort_cuda::CudaSortError::from(e).to_string())),
        },
        DeviceList::List(l) => l.clone(),
    };
    Some(ordinals.into_iter().map(gpu_backend).collect())
}

/// The process's CPU backend.
pub fn cpu_backend() -> &'static CpuBackend {
    static CPU: OnceLock<CpuBackend> = OnceLock::new();
    CPU.get_or_init(CpuBackend::new)
}
