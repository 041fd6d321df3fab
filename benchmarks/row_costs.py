"""Where a job's writes go: row operations per table and WAL bytes per job, for fairqueue, the fair SQL
floor and the unfair loop, draining the same jobs.

    python -m benchmarks.row_costs [--jobs 20000] [--channels 1 --channels 1000] [--batch 100]
                                   [--database-url URL] [--quick] [--no-doc]

Unlike a rate, these counts hardly depend on how busy the machine is, so they say where the cost of
fairness is before any timing does. For each system and channel count: a fresh database, the jobs
queued over the channels (each channel's jobs in one transaction), statistics reset, the workers
started, the queue drained, the workers stopped (their statistics flushed on exit); then per job:
inserted, updated (HOT or not) and deleted rows of each table (indexes follow their table), dead rows
left, and the WAL the drain wrote. Enqueue's own writes are not counted (they are the same inserts for
every system, plus fairqueue's and the floor's wakeup rows).

Writes benchmarks/results/row_costs-<time>.json and appends a section to docs/benchmarks.md.
"""

from __future__ import annotations

from typing import Any

import psycopg

from benchmarks._common import parser, scalar, session, wait_for
from benchmarks._systems import Fairqueue, Floor, Loop, System

TABLE_STATS = """
SELECT schemaname || '.' || relname, n_tup_ins, n_tup_upd, n_tup_hot_upd, n_tup_del, n_dead_tup
FROM pg_stat_user_tables WHERE n_tup_ins + n_tup_upd + n_tup_del > 0 ORDER BY 1
"""


def measure(system: System, url: str, jobs: int, channels: int) -> dict[str, Any]:
    system.setup(url)
    with psycopg.connect(url, autocommit=True) as conn:
        for channel in range(channels):
            share = jobs // channels + (channel < jobs % channels)
            if share:
                system.add(conn, f"c{channel}", share)
        conn.execute("VACUUM ANALYZE")
        # this session's counts of the enqueue may still be pending (a backend flushes them at most once
        # a second): flush them now, so that the reset below clears them
        conn.execute("SELECT pg_stat_force_next_flush()")
        conn.execute("SELECT 1")
        conn.execute("SELECT pg_stat_reset()")
        wal_before = scalar(conn, "SELECT pg_current_wal_insert_lsn()")
        workers = system.start(url)
        try:
            wait_for(conn, f"SELECT ({system.unfinished_sql}) = 0", timeout=900, what="the queue to drain")
        finally:
            workers.stop()
        wal = int(scalar(conn, "SELECT pg_current_wal_insert_lsn() - %s::pg_lsn", (wal_before,)))
        conn.execute("SELECT pg_stat_force_next_flush()")
        tables = {
            name: {"inserted": ins, "updated": upd, "hot_updated": hot, "deleted": dele, "dead": dead}
            for name, ins, upd, hot, dele, dead in conn.execute(TABLE_STATS).fetchall()
        }
    ops = sum(t["inserted"] + t["updated"] + t["deleted"] for t in tables.values())
    return {
        "system": system.label,
        "channels": channels,
        "jobs": jobs,
        "wal_bytes_per_job": round(wal / jobs, 1),
        "row_ops_per_job": round(ops / jobs, 2),
        "tables": tables,
    }


def main() -> None:
    p = parser(__doc__.split("\n\n")[0])
    p.add_argument("--jobs", type=int, default=20_000)
    p.add_argument("--channels", type=int, action="append", help="channel counts (default 1 and 1,000)")
    p.add_argument("--batch", type=int, default=100, help="claim batch of every system (default 100)")
    args = p.parse_args()
    if args.quick:
        args.jobs = 2_000
    counts = args.channels or [1, 1_000]
    if min(counts) < 1 or args.jobs < 1:
        p.error("--jobs and --channels must be at least 1")
    systems = [Fairqueue(2, args.batch, args.batch), Floor(2, args.batch), Loop(2, args.batch)]
    with session("row_costs", args) as run:
        results = []
        for channels in counts:
            for system in systems:
                r = measure(system, run.database("fq_row_costs"), args.jobs, channels)
                results.append(r)
                print(
                    f"{channels:,} channel(s): {r['system']}: {r['row_ops_per_job']} row operations, "
                    f"{r['wal_bytes_per_job']:,.0f} WAL bytes per job"
                )
        table = ["| channels | system | row operations / job | WAL bytes / job | per table: ins/upd(hot)/del per job |"]
        table.append("|---:|---|---:|---:|---|")
        for r in results:
            parts = []
            for name, t in r["tables"].items():
                per = [round(t[k] / r["jobs"], 2) for k in ("inserted", "updated", "hot_updated", "deleted")]
                parts.append(f"{name.split('.')[-1]} {per[0]:g}/{per[1]:g}({per[2]:g})/{per[3]:g}")
            table.append(
                f"| {r['channels']:,} | {r['system']} | {r['row_ops_per_job']} | {r['wal_bytes_per_job']:,.0f} | "
                f"{'; '.join(parts)} |"
            )
        run.finish(
            {"jobs": args.jobs, "batch": args.batch, "runs": results},
            f"Row operations and WAL per job, drain of {args.jobs:,} jobs, batch {args.batch}",
            table,
            ["Counted from pg_stat_user_tables and the WAL insert position around the drain (enqueue not counted)."],
        )


if __name__ == "__main__":
    main()
