#!/usr/bin/env bash
# Sourced by the device-*.sh scripts on the GPU machine: sets OUT, unpacks the xz-compressed
# binaries in .gpu/ (python3's lzma: the machine has no zstd) and points at CUDA's libraries.
OUT=${OUT:-/tmp/gpusort-out}
mkdir -p "$OUT"
python3 - <<'PY'
import glob, lzma, os, shutil
for f in glob.glob(".gpu/*.xz"):
    with lzma.open(f) as src, open(f[:-3], "wb") as dst:
        shutil.copyfileobj(src, dst, 1 << 24)
    os.chmod(f[:-3], 0o755)
    os.remove(f)
PY
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export GPUSORT_KERNEL_CACHE=/tmp/gpusort-kernels
# nvCOMP (zstd on the GPU) where an earlier command left it: scripts/device-nvcomp.sh.
if [ -f /tmp/nvcomp/libnvcomp.so.6 ]; then
  export GPUSORT_NVCOMP=/tmp/nvcomp/libnvcomp.so.6 GPUSORT_REQUIRE_NVCOMP=1
fi
