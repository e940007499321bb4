"""Issue 6: the dashboard's pages, JSON API, /metrics, security, operator actions (requeue and
delete dead letters, cancel, priority, resize, drain) and ``info --watch``.

Real Redis, real worker and controller processes; the app runs in-process under Starlette's
httpx.Client. Budget: ~25 s on this machine.
"""

from __future__ import annotations

import html
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any
from urllib.parse import parse_qs, urlsplit

import httpx
import pytest
import redis
import uvicorn
from prometheus_client.parser import text_string_to_metric_families

from queueworks import Client, SubtaskContext, TaskSpec, TaskState
from queueworks.client.admin import Admin
from queueworks.contrib.redis_server import RedisServer, free_port
from queueworks.dashboard import BindRefused, DashboardConfig, check_bind, create_app
from queueworks.dashboard.pages import chart
from queueworks.dashboard.throughput import Throughput
from queueworks.errors import AdminError
from queueworks.protocol.keys import Keys
from queueworks.protocol.messages import partition_of
from queueworks.protocol.models import WorkerRecord
from queueworks.protocol.records import MEMBER_OF, registered_worker
from tests.conftest import ROOT, Cluster, wait_for

TOKEN = "tok-3f9a7c1e5b"
PASSWORD = "pw-Zq8rT4vLm2Xs"  # the test server's password: no response may contain it


def gated(payload: dict[str, Any], ctx: SubtaskContext) -> int:
    """Fails for ``x == fail`` until the Redis key ``gate`` exists (then doubles ``x``)."""
    if payload["x"] == payload["fail"]:
        r = redis.Redis.from_url(os.environ["QUEUEWORKS_REDIS_URL"])
        try:
            if not r.exists(payload["gate"]):
                raise RuntimeError(f"gate {payload['gate']} is closed")
        finally:
            r.close()
    return int(payload["x"]) * 2


@contextmanager
def serve(app: Any) -> Iterator[httpx.Client]:
    """Run ``app`` under uvicorn in a thread on a free loopback port; yield an HTTP client."""
    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="on")
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        wait_for(lambda: server.started, 15, "the dashboard to listen")
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30) as http:
            yield http
    finally:
        server.should_exit = True
        thread.join(15)


@contextmanager
def make_app(client: Client, **config: Any) -> Iterator[httpx.Client]:
    url = config.pop("redis_url", "redis://127.0.0.1:1/0")
    cfg = DashboardConfig(redis_url=url, prefix=client.keys.prefix, sample_interval=0.2, **config)
    with serve(create_app(cfg, client=client)) as http:
        yield http


@pytest.fixture
def web(client: Client) -> Iterator[httpx.Client]:
    with make_app(client) as http:
        yield http


def csrf_of(tc: httpx.Client) -> str:
    if "qw_csrf" not in tc.cookies:
        tc.get("/healthz")
    token = tc.cookies.get("qw_csrf")
    assert token, "the dashboard sets a CSRF cookie"
    return str(token)


def post(tc: httpx.Client, path: str, data: dict[str, Any] | None = None, **kw: Any) -> Any:
    headers = {"X-CSRF-Token": csrf_of(tc), **kw.pop("headers", {})}
    return tc.post(path, data=data or {}, headers=headers, **kw)


def metric_values(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def history_rebalances(r: redis.Redis, keys: Keys, task_ids: list[str]) -> list[dict[bytes, bytes]]:
    out = []
    for tid in task_ids:
        for _, f in r.xrange(keys.task(tid).history):
            if f[b"cause"] == b"rebalanced":
                out.append(f)
    return out


# -- pages, API and metrics against a real cluster -------------------------------------------


@pytest.mark.system
def test_pages_api_and_metrics_agree_with_status(
    cluster: Cluster, client: Client, r: redis.Redis, keys: Keys, web: httpx.Client
) -> None:
    cluster.controller()
    cluster.worker("w-pages")
    cluster.wait_workers(r, 1)
    done = client.submit(
        TaskSpec(
            name="doubles", handler="tests.handlers:double", subtasks=[{"x": i} for i in range(40)]
        )
    )
    failing = client.submit(
        TaskSpec(
            name="fails",
            handler="tests.handlers:fail_odd",
            subtasks=[{"x": i} for i in range(6)],
            max_attempts=1,
        )
    )
    waiting = client.submit(
        TaskSpec(
            name="needs-gpu",
            handler="tests.handlers:double",
            subtasks=[{"x": i} for i in range(25)],
            node_selector={"gpu": "yes"},
            priority=3,
        )
    )
    done.wait(30)
    failing.wait(30)
    cancelled = client.submit(
        TaskSpec(
            name="later",
            handler="tests.handlers:double",
            subtasks=[{"x": 1}],
            node_selector={"gpu": "yes"},
        )
    )
    cancelled.cancel()
    statuses = {s.id: s for s in client.tasks()}
    assert statuses[failing.id].dead == 3

    # pages
    page = web.get("/")
    assert page.status_code == 200, page.text[:2000]
    assert "doubles" in page.text and "needs-gpu" in page.text
    assert 'id="throughput"' in page.text
    listing = web.get("/tasks?state=all").text
    for s in statuses.values():
        assert f'data-task="{s.id}"' in listing
    task_page = web.get(f"/tasks/{done.id}").text
    assert 'id="task-progress" value="40" max="40"' in task_page
    assert 'id="epoch-history"' in task_page and "join" in task_page
    dead_page = web.get(f"/tasks/{failing.id}").text
    assert 'id="dead-letters"' in dead_page and "ValueError" in dead_page
    assert "/requeue" in dead_page and "/delete" in dead_page
    workers_page = web.get("/workers").text
    assert 'data-worker="w-pages"' in workers_page and "/workers/w-pages/drain" in workers_page

    # API
    api = web.get("/api/tasks").json()
    assert api["count"] == 4
    by_id = {t["id"]: t for t in api["tasks"]}
    for tid, s in statuses.items():
        row = by_id[tid]
        assert (row["state"], row["total"], row["done"], row["dead"]) == (
            s.state.value,
            s.total,
            s.done,
            s.dead,
        )
        assert (row["priority"], row["min_nodes"], row["max_nodes"]) == (
            s.priority,
            s.min_nodes,
            s.max_nodes,
        )
    assert [t["id"] for t in web.get("/api/tasks?state=queued").json()["tasks"]] == [waiting.id]
    assert web.get("/api/tasks?state=nope").status_code == 400
    assert web.get("/api/tasks?limit=0").status_code == 400
    detail = web.get(f"/api/tasks/{done.id}").json()
    assert detail["results_total"] == 40 and len(detail["results"]) == 10
    assert all(x["result"] == 2 * x["index"] for x in detail["results"])
    joins = [e for e in detail["rebalances"] if e["cause"] == "join"]
    assert joins and joins[0]["worker"] == "w-pages" and joins[0]["pause_ms"] is not None
    queued = web.get(f"/api/tasks/{waiting.id}").json()
    assert queued["backlog_total"] == 25 and queued["backlog"][0]["unread"] == 25
    dead = web.get(f"/api/tasks/{failing.id}").json()
    assert dead["dead_letters_total"] == 3
    assert sorted(x["index"] for x in dead["dead_letters"]) == [1, 3, 5]
    assert web.get("/api/tasks/nosuchtask").status_code == 404
    assert web.get("/api/tasks/bad%20id").status_code == 400
    assert web.get("/tasks/nosuchtask").status_code == 404
    workers = web.get("/api/workers").json()
    assert [w["id"] for w in workers["workers"]] == ["w-pages"]
    assert workers["workers"][0]["alive"] and workers["workers"][0]["processed"] >= 40
    kinds = [e["kind"] for e in web.get("/api/events?count=1000").json()["events"]]
    assert "submitted" in kinds and "cancelled" in kinds
    only = web.get(f"/api/events?task={done.id}").json()["events"]
    assert only and all(e["task"] == done.id for e in only)
    overview = web.get("/api/overview").json()
    assert overview["tasks_by_state"]["completed"] == 2

    # /metrics parses and agrees with Task.status()
    resp = web.get("/metrics")
    assert resp.headers["content-type"].startswith("text/plain; version=0.0.4")
    m = metric_values(resp.text)
    states = Counter(s.state.value for s in statuses.values())
    for st in TaskState:
        assert m[("queueworks_tasks", (("state", st.value),))] == states.get(st.value, 0)
    for tid, s in statuses.items():
        for what in ("total", "done", "dead"):
            key = ("queueworks_task_subtasks", (("state", what), ("task", tid)))
            assert m[key] == getattr(s, what), (tid, what)
    assert m[("queueworks_subtasks", (("state", "done"),))] == sum(
        s.done for s in statuses.values()
    )
    assert m[("queueworks_subtasks", (("state", "dead"),))] == sum(
        s.dead for s in statuses.values()
    )
    assert m[("queueworks_task_backlog", (("task", waiting.id),))] == 25
    assert ("queueworks_task_backlog", (("task", done.id),)) not in m  # finished: not active
    live = [w for w in client.workers()]
    assert m[("queueworks_workers", (("state", "idle"),))] + m[
        ("queueworks_workers", (("state", "assigned"),))
    ] == len(live)
    recorded = history_rebalances(r, keys, list(statuses))
    assert recorded, "rank 0 records every rebalance"
    assert m[("queueworks_rebalances_total", ())] == len(recorded)
    assert m[("queueworks_rebalance_pause_seconds_count", ())] == len(recorded)
    pause_sum = sum(float(f[b"pause_ms"]) for f in recorded) / 1000
    assert m[("queueworks_rebalance_pause_seconds_sum", ())] == pytest.approx(pause_sum)
    with_latency = [f for f in recorded if f.get(b"since_change_ms")]
    assert m[("queueworks_reclaim_latency_seconds_count", ())] == len(with_latency)
    # a second scrape counts nothing twice
    again = metric_values(web.get("/metrics").text)
    assert again[("queueworks_rebalances_total", ())] == len(recorded)


@pytest.mark.integration
def test_throughput_samples_count_progress_once(client: Client, r: redis.Redis, keys: Keys) -> None:
    task = client.submit(
        TaskSpec(name="t", handler="tests.handlers:double", subtasks=[{"x": 1}] * 50)
    )
    rec = keys.task(task.id).record
    r.hset(rec, "done", 10)  # progress made before the dashboard watched: not counted
    tp = Throughput(window=60, bucket=10)
    t0 = 1_000_000.0
    assert tp.sample(r, keys, now=t0) == 0
    r.hincrby(rec, "done", 15)
    r.hincrby(rec, "dead", 5)
    assert tp.sample(r, keys, now=t0 + 2) == 20
    r.zrem(keys.queue, task.id)  # it finished and left the queue: its last progress counts
    r.hincrby(rec, "done", 20)
    assert tp.sample(r, keys, now=t0 + 4) == 20
    assert tp.sample(r, keys, now=t0 + 6) == 0
    series = tp.series(now=t0 + 9.5)
    assert len(series) == 6 and series[-1][0] == t0
    assert [v for _, v in series[:-1]] == [0.0] * 5
    assert series[-1][1] * 6 == pytest.approx(40)  # over the 6 s the samples cover


@pytest.mark.integration
@pytest.mark.parametrize("intervals", [(2.0,), (1.7, 2.3), (0.9, 3.1, 2.0)])
def test_a_steady_throughput_shows_steadily_at_every_phase(
    client: Client, r: redis.Redis, keys: Keys, intervals: tuple[float, ...]
) -> None:
    """50 subtasks/s, sampled every ~2 s (as the app does, or irregularly): the current
    bucket, the "now" of the overview, and every bucket the samples covered say 50/s,
    whatever the phase of the 10 s buckets (the current one was 0/s for its first ~2 s)."""
    task = client.submit(
        TaskSpec(name="t", handler="tests.handlers:double", subtasks=[{"x": 1}] * 10)
    )
    rec = keys.task(task.id).record
    tp = Throughput(window=300, bucket=10)
    rate, t = 50.0, 1_000_000.37
    tp.sample(r, keys, now=t)
    started = t
    checked = set()
    for step in range(180):  # ~360 s of samples: longer than the window
        interval = intervals[step % len(intervals)]
        t += interval
        r.hincrby(rec, "done", round(rate * interval))
        assert tp.sample(r, keys, now=t) == round(rate * interval)
        until_next = round(intervals[(step + 1) % len(intervals)] * 10)
        for k in range(until_next if step % 3 == 0 or step >= 150 else 1):
            now = t + k / 10  # any time until the next sample (to 0.1 s)
            series = tp.series(now=now)
            assert len(series) == 30
            starts = [s for s, _ in series]
            assert starts == sorted(starts) and starts[-1] <= now < starts[-1] + 20
            assert series[-1][1] == pytest.approx(rate), (step, k, now, series[-3:])
            assert chart(series)["last"] == pytest.approx(rate)
            covered = [v for s, v in series if s + 10 > started]
            assert covered == pytest.approx([rate] * len(covered)), (step, k)
            checked.add(round(now % 10, 1))
    assert len(checked) >= 99  # every phase of the bucket, to 0.1 s


def links(page: str, label: str) -> list[str]:
    """The addresses of the page's links whose text starts with ``label``."""
    return [
        html.unescape(h)
        for h, text in re.findall(r'<a href="([^"]*)"[^>]*>([^<]*)', page)
        if text.strip().startswith(label)
    ]


@pytest.mark.integration
def test_the_task_list_filters_by_state_and_pages_keep_the_filter(client: Client) -> None:
    spec = TaskSpec(name="f", handler="tests.handlers:double", subtasks=[{"x": 1}])
    tasks = [client.submit(spec.model_copy(update={"name": f"t{i}"})) for i in range(7)]
    for t in tasks[:5]:
        t.cancel()
    cancelled = {t.id for t in tasks[:5]}
    with make_app(client, page_size=2) as web:
        seen: list[str] = []
        url = "/tasks?state=cancelled&x=kept"
        for page in (1, 2, 3):
            got = web.get(url)
            assert got.status_code == 200
            rows = re.findall(r'data-task="([^"]+)"', got.text)
            assert len(rows) == (1 if page == 3 else 2) and set(rows) <= cancelled, (page, rows)
            seen += rows
            assert f"page {page} of 3 · 5 tasks" in got.text
            filters = got.text.split('<nav class="filters">')[1].split("</nav>")[0]
            (on,) = re.findall(r'<a href="([^"]*)" class="on">', filters)
            assert "state=cancelled" in html.unescape(on)
            older = links(got.text, "older")
            if page == 3:
                assert older == []
                (newer,) = links(got.text, "← newer")
                assert parse_qs(urlsplit(newer).query) == {
                    "state": ["cancelled"],
                    "x": ["kept"],
                    "page": ["2"],
                }
                break
            (url,) = older
            assert parse_qs(urlsplit(url).query) == {
                "state": ["cancelled"],
                "x": ["kept"],
                "page": [str(page + 1)],
            }
        assert sorted(seen) == sorted(cancelled)
        failed = web.get("/tasks?state=failed").text
        assert "No failed tasks." in failed and "Macro" not in failed
        queued = web.get("/tasks?state=queued&page=9").text  # past the end: the last page
        assert set(re.findall(r'data-task="([^"]+)"', queued)) == {t.id for t in tasks[5:]}
        assert "No  tasks." not in web.get("/tasks?state=bogus").text


# -- actions -------------------------------------------------------------------------------


@pytest.mark.integration
def test_actions_cancel_priority_resize_through_the_api(client: Client, web: httpx.Client) -> None:
    task = client.submit(
        TaskSpec(name="a", handler="tests.handlers:double", subtasks=[{"x": 1}] * 3)
    )
    base = f"/api/tasks/{task.id}"
    got = post(web, f"{base}/priority", {"priority": "7"})
    assert got.status_code == 200 and got.json()["priority"] == 7
    assert task.status().priority == 7
    got = post(web, f"{base}/resize", {"min_nodes": "2", "max_nodes": "4"})
    assert got.status_code == 200
    s = task.status()
    assert (s.min_nodes, s.max_nodes) == (2, 4)
    assert post(web, f"{base}/resize", {"min_nodes": "2", "max_nodes": ""}).status_code == 200
    assert task.status().max_nodes is None
    bad = post(web, f"{base}/resize", {"min_nodes": "3", "max_nodes": "2"})
    assert bad.status_code == 400 and "min_nodes" in bad.json()["error"]
    assert post(web, f"{base}/priority", {"priority": "high"}).status_code == 400
    assert post(web, "/api/tasks/nosuch/cancel").status_code == 404
    assert post(web, f"{base}/explode").status_code == 404
    got = post(web, f"{base}/cancel")
    assert got.json() == {"ok": True, "cancelled": True, "message": "Task cancelled."}
    assert task.status().state == TaskState.CANCELLED
    assert post(web, f"{base}/cancel").json()["cancelled"] is False
    assert post(web, f"{base}/priority", {"priority": "1"}).status_code == 400  # finished
    # JSON bodies work too, and the plain-form address redirects back to the page
    other = client.submit(TaskSpec(name="b", handler="tests.handlers:double", subtasks=[{"x": 1}]))
    got = post(web, f"/api/tasks/{other.id}/priority", json={"priority": 4})
    assert got.status_code == 200 and other.status().priority == 4
    form = {"csrf_token": csrf_of(web), "next": f"/tasks/{other.id}"}
    back = web.post(f"/tasks/{other.id}/cancel", data=form, follow_redirects=False)
    assert back.status_code == 303 and back.headers["location"] == f"/tasks/{other.id}"
    assert other.status().state == TaskState.CANCELLED
    evil = web.post(
        f"/tasks/{other.id}/cancel", data={**form, "next": "//evil.example"}, follow_redirects=False
    )
    assert evil.headers["location"] == "/"


@pytest.mark.integration
def test_csrf_and_origin_are_checked_without_a_token(client: Client, web: httpx.Client) -> None:
    task = client.submit(TaskSpec(name="c", handler="tests.handlers:double", subtasks=[{"x": 1}]))
    url = f"/api/tasks/{task.id}/cancel"
    assert web.post(url).status_code == 403  # no CSRF token at all
    assert web.post(url, headers={"X-CSRF-Token": "forged.token"}).status_code == 403
    web.cookies.clear()
    assert web.post(url, headers={"X-CSRF-Token": "x"}).status_code == 403  # no cookie
    token = csrf_of(web)
    cross = web.post(url, headers={"X-CSRF-Token": token, "Origin": "http://evil.example"})
    assert cross.status_code == 403 and "cross-origin" in cross.json()["error"]
    assert task.status().state == TaskState.QUEUED
    same = web.post(url, headers={"X-CSRF-Token": token, "Origin": str(web.base_url).rstrip("/")})
    assert same.status_code == 200
    page = web.get(f"/tasks/{task.id}")
    assert page.headers["content-security-policy"].startswith("default-src 'self'")
    assert f'name="csrf-token" content="{token}"' in page.text


@pytest.mark.integration
def test_token_guards_actions_pages_and_api(client: Client) -> None:
    task = client.submit(TaskSpec(name="t", handler="tests.handlers:double", subtasks=[{"x": 1}]))
    url = f"/api/tasks/{task.id}/cancel"
    with make_app(client, token=TOKEN) as tc:
        assert tc.get("/healthz").status_code == 200
        csrf = csrf_of(tc)
        assert tc.post(url, headers={"X-CSRF-Token": csrf}).status_code == 401
        wrong = {"Authorization": "Bearer nope", "X-CSRF-Token": csrf}
        assert tc.post(url, headers=wrong).status_code == 401
        assert tc.post(f"/tasks/{task.id}/cancel", data={"csrf_token": csrf}).status_code == 401
        for path in (
            "/api/tasks",
            f"/api/tasks/{task.id}",
            "/api/workers",
            "/api/events",
            "/metrics",
        ):
            got = tc.get(path)
            assert got.status_code == 401 and got.headers["www-authenticate"].startswith("Bearer")
        page = tc.get("/tasks", follow_redirects=False)
        assert page.status_code == 303 and page.headers["location"] == "/login?next=/tasks"
        assert task.status().state == TaskState.QUEUED
        # scripts: the bearer token, no CSRF needed
        bearer = {"Authorization": f"Bearer {TOKEN}"}
        assert tc.get("/api/tasks", headers=bearer).json()["count"] == 1
        assert tc.get("/metrics", headers=bearer).status_code == 200
        # browsers: log in, then the session cookie authenticates, and POSTs need CSRF
        bad = tc.post("/login", data={"token": "guess", "csrf_token": csrf})
        assert bad.status_code == 401 and "qw_session" not in tc.cookies
        ok = tc.post(
            "/login?next=/tasks", data={"token": TOKEN, "csrf_token": csrf}, follow_redirects=False
        )
        assert ok.status_code == 303 and ok.headers["location"] == "/tasks"
        assert tc.get("/tasks").status_code == 200
        assert tc.post(url).status_code == 403  # session cookie but no CSRF token
        assert task.status().state == TaskState.QUEUED
        assert tc.post(url, headers={"X-CSRF-Token": csrf}).status_code == 200
        assert task.status().state == TaskState.CANCELLED
        tc.post("/logout", data={"csrf_token": csrf})
        assert tc.get("/api/tasks").status_code == 401
    other = client.submit(TaskSpec(name="u", handler="tests.handlers:double", subtasks=[{"x": 1}]))
    with make_app(client, token=TOKEN) as tc:
        got = tc.post(f"/api/tasks/{other.id}/cancel", headers={"Authorization": f"Bearer {TOKEN}"})
        assert got.status_code == 200 and other.status().state == TaskState.CANCELLED


@pytest.mark.system
def test_bind_beyond_loopback_needs_a_token(redis_url: str) -> None:
    for host in ("127.0.0.1", "localhost", "::1", "127.0.0.2"):
        check_bind(host, None)
    for host in ("0.0.0.0", "192.168.1.5", "::", "example.com"):
        with pytest.raises(BindRefused, match="without a token"):
            check_bind(host, None)
        check_bind(host, TOKEN)
    env = {**os.environ, "QUEUEWORKS_REDIS_URL": redis_url, "PYTHONPATH": str(ROOT)}
    env.pop("QUEUEWORKS_DASHBOARD_TOKEN", None)
    got = subprocess.run(
        [sys.executable, "-m", "queueworks", "dashboard", "--host", "0.0.0.0"],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert got.returncode == 2
    assert "refusing to bind the dashboard to '0.0.0.0' without a token" in got.stderr


@pytest.mark.integration
def test_no_page_or_api_shows_the_redis_password(tmp_path: Any, prefix: str) -> None:
    with RedisServer(password=PASSWORD) as server:
        server.start()
        url = server.url
        assert PASSWORD in url
        client = Client.from_url(url, prefix=prefix)
        task = client.submit(
            TaskSpec(name="secret-test", handler="tests.handlers:double", subtasks=[{"x": 1}] * 3)
        )
        client.redis.hset(client.keys.task(task.id).record, "error", f"failed at {url}")
        cfg = DashboardConfig(redis_url=url, prefix=prefix, token=TOKEN)
        with serve(create_app(cfg, client=client)) as tc:
            tc.headers["Authorization"] = f"Bearer {TOKEN}"
            paths = [
                "/",
                "/tasks",
                f"/tasks/{task.id}",
                "/workers",
                "/metrics",
                "/api/overview",
                "/api/tasks",
                f"/api/tasks/{task.id}",
                "/api/workers",
                "/api/events",
                "/tasks/missing",
                "/api/tasks/missing",
                "/login",
                "/api/tasks?state=bad",
            ]
            for path in paths:
                got = tc.get(path)
                assert PASSWORD not in got.text, path
                assert PASSWORD not in str(got.headers), path
            assert ":***@" in tc.get("/").text
            server.stop()
            down = tc.get("/tasks")
            assert down.status_code == 503 and ":***@" in down.text and PASSWORD not in down.text
            api_down = tc.get("/api/tasks")
            assert api_down.status_code == 503 and PASSWORD not in api_down.text
        client.close()


# -- admin: requeue and delete dead letters --------------------------------------------------


def _dead_letter(client: Client, task_id: str, partitions: int = 0) -> None:
    """Dead-letter the first unread entry of each stream the way a worker does (settle.lua)."""
    from queueworks.scripts.bound import DeadEntry

    tk = client.keys.task(task_id)
    for stream in tk.streams(partitions):
        got: Any = client.redis.xreadgroup(tk.group, "w1", {stream: ">"}, count=1)
        if not got:
            continue
        entry_id, fields = got[0][1][0]
        entry = DeadEntry(
            entry_id.decode(),
            int(fields[b"i"]),
            "failed 1 times",
            "Traceback: boom",
            1,
            fields[b"p"].decode(),
        )
        client.scripts.settle(tk, stream, "w1", time.time(), [], [entry])


@pytest.mark.integration
def test_requeue_on_an_active_task_keeps_accounting_exact(client: Client, r: redis.Redis) -> None:
    admin = Admin(client)
    task = client.submit(
        TaskSpec(name="a", handler="tests.handlers:double", subtasks=[{"x": i} for i in range(3)])
    )
    _dead_letter(client, task.id)
    (dl,) = task.dead_letters()
    assert task.status().dead == 1
    got = admin.requeue_dead(task.id, dl.id)
    assert (got.index, got.reopened) == (0, False)
    s = task.status()
    assert (s.state, s.dead, s.done) == (TaskState.QUEUED, 0, 0)
    assert task.dead_letters() == []
    entry = r.xrange(task.keys.stream, got.new_entry, got.new_entry)[0][1]
    assert entry == {b"i": b"0", b"p": json.dumps({"x": 0}, separators=(",", ":")).encode()}
    with pytest.raises(AdminError, match="missing entry"):
        admin.requeue_dead(task.id, dl.id)
    # delete: the record goes, the subtask stays counted as dead
    _dead_letter(client, task.id)
    (dl2,) = task.dead_letters()
    assert admin.delete_dead(task.id, dl2.id) is True
    assert admin.delete_dead(task.id, dl2.id) is False
    assert task.dead_letters() == [] and task.status().dead == 1
    # a cancelled task is never reopened
    _dead_letter(client, task.id)
    (dl3,) = task.dead_letters()
    task.cancel()
    with pytest.raises(AdminError, match="task cancelled"):
        admin.requeue_dead(task.id, dl3.id)
    assert task.status().dead == 2


@pytest.mark.integration
def test_requeue_in_a_partitioned_task_goes_to_its_partition(
    client: Client, r: redis.Redis
) -> None:
    admin = Admin(client)
    subtasks = [{"key": f"k{i}", "x": i} for i in range(8)]
    task = client.submit(
        TaskSpec(name="p", handler="tests.handlers:double", subtasks=subtasks, partitions=4)
    )
    _dead_letter(client, task.id, partitions=4)
    letters = task.dead_letters()
    assert len(letters) >= 2
    for dl in letters:
        got = admin.requeue_dead(task.id, dl.id)
        payload = json.loads(dl.payload or "")
        expected = task.keys.partition(partition_of(payload["key"], 4))
        assert got.stream == expected
        fields = r.xrange(expected, got.new_entry, got.new_entry)[0][1]
        assert fields[b"k"] == payload["key"].encode() and int(fields[b"i"]) == dl.index
    assert task.status().dead == 0


@pytest.mark.system
def test_requeue_from_the_page_reopens_a_completed_task(
    cluster: Cluster, client: Client, r: redis.Redis, keys: Keys, web: httpx.Client, prefix: str
) -> None:
    cluster.controller()
    allow = ("tests.test_dashboard",)
    first = cluster.worker("w-first", allow=allow)
    cluster.wait_workers(r, 1)
    gate = f"{prefix}:gate"
    task = client.submit(
        TaskSpec(
            name="gated",
            handler="tests.test_dashboard:gated",
            subtasks=[{"x": i, "fail": 3, "gate": gate} for i in range(6)],
            max_attempts=1,
        )
    )
    s = task.wait(30)
    assert (s.state, s.done, s.dead) == (TaskState.COMPLETED, 5, 1)
    tk = keys.task(task.id)
    wait_for(lambda: r.pttl(tk.record) > 0, 15, "the controller released the finished task")
    (dl,) = task.dead_letters()
    assert "gate" in dl.error and dl.index == 3
    r.set(gate, "open")
    # No worker while the reopened task is checked, so nothing can take it meanwhile.
    first.terminate()
    got = post(web, f"/api/tasks/{task.id}/dead/{dl.id}/requeue")
    assert got.status_code == 200, got.text
    assert got.json()["reopened"] is True and got.json()["index"] == 3
    s = task.status()
    assert (s.state, s.done, s.dead) == (TaskState.QUEUED, 5, 0)
    assert r.pttl(tk.record) == -1 and r.pttl(tk.stream) == -1  # persistent again
    assert r.zscore(keys.queue, task.id) is not None
    kinds = [e["kind"] for e in web.get(f"/api/events?task={task.id}").json()["events"]]
    assert kinds[0] == "requeued"
    cluster.worker("w-second", allow=allow)
    s = task.wait(30)
    assert (s.state, s.done, s.dead) == (TaskState.COMPLETED, 6, 0)
    assert dict(task.results())[3] == 6
    missing = post(web, f"/api/tasks/{task.id}/dead/{dl.id}/requeue")
    assert missing.status_code == 400 and "missing" in missing.json()["error"]
    assert post(web, f"/api/tasks/{task.id}/dead/not-an-id/delete").status_code == 400


@pytest.mark.system
def test_drain_a_worker_from_the_dashboard(
    cluster: Cluster, r: redis.Redis, web: httpx.Client
) -> None:
    proc = cluster.worker("w-drain")
    cluster.wait_workers(r, 1)
    assert post(web, "/api/workers/nobody/drain").status_code == 404
    got = post(web, "/api/workers/w-drain/drain")
    assert got.status_code == 200 and got.json()["draining"] == "w-drain"
    assert proc.p.wait(20) == 0
    assert web.get("/api/workers").json()["workers"] == []


def plant_worker(
    r: redis.Redis, keys: Keys, record: WorkerRecord, *, alive: bool = True, old: bool = False
) -> None:
    """A worker hash as ``Worker._register`` writes it (``old``: as a version before
    ``queues`` and ``member_of`` wrote it), in the pool; ``alive``: its heartbeat is on."""
    now = time.time()
    mapping = registered_worker(record, now)
    if old:
        del mapping[MEMBER_OF]
        mapping["record"] = record.model_dump_json(exclude={"queues", "member_of"})
    r.hset(keys.worker(record.id), mapping=mapping)
    r.zadd(keys.workers, {record.id: now})
    if alive:
        r.set(keys.worker_heartbeat(record.id), repr(now))


@pytest.mark.integration
def test_workers_show_their_queue_filter_and_memberships(
    r: redis.Redis, keys: Keys, web: httpx.Client
) -> None:
    """A worker's ``--queues`` and the queues it is a member of, on the workers page, in
    ``/api/workers`` and in ``/metrics`` (live workers only); an older record reads as
    serving every queue and a member of none."""
    base = {"host": "h", "pid": 1, "started_at": time.time()}
    some = WorkerRecord(id="w-some", queues=["mails", "gpu-jobs"], member_of=["mails"], **base)
    plant_worker(r, keys, some)
    plant_worker(r, keys, WorkerRecord(id="w-any", member_of=["reports", "mails"], **base))
    plant_worker(r, keys, WorkerRecord(id="w-lost", member_of=["mails"], **base), alive=False)
    plant_worker(r, keys, WorkerRecord(id="w-old", **base), old=True)
    odd = 'q"\\\n<b>'  # no writer stores such a name: still one label value, whole
    plant_worker(r, keys, WorkerRecord(id="w-odd", member_of=[odd], **base))

    by_id = {w["id"]: w for w in web.get("/api/workers").json()["workers"]}
    assert sorted(by_id) == ["w-any", "w-lost", "w-odd", "w-old", "w-some"]
    assert (by_id["w-some"]["queues"], by_id["w-some"]["member_of"]) == (
        ["mails", "gpu-jobs"],
        ["mails"],
    )
    assert (by_id["w-any"]["queues"], by_id["w-any"]["member_of"]) == (None, ["mails", "reports"])
    assert (by_id["w-old"]["queues"], by_id["w-old"]["member_of"]) == (None, [])

    page = web.get("/workers").text
    rows = dict(re.findall(r'<tr data-worker="([^"]+)">(.*?)</tr>', page, re.S))
    member = re.compile(r'<a href="/queues/([^"]+)"><code>')
    assert member.findall(rows["w-some"]) == ["mails"]
    assert member.findall(rows["w-any"]) == ["mails", "reports"]
    assert member.findall(rows["w-old"]) == []
    assert member.findall(rows["w-odd"]) == ["q%22%5C%0A%3Cb%3E"]
    assert "<code>q&#34;\\\n&lt;b&gt;</code>" in rows["w-odd"]
    assert "<code>gpu-jobs</code>" in rows["w-some"] and "every queue" not in rows["w-some"]
    assert "every queue" in rows["w-any"] and "every queue" in rows["w-old"]

    text = web.get("/metrics").text
    assert "# TYPE queueworks_worker_member gauge" in text
    m = metric_values(text)
    members = {k: v for k, v in m.items() if k[0] == "queueworks_worker_member"}
    assert members == {
        ("queueworks_worker_member", (("queue", "mails"), ("worker", "w-some"))): 1,
        ("queueworks_worker_member", (("queue", "mails"), ("worker", "w-any"))): 1,
        ("queueworks_worker_member", (("queue", "reports"), ("worker", "w-any"))): 1,
        ("queueworks_worker_member", (("queue", odd), ("worker", "w-odd"))): 1,
    }


# -- queueworks info --watch ----------------------------------------------------------------


class Watch:
    """``queueworks info --watch`` as a process, its output read as it comes. ``ignore_int``:
    started with SIGINT ignored, as a shell starts a command in the background (``cmd &``
    in a script) -- the test suite itself, run that way, passes that on to what it starts."""

    def __init__(self, redis_url: str, prefix: str, ignore_int: bool = False) -> None:
        env = {
            **os.environ,
            "QUEUEWORKS_REDIS_URL": redis_url,
            "QUEUEWORKS_PREFIX": prefix,
            "TERM": "dumb",
        }
        argv = [sys.executable, "-m", "queueworks", "info", "--watch", "--interval", "0.2"]
        if ignore_int:
            argv = ["sh", "-c", 'trap "" INT; exec "$@"', "sh", *argv]
        self.p = subprocess.Popen(
            argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=ROOT
        )
        self.lines: list[str] = []
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.p.stdout is not None
        for raw in self.p.stdout:
            self.lines.append(raw.decode())

    def renders(self) -> int:
        return sum(1 for line in list(self.lines) if line == "1 task(s)\n")

    def stop(self, sig: int) -> int:
        """Send ``sig``; the exit code (the watch must end within 30 s, whatever the load)."""
        self.p.send_signal(sig)
        try:
            code = self.p.wait(30)
        finally:
            self.p.kill()
            self.p.wait()
            self.reader.join(10)
            assert self.p.stdout is not None and self.p.stderr is not None
            self.err = self.p.stderr.read().decode()
            self.p.stdout.close()
            self.p.stderr.close()
        return code

    def text(self) -> str:
        return "".join(self.lines)[-500:] + self.err[-500:]


@pytest.mark.system
def test_info_watch_refreshes(redis_url: str, prefix: str, client: Client) -> None:
    client.submit(TaskSpec(name="watched", handler="tests.handlers:double", subtasks=[{"x": 1}]))
    watch = Watch(redis_url, prefix)
    try:
        wait_for(lambda: watch.renders() >= 3, 60, "three renders of info --watch")
    finally:
        code = watch.stop(signal.SIGINT)
    text = "".join(watch.lines)
    assert code == 0, watch.text()
    assert "watched" in text and "queued" in text


@pytest.mark.system
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_info_watch_ends_on_sigint_or_sigterm_even_with_sigint_ignored(
    redis_url: str, prefix: str, client: Client, sig: int
) -> None:
    """Started with SIGINT ignored (as from ``cmd &`` in a script), the watch still ends on
    SIGINT, and on SIGTERM, at once and with exit 0 (Python keeps an inherited ignore:
    the watch would redraw forever)."""
    client.submit(TaskSpec(name="watched", handler="tests.handlers:double", subtasks=[{"x": 1}]))
    watch = Watch(redis_url, prefix, ignore_int=True)
    try:
        wait_for(lambda: watch.renders() >= 1, 60, "a render of info --watch")
    finally:
        code = watch.stop(sig)
    assert code == 0, (code, watch.text())


# -- lost workers and readable events ---------------------------------------------------------

FAST_BEAT = {"QUEUEWORKS_HEARTBEAT_INTERVAL": "0.5", "QUEUEWORKS_HEARTBEAT_TTL": "1.5"}


@pytest.mark.system
def test_a_killed_worker_shows_as_lost_with_what_was_reclaimed_a_leaver_does_not(
    cluster: Cluster, client: Client, r: redis.Redis, keys: Keys, web: httpx.Client
) -> None:
    """SIGKILL a worker running a queue's job: /workers, /api/workers, /metrics and info
    show it as lost (when, and what the queue reclaimed from it) after the controller has
    dropped it from the index; a worker stopped with SIGTERM leaves without a trace."""
    cluster.spawn(["controller"], "ctl", env=FAST_BEAT)
    for name in ("w-keep", "w-doomed", "w-leaves"):
        cluster.worker(name, env=FAST_BEAT)
    cluster.wait_workers(r, 3)
    q = client.queue("lw")
    wait_for(lambda: len(q.status().nodes) == 3, 30, "three members of lw")
    cluster.procs[3].terminate()  # w-leaves: a graceful leave
    wait_for(lambda: r.zscore(keys.workers, "w-leaves") is None, 30, "w-leaves deregistered")
    jobs = [q.enqueue("tests.handlers:sleep_for", {"seconds": 1.0}) for _ in range(6)]

    def doomed_runs() -> bool:
        return any(j.status().worker == "w-doomed" for j in jobs)

    wait_for(doomed_runs, 30, "a job running on w-doomed")
    cluster.procs[2].kill()  # w-doomed
    killed_at = time.time()

    def lost() -> Any:
        found = {w.id: w for w in client.lost_workers()}
        w = found.get("w-doomed")
        return w if w and w.reclaims and w.reclaims[0].reclaimed is not None else None

    doomed = wait_for(lost, 30, "w-doomed lost, with the rebalance that reclaimed from it")
    assert r.zscore(keys.workers, "w-doomed") is None  # dropped from the index
    assert killed_at - 5 <= doomed.lost_at <= time.time()
    assert doomed.last_heartbeat is not None and doomed.last_heartbeat <= doomed.lost_at
    assert doomed.pid == cluster.procs[2].pid and doomed.member_of == ["lw"]
    [reclaim] = doomed.reclaims
    assert reclaim.task == "lw" and reclaim.epoch is not None and reclaim.reclaimed >= 1
    for job in jobs:  # nothing lost: the job it held ran again elsewhere
        job.result(timeout=30)
    assert {w.id for w in client.lost_workers()} == {"w-doomed"}  # the leaver is not lost

    page = web.get("/workers").text
    assert 'data-lost-worker="w-doomed"' in page and 'data-lost-worker="w-leaves"' not in page
    assert 'data-reclaim="lw"' in page and f"epoch {reclaim.epoch}: <b>" in page
    api = web.get("/api/workers").json()
    assert [w["id"] for w in api["lost"]] == ["w-doomed"] and api["by_state"]["lost"] == 1
    assert api["lost"][0]["reclaims"][0]["reclaimed"] == reclaim.reclaimed
    assert web.get("/api/overview").json()["workers_by_state"]["lost"] == 1
    values = metric_values(web.get("/metrics").text)
    assert values[("queueworks_workers", (("state", "lost"),))] == 1
    kinds = [e["kind"] for e in web.get("/api/events?count=1000").json()["events"]]
    assert "worker_lost" in kinds

    from queueworks.cli.info import render

    text = render(client)
    line = next(x for x in text.splitlines() if x.strip().startswith("w-doomed"))
    assert "lost" in line and f"reclaimed=lw@{reclaim.epoch}={reclaim.reclaimed}" in line
    assert "w-leaves" not in text
    data = json.loads(render(client, as_json=True))
    assert [w["id"] for w in data["lost_workers"]] == ["w-doomed"]


@pytest.mark.system
def test_events_name_their_task_and_dead_letters_say_which_and_why(
    cluster: Cluster, client: Client, r: redis.Redis, web: httpx.Client
) -> None:
    """The events list shows a task's name beside its id; a ``dead_lettered`` event names
    the first dead subtask (or job) and its reason, and how many died with it."""
    cluster.controller()
    cluster.worker("w-ev")
    cluster.wait_workers(r, 1)
    task = client.submit(
        TaskSpec(
            name="half-fail",
            handler="tests.handlers:fail_odd",
            subtasks=[{"x": i} for i in range(6)],
            max_attempts=1,
        )
    )
    task.wait(30)
    q = client.queue("ev-q", max_attempts=1)
    job = q.enqueue("tests.handlers:always_fails", {"x": 1})
    with pytest.raises(Exception, match="failed"):
        job.result(timeout=30)

    events = web.get("/api/events?count=1000").json()["events"]
    of_task = [e for e in events if e["task"] == task.id]
    assert of_task and all(e["task_name"] == "half-fail" for e in of_task)
    dead = [e["fields"] for e in of_task if e["kind"] == "dead_lettered"]
    assert dead and sum(int(f["count"]) for f in dead) == 3
    assert all(int(f["index"]) % 2 == 1 and f["reason"] == "failed 1 time" for f in dead)
    [job_dead] = [e for e in events if e["task"] == "ev-q" and e["kind"] == "dead_lettered"]
    assert job_dead["fields"]["job"] == job.id and job_dead["fields"]["count"] == "1"
    assert job_dead["fields"]["reason"] == "failed 1 time"
    page = web.get("/").text
    assert f"half-fail <code>{task.id}</code>" in page
    assert f'href="/queues/ev-q/jobs/{job.id}"' in page
