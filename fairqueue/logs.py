"""Structured logging for fairqueue processes: one-line text or JSON records on the "fairqueue" logger.

Fields passed with ``extra=`` (``log.info("job failed", extra={"job_id": 5})``) become ``key=value`` pairs in
text output and top-level keys in JSON output. :func:`configure_logging` touches only the "fairqueue" logger,
never the root logger, so an application embedding fairqueue keeps its own logging setup.

The worker commands (``fairqueue worker``, ``manage.py runworker``) also call :func:`log_the_application`:
when nothing has configured the root logger, the records of the application's own loggers (a task
module's ``logging.getLogger(__name__)``) go to the worker's output too, in its format and from its level.
"""

from __future__ import annotations

import json
import logging
import re
import sys
import time
from collections.abc import Iterator
from typing import IO, Any, Final

from fairqueue.errors import ConfigurationError
from fairqueue.text import visible

__all__ = ["FORMATS", "JsonFormatter", "TextFormatter", "configure_logging", "log_the_application"]

FORMATS: Final = ("text", "json")
LOGGER_NAME: Final = "fairqueue"

# attributes every LogRecord has; anything else on a record came from extra=
_STANDARD_ATTRS: Final = frozenset(
    {*logging.LogRecord("", 0, "", 0, "", (), None).__dict__, "message", "asctime", "taskName"}
)
_JSON_KEYS: Final = ("ts", "level", "logger", "message", "exc", "stack")


def _timestamp(record: logging.LogRecord) -> str:
    """ISO-8601 UTC with milliseconds, e.g. 2026-11-22T03:04:05.123Z."""
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z"


def _extras(record: logging.LogRecord) -> Iterator[tuple[str, Any]]:
    for key, value in record.__dict__.items():
        if key not in _STANDARD_ATTRS and not key.startswith("_"):
            yield key, value


def _exception_text(formatter: logging.Formatter, record: logging.LogRecord) -> str | None:
    # cached on the record like logging.Formatter does, so several handlers format a traceback once
    if record.exc_info and not record.exc_text:
        record.exc_text = formatter.formatException(record.exc_info)
    return record.exc_text


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ts, level, logger, message, the extra fields, and exc/stack when present."""

    def format(self, record: logging.LogRecord) -> str:
        doc: dict[str, Any] = {
            "ts": _timestamp(record),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key, value in _extras(record):
            # an extra field never overwrites one of the fixed keys
            doc[f"{key}_" if key in _JSON_KEYS else key] = value
        exc = _exception_text(self, record)
        if exc:
            doc["exc"] = exc
        if record.stack_info:
            doc["stack"] = self.formatStack(record.stack_info)
        try:
            line = json.dumps(doc, ensure_ascii=False, default=str)
        except (TypeError, ValueError):
            # e.g. non-string dict keys or circular references deep inside a value: fall back to str() per field
            line = json.dumps({k: v if isinstance(v, str) else str(v) for k, v in doc.items()}, ensure_ascii=False)
        # JSON escapes C0 controls itself; DEL and C1 controls (and U+2028/9) become \u escapes too
        return _JSON_CONTROL.sub(lambda m: f"\\u{ord(m.group()):04x}", line)


_JSON_CONTROL = re.compile(r"[\x7f-\x9f\u2028\u2029]")


def _text_value(value: Any) -> str:
    text = str(value)
    if text == "" or any(c.isspace() or c in '"=' for c in text):
        return visible(json.dumps(text, ensure_ascii=False))
    return visible(text)


class TextFormatter(logging.Formatter):
    """``<ts> <LEVEL> <logger> <message> key=value ...``, with any traceback on the following lines.

    The line is one line whatever the message and the fields hold: their control characters
    (newlines, carriage returns, escape sequences: a channel name stored before they were refused,
    an error text) are written as escapes (:func:`fairqueue.text.visible`), so no value can forge a
    record or colour a terminal. A traceback keeps its own lines, with its other control
    characters escaped."""

    def format(self, record: logging.LogRecord) -> str:
        parts = [_timestamp(record), record.levelname, record.name, visible(record.getMessage())]
        parts.extend(f"{key}={_text_value(value)}" for key, value in _extras(record))
        text = " ".join(parts)
        exc = _exception_text(self, record)
        if exc:
            text += "\n" + visible(exc, keep_newlines=True)
        if record.stack_info:
            text += "\n" + visible(self.formatStack(record.stack_info), keep_newlines=True)
        return text


class _FairqueueHandler(logging.StreamHandler[IO[str]]):
    """Marks the handler :func:`configure_logging` installed, so a second call replaces it. Without a
    stream of its own it writes to the ``sys.stderr`` of the moment of each record, as logging's
    last-resort handler does, never to a stream that was stderr once and may be closed since (a
    worker thread logging after whoever replaced stderr, a test's capture, is done with it)."""

    def __init__(self, stream: IO[str] | None = None) -> None:
        logging.Handler.__init__(self)  # what StreamHandler.__init__ does, but for the stream
        self._own_stream = stream

    @property
    def stream(self) -> IO[str]:
        return self._own_stream if self._own_stream is not None else sys.stderr

    @stream.setter
    def stream(self, value: IO[str]) -> None:  # StreamHandler.__init__ and setStream
        self._own_stream = value if value is not sys.stderr else None


class _ApplicationHandler(_FairqueueHandler):
    """Marks the root logger's handler :func:`log_the_application` installed."""


def _parse_level(level: str | int) -> int:
    if isinstance(level, bool):
        raise ConfigurationError(f"invalid log level {level!r}")
    if isinstance(level, int):
        if level < 0:
            raise ConfigurationError(f"invalid log level {level}: must be >= 0")
        return level
    if level.strip().isdigit():
        return int(level.strip())
    value = logging.getLevelNamesMapping().get(level.strip().upper())
    if value is None:
        raise ConfigurationError(
            f"invalid log level {level!r}; expected one of DEBUG, INFO, WARNING, ERROR, CRITICAL (or a number)"
        )
    return value


def _checked(fmt: str, level: str | int) -> int:
    if fmt not in FORMATS:
        raise ConfigurationError(f"invalid log format {fmt!r}; expected one of {', '.join(FORMATS)}")
    return _parse_level(level)


def _install(logger: logging.Logger, handler: _FairqueueHandler, fmt: str, level: int) -> None:
    """``handler`` (formatted as ``fmt``) on ``logger`` at ``level``, in place of the one installed before."""
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    for old in [h for h in logger.handlers if isinstance(h, type(handler))]:
        logger.removeHandler(old)
        old.close()
    logger.addHandler(handler)
    logger.setLevel(level)


def configure_logging(fmt: str = "text", level: str | int = "INFO", stream: IO[str] | None = None) -> None:
    """Send "fairqueue" log records to ``stream`` (default stderr) as ``fmt`` ("text" or "json") from ``level`` up.

    Calling it again replaces the previous configuration rather than adding a second handler.
    """
    numeric_level = _checked(fmt, level)
    logger = logging.getLogger(LOGGER_NAME)
    _install(logger, _FairqueueHandler(stream), fmt, numeric_level)
    # records already written here must not be printed a second time by a root handler
    logger.propagate = False


def log_the_application(fmt: str = "text", level: str | int = "INFO", stream: IO[str] | None = None) -> bool:
    """In a worker process, show the application's own log records (``logging.getLogger(__name__)`` in a
    task module) like the worker's: to ``stream`` (default stderr), as ``fmt``, from ``level`` up.

    Only if nothing has configured the root logger, that is if it has no handler: a root logger that
    the application set up (``logging.basicConfig`` or ``dictConfig`` in a module the worker imported,
    Django's ``LOGGING`` with a ``root`` entry) is left exactly as it is, and its records go where it
    sends them. Then the root logger gets a handler like the "fairqueue" logger's, and ``level``.
    fairqueue's own records are not printed twice: the "fairqueue" logger does not propagate (see
    :func:`configure_logging`). Calling it again replaces the handler it installed. Returns whether
    the root logger now has that handler.
    """
    numeric_level = _checked(fmt, level)
    root = logging.getLogger()
    if any(not isinstance(h, _ApplicationHandler) for h in root.handlers):
        return False  # configured by the application: not ours to change
    _install(root, _ApplicationHandler(stream), fmt, numeric_level)
    return True
