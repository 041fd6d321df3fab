"""The ``fairqueue`` command line. ``fairqueue --help`` lists the commands; each has ``--help``."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

import psycopg

from fairqueue import __version__
from fairqueue._db import psycopg_error
from fairqueue.errors import FairqueueError
from fairqueue.urls import ENV_VAR, redact

EXIT_FAILURE = 1
EXIT_USAGE = 2


def _one_line(text: str) -> str:
    return " ".join(part.strip() for part in str(text).splitlines() if part.strip())


def _database_url_option(parser: argparse.ArgumentParser, *, required_hint: str = "") -> None:
    parser.add_argument(
        "--database-url",
        metavar="URL",
        help=f"PostgreSQL URL, e.g. postgresql://user:password@host:5432/dbname (default: ${ENV_VAR}){required_hint}",
    )


def _cmd_migrate(args: argparse.Namespace) -> int:
    from fairqueue import migrations
    from fairqueue.urls import resolve

    url = resolve(args.database_url)
    if args.revision == "base":
        migrations.downgrade(url, "base")
    elif args.downgrade:
        migrations.downgrade(url, args.revision)
    else:
        migrations.upgrade(url, args.revision)
    current = migrations.current_revision(url)
    head = migrations.head_revision()
    where = "at head" if current == head else f"at {current or 'base (nothing installed)'}"
    print(f"fairqueue schema in {redact(url)} is {where} ({current or '-'})")
    return 0


def _cmd_demo(args: argparse.Namespace) -> int:
    from fairqueue.demo import run_demo

    return run_demo(
        database_url=args.database_url,
        bob_jobs=args.bob_jobs,
        workers=args.workers,
        batch=args.batch,
        job_ms=args.job_ms,
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="fairqueue",
        description="A fair, multi-tenant job queue in PostgreSQL.",
    )
    parser.add_argument("--version", action="version", version=f"fairqueue {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    migrate = commands.add_parser(
        "migrate",
        help="create or upgrade fairqueue's tables and functions in a database",
        description="Apply fairqueue's migrations (Alembic revisions in the fairqueue branch).",
    )
    _database_url_option(migrate)
    migrate.add_argument("--revision", default="head", help="target revision (default: head; 'base' removes fairqueue)")
    migrate.add_argument("--downgrade", action="store_true", help="move down to --revision instead of up")
    migrate.set_defaults(func=_cmd_migrate)

    demo = commands.add_parser(
        "demo",
        help="show fair queueing: Bob's 10,000 jobs, then Alice's one",
        description=(
            "Enqueues Bob's backlog, then one job for Alice, lets workers drain the queue and shows where "
            "Alice's job ran. Without a database URL it runs on an embedded PostgreSQL it starts and removes."
        ),
    )
    _database_url_option(demo, required_hint="; without one an embedded server is used")
    demo.add_argument("--bob-jobs", type=int, default=10_000, help="size of Bob's backlog (default 10000)")
    demo.add_argument("--workers", type=int, default=4, help="workers draining the queue (default 4)")
    demo.add_argument("--batch", type=int, default=10, help="jobs claimed per round trip (default 10)")
    demo.add_argument("--job-ms", type=float, default=0.2, help="simulated work per job, ms (default 0.2)")
    demo.set_defaults(func=_cmd_demo)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args))
    except KeyboardInterrupt:
        print("fairqueue: interrupted", file=sys.stderr)
        return 130
    except FairqueueError as exc:
        print(f"fairqueue: error: {_one_line(str(exc))}", file=sys.stderr)
        return EXIT_USAGE
    except Exception as exc:
        driver = psycopg_error(exc)
        if isinstance(driver, psycopg.OperationalError):
            url = getattr(args, "database_url", None)
            where = f" {redact(url)}" if url else ""
            print(f"fairqueue: error: cannot connect to the database{where}: {_one_line(str(driver))}", file=sys.stderr)
            return EXIT_FAILURE
        if driver is not None:
            print(f"fairqueue: error: database error: {_one_line(str(driver))}", file=sys.stderr)
            return EXIT_FAILURE
        raise


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
