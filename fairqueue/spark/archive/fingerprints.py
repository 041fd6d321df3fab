"""Row counts and checksums of history rows, computed independently by each engine: by PostgreSQL over a
partition (steps 1 and 5 of an archive run) and by Spark over the staged Parquet copy (step 3). The copy is
verified, and the partition dropped, only when the two agree outcome by outcome.

The checksum is the sum, over rows, of the first 60 bits of the MD5 of a canonical UTF-8 text of the row
(:data:`CANONICAL_FIELDS`): the same rows give the same sum whatever their order, and a lost, added or altered
row changes it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import psycopg
from psycopg import sql

from fairqueue.spark.archive.database import history_table
from fairqueue.sql import Q

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

#: (column, kind) in the order they enter the canonical text of a row. Each value is written as
#: ``<length>:<text>`` (length in characters; NULL as ``N``) and the values are joined with ``|``:
#: numbers in decimal, booleans as ``t``/``f``, timestamps as microseconds since the epoch, text as it
#: is, and JSON as PostgreSQL prints jsonb (which is what the archive stores). A column added later is of
#: kind ``optional``: text that enters the canonical text only when it is not NULL (no ``N``), so a row
#: without it hashes as it did before the column existed, and archives written before it still check out
#: (their files lack the column; readers take it as NULL).
CANONICAL_FIELDS = (
    ("job_id", "number"),
    ("attempt", "number"),
    ("outcome", "text"),
    ("final", "bool"),
    ("kind", "text"),
    ("channel", "text"),
    ("args", "text"),
    ("result", "text"),
    ("error", "text"),
    ("worker_id", "number"),
    ("unique_key", "text"),
    ("fifo_key", "text"),
    ("enqueued_at", "time"),
    ("ready_at", "time"),
    ("started_at", "time"),
    ("finished_at", "time"),
    ("fair_key", "optional"),
)


@dataclass(frozen=True)
class Fingerprint:
    """Row count and checksum of a set of history rows."""

    rows: int
    checksum: int

    def __add__(self, other: Fingerprint) -> Fingerprint:
        return Fingerprint(self.rows + other.rows, self.checksum + other.checksum)

    def __str__(self) -> str:
        return f"{self.rows:,} rows, checksum {self.checksum}"


#: fingerprint of each outcome present
Fingerprints = dict[str, Fingerprint]


def total(fingerprints: Fingerprints) -> Fingerprint:
    return sum(fingerprints.values(), Fingerprint(0, 0))


def _sql_row_hash() -> sql.Composable:
    """The row hash as PostgreSQL computes it (``Q.history_row_hash``), over :data:`CANONICAL_FIELDS`."""
    as_text = {
        "bool": Q.history_hash_bool,
        "time": Q.history_hash_time,
        "number": Q.history_hash_text,
        "text": Q.history_hash_text,
        "optional": Q.history_hash_text,
    }
    fields = []
    for name, kind in CANONICAL_FIELDS:
        field = sql.SQL(Q.history_hash_field).format(value=sql.SQL(as_text[kind]).format(column=sql.Identifier(name)))
        # an optional NULL is left out: concat_ws skips NULLs (a value is never just N: it has a length)
        fields.append(sql.SQL("nullif({field}, 'N')").format(field=field) if kind == "optional" else field)
    return sql.SQL(Q.history_row_hash).format(fields=sql.SQL(", ").join(fields))


def sql_fingerprints(conn: psycopg.Connection[Any], table: str) -> Fingerprints:
    """Count and checksum of each outcome in ``fairqueue.<table>``, computed by PostgreSQL."""
    statement = sql.SQL(Q.history_fingerprints).format(row_hash=_sql_row_hash(), table=history_table(table))
    rows = conn.execute(statement).fetchall()
    return {str(outcome): Fingerprint(int(n), int(s)) for outcome, n, s in rows}


def spark_fingerprints(df: DataFrame) -> Fingerprints:
    """Count and checksum of each outcome in ``df`` (the archive's columns), computed by Spark. An optional
    column ``df`` lacks (an archive written before it existed) is NULL."""
    from pyspark.sql import functions as F

    for name, kind in CANONICAL_FIELDS:
        if kind == "optional" and name not in df.columns:
            df = df.withColumn(name, F.lit(None).cast("string"))

    parts = []
    for name, kind in CANONICAL_FIELDS:
        column = F.col(name)
        if kind == "bool":
            value = F.when(column, F.lit("t")).when(~column, F.lit("f"))
        elif kind == "time":
            value = F.unix_micros(column).cast("string")
        else:
            value = column.cast("string")
        text = F.concat(F.length(value).cast("string"), F.lit(":"), value)
        parts.append(text if kind == "optional" else F.coalesce(text, F.lit("N")))  # concat_ws skips NULLs
    canonical = F.concat_ws("|", *parts)
    row_hash = F.conv(F.substring(F.md5(F.encode(canonical, "UTF-8")), 1, 15), 16, 10).cast("decimal(38,0)")
    rows = df.groupBy("outcome").agg(F.count(F.lit(1)).alias("rows"), F.sum(row_hash).alias("sum")).collect()
    return {str(r["outcome"]): Fingerprint(int(r["rows"]), int(r["sum"] or 0)) for r in rows}


def describe_outcomes(fingerprints: Fingerprints) -> str:
    """The rows of each outcome, for messages: ``failed 3, succeeded 1,000`` (``no rows`` when empty)."""
    return ", ".join(f"{o} {f.rows:,}" for o, f in sorted(fingerprints.items())) or "no rows"
