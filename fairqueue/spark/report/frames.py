"""Two things every step of the report does with a Spark result: cache it (the tables are read several times)
and collect a small one as plain Python rows (for the summary and the page)."""

from __future__ import annotations

from typing import Any

DataFrame = Any  # pyspark.sql.DataFrame; PySpark is optional, so it is imported where it is used


def keep(df: DataFrame, *, compact: bool = True) -> DataFrame:
    """``df`` cached. A cached plan keeps all its shuffle partitions (adaptive execution does not merge
    them), so a shuffled result is first brought down to the cluster's parallelism: these are aggregates."""
    from pyspark import StorageLevel

    if compact:
        df = df.coalesce(max(1, int(df.sparkSession.sparkContext.defaultParallelism)))
    return df.persist(StorageLevel.MEMORY_AND_DISK)


def rows(df: DataFrame) -> list[dict[str, Any]]:
    """``df`` collected, a dict per row."""
    return [row.asDict() for row in df.collect()]


def micros_columns(df: DataFrame, *names: str) -> DataFrame:
    """Timestamps as Unix microseconds (collecting timestamps would turn them into local naive datetimes)."""
    from pyspark.sql import functions as F

    return df.select(*(F.unix_micros(F.col(c)).alias(c) if c in names else F.col(c) for c in df.columns))
