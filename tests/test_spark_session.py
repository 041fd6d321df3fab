"""The Spark session and the JDBC form of database URLs."""

from __future__ import annotations

from typing import Any

import pytest

from fairqueue.errors import ConfigurationError
from fairqueue.spark import jdbc_target

pytestmark = pytest.mark.spark


def test_jdbc_target_from_a_libpq_url() -> None:
    target = jdbc_target("postgresql://app:s3cret@db.example:6543/shop?sslmode=require")
    assert target.url == "jdbc:postgresql://db.example:6543/shop"
    assert target.properties == {
        "driver": "org.postgresql.Driver",
        "user": "app",
        "password": "s3cret",
        "sslmode": "require",
    }
    assert "s3cret" not in repr(target)


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("postgresql://postgres@/db?host=/tmp/sock", "unix socket"),
        ("postgresql:///db", "unix socket"),
        ("postgresql://u@a,b/db", "several hosts"),
        ("mysql://u@h/db", "malformed database URL"),
    ],
)
def test_jdbc_target_rejects_what_jdbc_cannot_reach(url: str, message: str) -> None:
    with pytest.raises(ConfigurationError, match=message):
        jdbc_target(url)


def test_spark_reads_the_queue_over_jdbc(spark: Any, spark_url: str, conn: Any) -> None:
    import fairqueue

    fairqueue.enqueue(conn, "t.kind", channel="a")
    target = jdbc_target(spark_url)
    df = spark.read.format("jdbc").options(**target.options(dbtable="fairqueue.job")).load()
    assert [(r.kind, r.channel) for r in df.select("kind", "channel").collect()] == [("t.kind", "a")]
