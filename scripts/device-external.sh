#!/usr/bin/env bash
# Runs on the GPU machine (the `device` tool), from the repository root, with .gpu/ holding
# xz-compressed binaries (*.xz; python3's lzma unpacks them, the machine has no zstd):
# gpu_sql (the datafusion-gpusort GPU tests) and/or external (the external-sort benchmark),
# and, for the slt records, the datafusion-sqllogictest crate's `.slt` files in
# .gpu/datafusion-sqllogictest/ (scripts/pack-gpu.sh with SLT=1; their data is the repository's
# testdata/datafusion-slt). Logs go under $OUT.
#
#   STEPS="tests bench" EXT_ROWS=400000000 bash scripts/device-external.sh
set -u
. "$(dirname "$0")/device-unpack.sh"
export GPUSORT_REQUIRE_GPU=1 GPUSORT_SLT_CRATE_DIR=$PWD/.gpu/datafusion-sqllogictest \
  GPUSORT_SLT_DATA_DIR=$PWD/testdata/datafusion-slt
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
nproc; free -g | head -2; df -h /tmp | tail -1
for step in ${STEPS:-tests bench}; do
  case $step in
    tests)
      timeout "${TESTS_TIMEOUT:-400}" .gpu/gpu_sql --test-threads=1 --nocapture ${TESTS_FILTER:-} > "$OUT/gpu_sql.log" 2>&1
      echo "gpu_sql exit: $?"
      grep -E "^test |test result|runs \(|passed|failed|FAILED|panicked|TOTAL|^\| " "$OUT/gpu_sql.log" | tail -60
      ;;
    bench)
      EXT_CSV=$OUT/external.md timeout "${BENCH_TIMEOUT:-540}" .gpu/external 2>&1 | tee "$OUT/external.log"
      echo "external exit: ${PIPESTATUS[0]}"
      ;;
  esac
done
