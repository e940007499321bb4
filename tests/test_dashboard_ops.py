"""The dashboard's live settings form (queue page) and its Cancel job button (job page),
CSRF-checked like every other form. Real Redis, the real app over HTTP."""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import pytest
import redis

from queueworks import Client
from queueworks.protocol.keys import Keys
from queueworks.protocol.models import JobState
from queueworks.queue.queue_settings import LIVE
from tests.test_dashboard import csrf_of, make_app, post

pytestmark = pytest.mark.integration


@pytest.fixture
def web(client: Client) -> Iterator[httpx.Client]:
    with make_app(client) as http:
        yield http


def test_the_queue_page_has_a_settings_form_that_changes_them(
    client: Client, web: httpx.Client
) -> None:
    q = client.queue("dash-set", max_attempts=2, rate_limit=5.0)
    page = web.get("/queues/dash-set").text
    assert 'id="queue-settings-form"' in page and 'action="/queues/dash-set/settings"' in page
    for name in LIVE:
        assert f'name="{name}"' in page, name
    form = {name: "" for name in ("rate_limit", "group_limit")}
    form |= {"max_attempts": "6", "job_timeout": "12.5", "next": "/queues/dash-set"}
    refused = web.post("/queues/dash-set/settings", data=form, follow_redirects=False)
    assert refused.status_code == 403  # no CSRF token
    assert client.queue("dash-set").settings.max_attempts == 2
    form["csrf_token"] = csrf_of(web)
    saved = web.post("/queues/dash-set/settings", data=form, follow_redirects=False)
    assert saved.status_code == 303 and saved.headers["location"] == "/queues/dash-set"
    now = client.queue("dash-set").settings
    assert (now.max_attempts, now.job_timeout, now.rate_limit) == (6, 12.5, None)
    assert now.result_ttl == q.settings.result_ttl  # not in the form: as it was
    assert "max attempts 6" in web.get("/queues/dash-set").text
    bad = post(web, "/api/queues/dash-set/settings", {"max_attempts": "0"})
    assert bad.status_code == 400 and "max_attempts" in bad.json()["error"]
    nan = post(web, "/api/queues/dash-set/settings", {"job_timeout": "nan"})
    assert nan.status_code == 400 and "job_timeout" in nan.json()["error"]
    ok = post(web, "/api/queues/dash-set/settings", {"retry_delay": "0"})
    assert ok.json()["ok"] is True and ok.json()["settings"]["retry_delay"] == 0.0
    assert client.queue("dash-set").settings.max_attempts == 6


def test_the_job_page_cancels_a_running_job(
    client: Client, web: httpx.Client, r: redis.Redis, keys: Keys
) -> None:
    q = client.queue("dash-cancel")
    tk = keys.task("dash-cancel")
    job = q.enqueue("tests.handlers:double", {"x": 1})
    r.xreadgroup(tk.group, "member-m", {tk.stream: ">"}, count=1)  # a member runs it
    page = web.get(f"/queues/dash-cancel/jobs/{job.id}").text
    assert f'action="/queues/dash-cancel/jobs/{job.id}/cancel"' in page
    refused = web.post(f"/api/queues/dash-cancel/jobs/{job.id}/cancel")
    assert refused.status_code == 403 and job.status().state == JobState.RUNNING
    got = post(web, f"/api/queues/dash-cancel/jobs/{job.id}/cancel")
    assert got.status_code == 200 and got.json()["cancelled"] is True
    assert job.status().state == JobState.CANCELLED
    assert r.lrange(keys.worker_stops("member-m"), 0, -1) == [f"dash-cancel\t{job.id}".encode()]
    listed = web.get("/api/queues/dash-cancel/jobs?state=cancelled").json()  # the cancelled list
    assert [j["id"] for j in listed["jobs"]] == [job.id] and listed["total"] == 1
    kept = web.get(f"/api/queues/dash-cancel/jobs/{job.id}").json()["payload"]
    assert kept is not None and json.loads(kept) == {"x": 1}  # kept while its record lives
    assert "/cancel" not in web.get(f"/queues/dash-cancel/jobs/{job.id}").text  # finished
    again = post(web, f"/api/queues/dash-cancel/jobs/{job.id}/cancel")
    assert again.status_code == 409 and "had finished" in again.json()["error"]
