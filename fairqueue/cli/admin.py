"""The operator's commands: enqueue, status, retry, cancel, grant, periodic (list, pause, resume),
channels (list, set) and limits (list, set). Each opens one connection and does its work in one
transaction."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from datetime import datetime
from typing import Any, NoReturn

import psycopg

from fairqueue.cli.args import bounded_int, connect, database_url_option, job_id_type, positive_float, refuse
from fairqueue.errors import ConfigurationError
from fairqueue.sql import Q
from fairqueue.validation import MAX_CHANNEL, check_limits, check_optional_text, check_text


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

    # the names first, as enqueue checks them, so that a bad one is refused before any import or connection
    check_text("kind", args.kind)
    if args.channel is not None:
        check_text("channel", args.channel, max_len=MAX_CHANNEL)
    check_optional_text("unique_key", args.unique_key)
    check_optional_text("fifo_key", args.fifo_key)
    check_optional_text("fair_key", args.fair_key)
    limits = None if args.limits is None else check_limits(args.limits)
    job_args = _parse_job_args(args.args)
    run_at = None if args.run_at is None else _parse_run_at(args.run_at)
    channel, max_attempts, priority = args.channel, args.max_attempts, args.priority
    if args.imports:
        # the task's own defaults, as task.enqueue would use them; its timeout applies when it runs
        task = _imported_task(args.kind, args.imports)
        task.call_arguments(job_args)  # the args must fit its signature (BadArgumentsError)
        channel = task.channel if channel is None else channel
        max_attempts = task.max_attempts if max_attempts is None else max_attempts
        priority = task.priority if priority is None else priority
        limits = task.limits if limits is None else limits  # its shared limits hold from the shell too
    with connect(args) as conn:
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
                priority=0 if priority is None else priority,
                fair_key=args.fair_key,
                limits=limits,
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

    with connect(args) as conn:
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
    with connect(args) as conn:
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
    check_text("schedule name", args.name)  # as registering a schedule checks it
    with connect(args) as conn:
        found = pause(conn, args.name, paused=paused)
    if not found:
        return refuse(f"no periodic schedule {args.name!r} (workers register schedules when they start)")
    print(f"schedule {args.name} {'paused: no tick fires until it is resumed' if paused else 'resumed'}")
    return 0


def _cmd_retry(args: argparse.Namespace) -> int:
    from fairqueue.consumer import retry

    with connect(args) as conn:
        result = retry(conn, args.job_id, attempts=args.attempts)
    job, n = args.job_id, args.attempts
    if result == "retried":
        print(f"job {job} queued again ({n} more attempt{'' if n == 1 else 's'})")
    elif result == "rescheduled":
        print(f"job {job} was waiting to retry after a failed attempt; it is due now")
    elif result == "queued":
        print(f"job {job} has not finished (it is queued, scheduled or running); nothing to retry")
    elif result == "succeeded":
        return refuse(f"job {job} succeeded; it is not run again (enqueue a new job to repeat its work)")
    elif result == "duplicate":
        return refuse(f"job {job} was not run again: an unfinished job holds its unique key")
    elif result == "exhausted":
        return refuse(f"job {job} was not run again: it has used the most attempts a job can have")
    elif result == "not_found":
        return refuse(f"no job {job} (never enqueued, or its history has been dropped)")
    else:
        return refuse(f"job {job}: unexpected answer {result!r}")
    return 0


def _cmd_grant(args: argparse.Namespace) -> int:
    from fairqueue.roles import grant

    with connect(args) as conn:
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
    with connect(args) as conn:
        result = cancel(conn, job)
        info = get_job(conn, job) if result == "finished" else None
    if result == "cancelled":
        print(f"job {job} cancelled; it will not run")
    elif result == "cancel_requested":
        print(f"job {job} is running; its worker was asked to stop it")
    elif result == "finished":
        how = f" ({info.status})" if info is not None else ""
        return refuse(f"job {job} had already finished{how}; nothing to cancel")
    elif result == "not_found":
        return refuse(f"no job {job}")
    else:
        return refuse(f"job {job}: unexpected answer {result!r}")
    return 0


def _cmd_channels_set(args: argparse.Namespace) -> int:
    from fairqueue.channels import UNCHANGED, update_channel
    from fairqueue.errors import InvalidChannelConfigError

    check_text("channel name", args.name, max_len=MAX_CHANNEL, error=InvalidChannelConfigError)
    changes = (args.max_concurrency, args.rate_limit, args.burst, args.weight, args.paused, args.key_max_concurrency)
    cleared = (args.no_max_concurrency, args.no_rate_limit, args.no_key_max_concurrency)
    if all(c is None for c in changes) and not any(cleared):
        raise InvalidChannelConfigError(
            "nothing to change: give --max-concurrency, --no-max-concurrency, --rate-limit, --no-rate-limit, "
            "--burst, --weight, --pause, --resume, --key-max-concurrency or --no-key-max-concurrency"
        )

    def given(value: Any, *, cleared: bool = False) -> Any:
        return None if cleared else UNCHANGED if value is None else value

    with connect(args) as conn:
        result = update_channel(
            conn,
            args.name,
            max_concurrency=given(args.max_concurrency, cleared=args.no_max_concurrency),
            rate_limit=given(args.rate_limit, cleared=args.no_rate_limit),
            burst=given(args.burst),
            weight=given(args.weight),
            paused=given(args.paused),
            key_max_concurrency=given(args.key_max_concurrency, cleared=args.no_key_max_concurrency),
        )
    print(
        f"channel {args.name}: max_concurrency={result.max_concurrency or '-'} rate_limit={result.rate_limit or '-'} "
        f"burst={result.burst:g} weight={result.weight} {'paused' if result.paused else 'not paused'}"
        + (f" key_max_concurrency={result.key_max_concurrency}" if result.key_max_concurrency is not None else "")
    )
    return 0


def _cmd_limits_list(args: argparse.Namespace) -> int:
    from fairqueue.status import collect_limits, render_limits

    return _print_listing(args, collect_limits, lambda rows: render_limits(rows) if rows else ["(no shared limits)"])


def _cmd_limits_remove(args: argparse.Namespace) -> int:
    from fairqueue.producer import remove_limit

    with connect(args) as conn:
        removed = remove_limit(conn, args.name)
    if not removed:
        return refuse(f"no shared limit {args.name!r} (fairqueue limits list shows them)")
    print(f"shared limit {args.name} removed")
    return 0


def _cmd_limits_set(args: argparse.Namespace) -> int:
    from fairqueue.producer import configure_limit
    from fairqueue.status import collect_limits

    with connect(args) as conn:
        configure_limit(
            conn,
            args.name,
            max_concurrency=args.max_concurrency,
            rate_limit=args.rate_limit,
            burst=1 if args.burst is None else args.burst,
        )
        [limit] = [lim for lim in collect_limits(conn) if lim["name"] == args.name]
    burst = f" burst={limit['burst']:g}" if limit["rate_limit"] else ""
    print(
        f"shared limit {args.name}: max_concurrency={limit['max_concurrency'] or '-'} "
        f"rate_limit={limit['rate_limit'] or '-'}{burst}"
    )
    return 0


def add_admin_commands(commands: Any) -> None:
    enqueue = commands.add_parser(
        "enqueue",
        help="add a job and print its id",
        description=(
            "Adds one job in its own transaction and prints its id (just the number). Nothing is written "
            "if any argument is rejected."
        ),
    )
    database_url_option(enqueue)
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
        "--unique-key",
        metavar="K",
        help="while an unfinished job of the channel holds K, print that job's id instead",
    )
    enqueue.add_argument(
        "--fifo-key",
        metavar="K",
        help="jobs of the channel sharing K run one at a time, in enqueue order",
    )
    enqueue.add_argument(
        "--fair-key",
        metavar="K",
        help="within its channel, jobs take turns across their fair keys (one key's flood does not hold back "
        "another key's jobs)",
    )
    enqueue.add_argument(
        "--limit",
        dest="limits",
        action="append",
        metavar="NAME",
        help="a shared limit the job counts against (configured first: fairqueue limits set); repeat for "
        "several (default: the task's with --import, else none)",
    )
    enqueue.add_argument(
        "--priority",
        type=bounded_int(-100, 100),
        metavar="N",
        help="from -100 to 100: within its channel, higher runs first (default: the task's with --import, else 0)",
    )
    enqueue.add_argument(
        "--after",
        type=job_id_type,
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
    database_url_option(status)
    status.add_argument("--json", action="store_true", help="print the same data as one JSON object")
    status.add_argument(
        "--since", type=positive_float, default=24.0, metavar="HOURS", help="history window in hours (default 24)"
    )
    status.add_argument(
        "--failures", type=bounded_int(0, 1000), default=10, metavar="N", help="failed attempts to list (default 10)"
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
    database_url_option(retry)
    retry.add_argument("job_id", type=job_id_type, metavar="JOB_ID")
    retry.add_argument(
        "--attempts", type=bounded_int(1, 1000), default=1, metavar="N", help="attempts it gets (default 1)"
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
    database_url_option(cancel)
    cancel.add_argument("job_id", type=job_id_type, metavar="JOB_ID")
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
    database_url_option(grant)
    grant.add_argument("level", choices=("producer", "worker", "admin"), help="what the role may do")
    grant.add_argument("role", metavar="ROLE", help="an existing database role")
    grant.add_argument("--revoke", action="store_true", help="take the level's rights away instead")
    grant.set_defaults(func=_cmd_grant)

    periodic = commands.add_parser("periodic", help="list, pause or resume periodic (cron) schedules")
    periodic_commands = periodic.add_subparsers(dest="periodic_command", metavar="ACTION", required=True)
    listing_periodic = periodic_commands.add_parser(
        "list", help="schedules with their last and next tick", description="The periodic schedules."
    )
    database_url_option(listing_periodic)
    listing_periodic.add_argument("--json", action="store_true", help="print the schedules as a JSON array")
    listing_periodic.set_defaults(func=_cmd_periodic_list)
    for action, text in (("pause", "stop firing a schedule (no deploy needed)"), ("resume", "fire it again")):
        sub = periodic_commands.add_parser(action, help=text, description=text[0].upper() + text[1:] + ".")
        database_url_option(sub)
        sub.add_argument("name", metavar="NAME", help="the schedule's name")
        sub.set_defaults(func=_cmd_periodic_pause)

    channels = commands.add_parser("channels", help="list channels or change a channel's limits")
    channel_commands = channels.add_subparsers(dest="channels_command", metavar="ACTION", required=True)

    listing = channel_commands.add_parser(
        "list", help="the channels table of fairqueue status", description="Backlog and limits per channel."
    )
    database_url_option(listing)
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
    database_url_option(setting)
    setting.add_argument("name", metavar="NAME", help="the channel")
    cap = setting.add_mutually_exclusive_group()
    cap.add_argument("--max-concurrency", type=int, metavar="N", help="jobs of the channel running at once")
    cap.add_argument("--no-max-concurrency", action="store_true", help="remove the concurrency cap")
    key_cap = setting.add_mutually_exclusive_group()
    key_cap.add_argument(
        "--key-max-concurrency", type=int, metavar="N", help="jobs of any one fair key of the channel running at once"
    )
    key_cap.add_argument("--no-key-max-concurrency", action="store_true", help="remove the cap per fair key")
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

    limits = commands.add_parser("limits", help="list shared limits or set one")
    limit_commands = limits.add_subparsers(dest="limits_command", metavar="ACTION", required=True)
    limit_listing = limit_commands.add_parser(
        "list",
        help="the shared limits table of fairqueue status",
        description="Each shared limit's settings, the jobs holding its slots and the jobs waiting in its line.",
    )
    database_url_option(limit_listing)
    limit_listing.add_argument("--json", action="store_true", help="print the limits as a JSON array")
    limit_listing.set_defaults(func=_cmd_limits_list)
    limit_setting = limit_commands.add_parser(
        "set",
        help="create a shared limit or set all its settings",
        description=(
            "Sets every setting of a shared limit, creating it (as fairqueue.configure_limit does): the "
            "settings not given return to their defaults (no cap, no rate limit). Jobs name it with "
            "limits=[NAME]. Prints the resulting settings."
        ),
    )
    database_url_option(limit_setting)
    limit_setting.add_argument("name", metavar="NAME", help="the shared limit, e.g. stripe-api")
    limit_setting.add_argument(
        "--max-concurrency", type=int, metavar="N", help="jobs holding the limit at once, across every worker"
    )
    limit_setting.add_argument("--rate-limit", metavar="RATE", help="jobs let through, e.g. 100/s, 600/m")
    limit_setting.add_argument(
        "--burst", type=float, metavar="N", help="jobs let through back to back after a quiet spell (with a rate limit)"
    )
    limit_setting.set_defaults(func=_cmd_limits_set)
    limit_removal = limit_commands.add_parser(
        "remove",
        help="remove a shared limit that no live job uses",
        description=(
            "Removes a shared limit (as fairqueue.remove_limit does). Refused while a live job (ready, "
            "running, scheduled or waiting) declares it (exit status 2); exit status 1 if there is no such limit."
        ),
    )
    database_url_option(limit_removal)
    limit_removal.add_argument("name", metavar="NAME", help="the shared limit, e.g. stripe-api")
    limit_removal.set_defaults(func=_cmd_limits_remove)
