#!/usr/bin/env bash
# Runs on the GPU machine after scripts/device-setup.sh (lineitem and nvCOMP in place): the
# tool on TPC-H lineitem with nvCOMP taking the writer's pages in batches of each size and
# number at once (GPUSORT_NVCOMP_BATCHES=MiB,calls), against zstd on the CPU, alternated in
# rounds. Prints each run's summary time line; its summaries tarred under $OUT.
#
#   VARIANTS="cpu 8,1 32,2" LISTS="3 1" ROUNDS=2 bash scripts/device-nvcomp-batches.sh
set -u
. "$(dirname "$0")/device-lineitem.sh"
for round in $(seq "${ROUNDS:-2}"); do
  for list in ${LISTS:-3 1}; do
    for v in ${VARIANTS:-cpu 8,1 16,2 32,2 32,4 64,2}; do
      rm -f /tmp/nvb.parquet
      if [ "$v" = cpu ]; then
        line=$(.gpu/gpusort sort "$input" -k "${order[$list]}" -o /tmp/nvb.parquet --compress-on cpu 2>&1)
      else
        line=$(GPUSORT_NVCOMP_BATCHES=$v .gpu/gpusort sort "$input" -k "${order[$list]}" -o /tmp/nvb.parquet 2>&1)
      fi
      mkdir -p /tmp/nvb-logs && echo "$line" > "/tmp/nvb-logs/r$round-l$list-${v/,/x}.log"
      echo "round $round list $list $v: $(echo "$line" | grep -E '^ +time' | sed 's/^ *//') | $(ls -la /tmp/nvb.parquet | awk '{print $5}') bytes"
    done
  done
done 2>&1 | tee "$OUT/nvcomp-batches.txt"
tar czf "$OUT/nvb-logs.tgz" -C /tmp nvb-logs
