"""``fairqueue migrate --check-alembic alembic.ini`` reads a project's alembic.ini as the installed
Alembic does and names, on one line, what would make ``alembic upgrade heads`` silently install nothing
or put the project's revisions on fairqueue's branch. (With the wheel installed and a real `alembic
init`: tests/migrations/test_alembic_recipe.py.)

Here fairqueue runs from the source tree, whose revisions are the folder ``alembic/versions`` (the
wheel's ``fairqueue:_alembic/versions``); a copy of that folder stands in for the installed one."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from fairqueue import migrations, sql
from fairqueue.alembic_check import LOCATION, AlembicConfigError, check_alembic_ini
from fairqueue.cli import main

USER_REVISION = """
revision = {revision!r}
down_revision = {down!r}
branch_labels = {labels!r}
depends_on = None


def upgrade():
    pass


def downgrade():
    pass
"""


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """A project folder: migrations/ (env.py, versions/ with one revision of its own) and fairqueue's
    revisions in fairqueue-versions/."""
    (tmp_path / "migrations" / "versions").mkdir(parents=True)
    (tmp_path / "migrations" / "env.py").write_text("")
    _revision(tmp_path / "migrations" / "versions", "app001", None, ("app",))
    shutil.copytree(migrations.script_location() / "versions", tmp_path / "fairqueue-versions")
    return tmp_path


def _revision(folder: Path, revision: str, down: str | None, labels: tuple[str, ...] | None = None) -> Path:
    path = folder / f"{revision}_x.py"
    path.write_text(USER_REVISION.format(revision=revision, down=down, labels=labels))
    return path


def _ini(project: Path, alembic_section: str) -> str:
    path = project / "alembic.ini"
    path.write_text("[alembic]\nscript_location = %(here)s/migrations\n" + alembic_section)
    return str(path)


NEWLINES = "path_separator = newline\nversion_locations =\n    %(here)s/migrations/versions\n    {fairqueue}\n"


def test_one_location_per_line_finds_both_branches(project: Path) -> None:
    ini = _ini(project, NEWLINES.format(fairqueue="%(here)s/fairqueue-versions"))
    assert check_alembic_ini(ini) == (
        f"{ini}: fairqueue's revisions fq0001 to {sql.HEAD} (branch fairqueue) in {project / 'fairqueue-versions'}; "
        f"yours: 1 revision (heads: app001) in {project / 'migrations' / 'versions'}. `alembic upgrade heads` "
        "installs or upgrades both"
    )


def test_path_separator_os_cuts_the_package_location_apart(project: Path) -> None:
    """What the ini of `alembic init` (path_separator = os) does to the location on one line or on two."""
    for locations in (
        f"%(here)s/migrations/versions {LOCATION}",
        f"\n    %(here)s/migrations/versions\n    {LOCATION}",
    ):
        ini = _ini(project, f"path_separator = os\nversion_locations = {locations}\n")
        with pytest.raises(AlembicConfigError) as caught:
            check_alembic_ini(ini)
        message = str(caught.value)
        assert message.startswith(f"{ini} splits version_locations on ':' (path_separator = os), which cuts {LOCATION}")
        assert message.endswith(
            "set `path_separator = newline` and list one location per line (see docs/migrations.md, 'Including "
            "fairqueue in your own Alembic environment')"
        )
        assert "\n" not in message


def test_a_missing_location_is_named(project: Path) -> None:
    ini = _ini(project, NEWLINES.format(fairqueue="%(here)s/nowhere"))
    with pytest.raises(AlembicConfigError, match=r"the version location '.*/nowhere' is not a folder: Alembic skips"):
        check_alembic_ini(ini)
    ini = _ini(project, NEWLINES.format(fairqueue="no_such_package:_alembic/versions"))
    with pytest.raises(AlembicConfigError, match="'no_such_package:_alembic/versions' is not a folder"):
        check_alembic_ini(ini)


def test_no_fairqueue_location(project: Path) -> None:
    ini = _ini(project, "path_separator = newline\nversion_locations = %(here)s/migrations/versions\n")
    with pytest.raises(AlembicConfigError, match=f"holds fairqueue's revisions: add {LOCATION}"):
        check_alembic_ini(ini)
    ini = _ini(project, "path_separator = os\n")
    with pytest.raises(AlembicConfigError, match=r"has no version_locations: list your own versions folder and"):
        check_alembic_ini(ini)


def test_only_fairqueues_location(project: Path) -> None:
    ini = _ini(project, "path_separator = newline\nversion_locations = %(here)s/fairqueue-versions\n")
    with pytest.raises(AlembicConfigError, match="lists only fairqueue's revisions in version_locations"):
        check_alembic_ini(ini)


def test_an_older_copy_of_fairqueues_revisions(project: Path) -> None:
    (project / "fairqueue-versions" / f"{sql.HEAD}_{sql.REVISIONS[-1].slug}.py").unlink()
    ini = _ini(project, NEWLINES.format(fairqueue="%(here)s/fairqueue-versions"))
    with pytest.raises(AlembicConfigError, match=f"revisions up to {sql.REVISIONS[-2].id} in .* end at {sql.HEAD}"):
        check_alembic_ini(ini)


def test_a_revision_written_into_fairqueues_folder(project: Path) -> None:
    """What a plain `alembic revision -m x` does once fairqueue's location is listed."""
    stray = _revision(project / "fairqueue-versions", "abc123", sql.HEAD)
    ini = _ini(project, NEWLINES.format(fairqueue="%(here)s/fairqueue-versions"))
    with pytest.raises(AlembicConfigError) as caught:
        check_alembic_ini(ini)
    assert str(caught.value) == (
        f"your revision abc123 ({stray}) is in fairqueue's folder, where reinstalling fairqueue loses it, and "
        "continues fairqueue's branch: make your revisions with `alembic revision --head base --branch-label "
        "<name> --version-path <your versions folder>` (see docs/migrations.md, 'Including fairqueue in your own "
        "Alembic environment')"
    )


def test_a_revision_of_the_project_on_fairqueues_branch(project: Path) -> None:
    stray = _revision(project / "migrations" / "versions", "app002", sql.HEAD)
    ini = _ini(project, NEWLINES.format(fairqueue="%(here)s/fairqueue-versions"))
    with pytest.raises(AlembicConfigError) as caught:
        check_alembic_ini(ini)
    assert str(caught.value) == (
        f"your revision app002 ({stray}) continues fairqueue's branch (its down_revision is {sql.HEAD}): your "
        "revisions need a branch of their own (`alembic revision --head base --branch-label <name>`) (see "
        "docs/migrations.md, 'Including fairqueue in your own Alembic environment')"
    )


def test_not_an_alembic_ini(tmp_path: Path) -> None:
    with pytest.raises(AlembicConfigError, match=r"^no such file: .*missing\.ini$"):
        check_alembic_ini(str(tmp_path / "missing.ini"))
    (tmp_path / "setup.cfg").write_text("[metadata]\nname = x\n")
    with pytest.raises(AlembicConfigError, match=r"setup.cfg has no \[alembic\] section: is it an alembic.ini\?"):
        check_alembic_ini(str(tmp_path / "setup.cfg"))


def test_the_command_prints_the_finding_or_refuses(project: Path, capsys: pytest.CaptureFixture[str]) -> None:
    good = _ini(project, NEWLINES.format(fairqueue="%(here)s/fairqueue-versions"))
    assert main(["migrate", "--check-alembic", good]) == 0
    out, err = capsys.readouterr()
    assert out == check_alembic_ini(good) + "\n" and err == ""
    bad = _ini(project, f"path_separator = os\nversion_locations = %(here)s/migrations/versions {LOCATION}\n")
    assert main(["migrate", "--check-alembic", bad]) == 1
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1
    assert err.startswith(f"fairqueue: error: {bad} splits version_locations on ':'")
