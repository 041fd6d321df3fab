"""docs/pipeline.md's Spark blocks run as written (in a process of their own, with a Spark session of
their own), with the page's example places replaced by the test's: the archive (not there yet: the
report reads the live table), the report's folder and the database."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import psycopg
import pytest

import fairqueue
from tests.docs.run_blocks import run_in_a_process
from tests.docs.snippets import REPO, blocks

pytestmark = pytest.mark.spark

PAGE = REPO / "docs" / "pipeline.md"

PRELUDE = """
import os
from fairqueue.spark import spark_session

_spark = spark_session()
orders_df = _spark.createDataFrame(
    [("acme", 1, "Ada"), ("acme", 2, "Brian"), ("bob", 3, "Cleo")], "tenant string, order_id long, customer string"
)
"""

AFTER = """
assert report.summary["jobs"] == 3, report.summary
assert (result.rows, result.inserted) == (3, 3), result
"""


def test_the_spark_blocks_of_the_pipeline_page_run(
    spark_url: str, conn: psycopg.Connection[Any], tmp_path: Path
) -> None:
    worker = fairqueue.register_worker(conn)
    for i in range(3):
        fairqueue.enqueue(conn, "k", {"i": i}, channel="acme")
    for job in fairqueue.claim_batch(conn, worker, 10):
        fairqueue.complete(conn, worker, job.id)
    places = {
        'source="/data/fairqueue-archive"': f'source="{tmp_path / "archive"}"',
        "database_url=None": f'database_url="{spark_url}"',
        '"/tmp/report"': f'"{tmp_path / "report"}"',
        '"postgresql://app:secret@db:5432/shop"': f'"{spark_url}"',
    }
    spark_blocks = [b for b in blocks(PAGE) if b.mark == ("test", "tests/spark/test_docs.py")]
    assert len(spark_blocks) == 2
    code = []
    for block in spark_blocks:
        text = block.text
        for example, here in places.items():
            text = text.replace(example, here)
        code.append([block.where, text])
    result = run_in_a_process({"prelude": PRELUDE, "blocks": code, "after": AFTER}, {}, str(tmp_path), timeout=600)
    assert result.returncode == 0, result.stderr[-4000:]
    assert (tmp_path / "report" / "report.html").exists()
