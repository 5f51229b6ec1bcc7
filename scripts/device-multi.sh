#!/usr/bin/env bash
# Runs on a machine of several GPUs (the `device` tool: nvidia-h100-x2/-x4, nvidia-h200-x2/-x4),
# from the repository root, with .gpu/ holding `gpu` (gpusort-cuda's GPU tests), `gpu_sql`
# (datafusion-gpusort's) and `multi_gpu` (gpusort-cuda's bench), packed by scripts/pack-gpu.sh.
# One sort split over the GPUs by key ranges (issue 26):
#   1. the GPU tests of the split (GPUSORT_REQUIRE_GPU=1): `backend_split_over_gpus_matches_reference`
#      over every GPU, the one-GPU backend tests beside it, and `gpu_devices_all_splits_over_the_gpus`;
#   2. the `multi_gpu` bench: ROWS random u64 keys (default 800M), then REC_ROWS rows of a u64 key
#      and 4 u64 columns (default 400M: the external bench's table, here in memory), on 1, 2, 4 GPUs.
# Files under $OUT: gpus.txt, gpu_tests.log, gpu_sql.log, multi_keys.{txt,csv},
# multi_records.{txt,csv}.
set -u
. "$(dirname "$0")/device-unpack.sh"
export GPUSORT_REQUIRE_GPU=1
{
  nvidia-smi --query-gpu=index,name,driver_version,memory.total,pcie.link.gen.max,pcie.link.width.max --format=csv
  nvidia-smi topo -m
  echo "cores: $(nproc)"; free -g
} > "$OUT/gpus.txt" 2>&1
cat "$OUT/gpus.txt"
timeout "${TESTS_TIMEOUT:-240}" .gpu/gpu --test-threads=1 ${GPU_TESTS:-backend_} > "$OUT/gpu_tests.log" 2>&1
echo "gpu tests exit: $?"
timeout "${TESTS_TIMEOUT:-240}" .gpu/gpu_sql --test-threads=1 ${SQL_TESTS:-gpu_devices_all gpu_metrics} > "$OUT/gpu_sql.log" 2>&1
echo "gpu_sql exit: $?"
grep -hE "^test |test result|panicked" "$OUT/gpu_tests.log" "$OUT/gpu_sql.log"
GPUS=${GPUS:-1,2,4}
.gpu/multi_gpu --rows "${ROWS:-800000000}" --gpus "$GPUS" --reps "${REPS:-3}" \
  --csv "$OUT/multi_keys.csv" 2>&1 | tee "$OUT/multi_keys.txt"
.gpu/multi_gpu --rows "${REC_ROWS:-400000000}" --payload 4 --gpus "$GPUS" --reps "${REPS:-3}" \
  --csv "$OUT/multi_records.csv" 2>&1 | tee "$OUT/multi_records.txt"
