"""What the commands of the command line share: exit codes, the argument types, the --database-url
option, the connection a command opens, and the parser that reports usage errors on one line."""

from __future__ import annotations

import argparse
import math
import os
import re
import sys
from collections.abc import Callable
from typing import Any, NoReturn

import psycopg
import psycopg.conninfo

from fairqueue.text import one_line
from fairqueue.urls import ENV_VAR

EXIT_FAILURE = 1
EXIT_USAGE = 2


class Parser(argparse.ArgumentParser):
    """Usage errors on one line, like every other error of the command line."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"fairqueue: error: {one_line(message)} (see: {self.prog} --help)\n")


def database_url_option(parser: argparse.ArgumentParser, *, required_hint: str = "") -> None:
    parser.add_argument(
        "--database-url",
        metavar="URL",
        help=f"PostgreSQL URL, e.g. postgresql://user:password@host:5432/dbname (default: ${ENV_VAR}){required_hint}",
    )


def connect(args: argparse.Namespace) -> psycopg.Connection[Any]:
    """A connection (not autocommit: ``with`` commits on success, rolls back on error) to the URL given
    by --database-url or $FAIRQUEUE_DATABASE_URL; it gives up after 10 s unless the URL says otherwise."""
    from fairqueue.urls import resolve

    url = resolve(args.database_url)  # checked, ports included
    given = psycopg.conninfo.conninfo_to_dict(url)
    extra: dict[str, Any] = {}
    if "connect_timeout" not in given and "PGCONNECT_TIMEOUT" not in os.environ:
        extra["connect_timeout"] = 10
    if "application_name" not in given and "PGAPPNAME" not in os.environ:
        extra["application_name"] = f"fairqueue {args.command}"
    return psycopg.connect(url, **extra)


def refuse(message: str) -> int:
    print(f"fairqueue: error: {message}", file=sys.stderr)
    return EXIT_FAILURE


# -- argument types ------------------------------------------------------------------------------------

_WHOLE_NUMBER = re.compile(r"[0-9]+")


def job_id_type(text: str) -> int:
    """argparse type of job ids: a positive whole number that fits a bigint."""
    if not _WHOLE_NUMBER.fullmatch(text.strip()) or not 1 <= int(text) < 2**63:
        raise argparse.ArgumentTypeError(f"job id must be a positive whole number, got {text!r}")
    return int(text)


def bounded_int(low: int, high: int | None = None) -> Callable[[str], int]:
    def parse(text: str) -> int:
        value = int(text) if re.fullmatch(r"-?[0-9]+", text.strip()) else None
        if value is None or value < low or (high is not None and value > high):
            bound = f"from {low} to {high}" if high is not None else f"of at least {low}"
            raise argparse.ArgumentTypeError(f"must be a whole number {bound}, got {text!r}")
        return value

    return parse


def port_number(text: str) -> int:
    value = int(text) if re.fullmatch(r"[0-9]{1,5}", text.strip()) else 0
    if not 1 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"must be a port number from 1 to 65535, got {text!r}")
    return value


def seconds(high: float, *, zero_ok: bool = False) -> Callable[[str], float]:
    """argparse type of a duration: a finite number of seconds, more than zero (or zero), at most ``high``."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        if not (value >= 0 if zero_ok else value > 0) or not value <= high:  # also refuses nan
            low = "zero or more" if zero_ok else "more than zero"
            raise argparse.ArgumentTypeError(f"must be {low} seconds and at most {high:g}, got {text!r}")
        return value

    return parse


def positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"must be a number greater than zero, got {text!r}")
    return value
