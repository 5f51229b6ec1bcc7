#!/usr/bin/env bash
# Sourced by the device scripts that sort TPC-H lineitem with the tool (device-ab.sh,
# device-nvcomp-batches.sh): unpacks the binaries (device-unpack.sh), names the input made by
# device-setup.sh, and the ORDER BY lists of crates/gpusort-cli/benches/tpch.py by number.
. "$(dirname "${BASH_SOURCE[0]}")/device-unpack.sh"
input=/tmp/tpch/sf${SF:-10}/lineitem.parquet
declare -A order=([1]="l_shipdate, l_orderkey, l_linenumber"
  [2]="l_returnflag, l_linestatus, l_extendedprice DESC, l_orderkey, l_linenumber"
  [3]="l_comment, l_orderkey, l_linenumber")
