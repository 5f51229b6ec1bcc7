#!/usr/bin/env python3
"""CUB through CuPy: the reference the `paper` bench divides by, measured on the same GPU in the
same session.

CuPy's `sort` and `argsort` of a 1-D integer array are CUB's device radix sort (`SortKeys`, and
`SortPairs` of the key with a row index). This script times, with CUDA events and data already in
GPU memory:

  keys     `cupy.sort` of n random u32 and n random u64 keys, and `cupy.argsort` of the u32 keys
           (the key + index sort that an indirect record sort starts with);
  records  "CUB-indirect" for n records of a random u32 key and m random u32 fields: argsort of
           the key, then the rows gathered through the permutation, either one gather per field
           (ByField: one array per field) or one gather of an n x m row-major array (Hybrid).

Each figure is the minimum (what `paper` compares against) and the median over --reps timed runs
after --warmup untimed ones, in milliseconds.

    python3 cub_baseline.py                         # 10M and 100M keys; 10M records, m = 2..20
    python3 cub_baseline.py --json cub.json         # also write the figures for `paper --cub`
    python3 cub_baseline.py --keys 10000000 --fields 2 20 --reps 9

The JSON is {"gpu", "cupy", "reps", "keys": [...], "records": [...]}: one "keys" object per n
with `sort_u32_ms`, `sort_u64_ms` and `argsort_u32_ms` (and `*_median_ms`), one "records" object
per m with `n`, `fields`, `byfield_ms` and `hybrid_ms` (and `*_median_ms`).
`crates/gpusort-cuda/benches/paper.rs` (`read_cub`) reads the minima by those names.
"""

import argparse
import json
import statistics
import sys

import cupy as cp


class EventTimer:
    """Times a GPU callable with a pair of CUDA events on the current stream."""

    def __init__(self, warmup, reps):
        self.warmup = warmup
        self.reps = reps
        self.begin = cp.cuda.Event()
        self.end = cp.cuda.Event()

    def __call__(self, work):
        for _ in range(self.warmup):
            work()
        cp.cuda.Stream.null.synchronize()
        times = []
        for _ in range(self.reps):
            self.begin.record()
            work()
            self.end.record()
            self.end.synchronize()
            times.append(cp.cuda.get_elapsed_time(self.begin, self.end))
        return min(times), statistics.median(times)


def random_u32(rng, n):
    return rng.integers(0, 1 << 32, size=n, dtype=cp.uint64).astype(cp.uint32)


def random_u64(rng, n):
    # Two independent 32-bit halves: every one of the 64 bits varies.
    high = random_u32(rng, n).astype(cp.uint64)
    low = random_u32(rng, n).astype(cp.uint64)
    return (high << cp.uint64(32)) | low


def check_sorted(values, what):
    if n_unsorted := int(cp.count_nonzero(values[1:] < values[:-1])):
        sys.exit(f"{what}: {n_unsorted} adjacent pairs out of order")


def measure_keys(rng, n, timer):
    keys32 = random_u32(rng, n)
    check_sorted(cp.sort(keys32), f"sort u32 n={n}")
    sort32 = timer(lambda: cp.sort(keys32))
    argsort32 = timer(lambda: cp.argsort(keys32))
    del keys32
    keys64 = random_u64(rng, n)
    check_sorted(cp.sort(keys64), f"sort u64 n={n}")
    sort64 = timer(lambda: cp.sort(keys64))
    del keys64
    cp.get_default_memory_pool().free_all_blocks()
    return {
        "n": n,
        "sort_u32_ms": sort32[0],
        "sort_u32_median_ms": sort32[1],
        "sort_u64_ms": sort64[0],
        "sort_u64_median_ms": sort64[1],
        "argsort_u32_ms": argsort32[0],
        "argsort_u32_median_ms": argsort32[1],
    }


def measure_records(rng, n, m, timer):
    key = random_u32(rng, n)
    columns = [random_u32(rng, n) for _ in range(m)]

    def by_field():
        order = cp.argsort(key)
        return [cp.take(key, order)] + [cp.take(column, order) for column in columns]

    sorted_key = by_field()[0]
    check_sorted(sorted_key, f"records ByField m={m}")
    byfield = timer(by_field)

    rows = cp.ascontiguousarray(cp.stack(columns, axis=1))  # n x m, one row per record
    del columns

    def hybrid():
        order = cp.argsort(key)
        return cp.take(key, order), cp.take(rows, order, axis=0)

    hybrid_t = timer(hybrid)
    del key, rows, sorted_key
    cp.get_default_memory_pool().free_all_blocks()
    return {
        "n": n,
        "fields": m,
        "byfield_ms": byfield[0],
        "byfield_median_ms": byfield[1],
        "hybrid_ms": hybrid_t[0],
        "hybrid_median_ms": hybrid_t[1],
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", type=int, nargs="*", default=[10_000_000, 100_000_000],
                        help="key counts of the keys-only sorts")
    parser.add_argument("--records", type=int, default=10_000_000, help="records of the record sorts")
    parser.add_argument("--fields", type=int, nargs="*", default=list(range(2, 21, 2)),
                        help="u32 payload fields per record (m)")
    parser.add_argument("--reps", type=int, default=7, help="timed runs per figure")
    parser.add_argument("--warmup", type=int, default=2, help="untimed runs before them")
    parser.add_argument("--seed", type=int, default=20240601)
    parser.add_argument("--json", metavar="FILE", help="write the figures here as JSON")
    args = parser.parse_args()

    rng = cp.random.default_rng(args.seed)
    timer = EventTimer(args.warmup, args.reps)
    gpu = cp.cuda.runtime.getDeviceProperties(cp.cuda.Device().id)["name"]
    gpu = gpu.decode() if isinstance(gpu, bytes) else gpu
    result = {"gpu": gpu, "cupy": cp.__version__, "reps": args.reps, "keys": [], "records": []}
    print(f"# CUB through CuPy {cp.__version__} on {gpu}: min (median) of {args.reps} runs, ms")

    print(f"| keys | {'sort u32':>17} | {'argsort u32':>17} | {'sort u64':>17} | u32 Gkeys/s |")
    print("| ---: | ---: | ---: | ---: | ---: |")
    for n in args.keys:
        k = measure_keys(rng, n, timer)
        result["keys"].append(k)
        print(
            f"| {n} | {k['sort_u32_ms']:8.3f} ({k['sort_u32_median_ms']:.3f}) "
            f"| {k['argsort_u32_ms']:8.3f} ({k['argsort_u32_median_ms']:.3f}) "
            f"| {k['sort_u64_ms']:8.3f} ({k['sort_u64_median_ms']:.3f}) "
            f"| {n / k['sort_u32_ms'] / 1e6:.2f} |"
        )

    print(f"\n| records (n = {args.records}), m | ByField: argsort + gathers | Hybrid: argsort + row gather |")
    print("| ---: | ---: | ---: |")
    for m in args.fields:
        r = measure_records(rng, args.records, m, timer)
        result["records"].append(r)
        print(
            f"| {m} | {r['byfield_ms']:8.3f} ({r['byfield_median_ms']:.3f}) "
            f"| {r['hybrid_ms']:8.3f} ({r['hybrid_median_ms']:.3f}) |"
        )

    if args.json:
        with open(args.json, "w") as out:
            json.dump(result, out, indent=1)
            out.write("\n")
        print(f"# wrote {args.json}")


if __name__ == "__main__":
    main()
