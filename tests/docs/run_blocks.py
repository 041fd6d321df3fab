"""Runs the python blocks of one documentation page, in order, in one namespace, as a reader would
paste them into a session (tests/docs/test_python_in_docs.py starts it in a process of its own, so
each page's tasks register in a registry of their own).

    python -m tests.docs.run_blocks BLOCKS.json

BLOCKS.json: {"prelude": code, "blocks": [[where, code], ...], "between": code, "after": code}. The
prelude stands for the reader's own application (a database URL, an engine, their models); "between"
runs after each block (the pages reuse names such as `conn` for "your connection", which a `with`
block closes); "after" checks what the blocks did. A block that fails stops the run with its
traceback, which names the block.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import types
from collections.abc import Mapping
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def main(path: str) -> None:
    with open(path, encoding="utf-8") as f:
        spec = json.load(f)
    page = types.ModuleType("docs_page")  # a module, so that SQLAlchemy can resolve the models' annotations
    sys.modules[page.__name__] = page
    namespace = page.__dict__
    exec(compile(spec["prelude"], "<prelude>", "exec"), namespace)
    between = compile(spec.get("between", ""), "<between>", "exec")
    for where, code in spec["blocks"]:
        exec(compile(code, where, "exec"), namespace)
        exec(between, namespace)
    exec(compile(spec["after"], "<after>", "exec"), namespace)
    print("ok")


def run_in_a_process(
    spec: Mapping[str, object], env: Mapping[str, str], workdir: str, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    """Runs ``spec`` (see above) with this module in a fresh Python process, from the repository root."""
    path = os.path.join(workdir, "blocks.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump(spec, f)
    return subprocess.run(
        [sys.executable, "-m", "tests.docs.run_blocks", path],
        cwd=REPO,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=timeout,
    )


if __name__ == "__main__":
    main(sys.argv[1])
