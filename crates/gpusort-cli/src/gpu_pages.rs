//! Where the output's pages are compressed: on the GPU through nvCOMP
//! ([`gpusort_cuda::ZstdCompressor`]) when the codec is zstd and a GPU and nvCOMP are there,
//! else by the Parquet writer on the CPU. `--compress-on` chooses; the summary says which ran.

use std::str::FromStr;
use std::sync::Arc;

use datafusion_gpusort::DeviceChoice;
use gpusort_cuda::ZstdCompressor;
use gpusort_cuda::nvcomp::MAX_CHUNK;
use parquet::basic::Compression;
use parquet::errors::ParquetError;

use crate::pages::{CpuZstd, PageCompressor};
use crate::writer::Codec;

/// `--compress-on`: where zstd pages are compressed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CompressOn {
    /// The GPU when the codec is zstd, the sort may use a GPU, and nvCOMP loads; else the CPU.
    #[default]
    Auto,
    /// The GPU, or an error saying why not.
    Gpu,
    /// The CPU (the Parquet writer's own codec).
    Cpu,
}

impl FromStr for CompressOn {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim().to_ascii_lowercase().as_str() {
            "auto" => Ok(Self::Auto),
            "gpu" => Ok(Self::Gpu),
            "cpu" => Ok(Self::Cpu),
            _ => Err(format!("expected auto, gpu or cpu, got '{s}'")),
        }
    }
}

/// zstd frames from nvCOMP, and from the CPU for the rare page over nvCOMP's size limit.
#[derive(Debug)]
pub struct NvcompZstd {
    gpu: ZstdCompressor,
    /// For pages over [`MAX_CHUNK`], at the level the user asked for.
    cpu: CpuZstd,
    level: i32,
}

impl PageCompressor for NvcompZstd {
    fn codec(&self) -> Compression {
        Compression::ZSTD(parquet::basic::ZstdLevel::try_new(self.level).expect("a valid level"))
    }

    fn name(&self) -> String {
        format!("zstd on the GPU (nvCOMP {})", self.gpu.version())
    }

    fn compress(&self, pages: &[&[u8]]) -> Result<Vec<Vec<u8>>, ParquetError> {
        let (big, small): (Vec<usize>, Vec<usize>) = (0..pages.len()).partition(|&i| pages[i].len() > MAX_CHUNK);
        let small_pages: Vec<&[u8]> = small.iter().map(|&i| pages[i]).collect();
        let mut frames = self
            .gpu
            .compress(&small_pages)
            .map_err(|e| ParquetError::External(Box::new(e)))?
            .into_iter();
        let big_pages: Vec<&[u8]> = big.iter().map(|&i| pages[i]).collect();
        let mut big_frames = self.cpu.compress(&big_pages)?.into_iter();
        Ok(pages
            .iter()
            .map(|p| match p.len() > MAX_CHUNK {
                true => big_frames.next().expect("a frame per big page"),
                false => frames.next().expect("a frame per page"),
            })
            .collect())
    }
}

/// Where the pages are compressed, as [`choose`] found.
#[derive(Debug, Clone)]
pub struct PagePath {
    /// nvCOMP's compressor, or `None`: the Parquet writer compresses on the CPU.
    pub compressor: Option<Arc<dyn PageCompressor>>,
    /// The codec and where it runs, for the summary: `zstd on the GPU (nvCOMP 6.0.0)`,
    /// `zstd(3) on the CPU`, `snappy`.
    pub label: String,
    /// Why the CPU compresses zstd pages (`None` on the GPU, or for other codecs).
    pub why_cpu: Option<String>,
}

/// Where `--compress-on` and the codec have the pages compressed. An error only for
/// `--compress-on gpu` when nvCOMP cannot run.
pub fn choose(on: CompressOn, codec: Codec, device: DeviceChoice) -> Result<PagePath, String> {
    let Compression::ZSTD(level) = codec.0 else {
        if on == CompressOn::Gpu {
            return Err(format!("--compress-on gpu: nvCOMP is used for zstd only, not {codec}"));
        }
        return Ok(PagePath {
            compressor: None,
            label: codec.to_string(),
            why_cpu: None,
        });
    };
    let opened = match (on, device) {
        (CompressOn::Cpu, _) => Err("--compress-on cpu".to_string()),
        (_, DeviceChoice::Cpu) => Err("--device cpu".to_string()),
        (_, DeviceChoice::Gpu(n)) => ZstdCompressor::try_new(n).map_err(|e| e.to_string()),
        (_, DeviceChoice::Auto) => ZstdCompressor::try_new(0).map_err(|e| e.to_string()),
    };
    match opened {
        Ok(gpu) => {
            let level = level.compression_level();
            let pages = NvcompZstd {
                gpu,
                cpu: CpuZstd::new(level),
                level,
            };
            Ok(PagePath {
                label: pages.name(),
                compressor: Some(Arc::new(pages)),
                why_cpu: None,
            })
        }
        Err(why) if on == CompressOn::Gpu => Err(format!("--compress-on gpu: {why}")),
        Err(why) => Ok(PagePath {
            compressor: None,
            label: format!("{codec} on the CPU"),
            why_cpu: Some(why),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compress_on_parses() {
        assert_eq!("AUTO".parse::<CompressOn>().unwrap(), CompressOn::Auto);
        assert_eq!("gpu".parse::<CompressOn>().unwrap(), CompressOn::Gpu);
        assert_eq!(" cpu".parse::<CompressOn>().unwrap(), CompressOn::Cpu);
        assert!("disk".parse::<CompressOn>().unwrap_err().contains("auto, gpu or cpu"));
    }

    #[test]
    fn the_cpu_compresses_when_asked_or_when_nvcomp_cannot() {
        let zstd: Codec = "zstd(3)".parse().unwrap();
        let snappy: Codec = "snappy".parse().unwrap();
        let cpu = choose(CompressOn::Cpu, zstd, DeviceChoice::Auto).unwrap();
        assert!(cpu.compressor.is_none());
        assert_eq!(
            (cpu.label.as_str(), cpu.why_cpu.as_deref()),
            ("zstd(3) on the CPU", Some("--compress-on cpu"))
        );
        let cpu = choose(CompressOn::Auto, zstd, DeviceChoice::Cpu).unwrap();
        assert_eq!(cpu.why_cpu.as_deref(), Some("--device cpu"));
        let other = choose(CompressOn::Auto, snappy, DeviceChoice::Auto).unwrap();
        assert!(other.compressor.is_none() && other.why_cpu.is_none());
        assert_eq!(other.label, "snappy");
        let err = choose(CompressOn::Gpu, snappy, DeviceChoice::Auto).unwrap_err();
        assert!(err.contains("zstd only, not snappy"), "{err}");
        // Auto with zstd: the GPU where nvCOMP loads, else the CPU with the loader's reason.
        let auto = choose(CompressOn::Auto, zstd, DeviceChoice::Auto).unwrap();
        match auto.compressor {
            Some(_) => assert!(auto.label.starts_with("zstd on the GPU (nvCOMP 6."), "{}", auto.label),
            None => {
                assert_eq!(auto.label, "zstd(3) on the CPU");
                assert!(!auto.why_cpu.unwrap().is_empty());
            }
        }
    }
}
