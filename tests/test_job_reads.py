"""What ``Job.result`` and ``Job.status`` read: a settled job's record alone, one command
in one round trip; a live job's entry before its record, as before (``queue_plans``)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import redis

from queueworks import AsyncClient, Client
from queueworks.errors import JobFailed
from queueworks.protocol.jobrecords import JOB_PAYLOAD, JOB_RESULT, STATUS_FIELDS
from queueworks.protocol.keys import Keys
from queueworks.protocol.models import JobState
from tests.test_job_views import H, read_one, settle

pytestmark = pytest.mark.integration

READS = ("hmget", "hgetall", "xrange", "xpending", "exists", "smembers")


def calls(r: redis.Redis) -> dict[str, int]:
    """How many times the server ran each command that reads a job, so far."""
    stats: Any = r.info("commandstats")
    return {c: int(stats.get(f"cmdstat_{c}", {}).get("calls", 0)) for c in READS}


def spent(r: redis.Redis, before: dict[str, int]) -> dict[str, int]:
    after = calls(r)
    return {c: after[c] - before[c] for c in READS if after[c] != before[c]}


def test_a_settled_jobs_result_and_status_are_one_read(
    client: Client, r: redis.Redis, keys: Keys
) -> None:
    q = client.queue("reads")
    tk = keys.task("reads")
    done, dead, waiting = (q.enqueue(H, {"x": i}) for i in range(3))
    settle(client, tk, [read_one(r, tk)])
    settle(client, tk, [read_one(r, tk)], dead=True)

    before = calls(r)
    assert done.result(timeout=1) == {"y": 2}
    assert spent(r, before) == {"hmget": 1}
    before = calls(r)
    assert done.status().state == JobState.DONE
    assert spent(r, before) == {"hgetall": 1}
    with pytest.raises(JobFailed, match="failed 1 times"):
        dead.result(timeout=1)
    assert dead.status().state == JobState.DEAD

    before = calls(r)  # a job on the stream: its entry, then its record, read again
    assert waiting.status().state == JobState.QUEUED
    assert spent(r, before) == {"hgetall": 2, "xrange": 1, "xpending": 1}
    with pytest.raises(TimeoutError, match="queued"):
        waiting.result(timeout=0.01)
    with pytest.raises(LookupError):
        q.job("1-1").result(timeout=1)


def test_the_async_handles_read_a_settled_job_once(
    client: Client, r: redis.Redis, keys: Keys, redis_url: str, prefix: str
) -> None:
    q = client.queue("reads")
    tk = keys.task("reads")
    job = q.enqueue(H, {"x": 1})
    settle(client, tk, [read_one(r, tk)])

    async def go() -> tuple[Any, Any, dict[str, int]]:
        aclient = AsyncClient.from_url(redis_url, prefix=prefix)
        try:
            ajob = (await aclient.queue("reads")).job(job.id)
            before = calls(r)
            return await ajob.result(timeout=1), await ajob.status(), spent(r, before)
        finally:
            await aclient.close()

    result, status, read = asyncio.run(go())
    assert (result, status.state) == ({"y": 2}, JobState.DONE)
    assert read == {"hmget": 1, "hgetall": 1}


def test_a_list_of_jobs_reads_no_payload_or_result(
    client: Client, r: redis.Redis, keys: Keys
) -> None:
    q = client.queue("reads-list")
    tk = keys.task("reads-list")
    jobs = [q.enqueue(H, {"x": i, "pad": "p" * 10_000}) for i in range(5)]
    settle(client, tk, [read_one(r, tk) for _ in jobs])
    assert len(r.hget(tk.job(jobs[0].id), "p") or b"") > 10_000  # kept whole on its record
    before = calls(r)
    page = q.jobs("done", limit=5)
    assert {j.id for j in page.jobs} == {j.id for j in jobs}
    assert all(j.handler == H and j.finished_at is not None for j in page.jobs)
    assert spent(r, before).get("hgetall", 0) == 0  # each record's status fields alone
    assert not {JOB_PAYLOAD, JOB_RESULT} & set(STATUS_FIELDS)
