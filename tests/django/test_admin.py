"""The Django admin pages (fairqueue_django/admin.py), through Django's test client on the real database:
what each page shows, the actions (cancel, retry, pause/resume, channel limits) and who may do what."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import psycopg
import pytest

import fairqueue

django = pytest.importorskip("django")

from django.db import DatabaseError, connections  # noqa: E402
from django.test import Client  # noqa: E402

import fairqueue_django  # noqa: E402

ADMIN = "/admin/fairqueue"
USER_PREFIX = "fq-admin-"


@pytest.fixture(scope="module")
def test_environment(django_url: str) -> Iterator[None]:
    """What Django's test runner sets up: the 'testserver' host and template context capture."""
    from django.test.utils import setup_test_environment, teardown_test_environment

    try:
        setup_test_environment()
    except RuntimeError:  # set up already by another module of this process
        yield
        return
    yield
    teardown_test_environment()


MakeClient = Callable[..., Client]


@pytest.fixture
def login(dj: psycopg.Connection[Any], test_environment: None) -> Iterator[MakeClient]:
    """``login(name, *permissions, superuser=False)``: a client logged in as a new staff user."""
    from django.contrib.auth.models import Permission, User

    def make(name: str, *permissions: str, superuser: bool = False, staff: bool = True) -> Client:
        username = USER_PREFIX + name
        if superuser:
            user = User.objects.create_superuser(username, f"{name}@example.com", None)
        else:
            user = User.objects.create_user(username, f"{name}@example.com", None, is_staff=staff)
        for codename in permissions:
            user.user_permissions.add(Permission.objects.get(content_type__app_label="fairqueue", codename=codename))
        client = Client()
        client.force_login(user)
        return client

    yield make
    User.objects.filter(username__startswith=USER_PREFIX).delete()


@dataclass
class Queue:
    worker: int
    failed: int  # ended: one final failed attempt
    retrying: int  # live: one failed attempt, waiting out its backoff
    running: int
    ready: int
    ready_too: int
    scheduled: int
    blocked: int
    fifo_head: int
    waiting: int


@pytest.fixture
def queue(dj: psycopg.Connection[Any]) -> Queue:
    """A queue with a job in every state, a worker, history and configured channels."""
    worker = fairqueue.register_worker(
        dj, "worker-1", lease_seconds=300, info={"host": "box-1", "pid": 4242, "concurrency": 4}
    )
    fairqueue.configure_channel(dj, "tenant-a", max_concurrency=5, rate_limit="10/s", burst=3, weight=2)

    failed = fairqueue_django.enqueue(
        "emails.send", {"to": "<b>ann</b>", "n": [1, 2]}, channel="tenant-b", max_attempts=1
    )
    [claimed] = fairqueue.claim_batch(dj, worker, 1)
    assert claimed.id == failed
    fairqueue.fail(dj, worker, failed, "Traceback (most recent call last):\n  <frame>\nValueError: <bad> address")

    retrying = fairqueue_django.enqueue("emails.send", {"to": "bob"}, channel="tenant-b", max_attempts=3)
    [claimed] = fairqueue.claim_batch(dj, worker, 1)
    assert claimed.id == retrying
    fairqueue.fail(dj, worker, retrying, "Timeout talking to smtp", retry_in=3600)

    running = fairqueue_django.enqueue("video.encode", {"file": "a.mp4"}, channel="tenant-c")
    [claimed] = fairqueue.claim_batch(dj, worker, 1)
    assert claimed.id == running

    ready = fairqueue_django.enqueue("reports.build", {"month": 1}, channel="tenant-a")
    ready_too = fairqueue_django.enqueue("reports.build", {"month": 2}, channel="tenant-a")
    scheduled = fairqueue_django.enqueue("reports.send", {}, channel="tenant-a", delay=3600)
    blocked = fairqueue_django.enqueue("reports.archive", {}, channel="tenant-d", after=[ready])
    fifo_head = fairqueue_django.enqueue("ledger.post", {"entry": 1}, channel="tenant-d", fifo_key="acct-1")
    waiting = fairqueue_django.enqueue("ledger.post", {"entry": 2}, channel="tenant-d", fifo_key="acct-1")
    dj.execute("SELECT fairqueue.promote_due_jobs()")  # the worker side places jobs with after= / fifo_key
    return Queue(worker, failed, retrying, running, ready, ready_too, scheduled, blocked, fifo_head, waiting)


# -- helpers --------------------------------------------------------------------------------------------------


def _text(response: Any) -> str:
    return str(response.content.decode())


def _rows(response: Any) -> list[Any]:
    assert response.status_code == 200, response.status_code
    return list(response.context["cl"].result_list)


def _statuses(client: Client, query: str = "") -> dict[int, str]:
    return {job.id: job.status for job in _rows(client.get(f"{ADMIN}/job/{query}"))}


def _messages(response: Any) -> list[str]:
    return [str(m) for m in response.context["messages"]]


def _live(dj: psycopg.Connection[Any]) -> set[int]:
    return {r[0] for r in dj.execute("SELECT id FROM fairqueue.job")}


def _channel(dj: psycopg.Connection[Any], name: str) -> tuple[Any, ...]:
    row = dj.execute(
        "SELECT max_concurrency, rate_limit, rate_burst, weight, paused FROM fairqueue.channel WHERE name = %s",
        (name,),
    ).fetchone()
    assert row is not None
    return tuple(row)


def _history_key(dj: psycopg.Connection[Any], job_id: int) -> str:
    from fairqueue_django.admin import attempt_key
    from fairqueue_django.models import CompletedJob

    return attempt_key(CompletedJob.objects.filter(job_id=job_id).order_by("-finished_at").first())


def _action(action: str, *selected: object, change_form: bool = False) -> dict[str, Any]:
    key = "CHANGE_FORM-action" if change_form else "action"
    return {key: action, "_selected_action": [str(s) for s in selected], "index": "0"}


def _insert_old_attempt(dj: psycopg.Connection[Any], job_id: int, days_ago: float) -> None:
    dj.execute(
        """
        INSERT INTO fairqueue.completed_job (job_id, attempt, outcome, final, kind, channel, args, error,
                                             enqueued_at, ready_at, started_at, finished_at)
        VALUES (%(id)s, 1, 'failed', true, 'old.job', 'tenant-old', '{"old": true}', 'old failure',
                now() - %(age)s, now() - %(age)s, now() - %(age)s, now() - %(age)s)
        """,
        {"id": job_id, "age": timedelta(days=days_ago)},
    )


# -- what a superuser sees ------------------------------------------------------------------------------------


def test_the_admin_index_links_every_page(login: MakeClient, queue: Queue) -> None:
    client = login("root", superuser=True)
    page = _text(client.get("/admin/"))
    for path in ("job", "completedjob", "channel", "worker", "queueoverview"):
        assert f'href="{ADMIN}/{path}/"' in page
    assert "Queue overview" in page and "Live jobs" in page and "Finished attempts (history)" in page


def test_live_jobs_show_each_jobs_status_and_filter_on_it(login: MakeClient, queue: Queue) -> None:
    client = login("root", superuser=True)
    q = queue
    assert _statuses(client) == {
        q.retrying: "scheduled",
        q.running: "running",
        q.ready: "ready",
        q.ready_too: "ready",
        q.scheduled: "scheduled",
        q.blocked: "blocked",
        q.fifo_head: "ready",
        q.waiting: "waiting",
    }
    assert set(_statuses(client, "?status=ready")) == {q.ready, q.ready_too, q.fifo_head}
    assert set(_statuses(client, "?status=running")) == {q.running}
    assert set(_statuses(client, "?status=scheduled")) == {q.retrying, q.scheduled}
    assert set(_statuses(client, "?status=blocked")) == {q.blocked}
    assert set(_statuses(client, "?status=waiting")) == {q.waiting}
    # attempts so far: the retrying job failed once
    rows = {job.id: job for job in _rows(client.get(f"{ADMIN}/job/"))}
    assert (rows[q.retrying].attempt, rows[q.running].attempt, rows[q.ready].attempt) == (1, 1, 0)
    page = _text(client.get(f"{ADMIN}/job/"))
    assert "1 of 3" in page and "video.encode" in page


def test_live_jobs_search_and_filters(login: MakeClient, queue: Queue) -> None:
    client = login("root", superuser=True)
    assert set(_statuses(client, f"?q={queue.running}")) == {queue.running}  # a job id: exactly that job
    assert set(_statuses(client, "?q=reports.bu")) == {queue.ready, queue.ready_too}  # part of a kind
    assert set(_statuses(client, "?q=tenant-d")) == {queue.blocked, queue.fifo_head, queue.waiting}
    assert set(_statuses(client, "?channel=tenant-a")) == {queue.ready, queue.ready_too, queue.scheduled}
    assert set(_statuses(client, "?kind=ledger.post")) == {queue.fifo_head, queue.waiting}
    assert set(_statuses(client, "?kind=ledger.post&status=waiting")) == {queue.waiting}
    assert set(_statuses(client, "?channel=tenant-a&q=reports.send")) == {queue.scheduled}
    assert _statuses(client, "?q=999999") == {}


def test_a_live_jobs_page_shows_its_args_escaped_and_its_earlier_attempts(
    login: MakeClient, queue: Queue, dj: psycopg.Connection[Any]
) -> None:
    client = login("root", superuser=True)
    page = _text(client.get(f"{ADMIN}/job/{queue.retrying}/change/"))
    assert '<pre class="fairqueue-json">{\n  &quot;to&quot;: &quot;bob&quot;\n}</pre>' in page
    assert "retry after a failed attempt" in page
    assert "Timeout talking to smtp" in page  # the failed attempt, inline
    assert f'href="{ADMIN}/completedjob/{quote_key(dj, queue.retrying)}/change/"' in page

    page = _text(client.get(f"{ADMIN}/job/{queue.running}/change/"))
    assert f'running on <a href="{ADMIN}/worker/{queue.worker}/change/">worker {queue.worker}</a>' in page
    assert "none yet" in page  # no earlier attempts
    page = _text(client.get(f"{ADMIN}/job/{queue.blocked}/change/"))
    assert f"waiting for job {queue.ready} to succeed" in page
    page = _text(client.get(f"{ADMIN}/job/{queue.waiting}/change/"))
    assert "FIFO key acct-1" in page
    # a job that ended is in the history, not here
    response = client.get(f"{ADMIN}/job/{queue.failed}/change/", follow=True)
    assert any("doesn\u2019t exist" in m for m in _messages(response))


def test_the_history_lists_attempts_and_shows_one_in_full(
    login: MakeClient, queue: Queue, dj: psycopg.Connection[Any]
) -> None:
    client = login("root", superuser=True)
    rows = _rows(client.get(f"{ADMIN}/completedjob/"))
    assert {(r.job_id, r.attempt, r.outcome, r.final) for r in rows} == {
        (queue.failed, 1, "failed", True),
        (queue.retrying, 1, "failed", False),
    }
    page = _text(client.get(f"{ADMIN}/completedjob/"))
    assert "ValueError: &lt;bad&gt; address" in page  # of a traceback, the list shows the exception
    assert "Traceback" not in page and "&lt;frame&gt;" not in page
    assert "Timeout talking to smtp" in page

    response = client.get(f"{ADMIN}/completedjob/{quote_key(dj, queue.failed)}/change/")
    page = _text(response)
    assert response.status_code == 200
    assert "&quot;to&quot;: &quot;&lt;b&gt;ann&lt;/b&gt;&quot;" in page and '<pre class="fairqueue-json">' in page
    assert (
        '<pre class="fairqueue-text">Traceback (most recent call last):\n  &lt;frame&gt;\n'
        "ValueError: &lt;bad&gt; address</pre>"
    ) in page
    assert "<b>ann</b>" not in page
    # an address that is no row: back to the list
    response = client.get(f"{ADMIN}/completedjob/{queue.failed}-9-failed-0/change/", follow=True)
    assert any("doesn\u2019t exist" in m for m in _messages(response))


def test_live_jobs_and_the_history_show_each_jobs_priority(login: MakeClient, dj: psycopg.Connection[Any]) -> None:
    worker = fairqueue.register_worker(dj, "worker-1", lease_seconds=300)
    urgent = fairqueue_django.enqueue("reports.build", channel="tenant-a", priority=80, max_attempts=1)
    later = fairqueue_django.enqueue("reports.build", channel="tenant-a", priority=-15)
    [claimed] = fairqueue.claim_batch(dj, worker, 1)
    assert claimed.id == urgent
    fairqueue.fail(dj, worker, urgent, "boom")
    client = login("root", superuser=True)

    def shown(page: str) -> list[str]:
        cells = re.findall(r'<td class="field-priority">([^<]*)</td>', page)
        return cells or re.findall(r'<label>Priority:</label>\s*<div class="readonly">([^<]*)</div>', page)

    assert shown(_text(client.get(f"{ADMIN}/job/"))) == ["-15"]
    assert shown(_text(client.get(f"{ADMIN}/job/{later}/change/"))) == ["-15"]
    assert shown(_text(client.get(f"{ADMIN}/completedjob/"))) == []  # no room in the list: on the page
    assert shown(_text(client.get(f"{ADMIN}/completedjob/{quote_key(dj, urgent)}/change/"))) == ["80"]
    overview = client.get(f"{ADMIN}/queueoverview/")  # its recent failures, as fairqueue status lists them
    [failure] = overview.context["failures"]
    assert (failure["job_id"], failure["priority"]) == (urgent, 80)
    assert '<td>failed</td><td class="number">80</td>' in _text(overview)


def test_the_history_says_final_in_words_not_with_a_green_tick(
    login: MakeClient, queue: Queue, dj: psycopg.Connection[Any]
) -> None:
    """Django shows a true boolean as a green tick, which every admin user reads as success: a final
    failed attempt must not get one. Finality is said in words, next to the outcome."""
    succeeded = fairqueue_django.enqueue("emails.send", {"to": "cy"}, channel="tenant-e")
    for busy in ("tenant-a", "tenant-d"):  # the queue's ready jobs stay where they are
        fairqueue.update_channel(dj, busy, paused=True)
    [claimed] = fairqueue.claim_batch(dj, queue.worker, 1)
    assert claimed.id == succeeded and fairqueue.complete(dj, queue.worker, succeeded, None)
    client = login("root", superuser=True)
    page = _text(client.get(f"{ADMIN}/completedjob/"))
    start = page.index('<table id="result_list">')
    table = page[start : page.index("</table>", start)]
    assert "icon-yes" not in table and "icon-no" not in table and "<img" not in table
    row = r'<a href="[^"]*\?q=(\d+)"[^>]*>\d+</a>.*?<td class="field-outcome_and_finality">([^<]*)</td>'
    assert dict(re.findall(row, table, re.S)) == {
        str(queue.failed): "failed (final)",
        str(queue.retrying): "failed (retried)",
        str(succeeded): "succeeded (final)",
    }
    # each attempt's page says it in words too
    for job_id, final in (
        (queue.failed, "yes: this attempt ended the job"),
        (queue.retrying, "no: the job was retried"),
    ):
        detail = _text(client.get(f"{ADMIN}/completedjob/{quote_key(dj, job_id)}/change/"))
        assert re.search(rf'Final:</label>\s*<div class="readonly">{final}</div>', detail), detail
        assert "icon-yes" not in detail and "icon-no" not in detail
    # sorting by the column sorts by outcome
    rows = _rows(client.get(f"{ADMIN}/completedjob/?o=4"))
    assert [r.outcome for r in rows] == sorted(r.outcome for r in rows)


def quote_key(dj: psycopg.Connection[Any], job_id: int) -> str:
    from django.contrib.admin.utils import quote

    return str(quote(_history_key(dj, job_id)))


def test_the_history_shows_the_last_24_hours_unless_asked(
    login: MakeClient, queue: Queue, dj: psycopg.Connection[Any]
) -> None:
    from django.utils import timezone

    client = login("root", superuser=True)
    _insert_old_attempt(dj, 777, days_ago=3)

    def job_ids(query: str = "") -> set[int]:
        return {r.job_id for r in _rows(client.get(f"{ADMIN}/completedjob/{query}"))}

    assert job_ids() == {queue.failed, queue.retrying}  # default: the last 24 hours
    assert job_ids("?window=7d") == {queue.failed, queue.retrying, 777}
    assert job_ids("?window=all") == {queue.failed, queue.retrying, 777}
    assert job_ids("?window=1h") == {queue.failed, queue.retrying}
    today = timezone.localdate()
    since, until = today - timedelta(days=4), today - timedelta(days=2)
    assert job_ids(f"?finished_from={since}&finished_until={until}") == {777}
    assert job_ids(f"?finished_from={since}") == {queue.failed, queue.retrying, 777}
    assert job_ids("?q=777") == {777}  # a job id is looked up on every day
    assert job_ids("?q=777&window=24h") == set()
    page = _text(client.get(f"{ADMIN}/completedjob/"))
    assert '<li class="selected"><a href="?">Last 24 hours (default)</a></li>' in page
    # an unreadable date is refused, not ignored
    response = client.get(f"{ADMIN}/completedjob/?finished_from=yesterday")
    assert response.status_code == 302 and response["Location"].endswith("?e=1")


def test_the_history_filters(login: MakeClient, queue: Queue, dj: psycopg.Connection[Any]) -> None:
    client = login("root", superuser=True)
    fairqueue.cancel(dj, queue.ready_too)

    def job_ids(query: str) -> set[int]:
        return {r.job_id for r in _rows(client.get(f"{ADMIN}/completedjob/{query}"))}

    assert job_ids("?outcome__exact=cancelled") == {queue.ready_too}
    assert job_ids("?outcome__exact=failed") == {queue.failed, queue.retrying}
    assert job_ids("?final__exact=0") == {queue.retrying}
    assert job_ids("?final__exact=1&outcome__exact=failed") == {queue.failed}
    assert job_ids("?channel=tenant-a") == {queue.ready_too}
    assert job_ids("?kind=emails.send") == {queue.failed, queue.retrying}
    assert job_ids(f"?q={queue.retrying}") == {queue.retrying}
    assert job_ids("?q=reports.build") == {queue.ready_too}  # an exact kind


def test_channels_list_counts_and_settings(login: MakeClient, queue: Queue) -> None:
    from django.db import connections
    from django.test.utils import CaptureQueriesContext

    client = login("root", superuser=True)
    with CaptureQueriesContext(connections["default"]) as captured:
        rows = {c.name: c for c in _rows(client.get(f"{ADMIN}/channel/"))}
    # the list counts on the indexes of ready and running jobs; scheduled_job (no index by channel) is
    # read only on a channel's page
    assert not any("scheduled_job" in q["sql"] for q in captured.captured_queries)
    a = rows["tenant-a"]
    assert (a.backlog, a.running_jobs) == (2, 0)
    assert (a.max_concurrency, a.rate_limit, a.rate_burst, a.weight, a.paused) == (5, "10/s", 3.0, 2, False)
    assert (rows["tenant-c"].backlog, rows["tenant-c"].running_jobs) == (0, 1)
    response = client.get(f"{ADMIN}/channel/tenant-a/change/")
    assert response.context["original"].scheduled_jobs == 1
    page = _text(response)
    assert 'name="max_concurrency" value="5"' in page and 'name="rate_limit" value="10/s"' in page
    # sorted by backlog, largest first
    names = [c.name for c in _rows(client.get(f"{ADMIN}/channel/?o=-2"))]
    assert names[0] == "tenant-a"


def test_channels_show_their_busiest_fair_keys(login: MakeClient, dj: psycopg.Connection[Any]) -> None:
    """The list (one query for the page) and a channel's page show the keys with the most ready and
    running jobs, as ``fairqueue status`` does."""
    import re

    from django.db import connections
    from django.test.utils import CaptureQueriesContext

    worker = fairqueue.register_worker(dj, "worker-1", lease_seconds=300)
    fairqueue.configure_channel(dj, "tenant-k")
    fairqueue.configure_channel(dj, "tenant-plain")
    fairqueue_django.enqueue("reports.build", channel="tenant-k", fair_key="user-<b>")
    [claimed] = fairqueue.claim_batch(dj, worker, 1)
    assert claimed.fair_key == "user-<b>"
    for key, n in (("user-1", 3), ("user-2", 1), ("user-3", 1), ("user-<b>", 1)):
        for _ in range(n):
            fairqueue_django.enqueue("reports.build", channel="tenant-k", fair_key=key)
    fairqueue_django.enqueue("reports.build", channel="tenant-plain")
    fairqueue_django.enqueue("reports.build", channel="tenant-new", fair_key="solo")  # no channel row yet

    client = login("root", superuser=True)
    with CaptureQueriesContext(connections["default"]) as captured:
        response = client.get(f"{ADMIN}/channel/")
    rows = {c.name: c for c in _rows(response)}
    assert sum("fair_key IS NOT NULL" in q["sql"] for q in captured.captured_queries) == 1
    assert rows["tenant-k"].busiest["count"] == 4 and rows["tenant-plain"].busiest is None
    shown = (
        "user-1 (ready 3, running 0), user-&lt;b&gt; (ready 1, running 1), user-2 (ready 1, running 0) (+1 more key)"
    )
    assert shown in _text(response)

    def field(url: str) -> list[str]:
        page = _text(client.get(url))
        return re.findall(r'<label>Busiest keys:</label>\s*<div class="readonly">([^<]*)</div>', page)

    assert field(f"{ADMIN}/channel/tenant-k/change/") == [shown]
    assert field(f"{ADMIN}/channel/tenant-plain/change/") == ["-"]
    assert field(f"{ADMIN}/channel/tenant-new/change/") == ["solo (ready 1, running 0)"]


def test_workers_list_their_lease_and_jobs(login: MakeClient, queue: Queue) -> None:
    client = login("root", superuser=True)
    response = client.get(f"{ADMIN}/worker/")
    [worker] = _rows(response)
    assert (worker.id, worker.name, worker.info_host, worker.info_pid, worker.running_jobs) == (
        queue.worker,
        "worker-1",
        "box-1",
        "4242",
        1,
    )
    assert timedelta(0) <= worker.since_heartbeat < timedelta(minutes=1)
    assert timedelta(minutes=4) < worker.until_lease_end <= timedelta(minutes=5)
    page = _text(response)
    assert "box-1" in page and "4242" in page
    page = _text(client.get(f"{ADMIN}/worker/{queue.worker}/change/"))
    assert f'<a href="{ADMIN}/job/{queue.running}/change/">{queue.running}</a>' in page
    assert "&quot;concurrency&quot;: 4" in page


def test_the_overview_shows_backlog_waits_and_a_chart(login: MakeClient, queue: Queue) -> None:
    client = login("root", superuser=True)
    response = client.get(f"{ADMIN}/queueoverview/")
    assert response.status_code == 200
    page = _text(response)
    assert "<svg" in page and "<script" not in page.split('id="content-main"')[1].split("<!-- END Content")[0]
    bars = response.context["chart"]["bars"]
    assert [(b["name"], b["ready"]) for b in bars] == [("tenant-a", 2), ("tenant-d", 1)]
    assert bars[0]["width"] == 2 * bars[1]["width"]
    assert re.search(r'<rect class="bar" x="\d+" y="0" width="\d+"', page)
    channels = {c["name"]: c for c in response.context["channels"]}
    assert channels["tenant-a"]["ready"] == 2 and channels["tenant-c"]["running"] == 1
    assert channels["tenant-b"]["waits"]["count"] == 2  # two attempts started and finished in the last hour
    assert response.context["overall_wait"]["p50"] != "-"
    assert response.context["history"]["failed"] == 1
    assert f'href="{ADMIN}/completedjob/?q={queue.failed}"' in page  # recent failures link to the history


def test_nothing_can_be_added_or_deleted(login: MakeClient, queue: Queue) -> None:
    client = login("root", superuser=True)
    for path in (
        f"{ADMIN}/job/add/",
        f"{ADMIN}/channel/add/",
        f"{ADMIN}/worker/add/",
        f"{ADMIN}/job/{queue.ready}/delete/",
        f"{ADMIN}/channel/tenant-a/delete/",
        f"{ADMIN}/worker/{queue.worker}/delete/",
    ):
        assert client.get(path).status_code == 403, path
        assert client.post(path, {"post": "yes"}).status_code == 403, path
    response = client.get(f"{ADMIN}/job/")
    assert [name for name, _ in response.context["action_form"].fields["action"].choices] == ["", "cancel_jobs"]


# -- actions ------------------------------------------------------------------------------------------------


def test_cancel_jobs_from_the_list(login: MakeClient, queue: Queue, dj: psycopg.Connection[Any]) -> None:
    client = login("root", superuser=True)
    response = client.post(f"{ADMIN}/job/", _action("cancel_jobs", queue.ready, queue.running), follow=True)
    assert sorted(_messages(response)) == [
        f"Job {queue.running}: running: cancel requested, its worker stops it",
        f"Job {queue.ready}: cancelled",
    ]
    assert queue.ready not in _live(dj)
    assert dj.execute(
        "SELECT outcome, final FROM fairqueue.completed_job WHERE job_id = %s", (queue.ready,)
    ).fetchall() == [("cancelled", True)]
    assert dj.execute(
        "SELECT cancel_requested FROM fairqueue.running_job WHERE job_id = %s", (queue.running,)
    ).fetchone() == (True,)
    # the job that waited for it ended too; its history page has an outcome with an underscore in its address
    key = quote_key(dj, queue.blocked)
    assert "-dependency_5Ffailed-" in key
    page = _text(client.get(f"{ADMIN}/completedjob/{key}/change/"))
    assert "dependency failed" in page and "reports.archive" in page


def test_cancel_a_job_from_its_page(login: MakeClient, queue: Queue, dj: psycopg.Connection[Any]) -> None:
    client = login("root", superuser=True)
    url = f"{ADMIN}/job/{queue.scheduled}/change/"
    page = _text(client.get(url))
    assert '<option value="cancel_jobs">Cancel this job</option>' in page
    response = client.post(url, _action("cancel_jobs", queue.scheduled, change_form=True), follow=True)
    assert f"Job {queue.scheduled}: cancelled" in _messages(response)
    assert queue.scheduled not in _live(dj)


def test_retry_a_failed_job_from_the_history(login: MakeClient, queue: Queue, dj: psycopg.Connection[Any]) -> None:
    client = login("root", superuser=True)
    assert queue.failed not in _live(dj)
    response = client.post(f"{ADMIN}/completedjob/", _action("retry_jobs", queue.failed), follow=True)
    assert _messages(response) == [f"Job {queue.failed}: queued again"]
    assert queue.failed in _live(dj)
    assert _statuses(client, f"?q={queue.failed}") == {queue.failed: "scheduled"}  # due now, placed by a claim
    # again: it is live now, nothing changes
    response = client.post(f"{ADMIN}/completedjob/", _action("retry_jobs", queue.failed), follow=True)
    assert _messages(response) == [f"Job {queue.failed}: is live already, nothing changed"]


def test_retry_from_an_attempts_page_and_only_for_attempts_that_ended_a_job(
    login: MakeClient, queue: Queue, dj: psycopg.Connection[Any]
) -> None:
    client = login("root", superuser=True)
    url = f"{ADMIN}/completedjob/{quote_key(dj, queue.failed)}/change/"
    response = client.post(url, _action("retry_jobs", queue.failed, change_form=True), follow=True)
    assert f"Job {queue.failed}: queued again" in _messages(response)
    assert queue.failed in _live(dj)
    # the retrying job's attempt was not final: the job is waiting to run again by itself
    response = client.post(f"{ADMIN}/completedjob/", _action("retry_jobs", queue.retrying), follow=True)
    assert _messages(response) == [
        f"Job {queue.retrying}: not retried, only an attempt that ended a job without success can be"
    ]


def test_pause_and_resume_keep_the_other_settings(login: MakeClient, queue: Queue, dj: psycopg.Connection[Any]) -> None:
    client = login("root", superuser=True)
    response = client.post(f"{ADMIN}/channel/", _action("pause_channels", "tenant-a"), follow=True)
    assert _messages(response) == ["Channel tenant-a: paused"]
    assert _channel(dj, "tenant-a") == (5, "10/s", 3.0, 2, True)
    response = client.post(
        f"{ADMIN}/channel/tenant-a/change/", _action("resume_channels", "tenant-a", change_form=True), follow=True
    )
    assert "Channel tenant-a: resumed" in _messages(response)
    assert _channel(dj, "tenant-a") == (5, "10/s", 3.0, 2, False)
    # a paused channel's jobs are not claimed
    client.post(f"{ADMIN}/channel/", _action("pause_channels", "tenant-a"))
    assert {j.channel for j in fairqueue.claim_batch(dj, queue.worker, 10)} <= {"tenant-d"}


def test_a_burst_is_shown_as_it_was_given(login: MakeClient, queue: Queue, dj: psycopg.Connection[Any]) -> None:
    """tenant-a's burst was set as 3: the list and the form show 3, not the 3.0 the float column holds."""
    fairqueue.configure_channel(dj, "tenant-half", rate_limit="1/s", burst=2.5)
    client = login("root", superuser=True)
    listing = _text(client.get(f"{ADMIN}/channel/"))
    row = r'<th class="field-name"><a [^>]*>([^<]*)</a></th>.*?<td class="field-(?:rate_)?burst">([^<]*)</td>'
    cells = dict(re.findall(row, listing, re.S))
    assert cells["tenant-a"] == "3" and cells["tenant-half"] == "2.5", cells
    page = _text(client.get(f"{ADMIN}/channel/tenant-a/change/"))
    assert 'name="rate_burst" value="3"' in page and 'name="initial-rate_burst" value="3"' in page
    assert 'name="rate_burst" value="2.5"' in _text(client.get(f"{ADMIN}/channel/tenant-half/change/"))
    # saving the page as drawn changes nothing (the initial 3 is the stored 3.0)
    form = client.get(f"{ADMIN}/channel/tenant-a/change/").context["adminform"].form
    assert form.fields["rate_burst"].prepare_value(form.initial["rate_burst"]) == 3
    before = _channel(dj, "tenant-a")
    client.post(f"{ADMIN}/channel/tenant-a/change/", _form_data(form))
    assert _channel(dj, "tenant-a") == before


LIMITS = ("max_concurrency", "rate_limit", "rate_burst", "weight", "paused", "key_max_concurrency")


def _form_data(form: Any, **changes: Any) -> dict[str, str]:
    """What the browser sends: each field, and the value it had when the page was drawn."""
    data = {"_save": "Save"}
    for name in LIMITS:
        initial = form.initial.get(name)
        data[f"initial-{name}"] = "" if initial is None else str(initial)
        value = changes.get(name, initial)
        if name == "paused":
            if value:
                data[name] = "on"
        else:
            data[name] = "" if value is None else str(value)
    return data


def test_edit_a_channels_limits(login: MakeClient, queue: Queue, dj: psycopg.Connection[Any]) -> None:
    client = login("root", superuser=True)
    url = f"{ADMIN}/channel/tenant-a/change/"
    form = client.get(url).context["adminform"].form
    response = client.post(url, _form_data(form, max_concurrency=7, weight=3), follow=True)
    assert any("was changed successfully" in m for m in _messages(response))
    assert _channel(dj, "tenant-a") == (7, "10/s", 3.0, 3, False)
    # no cap, no rate limit: the burst goes back to 1 (it only applies with a rate limit)
    form = client.get(url).context["adminform"].form
    response = client.post(url, _form_data(form, max_concurrency=None, rate_limit=None))
    assert response.status_code == 302
    assert _channel(dj, "tenant-a") == (None, None, 1.0, 3, False)
    # a capped channel counts its running jobs again (configure_channel's recount)
    url = f"{ADMIN}/channel/tenant-c/change/"
    client.post(url, _form_data(client.get(url).context["adminform"].form, max_concurrency=1))
    assert dj.execute("SELECT max_concurrency, running FROM fairqueue.channel WHERE name = 'tenant-c'").fetchone() == (
        1,
        1,
    )


@pytest.mark.parametrize(
    ("changes", "field", "message"),
    [
        ({"rate_limit": "fast"}, "rate_limit", "is not understood"),
        ({"rate_limit": "0/s"}, "rate_limit", "more than zero"),
        ({"weight": 0}, None, "weight must be a whole number from 1 to 1000"),
        ({"max_concurrency": 0}, None, "max_concurrency must be a whole number of at least 1"),
        ({"rate_burst": 0.5}, None, "burst must be a number of at least 1"),
        ({"rate_limit": None, "rate_burst": 4}, None, "burst only applies together with a rate_limit"),
        ({"key_max_concurrency": 0}, None, "key_max_concurrency must be a whole number from 1 to 1,000,000"),
    ],
)
def test_invalid_limits_are_form_errors_and_change_nothing(
    login: MakeClient,
    queue: Queue,
    dj: psycopg.Connection[Any],
    changes: dict[str, Any],
    field: str | None,
    message: str,
) -> None:
    client = login("root", superuser=True)
    url = f"{ADMIN}/channel/tenant-a/change/"
    before = _channel(dj, "tenant-a")
    response = client.post(url, _form_data(client.get(url).context["adminform"].form, **changes))
    assert response.status_code == 200
    form = response.context["adminform"].form
    errors = form.errors.get(field or "__all__", [])
    assert any(message in e for e in errors), form.errors
    assert _channel(dj, "tenant-a") == before


def test_a_cap_per_fair_key_is_edited_on_the_channel_page(
    login: MakeClient, queue: Queue, dj: psycopg.Connection[Any]
) -> None:
    client = login("root", superuser=True)
    url = f"{ADMIN}/channel/tenant-a/change/"
    page = client.get(url)
    assert "Max concurrency per fair key" in page.content.decode()
    response = client.post(url, _form_data(page.context["adminform"].form, key_max_concurrency=2), follow=True)
    assert any("was changed successfully" in m for m in _messages(response))
    row = dj.execute("SELECT key_max_concurrency FROM fairqueue.channel WHERE name = 'tenant-a'").fetchone()
    assert row == (2,)
    assert _channel(dj, "tenant-a") == (5, "10/s", 3.0, 2, False)  # the other settings kept
    client.post(url, _form_data(client.get(url).context["adminform"].form, key_max_concurrency=None))
    assert dj.execute("SELECT key_max_concurrency FROM fairqueue.channel WHERE name = 'tenant-a'").fetchone() == (None,)


def test_a_cap_per_fair_key_the_channel_cannot_take_yet_is_a_message_on_the_page(
    login: MakeClient, queue: Queue, dj: psycopg.Connection[Any], django_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Adding a cap per key waits for the transactions enqueueing into the channel (at most lock_timeout
    or 30 s), then gives up and changes nothing: the page says so, rather than an error page."""
    client = login("root", superuser=True)
    url = f"{ADMIN}/channel/tenant-a/change/"
    form = client.get(url).context["adminform"].form
    before = _channel(dj, "tenant-a")
    with psycopg.connect(django_url) as producer:  # a transaction enqueueing into tenant-a, open
        fairqueue.enqueue(producer, "reports.build", channel="tenant-a", fair_key="user-1")
        monkeypatch.setenv("PGOPTIONS", "-c lock_timeout=200ms")  # for the request's own connection
        connections.close_all()  # (opened anew, with it)
        response = client.post(url, _form_data(form, key_max_concurrency=2), follow=True)
        producer.rollback()
    assert response.status_code == 200
    assert any(
        "Not saved: fairqueue: channel tenant-a still has transactions enqueueing" in m for m in _messages(response)
    )
    assert _channel(dj, "tenant-a") == before


def test_saving_an_old_page_does_not_undo_a_pause_made_meanwhile(
    login: MakeClient, queue: Queue, dj: psycopg.Connection[Any]
) -> None:
    client = login("root", superuser=True)
    url = f"{ADMIN}/channel/tenant-a/change/"
    old_page = client.get(url).context["adminform"].form
    other = login("other", superuser=True)
    other.post(f"{ADMIN}/channel/", _action("pause_channels", "tenant-a"))
    client.post(url, _form_data(old_page, weight=9))  # paused is unticked on the old page, untouched
    assert _channel(dj, "tenant-a") == (5, "10/s", 3.0, 9, True)


def test_saving_a_burst_for_a_rate_limit_removed_meanwhile_keeps_the_removal(
    login: MakeClient, queue: Queue, dj: psycopg.Connection[Any]
) -> None:
    client = login("root", superuser=True)
    url = f"{ADMIN}/channel/tenant-a/change/"
    old_page = client.get(url).context["adminform"].form  # shows rate limit 10/s, burst 3
    fairqueue.update_channel(dj, "tenant-a", rate_limit=None)
    response = client.post(url, _form_data(old_page, rate_burst=6, weight=4), follow=True)
    assert any("was changed successfully" in m for m in _messages(response))
    assert _channel(dj, "tenant-a") == (5, None, 1.0, 4, False)


def test_a_channel_with_jobs_but_no_row_yet_can_be_paused_and_limited(
    login: MakeClient, queue: Queue, dj: psycopg.Connection[Any]
) -> None:
    """A new tenant's flood: jobs in a channel no worker has served, so it has no row (no settings)."""
    client = login("root", superuser=True)
    for n in range(3):
        fairqueue_django.enqueue("flood.job", {"n": n}, channel="new tenant/1")
    fairqueue_django.enqueue("later.job", channel="new-delayed", delay=3600)
    rows = "SELECT name FROM fairqueue.channel WHERE name IN ('new tenant/1', 'new-delayed')"
    assert dj.execute(rows).fetchall() == []

    # the overview links it to its page, which shows the counts and the default settings
    overview = _text(client.get(f"{ADMIN}/queueoverview/"))
    url = f"{ADMIN}/channel/new%20tenant_2F1/change/"
    assert f'<a href="{url}">new tenant/1</a>' in overview
    response = client.get(url)
    assert response.status_code == 200
    page = _text(response)
    assert "No worker has served this channel yet" in page and 'name="weight" value="1"' in page
    assert response.context["original"].backlog == 3
    # the list does not show it, but a search for its exact name points to it
    response = client.get(f"{ADMIN}/channel/", {"q": "new tenant/1"})
    assert _rows(response) == []
    assert any("has live jobs but no settings yet" in m and url in m for m in _messages(response))

    # pause from its page: the row is created, paused, with the other settings at their defaults
    response = client.post(url, _action("pause_channels", "new tenant/1", change_form=True), follow=True)
    assert "Channel new tenant/1: paused" in _messages(response)
    assert _channel(dj, "new tenant/1") == (None, None, 1.0, 1, True)
    assert not {j.channel for j in fairqueue.claim_batch(dj, queue.worker, 100)} & {"new tenant/1"}

    # a channel with only a delayed job: its limits saved through the form
    url = f"{ADMIN}/channel/new-delayed/change/"
    form = client.get(url).context["adminform"].form
    response = client.post(url, _form_data(form, max_concurrency=2, rate_limit="5/m"), follow=True)
    assert any("was changed successfully" in m for m in _messages(response)), _messages(response)
    assert _channel(dj, "new-delayed") == (2, "5/m", 1.0, 1, False)
    # a name no job uses is still no channel
    response = client.get(f"{ADMIN}/channel/nobody-here/change/", follow=True)
    assert any("doesn\u2019t exist" in m for m in _messages(response))


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        ("completedjob/?finished_until=9999-12-31", "refused"),  # the day after is past year 9999
        ("completedjob/?finished_from=9999-12-31", 200),
        ("completedjob/1-1-succeeded-99999999999999999999/change/", "not found"),  # microseconds past 9999
        ("completedjob/1-1-succeeded--99999999999999999999/change/", "not found"),
        ("completedjob/99999999999999999999-1-succeeded-0/change/", "not found"),
        ("job/?channel=%00", 400),  # PostgreSQL text cannot hold a NUL
        ("job/?kind=%00", 400),
        ("job/?q=%00", 400),
        ("completedjob/?kind=%00", 400),
        ("completedjob/?channel=%00", 400),
        ("completedjob/?outcome__exact=%00", 400),
        ("channel/?q=%00", 400),
        ("channel/%00/change/", "not found"),
        ("channel/%00/history/", "not found"),
        ("periodicschedule/%00/change/", "not found"),
        ("job/99999999999999999999/change/", "not found"),
    ],
)
def test_crafted_addresses_are_refused_or_not_found_never_a_server_error(
    login: MakeClient, queue: Queue, path: str, expected: int | str
) -> None:
    client = login("root", superuser=True)
    client.raise_request_exception = False
    response = client.get(f"{ADMIN}/{path}")
    if expected == "refused":  # IncorrectLookupParameters: the admin's "?e=1" redirect
        assert response.status_code == 302 and response["Location"].endswith("?e=1")
    elif expected == "not found":
        assert response.status_code == 302
        assert any("doesn\u2019t exist" in m for m in _messages(client.get(response["Location"])))
    else:
        assert response.status_code == expected


@pytest.mark.parametrize(
    ("path", "action", "selected"),
    [
        ("job/", "cancel_jobs", "\x00"),
        ("job/", "cancel_jobs", "not-a-number"),
        ("completedjob/", "retry_jobs", "\x00"),
        ("channel/", "pause_channels", "\x00"),
        ("periodicschedule/", "pause_schedules", "\x00"),
    ],
)
def test_crafted_action_selections_are_bad_requests(
    login: MakeClient, queue: Queue, dj: psycopg.Connection[Any], path: str, action: str, selected: str
) -> None:
    client = login("root", superuser=True)
    client.raise_request_exception = False
    before = _state(dj)
    assert client.post(f"{ADMIN}/{path}", _action(action, selected)).status_code == 400
    assert _state(dj) == before


def test_every_page_works_without_time_zone_support(
    login: MakeClient, queue: Queue, dj: psycopg.Connection[Any]
) -> None:
    """USE_TZ = False: Django reads naive times (in TIME_ZONE) from the database."""
    from zoneinfo import ZoneInfo

    from django.test.utils import override_settings

    dj.execute(
        "SELECT fairqueue.register_periodic('nightly', '0 2 * * *', 'Europe/Paris', 'reports.nightly', 'reports', "
        "'{}'::jsonb, 'skip')"
    )
    # a tick that fired an hour ago (until a tick fires a job, last_tick is the registration time, no tick)
    dj.execute(
        "UPDATE fairqueue.periodic_schedule SET last_tick = now() - interval '1 hour', last_job_id = %s",
        (queue.ready,),
    )
    client = login("root", superuser=True)
    with override_settings(USE_TZ=False, TIME_ZONE="Asia/Tokyo"):
        for page in [*_pages(queue, dj), f"{ADMIN}/periodicschedule/", f"{ADMIN}/periodicschedule/nightly/change/"]:
            assert client.get(page).status_code == 200, page
        response = client.get(f"{ADMIN}/queueoverview/")
        [failure] = [f for f in response.context["failures"] if f["job_id"] == queue.failed]
        [(finished,)] = dj.execute(
            "SELECT finished_at FROM fairqueue.completed_job WHERE job_id = %s", (queue.failed,)
        ).fetchall()
        # the same instant, not shifted by a time zone, shown as TIME_ZONE's wall clock
        assert failure["finished_at"] == finished.astimezone(ZoneInfo("Asia/Tokyo")).replace(tzinfo=None)
        assert response.context["status"]["periodic"][0]["last_tick"] is not None
        page = _text(client.get(f"{ADMIN}/periodicschedule/"))
        [(tick,)] = dj.execute("SELECT last_tick AT TIME ZONE 'Asia/Tokyo' FROM fairqueue.periodic_schedule")
        assert tick.strftime("%Y-%m-%d %H:%M:%S") in page  # shown in TIME_ZONE


def test_the_overview_inside_a_callers_transaction_leaves_its_time_zone_alone(queue: Queue) -> None:
    """ATOMIC_REQUESTS: the overview reads in the request's transaction, with UTC only meanwhile."""
    from django.db import transaction

    from fairqueue_django import views

    with transaction.atomic(), fairqueue_django.connection().cursor() as cursor:
        cursor.execute("SET LOCAL TIME ZONE 'America/Lima'")
        assert views.overview("default")["jobs"]["ready"] == 3
        cursor.execute("SHOW TimeZone")
        assert cursor.fetchone() == ("America/Lima",)


# -- permissions --------------------------------------------------------------------------------------------


def _pages(queue: Queue, dj: psycopg.Connection[Any]) -> list[str]:
    return [
        f"{ADMIN}/job/",
        f"{ADMIN}/job/{queue.ready}/change/",
        f"{ADMIN}/completedjob/",
        f"{ADMIN}/completedjob/{quote_key(dj, queue.failed)}/change/",
        f"{ADMIN}/channel/",
        f"{ADMIN}/channel/tenant-a/change/",
        f"{ADMIN}/worker/",
        f"{ADMIN}/worker/{queue.worker}/change/",
        f"{ADMIN}/queueoverview/",
    ]


def _state(dj: psycopg.Connection[Any]) -> tuple[Any, ...]:
    return (
        sorted(_live(dj)),
        _channel(dj, "tenant-a"),
        dj.execute("SELECT count(*) FROM fairqueue.completed_job").fetchone(),
        dj.execute("SELECT count(*) FROM fairqueue.running_job WHERE cancel_requested").fetchone(),
    )


def _try_everything(client: Client, queue: Queue, dj: psycopg.Connection[Any]) -> list[int]:
    """Every change the admin can make, as forged POSTs; returns the status codes."""
    tenant_a = f"{ADMIN}/channel/tenant-a/change/"
    form_data = {
        "max_concurrency": "1",
        "rate_limit": "",
        "rate_burst": "1",
        "weight": "7",
        "paused": "on",
        "_save": "Save",
    }
    posts: list[tuple[str, dict[str, Any]]] = [
        (f"{ADMIN}/job/", _action("cancel_jobs", queue.ready, queue.running)),
        (f"{ADMIN}/job/{queue.ready}/change/", _action("cancel_jobs", queue.ready, change_form=True)),
        (f"{ADMIN}/completedjob/", _action("retry_jobs", queue.failed)),
        (
            f"{ADMIN}/completedjob/{quote_key(dj, queue.failed)}/change/",
            _action("retry_jobs", queue.failed, change_form=True),
        ),
        (f"{ADMIN}/channel/", _action("pause_channels", "tenant-a")),
        (tenant_a, _action("pause_channels", "tenant-a", change_form=True)),
        (tenant_a, form_data),
        (f"{ADMIN}/channel/", {**_action("pause_channels", "tenant-a"), "select_across": "1"}),
    ]
    return [client.post(url, data).status_code for url, data in posts]


def test_staff_without_permissions_is_refused_everywhere(
    login: MakeClient, queue: Queue, dj: psycopg.Connection[Any]
) -> None:
    client = login("nobody")
    for page in _pages(queue, dj):
        assert client.get(page).status_code == 403, page
    before = _state(dj)
    assert set(_try_everything(client, queue, dj)) == {403}
    assert _state(dj) == before


def test_without_staff_status_the_admin_asks_for_a_login(login: MakeClient, queue: Queue) -> None:
    client = login("visitor", "view_job", "cancel_job", staff=False)
    response = client.get(f"{ADMIN}/job/")
    assert response.status_code == 302 and "/admin/login/" in response["Location"]
    response = client.post(f"{ADMIN}/job/", _action("cancel_jobs", queue.ready))
    assert response.status_code == 302 and "/admin/login/" in response["Location"]


def test_view_only_staff_sees_the_pages_but_cannot_change_anything(
    login: MakeClient, queue: Queue, dj: psycopg.Connection[Any]
) -> None:
    client = login("viewer", "view_job", "view_completedjob", "view_channel", "view_worker")
    for page in _pages(queue, dj):
        response = client.get(page)
        assert response.status_code == 200, page
        assert response.context.get("action_form") is None, page  # no action is offered
        assert 'name="_save"' not in _text(response), page
    page = _text(client.get(f"{ADMIN}/job/"))
    assert "cancel_jobs" not in page and "reports.build" in page
    assert 'name="max_concurrency"' not in _text(client.get(f"{ADMIN}/channel/tenant-a/change/"))

    before = _state(dj)
    codes = _try_everything(client, queue, dj)
    assert _state(dj) == before
    assert 403 in codes  # the channel form: no change permission
    assert not {c for c in codes if c >= 500}


def test_each_action_needs_its_own_permission(login: MakeClient, queue: Queue, dj: psycopg.Connection[Any]) -> None:
    viewer = ("view_job", "view_completedjob", "view_channel")
    canceller = login("canceller", *viewer, "cancel_job")
    before = _state(dj)
    canceller.post(f"{ADMIN}/completedjob/", _action("retry_jobs", queue.failed))
    canceller.post(f"{ADMIN}/channel/", _action("pause_channels", "tenant-a"))
    assert _state(dj) == before
    canceller.post(f"{ADMIN}/job/", _action("cancel_jobs", queue.ready))
    assert queue.ready not in _live(dj)

    retrier = login("retrier", *viewer, "retry_job")
    retrier.post(f"{ADMIN}/job/", _action("cancel_jobs", queue.ready_too))
    assert queue.ready_too in _live(dj)
    retrier.post(f"{ADMIN}/completedjob/", _action("retry_jobs", queue.failed))
    assert queue.failed in _live(dj)

    operator = login("operator", *viewer, "change_channel")
    operator.post(f"{ADMIN}/channel/", _action("pause_channels", "tenant-a"))
    assert _channel(dj, "tenant-a")[-1] is True


def test_a_get_never_changes_anything(login: MakeClient, queue: Queue, dj: psycopg.Connection[Any]) -> None:
    client = login("root", superuser=True)
    before = _state(dj)
    for url in (
        f"{ADMIN}/job/?action=cancel_jobs&_selected_action={queue.ready}&index=0",
        f"{ADMIN}/job/{queue.ready}/change/?CHANGE_FORM-action=cancel_jobs&_selected_action={queue.ready}&index=0",
        f"{ADMIN}/completedjob/?action=retry_jobs&_selected_action={queue.failed}&index=0",
        f"{ADMIN}/channel/?action=pause_channels&_selected_action=tenant-a&index=0",
        f"{ADMIN}/channel/tenant-a/change/?weight=5&paused=on&_save=Save",
    ):
        assert client.get(url).status_code in (200, 302), url
    assert _state(dj) == before


def test_the_overview_needs_the_view_job_permission(login: MakeClient, queue: Queue) -> None:
    client = login("channels-only", "view_channel")
    assert client.get(f"{ADMIN}/queueoverview/").status_code == 403
    assert f'href="{ADMIN}/queueoverview/"' not in _text(client.get("/admin/"))
    client = login("jobs", "view_job")
    assert client.get(f"{ADMIN}/queueoverview/").status_code == 200
    assert f'href="{ADMIN}/queueoverview/"' in _text(client.get("/admin/"))


# -- the models ---------------------------------------------------------------------------------------------


def test_the_models_read_and_never_write(queue: Queue) -> None:
    from fairqueue_django.models import Channel, CompletedJob, Job

    assert Job.objects.with_state().get(id=queue.blocked).status == "blocked"
    assert set(Job.objects.with_status("waiting").values_list("id", flat=True)) == {queue.waiting}
    assert Channel.objects.with_counts().get(name="tenant-a").backlog == 2
    attempt = CompletedJob.objects.get(job_id=queue.failed)
    for write in (attempt.save, attempt.delete, Channel.objects.get(name="tenant-a").save):
        with pytest.raises(NotImplementedError):
            write()
    with pytest.raises(ValueError, match="status must be one of"):
        Job.objects.with_status("lost")


def test_the_models_migration_is_complete_and_runs_no_sql(django_url: str) -> None:
    import io

    from django.core.management import call_command

    call_command("makemigrations", "fairqueue", check=True, dry_run=True, verbosity=0)  # exits 1 if one is missing
    out = io.StringIO()
    call_command("sqlmigrate", "fairqueue", "0003", stdout=out)
    statements = [line for line in out.getvalue().splitlines() if line.strip() and not line.startswith("--")]
    assert statements == ["BEGIN;", "COMMIT;"]


# -- periodic schedules (FAIRQUEUE['PERIODIC'] and the admin page) ------------------------------------------


def _settings_schedule(**extra: Any) -> dict[str, Any]:
    spec = {"TASK": "tests.django_tasks.add", "CRON": "*/5 * * * *", "KWARGS": {"a": 2, "b": 3}} | extra
    return {"DATABASE": "default", "DEFAULT_CHANNEL": "web", "PERIODIC": {"every-five": spec}}


def test_schedules_from_settings_fire_django_tasks(dj: psycopg.Connection[Any]) -> None:
    from datetime import timedelta

    from django.test.utils import override_settings

    from fairqueue.periodic import PeriodicRunner
    from fairqueue_django.periodic import from_settings

    with override_settings(FAIRQUEUE=_settings_schedule(QUEUE_NAME="reports")):
        [entry] = from_settings()
    assert (entry.name, entry.task.name, entry.channel) == ("every-five", "tests.django_tasks.add", "reports")
    run = PeriodicRunner(lambda: [entry])
    [(now,)] = dj.execute("SELECT clock_timestamp()").fetchall()
    run.tick(dj, now=now)
    run.tick(dj, now=entry.schedule.next_after(now) + timedelta(seconds=1))
    assert dj.execute("SELECT kind, channel, args FROM fairqueue.job").fetchall() == [
        ("tests.django_tasks.add", "reports", {"args": [], "kwargs": {"a": 2, "b": 3}})
    ]


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"CRON": "61 * * * *"}, "out of range"),
        ({"TIMEZONE": "Mars/Olympus"}, "unknown time zone"),
        ({"TASK": "tests.django_tasks.nope"}, "cannot import"),
        ({"MISSED": "sometimes"}, "MISSED"),
    ],
)
def test_a_bad_settings_schedule_is_reported_by_the_checks(
    django_url: str, extra: dict[str, Any], message: str
) -> None:
    from django.core import checks
    from django.test.utils import override_settings

    with override_settings(FAIRQUEUE=_settings_schedule(**extra)):
        errors = [m for m in checks.run_checks() if m.id == "fairqueue.E005"]
    assert errors and message in errors[0].msg and "every-five" in errors[0].msg


def test_the_schedules_page_shows_them_and_pauses_with_permission(
    dj: psycopg.Connection[Any], login: MakeClient
) -> None:
    dj.execute(
        "SELECT fairqueue.register_periodic('nightly', '0 2 * * *', 'Europe/Paris', 'reports.nightly', 'reports', "
        "'{}'::jsonb, 'skip')"
    )
    admin_client = login("root", superuser=True)
    page = admin_client.get("/admin/fairqueue/periodicschedule/").content.decode()
    assert "nightly" in page and "0 2 * * *" in page and "Europe/Paris" in page and "active" in page
    viewer = login("viewer", "view_periodicschedule")
    assert viewer.get("/admin/fairqueue/periodicschedule/").status_code == 200
    forged = {"action": "pause_schedules", "_selected_action": ["nightly"]}
    viewer.post("/admin/fairqueue/periodicschedule/", forged)
    assert dj.execute("SELECT paused FROM fairqueue.periodic_schedule").fetchone() == (False,)
    admin_client.post("/admin/fairqueue/periodicschedule/", forged)
    assert dj.execute("SELECT paused FROM fairqueue.periodic_schedule").fetchone() == (True,)
    assert "paused" in admin_client.get("/admin/fairqueue/periodicschedule/").content.decode()


def test_a_schedule_that_never_fired_shows_never_as_its_last_tick(
    dj: psycopg.Connection[Any], login: MakeClient
) -> None:
    """register_periodic sets last_tick to the registration time; it is no tick until one fires a job."""
    from fairqueue_django.admin.base import local_time

    for name in ("fired", "new"):
        dj.execute(
            "SELECT fairqueue.register_periodic(%s, '*/10 * * * *', 'UTC', 'reports.nightly', 'reports', "
            "'{}'::jsonb, 'skip')",
            (name,),
        )
    [(registered, tick)] = dj.execute(
        "SELECT last_tick, date_trunc('hour', last_tick) + interval '1 hour' FROM fairqueue.periodic_schedule "
        "WHERE name = 'new'"
    ).fetchall()
    assert dj.execute("SELECT fairqueue.fire_periodic('fired', %s, true, 3)", (tick,)).fetchone() != (None,)
    client = login("root", superuser=True)
    page = _text(client.get(f"{ADMIN}/periodicschedule/"))
    row = r'<th class="field-name"><a [^>]*>([^<]*)</a></th>.*?<td class="field-last_run">([^<]*)</td>'
    assert dict(re.findall(row, page, re.S)) == {"fired": local_time(tick), "new": "never"}
    assert local_time(registered) not in page
    detail = _text(client.get(f"{ADMIN}/periodicschedule/new/change/"))
    assert re.search(r"Last tick:</label>\s*<div class=\"readonly\">never</div>", detail), detail
    # the queue overview's list of schedules (collect_status) says the same
    overview = client.get(f"{ADMIN}/queueoverview/").context["status"]["periodic"]
    assert {e["name"]: e["last_tick"] is None for e in overview} == {"fired": False, "new": True}


def test_the_schedules_page_reads_each_last_job_in_its_one_query(
    dj: psycopg.Connection[Any], login: MakeClient
) -> None:
    from django.db import connections
    from django.test.utils import CaptureQueriesContext

    def register(name: str, last_job: int | None = None) -> None:
        dj.execute(
            "SELECT fairqueue.register_periodic(%s, '0 2 * * *', 'UTC', 'reports.nightly', 'reports', '{}'::jsonb, "
            "'skip')",
            (name,),
        )
        dj.execute("UPDATE fairqueue.periodic_schedule SET last_job_id = %s WHERE name = %s", (last_job, name))

    client = login("root", superuser=True)

    def queries() -> tuple[int, str]:
        with CaptureQueriesContext(connections["default"]) as captured:
            response = client.get(f"{ADMIN}/periodicschedule/")
        assert response.status_code == 200
        return len(captured.captured_queries), _text(response)

    register("a-none")
    one, _ = queries()
    live = fairqueue_django.enqueue("reports.nightly", channel="reports")
    later = fairqueue_django.enqueue("reports.nightly", channel="reports", delay=3600)
    ended = fairqueue_django.enqueue("reports.nightly", channel="reports")
    fairqueue.cancel(dj, ended)
    for name, job in (("b-live", live), ("c-later", later), ("d-ended", ended), ("e-gone", 999_999)):
        register(name, job)
    many, page = queries()
    assert many == one
    for text in (f"{live} (ready)", f"{later} (scheduled)", f"{ended} (cancelled)", "999999 (gone)"):
        assert text in page
    for job_id, status in ((live, "ready"), (later, "scheduled"), (ended, "cancelled")):
        info = fairqueue_django.get_job(job_id)
        assert info is not None and info.status == status  # the same as fairqueue.get_job says


def test_a_big_history_window_is_counted_up_to_a_cap_and_paged_on_the_primary_key(
    dj: psycopg.Connection[Any], login: MakeClient
) -> None:
    from django.db import connections
    from django.test.utils import CaptureQueriesContext

    dj.execute(
        """
        INSERT INTO fairqueue.completed_job (job_id, attempt, outcome, final, kind, channel, error,
                                             enqueued_at, ready_at, started_at, finished_at)
        SELECT g, 1, CASE WHEN g % 10 = 0 THEN 'failed' ELSE 'succeeded' END, true, 'bulk.job', 'bulk',
               CASE WHEN g % 10 = 0 THEN 'boom' END, now() - interval '4 hours', now() - interval '4 hours',
               now() - interval '4 hours', now() - g * interval '1 second'
        FROM generate_series(1, 10050) AS g
        """
    )
    dj.execute("ANALYZE fairqueue.completed_job")
    client = login("root", superuser=True)
    with CaptureQueriesContext(connections["default"]) as captured:
        response = client.get(f"{ADMIN}/completedjob/")  # the default window: the last 24 hours
    assert response.status_code == 200
    cl = response.context["cl"]
    assert (cl.paginator.count, cl.paginator.capped, cl.paginator.num_pages) == (10_001, True, 201)
    [count_sql] = [q["sql"] for q in captured.captured_queries if "COUNT(" in q["sql"].upper()]
    assert "LIMIT 10001" in count_sql
    page = _text(response)
    assert "10,000+ finished attempts (history): counting stops there" in page
    assert "Select all 10,000+ finished attempts" in page
    assert response.context["selection_note_all"] == "All 10,000+ selected"
    # newest jobs first, read from the ends of each partition's primary key: no sort of the window
    assert [r.job_id for r in cl.result_list][:3] == [10_050, 10_049, 10_048]
    plan = cl.result_list.explain()
    assert not re.search(r"^\s*(->\s+)?Sort\s+\(", plan, re.MULTILINE), plan
    assert "Index Scan Backward" in plan, plan
    # the last page and a narrower filter (exact below the cap)
    assert _rows(client.get(f"{ADMIN}/completedjob/?p=201"))[0].job_id == 50
    response = client.get(f"{ADMIN}/completedjob/?outcome__exact=failed")
    assert response.context["cl"].paginator.count == 1005
    assert "1,005 finished attempts (history)\n" in _text(response)


def test_a_finished_attempts_page_has_no_history_button_and_lists_the_admins_actions_on_the_job(
    login: MakeClient, queue: Queue, dj: psycopg.Connection[Any]
) -> None:
    client = login("root", superuser=True)
    url = f"{ADMIN}/completedjob/{quote_key(dj, queue.failed)}/change/"
    page = _text(client.get(url))
    assert "/history/" not in page and "historylink" not in page  # it pointed at a page that does not exist
    assert "Admin actions on this job" in page
    # retried from the admin: the log entry is the job's (its live page and History are gone once it ends)
    client.post(f"{ADMIN}/completedjob/", _action("retry_jobs", queue.failed))
    fairqueue.cancel(dj, queue.failed)
    page = _text(client.get(url))
    assert f"{USER_PREFIX}root: Retry: retried." in page
    client.post(f"{ADMIN}/job/", _action("cancel_jobs", queue.ready))
    page = _text(client.get(f"{ADMIN}/completedjob/{quote_key(dj, queue.ready)}/change/"))
    assert f"{USER_PREFIX}root: Cancel: cancelled." in page
    # a live job's page keeps its History
    assert f'href="{ADMIN}/job/{queue.running}/history/"' in _text(client.get(f"{ADMIN}/job/{queue.running}/change/"))


# -- stored control characters ------------------------------------------------------------------------


def _shown_texts(page: str) -> list[str]:
    """What a page shows: its text and the attributes a browser displays (not the keys a form sends
    back, such as the value of an action's checkbox, which must stay the stored key)."""
    from html.parser import HTMLParser

    texts: list[str] = []

    class Shown(HTMLParser):
        def handle_data(self, data: str) -> None:
            texts.append(data)

        def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
            texts.extend(value or "" for key, value in attrs if key in ("title", "aria-label", "alt", "placeholder"))

    Shown().feed(page)
    return texts


def test_stored_control_characters_are_shown_as_escapes_on_every_page(
    login: MakeClient, dj: psycopg.Connection[Any]
) -> None:
    """Names stored before the schema refused control characters, a worker's name and info that older
    code registered, and error texts (free text) show as escapes: nothing raw reaches the page, where
    an invisible character could make two channels look the same."""
    from django.contrib.admin.utils import quote
    from django.urls import reverse

    from fairqueue_django.admin import attempt_key
    from fairqueue_django.models import CompletedJob

    worker = fairqueue.register_worker(dj, "w", lease_seconds=300, info={"host": "h", "pid": 1})
    failed = fairqueue_django.enqueue("k", channel="acme", max_attempts=1)
    fairqueue.claim_batch(dj, worker, 1)
    fairqueue.fail(dj, worker, failed, "Boom\x1b[31m\x9b\nTraceback (most recent call last):\n  File\x7f")
    live = fairqueue_django.enqueue("k", channel="acme", unique_key="u", delay=3600)
    fairqueue.configure_channel(dj, "acme")
    dj.execute("SELECT fairqueue.register_periodic('p', '0 3 * * *', 'UTC', 'k', 'acme', '{}', 'skip')")
    dj.execute("UPDATE fairqueue.job SET kind = %s, unique_key = %s WHERE id = %s", ("k\x1b[2J", "u\x85", live))
    dj.execute("UPDATE fairqueue.completed_job SET kind = %s, channel = %s", ("k\x1b[2J", "evil\nchannel"))
    dj.execute("UPDATE fairqueue.channel SET name = %s WHERE name = 'acme'", ("acme\x9b",))
    dj.execute(
        "UPDATE fairqueue.worker SET name = %s, info = %s",
        ("w\x1b]0;t\x07", json.dumps({"host": "h\x1b[1m", "pid": "1\x9b"})),
    )
    dj.execute("UPDATE fairqueue.periodic_schedule SET name = %s, kind = %s", ("p\x1b", "k\x7f"))

    client = login("escapes", superuser=True)
    row = CompletedJob.objects.get(job_id=failed)
    pages = {
        "jobs": f"{ADMIN}/job/",
        "job": f"{ADMIN}/job/{live}/change/",
        "history": f"{ADMIN}/completedjob/",
        "attempt": reverse("admin:fairqueue_completedjob_change", args=[attempt_key(row)]),
        "channels": f"{ADMIN}/channel/",
        "channel": reverse("admin:fairqueue_channel_change", args=[quote("acme\x9b")]),
        "workers": f"{ADMIN}/worker/",
        "worker": f"{ADMIN}/worker/{worker}/change/",
        "schedules": f"{ADMIN}/periodicschedule/",
        "overview": f"{ADMIN}/queueoverview/",
    }
    html = {}
    for name, url in pages.items():
        response = client.get(url)
        assert response.status_code == 200, name
        html[name] = _text(response)
        raw = [text for text in _shown_texts(html[name]) if re.search(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f]", text)]
        assert raw == [], (name, raw)
    assert "k\\x1b[2J" in html["jobs"] and "k\\x1b[2J" in html["job"] and "u\\x85" in html["job"]
    assert "evil\\nchannel" in html["history"] and "k\\x1b[2J" in html["history"]
    assert "Boom\\x1b[31m\\x9b" in html["history"]
    assert "Boom\\x1b[31m\\x9b" in html["attempt"] and "File\\x7f" in html["attempt"]
    assert "acme\\x9b" in html["channels"] and "acme\\x9b" in html["channel"]
    assert "w\\x1b]0;t\\x07" in html["workers"] and "h\\x1b[1m" in html["workers"] and "1\\x9b" in html["workers"]
    assert "w\\x1b]0;t\\x07" in html["worker"] and "h\\x1b[1m" in html["worker"]
    assert "p\\x1b" in html["schedules"] and "k\\x7f" in html["schedules"]
    for shown in ("acme\\x9b", "w\\x1b]0;t\\x07", "h\\x1b[1m", "evil\\nchannel", "Boom\\x1b[31m\\x9b"):
        assert shown in html["overview"], shown


def test_a_stored_channel_name_with_control_characters_cannot_be_configured(
    login: MakeClient, dj: psycopg.Connection[Any]
) -> None:
    """The channel form and the pause action refuse it, as fairqueue.update_channel does, with a
    message that shows the name with escapes; nothing changes."""
    from django.contrib.admin.utils import quote
    from django.urls import reverse

    fairqueue.configure_channel(dj, "acme")
    dj.execute("UPDATE fairqueue.channel SET name = %s", ("acme\x1b[2J",))
    client = login("old-names", superuser=True)
    url = reverse("admin:fairqueue_channel_change", args=[quote("acme\x1b[2J")])
    response = client.post(url, _form_data(client.get(url).context["adminform"].form, weight=3))
    assert response.status_code == 200
    errors = response.context["adminform"].form.errors.get("__all__", [])
    assert any("channel name must not contain control characters" in e for e in errors), errors
    response = client.post(f"{ADMIN}/channel/", _action("pause_channels", "acme\x1b[2J"), follow=True)
    assert _messages(response) == [
        "Channel acme\\x1b[2J: failed: channel name must not contain control characters (newline, tab, escape, "
        "...): it contains U+001B"
    ]
    assert _channel(dj, "acme\x1b[2J") == (None, None, 1.0, 1, False)


def test_pausing_schedules_reports_a_stored_name_it_refuses_and_pauses_the_others(
    dj: psycopg.Connection[Any], login: MakeClient
) -> None:
    for name in ("nightly", "old"):
        dj.execute(
            "SELECT fairqueue.register_periodic(%s, '0 2 * * *', 'UTC', 'reports.nightly', 'reports', '{}', 'skip')",
            (name,),
        )
    dj.execute("UPDATE fairqueue.periodic_schedule SET name = %s WHERE name = 'old'", ("old\x1b[2J",))
    client = login("root", superuser=True)
    selected = {"action": "pause_schedules", "_selected_action": ["nightly", "old\x1b[2J"]}
    response = client.post("/admin/fairqueue/periodicschedule/", selected, follow=True)
    assert response.status_code == 200
    assert _messages(response) == [
        "Schedule nightly: paused",
        "Schedule old\\x1b[2J: failed: schedule name must not contain control characters (newline, tab, escape, "
        "...): it contains U+001B",
    ]
    paused = dict(dj.execute("SELECT name, paused FROM fairqueue.periodic_schedule").fetchall())
    assert paused == {"nightly": True, "old\x1b[2J": False}


# -- as a database role of each level (fairqueue grant) ------------------------------------------------
# The admin reaches the queue through FAIRQUEUE['DATABASE']; in production that alias logs in as a role
# of the admin level. Here it points at a queue database of its own (granting and revoking would leave
# explicit privileges on the shared Django database's schema) and logs in as a role of each level in
# turn: an admin role can use every page and action, a producer or worker role sees the pages but
# every action is refused.


@dataclass
class RoleQueue:
    owner: psycopg.Connection[Any]  # the schema's owner, on the queue's database
    ready: int
    failed: int


@pytest.fixture
def queue_as(
    server_url: str, login: MakeClient, test_environment: None
) -> Iterator[Callable[[str], tuple[RoleQueue, Client]]]:
    """``queue_as(level)``: a queue database of its own (a ready job, a job that failed, channel
    tenant-a with limits, schedule nightly) that the admin reaches as a new login role of that
    level; returns it and a superuser's client."""
    from django.conf import settings
    from django.db import connections
    from django.test import override_settings

    from fairqueue import cli, migrations
    from fairqueue.urls import with_database
    from tests.helpers import PASSWORD

    suffix = os.environ.get("PYTEST_XDIST_WORKER", "main")
    database = f"fq_django_roles_{suffix}"
    created: list[tuple[str, str, Any]] = []
    owner: list[psycopg.Connection[Any]] = []
    admin = psycopg.connect(server_url, autocommit=True)
    admin.execute(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')
    admin.execute(f'CREATE DATABASE "{database}"')
    url = with_database(server_url, database)
    migrations.upgrade(url)

    def make(level: str) -> tuple[RoleQueue, Client]:
        name, alias = f"fq_dj_{level}_{suffix}", f"queue_as_{level}"
        if admin.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (name,)).fetchone():
            with psycopg.connect(url, autocommit=True) as c:
                c.execute(f'DROP OWNED BY "{name}"')
            admin.execute(f'DROP ROLE "{name}"')
        admin.execute(f"CREATE ROLE \"{name}\" LOGIN PASSWORD '{PASSWORD}'")
        assert cli.main(["grant", level, name, "--database-url", url]) == 0
        conn = psycopg.connect(url, autocommit=True)
        owner.append(conn)
        failed = fairqueue.enqueue(conn, "emails.send", {"to": "ann"}, channel="tenant-b", max_attempts=1)
        worker = fairqueue.register_worker(conn, "worker-1", lease_seconds=300)
        [claimed] = fairqueue.claim_batch(conn, worker, 1)
        fairqueue.fail(conn, worker, claimed.id, "ValueError: bad address")
        ready = fairqueue.enqueue(conn, "reports.build", {"month": 1}, channel="tenant-a")
        fairqueue.configure_channel(conn, "tenant-a", max_concurrency=5, rate_limit="10/s", burst=3, weight=2)
        conn.execute(
            "SELECT fairqueue.register_periodic('nightly', '0 2 * * *', 'UTC', 'reports.nightly', 'reports', '{}', "
            "'skip')"
        )
        connections.settings[alias] = connections.settings["default"] | {
            "NAME": database,
            "USER": name,
            "PASSWORD": PASSWORD,
        }
        override = override_settings(FAIRQUEUE={**settings.FAIRQUEUE, "DATABASE": alias})
        override.enable()
        created.append((name, alias, override))
        return RoleQueue(conn, ready, failed), login("root", superuser=True)

    yield make
    for _name, alias, override in created:
        override.disable()
        connections[alias].close()
        del connections[alias]
        del connections.settings[alias]
    for conn in owner:
        conn.close()
    admin.execute(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')
    for name, _, _ in created:
        admin.execute(f'DROP ROLE IF EXISTS "{name}"')
    admin.close()


def _every_page(client: Client, q: RoleQueue) -> None:
    from django.contrib.admin.utils import quote

    from fairqueue_django.admin import attempt_key
    from fairqueue_django.models import CompletedJob

    key = quote(attempt_key(CompletedJob.objects.filter(job_id=q.failed).first()))
    for path in (
        "/admin/",
        f"{ADMIN}/queueoverview/",
        f"{ADMIN}/job/",
        f"{ADMIN}/job/{q.ready}/change/",
        f"{ADMIN}/completedjob/",
        f"{ADMIN}/completedjob/{key}/change/",
        f"{ADMIN}/channel/",
        f"{ADMIN}/channel/tenant-a/change/",
        f"{ADMIN}/worker/",
        f"{ADMIN}/periodicschedule/",
    ):
        assert client.get(path).status_code == 200, path


def test_an_admin_role_can_use_every_page_and_action(queue_as: Callable[[str], tuple[RoleQueue, Client]]) -> None:
    q, client = queue_as("admin")
    _every_page(client, q)
    response = client.post(f"{ADMIN}/job/", _action("cancel_jobs", q.ready), follow=True)
    assert _messages(response) == [f"Job {q.ready}: cancelled"]
    response = client.post(f"{ADMIN}/completedjob/", _action("retry_jobs", q.failed), follow=True)
    assert _messages(response) == [f"Job {q.failed}: queued again"]
    response = client.post(f"{ADMIN}/channel/", _action("pause_channels", "tenant-a"), follow=True)
    assert _messages(response) == ["Channel tenant-a: paused"]
    url = f"{ADMIN}/channel/tenant-a/change/"
    response = client.post(url, _form_data(client.get(url).context["adminform"].form, max_concurrency=7), follow=True)
    assert any("was changed successfully" in m for m in _messages(response))
    # a shared limit's page saves through update_limit: an advisory lock, no table written
    fairqueue.configure_limit(q.owner, "mailer", max_concurrency=5, rate_limit="10/s")
    url = f"{ADMIN}/sharedlimit/mailer/change/"
    form = client.get(url).context["adminform"].form
    response = client.post(url, _limit_form_data(form, max_concurrency=9), follow=True)
    assert any("was changed successfully" in m for m in _messages(response))
    assert _limit(q.owner, "mailer") == (9, "10/s", 1.0)
    client.post(f"{ADMIN}/periodicschedule/", {"action": "pause_schedules", "_selected_action": ["nightly"]})
    assert q.ready not in _live(q.owner) and q.failed in _live(q.owner)
    assert _channel(q.owner, "tenant-a") == (7, "10/s", 3.0, 2, True)
    assert q.owner.execute("SELECT paused FROM fairqueue.periodic_schedule").fetchone() == (True,)


@pytest.mark.parametrize("level", ["producer", "worker"])
def test_below_the_admin_level_the_pages_show_but_every_action_is_refused(
    queue_as: Callable[[str], tuple[RoleQueue, Client]], level: str
) -> None:
    q, client = queue_as(level)
    _every_page(client, q)
    refused = "failed: permission denied for function"
    response = client.post(f"{ADMIN}/job/", _action("cancel_jobs", q.ready), follow=True)
    assert _messages(response) == [f"Job {q.ready}: {refused} cancel"]
    response = client.post(f"{ADMIN}/completedjob/", _action("retry_jobs", q.failed), follow=True)
    assert _messages(response) == [f"Job {q.failed}: {refused} retry"]
    response = client.post(f"{ADMIN}/channel/", _action("pause_channels", "tenant-a"), follow=True)
    assert _messages(response) == [f"Channel tenant-a: {refused} configure_channel"]
    url = f"{ADMIN}/channel/tenant-a/change/"
    form = _form_data(client.get(url).context["adminform"].form, max_concurrency=7)
    # the edit form has no message for a database error: the request fails (a 500 page)
    with pytest.raises(DatabaseError, match="permission denied for function configure_channel"):
        client.post(url, form)
    # the schedules' pause action says "failed: ..." per schedule, as the jobs' and channels' actions do
    response = client.post(
        f"{ADMIN}/periodicschedule/", {"action": "pause_schedules", "_selected_action": ["nightly"]}, follow=True
    )
    assert _messages(response) == [f"Schedule nightly: {refused} pause_periodic"]
    assert q.ready in _live(q.owner) and q.failed not in _live(q.owner)
    assert _channel(q.owner, "tenant-a") == (5, "10/s", 3.0, 2, False)
    assert q.owner.execute("SELECT paused FROM fairqueue.periodic_schedule").fetchone() == (False,)


def test_shared_limits_list_their_settings_holders_and_line(login: MakeClient, dj: psycopg.Connection[Any]) -> None:
    worker = fairqueue.register_worker(dj, "worker-1", lease_seconds=300)
    fairqueue.configure_limit(dj, "stripe-api", max_concurrency=1)
    fairqueue.configure_limit(dj, "mailer", rate_limit="10/s", burst=2)
    ids = [fairqueue_django.enqueue("billing.charge", {}, channel="tenant-a", limits=["stripe-api"]) for _ in range(3)]
    [running] = fairqueue.claim_batch(dj, worker, 10)  # one slot: one runs, two wait in the line
    client = login("root", superuser=True)
    response = client.get(f"{ADMIN}/sharedlimit/")
    rows = {r.name: (r.max_concurrency, r.rate_limit, r.holding, r.waiting) for r in _rows(response)}
    assert rows == {"mailer": (None, "10/s", 0, 0), "stripe-api": (1, None, 1, 2)}
    page = _text(client.get(f"{ADMIN}/sharedlimit/stripe-api/change/"))
    assert "stripe-api" in page and "waiting in its line" in page.lower()
    # the jobs in the line are waiting, as fairqueue.get_job says, and the waiting filter finds them
    statuses = _statuses(client)
    assert statuses[running.id] == "running"
    assert sorted(i for i in ids if statuses[i] == "waiting") == sorted(set(ids) - {running.id})
    assert set(_statuses(client, "?status=waiting")) == set(ids) - {running.id}
    # nothing to add or delete (the settings are changed on the limit's page: below)
    assert client.post(f"{ADMIN}/sharedlimit/add/").status_code == 403
    assert client.post(f"{ADMIN}/sharedlimit/stripe-api/delete/").status_code == 403


LIMIT_SETTINGS = ("max_concurrency", "rate_limit", "rate_burst")


def _limit(dj: psycopg.Connection[Any], name: str) -> tuple[Any, ...]:
    row = dj.execute(
        "SELECT max_concurrency, rate_limit, rate_burst FROM fairqueue.shared_limit WHERE name = %s", (name,)
    ).fetchone()
    assert row is not None
    return tuple(row)


def _limit_form_data(form: Any, **changes: Any) -> dict[str, str]:
    """What the browser sends for a shared limit's page: each field, and its value when the page was drawn."""
    data = {"_save": "Save"}
    for name in LIMIT_SETTINGS:
        initial = form.initial.get(name)
        data[f"initial-{name}"] = "" if initial is None else str(initial)
        value = changes.get(name, initial)
        data[name] = "" if value is None else str(value)
    return data


def test_a_shared_limits_settings_are_changed_on_its_page(login: MakeClient, dj: psycopg.Connection[Any]) -> None:
    worker = fairqueue.register_worker(dj, "worker-1", lease_seconds=300)
    fairqueue.configure_limit(dj, "stripe-api", max_concurrency=1)
    for _ in range(4):
        fairqueue_django.enqueue("billing.charge", {}, channel="tenant-a", limits=["stripe-api"])
    assert len(fairqueue.claim_batch(dj, worker, 10)) == 1  # one slot: three jobs wait in the line
    client = login("root", superuser=True)
    url = f"{ADMIN}/sharedlimit/stripe-api/change/"
    page = client.get(url)
    assert 'name="max_concurrency" value="1"' in _text(page)
    response = client.post(url, _limit_form_data(page.context["adminform"].form, max_concurrency=3), follow=True)
    assert any("was changed successfully" in m for m in _messages(response))
    assert _limit(dj, "stripe-api") == (3, None, 1.0)
    assert len(fairqueue.claim_batch(dj, worker, 10)) == 2  # the two new slots go to the line at once
    # a rate limit with a burst, then no rate limit: the burst goes back to 1
    form = client.get(url).context["adminform"].form
    client.post(url, _limit_form_data(form, rate_limit="10/s", rate_burst=2))
    assert _limit(dj, "stripe-api") == (3, "10/s", 2.0)
    form = client.get(url).context["adminform"].form
    assert form.fields["rate_burst"].prepare_value(form.initial["rate_burst"]) == 2
    client.post(url, _limit_form_data(form, rate_limit=None, max_concurrency=None))
    assert _limit(dj, "stripe-api") == (None, None, 1.0)


def test_saving_an_old_limit_page_keeps_what_was_changed_meanwhile(
    login: MakeClient, dj: psycopg.Connection[Any]
) -> None:
    fairqueue.configure_limit(dj, "mailer", max_concurrency=5, rate_limit="10/s", burst=3)
    client = login("root", superuser=True)
    url = f"{ADMIN}/sharedlimit/mailer/change/"
    old_page = client.get(url).context["adminform"].form
    fairqueue.configure_limit(dj, "mailer", max_concurrency=5, rate_limit="20/s", burst=3)  # elsewhere
    client.post(url, _limit_form_data(old_page, max_concurrency=8))  # the rate is as it was drawn: untouched
    assert _limit(dj, "mailer") == (8, "20/s", 3.0)
    # a burst saved for a rate limit that was removed meanwhile: the removal stays
    old_page = client.get(url).context["adminform"].form
    fairqueue.configure_limit(dj, "mailer", max_concurrency=8)
    response = client.post(url, _limit_form_data(old_page, rate_burst=6), follow=True)
    assert any("was changed successfully" in m for m in _messages(response))
    assert _limit(dj, "mailer") == (8, None, 1.0)


@pytest.mark.parametrize(
    ("changes", "field", "message"),
    [
        ({"rate_limit": "fast"}, "rate_limit", "is not understood"),
        (
            {"max_concurrency": 0},
            None,
            "max_concurrency must be a whole number of at least 1 (or None for no cap), got 0",
        ),
        ({"rate_burst": 0.5}, None, "burst must be a number of at least 1"),
        ({"rate_limit": None, "rate_burst": 4}, None, "burst only applies together with a rate_limit"),
    ],
)
def test_bad_limit_settings_are_form_errors_and_change_nothing(
    login: MakeClient, dj: psycopg.Connection[Any], changes: dict[str, Any], field: str | None, message: str
) -> None:
    fairqueue.configure_limit(dj, "mailer", max_concurrency=5, rate_limit="10/s", burst=3)
    client = login("root", superuser=True)
    url = f"{ADMIN}/sharedlimit/mailer/change/"
    response = client.post(url, _limit_form_data(client.get(url).context["adminform"].form, **changes))
    assert response.status_code == 200
    errors = response.context["adminform"].form.errors.get(field or "__all__", [])
    assert any(message in e for e in errors), errors
    assert not any("paused" in e for e in errors)  # a limit has no pause
    assert _limit(dj, "mailer") == (5, "10/s", 3.0)


def test_changing_a_shared_limit_needs_its_permission(login: MakeClient, dj: psycopg.Connection[Any]) -> None:
    fairqueue.configure_limit(dj, "mailer", max_concurrency=5)
    url = f"{ADMIN}/sharedlimit/mailer/change/"
    viewer = login("viewer", "view_sharedlimit")
    form = viewer.get(url).context["adminform"].form
    assert viewer.post(url, _limit_form_data(form, max_concurrency=9)).status_code == 403
    assert _limit(dj, "mailer") == (5, None, 1.0)
    operator = login("operator", "view_sharedlimit", "change_sharedlimit")
    form = operator.get(url).context["adminform"].form
    response = operator.post(url, _limit_form_data(form, max_concurrency=9), follow=True)
    assert any("was changed successfully" in m for m in _messages(response))
    assert _limit(dj, "mailer") == (9, None, 1.0)
