"""``job.cancel()`` on a running job: it is stopped (an ``async def`` handler at once, a
plain one at its next ``ctx.checkpoint()`` raising ``Cancelled``; one that never checks
finishes and its outcome is dropped), recorded ``cancelled``, and never run again, even
when its worker dies. Real Redis, real worker processes, a real SIGKILL."""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any

import pytest
import redis

from queueworks import Cancelled, Client, JobContext
from queueworks.errors import JobFailed
from queueworks.protocol.models import JobState
from tests.conftest import Cluster, wait_for

pytestmark = pytest.mark.system

ALLOW = ("tests.test_cancel_running", "tests.handlers")
BEAT = ["--heartbeat-interval", "0.5", "--heartbeat-ttl", "2"]
STOPPED_WITHIN = 5.0  # s: generous on a loaded machine (the worker hears it within a tick)


def _count(payload: dict[str, Any], what: str) -> None:
    r = redis.Redis.from_url(os.environ["QUEUEWORKS_REDIS_URL"])
    try:
        r.rpush(payload["key"], what)
    finally:
        r.close()


def checking(payload: dict[str, Any], ctx: JobContext) -> str:
    """Runs ``seconds`` at safe points; says how it ended (``ran``, ``cancelled``, ``done``)."""
    _count(payload, "ran")
    end = time.monotonic() + float(payload["seconds"])
    try:
        while time.monotonic() < end:
            ctx.checkpoint()
            time.sleep(0.02)
    except Cancelled:
        _count(payload, "cancelled")
        raise
    _count(payload, "done")
    return "finished"


async def async_checking(payload: dict[str, Any]) -> str:
    """Waits ``seconds``; says how it ended."""
    _count(payload, "ran")
    try:
        await asyncio.sleep(float(payload["seconds"]))
    except asyncio.CancelledError:
        _count(payload, "cancelled")
        raise
    _count(payload, "done")
    return "finished"


def deaf(payload: dict[str, Any]) -> str:
    """Runs ``seconds`` with no safe point: it cannot be asked to stop."""
    _count(payload, "ran")
    time.sleep(float(payload["seconds"]))
    _count(payload, "done")
    return "finished"


def said(r: redis.Redis, key: str) -> list[str]:
    return [x.decode() for x in r.lrange(key, 0, -1)]


def running(job: Any) -> None:
    wait_for(lambda: job.status().state == JobState.RUNNING, 60, "the job running")


@pytest.mark.parametrize("handler", [checking, async_checking])
def test_a_running_job_is_stopped_and_recorded_cancelled(
    cluster: Cluster, client: Client, r: redis.Redis, prefix: str, handler: Any
) -> None:
    cluster.worker(allow=ALLOW, extra=BEAT)
    q = client.queue("stop", job_timeout=120)
    key = f"{prefix}:said"
    job = q.enqueue(handler, {"seconds": 60, "key": key})
    running(job)
    wait_for(lambda: said(r, key) == ["ran"], 30, "the handler running")
    asked = time.monotonic()
    assert job.cancel() is True
    assert job.status().state == JobState.CANCELLED
    wait_for(lambda: said(r, key) == ["ran", "cancelled"], STOPPED_WITHIN, "the handler stopped")
    assert time.monotonic() - asked < STOPPED_WITHIN
    with pytest.raises(JobFailed, match="cancelled"):
        job.result(timeout=1)
    nxt = q.enqueue("tests.handlers:double", {"x": 4})  # its slot is free again
    assert nxt.result(timeout=30) == 8
    status = q.status()
    assert (status.done, status.dead, job.status().state) == (1, 0, JobState.CANCELLED)
    assert job.cancel() is False  # finished: nothing more to cancel


def test_a_handler_that_cannot_hear_finishes_and_its_outcome_is_dropped(
    cluster: Cluster, client: Client, r: redis.Redis, prefix: str
) -> None:
    w = cluster.worker(allow=ALLOW, extra=BEAT)
    q = client.queue("deaf", job_timeout=120)
    key = f"{prefix}:said"
    job = q.enqueue(deaf, {"seconds": 3, "key": key})
    running(job)
    assert job.cancel() is True
    wait_for(lambda: said(r, key) == ["ran", "done"], 30, "the handler finished")
    assert q.enqueue("tests.handlers:double", {"x": 1}).result(timeout=30) == 2
    assert job.status().state == JobState.CANCELLED
    assert (q.status().done, q.status().dead) == (1, 0)
    assert w.alive()


def test_a_cancelled_job_is_never_run_again_when_its_worker_dies(
    cluster: Cluster, client: Client, r: redis.Redis, prefix: str
) -> None:
    first = cluster.worker(allow=ALLOW, extra=BEAT)
    q = client.queue("final", job_timeout=120, max_attempts=3)
    key = f"{prefix}:said"
    job = q.enqueue(deaf, {"seconds": 30, "key": key})
    running(job)
    wait_for(lambda: said(r, key) == ["ran"], 30, "its handler started")  # not just read
    assert job.cancel() is True
    first.kill()  # before it could hear of the cancel, or after: nothing runs it again
    cluster.worker(allow=ALLOW, extra=BEAT)
    assert q.enqueue("tests.handlers:double", {"x": 2}).result(timeout=60) == 4
    time.sleep(3)  # past the dead worker's TTL: its pending jobs are reclaimed by now
    assert q.enqueue("tests.handlers:double", {"x": 3}).result(timeout=60) == 6
    assert said(r, key) == ["ran"]
    assert job.status().state == JobState.CANCELLED


def test_a_job_read_but_not_started_is_not_started_once_cancelled(
    cluster: Cluster, client: Client, r: redis.Redis, prefix: str
) -> None:
    cluster.worker(allow=ALLOW, extra=BEAT)
    q = client.queue("held", job_timeout=120)
    warm = [q.enqueue("tests.handlers:double", {"x": i}) for i in range(20)]
    assert [j.result(timeout=60) for j in warm] == [2 * i for i in range(20)]  # batches now
    q.pause()
    time.sleep(0.5)
    first = q.enqueue(deaf, {"seconds": 4, "key": f"{prefix}:first"})
    behind = q.enqueue(deaf, {"seconds": 0, "key": f"{prefix}:behind"})
    q.resume()
    running(first)
    assert behind.status().state == JobState.RUNNING  # read with it: held behind it
    assert behind.cancel() is True
    wait_for(lambda: said(r, f"{prefix}:first") == ["ran", "done"], 30, "the first job done")
    assert q.enqueue("tests.handlers:double", {"x": 5}).result(timeout=30) == 10
    assert said(r, f"{prefix}:behind") == []  # never started
    assert behind.status().state == JobState.CANCELLED
