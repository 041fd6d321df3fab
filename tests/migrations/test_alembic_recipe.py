"""docs/migrations.md, "Including fairqueue in your own Alembic environment", followed in a fresh
virtualenv where fairqueue is installed as README.md says: `alembic init migrations` with the Alembic
that fairqueue installs, the alembic.ini edit of the page's ``ini`` block, then the page's shell blocks,
run word for word (each block is marked ``<!-- test: tests/migrations/test_alembic_recipe.py#<name> -->``
on the page), against a new database."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any

import psycopg
import pytest

from fairqueue.sql import HEAD, previous
from fairqueue.urls import to_sqlalchemy
from tests.installs import REPO, clean_env, page_block, run_block
from tests.migrations.conftest import INSTALLED

pytestmark = [pytest.mark.slow, INSTALLED]

PAGE = REPO / "docs" / "migrations.md"
TEST = "tests/migrations/test_alembic_recipe.py"
#: what `alembic init` writes, which the page's ini block replaces
INIT_SEPARATOR = "path_separator = os\n"
INIT_URL = re.compile(r"^sqlalchemy\.url = .*$", re.M)
#: the recipe the page gave before: one line, split on ':' by the ini that `alembic init` writes
OLD_LOCATIONS = "version_locations = %(here)s/migrations/versions fairqueue:_alembic/versions\n"


def section() -> str:
    text = PAGE.read_text()
    start = text.index("## Including fairqueue in your own Alembic environment")
    return text[start : text.index("\n## ", start + 1)]


def block(name: str) -> str:
    return page_block(PAGE, TEST, name)


def sh(name: str, project: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """Runs the page's shell block ``name`` in the project; it must succeed."""
    result = run_block(block(name), project, env)
    assert result.returncode == 0, f"{block(name)}\n{result.stdout}\n{result.stderr}"
    assert "Logging error" not in result.stderr, result.stderr  # alembic.ini logs alembic at INFO
    return result


def run(cmd: list[str], project: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, cwd=project, env=env, capture_output=True, text=True, timeout=300)


def rows(url: str, query: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(url) as conn:
        return conn.execute(query).fetchall()


def version_rows(url: str) -> list[str]:
    return sorted(r[0] for r in rows(url, "SELECT version_num FROM alembic_version"))


def schema_revision(url: str) -> str | None:
    [(comment,)] = rows(url, "SELECT obj_description('fairqueue'::regnamespace, 'pg_namespace')")
    found = re.match(r"fairqueue schema at revision (fq[0-9]{4})", comment or "")
    return found[1] if found else None


def fairqueue_version_table(url: str) -> list[str] | None:
    if rows(url, "SELECT to_regclass('fairqueue_alembic_version')") == [(None,)]:
        return None
    return [r[0] for r in rows(url, "SELECT version_num FROM fairqueue_alembic_version")]


@pytest.fixture
def env(readme_install: Path, empty_database_url: str) -> dict[str, str]:
    """A shell with the virtualenv active and FAIRQUEUE_DATABASE_URL naming the new database."""
    return clean_env(readme_install) | {"FAIRQUEUE_DATABASE_URL": empty_database_url}


@pytest.fixture
def initialised(tmp_path: Path, env: dict[str, str], empty_database_url: str) -> Path:
    """A project after `alembic init migrations`, its sqlalchemy.url set to the new database."""
    assert "alembic init migrations" in section()
    project = tmp_path / "project"
    project.mkdir()
    result = run(["alembic", "init", "migrations"], project, env)
    assert result.returncode == 0, result.stderr
    ini = project / "alembic.ini"
    text = ini.read_text()
    assert len(INIT_URL.findall(text)) == 1, text
    url = to_sqlalchemy(empty_database_url).replace("%", "%%")
    ini.write_text(INIT_URL.sub(lambda _: f"sqlalchemy.url = {url}", text))
    return project


@pytest.fixture
def project(initialised: Path) -> Path:
    """The project with the page's alembic.ini edit: its ini block in place of `path_separator = os`."""
    ini = initialised / "alembic.ini"
    text = ini.read_text()
    assert text.count(INIT_SEPARATOR) == 1, "alembic init no longer writes the line the page replaces"
    ini.write_text(text.replace(INIT_SEPARATOR, block("ini")))
    return initialised


def fairqueue_versions(venv: Path) -> Path:
    [folder] = (venv / "lib").glob("python3.*/site-packages/fairqueue/_alembic/versions")
    return folder


def test_the_recipe_installs_fairqueue(
    project: Path, env: dict[str, str], empty_database_url: str, readme_install: Path
) -> None:
    result = sh("upgrade", project, env)
    assert result.stdout.splitlines()[0] == (
        f"alembic.ini: fairqueue's revisions fq0001 to {HEAD} (branch fairqueue) in "
        f"{fairqueue_versions(readme_install)}; yours: 0 revisions in {project / 'migrations' / 'versions'}. "
        "`alembic upgrade heads` installs or upgrades both"
    )
    assert f"Running upgrade {previous(HEAD)} -> {HEAD}," in result.stderr
    assert version_rows(empty_database_url) == [HEAD]
    assert schema_revision(empty_database_url) == HEAD
    assert fairqueue_version_table(empty_database_url) is None
    assert f"{HEAD} (fairqueue) (head)" in run(["alembic", "heads"], project, env).stdout

    # `fairqueue migrate` leaves this database to the project's Alembic, and says so
    refused = run(["fairqueue", "migrate"], project, env)
    assert refused.returncode == 1 and refused.stdout == ""
    assert "your project's Alembic migrates it, not `fairqueue migrate`" in refused.stderr
    assert "run `alembic upgrade fairqueue@head`" in refused.stderr and refused.stderr.count("\n") == 1


def test_the_recipe_the_page_gave_before_installs_nothing_and_the_check_says_why(
    initialised: Path, env: dict[str, str], empty_database_url: str
) -> None:
    ini = initialised / "alembic.ini"
    text = ini.read_text()
    ini.write_text(text.replace("[alembic]\n", "[alembic]\n" + OLD_LOCATIONS, 1))
    assert INIT_SEPARATOR in ini.read_text()

    # what the issue reported: Alembic finds no revision, and says nothing
    assert run(["alembic", "heads"], initialised, env).stdout == ""
    upgrade = run(["alembic", "upgrade", "heads"], initialised, env)
    assert upgrade.returncode == 0, upgrade.stderr
    assert rows(empty_database_url, "SELECT to_regnamespace('fairqueue')") == [(None,)]

    check = run(["fairqueue", "migrate", "--check-alembic", "alembic.ini"], initialised, env)
    assert check.returncode == 1 and check.stdout == ""
    assert check.stderr.count("\n") == 1
    assert check.stderr.startswith(
        "fairqueue: error: alembic.ini splits version_locations on ':' (path_separator = os), which cuts "
        "fairqueue:_alembic/versions apart"
    )
    assert "set `path_separator = newline` and list one location per line" in check.stderr


def test_the_projects_own_branch_goes_up_and_down_alone(
    project: Path, env: dict[str, str], empty_database_url: str, readme_install: Path
) -> None:
    sh("upgrade", project, env)
    shipped = sorted(p.name for p in fairqueue_versions(readme_install).glob("*.py"))
    sh("branch", project, env)
    assert sorted(p.name for p in fairqueue_versions(readme_install).glob("*.py")) == shipped  # nothing written there
    [first] = (project / "migrations" / "versions").glob("*_create_orders.py")
    [second] = (project / "migrations" / "versions").glob("*_add_orders_note.py")
    first_id, second_id = first.name.split("_")[0], second.name.split("_")[0]
    assert "down_revision: Union[str, Sequence[str], None] = None" in first.read_text()
    assert "branch_labels: Union[str, Sequence[str], None] = ('app',)" in first.read_text()
    assert f"down_revision: Union[str, Sequence[str], None] = '{first_id}'" in second.read_text()
    # what the revisions do, as the project writes them
    _bodies(first, "op.execute('CREATE TABLE orders (id serial PRIMARY KEY)')", "op.execute('DROP TABLE orders')")
    _bodies(
        second,
        "op.execute('ALTER TABLE orders ADD COLUMN note text')",
        "op.execute('ALTER TABLE orders DROP COLUMN note')",
    )
    check = run(["fairqueue", "migrate", "--check-alembic", "alembic.ini"], project, env)
    assert check.returncode == 0, check.stderr
    assert f"yours: 2 revisions (heads: {second_id})" in check.stdout

    result = sh("downgrade", project, env)
    assert f"Running upgrade {first_id} -> {second_id}, add orders.note" in result.stderr
    assert f"Running downgrade {first_id} -> , create orders" in result.stderr
    assert rows(empty_database_url, "SELECT to_regclass('public.orders')") == [(None,)]
    assert version_rows(empty_database_url) == [HEAD]
    assert schema_revision(empty_database_url) == HEAD
    assert rows(empty_database_url, "SELECT count(*) FROM pg_tables WHERE schemaname = 'fairqueue'")[0][0] > 10


def _bodies(script: Path, upgrade: str, downgrade: str) -> None:
    text = script.read_text()
    for name, body in (("upgrade", upgrade), ("downgrade", downgrade)):
        text, n = re.subn(rf'(def {name}\(\)[^\n]*:\n(?:    """[^\n]*"""\n)?)    pass\n', rf"\g<1>    {body}\n", text)
        assert n == 1, text
    script.write_text(text)


def test_a_plain_alembic_revision_lands_in_fairqueues_folder_and_the_check_says_so(
    project: Path, env: dict[str, str], readme_install: Path
) -> None:
    """Why the page makes the project's revisions with --head base and --version-path."""
    made = run(["alembic", "revision", "-m", "oops"], project, env)
    assert made.returncode == 0, made.stderr
    [stray] = fairqueue_versions(readme_install).glob("*_oops.py")
    try:
        check = run(["fairqueue", "migrate", "--check-alembic", "alembic.ini"], project, env)
        assert check.returncode == 1 and check.stderr.count("\n") == 1
        assert f"({stray}) is in fairqueue's folder, where reinstalling fairqueue loses it" in check.stderr
    finally:
        stray.unlink()


@pytest.mark.parametrize("revision", ["fq0005", HEAD])
def test_adopting_a_database_that_fairqueue_migrate_set_up(
    project: Path, env: dict[str, str], empty_database_url: str, revision: str
) -> None:
    done = run(["fairqueue", "migrate", "--revision", revision], project, env)
    assert done.returncode == 0, done.stderr
    [(job_table,)] = rows(empty_database_url, "SELECT 'fairqueue.job'::regclass::oid")
    # the project has its own branch, applied already
    sh("branch", project, env)
    mine = run(["alembic", "upgrade", "app@head"], project, env)
    assert mine.returncode == 0, mine.stderr
    [app_head] = version_rows(empty_database_url)

    result = sh("adopt", project, env)
    assert "your project's Alembic migrates it from now on" in result.stdout
    assert version_rows(empty_database_url) == sorted([app_head, HEAD])
    assert schema_revision(empty_database_url) == HEAD
    assert fairqueue_version_table(empty_database_url) is None
    assert rows(empty_database_url, "SELECT 'fairqueue.job'::regclass::oid") == [(job_table,)]  # nothing re-created
    again = run(["fairqueue", "migrate"], project, env)
    assert again.returncode == 1 and "run `alembic upgrade fairqueue@head`" in again.stderr


def test_handing_the_schema_back_to_fairqueue_migrate(
    project: Path, env: dict[str, str], empty_database_url: str
) -> None:
    sh("upgrade", project, env)
    result = sh("take-over", project, env)
    assert "`fairqueue migrate` migrates it from now on" in result.stdout
    assert version_rows(empty_database_url) == []
    assert fairqueue_version_table(empty_database_url) == [HEAD]
    ini = project / "alembic.ini"
    ini.write_text(ini.read_text().replace("    fairqueue:_alembic/versions\n", ""))  # out of version_locations
    assert run(["alembic", "heads"], project, env).stdout == ""
    again = run(["fairqueue", "migrate"], project, env)
    assert again.returncode == 0, again.stderr
    assert again.stdout.strip().endswith(f"is already at head ({HEAD}): nothing to do")
