"""fairqueue's data pipeline on Spark (PySpark): history archive, analytics, bulk enqueue.

Needs the ``spark`` extra (the wheel's ``[spark]``, or ``pip install 'pyspark>=4'``) and PostgreSQL's JDBC driver jar
(Debian: ``apt-get install libpostgresql-jdbc-java``; elsewhere point ``FAIRQUEUE_JDBC_JAR`` at it).
Everything runs on ``local[*]`` by default and on any cluster given ``master=`` / ``--master``.
"""

from __future__ import annotations

from fairqueue.spark.bulk import BulkRunResult, enqueue_dataframe
from fairqueue.spark.session import JdbcTarget, jdbc_jar, jdbc_target, spark_session

__all__ = ["BulkRunResult", "JdbcTarget", "enqueue_dataframe", "jdbc_jar", "jdbc_target", "spark_session"]
