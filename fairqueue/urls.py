"""Database URLs: validation, the forms each library wants, and redaction for anything printed."""

from __future__ import annotations

import os
import re
from urllib.parse import quote, urlsplit, urlunsplit

import psycopg.conninfo

from fairqueue.errors import ConfigurationError

ENV_VAR = "FAIRQUEUE_DATABASE_URL"
_SCHEMES = ("postgresql", "postgres", "postgresql+psycopg")


def redact(url: str) -> str:
    """The URL with any password replaced by ``***`` (safe for logs, errors and status output)."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return "<unparseable URL>"
    if parts.password is None:
        # also catch key=value conninfo strings
        return re.sub(r"(password\s*=\s*)(\S+)", r"\1***", url)
    netloc = parts.netloc.rsplit("@", 1)
    userinfo = netloc[0].split(":", 1)[0]
    return urlunsplit(parts._replace(netloc=f"{userinfo}:***@{netloc[1]}"))


def resolve(url: str | None) -> str:
    """The URL given, else $FAIRQUEUE_DATABASE_URL; validated and in libpq form."""
    chosen = url or os.environ.get(ENV_VAR)
    if not chosen:
        raise ConfigurationError(f"no database URL: pass --database-url or set {ENV_VAR}")
    return to_libpq(chosen)


def to_libpq(url: str) -> str:
    """Checks ``url`` and returns it as a libpq URL (``postgresql://...``), which psycopg accepts."""
    url = url.strip()
    scheme, sep, rest = url.partition("://")
    if not sep or scheme not in _SCHEMES:
        raise ConfigurationError(
            f"malformed database URL {redact(url)!r}: expected postgresql://user:password@host:port/dbname"
        )
    libpq = "postgresql://" + rest
    try:
        given = psycopg.conninfo.conninfo_to_dict(libpq)
    except psycopg.ProgrammingError as exc:
        message = str(exc).replace(url, redact(url)).replace(libpq, redact(libpq))
        raise ConfigurationError(f"malformed database URL {redact(url)!r}: {message}") from None
    for port in str(given.get("port") or "").split(","):
        if port and not (port.isascii() and port.isdigit() and 0 < int(port) < 65536):
            raise ConfigurationError(f"malformed database URL {redact(url)!r}: port {port!r} is not a port number")
    return libpq


def to_sqlalchemy(url: str) -> str:
    """The URL in SQLAlchemy's form, forcing the psycopg 3 driver."""
    return "postgresql+psycopg://" + to_libpq(url).partition("://")[2]


def database_name(url: str) -> str:
    return str(psycopg.conninfo.conninfo_to_dict(to_libpq(url)).get("dbname") or "")


def with_database(url: str, dbname: str) -> str:
    """The same server, another database."""
    parts = urlsplit(to_libpq(url))
    return urlunsplit(parts._replace(path="/" + quote(dbname)))
