"""A live queue's settings changed (``Queue.configure``, ``queueworks queue QUEUE set``):
checked as at creation, seen by every member for the jobs it starts from then on within a
second, while a job already running keeps the settings it started with. Real Redis, real
worker processes."""

from __future__ import annotations

import asyncio
import time

import pytest
import redis

from queueworks import Client
from queueworks.client.aio import AsyncClient
from queueworks.errors import JobFailed
from queueworks.protocol.models import JobState
from tests.conftest import Cluster, wait_for

SEEN_WITHIN = 1.0  # s: every member starts its next jobs with new settings within this


@pytest.mark.integration
def test_configure_changes_what_opening_the_queue_sees(client: Client) -> None:
    q = client.queue("conf", max_attempts=1, job_timeout=30)
    with pytest.raises(ValueError, match=r"q\.configure"):
        client.queue("conf", max_attempts=5)
    settings = q.configure(max_attempts=5, rate_limit=20.0, retry_delay=0.0)
    assert (settings.max_attempts, settings.rate_limit, settings.retry_delay) == (5, 20.0, 0.0)
    assert settings.job_timeout == 30 and q.settings == settings
    again = client.queue("conf", max_attempts=5, rate_limit=20.0)  # matches now
    assert again.settings == settings
    assert q.configure(rate_limit=None).rate_limit is None
    assert client.queue("conf").settings.rate_limit is None


@pytest.mark.integration
@pytest.mark.parametrize(
    ("given", "error"),
    [
        ({"max_attempts": 0}, "max_attempts"),
        ({"job_timeout": -1}, "job_timeout"),
        ({"job_timeout": float("nan")}, "job_timeout"),
        ({"result_ttl": 0}, "result_ttl"),
        ({"retry_backoff": 0.5}, "retry_backoff"),
        ({"rate_limit": 0}, "rate_limit"),
        ({"group_limit": 0}, "group_limit"),
        ({"wait_replicas": -1}, "wait_replicas"),
    ],
)
def test_bad_settings_are_named_and_change_nothing(
    client: Client, given: dict[str, float], error: str
) -> None:
    q = client.queue("conf-bad", max_attempts=2, retry_delay=5.0)
    with pytest.raises(ValueError, match=error):
        q.configure(**{"retry_delay": 0.0, **given})  # type: ignore[arg-type]
    assert client.queue("conf-bad").settings.retry_delay == 5.0


@pytest.mark.integration
def test_node_set_settings_are_no_live_settings(client: Client) -> None:
    q = client.queue("conf-nodes")
    for name in ("min_nodes", "max_nodes", "priority", "node_selector", "nonsense"):
        with pytest.raises(TypeError, match=name):
            q.configure(**{name: 1})  # type: ignore[arg-type]


@pytest.mark.integration
def test_the_asyncio_queue_configures_too(client: Client, redis_url: str, prefix: str) -> None:
    async def main() -> int:
        async with AsyncClient.from_url(redis_url, prefix=prefix) as ac:
            q = await ac.queue("conf-aio", max_attempts=1)
            return (await q.configure(max_attempts=7)).max_attempts

    assert asyncio.run(main()) == 7
    assert client.queue("conf-aio").settings.max_attempts == 7


@pytest.mark.system
def test_members_start_their_next_jobs_with_new_settings_within_a_second(
    cluster: Cluster, client: Client, r: redis.Redis
) -> None:
    q = client.queue("live", job_timeout=30, max_attempts=1)
    cluster.worker()
    cluster.worker()
    cluster.wait_workers(r, 2)
    assert q.enqueue("tests.handlers:double", {"x": 1}).result(timeout=60) == 2  # joined
    running = q.enqueue("tests.handlers:sleep_for", {"seconds": 2.0})
    wait_for(lambda: running.status().state == JobState.RUNNING, 30, "the job running")
    q.configure(job_timeout=0.5)
    time.sleep(SEEN_WITHIN)
    later = [q.enqueue("tests.handlers:sleep_for", {"seconds": 3.0}) for _ in range(4)]
    assert running.result(timeout=30) is None  # it kept the timeout it started with
    for job in later:  # each member, whichever starts it: the new timeout
        with pytest.raises(JobFailed, match="timed out"):
            job.result(timeout=30)
        assert job.status().attempts == 1
    q.configure(job_timeout=30, max_attempts=3, retry_delay=0.0)
    time.sleep(SEEN_WITHIN)
    failing = q.enqueue("tests.handlers:always_fails", {})
    with pytest.raises(JobFailed, match="failed 3 times"):
        failing.result(timeout=30)


@pytest.mark.system
def test_a_rate_limit_set_and_removed_on_a_live_queue(
    cluster: Cluster, client: Client, r: redis.Redis
) -> None:
    q = client.queue("live-rate")
    cluster.worker()
    assert q.enqueue("tests.handlers:double", {"x": 1}).result(timeout=60) == 2  # joined
    q.configure(rate_limit=2.0)
    time.sleep(SEEN_WITHIN)
    started = time.monotonic()
    jobs = [q.enqueue("tests.handlers:double", {"x": i}) for i in range(7)]
    assert [j.result(timeout=60) for j in jobs] == [2 * i for i in range(7)]
    assert time.monotonic() - started >= 2.5  # 7 jobs at 2/s (a burst of 1): 3 s at least
    assert client.queue("live-rate").status().rate_limit == 2.0
    q.configure(rate_limit=None)
    time.sleep(SEEN_WITHIN)
    started = time.monotonic()
    jobs = [q.enqueue("tests.handlers:double", {"x": i}) for i in range(40)]
    assert [j.result(timeout=60) for j in jobs] == [2 * i for i in range(40)]
    assert time.monotonic() - started < 15.0  # 40 jobs at 2/s would take 19.5 s at least
