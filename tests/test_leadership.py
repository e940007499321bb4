"""Issue 19: the controller keeps its state between passes, so what it must never do is act
on a stale one. A leader frozen mid-pass past its lease wakes up and writes nothing; a new
leader reads everything again and loses no task; events trimmed from the capped stream while
the leader was behind make it read everything again. Real processes, real signals.
"""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path
from typing import Any

import pytest
import redis

from queueworks import Client, TaskSpec, TaskState
from queueworks.protocol.keys import Keys
from tests.conftest import Cluster, Proc, wait_for

pytestmark = pytest.mark.system

FAST_LEASE = {"QUEUEWORKS_LEASE_TTL": "1.0"}


def slow(client: Client, n: int, seconds: float, **kw: Any) -> Any:
    return client.submit(
        TaskSpec(
            name=kw.pop("name", "slow"),
            handler="tests.handlers:double_slow",
            subtasks=[{"x": i, "seconds": seconds} for i in range(n)],
            **kw,
        )
    )


def stopped(proc: Proc) -> bool:
    """True if the process is stopped (SIGSTOP): its state in /proc is 'T'."""
    stat = Path(f"/proc/{proc.pid}/stat").read_text()
    return stat[stat.rindex(")") + 2] == "T"


def events_by(r: redis.Redis, keys: Keys, controller_id: str, after: str) -> list[dict[str, str]]:
    out = []
    for _, fields in r.xrange(keys.events, min=f"({after}"):
        body = {k.decode(): v.decode() for k, v in fields.items()}
        if body.get("by") == controller_id:
            out.append(body)
    return out


def log_lines(proc: Proc, event: str) -> list[dict[str, Any]]:
    out = []
    for line in proc.log().splitlines():
        if f'"{event}"' in line:
            out.append(json.loads(line))
    return out


def test_a_leader_stopped_mid_pass_past_its_lease_writes_nothing(
    cluster: Cluster, client: Client, r: redis.Redis, keys: Keys
) -> None:
    """The leader stops itself (QUEUEWORKS_FAULT_STOP_BEFORE_APPLY: a real SIGSTOP, right
    before the writes of its first pass that has any, after every local check) with a plan
    giving both workers task A. Meanwhile the standby takes over, A is cancelled and B runs.
    Resumed, the old leader sends its plan: Redis refuses it, and nothing it planned lands."""
    stale = cluster.spawn(
        ["controller"], "stale", {**FAST_LEASE, "QUEUEWORKS_FAULT_STOP_BEFORE_APPLY": "1"}
    )
    wait_for(lambda: r.get(keys.leader), 10, "a leader")
    stale_id = r.get(keys.leader).decode().split("#")[0]
    assert f"-{stale.pid}-" in stale_id
    workers = [cluster.worker() for _ in range(2)]
    cluster.wait_workers(r, 2)
    standby = cluster.spawn(["controller"], "standby", FAST_LEASE)
    a = slow(client, 200, 0.01, name="a", min_nodes=2)
    wait_for(lambda: log_lines(stale, "fault_stop_before_apply"), 10, "the stop mid-pass")
    wait_for(lambda: stopped(stale), 5, "the leader stopped")
    wait_for(lambda: f"-{standby.pid}-" in (r.get(keys.leader) or b"").decode(), 10, "takeover")
    wait_for(lambda: a.status().state == TaskState.RUNNING, 10, "a running, by the standby")
    a.cancel()
    b = slow(client, 300, 0.01, name="b", min_nodes=2)
    names = [w.name for w in workers]
    wait_for(lambda: len(b.status().nodes) == 2, 10, "b on both workers (they have left a)")
    assert [r.get(keys.assign(w)) for w in names] == [b.id.encode()] * 2
    before = r.xrevrange(keys.events, count=1)[0][0].decode()
    a_record = r.hgetall(keys.task(a.id).record)

    stale.signal(signal.SIGCONT)
    wait_for(lambda: log_lines(stale, "writes_fenced"), 10, "the old leader fenced")
    for _ in range(25):  # its plan said: both workers on a; they must never be
        assert [r.get(keys.assign(w)) for w in names] == [b.id.encode()] * 2
        time.sleep(0.02)
    assert events_by(r, keys, stale_id, before) == []
    assert r.hgetall(keys.task(a.id).record) == a_record
    assert a.status().state == TaskState.CANCELLED
    fenced = log_lines(stale, "writes_fenced")[0]
    assert "lease no longer holds" in fenced["reason"]  # refused by Redis, not locally
    assert b.wait(timeout=60).state == TaskState.COMPLETED
    assert {i: v["y"] for i, v in b.results()} == {i: 2 * i for i in range(300)}
    assert stale.alive() and standby.alive()
    assert f"-{standby.pid}-" in r.get(keys.leader).decode()


def test_a_new_leader_rebuilds_the_state_and_loses_no_task(
    cluster: Cluster, client: Client, r: redis.Redis, keys: Keys
) -> None:
    """Running tasks, a backlog queued behind them and tasks no worker can run, when the
    leader is SIGKILLed: the new leader reads it all back, moves none of the running node
    sets, keeps every waiting reason, and every runnable task completes."""
    first = cluster.spawn(["controller"], "first", FAST_LEASE)
    wait_for(lambda: r.get(keys.leader), 10, "a leader")
    for _ in range(3):
        cluster.worker()
    cluster.wait_workers(r, 3)
    second = cluster.spawn(["controller"], "second", FAST_LEASE)
    running = [slow(client, 150, 0.02, name=f"run{k}", max_nodes=1) for k in range(3)]
    wait_for(lambda: all(len(t.status().nodes) == 1 for t in running), 15, "3 running")
    backlog = [slow(client, 5, 0.002, name=f"queued{k}", max_nodes=1) for k in range(20)]
    never = [
        slow(client, 1, 0.0, name=f"never{k}", node_selector={"zone": "mars"}) for k in range(3)
    ]
    wait_for(lambda: all(t.status().reason for t in never), 10, "the reasons")
    reasons = {t.id: t.status().reason for t in never}
    held = {t.id: [n.worker for n in t.status().nodes] for t in running}

    first.kill()
    wait_for(lambda: f"-{second.pid}-" in (r.get(keys.leader) or b"").decode(), 10, "takeover")
    wait_for(lambda: log_lines(second, "rebuilt"), 10, "the rebuild")
    rebuilt = log_lines(second, "rebuilt")[-1]
    assert rebuilt["workers"] == 3
    assert rebuilt["tasks"] >= len(never) + 1  # every unfinished one, read back
    for t in running:  # what was running stays where it was, unless it finished meanwhile
        st = t.status()
        assert st.finished or [n.worker for n in st.nodes] == held[t.id], st
    for t in [*running, *backlog]:
        st = t.wait(timeout=90)
        assert st.state == TaskState.COMPLETED and st.done == st.total, st
    for t in never:
        st = t.status()
        assert st.state == TaskState.QUEUED and st.reason == reasons[t.id]
    listed = {t.id for t in client.tasks()}
    assert {t.id for t in [*running, *backlog, *never]} <= listed


def test_events_trimmed_while_the_leader_was_behind_cause_a_full_pass(
    cluster: Cluster, client: Client, r: redis.Redis, keys: Keys
) -> None:
    """The leader is stopped (well within its lease); a task is submitted and then 12,000
    other events push its `submitted` event out of the capped stream. Resumed, the leader
    sees that the stream now starts after the last event it read, reads everything again
    and runs the task (the backstop sweep is set to 10 minutes: it is not what finds it)."""
    slow_sweep = {"QUEUEWORKS_LEASE_TTL": "30", "QUEUEWORKS_FULL_PASS_INTERVAL": "600"}
    leader = cluster.spawn(["controller"], "leader", slow_sweep)
    cluster.worker()
    cluster.wait_workers(r, 1)
    wait_for(lambda: log_lines(leader, "rebuilt"), 30, "the leader's first read")
    warm = slow(client, 1, 0.0, name="warm")
    assert warm.wait(timeout=20).state == TaskState.COMPLETED

    leader.signal(signal.SIGSTOP)
    wait_for(lambda: stopped(leader), 30, "the leader stopped")
    # the first event reaches its blocked XREAD at once (the server answers a stopped
    # process all the same): let that be a noise event, so the task's is one it misses
    r.xadd(keys.events, {"kind": "noise", "n": "first"})
    task = slow(client, 20, 0.001, name="missed")
    submitted = next(
        i for i, f in r.xrange(keys.events) if f.get(b"task") == task.id.encode()
    ).decode()
    pipe = r.pipeline(transaction=False)
    for n in range(12_000):
        pipe.xadd(keys.events, {"kind": "noise", "n": str(n)}, maxlen=10_000, approximate=True)
    pipe.execute()
    head = r.xrange(keys.events, count=1)[0][0].decode()
    assert tuple(map(int, head.split("-"))) > tuple(map(int, submitted.split("-")))
    assert task.status().state == TaskState.QUEUED

    leader.signal(signal.SIGCONT)
    st = task.wait(timeout=60)
    assert st.state == TaskState.COMPLETED and st.done == 20
    # the trim seen, then the full pass (the first read's line, then its own); logged as
    # they happen, which can be after the task ran (a deep read may list it first)
    wait_for(lambda: log_lines(leader, "events_trimmed"), 30, "the trim logged")
    wait_for(lambda: len(log_lines(leader, "rebuilt")) == 2, 30, "the full pass logged")
    assert len(log_lines(leader, "rebuilt")) == 2


def test_tasks_are_listed_from_the_index_paged_and_forgotten_once_expired(
    cluster: Cluster, client: Client, r: redis.Redis, keys: Keys
) -> None:
    ids = [slow(client, 1, 0.0, name=f"t{k}").id for k in range(5)]
    assert [t.id for t in client.tasks()] == ids  # oldest first, as before
    assert [t.id for t in client.tasks(limit=2, offset=1, newest_first=True)] == ids[3:1:-1]
    assert client.task_count() == 5
    r.delete(keys.task(ids[0]).record)  # gone without the controller: skipped, not shown
    assert [t.id for t in client.tasks()] == ids[1:]
    cluster.controller()  # finds it gone: drops it from the queue and the index
    wait_for(lambda: r.zscore(keys.tasks, ids[0]) is None, 10, "the index forgets ids[0]")
    cluster.worker()
    short = client.submit(
        TaskSpec(name="short", handler="tests.handlers:double", subtasks=[{"x": 1}], result_ttl=1)
    )
    short.wait(timeout=20)
    wait_for(lambda: r.zscore(keys.tasks, short.id) is None, 10, "the index forgets it")
    assert not r.exists(keys.task(short.id).record)
    assert r.zscore(keys.tasks_expiry, short.id) is None
    assert r.zscore(keys.tasks, ids[1]) is not None  # the others stay until they expire
