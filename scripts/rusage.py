"""Runs a command three times and prints each run's wall time, user and system CPU seconds,
minor page faults and peak memory (the GPU machine has no perf or /usr/bin/time): what share
of a sort's CPU time is the kernel's (page faults, I/O).

    python3 scripts/rusage.py .gpu/gpusort sort lineitem.parquet -o /tmp/x.parquet -k "..." --force --quiet
"""
import resource, subprocess, sys, time
cmd = sys.argv[1:]
prev = resource.getrusage(resource.RUSAGE_CHILDREN)
for i in range(3):
    t = time.time()
    subprocess.run(cmd, check=True)
    wall = time.time() - t
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    print(f"run {i}: wall {wall:.2f} s, user {r.ru_utime - prev.ru_utime:.1f} s, sys {r.ru_stime - prev.ru_stime:.1f} s, "
          f"minor faults {r.ru_minflt - prev.ru_minflt}, max rss {r.ru_maxrss / 1e6:.1f} GB", flush=True)
    prev = r
