"""The Django admin in a real browser: headless Chromium logs in, opens the job list and a job.

Runs the example project (examples/django_shop) under `manage.py runserver`; screenshots go to
test-artifacts/ at the repository's root. `make test` installs Chromium and its driver with apt.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg.conninfo
import pytest

pytest.importorskip("django")
webdriver = pytest.importorskip("selenium.webdriver")

from selenium.webdriver.chrome.service import Service  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.support import expected_conditions  # noqa: E402
from selenium.webdriver.support.wait import WebDriverWait  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
PROJECT = REPO / "examples" / "django_shop"
ARTIFACTS = REPO / "test-artifacts"
PASSWORD = "browser-test-password"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@pytest.fixture
def site(empty_database_url: str) -> Iterator[tuple[str, dict[str, Any]]]:
    """The example project served on a free port, with a superuser and three queued jobs."""
    database = psycopg.conninfo.conninfo_to_dict(empty_database_url)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DJANGO_", "FAIRQUEUE_"))} | {
        "PGHOST": str(database.get("host", "")),
        "PGPORT": str(database.get("port", "")),
        "PGDATABASE": str(database["dbname"]),
        "PGUSER": str(database.get("user", "")),
        "DJANGO_SUPERUSER_PASSWORD": PASSWORD,
    }

    def manage(*args: str) -> None:
        subprocess.run(
            [sys.executable, "manage.py", *args], cwd=PROJECT, env=env, check=True, capture_output=True, timeout=120
        )

    manage("migrate", "--verbosity", "0")
    manage("createsuperuser", "--noinput", "--username", "admin", "--email", "admin@example.com")
    port = _free_port()
    server = subprocess.Popen(
        [sys.executable, "manage.py", "runserver", "--noreload", f"127.0.0.1:{port}"],
        cwd=PROJECT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    base = f"http://127.0.0.1:{port}"
    jobs = []
    try:
        deadline = time.monotonic() + 60
        for tenant in ("acme", "globex", "initech"):
            while True:
                try:
                    request = urllib.request.Request(f"{base}/checkout/{tenant}/", data=b"total=42")
                    with urllib.request.urlopen(request, timeout=10) as response:
                        jobs.append(json.loads(response.read())["job"])
                    break
                except OSError:
                    assert time.monotonic() < deadline, "runserver did not answer"
                    time.sleep(0.2)
        yield base, {"jobs": jobs}
    finally:
        server.kill()
        server.wait()


@pytest.fixture
def browser() -> Iterator[Any]:
    chromium, driver = shutil.which("chromium"), shutil.which("chromedriver")
    if not chromium or not driver:
        pytest.fail("headless Chromium is needed: `make browser` installs chromium and chromium-driver")
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for argument in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--disable-background-networking",
        "--window-size=1400,1000",
    ):
        options.add_argument(argument)
    chrome = webdriver.Chrome(options=options, service=Service(driver))
    chrome.set_page_load_timeout(60)
    try:
        yield chrome
    finally:
        chrome.quit()


def test_an_admin_logs_in_and_inspects_a_job_in_chromium(site: tuple[str, dict[str, Any]], browser: Any) -> None:
    base, data = site
    ARTIFACTS.mkdir(exist_ok=True)
    browser.get(f"{base}/admin/login/?next=/admin/")
    browser.find_element(By.NAME, "username").send_keys("admin")
    browser.find_element(By.NAME, "password").send_keys(PASSWORD)
    browser.find_element(By.CSS_SELECTOR, "input[type=submit]").click()
    # a click does not wait for the next page: wait until the index has replaced the login form
    wait = WebDriverWait(browser, 30)
    wait.until(expected_conditions.url_to_be(f"{base}/admin/"))
    wait.until(expected_conditions.presence_of_element_located((By.CSS_SELECTOR, 'a[href="/admin/fairqueue/job/"]')))
    assert "fair queue" in browser.find_element(By.TAG_NAME, "body").text.lower()  # CSS upper-cases it

    browser.get(f"{base}/admin/fairqueue/job/")
    listing = browser.find_element(By.ID, "result_list").text
    for tenant in ("acme", "globex", "initech"):
        assert tenant in listing
    browser.save_screenshot(str(ARTIFACTS / "admin-job-list.png"))

    job_id = data["jobs"][0]
    browser.find_element(By.LINK_TEXT, str(job_id)).click()
    wait.until(expected_conditions.url_contains(f"/job/{job_id}/change/"))
    args = wait.until(expected_conditions.presence_of_element_located((By.CSS_SELECTOR, "pre.fairqueue-json")))
    assert '"order_id": 1' in args.text  # the pretty-printed arguments: only the job's page has them
    page = browser.find_element(By.TAG_NAME, "body").text
    assert "orders.confirm" in page and "acme" in page
    browser.save_screenshot(str(ARTIFACTS / "admin-job.png"))
    assert (ARTIFACTS / "admin-job.png").stat().st_size > 10_000
