"""Worker CPU per job: what the worker runtime costs, measured steadier than throughput.

    python -m benchmarks.worker_cpu [JOBS]      # default 20,000

Two `fairqueue worker` processes (concurrency 50, batch 50) on an embedded PostgreSQL with durable
settings; their CPU time (user + system, from /proc) is read once they are registered and idle, and
again when the JOBS no-op jobs enqueued in one transaction (10 channels) are drained. Prints the
workers' CPU per job and the drain rate. Linux only (/proc). Used to compare two checkouts side by
side (docs/benchmarks.md, "Restructuring check").
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

import psycopg

import fairqueue
from fairqueue import migrations
from fairqueue.embedded import DURABLE_SETTINGS, LocalPostgres

TICK = os.sysconf("SC_CLK_TCK")


def cpu(pid: int) -> float:
    """Seconds of user + system CPU the process has used."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def main() -> None:
    jobs = int(sys.argv[1]) if len(sys.argv) > 1 else 20_000
    print(measure(jobs))


def measure(jobs: int) -> str:
    with LocalPostgres(settings=DURABLE_SETTINGS) as server:
        url = server.url
        migrations.upgrade(url)
        env = dict(os.environ, FAIRQUEUE_DATABASE_URL=url)
        command = [sys.executable, "-m", "fairqueue", "worker", "--import", "fairqueue.demo_tasks"]
        command += ["--concurrency", "50", "--batch", "50", "--log-level", "WARNING"]
        workers = [subprocess.Popen([*command, "--name", f"w{i}"], env=env) for i in range(2)]
        try:
            with psycopg.connect(url, autocommit=True) as conn:
                while _count(conn, "worker") < len(workers):
                    time.sleep(0.05)
                time.sleep(1.0)  # start-up done: from here on the workers only wait
                before = sum(cpu(w.pid) for w in workers)
                with psycopg.connect(url) as tx:
                    specs = [
                        fairqueue.JobSpec("demo.resize_image", {"n": i}, channel=f"t{i % 10}") for i in range(jobs)
                    ]
                    fairqueue.enqueue_many(tx, specs)
                started = time.monotonic()
                while _count(conn, "job"):
                    time.sleep(0.02)
                elapsed = time.monotonic() - started
                after = sum(cpu(w.pid) for w in workers)
        finally:
            for w in workers:
                w.terminate()
            for w in workers:
                w.wait(30)
    return f"{(after - before) / jobs * 1e6:.1f} us/job  {jobs / elapsed:,.0f} jobs/s"


def _count(conn: psycopg.Connection[tuple[int]], table: str) -> int:
    row = conn.execute(f"SELECT count(*) FROM fairqueue.{table}").fetchone()
    return int(row[0]) if row else 0


if __name__ == "__main__":
    main()
