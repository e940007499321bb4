"""Issue 2: submit, split, process on a node set, results; retries, dead letters, bad input."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import pytest
import redis
from pydantic import ValidationError

from queueworks import Client, SubmitError, TaskSpec, TaskState
from queueworks.protocol.keys import Keys
from queueworks.scripts.bound import Scripts
from tests.conftest import Cluster, wait_for


@pytest.mark.system
def test_three_workers_process_3000_subtasks(
    cluster: Cluster, client: Client, r: redis.Redis
) -> None:
    cluster.controller()
    for _ in range(3):
        cluster.worker()
    cluster.wait_workers(r, 3)
    task = client.submit(
        TaskSpec(
            name="double", handler="tests.handlers:double", subtasks=[{"x": i} for i in range(3000)]
        )
    )
    status = task.wait(timeout=60)
    assert status.state == TaskState.COMPLETED
    assert dict(task.results()) == {i: 2 * i for i in range(3000)}
    assert status.done == 3000
    assert status.dead == 0
    # the node set is released when the task completes: every worker idle again
    wait_for(lambda: all(w.task is None for w in client.workers()), 10, "workers idle")


@pytest.mark.system
def test_retry_then_success_and_dead_letters(
    cluster: Cluster, client: Client, r: redis.Redis
) -> None:
    cluster.controller()
    cluster.worker()
    cluster.wait_workers(r, 1)
    flaky = client.submit(
        TaskSpec(
            name="flaky",
            handler="tests.handlers:flaky",
            subtasks=[{"x": i} for i in range(5)],
            max_attempts=3,
        )
    )
    status = flaky.wait(timeout=30)
    assert status.done == 5 and status.dead == 0
    assert {i: v["attempt"] for i, v in flaky.results()} == {i: 3 for i in range(5)}

    bad = client.submit(
        TaskSpec(
            name="bad",
            handler="tests.handlers:fail_odd",
            subtasks=[{"x": i} for i in range(10)],
            max_attempts=2,
        )
    )
    status = bad.wait(timeout=30)
    assert status.state == TaskState.COMPLETED
    assert (status.done, status.dead) == (5, 5)
    letters = bad.dead_letters()
    assert sorted(d.index for d in letters) == [1, 3, 5, 7, 9]
    for d in letters:
        assert d.attempts == 2
        assert "Traceback" in d.error and "ValueError: odd" in d.error
        assert json.loads(d.payload or "null")["x"] == d.index
    assert dict(bad.results()) == {i: i for i in range(0, 10, 2)}


@pytest.mark.system
def test_a_retry_runs_before_anything_later_and_every_settle_is_counted(
    cluster: Cluster, client: Client, r: redis.Redis, prefix: str
) -> None:
    """One worker: a failed subtask runs again at once, before the rest of its batch (the
    per-key order of partitioned tasks relies on it), and the worker record counts every
    subtask it settled exactly once."""
    cluster.controller()
    cluster.worker()
    cluster.wait_workers(r, 1)
    log = f"{prefix}:test:log"
    fails = {i: (2 if i % 7 == 3 else 0) for i in range(40)}
    task = client.submit(
        TaskSpec(
            name="order",
            handler="tests.handlers:flaky_logged",
            subtasks=[{"log": log, "fails": fails[i]} for i in range(40)],
            max_attempts=3,
        )
    )
    status = task.wait(timeout=30)
    assert (status.done, status.dead) == (40, 0)
    runs = [tuple(map(int, x.split(b"|"))) for x in r.lrange(log, 0, -1)]
    expected = [(i, a) for i in range(40) for a in range(1, fails[i] + 2)]
    assert runs == expected
    wait_for(lambda: [w.processed for w in client.workers()] == [40], 10, "processed == 40")


@pytest.mark.system
def test_max_dead_fails_the_task(cluster: Cluster, client: Client, r: redis.Redis) -> None:
    cluster.controller()
    cluster.worker()
    task = client.submit(
        TaskSpec(
            name="doomed",
            handler="tests.handlers:always_fails",
            subtasks=[{"x": i} for i in range(50)],
            max_attempts=1,
            max_dead=3,
        )
    )
    status = task.wait(timeout=30)
    assert status.state == TaskState.FAILED
    assert status.dead >= 4
    assert "dead-lettered" in (status.error or "")


@pytest.mark.unit
@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"min_nodes": 3, "max_nodes": 2}, "max_nodes"),
        ({"handler": ""}, "handler"),
        ({"handler": "no_colon"}, "handler"),
        ({"handler": "os:__import__"}, "handler"),
        ({"handler": "a.b:c.d"}, "handler"),
        ({"min_nodes": 0}, "min_nodes"),
        ({"max_attempts": 0}, "max_attempts"),
        ({"subtasks": "abc"}, "subtasks"),
    ],
)
def test_invalid_spec_names_the_field(kwargs: dict[str, object], field: str) -> None:
    base: dict[str, object] = {"name": "t", "handler": "m:f", "subtasks": []}
    with pytest.raises(ValidationError) as err:
        TaskSpec(**{**base, **kwargs})
    assert field in str(err.value)


@pytest.mark.integration
def test_non_json_payload_is_refused_at_submit(client: Client, r: redis.Redis, keys: Keys) -> None:
    spec = TaskSpec(name="t", handler="m:f", subtasks=[{"x": 1}, {"x": {1, 2}}])
    with pytest.raises(SubmitError, match=r"subtasks\[1\]"):
        client.submit(spec, task_id="badjson")
    assert not r.exists(keys.task("badjson").stream)  # nothing left behind
    assert not r.exists(keys.task("badjson").record)


@pytest.mark.integration
def test_generator_subtasks_are_streamed(client: Client) -> None:
    consumed = []

    def gen():  # type: ignore[no-untyped-def]
        for i in range(2500):
            consumed.append(i)
            yield {"x": i}

    task = client.submit(TaskSpec(name="g", handler="m:f", subtasks=gen(), min_nodes=1))
    status = task.status()
    assert status.total == 2500 and status.state == TaskState.QUEUED
    assert len(consumed) == 2500


@pytest.mark.system
def test_malformed_entries_are_rejected_and_a_refused_handler_waits_or_fails(
    cluster: Cluster, client: Client, r: redis.Redis, keys: Keys
) -> None:
    """Entries that did not come from submit are rejected (counted apart, never in done or
    dead); a handler no worker may run waits with its reason; one no worker can import
    fails, saying why. Nothing is dead-lettered as "handler refused"."""
    cluster.controller()
    # queued until a worker exists: add malformed entries straight into the stream first
    outside = client.submit(
        TaskSpec(name="outside", handler="os.path:join", subtasks=[{"x": 1}, {"x": 2}])
    )
    missing = client.submit(
        TaskSpec(name="missing", handler="queueworks.examples.nope:f", subtasks=[{"x": 1}])
    )
    tk = keys.task("goodtask")

    def subtasks() -> Iterator[dict[str, int]]:
        # runs once submit has made the stream, before its first batch: junk comes first
        r.xadd(tk.stream, {"i": "10", "p": "{not json"})
        r.xadd(tk.stream, {"garbage": "\xff"})
        r.xadd(tk.stream, {"i": "-3", "p": "1"})
        r.xadd(tk.stream, {"i": "11", "p": '{"x": 5}'})  # well formed, but no index of the task
        yield from ({"x": i} for i in range(10))

    good = client.submit(
        TaskSpec(name="good", handler="tests.handlers:double", subtasks=subtasks()),
        task_id="goodtask",
    )
    cluster.worker()
    st = good.wait(timeout=30)
    assert st.state == TaskState.COMPLETED and (st.done, st.dead, st.rejected) == (10, 0, 4)
    letters = good.dead_letters()
    assert {d.reason for d in letters} == {"rejected"} and len(letters) == 4
    errors = sorted(d.error for d in letters)
    assert any("not valid JSON" in e for e in errors)
    assert any("must have fields 'i' and 'p'" in e for e in errors)
    assert any("negative" in e for e in errors)
    assert any("index 11 is out of range 0..9; its result was discarded" in e for e in errors)
    assert all(d.index is None for d in letters)
    assert dict(good.results()) == {i: 2 * i for i in range(10)}

    st = missing.wait(timeout=30)
    assert st.state == TaskState.FAILED and (st.done, st.dead) == (0, 0), st
    assert st.error and "cannot import 'queueworks.examples.nope'" in st.error
    assert missing.dead_letters() == []

    wait_for(lambda: "may run" in (outside.status().reason or ""), 10, "the outside task's reason")
    st = outside.status()
    assert st.state == TaskState.QUEUED and (st.done, st.dead) == (0, 0)
    assert st.reason and "no live worker may run 'os.path:join'" in st.reason
    assert "tests.handlers" in st.reason  # it says what the workers do allow
    assert outside.dead_letters() == []


@pytest.mark.integration
def test_late_ack_is_counted_once(client: Client, r: redis.Redis, keys: Keys) -> None:
    """A subtask acked twice (a presumed-dead consumer acks late) counts once, result once."""
    task = client.submit(TaskSpec(name="t", handler="m:f", subtasks=[{"x": 0}, {"x": 1}]))
    tk = keys.task(task.id)
    scripts = Scripts(r)
    r.zadd(tk.members, {"b": 1})
    got = r.xreadgroup(tk.group, "a", {tk.stream: ">"}, count=2)
    (first_id, _), (second_id, _) = got[0][1]
    # b reclaims a's entries (a presumed dead) and acks with its result
    claimed, gone = scripts.reclaim(tk, tk.stream, "b", from_consumer="a")
    assert [c.entry_id for c in claimed] == [first_id.decode(), second_id.decode()]
    assert claimed[0].deliveries == 2 and not gone
    s1 = scripts.settle(tk, tk.stream, "b", time.time(), [(first_id.decode(), 0, '"from-b"')])
    # the zombie a acks the same entry late, with another result
    s2 = scripts.settle(tk, tk.stream, "a", time.time(), [(first_id.decode(), 0, '"from-a"')])
    assert (s1.ok, s2.ok) == (1, 0)
    assert task.status().done == 1
    assert dict(task.results()) == {0: "from-b"}
    s3 = scripts.settle(tk, tk.stream, "a", time.time(), [(second_id.decode(), 1, '"a"')])
    assert s3.finished and task.status().state == TaskState.COMPLETED
    assert task.status().done == 2


@pytest.mark.system
def test_cancel_releases_nodes(cluster: Cluster, client: Client, r: redis.Redis) -> None:
    cluster.controller()
    cluster.worker()
    cluster.worker()
    task = client.submit(
        TaskSpec(
            name="slow",
            handler="tests.handlers:double_slow",
            subtasks=[{"x": i, "seconds": 0.05} for i in range(2000)],
        )
    )
    wait_for(lambda: task.status().done > 5, 20, "progress")
    assert task.cancel()
    assert task.status().state == TaskState.CANCELLED
    wait_for(lambda: all(w.task is None for w in client.workers()), 5, "nodes released")
    assert not task.cancel()  # finished tasks stay finished


@pytest.mark.system
def test_a_restarted_worker_charges_its_old_entry_not_the_one_its_join_read(
    cluster: Cluster, client: Client, r: redis.Redis
) -> None:
    """A worker back under its name finds an entry of its earlier life pending on its
    consumer: it adopts it, charged (it may have run: attempt 2). The entry its join read
    (first delivery) is pending on the same consumer, yet runs as attempt 1."""
    spec = TaskSpec(
        name="adopt",
        handler="tests.handlers:double_slow",
        subtasks=[{"x": i} for i in range(3)],
        max_nodes=1,
    )
    task = client.submit(spec)
    tk = client.keys.task(task.id)
    r.xreadgroup(tk.group, "w-again", {tk.stream: ">"}, count=1)  # its earlier life: index 0
    cluster.controller()
    cluster.worker("w-again")
    assert task.wait(timeout=30).state == TaskState.COMPLETED
    assert {i: v["attempt"] for i, v in task.results()} == {0: 2, 1: 1, 2: 1}


@pytest.mark.system
def test_a_worker_takes_up_a_task_reopened_by_a_requeue(
    cluster: Cluster, client: Client, r: redis.Redis
) -> None:
    """A requeued dead letter reopens a completed task; the worker that ran it runs it again."""
    from queueworks.client.admin import Admin

    cluster.controller()
    cluster.worker()
    cluster.wait_workers(r, 1)
    task = client.submit(
        TaskSpec(
            name="odd",
            handler="tests.handlers:fail_odd",
            subtasks=[{"x": 2}, {"x": 3}],
            max_attempts=1,
        )
    )
    st = task.wait(timeout=30)
    assert (st.state, st.done, st.dead) == (TaskState.COMPLETED, 1, 1)
    (letter,) = task.dead_letters()
    Admin(client).requeue_dead(task.id, letter.id)
    wait_for(lambda: task.status().dead == 1 and task.status().finished, 20, "ran again")
    assert len(task.dead_letters()) == 1  # it failed again, on the same (only) worker
