"""The python blocks of the documentation run, as written, against a real database: each page's blocks
in order, in one namespace, in a process of their own (tests/docs/run_blocks.py). A block that another
test runs is marked `<!-- test: path -->` above it; one that cannot run on its own (a settings
excerpt) is marked `<!-- not run: why -->`. Every other python block of the pages below runs here, and
a page with python blocks that is not listed here fails the completeness test."""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from fairqueue.urls import to_sqlalchemy
from tests.docs.run_blocks import run_in_a_process
from tests.docs.snippets import DOCUMENTS, REPO, Block, all_blocks, blocks

#: what every page's prelude gives the blocks: the reader's database, engine, session and models
COMMON = """
import logging, os
import psycopg
import sqlalchemy as sa
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column
import fairqueue

url = os.environ["DOCS_DATABASE_URL"]
engine = sa.create_engine(os.environ["DOCS_SQLALCHEMY_URL"], poolclass=sa.pool.NullPool)
conn = psycopg.connect(url, autocommit=True)
session = Session(engine)


class Base(DeclarativeBase):
    pass


class Invoice(Base):  # the reader's own model, as the pages use it
    __tablename__ = "invoices"
    id: Mapped[int] = mapped_column(primary_key=True)
    tenant: Mapped[str | None]
    tenant_id: Mapped[int | None]
    total: Mapped[int]
    state: Mapped[str] = mapped_column(default="draft")


Base.metadata.drop_all(engine)
Base.metadata.create_all(engine)
conn.execute("DROP TABLE IF EXISTS accounts")
conn.execute("CREATE TABLE accounts (id integer PRIMARY KEY, balance integer)")
conn.execute("INSERT INTO accounts VALUES (3, 100)")


def jobs(kind):
    return conn.execute("SELECT channel, args FROM fairqueue.job WHERE kind = %s ORDER BY id", (kind,)).fetchall()
"""


#: after each block: `conn` is the reader's autocommit connection again if a `with` block closed it
BETWEEN = "if conn.closed:\n    conn = psycopg.connect(url, autocommit=True)\n"


@dataclass(frozen=True)
class Page:
    prelude: str = ""  # names the page's blocks use without defining them
    after: str = ""  # what the blocks must have done


PAGES: dict[str, Page] = {
    "README.md": Page(
        after="""
import asyncio
from sqlalchemy.ext.asyncio import create_async_engine


async def _checkout_on(driver):  # the async block's function, called as the reader's app would
    engine = create_async_engine(os.environ["DOCS_SQLALCHEMY_URL"].replace("+psycopg", "+" + driver))
    await checkout(async_sessionmaker(engine))
    await engine.dispose()


for driver in ("psycopg", "asyncpg"):
    asyncio.run(_checkout_on(driver))
assert jobs("invoices.send") == [("acme", {"invoice_id": i}) for i in (1, 2, 3)]
assert session.get(Invoice, 1) is None or True
""",
    ),
    "docs/guide.md": Page(
        prelude="work = [(1, 7), (2, 8)]  # (image, tenant) pairs\nrunning = False\n"
        "def run(job):\n    return fairqueue.Outcome(job.id, 'succeeded')\n",
        after='assert jobs("accounts.recalculate") == [("tenant-3", {"id": 3})]\n'
        'assert conn.execute("SELECT balance FROM accounts").fetchone() == (90,)\n'
        "assert len(ids) == 2\n"
        "assert (settings.max_concurrency, settings.rate_limit, settings.weight, settings.paused) == "
        "(None, '600/m', 3, True)\n"
        "claimed = fairqueue.claim_batch(conn, fairqueue.register_worker(conn, 'docs', lease_seconds=60), 100)\n"
        "assert [j.id for j in claimed if j.id in (urgent, plain, nightly)] == [urgent, plain, nightly]\n",
    ),
    "docs/tasks.md": Page(
        prelude="""
class _Pdf:
    pages = 2


def render_invoice(invoice_id):
    return _Pdf()


def mail(pdf, copy_to):
    pass


@fairqueue.task(name="images.resize")
def resize(image_id: int) -> None: ...


images = [(1, 7), (2, 8)]  # (image, tenant) pairs
job_id = fairqueue.enqueue(conn, "reports.build", {"report_id": 1})
""",
        after="""
# the first block's enqueues stay in the page's open session, which the next block's `with` replaces
# (never committed); the blocks that commit leave their jobs
assert jobs("invoices.send") == [("tenant-7", {"invoice_id": 1}), ("default", {"invoice_id": 42})]
assert len(ids) == 2 and info is not None and info.status == "ready"
assert fairqueue.registry.get("ledger.post") is post_entry and fairqueue.registry.get("reports.build")
""",
    ),
    "docs/periodic.md": Page(
        after="assert refresh.name == 'reports.refresh' and digest.name == 'emails.digest'\n"
        "assert FAIRQUEUE['PERIODIC']['nightly-report']['CRON'] == '0 2 * * *'\n"
    ),
    "docs/migrations.md": Page(
        after="assert not include_name('fairqueue', 'schema', {}) and include_name('public', 'schema', {})\n"
    ),
    "docs/tracing.md": Page(
        after="""
assert set(stored) == {"traceparent"} and stored["traceparent"].startswith("00-")
assert fairqueue.get_job(conn, job_id).result == "invoice-7.pdf"
provider.force_flush()
""",
    ),
    "docs/pipeline.md": Page(
        prelude="recipients = [('acme', 'a@example.com'), ('bob', 'b@example.com')]\n",
        after="assert (result.jobs, result.created, result.duplicates) == (2, 2, 0)\n",
    ),
}


def _runnable(block: Block) -> bool:
    return block.language == "python" and block.mark is None


def _run(document: Path, url: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    page = PAGES[str(document.relative_to(REPO))]
    spec = {
        "prelude": COMMON + page.prelude,
        "blocks": [[b.where, b.text] for b in blocks(document) if _runnable(b)],
        "between": BETWEEN,
        "after": page.after,
    }
    env = {"DOCS_DATABASE_URL": url, "DOCS_SQLALCHEMY_URL": to_sqlalchemy(url)}
    return run_in_a_process(spec, env, str(tmp_path))


@pytest.mark.parametrize("page", sorted(PAGES))
def test_the_python_blocks_of_a_page_run_as_written(page: str, db_url: str, tmp_path: Path) -> None:
    document = REPO / page
    assert any(_runnable(b) for b in blocks(document)), f"{page} has no python block left to run here"
    result = _run(document, db_url, tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip().endswith("ok")


SHELL = {"bash", "sh", "shell", "console"}


def _shell_is_only_fairqueue_commands(block: Block) -> bool:
    """Lines that are comments, `export`s or `fairqueue ...` commands (tests/docs/test_cli_in_docs.py
    parses those with the real CLI)."""
    for raw in block.text.replace("\\\n", " ").splitlines():
        line = raw.strip()
        if line and not line.startswith(("#", "fairqueue ", "export ")):
            return False
    return True


def test_every_code_block_is_run_or_says_why_not() -> None:
    problems = []
    for block in all_blocks():
        if block.language not in SHELL | {"python"}:
            continue
        if block.mark is not None:
            kind, what = block.mark
            if kind == "not run":
                if not what:
                    problems.append(f"{block.where}: 'not run' needs a reason")
                continue
            test_file = REPO / what.split("#", 1)[0].split("::", 1)[0]
            if not test_file.is_file():
                problems.append(f"{block.where}: {what} does not exist")
            elif block.document.name not in test_file.read_text():
                problems.append(f"{block.where}: {what} does not mention {block.document.name}")
            continue
        page = str(block.document.relative_to(REPO))
        if block.language == "python" and page not in PAGES:
            problems.append(f"{block.where}: a python block of a page tests/docs does not run")
        if block.language in SHELL and not _shell_is_only_fairqueue_commands(block):
            problems.append(f"{block.where}: a shell block that no test runs (mark it test: or not run:)")
    assert problems == [], "\n".join(problems)


def test_every_listed_page_exists() -> None:
    assert {str(d.relative_to(REPO)) for d in DOCUMENTS} >= set(PAGES)
