"""Every piece of SQL fairqueue has, in one package; Python elsewhere only calls it by name.

- ``schema/``: the current definition of every table, index and function, one file per area, in
  the order they are created (``00_`` first). This is the file to open to read how the queue
  works: ``schema/30_claim.sql`` holds the claim as it is installed today.
- ``migrations/``: the versioned deltas (``v000N_up.sql`` / ``v000N_down.sql``) that bring an
  existing database from one revision to the next. Released files are never edited. The Alembic
  revisions and the Django migrations both run them, through :func:`step_sql`.
- ``queries/``: the named statements Python sends (``-- name: claim`` blocks), reached as
  ``Q.claim``.

``tests/migrations/test_schema_files.py`` builds one database from ``schema/`` and migrates another
through every delta, and compares the two catalogs (every column, index, constraint, function body,
privilege and comment), so the schema files cannot drift from what ``fairqueue migrate`` and Django's
``migrate`` install.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from importlib import resources
from typing import Literal

__all__ = [
    "HEAD",
    "REVISIONS",
    "Direction",
    "Drop",
    "Q",
    "Revision",
    "dropped_by",
    "drops_in",
    "installed_revision_of",
    "is_revision_id",
    "migration_file",
    "previous",
    "queries",
    "query",
    "revision",
    "schema_files",
    "schema_sql",
    "stamp_sql",
    "step_sql",
]

Direction = Literal["up", "down"]


@dataclass(frozen=True)
class Revision:
    """One step of the schema's history: an Alembic revision, a Django migration, a pair of delta files."""

    id: str  # the Alembic revision id, also recorded in the schema's comment: "fq0007"
    slug: str  # the rest of the Alembic file's name: fq0007_paused_ticks.py
    title: str  # what it changes, in a line

    @property
    def number(self) -> int:
        return int(self.id[2:])

    @property
    def up_file(self) -> str:
        return f"v{self.number:04d}_up.sql"

    @property
    def down_file(self) -> str:
        return f"v{self.number:04d}_down.sql"


#: The schema's revisions, oldest first: the one list the Alembic revisions, the Django migrations and
#: the workers' version check are made from (tests/migrations checks the first two against it).
REVISIONS: tuple[Revision, ...] = (
    Revision("fq0001", "initial", "tables and the queue functions"),
    Revision("fq0002", "retry_maintenance", "retry, due jobs, least-privilege EXECUTE"),
    Revision("fq0003", "periodic", "periodic (cron) schedules"),
    Revision("fq0004", "bulk", "bulk runs and their batch ledger"),
    Revision("fq0005", "maintenance_wakes", "promoting due jobs wakes their channels"),
    Revision("fq0006", "shared_claims", "claims share held channels; channel debts"),
    Revision("fq0007", "paused_ticks", "paused ticks stay missed; a claim never shares a channel being configured"),
    Revision("fq0008", "revision_mark", "the schema records its revision in its comment"),
    Revision("fq0009", "tenant_keys", "keys per channel; no control characters in names; earlier dependencies only"),
    Revision("fq0010", "priorities", "priority within a channel; a job's trace context"),
    Revision("fq0011", "channel_active", "held snapshots: producers read channel_active, claims scan from a floor"),
    Revision("fq0012", "fair_keys", "fair keys: turns within a channel's turn"),
    Revision("fq0013", "limits", "a cap per fair key; shared limits"),
    Revision("fq0014", "claim_order", "a claim never serves a channel whose turn moved under it"),
    Revision("fq0015", "limit_names", "producers check shared limit names before writing anything"),
    Revision("fq0016", "limit_inbox", "a job whose limit's row is busy joins the line through limit_release"),
    Revision("fq0017", "claim_spread", "a claim's share of the busy channels is rounded down"),
    Revision("fq0018", "floor_database", "the floors wait only for this database's transactions"),
    Revision("fq0019", "limit_sets", "shared limits hand out slots and join lines a set at a time"),
    Revision("fq0020", "covered_keys", "a job added to a fair key already in turn needs no wakeup"),
    Revision("fq0021", "bulk_limits", "bulk enqueue takes shared limits; periodic jobs take their task's too"),
    Revision("fq0022", "limit_edit_lock", "shared limits changed in part (a settings lock) and removed"),
    Revision("fq0023", "direct_handout", "jobs handed a slot in an idle channel start in the claim that handed it"),
    Revision("fq0024", "wake_snapshot", "the intake reads the channels it wakes after locking them"),
    Revision("fq0025", "key_slots", "keys take turns by slots their jobs carry, without a row per key"),
    Revision("fq0026", "configure_wait", "configure_channel waits for producers before it takes the channel's row"),
    Revision("fq0027", "producer_lines", "a job ready but for its limits joins a line in its producer's transaction"),
)
HEAD = REVISIONS[-1].id
_BY_ID = {r.id: r for r in REVISIONS}
_REVISION_ID = re.compile(r"fq[0-9]{4}")
#: The schema comment written after every step; a database's revision is read back from it.
_MARK = "fairqueue schema at revision {revision} (fairqueue/sql/schema/ in the fairqueue package)"
_MARK_PATTERN = re.compile(r"fairqueue schema at revision (fq[0-9]{4})\b")


def revision(revision_id: str) -> Revision:
    try:
        return _BY_ID[revision_id]
    except KeyError:
        raise KeyError(f"no fairqueue schema revision {revision_id!r} (known: {', '.join(_BY_ID)})") from None


def previous(revision_id: str) -> str | None:
    """The revision before ``revision_id`` (None for the first)."""
    index = REVISIONS.index(revision(revision_id))
    return REVISIONS[index - 1].id if index else None


def _read(*parts: str) -> str:
    return resources.files(__package__).joinpath(*parts).read_text(encoding="utf-8")


def migration_file(name: str) -> str:
    """The text of one delta file of ``migrations/`` (``v0007_up.sql``)."""
    return _read("migrations", name)


def is_revision_id(text: str) -> bool:
    """Whether ``text`` has the form of a fairqueue revision id (``fq0007``; this release's or another's)."""
    return bool(_REVISION_ID.fullmatch(text))


def stamp_sql(revision_id: str) -> str:
    """The statement that records ``revision_id`` in the schema's comment."""
    if not is_revision_id(revision_id):
        raise ValueError(f"not a revision id: {revision_id!r}")
    return f"COMMENT ON SCHEMA fairqueue IS '{_MARK.format(revision=revision_id)}';\n"


def step_sql(revision_id: str, direction: Direction) -> str:
    """The whole SQL of one migration step: the delta, then the revision it leaves the schema at
    recorded in the schema's comment (nothing to record after the first revision's down: it drops
    the schema)."""
    step = revision(revision_id)
    if direction == "up":
        return migration_file(step.up_file) + "\n" + stamp_sql(step.id)
    text = migration_file(step.down_file)
    before = previous(step.id)
    return text if before is None else text + "\n" + stamp_sql(before)


def installed_revision_of(schema_comment: str | None) -> str | None:
    """The revision recorded in the ``fairqueue`` schema's comment (None: not recorded, i.e. the
    schema is older than fq0008 or absent)."""
    if not schema_comment:
        return None
    found = _MARK_PATTERN.match(schema_comment)
    return found.group(1) if found else None


# -- what a down step drops ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Drop:
    """Data a down step destroys: the whole schema, a table, a column, or rows of a table."""

    kind: Literal["schema", "table", "column", "rows"]
    name: str  # "fairqueue", "fairqueue.bulk_run", "fairqueue.periodic_schedule.resumed_at"

    def __str__(self) -> str:
        if self.kind == "schema":
            return f"the schema {self.name} (every job, all history, channels, schedules and workers)"
        if self.kind == "rows":
            return f"rows of {self.name}"
        return f"{self.kind} {self.name}"


# Function bodies, literals and comments are removed before statements are read (a function body may
# well delete rows); one pass, left to right, so that each hides what the others would misread.
_NOT_STATEMENTS = re.compile(r"\$([A-Za-z_][A-Za-z_0-9]*|)\$.*?\$\1\$|'(?:[^']|'')*'|--[^\n]*", re.S)
_NAME = r"[A-Za-z_][A-Za-z_0-9.]*"
_DROP_SCHEMA = re.compile(rf"DROP\s+SCHEMA\s+(?:IF\s+EXISTS\s+)?({_NAME})", re.I)
_DROP_TABLE = re.compile(rf"DROP\s+TABLE\s+(?:IF\s+EXISTS\s+)?({_NAME}(?:\s*,\s*{_NAME})*)", re.I)
_ALTER_TABLE = re.compile(rf"ALTER\s+TABLE\s+(?:IF\s+EXISTS\s+)?(?:ONLY\s+)?({_NAME})\s+(.*)", re.I | re.S)
_DROP_IN_ALTER = re.compile(r"(?:^|,)\s*DROP\s+(?:COLUMN\s+)?(?:IF\s+EXISTS\s+)?([A-Za-z_][A-Za-z_0-9]*)", re.I)
_NOT_A_COLUMN = {"constraint", "default", "not", "expression", "identity"}
_DELETE = re.compile(rf"(?:DELETE\s+FROM|TRUNCATE(?:\s+TABLE)?)\s+(?:ONLY\s+)?({_NAME})", re.I)


def _statements(text: str) -> list[str]:
    """The top-level statements of a delta file, without function bodies, literals and comments."""
    text = _NOT_STATEMENTS.sub(" ", text)
    return [s.strip() for s in text.split(";") if s.strip()]


def dropped_by(revision_id: str) -> tuple[Drop, ...]:
    """The data the down step of ``revision_id`` destroys; empty if it only changes functions, indexes
    and the like. tests/migrations check it against the catalog, step by step."""
    return drops_in(migration_file(revision(revision_id).down_file))


def drops_in(text: str) -> tuple[Drop, ...]:
    """The data a delta destroys: its top-level ``DROP SCHEMA``, ``DROP TABLE``, ``ALTER TABLE ...
    DROP COLUMN``, ``DELETE`` and ``TRUNCATE`` statements (not those inside function bodies)."""
    found: list[Drop] = []
    for statement in _statements(text):
        if match := _DROP_SCHEMA.match(statement):
            found.append(Drop("schema", match[1]))
        elif match := _DROP_TABLE.match(statement):
            found.extend(Drop("table", name.strip()) for name in match[1].split(","))
        elif match := _ALTER_TABLE.match(statement):
            for column in _DROP_IN_ALTER.findall(match[2]):
                if column.lower() not in _NOT_A_COLUMN:
                    found.append(Drop("column", f"{match[1]}.{column}"))
        elif match := _DELETE.match(statement):
            found.append(Drop("rows", match[1]))
    return tuple(found)


def schema_files() -> list[str]:
    """The files of ``schema/``, in the order they are run."""
    return sorted(
        entry.name for entry in resources.files(__package__).joinpath("schema").iterdir() if entry.name.endswith(".sql")
    )


def schema_sql() -> str:
    """The current schema, whole, as ``schema/`` defines it (and stamped with the head revision)."""
    return "\n".join(_read("schema", name) for name in schema_files()) + "\n" + stamp_sql(HEAD)


# -- named queries ------------------------------------------------------------------------------------

_NAME_LINE = re.compile(r"^-- name: ([a-z_][a-z0-9_]*)\s*$")


def _parse(file: str, text: str) -> dict[str, str]:
    """The ``-- name: x`` blocks of one file. A block's whole-line comments are its documentation and
    are not sent; neither is a trailing semicolon."""
    found: dict[str, str] = {}
    name: str | None = None
    lines: list[str] = []

    def close() -> None:
        if name is None:
            return
        body = "\n".join(lines).strip().rstrip(";").strip()
        if not body:
            raise ValueError(f"fairqueue/sql/queries/{file}: query {name!r} is empty")
        found[name] = body

    for line in text.splitlines():
        match = _NAME_LINE.match(line)
        if match:
            close()
            name, lines = match.group(1), []
            if name in found:
                raise ValueError(f"fairqueue/sql/queries/{file}: query {name!r} is defined twice")
        elif name is not None and not line.lstrip().startswith("--"):
            lines.append(line.rstrip())
    close()
    return found


@functools.cache
def queries() -> dict[str, str]:
    """Every named query of ``queries/*.sql``, by name (names are unique across the files)."""
    found: dict[str, str] = {}
    folder = resources.files(__package__).joinpath("queries")
    for entry in sorted(folder.iterdir(), key=lambda e: e.name):
        if not entry.name.endswith(".sql"):
            continue
        for name, text in _parse(entry.name, entry.read_text(encoding="utf-8")).items():
            if name in found:
                raise ValueError(f"fairqueue/sql/queries/{entry.name}: query {name!r} is defined in two files")
            found[name] = text
    return found


def query(name: str) -> str:
    """The text of the named query ``name``."""
    try:
        return queries()[name]
    except KeyError:
        raise AttributeError(f"no query named {name!r} in fairqueue/sql/queries/") from None


class _Queries:
    """``Q.claim`` is the text of the query named ``claim``. A name is looked up once, then cached
    as an attribute."""

    def __getattr__(self, name: str) -> str:
        if name.startswith("__"):
            raise AttributeError(name)
        text = query(name)
        setattr(self, name, text)
        return text


Q = _Queries()
