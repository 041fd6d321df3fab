"""``fairqueue worker`` and ``fairqueue demo``: running jobs. :func:`run_worker` and
:func:`add_worker_options` are shared with Django's ``manage.py runworker``."""

from __future__ import annotations

import argparse
import logging
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

from fairqueue._db import psycopg_error
from fairqueue.cli.args import EXIT_FAILURE, database_url_option, port_number, seconds
from fairqueue.errors import ConfigurationError, FairqueueError
from fairqueue.urls import ENV_VAR


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
    from fairqueue.logs import configure_logging, log_the_application
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
    # after the imports: a task module that sets up logging itself (basicConfig) keeps its setup
    log_the_application(args.log_format, args.log_level)
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
        type=seconds(WORKER_SECONDS_BOUNDS["lease"]),
        default=10.0,
        help="seconds without a heartbeat after which this worker's jobs are re-run elsewhere (default 10)",
    )
    parser.add_argument(
        "--poll-interval",
        type=seconds(WORKER_SECONDS_BOUNDS["poll_interval"]),
        default=1.0,
        help="longest wait between claims without a notification (s)",
    )
    parser.add_argument(
        "--grace",
        type=seconds(WORKER_SECONDS_BOUNDS["grace"], zero_ok=True),
        default=30.0,
        help="on SIGTERM, seconds running jobs may take to finish (default 30)",
    )
    parser.add_argument(
        "--no-maintenance", action="store_true", help="never take the maintenance role (another worker does it)"
    )
    parser.add_argument("--metrics-port", type=port_number, default=None, help="serve Prometheus metrics on this port")
    parser.add_argument(
        "--metrics-host",
        default="0.0.0.0",  # noqa: S104 - scraped from other hosts
        help="address for --metrics-port (default 0.0.0.0: every IPv4 address, for Prometheus elsewhere)",
    )
    parser.add_argument("--log-format", choices=("text", "json"), default="text", help="log line format")
    parser.add_argument("--log-level", default="INFO", help="DEBUG, INFO, WARNING or ERROR (default INFO)")
    if defaults:
        parser.set_defaults(**defaults)


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


def add_worker_commands(commands: Any) -> None:
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
    database_url_option(worker)
    add_worker_options(worker)
    worker.set_defaults(func=_cmd_worker)

    demo = commands.add_parser(
        "demo",
        help="show fair queueing: Bob's 10,000 jobs, then Alice's one",
        description=(
            "Enqueues Bob's backlog, then one job for Alice, lets workers drain the queue and shows where "
            "Alice's job ran. Without --database-url it runs on an embedded PostgreSQL it starts and removes "
            f"(${ENV_VAR} is not read: the demo never writes to the database your shell points at). "
            "With one, the database's queue must be unused (no jobs, history or workers): the demo deletes nothing. "
            "Ctrl-C, SIGTERM or SIGHUP stop it cleanly: its workers stop and an embedded server is removed."
        ),
    )
    # not database_url_option: the demo does not default to $FAIRQUEUE_DATABASE_URL (see fairqueue.demo)
    demo.add_argument(
        "--database-url",
        metavar="URL",
        help=(
            "an empty PostgreSQL database to run the demo in, e.g. postgresql://user:password@host:5432/dbname "
            f"(default: an embedded PostgreSQL; ${ENV_VAR} is not used)"
        ),
    )
    demo.add_argument("--bob-jobs", type=int, default=10_000, help="size of Bob's backlog (default 10000)")
    demo.add_argument("--workers", type=int, default=2, help="worker processes draining the queue (default 2)")
    demo.add_argument("--concurrency", type=int, default=10, help="jobs each worker runs at once (default 10)")
    demo.add_argument("--batch", type=int, default=10, help="jobs claimed per round trip (default 10)")
    demo.add_argument("--job-ms", type=float, default=0.2, help="simulated work per job, ms (default 0.2)")
    demo.set_defaults(func=_cmd_demo)
