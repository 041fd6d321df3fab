"""Prometheus metrics for the worker process, standard library only.

:class:`Metrics` collects counters, gauges and histograms in memory (every call is a dict update under one
lock, cheap enough to run per job); :meth:`Metrics.render` produces the text exposition format 0.0.4.
:class:`MetricsServer` serves that text over HTTP on ``/metrics`` from a daemon thread.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import math
import socket
import threading
import time
from bisect import bisect_left
from collections.abc import Iterable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any, Final

from fairqueue.errors import ConfigurationError
from fairqueue.outcomes import WORKER_OUTCOMES

__all__ = ["CONTENT_TYPE", "OTHER_CHANNEL", "OUTCOMES", "SECONDS_BUCKETS", "Metrics", "MetricsServer"]

log = logging.getLogger(__name__)

CONTENT_TYPE: Final = "text/plain; version=0.0.4; charset=utf-8"
OTHER_CHANNEL: Final = "_other"
SECONDS_BUCKETS: Final[tuple[float, ...]] = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0,
)  # fmt: skip
OUTCOMES: Final = WORKER_OUTCOMES

Labels = tuple[str, ...]


@dataclass(slots=True)
class _Family:
    """One metric family: its samples keyed by label values (in the order of ``label_names``)."""

    name: str
    kind: str  # counter, gauge or histogram
    help: str
    label_names: Labels = ()
    values: dict[Labels, float] = field(default_factory=dict)  # counters and gauges
    histograms: dict[Labels, _Histogram] = field(default_factory=dict)


@dataclass(slots=True)
class _Histogram:
    # per-bucket (not cumulative) counts; the last slot is the +Inf bucket
    counts: list[int] = field(default_factory=lambda: [0] * (len(SECONDS_BUCKETS) + 1))
    total: float = 0.0
    count: int = 0

    def observe(self, value: float) -> None:
        # le is inclusive, so the first bound >= value is the bucket
        self.counts[bisect_left(SECONDS_BUCKETS, value)] += 1
        self.total += value
        self.count += 1


def _escape_label(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _escape_help(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def _format_value(value: float) -> str:
    if isinstance(value, int):
        return str(value)
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(value)


def _label_text(names: Labels, values: Labels, extra: str = "") -> str:
    parts = [f'{n}="{_escape_label(v)}"' for n, v in zip(names, values, strict=True)]
    if extra:
        parts.append(extra)
    return "{" + ",".join(parts) + "}" if parts else ""


def _seconds(value: float) -> float:
    # durations come partly from the database clock; skew must not produce negative observations
    return value if value > 0.0 else 0.0


class Metrics:
    """In-memory Prometheus metrics of one worker process. Thread-safe."""

    def __init__(self, *, max_channels: int = 1000) -> None:
        if max_channels < 0:
            raise ValueError(f"max_channels must be >= 0, got {max_channels}")
        self._lock = threading.Lock()
        self._max_channels = max_channels
        self._channels: set[str] = set()
        self._claimed = _Family(
            "fairqueue_jobs_claimed_total", "counter", "Jobs claimed by this worker.", ("channel", "kind")
        )
        self._wait = _Family(
            "fairqueue_job_wait_seconds",
            "histogram",
            "Time from a job becoming ready to it starting, in seconds.",
            ("channel",),
        )
        self._finished = _Family(
            "fairqueue_jobs_finished_total",
            "counter",
            "Jobs finished by this worker, by outcome.",
            ("channel", "kind", "outcome"),
        )
        self._run = _Family(
            "fairqueue_job_run_seconds", "histogram", "Time a job ran, in seconds.", ("channel", "kind")
        )
        self._slots = _Family("fairqueue_worker_slots", "gauge", "Job slots of this worker.")
        self._busy = _Family("fairqueue_worker_busy_slots", "gauge", "Job slots of this worker running a job.")
        self._reconnects = _Family(
            "fairqueue_worker_reconnects_total",
            "counter",
            "Database reconnections of this worker, by connection.",
            ("connection",),
        )
        self._claim_seconds = _Family(
            "fairqueue_claim_seconds", "histogram", "Round-trip time of claim calls, in seconds."
        )
        self._claims = _Family("fairqueue_claims_total", "counter", "Claim calls made by this worker.")
        self._claims_empty = _Family("fairqueue_claims_empty_total", "counter", "Claim calls that returned no job.")
        # unlabelled series exist from the start so dashboards see 0 rather than no data
        for family in (self._slots, self._busy, self._claims, self._claims_empty):
            family.values[()] = 0
        self._claim_seconds.histograms[()] = _Histogram()
        self._families: tuple[_Family, ...] = (
            self._claimed,
            self._finished,
            self._wait,
            self._run,
            self._slots,
            self._busy,
            self._reconnects,
            self._claims,
            self._claims_empty,
            self._claim_seconds,
        )

    def _channel(self, channel: str) -> str:
        """The label value for ``channel``; call with the lock held."""
        if channel in self._channels:
            return channel
        if len(self._channels) < self._max_channels:
            self._channels.add(channel)
            return channel
        return OTHER_CHANNEL

    @staticmethod
    def _inc(family: _Family, labels: Labels, amount: int = 1) -> None:
        family.values[labels] = family.values.get(labels, 0) + amount

    @staticmethod
    def _observe(family: _Family, labels: Labels, value: float) -> None:
        hist = family.histograms.get(labels)
        if hist is None:
            hist = family.histograms[labels] = _Histogram()
        hist.observe(value)

    def job_claimed(self, channel: str, kind: str, wait_seconds: float) -> None:
        """A job was claimed; ``wait_seconds`` is the time from it being ready to it starting."""
        self.jobs_claimed(((channel, kind, wait_seconds),))

    def jobs_claimed(self, jobs: Iterable[tuple[str, str, float]]) -> None:
        """:meth:`job_claimed` for a batch of (channel, kind, wait_seconds), under one lock."""
        with self._lock:
            for channel, kind, wait_seconds in jobs:
                ch = self._channel(channel)
                self._inc(self._claimed, (ch, kind))
                self._observe(self._wait, (ch,), _seconds(wait_seconds))

    def job_finished(self, channel: str, kind: str, outcome: str, run_seconds: float) -> None:
        """A job ended with ``outcome`` (succeeded, failed, timed_out, lost or cancelled) after ``run_seconds``."""
        self.jobs_finished(((channel, kind, outcome, run_seconds),))

    def jobs_finished(self, jobs: Iterable[tuple[str, str, str, float]]) -> None:
        """:meth:`job_finished` for a batch of (channel, kind, outcome, run_seconds), under one lock."""
        jobs = list(jobs)
        for _, _, outcome, _ in jobs:
            if outcome not in OUTCOMES:
                raise ValueError(f"unknown outcome {outcome!r}; expected one of {', '.join(sorted(OUTCOMES))}")
        with self._lock:
            for channel, kind, outcome, run_seconds in jobs:
                ch = self._channel(channel)
                self._inc(self._finished, (ch, kind, outcome))
                self._observe(self._run, (ch, kind), _seconds(run_seconds))

    def set_slots(self, total: int, busy: int) -> None:
        """The worker has ``total`` job slots, ``busy`` of them running a job."""
        with self._lock:
            self._slots.values[()] = total
            self._busy.values[()] = busy

    def reconnected(self, which: str) -> None:
        """The connection named ``which`` (e.g. "claim", "listen") was re-established."""
        with self._lock:
            self._inc(self._reconnects, (which,))

    def claim_round_trip(self, seconds: float, jobs: int) -> None:
        """A claim call took ``seconds`` and returned ``jobs`` jobs."""
        value = _seconds(seconds)
        with self._lock:
            self._observe(self._claim_seconds, (), value)
            self._inc(self._claims, ())
            if jobs == 0:
                self._inc(self._claims_empty, ())

    def render(self) -> str:
        """All metrics in the Prometheus text exposition format 0.0.4 (ends with a newline)."""
        lines: list[str] = []
        with self._lock:
            for family in self._families:
                lines.append(f"# HELP {family.name} {_escape_help(family.help)}")
                lines.append(f"# TYPE {family.name} {family.kind}")
                if family.kind == "histogram":
                    for labels in sorted(family.histograms):
                        self._render_histogram(lines, family, labels, family.histograms[labels])
                else:
                    for labels in sorted(family.values):
                        label_text = _label_text(family.label_names, labels)
                        lines.append(f"{family.name}{label_text} {_format_value(family.values[labels])}")
        return "\n".join(lines) + "\n"

    @staticmethod
    def _render_histogram(lines: list[str], family: _Family, labels: Labels, hist: _Histogram) -> None:
        cumulative = 0
        for bound, count in zip((*SECONDS_BUCKETS, math.inf), hist.counts, strict=True):
            cumulative += count
            le = f'le="{_format_value(bound)}"'
            lines.append(f"{family.name}_bucket{_label_text(family.label_names, labels, le)} {cumulative}")
        label_text = _label_text(family.label_names, labels)
        lines.append(f"{family.name}_sum{label_text} {_format_value(hist.total)}")
        lines.append(f"{family.name}_count{label_text} {hist.count}")


#: Seconds a connection to the metrics endpoint may take, from its accept to the end of the response
#: (a scrape takes milliseconds): an idle or trickling connection is closed then.
REQUEST_TIMEOUT: Final = 10.0
#: Connections served at once (each has a thread); one beyond them is closed at once, unanswered.
MAX_CONNECTIONS: Final = 16


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def setup(self) -> None:
        super().setup()
        self.connection.settimeout(self.server.request_timeout)  # each read and write of the socket, at most

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0]
        if path in ("/metrics", "/"):
            body = self.server.metrics.render().encode("utf-8")
            self.send_response(200)
            self.send_header("Content-Type", CONTENT_TYPE)
        else:
            body = b"not found; metrics are at /metrics\n"
            self.send_response(404)
            self.send_header("Content-Type", "text/plain; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        # scrapes every few seconds would flood stderr
        pass


class _Server(ThreadingHTTPServer):
    """One thread per connection, as ThreadingHTTPServer, but at most ``max_connections`` of them, and
    no connection kept past ``request_timeout``: idle sockets cannot pile up threads."""

    daemon_threads = True

    def __init__(
        self,
        address: tuple[str, int],
        metrics: Metrics,
        family: socket.AddressFamily,
        *,
        request_timeout: float,
        max_connections: int,
    ) -> None:
        self.address_family = family
        self.metrics = metrics
        self.request_timeout = request_timeout
        self.max_connections = max_connections
        self._open: dict[socket.socket, float] = {}  # connections being served, and when they were accepted
        self._open_lock = threading.Lock()
        super().__init__(address, _Handler)

    @property
    def open_connections(self) -> int:
        with self._open_lock:
            return len(self._open)

    def process_request(self, request: Any, client_address: Any) -> None:
        with self._open_lock:
            full = len(self._open) >= self.max_connections
            if not full:
                self._open[request] = time.monotonic()
        if full:
            self.shutdown_request(request)  # closed unanswered: the scraper tries again next time
            return
        thread = threading.Thread(
            target=self.process_request_thread,
            args=(request, client_address),
            name=f"fairqueue-metrics-{self.server_address[1]}-conn",
            daemon=True,
        )
        try:
            thread.start()
        except RuntimeError:  # no thread to be had
            self._forget(request)
            self.shutdown_request(request)

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._forget(request)

    def _forget(self, request: Any) -> None:
        with self._open_lock:
            self._open.pop(request, None)

    def service_actions(self) -> None:
        """Called by serve_forever between polls: ends connections older than request_timeout (one
        that trickles a byte now and then never lets a read time out)."""
        deadline = time.monotonic() - self.request_timeout
        with self._open_lock:
            late = [request for request, accepted in self._open.items() if accepted < deadline]
        for request in late:
            with contextlib.suppress(OSError):
                request.shutdown(socket.SHUT_RDWR)  # its thread's next read or write ends, and so does it

    def handle_error(self, request: Any, client_address: Any) -> None:
        # a scraper hanging up mid-response is not worth a traceback on stderr
        log.debug("metrics request from %s failed", client_address, exc_info=True)


class MetricsServer:
    """Serves ``metrics.render()`` on ``http://host:port/metrics`` from a daemon thread until :meth:`close`.

    It binds ``host`` (all IPv4 addresses by default, so that Prometheus on another machine or in
    another container can scrape it; see docs/operations.md). At most ``max_connections`` connections
    are served at once, each for at most ``request_timeout`` seconds: idle or slow connections cannot
    pile up threads."""

    def __init__(
        self,
        metrics: Metrics,
        port: int,
        host: str = "0.0.0.0",  # noqa: S104
        *,
        request_timeout: float = REQUEST_TIMEOUT,
        max_connections: int = MAX_CONNECTIONS,
    ) -> None:
        if not 0 < request_timeout < math.inf or max_connections < 1:
            raise ValueError("request_timeout must be a number of seconds above zero and max_connections at least 1")
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        where = f"[{host}]:{port}" if family == socket.AF_INET6 else f"{host}:{port}"
        try:
            self._server = _Server(
                (host, port), metrics, family, request_timeout=request_timeout, max_connections=max_connections
            )
        except OSError as exc:
            reason = "address already in use" if exc.errno == errno.EADDRINUSE else (exc.strerror or str(exc))
            raise ConfigurationError(f"cannot serve metrics on {where}: {reason.lower()}") from exc
        self.host = host
        self.port: int = self._server.server_address[1]
        self._closed = False
        self._thread = threading.Thread(
            target=self._server.serve_forever,
            kwargs={"poll_interval": min(0.5, request_timeout / 2)},
            name=f"fairqueue-metrics-{self.port}",
            daemon=True,
        )
        self._thread.start()

    @property
    def open_connections(self) -> int:
        """Connections being served now."""
        return self._server.open_connections

    def close(self) -> None:
        """Stop serving and wait for the server thread; calling it again does nothing."""
        if self._closed:
            return
        self._closed = True
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()

    def __enter__(self) -> MetricsServer:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()
