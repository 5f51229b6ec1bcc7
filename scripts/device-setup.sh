#!/usr/bin/env bash
# Runs on the GPU machine, from the repository root: the first call of a lease that measures
# TPC-H (device-tpch.sh), with what is too big to carry beside the binaries in one call (64 MiB,
# the working tree included). Files outlive a call while the machine stays warm (30 s idle),
# so the next call carries only the binaries. From .gpu/, each where present:
#   libnvcomp.so.6.xz   nvCOMP, as device-nvcomp.sh takes it (zstd pages on the GPU)
#   duckdb.tar.xz       DuckDB's wheel unpacked and repacked with xz (as device-tpch.sh takes it)
#   tpchgen_cli-*.whl   tpchgen-cli's wheel
# then makes TPC-H lineitem at scale $SF (default 10) in /tmp/tpch/sf$SF, where tpch.py looks.
#
#   SF=10 bash scripts/device-setup.sh
set -eu
if [ -f .gpu/libnvcomp.so.6.xz ] && [ ! -f /tmp/nvcomp/libnvcomp.so.6 ]; then
  bash "$(dirname "$0")/device-nvcomp.sh" > /dev/null
fi
. "$(dirname "$0")/device-unpack.sh"
mkdir -p /tmp/site
if [ -f .gpu/duckdb.tar ] && [ ! -d /tmp/site/duckdb ]; then
  tar xf .gpu/duckdb.tar -C /tmp/site
fi
if ls .gpu/tpchgen_cli-*.whl > /dev/null 2>&1 && [ ! -x /tmp/site/bin/tpchgen-cli ]; then
  python3 -m pip install -q --no-index --no-deps --target /tmp/site .gpu/tpchgen_cli-*.whl
fi
sf=${SF:-10}
data=/tmp/tpch/sf$sf
if [ ! -f "$data/lineitem.parquet" ]; then
  mkdir -p "$data"
  t=$SECONDS
  PYTHONPATH=/tmp/site /tmp/site/bin/tpchgen-cli parquet -s "$sf" --tables lineitem --output-dir "$data"
  echo "tpchgen-cli: SF$sf lineitem in $((SECONDS - t)) s"
fi
ls -la "$data" /tmp/nvcomp 2>/dev/null
echo "GPUSORT_NVCOMP=${GPUSORT_NVCOMP:-unset}; duckdb: $([ -d /tmp/site/duckdb ] && echo yes || echo no)"
