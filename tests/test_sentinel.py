"""Issue 11: queueworks behind Redis Sentinel, and a failover in the middle of a task.

A primary, one replica and three sentinels, all local (``tests.cluster_fixtures``); a
controller and three workers on ``redis+sentinel://.../<service>/0``. The primary is
SIGKILLed while a task runs; the sentinels promote the replica; the task completes with
every result right. Replication is asynchronous, so what the old primary had not yet sent
is lost: acks and results written in that window, and the results still in the workers'
hands. Those subtasks run again; the test reports how many (``-s`` shows the line).

A queue's ``wait_replicas``: a failover with the replica held back (SIGSTOPped, the primary
buffering what it owes it) keeps every job whose replicated enqueue returned and loses the
plain queue's acknowledged ones; and results through a worker on a replicated queue.

Budget: ~45 s.
"""

from __future__ import annotations

import asyncio
import gc
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest
import redis

from queueworks import AsyncClient, Client, TaskSpec, TaskState, TaskStatus
from queueworks.errors import NotReplicated
from queueworks.transport.connection import UNAVAILABLE, connect, redact_url
from tests.cluster_fixtures import LocalSentinel, executions
from tests.conftest import Cluster

ALLOW = ("tests.cluster_fixtures",)
T = TypeVar("T")


@pytest.fixture
def sentinel() -> Iterator[LocalSentinel]:
    with LocalSentinel(replicas=1, sentinels=3) as s:
        yield s


def retrying(fn: Callable[[], T], timeout: float, what: str) -> T:
    """``fn()``, again while Redis is unavailable (a failover in progress)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return fn()
        except UNAVAILABLE:
            if time.monotonic() > deadline:
                raise AssertionError(f"Redis unavailable for {timeout} s: {what}") from None
            time.sleep(0.1)


def wait_until(pred: Callable[[], Any], timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = retrying(pred, max(1.0, deadline - time.monotonic()), what)
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.05)


@pytest.mark.system
def test_failover_mid_task_completes_with_every_result_right(
    sentinel: LocalSentinel, prefix: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    n, seconds = 2400, 0.004
    procs = Cluster(sentinel.url, prefix, tmp_path)
    client = Client.from_url(sentinel.url, prefix=prefix)
    try:
        procs.controller()
        workers = [procs.worker(allow=ALLOW) for _ in range(3)]
        procs.wait_workers(client.redis, 3)
        log = tmp_path / "runs.log"
        task = client.submit(
            TaskSpec(
                name="failover",
                handler="tests.cluster_fixtures:logged",
                subtasks=({"x": i, "log": str(log), "seconds": seconds} for i in range(n)),
            ),
            wait_replicas=1,  # on the replica before submit returns: the failover keeps it
            wait_timeout=5.0,
        )
        wait_until(lambda: task.status().done >= n // 5, 30, "a fifth done")
        old = sentinel.primary()
        done_before = task.status().done
        killed_at = time.time()
        old.kill()  # SIGKILL: no goodbye to clients, no last sync to the replica
        new = sentinel.wait_failover(old.port, 30)
        promoted_at = time.time()
        done_after = retrying(lambda: task.status().done, 30, "status on the new primary")

        status: TaskStatus = wait_until(
            lambda: (st := task.status(with_nodes=False)).finished and st, 120, "completion"
        )
        assert status.state == TaskState.COMPLETED, status
        assert (status.done, status.dead) == (n, 0), status
        assert {i: v["y"] for i, v in task.results()} == {i: 2 * i for i in range(n)}

        ran = executions(log)
        counts = Counter(i for i, *_ in ran)
        assert set(counts) == set(range(n)), "every subtask ran"
        repeated = {i: c for i, c in counts.items() if c > 1}
        first_run = {i: min(t for j, *_, t in ran if j == i) for i in repeated}
        offsets = [t - killed_at for t in first_run.values()]
        report = (
            f"sentinel failover: primary SIGKILLed at done={done_before}, new primary "
            f"{promoted_at - killed_at:.1f} s later showed done={done_after}; "
            f"{len(repeated)} of {n} subtasks ran more than once "
            f"({sum(repeated.values()) - len(repeated)} extra runs); their first runs started "
            f"{min(offsets, default=0):+.1f} s to {max(offsets, default=0):+.1f} s from the kill"
        )
        print(report)
        request.node.user_properties.append(("repeated", len(repeated)))
        # What repeats is what the failover lost or interrupted: subtasks first started
        # before the new primary was serving (never ones started well after it).
        assert all(t < promoted_at + 5.0 for t in first_run.values()), report
        assert len(repeated) < n // 2, report

        # the watchers reconnected to the promoted replica and enabled notifications there
        assert any("watcher_resubscribed" in w.log() for w in workers)
        with new.client() as c:
            flags = c.config_get("notify-keyspace-events")["notify-keyspace-events"]
        assert set("K$gx") <= set(flags) or {"K", "A"} <= set(flags), flags
        for w in workers:
            assert w.alive(), w.log()[-3000:]
    except BaseException:
        print(procs.logs())
        raise
    finally:
        client.close()
        procs.close()


@pytest.mark.integration
def test_sentinel_urls(sentinel: LocalSentinel) -> None:
    """Service and database from the path; the password never shows; a wrong service name
    is a connection error that says so."""
    r = connect(sentinel.url)
    assert isinstance(r, redis.Redis)
    assert r.set("qw-sentinel-probe", "1") and r.get("qw-sentinel-probe") == b"1"
    hosts = sentinel.url.removeprefix("redis+sentinel://").split("/")[0]
    secret = f"redis+sentinel://u:Zz9secret@{hosts}/qw/0?sentinel_password=Xx8secret"
    shown = redact_url(secret)
    assert "Zz9secret" not in shown and "Xx8secret" not in shown
    with pytest.raises(ValueError) as bad:
        connect(f"redis+sentinel://u:Zz9secret@{hosts}")
    assert "Zz9secret" not in str(bad.value) and "service" in str(bad.value)
    with pytest.raises(redis.ConnectionError, match="nosuch"):
        connect(f"redis+sentinel://{hosts}/nosuch/0").ping()


def held_output(primary: Any) -> int:
    """Bytes the primary holds for its replica, not yet written to the replica's socket."""
    rows: Any = primary.client_list(_type="replica")
    return max((int(row.get("omem", 0)) for row in rows), default=0)


def hold_back(primary: Any, key: str) -> None:
    """With the replica stopped: write to the primary until its socket buffers are full
    and the primary holds replication output itself (what a SIGKILL then loses)."""
    pad = b"x" * (1 << 20)
    for _ in range(512):
        primary.set(key, pad)
        if held_output(primary) >= 4 << 20:
            return
    raise AssertionError("the primary never held output back for its replica")


@pytest.mark.integration
@pytest.mark.slow(25)
def test_wait_replicas_keeps_every_acknowledged_job_through_a_failover(
    sentinel: LocalSentinel, prefix: str
) -> None:
    """A replica held back (SIGSTOPped, the primary's buffers to it full) while jobs are
    enqueued, then the primary SIGKILLed and the replica promoted: every job a
    ``wait_replicas=1`` enqueue returned is there; the ones it could not replicate raised
    ``NotReplicated``; without it, jobs whose enqueue returned are lost (``-s`` shows how
    many)."""
    old = sentinel.primary()
    replica = next(s for s in sentinel.servers if s is not old)
    with replica.client() as rc:  # online (its first sync may wait for a diskless delay)
        wait_until(
            lambda: rc.info("replication").get("master_link_status") == "up", 30, "a replica"
        )
    client = Client.from_url(sentinel.url, prefix=prefix)
    try:
        plain, durable = client.queue("plain"), client.queue("durable", wait_replicas=1)
        before = [plain.enqueue("m:f", {"i": i}).id for i in range(10)]
        kept = [durable.enqueue("m:f", {"i": i}).id for i in range(10)]  # WAIT covers both
        kept += [job.id for job in durable.enqueue_many(("m:f", i) for i in range(600))]

        replica.pause()  # SIGSTOP: it takes nothing more from the primary
        with old.client() as primary:
            hold_back(primary, f"{prefix}:pad")
        acknowledged = [plain.enqueue("m:f", {"held": i}).id for i in range(20)]
        acknowledged += [job.id for job in plain.enqueue_many(("m:f", i) for i in range(600))]
        with pytest.raises(NotReplicated) as one:
            durable.enqueue("m:f", {"held": 1}, wait_timeout=0.2)
        with pytest.raises(NotReplicated) as many:
            durable.enqueue_many((("m:f", i) for i in range(600)), wait_timeout=0.2)
        assert (one.value.acked, many.value.acked, len(many.value.jobs)) == (0, 0, 600)

        old.kill()  # SIGKILL: what it held for the replica dies with it
        replica.resume()
        new = sentinel.wait_failover(old.port, 30)
        assert new is replica
        with new.client() as c:
            durable_ids = {i.decode() for i, _ in c.xrange(durable.keys.stream)}
            plain_ids = {i.decode() for i, _ in c.xrange(plain.keys.stream)}
        refused = [one.value.job_ids[0], *many.value.job_ids]
        lost = [i for i in acknowledged if i not in plain_ids]
        print(
            f"failover with a lagging replica: wait_replicas=1 kept {len(kept)} of "
            f"{len(kept)} jobs it returned ({sum(i not in durable_ids for i in refused)} of "
            f"{len(refused)} it refused with NotReplicated were lost); without it "
            f"{len(lost)} of {len(acknowledged)} acknowledged jobs were lost"
        )
        assert set(kept) <= durable_ids, "a job whose replicated enqueue returned was lost"
        assert set(before) <= plain_ids
        assert lost, "the window should lose acknowledged jobs without wait_replicas"
    finally:
        replica.resume()
        client.close()


@pytest.mark.system
def test_results_of_a_replicated_queue_through_a_worker(
    sentinel: LocalSentinel, prefix: str, tmp_path: Path
) -> None:
    """A ``wait_replicas=1`` queue with a replica that keeps up, run by a real worker:
    enqueues return, results come (each after its settle is on the replica), sync and
    async alike."""
    procs = Cluster(sentinel.url, prefix, tmp_path)
    client = Client.from_url(sentinel.url, prefix=prefix)
    try:
        procs.controller()
        procs.worker()
        procs.wait_workers(client.redis, 1)
        q = client.queue("durable", wait_replicas=1, wait_timeout=10.0)
        jobs = [q.enqueue("tests.handlers:double", {"x": i}) for i in range(5)]
        jobs += q.enqueue_many(("tests.handlers:double", {"x": i}) for i in range(5, 50))
        assert [job.result(timeout=60) for job in jobs] == [2 * i for i in range(50)]

        async def gathered() -> list[Any]:
            async with AsyncClient.from_url(sentinel.url, prefix=prefix) as ac:
                aq = await ac.queue("durable")
                ajobs = await asyncio.gather(
                    *(aq.enqueue("tests.handlers:double", {"x": i}) for i in range(20))
                )
                return list(await asyncio.gather(*(j.result(timeout=60) for j in ajobs)))

        try:
            assert asyncio.run(gathered()) == [2 * i for i in range(20)]
        finally:
            gc.collect()
    except BaseException:
        print(procs.logs())
        raise
    finally:
        client.close()
        procs.close()
