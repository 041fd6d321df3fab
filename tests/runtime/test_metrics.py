"""Prometheus metrics: exposition format, counter/histogram arithmetic, cardinality cap, threads, HTTP server.

No database needed.
"""

from __future__ import annotations

import math
import re
import socket
import threading
import urllib.error
import urllib.request
from dataclasses import dataclass, field

import pytest

from fairqueue.errors import ConfigurationError
from fairqueue.metrics import CONTENT_TYPE, SECONDS_BUCKETS, Metrics, MetricsServer
from tests.helpers import wait_for

FAMILIES = {
    "fairqueue_jobs_claimed_total": "counter",
    "fairqueue_job_wait_seconds": "histogram",
    "fairqueue_jobs_finished_total": "counter",
    "fairqueue_job_run_seconds": "histogram",
    "fairqueue_worker_slots": "gauge",
    "fairqueue_worker_busy_slots": "gauge",
    "fairqueue_worker_reconnects_total": "counter",
    "fairqueue_claim_seconds": "histogram",
    "fairqueue_claims_total": "counter",
    "fairqueue_claims_empty_total": "counter",
}

# --- a tiny parser of the text exposition format 0.0.4 -------------------------------------------------------

_NAME = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
_LABEL_VALUE = r'"(?:[^"\\\n]|\\[\\"n])*"'
_LABEL = rf"[a-zA-Z_][a-zA-Z0-9_]*={_LABEL_VALUE}"
_VALUE = r"[+-]?(?:Inf|NaN|[0-9]+(?:\.[0-9]*)?(?:[eE][+-]?[0-9]+)?|\.[0-9]+(?:[eE][+-]?[0-9]+)?)"
SAMPLE_RE = re.compile(rf"^(?P<name>{_NAME})(?:\{{(?P<labels>(?:{_LABEL})(?:,{_LABEL})*)?\}})? (?P<value>{_VALUE})$")
HELP_RE = re.compile(rf"^# HELP (?P<name>{_NAME}) (?P<text>.*)$")
TYPE_RE = re.compile(rf"^# TYPE (?P<name>{_NAME}) (?P<kind>counter|gauge|histogram|summary|untyped)$")
LABEL_RE = re.compile(rf"([a-zA-Z_][a-zA-Z0-9_]*)=({_LABEL_VALUE})")

Key = tuple[str, tuple[tuple[str, str], ...]]


def _unescape(quoted: str) -> str:
    body = quoted[1:-1]
    return re.sub(r"\\(.)", lambda m: {"n": "\n"}.get(m.group(1), m.group(1)), body)


@dataclass
class Exposition:
    help: dict[str, str] = field(default_factory=dict)
    types: dict[str, str] = field(default_factory=dict)
    samples: dict[Key, float] = field(default_factory=dict)
    order: list[Key] = field(default_factory=list)

    def get(self, name: str, **labels: str) -> float:
        return self.samples[(name, tuple(sorted(labels.items())))]

    def series(self, name: str) -> dict[tuple[tuple[str, str], ...], float]:
        return {labels: v for (n, labels), v in self.samples.items() if n == name}


def parse(text: str) -> Exposition:
    assert text.endswith("\n"), "exposition must end with a newline"
    exp = Exposition()
    for lineno, line in enumerate(text[:-1].split("\n"), 1):
        if m := HELP_RE.match(line):
            assert m["name"] not in exp.help, f"line {lineno}: second HELP for {m['name']}"
            exp.help[m["name"]] = m["text"]
        elif m := TYPE_RE.match(line):
            assert m["name"] not in exp.types, f"line {lineno}: second TYPE for {m['name']}"
            exp.types[m["name"]] = m["kind"]
        else:
            m = SAMPLE_RE.match(line)
            assert m, f"line {lineno} is not a valid sample: {line!r}"
            name = m["name"]
            family = name
            for suffix in ("_bucket", "_sum", "_count"):
                if name.endswith(suffix) and exp.types.get(name.removesuffix(suffix)) == "histogram":
                    family = name.removesuffix(suffix)
            assert family in exp.types, f"line {lineno}: sample of {family} before its TYPE line"
            assert family in exp.help, f"line {lineno}: sample of {family} before its HELP line"
            labels = tuple(sorted((k, _unescape(v)) for k, v in LABEL_RE.findall(m["labels"] or "")))
            key = (name, labels)
            assert key not in exp.samples, f"line {lineno}: duplicate sample {key}"
            raw = m["value"]
            exp.samples[key] = float(raw.replace("Inf", "inf").replace("NaN", "nan"))
            exp.order.append(key)
    return exp


def check_histogram(exp: Exposition, name: str, **labels: str) -> list[float]:
    """The cumulative bucket counts of one histogram series, after checking its invariants."""
    counts = [exp.get(f"{name}_bucket", **labels, le=repr(b)) for b in SECONDS_BUCKETS]
    counts.append(exp.get(f"{name}_bucket", **labels, le="+Inf"))
    assert counts == sorted(counts), f"{name} buckets are not cumulative: {counts}"
    assert counts[-1] == exp.get(f"{name}_count", **labels)
    return counts


# --- format -------------------------------------------------------------------------------------------------


def test_empty_metrics_render_every_family_with_help_and_type() -> None:
    exp = parse(Metrics().render())
    assert exp.types == FAMILIES
    assert set(exp.help) == set(FAMILIES)
    assert all(exp.help.values())
    # unlabelled series start at zero
    for name in ("fairqueue_worker_slots", "fairqueue_worker_busy_slots", "fairqueue_claims_total"):
        assert exp.get(name) == 0
    assert exp.get("fairqueue_claims_empty_total") == 0
    assert check_histogram(exp, "fairqueue_claim_seconds") == [0] * (len(SECONDS_BUCKETS) + 1)
    assert exp.get("fairqueue_claim_seconds_sum") == 0
    # labelled families have no samples until something is recorded
    assert exp.series("fairqueue_jobs_claimed_total") == {}


def test_histogram_buckets_are_cumulative_and_le_is_inclusive() -> None:
    m = Metrics()
    for wait in (0.0005, 0.001, 0.003, 0.2, 0.25, 299.0, 1000.0):
        m.job_claimed("alice", "email", wait)
    exp = parse(m.render())
    counts = check_histogram(exp, "fairqueue_job_wait_seconds", channel="alice")
    by_le = dict(zip((*SECONDS_BUCKETS, math.inf), counts, strict=True))
    assert by_le[0.001] == 2  # 0.001 itself falls into le="0.001"
    assert by_le[0.0025] == 2
    assert by_le[0.005] == 3
    assert by_le[0.1] == 3
    assert by_le[0.25] == 5
    assert by_le[60.0] == 5
    assert by_le[300.0] == 6
    assert by_le[math.inf] == 7
    assert exp.get("fairqueue_job_wait_seconds_count", channel="alice") == 7
    assert exp.get("fairqueue_job_wait_seconds_sum", channel="alice") == pytest.approx(1299.4545)
    assert exp.get("fairqueue_jobs_claimed_total", channel="alice", kind="email") == 7


def test_bucket_bounds_are_the_documented_ones() -> None:
    text = Metrics().render()
    les = re.findall(r'fairqueue_claim_seconds_bucket\{le="([^"]+)"\}', text)
    assert [float(x) for x in les[:-1]] == [
        0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300,
    ]  # fmt: skip
    assert les[-1] == "+Inf"


def test_negative_durations_count_as_zero() -> None:
    m = Metrics()
    m.job_claimed("a", "k", -0.5)  # ready_at from a database clock slightly ahead of ours
    exp = parse(m.render())
    assert exp.get("fairqueue_job_wait_seconds_bucket", channel="a", le="0.001") == 1
    assert exp.get("fairqueue_job_wait_seconds_sum", channel="a") == 0


def test_finished_counters_and_run_histogram() -> None:
    m = Metrics()
    m.job_finished("bob", "resize", "succeeded", 0.02)
    m.job_finished("bob", "resize", "succeeded", 0.04)
    m.job_finished("bob", "resize", "failed", 3.0)
    m.job_finished("alice", "resize", "timed_out", 61.0)
    for outcome in ("lost", "cancelled"):
        m.job_finished("alice", "email", outcome, 0.0)
    exp = parse(m.render())
    finished = exp.series("fairqueue_jobs_finished_total")
    assert finished == {
        (("channel", "alice"), ("kind", "email"), ("outcome", "cancelled")): 1,
        (("channel", "alice"), ("kind", "email"), ("outcome", "lost")): 1,
        (("channel", "alice"), ("kind", "resize"), ("outcome", "timed_out")): 1,
        (("channel", "bob"), ("kind", "resize"), ("outcome", "failed")): 1,
        (("channel", "bob"), ("kind", "resize"), ("outcome", "succeeded")): 2,
    }
    counts = check_histogram(exp, "fairqueue_job_run_seconds", channel="bob", kind="resize")
    assert counts[SECONDS_BUCKETS.index(0.025)] == 1
    assert counts[SECONDS_BUCKETS.index(0.05)] == 2
    assert counts[SECONDS_BUCKETS.index(5.0)] == 3
    assert exp.get("fairqueue_job_run_seconds_sum", channel="bob", kind="resize") == pytest.approx(3.06)
    assert check_histogram(exp, "fairqueue_job_run_seconds", channel="alice", kind="email")[0] == 2


def test_unknown_outcome_is_rejected() -> None:
    with pytest.raises(ValueError, match="unknown outcome 'done'"):
        Metrics().job_finished("a", "k", "done", 1.0)


def test_gauges_reconnects_and_claims() -> None:
    m = Metrics()
    m.set_slots(8, 3)
    m.set_slots(8, 5)
    m.reconnected("claim")
    m.reconnected("claim")
    m.reconnected("listen")
    m.claim_round_trip(0.004, 10)
    m.claim_round_trip(0.002, 0)
    m.claim_round_trip(0.03, 0)
    exp = parse(m.render())
    assert exp.get("fairqueue_worker_slots") == 8
    assert exp.get("fairqueue_worker_busy_slots") == 5
    assert exp.get("fairqueue_worker_reconnects_total", connection="claim") == 2
    assert exp.get("fairqueue_worker_reconnects_total", connection="listen") == 1
    assert exp.get("fairqueue_claims_total") == 3
    assert exp.get("fairqueue_claims_empty_total") == 2
    counts = check_histogram(exp, "fairqueue_claim_seconds")
    assert counts[SECONDS_BUCKETS.index(0.0025)] == 1
    assert counts[SECONDS_BUCKETS.index(0.005)] == 2
    assert counts[-1] == 3
    assert exp.get("fairqueue_claim_seconds_sum") == pytest.approx(0.036)


def test_label_values_are_escaped() -> None:
    nasty = 'a"b\\c\nd'
    m = Metrics()
    m.job_claimed(nasty, "k\\", 0.1)
    text = m.render()
    assert 'channel="a\\"b\\\\c\\nd",kind="k\\\\"' in text
    exp = parse(text)
    assert exp.get("fairqueue_jobs_claimed_total", channel=nasty, kind="k\\") == 1
    assert exp.get("fairqueue_job_wait_seconds_count", channel=nasty) == 1


def test_output_order_is_sorted_and_deterministic() -> None:
    a, b = Metrics(), Metrics()
    events = [("zed", "x"), ("amy", "y"), ("amy", "x"), ("bob", "x")]
    for channel, kind in events:
        a.job_claimed(channel, kind, 0.1)
    for channel, kind in reversed(events):
        b.job_claimed(channel, kind, 0.1)
    assert a.render() == b.render()
    keys = [labels for name, labels in parse(a.render()).order if name == "fairqueue_jobs_claimed_total"]
    assert keys == sorted(keys)
    assert [dict(k)["channel"] for k in keys] == ["amy", "amy", "bob", "zed"]


def test_channel_cardinality_cap() -> None:
    m = Metrics(max_channels=2)
    for channel in ("a", "b", "c", "d", "a"):
        m.job_claimed(channel, "k", 0.01)
    m.job_finished("b", "k", "succeeded", 0.01)
    m.job_finished("e", "k", "failed", 0.01)
    exp = parse(m.render())
    assert exp.series("fairqueue_jobs_claimed_total") == {
        (("channel", "_other"), ("kind", "k")): 2,
        (("channel", "a"), ("kind", "k")): 2,
        (("channel", "b"), ("kind", "k")): 1,
    }
    assert exp.get("fairqueue_job_wait_seconds_count", channel="_other") == 2
    assert exp.get("fairqueue_jobs_finished_total", channel="b", kind="k", outcome="succeeded") == 1
    assert exp.get("fairqueue_jobs_finished_total", channel="_other", kind="k", outcome="failed") == 1
    assert exp.get("fairqueue_job_run_seconds_count", channel="_other", kind="k") == 1


def test_default_cap_is_a_thousand_channels() -> None:
    m = Metrics()
    for i in range(1005):
        m.job_claimed(f"tenant-{i}", "k", 0.0)
    channels = {dict(labels)["channel"] for labels in parse(m.render()).series("fairqueue_jobs_claimed_total")}
    assert len(channels) == 1001
    assert "_other" in channels
    assert "tenant-999" in channels
    assert "tenant-1000" not in channels


def test_concurrent_recording_loses_nothing() -> None:
    m = Metrics()
    threads_n, per_thread = 8, 2000
    barrier = threading.Barrier(threads_n)
    errors: list[BaseException] = []

    def work(i: int) -> None:
        try:
            barrier.wait()
            for j in range(per_thread):
                channel = f"c{j % 3}"
                m.job_claimed(channel, "k", 0.01)
                m.job_finished(channel, "k", "succeeded", 0.5)
                m.claim_round_trip(0.001, j % 2)
                m.reconnected("claim")
                if j % 100 == 0:
                    m.render()  # rendering concurrently with writers must be safe too
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(threads_n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    total = threads_n * per_thread
    exp = parse(m.render())
    assert sum(exp.series("fairqueue_jobs_claimed_total").values()) == total
    assert sum(exp.series("fairqueue_jobs_finished_total").values()) == total
    assert sum(exp.series("fairqueue_job_wait_seconds_count").values()) == total
    assert sum(exp.series("fairqueue_job_run_seconds_count").values()) == total
    assert exp.get("fairqueue_claims_total") == total
    assert exp.get("fairqueue_claims_empty_total") == total // 2
    assert exp.get("fairqueue_claim_seconds_count") == total
    assert exp.get("fairqueue_worker_reconnects_total", connection="claim") == total
    assert exp.get("fairqueue_job_run_seconds_sum", channel="c0", kind="k") == pytest.approx(
        0.5 * threads_n * len(range(0, per_thread, 3))
    )


# --- HTTP server --------------------------------------------------------------------------------------------


def _get(url: str) -> tuple[int, str, str]:
    with urllib.request.urlopen(url, timeout=5) as resp:
        return resp.status, resp.headers["Content-Type"], resp.read().decode("utf-8")


def test_server_serves_metrics_and_404s_elsewhere() -> None:
    m = Metrics()
    m.job_claimed("alice", "email", 0.2)
    with MetricsServer(m, 0, host="127.0.0.1") as server:
        assert server.port > 0
        base = f"http://127.0.0.1:{server.port}"
        status, ctype, body = _get(base + "/metrics")
        assert status == 200
        assert ctype == CONTENT_TYPE == "text/plain; version=0.0.4; charset=utf-8"
        assert body == m.render()
        assert parse(body).get("fairqueue_jobs_claimed_total", channel="alice", kind="email") == 1
        status, ctype, root_body = _get(base + "/")
        assert (status, ctype) == (200, CONTENT_TYPE)
        assert "fairqueue_claims_total" in root_body
        assert _get(base + "/metrics?x=1")[0] == 200
        with pytest.raises(urllib.error.HTTPError) as info:
            _get(base + "/other")
        assert info.value.code == 404
    # closed: the port no longer accepts connections, and closing again is harmless
    server.close()
    with pytest.raises(urllib.error.URLError):
        _get(f"http://127.0.0.1:{server.port}/metrics")


def test_server_does_not_log_requests(capfd: pytest.CaptureFixture[str]) -> None:
    with MetricsServer(Metrics(), 0, host="127.0.0.1") as server:
        _get(f"http://127.0.0.1:{server.port}/metrics")
        with pytest.raises(urllib.error.HTTPError):
            _get(f"http://127.0.0.1:{server.port}/nope")
    assert capfd.readouterr().err == ""


def test_server_port_in_use_is_a_configuration_error() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        with pytest.raises(ConfigurationError) as info:
            MetricsServer(Metrics(), port, host="127.0.0.1")
    assert str(info.value) == f"cannot serve metrics on 127.0.0.1:{port}: address already in use"
    assert "\n" not in str(info.value)


def _connect(port: int) -> socket.socket:
    return socket.create_connection(("127.0.0.1", port), timeout=5)


def _closed_by_the_server(sock: socket.socket) -> bool:
    """Whether the server closed the connection without an answer (the client waits at most 5 s)."""
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True


def test_server_serves_a_bounded_number_of_connections_and_closes_the_others_at_once() -> None:
    """500 idle sockets kept 508 threads alive: beyond max_connections, a connection is closed unanswered
    instead of getting a thread, and scrapes work again once the idle ones are gone."""
    with MetricsServer(Metrics(), 0, host="127.0.0.1", max_connections=4) as server:

        def threads() -> int:
            return sum(t.name == f"fairqueue-metrics-{server.port}-conn" for t in threading.enumerate())

        idle = [_connect(server.port) for _ in range(4)]
        wait_for(lambda: threads() == 4, what="a thread per idle connection")
        try:
            for _ in range(40):
                with _connect(server.port) as extra:
                    assert _closed_by_the_server(extra)
            assert threads() == 4 and server.open_connections == 4
        finally:
            for sock in idle:
                sock.close()
        wait_for(lambda: threads() == 0, what="the idle connections' threads to end")
        assert server.open_connections == 0
        assert _get(f"http://127.0.0.1:{server.port}/metrics")[0] == 200


def test_server_closes_an_idle_connection_after_its_timeout() -> None:
    with MetricsServer(Metrics(), 0, host="127.0.0.1", request_timeout=0.3) as server:
        with _connect(server.port) as idle:  # sends nothing
            assert _closed_by_the_server(idle)
        wait_for(lambda: server.open_connections == 0, what="the connection's thread to end")
        assert _get(f"http://127.0.0.1:{server.port}/metrics")[0] == 200


def test_server_closes_a_connection_that_trickles_its_request_after_the_timeout() -> None:
    """A header line every 0.1 s: no single read waits long enough to time out, the whole request does."""
    server = MetricsServer(Metrics(), 0, host="127.0.0.1", request_timeout=0.5)
    with server, _connect(server.port) as slow:
        slow.settimeout(0.1)  # paces the trickle: a line whenever 0.1 s pass without an answer
        slow.sendall(b"GET /metrics HTTP/1.0\r\n")
        closed = False
        for _ in range(60):  # 6 s at most, far below the server's header limits
            try:
                if slow.recv(1) == b"":
                    closed = True
                    break
            except TimeoutError:
                try:
                    slow.sendall(b"X-Trickle: 1\r\n")
                except OSError:
                    closed = True
                    break
            except OSError:
                closed = True
                break
        assert closed, "the server kept a trickling connection open"
