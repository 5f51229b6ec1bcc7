#!/usr/bin/env python3
"""TPC-H lineitem sorted file to file: the `gpusort` tool (GPU, CPU, DataFusion's sort) against
DuckDB's `COPY`, in one command on one machine, with every output checked against DuckDB's.

    python3 tpch.py --gpusort PATH/TO/gpusort --sf 10 --data /tmp/tpch [--runs 2]
        [--lists 1,2,3] [--contenders gpu,cpu,duckdb,datafusion] [--extra "--gpu-memory-limit 4G"]
        [--sql-bench PATH/TO/sql_parquet] [--csv out.csv] [--svg phases.svg]

Contenders: `gpu`, `cpu` (`gpusort sort --device cpu`), `gpu-4g` (`--gpu-memory-limit 4GiB`: the
external sort, runs within 4 GiB of device memory, merged), `gpu-cpu-zstd` (the GPU sort with
its pages compressed on the CPU, `--compress-on cpu`: what nvCOMP saves), `gpu-parquet-enc` (every
column encoded by the Parquet crate, `--column-encoder parquet`: what gpusort's encoder saves),
`gpu-parquet-writer` and `cpu-parquet-writer` (both, the Parquet crate's writer alone, on the GPU
and CPU sorts), `gpu-host-views` (`GPUSORT_DEVICE_VIEWS=0`), `gpu-thp` and `cpu-thp` (mimalloc's
large OS pages), `gpu-keep-freed` (`MIMALLOC_PURGE_DELAY=-1`: freed memory kept, not returned to
the OS and faulted in again), `gpu-host-keys` (`GPUSORT_DEVICE_KEYS=0`: every sort key encoded
on the host), `gpu-host-ties`, `gpu-device-ties` and `gpu-gathered-ties` (tied string prefixes
ordered on the host, on the device through the views, on the device from tails gathered on the
host: `GPUSORT_DEVICE_TIES=0`, `1`, `1` with `GPUSORT_TIE_VIEWS=0`), `gpu-host-compact` (a view
key's sorted values not laid out on the device for the writer: `GPUSORT_COMPACT_VIEWS=0`), `datafusion` (`gpusort sort
--no-gpusort`: DataFusion's SortExec into gpusort's writer), `duckdb`, and with `--sql-bench` (the
`sql_parquet` bench binary) SQL through a DataFusion `SessionContext`: `sql-copy` (`COPY (SELECT
* FROM 'file' ORDER BY ...) TO 'out.parquet'` with gpusort), `df-copy` (the same on stock
DataFusion), `sql-collect` (`SELECT ... ORDER BY` collected, with gpusort).

Needs `tpchgen-cli` (pip) to make lineitem at the scale factor (once, kept in --data) and the
`duckdb` Python package. Each ORDER BY list is sorted by each contender in turn, `--runs`
rounds; the table gives the best wall time of each, its ratio to DuckDB's, and gpusort's own
phases (planning, reading, sorting, writing) from its summary. Before the first gpusort run the
kernel cache is a new empty folder, so the first GPU contender's extra first run (its row
"(cold kernel cache)") is the cold start a new machine pays (the kernels loaded or compiled, on
a freshly started machine also the driver's start and the first touch of its memory); later
runs use the cache.

Checks, against DuckDB's output of the same list: the same number of rows, the same key columns
row for row, and the same order-independent checksum of every row (the sum of DuckDB's hash of
all the columns as text), computed by DuckDB on all cores.
"""

import argparse
import csv
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

LISTS = {
    "1": "l_shipdate, l_orderkey, l_linenumber",
    "2": "l_returnflag, l_linestatus, l_extendedprice DESC, l_orderkey, l_linenumber",
    "3": "l_comment, l_orderkey, l_linenumber",
    "4": "l_partkey, l_suppkey",
    "5": "l_orderkey DESC, l_linenumber DESC",
    "6": "l_shipmode, l_receiptdate DESC NULLS LAST, l_quantity",
}

COLUMNS = [
    "l_orderkey", "l_partkey", "l_suppkey", "l_linenumber", "l_quantity", "l_extendedprice",
    "l_discount", "l_tax", "l_returnflag", "l_linestatus", "l_shipdate", "l_commitdate",
    "l_receiptdate", "l_shipinstruct", "l_shipmode", "l_comment",
]

PHASES = ["planning", "reading", "sorting", "writing"]


def key_columns(order_by):
    return [k.strip().split()[0] for k in order_by.split(",")]


def make_lineitem(sf, data):
    path = os.path.join(data, f"sf{sf}", "lineitem.parquet")
    if not os.path.exists(path):
        os.makedirs(os.path.dirname(path), exist_ok=True)
        t = time.time()
        subprocess.run(["tpchgen-cli", "parquet", "-s", str(sf), "--tables", "lineitem",
                        "--output-dir", os.path.dirname(path)], check=True)
        print(f"tpchgen-cli: SF{sf} lineitem in {time.time() - t:.1f} s", flush=True)
    return path


def run_gpusort(binary, args, inp, out, order_by, env):
    # A new file each run, as DuckDB writes one: replacing the last run's output (--force)
    # costs the file system seconds to free it, which is not the sort's time.
    if os.path.exists(out):
        os.remove(out)
    cmd = [binary, "sort", inp, "-o", out, "--order-by", order_by] + args
    t = time.time()
    p = subprocess.run(cmd, capture_output=True, text=True, env=env)
    wall = time.time() - t
    if p.returncode != 0:
        return wall, None, p.stderr.strip().splitlines()[-1:] or ["exit %d" % p.returncode]
    phases = {}
    m = re.search(r"planning ([\d.]+) ?(m?s) \+ reading ([\d.]+) ?(m?s) \+ sorting(?:\+merging)? ([\d.]+) ?(m?s) "
                  r"\+ writing ([\d.]+) ?(m?s)", p.stderr)
    if m:
        vals = m.groups()
        for i, name in enumerate(PHASES):
            v, unit = float(vals[2 * i]), vals[2 * i + 1]
            phases[name] = v / 1000 if unit == "ms" else v
    where = re.search(r"sorted   (.*)", p.stderr)
    phases["where"] = where.group(1) if where else ""
    kernels = re.search(r"GPU      kernels ([\d.]+) ?(m?s)", p.stderr)
    if kernels:
        phases["kernels"] = float(kernels.group(1)) / (1000 if kernels.group(2) == "ms" else 1)
    return wall, phases, p.stderr


def run_sql(binary, mode, inp, out, order_by, stock):
    """The sql_parquet bench: (seconds, rows, plan's sort operator), or None and the error."""
    if out and os.path.exists(out):
        os.remove(out)
    cmd = [binary, inp, order_by, mode] + ([out] if out else []) + (["--stock"] if stock else [])
    p = subprocess.run(cmd, capture_output=True, text=True)
    m = re.search(r"seconds=([\d.]+) rows=(\d+) plan=(\S*)", p.stdout)
    if p.returncode != 0 or not m:
        return None, (p.stderr.strip().splitlines() or [f"exit {p.returncode}"])[-1]
    return (float(m.group(1)), int(m.group(2)), m.group(3)), None


def run_duckdb(inp, out, order_by, threads):
    import duckdb
    if os.path.exists(out):
        os.remove(out)
    con = duckdb.connect()
    con.execute(f"SET threads={threads}")
    t = time.time()
    con.execute(f"COPY (SELECT * FROM read_parquet('{inp}') ORDER BY {order_by}) "
                f"TO '{out}' (FORMAT parquet, COMPRESSION zstd)")
    wall = time.time() - t
    con.close()
    return wall


def check(out, ref, order_by, threads):
    """None when `out` has DuckDB's rows in DuckDB's key order, else what differs."""
    import duckdb
    con = duckdb.connect()
    con.execute(f"SET threads={threads}")
    keys = key_columns(order_by)
    diff = " OR ".join(f"a.{k} IS DISTINCT FROM b.{k}" for k in keys)
    n_a, n_b = (con.execute(f"SELECT count(*) FROM read_parquet('{p}')").fetchone()[0] for p in (out, ref))
    if n_a != n_b:
        return f"{n_a} rows, DuckDB {n_b}"
    bad = con.execute(
        f"SELECT count(*) FROM read_parquet('{out}', file_row_number=true) a "
        f"JOIN read_parquet('{ref}', file_row_number=true) b USING (file_row_number) WHERE {diff}").fetchone()[0]
    if bad:
        return f"{bad} rows whose keys differ from DuckDB's"
    h = "hash(" + ", ".join(f"{c}::VARCHAR" for c in COLUMNS) + ")::HUGEINT"
    sums = [con.execute(f"SELECT sum({h}) FROM read_parquet('{p}')").fetchone()[0] for p in (out, ref)]
    if sums[0] != sums[1]:
        return "row checksums differ from DuckDB's"
    return None


def sql_contender(args, c, inp, out, ref, order_by, li, best_duck):
    """One SQL contender's row of the table (best of --runs)."""
    mode = "collect" if c == "sql-collect" else "copy"
    best, err = None, None
    for _ in range(args.runs):
        r, err = run_sql(args.sql_bench, mode, inp, None if mode == "collect" else out, order_by, c == "df-copy")
        if r is None:
            break
        if best is None or r[0] < best[0]:
            best = r
    if best is None:
        print(f"{c}: FAILED: {err}", flush=True)
        return dict(list=li, contender=c, seconds=None, ratio=None, check="failed")
    seconds, n, plan = best
    if mode == "copy":
        problem = check(out, ref, order_by, args.threads)
        os.remove(out)
    else:
        import duckdb
        want = duckdb.connect().execute(f"SELECT count(*) FROM read_parquet('{ref}')").fetchone()[0]
        problem = None if n == want else f"{n} rows, DuckDB {want}"
    print(f"{c}: {seconds:.2f} s ({plan}); check: {problem or 'ok'}", flush=True)
    return dict(list=li, contender=f"{c} ({plan})", seconds=seconds, ratio=best_duck / seconds,
                check=problem or "ok")


def svg(rows, path):
    """Stacked bars of gpusort's phases (and DuckDB's total) per list and contender."""
    bars = [r for r in rows if r["seconds"] is not None]
    if not bars:
        return
    colors = {"planning": "#999999", "reading": "#4e79a7", "sorting": "#f28e2b", "writing": "#59a14f",
              "total": "#b07aa1"}
    scale = 700 / max(r["seconds"] for r in bars)
    h, y = 22, 30
    out = ['<svg xmlns="http://www.w3.org/2000/svg" width="1000" height="%d" font-family="sans-serif" '
           'font-size="12">' % (40 + len(bars) * (h + 6) + 30)]
    out.append('<text x="10" y="18">seconds per phase (gpusort summary); DuckDB: total</text>')
    for r in bars:
        label = f"list {r['list']} {r['contender']}"
        out.append(f'<text x="10" y="{y + 15}">{label}</text>')
        x = 180
        parts = [(p, r.get(p)) for p in PHASES] if r.get("planning") is not None else [("total", r["seconds"])]
        for name, v in parts:
            w = max(0.0, (v or 0) * scale)
            out.append(f'<rect x="{x:.1f}" y="{y}" width="{w:.1f}" height="{h}" fill="{colors[name]}">'
                       f'<title>{name} {v:.2f} s</title></rect>')
            x += w
        out.append(f'<text x="{x + 5:.1f}" y="{y + 15}">{r["seconds"]:.2f} s</text>')
        y += h + 6
    lx = 10
    for name, c in colors.items():
        out.append(f'<rect x="{lx}" y="{y + 10}" width="12" height="12" fill="{c}"/>'
                   f'<text x="{lx + 16}" y="{y + 21}">{name}</text>')
        lx += 100
    out.append("</svg>")
    with open(path, "w") as f:
        f.write("\n".join(out))


def print_table(rows):
    """The table of every contender's best time, ratio to DuckDB and phases."""
    print("\n| list | ORDER BY | contender | seconds | DuckDB / it | planning | reading | sorting | writing | "
          "GPU kernels | check |")
    print("|---|---|---|---:|---:|---:|---:|---:|---:|---:|---|")
    f = lambda v: "" if v is None else f"{v:.2f}"
    ratio = lambda v: "" if v is None else f"{v:.2f}x"
    for r in rows:
        print(f"| {r['list']} | {LISTS[r['list']]} | {r['contender']} | {f(r['seconds'])} | "
              + ratio(r['ratio']) + " | "
              + " | ".join(f(r.get(p)) for p in PHASES) + f" | {f(r.get('kernels'))} | {r['check']} |")


def write_files(rows, args):
    """The rows as --csv and --svg say (rewritten after each list)."""
    if args.csv:
        with open(args.csv, "w", newline="") as fh:
            w = csv.writer(fh)
            w.writerow(["list", "order_by", "contender", "seconds", "duckdb_ratio"] + PHASES + ["kernels", "check"])
            for r in rows:
                w.writerow([r["list"], LISTS[r["list"]], r["contender"], r["seconds"], r["ratio"]]
                           + [r.get(p) for p in PHASES] + [r.get("kernels"), r["check"]])
    if args.svg:
        svg(rows, args.svg)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gpusort", required=True)
    ap.add_argument("--sf", default="10")
    ap.add_argument("--data", default="/tmp/tpch")
    ap.add_argument("--out-dir", default=None, help="where outputs go (default: a temporary folder)")
    ap.add_argument("--lists", default="1,2,3")
    ap.add_argument("--contenders", default="gpu,cpu,duckdb")
    ap.add_argument("--extra", default="", help="more arguments for every gpusort run")
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--timeline", action="store_true",
                    help="print gpusort's --timeline of its last run of each, and of the cold run")
    ap.add_argument("--sql-bench", help="the sql_parquet bench binary (for sql-copy, df-copy, sql-collect)")
    ap.add_argument("--csv")
    ap.add_argument("--svg")
    args = ap.parse_args()

    inp = make_lineitem(args.sf, args.data)
    print(f"input: {inp} ({os.path.getsize(inp) / 2**30:.2f} GiB), {args.threads} threads", flush=True)
    contenders = args.contenders.split(",")
    out_dir = args.out_dir or tempfile.mkdtemp(prefix="tpch-bench-")
    os.makedirs(out_dir, exist_ok=True)
    cache = tempfile.mkdtemp(prefix="gpusort-kernels-")  # empty: the first GPU run compiles
    env = dict(os.environ, GPUSORT_KERNEL_CACHE=cache)
    extra = args.extra.split()
    gpusort_args = {"gpu": [], "cpu": ["--device", "cpu"], "datafusion": ["--no-gpusort"],
                    # larger than the GPU budget: sorted runs of at most 4 GB of device memory, merged
                    "gpu-4g": ["--gpu-memory-limit", "4GiB"],
                    # the GPU sort, pages compressed by the Parquet writer on the CPU
                    "gpu-cpu-zstd": ["--compress-on", "cpu"],
                    # the GPU sort, every column encoded by the Parquet crate (pages still on the GPU)
                    "gpu-parquet-enc": ["--column-encoder", "parquet"],
                    # the same with the Parquet crate compressing too: the writer as it was
                    "gpu-parquet-writer": ["--column-encoder", "parquet", "--compress-on", "cpu"],
                    "cpu-parquet-writer": ["--device", "cpu", "--column-encoder", "parquet", "--compress-on", "cpu"],
                    # the GPU sort with string views concatenated and gathered on the host
                    "gpu-host-views": [],
                    # the same with mimalloc asking for transparent huge pages (2 MiB)
                    "gpu-thp": [], "cpu-thp": ["--device", "cpu"],
                    # the same with mimalloc keeping freed memory instead of returning it to the OS
                    "gpu-keep-freed": [],
                    # the same with every sort key encoded on the host (as before string keys
                    # were encoded on the device)
                    "gpu-host-keys": [],
                    # the same with tied string prefixes ordered on the host, and on the device
                    # (through the views, or from tails gathered on the host)
                    "gpu-host-ties": [], "gpu-device-ties": [], "gpu-gathered-ties": [],
                    # the same with the view key's output values left where the input had them
                    # (the writer reads them at random) instead of laid out on the device
                    "gpu-host-compact": [],
                    "gpu-4g-host-views": ["--gpu-memory-limit", "4GiB"],
                    # the same with the merge steps' keys alone on the GPU, their rows gathered on the host
                    "gpu-4g-keys": ["--gpu-memory-limit", "4GiB"],
                    # the same with every uploaded row staged, none copied from the runs' pinned blocks
                    "gpu-4g-staged": ["--gpu-memory-limit", "4GiB"],
                    # the same with each run and merge step brought down in one piece (the default),
                    # and in ranges of several sizes
                    "gpu-4g-whole": ["--gpu-memory-limit", "4GiB"],
                    "gpu-4g-r4m": ["--gpu-memory-limit", "4GiB"],
                    "gpu-4g-r1m": ["--gpu-memory-limit", "4GiB"],
                    "gpu-4g-r2m": ["--gpu-memory-limit", "4GiB"],
                    "gpu-4g-r8m": ["--gpu-memory-limit", "4GiB"],
                    # the pinned pool given back on threads before the process's exit, not left to it
                    "gpu-release-pool": [], "gpu-4g-release-pool": ["--gpu-memory-limit", "4GiB"]}
    # Contenders that differ by an environment variable.
    thp = {"MIMALLOC_ALLOW_LARGE_OS_PAGES": "1"}
    contender_env = {"gpu-host-views": {"GPUSORT_DEVICE_VIEWS": "0"}, "gpu-thp": thp, "cpu-thp": thp,
                     "gpu-keep-freed": {"MIMALLOC_PURGE_DELAY": "-1"},
                     "gpu-host-keys": {"GPUSORT_DEVICE_KEYS": "0"},
                     "gpu-host-ties": {"GPUSORT_DEVICE_TIES": "0"},
                     "gpu-device-ties": {"GPUSORT_DEVICE_TIES": "1"},
                     "gpu-gathered-ties": {"GPUSORT_DEVICE_TIES": "1", "GPUSORT_TIE_VIEWS": "0"},
                     "gpu-host-compact": {"GPUSORT_COMPACT_VIEWS": "0"},
                     "gpu-4g-host-views": {"GPUSORT_DEVICE_VIEWS": "0"},
                     "gpu-4g-keys": {"GPUSORT_MERGE_KEYS_ONLY": "1"},
                     "gpu-4g-staged": {"GPUSORT_DIRECT_UPLOADS": "0"},
                     "gpu-4g-whole": {"GPUSORT_RUN_RANGE_ROWS": "0"},
                     # runs and merge steps in ranges of 1M, 2M, 4M, 8M rows
                     "gpu-4g-r4m": {"GPUSORT_RUN_RANGE_ROWS": str(4 << 20)},
                     "gpu-4g-r1m": {"GPUSORT_RUN_RANGE_ROWS": str(1 << 20)},
                     "gpu-4g-r2m": {"GPUSORT_RUN_RANGE_ROWS": str(2 << 20)},
                     "gpu-4g-r8m": {"GPUSORT_RUN_RANGE_ROWS": str(8 << 20)},
                     "gpu-release-pool": {"GPUSORT_EXIT_RELEASE": "1"},
                     "gpu-4g-release-pool": {"GPUSORT_EXIT_RELEASE": "1"}}
    rows = []
    first_gpu = True
    for li in args.lists.split(","):
        order_by = LISTS[li]
        print(f"\n== list {li}: ORDER BY {order_by}", flush=True)
        ref = os.path.join(out_dir, f"duckdb-{li}.parquet")
        duck = [run_duckdb(inp, ref, order_by, args.threads) for _ in range(args.runs)]
        best_duck = min(duck)
        print(f"duckdb: {' '.join(f'{d:.2f}' for d in duck)} s", flush=True)
        if "duckdb" in contenders:
            rows.append(dict(list=li, contender="duckdb", seconds=best_duck, ratio=1.0, check="reference"))
        for c in contenders:
            if c == "duckdb":
                continue
            out = os.path.join(out_dir, f"{c}-{li}.parquet")
            if c in ("sql-copy", "df-copy", "sql-collect"):
                rows.append(sql_contender(args, c, inp, out, ref, order_by, li, best_duck))
                continue
            walls, best = [], None
            # The first GPU contender of the call runs once more, first, with the empty kernel
            # cache (on a freshly started machine also the process's first touch of its memory
            # and the driver's start): its own row, and its timeline with --timeline.
            on_gpu = c.startswith("gpu")
            runs = args.runs + (1 if on_gpu and first_gpu else 0)
            for r in range(runs):
                cold = on_gpu and first_gpu and r == 0
                timeline = ["--timeline"] if args.timeline and (r == runs - 1 or cold) else []
                wall, phases, log = run_gpusort(args.gpusort, gpusort_args[c] + extra + timeline, inp, out,
                                                order_by, dict(env, **contender_env.get(c, {})))
                if phases is None:
                    print(f"{c}: FAILED: {log}", flush=True)
                    break
                if timeline:
                    print(log, flush=True)
                if cold:
                    rows.append(dict(list=li, contender=f"{c} (cold kernel cache)", seconds=wall,
                                     ratio=best_duck / wall, check="", **phases))
                    first_gpu = False
                    continue
                walls.append(wall)
                if best is None or wall < best[0]:
                    best = (wall, phases)
            if best is None:
                rows.append(dict(list=li, contender=c, seconds=None, ratio=None, check="failed"))
                continue
            problem = check(out, ref, order_by, args.threads)
            print(f"{c}: {' '.join(f'{w:.2f}' for w in walls)} s; {best[1].get('where', '')}; "
                  f"check: {problem or 'ok'}", flush=True)
            rows.append(dict(list=li, contender=c, seconds=best[0], ratio=best_duck / best[0],
                             check=problem or "ok", **best[1]))
            os.remove(out)
        os.remove(ref)
        # The lists done so far, in case the caller's time runs out before the last.
        write_files(rows, args)
    shutil.rmtree(cache, ignore_errors=True)

    print_table(rows)
    failed = [r for r in rows if r["check"] not in ("ok", "reference", "")]
    if failed:
        print(f"\n{len(failed)} outputs failed their check", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
