"""Shared benchmark plumbing: the database, the peers' virtualenv, machine information, and the run
record every workload writes (benchmarks/results/<workload>-<UTC time>.json and a section appended
to docs/benchmarks.md).

A workload's ``main`` parses its options with :func:`parser`, then::

    with session("steady", args, peers=True) as run:
        url = run.database("fq_steady")          # a fresh database on the benchmark server
        ...
        run.finish(results, title, table_lines, notes)
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg

from fairqueue.urls import resolve, with_database

ROOT = Path(__file__).resolve().parent.parent
RESULTS = Path(os.environ.get("FAIRQUEUE_BENCH_RESULTS") or ROOT / "benchmarks" / "results")  # tests redirect it
DOC = ROOT / "docs" / "benchmarks.md"
VENV = ROOT / ".bench-venv"
REQUIREMENTS = ROOT / "benchmarks" / "requirements-peers.txt"
SCRIPTS = ROOT / "benchmarks" / "peer_workers"
RUNS_HEADING = "## Runs"


@contextlib.contextmanager
def database(url: str | None) -> Iterator[str]:
    """The given database, or an embedded PostgreSQL with durable settings for the duration."""
    if url:
        yield resolve(url)
        return
    from fairqueue.embedded import DURABLE_SETTINGS, LocalPostgres

    with LocalPostgres(settings=DURABLE_SETTINGS) as server:
        yield server.url


def fresh_database(server_url: str, name: str) -> str:
    """Drops and creates database ``name`` on the server of ``server_url``; returns its URL."""
    with psycopg.connect(server_url, autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.execute(f'CREATE DATABASE "{name}"')
    return with_database(server_url, name)


def scalar(conn: psycopg.Connection[Any], query: str, params: Any = None) -> Any:
    row = conn.execute(query, params).fetchone()
    assert row is not None
    return row[0]


def now(conn: psycopg.Connection[Any]) -> datetime:
    """The database's clock (all latencies and windows are read from the database's own timestamps)."""
    value: datetime = scalar(conn, "SELECT clock_timestamp()")
    return value


def wait_for(conn: psycopg.Connection[Any], query: str, *, timeout: float, what: str) -> None:
    """Polls ``query`` until it returns a true first column."""
    deadline = time.monotonic() + timeout
    while not scalar(conn, query):
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {what}")
        time.sleep(0.05)


# -- the benchmark-only virtualenv --------------------------------------------------------------------


def bench_python() -> str:
    """The .bench-venv interpreter, with the peers installed (built or refreshed when needed)."""
    python = VENV / "bin" / "python"
    stamp = VENV / ".requirements-sha256"
    wanted = hashlib.sha256(REQUIREMENTS.read_bytes()).hexdigest()
    if python.exists() and stamp.exists() and stamp.read_text().strip() == wanted:
        return str(python)
    print(f"building the benchmark-only virtualenv {VENV} (PgQueuer, Procrastinate) ...", flush=True)
    try:
        if not python.exists():
            subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True)
        subprocess.run(
            [str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check", "-r", str(REQUIREMENTS)],
            check=True,
        )
    except subprocess.CalledProcessError as exc:
        raise SystemExit(f"could not build {VENV}: {exc}") from None
    stamp.write_text(wanted + "\n")
    return str(python)


# -- what the run ran on --------------------------------------------------------------------------------

PG_SETTINGS = ("server_version", "fsync", "synchronous_commit", "full_page_writes", "shared_buffers", "max_connections")


def _proc_field(path: str, key: str) -> str | None:
    with contextlib.suppress(OSError):
        for line in Path(path).read_text().splitlines():
            name, _, value = line.partition(":")
            if name.strip() == key:
                return value.strip()
    return None


def machine() -> dict[str, Any]:
    mem_kb = _proc_field("/proc/meminfo", "MemTotal")
    return {
        "cpus": os.cpu_count(),
        "cpu_model": _proc_field("/proc/cpuinfo", "model name") or platform.processor() or "unknown",
        "ram_gib": round(int(mem_kb.split()[0]) / 1024**2, 1) if mem_kb else None,
        "platform": platform.platform(),
        "load_average": [round(x, 2) for x in os.getloadavg()],
    }


def postgresql(url: str) -> dict[str, str]:
    """Version and the settings that matter for queue benchmarks, as PostgreSQL shows them."""
    with psycopg.connect(url, autocommit=True) as conn:
        return {name: str(scalar(conn, "SELECT current_setting(%s)", (name,))) for name in PG_SETTINGS}


def source() -> dict[str, str]:
    """What was measured: the commit (with "+changes" when the tree differs from it) and the schema revision."""
    from fairqueue.sql import HEAD

    def git(*args: str) -> str:
        out = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True)
        return out.stdout.strip() if out.returncode == 0 else ""

    commit = git("rev-parse", "--short", "HEAD") or "unknown"
    if git("status", "--porcelain", "--untracked-files=no", "--", "fairqueue", "benchmarks"):
        commit += "+changes"
    return {"commit": commit, "schema_revision": HEAD}


def versions(python: str | None) -> dict[str, str]:
    """fairqueue's side, and the peers' from .bench-venv when it exists (or ``python`` is given)."""
    import fairqueue

    found = {"fairqueue": fairqueue.__version__, "psycopg": psycopg.__version__, "python": platform.python_version()}
    python = python or (str(VENV / "bin" / "python") if (VENV / "bin" / "python").exists() else None)
    peers = {"pgqueuer": "not installed", "asyncpg": "not installed", "procrastinate": "not installed"}
    if python:
        out = subprocess.run(
            [python, "-c", "import importlib.metadata as m; print(*(m.version(p) for p in " + repr(list(peers)) + "))"],
            capture_output=True,
            text=True,
        )
        if out.returncode == 0:
            peers = dict(zip(peers, out.stdout.split(), strict=True))
    return found | peers


# -- options, and the record of a run --------------------------------------------------------------------


def parser(doc: str, *, peers: bool = False) -> argparse.ArgumentParser:
    """The options every workload takes (--database-url, --quick, --no-doc; --no-peers with peers)."""
    p = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--database-url", help="a server to create scratch databases on (default: embedded PostgreSQL)")
    p.add_argument("--quick", action="store_true", help="small sizes, a few seconds: a smoke run")
    p.add_argument("--no-doc", action="store_true", help="do not append to docs/benchmarks.md (JSON is still written)")
    if peers:
        p.add_argument("--no-peers", action="store_true", help="skip PgQueuer and Procrastinate (no .bench-venv)")
    return p


def command(module: str, argv: Sequence[str]) -> str:
    """The command that reproduces this run (no database URL, no --no-doc)."""
    kept: list[str] = []
    skip = False
    for a in argv:
        if skip:
            skip = False
        elif a == "--database-url":
            skip = True
        elif not a.startswith("--database-url=") and a != "--no-doc":
            kept.append(a)
    return " ".join(["python -m", module, *map(shlex.quote, kept)])


def worker_options(p: argparse.ArgumentParser, *, concurrency: int, batch: int | None = None) -> None:
    """--processes (worker processes per system), --concurrency (fairqueue's), --batch (every system's)."""
    p.add_argument("--processes", type=int, default=2, help="worker processes per system (default 2)")
    p.add_argument("--concurrency", type=int, default=concurrency, help=f"fairqueue's (default {concurrency})")
    if batch:
        p.add_argument("--batch", type=int, default=batch, help=f"claim batch of every system (default {batch})")


def verdict(met: bool | None) -> str:
    return "n/a" if met is None else ("**met**" if met else "**not met**")


def target_cell(key: str, met: bool | None) -> str:
    """The target column: fairqueue's verdict; the other systems are references."""
    return verdict(met) if key == "fairqueue" else "reference"


def percentiles(values: Sequence[float], points: Sequence[int] = (50, 95, 99)) -> dict[str, float]:
    """{"p50": ..., "p95": ..., "p99": ..., "max": ...} of ``values`` (inclusive method)."""
    if not values:
        return {f"p{p}": float("nan") for p in points} | {"max": float("nan")}
    if len(values) == 1:
        return {f"p{p}": values[0] for p in points} | {"max": values[0]}
    q = statistics.quantiles(values, n=100, method="inclusive")
    return {f"p{p}": q[p - 1] for p in points} | {"max": max(values)}


@dataclass
class Run:
    workload: str
    args: argparse.Namespace
    server_url: str
    python: str | None
    command: str
    started_at: datetime = field(default_factory=lambda: datetime.now(UTC))
    load_before: list[float] = field(default_factory=lambda: [round(x, 2) for x in os.getloadavg()])

    def database(self, name: str) -> str:
        return fresh_database(self.server_url, name)

    def finish(self, results: Any, title: str, table: list[str], notes: Sequence[str] = ()) -> Path:
        """Writes the JSON record, prints the markdown section and appends it to docs/benchmarks.md."""
        record = {
            "workload": self.workload,
            "at": self.started_at.isoformat(timespec="seconds"),
            "command": self.command,
            "args": {k: v for k, v in vars(self.args).items() if k != "database_url"},
            "machine": machine() | {"load_before": self.load_before},
            "postgresql": postgresql(self.server_url),
            "versions": versions(self.python),
            "source": source(),
            "results": results,
        }
        RESULTS.mkdir(parents=True, exist_ok=True)
        quick = "-quick" if self.args.quick else ""  # smoke runs: ignored by git
        out = RESULTS / f"{self.workload}{quick}-{self.started_at.strftime('%Y-%m-%dT%H%M%SZ')}.json"
        out.write_text(json.dumps(record, indent=2, default=str) + "\n")
        section = doc_section(record, title, table, notes)
        print("\n" + section)
        if self.args.no_doc:
            print(f"results: {out} (not appended to {DOC.relative_to(ROOT)}: --no-doc)")
        else:
            append_doc(section)
            print(f"results: {out}, appended to {DOC.relative_to(ROOT)}")
        return out


def doc_section(record: dict[str, Any], title: str, table: list[str], notes: Sequence[str]) -> str:
    m, pg, v = record["machine"], record["postgresql"], record["versions"]
    lines = [
        f"### {title}, {record['at']}",
        "",
        f"- Machine: {m['cpus']} CPUs ({m['cpu_model']}), {m['ram_gib']} GiB RAM, {m['platform']}; load average "
        f"{m['load_before'][0]:.1f} before, {m['load_average'][0]:.1f} after.",
        f"- PostgreSQL {pg['server_version']}: fsync={pg['fsync']}, synchronous_commit={pg['synchronous_commit']}, "
        f"full_page_writes={pg['full_page_writes']}, shared_buffers={pg['shared_buffers']}, "
        f"max_connections={pg['max_connections']}.",
        f"- Versions: fairqueue {v['fairqueue']}, psycopg {v['psycopg']}, PgQueuer {v['pgqueuer']}, asyncpg "
        f"{v['asyncpg']}, Procrastinate {v['procrastinate']}, Python {v['python']}.",
        f"- Measured: commit {record['source']['commit']}, schema revision {record['source']['schema_revision']}.",
        f"- Reproduce: `{record['command']}`",
        "",
        *table,
    ]
    if notes:
        lines += ["", *notes]
    return "\n".join(lines) + "\n"


def append_doc(section: str) -> None:
    """Appends a run's section at the end of docs/benchmarks.md (its "Runs" part, newest last)."""
    text = DOC.read_text() if DOC.exists() else "# Benchmarks\n"
    if RUNS_HEADING not in text:
        text = text.rstrip("\n") + f"\n\n{RUNS_HEADING}\n"
    DOC.write_text(text.rstrip("\n") + "\n\n" + section)


@contextlib.contextmanager
def session(
    workload: str, args: argparse.Namespace, *, peers: bool = False, module: str | None = None
) -> Iterator[Run]:
    """Starts the database (and the peers' virtualenv when ``peers`` and not --no-peers) for a run.
    ``module``: the benchmark module, when the workload is named otherwise (one mode of a module)."""
    python = bench_python() if peers and not getattr(args, "no_peers", False) else None
    with database(args.database_url) as url:
        yield Run(workload, args, url, python, command(f"benchmarks.{module or workload}", sys.argv[1:]))
