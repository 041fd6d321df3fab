"""Checks a project's own Alembic environment for fairqueue's revisions (``fairqueue migrate
--check-alembic alembic.ini``).

A project lists fairqueue's revisions in its alembic.ini's ``version_locations``
(docs/migrations.md). When that list is misread, Alembic says nothing: a location it cannot find is
skipped, ``alembic heads`` shows nothing and ``alembic upgrade heads`` exits 0 having installed
nothing. The commonest cause is ``path_separator = os``, which ``alembic init`` writes and which
splits ``fairqueue:_alembic/versions`` at its colon. This module reads the ini as the installed
Alembic does and names the first problem, with its fix, on one line.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from fairqueue.errors import ConfigurationError
from fairqueue.sql import HEAD, REVISIONS

#: How a project lists fairqueue's revisions in its version_locations (a package resource).
LOCATION = "fairqueue:_alembic/versions"
RECIPE = "see docs/migrations.md, 'Including fairqueue in your own Alembic environment'"
_KNOWN = {r.id for r in REVISIONS}
_SEPARATORS = {"space": "spaces", "newline": "newlines", "os": repr(os.pathsep), ":": "':'", ";": "';'"}


class AlembicConfigError(ConfigurationError):
    """The Alembic environment of an alembic.ini would not install or upgrade fairqueue's schema."""


def _resolve(location: str) -> Path | None:
    """The folder a version location names, as Alembic resolves it (None: a package that is missing)."""
    from alembic.util import coerce_resource_to_filename

    try:
        return Path(coerce_resource_to_filename(location)).absolute()
    except (ModuleNotFoundError, ValueError):
        return None


def _within(path: str | Path, folder: Path) -> bool:
    return Path(path).resolve().is_relative_to(folder.resolve())


def _config(ini: str) -> Any:
    from alembic.config import Config

    path = Path(ini)
    if not path.is_file():
        raise AlembicConfigError(f"no such file: {ini}")
    config = Config(str(path))
    if not config.file_config.has_section(config.config_ini_section):
        raise AlembicConfigError(f"{ini} has no [{config.config_ini_section}] section: is it an alembic.ini?")
    return config


def _locations(ini: str, config: Any) -> list[str]:
    raw = config.file_config.get(config.config_ini_section, "version_locations", fallback=None)
    if not raw:
        raise AlembicConfigError(
            f"{ini} has no version_locations: list your own versions folder and {LOCATION} there, one per "
            f"line, with path_separator = newline ({RECIPE})"
        )
    try:
        locations: list[str] = config.get_version_locations_list() or []
    except ValueError as exc:  # an unknown path_separator
        raise AlembicConfigError(f"{ini}: {exc}") from None
    if LOCATION in raw and LOCATION not in locations:
        separator = config.get_main_option("path_separator") or config.get_main_option("version_path_separator")
        cut = ", ".join(repr(loc) for loc in locations)
        raise AlembicConfigError(
            f"{ini} splits version_locations on {_SEPARATORS.get(str(separator), repr(separator))} "
            f"(path_separator = {separator}), which cuts {LOCATION} apart (Alembic reads {cut}, and finds none of "
            f"fairqueue's revisions): set `path_separator = newline` and list one location per line ({RECIPE})"
        )
    return locations


def check_alembic_ini(ini: str = "alembic.ini") -> str:
    """One line saying what the Alembic environment of ``ini`` finds (relative locations are read from
    the current folder, as Alembic reads them). Raises :class:`AlembicConfigError`, naming the first
    problem and its fix, when ``alembic upgrade heads`` would not install or upgrade fairqueue's schema
    as this fairqueue ships it, or when the project's own revisions are not on a branch of their own."""
    from alembic.script import ScriptDirectory
    from alembic.util import CommandError

    config = _config(ini)
    locations = _locations(ini, config)
    folders: dict[str, Path] = {}
    for location in locations:
        folder = _resolve(location)
        if folder is None or not folder.is_dir():
            raise AlembicConfigError(
                f"{ini}: the version location {location!r} is not a folder"
                + (f" (is fairqueue installed from its wheel? {RECIPE})" if location == LOCATION else "")
                + ": Alembic skips it without a word"
            )
        folders[location] = folder
    ours = [loc for loc, folder in folders.items() if (folder / f"{REVISIONS[0].id}_{REVISIONS[0].slug}.py").is_file()]
    if not ours:
        raise AlembicConfigError(
            f"none of {ini}'s version_locations ({', '.join(locations)}) holds fairqueue's revisions: add "
            f"{LOCATION} ({RECIPE})"
        )
    fairqueue_folder = folders[ours[0]]
    own = [loc for loc in locations if loc not in ours]
    if not own:
        raise AlembicConfigError(
            f"{ini} lists only fairqueue's revisions in version_locations: list your own versions folder first "
            f"(else `alembic revision` writes into fairqueue's) ({RECIPE})"
        )
    try:
        scripts = list(ScriptDirectory.from_config(config).walk_revisions())
    except CommandError as exc:
        raise AlembicConfigError(f"{ini}: Alembic cannot read the revisions: {exc}") from None

    fairqueue_scripts = {s.revision: s for s in scripts if s.revision in _KNOWN}
    if HEAD not in fairqueue_scripts:
        last = max(fairqueue_scripts, default="none")
        raise AlembicConfigError(
            f"{ini} finds fairqueue's revisions up to {last} in {fairqueue_folder}, and this fairqueue's end at "
            f"{HEAD}: list {LOCATION}, the installed fairqueue's ({RECIPE})"
        )
    for script in scripts:
        if script.revision in _KNOWN:
            continue
        if _within(script.path, fairqueue_folder):
            raise AlembicConfigError(
                f"your revision {script.revision} ({script.path}) is in fairqueue's folder, where reinstalling "
                "fairqueue loses it, and continues fairqueue's branch: make your revisions with `alembic revision "
                f"--head base --branch-label <name> --version-path <your versions folder>` ({RECIPE})"
            )
        parents = script.down_revision if isinstance(script.down_revision, tuple) else (script.down_revision,)
        continued = sorted(p for p in parents if p in _KNOWN)
        if continued:
            raise AlembicConfigError(
                f"your revision {script.revision} ({script.path}) continues fairqueue's branch (its "
                f"down_revision is {', '.join(continued)}): your revisions need a branch of their own "
                f"(`alembic revision --head base --branch-label <name>`) ({RECIPE})"
            )
    yours = [s for s in scripts if s.revision not in _KNOWN]
    heads = sorted(s.revision for s in yours if s.is_head)
    mine = f"{len(yours)} revision{'s' if len(yours) != 1 else ''}" + (f" (heads: {', '.join(heads)})" if heads else "")
    return (
        f"{ini}: fairqueue's revisions {REVISIONS[0].id} to {HEAD} (branch fairqueue) in {fairqueue_folder}; "
        f"yours: {mine} in {', '.join(own)}. `alembic upgrade heads` installs or upgrades both"
    )
