"""A day's directory in the archive and its manifest (``day=YYYY-MM-DD/_fairqueue_manifest.json``): which copy
of which partition, from which database, each file belongs to. Step 4 of an archive run: remove what an
interrupted attempt at the same partition left (never another database's or another partition's copy), move
the staged files into place and record the copy."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime
from typing import Any

from fairqueue.spark.archive.database import Partition, SourceDatabase
from fairqueue.spark.archive.files import ArchiveFiles, StoredFile
from fairqueue.spark.archive.fingerprints import CANONICAL_FIELDS, Fingerprints, total
from fairqueue.spark.archive.params import ArchiveError, log

MANIFEST = "_fairqueue_manifest.json"


def _copy_owners(manifest: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """{file relative to the day's directory: the manifest entry of the copy that lists it}."""
    owners: dict[str, dict[str, Any]] = {}
    for copy in manifest["copies"]:
        if isinstance(copy, dict) and isinstance(copy.get("files"), list):
            for name in copy["files"]:
                owners[str(name)] = copy
    return owners


def check_not_foreign(manifest: dict[str, Any], day_dir: str, part: Partition, source: SourceDatabase) -> None:
    """Stops (deleting nothing) when the day's manifest holds a copy with this partition's archive id that
    another database made: then this database's partition carries a copied comment (a restored dump, a clone)."""
    for copy in manifest["copies"]:
        if isinstance(copy, dict) and copy.get("file_prefix") == part.tag and not source.made(copy):
            theirs = copy.get("source_database")
            name = theirs.get("name") if isinstance(theirs, dict) else None
            raise ArchiveError(
                f"{day_dir} already holds a copy of {copy.get('partition', 'a partition')} with the archive id "
                f"{part.archive_id} made from another database ({name or 'unknown'}); {part.table} here carries the "
                f"same id (restored from a dump or cloned?). Nothing was deleted. Give it a new id with "
                f"COMMENT ON TABLE fairqueue.{part.table} IS NULL and run again"
            )


def remove_copies(files: ArchiveFiles, day_dir: str, part: Partition, source: SourceDatabase) -> None:
    """Deletes the files an earlier, interrupted attempt at the same partition left in the day's directory;
    never a file that the manifest lists as another database's or another partition's copy (ArchiveError)."""
    tag = part.tag
    owners = _copy_owners(read_manifest(files, day_dir))
    doomed = []
    for name, is_dir in files.children(day_dir):
        if not (is_dir and name.startswith("outcome=")):
            continue
        for child, child_is_dir in files.children(f"{day_dir}/{name}"):
            if not child_is_dir and child.startswith(tag):
                owner = owners.get(f"{name}/{child}")
                if owner is not None and not (owner.get("file_prefix") == tag and source.made(owner)):
                    raise ArchiveError(
                        f"{day_dir}/{name}/{child} is listed in the manifest as a copy of "
                        f"{owner.get('partition', 'another partition')} from another database; nothing was deleted"
                    )
                doomed.append(f"{day_dir}/{name}/{child}")
    for where in doomed:
        files.delete(where)


def move_into_place(files: ArchiveFiles, staged: list[StoredFile], day_dir: str, part: Partition) -> list[str]:
    """Moves the staged Parquet files into the day's outcome directories; returns their paths relative to it."""
    expected_day = f"day={part.day.isoformat()}"
    moved = []
    for f in staged:
        if f.grandparent != expected_day or not f.parent.startswith("outcome="):
            raise ArchiveError(f"unexpected file in the staging area: {f.path}")
        relative = f"{f.parent}/{part.tag}{f.name.removeprefix('part-')}"
        files.mkdirs(f"{day_dir}/{f.parent}")
        files.rename(f.path, f"{day_dir}/{relative}")
        if files.size(f"{day_dir}/{relative}") != f.size:  # on object stores a move is a copy
            raise ArchiveError(f"{day_dir}/{relative} does not have the size of the file staged for it")
        moved.append(relative)
    return moved


def read_manifest(files: ArchiveFiles, day_dir: str) -> dict[str, Any]:
    """The day's manifest (``{"copies": []}`` when there is none; an unreadable one is set aside, renamed)."""
    for name in (MANIFEST, MANIFEST + ".tmp"):  # .tmp: a run stopped between writing it and renaming it
        where = f"{day_dir}/{name}"
        if files.exists(where):
            try:
                manifest = json.loads(files.read_text(where))
                if isinstance(manifest, dict) and isinstance(manifest.get("copies"), list):
                    return manifest
            except ValueError:
                pass
            log.warning("fairqueue archive: %s is unreadable; starting a new one", where)
            files.rename(where, f"{where}.unreadable-{uuid.uuid4().hex[:8]}")
    return {"copies": []}


def record_manifest(
    files: ArchiveFiles, day_dir: str, part: Partition, source: SourceDatabase, outcomes: Fingerprints, moved: list[str]
) -> None:
    """Adds this copy to the day's manifest (replacing an interrupted attempt's entry for the same partition)."""
    manifest = read_manifest(files, day_dir)
    check_not_foreign(manifest, day_dir, part, source)
    copies = [c for c in manifest["copies"] if not (isinstance(c, dict) and c.get("file_prefix") == part.tag)]
    whole = total(outcomes)
    copies.append(
        {
            "partition": f"fairqueue.{part.table}",
            "partition_oid": part.oid,
            "archive_id": part.archive_id,
            "source_database": source.record(),
            "file_prefix": part.tag,
            "rows": whole.rows,
            "checksum": str(whole.checksum),
            "outcomes": {o: {"rows": f.rows, "checksum": str(f.checksum)} for o, f in sorted(outcomes.items())},
            "files": sorted(moved),
            "archived_at": datetime.now(UTC).isoformat(timespec="seconds"),
        }
    )
    manifest = {
        "format": 1,
        "day": part.day.isoformat(),
        "rows": sum(int(c.get("rows", 0)) for c in copies if isinstance(c, dict)),
        "checksum_fields": [f"{name}:{kind}" for name, kind in CANONICAL_FIELDS],
        "copies": copies,
    }
    final, temporary = f"{day_dir}/{MANIFEST}", f"{day_dir}/{MANIFEST}.tmp"
    files.write_text(temporary, json.dumps(manifest, indent=2) + "\n")
    files.delete(final)
    files.rename(temporary, final)
