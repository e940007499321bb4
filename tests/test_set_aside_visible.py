"""Jobs set aside are the queue's like any other: a job whose handler no member may run
waits alone (``workers.aside``), and the queue's status, ``queueworks info``, the
dashboard's counts and job lists, ``/metrics`` and ``queueworks queue Q jobs`` count and
list it, ``q.empty()`` cancels it, and a result's ``TimeoutError`` says why it waits (or
that it runs). Real Redis, real worker and controller processes."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import redis

from queueworks import AsyncClient, Client, TaskState
from queueworks.protocol.keys import Keys
from queueworks.protocol.models import JobState
from tests.conftest import Cluster, wait_for
from tests.test_cli import cli
from tests.test_dashboard import make_app, metric_values

AWAY = "os:system"  # outside every worker's --allow


@pytest.fixture
def web(client: Client) -> Iterator[httpx.Client]:
    with make_app(client) as http:
        yield http


@pytest.mark.system
def test_jobs_no_member_may_run_are_counted_listed_and_emptied(
    cluster: Cluster,
    client: Client,
    r: redis.Redis,
    keys: Keys,
    web: httpx.Client,
    redis_url: str,
    prefix: str,
) -> None:
    """``os:system`` three times, on a queue whose only worker may run tests.handlers:
    each job says why it waits, and so does everything that shows the queue."""
    cluster.controller()
    cluster.worker("narrow", allow=("tests.handlers",))
    cluster.wait_workers(r, 1)
    q = client.queue("picky")
    away = [q.enqueue(AWAY, f"echo {i}") for i in range(3)]
    assert q.enqueue("tests.handlers:double", {"x": 1}).result(timeout=30) == 2
    wait_for(lambda: all(j.status().reason for j in away), 15, "the jobs set aside")
    why = away[0].status().reason
    assert why and why.startswith(f"no member may run {AWAY!r}: "), why
    wait_for(lambda: q.status().state == TaskState.RUNNING, 15, "the queue running")

    # counted, with the reason they wait: the status (sync and asyncio alike)
    status = q.status()
    said = f"3 job(s) of {AWAY!r} set aside, waiting for a member that may run their handler"
    assert (status.backlog, status.running, status.done) == (3, 0, 1), status
    assert status.set_aside == {AWAY: 3} and status.reason == said

    async def async_status() -> Any:
        async with AsyncClient.from_url(redis_url, prefix=prefix) as ac:
            return await (await ac.queue("picky")).status()

    seen = asyncio.run(async_status())
    assert (seen.backlog, seen.set_aside, seen.reason) == (3, {AWAY: 3}, said)
    assert [s.backlog for s in client.queues()] == [3]

    # the dashboard and /metrics
    (row,) = web.get("/api/queues").json()["queues"]
    assert (row["backlog"], row["reason"], row["set_aside"]) == (3, said, {AWAY: 3})
    assert web.get("/api/queues/picky").json()["queue"]["backlog"] == 3
    page = web.get("/api/queues/picky/jobs", params={"state": "queued"}).json()
    assert page["total"] == 3 and [j["id"] for j in page["jobs"]] == [j.id for j in away]
    assert all(j["reason"] == why for j in page["jobs"][:1])
    m = metric_values(web.get("/metrics").text)
    assert m[("queueworks_queue_backlog", (("queue", "picky"),))] == 3
    assert m[("queueworks_queue_set_aside", (("handler", AWAY), ("queue", "picky")))] == 3

    # listed, a page at a time
    listed = q.jobs("queued")
    assert listed.total == 3 and [j.id for j in listed.jobs] == [j.id for j in away]
    assert {j.state for j in listed.jobs} == {JobState.QUEUED}
    assert [j.id for j in q.jobs("queued", limit=1, offset=1).jobs] == [away[1].id]
    assert [j.id for j in q.jobs("queued", limit=5, offset=2).jobs] == [away[2].id]
    assert q.jobs("queued", limit=5, offset=3).jobs == []
    shown = cli(["queue", "picky", "jobs"], redis_url, prefix)
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.splitlines()[0] == "3 of 3 queued job(s) of queue picky", shown.stdout
    assert all(j.id in shown.stdout for j in away) and AWAY in shown.stdout

    # queueworks info
    info = cli(["info"], redis_url, prefix)
    assert info.returncode == 0, info.stderr
    line = next(x for x in info.stdout.splitlines() if x.strip().startswith("picky "))
    assert "backlog=3" in line, info.stdout
    assert f"waiting: {said}" in info.stdout, info.stdout

    # the result's timeout says why it waits, for the sync and the asyncio client
    with pytest.raises(TimeoutError) as timed_out:
        away[0].result(timeout=0.3)
    assert str(timed_out.value) == f"job {away[0].id} not finished after 0.3 s (queued: {why})"

    async def async_result() -> str:
        async with AsyncClient.from_url(redis_url, prefix=prefix) as ac:
            try:
                await (await ac.queue("picky")).job(away[1].id).result(timeout=0.3)
            except TimeoutError as exc:
                return str(exc)
        raise AssertionError("no TimeoutError")

    said_async = f"job {away[1].id} not finished after 0.3 s (queued: {why})"
    assert asyncio.run(async_result()) == said_async

    # emptied: every one cancelled, nothing of them left; the queue goes on
    assert q.empty() == 3
    assert {j.status().state for j in away} == {JobState.CANCELLED}
    tk = keys.task("picky")
    assert r.smembers(tk.aside) == set() and not r.exists(tk.aside_stream(AWAY))
    assert AWAY.encode() not in r.smembers(tk.handlers)
    status = q.status()
    assert (status.backlog, status.set_aside, status.reason) == (0, {}, None), status
    assert q.jobs("queued").total == 0
    assert q.enqueue("tests.handlers:double", {"x": 4}).result(timeout=30) == 8


@pytest.mark.system
def test_a_running_jobs_timeout_says_running(
    cluster: Cluster, client: Client, r: redis.Redis, redis_url: str, prefix: str
) -> None:
    """A job a member runs: ``result(timeout)`` says ``running``, not ``queued`` (a job to
    run now has no record until it settles), sync and asyncio alike."""
    cluster.worker("w", allow=("tests.handlers",))
    cluster.wait_workers(r, 1)
    q = client.queue("slow")
    job = q.enqueue("tests.handlers:sleep_for", {"seconds": 30})
    wait_for(lambda: job.status().state == JobState.RUNNING, 30, "the job running")
    with pytest.raises(TimeoutError) as timed_out:
        job.result(timeout=0.2)
    assert str(timed_out.value) == f"job {job.id} not finished after 0.2 s (running)"

    async def async_result() -> str:
        async with AsyncClient.from_url(redis_url, prefix=prefix) as ac:
            try:
                await (await ac.queue("slow")).job(job.id).result(timeout=0.2)
            except TimeoutError as exc:
                return str(exc)
        raise AssertionError("no TimeoutError")

    assert asyncio.run(async_result()) == f"job {job.id} not finished after 0.2 s (running)"


@pytest.mark.system
def test_a_set_aside_job_a_member_runs_is_counted_and_listed_running(
    cluster: Cluster, client: Client, r: redis.Redis
) -> None:
    """A job set aside, then taken by a worker that may run it: ``running`` in the
    queue's status and in its running list, no longer in its backlog."""
    cluster.controller()
    cluster.worker("narrow", allow=("tests.handlers",))
    cluster.wait_workers(r, 1)
    q = client.queue("later")
    assert q.enqueue("tests.handlers:double", {"x": 1}).result(timeout=30) == 2  # a member
    slow = q.enqueue("queueworks.examples:sleep", {"seconds": 6})
    wait_for(lambda: slow.status().reason, 15, "the job set aside")
    assert q.status().set_aside == {"queueworks.examples:sleep": 1}
    cluster.worker("wide", allow=("queueworks.examples",))
    wait_for(lambda: slow.status().state == JobState.RUNNING, 30, "the job running")
    status = q.status()
    assert (status.backlog, status.running, status.set_aside, status.reason) == (0, 1, {}, None)
    running = q.jobs("running")
    assert running.total == 1 and [(j.id, j.worker) for j in running.jobs] == [(slow.id, "wide")]
    assert q.jobs("queued").total == 0
    assert slow.result(timeout=30) == 6.0
