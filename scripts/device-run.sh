#!/usr/bin/env bash
# Runs on the GPU machine (the `device` tool), from the repository root, with the binaries
# xz-compressed in .gpu/ (scripts/pack-gpu.sh). Unpacks them, then runs the steps named in $STEPS (default:
# all) with their logs under $OUT:
#   tests     GPU tests with GPUSORT_REQUIRE_GPU=1 (and the settings in $TESTS_ENV, comma-separated,
#             e.g. "GPUSORT_ONESWEEP_IPT=24,GPUSORT_ONESWEEP_KEEP_WORDS=2")
#   sanitize  compute-sanitizer memcheck and racecheck on the small-input test
#   bench     CUB's baseline through CuPy (.gpu/cub_baseline.py), then the paper's evaluation with
#             ratios to it
#   cub       CUB called natively: builds .gpu/cub_native.cu with nvcc (sm_90) and runs it, JSON in
#             $OUT/cub_native.json (`paper --cub` reads it too)
#   topk      the datafusion-gpusort `topk` bench (ORDER BY k LIMIT n: DataFusion's TopK against
#             GpuSortExec, for the default of gpusort.topk_max_fetch)
#   proto     the one-sweep prototype (scripts/prototypes/proto_onesweep.py): its timing for each variant in
#             $PROTO_VARIANTS, then its correctness cases for each in $PROTO_CHECK_VARIANTS. A variant
#             is comma-separated settings, e.g. "IPT=16,ONESWEEP_IPT=24,ONESWEEP_KEEP_WORDS=2"
#   tune      per engine variant in $TUNE_VARIANTS (comma-separated GPUSORT_* settings, kernels.rs
#             KernelTuning, or "default"): the one-sweep GPU test, then the paper bench's goal rows
#             (keys only, 8-bit digits; ByField m = 2 and 20)
#   tune-profile  `gpusort tune` (.gpu/gpusort; budget $TUNE_BUDGET, default 2m): the empirical
#             search on this GPU, its table in $OUT/tune_profile.txt, its progress in
#             tune_progress.txt, the profile it writes into the kernel cache copied to $OUT; then
#             the paper bench's goal rows (keys; ByField and Hybrid m = 2, 20; 8-bit digits) with
#             the profile and without it (GPUSORT_TUNING=off), alternately, $TUNE_ROUNDS times
#             (default 2), in $OUT/tune_paper.txt. The old `tune` step times hand-picked variants.
#   dist      the paper bench's key-distribution table (presorted keys against random keys and a
#             device copy), then the CPU backend's (`presorted` bench)
#   dist-tpch the distributed ORDER BY bench (.gpu/tpch_workers: crates/gpusort-distributed/benches/
#             tpch_workers.rs) on TPC-H lineitem at scale $SF (default 10; SF=1 for a quick run), made
#             once in /tmp/tpch/sf$SF with tpchgen-cli (the wheel .gpu/tpchgen_cli-*.whl, as
#             device-tpch.sh installs it): $DIST_WORKERS loopback workers in one process sharing the
#             GPU (default 1,2,4), beside single-node gpusort and stock DataFusion, ORDER BY
#             $DIST_ORDER_BY (default l_shipdate, l_orderkey, l_linenumber), $RUNS runs (default 2).
#             Log: dist_tpch_sf$SF.txt
#   ab        before/after of a restructuring: .gpu/paper_before and .gpu/paper (and .gpu/sql_before
#             and .gpu/sql when both are there) run alternately, $AB_ROUNDS times each (default 2),
#             with $AB_PAPER_ARGS (default: the issue goal rows) and $AB_SQL_ENV
#   caps      per shared-memory cap in $CAPS (default "none 96K 99K 163K": uncapped, then the
#             GPUSORT_SMEM_CAP of a V100, of an sm_86/sm_89 GPU (A10, L4, RTX 3090/4090) and of an
#             A100; crates/gpusort-cuda/src/shapes.rs), the parts in $CAPS_PARTS (default "tests
#             memcheck bench"): the GPU tests ($TESTS_FILTER), compute-sanitizer memcheck of the
#             sanitize test, the paper bench ($BENCH_ARGS; ratios to CUB when the cub or bench step
#             left its JSON in $OUT). Logs caps_{tests,memcheck,paper}_<cap>.*; each run's first
#             lines say the shapes it got. One cap a call keeps a call under 10 minutes:
#             CAPS=99K STEPS=caps bash scripts/device-run.sh
set -u
. "$(dirname "$0")/device-unpack.sh"
export GPUSORT_REQUIRE_GPU=1 PYTHONUNBUFFERED=1
STEPS=${STEPS:-"tests sanitize bench"}
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv
for step in $STEPS; do
  case $step in
    unit) timeout 120 .gpu/gpusort_cuda --test-threads=1 2>&1 | tee "$OUT/unit.log" | tail -15 ;;
    tests) te=${TESTS_ENV:-}; env ${te//,/ } timeout "${TESTS_TIMEOUT:-300}" .gpu/gpu --test-threads=1 ${TESTS_FILTER:-} 2>&1 | tee "$OUT/gpu_tests.log" | tail -40 ;;
    sanitize)
      for tool in memcheck racecheck; do
        timeout 200 compute-sanitizer --tool $tool --error-exitcode 99 .gpu/gpu --test-threads=1 sanitize \
          > "$OUT/sanitize_$tool.log" 2>&1
        echo "compute-sanitizer --tool $tool: exit $?"; grep -E "ERROR SUMMARY|test result|RACECHECK SUMMARY" "$OUT/sanitize_$tool.log" | tail -3
      done ;;
    bench)
      { echo "## CUB (cub_baseline.py), same machine, same run"; timeout 120 python3 .gpu/cub_baseline.py --json "$OUT/cub.json" 2>&1; } | tee "$OUT/paper.txt" | tail -14
      timeout "${BENCH_TIMEOUT:-300}" .gpu/paper ${BENCH_ARGS:-} --cub "$OUT/cub.json" --csv "$OUT/paper.csv" --svg "$OUT/paper.svg" 2>&1 | tee -a "$OUT/paper.txt" ;;
    cub)
      "$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)" -O3 -std=c++17 -arch=sm_90 .gpu/cub_native.cu -o /tmp/cub_native 2>&1 | tail -20
      timeout "${BENCH_TIMEOUT:-300}" /tmp/cub_native --json "$OUT/cub_native.json" 2>&1 | tee "$OUT/cub_native.txt" ;;
    topk) BENCH_CSV="$OUT/topk.csv" timeout "${BENCH_TIMEOUT:-300}" .gpu/topk 2>&1 | tee "$OUT/topk.txt" | tail -10 ;;
    proto)
      for v in ${PROTO_VARIANTS:-IPT=16}; do
        env PROTO_SKIP_CHECKS=1 ${v//,/ } timeout 150 python3 scripts/prototypes/proto_onesweep.py > "$OUT/proto_$v.txt" 2>&1
        echo "variant $v:"; grep -E "^(100M|10M)|pass|WRONG" "$OUT/proto_$v.txt"
      done
      for v in ${PROTO_CHECK_VARIANTS:-IPT=16}; do
        env PROTO_SKIP_TIMING=1 ${v//,/ } timeout 200 python3 scripts/prototypes/proto_onesweep.py > "$OUT/proto_checks_$v.txt" 2>&1
        echo "checks, variant $v:"; tail -2 "$OUT/proto_checks_$v.txt"
      done ;;
    tune)
      for v in ${TUNE_VARIANTS:-default}; do
        settings=${v//,/ }
        [ "$v" = default ] && settings=
        # File names without '=' and ',' (such names do not come back from the device).
        f=$(printf '%s' "$v" | tr '=,' '__')
        echo "== engine variant $v"
        # Correct first: the one-sweep GPU test (tile edges, grid rounds, skewed digits) with it.
        env $settings timeout 150 .gpu/gpu --test-threads=1 one_sweep > "$OUT/tune_tests_$f.txt" 2>&1
        grep -E "^test result|panicked" "$OUT/tune_tests_$f.txt" | head -3
        env $settings timeout 150 .gpu/paper --only keys --bits 8 --reps 7 > "$OUT/tune_$f.txt" 2>&1
        env $settings timeout 150 .gpu/paper --only records --fields 2,20 --bits 8 --reps 7 >> "$OUT/tune_$f.txt" 2>&1
        grep -E "^\| (u32|u64|ByField|Hybrid) |panicked|error" "$OUT/tune_$f.txt"
      done ;;
    tune-profile)
      timeout 400 .gpu/gpusort tune --budget "${TUNE_BUDGET:-2m}" > "$OUT/tune_profile.txt" 2> "$OUT/tune_progress.txt"
      echo "gpusort tune: exit $?"; cat "$OUT/tune_profile.txt"; tail -3 "$OUT/tune_progress.txt"
      cp "$GPUSORT_KERNEL_CACHE"/tuning-*.txt "$OUT/" 2>/dev/null || echo "no profile in $GPUSORT_KERNEL_CACHE"
      .gpu/gpusort info | grep -E "^(GPU|tuning) "
      for r in $(seq "${TUNE_ROUNDS:-2}"); do
        for v in tuned defaults; do
          te=; [ $v = defaults ] && te=GPUSORT_TUNING=off
          echo "== paper, $v, round $r" | tee -a "$OUT/tune_paper.txt"
          for only in keys records; do
            env $te timeout 200 .gpu/paper --only $only --fields 2,20 --bits 8 --reps 7 2>&1 \
              | grep -E "^# |^\| (u32|u64|ByField|Hybrid) |panicked" | tee -a "$OUT/tune_paper.txt"
          done
        done
      done ;;
    dist)
      timeout "${BENCH_TIMEOUT:-300}" .gpu/paper --only dist --reps "${DIST_REPS:-7}" 2>&1 | tee "$OUT/dist.txt" | tail -12
      [ -x .gpu/presorted ] && timeout 300 .gpu/presorted 2>&1 | tee "$OUT/presorted_cpu.txt" | tail -10 ;;
    dist-tpch)
      sf=${SF:-10}; data=/tmp/tpch/sf$sf
      if [ ! -f "$data/lineitem.parquet" ]; then
        [ -x /tmp/site/bin/tpchgen-cli ] ||
          python3 -m pip install -q --no-index --no-deps --target /tmp/site .gpu/tpchgen_cli-*.whl
        mkdir -p "$data"; t=$SECONDS
        PYTHONPATH=/tmp/site /tmp/site/bin/tpchgen-cli parquet -s "$sf" --tables lineitem --output-dir "$data"
        echo "tpchgen-cli: SF$sf lineitem in $((SECONDS - t)) s"
      fi
      timeout "${BENCH_TIMEOUT:-540}" .gpu/tpch_workers "$data/lineitem.parquet" --workers "${DIST_WORKERS:-1,2,4}" \
        --order-by "${DIST_ORDER_BY:-l_shipdate, l_orderkey, l_linenumber}" --runs "${RUNS:-2}" 2>&1 \
        | tee "$OUT/dist_tpch_sf$sf.txt" | tail -14 ;;
    ab)
      pargs=${AB_PAPER_ARGS:-"--fields 2,20 --bits 8 --reps 7"}
      for r in $(seq "${AB_ROUNDS:-2}"); do
        for v in before after; do
          b=.gpu/paper; [ $v = before ] && b=.gpu/paper_before
          [ -x $b ] || continue
          echo "== paper $v, round $r" | tee -a "$OUT/ab_paper.txt"
          for only in records keys; do
            timeout 300 $b --only $only $pargs 2>&1 | grep -E "^\| (u32|u64|ByField|Hybrid) " | tee -a "$OUT/ab_paper.txt"
          done
        done
        for v in before after; do
          b=.gpu/sql; [ $v = before ] && b=.gpu/sql_before
          [ -x $b ] || continue
          echo "== sql $v, round $r" | tee -a "$OUT/ab_sql.txt"
          env ${AB_SQL_ENV:-} timeout 300 $b 2>&1 | tee -a "$OUT/ab_sql.txt" | grep -E "^\| " | head -20
        done
      done ;;
    caps)
      cub=
      for j in "$OUT/cub_native.json" "$OUT/cub.json"; do [ -f "$j" ] && { cub="--cub $j"; break; }; done
      parts=${CAPS_PARTS:-"tests memcheck bench"}
      for cap in ${CAPS:-none 96K 99K 163K}; do
        capenv=; [ "$cap" = none ] || capenv="GPUSORT_SMEM_CAP=$cap"
        echo "== shared memory cap: $cap"
        case " $parts " in *" tests "*)
          env $capenv timeout "${TESTS_TIMEOUT:-300}" .gpu/gpu --test-threads=1 ${TESTS_FILTER:-} \
            > "$OUT/caps_tests_$cap.log" 2>&1
          echo "tests under $cap: exit $?"; grep -E "^test result|panicked|FAILED" "$OUT/caps_tests_$cap.log" | head -8
          env $capenv timeout 60 .gpu/gpu --test-threads=1 --nocapture shapes_fit_the_device 2>&1 | grep -E "KiB a block|panicked" ;;
        esac
        case " $parts " in *" memcheck "*)
          env $capenv timeout 200 compute-sanitizer --tool memcheck --error-exitcode 99 .gpu/gpu --test-threads=1 sanitize \
            > "$OUT/caps_memcheck_$cap.log" 2>&1
          echo "memcheck under $cap: exit $?"; grep -E "ERROR SUMMARY|test result" "$OUT/caps_memcheck_$cap.log" | tail -2 ;;
        esac
        case " $parts " in *" bench "*)
          env $capenv timeout "${BENCH_TIMEOUT:-300}" .gpu/paper ${BENCH_ARGS:-} $cub --csv "$OUT/caps_paper_$cap.csv" \
            > "$OUT/caps_paper_$cap.txt" 2>&1
          echo "paper under $cap: exit $?"; grep -E "^# |^\| " "$OUT/caps_paper_$cap.txt" | head -60 ;;
        esac
      done ;;
  esac
done
