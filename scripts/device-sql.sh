#!/usr/bin/env bash
# Runs on the GPU machine (the `device` tool), from the repository root, with .gpu/ holding
# gpu_sql.xz (the datafusion-gpusort GPU test binary) and, from scripts/pack-gpu.sh with SLT=1, the
# datafusion-sqllogictest crate's `.slt` files in .gpu/datafusion-sqllogictest/ (their data is the
# repository's testdata/datafusion-slt). Logs go under $OUT.
set -u
. "$(dirname "$0")/device-unpack.sh"
export GPUSORT_REQUIRE_GPU=1 GPUSORT_SLT_CRATE_DIR=$PWD/.gpu/datafusion-sqllogictest \
  GPUSORT_SLT_DATA_DIR=$PWD/testdata/datafusion-slt
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
timeout "${TESTS_TIMEOUT:-500}" .gpu/gpu_sql --test-threads=1 --nocapture ${TESTS_FILTER:-} > "$OUT/gpu_sql.log" 2>&1
echo "gpu_sql exit: $?"
grep -E "^test |test result|passed|failed|FAILED|panicked|TOTAL|total|^\| " "$OUT/gpu_sql.log" | tail -60
