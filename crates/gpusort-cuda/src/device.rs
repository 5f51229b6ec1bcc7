//! Finding a GPU: whether the CUDA driver and NVRTC can be loaded, which devices there are,
//! and what they offer. Nothing here panics when CUDA is missing: the driver library is
//! looked for (with cudarc's `is_culib_present`) before any driver call is made.

use std::fmt;

use cudarc::driver::{CudaContext, sys};

/// Why there is no usable GPU: a reason the caller can show (in metrics, `EXPLAIN ANALYZE`,
/// `gpusort info`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GpuUnavailable {
    /// The CUDA driver library (libcuda) cannot be loaded.
    #[error("the CUDA driver (libcuda) is not installed")]
    NoDriver,
    /// NVRTC (libnvrtc), which compiles the kernels, cannot be loaded.
    #[error("NVRTC (libnvrtc), which compiles the kernels, is not installed")]
    NoNvrtc,
    /// The driver reports no CUDA device.
    #[error("no CUDA device found")]
    NoDevice,
    /// The requested device does not exist.
    #[error("device {ordinal} requested, but there are {count} CUDA devices")]
    NoSuchDevice {
        /// Requested ordinal.
        ordinal: usize,
        /// Devices present.
        count: usize,
    },
    /// The device is older than the kernels need (`__match_any_sync`: compute capability 7.0).
    #[error("device {name} has compute capability {major}.{minor}; 7.0 or newer is needed")]
    TooOld {
        /// Device name.
        name: String,
        /// Major compute capability.
        major: i32,
        /// Minor compute capability.
        minor: i32,
    },
    /// The installed NVRTC does not compile for the device's architecture (NVRTC 13 offers
    /// no Volta, sm_70 / sm_72).
    #[error("NVRTC {nvrtc_major}.{nvrtc_minor} does not compile for {arch} (device {name}); an NVRTC of CUDA 12 does")]
    ArchNotOffered {
        /// Device name.
        name: String,
        /// The device's architecture, e.g. `sm_70`.
        arch: String,
        /// NVRTC's major version.
        nvrtc_major: i32,
        /// NVRTC's minor version.
        nvrtc_minor: i32,
    },
    /// The driver failed to start.
    #[error("the CUDA driver failed: {0}")]
    Driver(String),
    /// The GPU was turned off by configuration.
    #[error("the GPU is disabled: {0}")]
    Disabled(String),
}

/// What a device is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceInfo {
    /// Device ordinal.
    pub ordinal: usize,
    /// Name, e.g. `NVIDIA H100 80GB HBM3`.
    pub name: String,
    /// Compute capability (major, minor).
    pub compute_capability: (i32, i32),
    /// Streaming multiprocessors.
    pub multiprocessors: u32,
    /// Total device memory in bytes.
    pub total_memory: usize,
    /// Most shared memory one block may use, static and dynamic, with opt-in
    /// (`MAX_SHARED_MEMORY_PER_BLOCK_OPTIN`; 227 KiB on the H100, 163 KiB on the A100, 99 KiB on
    /// sm_86/sm_89, 96 KiB on the V100).
    pub smem_per_block: usize,
    /// Shared memory of one SM (`MAX_SHARED_MEMORY_PER_MULTIPROCESSOR`; 228 KiB on the H100).
    pub smem_per_sm: usize,
    /// Threads resident on one SM (`MAX_THREADS_PER_MULTIPROCESSOR`; 2048 on the H100).
    pub threads_per_sm: u32,
    /// 32-bit registers of one SM (`MAX_REGISTERS_PER_MULTIPROCESSOR`).
    pub registers_per_sm: u32,
    /// L2 cache bytes (`L2_CACHE_SIZE`).
    pub l2_bytes: usize,
    /// Free device memory in bytes when probed.
    pub free_memory: usize,
    /// CUDA driver version, e.g. 13000 for 13.0.
    pub driver_version: i32,
    /// NVRTC version (major, minor).
    pub nvrtc_version: (i32, i32),
}

impl DeviceInfo {
    /// The attributes of an H100 80GB HBM3 (132 SMs, 227 KiB of shared memory a block, driver
    /// and NVRTC 13.0, 79 GiB free): a device to plan for without one, in tests and examples
    /// (kernel shapes, tuning profiles, `gpusort info`).
    pub fn h100_example() -> Self {
        Self {
            ordinal: 0,
            name: "NVIDIA H100 80GB HBM3".into(),
            compute_capability: (9, 0),
            multiprocessors: 132,
            total_memory: 80 << 30,
            smem_per_block: 227 << 10,
            smem_per_sm: 228 << 10,
            threads_per_sm: 2048,
            registers_per_sm: 65536,
            l2_bytes: 50 << 20,
            free_memory: 79 << 30,
            driver_version: 13000,
            nvrtc_version: (13, 0),
        }
    }

    /// The architecture name NVRTC compiles for, e.g. `sm_90`.
    pub fn arch(&self) -> String {
        format!("sm_{}{}", self.compute_capability.0, self.compute_capability.1)
    }
}

impl fmt::Display for DeviceInfo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "cuda:{} {} ({}, {} SMs, {} KiB shared memory per block, {} threads an SM, {} MiB L2, {:.1} GiB, \
             {:.1} GiB free; driver {}.{}, NVRTC {}.{})",
            self.ordinal,
            self.name,
            self.arch(),
            self.multiprocessors,
            self.smem_per_block >> 10,
            self.threads_per_sm,
            self.l2_bytes >> 20,
            self.total_memory as f64 / (1u64 << 30) as f64,
            self.free_memory as f64 / (1u64 << 30) as f64,
            self.driver_version / 1000,
            self.driver_version % 1000 / 10,
            self.nvrtc_version.0,
            self.nvrtc_version.1,
        )
    }
}

/// True when the CUDA driver library can be loaded.
pub fn driver_present() -> bool {
    // SAFETY: only tries to load the library.
    unsafe { sys::is_culib_present() }
}

/// True when NVRTC can be loaded.
pub fn nvrtc_present() -> bool {
    // SAFETY: only tries to load the library.
    unsafe { cudarc::nvrtc::sys::is_culib_present() }
}

/// NVRTC's version; NVRTC must be present.
pub(crate) fn nvrtc_version() -> (i32, i32) {
    let (mut major, mut minor) = (0, 0);
    // SAFETY: NVRTC is loaded (checked by callers); the call writes two ints.
    unsafe { cudarc::nvrtc::sys::nvrtcVersion(&mut major, &mut minor) };
    (major, minor)
}

/// The architectures NVRTC compiles for, as compute capabilities times ten (e.g. 90 for
/// `sm_90`), or `None` when NVRTC is not installed. NVRTC 13.0 offers 75 to 121: CUDA 13 dropped
/// Volta (sm_70, sm_72).
pub fn nvrtc_supported_archs() -> Option<Vec<i32>> {
    if !nvrtc_present() {
        return None;
    }
    let mut n = 0;
    // SAFETY: NVRTC is loaded; the call writes one int.
    unsafe { cudarc::nvrtc::sys::nvrtcGetNumSupportedArchs(&mut n) }
        .result()
        .ok()?;
    let mut archs = vec![0; n.max(0) as usize];
    // SAFETY: the buffer holds the count NVRTC reported.
    unsafe { cudarc::nvrtc::sys::nvrtcGetSupportedArchs(archs.as_mut_ptr()) }
        .result()
        .ok()?;
    Some(archs)
}

/// The CUDA driver's version (e.g. 13000 for 13.0), or `None` when the driver is not
/// installed. Needs no device.
pub fn driver_version() -> Option<i32> {
    if !driver_present() {
        return None;
    }
    let mut version = 0;
    // SAFETY: the driver is loaded; cuDriverGetVersion needs no cuInit and writes one int.
    let result = unsafe { sys::cuDriverGetVersion(&mut version) };
    (result == sys::cudaError_enum::CUDA_SUCCESS).then_some(version)
}

/// NVRTC's version (major, minor), or `None` when NVRTC is not installed.
pub fn installed_nvrtc_version() -> Option<(i32, i32)> {
    nvrtc_present().then(nvrtc_version)
}

/// The libraries are there, or why not.
pub fn check_libraries() -> Result<(), GpuUnavailable> {
    if !driver_present() {
        return Err(GpuUnavailable::NoDriver);
    }
    if !nvrtc_present() {
        return Err(GpuUnavailable::NoNvrtc);
    }
    Ok(())
}

/// Number of CUDA devices (0 when there is no driver).
pub fn device_count() -> Result<usize, GpuUnavailable> {
    check_libraries()?;
    CudaContext::device_count().map(|c| c as usize).map_err(|e| match e.0 {
        sys::cudaError_enum::CUDA_ERROR_NO_DEVICE => GpuUnavailable::NoDevice,
        _ => GpuUnavailable::Driver(e.to_string()),
    })
}

/// Opens a context on device `ordinal` and describes it.
pub(crate) fn open(ordinal: usize) -> Result<(std::sync::Arc<CudaContext>, DeviceInfo), GpuUnavailable> {
    let count = device_count()?;
    if count == 0 {
        return Err(GpuUnavailable::NoDevice);
    }
    if ordinal >= count {
        return Err(GpuUnavailable::NoSuchDevice { ordinal, count });
    }
    let driver = |e: cudarc::driver::DriverError| GpuUnavailable::Driver(e.to_string());
    let ctx = CudaContext::new(ordinal).map_err(driver)?;
    let name = ctx.name().map_err(driver)?;
    let compute_capability = ctx.compute_capability().map_err(driver)?;
    if compute_capability.0 < 7 {
        return Err(GpuUnavailable::TooOld {
            name,
            major: compute_capability.0,
            minor: compute_capability.1,
        });
    }
    let nvrtc = nvrtc_version();
    let cc = compute_capability.0 * 10 + compute_capability.1;
    if nvrtc_supported_archs().is_some_and(|offered| !offered.is_empty() && !offered.contains(&cc)) {
        return Err(GpuUnavailable::ArchNotOffered {
            name,
            arch: format!("sm_{cc}"),
            nvrtc_major: nvrtc.0,
            nvrtc_minor: nvrtc.1,
        });
    }
    let (free_memory, total_memory) = ctx.mem_get_info().map_err(driver)?;
    let multiprocessors = ctx
        .attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
        .map_err(driver)? as u32;
    let attr = |a| ctx.attribute(a).map_err(driver);
    let smem_per_block = attr(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)? as usize;
    let smem_per_sm = attr(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR)? as usize;
    let threads_per_sm = attr(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR)? as u32;
    let registers_per_sm = attr(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_MULTIPROCESSOR)? as u32;
    let l2_bytes = attr(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE)? as usize;
    let mut driver_version = 0;
    // SAFETY: the driver is loaded; the call writes one int.
    unsafe { sys::cuDriverGetVersion(&mut driver_version) };
    let info = DeviceInfo {
        ordinal,
        name,
        compute_capability,
        multiprocessors,
        total_memory,
        smem_per_block,
        smem_per_sm,
        threads_per_sm,
        registers_per_sm,
        l2_bytes,
        free_memory,
        driver_version,
        nvrtc_version: nvrtc,
    };
    Ok((ctx, info))
}

/// Describes device `ordinal`, or says why it cannot be used. Never panics.
pub fn probe(ordinal: usize) -> Result<DeviceInfo, GpuUnavailable> {
    open(ordinal).map(|(_, info)| info)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reasons_read_well() {
        assert_eq!(
            GpuUnavailable::NoDriver.to_string(),
            "the CUDA driver (libcuda) is not installed"
        );
        let e = GpuUnavailable::NoSuchDevice { ordinal: 3, count: 1 };
        assert_eq!(e.to_string(), "device 3 requested, but there are 1 CUDA devices");
        let e = GpuUnavailable::ArchNotOffered {
            name: "Tesla V100-SXM2-16GB".into(),
            arch: "sm_70".into(),
            nvrtc_major: 13,
            nvrtc_minor: 0,
        };
        assert_eq!(
            e.to_string(),
            "NVRTC 13.0 does not compile for sm_70 (device Tesla V100-SXM2-16GB); an NVRTC of CUDA 12 does"
        );
        let info = DeviceInfo::h100_example();
        assert_eq!(info.arch(), "sm_90");
        assert!(
            info.to_string()
                .contains("132 SMs, 227 KiB shared memory per block, 2048 threads an SM, 50 MiB L2")
        );
        assert!(info.to_string().contains("driver 13.0"));
    }

    #[test]
    fn probing_never_panics() {
        // On machines without CUDA this is an error with a reason; with a GPU it is a device.
        match probe(0) {
            Ok(info) => assert!(!info.name.is_empty()),
            Err(reason) => assert!(!reason.to_string().is_empty()),
        }
        // Versions are there exactly when the libraries are.
        assert_eq!(driver_version().is_some(), driver_present());
        assert_eq!(installed_nvrtc_version().is_some(), nvrtc_present());
        match probe(1000) {
            Ok(_) => panic!("no machine has 1001 GPUs"),
            Err(reason) => assert!(!reason.to_string().is_empty()),
        }
    }
}
