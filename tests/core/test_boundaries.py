"""The core stays light and independent of its integrations: importing the API, the worker runtime or
the CLI loads no Django, Spark, Alembic or SQLAlchemy (they are optional, or only needed by the
commands that use them), and no core module imports fairqueue_django."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_importing_the_core_loads_no_integration() -> None:
    code = (
        "import sys, fairqueue, fairqueue.worker, fairqueue.cli, fairqueue.sql; "
        "print(sorted(m for m in ('django', 'pyspark', 'alembic', 'sqlalchemy', 'fairqueue_django', "
        "'fairqueue.spark') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO)
    assert out.stdout.strip() == "[]"


def test_no_core_module_imports_the_django_app() -> None:
    offenders = []
    for path in sorted((REPO / "fairqueue").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            else:
                continue
            if any(n == "fairqueue_django" or n.startswith("fairqueue_django.") for n in names):
                offenders.append(f"{path.relative_to(REPO)}:{node.lineno}")
    assert offenders == []
