"""Database URLs with a password never show it: not in the CLI's errors (whether the URL came from
--database-url or $FAIRQUEUE_DATABASE_URL), not in the worker's log, not even when the URL is too
broken to parse (urlsplit cannot, or psycopg quotes the broken part in its error)."""

from __future__ import annotations

import threading
from typing import Any

import psycopg
import pytest

from fairqueue.cli import main
from fairqueue.urls import redact, scrub, to_libpq
from fairqueue.worker import Worker, WorkerConfig
from tests.helpers import Records, wait_for

# (URL, its password, pieces of the password that must not show either)
LEAKY_URLS = [
    ("postgresql://u:s3cr#etpw@127.0.0.1:1/db", "s3cr#etpw", ["s3cr", "etpw"]),
    ("postgresql://u:s3cr/etpw@127.0.0.1:1/db", "s3cr/etpw", ["s3cr", "etpw"]),
    ("postgresql://u:my s3cret@127.0.0.1:1/db", "my s3cret", ["s3cret"]),
    ("postgresql://u:s3cr%zzet@127.0.0.1:1/db", "s3cr%zzet", ["s3cr", "zzet"]),
    ("postgresql://u@127.0.0.1:1/db?password=hunter2", "hunter2", []),
    ("postgresql://u@127.0.0.1:1/db?sslmode=disable&password=hunter2&connect_timeout=2", "hunter2", []),
    ("postgresql://u:pw@127.0.0.1:1/db?password=hunt er2", "hunt er2", ["hunt", "er2"]),
    ("postgresql://u:s3cr%40etpw@127.0.0.1:1/db", "s3cr%40etpw", ["s3cr@etpw", "s3cr", "etpw"]),
    ("postgresql://u:s3cr@etpw@127.0.0.1:1/db", "s3cr@etpw", ["s3cr", "etpw"]),
    ("postgresql://u:s3cretpw@127.0.0.1:notaport/db", "s3cretpw", []),
    ("host=127.0.0.1 password=s3cr etpw", "s3cr etpw", ["s3cr", "etpw"]),
]
IDS = [url for url, _, _ in LEAKY_URLS]


def _assert_hidden(text: str, secret: str, pieces: list[str]) -> None:
    for piece in [secret, *pieces]:
        assert piece not in text, f"{piece!r} shows in {text!r}"


@pytest.mark.parametrize(("url", "secret", "pieces"), LEAKY_URLS, ids=IDS)
def test_redact_masks_the_password_of_urls_it_cannot_parse(url: str, secret: str, pieces: list[str]) -> None:
    shown = redact(url)
    _assert_hidden(shown, secret, pieces)
    assert "***" in shown


@pytest.mark.parametrize(("url", "secret", "pieces"), LEAKY_URLS, ids=IDS)
def test_to_libpq_errors_never_quote_the_password(url: str, secret: str, pieces: list[str]) -> None:
    try:
        to_libpq(url)
    except Exception as exc:
        _assert_hidden(str(exc), secret, pieces)


@pytest.mark.parametrize("source", ["option", "environment"])
@pytest.mark.parametrize("command", [["status"], ["enqueue", "k"], ["migrate"]])
@pytest.mark.parametrize(("url", "secret", "pieces"), LEAKY_URLS, ids=IDS)
def test_the_cli_never_prints_the_password(
    url: str,
    secret: str,
    pieces: list[str],
    command: list[str],
    source: str,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    if source == "option":
        monkeypatch.delenv("FAIRQUEUE_DATABASE_URL", raising=False)
        argv = [*command, "--database-url", url]
    else:
        monkeypatch.setenv("FAIRQUEUE_DATABASE_URL", url)
        argv = command
    code = main(argv)
    out, err = capsys.readouterr()
    assert code in (1, 2)
    assert len(err.strip().splitlines()) == 1 and err.startswith("fairqueue: error: "), err
    assert "Traceback" not in err
    _assert_hidden(out + err, secret, pieces)


def test_scrub_leaves_words_that_merely_contain_a_short_password() -> None:
    assert scrub('unexpected spaces found in "a b"', "postgresql://u:x@h/db?password=a b") == (
        'unexpected spaces found in "***"'
    )


@pytest.mark.parametrize(
    ("password_part", "secret"),
    [(":s3cr#etpw@", "s3cr#etpw"), ("@", "hunter2"), (":s3cr%2Fetpw@", "s3cr%2Fetpw")],
    ids=["hash", "query", "encoded-slash"],
)
def test_the_worker_logs_its_database_without_the_password(
    db_url: str, worker_log: Records, password_part: str, secret: str
) -> None:
    # the test server trusts local connections, so any password connects
    assert db_url.startswith("postgresql://postgres@"), db_url
    url = db_url.replace("postgres@", "postgres" + password_part, 1)
    if secret == "hunter2":
        url += ("&" if "?" in url else "?") + "password=hunter2"
    with psycopg.connect(to_libpq(url)):
        pass  # the URL works
    worker = Worker(WorkerConfig(database_url=url, concurrency=1, poll_interval=0.2, maintenance=False))
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    try:
        wait_for(lambda: worker.worker_id, what="the worker to start")
        started: Any = wait_for(
            lambda: next((r for r in worker_log.records if r.getMessage() == "worker started"), None),
            what="the start record",
        )
        assert "***" in started.database
        assert secret not in started.database and "s3cr" not in started.database
    finally:
        worker.stop()
        thread.join(20)
