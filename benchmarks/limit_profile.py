"""Where the time of a shared limit's jobs goes: one run of the fairness benchmark's scenario 4 on an
embedded PostgreSQL with pg_stat_statements (every nested statement tracked), then the statements
by total time, and from the jobs' own records how long an acme job (the limit's) and an initech
job (none) waited from ready to start and took from start to their recorded end, how much of
the time the limit's slots were held, and the rows each table had written per job completed.

    python -m benchmarks.limit_profile [--control] [--job-ms 0] [--seconds 15] [--limit 8]

--control runs the same three tenants without the limit. Prints only (a diagnostic).
"""

from __future__ import annotations

import argparse

import psycopg

from benchmarks import fairness
from benchmarks._common import Run
from fairqueue.embedded import DURABLE_SETTINGS, LocalPostgres

SINCE = "(SELECT min(started_at) + interval '3 seconds' FROM fairqueue.completed_job)"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--control", action="store_true", help="no job uses the limit")
    p.add_argument("--job-ms", type=int, default=0, help="each job waits this long (default 0: it does nothing)")
    p.add_argument("--seconds", type=float, default=15.0)
    p.add_argument("--limit", type=int, default=8)
    p.add_argument("--top", type=int, default=30, help="statements listed (default 30)")
    cli = p.parse_args()
    settings = dict(
        DURABLE_SETTINGS,
        shared_preload_libraries="pg_stat_statements",
        **{"pg_stat_statements.track": "all", "pg_stat_statements.max": "5000"},
    )
    args = argparse.Namespace(
        processes=2, concurrency=10, batch=10, backlog=5000, seconds=cli.seconds, limit=cli.limit,
        quick=False, no_doc=True, database_url=None, pairs=1,
    )  # fmt: skip
    with LocalPostgres(settings=settings) as server:
        with psycopg.connect(server.url, autocommit=True) as admin:
            admin.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        run = Run("fairness", args, server.url, None, "limit_profile")
        with psycopg.connect(server.url, autocommit=True) as admin:
            admin.execute("SELECT pg_stat_statements_reset()")
        rates, most = fairness._limit_run(run, args, limited=not cli.control, job_ms=cli.job_ms)
        print("started per second:", {c: round(r, 1) for c, r in rates.items()}, "most holding the limit:", most)
        with psycopg.connect(server.url, autocommit=True) as admin:
            print("\ncalls | total ms | mean ms | top level | statement")
            for calls, total, mean, top, text in admin.execute(
                "SELECT calls, round(total_exec_time)::bigint, round(mean_exec_time::numeric, 3), toplevel,"
                " left(regexp_replace(query, '\\s+', ' ', 'g'), 140)"
                " FROM pg_stat_statements ORDER BY total_exec_time DESC LIMIT %s",
                (cli.top,),
            ).fetchall():
                print(f"{calls} | {total} | {mean} | {top} | {text}")
        with psycopg.connect(server.socket_url_for("fq_fairness")) as db:
            print("\nchannel | jobs | ready -> start ms | start -> recorded end ms (from 3 s in)")
            for channel in ("acme", "initech"):
                row = db.execute(
                    "SELECT count(*), round(avg(extract(epoch FROM started_at - ready_at)) * 1000, 1),"
                    " round(avg(extract(epoch FROM finished_at - started_at)) * 1000, 1)"
                    f" FROM fairqueue.completed_job WHERE channel = %s AND started_at > {SINCE}",
                    (channel,),
                ).fetchone()
                print(channel, "|", " | ".join(str(v) for v in row or ()))
            if not cli.control:
                row = db.execute(
                    "SELECT round((sum(extract(epoch FROM finished_at - ready_at))"
                    " / (%s * extract(epoch FROM max(finished_at) - min(ready_at))))::numeric, 3)"
                    f" FROM fairqueue.completed_job WHERE 'api' = ANY (limits) AND started_at > {SINCE}",
                    (cli.limit,),
                ).fetchone()
                print("the limit's slots held (ready to recorded end), share of the time:", row[0] if row else None)
            # what the run wrote, table by table, per job it completed (since the database was made: the
            # first backlog's inserts count too)
            done = db.execute("SELECT count(*) FROM fairqueue.completed_job").fetchone()
            print("\nrows per completed job | inserted | updated | of which HOT | deleted")
            for name, *ops in db.execute(
                "SELECT relname, n_tup_ins, n_tup_upd, n_tup_hot_upd, n_tup_del FROM pg_stat_user_tables"
                " WHERE schemaname = 'fairqueue' AND n_tup_ins + n_tup_upd + n_tup_del > 0 ORDER BY relname"
            ).fetchall():
                print(name, "|", " | ".join(f"{n / max(done[0] if done else 0, 1):.3f}" for n in ops))


if __name__ == "__main__":
    main()
