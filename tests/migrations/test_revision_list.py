"""fairqueue.sql.REVISIONS is the one list of schema revisions: the Alembic chain and the Django
migrations of the schema follow it, step for step."""

from __future__ import annotations

from pathlib import Path

import pytest
from alembic.config import Config
from alembic.script import ScriptDirectory

from fairqueue import migrations, sql


def test_the_alembic_chain_is_the_revision_list() -> None:
    config = Config()
    config.set_main_option("script_location", str(migrations.script_location()))
    scripts = ScriptDirectory.from_config(config)
    chain = list(reversed([s.revision for s in scripts.walk_revisions("base", "heads")]))
    assert chain == [r.id for r in sql.REVISIONS]
    files = sorted(p.name for p in (migrations.script_location() / "versions").glob("fq*.py"))
    assert files == [f"{r.id}_{r.slug}.py" for r in sql.REVISIONS]
    assert migrations.head_revision() == sql.HEAD


def test_the_django_migrations_apply_the_revision_list_in_order(django_url: str) -> None:
    from django.db import connection
    from django.db.migrations.loader import MigrationLoader

    loader = MigrationLoader(connection)
    plan = loader.graph.forwards_plan(("fairqueue", loader.graph.leaf_nodes("fairqueue")[0][1]))
    applied = [
        op.fairqueue_revision
        for key in plan
        if key[0] == "fairqueue"
        for op in loader.graph.nodes[key].operations
        if hasattr(op, "fairqueue_revision")
    ]
    assert applied == [r.id for r in sql.REVISIONS]


def test_every_revision_has_its_delta_files() -> None:
    folder = Path(sql.__file__).parent / "migrations"
    expected = {name for r in sql.REVISIONS for name in (r.up_file, r.down_file)}
    assert {p.name for p in folder.glob("*.sql")} == expected


def test_an_unknown_revision_is_a_clear_error() -> None:
    with pytest.raises(KeyError, match="no fairqueue schema revision 'fq9999'"):
        sql.step_sql("fq9999", "up")
