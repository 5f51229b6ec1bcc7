#!/usr/bin/env bash
# Runs on the GPU machine, after device-setup.sh (nvCOMP, TPC-H lineitem): Parquet decode on
# the GPU, tested and measured. From .gpu/ (scripts/pack-gpu.sh), each where present:
#   gpusort_cuda     the CUDA crate's unit tests: nvCOMP's and the decode kernels' ($CUDA_FILTER)
#   gpusort_parquet  the Parquet crate's unit tests (the GPU decode against the Parquet crate's)
#   gpu_decode       the bench: lineitem decoded on the GPU against the Parquet crate's reader,
#                    $DECODE_GROUPS row groups a call (default "32 64")
#   gpu_session      the GPU session's tests (device batches beside host batches)
#   device_sort      the bench: lineitem sorted from host batches and from device batches,
#                    ORDER BY lists $SORT_LISTS (default 1,3), $SORT_GROUPS row groups a call
# Logs in $OUT: cuda.log, parquet.log, decode.log, session.log, sort.log.
#
#   SF=10 bash scripts/device-decode.sh
set -u
. "$(dirname "$0")/device-unpack.sh"
export GPUSORT_REQUIRE_GPU=1
data=/tmp/tpch/sf${SF:-10}/lineitem.parquet
if [ -x .gpu/gpusort_cuda ]; then
  .gpu/gpusort_cuda --test-threads=1 ${CUDA_FILTER:-nvcomp parquet} > "$OUT/cuda.log" 2>&1
  echo "gpusort_cuda: $(grep -E '^test result' "$OUT/cuda.log")"
fi
if [ -x .gpu/gpusort_parquet ]; then
  .gpu/gpusort_parquet --test-threads=2 > "$OUT/parquet.log" 2>&1
  echo "gpusort_parquet: $(grep -E '^test result' "$OUT/parquet.log")"
  grep -E "FAILED|panicked|did not run" "$OUT/parquet.log" | head -20
fi
if [ -x .gpu/gpu_decode ] && [ -f "$data" ]; then
  for g in ${DECODE_GROUPS:-32 64}; do
    .gpu/gpu_decode "$data" "$g" 2>&1 | tee -a "$OUT/decode.log"
  done
fi
if [ -x .gpu/gpu_session ]; then
  .gpu/gpu_session --test-threads=1 > "$OUT/session.log" 2>&1
  echo "gpu_session: $(grep -E '^test result' "$OUT/session.log")"
  grep -E "FAILED|panicked" "$OUT/session.log" | head -20
fi
if [ -x .gpu/device_sort ] && [ -f "$data" ]; then
  .gpu/device_sort "$data" "${SORT_LISTS:-1,3}" "${SORT_GROUPS:-64}" 2>&1 | tee "$OUT/sort.log"
fi
