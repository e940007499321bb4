"""Workers shared by queues: one worker is a member of every queue it may serve and serves
them all from one loop; a task takes workers whole. Real Redis, real processes."""

from __future__ import annotations

import time
from typing import Any

import pytest
import redis

from queueworks import Client, TaskSpec, TaskState
from queueworks.errors import JobFailed
from queueworks.protocol.keys import Keys
from tests.conftest import Cluster, wait_for


def results_of(jobs: list[Any], timeout: float = 60.0) -> list[Any]:
    deadline = time.monotonic() + timeout
    return [j.result(timeout=max(0.1, deadline - time.monotonic())) for j in jobs]


def members_of(client: Client, name: str) -> list[str]:
    return sorted(n.worker for n in client.task(name).status().nodes)


@pytest.mark.system
def test_one_worker_serves_three_queues_at_once(
    cluster: Cluster, client: Client, r: redis.Redis, keys: Keys
) -> None:
    queues = [client.queue(f"q{i}") for i in range(3)]
    w = cluster.worker("solo")
    wait_for(lambda: all(members_of(client, q.name) == ["solo"] for q in queues), 30, "members")
    started = time.monotonic()
    jobs = [
        j
        for q in queues
        for j in q.enqueue_many(("tests.handlers:double", {"x": i}) for i in range(100))
    ]
    assert results_of(jobs, 30) == [2 * i for _ in queues for i in range(100)]
    elapsed = time.monotonic() - started
    assert elapsed < 20, elapsed
    record = client.workers()[0]
    assert record.member_of == ["q0", "q1", "q2"]
    assert w.alive()


@pytest.mark.system
def test_concurrency_spans_every_queue_of_a_worker(cluster: Cluster, client: Client) -> None:
    """--concurrency 16: 8 half-second I/O jobs in each of two queues run at once."""
    queues = [client.queue("io-a"), client.queue("io-b")]
    cluster.worker("wide", extra=["--concurrency", "16"])
    wait_for(lambda: all(members_of(client, q.name) == ["wide"] for q in queues), 30, "members")
    started = time.monotonic()
    jobs = [
        q.enqueue("tests.handlers:async_sleep", {"seconds": 0.5}) for q in queues for _ in range(8)
    ]
    assert results_of(jobs, 30) == [0.5] * 16
    assert time.monotonic() - started < 4.0  # one at a time: 8 s


@pytest.mark.system
def test_queues_flag_allow_and_selector_decide_which_queues_a_worker_serves(
    cluster: Cluster, client: Client
) -> None:
    named = client.queue("named")
    other = client.queue("other")
    gpu = client.queue("gpu", node_selector={"gpu": "1"})
    foreign = client.queue("foreign")
    foreign.enqueue("elsewhere.jobs:run", {})  # a handler no worker here may run
    cluster.worker("narrow", extra=["--queues", "named,gpu"])
    cluster.worker("plain")
    wait_for(lambda: members_of(client, "other") == ["plain"], 30, "plain joins other")
    wait_for(lambda: members_of(client, "named") == ["narrow", "plain"], 30, "both join named")
    assert members_of(client, "gpu") == []  # neither has the label
    assert members_of(client, "foreign") == []  # nobody's --allow covers its handler
    job = other.enqueue("tests.handlers:double", {"x": 4})
    assert job.result(timeout=20) == 8
    assert named.enqueue("tests.handlers:double", {"x": 5}).result(timeout=20) == 10
    assert gpu.status().backlog == 0 and foreign.status().backlog == 1
    records = {w.id: w for w in client.workers()}
    assert records["narrow"].queues == ["named", "gpu"] or sorted(
        records["narrow"].queues or []
    ) == ["gpu", "named"]
    assert records["narrow"].member_of == ["named"]
    assert records["plain"].member_of == ["named", "other"]


@pytest.mark.system
def test_max_nodes_caps_a_queues_members(cluster: Cluster, client: Client) -> None:
    capped = client.queue("capped", max_nodes=1)
    client.queue("free")
    cluster.worker("a")
    cluster.worker("b")
    wait_for(lambda: members_of(client, "free") == ["a", "b"], 30, "both join free")
    assert len(members_of(client, "capped")) == 1
    jobs = capped.enqueue_many(("tests.handlers:double", {"x": i}) for i in range(50))
    assert results_of(jobs) == [2 * i for i in range(50)]
    assert len(members_of(client, "capped")) == 1


@pytest.mark.system
def test_a_worker_killed_mid_job_loses_nothing_in_any_of_its_queues(
    cluster: Cluster, client: Client, r: redis.Redis, prefix: str
) -> None:
    """Two workers serve two queues; one is SIGKILLed while jobs of both run: every job
    finishes, each counted once, and the survivor serves both queues."""
    queues = [client.queue("k1"), client.queue("k2")]
    victim = cluster.worker("victim")
    cluster.worker("survivor")
    wait_for(
        lambda: all(members_of(client, q.name) == ["survivor", "victim"] for q in queues),
        30,
        "both members of both",
    )
    log = f"{prefix}:test:log"
    jobs = [
        q.enqueue("tests.handlers:job_logged", {"x": i, "log": log, "seconds": 0.05})
        for i in range(40)
        for q in queues
    ]
    wait_for(lambda: r.llen(log) >= 10, 30, "jobs running")
    victim.kill()
    assert results_of(jobs) == [2 * i for i in range(40) for _ in queues]
    for q in queues:
        status = q.status()
        assert (status.done, status.dead) == (40, 0)
    wait_for(lambda: all(members_of(client, q.name) == ["survivor"] for q in queues), 20, "pruned")


@pytest.mark.system
def test_sigterm_leaves_every_queue_at_once(cluster: Cluster, client: Client) -> None:
    queues = [client.queue(f"t{i}") for i in range(3)]
    leaving = cluster.worker("leaving")
    cluster.worker("staying")
    wait_for(lambda: all(len(members_of(client, q.name)) == 2 for q in queues), 30, "members")
    assert leaving.terminate() == 0
    # a leave, not a prune: no heartbeat TTL to wait out
    wait_for(lambda: all(members_of(client, q.name) == ["staying"] for q in queues), 2, "left")


@pytest.mark.system
def test_the_worker_record_says_serving_with_its_queues(cluster: Cluster, client: Client) -> None:
    client.queue("shown")
    cluster.worker("shower")
    wait_for(lambda: [w.member_of for w in client.workers()] == [["shown"]], 30, "member_of")
    (record,) = client.workers()
    assert record.state == "serving" and record.task is None
    client.queue("shown").task.cancel()
    wait_for(
        lambda: [(w.state, w.member_of) for w in client.workers()] == [("idle", [])], 30, "idle"
    )


@pytest.mark.system
def test_a_task_takes_a_worker_whole_and_gives_it_back_to_its_queues(
    cluster: Cluster, client: Client, r: redis.Redis, keys: Keys
) -> None:
    """Two workers serve two busy queues; a task of the same priority starts at once on the
    worker the queues do not guard (their min_nodes, 1, is met by the other), the queues
    keep finishing jobs meanwhile, and when the task ends its worker rejoins both."""
    cluster.controller()
    cluster.worker("wa")
    cluster.worker("wb")
    queues = [client.queue("busy-1"), client.queue("busy-2")]
    wait_for(lambda: all(members_of(client, q.name) == ["wa", "wb"] for q in queues), 30, "members")
    slow = {"x": 1, "seconds": 0.02}
    for q in queues:
        q.enqueue_many(("tests.handlers:double_slow", slow) for _ in range(200))
    task = client.submit(
        TaskSpec(
            name="batch",
            handler="tests.handlers:double_slow",
            subtasks=[{"x": i, "seconds": 0.01} for i in range(100)],
        )
    )
    wait_for(lambda: task.status().nodes, 10, "the task's node")
    (node,) = task.status().nodes
    assert node.worker == "wb"  # wa is the one the queues guard (the lowest id)
    done_before = [q.status().done for q in queues]
    assert task.wait(timeout=60).state == TaskState.COMPLETED
    assert all(q.status().done > before for q, before in zip(queues, done_before, strict=True))
    wait_for(
        lambda: all(members_of(client, q.name) == ["wa", "wb"] for q in queues), 30, "rejoined"
    )


@pytest.mark.system
def test_a_queue_of_higher_priority_takes_a_worker_from_a_running_task(
    cluster: Cluster, client: Client, r: redis.Redis
) -> None:
    """Both workers run a low-priority task when an urgent queue appears: it takes one of
    them (the task's surplus), its jobs run, and the task finishes on the other."""
    cluster.controller()
    cluster.worker("wa")
    cluster.worker("wb")
    cluster.wait_workers(r, 2)
    task = client.submit(
        TaskSpec(
            name="long",
            handler="tests.handlers:double_slow",
            subtasks=[{"x": i, "seconds": 0.05} for i in range(120)],
        )
    )
    wait_for(lambda: len(task.status().nodes) == 2, 20, "the task on both workers")
    urgent = client.queue("urgent", priority=5)
    assert urgent.enqueue("tests.handlers:double", {"x": 21}).result(timeout=20) == 42
    assert len(members_of(client, "urgent")) == 1
    assert len(task.status().nodes) == 1
    assert task.wait(timeout=60).state == TaskState.COMPLETED


@pytest.mark.system
def test_each_queues_job_timeout_holds_for_its_own_jobs_in_the_pool(
    cluster: Cluster, client: Client
) -> None:
    """--concurrency 4 runs plain functions on pool threads: a job keeps its own queue's
    job_timeout while a job of a queue with a shorter one starts beside it."""
    patient = client.queue("patient", job_timeout=30.0)
    strict = client.queue("strict", job_timeout=1.0, max_attempts=1)
    cluster.worker("pool", extra=["--concurrency", "4"])
    wait_for(lambda: members_of(client, "strict") == ["pool"], 30, "members")
    slow = patient.enqueue("tests.handlers:sleep_for", {"seconds": 3.0})
    wait_for(lambda: slow.status().state == "running", 20, "the patient job running")
    stuck = strict.enqueue("tests.handlers:sleep_for", {"seconds": 10.0})
    with pytest.raises(JobFailed):
        stuck.result(timeout=20)
    assert "ran past job_timeout (1.0 s)" in (stuck.status().error or "")
    assert slow.result(timeout=20) is None
    assert slow.status().attempts == 1
