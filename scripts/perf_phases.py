#!/usr/bin/env python3
"""Cuts the samples of scripts/device-perf.sh (samples-L.txt.xz: `perf script -F comm,tid,time,ip,sym`)
into the phases of the same process's timeline: CPU seconds, cores busy, threads and the top
symbols of each phase.

    python3 scripts/perf_phases.py samples-3.txt.xz 0,1.546,2.456,5.567,6.46 reading,sorting,writing,tail [TOP]

The marks are seconds from the process's start as the timeline prints them (its first sample
is taken as 0); the rate is device-perf.sh's (997 Hz).
"""
import collections
import lzma
import re
import sys

HZ = 997


def main():
    path, marks, names = sys.argv[1], [float(x) for x in sys.argv[2].split(",")], sys.argv[3].split(",")
    top = int(sys.argv[4]) if len(sys.argv) > 4 else 25
    rows = []
    for line in lzma.open(path, "rt"):
        m = re.match(r"\s*(.+?)\s+(\d+)\s+([\d.]+):\s+([0-9a-f]+)\s+(.*)$", line)
        if m:
            rows.append((m.group(1), float(m.group(3)), m.group(5).strip()))
    t0 = min(r[1] for r in rows)
    for i, name in enumerate(names):
        lo, hi = marks[i], marks[i + 1]
        sel = [r for r in rows if lo <= r[1] - t0 < hi]
        n = max(len(sel), 1)
        print(f"== {name} [{lo:.2f}, {hi:.2f}) : {len(sel)} samples = {len(sel) / HZ:.1f} CPU-s over "
              f"{hi - lo:.2f} s = {len(sel) / HZ / (hi - lo):.1f} cores")
        threads = collections.Counter(re.sub(r"[-\d]+$", "", r[0]) for r in sel)
        print("  threads:", ", ".join(f"{k} {v / HZ:.1f}" for k, v in threads.most_common(8)))
        for sym, v in collections.Counter(r[2] for r in sel).most_common(top):
            print(f"  {v / HZ:6.2f} s  {100 * v / n:5.1f}%  {sym[:120]}")


if __name__ == "__main__":
    main()
