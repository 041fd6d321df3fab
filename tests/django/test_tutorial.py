"""docs/django.md's "Django in 5 minutes", followed in a fresh virtualenv with the built wheel.

The Python files are taken from the page's code blocks (a block whose first line is ``# path`` is
that file; ``# path (append)`` is added to its end), and every command the test runs is checked to
appear on the page, so the page and the test cannot drift apart.
"""

from __future__ import annotations

import json
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path

import psycopg
import psycopg.conninfo
import pytest

from tests.installs import build_wheel, clean_env

REPO = Path(__file__).resolve().parents[2]
PAGE = REPO / "docs" / "django.md"

pytestmark = pytest.mark.slow


def tutorial() -> str:
    text = PAGE.read_text()
    start = text.index("## Django in 5 minutes")
    return text[start : text.index("\n## ", start + 1)]


def files_from_page() -> list[tuple[str, bool, str]]:
    blocks = re.findall(r"```python\n(.*?)```", tutorial(), flags=re.S)
    found = []
    for block in blocks:
        header, _, body = block.partition("\n")
        match = re.fullmatch(r"# (\S+)( \(append\))?", header.strip())
        assert match, f"a python block of the tutorial does not name its file: {header!r}"
        found.append((match[1], bool(match[2]), body))
    return found


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def run(cmd: list[str], cwd: Path, env: dict[str, str], on_page: str | None = None) -> str:
    if on_page is not None:
        assert on_page in tutorial(), f"the tutorial no longer says {on_page!r}"
    result = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=600, check=False)
    assert result.returncode == 0, f"{cmd}\n{result.stdout}\n{result.stderr}"
    return result.stdout


def test_the_django_tutorial_works_in_a_fresh_virtualenv(tmp_path: Path, empty_database_url: str) -> None:
    wheel = build_wheel(tmp_path / "wheels")
    venv = tmp_path / "venv"
    env = clean_env(venv)
    run([sys.executable, "-m", "venv", str(venv)], tmp_path, env, on_page="python -m venv .venv")
    run(
        [str(venv / "bin" / "pip"), "install", "-q", f"{wheel}[django]"],
        tmp_path,
        env,
        on_page="fairqueue-0.1.0-py3-none-any.whl[django]",
    )
    run(["django-admin", "startproject", "shop"], tmp_path, env, on_page="django-admin startproject shop")
    project = tmp_path / "shop"
    python = str(venv / "bin" / "python")
    run([python, "manage.py", "startapp", "orders"], project, env, on_page="python manage.py startapp orders")

    for path, append, body in files_from_page():
        target = project / path
        if append:
            target.write_text(target.read_text() + "\n" + body)
        else:
            target.write_text(body)

    database = psycopg.conninfo.conninfo_to_dict(empty_database_url)
    env |= {
        "PGHOST": str(database.get("host", "")),
        "PGPORT": str(database.get("port", "")),
        "PGDATABASE": str(database["dbname"]),
        "PGUSER": str(database.get("user", "")),
        "DJANGO_SUPERUSER_PASSWORD": "tutorial-password",
    }
    run(
        [python, "manage.py", "makemigrations", "orders"],
        project,
        env,
        on_page="python manage.py makemigrations orders",
    )
    run([python, "manage.py", "migrate"], project, env, on_page="python manage.py migrate")
    run(
        [python, "manage.py", "createsuperuser", "--noinput", "--username", "admin", "--email", "admin@example.com"],
        project,
        env,
        on_page="python manage.py createsuperuser",
    )

    port = free_port()
    assert "python manage.py runserver" in tutorial()
    server = subprocess.Popen(
        [python, "manage.py", "runserver", "--noreload", f"127.0.0.1:{port}"],
        cwd=project,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    worker = None
    try:
        answer = None
        deadline = time.monotonic() + 60
        while answer is None:
            try:
                request = urllib.request.Request(f"http://127.0.0.1:{port}/checkout/acme/", data=b"total=42")
                with urllib.request.urlopen(request, timeout=10) as response:
                    answer = json.loads(response.read())
            except OSError:
                assert time.monotonic() < deadline, "runserver did not answer"
                time.sleep(0.2)
        assert set(answer) == {"order", "job"}

        assert "python manage.py runworker" in tutorial()
        worker = subprocess.Popen(
            [python, "manage.py", "runworker"], cwd=project, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
        )
        with psycopg.connect(empty_database_url, autocommit=True) as conn:
            deadline = time.monotonic() + 60
            final_attempt = (
                "SELECT outcome, channel, result #>> '{}' FROM fairqueue.completed_job WHERE job_id = %s AND final"
            )
            while (final := conn.execute(final_attempt, (answer["job"],)).fetchone()) is None:
                assert worker.poll() is None and time.monotonic() < deadline, "the worker did not finish the job"
                time.sleep(0.1)
            # ctx.atomic(): the order's update committed with the job's success
            confirmed = conn.execute("SELECT confirmed FROM orders_order WHERE id = %s", (answer["order"],)).fetchone()
        assert final == ("succeeded", "acme", f"order {answer['order']} confirmed")
        assert confirmed == (True,)
        worker.send_signal(signal.SIGINT)  # Ctrl-C
        assert worker.wait(30) == 0

        # "in the admin the job appears under Fair queue with its outcome and result"
        login = {"username": "admin", "password": "tutorial-password", "next": "/admin/"}
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/admin/login/", timeout=10) as response:
            cookie = response.headers["Set-Cookie"].split(";")[0]
            token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', response.read().decode())
        assert token is not None
        opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor())
        request = urllib.request.Request(
            f"http://127.0.0.1:{port}/admin/login/",
            data=urllib.parse.urlencode(login | {"csrfmiddlewaretoken": token[1]}).encode(),
            headers={"Cookie": cookie, "Referer": f"http://127.0.0.1:{port}/admin/login/"},
        )
        opener.open(request, timeout=10).read()
        history = (
            opener.open(f"http://127.0.0.1:{port}/admin/fairqueue/completedjob/?q={answer['job']}", timeout=10)
            .read()
            .decode()
        )
        rows = history[history.index('id="result_list"') :]
        rows = rows[: rows.index("</table>")]
        assert "orders.confirm" in rows and "succeeded" in rows and "acme" in rows
    finally:
        for proc in (worker, server):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait()
