"""Retry backoff: a failed job (or subtask) waits ``retry_delay * retry_backoff ** (n - 1)``
(capped at ``retry_max_delay``, jittered) before its next attempt, and while it waits it
blocks no other job. Real worker and controller processes on a real Redis."""

from __future__ import annotations

import time
from typing import Any

import pytest
import redis

from queueworks import Client, TaskSpec
from queueworks.errors import JobFailed
from queueworks.protocol.job_options import JobOptions
from queueworks.protocol.keys import Keys
from queueworks.protocol.models import JobState, StoredSpec
from queueworks.protocol.retry_policy import JITTER_LOW, RetryPolicy
from queueworks.queue.queue_settings import DEFAULTS, QueueSettings, check_queue_settings
from tests.conftest import Cluster, wait_for
from tests.handlers_retry import starts

FAILS = "tests.handlers_retry:fails_first"
ALLOW = ("tests.handlers_retry", "tests.handlers")

# -- the schedule (unit) ---------------------------------------------------------------------


@pytest.mark.unit
def test_the_wait_grows_by_the_backoff_up_to_the_cap() -> None:
    policy = RetryPolicy(delay=0.5, backoff=2.0, max_delay=3.0)
    assert [policy.base_delay(n) for n in range(1, 6)] == [0.5, 1.0, 2.0, 3.0, 3.0]
    assert RetryPolicy(delay=1.0, backoff=100.0, max_delay=600.0).base_delay(10_000) == 600.0
    assert RetryPolicy(delay=0.0).base_delay(5) == 0.0  # the default: at once


@pytest.mark.unit
def test_jitter_keeps_a_wait_between_half_and_all_of_it() -> None:
    policy = RetryPolicy(delay=2.0, backoff=3.0, max_delay=600.0)
    assert policy.wait(2, lambda: 0.0) == pytest.approx(6.0 * JITTER_LOW)
    assert policy.wait(2, lambda: 0.999999) == pytest.approx(6.0, rel=1e-5)
    waits = [policy.wait(1) for _ in range(2000)]
    assert all(1.0 <= w <= 2.0 for w in waits)
    assert max(waits) - min(waits) > 0.5  # it spreads
    assert RetryPolicy().wait(3) == 0.0


@pytest.mark.unit
def test_a_jobs_own_options_override_the_queues() -> None:
    queue = RetryPolicy(delay=30.0, backoff=2.0, max_delay=600.0)
    assert queue.for_job(JobOptions()) is queue
    own = queue.for_job(JobOptions(retry_delay=0.0))
    assert own == RetryPolicy(0.0, 2.0, 600.0) and own.wait(1) == 0.0
    capped = queue.for_job(JobOptions(retry_backoff=10.0, retry_max_delay=40.0))
    assert [capped.base_delay(n) for n in (1, 2)] == [30.0, 40.0]


@pytest.mark.unit
def test_settings_are_checked_and_stored_only_when_set() -> None:
    for bad, what in (
        ({"retry_delay": -1}, "retry_delay"),
        ({"retry_backoff": 0.5}, "retry_backoff"),
        ({"retry_max_delay": float("inf")}, "retry_max_delay"),
        ({"retry_delay": "soon"}, "retry_delay"),
    ):
        with pytest.raises(ValueError, match=what):
            check_queue_settings(bad)
    assert "retry" not in DEFAULTS.spec("q").spec_json()  # a queue without: stored as before
    settings = QueueSettings(retry_delay=1.5, retry_backoff=3.0, retry_max_delay=60.0)
    stored = StoredSpec.model_validate_json(settings.spec("q").spec_json())
    assert (stored.retry_delay, stored.retry_backoff, stored.retry_max_delay) == (1.5, 3.0, 60.0)
    assert QueueSettings.of(stored) == settings
    task = TaskSpec(name="t", handler="m:f", retry_delay=2.0)
    assert '"retry_delay":2.0' in task.spec_json() and "retry_backoff" not in task.spec_json()
    with pytest.raises(ValueError, match="retry_backoff"):
        TaskSpec(name="t", handler="m:f", retry_backoff=0.0)


# -- queues (system) --------------------------------------------------------------------------


def _one_worker(cluster: Cluster, r: redis.Redis, concurrency: int = 1) -> None:
    cluster.controller()
    cluster.worker(allow=ALLOW, extra=["--concurrency", str(concurrency)])
    cluster.wait_workers(r, 1)


def _first_scheduled(job: Any) -> tuple[Any, float]:
    """The job's status the first time it says scheduled, and when it was read (after)."""

    def look() -> tuple[Any, float] | None:
        before = time.time()
        status = job.status()
        return (status, before) if status.state == JobState.SCHEDULED else None

    found: tuple[Any, float] = wait_for(look, 60, "the retry waiting", interval=0.005)
    return found


@pytest.mark.system
def test_a_retry_waits_its_backoff_and_blocks_no_other_job(
    cluster: Cluster, client: Client, r: redis.Redis, prefix: str, keys: Keys
) -> None:
    _one_worker(cluster, r)
    q = client.queue("backoff", retry_delay=0.5, retry_backoff=2.0, max_attempts=3)
    log = f"{prefix}:log"
    flaky = q.enqueue(FAILS, {"name": "flaky", "log": log, "fails": 2})
    others = q.enqueue_many((FAILS, {"name": f"o{i}", "log": log}) for i in range(5))
    waiting, seen = _first_scheduled(flaky)
    assert waiting.attempts == 1 and waiting.run_at is not None and waiting.run_at > seen
    assert waiting.last_error and "failure on attempt 1" in waiting.last_error
    assert r.zscore(keys.task("backoff").scheduled, flaky.id) == waiting.run_at
    assert flaky.result(timeout=60) == 3
    assert [o.result(timeout=60) for o in others] == [1] * 5
    runs = starts(r, log)
    (a1, t1), (a2, t2), (a3, t3) = runs["flaky"]
    assert (a1, a2, a3) == (1, 2, 3)  # the attempts count on across the waits
    assert t2 - t1 >= 0.5 * JITTER_LOW - 0.01 and t3 - t2 >= 1.0 * JITTER_LOW - 0.01
    assert t3 - t1 < 30
    # the jobs enqueued after it ran while it waited (1 worker, one job at a time)
    assert max(t for name, rows in runs.items() if name != "flaky" for _, t in rows) < t2
    done = flaky.status()
    assert (done.state, done.attempts) == (JobState.DONE, 3)
    status = q.status()
    assert (status.done, status.dead, status.scheduled) == (6, 0, 0)


@pytest.mark.system
def test_a_jobs_own_retry_delay_beats_the_queues(
    cluster: Cluster, client: Client, r: redis.Redis, prefix: str
) -> None:
    _one_worker(cluster, r, concurrency=4)  # (jobs in flight settle their retries alike)
    q = client.queue("override", retry_delay=300.0)
    log = f"{prefix}:log"
    slow = q.enqueue(FAILS, {"name": "own", "log": log, "fails": 1}, retry_delay=0.6)
    now = q.enqueue(FAILS, {"name": "now", "log": log, "fails": 2}, retry_delay=0)
    assert now.result(timeout=30) == 3  # its own 0: retried at once, not in 300 s
    assert slow.result(timeout=30) == 2
    runs = starts(r, log)
    (_, t1), (_, t2) = runs["own"]
    assert 0.6 * JITTER_LOW - 0.01 <= t2 - t1 < 30


@pytest.mark.system
def test_the_last_failure_is_dead_with_its_traceback(
    cluster: Cluster, client: Client, r: redis.Redis, keys: Keys
) -> None:
    _one_worker(cluster, r)
    q = client.queue("dies", retry_delay=0.2, max_attempts=2)
    job = q.enqueue("tests.handlers:always_fails", {"x": 1})
    with pytest.raises(JobFailed) as failed:
        job.result(timeout=60)
    assert failed.value.reason == "failed 2 times"
    assert "ValueError: cannot handle" in (failed.value.traceback or "")
    status = job.status()
    assert (status.state, status.attempts) == (JobState.DEAD, 2)
    assert r.zcard(keys.task("dies").scheduled) == 0
    assert (q.status().dead, q.status().scheduled) == (1, 0)


@pytest.mark.system
def test_a_waiting_retry_can_be_cancelled(
    cluster: Cluster, client: Client, r: redis.Redis, keys: Keys
) -> None:
    _one_worker(cluster, r)
    q = client.queue("cancel", retry_delay=300.0)
    job = q.enqueue("tests.handlers:always_fails", {"x": 1})
    waiting, _ = _first_scheduled(job)
    assert waiting.attempts == 1 and waiting.run_at is not None
    with pytest.raises(TimeoutError):
        job.result(timeout=0.3)  # it keeps waiting
    assert job.cancel() is True
    assert job.status().state == JobState.CANCELLED
    with pytest.raises(JobFailed, match="cancelled"):
        job.result(timeout=5)
    assert r.zcard(keys.task("cancel").scheduled) == 0
    assert job.cancel() is False


# -- subtasks (system) ------------------------------------------------------------------------


@pytest.mark.system
def test_a_subtask_retry_waits_without_holding_back_the_others(
    cluster: Cluster, client: Client, r: redis.Redis, prefix: str
) -> None:
    _one_worker(cluster, r)
    log = f"{prefix}:log"
    subtasks = [{"name": "s0", "log": log, "fails": 1}]
    subtasks += [{"name": f"s{i}", "log": log, "seconds": 0.01} for i in range(1, 11)]
    spec = TaskSpec(name="waits", handler=FAILS, subtasks=subtasks, retry_delay=2.0)
    task = client.submit(spec)
    status = task.wait(timeout=60)
    assert (status.state, status.done, status.dead) == ("completed", 11, 0)
    results = dict(task.results())
    assert results[0] == 2 and all(results[i] == 1 for i in range(1, 11))
    runs = starts(r, log)
    (a1, t1), (a2, t2) = runs["s0"]
    assert (a1, a2) == (1, 2) and 2.0 * JITTER_LOW - 0.01 <= t2 - t1 < 30
    assert max(t for name, rows in runs.items() if name != "s0" for _, t in rows) < t2
