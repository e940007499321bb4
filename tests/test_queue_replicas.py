"""A queue's ``wait_replicas``: an enqueue returns once that many replicas hold its job(s),
else ``NotReplicated`` names them (they stay queued on the primary); with 0 (the default)
no ``WAIT`` is sent at all. Each test starts its own Redis server (its command counts are
its own); the failover with a lagging replica is in ``tests/test_sentinel.py``.

Budget: ~5 s.
"""

from __future__ import annotations

import asyncio
import gc
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from queueworks import AsyncClient, Client
from queueworks.contrib.redis_server import RedisServer
from queueworks.errors import NotReplicated
from queueworks.protocol.jobrecords import JOB_RESULT, JOB_STATE

pytestmark = pytest.mark.integration


@pytest.fixture
def server() -> Iterator[RedisServer]:
    srv = RedisServer()
    srv.start()
    try:
        yield srv
    finally:
        srv.close()


def waits(srv: RedisServer) -> int:
    """How many WAIT commands the server ran."""
    with srv.client() as c:
        stats: Any = c.info("commandstats")
    return int(stats.get("cmdstat_wait", {}).get("calls", 0))


def entries(c: Client, name: str) -> set[str]:
    stream = c.queue(name).keys.stream
    return {i.decode() for i, _ in c.redis.xrange(stream)}


def test_no_wait_is_sent_without_wait_replicas(server: RedisServer, prefix: str) -> None:
    with Client.from_url(server.url, prefix=prefix) as c:
        q = c.queue("plain")
        jobs = [q.enqueue("m:f", {"i": i}) for i in range(5)]
        jobs += q.enqueue_many(("m:f", i) for i in range(2500))
        jobs.append(q.enqueue("m:f", delay=60))

        async def gathered() -> list[Any]:
            async with AsyncClient.from_url(server.url, prefix=prefix) as ac:
                aq = await ac.queue("plain")
                many = await aq.enqueue_many(("m:f", i) for i in range(10))
                return many + list(await asyncio.gather(*(aq.enqueue("m:f") for _ in range(50))))

        try:
            ajobs = asyncio.run(gathered())
        finally:
            gc.collect()
        assert waits(server) == 0
        assert len(entries(c, "plain")) == 5 + 2500 + 10 + 50  # the delayed one waits aside
        assert len({j.id for j in jobs} | {j.id for j in ajobs}) == 5 + 2500 + 1 + 60


def test_without_a_replica_enqueue_says_not_replicated(server: RedisServer, prefix: str) -> None:
    with Client.from_url(server.url, prefix=prefix) as c:
        q = c.queue("durable", wait_replicas=1, wait_timeout=0.1)
        assert (q.settings.wait_replicas, q.settings.wait_timeout) == (1, 0.1)
        assert c.queue("durable").settings.wait_replicas == 1  # stored with the queue
        with pytest.raises(NotReplicated) as one:
            q.enqueue("m:f", {"x": 1})
        err = one.value
        assert (err.acked, err.wanted, err.task, err.queue) == (0, 1, None, "durable")
        assert len(err.jobs) == 1 and err.job_ids == [err.jobs[0].id]
        assert f"job {err.job_ids[0]} of queue durable is written but only 0 of 1" in str(err)
        assert err.job_ids[0] in entries(c, "durable")  # queued on the primary all the same
        assert waits(server) == 1

        with pytest.raises(NotReplicated) as many:
            q.enqueue_many(("m:f", i) for i in range(4600))  # two round trips, one WAIT
        assert len(many.value.job_ids) == 4600 and many.value.acked == 0
        assert "4600 jobs of queue durable" in str(many.value)
        assert set(many.value.job_ids) <= entries(c, "durable")
        assert waits(server) == 2  # one WAIT for the whole batch

        # per call: 0 replicas is the bare XADD; a wait given overrides the queue's
        assert q.enqueue("m:f", wait_replicas=0).id in entries(c, "durable")
        assert q.enqueue_many([("m:f", 1)], wait_replicas=0)[0].id in entries(c, "durable")
        assert waits(server) == 2
        with pytest.raises(ValueError, match="wait_replicas >= 0"):
            q.enqueue("m:f", wait_replicas=-1)
        with pytest.raises(ValueError, match="wait_timeout > 0"):
            q.enqueue("m:f", wait_timeout=0)


def test_gathered_async_enqueues_share_a_wait(server: RedisServer, prefix: str) -> None:
    async def main() -> tuple[list[Any], list[Any]]:
        async with AsyncClient.from_url(server.url, prefix=prefix) as ac:
            aq = await ac.queue("durable", wait_replicas=1, wait_timeout=0.2)
            got = await asyncio.gather(
                *(aq.enqueue("m:f", {"i": i}) for i in range(40)), return_exceptions=True
            )
            with pytest.raises(NotReplicated) as many:
                await aq.enqueue_many(("m:f", i) for i in range(30))
            return list(got), many.value.job_ids

    try:
        got, many = asyncio.run(main())
    finally:
        gc.collect()
    assert all(isinstance(e, NotReplicated) for e in got), got
    ids = [e.job_ids[0] for e in got]
    assert len(set(ids)) == 40 and all(len(e.job_ids) == 1 for e in got)
    assert all(e.acked == 0 and e.wanted == 1 for e in got)
    assert len(many) == 30
    with Client.from_url(server.url, prefix=prefix) as c:
        assert set(ids) | set(many) <= entries(c, "durable")
    # the first enqueue alone, the 39 gathered behind it in one round trip, the batch: 3
    assert waits(server) == 3


def test_a_replica_that_keeps_up_acknowledges(server: RedisServer, prefix: str) -> None:
    replica = RedisServer(extra_args=["--replicaof", "127.0.0.1", str(server.port)])
    replica.start()
    try:
        deadline = time.monotonic() + 20
        with replica.client() as rc:
            while rc.info("replication").get("master_link_status") != "up":
                assert time.monotonic() < deadline, "the replica never synced"
                time.sleep(0.05)
        with Client.from_url(server.url, prefix=prefix) as c:
            q = c.queue("durable", wait_replicas=1, wait_timeout=5.0)
            job = q.enqueue("m:f", {"x": 1})
            jobs = q.enqueue_many(("m:f", i) for i in range(1500))
            with replica.client() as rc:
                assert rc.xrange(q.keys.stream, job.id, job.id)  # on the replica at return
                assert rc.xlen(q.keys.stream) == 1 + len(jobs)
            with pytest.raises(NotReplicated, match="only 1 of 2 replica"):
                q.enqueue("m:f", wait_replicas=2, wait_timeout=0.1)
            c.redis.hset(q.keys.job(job.id), mapping={JOB_STATE: "done", JOB_RESULT: "7"})
            assert job.result(timeout=5) == 7  # its settle is on the replica
    except redis.RedisError:
        print(replica.logfile.read_text()[-2000:])
        raise
    finally:
        replica.close()


def finish_by_hand(c: Client, q: Any, job_id: str, result: str) -> None:
    """The job's record as a worker's settle leaves it (done, with its result)."""
    c.redis.hset(q.keys.job(job_id), mapping={JOB_STATE: "done", JOB_RESULT: result})


def test_a_result_counts_once_its_settle_is_replicated(server: RedisServer, prefix: str) -> None:
    """No replica here: a job of a ``wait_replicas`` queue that is done is not reported
    done (its settle could still be lost); on a queue without it, it is, with no WAIT."""
    with Client.from_url(server.url, prefix=prefix) as c:
        plain = c.queue("plain")
        durable = c.queue("durable", wait_replicas=1, wait_timeout=0.1)
        pj = plain.enqueue("m:f")
        dj = durable.enqueue("m:f", wait_replicas=0)
        finish_by_hand(c, plain, pj.id, "42")
        finish_by_hand(c, durable, dj.id, "43")
        assert pj.result(timeout=1) == 42
        assert waits(server) == 0
        with pytest.raises(TimeoutError):
            dj.result(timeout=0.3)
        assert waits(server) >= 1

        async def main() -> None:
            async with AsyncClient.from_url(server.url, prefix=prefix) as ac:
                aplain, adurable = await ac.queue("plain"), await ac.queue("durable")
                assert await aplain.job(pj.id).result(timeout=1) == 42
                with pytest.raises(TimeoutError):
                    await adurable.job(dj.id).result(timeout=0.3)

        before = waits(server)
        try:
            asyncio.run(main())
        finally:
            gc.collect()
        assert waits(server) > before
