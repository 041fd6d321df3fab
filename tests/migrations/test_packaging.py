"""The wheel carries everything a pip-installed fairqueue needs to migrate a database."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from fairqueue import migrations

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow  # independent of the PostgreSQL version: not repeated on 15


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(out), str(REPO)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    [built] = out.glob("fairqueue-*.whl")
    return built


@pytest.fixture
def site(wheel: Path, tmp_path: Path) -> Path:
    """The wheel unpacked, as pip would install it (and nothing from the source tree)."""
    target = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(target)
    return target


def test_wheel_ships_the_migrations_and_sql(wheel: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    assert "fairqueue/_alembic/env.py" in names
    assert "fairqueue/_alembic/versions/fq0001_initial.py" in names
    assert "fairqueue/sql/migrations/v0001_up.sql" in names
    assert "fairqueue/sql/migrations/v0001_down.sql" in names
    assert "fairqueue/sql/schema/30_claim.sql" in names  # the current schema, as schema/ defines it
    assert "fairqueue/sql/queries/consumer.sql" in names  # the named queries
    assert "fairqueue_django/__init__.py" in names


def test_installed_wheel_migrates_a_database(site: Path, tmp_path: Path, empty_database_url: str) -> None:
    code = (
        "import sys; sys.path.insert(0, sys.argv[1]); import fairqueue, fairqueue.migrations as m; "
        "assert fairqueue.__file__.startswith(sys.argv[1]), fairqueue.__file__; "
        "print(m.script_location()); m.upgrade(sys.argv[2])"
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    result = subprocess.run(
        [sys.executable, "-c", code, str(site), empty_database_url],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == str(site / "fairqueue" / "_alembic")
    assert migrations.current_revision(empty_database_url) == migrations.head_revision()


USER_ENV = """
import os
import sqlalchemy as sa
from alembic import context

url = os.environ["APP_DATABASE_URL"].replace("postgresql://", "postgresql+psycopg://", 1)
engine = sa.create_engine(url, poolclass=sa.pool.NullPool)
with engine.connect() as conn:
    context.configure(connection=conn, target_metadata=None)
    with context.begin_transaction():
        context.run_migrations()
"""

USER_REVISION = """
from alembic import op

revision = "app001"
down_revision = None
branch_labels = ("app",)
depends_on = None


def upgrade():
    op.execute("CREATE TABLE public.orders (id serial PRIMARY KEY)")


def downgrade():
    op.execute("DROP TABLE public.orders")
"""


def test_fairqueue_revisions_in_a_projects_own_alembic_environment(
    site: Path, tmp_path: Path, empty_database_url: str
) -> None:
    """docs/migrations.md: a project lists fairqueue's versions in its own version_locations."""
    project = tmp_path / "project"
    (project / "migrations" / "versions").mkdir(parents=True)
    (project / "alembic.ini").write_text(
        "[alembic]\n"
        "script_location = %(here)s/migrations\n"
        "version_locations = %(here)s/migrations/versions fairqueue:_alembic/versions\n"
    )
    (project / "migrations" / "env.py").write_text(USER_ENV)
    (project / "migrations" / "versions" / "app001_orders.py").write_text(USER_REVISION)
    env = {**os.environ, "PYTHONPATH": str(site), "APP_DATABASE_URL": empty_database_url}
    result = subprocess.run(
        [sys.executable, "-m", "alembic", "upgrade", "heads"],
        cwd=project,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    import psycopg

    with psycopg.connect(empty_database_url) as c:
        heads = sorted(r[0] for r in c.execute("SELECT version_num FROM alembic_version"))
        assert heads == ["app001", migrations.head_revision()]
        assert c.execute("SELECT to_regclass('fairqueue.running_job'), to_regclass('public.orders')").fetchone() == (
            "fairqueue.running_job",
            "orders",
        )
