#!/usr/bin/env python3
"""DuckDB beside the `external` bench (issue 24): `SELECT * FROM t ORDER BY k` over the bench's
own table, under the same memory limit, spilling to the same directory. The Rust bench writes
its table partitions as Arrow IPC files and runs this script in the same command.

    python3 external_duckdb.py <dir of *.arrow> <memory limit in bytes> <spill dir>

The table is memory-mapped and registered with DuckDB as an Arrow table, so it is in memory
outside DuckDB's limit, as the bench's MemTable is outside DataFusion's pool. The result is
streamed out in Arrow batches and checked as the Rust bench checks its contenders (sorted by k
within and across batches, the row count, the wrapping sums of every column), the batches on a
thread pool (numpy releases the GIL). Prints `key=value` lines: ms, rows, sorted, sums, version.
Environment: DUCKDB_THREADS (default all cores).
"""

import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc

BATCH_ROWS = 1 << 20


def check(batch):
    """(rows, first k, last k, sorted within, wrapping sums) of one output batch."""
    cols = [c.to_numpy(zero_copy_only=False) for c in batch.columns]
    k = cols[0]
    n = len(k)
    inside = bool(np.all(k[1:] >= k[:-1])) if n > 1 else True
    sums = [int(np.sum(c, dtype=np.uint64)) for c in cols]
    return n, (int(k[0]) if n else None), (int(k[-1]) if n else None), inside, sums


def main():
    src, limit, spill = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    threads = int(os.environ.get("DUCKDB_THREADS", os.cpu_count()))
    files = sorted(f for f in os.listdir(src) if f.endswith(".arrow"))
    table = pa.concat_tables([ipc.open_file(pa.memory_map(os.path.join(src, f))).read_all() for f in files])
    con = duckdb.connect()
    con.execute(f"SET memory_limit = '{limit // (1 << 20)}MiB'")
    con.execute(f"SET temp_directory = '{spill}'")
    con.execute(f"SET threads = {threads}")
    con.register("t", table)
    start = time.perf_counter()
    rel = con.sql("SELECT * FROM t ORDER BY k")
    # A relation's Arrow reader (no extra copy of the rows): DuckDB 2 names it to_arrow_reader,
    # 1.x fetch_arrow_reader.
    take = getattr(rel, "to_arrow_reader", None) or getattr(rel, "fetch_arrow_reader")
    reader = take(BATCH_ROWS)
    with ThreadPoolExecutor(max_workers=max(1, threads // 2)) as pool:
        pending = [pool.submit(check, b) for b in reader]
        results = [p.result() for p in pending]
    ms = (time.perf_counter() - start) * 1e3
    rows, last, ok = 0, None, True
    sums = [0] * table.num_columns
    for n, first, end, inside, s in results:
        rows += n
        ok &= inside
        if n:
            ok &= last is None or last <= first
            last = end
        sums = [(a + b) % (1 << 64) for a, b in zip(sums, s)]
    print(f"ms={ms:.1f}")
    print(f"rows={rows}")
    print(f"sorted={int(ok)}")
    print("sums=" + ",".join(str(s) for s in sums))
    print(f"version={duckdb.__version__}")


if __name__ == "__main__":
    main()
