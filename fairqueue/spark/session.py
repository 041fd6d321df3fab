"""Building a Spark session that can talk to PostgreSQL, and the JDBC form of a database URL.

The traps this module takes care of (each one costs an afternoon the first time):

- the JDBC driver must be on the classpath (``spark.jars``) *and* named in every read/write
  (``driver=org.postgresql.Driver``), or Spark answers "No suitable driver";
- executors must run this Python (``PYSPARK_PYTHON``), or they miss fairqueue and psycopg: set
  to this interpreter for local masters only (on a cluster, the executors' Python is the cluster's);
- a ``spark.jars`` the user gives (``config``, or ``spark-defaults.conf``) is kept: the driver jar is
  appended to it;
- on machines with several interfaces the driver must bind to an address executors can reach;
  locally that is 127.0.0.1;
- JDBC cannot use a unix socket: the database URL must name a TCP host;
- an unreachable standalone master (``spark://host:port``) makes Spark retry for a minute and print
  pages of stack traces: it is checked first, and the command-line tools start Spark quietly;
- without Java, or with one older than 17, PySpark only says ``JAVA_GATEWAY_EXITED``: the Java that Spark
  would start (``$JAVA_HOME/bin/java``, else ``java`` on PATH) and its version are checked first.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import socket
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psycopg.conninfo

from fairqueue.errors import ConfigurationError
from fairqueue.spark.errors import JAVA_HINT, JAVA_NEEDED, MIN_JAVA
from fairqueue.text import first_line
from fairqueue.urls import redact, to_libpq

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)

JAR_ENV = "FAIRQUEUE_JDBC_JAR"
DEFAULT_JARS = ("/usr/share/java/postgresql.jar",)  # Debian's libpostgresql-jdbc-java
DRIVER = "org.postgresql.Driver"


def jdbc_jar() -> str:
    """Path of PostgreSQL's JDBC driver jar: ``$FAIRQUEUE_JDBC_JAR``, else Debian's location."""
    given = os.environ.get(JAR_ENV)
    candidates = [given] if given else list(DEFAULT_JARS)
    for candidate in candidates:
        if candidate and Path(candidate).is_file():
            return candidate
    if given:
        raise ConfigurationError(f"{JAR_ENV}={given!r} is not a file")
    raise ConfigurationError(
        "PostgreSQL's JDBC driver was not found at /usr/share/java/postgresql.jar: install it "
        f"(apt-get install libpostgresql-jdbc-java) or set {JAR_ENV} to the jar's path"
    )


@dataclass(frozen=True)
class JdbcTarget:
    """A database as Spark's JDBC source sees it: ``url`` plus connection ``properties``."""

    url: str
    properties: dict[str, str] = field(repr=False)

    def options(self, **extra: Any) -> dict[str, str]:
        """Options for ``spark.read.format("jdbc")`` / ``df.write.format("jdbc")``."""
        return {"url": self.url, **self.properties, **{k: str(v) for k, v in extra.items()}}


def jdbc_target(database_url: str) -> JdbcTarget:
    """The JDBC URL and properties for a libpq/SQLAlchemy database URL (which must use TCP)."""
    libpq = to_libpq(database_url)
    info = psycopg.conninfo.conninfo_to_dict(libpq)
    host = str(info.get("host") or info.get("hostaddr") or "")
    if not host or host.startswith("/") or "," in host:
        raise ConfigurationError(
            f"Spark's JDBC driver needs a TCP host, but {redact(libpq)!r} "
            + ("uses a unix socket" if not host or host.startswith("/") else "lists several hosts")
            + ": use postgresql://user:password@host:port/dbname"
        )
    port = str(info.get("port") or 5432)
    dbname = str(info.get("dbname") or info.get("user") or "postgres")
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"  # IPv6 literal
    properties = {"driver": DRIVER, "user": str(info.get("user") or os.environ.get("PGUSER") or "postgres")}
    password = info.get("password") or os.environ.get("PGPASSWORD")
    if password:
        properties["password"] = str(password)
    if info.get("sslmode"):
        properties["sslmode"] = str(info["sslmode"])
    return JdbcTarget(url=f"jdbc:postgresql://{host}:{port}/{dbname}", properties=properties)


def is_local_master(master: str) -> bool:
    """``local``, ``local[N]``, ``local[N,F]``, ``local[*]``, ``local-cluster[...]``."""
    return master.strip().startswith("local")


def standalone_masters(master: str) -> list[tuple[str, int]]:
    """(host, port) of each master in a standalone URL ``spark://h1:7077[,h2:7077]``; [] for other masters."""
    if not master.startswith("spark://"):
        return []
    found = []
    for part in master.removeprefix("spark://").split(","):
        match = re.fullmatch(r"(\[[^\]]+\]|[^:/\[\]]+)(?::(\d+))?/?", part.strip())
        if match is None:
            return []  # not understood: Spark itself says what is wrong with it
        found.append((match.group(1).strip("[]"), int(match.group(2) or 7077)))
    return found


def check_master(master: str, *, timeout: float = 5.0) -> None:
    """Raises :class:`ConfigurationError` unless one of a standalone master's addresses takes a TCP
    connection (Spark itself would retry for a minute before saying so). Other masters are not checked."""
    masters = standalone_masters(master)
    reasons = []
    for host, port in masters:
        try:
            with socket.create_connection((host, port), timeout=timeout):
                return
        except OSError as exc:
            reasons.append(f"{host}:{port}: {exc.strerror or exc}")
    if len(reasons) == 1:
        raise ConfigurationError(f"cannot reach the Spark master {reasons[0]}")
    if reasons:
        raise ConfigurationError(f"cannot reach any of the Spark masters ({'; '.join(reasons)})")


def java_major(version_output: str) -> int | None:
    """The major version in what ``java -version`` prints (``openjdk version "17.0.15" ...`` is 17,
    ``java version "1.8.0_392"`` is 8), or None if it names none."""
    match = re.search(r'version "(\d+)(?:\.(\d+))?[^"]*"', version_output)
    if match is None:
        return None
    major = int(match.group(1))
    return int(match.group(2) or 0) if major == 1 else major


def check_java() -> None:
    """Raises :class:`ConfigurationError` unless the Java that Spark would start is there and at least
    :data:`~fairqueue.spark.errors.MIN_JAVA`: ``$JAVA_HOME/bin/java`` when JAVA_HOME is set, else ``java`` on
    PATH (as Spark's launch scripts pick it). Without this PySpark only says ``JAVA_GATEWAY_EXITED``."""
    home = os.environ.get("JAVA_HOME")
    if home:
        java = os.path.join(home, "bin", "java")
        if not (os.path.isfile(java) and os.access(java, os.X_OK)):
            raise ConfigurationError(f"{JAVA_NEEDED}, but JAVA_HOME={home} has no bin/java: {JAVA_HINT}")
    else:
        found = shutil.which("java")
        if found is None:
            raise ConfigurationError(
                f"{JAVA_NEEDED}, but no Java was found (JAVA_HOME is not set and there is no java on PATH): {JAVA_HINT}"
            )
        java = found
    try:
        done = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=60, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ConfigurationError(f"{JAVA_NEEDED}, but {java} -version failed ({exc}): {JAVA_HINT}") from None
    said = done.stderr + done.stdout  # java -version prints to standard error
    major = java_major(said)
    if major is None:
        raise ConfigurationError(
            f"{JAVA_NEEDED}, but {java} -version did not say which version it is "
            f"({first_line(said) or f'exit status {done.returncode}'}): {JAVA_HINT}"
        )
    if major < MIN_JAVA:
        raise ConfigurationError(f"{JAVA_NEEDED}, but {java} is Java {major} ({first_line(said)}): {JAVA_HINT}")


def _jvm_running() -> bool:
    """Whether this process already has Spark's JVM (a stopped session's, or one it was handed through
    ``PYSPARK_GATEWAY_PORT``, as notebooks do): then no Java is started."""
    if os.environ.get("PYSPARK_GATEWAY_PORT"):
        return True
    from pyspark import SparkContext

    return SparkContext._gateway is not None


def session_environment(master: str) -> dict[str, str]:
    """Environment variables :func:`spark_session` sets for ``master`` where they are not set already. The
    executors run this Python only for a local master (they are this machine's, and need fairqueue and
    psycopg); on a cluster their Python is the cluster's business (``PYSPARK_PYTHON`` there, or
    ``spark.pyspark.python``): a path into this machine's virtualenv would not exist on its nodes."""
    env = {"PYSPARK_DRIVER_PYTHON": sys.executable}
    if is_local_master(master):
        env |= {"PYSPARK_PYTHON": sys.executable, "SPARK_LOCAL_IP": "127.0.0.1"}
    return env


def _spark_defaults(key: str) -> str | None:
    """``key`` in Spark's ``spark-defaults.conf`` (``$SPARK_CONF_DIR``, else ``$SPARK_HOME/conf``), if set."""
    conf_dir = os.environ.get("SPARK_CONF_DIR")
    if not conf_dir:
        home = os.environ.get("SPARK_HOME")
        if not home:
            try:
                from pyspark.find_spark_home import _find_spark_home

                home = _find_spark_home()
            except Exception:  # pragma: no cover - no Spark home: no defaults
                return None
        conf_dir = os.path.join(home, "conf")
    path = Path(conf_dir) / "spark-defaults.conf"
    try:
        lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return None
    value = None
    for line in lines:  # java.util.Properties' common forms: "key value", "key=value", "key: value"
        stripped = line.strip()
        if not stripped or stripped[0] in "#!":
            continue
        parts = re.split(r"\s*[=:]\s*|\s+", stripped, maxsplit=1)
        if parts[0] == key:
            value = parts[1].strip() if len(parts) > 1 else ""
    return value


def session_settings(
    master: str, *, app_name: str = "fairqueue", config: dict[str, str] | None = None, jar: str | None = None
) -> dict[str, str]:
    """The settings :func:`spark_session` starts Spark with: ``master``, the JDBC ``jar`` appended to any
    ``spark.jars`` given (in ``config`` or ``spark-defaults.conf``), local binding for local masters, UTC,
    then ``config`` (which wins, except that ``spark.jars`` keeps the jar)."""
    jar = jar or jdbc_jar()
    given = dict(config or {})
    settings = {"spark.master": master, "spark.app.name": app_name}
    if is_local_master(master):
        settings |= {
            "spark.driver.host": "127.0.0.1",
            "spark.driver.bindAddress": "127.0.0.1",
            "spark.ui.enabled": "false",
        }
    settings["spark.sql.session.timeZone"] = "UTC"
    settings |= given
    jars = given.get("spark.jars")
    if jars is None:
        jars = _spark_defaults("spark.jars")
    listed = [j.strip() for j in (jars or "").split(",") if j.strip()]
    if jar not in listed and f"file://{jar}" not in listed and f"local:{jar}" not in listed:
        listed.append(jar)
    settings["spark.jars"] = ",".join(listed)
    return settings


def _quiet_jvm(settings: dict[str, str]) -> None:
    """Starts the JVM with ``settings`` (as pyspark would) and lowers Spark's logging to errors before the
    SparkContext starts, so a failing start prints one line, not pages of retries and stack traces."""
    try:
        from pyspark import SparkConf, SparkContext

        conf = SparkConf(loadDefaults=False)
        conf.setAll(list(settings.items()))
        SparkContext._ensure_initialized(conf=conf)
        jvm: Any = SparkContext._jvm
        log4j = jvm.org.apache.logging.log4j
        log4j.core.config.Configurator.setRootLevel(log4j.Level.ERROR)
    except Exception as exc:  # pragma: no cover - logging stays as it is
        log.debug("could not quieten Spark's logging: %s", exc)


def spark_session(
    master: str | None = None,
    *,
    app_name: str = "fairqueue",
    config: dict[str, str] | None = None,
    quiet: bool = False,
) -> SparkSession:
    """A Spark session (``local[*]`` unless ``master`` says otherwise) with the JDBC driver loaded.

    Reuses the active session when there is one (its master and jars are then the caller's
    business). On a cluster, the jar is shipped to the executors through ``spark.jars`` (appended to
    any ``spark.jars`` in ``config`` or ``spark-defaults.conf``). ``config``: more Spark settings, e.g.
    ``{"spark.driver.memory": "4g"}`` (applied when the JVM starts, so only by the first session of the
    process). ``quiet``: Spark logs errors only (the command-line tools).

    Raises :class:`ConfigurationError` when PySpark, Java 17+ (:func:`check_java`) or the JDBC jar is missing,
    or a standalone master (``spark://``) cannot be reached.
    """
    try:
        from pyspark.sql import SparkSession
    except ImportError:  # pragma: no cover - depends on the installation
        raise ConfigurationError(
            "PySpark is not installed: install fairqueue's wheel with the spark extra, or pip install 'pyspark>=4'"
        ) from None
    active = SparkSession.getActiveSession()
    if active is not None:
        return active
    if not _jvm_running():
        check_java()
    chosen = master or os.environ.get("FAIRQUEUE_SPARK_MASTER") or "local[*]"
    settings = session_settings(chosen, app_name=app_name, config=config)
    for name, value in session_environment(chosen).items():
        os.environ.setdefault(name, value)
    check_master(chosen)
    if quiet:
        _quiet_jvm(settings)
    builder = SparkSession.builder
    for key, value in settings.items():
        builder = builder.config(key, value)
    try:
        session = builder.getOrCreate()
    except Exception as exc:
        text = str(exc)
        if standalone_masters(chosen) and ("All masters are unresponsive" in text or "stopped SparkContext" in text):
            where = ", ".join(f"{h}:{p}" for h, p in standalone_masters(chosen))
            raise ConfigurationError(
                f"cannot reach the Spark master {where}: it takes connections but did not answer as a Spark master"
            ) from None
        raise
    if quiet:
        session.sparkContext.setLogLevel("ERROR")
    return session
