#!/usr/bin/env python3
"""Sums what a `gpusort sort --timeline` log says of the output ranges and the writer's row groups.

For the ranges (`session: rows A..B handed out (...)` lines): their count, the mean and median
gap between hand-outs, and each part's total (the downloads' start, split into host buffers and
the views' compaction; the host gather; the wait for the downloads). For the row groups (`writer:
row group N encoding|encoded|ready|appended`): the median time from encoding to encoded, to ready
(pages compressed) and to appended. Then the phase line of the summary.

    python3 scripts/timeline_ranges.py LOG [LOG ...]
"""

import re
import statistics
import sys

STAMP = r"\[\s*([\d.]+) s, cpu\s+([\d.]+) s[^\]]*\] "
RANGE = re.compile(
    STAMP + r"session: rows (\d+)\.\.(\d+) handed out \(downloads started ([\d.]+) ms "
    r"\[host buffers ([\d.]+), views compacted ([\d.]+)\], host gather ([\d.]+), downloads done ([\d.]+)\)"
)
GROUP = re.compile(STAMP + r"writer: row group (\d+) (encoding|encoded|ready|appended)")


def summarize(path):
    ranges, groups, time_line = [], {}, None
    with open(path, errors="replace") as f:
        for line in f:
            if m := RANGE.match(line):
                ranges.append([float(x) for x in m.groups()])
            elif m := GROUP.match(line):
                groups.setdefault(int(m.group(3)), {})[m.group(4)] = float(m.group(1))
            elif line.strip().startswith("time "):
                time_line = line.strip()
    print(f"== {path}")
    if time_line:
        print(f"  {time_line}")
    if ranges:
        at = [r[0] for r in ranges]
        gaps = [b - a for a, b in zip(at, at[1:])] or [0.0]
        parts = {
            "downloads started": sum(r[4] for r in ranges),
            "  host buffers": sum(r[5] for r in ranges),
            "  views compacted": sum(r[6] for r in ranges),
            "host gather": sum(r[7] for r in ranges),
            "downloads done": sum(r[8] for r in ranges),
        }
        print(
            f"  ranges: {len(ranges)}, handed out {at[0]:.3f}..{at[-1]:.3f} s, gap mean "
            f"{1e3 * statistics.mean(gaps):.1f} ms, median {1e3 * statistics.median(gaps):.1f} ms"
        )
        for name, ms in parts.items():
            print(f"    {name:<20} {ms:8.1f} ms")
    steps = [("encoding", "encoded"), ("encoded", "ready"), ("ready", "appended")]
    done = [g for g in groups.values() if all(k in g for k in ("encoding", "encoded", "ready", "appended"))]
    if done:
        medians = [statistics.median(1e3 * (g[b] - g[a]) for g in done) for a, b in steps]
        print(
            f"  row groups: {len(done)}, median ms encoding->encoded {medians[0]:.0f}, "
            f"->ready {medians[1]:.0f}, ->appended {medians[2]:.0f}"
        )


if __name__ == "__main__":
    for p in sys.argv[1:]:
        summarize(p)
