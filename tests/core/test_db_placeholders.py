"""psycopg's placeholders as asyncpg's: the async API sends fairqueue's named statements (written for
psycopg) through SQLAlchemy's asyncpg driver, which takes $n (fairqueue._db.numbered_placeholders)."""

from __future__ import annotations

from collections import defaultdict

import pytest

from fairqueue._db import numbered_placeholders
from fairqueue.sql import Q, queries


def test_positional_placeholders_are_numbered_in_order() -> None:
    assert numbered_placeholders("SELECT f(%s, %s::jsonb)", ("a", "{}")) == ("SELECT f($1, $2::jsonb)", ("a", "{}"))


def test_a_name_used_twice_is_one_parameter() -> None:
    sql, params = numbered_placeholders(
        "SELECT %(kind)s, coalesce(x, %(timeout)s), %(timeout)s", {"timeout": 5, "kind": "k"}
    )
    assert (sql, params) == ("SELECT $1, coalesce(x, $2), $2", ("k", 5))


def test_a_literal_percent_stays_one_percent() -> None:
    assert numbered_placeholders("SELECT 'a%%b', %s", (1,)) == ("SELECT 'a%b', $1", (1,))


def test_mixed_placeholder_styles_are_refused() -> None:
    with pytest.raises(ValueError, match="mixes"):
        numbered_placeholders("SELECT %s, %(x)s", (1,))


@pytest.mark.parametrize("name", sorted(queries()))
def test_every_named_query_converts_with_no_psycopg_placeholder_left(name: str) -> None:
    """What asyncpg would see of every statement: no %s or %(name)s left over."""
    sql = getattr(Q, name)
    converted, _ = numbered_placeholders(sql, defaultdict(int) if "%(" in sql else ())
    assert "%s" not in converted and "%(" not in converted
