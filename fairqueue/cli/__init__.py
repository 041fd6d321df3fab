"""The ``fairqueue`` command line. ``fairqueue --help`` lists the commands; each has ``--help``.

This module builds the parser and runs a command (:func:`main`, the ``fairqueue`` entry point), turning
errors into one line on stderr. The commands live by area: ``migrate``, ``worker`` (worker, demo),
``admin`` (enqueue, status, retry, cancel, grant, periodic, channels) and ``history`` (archive,
report); ``args`` holds what they share.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

import psycopg

from fairqueue import __version__
from fairqueue._db import db_error_text, psycopg_error
from fairqueue.cli.admin import add_admin_commands
from fairqueue.cli.args import EXIT_FAILURE, EXIT_USAGE, Parser
from fairqueue.cli.history import add_archive_command, add_report_command
from fairqueue.cli.migrate import add_migrate_command
from fairqueue.cli.worker import add_worker_commands, add_worker_options, run_worker
from fairqueue.errors import FairqueueError
from fairqueue.text import one_line
from fairqueue.urls import ENV_VAR, redact, scrub

__all__ = ["EXIT_FAILURE", "EXIT_USAGE", "add_worker_options", "build_parser", "main", "run_worker"]

# undefined_table, undefined_function, invalid_schema_name: fairqueue's schema is not (fully) there
_NOT_INSTALLED = frozenset({"42P01", "42883", "3F000"})


def _cannot_connect(exc: psycopg.Error) -> bool:
    """A failure to reach or stay connected to the server: a client-side OperationalError (no SQLSTATE),
    a connection exception (class 08), or the server shutting down or starting (57P01-57P03). psycopg
    also raises OperationalError for errors of a running statement (a lock not available, a timeout
    or a cancel), which are database errors like any other."""
    if not isinstance(exc, psycopg.OperationalError):
        return False
    state = exc.sqlstate
    return state is None or state.startswith("08") or state in {"57P01", "57P02", "57P03"}


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="fairqueue",
        description="A fair, multi-tenant job queue in PostgreSQL.",
    )
    parser.add_argument("--version", action="version", version=f"fairqueue {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    # in the order --help lists them
    add_migrate_command(commands)
    add_worker_commands(commands)
    add_admin_commands(commands)
    add_archive_command(commands)
    add_report_command(commands)
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
        print(f"fairqueue: error: {one_line(exc)}", file=sys.stderr)
        return EXIT_USAGE
    except Exception as exc:
        driver = psycopg_error(exc)
        url = getattr(args, "database_url", None)
        # a driver's message may quote the URL it was given: never with its password
        secret_of = url or os.environ.get(ENV_VAR)
        if driver is not None and _cannot_connect(driver):
            where = f" {redact(url)}" if url else ""
            message = scrub(db_error_text(driver), secret_of)
            print(f"fairqueue: error: cannot connect to the database{where}: {message}", file=sys.stderr)
            return EXIT_FAILURE
        if driver is not None and driver.sqlstate in _NOT_INSTALLED:
            print(
                f"fairqueue: error: database error: {scrub(db_error_text(driver), secret_of)} "
                "(is fairqueue installed in this database? run: fairqueue migrate)",
                file=sys.stderr,
            )
            return EXIT_FAILURE
        if driver is not None:
            # the primary message: an error raised inside a function carries kilobytes of CONTEXT
            print(f"fairqueue: error: database error: {scrub(db_error_text(driver), secret_of)}", file=sys.stderr)
            return EXIT_FAILURE
        raise
