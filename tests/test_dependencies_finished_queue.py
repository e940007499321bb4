"""Jobs that wait for a job of a queue that finishes (cancelled, failed) before that job has
an outcome: they die (never run), naming the dependency and what became of its queue, in
the step that finishes the queue — not left deferred for ever. Real Redis; the system test
runs real worker and controller processes."""

from __future__ import annotations

import time
from typing import Any

import pytest
import redis

from queueworks import Client
from queueworks.errors import JobFailed
from queueworks.protocol.keys import Keys
from queueworks.protocol.models import JobState, TaskState
from queueworks.scripts.calls import DRAIN_BATCH
from queueworks.task.dependencies import plan_task_backstop
from queueworks.transport.runner import run
from tests.conftest import Cluster, wait_for

DOUBLE = "tests.handlers:double"
LOGGED = "tests.handlers:job_logged"
UNSERVED = "queueworks.examples:double"  # outside the worker's allowed prefixes: set aside


def state_of(job: Any) -> JobState:
    return job.status().state


def dead_letter_ids(r: redis.Redis, keys: Keys, queue: str) -> set[str]:
    return {f[b"job"].decode() for _, f in r.xrange(keys.task(queue).dead)}


@pytest.mark.system
def test_cancelling_a_queue_kills_the_jobs_waiting_for_its_unfinished_ones(
    cluster: Cluster, client: Client, r: redis.Redis, keys: Keys
) -> None:
    cluster.controller()
    cluster.worker(allow=("tests.handlers",))
    cluster.wait_workers(r, 1)
    a, b, c = client.queue("fq-a"), client.queue("fq-b"), client.queue("fq-c")
    log = f"{cluster.prefix}:log"
    finished = a.enqueue(DOUBLE, {"x": 1})
    assert finished.result(timeout=30) == 2
    delayed = a.enqueue(DOUBLE, {"x": 2}, delay=3600)
    unserved = a.enqueue(UNSERVED, {"x": 3})
    wait_for(lambda: unserved.status().reason, 15, "the unserved job's reason")
    assert state_of(unserved) == JobState.QUEUED and state_of(delayed) == JobState.SCHEDULED
    after_done = b.enqueue(LOGGED, {"x": 4, "log": log}, depends_on=[finished])
    on_delayed = b.enqueue(LOGGED, {"x": 5, "log": log}, depends_on=[delayed])
    on_unserved = b.enqueue(LOGGED, {"x": 6, "log": log}, depends_on=[unserved, finished])
    cascade = c.enqueue(LOGGED, {"x": 7, "log": log}, depends_on=[on_delayed])
    own = a.enqueue(DOUBLE, {"x": 8}, depends_on=[delayed])  # of the queue itself
    assert after_done.result(timeout=30) == 8  # released at the settle of `finished`
    assert state_of(on_delayed) == JobState.DEFERRED == state_of(on_unserved)

    assert a.task.cancel()
    start = time.monotonic()
    for job, dep in ((on_delayed, delayed), (on_unserved, unserved)):
        with pytest.raises(JobFailed, match=f"dependency fq-a/{dep.id}: its queue was cancelled"):
            job.result(timeout=5)
    with pytest.raises(JobFailed, match=f"dependency fq-b/{on_delayed.id}: dead: dependency"):
        cascade.result(timeout=5)
    assert time.monotonic() - start < 5
    assert [x.decode().split("|")[0] for x in r.lrange(log, 0, -1)] == [after_done.id]
    assert dead_letter_ids(r, keys, "fq-b") == {on_delayed.id, on_unserved.id}  # requeueable
    assert dead_letter_ids(r, keys, "fq-c") == {cascade.id}
    assert b.status().deferred == 0 and c.status().deferred == 0
    assert state_of(own) == JobState.DEFERRED  # frozen with its queue (a reopen goes on)
    assert b.status().dead == 2 and c.status().dead == 1
    assert r.hlen(keys.task("fq-a").waiters) == 1 and r.llen(keys.task("fq-a").released) == 0
    assert b.requeue_dead() == 2  # they then run without waiting
    assert on_delayed.result(timeout=30) == 10 and on_unserved.result(timeout=30) == 12


@pytest.mark.integration
def test_many_waiters_of_a_cancelled_queue_die_in_batches(
    client: Client, r: redis.Redis, keys: Keys
) -> None:
    a, b = client.queue("fq-many-a"), client.queue("fq-many-b")
    deps = [a.enqueue(DOUBLE, {"x": i}) for i in range(2 * DRAIN_BATCH + 30)]
    waiting = [b.enqueue(DOUBLE, {"x": i}, depends_on=[d]) for i, d in enumerate(deps)]
    frozen = [a.enqueue(DOUBLE, {"x": i}, depends_on=[d]) for i, d in enumerate(deps[:50])]
    assert b.status().deferred == len(waiting)
    assert a.task.cancel()
    assert b.status().deferred == 0 and b.status().dead == len(waiting)
    assert a.status().deferred == len(frozen) and a.status().dead == 0  # its own: frozen
    assert all(state_of(j) == JobState.DEAD for j in waiting[:: DRAIN_BATCH // 2])
    assert r.hlen(keys.task("fq-many-a").waiters) == len(frozen)
    assert r.llen(keys.task("fq-many-a").released) == 0
    client.queue("fq-many-a", reopen=True)  # its jobs are its own again
    assert all(state_of(j) == JobState.DEFERRED for j in frozen)
    assert deps[0].cancel() and state_of(frozen[0]) == JobState.DEAD  # released as usual
    assert state_of(waiting[0]) == JobState.DEAD  # died at the cancel: stays dead


@pytest.mark.integration
def test_the_backstop_buries_the_waiters_of_a_queue_finished_without_a_drain(
    client: Client, r: redis.Redis, keys: Keys
) -> None:
    """A writer that finished the queue and died (or the controller, which does not drain):
    the leaders' backstop of ``Keys.dep_tasks`` moves what is left and releases it."""
    a, b = client.queue("fq-lost-a"), client.queue("fq-lost-b")
    deps = [a.enqueue(DOUBLE, {"x": i}) for i in range(6 * DRAIN_BATCH)]  # > a listpack
    waiting = [b.enqueue(DOUBLE, {"x": i}, depends_on=[d]) for i, d in enumerate(deps)]
    assert b"fq-lost-a" in r.smembers(keys.dep_tasks)
    tk = keys.task("fq-lost-a")
    assert client.scripts.set_state(tk, TaskState.FAILED, time.time(), "boom")  # no drain
    assert 0 < r.hlen(tk.waiters) < len(deps) and r.llen(tk.released) > 0  # one step moved
    assert b.status().deferred == len(waiting)
    for _ in range(5):  # a few passes (it looks at a few tasks at random each)
        run(r, client.scripts, plan_task_backstop(keys))
    assert b.status().deferred == 0 and b.status().dead == len(waiting)
    with pytest.raises(JobFailed, match=f"dependency fq-lost-a/{deps[-1].id}: its queue failed"):
        waiting[-1].result(timeout=1)
    assert r.hlen(tk.waiters) == 0 and r.llen(tk.released) == 0
    assert b"fq-lost-a" not in r.smembers(keys.dep_tasks)  # nothing can wait for it any more


@pytest.mark.integration
def test_a_job_of_a_finished_queue_is_a_dead_dependency_at_once(client: Client) -> None:
    a, b = client.queue("fq-late-a"), client.queue("fq-late-b")
    dep = a.enqueue(DOUBLE, {"x": 1})
    assert a.task.cancel()
    late = b.enqueue(DOUBLE, {"x": 2}, depends_on=[dep])
    assert state_of(late) == JobState.DEAD
    with pytest.raises(JobFailed, match=f"dependency fq-late-a/{dep.id}: its queue was cancelled"):
        late.result(timeout=1)
