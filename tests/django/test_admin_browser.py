"""The Django admin in a real browser: headless Chromium logs in, opens the job list and a job, and changes
a shared limit's cap on its page; the channel list and the history fit a 1400 px window.

Runs the example project (examples/django_shop) under `manage.py runserver`; the first test's
screenshots go to test-artifacts/ at the repository's root, the width test's to its tmp path.
`make test` installs Chromium and its driver with apt.
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


def _log_in(browser: Any, base: str) -> None:
    browser.get(f"{base}/admin/login/?next=/admin/")
    browser.find_element(By.NAME, "username").send_keys("admin")
    browser.find_element(By.NAME, "password").send_keys(PASSWORD)
    browser.find_element(By.CSS_SELECTOR, "input[type=submit]").click()
    WebDriverWait(browser, 30).until(expected_conditions.url_to_be(f"{base}/admin/"))


#: Where a change list's table ends, against the window and the box it scrolls in (Django's
#: ``#changelist-form .results``, whose scroll bar sits below the list's last row, out of sight).
TABLE_GEOMETRY = """
const table = document.getElementById("result_list");
const box = table.closest(".results");
return {
    window: document.documentElement.clientWidth,
    page: document.documentElement.scrollWidth,
    table_right: table.getBoundingClientRect().right,
    box_right: box.getBoundingClientRect().right,
    box_content: box.scrollWidth,
    box_width: box.clientWidth,
};
"""


def test_the_channel_and_history_lists_fit_a_1400_pixel_window(
    site: tuple[str, dict[str, Any]], browser: Any, empty_database_url: str, tmp_path: Path
) -> None:
    """In a 1400 px window, beside Django's navigation and the filters, the channel list and the history
    show every column: nothing is cut off on the right, or hidden in a box to scroll sideways."""
    import fairqueue

    base, _ = site
    with psycopg.connect(empty_database_url, autocommit=True) as conn:
        tenants = [f"tenant-{i:02d}-of-a-large-customer" for i in range(12)]
        for i, tenant in enumerate(tenants):
            fairqueue.update_channel(conn, tenant, max_concurrency=i + 1, rate_limit="600/m", burst=5)
        worker = fairqueue.register_worker(conn, "web-7f9c2d-worker-3:41877", lease_seconds=300)
        for i, tenant in enumerate(tenants):
            kind = "orders.confirm_and_notify_the_customer"
            fairqueue.enqueue(conn, kind, {"order_id": i}, channel=tenant, max_attempts=2)
        error = "Traceback (most recent call last):\n  ...\nConnectionError: " + "the mail server refused us. " * 7
        for job in fairqueue.claim_batch(conn, worker, 100):
            if job.id % 3 == 0:
                fairqueue.complete(conn, worker, job.id, {"ok": True})
            else:  # final failures, and failures retried later
                fairqueue.fail(conn, worker, job.id, error, retry_in=3600 if job.id % 3 == 1 else None)

    browser.set_window_size(1400, 1000)
    _log_in(browser, base)
    for page in ("channel", "completedjob"):
        browser.get(f"{base}/admin/fairqueue/{page}/")
        # get() can return before a busy machine has laid the page out: wait for the rows, and for the
        # filters (beside the list, they are part of what must fit)
        WebDriverWait(browser, 30).until(
            lambda b: (
                len(b.find_elements(By.CSS_SELECTOR, "#result_list tbody tr")) >= 12
                and b.find_elements(By.ID, "changelist-filter")
            )
        )
        browser.save_screenshot(str(tmp_path / f"admin-{page}-list-1400px.png"))
        at = browser.execute_script(TABLE_GEOMETRY)
        assert at["window"] >= 1360, at  # the window is 1400 px wide (less a scroll bar)
        assert at["page"] <= at["window"], f"{page}: the page scrolls sideways: {at}"
        assert at["box_content"] <= at["box_width"], f"{page}: columns hidden to the right of the list: {at}"
        assert at["table_right"] <= min(at["box_right"], at["window"]) + 0.5, f"{page}: the table is cut off: {at}"
    assert (tmp_path / "admin-completedjob-list-1400px.png").stat().st_size > 10_000
    outcomes = {cell.text for cell in browser.find_elements(By.CSS_SELECTOR, "td.field-outcome_and_finality")}
    assert outcomes == {"succeeded (final)", "failed (final)", "failed (retried)"}


def test_a_shared_limits_cap_is_changed_on_its_page_in_chromium(
    site: tuple[str, dict[str, Any]], browser: Any, empty_database_url: str
) -> None:
    import fairqueue

    base, _ = site
    with psycopg.connect(empty_database_url, autocommit=True) as conn:
        fairqueue.configure_limit(conn, "stripe-api", max_concurrency=5, rate_limit="10/s", burst=3)
    _log_in(browser, base)
    browser.get(f"{base}/admin/fairqueue/sharedlimit/stripe-api/change/")
    cap = browser.find_element(By.NAME, "max_concurrency")
    assert cap.get_attribute("value") == "5"
    assert browser.find_element(By.NAME, "rate_burst").get_attribute("value") == "3"  # as it was set, not 3.0
    cap.clear()
    cap.send_keys("9")
    browser.save_screenshot(str(ARTIFACTS / "admin-shared-limit.png"))
    browser.find_element(By.NAME, "_save").click()
    WebDriverWait(browser, 30).until(expected_conditions.url_to_be(f"{base}/admin/fairqueue/sharedlimit/"))
    assert "was changed successfully" in browser.find_element(By.TAG_NAME, "body").text
    with psycopg.connect(empty_database_url) as conn:
        row = conn.execute("SELECT max_concurrency, rate_limit, rate_burst FROM fairqueue.shared_limit").fetchone()
    assert row == (9, "10/s", 3.0)  # the rate and burst kept
