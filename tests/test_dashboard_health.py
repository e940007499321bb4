"""A queue's health on the dashboard: ``paused``, ``warnings`` (no member with a backlog,
paused with a backlog, members on lost workers), ``null`` for a limit not set, and a job on
a lost worker saying so, in the API and on the pages.

Real Redis, a real worker process SIGKILLed; the dashboard in-process (``make_app``).
"""

from __future__ import annotations

import html
import json
import re
from collections.abc import Iterator

import httpx
import pytest
import redis

from queueworks import Client
from queueworks.protocol.keys import Keys
from queueworks.protocol.models import JobState
from tests.conftest import Cluster, wait_for
from tests.test_dashboard import FAST_BEAT, make_app


@pytest.fixture
def web(client: Client) -> Iterator[httpx.Client]:
    with make_app(client) as http:
        yield http


def row(web: httpx.Client, name: str) -> dict[str, object]:
    rows = {q["name"]: q for q in web.get("/api/queues").json()["queues"]}
    return rows[name]


@pytest.mark.integration
def test_no_member_and_paused_with_a_backlog_are_warnings_on_every_page(
    client: Client, web: httpx.Client
) -> None:
    idle = client.queue("idle-h")
    idle.enqueue("tests.handlers:double", {"x": 1})
    held = client.queue("held-h")
    held.pause()
    held.enqueue("tests.handlers:double", {"x": 2})
    fine = client.queue("fine-h")

    idle_row, held_row, fine_row = (row(web, q.name) for q in (idle, held, fine))
    assert idle_row["paused"] is False and held_row["paused"] is True
    assert any("No member serves this queue" in w for w in idle_row["warnings"])  # type: ignore[attr-defined]
    assert any(w.startswith("Paused with 1 job waiting") for w in held_row["warnings"])  # type: ignore[attr-defined]
    assert fine_row["warnings"] == []
    detail = web.get(f"/api/queues/{held.name}").json()
    assert detail["queue"]["warnings"] == held_row["warnings"] and detail["queue"]["paused"]
    assert detail["rate_limit"] is None and detail["group_limit"] is None  # unset: null
    assert detail["queue"]["rate_limit"] is None and detail["queue"]["group_limit"] is None

    for page in ("/", "/queues"):
        text = web.get(page).text
        for q, n in ((idle, 1), (held, 2)):
            at = text.index(f'data-queue="{q.name}"')
            cells = text[at : text.index("</tr>", at)]
            assert f'data-field="warnings" href="/queues/{q.name}#warnings"' in cells, page
            assert f">{n} warning" in cells or ">1 warning<" in cells
        at = text.index(f'data-queue="{held.name}"')
        assert 'data-field="paused">paused<' in text[at : text.index("</tr>", at)], page
        at = text.index(f'data-queue="{fine.name}"')
        assert "data-field=" + '"warnings"' not in text[at : text.index("</tr>", at)]
    page = web.get(f"/queues/{held.name}").text
    assert 'id="warnings"' in page and html.escape("Paused with 1 job waiting") in page
    assert "at most 0" not in page  # no limit set: none shown as 0
    assert 'id="warnings"' not in web.get(f"/queues/{fine.name}").text


@pytest.mark.system
def test_a_member_on_a_lost_worker_is_a_warning_and_its_job_says_so(
    cluster: Cluster, client: Client, r: redis.Redis, keys: Keys, web: httpx.Client
) -> None:
    cluster.worker("w-lost", env=FAST_BEAT)
    cluster.wait_workers(r, 1)
    q = client.queue("lost-h")
    job = q.enqueue("tests.handlers:sleep_for", {"seconds": 60.0})
    wait_for(lambda: job.status().state == JobState.RUNNING, 60, "the job running")
    assert web.get(f"/api/queues/{q.name}/jobs/{job.id}").json()["worker_lost"] is False
    assert not any("lost" in w for w in row(web, q.name)["warnings"])  # type: ignore[attr-defined]
    cluster.procs[0].kill()
    wait_for(lambda: not r.exists(keys.worker_heartbeat("w-lost")), 30, "the heartbeat gone")

    warnings = row(web, q.name)["warnings"]
    assert any("1 member on lost workers (w-lost)" in w for w in warnings), warnings  # type: ignore[attr-defined]
    found = web.get(f"/api/queues/{q.name}/jobs/{job.id}").json()
    assert found["state"] == "running" and found["worker"] == "w-lost" and found["worker_lost"]
    page = web.get(f"/queues/{q.name}/jobs/{job.id}").text
    assert 'id="job-worker-lost"' in page


def tabs(page: str) -> dict[str, int]:
    """The queue page's state tabs: state -> the count it shows."""
    nav = page[page.index('id="job-states"') : page.index("</nav>", page.index('id="job-states"'))]
    found = re.findall(r'data-state="(\w+)"[^>]*>\w+ <span class="num">(\d+)</span>', nav)
    return {s: int(n) for s, n in found}


def every_job(web: httpx.Client, name: str, state: str) -> tuple[int, list[str]]:
    """A state's list total and every job id of it, page after page."""
    ids: list[str] = []
    while True:
        page = web.get(f"/api/queues/{name}/jobs?state={state}&limit=2&offset={len(ids)}")
        assert page.status_code == 200, page.text
        body = page.json()
        ids += [j["id"] for j in body["jobs"]]
        if not body["jobs"]:
            return body["total"], ids


def check_tabs_match_lists(web: httpx.Client, name: str) -> dict[str, int]:
    counts = web.get(f"/api/queues/{name}").json()["jobs_by_state"]
    assert tabs(web.get(f"/queues/{name}").text) == counts
    for state, n in counts.items():
        total, ids = every_job(web, name, state)
        assert total == n == len(ids), (state, total, n, ids)
    return dict(counts)


@pytest.mark.system
def test_every_tab_counts_what_its_list_holds_cancelled_included(
    cluster: Cluster, client: Client, r: redis.Redis, keys: Keys, web: httpx.Client
) -> None:
    q = client.queue("tabs-h")
    bad = q.enqueue("tests.handlers:always_fails", {})
    cluster.worker("w-tabs")
    assert q.enqueue("tests.handlers:double", {"x": 1}).result(timeout=60) == 2
    wait_for(lambda: bad.status().state == JobState.DEAD, 60, "a dead job")
    cluster.procs[0].terminate()
    cluster.procs[0].p.wait(30)
    waiting = [q.enqueue("tests.handlers:double", {"x": i}) for i in range(3)]
    later = [q.enqueue("tests.handlers:double", {"x": i}, delay=600) for i in range(2)]
    after = q.enqueue("tests.handlers:double", {"x": 5}, depends_on=[later[0]])
    assert waiting[0].cancel() and later[1].cancel()

    counts = check_tabs_match_lists(web, q.name)
    assert counts == {
        "queued": 2,
        "scheduled": 1,
        "deferred": 1,
        "running": 0,
        "done": 1,
        "dead": 1,
        "cancelled": 2,
    }
    row = web.get(f"/api/queues/{q.name}").json()["queue"]
    assert row["cancelled"] == 2 and row["deferred"] == 1
    _, ids = every_job(web, q.name, "cancelled")
    assert ids == [later[1].id, waiting[0].id]  # newest first
    assert after.status().state == JobState.DEFERRED

    letter = web.get(f"/api/queues/{q.name}").json()["dead_letters"][0]
    from tests.test_dashboard import post

    assert post(web, f"/api/queues/{q.name}/dead/{letter['id']}/delete").status_code == 200
    assert check_tabs_match_lists(web, q.name)["dead"] == 0  # no letter: none listed
    kept = web.get(f"/api/queues/{q.name}/jobs/{bad.id}").json()  # its record keeps it all
    assert kept["state"] == "dead" and kept["payload"] == "{}"
    cancelled = web.get(f"/api/queues/{q.name}/jobs/{waiting[0].id}").json()
    assert json.loads(cancelled["payload"]) == {"x": 0}


@pytest.mark.integration
def test_a_cancelled_queue_tabs_count_its_left_jobs_and_the_page_opens_on_them(
    client: Client, web: httpx.Client
) -> None:
    q = client.queue("left-h")
    for i in range(3):
        q.enqueue("tests.handlers:double", {"x": i}, delay=600)
    page = web.get(f"/queues/{q.name}").text
    assert 'data-state="scheduled" class="on"' in page  # where the jobs are, not queued
    for i in range(4):
        q.enqueue("tests.handlers:double", {"x": i})
    client.task(q.name).cancel()
    counts = check_tabs_match_lists(web, q.name)
    assert counts["queued"] == 4 and counts["scheduled"] == 3
