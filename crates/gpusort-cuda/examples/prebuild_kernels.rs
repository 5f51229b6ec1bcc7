//! Builds the kernels of the default tuning ahead of time for the architectures of
//! `gpusort_cuda::prebuilt::ARCHS`, into `crates/gpusort-cuda/prebuilt/` (see that module). NVRTC
//! must be loadable (e.g. `LD_LIBRARY_PATH` naming the `lib` folder of the `nvidia-cuda-nvrtc`
//! wheel); no GPU is needed.
//!
//! ```text
//! LD_LIBRARY_PATH=/path/to/nvidia/cu13/lib cargo run -p gpusort-cuda --example prebuild_kernels
//! ```

use std::path::Path;

use gpusort_cuda::kernels::{KernelTuning, compile_cubin};
use gpusort_cuda::prebuilt::{ARCHS, manifest_for};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("prebuilt");
    let programs = KernelTuning::default().programs();
    for arch in ARCHS {
        let dir = root.join(arch);
        std::fs::create_dir_all(&dir)?;
        // Each family on a thread of its own, as at run time.
        let built: Vec<_> = std::thread::scope(|scope| {
            let handles: Vec<_> = programs
                .iter()
                .map(|(family, source)| scope.spawn(move || (*family, compile_cubin(source, arch))))
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().expect("a compile thread"))
                .collect()
        });
        for (family, cubin) in built {
            let cubin = cubin?;
            std::fs::write(dir.join(format!("{family}.cubin")), &cubin)?;
            println!("{arch} {family}: {} bytes", cubin.len());
        }
    }
    std::fs::write(root.join("manifest.txt"), manifest_for(ARCHS))?;
    println!("wrote {}", root.join("manifest.txt").display());
    Ok(())
}
