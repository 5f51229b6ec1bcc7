#!/usr/bin/env bash
# Runs on the GPU machine, from the repository root: where a `gpusort sort` of TPC-H lineitem
# spends its CPU time, phase by phase. The machine has no perf: .gpu/perfpkg.tar.xz carries
# one (the development machine's /usr/bin/perf and the libraries it links, but glibc's, under
# perfpkg/lib). Carry gpusort with its symbols (`strip --strip-debug`, not `strip`). For each
# ORDER BY list in LISTS (1-6 as in tpch.py): the sort under `perf record` (no call
# graphs: Rust's release builds keep no frame pointers) with --timeline, then under $OUT
#   perf-L.txt        the profile by thread name and symbol, and by symbol alone
#   samples-L.txt.xz  every sample (time, thread, symbol), to cut by the timeline's phases
#   timeline-L.txt    the tool's timeline (the same process)
#
# scripts/perf_phases.py cuts the samples by the timeline's phases (on the development machine).
#
#   SF=10 LISTS=3,1 bash scripts/device-perf.sh
set -u
. "$(dirname "$0")/device-unpack.sh"
if [ ! -x /tmp/perfpkg/perf ]; then
  # device-unpack.sh has taken off the .xz.
  tar xf .gpu/perfpkg.tar -C /tmp || exit 1
fi
perf() { LD_LIBRARY_PATH=/tmp/perfpkg/lib /tmp/perfpkg/perf "$@"; }
input=/tmp/tpch/sf${SF:-10}/lineitem.parquet
for list in $(echo "${LISTS:-3}" | tr , ' '); do
  case $list in
    1) order="l_shipdate, l_orderkey, l_linenumber" ;;
    2) order="l_returnflag, l_linestatus, l_extendedprice DESC, l_orderkey, l_linenumber" ;;
    3) order="l_comment, l_orderkey, l_linenumber" ;;
    4) order="l_partkey, l_suppkey" ;;
    5) order="l_orderkey DESC, l_linenumber DESC" ;;
    6) order="l_shipmode, l_receiptdate DESC NULLS LAST, l_quantity" ;;
  esac
  # A warm-up run: kernels compiled and cached, the file in the page cache.
  .gpu/gpusort sort "$input" -o /tmp/perf-out.parquet -k "$order" --force --quiet
  perf record -F 997 -o /tmp/perf-$list.data .gpu/gpusort sort "$input" -o /tmp/perf-out.parquet \
    -k "$order" --force --timeline > "$OUT/timeline-$list.txt" 2>&1
  {
    echo "== by thread and symbol"
    perf report -i /tmp/perf-$list.data --no-children --sort comm,sym --stdio 2>/dev/null | grep -E "^ +[0-9]" | head -80
    echo "== by symbol"
    perf report -i /tmp/perf-$list.data --no-children --sort sym --stdio 2>/dev/null | grep -E "^ +[0-9]" | head -80
    echo "== by thread"
    perf report -i /tmp/perf-$list.data --no-children --sort comm --stdio 2>/dev/null | grep -E "^ +[0-9]" | head -30
  } > "$OUT/perf-$list.txt"
  perf script -i /tmp/perf-$list.data -F comm,tid,time,ip,sym 2>/dev/null | xz -T0 -3 > "$OUT/samples-$list.txt.xz"
  head -30 "$OUT/perf-$list.txt"
  grep '  time ' "$OUT/timeline-$list.txt"
done
