"""Issue 18: queues on the dashboard (list, page, JSON API, requeue / delete of dead jobs),
in ``/metrics`` (backlog, jobs by outcome, nodes, the enqueue -> start histogram), in
``queueworks info`` and through ``queueworks enqueue [--wait]``.

Real Redis, real worker and controller processes; the dashboard runs in-process under
uvicorn (as in ``test_dashboard.py``). Budget: ~30 s for the file.
"""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Iterator
from typing import Any
from urllib.parse import parse_qs, urlsplit

import httpx
import pytest
import redis
from prometheus_client.parser import text_string_to_metric_families

from queueworks import Client, TaskSpec
from queueworks.contrib.redis_server import free_port
from queueworks.dashboard.templating import quantile_text
from queueworks.dashboard.views import LatencyBucket, QueueDetail
from queueworks.errors import JobFailed
from queueworks.protocol.keys import Keys
from queueworks.protocol.models import JobState, TaskState
from tests.conftest import Cluster, wait_for
from tests.test_cli import cli, one_line_error
from tests.test_dashboard import links, make_app, metric_values, post

HISTOGRAM = "queueworks_queue_enqueue_to_start_seconds"


def gated_job(payload: dict[str, Any]) -> int:
    """Fails until the Redis key ``payload["gate"]`` exists, then doubles ``x``."""
    r = redis.Redis.from_url(os.environ["QUEUEWORKS_REDIS_URL"])
    try:
        if not r.exists(payload["gate"]):
            raise RuntimeError(f"gate {payload['gate']} is closed")
    finally:
        r.close()
    return int(payload["x"]) * 2


@pytest.fixture
def web(client: Client) -> Iterator[httpx.Client]:
    with make_app(client) as http:
        yield http


def histogram(text: str, queue: str) -> tuple[list[tuple[float, float]], float, float]:
    """The ``(le, cumulative count)`` buckets in the order exposed, ``_sum`` and ``_count``
    of one queue's enqueue -> start histogram, as prometheus_client parses them."""
    (family,) = [f for f in text_string_to_metric_families(text) if f.name == HISTOGRAM]
    assert family.type == "histogram"
    buckets, total, count = [], -1.0, -1.0
    for s in family.samples:
        if s.labels.get("queue") != queue:
            continue
        if s.name == HISTOGRAM + "_bucket":
            buckets.append((float(s.labels["le"]), s.value))
        elif s.name == HISTOGRAM + "_sum":
            total = s.value
        elif s.name == HISTOGRAM + "_count":
            count = s.value
    return buckets, total, count


def check_cumulative(buckets: list[tuple[float, float]], count: float) -> None:
    bounds = [le for le, _ in buckets]
    assert bounds == sorted(bounds) and bounds[-1] == float("inf"), bounds
    counts = [n for _, n in buckets]
    assert counts == sorted(counts), f"buckets not cumulative: {buckets}"
    assert counts[-1] == count, (buckets, count)


# -- counts on the pages, the API, /metrics and info -----------------------------------------


@pytest.mark.system
def test_queue_counts_agree_on_pages_api_metrics_and_info(
    cluster: Cluster, client: Client, r: redis.Redis, web: httpx.Client, redis_url: str
) -> None:
    cluster.controller()
    cluster.worker("w-q")
    cluster.wait_workers(r, 1)
    task = client.submit(  # first: the queue keeps the only worker once it has it
        TaskSpec(name="plain", handler="tests.handlers:double", subtasks=[{"x": 1}] * 3)
    )
    task.wait(30)
    mails = client.queue("mails", max_attempts=1)
    done = [mails.enqueue("tests.handlers:double", {"x": i}) for i in range(6)]
    dead = [mails.enqueue("tests.handlers:always_fails", {"x": i}) for i in range(2)]
    later = [mails.enqueue("tests.handlers:double", {"x": i}, delay=600) for i in range(3)]
    assert [j.result(timeout=30) for j in done] == [2 * i for i in range(6)]
    for j in dead:
        with pytest.raises(JobFailed, match="failed 1 time: "):
            j.result(timeout=30)
    assert {j.status().state for j in later} == {JobState.SCHEDULED}
    gpu = client.queue("gpu-jobs", node_selector={"gpu": "yes"})  # no worker matches: it waits
    for i in range(4):
        gpu.enqueue("tests.handlers:double", {"x": i})
    wait_for(lambda: gpu.status().reason, 15, "the controller to say why gpu-jobs waits")
    s = mails.status()
    assert (s.backlog, s.scheduled, s.running, s.done, s.dead) == (0, 3, 0, 6, 2)
    assert len(s.nodes) == 1 and s.nodes[0].worker == "w-q"
    g = gpu.status()
    assert (g.backlog, g.done, g.nodes) == (4, 0, []) and g.reason

    # the API
    listed = {q["name"]: q for q in web.get("/api/queues").json()["queues"]}
    assert sorted(listed) == ["gpu-jobs", "mails"]
    row = listed["mails"]
    for field in ("backlog", "scheduled", "running", "done", "dead", "rejected", "epoch"):
        assert row[field] == getattr(s, field), field
    assert (row["nodes"], row["state"], row["min_nodes"]) == (1, s.state.value, 1)
    assert set(row["rates"]) == {"1s", "10s", "60s"}
    assert listed["gpu-jobs"]["backlog"] == 4 and listed["gpu-jobs"]["reason"] == g.reason
    detail = web.get("/api/queues/mails").json()
    assert detail["queue"]["done"] == 6 and detail["max_attempts"] == 1
    assert [n["worker"] for n in detail["nodes"]] == ["w-q"] and detail["nodes"][0]["rank"] == 0
    assert detail["handlers"] == ["tests.handlers:always_fails", "tests.handlers:double"]
    assert detail["dead_letters_total"] == 2
    assert sorted(x["job"] for x in detail["dead_letters"]) == sorted(j.id for j in dead)
    assert all("ValueError: cannot handle" in x["error"] for x in detail["dead_letters"])
    assert detail["latency_count"] == 8  # every job that started, once
    counts = [b["count"] for b in detail["latency"]]
    assert counts == sorted(counts) and counts[-1] == 8 and detail["latency"][-1]["le"] is None
    assert web.get("/api/queues/nosuch").status_code == 404
    assert web.get(f"/api/queues/{task.id}").status_code == 404  # a task, not a queue
    assert web.get("/api/queues/bad%20id").status_code == 400
    # queues are no tasks in the task list and the overview
    assert [t["id"] for t in web.get("/api/tasks").json()["tasks"]] == [task.id]
    overview = web.get("/api/overview").json()
    assert overview["tasks_total"] == 1 and overview["tasks_by_state"]["completed"] == 1
    assert [q["name"] for q in overview["queues"]] == ["gpu-jobs", "mails"]

    # the pages
    page = web.get("/queues").text
    assert 'data-queue="mails"' in page and 'data-queue="gpu-jobs"' in page
    assert f"waiting: {g.reason}" in page
    qpage = web.get("/queues/mails")
    assert qpage.status_code == 200
    assert '<td class="num" id="queue-scheduled">3</td>' in qpage.text
    assert '<td class="num" id="queue-done">6</td>' in qpage.text
    assert '<td class="num warn" id="queue-dead">2</td>' in qpage.text
    assert 'id="node-set"' in qpage.text and 'data-worker="w-q"' in qpage.text
    for j in dead:
        assert f'data-job="{j.id}"' in qpage.text
    assert "/queues/mails/dead/" in qpage.text and "/requeue" in qpage.text
    assert 'id="latency"' in qpage.text
    assert 'id="queue-backlog">4<' in web.get("/queues/gpu-jobs").text
    tasks_page = web.get("/tasks").text
    assert f'data-task="{task.id}"' in tasks_page and 'data-task="mails"' not in tasks_page
    home = web.get("/").text
    assert 'data-queue="mails"' in home and 'id="tasks-running">0<' in home
    moved = web.get("/tasks/mails", follow_redirects=False)
    assert moved.status_code == 303 and moved.headers["location"] == "/queues/mails"
    back = web.get(f"/queues/{task.id}", follow_redirects=False)
    assert back.status_code == 303 and back.headers["location"] == f"/tasks/{task.id}"
    assert web.get("/queues/nosuch").status_code == 404

    # /metrics
    text = web.get("/metrics").text
    m = metric_values(text)
    assert m[("queueworks_queue_backlog", (("queue", "mails"),))] == 0
    assert m[("queueworks_queue_backlog", (("queue", "gpu-jobs"),))] == 4
    assert m[("queueworks_queue_scheduled", (("queue", "mails"),))] == 3
    assert m[("queueworks_queue_nodes", (("queue", "mails"),))] == 1
    assert m[("queueworks_queue_nodes", (("queue", "gpu-jobs"),))] == 0
    for outcome, n in (("done", 6), ("dead", 2), ("rejected", 0)):
        key = ("queueworks_queue_jobs_total", (("outcome", outcome), ("queue", "mails")))
        assert m[key] == n, outcome
    assert sum(v for (name, _), v in m.items() if name == "queueworks_tasks") == 1
    assert ("queueworks_task_subtasks", (("state", "total"), ("task", "mails"))) not in m
    buckets, total, count = histogram(text, "mails")
    check_cumulative(buckets, count)
    assert count == 8 and 0 < total < 8 * 5
    stored = float(r.hget(Keys(client.keys.prefix).task("mails").latency, "sum") or 0)
    assert total == pytest.approx(stored)
    buckets, total, count = histogram(text, "gpu-jobs")  # no job started: all zero
    check_cumulative(buckets, count)
    assert (count, total) == (0, 0)

    # queueworks info
    shown = cli(["info"], redis_url, client.keys.prefix)
    assert shown.returncode == 0, shown.stderr
    out = shown.stdout
    assert "1 task(s)" in out and "2 queue(s)" in out, out
    line = next(x for x in out.splitlines() if x.strip().startswith("mails "))
    for piece in (
        "backlog=0",
        "scheduled=3",
        "running=0",
        "done=6",
        "dead=2",
        "(now/min/max)=1/1/- ",
    ):
        assert piece in line, (piece, line)
    assert f"waiting: {g.reason}" in out and "rank 0: w-q" in out
    data = json.loads(cli(["info", "--json"], redis_url, client.keys.prefix).stdout)
    assert [t["id"] for t in data["tasks"]] == [task.id]
    queues = {q["name"]: q for q in data["queues"]}
    assert (queues["mails"]["done"], queues["mails"]["dead"]) == (6, 2)
    assert queues["mails"]["scheduled"] == 3 and queues["gpu-jobs"]["backlog"] == 4
    assert [n["worker"] for n in queues["mails"]["nodes"]] == ["w-q"]


# -- requeue and delete from the dashboard ---------------------------------------------------


@pytest.mark.system
def test_requeue_from_the_dashboard_runs_a_dead_job_again(
    cluster: Cluster, client: Client, r: redis.Redis, web: httpx.Client, prefix: str
) -> None:
    cluster.controller()
    cluster.worker("w-r", allow=("tests.test_queue_dashboard", "tests.handlers"))
    cluster.wait_workers(r, 1)
    gate = f"{prefix}:gate"
    q = client.queue("retry", max_attempts=2)
    job = q.enqueue("tests.test_queue_dashboard:gated_job", {"x": 21, "gate": gate})
    with pytest.raises(JobFailed, match="failed 2 times") as failed:
        job.result(timeout=30)
    assert "gate" in failed.value.traceback
    (letter,) = web.get("/api/queues/retry").json()["dead_letters"]
    assert (letter["job"], letter["attempts"]) == (job.id, 2)
    base = f"/api/queues/retry/dead/{letter['id']}"
    assert web.post(f"{base}/requeue").status_code == 403  # no CSRF token
    assert post(web, "/api/queues/nosuch/dead/1-0/requeue").status_code == 404
    assert post(web, "/api/queues/retry/dead/not-an-id/requeue").status_code == 400
    assert post(web, f"{base}/explode").status_code == 404

    r.set(gate, "open")
    got = post(web, f"{base}/requeue")
    assert got.status_code == 200, got.text
    assert got.json()["job"] == job.id and got.json()["ok"] is True
    assert job.result(timeout=30) == 42
    s = q.status()
    assert (s.done, s.dead) == (1, 0)
    assert job.status().state == JobState.DONE and job.status().attempts == 1
    assert web.get("/api/queues/retry").json()["dead_letters"] == []
    kinds = [e["kind"] for e in web.get("/api/events?task=retry").json()["events"]]
    assert "requeued" in kinds
    again = post(web, f"{base}/requeue")
    assert again.status_code == 400 and "missing entry" in again.json()["error"]

    # delete: the record goes, the job stays counted as dead
    r.delete(gate)
    other = q.enqueue("tests.test_queue_dashboard:gated_job", {"x": 1, "gate": gate})
    with pytest.raises(JobFailed):
        other.result(timeout=30)
    (letter,) = web.get("/api/queues/retry").json()["dead_letters"]
    form = {"csrf_token": web.cookies["qw_csrf"], "next": "/queues/retry"}
    gone = web.post(f"/queues/retry/dead/{letter['id']}/delete", data=form, follow_redirects=False)
    assert gone.status_code == 303 and gone.headers["location"] == "/queues/retry"
    assert web.get("/api/queues/retry").json()["dead_letters"] == []
    assert q.status().dead == 1
    assert post(web, f"/api/queues/retry/dead/{letter['id']}/delete").status_code == 404

    # a cancelled queue takes no job back
    r.delete(gate)
    third = q.enqueue("tests.test_queue_dashboard:gated_job", {"x": 2, "gate": gate})
    with pytest.raises(JobFailed):
        third.result(timeout=30)
    (letter,) = web.get("/api/queues/retry").json()["dead_letters"]
    assert post(web, "/api/tasks/retry/cancel").json()["cancelled"] is True
    refused = post(web, f"/api/queues/retry/dead/{letter['id']}/requeue")
    assert refused.status_code == 400 and "cancelled" in refused.json()["error"]
    assert q.status().state == TaskState.CANCELLED and q.status().dead == 2


# -- dead letters page, newest first; a finished queue; latency past the last bound ----------


def entry_key(entry_id: str) -> tuple[int, int]:
    ms, seq = entry_id.split("-")
    return int(ms), int(seq)


@pytest.mark.integration
def test_dead_letters_page_newest_first_on_queue_and_task_pages(
    client: Client, r: redis.Redis, web: httpx.Client
) -> None:
    client.queue("many-dead")
    qk = client.keys.task("many-dead")
    task = client.submit(
        TaskSpec(name="t", handler="tests.handlers:double", subtasks=[{"x": 1}] * 120)
    )
    tk = client.keys.task(task.id)
    written = {"queue": [], "task": []}
    for i in range(120):  # as settle_jobs.lua and settle.lua write them
        job = {"job": f"j{i:03d}", "handler": "tests.handlers:double", "reason": "failed 1 times"}
        written["queue"].append(
            r.xadd(qk.dead, {**job, "error": f"E{i}", "attempts": 1, "ts": time.time()}).decode()
        )
        sub = {"index": i, "reason": "failed 1 times", "error": f"E{i}", "attempts": 1}
        written["task"].append(r.xadd(tk.dead, {**sub, "payload": "{}", "worker": "w"}).decode())
    for kind, page, api in (
        ("queue", "/queues/many-dead", "/api/queues/many-dead"),
        ("task", f"/tasks/{task.id}", f"/api/tasks/{task.id}"),
    ):
        url, seen = page, []
        for n in (50, 50, 20):
            got = web.get(url)
            assert got.status_code == 200, got.text[:500]
            rows = re.findall(r'<tr data-entry="([^"]+)"', got.text)
            assert len(rows) == n, (kind, url, len(rows))
            assert rows == sorted(rows, key=entry_key, reverse=True), (kind, "newest first")
            assert not seen or entry_key(rows[0]) < entry_key(seen[-1]), (kind, "older")
            assert f"{n} of 120" in got.text, kind
            newest = links(got.text, "← newest")
            assert newest == ([] if not seen else [f"{page}#dead"]), (kind, newest)
            seen += rows
            older = links(got.text, "older")
            if n == 20:
                assert older == [], kind
                break
            (url,) = older
            assert parse_qs(urlsplit(url).query) == {"dead_before": [rows[-1]]}, url
        assert seen == written[kind][::-1], kind
        # the API pages the same way
        body = web.get(api).json()
        assert [x["id"] for x in body["dead_letters"]] == seen[:50]
        assert body["dead_letters_total"] == 120 and body["dead_letters_next"] == seen[49]
        body = web.get(f"{api}?dead_before={seen[99]}").json()
        assert [x["id"] for x in body["dead_letters"]] == seen[100:]
        assert body["dead_letters_next"] is None
        bad = web.get(f"{api}?dead_before=yesterday")
        assert bad.status_code == 400 and "dead_before" in bad.json()["error"]
        assert web.get(f"{page}?dead_before=yesterday").status_code == 400


@pytest.mark.system
def test_a_cancelled_queue_shows_what_was_left_not_a_live_backlog(
    cluster: Cluster, client: Client, r: redis.Redis, web: httpx.Client
) -> None:
    cluster.controller()
    q = client.queue("gone", node_selector={"gpu": "yes"})  # no worker matches: it waits
    for i in range(4):
        q.enqueue("tests.handlers:double", {"x": i})
    q.enqueue("tests.handlers:double", {"x": 9}, delay=600)
    wait_for(lambda: q.status().reason, 15, "the controller to say why the queue waits")
    row = web.get("/api/queues/gone").json()["queue"]
    assert (row["backlog"], row["scheduled"]) == (4, 1) and row["reason"]
    assert "waiting: " in web.get("/queues/gone").text
    assert post(web, "/api/tasks/gone/cancel").json()["cancelled"] is True

    row = web.get("/api/queues/gone").json()["queue"]
    assert row["state"] == "cancelled"
    assert (row["backlog"], row["scheduled"], row["running"]) == (0, 0, 0)
    assert row["reason"] is None and "want" not in row
    assert row["left"] == 5
    page = web.get("/queues/gone").text
    assert "waiting: " not in page and 'id="queue-reason"' not in page
    assert '<p class="muted" id="queue-left">5 jobs were left when it was cancelled' in page
    assert 'id="queue-backlog">0<' in page and "wants" not in page
    listing = web.get("/queues").text
    assert "waiting: " not in listing and '<td class="num" data-field="backlog">0</td>' in listing
    m = metric_values(web.get("/metrics").text)
    assert m[("queueworks_queue_backlog", (("queue", "gone"),))] == 0
    assert m[("queueworks_queue_scheduled", (("queue", "gone"),))] == 0


@pytest.mark.integration
def test_latency_quantiles_past_the_last_bound_say_so(
    client: Client, r: redis.Redis, web: httpx.Client
) -> None:
    client.queue("slow")
    lk = client.keys.task("slow").latency
    r.hset(lk, mapping={"0.001": 90, "+Inf": 10, "sum": 200})  # as settle_jobs.lua writes
    page = web.get("/queues/slow").text
    assert "≤ ∞" not in page
    assert 'id="queue-latency">≤ 1 ms / &gt; 5 s<' in page
    detail = web.get("/api/queues/slow").json()
    assert (detail["latency_p50"], detail["latency_p99"]) == (0.001, None)
    r.hset(lk, "+Inf", 1000)
    assert 'id="queue-latency">&gt; 5 s / &gt; 5 s<' in web.get("/queues/slow").text


@pytest.mark.unit
def test_quantile_text() -> None:
    def detail(counts: dict[float, int]) -> QueueDetail:
        running, buckets = 0, []
        for le, n in sorted(counts.items()):
            running += n
            buckets.append(LatencyBucket(le=None if le == float("inf") else le, count=running))
        return QueueDetail.model_construct(latency=buckets, latency_count=running)

    inf = float("inf")
    assert quantile_text(detail({0.001: 0, 5.0: 0, inf: 0}), 0.5) == "-"
    assert quantile_text(detail({0.0005: 3, 0.001: 1, inf: 0}), 0.5) == "≤ 0.5 ms"
    assert quantile_text(detail({0.0005: 3, 0.001: 1, inf: 0}), 0.99) == "≤ 1 ms"
    assert quantile_text(detail({0.25: 1, 1.0: 1, 5.0: 0, inf: 0}), 0.99) == "≤ 1 s"
    assert quantile_text(detail({0.001: 1, 5.0: 0, inf: 1}), 0.99) == "> 5 s"
    assert quantile_text(detail({0.001: 0, 0.5: 0, inf: 7}), 0.5) == "> 500 ms"
    assert quantile_text(detail({inf: 2}), 0.5) == "> 0 ms"


# -- nothing 500s on stored values ------------------------------------------------------------


@pytest.mark.integration
def test_queue_pages_survive_values_no_writer_would_store(
    client: Client, r: redis.Redis, web: httpx.Client
) -> None:
    q = client.queue("broken")
    q.enqueue("tests.handlers:double", {"x": 1})
    tk = client.keys.task("broken")
    r.hset(tk.record, mapping={"done": "many", "state": "bogus", "created_at": "x"})
    r.hset(tk.latency, mapping={"0.001": "x", "nope": "3", "+Inf": "2", "sum": "inf", "1.0": "1"})
    r.hset(tk.rate, mapping={"abc": "1", str(int(time.time()) - 2): "zz"})
    r.xadd(tk.dead, {"job": "}{bad", "attempts": "lots", "ts": "soon", "error": b"\xff\xfe"})
    r.xadd(tk.dead, {"reason": "rejected"})
    r.xadd(tk.history, {"epoch": "x", "cause": "join"})
    for path in ("/queues", "/queues/broken", "/api/queues", "/api/queues/broken", "/metrics"):
        got = web.get(path)
        assert got.status_code == 200, (path, got.text[:1000])
    page = web.get("/queues/broken").text
    assert 'id="queue-problems"' in page and "done" in page and "state" in page
    detail = web.get("/api/queues/broken").json()
    assert detail["queue"]["problems"] == ["state", "done", "created_at"]
    assert detail["latency_count"] == 3  # "+Inf": 2 and "1.0": 1; the rest is unreadable
    text = web.get("/metrics").text
    buckets, _, count = histogram(text, "broken")
    check_cumulative(buckets, count)
    assert count == 3
    (bad, rejected) = sorted(detail["dead_letters"], key=lambda x: x["reason"])
    refused = post(web, f"/api/queues/broken/dead/{bad['id']}/requeue")
    assert refused.status_code == 400 and "state 'bogus' is no state" in refused.json()["error"]
    r.hset(tk.record, "state", "running")
    refused = post(web, f"/api/queues/broken/dead/{bad['id']}/requeue")
    assert refused.status_code == 400 and "bad job id" in refused.json()["error"]
    refused = post(web, f"/api/queues/broken/dead/{rejected['id']}/requeue")
    assert refused.status_code == 400 and "rejected" in refused.json()["error"]


@pytest.mark.integration
def test_token_guards_the_queue_pages_and_api(client: Client) -> None:
    client.queue("guarded")
    with make_app(client, token="tok-q-1") as tc:
        for path in ("/api/queues", "/api/queues/guarded", "/metrics"):
            assert tc.get(path).status_code == 401, path
        assert tc.get("/queues", follow_redirects=False).status_code == 303
        bearer = {"Authorization": "Bearer tok-q-1"}
        assert tc.get("/api/queues", headers=bearer).json()["count"] == 1


# -- queueworks enqueue ----------------------------------------------------------------------


@pytest.mark.system
def test_enqueue_cli_prints_the_id_and_waits_for_the_result(
    cluster: Cluster, client: Client, r: redis.Redis, redis_url: str, prefix: str
) -> None:
    cluster.controller()
    cluster.worker("w-cli")
    cluster.wait_workers(r, 1)
    cluster.wait_leader(r)  # else `enqueue --wait` rightly says no controller runs
    args = ["enqueue", "jobs", "tests.handlers:double", "--json", '{"x": 21}']
    res = cli([*args, "--max-attempts", "1"], redis_url, prefix)  # creates the queue
    assert res.returncode == 0, res.stderr
    (job_id,) = res.stdout.split()
    assert client.queue("jobs", max_attempts=1).job(job_id).result(timeout=30) == 42

    args = ["enqueue", "jobs", "tests.handlers:double", "--json", '{"x": 5}', "--wait"]
    res = cli([*args, "--delay", "1"], redis_url, prefix)
    assert res.returncode == 0, (res.stdout, res.stderr)
    job_id, result = res.stdout.split()
    assert json.loads(result) == 10 and not res.stderr
    status = client.queue("jobs").job(job_id).status()
    assert status.started_at and status.started_at - status.enqueued_at >= 0.9  # not before

    failing = ["enqueue", "jobs", "tests.handlers:always_fails", "--json", "[1]", "--wait"]
    res = cli(failing, redis_url, prefix)
    assert res.returncode == 3, (res.stdout, res.stderr)
    (job_id,) = res.stdout.split()
    assert res.stderr.strip() == f"job {job_id}: failed 1 time: ValueError: cannot handle [1]"

    # as docs/queues.md says: a handler the module does not have is the job's fault
    typo = ["enqueue", "jobs", "queueworks.examples:dubble", "--json", '{"x": 21}', "--wait"]
    res = cli(typo, redis_url, prefix)
    assert res.returncode == 3, (res.stdout, res.stderr)
    (job_id,) = res.stdout.split()
    assert res.stderr.strip() == (
        f"job {job_id}: handler 'queueworks.examples:dubble': module "
        "'queueworks.examples' has no 'dubble'"
    )

    # the queue exists with other settings: one line, nothing enqueued
    res = cli([*failing, "--max-attempts", "2"], redis_url, prefix)
    one_line_error(res, 2, "queue 'jobs' exists with max_attempts=1")
    assert client.queue("jobs").status().dead == 2

    # no live worker may run its handler: --wait says why, and gives up at --timeout
    blocked = ["enqueue", "blocked", "tests.handlers_cli:needs_file", "--json", '{"x": 1}']
    res = cli([*blocked, "--wait", "--timeout", "3"], redis_url, prefix)
    assert res.returncode == 3, (res.stdout, res.stderr)
    assert "waiting: no live worker may run 'tests.handlers_cli:needs_file'" in res.stderr
    assert "did not finish within 3.0 s" in res.stderr


@pytest.mark.system
def test_enqueue_cli_errors_are_one_line(redis_url: str, prefix: str, r: redis.Redis) -> None:
    closed = f"redis://127.0.0.1:{free_port()}/0"
    one_line_error(
        cli(["enqueue", "q", "tests.handlers:double"], closed), 1, f"cannot reach Redis at {closed}"
    )
    one_line_error(
        cli(["enqueue", "q", "tests.handlers.double"], redis_url, prefix),
        2,
        "handler 'tests.handlers.double' must look like 'package.module:function'",
    )
    one_line_error(
        cli(["enqueue", "q", "x:y", "--json", "{'x': 1}"], redis_url, prefix),
        2,
        "--json is not valid JSON",
    )
    one_line_error(cli(["enqueue", "q", "x:y", "--json", "NaN"], redis_url, prefix), 2, "NaN")
    one_line_error(cli(["enqueue", "bad/name", "x:y"], redis_url, prefix), 2, "must match")
    one_line_error(cli(["enqueue", "q", "x:y", "--delay", "-1"], redis_url, prefix), 2, "--delay")
    one_line_error(
        cli(["enqueue", "q", "x:y", "--min-nodes", "3", "--max-nodes", "2"], redis_url, prefix),
        2,
        "max_nodes (2) must be >= min_nodes (3)",
    )
    assert list(r.scan_iter(match=f"{prefix}:*")) == []  # nothing was written


@pytest.mark.system
def test_dead_cli_requeues_a_queues_dead_jobs(
    cluster: Cluster, client: Client, r: redis.Redis, redis_url: str, prefix: str
) -> None:
    cluster.controller()
    cluster.worker("w-d", allow=("tests.test_queue_dashboard",))
    cluster.wait_workers(r, 1)
    gate = f"{prefix}:gate"
    q = client.queue("dead-cli", max_attempts=1)
    jobs = [q.enqueue(gated_job, {"x": i, "gate": gate}) for i in range(3)]
    for job in jobs:
        with pytest.raises(JobFailed):
            job.result(timeout=30)
    r.set(gate, "open")
    res = cli(["dead", "dead-cli", "--requeue"], redis_url, prefix)
    assert res.returncode == 0, res.stderr
    assert "requeued 3 dead job(s) of queue dead-cli" in res.stdout + res.stderr
    assert [j.result(timeout=30) for j in jobs] == [0, 2, 4]
    assert (q.status().done, q.status().dead) == (3, 0)
