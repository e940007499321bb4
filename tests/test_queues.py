"""Issue 18: queues — jobs enqueued one at a time on an elastic node set. Real Redis, real
worker and controller processes, real SIGKILLs."""

from __future__ import annotations

import threading
import time
from collections import Counter
from typing import Any

import pytest
import redis

from queueworks import Client, TaskSpec, TaskState
from queueworks.errors import JobFailed
from queueworks.protocol.keys import Keys
from queueworks.protocol.models import JobState
from tests import handlers
from tests.conftest import Cluster, wait_for


def results_of(jobs: list[Any], timeout: float = 60.0) -> list[Any]:
    deadline = time.monotonic() + timeout
    return [j.result(timeout=max(0.1, deadline - time.monotonic())) for j in jobs]


def nodes_of(client: Client, name: str) -> int:
    return len(client.task(name).status().nodes)


@pytest.mark.system
def test_5000_jobs_of_mixed_handlers_are_all_right(
    cluster: Cluster, client: Client, r: redis.Redis, keys: Keys
) -> None:
    cluster.controller()
    cluster.worker()
    cluster.worker()
    cluster.wait_workers(r, 2)
    q = client.queue("mixed")
    kinds = ["tests.handlers:double", "tests.handlers:square", handlers.job_echo]
    one_by_one = [q.enqueue(kinds[i % 3], {"x": i}) for i in range(1000)]
    batched = q.enqueue_many((kinds[i % 3], {"x": i}) for i in range(1000, 5000))
    jobs = one_by_one + batched
    got = results_of(jobs)
    for i, (job, value) in enumerate(zip(jobs, got, strict=True)):
        if i % 3 == 0:
            assert value == 2 * i
        elif i % 3 == 1:
            assert value == i * i
        else:
            assert value["x"] == i and value["job"] == job.id and value["attempt"] == 1
    status = q.status()
    assert (status.done, status.dead, status.rejected, status.backlog) == (5000, 0, 0, 0)
    assert r.xlen(keys.task("mixed").stream) == 0  # settled jobs leave the stream
    assert {s.name for s in client.queues()} == {"mixed"}
    one = jobs[7].status()
    assert one.state == JobState.DONE and one.attempts == 1 and one.worker
    assert one.enqueued_at <= (one.started_at or 0) <= (one.finished_at or 0)


@pytest.mark.system
def test_a_member_killed_mid_job_loses_nothing_and_counts_each_once(
    cluster: Cluster, client: Client, r: redis.Redis, prefix: str
) -> None:
    cluster.controller()
    workers = [cluster.worker() for _ in range(3)]
    cluster.wait_workers(r, 3)
    q = client.queue("kill")
    log = f"{prefix}:log"
    # jobs of 0.1 s: a worker is between two jobs (its settle, its next read) a small part of
    # the time, so the kill finds the victim running one even on a loaded machine
    n = 150
    jobs = q.enqueue_many(
        (handlers.job_logged, {"x": i, "log": log, "seconds": 0.1}) for i in range(n)
    )
    wait_for(lambda: q.status().done >= 30, 30, "30 done")
    running = {s.worker for s in (j.status() for j in jobs[30:]) if s.state == JobState.RUNNING}
    victim = next(w for w in workers if w.name in running)
    killed_at = time.time()
    victim.kill()
    started_before = {
        job
        for job, worker, _, t in (x.decode().split("|") for x in r.lrange(log, 0, -1))
        if worker == victim.name and float(t) < killed_at
    }
    assert results_of(jobs) == [2 * i for i in range(n)]
    status = q.status()
    assert (status.done, status.dead) == (n, 0)  # counted once
    runs: dict[str, list[tuple[str, int, float]]] = {}
    for line in (x.decode() for x in r.lrange(log, 0, -1)):
        job, worker, attempt, t = line.split("|")
        runs.setdefault(job, []).append((worker, int(attempt), float(t)))
    assert set(runs) == {j.id for j in jobs}
    # what the victim had started but not settled ran again elsewhere, charged (attempt 2),
    # within TTL + one tick of the kill
    settled_by = {j.id: j.status().worker for j in jobs}
    interrupted = [j for j in started_before if settled_by[j] != victim.name]
    assert interrupted, "the victim held a started job when it died"
    for job in interrupted:
        later = [(w, a, t) for w, a, t in runs[job] if t > killed_at]
        assert later and later[0][0] != victim.name and later[0][1] == 2, runs[job]
        assert later[0][2] - killed_at < 3.0 + 1.0 + 1.0


@pytest.mark.system
def test_a_higher_priority_task_takes_nodes_from_a_busy_queue_and_gives_them_back(
    cluster: Cluster, client: Client, r: redis.Redis, prefix: str
) -> None:
    cluster.controller()
    for _ in range(3):
        cluster.worker()
    cluster.wait_workers(r, 3)
    q = client.queue("busy", min_nodes=1)
    log = f"{prefix}:log"
    stop = threading.Event()
    enqueued: list[Any] = []

    def produce() -> None:  # ~150 jobs/s of 10 ms: more than one member keeps up with
        while not stop.is_set():
            enqueued.append(q.enqueue(handlers.job_logged, {"x": 1, "log": log, "seconds": 0.01}))
            time.sleep(1 / 150)

    producer = threading.Thread(target=produce, daemon=True)
    producer.start()
    try:
        wait_for(lambda: nodes_of(client, "busy") == 3, 15, "the queue to grow onto 3 workers")
        batch = client.submit(
            TaskSpec(
                name="urgent",
                handler="tests.handlers:double_slow",
                subtasks=[{"x": i, "seconds": 0.01} for i in range(400)],
                priority=10,
                min_nodes=2,
                max_nodes=2,
            )
        )
        submitted = time.monotonic()
        wait_for(lambda: len(batch.status().nodes) == 2, 10, "the task to get 2 nodes")
        assert time.monotonic() - submitted < 2.0
        assert nodes_of(client, "busy") == 1  # it keeps min_nodes
        before = q.status().done
        wait_for(lambda: q.status().done > before + 50, 10, "the queue to keep finishing jobs")
        assert batch.wait(timeout=60).state == TaskState.COMPLETED
        wait_for(lambda: nodes_of(client, "busy") == 3, 10, "the queue to regrow")
    finally:
        stop.set()
        producer.join(5)
    assert len(results_of(enqueued)) == len(enqueued)
    assert q.status().dead == 0


@pytest.mark.system
def test_jobs_wait_while_the_queue_has_no_member_and_run_when_one_comes(
    cluster: Cluster, client: Client, r: redis.Redis
) -> None:
    cluster.controller()
    q = client.queue("patient")
    early = q.enqueue_many(("tests.handlers:double", {"x": i}) for i in range(200))
    wait_for(lambda: q.status().reason == "no live worker", 10, "the queue's reason")
    status = q.status()
    assert (status.backlog, status.nodes, status.done) == (200, [], 0)
    cluster.worker()
    assert results_of(early) == [2 * i for i in range(200)]
    # all preempted: a higher-priority task takes the only worker, the queue keeps its jobs
    hog = client.submit(
        TaskSpec(
            name="hog",
            handler="tests.handlers:double_slow",
            subtasks=[{"x": i, "seconds": 0.05} for i in range(100)],
            priority=5,
        )
    )
    wait_for(lambda: nodes_of(client, "patient") == 0 and hog.status().nodes, 20, "preempted")
    later = q.enqueue_many(("tests.handlers:double", {"x": i}) for i in range(100))
    assert q.status().done == 200
    assert hog.wait(timeout=60).state == TaskState.COMPLETED
    assert results_of(later) == [2 * i for i in range(100)]


@pytest.mark.system
def test_delayed_jobs_run_at_their_time_and_survive_restarts(
    cluster: Cluster, client: Client, r: redis.Redis
) -> None:
    controller = cluster.controller()
    worker = cluster.worker()
    cluster.wait_workers(r, 1)
    q = client.queue("later")
    soon = q.enqueue("tests.handlers:double", {"x": 1}, delay=1.5)
    assert soon.status().state == JobState.SCHEDULED
    assert soon.result(timeout=10) == 2
    st = soon.status()
    assert st.started_at is not None and st.run_at is not None
    assert st.run_at <= st.started_at <= st.run_at + 1.0  # at its time, within a tick

    enqueued = time.time()
    delayed = [q.enqueue("tests.handlers:double", {"x": i}, delay=3.0) for i in range(20)]
    now = [q.enqueue("tests.handlers:double", {"x": 100 + i}) for i in range(5)]
    assert results_of(now) == [2 * (100 + i) for i in range(5)]
    worker.kill()
    controller.kill()
    assert q.status().scheduled == 20
    time.sleep(max(0.0, enqueued + 3.5 - time.time()))
    assert all(j.status().state == JobState.SCHEDULED for j in delayed)  # nobody to move them
    cluster.controller()
    cluster.worker()
    assert results_of(delayed) == [2 * i for i in range(20)]
    for j in delayed:
        st = j.status()
        assert st.started_at is not None and st.started_at >= enqueued + 3.0  # not before
    assert q.status().scheduled == 0


@pytest.mark.system
def test_a_job_whose_handler_the_worker_may_not_run_waits_alone_not_dead(
    cluster: Cluster, client: Client, r: redis.Redis, keys: Keys
) -> None:
    cluster.controller()
    cluster.worker("narrow", allow=("tests.handlers",))
    cluster.wait_workers(r, 1)
    q = client.queue("picky")
    assert results_of([q.enqueue("tests.handlers:double", {"x": i}) for i in range(10)]) == [
        2 * i for i in range(10)
    ]
    other = [q.enqueue("queueworks.examples:double", {"x": i}) for i in range(5)]
    wait_for(lambda: all(j.status().reason for j in other), 15, "the jobs' reasons")
    assert "queueworks.examples:double" in (other[0].status().reason or "")
    # the queue keeps its node and runs its other jobs meanwhile
    assert results_of([q.enqueue("tests.handlers:double", {"x": 5})]) == [10]
    status = q.status()
    assert [n.worker for n in status.nodes] == ["narrow"] and status.dead == 0
    assert status.reason == (  # theirs alone: the queue itself waits for nothing
        "5 job(s) of 'queueworks.examples:double' set aside, waiting for a member that may "
        "run their handler"
    )
    assert status.backlog == 5 and status.set_aside == {"queueworks.examples:double": 5}
    assert r.xlen(keys.task("picky").dead) == 0
    cluster.worker("wide", allow=("tests.handlers", "queueworks.examples"))
    assert results_of(other) == [2 * i for i in range(5)]
    assert q.status().dead == 0


@pytest.mark.system
def test_a_job_naming_a_function_its_module_lacks_is_dead_lettered(
    cluster: Cluster, client: Client, r: redis.Redis
) -> None:
    cluster.controller()
    cluster.worker()
    cluster.wait_workers(r, 1)
    q = client.queue("typo")
    bad = q.enqueue("tests.handlers:dubble", {"x": 1})
    good = q.enqueue("tests.handlers:double", {"x": 2})
    with pytest.raises(JobFailed) as failed:
        bad.result(timeout=15)
    assert (
        failed.value.reason
        == "handler 'tests.handlers:dubble': module 'tests.handlers' has no 'dubble'"
    )
    assert bad.status().attempts == 1  # dead at once: it would fail the same way again
    assert good.result(timeout=15) == 4  # the queue goes on


@pytest.mark.system
def test_job_timeout_attempts_and_cancel(cluster: Cluster, client: Client, r: redis.Redis) -> None:
    cluster.controller()
    q = client.queue("strict", job_timeout=0.5, max_attempts=2)
    hung = q.enqueue("tests.handlers:sleep_for", {"seconds": 5})
    waiting = q.enqueue("tests.handlers:double", {"x": 3})
    delayed = q.enqueue("tests.handlers:double", {"x": 4}, delay=30)
    assert waiting.cancel() and delayed.cancel()  # nobody has read them yet
    assert waiting.status().state == JobState.CANCELLED
    cluster.worker()
    with pytest.raises(JobFailed) as failed:
        hung.result(timeout=30)
    assert failed.value.reason == "failed 2 times"
    assert "timed out: it ran past job_timeout (0.5 s)" in failed.value.traceback
    assert hung.status().attempts == 2 and hung.status().state == JobState.DEAD
    with pytest.raises(JobFailed, match="cancelled"):
        waiting.result(timeout=1)
    assert not hung.cancel()  # finished: nothing to cancel
    assert q.status().dead == 1 and q.status().done == 0


@pytest.mark.system
def test_the_stream_stays_bounded_over_100000_jobs(
    cluster: Cluster, client: Client, r: redis.Redis, keys: Keys
) -> None:
    cluster.controller()
    cluster.worker()
    cluster.worker()
    cluster.wait_workers(r, 2)
    q = client.queue("bulk", result_ttl=600)
    tk = keys.task("bulk")
    n = 100_000
    jobs = q.enqueue_many(("queueworks.examples:noop", {"x": i}) for i in range(n))
    lengths = []
    while q.status().done < n:
        lengths.append(r.xlen(tk.stream))
        time.sleep(0.2)
        assert len(lengths) < 600, "100,000 jobs took over two minutes"
    assert r.xlen(tk.stream) == 0 and max(lengths) <= n
    # it shrank while the jobs ran (one sample: they drained before a second one)
    assert len(lengths) == 1 or lengths[-1] < lengths[0] or lengths[0] == 0
    # what is left is each job's record, expiring with its result
    for job in jobs[:: n // 50]:
        assert 0 < r.ttl(tk.job(job.id)) <= 600
    assert Counter(j.status().state for j in jobs[:: n // 50]) == {JobState.DONE: 50}


@pytest.mark.integration
def test_opening_a_queue_is_idempotent_and_checks_settings(client: Client) -> None:
    q = client.queue("same", max_attempts=5, job_timeout=10.0)
    again = client.queue("same")
    assert again.settings == q.settings and again.settings.max_attempts == 5
    assert client.queue("same", max_attempts=5).name == "same"
    with pytest.raises(ValueError, match="exists with max_attempts=5"):
        client.queue("same", max_attempts=3)
    client.submit(TaskSpec(name="t", handler="m:f", subtasks=[]), task_id="plain")
    with pytest.raises(ValueError, match="not a queue"):
        client.queue("plain")
    job = q.enqueue(handlers.double, {"x": 1})
    assert job.status().handler == "tests.handlers:double"
    with pytest.raises(ValueError, match="module-level function"):
        q.enqueue(lambda p: p, {})
    with pytest.raises(ValueError, match="payload is not JSON"):
        q.enqueue("tests.handlers:double", {"x": {1, 2}})


@pytest.mark.system
def test_a_queue_whose_stream_has_the_group_of_an_older_version_is_served(
    cluster: Cluster, client: Client, r: redis.Redis, keys: Keys
) -> None:
    """Older versions named a task's consumer group after the task; a worker of this one
    gives the stream the shared group when it joins, and every job runs (those an old
    worker had read too: they were never settled)."""
    q = client.queue("old-groups")
    jobs = q.enqueue_many(("tests.handlers:double", {"x": i}) for i in range(20))
    tk = keys.task("old-groups")
    r.xgroup_destroy(tk.stream, tk.group)
    r.xgroup_create(tk.stream, "old-groups", id="0")
    r.xreadgroup("old-groups", "old-worker", {tk.stream: ">"}, count=5)
    cluster.controller()
    cluster.worker()
    assert results_of(jobs) == [2 * i for i in range(20)]
    assert tk.group in {g["name"].decode() for g in r.xinfo_groups(tk.stream)}
