"""The wheel carries everything a pip-installed fairqueue needs to migrate a database, and README.md's
"Installing" commands (`make wheel`, then pip install the wheel with extras) give a working fairqueue."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from fairqueue import migrations
from tests.installs import build_wheel, clean_env
from tests.migrations.conftest import INSTALLED

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow  # independent of the PostgreSQL version: not repeated on 15


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_wheel(tmp_path_factory.mktemp("wheel"))


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
    """A project lists fairqueue's versions in its own version_locations, in an alembic.ini without
    path_separator (as older Alembics wrote it: the list is split on spaces). The ini that today's
    `alembic init` writes, as docs/migrations.md edits it: tests/migrations/test_alembic_recipe.py."""
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


# -- README.md, "Installing" ---------------------------------------------------------------------------


@INSTALLED
def test_the_readme_install_gives_a_working_fairqueue(
    readme_install: Path, tmp_path: Path, empty_database_url: str
) -> None:
    env = clean_env(readme_install)
    code = "import django, fairqueue, fairqueue_django; print(fairqueue.__file__)"
    where = subprocess.run(["python", "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert where.returncode == 0, where.stderr
    assert where.stdout.strip().startswith(str(readme_install / "lib")), where.stdout  # the wheel, with its extra
    result = subprocess.run(
        ["fairqueue", "migrate", "--database-url", empty_database_url],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().endswith(f"is at head ({migrations.head_revision()})")


#: `pip install fairqueue`, `pip install "fairqueue[django]"`: from the index, where fairqueue is not yet
FROM_THE_INDEX = re.compile(r"pip install +[\"']?fairqueue(\[[a-z,]+\])?[\"']?(\s|$)", re.M)


def test_no_page_installs_fairqueue_from_the_index() -> None:
    pages = [REPO / "README.md", *(REPO / "docs").glob("*.md"), *(REPO / "examples").rglob("*.md")]
    offenders = sorted(str(p.relative_to(REPO)) for p in pages if FROM_THE_INDEX.search(p.read_text()))
    assert offenders == [], "install the wheel as README.md says (Installing)"
