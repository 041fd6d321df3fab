"""Database URLs: validation, the forms each library wants, and redaction for anything printed."""

from __future__ import annotations

import os
import re
from urllib.parse import quote, unquote, urlsplit, urlunsplit

import psycopg.conninfo

from fairqueue.errors import ConfigurationError

ENV_VAR = "FAIRQUEUE_DATABASE_URL"
_SCHEMES = ("postgresql", "postgres", "postgresql+psycopg")


_URL_START = re.compile(r"^\s*[A-Za-z][A-Za-z0-9+.-]*://")
# password=VALUE in a query string: up to the next parameter
_QUERY_PASSWORD = re.compile(r"([?&]password=)[^&]*", re.IGNORECASE)
# password=VALUE in a key=value conninfo string: a quoted value, or up to the next key= (a value
# with a space is malformed, but still somebody's password)
_CONNINFO_PASSWORD = re.compile(
    r"(\bpassword\s*=\s*)('(?:[^'\\]|\\.)*'?|.*?(?=\s+[A-Za-z_]+\s*=|$))", re.IGNORECASE | re.DOTALL
)
MASK = "***"


def _userinfo_password(url: str) -> tuple[int, int] | None:
    """Where the password of ``scheme://user:password@host...`` is: everything between the first
    ":" after the scheme and the last "@", whatever it contains ("#", "/", "?", spaces)."""
    start = _URL_START.match(url)
    if start is None:
        return None
    at = url.rfind("@", start.end())
    if at < 0:
        return None
    colon = url.find(":", start.end(), at)
    if colon < 0:
        return None
    return colon + 1, at


def _secret_spans(url: str) -> list[tuple[int, int]]:
    """Where the passwords are in ``url`` (userinfo, query string, key=value)."""
    spans = []
    userinfo = _userinfo_password(url)
    if userinfo is not None:
        spans.append(userinfo)
    spans += [(m.start(0) + len(m.group(1)), m.end(0)) for m in _QUERY_PASSWORD.finditer(url)]
    spans += [m.span(2) for m in _CONNINFO_PASSWORD.finditer(url)]
    return [(a, b) for a, b in spans if b > a]


def _secrets(url: str) -> list[str]:
    """The password texts in ``url``, as written and percent-decoded, longest first."""
    found = [url[a:b] for a, b in _secret_spans(url)]
    found += [unquote(text) for text in found]
    found += [text.strip("'") for text in found]
    return sorted({text for text in found if text}, key=len, reverse=True)


def redact(url: str) -> str:
    """The URL with any password replaced by ``***`` (safe for logs, errors and status output).

    Parses nothing: a URL too broken to parse (a "#" or "/" in the password, a space, a bad
    percent-escape) is masked just as well."""
    text = str(url)
    span = _userinfo_password(text)
    if span is not None:
        text = text[: span[0]] + MASK + text[span[1] :]
    text = _QUERY_PASSWORD.sub(lambda m: m.group(1) + MASK, text)
    return _CONNINFO_PASSWORD.sub(lambda m: m.group(1) + MASK, text)


_QUOTED = re.compile(r"\"([^\"]*)\"|'([^']*)'")


def scrub(message: str, url: str | None) -> str:
    """``message`` (e.g. a driver's error about ``url``) with the URL redacted and no text of its
    password left: neither the password itself nor a quoted piece of it."""
    if not url:
        return message
    message = message.replace(url, redact(url))
    secrets = _secrets(url)
    spans = _secret_spans(url)

    def overlaps_a_password(piece: str) -> bool:
        if len(piece) < 3:
            return False  # too short to give anything away, and found everywhere
        if any(piece in secret or secret in piece for secret in secrets):
            return True
        at = url.find(piece)
        while at >= 0:  # a piece of the URL that straddles a password's edge
            if any(at < b and a < at + len(piece) for a, b in spans):
                return True
            at = url.find(piece, at + 1)
        return False

    def quoted(m: re.Match[str]) -> str:
        inner = m.group(1) if m.group(1) is not None else m.group(2)
        if inner and overlaps_a_password(inner):
            return m.group(0)[0] + MASK + m.group(0)[-1]
        return m.group(0)

    message = _QUOTED.sub(quoted, message)
    for secret in secrets:
        if len(secret) >= 6:
            message = message.replace(secret, MASK)
        else:  # a short one only where it stands alone, not inside every word that contains it
            message = re.sub(rf"(?<![A-Za-z0-9]){re.escape(secret)}(?![A-Za-z0-9])", MASK, message)
    return message


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
        message = scrub(scrub(" ".join(str(exc).split()), url), libpq)
        raise ConfigurationError(f"malformed database URL {redact(url)!r}: {message}") from None
    for port in str(given.get("port") or "").split(","):
        if port and not (port.isascii() and port.isdigit() and 0 < int(port) < 65536):
            problem = scrub(f"port {port!r} is not a port number", url)
            raise ConfigurationError(f"malformed database URL {redact(url)!r}: {problem}")
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
