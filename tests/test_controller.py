"""Issue 4: node sets sized from free resources, resized live, preemption, failover."""

from __future__ import annotations

import time
from typing import Any

import pytest
import redis

from queueworks import Client, TaskSpec, TaskState
from queueworks.protocol.keys import Keys
from tests.conftest import Cluster, wait_for

pytestmark = pytest.mark.system

REACT = 10.0  # s: a generous bound on the controller's reaction (milliseconds when idle)


def slow(client: Client, n: int, seconds: float = 0.01, **kw: Any) -> Any:
    return client.submit(
        TaskSpec(
            name=kw.pop("name", "slow"),
            handler="tests.handlers:double_slow",
            subtasks=({"x": i, "seconds": seconds} for i in range(n)),
            **kw,
        )
    )


def nodes(task: Any) -> int:
    return len(task.status().nodes)


def assert_right(task: Any, n: int) -> None:
    st = task.status()
    assert st.state == TaskState.COMPLETED and (st.done, st.dead) == (n, 0), st
    assert {i: v["y"] for i, v in task.results()} == {i: 2 * i for i in range(n)}


def kinds(r: redis.Redis, keys: Keys, task_id: str) -> list[str]:
    return [
        e[b"kind"].decode() for _, e in r.xrange(keys.events) if e.get(b"task") == task_id.encode()
    ]


def test_priority_preemption_and_flow_back(
    cluster: Cluster, client: Client, r: redis.Redis, keys: Keys
) -> None:
    cluster.controller()
    for _ in range(4):
        cluster.worker()
    cluster.wait_workers(r, 4)
    low = slow(client, 1500, 0.01, name="low", min_nodes=1, max_nodes=4, priority=0)
    wait_for(lambda: nodes(low) == 4, 10, "low on 4 nodes")
    # the controller reacts to the submit and the release in milliseconds; the bounds are
    # generous, for a loaded machine (every process here shares 2 cores with the suite)
    high = slow(client, 150, 0.02, name="high", min_nodes=3, max_nodes=3, priority=10)
    wait_for(lambda: nodes(high) == 3 and nodes(low) == 1, REACT, "high on 3, low on 1")
    assert low.status().state == TaskState.RUNNING
    high.wait(timeout=60)
    wait_for(lambda: nodes(low) == 4, REACT, "low back on 4 nodes")
    low.wait(timeout=120)
    assert_right(high, 150)
    assert_right(low, 1500)
    assert "released" in kinds(r, keys, high.id)


def test_gang_start_waits_for_min_nodes(cluster: Cluster, client: Client, r: redis.Redis) -> None:
    cluster.controller()
    cluster.worker()
    cluster.worker()
    cluster.wait_workers(r, 2)
    task = slow(client, 60, 0.005, min_nodes=3)
    time.sleep(1.0)
    assert task.status().state == TaskState.QUEUED
    assert nodes(task) == 0
    cluster.worker()
    cluster.wait_workers(r, 3, timeout=30)  # the third process started (seconds, loaded)
    wait_for(lambda: task.status().state == TaskState.RUNNING, REACT, "gang start")
    task.wait(timeout=30)
    assert_right(task, 60)


def test_node_selector_labels(cluster: Cluster, client: Client, r: redis.Redis) -> None:
    cluster.controller()
    cpu = [cluster.worker(f"cpu{i}-{r.time()[1]}") for i in range(2)]
    gpu = cluster.worker(f"gpu-{r.time()[1]}", labels={"gpu": "1"})
    cluster.wait_workers(r, 3)
    task = slow(client, 200, 0.002, node_selector={"gpu": "1"})
    task.wait(timeout=30)
    assert_right(task, 200)
    workers = {v["worker"] for _, v in task.results()}
    assert workers == {gpu.name}
    assert not workers & {w.name for w in cpu}


def test_waiting_below_min_and_resume(
    cluster: Cluster, client: Client, r: redis.Redis, keys: Keys
) -> None:
    cluster.controller()
    ws = [cluster.worker() for _ in range(2)]
    cluster.wait_workers(r, 2)
    task = slow(client, 800, 0.005, min_nodes=2)
    wait_for(lambda: task.status().state == TaskState.RUNNING, 10, "running")
    ws[0].kill()
    wait_for(lambda: task.status().state == TaskState.WAITING, 8, "waiting below min")
    cluster.worker()
    task.wait(timeout=60)
    assert_right(task, 800)
    seen = kinds(r, keys, task.id)
    assert seen.index("waiting") < len(seen) - 1
    assert "running" in seen[seen.index("waiting") :]


def test_live_priority_and_resize(cluster: Cluster, client: Client, r: redis.Redis) -> None:
    cluster.controller()
    for _ in range(3):
        cluster.worker()
    cluster.wait_workers(r, 3)
    task = slow(client, 3000, 0.01, min_nodes=1, max_nodes=1)
    wait_for(lambda: nodes(task) == 1, 10, "1 node")
    task.resize(2, 3)
    wait_for(lambda: nodes(task) == 3, REACT, "grown to 3")
    other = slow(client, 100, 0.01, name="other", min_nodes=2, max_nodes=2, priority=0)
    time.sleep(0.5)
    assert nodes(other) == 0  # same priority: no preemption
    other.set_priority(5)
    # other takes task's surplus node, then (task's min 2 no longer fits in the 1 node
    # left) all of task: task waits with its work parked, nothing lost
    wait_for(lambda: nodes(other) == 2, REACT, "raised priority preempts")
    wait_for(lambda: task.status().state == TaskState.WAITING, REACT, "below its min: waiting")
    assert nodes(task) == 0
    other.wait(timeout=30)
    wait_for(lambda: nodes(task) >= 2, REACT, "back")
    task.cancel()


def test_finished_task_keys_expire(
    cluster: Cluster, client: Client, r: redis.Redis, keys: Keys
) -> None:
    cluster.controller()
    cluster.worker()
    task = client.submit(
        TaskSpec(name="short", handler="tests.handlers:double", subtasks=[{"x": 1}], result_ttl=1.0)
    )
    task.wait(timeout=20)
    tk = keys.task(task.id)
    wait_for(lambda: 0 < r.pttl(tk.record) <= 1000, 5, "expiry set")
    wait_for(lambda: not r.exists(tk.record, tk.stream, tk.results), 5, "keys gone")
    assert not r.zscore(keys.queue, task.id)


def test_leader_failover(cluster: Cluster, client: Client, r: redis.Redis, keys: Keys) -> None:
    controllers = [cluster.controller(), cluster.controller()]
    for _ in range(2):
        cluster.worker()
    cluster.wait_workers(r, 2)
    wait_for(lambda: r.get(keys.leader), 5, "a leader")
    inflight = slow(client, 400, 0.01)
    wait_for(lambda: inflight.status().done > 10, 10, "in flight")
    leader_id = r.get(keys.leader).decode()
    leader = next(c for c in controllers if f"-{c.pid}-" in leader_id)
    leader.kill()
    killed = time.monotonic()
    after = slow(client, 50, 0.005, name="after", min_nodes=1)
    # a standby takes over within the leader lease (5 s), plus a generous reaction time
    wait_for(lambda: nodes(after) > 0 or after.status().finished, 5.0 + REACT, "nodes after")
    assert time.monotonic() - killed < 5.0 + REACT
    inflight.wait(timeout=60)
    after.wait(timeout=60)
    assert_right(inflight, 400)
    assert_right(after, 50)
    assert r.get(keys.leader).decode() != leader_id


def stand_in(
    r: redis.Redis,
    keys: Keys,
    wid: str,
    member_of: list[str],
    kind: str,
    queue: str,
    queues: list[str] | None = None,
) -> None:
    """A live worker's keys, written by hand: its record says which queues it is a member
    of (what a worker writes when it joins or leaves one), with an event naming it."""
    from queueworks.protocol import events
    from queueworks.protocol.models import WorkerRecord
    from queueworks.protocol.records import registered_worker

    now = time.time()
    record = WorkerRecord(
        id=wid,
        host="here",
        pid=1,
        allow=["tests"],
        started_at=now,
        member_of=member_of,
        queues=queues,
    )
    r.hset(keys.worker(wid), mapping=registered_worker(record, now))
    r.set(keys.worker_heartbeat(wid), repr(now), ex=60)
    r.set(keys.assign(wid), "", nx=True)
    r.zadd(keys.workers, {wid: now})
    events.emit(r, keys, kind, worker=wid, task=queue)


def test_a_queue_runs_while_it_has_a_member_which_it_guards(
    cluster: Cluster, client: Client, r: redis.Redis, keys: Keys
) -> None:
    """A queue is never assigned: it runs while a live worker is its member and waits,
    saying why, while none is; its min_nodes guard its member from a task of no higher
    priority, which gets that worker once it is no member and would not join it again (a
    free worker that would, the queue guards too)."""
    cluster.controller()
    client.queue("q", priority=1)
    q = client.task("q")
    wait_for(lambda: q.status().state == TaskState.WAITING, REACT, "a queue with no member")
    assert q.status().reason == "no live worker"
    stand_in(r, keys, "member", ["q"], "member_joined", "q")
    wait_for(lambda: q.status().state == TaskState.RUNNING, REACT, "running with a member")
    assert not q.status().reason
    low = slow(client, 10, priority=1)
    wait_for(lambda: "free worker" in (low.status().reason or ""), REACT, "low waits")
    assert r.get(keys.assign("member")) == b""  # guarded: equal priority takes nothing
    stand_in(r, keys, "member", [], "member_left", "q", queues=["elsewhere"])
    wait_for(lambda: r.get(keys.assign("member")) == low.id.encode(), REACT, "assigned")
    wait_for(lambda: q.status().state == TaskState.WAITING, REACT, "waiting again")
    assert q.status().reason == "no live worker that may serve it lists it in its --queues"
    low.cancel()
