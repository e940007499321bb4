"""Issue 11: queueworks behind Redis Sentinel, and a failover in the middle of a task.

A primary, one replica and three sentinels, all local (``tests.cluster_fixtures``); a
controller and three workers on ``redis+sentinel://.../<service>/0``. The primary is
SIGKILLed while a task runs; the sentinels promote the replica; the task completes with
every result right. Replication is asynchronous, so what the old primary had not yet sent
is lost: acks and results written in that window, and the results still in the workers'
hands. Those subtasks run again; the test reports how many (``-s`` shows the line).

Budget: ~20 s.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest
import redis

from queueworks import Client, TaskSpec, TaskState, TaskStatus
from queueworks.connection import UNAVAILABLE, connect, redact_url
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
