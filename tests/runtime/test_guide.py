"""docs/guide.md's first example as written: the README's task in its own module, run by a real
``fairqueue worker``, and a job enqueued by name with the guide's own lines in a SQLAlchemy session.
The job must succeed (with the wrong argument name it fails as "bad arguments").

The blocks of the page this test runs are those right after a ``<!-- test: tests/runtime/test_guide.py -->``
comment: a task module (its first line is ``# path/of/module.py``), then the code that enqueues.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
import sqlalchemy as sa
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

import fairqueue
from tests.helpers import wait_for

REPO = Path(__file__).resolve().parents[2]
GUIDE = REPO / "docs" / "guide.md"
MARK = "<!-- test: tests/runtime/test_guide.py -->"


def marked_blocks() -> list[str]:
    """The python blocks of the guide that follow the mark, in page order."""
    return re.findall(re.escape(MARK) + r"\n```python\n(.*?)```", GUIDE.read_text(), flags=re.S)


class Base(DeclarativeBase):
    pass


class Invoice(Base):
    """The ``Invoice`` of the guide's example: the application's own table."""

    __tablename__ = "guide_invoice"
    id: Mapped[int] = mapped_column(primary_key=True)
    tenant_id: Mapped[int]
    total: Mapped[int]


@pytest.fixture
def invoices(engine: sa.Engine) -> Iterator[None]:
    Base.metadata.drop_all(engine)
    Base.metadata.create_all(engine)
    yield
    Base.metadata.drop_all(engine)


def test_the_guides_job_enqueued_by_name_succeeds(
    db_url: str, engine: sa.Engine, conn: psycopg.Connection[Any], invoices: None, tmp_path: Path
) -> None:
    blocks = marked_blocks()
    assert len(blocks) == 2, f"expected the task module and the enqueue after {MARK} in {GUIDE}"
    module, enqueue = blocks
    header = module.partition("\n")[0]
    named = re.fullmatch(r"# (\w+)/(\w+)\.py", header)
    assert named, f"the task block's first line must name its module, e.g. # myapp/tasks.py; got {header!r}"
    package = tmp_path / named[1]
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / f"{named[2]}.py").write_text(module)

    log = tmp_path / "worker.log"
    env = {k: v for k, v in os.environ.items() if k != "FAIRQUEUE_DATABASE_URL"} | {"PYTHONPATH": str(tmp_path)}
    command = [sys.executable, "-m", "fairqueue", "worker", "--import", f"{named[1]}.{named[2]}"]
    with log.open("wb") as output:
        worker = subprocess.Popen(
            [*command, "--database-url", db_url, "--concurrency", "2", "--poll-interval", "0.2"],
            cwd=tmp_path,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=output,
            stderr=subprocess.STDOUT,
        )
    try:
        page: dict[str, Any] = {"Session": Session, "engine": engine, "Invoice": Invoice}
        exec(compile(enqueue, str(GUIDE), "exec"), page)  # the guide's own lines, as written
        job_id = page["job_id"]
        info = wait_for(
            lambda: (job := fairqueue.get_job(conn, job_id)) is not None and job.finished and job,
            timeout=60,
            what=f"the guide's job to finish (worker log: {log})",
        )
        assert info.status == "succeeded", f"{info.status}: {info.error}\n{log.read_text()}"
        assert info.result == {"sent": True}
        [(invoice_id,)] = conn.execute("SELECT id FROM public.guide_invoice").fetchall()
        assert (info.kind, info.channel, info.args) == ("invoices.send", "tenant-7", {"invoice_id": invoice_id})
    finally:
        worker.send_signal(signal.SIGTERM)
        try:
            worker.wait(timeout=30)
        except subprocess.TimeoutExpired:
            worker.kill()
            worker.wait()
