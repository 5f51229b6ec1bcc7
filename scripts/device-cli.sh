#!/usr/bin/env bash
# Runs on the GPU machine (the `device` tool), from the repository root, with .gpu/ holding
# xz-compressed binaries (*.xz; python3's lzma unpacks them): make_testdata (writes the
# Parquet input), parquet_sort (the gpusort-cli benchmark) and optionally gpusort (the CLI).
# Logs go under $OUT.
#
#   ROWS=50000000 ORDER_BY="customer, amount DESC, order_id" bash scripts/device-cli.sh
set -u
. "$(dirname "$0")/device-unpack.sh"
input=/tmp/orders-${ROWS:-50000000}.parquet
[ -f "$input" ] || /usr/bin/time -f "make_testdata: %e s" .gpu/make_testdata --rows "${ROWS:-50000000}" --out "$input"
ls -la "$input"
[ -x .gpu/gpusort ] && .gpu/gpusort info 2>&1 | tee "$OUT/info.txt"
BENCH_INPUT=$input BENCH_ORDER_BY="${ORDER_BY:-customer, amount DESC, order_id}" BENCH_RUNS=${RUNS:-1} \
  BENCH_CSV=$OUT/parquet_sort.csv timeout "${BENCH_TIMEOUT:-500}" .gpu/parquet_sort 2>&1 | tee "$OUT/parquet_sort.log"
echo "parquet_sort exit: ${PIPESTATUS[0]}"
