"""fairqueue installed as a user installs it, for the slow tests that follow the docs: its wheel, a copy
of the checkout, a fresh virtualenv's environment, and the shell blocks of a page that a test runs.

A page marks a block that a test runs with a comment naming the test and the block, on the line
before the block:

    <!-- test: tests/migrations/test_alembic_recipe.py#adopt -->
    ```bash
    ...
    ```
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def build_wheel(out: Path) -> Path:
    """fairqueue's wheel, built from the source tree into ``out`` with the test environment's hatchling
    (no build isolation: nothing is downloaded)."""
    out.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(out), str(REPO)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    [built] = out.glob("fairqueue-*.whl")
    return built


def copy_checkout(dest: Path) -> Path:
    """The source tree as a user's checkout has it (the files git tracks, and new ones it does not
    ignore), copied to ``dest``: commands that write into the checkout (``make wheel``) write there."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=REPO,
        check=True,
        capture_output=True,
        timeout=60,
    ).stdout.decode()
    for name in filter(None, listed.split("\0")):
        source = REPO / name
        if source.is_file():  # a tracked file deleted in the working tree is not copied
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, dest / name)
    return dest


def clean_env(venv: Path | None = None) -> dict[str, str]:
    """The environment of a user's shell: none of the test run's Python, virtualenv, Django or fairqueue
    variables; with ``venv`` activated (its ``bin`` first on PATH) if given."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DJANGO_", "FAIRQUEUE_", "PYTHON", "VIRTUAL_ENV"))}
    if venv is not None:
        env["PATH"] = f"{venv / 'bin'}:{env['PATH']}"
        env["VIRTUAL_ENV"] = str(venv)
    return env


def page_block(page: Path, test_file: str, name: str) -> str:
    """The text of the fenced block of ``page`` marked ``<!-- test: <test_file>#<name> -->``."""
    marker = f"<!-- test: {test_file}#{name} -->"
    found = re.findall(re.escape(marker) + r"\n```[a-z]*\n(.*?)```", page.read_text(), flags=re.S)
    assert len(found) == 1, f"{page.relative_to(REPO)} has {len(found)} blocks marked {marker!r}"
    return str(found[0])


def run_block(block: str, cwd: Path, env: dict[str, str], timeout: float = 600) -> subprocess.CompletedProcess[str]:
    """Runs a page's shell block as a user pastes it into bash, stopping at the first failing command."""
    return subprocess.run(
        ["bash", "-euo", "pipefail", "-c", block], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )
