"""Structured logging: JSON and text formatters, configure_logging, log_the_application. No database needed
(tests/cli/test_worker_command.py and tests/django/test_app.py run workers whose tasks log)."""

from __future__ import annotations

import calendar
import contextlib
import io
import json
import logging
import re
from collections.abc import Iterator

import pytest

from fairqueue.errors import ConfigurationError
from fairqueue.logs import JsonFormatter, TextFormatter, _FairqueueHandler, configure_logging, log_the_application

TS_RE = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$")


@pytest.fixture(autouse=True)
def restore_fairqueue_logger() -> Iterator[logging.Logger]:
    """configure_logging changes process-wide state; put the "fairqueue" logger back as it was."""
    logger = logging.getLogger("fairqueue")
    saved = (list(logger.handlers), logger.level, logger.propagate)
    root_handlers = list(logging.getLogger().handlers)
    yield logger
    assert logging.getLogger().handlers == root_handlers, "configure_logging must not touch the root logger"
    for h in list(logger.handlers):
        if h not in saved[0]:
            h.close()
    logger.handlers[:] = saved[0]
    logger.setLevel(saved[1])
    logger.propagate = saved[2]


def _record(msg: str = "job failed", **extra: object) -> logging.LogRecord:
    record = logging.LogRecord("fairqueue.worker", logging.INFO, __file__, 1, msg, (), None)
    record.created = calendar.timegm((2026, 11, 22, 3, 4, 5, 0, 0, 0)) + 0.123
    record.msecs = 123.0
    record.__dict__.update(extra)
    return record


def _lines(stream: io.StringIO) -> list[str]:
    return stream.getvalue().splitlines()


# --- JSON ---------------------------------------------------------------------------------------------------


class Unserialisable:
    def __str__(self) -> str:
        return "<unserialisable thing>"


def test_json_lines_carry_fixed_keys_and_extra_fields() -> None:
    stream = io.StringIO()
    configure_logging("json", "DEBUG", stream=stream)
    log = logging.getLogger("fairqueue.worker")
    log.info("job failed", extra={"job_id": 5, "channel": "bob", "thing": Unserialisable(), "tags": ["a", 1]})
    log.debug("claimed %d jobs", 3)
    lines = _lines(stream)
    assert len(lines) == 2
    first, second = (json.loads(line) for line in lines)
    assert TS_RE.match(first["ts"])
    assert first == {
        "ts": first["ts"],
        "level": "INFO",
        "logger": "fairqueue.worker",
        "message": "job failed",
        "job_id": 5,
        "channel": "bob",
        "thing": "<unserialisable thing>",
        "tags": ["a", 1],
    }
    assert second["message"] == "claimed 3 jobs"
    assert second["level"] == "DEBUG"
    assert "exc" not in second


def test_json_includes_the_traceback() -> None:
    stream = io.StringIO()
    configure_logging("json", stream=stream)
    log = logging.getLogger("fairqueue.worker")
    try:
        raise ValueError('bad "input"\nsecond line')
    except ValueError:
        log.exception("handler crashed", extra={"job_id": 7})
    lines = _lines(stream)
    assert len(lines) == 1, "a traceback must not break the one-object-per-line rule"
    doc = json.loads(lines[0])
    assert doc["message"] == "handler crashed"
    assert doc["level"] == "ERROR"
    assert doc["job_id"] == 7
    assert doc["exc"].startswith("Traceback (most recent call last):")
    assert 'ValueError: bad "input"\nsecond line' in doc["exc"]


def test_json_timestamp_is_utc_with_milliseconds() -> None:
    doc = json.loads(JsonFormatter().format(_record()))
    assert doc["ts"] == "2026-11-22T03:04:05.123Z"


def test_json_extra_fields_do_not_overwrite_fixed_keys() -> None:
    doc = json.loads(JsonFormatter().format(_record(level="custom", ts=1)))
    assert doc["level"] == "INFO"
    assert doc["level_"] == "custom"
    assert doc["ts"] == "2026-11-22T03:04:05.123Z"
    assert doc["ts_"] == 1


def test_json_survives_values_json_cannot_encode() -> None:
    doc = json.loads(JsonFormatter().format(_record(mapping={("a", 1): "tuple key"})))
    assert doc["mapping"] == "{('a', 1): 'tuple key'}"
    assert doc["message"] == "job failed"


# --- text ---------------------------------------------------------------------------------------------------


def test_text_format() -> None:
    line = TextFormatter().format(_record(job_id=5, channel="bob"))
    assert line == "2026-11-22T03:04:05.123Z INFO fairqueue.worker job failed job_id=5 channel=bob"


def test_text_quotes_values_with_spaces() -> None:
    line = TextFormatter().format(_record(reason="out of memory", empty="", quote='say "hi"', plain="x"))
    assert line.endswith(' reason="out of memory" empty="" quote="say \\"hi\\"" plain=x')


def test_text_through_configure_with_traceback() -> None:
    stream = io.StringIO()
    configure_logging("text", stream=stream)
    log = logging.getLogger("fairqueue.worker")
    log.info("job failed", extra={"job_id": 5, "channel": "bob"})
    try:
        1 / 0  # noqa: B018
    except ZeroDivisionError:
        log.error("crashed", exc_info=True, extra={"job_id": 6})
    lines = _lines(stream)
    assert re.fullmatch(r"\S+ INFO fairqueue\.worker job failed job_id=5 channel=bob", lines[0])
    assert TS_RE.match(lines[0].split(" ")[0])
    assert re.fullmatch(r"\S+ ERROR fairqueue\.worker crashed job_id=6", lines[1])
    assert lines[2] == "Traceback (most recent call last):"
    assert lines[-1] == "ZeroDivisionError: division by zero"


def test_text_lines_cannot_be_forged_by_what_the_message_and_the_fields_hold() -> None:
    # a channel name or an error text with a newline, a carriage return, escape sequences or a C1
    # control (stored before names were checked, or an error's free text) stays inside its own line
    forged = "\n2026-11-22T03:04:05.123Z INFO fairqueue.worker job succeeded"
    line = TextFormatter().format(
        _record(
            "job failed" + forged,
            channel="evil\x1b[2K\rchannel",
            error="Boom" + forged,
            kind="k\x9b31m\x7f\u2028x",
        )
    )
    assert "\n" not in line and "\r" not in line
    assert not re.search(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]", line)
    assert line.startswith("2026-11-22T03:04:05.123Z INFO fairqueue.worker job failed\\n2026-11-22T03:04:05.123Z")
    assert ' channel="evil\\u001b[2K\\rchannel" ' in line  # quoted: a carriage return is a space
    assert ' error="Boom\\n2026-11-22T03:04:05.123Z INFO fairqueue.worker job succeeded" ' in line
    assert line.endswith(' kind="k\\x9b31m\\x7f\\u2028x"')


def test_text_tracebacks_keep_their_lines_but_not_their_control_characters() -> None:
    stream = io.StringIO()
    configure_logging("text", stream=stream)
    try:
        raise ValueError("bad\x1b[31m input\r")
    except ValueError:
        logging.getLogger("fairqueue.worker").exception("crashed")
    lines = _lines(stream)
    assert lines[1] == "Traceback (most recent call last):"
    assert lines[-1] == "ValueError: bad\\x1b[31m input\\r"
    assert not re.search(r"[\x00-\x09\x0b-\x1f\x7f-\x9f]", stream.getvalue())


def test_json_lines_escape_every_control_character() -> None:
    value = "evil\x1b[2K\x9b\x7f\u2028channel\n"
    line = JsonFormatter().format(_record(channel=value))
    assert not re.search(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]", line)
    assert json.loads(line)["channel"] == value


# --- configure_logging --------------------------------------------------------------------------------------


def test_configure_is_idempotent_and_replaces_the_previous_setup() -> None:
    first, second = io.StringIO(), io.StringIO()
    logger = logging.getLogger("fairqueue")
    # not counting a handler an earlier in-process CLI run installed: configure_logging replaces it
    before = len([h for h in logger.handlers if not isinstance(h, _FairqueueHandler)])
    configure_logging("text", stream=first)
    configure_logging("json", stream=second)
    assert len(logger.handlers) == before + 1
    logging.getLogger("fairqueue.worker").warning("hello")
    assert first.getvalue() == ""
    assert json.loads(second.getvalue())["message"] == "hello"


def test_configure_leaves_other_loggers_alone(caplog: pytest.LogCaptureFixture) -> None:
    stream = io.StringIO()
    configure_logging("text", stream=stream)
    with caplog.at_level(logging.INFO):
        logging.getLogger("someapp").info("not ours")
    assert "not ours" not in stream.getvalue()
    assert [r.getMessage() for r in caplog.records] == ["not ours"]


@pytest.mark.parametrize(
    ("level", "shown"),
    [
        ("WARNING", ["warning"]),
        ("debug", ["debug", "info", "warning"]),
        (logging.INFO, ["info", "warning"]),
        ("20", ["info", "warning"]),
    ],
)
def test_level_filters(level: str | int, shown: list[str]) -> None:
    stream = io.StringIO()
    configure_logging("text", level, stream=stream)
    log = logging.getLogger("fairqueue.x")
    log.debug("debug")
    log.info("info")
    log.warning("warning")
    assert [line.split(" ")[-1] for line in _lines(stream)] == shown


@pytest.mark.parametrize("fmt", ["xml", "JSON ", ""])
def test_bad_format_is_a_configuration_error(fmt: str) -> None:
    handlers = list(logging.getLogger("fairqueue").handlers)
    with pytest.raises(ConfigurationError, match="invalid log format"):
        configure_logging(fmt)
    assert logging.getLogger("fairqueue").handlers == handlers


@pytest.mark.parametrize("level", ["LOUD", "", "info!", -1])
def test_bad_level_is_a_configuration_error(level: str | int) -> None:
    handlers = list(logging.getLogger("fairqueue").handlers)
    with pytest.raises(ConfigurationError, match="invalid log level"):
        configure_logging("json", level)
    assert logging.getLogger("fairqueue").handlers == handlers


# --- log_the_application: the application's own records in a worker ---------------------------------------


@contextlib.contextmanager
def bare_root() -> Iterator[logging.Logger]:
    """The root logger as in a fresh process, without pytest's capture handlers (which pytest adds for
    the test's own run, so this is entered in the test); put back afterwards."""
    root = logging.getLogger()
    saved = (list(root.handlers), root.level)
    root.handlers[:] = []
    try:
        yield root
    finally:
        for h in root.handlers:
            h.close()
        root.handlers[:] = saved[0]
        root.setLevel(saved[1])


def test_an_unconfigured_root_logger_gets_the_workers_format_and_level() -> None:
    with bare_root() as root:
        stream = io.StringIO()
        configure_logging("json", "INFO", stream=stream)
        assert log_the_application("json", "INFO", stream=stream)
        logging.getLogger("myapp.tasks").info("building %s", 7, extra={"report": 7})
        logging.getLogger("myapp.tasks").debug("not at INFO")
        logging.getLogger("fairqueue.worker").info("worker started")
        records = [json.loads(line) for line in _lines(stream)]
        assert [(r["logger"], r["message"]) for r in records] == [
            ("myapp.tasks", "building 7"),
            ("fairqueue.worker", "worker started"),  # once: the "fairqueue" logger does not propagate
        ]
        assert records[0]["report"] == 7 and records[0]["level"] == "INFO"
        # called again (another in-process run): the handler is replaced, not added
        again = io.StringIO()
        assert log_the_application("text", "DEBUG", stream=again)
        assert len(root.handlers) == 1 and root.level == logging.DEBUG
        logging.getLogger("myapp.tasks").debug("now at DEBUG")
        assert re.fullmatch(r"\S+ DEBUG myapp\.tasks now at DEBUG", again.getvalue().strip())


def test_a_root_logger_the_application_configured_is_not_touched() -> None:
    with bare_root() as root:
        theirs = logging.StreamHandler(io.StringIO())
        root.addHandler(theirs)
        root.setLevel(logging.WARNING)
        stream = io.StringIO()
        assert not log_the_application("text", "DEBUG", stream=stream)
        assert root.handlers == [theirs] and root.level == logging.WARNING
        logging.getLogger("myapp.tasks").warning("theirs")
        assert stream.getvalue() == "" and "theirs" in theirs.stream.getvalue()


def test_log_the_application_checks_its_arguments() -> None:
    with bare_root() as root:
        with pytest.raises(ConfigurationError, match="invalid log format"):
            log_the_application("xml")
        with pytest.raises(ConfigurationError, match="invalid log level"):
            log_the_application("text", "LOUD")
        assert root.handlers == []


def test_without_a_stream_records_go_to_the_stderr_of_the_moment(monkeypatch: pytest.MonkeyPatch) -> None:
    """A worker thread may log after whoever replaced stderr when logging was set up (a test's capture,
    an embedding application) has closed that stream: the record goes to the current stderr, not to
    the closed one (where logging would print "--- Logging error ---")."""
    first, second = io.StringIO(), io.StringIO()
    monkeypatch.setattr("sys.stderr", first)
    configure_logging("text")
    first.close()
    monkeypatch.setattr("sys.stderr", second)
    monkeypatch.setattr(logging, "raiseExceptions", True)
    logging.getLogger("fairqueue.worker").warning("job did not succeed")
    assert "job did not succeed" in second.getvalue() and "Logging error" not in second.getvalue()
    explicit = io.StringIO()
    configure_logging("text", stream=explicit)  # a stream given is kept
    logging.getLogger("fairqueue.worker").warning("to the stream given")
    assert "to the stream given" in explicit.getvalue() and "to the stream given" not in second.getvalue()
