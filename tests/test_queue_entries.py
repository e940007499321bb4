"""A job to run now is its stream entry until it settles (issue 18, Performance: an enqueue
is one ``XADD``): its id is the entry's, it has no record while it waits, and status,
result and cancel read the entry, then the record. Real Redis; a member played by hand
where a test needs a job held without running it."""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any

import pytest
import redis

from queueworks import AsyncClient, Client, JobFailed
from queueworks.contrib.redis_server import RedisServer
from queueworks.protocol.keys import Keys
from queueworks.protocol.models import JobState
from queueworks.transport.connection import connect, one_command

pytestmark = pytest.mark.integration

NOOP = "tests.handlers:double"


def test_a_job_to_run_now_is_its_entry_until_it_settles(
    client: Client, r: redis.Redis, keys: Keys
) -> None:
    q = client.queue("entries", result_ttl=600)
    tk = keys.task("entries")
    before = time.time()
    job = q.enqueue(NOOP, {"x": 1})
    entries: Any = r.xrange(tk.stream)
    assert [e.decode() for e, _ in entries] == [job.id]
    assert set(entries[0][1]) == {b"h", b"p", b"t"}  # no job id of its own: the entry's
    assert not r.exists(tk.job(job.id))  # no record while it waits

    status = job.status()
    assert (status.id, status.state, status.handler) == (job.id, JobState.QUEUED, NOOP)
    assert before <= status.enqueued_at <= time.time()
    with pytest.raises(TimeoutError, match="queued"):  # waits: it is no unknown job
        job.result(timeout=0.05)

    r.xreadgroup(tk.group, "member-m", {tk.stream: ">"}, count=1)  # a member takes it
    running = job.status()
    assert (running.state, running.worker, running.attempts) == (JobState.RUNNING, "member-m", 1)
    other = q.enqueue(NOOP, {"x": 2})
    assert other.cancel() is True
    assert r.xlen(tk.stream) == 1  # its entry left the stream; the running one stays
    cancelled = other.status()
    assert (cancelled.state, cancelled.handler) == (JobState.CANCELLED, NOOP)
    assert before <= cancelled.enqueued_at <= (cancelled.finished_at or 0)
    assert 0 < r.ttl(tk.job(other.id)) <= 600
    with pytest.raises(JobFailed, match="cancelled"):
        other.result(timeout=1)
    assert other.cancel() is False  # cancelled already

    assert job.cancel() is True  # running: stopped, its entry gone (nobody runs it again)
    assert r.xlen(tk.stream) == 0 and not r.xpending(tk.stream, tk.group)["pending"]
    stopped = job.status()
    assert (stopped.state, stopped.attempts, stopped.worker) == (
        JobState.CANCELLED,
        1,
        "member-m",
    )
    assert r.lrange(keys.worker_stops("member-m"), 0, -1) == [f"entries\t{job.id}".encode()]


@pytest.mark.parametrize("job_id", ["nope", "1-0", "0-1", "99999999999999999999-1", "1-0-0"])
def test_an_id_of_no_job_is_no_job_to_status_result_and_cancel(client: Client, job_id: str) -> None:
    q = client.queue("unknown")
    q.enqueue(NOOP, {"x": 1})  # a stream with an entry, none of them this id
    job = q.job(job_id)
    for call in (job.status, lambda: job.result(timeout=0.05), job.cancel):
        with pytest.raises(LookupError, match="has no job"):
            call()


def test_the_async_client_reads_a_job_waiting_on_the_stream_alike(
    redis_url: str, prefix: str, r: redis.Redis, keys: Keys
) -> None:
    async def main() -> None:
        async with AsyncClient.from_url(redis_url, prefix=prefix) as ac:
            q = await ac.queue("aentries")
            alone = await q.enqueue(NOOP, {"x": 1})
            together = await asyncio.gather(*(q.enqueue(NOOP, {"x": i}) for i in range(20)))
            many = await q.enqueue_many((NOOP, {"x": i}) for i in range(1200))
            stream: Any = r.xrange(keys.task("aentries").stream)
            ids = [alone.id, *(j.id for j in together), *(j.id for j in many)]
            assert [e.decode() for e, _ in stream] == ids  # each job's id is its entry's
            assert (await alone.status()).state == JobState.QUEUED
            with pytest.raises(TimeoutError):
                await together[-1].result(timeout=0.05)
            assert await many[0].cancel() is True
            assert (await many[0].status()).state == JobState.CANCELLED
            with pytest.raises(LookupError):
                await q.job("2-0").result(timeout=0.05)

    asyncio.run(main())


def test_one_command_raises_error_replies_and_recovers_from_a_lost_connection() -> None:
    """The enqueue's and the member's bare command: an error reply is raised and the
    connection stays good; a connection lost under it (Redis restarted) is replaced."""
    with RedisServer() as server:
        server.start()
        r = connect(server.url)
        assert one_command(r, "PING") == b"PONG"
        with pytest.raises(redis.ResponseError, match="wrong number of arguments"):
            one_command(r, "XADD", "s")
        assert one_command(r, "XADD", "s", "*", "h", "x") and r.xlen("s") == 1
        server.restart()
        with contextlib.suppress(redis.ConnectionError):  # the lost connection, if the
            one_command(r, "PING")  # pool handed it out: disconnected, not kept
        assert one_command(r, "PING") == b"PONG"
        r.close()
