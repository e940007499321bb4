"""Jobs that wait for others (``depends_on``): deferred until every dependency is done, dead
(never run) when one is not, released where the dependency's outcome is written — never
polled. Real Redis; the system tests run real worker and controller processes."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
import redis

from queueworks import AsyncClient, Client, TaskSpec
from queueworks.errors import JobFailed
from queueworks.protocol.keys import Keys
from queueworks.protocol.models import JobState
from queueworks.task.dependencies import MAX_DEPENDENCIES, plan_drain
from queueworks.transport.runner import run, send_trip
from tests.conftest import Cluster, wait_for

DOUBLE = "tests.handlers:double"
LOGGED = "tests.handlers:job_logged"


def state_of(job: Any) -> JobState:
    return job.status().state


def ran(r: redis.Redis, log: str) -> list[str]:
    """The job ids ``job_logged`` logged, in the order they started."""
    return [x.decode().split("|")[0] for x in r.lrange(log, 0, -1)]


# -- without workers: the Lua steps, the checks -------------------------------------------------


@pytest.mark.integration
def test_a_deferred_job_waits_and_says_for_what(client: Client, r: redis.Redis, keys: Keys) -> None:
    q = client.queue("deps-wait")
    a = q.enqueue(DOUBLE, {"x": 1})
    b = q.enqueue(DOUBLE, {"x": 2})
    c = q.enqueue(DOUBLE, {"x": 3}, depends_on=[a, f"deps-wait/{b.id}"])
    status = c.status()
    assert status.state == JobState.DEFERRED
    assert status.waits_for == sorted([f"deps-wait/{a.id}", f"deps-wait/{b.id}"])
    assert status.reason is not None and status.reason.startswith("waits for 2 of 2")
    assert q.status().deferred == 1 and q.status().backlog == 2
    assert r.xlen(keys.task("deps-wait").stream) == 2  # not on the stream while it waits
    with pytest.raises(TimeoutError, match="deferred"):
        c.result(timeout=0.2)


@pytest.mark.integration
def test_bad_dependencies_are_refused_and_leave_nothing(
    client: Client, r: redis.Redis, keys: Keys
) -> None:
    q = client.queue("deps-bad")
    a = q.enqueue(DOUBLE, {"x": 1})
    tk = keys.task("deps-bad")
    with pytest.raises(ValueError, match="no job 'ffff' in queue 'deps-bad'"):
        q.enqueue(DOUBLE, {"x": 2}, depends_on=[a, "deps-bad/ffff"])
    with pytest.raises(ValueError, match="no task 'nope'"):
        q.enqueue(DOUBLE, {"x": 2}, depends_on=["task:nope"])
    with pytest.raises(ValueError, match="neither 'QUEUE/JOB_ID'"):
        q.enqueue(DOUBLE, {"x": 2}, depends_on=["just-a-name"])
    with pytest.raises(ValueError, match="no job id"):
        q.enqueue(DOUBLE, {"x": 2}, depends_on=["deps-bad/not hex"])
    with pytest.raises(ValueError, match="empty"):
        q.enqueue(DOUBLE, {"x": 2}, depends_on=[])
    with pytest.raises(ValueError, match=f"at most {MAX_DEPENDENCIES}"):
        q.enqueue(DOUBLE, depends_on=[f"deps-bad/{i:04x}" for i in range(MAX_DEPENDENCIES + 1)])
    with pytest.raises(ValueError, match="no delay or at"):
        q.enqueue(DOUBLE, {"x": 2}, depends_on=[a], delay=5)
    with pytest.raises(ValueError, match="is no job, task"):
        q.enqueue(DOUBLE, {"x": 2}, depends_on=[3])
    assert q.status().deferred == 0
    assert not r.keys(f"{tk.job_prefix}*") and not r.keys(tk.deps("*"))  # nothing left of them
    # (its registration at a stays until a settles: that release finds no job, counts nothing)
    assert r.xlen(tk.stream) == 1


@pytest.mark.integration
def test_a_cycle_is_refused(client: Client, r: redis.Redis, keys: Keys) -> None:
    """A new job cannot be named before it exists: a job naming itself (as a unique key's
    existing job could) is refused at its registration."""
    from queueworks.queue.queue_plans import plan_defer
    from queueworks.queue.queues import new_job
    from queueworks.task.dependencies import Dependency, plan_register

    q = client.queue("deps-cycle")
    job_id = run(r, client.scripts, plan_defer(q.ref, new_job(DOUBLE, {}, None, None), []))
    with pytest.raises(ValueError, match=f"cycle: deps-cycle/{job_id} -> deps-cycle/{job_id}"):
        run(r, client.scripts, plan_register(keys, q.keys, job_id, [Dependency(q.name, job_id)]))


@pytest.mark.integration
@pytest.mark.parametrize("turns", ["a-first", "b-first", "in-turns"])
def test_a_two_cycle_of_racing_clients_is_refused(
    client: Client, r: redis.Redis, keys: Keys, monkeypatch: pytest.MonkeyPatch, turns: str
) -> None:
    """Two clients that chose their jobs' ids enqueue a -> b and b -> a at once (each job
    written before either registers), their round trips in any order: neither is left
    deferred: a registration that finds the other job waiting for its own is refused as a
    cycle, and one that finds the other taken back as no such job."""
    from queueworks.queue import queue_plans
    from queueworks.queue.queue_plans import plan_defer
    from queueworks.queue.queues import new_job
    from queueworks.task.dependencies import Dependency

    qa, qb = client.queue("deps-2cycle-a"), client.queue("deps-2cycle-b")
    ids = iter(["aaaa", "bbbb"])
    monkeypatch.setattr(queue_plans, "new_job_id", lambda: next(ids))
    halves = [
        plan_defer(qa.ref, new_job(DOUBLE, {"x": 1}, None, None), [Dependency(qb.name, "bbbb")]),
        plan_defer(qb.ref, new_job(DOUBLE, {"x": 2}, None, None), [Dependency(qa.name, "aaaa")]),
    ]
    trips: list[Any] = [next(halves[0]), next(halves[1])]
    order = {"a-first": [0] * 9 + [1] * 9, "b-first": [1] * 9 + [0] * 9, "in-turns": [0, 1] * 9}
    ended: list[Any] = [None, None]
    for i in [0, 1] + order[turns]:  # both written (state deferred), then the rest
        if trips[i] is None:
            continue
        try:
            trips[i] = halves[i].send(send_trip(r, client.scripts, trips[i]))
        except StopIteration as stop:
            trips[i], ended[i] = None, stop.value
        except ValueError as exc:
            trips[i], ended[i] = None, exc
    assert trips == [None, None] and all(isinstance(e, ValueError) for e in ended), ended
    a_b_a = "cycle: deps-2cycle-a/aaaa -> deps-2cycle-b/bbbb -> deps-2cycle-a/aaaa"
    b_a_b = "cycle: deps-2cycle-b/bbbb -> deps-2cycle-a/aaaa -> deps-2cycle-b/bbbb"
    gone = "no job"
    expected = {"a-first": (a_b_a, gone), "b-first": (gone, b_a_b), "in-turns": (a_b_a, b_a_b)}
    for said, want in zip(ended, expected[turns], strict=True):
        assert want in str(said), said
    assert qa.status().deferred == 0 and qb.status().deferred == 0
    for q, job_id in ((qa, "aaaa"), (qb, "bbbb")):
        with pytest.raises(LookupError):
            q.job(job_id).status()
        assert not r.exists(q.keys.deps(job_id))


@pytest.mark.integration
def test_an_entry_id_is_refused_naming_its_job(client: Client, r: redis.Redis, keys: Keys) -> None:
    """A delayed (or retried, requeued) job that is back on the stream has an entry of its
    own (``job.detail().entry``): naming it is refused with the job's id, never accepted to
    wait for a release that comes under the job's id."""
    q = client.queue("deps-entry")
    tk = keys.task("deps-entry")
    a = q.enqueue(DOUBLE, {"x": 1}, delay=3600)
    assert client.scripts.promote_due(tk, [a.id]) == 1  # due: an entry naming it
    entry = a.detail().entry
    assert entry is not None and entry != a.id
    with pytest.raises(ValueError, match=f"entry of job deps-entry/{a.id}"):
        q.enqueue(DOUBLE, {"x": 2}, depends_on=[f"deps-entry/{entry}"])
    assert q.status().deferred == 0 and not r.keys(tk.deps("*"))
    b = q.enqueue(DOUBLE, {"x": 2}, depends_on=[f"deps-entry/{a.id}"])  # by its id: waits
    assert state_of(b) == JobState.DEFERRED


@pytest.mark.integration
def test_cancel_cascades_and_a_cancelled_deferred_job_never_runs(
    client: Client, r: redis.Redis, keys: Keys
) -> None:
    q, other = client.queue("deps-cancel"), client.queue("deps-cancel-2")
    a = q.enqueue(DOUBLE, {"x": 1})
    b = other.enqueue(DOUBLE, {"x": 2}, depends_on=[a])
    c = q.enqueue(DOUBLE, {"x": 3}, depends_on=[b])
    d = other.enqueue(DOUBLE, {"x": 4}, depends_on=[a])
    assert d.cancel()  # a deferred job: cancelled, its registration at a counts nothing
    assert state_of(d) == JobState.CANCELLED
    assert a.cancel()
    assert state_of(b) == JobState.DEAD and state_of(c) == JobState.DEAD
    with pytest.raises(JobFailed, match=f"dependency deps-cancel/{a.id}: cancelled"):
        b.result(timeout=1)
    with pytest.raises(JobFailed, match=f"dependency deps-cancel-2/{b.id}: dead: dependency"):
        c.result(timeout=1)
    assert other.status().dead == 1 and q.status().dead == 1  # d is cancelled, not dead
    assert other.status().deferred == 0 and q.status().deferred == 0
    dead = r.xrange(keys.task("deps-cancel-2").dead)
    assert [f[b"job"].decode() for _, f in dead] == [b.id]  # it can be requeued from there
    assert r.xlen(keys.task("deps-cancel-2").stream) == 0  # never on the stream


@pytest.mark.integration
def test_a_dependency_with_an_outcome_releases_at_once(client: Client, keys: Keys) -> None:
    q = client.queue("deps-now")
    a = q.enqueue(DOUBLE, {"x": 1})
    assert a.cancel()
    b = q.enqueue(DOUBLE, {"x": 2}, depends_on=[a])
    assert state_of(b) == JobState.DEAD
    task = client.submit(TaskSpec(name="t", handler=DOUBLE, subtasks=[]), task_id="deps-empty")
    wait_for(lambda: task.status().finished, 10, "the empty task to complete")
    c = q.enqueue(DOUBLE, {"x": 3}, depends_on=[task])
    assert state_of(c) == JobState.QUEUED  # the task completed: it runs at once
    assert q.status().backlog == 1


@pytest.mark.integration
def test_the_backstop_drains_an_outbox_left_behind(
    client: Client, r: redis.Redis, keys: Keys
) -> None:
    """A drainer that died between the outcome and the release leaves items in the
    outbox: ``plan_drain`` (the leader's backstop) releases them, each once."""
    q = client.queue("deps-outbox")
    a = q.enqueue(DOUBLE, {"x": 1})
    b = q.enqueue(DOUBLE, {"x": 2}, depends_on=[a])
    tk = keys.task("deps-outbox")
    r.hdel(tk.waiters, a.id)  # as the settle of a moves it...
    item = f"deps-outbox/{b.id}\t{a.id}\tdone\t"
    r.rpush(tk.released, item, item)  # ...to the outbox (twice: the second counts nothing)
    assert run(r, client.scripts, plan_drain(keys, ["deps-outbox"])) == 1
    assert state_of(b) == JobState.QUEUED and r.llen(tk.released) == 0
    assert q.status().backlog == 2


@pytest.mark.integration
def test_async_client_defers_and_cancels(redis_url: str, prefix: str) -> None:
    async def main() -> None:
        client = AsyncClient.from_url(redis_url, prefix=prefix)
        try:
            q = await client.queue("deps-aio")
            a = await q.enqueue(DOUBLE, {"x": 1})
            b = await q.enqueue(DOUBLE, {"x": 2}, depends_on=[a])
            assert (await b.status()).state == JobState.DEFERRED
            assert (await q.status()).deferred == 1
            with pytest.raises(ValueError, match="no job"):
                await q.enqueue(DOUBLE, {"x": 2}, depends_on=["deps-aio/abc"])
            assert await a.cancel()
            with pytest.raises(JobFailed, match="cancelled"):
                await b.result(timeout=2)
        finally:
            await client.close()

    asyncio.run(main())


# -- with workers -------------------------------------------------------------------------------


@pytest.mark.system
def test_b_waits_for_a_then_runs(cluster: Cluster, client: Client, r: redis.Redis) -> None:
    cluster.controller()
    cluster.worker()
    cluster.wait_workers(r, 1)
    q = client.queue("deps-ab")
    log = f"{cluster.prefix}:log"
    a = q.enqueue(LOGGED, {"x": 1, "log": log, "seconds": 1.0})
    b = q.enqueue(LOGGED, {"x": 2, "log": log}, depends_on=[a])
    wait_for(lambda: state_of(a) == JobState.RUNNING, 30, "a to run")
    assert state_of(b) == JobState.DEFERRED
    assert b.result(timeout=30) == 4
    assert ran(r, log) == [a.id, b.id]
    assert b.status().started_at >= a.status().finished_at  # type: ignore[operator]


@pytest.mark.system
def test_a_delayed_job_is_waited_for_by_its_id_not_its_entry(
    cluster: Cluster, client: Client, r: redis.Redis
) -> None:
    """A delayed job that a worker runs has an entry other than its id: a dependent named
    by the entry would wait for a release that comes under the id: it is refused, naming
    the id; named by the id, it runs once the job is done."""
    cluster.controller()
    cluster.worker()
    cluster.wait_workers(r, 1)
    q = client.queue("deps-delayed")
    log = f"{cluster.prefix}:log"
    a = q.enqueue(LOGGED, {"x": 1, "log": log, "seconds": 1.0}, delay=0.2)
    wait_for(lambda: state_of(a) == JobState.RUNNING, 30, "a to run")
    entry = a.detail().entry
    assert entry is not None and entry != a.id
    with pytest.raises(ValueError, match=f"name the job: 'deps-delayed/{a.id}'"):
        q.enqueue(LOGGED, {"x": 2, "log": log}, depends_on=[f"deps-delayed/{entry}"])
    b = q.enqueue(LOGGED, {"x": 2, "log": log}, depends_on=[f"deps-delayed/{a.id}"])
    assert state_of(b) == JobState.DEFERRED
    assert b.result(timeout=30) == 4
    assert ran(r, log) == [a.id, b.id]


@pytest.mark.system
def test_fan_in_across_queues_and_a_task_callback(
    cluster: Cluster, client: Client, r: redis.Redis
) -> None:
    cluster.controller()
    cluster.worker()
    cluster.worker()
    cluster.wait_workers(r, 2)
    q1, q2, cb = client.queue("deps-in1"), client.queue("deps-in2"), client.queue("deps-cb")
    log = f"{cluster.prefix}:log"
    jobs = [(q1 if i % 2 else q2).enqueue(LOGGED, {"x": i, "log": log}) for i in range(5)]
    callback = cb.enqueue(LOGGED, {"x": 10, "log": log}, depends_on=jobs)
    assert callback.result(timeout=60) == 20
    assert ran(r, log)[-1] == callback.id and len(ran(r, log)) == 6
    task = client.submit(
        TaskSpec(
            name="batch",
            handler="tests.handlers:double_slow",
            subtasks=[{"x": i, "seconds": 0.05} for i in range(20)],
        )
    )
    after = cb.enqueue(LOGGED, {"x": 11, "log": log}, depends_on=[task])
    assert state_of(after) == JobState.DEFERRED
    assert after.result(timeout=60) == 22
    assert task.status().state == "completed"


@pytest.mark.system
def test_a_dead_dependency_kills_the_chain_never_run(
    cluster: Cluster, client: Client, r: redis.Redis
) -> None:
    cluster.controller()
    cluster.worker()
    cluster.wait_workers(r, 1)
    q = client.queue("deps-dead", max_attempts=1)
    log = f"{cluster.prefix}:log"
    a = q.enqueue("tests.handlers:always_fails", {})
    b = q.enqueue(LOGGED, {"x": 1, "log": log}, depends_on=[a])
    c = client.queue("deps-dead-2").enqueue(LOGGED, {"x": 2, "log": log}, depends_on=[b])
    with pytest.raises(JobFailed, match=f"dependency deps-dead/{a.id}: dead: failed"):
        b.result(timeout=30)
    with pytest.raises(JobFailed, match=f"dependency deps-dead/{b.id}: dead"):
        c.result(timeout=30)
    assert ran(r, log) == []
    assert q.status().dead == 2 and client.queue("deps-dead-2").status().dead == 1


@pytest.mark.system
def test_a_failed_or_cancelled_task_kills_its_callback(
    cluster: Cluster, client: Client, r: redis.Redis
) -> None:
    cluster.controller()
    cluster.worker()
    cluster.worker()  # one for the queue (its min_nodes), one for the task
    cluster.wait_workers(r, 2)
    q = client.queue("deps-task")
    failing = client.submit(
        TaskSpec(
            name="f",
            handler="tests.handlers:always_fails",
            subtasks=[{}],
            max_attempts=1,
            max_dead=0,
        )
    )
    slow = [{"x": i, "seconds": 1.0} for i in range(10)]
    hold = client.submit(TaskSpec(name="h", handler="tests.handlers:double_slow", subtasks=slow))
    on_fail = q.enqueue(DOUBLE, {"x": 1}, depends_on=[failing])
    on_cancel = q.enqueue(DOUBLE, {"x": 2}, depends_on=[hold])
    assert state_of(on_cancel) == JobState.DEFERRED
    assert hold.cancel()
    with pytest.raises(JobFailed, match=f"dependency {hold.id}: task cancelled"):
        on_cancel.result(timeout=10)
    with pytest.raises(JobFailed, match=f"dependency {failing.id}: task failed"):
        on_fail.result(timeout=60)


@pytest.mark.system
def test_deferred_jobs_survive_restarts_and_a_lost_release(
    cluster: Cluster, client: Client, r: redis.Redis, keys: Keys
) -> None:
    cluster.controller()
    w = cluster.worker()
    cluster.wait_workers(r, 1)
    q = client.queue("deps-restart")
    log = f"{cluster.prefix}:log"
    a = q.enqueue(LOGGED, {"x": 1, "log": log, "seconds": 0.5})
    b = q.enqueue(LOGGED, {"x": 2, "log": log}, depends_on=[a])
    wait_for(lambda: state_of(a) == JobState.RUNNING, 30, "a to run")
    w.kill()  # mid-a: a is reclaimed and runs again; b still waits
    assert state_of(b) == JobState.DEFERRED
    cluster.worker()
    assert b.result(timeout=60) == 4
    # a settle whose worker died before draining: its outbox item is left; the leader's
    # backstop releases it
    c = q.enqueue(LOGGED, {"x": 3, "log": log}, depends_on=[f"deps-restart/{a.id}", b])
    assert state_of(c) != JobState.DEFERRED  # both done already: on the stream at once
    d = q.enqueue(DOUBLE, {"x": 4})
    assert d.result(timeout=30) == 8
    tk = keys.task("deps-restart")
    e_dep = client.submit(TaskSpec(name="t", handler=DOUBLE, subtasks=[]), task_id="deps-t")
    wait_for(lambda: e_dep.status().finished, 10, "the empty task")
    r.hset(keys.task("deps-t").record, "state", "running")  # as if it had not finished
    e = q.enqueue(DOUBLE, {"x": 5}, depends_on=[e_dep])
    r.hset(keys.task("deps-t").record, "state", "completed")  # finished; its drain "lost"
    r.hdel(keys.task("deps-t").waiters, "*")
    r.rpush(keys.task("deps-t").released, f"deps-restart/{e.id}\t*\tdone\t")
    assert state_of(e) == JobState.DEFERRED
    assert e.result(timeout=30) == 10  # the backstop (every 2 s) found it
    assert r.llen(tk.released) == 0


@pytest.mark.system
def test_a_deferred_job_costs_no_command_while_it_waits(
    cluster: Cluster, client: Client, r: redis.Redis, keys: Keys
) -> None:
    """Nobody polls a deferred job: over a few seconds with a worker serving its queue,
    no command touches its record or its dependency set (MONITOR sees every command)."""
    cluster.controller()
    cluster.worker()
    cluster.wait_workers(r, 1)
    q = client.queue("deps-idle")
    dep = client.submit(
        TaskSpec(name="d", handler="tests.handlers:hang", subtasks=[{}], priority=-100)
    )  # no worker to spare: it waits
    b = q.enqueue(DOUBLE, {"x": 2}, depends_on=[dep])
    assert q.enqueue(DOUBLE, {"x": 3}).result(timeout=30) == 6  # the queue is served
    watched = (keys.task("deps-idle").job(b.id), keys.task("deps-idle").deps(b.id))
    seen: list[str] = []
    with r.monitor() as m:
        end = time.monotonic() + 3.0
        for cmd in m.listen():
            if any(k in cmd["command"] for k in watched):
                seen.append(cmd["command"])
            if time.monotonic() > end:
                break
    assert seen == []
    assert state_of(b) == JobState.DEFERRED
    assert dep.cancel()
    with pytest.raises(JobFailed, match="task cancelled"):
        b.result(timeout=10)


@pytest.mark.integration
def test_cli_info_and_dashboard_show_deferred_jobs(
    client: Client, redis_url: str, prefix: str
) -> None:
    from queueworks.dashboard.queue_reader import QueueReader
    from tests.test_cli import cli

    q = client.queue("deps-cli")
    a = q.enqueue(DOUBLE, {"x": 1})
    task = client.submit(TaskSpec(name="t", handler=DOUBLE, subtasks=[{"x": 1}]), task_id="deps-ct")
    done = cli(
        [
            "enqueue",
            "deps-cli",
            DOUBLE,
            "--json",
            '{"x": 2}',
            "--depends-on",
            f"deps-cli/{a.id}",
            "--depends-on",
            "task:deps-ct",
        ],
        redis_url,
        prefix,
    )
    assert done.returncode == 0, done.stderr
    job = q.job(done.stdout.strip())
    status = job.status()
    assert status.state == JobState.DEFERRED
    assert status.waits_for == sorted([f"deps-cli/{a.id}", task.id])
    bad = cli(["enqueue", "deps-cli", DOUBLE, "--depends-on", "deps-cli/abc"], redis_url, prefix)
    assert bad.returncode != 0 and "no job 'abc' in queue 'deps-cli'" in bad.stderr
    shown = cli(["info"], redis_url, prefix)
    line = next(x for x in shown.stdout.splitlines() if x.strip().startswith("deps-cli "))
    assert "deferred=1" in line and "backlog=1" in line, line
    assert QueueReader(client).summary("deps-cli").deferred == 1
