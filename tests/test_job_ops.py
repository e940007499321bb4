"""One job from its id (``client.job("QUEUE/JOB_ID")``, ``queueworks job``), a queue's dead
jobs by id (``queueworks dead QUEUE``, ``--requeue JOB_ID``) and a live queue's settings from
the command line (``queueworks queue QUEUE set``). Real Redis, real worker processes."""

from __future__ import annotations

import asyncio
import json
import os
from typing import Any

import pytest
import redis

from queueworks import Client
from queueworks.client.aio import AsyncClient
from queueworks.errors import JobFailed
from queueworks.protocol.models import JobState
from tests.conftest import Cluster
from tests.test_cli import cli

ALLOW = ("tests.test_job_ops",)


def gated(payload: dict[str, Any]) -> int:
    """Fails until the Redis key ``payload["gate"]`` exists, then doubles ``x``."""
    r = redis.Redis.from_url(os.environ["QUEUEWORKS_REDIS_URL"])
    try:
        if not r.exists(payload["gate"]):
            raise RuntimeError(f"gate {payload['gate']} is closed")
    finally:
        r.close()
    return int(payload["x"]) * 2


@pytest.mark.integration
def test_a_job_handle_from_its_id_alone(client: Client, redis_url: str, prefix: str) -> None:
    q = client.queue("byid")
    later = q.enqueue("tests.handlers:double", {"x": 2}, delay=60)
    now = q.enqueue("tests.handlers:double", {"x": 3})
    job = client.job(f"byid/{later.id}")
    assert (job.id, job.queue.name) == (later.id, "byid")
    assert job.status().state == JobState.SCHEDULED
    assert client.job(f"byid/{now.id}").status().state == JobState.QUEUED
    assert job.cancel() and later.status().state == JobState.CANCELLED
    with pytest.raises(LookupError):
        client.job("byid/abc123").status()

    async def main() -> tuple[JobState, bool]:
        async with AsyncClient.from_url(redis_url, prefix=prefix) as ac:
            handle = ac.job(f"byid/{now.id}")
            return (await handle.status()).state, await handle.cancel()

    assert asyncio.run(main()) == (JobState.QUEUED, True)
    assert now.status().state == JobState.CANCELLED


@pytest.mark.integration
@pytest.mark.parametrize("ref", ["byid", "/1-0", "byid/", "by id/1-0", "byid/xyz", "byid/1-0-0"])
def test_a_bad_job_reference_is_named(client: Client, ref: str) -> None:
    with pytest.raises(ValueError, match=r"job|queue name"):
        client.job(ref)


@pytest.mark.system
def test_job_and_dead_commands_show_and_requeue_a_dead_job_by_id(
    cluster: Cluster, client: Client, r: redis.Redis, redis_url: str, prefix: str
) -> None:
    cluster.worker(allow=ALLOW)
    gate = f"{prefix}:gate"
    q = client.queue("ops", max_attempts=1)
    jobs = [q.enqueue(gated, {"x": i, "gate": gate}) for i in range(3)]
    for job in jobs:
        with pytest.raises(JobFailed):
            job.result(timeout=60)
    listed = cli(["dead", "ops"], redis_url, prefix)
    assert listed.returncode == 0, listed.stderr
    assert all(job.id in listed.stdout for job in jobs), listed.stdout
    as_json = json.loads(cli(["dead", "ops", "--json"], redis_url, prefix).stdout)
    assert [d["job"] for d in as_json["dead_letters"]] == [j.id for j in jobs]

    shown = cli(["job", f"ops/{jobs[0].id}"], redis_url, prefix)
    assert shown.returncode == 0, shown.stderr
    assert f"job ops/{jobs[0].id}  dead  tests.test_job_ops:gated" in shown.stdout
    assert "attempts  1" in shown.stdout and "gate" in shown.stdout and "closed" in shown.stdout
    detail = json.loads(cli(["job", f"ops/{jobs[0].id}", "--json"], redis_url, prefix).stdout)
    assert (detail["state"], detail["attempts"]) == ("dead", 1)

    r.set(gate, "open")
    again = cli(["job", f"ops/{jobs[0].id}", "--requeue", "--wait"], redis_url, prefix)
    assert again.returncode == 0, again.stderr
    assert "done" in again.stdout and "result    0" in again.stdout
    one = cli(["dead", "ops", "--requeue", jobs[2].id], redis_url, prefix)
    assert one.returncode == 0, one.stderr
    assert jobs[2].result(timeout=60) == 4
    assert jobs[1].status().state == JobState.DEAD  # the one not named stays dead
    assert (q.status().done, q.status().dead) == (2, 1)

    missing = cli(["job", "ops/abc123"], redis_url, prefix)
    assert missing.returncode == 1 and "no job" in missing.stderr
    bad = cli(["job", "ops"], redis_url, prefix)
    assert bad.returncode == 2 and "QUEUE/JOB_ID" in bad.stderr
    gone = cli(["job", f"ops/{jobs[1].id}", "--cancel"], redis_url, prefix)
    assert gone.returncode == 1 and "had finished" in gone.stderr


@pytest.mark.integration
def test_job_cancel_and_wait_from_the_command_line(
    client: Client, redis_url: str, prefix: str
) -> None:
    q = client.queue("ops-cancel")
    job = q.enqueue("tests.handlers:double", {"x": 1}, delay=600)
    res = cli(["job", f"ops-cancel/{job.id}", "--cancel", "--wait"], redis_url, prefix)
    assert res.returncode == 3, res.stderr  # waited: it finished, but cancelled
    assert "cancelled" in res.stdout and "cancelled" in res.stderr
    assert job.status().state == JobState.CANCELLED


@pytest.mark.integration
def test_queue_set_changes_live_settings(client: Client, redis_url: str, prefix: str) -> None:
    q = client.queue("ops-set", max_attempts=1, rate_limit=5.0)
    res = cli(
        [
            "queue",
            "ops-set",
            "set",
            "--max-attempts",
            "5",
            "--job-timeout",
            "2.5",
            "--rate-limit",
            "none",
        ],
        redis_url,
        prefix,
    )
    assert res.returncode == 0, res.stderr
    assert "max_attempts=5" in res.stdout and "rate_limit=None" in res.stdout
    settings = client.queue("ops-set").settings
    assert (settings.max_attempts, settings.job_timeout, settings.rate_limit) == (5, 2.5, None)
    assert q.configure().max_attempts == 5
    for args, said in [
        (["--max-attempts", "0"], "max-attempts"),
        (["--job-timeout", "nan"], "job-timeout"),
        ([], "--max-attempts"),
    ]:
        bad = cli(["queue", "ops-set", "set", *args], redis_url, prefix)
        assert bad.returncode == 2 and said in bad.stderr, bad.stderr
    elsewhere = cli(["queue", "ops-set", "pause", "--max-attempts", "2"], redis_url, prefix)
    assert elsewhere.returncode == 2 and "set" in elsewhere.stderr
    none = cli(["queue", "no-such", "set", "--max-attempts", "2"], redis_url, prefix)
    assert none.returncode == 1 and "no queue no-such" in none.stderr
    assert client.queue("ops-set").settings.max_attempts == 5
