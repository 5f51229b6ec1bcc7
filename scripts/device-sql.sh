#!/usr/bin/env bash
# Runs on the GPU machine (the `device` tool), from the repository root, with .gpu/ holding
# gpu_sql.xz (the datafusion-gpusort GPU test binary, scripts/pack-gpu.sh with SLT=1) and a copy of
# ../shared/datafusion-slt. Logs go under $OUT.
set -u
. "$(dirname "$0")/device-unpack.sh"
export GPUSORT_REQUIRE_GPU=1 GPUSORT_SLT_REQUIRED=1 GPUSORT_SLT_DIR=$PWD/.gpu/datafusion-slt
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
timeout "${TESTS_TIMEOUT:-500}" .gpu/gpu_sql --test-threads=1 --nocapture ${TESTS_FILTER:-} > "$OUT/gpu_sql.log" 2>&1
echo "gpu_sql exit: $?"
grep -E "^test |test result|passed|failed|FAILED|panicked|TOTAL|total|^\| " "$OUT/gpu_sql.log" | tail -60
