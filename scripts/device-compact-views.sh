#!/usr/bin/env bash
# Runs on the GPU machine (the `device` tool), from the repository root: stop 37's check of
# output views laid out on the device. .gpu-f/ (carried) holds gpusort.xz and gpu_session.xz
# (scripts/pack-gpu.sh) and tpchgen-cli's wheel. Makes TPC-H lineitem SF10, runs the
# `gpu_session` tests, then the tool on lists 1 and 3 with the views laid out on the device and
# with GPUSORT_COMPACT_VIEWS=0 (alternated), and checks that both write the same file.
#
#   bash scripts/device-compact-views.sh
set -u
rm -rf .gpu && mv .gpu-f .gpu && . scripts/device-unpack.sh
mkdir -p /tmp/site /tmp/tpch/sf10
python3 -m pip install -q --no-index --no-deps --target /tmp/site .gpu/tpchgen_cli-*.whl
PYTHONPATH=/tmp/site /tmp/site/bin/tpchgen-cli parquet -s 10 --tables lineitem --output-dir /tmp/tpch/sf10
(GPUSORT_REQUIRE_GPU=1 timeout 100 .gpu/gpu_session --test-threads=1; echo "exit $?") > $OUT/gpu_session.log 2>&1
in=/tmp/tpch/sf10/lineitem.parquet
l1="l_shipdate, l_orderkey, l_linenumber"; l3="l_comment, l_orderkey, l_linenumber"
run() { # name env order
  echo "== $1 ($2): ORDER BY $3" >> $OUT/tool.txt
  env $2 timeout 40 .gpu/gpusort sort $in -k "$3" -o /tmp/$1.parquet -f 2>&1 | grep -E "time |sorted  |output " >> $OUT/tool.txt
}
run warm3 "X=1" "$l3"
run l1-device "X=1" "$l1"; run l1-host "GPUSORT_COMPACT_VIEWS=0" "$l1"
run l3-device "X=1" "$l3"; run l3-host "GPUSORT_COMPACT_VIEWS=0" "$l3"
run l1-device2 "X=1" "$l1"; run l1-host2 "GPUSORT_COMPACT_VIEWS=0" "$l1"
cmp /tmp/l1-device.parquet /tmp/l1-host.parquet && echo "list 1: the two files are byte for byte equal" >> $OUT/tool.txt
cmp /tmp/l3-device.parquet /tmp/l3-host.parquet && echo "list 3: the two files are byte for byte equal" >> $OUT/tool.txt
grep -E "test result|exit" $OUT/gpu_session.log; cat $OUT/tool.txt
