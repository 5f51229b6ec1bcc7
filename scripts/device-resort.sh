#!/usr/bin/env bash
# Runs on the GPU machine, from the repository root, after device-setup.sh (TPC-H lineitem in
# /tmp/tpch/sf$SF) with .gpu/gpusort(.xz): the tool's own output (zstd pages, each of nvCOMP's
# 64 KiB frames joined) sorted again by another ORDER BY, with --timeline, against the same
# ORDER BY of tpchgen's snappy file. Prints the reading phase and the device scan's marks of
# each, and checks with pyarrow that both outputs hold the same rows in the same order.
# Timelines go under $OUT.
#
#   SF=10 bash scripts/device-resort.sh
set -u
. "$(dirname "$0")/device-unpack.sh"
input=/tmp/tpch/sf${SF:-10}/lineitem.parquet
first="l_orderkey"
then="l_shipdate, l_orderkey, l_linenumber"
.gpu/gpusort sort "$input" -o /tmp/resort-1.parquet -k "$first" --force --quiet || exit 1
for round in 1 2; do
  .gpu/gpusort sort /tmp/resort-1.parquet -o /tmp/resort-2.parquet -k "$then" --force --timeline \
    > "$OUT/resort-zstd-$round.txt" 2>&1 || { tail -5 "$OUT/resort-zstd-$round.txt"; exit 1; }
  .gpu/gpusort sort "$input" -o /tmp/resort-3.parquet -k "$then" --force --timeline \
    > "$OUT/resort-snappy-$round.txt" 2>&1 || exit 1
done
for f in zstd snappy; do
  echo "== $f input (round 2)"
  grep -E "device scan: (session begun|run 0)|is read on the host|  time " "$OUT/resort-$f-2.txt" | head -4
done
python3 - <<'PY'
import pyarrow.parquet as pq
a = pq.read_table("/tmp/resort-2.parquet")
b = pq.read_table("/tmp/resort-3.parquet")
print("codec of the re-sorted input:", pq.ParquetFile("/tmp/resort-1.parquet").metadata.row_group(0).column(0).compression)
if a.schema != b.schema:
    print("schemas differ (compared as the snappy input's):", a.schema, b.schema, sep="\n")
    a = a.cast(b.schema)
print("rows", a.num_rows, b.num_rows, "equal:", a.equals(b))
PY
