#!/usr/bin/env bash
# Runs on the GPU machine (the `device` tool), from the repository root: the TPC-H lineitem
# benchmark (crates/gpusort-cli/benches/tpch.py) of the `gpusort` binary in .gpu/ against
# DuckDB. .gpu/ holds gpusort.xz (scripts/pack-gpu.sh) and the wheels: duckdb.tar.xz (the
# duckdb wheel unpacked and repacked with xz; device-unpack.sh leaves it as duckdb.tar) and
# tpchgen_cli-*.whl, and optionally sql_parquet (the SQL bench, for CONTENDERS sql-copy, df-copy,
# sql-collect). Logs go under $OUT. Where one call cannot carry both the binaries and the wheels,
# a first call runs scripts/device-setup.sh with the wheels (and nvCOMP), this one the binaries.
#
#   SF=10 LISTS=1,2,3 CONTENDERS=gpu,cpu,duckdb RUNS=2 EXTRA="" bash scripts/device-tpch.sh
set -u
. "$(dirname "$0")/device-unpack.sh"
# Each wheel where it is carried and not yet installed (an earlier call's device-setup.sh may
# have installed tpchgen-cli and left DuckDB to this call, or the other way round).
mkdir -p /tmp/site
if [ ! -d /tmp/site/duckdb ]; then
  tar xf .gpu/duckdb.tar -C /tmp/site || { echo "DuckDB: no .gpu/duckdb.tar(.xz) carried"; exit 1; }
fi
if [ ! -x /tmp/site/bin/tpchgen-cli ] && ls .gpu/tpchgen_cli-*.whl > /dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --target /tmp/site .gpu/tpchgen_cli-*.whl || exit 1
fi
export PYTHONPATH=/tmp/site PATH=/tmp/site/bin:$PATH PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
python3 crates/gpusort-cli/benches/tpch.py --gpusort .gpu/gpusort --sf "${SF:-10}" --data /tmp/tpch \
  --lists "${LISTS:-1,2,3}" --contenders "${CONTENDERS:-gpu,cpu,duckdb}" --runs "${RUNS:-2}" \
  --extra "${EXTRA:-}" ${TIMELINE:+--timeline} $( [ -x .gpu/sql_parquet ] && echo --sql-bench .gpu/sql_parquet ) --csv "$OUT/tpch.csv" --svg "$OUT/tpch.svg" 2>&1 | tee "$OUT/tpch.log"
echo "tpch exit: ${PIPESTATUS[0]}"
input=/tmp/tpch/sf${SF:-10}/lineitem.parquet
# The writer's cost per column and setting (WRITER_PROPS=1; needs the writer_props bench).
if [ "${WRITER_PROPS:-0}" = 1 ] && [ -x .gpu/writer_props ]; then
  .gpu/writer_props "$input" 2>&1 | tee "$OUT/writer_props.txt"
fi
# Where a GPU sort's CPU time goes (PERF=1, where perf is installed).
if [ "${PERF:-0}" = 1 ]; then
  if command -v perf >/dev/null; then
    perf record -F 499 -g -o /tmp/perf.data .gpu/gpusort sort "$input" -o /tmp/perf-out.parquet \
      -k "${PERF_ORDER_BY:-l_shipdate, l_orderkey, l_linenumber}" --force --quiet
    perf report -i /tmp/perf.data --no-children --sort comm,sym --stdio 2>/dev/null | grep -E "^ +[0-9]" \
      | head -60 | tee "$OUT/perf.txt"
  else
    echo "perf: not installed"
  fi
fi
