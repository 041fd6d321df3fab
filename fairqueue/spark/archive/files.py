"""The archive target's file system, a local path or any Hadoop URI (``hdfs://``, ``s3a://``, ``file://``),
used through Spark's JVM: the few operations an archive run needs to stage, move and list Parquet files and to
read and write the manifest, each failing as :class:`ArchiveError`."""

from __future__ import annotations

import re
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fairqueue.spark.archive.params import ArchiveError
from fairqueue.spark.errors import spark_message

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

STAGING = "_staging"  # under the target; Spark skips names starting with "_" when it reads the archive


@dataclass(frozen=True)
class StoredFile:
    """A file found under a directory of the target, with the names of the two directories above it."""

    path: str  # fully qualified
    name: str
    parent: str  # name of the directory holding it (outcome=...)
    grandparent: str  # (day=...)
    size: int


class ArchiveFiles:
    """The few Hadoop FileSystem operations the archive needs, on the target's file system."""

    def __init__(self, spark: SparkSession, root: str) -> None:
        self.spark = spark
        jvm: Any = spark._jvm
        self._jvm = jvm
        conf = spark._jsc.hadoopConfiguration()
        self.root = root.rstrip("/")
        self._fs = self._path(self.root).getFileSystem(conf)

    def _path(self, where: str) -> Any:
        return self._jvm.org.apache.hadoop.fs.Path(where)

    def join(self, *parts: str) -> str:
        return "/".join([self.root, *parts])

    def exists(self, where: str) -> bool:
        return bool(self._fs.exists(self._path(where)))

    def delete(self, where: str) -> None:
        if self.exists(where) and not self._fs.delete(self._path(where), True):
            raise ArchiveError(f"could not delete {where}")

    def mkdirs(self, where: str) -> None:
        if not self._fs.mkdirs(self._path(where)):
            raise ArchiveError(f"could not create the directory {where}")

    def rename(self, source: str, target: str) -> None:
        if not self._fs.rename(self._path(source), self._path(target)):
            raise ArchiveError(f"could not move {source} to {target}")

    def size(self, where: str) -> int:
        return int(self._fs.getFileStatus(self._path(where)).getLen())

    def write_text(self, where: str, text: str) -> None:
        stream = self._fs.create(self._path(where), True)
        try:
            stream.write(bytearray(text.encode()))
        finally:
            stream.close()

    def read_text(self, where: str) -> str:
        stream = self._fs.open(self._path(where))
        try:
            out = self._jvm.java.io.ByteArrayOutputStream()
            self._jvm.org.apache.hadoop.io.IOUtils.copyBytes(stream, out, 65536, False)
            return bytes(out.toByteArray()).decode()
        finally:
            stream.close()

    def children(self, where: str) -> list[tuple[str, bool]]:
        """(name, is a directory) of each entry of ``where`` (none when it does not exist)."""
        if not self.exists(where):
            return []
        return [(str(s.getPath().getName()), bool(s.isDirectory())) for s in self._fs.listStatus(self._path(where))]

    def files_under(self, where: str) -> list[StoredFile]:
        found = []
        listing = self._fs.listFiles(self._path(where), True)
        while listing.hasNext():
            status = listing.next()
            path = status.getPath()
            parent = path.getParent()
            found.append(
                StoredFile(
                    path=str(path.toString()),
                    name=str(path.getName()),
                    parent=str(parent.getName()),
                    grandparent=str(parent.getParent().getName()),
                    size=int(status.getLen()),
                )
            )
        return found


def target_uri(to: str) -> str:
    """``to`` as a URI: local paths (relative or absolute, without a scheme) become absolute ``file:`` URIs."""
    if not to or not to.strip():
        raise ArchiveError("no archive target: pass --to PATH (a directory or a Hadoop-compatible URI)")
    if re.match(r"^[A-Za-z][A-Za-z0-9+.-]*:", to) and not re.match(r"^[A-Za-z]:[\\/]", to):
        return to
    # not Path.as_uri(): Hadoop's Path takes the path as it is, and would not undo the percent-encoding
    return "file://" + Path(to).expanduser().absolute().as_posix()


def check_writable(files: ArchiveFiles) -> None:
    """Fails early, with the reason, when the target cannot take files."""
    probe = files.join(STAGING, f"probe-{uuid.uuid4().hex[:8]}")
    try:
        files.mkdirs(files.root)
        files.write_text(probe, "fairqueue archive probe\n")
        files.delete(probe)
    except ArchiveError as exc:
        raise ArchiveError(f"the archive target {files.root} is not writable: {exc}") from None
    except Exception as exc:
        raise ArchiveError(f"the archive target {files.root} is not writable: {spark_message(exc)}") from None
