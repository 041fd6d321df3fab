"""The ``fairqueue`` command line. ``fairqueue --help`` lists the commands; each has ``--help``."""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import re
import sys
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from datetime import datetime
from typing import Any, NoReturn

import psycopg
import psycopg.conninfo

from fairqueue import __version__
from fairqueue._db import db_error_text, psycopg_error
from fairqueue.errors import ConfigurationError, FairqueueError
from fairqueue.sql import Q
from fairqueue.text import one_line
from fairqueue.urls import ENV_VAR, redact, scrub

EXIT_FAILURE = 1
EXIT_USAGE = 2
# undefined_table, undefined_function, invalid_schema_name: fairqueue's schema is not (fully) there
_NOT_INSTALLED = frozenset({"42P01", "42883", "3F000"})


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


def _cmd_worker(args: argparse.Namespace) -> int:
    from fairqueue.urls import resolve

    return run_worker(args, resolve(args.database_url))


def run_worker(
    args: argparse.Namespace,
    url: str,
    *,
    around_job: Callable[[], AbstractContextManager[object]] | None = None,
    job_transaction: Callable[[], Any] | None = None,
) -> int:
    """Runs a worker with the options of :func:`add_worker_options` (``fairqueue worker`` and Django's
    ``runworker``); ``around_job`` wraps each sync job in its slot thread, ``job_transaction`` is
    what a handler's ``ctx.atomic()`` opens."""
    from fairqueue.logs import configure_logging
    from fairqueue.metrics import Metrics, MetricsServer
    from fairqueue.worker import Worker, WorkerConfig, import_task_modules

    configure_logging(args.log_format, args.log_level)
    if not args.imports:
        raise ConfigurationError("give at least one --import MODULE (the modules that define your tasks)")
    config = WorkerConfig(
        database_url=url,
        concurrency=args.concurrency,
        batch=args.batch,
        name=args.name,
        lease=args.lease,
        poll_interval=args.poll_interval,
        grace=args.grace,
        maintenance=not args.no_maintenance,
    )
    config.check()
    import_task_modules(args.imports)
    metrics = Metrics()
    server = MetricsServer(metrics, args.metrics_port, args.metrics_host) if args.metrics_port is not None else None
    try:
        worker = Worker(config, metrics=metrics, around_job=around_job, job_transaction=job_transaction)
        worker.install_signal_handlers()
        return worker.run()
    except Exception as exc:
        if isinstance(exc, FairqueueError) or psycopg_error(exc) is not None:
            raise  # a configuration or database problem: one line on stderr (see main)
        # a bug: in the log's own format (one JSON record under --log-format json), with the traceback
        logging.getLogger("fairqueue.worker").critical("the worker crashed", exc_info=True)
        return EXIT_FAILURE
    finally:
        if server is not None:
            server.close()


def _cmd_demo(args: argparse.Namespace) -> int:
    from fairqueue.demo import run_demo

    return run_demo(
        database_url=args.database_url,
        bob_jobs=args.bob_jobs,
        workers=args.workers,
        batch=args.batch,
        job_ms=args.job_ms,
        concurrency=args.concurrency,
    )


# -- admin commands: enqueue, status, retry, cancel, channels --------------------------------------

_WHOLE_NUMBER = re.compile(r"[0-9]+")


def _job_id(text: str) -> int:
    """argparse type of job ids: a positive whole number that fits a bigint."""
    if not _WHOLE_NUMBER.fullmatch(text.strip()) or not 1 <= int(text) < 2**63:
        raise argparse.ArgumentTypeError(f"job id must be a positive whole number, got {text!r}")
    return int(text)


def _bounded_int(low: int, high: int | None = None) -> Callable[[str], int]:
    def parse(text: str) -> int:
        value = int(text) if re.fullmatch(r"-?[0-9]+", text.strip()) else None
        if value is None or value < low or (high is not None and value > high):
            bound = f"from {low} to {high}" if high is not None else f"of at least {low}"
            raise argparse.ArgumentTypeError(f"must be a whole number {bound}, got {text!r}")
        return value

    return parse


def _port(text: str) -> int:
    value = int(text) if re.fullmatch(r"[0-9]{1,5}", text.strip()) else 0
    if not 1 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"must be a port number from 1 to 65535, got {text!r}")
    return value


def _seconds(high: float, *, zero_ok: bool = False) -> Callable[[str], float]:
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


class _Parser(argparse.ArgumentParser):
    """Usage errors on one line, like every other error of the command line."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"fairqueue: error: {one_line(message)} (see: {self.prog} --help)\n")


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"must be a number greater than zero, got {text!r}")
    return value


def _connect(args: argparse.Namespace) -> psycopg.Connection[Any]:
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


def _json_type(value: object) -> str:
    names = {dict: "an object", list: "an array", str: "a string", bool: "a boolean", type(None): "null"}
    return names.get(type(value), "a number")


def _reject_constant(name: str) -> NoReturn:
    raise ValueError(f"{name} is not valid JSON")


def _parse_job_args(text: str | None) -> dict[str, Any]:
    """--args: a JSON object (``-`` reads it from standard input), checked like enqueue checks it."""
    from fairqueue.config import settings
    from fairqueue.errors import InvalidJobError
    from fairqueue.validation import encode_json

    if text is None:
        return {}
    source = "--args"
    if text == "-":
        source = "--args (standard input)"
        try:
            text = sys.stdin.read()
        except UnicodeDecodeError as exc:
            raise InvalidJobError(f"{source} is not valid text: {exc}") from None
    try:
        value = json.loads(text, parse_constant=_reject_constant)
    except ValueError as exc:
        raise InvalidJobError(f"{source} is not valid JSON: {exc}") from None
    except RecursionError:
        raise InvalidJobError(f"{source} is nested too deeply") from None
    if not isinstance(value, dict):
        raise InvalidJobError(f'{source} must be a JSON object such as {{"user_id": 42}}, got {_json_type(value)}')
    encode_json("args", value, limit=settings.max_args_bytes, require_object=True)  # size, NUL characters
    return value


def _parse_run_at(text: str) -> datetime:
    from fairqueue.errors import InvalidJobError

    try:
        when = datetime.fromisoformat(text.strip())
    except ValueError:
        raise InvalidJobError(
            f"--run-at {text!r} is not an ISO 8601 date and time, e.g. 2030-01-31T09:00:00+01:00"
        ) from None
    if when.tzinfo is None or when.utcoffset() is None:
        raise InvalidJobError(f"--run-at {text!r} has no timezone: add one, e.g. +00:00 or Z")
    return when


def _unknown_task_warning(conn: psycopg.Connection[Any], kind: str) -> str | None:
    """A warning if no live worker runs task ``kind`` (never an error: producers may enqueue
    before the workers that run a new task are deployed)."""
    try:
        with conn.transaction():  # a savepoint: a failure here must not cost the enqueue
            row = conn.execute(Q.workers_knowing, {"kind": kind}).fetchone()
    except Exception:  # the warning is a courtesy
        return None
    live, knowing = row if row else (0, 0)
    if knowing:
        return None
    if not live:
        return (
            f"no worker is running, so none could be asked about task {kind!r}; "
            "the job waits for one (check the name against the workers' --import)"
        )
    return (
        f"none of the {live} running worker{'' if live == 1 else 's'} knows task {kind!r}; unless a worker that "
        "imports it starts in time, the job fails as an unknown task (check the name, or the workers' --import)"
    )


def _imported_task(kind: str, modules: list[str]) -> Any:
    """The task named ``kind`` from the modules given with --import."""
    from fairqueue.tasks import registry
    from fairqueue.worker import import_task_modules

    import_task_modules(modules)
    task = registry.get(kind)
    if task is None:
        known = ", ".join(registry.names()[:20]) or "none"
        raise ConfigurationError(f"no task {kind!r} in the modules given with --import (they define: {known})")
    return task


def _cmd_enqueue(args: argparse.Namespace) -> int:
    from fairqueue.errors import DuplicateJobError
    from fairqueue.producer import enqueue

    job_args = _parse_job_args(args.args)
    run_at = None if args.run_at is None else _parse_run_at(args.run_at)
    channel, max_attempts = args.channel, args.max_attempts
    if args.imports:
        # the task's own defaults, as task.enqueue would use them; its timeout applies when it runs
        task = _imported_task(args.kind, args.imports)
        task.call_arguments(job_args)  # the args must fit its signature (BadArgumentsError)
        channel = task.channel if channel is None else channel
        max_attempts = task.max_attempts if max_attempts is None else max_attempts
    with _connect(args) as conn:
        try:
            job_id = enqueue(
                conn,
                args.kind,
                job_args,
                channel="default" if channel is None else channel,
                run_at=run_at,
                delay=args.delay,
                max_attempts=max_attempts,
                timeout=args.timeout,
                unique_key=args.unique_key,
                fifo_key=args.fifo_key,
                after=args.after or None,
                on_duplicate="raise",
            )
        except DuplicateJobError as exc:
            conn.rollback()
            print(f"fairqueue: note: {exc}; nothing enqueued, printing its id", file=sys.stderr)
            job_id = exc.existing_job_id
        warning = _unknown_task_warning(conn, args.kind)  # once the kind is known to be a valid name
    print(job_id)
    if warning:
        print(f"fairqueue: warning: {warning}", file=sys.stderr)
    return 0


def _cmd_status(args: argparse.Namespace) -> int:
    from fairqueue.status import collect_status, render_status

    with _connect(args) as conn:
        # one snapshot for every number, and nothing written
        conn.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
        conn.read_only = True
        data = collect_status(conn, args.since, args.failures)
    print(json.dumps(data, indent=2) if args.json else render_status(data))
    return 0


def _print_listing(
    args: argparse.Namespace,
    collect: Callable[[object], list[dict[str, Any]]],
    render: Callable[[list[dict[str, Any]]], list[str]],
) -> int:
    """A read-only listing: a table, or with --json the rows as a JSON array."""
    with _connect(args) as conn:
        conn.read_only = True
        rows = collect(conn)
    print(json.dumps(rows, indent=2) if args.json else "\n".join(render(rows)))
    return 0


def _cmd_channels_list(args: argparse.Namespace) -> int:
    from fairqueue.status import collect_channels, render_channels

    return _print_listing(args, collect_channels, render_channels)


def _cmd_periodic_list(args: argparse.Namespace) -> int:
    from fairqueue.status import collect_periodic, render_periodic

    return _print_listing(args, collect_periodic, render_periodic)


def _cmd_periodic_pause(args: argparse.Namespace) -> int:
    from fairqueue.periodic import pause

    paused = args.periodic_command == "pause"
    with _connect(args) as conn:
        found = pause(conn, args.name, paused=paused)
    if not found:
        return _refuse(f"no periodic schedule {args.name!r} (workers register schedules when they start)")
    print(f"schedule {args.name} {'paused: no tick fires until it is resumed' if paused else 'resumed'}")
    return 0


def _refuse(message: str) -> int:
    print(f"fairqueue: error: {message}", file=sys.stderr)
    return EXIT_FAILURE


def _cmd_retry(args: argparse.Namespace) -> int:
    from fairqueue.consumer import retry

    with _connect(args) as conn:
        result = retry(conn, args.job_id, attempts=args.attempts)
    job, n = args.job_id, args.attempts
    if result == "retried":
        print(f"job {job} queued again ({n} more attempt{'' if n == 1 else 's'})")
    elif result == "rescheduled":
        print(f"job {job} was waiting to retry after a failed attempt; it is due now")
    elif result == "queued":
        print(f"job {job} has not finished (it is queued, scheduled or running); nothing to retry")
    elif result == "succeeded":
        return _refuse(f"job {job} succeeded; it is not run again (enqueue a new job to repeat its work)")
    elif result == "duplicate":
        return _refuse(f"job {job} was not run again: an unfinished job holds its unique key")
    elif result == "exhausted":
        return _refuse(f"job {job} was not run again: it has used the most attempts a job can have")
    elif result == "not_found":
        return _refuse(f"no job {job} (never enqueued, or its history has been dropped)")
    else:
        return _refuse(f"job {job}: unexpected answer {result!r}")
    return 0


def _cmd_grant(args: argparse.Namespace) -> int:
    from fairqueue.roles import grant

    with _connect(args) as conn:
        done = grant(conn, args.level, args.role, revoke=args.revoke)
    for statement in done:
        print(statement)
    verb = "revoked from" if args.revoke else "granted to"
    print(f"{args.level} rights {verb} role {args.role!r}", file=sys.stderr)
    return 0


def _cmd_cancel(args: argparse.Namespace) -> int:
    from fairqueue.consumer import cancel
    from fairqueue.inspection import get_job

    job = args.job_id
    with _connect(args) as conn:
        result = cancel(conn, job)
        info = get_job(conn, job) if result == "finished" else None
    if result == "cancelled":
        print(f"job {job} cancelled; it will not run")
    elif result == "cancel_requested":
        print(f"job {job} is running; its worker was asked to stop it")
    elif result == "finished":
        how = f" ({info.status})" if info is not None else ""
        return _refuse(f"job {job} had already finished{how}; nothing to cancel")
    elif result == "not_found":
        return _refuse(f"no job {job}")
    else:
        return _refuse(f"job {job}: unexpected answer {result!r}")
    return 0


def _cmd_channels_set(args: argparse.Namespace) -> int:
    from fairqueue.channels import UNCHANGED, update_channel
    from fairqueue.errors import InvalidChannelConfigError

    changes = (args.max_concurrency, args.rate_limit, args.burst, args.weight, args.paused)
    if all(c is None for c in changes) and not (args.no_max_concurrency or args.no_rate_limit):
        raise InvalidChannelConfigError(
            "nothing to change: give --max-concurrency, --no-max-concurrency, --rate-limit, --no-rate-limit, "
            "--burst, --weight, --pause or --resume"
        )

    def given(value: Any, *, cleared: bool = False) -> Any:
        return None if cleared else UNCHANGED if value is None else value

    with _connect(args) as conn:
        result = update_channel(
            conn,
            args.name,
            max_concurrency=given(args.max_concurrency, cleared=args.no_max_concurrency),
            rate_limit=given(args.rate_limit, cleared=args.no_rate_limit),
            burst=given(args.burst),
            weight=given(args.weight),
            paused=given(args.paused),
        )
    print(
        f"channel {args.name}: max_concurrency={result.max_concurrency or '-'} rate_limit={result.rate_limit or '-'} "
        f"burst={result.burst:g} weight={result.weight} {'paused' if result.paused else 'not paused'}"
    )
    return 0


def _add_admin_commands(commands: Any) -> None:
    enqueue = commands.add_parser(
        "enqueue",
        help="add a job and print its id",
        description=(
            "Adds one job in its own transaction and prints its id (just the number). Nothing is written "
            "if any argument is rejected."
        ),
    )
    _database_url_option(enqueue)
    enqueue.add_argument("kind", metavar="KIND", help="the task name, e.g. emails.send")
    enqueue.add_argument(
        "--args", metavar="JSON", default=None, help="the job's arguments, a JSON object ('-' reads it from stdin)"
    )
    enqueue.add_argument(
        "--channel", default=None, help="channel (tenant) of the job (default: the task's with --import, else default)"
    )
    when = enqueue.add_mutually_exclusive_group()
    when.add_argument("--delay", type=float, metavar="SECONDS", help="do not start before SECONDS from now")
    when.add_argument(
        "--run-at", metavar="ISO8601", help="do not start before then, with a timezone: 2030-01-31T09:00:00+00:00"
    )
    enqueue.add_argument(
        "--max-attempts",
        type=int,
        metavar="N",
        help="attempts before it fails for good (default: the task's with --import, else 3)",
    )
    enqueue.add_argument("--timeout", type=float, metavar="SECONDS", help="longest run per attempt")
    enqueue.add_argument(
        "--unique-key", metavar="K", help="while an unfinished job holds K, print that job's id instead"
    )
    enqueue.add_argument("--fifo-key", metavar="K", help="jobs sharing K run one at a time, in enqueue order")
    enqueue.add_argument(
        "--after",
        type=_job_id,
        nargs="+",
        action="extend",
        default=[],
        metavar="ID",
        help="job ids that must succeed first (repeatable)",
    )
    enqueue.add_argument(
        "--import",
        dest="imports",
        action="append",
        default=[],
        metavar="MODULE",
        help="module defining the task (repeatable): use its defaults and check the args against it",
    )
    enqueue.set_defaults(func=_cmd_enqueue)

    status = commands.add_parser(
        "status",
        help="channels, workers and recent failures at a glance",
        description=(
            "Shows the backlog per channel, the workers and their leases, who holds the maintenance role, "
            "and the latest failed attempts. All numbers come from one snapshot; nothing is written."
        ),
    )
    _database_url_option(status)
    status.add_argument("--json", action="store_true", help="print the same data as one JSON object")
    status.add_argument(
        "--since", type=_positive_float, default=24.0, metavar="HOURS", help="history window in hours (default 24)"
    )
    status.add_argument(
        "--failures", type=_bounded_int(0, 1000), default=10, metavar="N", help="failed attempts to list (default 10)"
    )
    status.set_defaults(func=_cmd_status)

    retry = commands.add_parser(
        "retry",
        help="run a failed, cancelled or lost job again",
        description=(
            "Queues a job that ended without succeeding again under the same id, or makes a job waiting "
            "out a retry backoff due now. A job that succeeded is not run again (exit status 1)."
        ),
    )
    _database_url_option(retry)
    retry.add_argument("job_id", type=_job_id, metavar="JOB_ID")
    retry.add_argument(
        "--attempts", type=_bounded_int(1, 1000), default=1, metavar="N", help="attempts it gets (default 1)"
    )
    retry.set_defaults(func=_cmd_retry)

    cancel = commands.add_parser(
        "cancel",
        help="cancel a job",
        description=(
            "A job that has not started never runs; a running job's worker is asked to stop it. "
            "Exit status 1 if the job had already finished or does not exist."
        ),
    )
    _database_url_option(cancel)
    cancel.add_argument("job_id", type=_job_id, metavar="JOB_ID")
    cancel.set_defaults(func=_cmd_cancel)

    grant = commands.add_parser(
        "grant",
        help="give a database role least-privilege rights: producer, worker or admin",
        description=(
            "Grants an existing role the rights of one level (run it as the schema's owner). producer: enqueue "
            "and read job state; worker: also claim, finish, heartbeat and the maintenance chores; admin: also "
            "cancel, retry and configure channels. No level may write fairqueue's tables directly. Prints the "
            "statements it ran."
        ),
    )
    _database_url_option(grant)
    grant.add_argument("level", choices=("producer", "worker", "admin"), help="what the role may do")
    grant.add_argument("role", metavar="ROLE", help="an existing database role")
    grant.add_argument("--revoke", action="store_true", help="take the level's rights away instead")
    grant.set_defaults(func=_cmd_grant)

    periodic = commands.add_parser("periodic", help="list, pause or resume periodic (cron) schedules")
    periodic_commands = periodic.add_subparsers(dest="periodic_command", metavar="ACTION", required=True)
    listing_periodic = periodic_commands.add_parser(
        "list", help="schedules with their last and next tick", description="The periodic schedules."
    )
    _database_url_option(listing_periodic)
    listing_periodic.add_argument("--json", action="store_true", help="print the schedules as a JSON array")
    listing_periodic.set_defaults(func=_cmd_periodic_list)
    for action, text in (("pause", "stop firing a schedule (no deploy needed)"), ("resume", "fire it again")):
        sub = periodic_commands.add_parser(action, help=text, description=text[0].upper() + text[1:] + ".")
        _database_url_option(sub)
        sub.add_argument("name", metavar="NAME", help="the schedule's name")
        sub.set_defaults(func=_cmd_periodic_pause)

    channels = commands.add_parser("channels", help="list channels or change a channel's limits")
    channel_commands = channels.add_subparsers(dest="channels_command", metavar="ACTION", required=True)

    listing = channel_commands.add_parser(
        "list", help="the channels table of fairqueue status", description="Backlog and limits per channel."
    )
    _database_url_option(listing)
    listing.add_argument("--json", action="store_true", help="print the channels as a JSON array")
    listing.set_defaults(func=_cmd_channels_list)

    setting = channel_commands.add_parser(
        "set",
        help="change some of a channel's limits",
        description=(
            "Changes only the settings given; the others keep their current values (a new channel starts "
            "from the defaults: no cap, no rate limit, weight 1, not paused). Prints the resulting settings."
        ),
    )
    _database_url_option(setting)
    setting.add_argument("name", metavar="NAME", help="the channel")
    cap = setting.add_mutually_exclusive_group()
    cap.add_argument("--max-concurrency", type=int, metavar="N", help="jobs of the channel running at once")
    cap.add_argument("--no-max-concurrency", action="store_true", help="remove the concurrency cap")
    rate = setting.add_mutually_exclusive_group()
    rate.add_argument("--rate-limit", metavar="RATE", help="starts allowed, e.g. 10/s, 600/m, 3/10s")
    rate.add_argument("--no-rate-limit", action="store_true", help="remove the rate limit")
    setting.add_argument(
        "--burst", type=float, metavar="N", help="starts allowed back to back after a quiet spell (with a rate limit)"
    )
    setting.add_argument("--weight", type=int, metavar="N", help="share of service relative to other channels (1-1000)")
    pause = setting.add_mutually_exclusive_group()
    pause.add_argument("--pause", dest="paused", action="store_const", const=True, help="stop starting its jobs")
    pause.add_argument("--resume", dest="paused", action="store_const", const=False, help="start its jobs again")
    setting.set_defaults(func=_cmd_channels_set, paused=None)


# -- report: fairness and SLA analytics over the history archive (Spark) --------------------------------


def _cmd_report(args: argparse.Namespace) -> int:
    from fairqueue.spark.report import run_command

    return run_command(args)


def _add_report_command(commands: Any) -> None:
    report = commands.add_parser(
        "report",
        help="fairness and SLA analytics over the job-history archive (Spark)",
        description=(
            "Reads the Parquet archive written by fairqueue archive (and, with --include-live, the live "
            "completed_job table), computes throughput, queue wait and run time percentiles, failure and retry "
            "rates per window, channel and kind, Jain's fairness index per window and the starvation incidents, "
            "and writes them as Parquet and CSV tables plus a self-contained report.html."
        ),
    )
    report.add_argument("--from", dest="source", required=True, metavar="PATH", help="the archive's root (or URI)")
    report.add_argument(
        "--since", metavar="WHEN", help="first instant: ISO 8601 (UTC unless it says) or back from now, e.g. 7d"
    )
    report.add_argument("--until", metavar="WHEN", help="end (exclusive), same forms as --since")
    report.add_argument(
        "--window", default="1h", metavar="DURATION", help="window length, e.g. 15m, 1h, 1d (default 1h)"
    )
    report.add_argument(
        "--starvation-threshold",
        default="30s",
        metavar="DURATION",
        help="wait at the head of its channel above which a job can be a starvation incident (default 30s)",
    )
    report.add_argument("--include-live", action="store_true", help="also read fairqueue.completed_job (over JDBC)")
    _database_url_option(report, required_hint="; with --include-live")
    report.add_argument(
        "--out", default="fairqueue-report", metavar="DIR", help="output directory or URI (default ./fairqueue-report)"
    )
    from fairqueue.spark.options import add_spark_options

    add_spark_options(report)
    report.set_defaults(func=_cmd_report)


# -- archive: move finished days of history to Parquet (Spark) ------------------------------------------------


def _cmd_archive(args: argparse.Namespace) -> int:
    from fairqueue.spark.archive import run_command

    return run_command(args)


def _add_archive_command(commands: Any) -> None:
    archive = commands.add_parser(
        "archive",
        help="move old days of job history from PostgreSQL to Parquet (Spark)",
        description=(
            "Copies each daily partition of fairqueue.completed_job older than --older-than to Parquet under --to "
            "(partitioned by day and outcome; a local path or any Hadoop-compatible URI), checks the copy's row "
            "count and checksum against PostgreSQL, and only then detaches and drops the partition. A failure "
            "leaves the rows in PostgreSQL; running it again is safe."
        ),
    )
    archive.add_argument(
        "--older-than", required=True, metavar="AGE", help="archive days that ended longer ago than this, e.g. 7d, 12h"
    )
    archive.add_argument("--to", required=True, metavar="PATH", help="archive root: a directory or a URI (s3a://...)")
    _database_url_option(archive)
    from fairqueue.spark.options import add_spark_options

    add_spark_options(archive)
    archive.set_defaults(func=_cmd_archive)


def add_worker_options(parser: argparse.ArgumentParser, defaults: dict[str, Any] | None = None) -> None:
    """The options of ``fairqueue worker`` (also ``manage.py runworker``, whose settings give ``defaults``)."""
    from fairqueue.validation import WORKER_SECONDS_BOUNDS

    parser.add_argument(
        "--import",
        dest="imports",
        action="append",
        default=[],
        metavar="MODULE",
        help="module defining tasks (repeatable), e.g. --import myapp.tasks",
    )
    parser.add_argument("--concurrency", type=int, default=10, help="jobs run at once (default 10)")
    parser.add_argument(
        "--batch", type=int, default=None, help="most jobs claimed per round trip (default: concurrency, at most 100)"
    )
    parser.add_argument("--name", default=None, help="worker name shown in status (default host:pid)")
    parser.add_argument(
        "--lease",
        type=_seconds(WORKER_SECONDS_BOUNDS["lease"]),
        default=10.0,
        help="seconds without a heartbeat after which this worker's jobs are re-run elsewhere (default 10)",
    )
    parser.add_argument(
        "--poll-interval",
        type=_seconds(WORKER_SECONDS_BOUNDS["poll_interval"]),
        default=1.0,
        help="longest wait between claims without a notification (s)",
    )
    parser.add_argument(
        "--grace",
        type=_seconds(WORKER_SECONDS_BOUNDS["grace"], zero_ok=True),
        default=30.0,
        help="on SIGTERM, seconds running jobs may take to finish (default 30)",
    )
    parser.add_argument(
        "--no-maintenance", action="store_true", help="never take the maintenance role (another worker does it)"
    )
    parser.add_argument("--metrics-port", type=_port, default=None, help="serve Prometheus metrics on this port")
    parser.add_argument(
        "--metrics-host",
        default="0.0.0.0",  # noqa: S104 - scraped from other hosts
        help="address for --metrics-port (default 0.0.0.0)",
    )
    parser.add_argument("--log-format", choices=("text", "json"), default="text", help="log line format")
    parser.add_argument("--log-level", default="INFO", help="DEBUG, INFO, WARNING or ERROR (default INFO)")
    if defaults:
        parser.set_defaults(**defaults)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
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

    worker = commands.add_parser(
        "worker",
        help="run jobs: claim fairly across channels, run the task handlers, record outcomes",
        description=(
            "Runs a worker process. It claims jobs in batches sized to its free slots, wakes on "
            "LISTEN/NOTIFY (polling as a fallback), heartbeats, and survives lost connections. SIGTERM or "
            "SIGINT stops it gracefully (running jobs finish within --grace); a second signal aborts them "
            "(they run again later)."
        ),
    )
    _database_url_option(worker)
    add_worker_options(worker)
    worker.set_defaults(func=_cmd_worker)

    demo = commands.add_parser(
        "demo",
        help="show fair queueing: Bob's 10,000 jobs, then Alice's one",
        description=(
            "Enqueues Bob's backlog, then one job for Alice, lets workers drain the queue and shows where "
            "Alice's job ran. Without a database URL it runs on an embedded PostgreSQL it starts and removes. "
            "With one, the database's queue must be unused (no jobs, history or workers): the demo deletes nothing. "
            "Ctrl-C, SIGTERM or SIGHUP stop it cleanly: its workers stop and an embedded server is removed."
        ),
    )
    _database_url_option(demo, required_hint="; without one an embedded server is used")
    demo.add_argument("--bob-jobs", type=int, default=10_000, help="size of Bob's backlog (default 10000)")
    demo.add_argument("--workers", type=int, default=2, help="worker processes draining the queue (default 2)")
    demo.add_argument("--concurrency", type=int, default=10, help="jobs each worker runs at once (default 10)")
    demo.add_argument("--batch", type=int, default=10, help="jobs claimed per round trip (default 10)")
    demo.add_argument("--job-ms", type=float, default=0.2, help="simulated work per job, ms (default 0.2)")
    demo.set_defaults(func=_cmd_demo)

    _add_admin_commands(commands)
    _add_archive_command(commands)
    _add_report_command(commands)
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
        if isinstance(driver, psycopg.OperationalError):
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


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
