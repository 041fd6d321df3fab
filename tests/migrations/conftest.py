"""The virtualenv where fairqueue is installed as README.md says, shared by the slow tests that follow
the docs from it (tests/migrations/test_packaging.py, test_alembic_recipe.py: one xdist group, so the
wheel is built and installed once per run)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.installs import REPO, clean_env, copy_checkout, page_block, run_block

#: the xdist group of the tests that use ``readme_install``
INSTALLED = pytest.mark.xdist_group("readme_install")


@pytest.fixture(scope="session")
def readme_install(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh virtualenv with fairqueue installed by README.md's "Installing" block, run word for word
    in a copy of the checkout with that virtualenv active. Returns the virtualenv."""
    root = tmp_path_factory.mktemp("readme_install")
    checkout = copy_checkout(root / "fairqueue")
    venv = root / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, capture_output=True, timeout=300)
    block = page_block(REPO / "README.md", "tests/migrations/test_packaging.py", "install")
    result = run_block(block, checkout, clean_env(venv))
    assert result.returncode == 0, f"{block}\n{result.stdout}\n{result.stderr}"
    return venv
