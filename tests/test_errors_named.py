"""Errors that say what went wrong: ``JobFailed``'s message carries the last error, a
result waited for through a Redis outage keeps looking until its timeout, and a payload
that UTF-8 cannot carry (a lone surrogate) is a ``ValueError`` naming the field, with
nothing sent. Real Redis (a private server that really stops), a real worker."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from queueworks import AsyncClient, Client, TaskSpec
from queueworks.contrib.redis_server import RedisServer
from queueworks.errors import JobFailed, RedisUnavailable
from queueworks.protocol.keys import Keys
from tests.conftest import Cluster


@pytest.mark.system
def test_job_failed_says_the_last_error(
    cluster: Cluster, client: Client, r: redis.Redis, redis_url: str, prefix: str
) -> None:
    """A job dead after its attempts: the message says why and the last error's type and
    message (as ``queueworks enqueue --wait`` prints it), sync and asyncio alike."""
    cluster.worker("w", allow=("tests",))
    cluster.wait_workers(r, 1)
    q = client.queue("failing", max_attempts=2, retry_delay=0.0)
    job = q.enqueue("tests.handlers:always_fails", {"x": 1})
    with pytest.raises(JobFailed) as failed:
        job.result(timeout=30)
    said = f"job {job.id}: failed 2 times: ValueError: cannot handle {{'x': 1}}"
    assert str(failed.value) == said
    assert failed.value.reason == "failed 2 times"  # the parts stay as they were
    assert failed.value.traceback.rstrip().endswith("ValueError: cannot handle {'x': 1}")

    async def in_asyncio() -> str:
        async with AsyncClient.from_url(redis_url, prefix=prefix) as ac:
            aq = await ac.queue("failing")
            try:
                await aq.job(job.id).result(timeout=5)
            except JobFailed as exc:
                return str(exc)
        raise AssertionError("no JobFailed")

    assert asyncio.run(in_asyncio()) == said
    cancelled = q.enqueue("tests.handlers:double", {"x": 1}, delay=600)
    assert cancelled.cancel()
    with pytest.raises(JobFailed) as failed:
        cancelled.result(timeout=1)
    assert str(failed.value) == f"job {cancelled.id}: cancelled"


# -- a result waited for through an outage -------------------------------------------------


@pytest.fixture
def durable() -> Iterator[RedisServer]:
    """A private server that keeps its data across a restart (AOF, fsync always)."""
    with RedisServer(appendonly=True, appendfsync="always") as server:
        server.start()
        yield server


def outage_then(server: RedisServer, down: float, then: Any) -> threading.Thread:
    """Stop ``server`` now, start it again after ``down`` s, then call ``then()``."""
    server.stop()

    def back() -> None:
        time.sleep(down)
        server.start()
        then()

    thread = threading.Thread(target=back, daemon=True)
    thread.start()
    return thread


@pytest.mark.integration
def test_result_looks_again_through_a_redis_outage(durable: RedisServer) -> None:
    """``job.result(timeout)`` while Redis is down: it keeps looking (not the first
    ``RedisUnavailable``), sees the outcome written once Redis is back; with Redis down
    until the timeout, it raises ``RedisUnavailable`` then, not before."""
    with Client.from_url(durable.url, prefix="outage") as client:
        q = client.queue("through")
        job = q.enqueue("tests.handlers:double", {"x": 1})
        other = Client.from_url(durable.url, prefix="outage")
        start = time.monotonic()
        thread = outage_then(durable, 1.5, lambda: other.queue("through").job(job.id).cancel())
        with pytest.raises(JobFailed, match="cancelled"):
            job.result(timeout=30)
        assert time.monotonic() - start >= 1.4
        thread.join()
        other.close()

        job = q.enqueue("tests.handlers:double", {"x": 2})
        thread = outage_then(durable, 3.0, lambda: None)
        start = time.monotonic()
        with pytest.raises(RedisUnavailable):
            job.result(timeout=1.5)
        assert 1.4 <= time.monotonic() - start < 2.9
        thread.join()
        assert job.status().state.value == "queued"  # Redis back: the job is there


@pytest.mark.integration
def test_async_result_looks_again_through_a_redis_outage(durable: RedisServer) -> None:
    """The asyncio client (its results are polled together, ``ResultWatcher``) alike."""
    threads: list[threading.Thread] = []  # joined before the server is closed
    with Client.from_url(durable.url, prefix="outage") as other:
        job_id = other.queue("through").enqueue("tests.handlers:double", {"x": 1}).id

        async def wait_through() -> tuple[float, float]:
            async with AsyncClient.from_url(durable.url, prefix="outage") as ac:
                aq = await ac.queue("through")
                start = time.monotonic()
                threads.append(
                    outage_then(durable, 1.5, lambda: other.queue("through").job(job_id).cancel())
                )
                with pytest.raises(JobFailed, match="cancelled"):
                    await aq.job(job_id).result(timeout=30)
                through = time.monotonic() - start
                job = await aq.enqueue("tests.handlers:double", {"x": 2})
                threads.append(outage_then(durable, 3.0, lambda: None))
                start = time.monotonic()
                with pytest.raises(RedisUnavailable):
                    await job.result(timeout=1.5)
                return through, time.monotonic() - start

        through, until = asyncio.run(wait_through())
        for thread in threads:
            thread.join()
        assert through >= 1.4
        assert 1.4 <= until < 2.9


# -- text UTF-8 cannot carry ------------------------------------------------------------


LONE = "\ud800"


def lone_surrogate(exc: pytest.ExceptionInfo[ValueError], field: str) -> None:
    said = str(exc.value)
    assert said.startswith(f"{field} is not valid text: "), said
    assert "lone surrogate '\\ud800'" in said, said


@pytest.mark.integration
def test_a_lone_surrogate_is_refused_naming_the_field(
    client: Client, r: redis.Redis, keys: Keys, redis_url: str, prefix: str
) -> None:
    """A payload (or a subtask, a unique key, a group) holding ``"\\ud800"``: ``ValueError``
    naming it, from enqueue, enqueue_many and submit, sync and asyncio, and nothing of it
    is written."""
    q = client.queue("texts")
    q.enqueue("tests.handlers:double", {"x": 1})  # the handler known: the shortest path
    written = sorted(r.keys(f"{prefix}:*"))
    stream = keys.task("texts").stream
    for payload in (LONE, {"x": LONE}, {LONE: 1}, ["ok", {"deep": [LONE]}]):
        with pytest.raises(ValueError) as exc:
            q.enqueue("tests.handlers:double", payload)
        lone_surrogate(exc, "payload")
        with pytest.raises(ValueError) as exc:
            q.enqueue("tests.handlers:double", payload, delay=60)
        lone_surrogate(exc, "payload")
        with pytest.raises(ValueError) as exc:
            q.enqueue("tests.other:fresh", payload)  # a handler the queue does not know
        lone_surrogate(exc, "payload")
    with pytest.raises(ValueError) as exc:
        q.enqueue_many([("tests.handlers:double", {"x": LONE})])
    lone_surrogate(exc, "payload")
    for field, given in (("key", {"key": f"k{LONE}"}), ("group", {"group": LONE})):
        with pytest.raises(ValueError, match=rf"^{field} .* holds a lone surrogate"):
            q.enqueue("tests.handlers:double", {"x": 1}, **given)
    with pytest.raises(ValueError, match=r"^group .* holds a lone surrogate"):
        q.enqueue_many([("tests.handlers:double", {"x": 1})], group=LONE)
    with pytest.raises(ValueError) as exc:
        client.submit(TaskSpec(name="t", handler="tests.handlers:double", subtasks=[{}, LONE]))
    lone_surrogate(exc, "subtasks[1]")
    assert r.xlen(stream) == 1 and sorted(r.keys(f"{prefix}:*")) == written

    async def in_asyncio() -> list[pytest.ExceptionInfo[ValueError]]:
        out = []
        async with AsyncClient.from_url(redis_url, prefix=prefix) as ac:
            aq = await ac.queue("texts")
            with pytest.raises(ValueError) as exc:
                await aq.enqueue("tests.handlers:double", {"x": LONE})
            out.append(exc)
            with pytest.raises(ValueError) as exc:
                await aq.enqueue_many([("tests.handlers:double", [LONE])])
            out.append(exc)
            with pytest.raises(ValueError, match=r"^key .* holds a lone surrogate"):
                await aq.enqueue("tests.handlers:double", {"x": 1}, key=LONE)
            spec = TaskSpec(name="t", handler="tests.handlers:double", subtasks=[LONE])
            with pytest.raises(ValueError) as exc:
                await ac.submit(spec)
            out.append(exc)
        return out

    sync_payload, many, submitted = asyncio.run(in_asyncio())
    lone_surrogate(sync_payload, "payload")
    lone_surrogate(many, "payload")
    lone_surrogate(submitted, "subtasks[0]")
    assert r.xlen(stream) == 1 and sorted(r.keys(f"{prefix}:*")) == written
    # valid text of every plane goes through as it was
    sent = {"x": "é \u2028 😀 \U0010ffff"}
    job = q.enqueue("tests.handlers:double", sent)
    assert job.detail().payload is not None and "😀" in job.detail().payload
