"""fairqueue/roles.py names the schema's functions and tables by hand; they must be the schema's."""

from __future__ import annotations

import psycopg

from fairqueue import roles

#: Public functions no role level is granted: run by the schema's owner only, and why.
OWNER_ONLY: dict[str, str] = {}


def test_every_public_function_belongs_to_a_level_and_every_listed_one_exists(migrated_url: str) -> None:
    with psycopg.connect(migrated_url) as conn:
        names = {
            row[0]
            for row in conn.execute(
                "SELECT p.proname FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace "
                "WHERE n.nspname = 'fairqueue'"
            )
        }
    public = {name for name in names if not name.startswith("_")}
    granted = set(roles.FUNCTIONS["admin"])
    assert granted - public == set(), "roles.py grants functions the schema does not have"
    assert public - granted - set(OWNER_ONLY) == set(), "functions of the schema no role level may run"
    # each level includes the one below it
    assert set(roles.FUNCTIONS["producer"]) <= set(roles.FUNCTIONS["worker"]) <= set(roles.FUNCTIONS["admin"])


def test_every_table_of_the_schema_is_readable_by_the_roles(migrated_url: str) -> None:
    with psycopg.connect(migrated_url) as conn:
        tables = {
            row[0]
            for row in conn.execute(
                "SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
                "WHERE n.nspname = 'fairqueue' AND c.relkind IN ('r', 'p') AND NOT c.relispartition"
            )
        }
    assert set(roles.READABLE_TABLES) == tables
