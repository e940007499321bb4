"""One job's actions on the dashboard: ``POST /api/queues/{q}/jobs/{id}/cancel`` (a job
not finished: a running one is stopped; 409 for a finished job), ``/requeue`` (dead), ``/delete``
(dead, done or cancelled), with their buttons on the job page and on each row.

Real Redis, a real worker process; the dashboard in-process (``make_app``).
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import pytest
import redis

from queueworks import Client
from queueworks.protocol.models import JobState
from tests.conftest import Cluster, wait_for
from tests.test_dashboard import make_app, post

ALLOW = ("tests.handlers", "tests.test_queue_dashboard")


@pytest.fixture
def web(client: Client) -> Iterator[httpx.Client]:
    with make_app(client) as http:
        yield http


def buttons(page: str, queue: str, job: str) -> set[str]:
    """The job actions a page offers for ``job`` (by the address each form posts to)."""
    base = f'action="/queues/{queue}/jobs/{job}/'
    found, at = set(), page.find(base)
    while at >= 0:
        found.add(page[at + len(base) : page.index('"', at + len(base))])
        at = page.find(base, at + 1)
    return found


@pytest.mark.integration
def test_a_job_not_started_is_cancelled_from_its_page_and_row(
    client: Client, web: httpx.Client
) -> None:
    q = client.queue("act-cancel")
    now = q.enqueue("tests.handlers:double", {"x": 1})
    later = q.enqueue("tests.handlers:double", {"x": 2}, delay=600)
    after = q.enqueue("tests.handlers:double", {"x": 3}, depends_on=[later])
    assert buttons(web.get(f"/queues/{q.name}/jobs/{now.id}").text, q.name, now.id) == {"cancel"}
    assert buttons(web.get(f"/queues/{q.name}?jobs=scheduled").text, q.name, later.id) == {
        "run",
        "cancel",
    }
    for job in (after, later, now):  # the dependent first: it dies with what it waits for
        got = post(web, f"/api/queues/{q.name}/jobs/{job.id}/cancel")
        assert got.status_code == 200 and got.json()["cancelled"] is True, got.text
        assert job.status().state == JobState.CANCELLED
    for job, x in ((now, 1), (later, 2), (after, 3)):  # a cancelled job keeps its payload
        payload = web.get(f"/api/queues/{q.name}/jobs/{job.id}").json()["payload"]
        assert payload is not None and json.loads(payload) == {"x": x}, job.id
    again = post(web, f"/api/queues/{q.name}/jobs/{now.id}/cancel")
    assert again.status_code == 409 and "had finished" in again.json()["error"]
    assert buttons(web.get(f"/queues/{q.name}/jobs/{now.id}").text, q.name, now.id) == {"delete"}
    assert post(web, f"/api/queues/{q.name}/jobs/nojob/cancel").status_code == 404
    assert post(web, f"/api/queues/{q.name}/jobs/{now.id}/delete").status_code == 200
    assert web.get(f"/api/queues/{q.name}/jobs/{now.id}").status_code == 404
    listed = web.get(f"/api/queues/{q.name}/jobs?state=cancelled").json()
    assert now.id not in [j["id"] for j in listed["jobs"]] and listed["total"] == 2
    form = web.post(f"/queues/{q.name}/jobs/{now.id}/cancel", data={}, follow_redirects=False)
    assert form.status_code == 403  # no CSRF token: refused


@pytest.mark.system
def test_a_dead_job_is_requeued_or_deleted_and_a_running_one_cancelled(
    cluster: Cluster, client: Client, r: redis.Redis, web: httpx.Client
) -> None:
    q = client.queue("act-dead", max_attempts=1)
    gate = f"{client.keys.prefix}:gate-act"
    dead = q.enqueue("tests.test_queue_dashboard:gated_job", {"gate": gate, "x": 4})
    gone = q.enqueue("tests.handlers:always_fails", {})
    done = q.enqueue("tests.handlers:double", {"x": 1})
    busy = q.enqueue("tests.handlers:sleep_for", {"seconds": 60.0})
    cluster.worker("w-act", allow=ALLOW, extra=["--concurrency", "4"])
    wait_for(lambda: gone.status().state == JobState.DEAD, 60, "a dead job")
    wait_for(lambda: dead.status().state == JobState.DEAD, 60, "a dead job")
    assert done.result(timeout=60) == 2
    wait_for(lambda: busy.status().state == JobState.RUNNING, 60, "a running job")

    page = web.get(f"/queues/{q.name}/jobs/{dead.id}").text
    assert buttons(page, q.name, dead.id) == {"requeue", "delete"}
    assert buttons(web.get(f"/queues/{q.name}?jobs=dead").text, q.name, dead.id) == {
        "requeue",
        "delete",
    }
    assert buttons(web.get(f"/queues/{q.name}/jobs/{busy.id}").text, q.name, busy.id) == {"cancel"}
    assert post(web, f"/api/queues/{q.name}/jobs/{busy.id}/delete").status_code == 409
    running = post(web, f"/api/queues/{q.name}/jobs/{busy.id}/cancel")
    assert running.status_code == 200 and running.json()["cancelled"] is True, running.text
    wait_for(lambda: busy.status().state == JobState.CANCELLED, 10, "the running job cancelled")
    listed = web.get(f"/api/queues/{q.name}/jobs?state=cancelled").json()
    assert [j["id"] for j in listed["jobs"]] == [busy.id] and listed["total"] == 1
    assert post(web, f"/api/queues/{q.name}/jobs/{done.id}/requeue").status_code == 409

    r.set(gate, 1)
    got = post(web, f"/api/queues/{q.name}/jobs/{dead.id}/requeue")
    assert got.status_code == 200 and got.json()["job"] == dead.id, got.text
    assert dead.result(timeout=60) == 8

    kept = web.get(f"/api/queues/{q.name}/jobs/{gone.id}").json()
    assert kept["payload"] is not None and json.loads(kept["payload"]) == {}
    assert post(web, f"/api/queues/{q.name}/jobs/{gone.id}/delete").status_code == 200
    assert web.get(f"/api/queues/{q.name}/jobs/{gone.id}").status_code == 404
    letters = web.get(f"/api/queues/{q.name}").json()["dead_letters"]
    assert gone.id not in [x["job"] for x in letters]
    assert post(web, f"/api/queues/{q.name}/jobs/{done.id}/delete").status_code == 200
    (total,) = [web.get(f"/api/queues/{q.name}/jobs?state=done").json()["total"]]
    assert total == 1  # the requeued job, done; the deleted one is gone from the list
