#!/usr/bin/env bash
# Runs on the GPU machine: the paper benchmark (keys and a few record widths) for several tile
# sizes (GPUSORT_IPT rows per thread), to pick the default empirically. Logs under $OUT.
set -u
OUT=${OUT:-/tmp/gpusort-out}
mkdir -p "$OUT"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-} GPUSORT_KERNEL_CACHE=/tmp/gpusort-kernels
for ipt in ${IPTS:-8 12 16}; do
  echo "## IPT=$ipt"
  GPUSORT_IPT=$ipt timeout 150 .gpu/paper --reps 5 --bits 8 --fields ${FIELDS:-2,20} --key-rows ${KEY_ROWS:-10000000,100000000} 2>&1 \
    | grep -E "^\| (ByField|Hybrid|u32|u64)" | tee -a "$OUT/tune.txt"
done
