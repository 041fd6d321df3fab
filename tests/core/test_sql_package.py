"""The SQL stays in fairqueue/sql/: Python elsewhere calls named queries (Q.name) and never spells out
a statement that names fairqueue's tables or functions; every named query is used, and every use names
a query that exists."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from fairqueue import sql
from fairqueue.sql import Q

REPO = Path(__file__).resolve().parents[2]
LIBRARY = [REPO / "fairqueue", REPO / "fairqueue_django", REPO / "alembic"]
SQL_PACKAGE = REPO / "fairqueue" / "sql"

# a string that names an object of the fairqueue schema and reads like a statement
QUALIFIED = re.compile(r"\bfairqueue\.(?:[a-z_]+\b|\{)")
STATEMENT = re.compile(
    r"\b(SELECT|INSERT|UPDATE|DELETE|FROM|JOIN|ALTER|DROP|CREATE|TRUNCATE|VACUUM|LOCK|COPY|GRANT|REVOKE|COMMENT ON)\b"
)

#: (file, text in the string): SQL in Python that is allowed, and why.
ALLOWED: list[tuple[str, str]] = [
    # advice printed for an operator to run by hand, not a statement fairqueue sends
    ("fairqueue/spark/", "SELECT fairqueue.ensure_completed_partitions("),
    ("fairqueue/spark/", "COMMENT ON TABLE fairqueue.{} IS NULL"),
]


def _python_files() -> list[Path]:
    return sorted(
        p
        for root in LIBRARY
        for p in root.rglob("*.py")
        if SQL_PACKAGE not in p.parents and ".venv" not in p.parts and "__pycache__" not in p.parts
    )


def _strings(tree: ast.AST) -> list[tuple[int, str]]:
    """The string literals of a module, but its docstrings (prose)."""
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
        and node.body
        and isinstance(node.body[0], ast.Expr)
    }
    found = []
    for node in ast.walk(tree):
        if id(node) in docstrings:
            continue
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            found.append((node.lineno, node.value))
        elif isinstance(node, ast.JoinedStr):  # an f-string: its literal parts, with {} where values go
            text = "".join(str(v.value) if isinstance(v, ast.Constant) else "{}" for v in node.values)
            found.append((node.lineno, text))
    return found


def _allowed(path: Path, text: str) -> bool:
    relative = path.relative_to(REPO).as_posix()
    return any(relative.startswith(where) and snippet in text for where, snippet in ALLOWED)


def test_no_python_outside_the_sql_package_spells_out_fairqueue_sql() -> None:
    offenders = []
    for path in _python_files():
        for line, text in _strings(ast.parse(path.read_text(encoding="utf-8"))):
            if QUALIFIED.search(text) and STATEMENT.search(text) and not _allowed(path, text):
                offenders.append(f"{path.relative_to(REPO)}:{line}: {' '.join(text.split())[:100]}")
    assert offenders == [], "SQL belongs in fairqueue/sql/queries/ (a named query):\n" + "\n".join(offenders)


def test_the_check_finds_sql_in_python(tmp_path: Path) -> None:
    source = 'x = 1\nQUERY = f"SELECT count(*) FROM fairqueue.{table}"\n'
    assert [t for _, t in _strings(ast.parse(source)) if QUALIFIED.search(t) and STATEMENT.search(t)]


def _library_source() -> str:
    return "\n".join(p.read_text(encoding="utf-8") for p in _python_files())


def test_every_named_query_is_used_and_every_use_exists() -> None:
    source = _library_source()
    defined = set(sql.queries())
    used = set(re.findall(r"\bQ\.([a-z_][a-z0-9_]*)\b", source))
    assert used - defined == set(), "Q.<name> used but not defined in fairqueue/sql/queries/"
    unused = {name for name in defined if not re.search(rf"\.{name}\b", source)}
    assert unused == set(), "named queries nothing uses"


def test_an_unknown_query_name_is_a_clear_error() -> None:
    with pytest.raises(AttributeError, match="no query named 'no_such_query'"):
        _ = Q.no_such_query


def test_a_named_query_is_sent_without_its_comments() -> None:
    assert Q.claim.startswith("SELECT job_id, kind")
    assert "--" not in Q.enqueue and not Q.enqueue.rstrip().endswith(";")
