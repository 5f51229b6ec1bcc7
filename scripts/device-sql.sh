#!/usr/bin/env bash
# Runs on the GPU machine (the `device` tool), from the repository root, with .gpu/ holding
# gpu_sql.gz (the datafusion-gpusort GPU test binary, gzipped) and a copy of
# ../shared/datafusion-slt. Logs go under $OUT.
set -u
OUT=${OUT:-/tmp/gpusort-out}
mkdir -p "$OUT"
(cd .gpu && for f in *.gz; do [ -e "$f" ] && gunzip -f "$f" && chmod +x "${f%.gz}"; done; true)
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export GPUSORT_REQUIRE_GPU=1 GPUSORT_SLT_REQUIRED=1 GPUSORT_SLT_DIR=$PWD/.gpu/datafusion-slt
export GPUSORT_KERNEL_CACHE=/tmp/gpusort-kernels
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
timeout "${TESTS_TIMEOUT:-500}" .gpu/gpu_sql --test-threads=1 --nocapture ${TESTS_FILTER:-} > "$OUT/gpu_sql.log" 2>&1
echo "gpu_sql exit: $?"
grep -E "^test |test result|passed|failed|FAILED|panicked|TOTAL|total|^\| " "$OUT/gpu_sql.log" | tail -60
