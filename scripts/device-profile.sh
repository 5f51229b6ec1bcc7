#!/usr/bin/env bash
# Runs on the GPU machine: per-kernel times of the radix sorts (GPUSORT_PROFILE=1) and an
# Nsight Compute speed-of-light report of the main kernels. Logs under $OUT.
set -u
. "$(dirname "$0")/device-unpack.sh"
if [ "${PROFILE:-1}" = 1 ]; then
GPUSORT_PROFILE=1 .gpu/paper --only keys --key-rows ${KEY_ROWS:-100000000} --reps 1 --bits 8 2>&1 | grep -E "profile|^\| u" | tee "$OUT/profile_keys.txt"
GPUSORT_PROFILE=1 .gpu/paper --only records --fields ${FIELDS:-2,20} --reps 1 --bits 8 2>&1 | grep -E "profile|^\| [BH]" | tee "$OUT/profile_records.txt"
fi
# NCU_SECTIONS, NCU_KERNELS, NCU_SKIP, NCU_COUNT and NCU_PAPER_ARGS choose what is profiled;
# NCU_ENV (comma-separated GPUSORT_* settings) a kernel variant.
ncu_env=${NCU_ENV:-}
env ${ncu_env//,/ } timeout ${NCU_TIMEOUT:-240} ncu \
  ${NCU_SECTIONS:---section SpeedOfLight --section Occupancy --section LaunchStats --section MemoryWorkloadAnalysis} \
  -k "regex:${NCU_KERNELS:-grs_rank_b8|grs_scatter_b8|srts_upsweep_b8|srts_downsweep_b8}" \
  --launch-skip ${NCU_SKIP:-0} --launch-count ${NCU_COUNT:-4} \
  .gpu/paper ${NCU_PAPER_ARGS:---only keys --key-rows 10000000 --reps 1 --bits 8} > "$OUT/ncu${NCU_TAG:-}.txt" 2>&1
[ -n "${NCU_ONLY:-}" ] && exit 0
grep -E "^  [a-z_0-9]+\(|Duration|DRAM Throughput|Memory Throughput|Compute \(SM\) Throughput|Achieved Occupancy|Registers Per Thread|Theoretical Occupancy|Block Limit|L1/TEX Hit|L2 Hit|Mem Busy|Max Bandwidth" "$OUT/ncu${NCU_TAG:-}.txt" | head -80
