#!/usr/bin/env bash
# Runs on the GPU machine after scripts/device-setup.sh (lineitem, and nvCOMP where carried, in
# place): the tool on TPC-H lineitem under each variant, a set of environment variables, in
# alternating rounds, so that two settings are compared on one machine in one call. Prints each
# run's summary time line and output size; the summaries (with --timeline when TIMELINE=1) are
# tarred under $OUT.
#
#   VARIANTS="GPUSORT_PIN_AHEAD=0 GPUSORT_PIN_AHEAD=1" LISTS="1 3" ROUNDS=2 bash scripts/device-ab.sh
#
# A variant of several variables joins them with commas: "GPUSORT_PIN_AHEAD=0,GPUSORT_X=1";
# BIN=NAME in a variant runs .gpu/NAME instead of .gpu/gpusort (another build, carried beside it).
set -u
. "$(dirname "$0")/device-lineitem.sh"
mkdir -p /tmp/ab-logs
for round in $(seq "${ROUNDS:-2}"); do
  for list in ${LISTS:-1 3}; do
    for v in ${VARIANTS:?VARIANTS names the settings to compare}; do
      rm -f /tmp/ab.parquet
      bin=gpusort
      case ",$v," in *,BIN=*) bin=$(echo ",$v," | sed -E 's/.*,BIN=([^,]*),.*/\1/') ;; esac
      t0=$(date +%s.%N)
      line=$(env ${v//,/ } .gpu/$bin sort "$input" -k "${order[$list]}" -o /tmp/ab.parquet \
        ${TIMELINE:+--timeline} 2>&1)
      wall=$(awk "BEGIN { printf \"%.3f\", $(date +%s.%N) - $t0 }")
      echo "$line" > "/tmp/ab-logs/r$round-l$list-${v//[,=]/_}.log"
      echo "round $round list $list $v: wall $wall s; $(echo "$line" | grep -E '^ +time' | sed 's/^ *//') | $(stat -c %s /tmp/ab.parquet 2>/dev/null) bytes"
    done
  done
done 2>&1 | tee "$OUT/ab.txt"
tar czf "$OUT/ab-logs.tgz" -C /tmp ab-logs
