"""A libpq URL for a Django database's settings (the worker opens its own connections)."""

from __future__ import annotations

from typing import Any
from urllib.parse import quote, urlencode

# OPTIONS of Django's PostgreSQL backend that are libpq connection parameters (the others, such as
# "pool" or "isolation_level", are Django's own and do not belong in a URL)
LIBPQ_OPTIONS = frozenset(
    {
        "sslmode",
        "sslrootcert",
        "sslcert",
        "sslkey",
        "sslpassword",
        "sslcrl",
        "connect_timeout",
        "options",
        "target_session_attrs",
        "application_name",
        "keepalives",
        "keepalives_idle",
        "keepalives_interval",
        "keepalives_count",
        "tcp_user_timeout",
        "gssencmode",
        "service",
        "passfile",
        "channel_binding",
    }
)


def database_url(settings: dict[str, Any]) -> str:
    """``postgresql://user:password@host:port/name?options`` for a DATABASES entry; a socket
    directory as HOST goes into the query, as libpq expects."""
    user = quote(str(settings.get("USER") or ""), safe="")
    password = quote(str(settings.get("PASSWORD") or ""), safe="")
    host = str(settings.get("HOST") or "")
    port = str(settings.get("PORT") or "")
    query: dict[str, str] = {}
    netloc_host = host
    if host.startswith("/"):
        query["host"] = host
        netloc_host = ""
    if port and not netloc_host:
        query["port"] = port
    elif port:
        netloc_host = f"{netloc_host}:{port}"
    for key, value in (settings.get("OPTIONS") or {}).items():
        if key in LIBPQ_OPTIONS and isinstance(value, str | int) and not isinstance(value, bool):
            query[key] = str(value)
    auth = f"{user}:{password}@" if password else (f"{user}@" if user else "")
    url = f"postgresql://{auth}{netloc_host}/{quote(str(settings.get('NAME') or ''), safe='')}"
    return url + ("?" + urlencode(query) if query else "")
