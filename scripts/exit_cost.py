"""Where the first sort on a freshly started GPU machine loses its seconds (issue 20's cold
start): from a process's last mark to its end, the exit. Stop 54 found the tool's first run
on a fresh machine 2.7 s slower than a warm one, all of it after its timeline's last mark.
This runs, in turn and twice each, a probe that is not the tool (CuPy pins and touches
`--pin-gb` of host memory, marks, exits) and the tool on a Parquet file (`--timeline`), and
prints for each run the wall time, the time from its last mark to its end, and what
`/proc/vmstat` counted meanwhile. Run it as the first GPU process of a fresh machine: if the
probe's first exit is the slow one, the machine pays it, not the tool. Then `--ab` pairs of
the tool leaving its pinned pool to the exit (the default) against giving it back on threads
before (`GPUSORT_EXIT_RELEASE=1`, stop 55).

    python3 scripts/exit_cost.py --gpusort .gpu/gpusort --input /tmp/tpch/sf10/lineitem.parquet \
        --order-by "l_shipdate, l_orderkey, l_linenumber" -- --gpu-memory-limit 4GiB
"""
import argparse, os, re, subprocess, sys, time

PROBE = """
import sys, time, cupy
n = int(float(sys.argv[1]) * (1 << 30))
mem = cupy.cuda.alloc_pinned_memory(n)
view = memoryview(mem).cast("B")
for i in range(0, n, 1 << 21):
    view[i] = 1
cupy.zeros(1).sum().get()
print("mark %.6f" % time.time(), flush=True)
"""

COUNTERS = ("pgfault", "pgfree", "thp_fault_alloc", "thp_split_page", "compact_stall", "pgmajfault")


def vmstat():
    with open("/proc/vmstat") as f:
        pairs = (line.split() for line in f)
        return {k: int(v) for k, v in pairs if k in COUNTERS}


def probe(gb):
    """Wall time, and seconds from the probe's mark to its end."""
    start = time.time()
    p = subprocess.run([sys.executable, "-c", PROBE, str(gb)], capture_output=True, text=True)
    end = time.time()
    m = re.search(r"mark ([\d.]+)", p.stdout)
    if p.returncode != 0 or not m:
        return end - start, None, p.stderr.strip().splitlines()[-1:]
    return end - start, end - float(m.group(1)), None


def tool(args, extra, release=False):
    """Wall time, and seconds from the tool's last timeline mark to its end; `release=True`
    gives the pinned pool back before the exit (`GPUSORT_EXIT_RELEASE=1`)."""
    cmd = [args.gpusort, "sort", args.input, "-o", "/tmp/exit-cost.parquet", "--order-by", args.order_by,
           "--force", "--timeline"] + extra
    env = dict(os.environ, GPUSORT_EXIT_RELEASE="1" if release else "0")
    start = time.time()
    p = subprocess.run(cmd, capture_output=True, text=True, env=env)
    wall = time.time() - start
    marks = re.findall(r"^\[\s*([\d.]+) s", p.stderr, re.M)
    if p.returncode != 0 or not marks:
        return wall, None, p.stderr.strip().splitlines()[-1:]
    given = re.search(r"main: (\d+) pinned bytes given back in ([\d.]+) ms", p.stderr)
    if given:
        print(f"  ({int(given.group(1)) / 1e9:.1f} GB pinned given back in {given.group(2)} ms before the exit)")
    return wall, wall - float(marks[-1]), None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gpusort", required=True)
    ap.add_argument("--input", required=True)
    ap.add_argument("--order-by", required=True)
    ap.add_argument("--pin-gb", type=float, default=15.0, help="host memory the probe pins (the tool pins ~15 GB under 4 GiB)")
    ap.add_argument("--ab", type=int, default=2, help="pairs of runs with and without the pool given back before the exit")
    ap.add_argument("extra", nargs="*", help="arguments for the tool, after --")
    args = ap.parse_args()
    runs = [("probe", lambda: probe(args.pin_gb)), ("gpusort", lambda: tool(args, args.extra))] * 2
    # Then the pool given back on threads before the exit against left to the exit (the default).
    runs += [("gpusort, pool given back before the exit", lambda: tool(args, args.extra, release=True)),
             ("gpusort", lambda: tool(args, args.extra))] * args.ab
    for name, run in runs:
        before = vmstat()
        wall, exit_s, error = run()
        after = vmstat()
        delta = " ".join(f"{k} {after.get(k, 0) - before.get(k, 0)}" for k in COUNTERS)
        tail = f"after the last mark {exit_s:.2f} s" if exit_s is not None else f"FAILED: {error}"
        print(f"{name}: wall {wall:.2f} s, {tail}; vmstat: {delta}", flush=True)


if __name__ == "__main__":
    main()
