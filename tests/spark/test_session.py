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


# -- Java: PySpark 4 needs Java 17+, checked before Spark starts -----------------------------------------


def _path_without_java(tmp_path: Path) -> str:
    """A PATH with every program of this one except ``java`` (links in one directory)."""
    shown = tmp_path / "path-without-java"
    shown.mkdir()
    for directory in os.environ.get("PATH", "").split(os.pathsep):
        if not directory or not Path(directory).is_dir():
            continue
        for entry in Path(directory).iterdir():
            if entry.name != "java" and not (shown / entry.name).exists():
                (shown / entry.name).symlink_to(entry)
    return str(shown)


def _java_home(tmp_path: Path, version_line: str) -> Path:
    """A directory like a JDK's, whose bin/java only prints ``version_line`` as ``java -version`` does."""
    home = tmp_path / "old-jdk"
    (home / "bin").mkdir(parents=True)
    java = home / "bin" / "java"
    java.write_text(f"#!/bin/sh\necho '{version_line}' >&2\necho 'OpenJDK Runtime Environment' >&2\n")
    java.chmod(0o755)
    return home


def _report_without_spark(tmp_path: Path, **env: str | None) -> subprocess.CompletedProcess[str]:
    """``fairqueue report`` in its own process with ``env`` changed (None: unset); nothing to read, so it can
    only fail when it starts Spark."""
    environment = os.environ | {"PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    environment.pop("PYSPARK_GATEWAY_PORT", None)
    for name, value in env.items():
        if value is None:
            environment.pop(name, None)
        else:
            environment[name] = value
    (tmp_path / "archive").mkdir(exist_ok=True)
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "fairqueue",
            "report",
            "--from",
            str(tmp_path / "archive"),
            "--out",
            str(tmp_path / "out"),
            "--master",
            "local[1]",
        ],
        capture_output=True,
        text=True,
        env=environment,
        timeout=120,
        check=False,
    )


def test_no_java_is_one_line_naming_java_17_before_spark_starts(tmp_path: Path) -> None:
    hint = (
        "install Java 17+ (e.g. apt-get install openjdk-17-jre-headless) and set JAVA_HOME to its directory or put "
        "its bin/java first on PATH"
    )
    done = _report_without_spark(tmp_path, PATH=_path_without_java(tmp_path), JAVA_HOME=None)
    assert done.returncode == 2
    assert done.stderr == (
        "fairqueue: error: PySpark needs Java 17 or later, but no Java was found (JAVA_HOME is not set and there is "
        f"no java on PATH): {hint}\n"
    )
    assert not (tmp_path / "out").exists()

    # JAVA_HOME wins over PATH, as in Spark's launch scripts: one without bin/java is named
    empty_home = tmp_path / "not-a-jdk"
    empty_home.mkdir()
    done = _report_without_spark(tmp_path, JAVA_HOME=str(empty_home))
    assert done.returncode == 2
    assert done.stderr == (
        f"fairqueue: error: PySpark needs Java 17 or later, but JAVA_HOME={empty_home} has no bin/java: {hint}\n"
    )


def test_java_11_is_one_line_naming_java_17_before_spark_starts(tmp_path: Path) -> None:
    home = _java_home(tmp_path, 'openjdk version "11.0.22" 2024-01-16')
    java = home / "bin" / "java"
    expected = (
        f'fairqueue: error: PySpark needs Java 17 or later, but {java} is Java 11 (openjdk version "11.0.22" '
        "2024-01-16): install Java 17+ (e.g. apt-get install openjdk-17-jre-headless) and set JAVA_HOME to its "
        "directory or put its bin/java first on PATH\n"
    )
    on_path = f"{home / 'bin'}{os.pathsep}{_path_without_java(tmp_path)}"
    for env in ({"JAVA_HOME": str(home)}, {"JAVA_HOME": None, "PATH": on_path}):
        done = _report_without_spark(tmp_path, **env)
        assert done.returncode == 2, env
        assert done.stderr == expected, env
        assert not (tmp_path / "out").exists()


def test_java_versions_are_read_as_java_prints_them(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from fairqueue.spark.errors import spark_failure
    from fairqueue.spark.session import check_java, java_major

    assert java_major('openjdk version "17.0.15" 2025-04-15\nOpenJDK Runtime Environment') == 17
    assert java_major('openjdk version "21" 2023-09-19') == 21
    assert java_major('openjdk version "25-ea" 2025-09-16') == 25
    assert java_major('java version "1.8.0_392"') == 8
    assert java_major("Error: could not find libjava.so") is None
    monkeypatch.setenv("JAVA_HOME", str(_java_home(tmp_path, 'java version "1.8.0_392"')))
    with pytest.raises(ConfigurationError, match=r"PySpark needs Java 17 or later, but .* is Java 8 "):
        check_java()
    # should Spark's JVM still not start, its one line says what it needs
    from pyspark.errors import PySparkRuntimeError

    exited = PySparkRuntimeError(errorClass="JAVA_GATEWAY_EXITED", messageParameters={})
    assert spark_failure(exited).endswith(
        "(PySpark needs Java 17 or later: install Java 17+ (e.g. apt-get install "
        "openjdk-17-jre-headless) and set JAVA_HOME to its directory or put its "
        "bin/java first on PATH)"
    )
