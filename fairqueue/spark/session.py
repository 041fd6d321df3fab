"""Building a Spark session that can talk to PostgreSQL, and the JDBC form of a database URL.

The traps this module takes care of (each one costs an afternoon the first time):

- the JDBC driver must be on the classpath (``spark.jars``) *and* named in every read/write
  (``driver=org.postgresql.Driver``), or Spark answers "No suitable driver";
- executors must run this Python (``PYSPARK_PYTHON``), or they miss fairqueue and psycopg;
- on machines with several interfaces the driver must bind to an address executors can reach;
  locally that is 127.0.0.1;
- JDBC cannot use a unix socket: the database URL must name a TCP host.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psycopg.conninfo

from fairqueue.errors import ConfigurationError
from fairqueue.urls import redact, to_libpq

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

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


def spark_session(
    master: str | None = None, *, app_name: str = "fairqueue", config: dict[str, str] | None = None
) -> SparkSession:
    """A Spark session (``local[*]`` unless ``master`` says otherwise) with the JDBC driver loaded.

    Reuses the active session when there is one (its master and jars are then the caller's
    business). On a cluster, the jar is shipped to the executors through ``spark.jars``.
    """
    try:
        from pyspark.sql import SparkSession
    except ImportError:  # pragma: no cover - depends on the installation
        raise ConfigurationError("PySpark is not installed: pip install 'fairqueue[spark]'") from None
    active = SparkSession.getActiveSession()
    if active is not None:
        return active
    jar = jdbc_jar()
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    chosen = master or os.environ.get("FAIRQUEUE_SPARK_MASTER") or "local[*]"
    builder = SparkSession.builder.master(chosen).appName(app_name).config("spark.jars", jar)
    if chosen.startswith("local"):
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
        builder = builder.config("spark.driver.host", "127.0.0.1").config("spark.driver.bindAddress", "127.0.0.1")
        builder = builder.config("spark.ui.enabled", "false")
    builder = builder.config("spark.sql.session.timeZone", "UTC")
    for key, value in (config or {}).items():
        builder = builder.config(key, value)
    return builder.getOrCreate()
