#!/usr/bin/env python3
"""DuckDB beside the `concurrent` bench (issue 28): the same two ORDER BY queries over the same
tables, from 1, 4 and 16 client threads, each with a cursor of its own running its queries back
to back (results fetched whole as Arrow tables, as DataFusion's collect does, when pyarrow is
installed; else, or with DUCKDB_FETCH=table, materialized inside DuckDB as a temporary table,
which keeps the order: preserve_insertion_order is on); prints JSON with
the aggregate rows/s and p50/p99 latency per level, which the Rust bench reads through
BENCH_DUCKDB_JSON.

    BENCH_PARQUET_DIR=/tmp/tables cargo bench -p datafusion-gpusort --bench concurrent
    python3 crates/datafusion-gpusort/benches/concurrent_duckdb.py /tmp/tables > duckdb.json

Arguments: the directory holding t_a.parquet and t_b.parquet (written by the Rust bench).
Environment: BENCH_CLIENTS (default 1,4,16), BENCH_QUERIES (queries per client, default 4),
DUCKDB_THREADS (DuckDB's threads, default all cores). The tables are loaded into DuckDB's
memory first, so the queries read no Parquet.
"""

import json
import os
import sys
import threading
import time

import duckdb

MODE = "arrow"

QUERIES = [
    "SELECT * FROM t_a ORDER BY k",
    "SELECT * FROM t_b ORDER BY a, s DESC, b",
]


def quantile(values, q):
    values = sorted(values)
    return values[round((len(values) - 1) * q)]


def fetch_mode():
    """How results are taken: `arrow` (whole Arrow tables, needs pyarrow) or `table`."""
    mode = os.environ.get("DUCKDB_FETCH")
    if mode:
        return mode
    try:
        import pyarrow  # noqa: F401

        return "arrow"
    except ImportError:
        return "table"


def run_query(cur, sql, mode, name):
    """Runs `sql` to its end on `cur`; returns its rows."""
    if mode == "arrow":
        result = cur.execute(sql)
        take = getattr(result, "fetch_arrow_table", None) or getattr(result, "to_arrow_table")
        return take().num_rows
    cur.execute(f"CREATE OR REPLACE TEMP TABLE {name} AS {sql}")
    n = cur.execute(f"SELECT count(*) FROM {name}").fetchone()[0]
    cur.execute(f"DROP TABLE {name}")
    return n


def level(con, clients, queries):
    latencies = []
    rows = []
    errors = []
    lock = threading.Lock()

    def client(i):
        cur = con.cursor()
        try:
            for q in range(queries):
                sql = QUERIES[(i + q) % 2]
                t = time.perf_counter()
                n = run_query(cur, sql, MODE, f"result_{i}")
                ms = (time.perf_counter() - t) * 1e3
                with lock:
                    latencies.append(ms)
                    rows.append(n)
        except Exception as e:  # reported, and the run fails
            with lock:
                errors.append(repr(e))
        finally:
            cur.close()

    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    seconds = time.perf_counter() - start
    if errors:
        raise RuntimeError("; ".join(errors))
    return {
        "clients": clients,
        "queries": len(latencies),
        "seconds": round(seconds, 4),
        "rows_per_s": round(sum(rows) / seconds, 1),
        "p50_ms": round(quantile(latencies, 0.5), 2),
        "p99_ms": round(quantile(latencies, 0.99), 2),
    }


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    directory = sys.argv[1]
    clients = [int(c) for c in os.environ.get("BENCH_CLIENTS", "1,4,16").split(",") if c.strip()]
    queries = max(2, int(os.environ.get("BENCH_QUERIES", "4")))
    global MODE
    MODE = fetch_mode()
    con = duckdb.connect()
    if "DUCKDB_THREADS" in os.environ:
        con.execute(f"SET threads = {int(os.environ['DUCKDB_THREADS'])}")
    for name in ("t_a", "t_b"):
        path = os.path.join(directory, f"{name}.parquet")
        con.execute(f"CREATE TABLE {name} AS SELECT * FROM read_parquet('{path}')")
    rows = con.execute("SELECT count(*) FROM t_a").fetchone()[0]
    threads = con.execute("SELECT current_setting('threads')").fetchone()[0]
    # Warm-up: each query once.
    level(con, 1, 2)
    results = []
    for n in clients:
        results.append(level(con, n, queries))
        print(json.dumps(results[-1]), file=sys.stderr)
    print(
        json.dumps(
            {
                "engine": "duckdb",
                "version": duckdb.__version__,
                "threads": threads,
                "fetch": MODE,
                "rows": rows,
                "results": results,
            },
            indent=1,
        )
    )


if __name__ == "__main__":
    main()
