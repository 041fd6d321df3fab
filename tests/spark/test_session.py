"""The Spark session and the JDBC form of database URLs."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from fairqueue.errors import ConfigurationError
from fairqueue.spark import jdbc_target
from fairqueue.spark.session import check_master, session_environment, session_settings

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


def test_cluster_masters_keep_their_own_python_and_a_given_spark_jars(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    local = session_environment("local[2]")
    assert local["PYSPARK_PYTHON"] == sys.executable and local["SPARK_LOCAL_IP"] == "127.0.0.1"
    for master in ("spark://spark-master:7077", "yarn", "k8s://https://k8s:6443"):
        assert "PYSPARK_PYTHON" not in session_environment(master)  # this virtualenv is not on the cluster
        assert "SPARK_LOCAL_IP" not in session_environment(master)

    monkeypatch.setenv("SPARK_CONF_DIR", str(tmp_path))
    given = {"spark.jars": "/opt/theirs.jar", "spark.driver.memory": "4g"}
    settings = session_settings("spark://h:7077", config=given, jar="/j/pg.jar")
    assert settings["spark.jars"] == "/opt/theirs.jar,/j/pg.jar"  # appended, not replaced
    assert settings["spark.driver.memory"] == "4g" and settings["spark.master"] == "spark://h:7077"
    assert "spark.driver.host" not in settings
    assert session_settings("local[1]", jar="/j/pg.jar")["spark.driver.host"] == "127.0.0.1"
    assert (
        session_settings("local[1]", config={"spark.jars": "/j/pg.jar"}, jar="/j/pg.jar")["spark.jars"] == "/j/pg.jar"
    )
    # spark.jars from spark-defaults.conf is kept too (the command line's --conf would override it)
    (tmp_path / "spark-defaults.conf").write_text("# defaults\nspark.jars   /opt/a.jar,/opt/b.jar\nspark.x 1\n")
    assert session_settings("yarn", jar="/j/pg.jar")["spark.jars"] == "/opt/a.jar,/opt/b.jar,/j/pg.jar"


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_an_unreachable_master_is_one_line_at_once(tmp_path: Path) -> None:
    port = _closed_port()
    with pytest.raises(
        ConfigurationError, match=rf"^cannot reach the Spark master 127\.0\.0\.1:{port}: Connection refused"
    ):
        check_master(f"spark://127.0.0.1:{port}")
    with socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        check_master(f"spark://127.0.0.1:{port},127.0.0.1:{listening.getsockname()[1]}")  # one answers
    check_master("local[2]")
    check_master("yarn")

    started = time.monotonic()
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "fairqueue",
            "report",
            "--from",
            str(tmp_path),
            "--out",
            str(tmp_path / "out"),
            "--master",
            f"spark://127.0.0.1:{port}",
        ],
        capture_output=True,
        text=True,
        env=os.environ | {"PYTHONPATH": str(Path(__file__).resolve().parents[2])},
        timeout=120,
        check=False,
    )
    assert time.monotonic() - started < 30  # Spark itself retries for a minute
    assert done.returncode != 0
    assert done.stderr == f"fairqueue: error: cannot reach the Spark master 127.0.0.1:{port}: Connection refused\n"
    assert not (tmp_path / "out").exists()
