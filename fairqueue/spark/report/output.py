"""The last step of ``fairqueue report``: writing a :class:`~fairqueue.spark.report.build.Report` out (every table
as Parquet and as one CSV file, ``summary.json``, ``report.html``) to a local directory or any Hadoop URI, and
the command itself (:func:`run_command`), which checks what it can before Spark starts and prints the
headline figures."""

from __future__ import annotations

import contextlib
import json
import shutil
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import date, datetime
from pathlib import Path
from typing import Any

from fairqueue.durations import readable as fmt_duration
from fairqueue.errors import FairqueueError
from fairqueue.spark.errors import spark_failure
from fairqueue.spark.report.build import TABLES, Report, build_report
from fairqueue.spark.report.formatting import fmt_number, fmt_rate, fmt_throughput, fmt_time
from fairqueue.spark.report.html import render_html
from fairqueue.spark.report.params import ReportError, format_duration, report_params
from fairqueue.spark.report.sources import check_live_database

SparkSession = Any  # pyspark.sql.SparkSession; PySpark is optional, so it is imported where it is used


def is_uri(path: str) -> bool:
    """Whether ``path`` is a URI (written through Hadoop's FileSystem) rather than a local path."""
    return "://" in path or path.startswith("file:")


class _Output:
    """Files in the output directory: plain Python for a local path, Hadoop's FileSystem for a URI
    (hdfs://, s3a://, file://: wherever Spark can write). Creating it creates the directory and checks that
    it takes files; a failure of these file operations is a :class:`ReportError` naming the output."""

    def __init__(self, spark: SparkSession, root: str) -> None:
        self.spark = spark
        self.given = root
        self.uri = is_uri(root)
        self.root = root.rstrip("/") if self.uri else str(Path(root).resolve())
        self._fs: Any = None
        with self._failing("cannot write the report to"):
            if self.uri:
                jvm = spark.sparkContext._jvm
                self._path = jvm.org.apache.hadoop.fs.Path
                self._fs = self._path(self.root).getFileSystem(spark.sparkContext._jsc.hadoopConfiguration())
                self._fs.setWriteChecksum(False)
                if not self._fs.mkdirs(self._path(self.root)):
                    raise ReportError(f"cannot write the report to {root}: could not create the directory")
            else:
                Path(self.root).mkdir(parents=True, exist_ok=True)
        probe = f".fairqueue-report-probe-{uuid.uuid4().hex[:8]}"
        self.write_text(probe, "")
        self.delete(probe)

    @contextmanager
    def _failing(self, what: str) -> Iterator[None]:
        try:
            yield
        except FairqueueError:
            raise
        except OSError as exc:
            raise ReportError(f"{what} {self.given}: {exc.strerror or exc}") from None
        except Exception as exc:
            from py4j.protocol import Py4JError
            from pyspark.errors import PySparkException

            if isinstance(exc, PySparkException | Py4JError):
                raise ReportError(f"{what} {self.given}: {spark_failure(exc)}") from None
            raise

    def path(self, *parts: str) -> str:
        return "/".join([self.root, *parts])

    def write_text(self, relative: str, text: str) -> str:
        target = self.path(relative)
        with self._failing("cannot write the report to"):
            if self.uri:
                stream = self._fs.create(self._path(target), True)
                try:
                    stream.write(bytearray(text.encode("utf-8")))
                finally:
                    stream.close()
            else:
                Path(target).write_text(text, encoding="utf-8")
        return target

    def delete(self, relative: str) -> None:
        target = self.path(relative)
        with self._failing("cannot write the report to"):
            if self.uri:
                self._fs.delete(self._path(target), False)
            else:
                Path(target).unlink(missing_ok=True)

    def single_file(self, directory: str, pattern: str, target: str) -> str:
        """Moves the one file ``pattern`` of ``directory`` (Spark's part file) to ``target``; removes
        ``directory``."""
        source_dir, destination = self.path(directory), self.path(target)
        with self._failing("cannot write the report to"):
            if self.uri:
                found = self._fs.globStatus(self._path(f"{source_dir}/{pattern}"))
                self._fs.delete(self._path(destination), False)
                self._fs.rename(found[0].getPath(), self._path(destination))
                self._fs.delete(self._path(source_dir), True)
            else:
                part = next(Path(source_dir).glob(pattern))
                Path(destination).unlink(missing_ok=True)
                part.replace(destination)
                shutil.rmtree(source_dir)
        return destination


def claim_local_output(out: str) -> Path | None:
    """Creates a local output directory (and its missing parents) and checks that it takes files, before
    Spark starts: an unwritable ``--out`` fails at once, not after the computing. Returns the topmost directory
    it created (for :func:`release_local_output` if the report then fails), or None."""
    path = Path(out).expanduser().absolute()
    missing = [p for p in (path, *path.parents) if not p.is_dir()]
    probe = path / f".fairqueue-report-probe-{uuid.uuid4().hex[:8]}"
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe.write_text("", encoding="utf-8")
        probe.unlink()
    except OSError as exc:
        raise ReportError(f"cannot write the report to {out}: {exc.strerror or exc}") from None
    return missing[-1] if missing else None


def release_local_output(created: Path | None) -> None:
    """Removes the directories :func:`claim_local_output` created, if nothing was written in them."""
    if created is None or not created.is_dir():
        return
    directories = sorted((p for p in created.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True)
    for directory in [*directories, created]:
        with contextlib.suppress(OSError):  # not empty: something was written, keep it
            directory.rmdir()


def _json_default(value: object) -> str:
    if isinstance(value, datetime | date):
        return value.isoformat().replace("+00:00", "Z")
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")


def write_report(report: Report, out_dir: str) -> dict[str, str]:
    """Writes every table as Parquet (``parquet/<table>/``) and CSV (``csv/<table>.csv``), the headline
    numbers as ``summary.json`` and the page as ``report.html``. Returns {name: path written}.

    Raises :class:`ReportError` when ``out_dir`` cannot be created or written to."""
    some = next(iter(report.tables.values()))
    spark = some.sparkSession
    out = _Output(spark, out_dir)
    written: dict[str, str] = {}
    written["report.html"] = out.write_text("report.html", render_html(report.page))
    written["summary.json"] = out.write_text(
        "summary.json", json.dumps(report.summary, indent=2, default=_json_default) + "\n"
    )
    for name in TABLES:
        # small aggregates: one file each (coalesce keeps the order of a sorted table)
        target = out.path("parquet", name)
        report.tables[name].coalesce(1).write.mode("overwrite").parquet(target)
        written[f"parquet/{name}"] = target
        staging = f"csv/.{name}.tmp"
        (
            spark.read.parquet(target)  # not computed twice
            .coalesce(1)
            .write.mode("overwrite")
            .option("header", True)
            .option("escape", '"')
            .option("timeZone", "UTC")
            .option("timestampFormat", "yyyy-MM-dd'T'HH:mm:ss.SSSSSSXXX")
            .csv(out.path(staging))
        )
        written[f"csv/{name}.csv"] = out.single_file(staging, "part-*.csv", f"csv/{name}.csv")
    return written


# -- the command ----------------------------------------------------------------------------------------


@contextmanager
def _spark_errors() -> Iterator[None]:
    """Spark's own failures as one line (the CLI prints no tracebacks)."""
    try:
        yield
    except FairqueueError:
        raise
    except Exception as exc:
        from py4j.protocol import Py4JError
        from pyspark.errors import PySparkException

        if isinstance(exc, PySparkException | Py4JError):
            raise ReportError(f"Spark failed: {spark_failure(exc)}") from None
        raise


def headline(summary: dict[str, Any]) -> list[str]:
    """The headline figures, as the command prints them (fairness across fair keys only when some channel had
    two keys or more in a window)."""
    keys = (
        [
            f"fairness within channels across fair keys ({summary['keyed_channels']} channel(s) with 2+ keys in a "
            f"window) mean {fmt_number(summary['key_jain_mean'], 3)}, min {fmt_number(summary['key_jain_min'], 3)}; "
            f"key starvation incidents {summary['key_starvation_incidents']} in {summary['starved_keys']} key(s)"
        ]
        if summary.get("keyed_channels")
        else []
    )
    return [
        f"period {fmt_time(summary['period_start'])} .. {fmt_time(summary['period_end'])}: "
        f"{summary['windows']} window(s) of {format_duration(summary['window_seconds'])} with activity, "
        f"{summary['channels']} channel(s), {summary['kinds']} kind(s)",
        f"jobs {fmt_number(summary['jobs'])} ({fmt_throughput(summary['throughput_per_s'])}), attempts "
        f"{fmt_number(summary['attempts'])}; failure rate {fmt_rate(summary['failure_rate'])}, retry rate "
        f"{fmt_rate(summary['retry_rate'])}",
        f"queue wait p50 {fmt_duration(summary['wait_p50_s'])}, p95 {fmt_duration(summary['wait_p95_s'])}, "
        f"p99 {fmt_duration(summary['wait_p99_s'])}; run time p50 {fmt_duration(summary['run_p50_s'])}, "
        f"p95 {fmt_duration(summary['run_p95_s'])}",
        "fairness (Jain's index of the backlogged channels per window) mean "
        f"{fmt_number(summary['jain_mean'], 3)}, min {fmt_number(summary['jain_min'], 3)}; starvation incidents "
        f"{summary['starvation_incidents']} in {summary['starved_channels']} channel(s) (head waits over "
        f"{fmt_duration(summary['starvation_threshold_seconds'])})",
        *keys,
    ]


def _parent(path: str) -> str:
    return path.rsplit("/", 1)[0]


def run_command(args: Any) -> int:
    """``fairqueue report`` (the options of ``fairqueue.cli``'s report parser)."""
    from fairqueue.urls import resolve

    if args.database_url and not args.include_live:
        raise ReportError("--database-url is only used with --include-live (to read the live table too)")
    database_url = resolve(args.database_url) if args.include_live else None
    params: dict[str, Any] = {
        "source": args.source,
        "since": args.since,
        "until": args.until,
        "window": args.window,
        "starvation_threshold": args.starvation_threshold,
        "database_url": database_url,
    }
    # check the options, the database and a local output before starting Spark
    report_params(**params)
    if args.source is not None and database_url is None and not is_uri(args.source) and not Path(args.source).exists():
        raise ReportError(f"no archive at {args.source}: no such file or directory")
    if database_url is not None:
        check_live_database(database_url)
    created = None if is_uri(args.out) else claim_local_output(args.out)

    from fairqueue.spark.options import spark_config
    from fairqueue.spark.session import spark_session

    try:
        with _spark_errors():
            spark = spark_session(args.master, app_name="fairqueue report", config=spark_config(args), quiet=True)
            if is_uri(args.out):
                _Output(spark, args.out)  # can it be written? (before the computing)
            report = build_report(spark, **params)
            try:
                written = write_report(report, args.out)
            finally:
                report.close()
    except BaseException:
        release_local_output(created)
        raise
    print(f"report written to {args.out}")
    for name in ("report.html", "summary.json"):
        print(f"  {written[name]}")
    print(f"  tables: {', '.join(TABLES)} as Parquet ({_parent(written['parquet/summary'])}/<table>/)")
    print(f"          and CSV ({_parent(written['csv/summary.csv'])}/<table>.csv)")
    for line in headline(report.summary):
        print(line)
    for note in report.notes:
        print(f"note: {note}")
    return 0
