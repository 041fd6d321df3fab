"""``fairqueue migrate``: upgrades by default and again does nothing; moves down only when asked, and
drops data only when that is confirmed too; says which revision a database is at; refuses, saying what
to run, a schema that a project's own Alembic migrates; hands the schema to that Alembic and back.

Each path checks its exit status (0 done or nothing to do, 1 refused, 2 a usage error), its message
(one line) and that a refused request changed nothing. A project's own Alembic is simulated here by
its version table (``alembic_version``, which `alembic stamp` and `alembic upgrade` write);
tests/migrations/test_alembic_recipe.py runs the real thing."""

from __future__ import annotations

import shlex
from collections.abc import Callable
from typing import Any

import psycopg
import pytest

import fairqueue
from fairqueue import migrations, sql
from fairqueue.cli import main
from fairqueue.errors import ConfigurationError
from tests.installs import REPO, page_block

Run = Callable[..., tuple[int, str, str]]


@pytest.fixture
def migrate(empty_database_url: str, capsys: pytest.CaptureFixture[str]) -> Run:
    """Runs ``fairqueue migrate ARGS --database-url <a new database>``: (exit status, stdout, stderr)."""

    def run(*argv: str) -> tuple[int, str, str]:
        capsys.readouterr()
        try:
            code = main(["migrate", *argv, "--database-url", empty_database_url])
        except SystemExit as exc:  # argparse's usage errors
            code = int(exc.code or 0)
        out, err = capsys.readouterr()
        return code, out, err

    return run


def _error(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("fairqueue: error: ") and "Traceback" not in err, err
    return lines[0]


def _sql(url: str, statement: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    with psycopg.connect(url, autocommit=True) as conn:
        cur = conn.execute(statement, params)
        return cur.fetchall() if cur.description else []


def _state(url: str) -> tuple[str | None, str | None]:
    """(the revision the schema records, the revision fairqueue_alembic_version holds)."""
    state = migrations.schema_state(url)
    return state.revision, state.tracked


def _has_column(url: str, table: str, column: str) -> bool:
    query = (
        "SELECT 1 FROM information_schema.columns "
        "WHERE table_schema = 'fairqueue' AND table_name = %s AND column_name = %s"
    )
    return bool(_sql(url, query, (table, column)))


def _as_if_a_projects_alembic_migrated_it(url: str) -> None:
    """What a project's own Alembic leaves: fairqueue's revision in alembic_version, no fairqueue_alembic_version."""
    _sql(url, "ALTER TABLE fairqueue_alembic_version RENAME TO alembic_version")
    _sql(url, "ALTER TABLE alembic_version RENAME CONSTRAINT fairqueue_alembic_version_pkc TO alembic_version_pkc")


# -- upgrading ------------------------------------------------------------------------------------------


def test_the_commands_of_the_page_in_order(migrate: Run, empty_database_url: str) -> None:
    """docs/migrations.md, "Running them": each `fairqueue migrate` line, in order, on a new database (the
    block's `export` names the database; here it is the test's)."""
    block = page_block(REPO / "docs" / "migrations.md", "tests/migrations/test_migrate_command.py", "commands")
    commands = [shlex.split(line, comments=True) for line in block.splitlines() if line.startswith("fairqueue ")]
    assert len(commands) == 5
    outcomes = []
    for command in commands:
        assert command[:2] == ["fairqueue", "migrate"]
        code, out, err = migrate(*command[2:])
        assert (code, err) == (0, ""), command
        outcomes.append(out.splitlines()[-1])
    assert outcomes == [
        f"fairqueue schema in {empty_database_url} is at head ({sql.HEAD})",
        sql.HEAD,
        f"fairqueue schema in {empty_database_url} is at fq0007",
        f"fairqueue schema in {empty_database_url} is at fq0008",
        f"fairqueue schema in {empty_database_url} is at base (nothing installed)",
    ]


def test_migrate_upgrades_to_head_and_then_has_nothing_to_do(migrate: Run, empty_database_url: str) -> None:
    code, out, err = migrate()
    assert (code, err) == (0, "")
    assert out.strip().endswith(f"is at head ({sql.HEAD})")
    code, out, err = migrate()
    assert (code, err) == (0, "")
    assert out.strip().endswith(f"is already at head ({sql.HEAD}): nothing to do")
    assert _state(empty_database_url) == (sql.HEAD, sql.HEAD)


def test_migrate_to_a_revision_upgrades_to_it(migrate: Run, empty_database_url: str) -> None:
    code, out, _ = migrate("--revision", "fq0005")
    assert code == 0 and out.strip().endswith("is at fq0005")
    assert _state(empty_database_url) == ("fq0005", "fq0005")
    code, out, _ = migrate("--revision", "fq0005")
    assert code == 0 and out.strip().endswith("is already at fq0005: nothing to do")


# -- which revision -------------------------------------------------------------------------------------


def test_current_prints_the_revision_alone(migrate: Run) -> None:
    code, out, err = migrate("--current")
    assert (code, out) == (1, "")
    assert "there is no fairqueue schema in" in _error(err)
    migrate("--revision", "fq0006")
    assert migrate("--current") == (0, "fq0006\n", "")


# -- moving down --------------------------------------------------------------------------------------------


def test_a_revision_below_the_current_one_is_refused_without_downgrade(migrate: Run, empty_database_url: str) -> None:
    migrate("--revision", "fq0008")  # (below fq0008, the next step down drops nothing)
    code, out, err = migrate("--revision", "fq0007")
    assert (code, out) == (1, "")
    assert _error(err).endswith(
        f"fq0007 is below the revision of {empty_database_url} (fq0008): to move down, run "
        "`fairqueue migrate --revision fq0007 --downgrade`; nothing was changed"
    )
    migrate()
    code, _, err = migrate("--revision", "fq0001")
    assert code == 1
    assert "run `fairqueue migrate --revision fq0001 --downgrade --yes-drop-data`" in _error(err)
    code, _, err = migrate("--revision", "base")
    assert code == 1
    assert "run `fairqueue migrate --revision base --downgrade --yes-drop-data`" in _error(err)
    assert _state(empty_database_url) == (sql.HEAD, sql.HEAD)


def test_a_downgrade_that_drops_nothing_needs_only_the_flag(migrate: Run, empty_database_url: str) -> None:
    migrate("--revision", "fq0008")
    assert sql.dropped_by("fq0008") == ()
    code, out, err = migrate("--revision", "fq0007", "--downgrade")
    assert (code, err) == (0, "")
    assert out.strip().endswith("is at fq0007") and "dropping" not in out
    assert _state(empty_database_url) == ("fq0007", "fq0007")


def test_a_downgrade_that_drops_data_says_what_and_needs_confirmation(migrate: Run, empty_database_url: str) -> None:
    migrate("--revision", "fq0007")
    code, out, err = migrate("--revision", "fq0005", "--downgrade")
    assert (code, out) == (1, "")
    assert _error(err).endswith(
        f"moving {empty_database_url} down from fq0007 to fq0005 drops column fairqueue.periodic_schedule.resumed_at; "
        "table fairqueue.channel_debt: add --yes-drop-data to do it; nothing was changed"
    )
    assert _state(empty_database_url) == ("fq0007", "fq0007")
    assert _has_column(empty_database_url, "periodic_schedule", "resumed_at")

    code, out, err = migrate("--revision", "fq0005", "--downgrade", "--yes-drop-data")
    assert (code, err) == (0, "")
    assert out.splitlines() == [
        f"moving {empty_database_url} down from fq0007 to fq0005: dropping column "
        "fairqueue.periodic_schedule.resumed_at; table fairqueue.channel_debt",
        f"fairqueue schema in {empty_database_url} is at fq0005",
    ]
    assert _state(empty_database_url) == ("fq0005", "fq0005")
    assert not _has_column(empty_database_url, "periodic_schedule", "resumed_at")


def test_removing_fairqueue_needs_downgrade_and_confirmation(migrate: Run, empty_database_url: str) -> None:
    migrate()
    with psycopg.connect(empty_database_url, autocommit=True) as conn:
        fairqueue.enqueue(conn, "kept.until.confirmed")
    code, out, err = migrate("--revision", "base", "--downgrade")
    assert (code, out) == (1, "")
    assert (
        f"down from {sql.HEAD} to base drops the schema fairqueue (every job, all history, channels, schedules and "
        "workers): add --yes-drop-data to do it; nothing was changed" in _error(err)
    )
    assert _sql(empty_database_url, "SELECT kind FROM fairqueue.job") == [("kept.until.confirmed",)]

    code, out, err = migrate("--revision", "base", "--downgrade", "--yes-drop-data")
    assert (code, err) == (0, "")
    assert out.splitlines() == [
        f"moving {empty_database_url} down from {sql.HEAD} to base: dropping the schema fairqueue (every job, all "
        "history, channels, schedules and workers)",
        f"fairqueue schema in {empty_database_url} is at base (nothing installed)",
    ]
    assert _sql(empty_database_url, "SELECT to_regnamespace('fairqueue')") == [(None,)]
    code, out, _ = migrate("--revision", "base", "--downgrade")
    assert code == 0 and out.strip().endswith("is already at base (nothing installed): nothing to do")


def test_downgrade_to_a_revision_above_the_current_one_is_refused(migrate: Run, empty_database_url: str) -> None:
    migrate("--revision", "fq0005")
    code, out, err = migrate("--revision", "fq0008", "--downgrade")
    assert (code, out) == (1, "")
    assert _error(err).endswith(
        f"fq0008 is above the revision of {empty_database_url} (fq0005): --downgrade only moves down, leave it "
        "out to upgrade; nothing was changed"
    )
    assert _state(empty_database_url) == ("fq0005", "fq0005")


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["--revision", "fq0042"],
            "argument --revision: unknown revision 'fq0042': fairqueue's revisions are fq0001 to "
            f"{sql.HEAD}, head and base",
        ),
        (["--revision", "-1"], "argument --revision: unknown revision '-1'"),
        (["--downgrade"], "--downgrade needs --revision (the revision to move down to, or base)"),
        (["--revision", "fq0001", "--yes-drop-data"], "--yes-drop-data goes with --downgrade"),
        (["--current", "--revision", "fq0001"], "--current takes no --revision, --downgrade or --yes-drop-data"),
        (["--hand-over", "--downgrade"], "--hand-over takes no --revision, --downgrade or --yes-drop-data"),
        (["--current", "--take-over"], "argument --take-over: not allowed with argument --current"),
    ],
)
def test_usage_errors_are_one_line(migrate: Run, empty_database_url: str, argv: list[str], message: str) -> None:
    code, out, err = migrate(*argv)
    assert (code, out) == (2, "")
    assert message in _error(err)
    assert migrations.schema_state(empty_database_url).exists is False


# -- a schema that a project's own Alembic migrates ---------------------------------------------------------


def test_a_schema_migrated_by_a_projects_alembic_is_refused_with_what_to_run(
    migrate: Run, empty_database_url: str
) -> None:
    migrations.upgrade(empty_database_url, "fq0007")
    _as_if_a_projects_alembic_migrated_it(empty_database_url)
    for argv in ([], ["--revision", "base", "--downgrade", "--yes-drop-data"]):
        code, out, err = migrate(*argv)
        assert (code, out) == (1, "")
        assert _error(err).endswith(
            f"fairqueue's schema in {empty_database_url} is at fq0007 and your project's Alembic migrates it, not "
            "`fairqueue migrate` (fairqueue_alembic_version records nothing): run `alembic upgrade fairqueue@head`, "
            "or hand it to `fairqueue migrate` with `alembic stamp fairqueue@base` then `fairqueue migrate "
            "--take-over`; nothing was changed"
        )
    assert migrate("--current") == (0, "fq0007\n", "")
    with pytest.raises(migrations.MigrationRefused, match="your project's Alembic migrates it"):
        migrations.upgrade(empty_database_url)  # the Python API refuses too (it used to fail half-way)
    with pytest.raises(migrations.MigrationRefused, match="your project's Alembic migrates it"):
        migrations.downgrade(empty_database_url, "base")
    assert _state(empty_database_url) == ("fq0007", None)


def test_the_worker_check_says_which_tool_to_run(empty_database_url: str) -> None:
    with psycopg.connect(empty_database_url, autocommit=True) as conn:
        with pytest.raises(ConfigurationError, match=r"not installed .*: run `fairqueue migrate` first$"):
            migrations.check_schema(conn, empty_database_url)
        # a project's Alembic ran here (its version table exists) but installed nothing
        conn.execute("CREATE TABLE alembic_version (version_num varchar(32) PRIMARY KEY)")
        with pytest.raises(
            ConfigurationError,
            match=r"run `fairqueue migrate` first, or `alembic upgrade heads` if your project's Alembic is to install "
            r"it \(`fairqueue migrate --check-alembic alembic.ini` tells whether it finds fairqueue's revisions\)$",
        ):
            migrations.check_schema(conn, empty_database_url)
        conn.execute("DROP TABLE alembic_version")
        migrations.upgrade(empty_database_url, "fq0007")
        _as_if_a_projects_alembic_migrated_it(empty_database_url)
        with pytest.raises(
            ConfigurationError,
            match=rf"is at fq0007, and this fairqueue needs {sql.HEAD}: your project's Alembic migrates it: run "
            r"`alembic upgrade fairqueue@head` first$",
        ):
            migrations.check_schema(conn, empty_database_url)


def test_handing_the_schema_to_a_projects_alembic(migrate: Run, empty_database_url: str) -> None:
    migrate("--revision", "fq0005")
    code, out, err = migrate("--hand-over")
    assert (code, out) == (1, "")
    assert _error(err).endswith(
        f"your project's alembic_version in {empty_database_url} has no fairqueue revision, and fairqueue's schema "
        "is at fq0005: run `alembic stamp fq0005` first; nothing was changed"
    )
    # alembic stamp fq0005, as the project's Alembic writes it
    _sql(empty_database_url, "CREATE TABLE alembic_version (version_num varchar(32) PRIMARY KEY)")
    _sql(empty_database_url, "INSERT INTO alembic_version VALUES ('app001'), ('fq0004')")
    code, _, err = migrate("--hand-over")
    assert code == 1
    assert "alembic_version in" in err and "records fq0004, and fairqueue's schema is at fq0005" in _error(err)
    _sql(empty_database_url, "UPDATE alembic_version SET version_num = 'fq0005' WHERE version_num = 'fq0004'")

    code, out, err = migrate()  # recorded by both tools: one of them has to let go
    assert (code, out) == (1, "")
    assert _error(err).endswith(
        f"fairqueue's revision in {empty_database_url} is recorded both in fairqueue_alembic_version (fq0005) and "
        "in your project's alembic_version (fq0005): finish handing it to your Alembic with `fairqueue migrate "
        "--hand-over`, or run `alembic stamp fairqueue@base` to leave it to `fairqueue migrate`; nothing was changed"
    )
    code, out, err = migrate("--hand-over")
    assert (code, err) == (0, "")
    assert out.strip() == (
        f"fairqueue's schema in {empty_database_url} is at fq0005: your project's Alembic migrates it from now on "
        "(fairqueue_alembic_version dropped); upgrade it with `alembic upgrade fairqueue@head`"
    )
    assert _sql(empty_database_url, "SELECT to_regclass('fairqueue_alembic_version')") == [(None,)]
    code, _, err = migrate()
    assert code == 1 and "your project's Alembic migrates it" in _error(err)
    code, _, err = migrate("--hand-over")
    assert code == 1 and "`fairqueue migrate` does not migrate fairqueue's schema" in _error(err)


def test_taking_the_schema_back_from_a_projects_alembic(migrate: Run, empty_database_url: str) -> None:
    code, _, err = migrate("--take-over")
    assert code == 1 and "there is no fairqueue schema in" in _error(err)
    migrations.upgrade(empty_database_url, "fq0006")
    code, _, err = migrate("--take-over")
    assert code == 1
    assert "`fairqueue migrate` migrates fairqueue's schema in" in err and "already" in _error(err)
    _as_if_a_projects_alembic_migrated_it(empty_database_url)
    code, out, err = migrate("--take-over")
    assert (code, out) == (1, "")
    assert _error(err).endswith(
        f"your project's alembic_version in {empty_database_url} still records fairqueue's fq0006: run `alembic "
        "stamp fairqueue@base` first (your Alembic forgets fairqueue's revisions, the schema stays); nothing was "
        "changed"
    )
    _sql(empty_database_url, "DELETE FROM alembic_version")  # alembic stamp fairqueue@base
    code, out, err = migrate("--take-over")
    assert (code, err) == (0, "")
    assert out.strip() == (
        f"fairqueue's schema in {empty_database_url} is at fq0006: `fairqueue migrate` migrates it from now on "
        "(recorded in fairqueue_alembic_version); take fairqueue:_alembic/versions out of your alembic.ini's "
        "version_locations"
    )
    code, out, _ = migrate()
    assert code == 0 and out.strip().endswith(f"is at head ({sql.HEAD})")
    assert _state(empty_database_url) == (sql.HEAD, sql.HEAD)


def test_a_version_table_that_disagrees_with_the_schema_is_refused(migrate: Run, empty_database_url: str) -> None:
    migrate()
    _sql(empty_database_url, "UPDATE fairqueue_alembic_version SET version_num = 'fq0005'")
    code, out, err = migrate()
    assert (code, out) == (1, "")
    assert _error(err).endswith(
        f"fairqueue's schema in {empty_database_url} is at {sql.HEAD} but fairqueue_alembic_version says fq0005: "
        "another tool (your project's Alembic?) migrated it; if your Alembic migrates it now, `fairqueue migrate "
        "--hand-over` finishes handing it over; nothing was changed"
    )


def test_a_revision_newer_than_this_fairqueue_is_refused(migrate: Run, empty_database_url: str) -> None:
    migrate()
    _sql(empty_database_url, "UPDATE fairqueue_alembic_version SET version_num = 'fq0042'")
    _sql(empty_database_url, sql.stamp_sql("fq0042"))
    code, out, err = migrate()
    assert (code, out) == (1, "")
    assert _error(err).endswith(
        f"fairqueue's schema in {empty_database_url} is at fq0042, a revision this fairqueue (up to {sql.HEAD}) "
        "does not know: migrate it with the newer fairqueue that made it; nothing was changed"
    )
    assert migrate("--current") == (0, "fq0042\n", "")
