"""Redis loses its data under running processes (a restart without persistence, a
``FLUSHALL``, a failover to an empty replica): every process keeps running and serves what
comes next; what was lost is said, not hidden (docs/reliability.md, "Redis restarts and
outages"). Each test has a private server, since emptying it would empty every test's keys.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from structlog.testing import capture_logs

from queueworks import AsyncClient, Client, TaskNotFound, TaskSpec, TaskState
from queueworks.contrib.redis_server import RedisServer
from queueworks.controller.emptied import Emptied
from queueworks.controller.lease import Lease
from queueworks.controller.tally import Tally
from queueworks.logs import get_logger
from queueworks.protocol.keys import Keys
from queueworks.queue.vanished import gone_stream, stream_gone
from queueworks.scripts.bound import Scripts
from queueworks.workers.reclaim import Reclaim
from tests.conftest import Cluster, wait_for


@pytest.fixture
def lonely() -> Iterator[RedisServer]:
    """A private server (no AOF, no RDB: a restart empties it)."""
    with RedisServer() as server:
        server.start()
        yield server


def events(log: str, name: str) -> list[dict[str, Any]]:
    """The JSON log lines of ``log`` whose event is ``name``."""
    out = []
    for line in log.splitlines():
        if f'"event": "{name}"' in line:
            out.append(json.loads(line))
    return out


def alive(cluster: Cluster) -> None:
    dead = [p.name for p in cluster.procs if not p.alive()]
    assert not dead, f"exited: {dead}\n{cluster.logs()}"


@pytest.mark.system
@pytest.mark.slow(20)
@pytest.mark.parametrize("how", ["flushall", "restart"])
def test_every_process_serves_again_after_redis_lost_its_data(
    lonely: RedisServer, prefix: str, tmp_path: Path, how: str
) -> None:
    """Jobs of two queues and a task's subtasks run on three workers (one with many jobs
    in flight), a waiter waits on the task, a schedule is set; then the data goes. Every
    process lives on; the waiter ends with ``TaskNotFound``; the kept queue handle's next
    job, a new queue's job and a new task run; the lost schedule is logged once."""
    client = Client.from_url(lonely.url, prefix=prefix)
    r = redis.Redis.from_url(lonely.url, socket_timeout=10)
    cluster = Cluster(lonely.url, prefix, tmp_path)
    try:
        cluster.controller()
        cluster.worker()
        cluster.worker(extra=["--concurrency", "3"])
        cluster.worker()
        cluster.wait_workers(r, 3)
        kept, other = client.queue("kept"), client.queue("other")
        assert kept.enqueue("tests.handlers:double", {"x": 1}).result(timeout=60) == 2
        kept.schedule("tick", "tests.handlers:double", {"x": 3}, every=3600.0)
        task = client.submit(
            TaskSpec(
                name="doomed",
                handler="tests.handlers:double_slow",
                subtasks=[{"x": i, "seconds": 0.05} for i in range(3000)],
                max_nodes=1,
            )
        )
        for q in (kept, other):
            q.enqueue_many([("tests.handlers:sleep_for", {"seconds": 0.05})] * 300)
        waited: list[BaseException | None] = []

        def waiter() -> None:
            try:
                task.wait(timeout=120)
                waited.append(None)
            except BaseException as exc:
                waited.append(exc)

        thread = threading.Thread(target=waiter, daemon=True)
        if how == "flushall":  # (a wait under way when Redis goes down is not this test's)
            thread.start()
        wait_for(lambda: task.status().done > 5, 60, "the task under way")
        wait_for(lambda: kept.status().done > 5 and other.status().done > 5, 60, "jobs flowing")

        if how == "flushall":
            r.flushall()
        else:
            lonely.restart()
            client.redis.connection_pool.disconnect()
        time.sleep(5.0)  # past every heartbeat's TTL, and the controller's lease
        alive(cluster)

        if how == "flushall":
            thread.join(30)
            assert len(waited) == 1 and isinstance(waited[0], TaskNotFound), waited
        with pytest.raises(TaskNotFound):
            task.wait(timeout=5)
        with pytest.raises(TaskNotFound):
            list(task.results())

        assert kept.enqueue("tests.handlers:double", {"x": 7}).result(timeout=60) == 14
        assert other.enqueue("tests.handlers:double", {"x": 9}).result(timeout=60) == 18
        fresh = client.queue("fresh")
        assert fresh.enqueue("tests.handlers:double", {"x": 8}).result(timeout=60) == 16
        again = client.submit(
            TaskSpec(
                name="again",
                handler="tests.handlers:double",
                subtasks=[{"x": i} for i in range(20)],
            )
        )
        assert again.wait(timeout=60).state == TaskState.COMPLETED
        assert dict(again.results()) == {i: 2 * i for i in range(20)}
        alive(cluster)

        log = cluster.procs[0].log()
        lost = events(log, "schedules_lost")
        assert len(lost) == 1, log[-5000:]
        assert lost[0]["schedules"] == ["kept/tick"], lost
        assert len(events(log, "redis_emptied")) == 1, log[-5000:]
    finally:
        cluster.close()
        client.close()
        r.close()


@pytest.mark.integration
def test_results_of_a_vanished_task_raise_task_not_found(lonely: RedisServer, prefix: str) -> None:
    """A task's results after its record is gone: ``TaskNotFound``, not an empty list that
    reads as "no subtask succeeded" (sync and asyncio); a task that has none yet: none."""
    client = Client.from_url(lonely.url, prefix=prefix)
    r, keys = lonely.client(), Keys(prefix)
    task = client.submit(TaskSpec(name="t", handler="tests.handlers:double", subtasks=[{"x": 1}]))
    assert list(task.results()) == []  # none yet: the task is there
    r.delete(keys.task(task.id).record)
    with pytest.raises(TaskNotFound):
        list(task.results())

    async def main() -> None:
        async with AsyncClient.from_url(lonely.url, prefix=prefix) as ac:
            with pytest.raises(TaskNotFound):
                [item async for item in ac.task(task.id).results()]

    asyncio.run(main())
    client.close()


@pytest.mark.integration
def test_the_lease_says_when_it_went_with_the_data(lonely: RedisServer, prefix: str) -> None:
    """A leader's lease vanishes: with the data (the term counter behind its term, or at it
    under another holder), ``emptied`` is set, once per lease won; a lease that expired, or
    that another controller took over, is no loss of data."""
    r, keys = lonely.client(), Keys(prefix)

    def won(holder: str) -> Lease:
        lease = Lease(r, keys, Scripts(r), holder, 5.0, get_logger(), Tally())
        lease._tick()  # takes it (the thread's first step)
        assert lease.won.is_set()
        return lease

    lease = won("a")
    r.delete(keys.leader)  # it expired, nobody took it: the counter is still at our term
    lease.check_emptied()
    assert not lease.emptied.is_set()
    lease = won("a")
    r.set(keys.leader, "b#9")
    r.set(keys.leader_term, 9)  # another controller took it over
    lease._tick()  # the renewal finds another holder
    assert not lease.won.is_set() and not lease.emptied.is_set()

    r.delete(keys.leader)
    lease = won("a")
    r.flushall()
    lease._tick()  # the renewal finds it gone, the counter behind our term
    assert not lease.won.is_set() and lease.emptied.is_set()
    lease.emptied.clear()
    lease.check_emptied()
    assert not lease.emptied.is_set()  # said once

    r.flushall()
    lease = won("a")  # term 1 again
    r.flushall()
    other = won("b")  # another takes term 1 again: the counter is at our term, not ours
    lease.check_emptied()
    assert lease.emptied.is_set() and other.term == lease.term == 1


@pytest.mark.integration
def test_reclaim_finds_nothing_where_the_stream_or_its_group_is_gone(
    lonely: RedisServer, prefix: str
) -> None:
    """The claims and looks of a member on a stream that is gone, or has no group: nothing
    pending, nothing to claim (not a ``NOGROUP`` error)."""
    r, keys = lonely.client(), Keys(prefix)
    tk = keys.task("gone")
    reclaim = Reclaim(r, Scripts(r), tk, "w1")
    for _ in ("no stream", "no group"):
        assert reclaim.consumers(tk.stream) == {}
        assert reclaim.adopt_own(tk.stream) == []
        assert reclaim.hand_back(tk.stream) == []
        assert reclaim.backstop(tk.stream, 0) == ([], [])
        assert reclaim.departed(tk.stream, {"w0": 1}, []) == ([], [])
        r.xadd(tk.stream, {"i": "0"})  # a stream without the group


@pytest.mark.integration
def test_a_stream_gone_is_told_in_every_form_redis_says_it(lonely: RedisServer) -> None:
    """``NOGROUP`` alone or from a pipeline (redis-py puts the command before it), "no such
    key" from ``XINFO CONSUMERS``, ``UNBLOCKED`` for a read that waited: the stream named
    where Redis names it; any other error is not a stream gone."""
    r = lonely.client()
    with pytest.raises(redis.ResponseError) as alone:
        r.xreadgroup("g", "c", {"s1": ">"})
    pipe = r.pipeline(transaction=False)
    pipe.get("x")
    pipe.xreadgroup("g", "c", {"s2": ">"})
    with pytest.raises(redis.ResponseError) as piped:
        pipe.execute()
    with pytest.raises(redis.ResponseError) as info:
        r.xinfo_consumers("s3", "g")
    assert "of pipeline caused error" in str(piped.value)
    assert [gone_stream(e.value) for e in (alone, piped, info)] == ["s1", "s2", None]
    assert all(stream_gone(e.value) for e in (alone, piped, info))

    r.xgroup_create("s4", "g", id="0", mkstream=True)
    waited: list[BaseException] = []

    def read() -> None:
        try:
            lonely.client().xreadgroup("g", "c", {"s4": ">"}, block=10_000)
        except redis.ResponseError as exc:
            waited.append(exc)

    thread = threading.Thread(target=read)
    thread.start()
    wait_for(lambda: r.info("clients")["blocked_clients"] == 1, 10, "the read waiting")
    r.delete("s4")
    thread.join(10)
    # Redis's UNBLOCKED names no stream; valkey's (the embedded server) names it
    assert len(waited) == 1 and stream_gone(waited[0]) and gone_stream(waited[0]) in (None, "s4")
    r.set("k", "v")
    with pytest.raises(redis.ResponseError) as other:
        r.xreadgroup("g", "c", {"k": ">"})
    assert not stream_gone(other.value)


@pytest.mark.integration
def test_the_schedules_that_went_with_the_data_are_named_once(
    lonely: RedisServer, prefix: str
) -> None:
    """What the leader knew of the schedule index, against what is left: those whose
    definitions went are named, once; one made again meanwhile is not."""
    r, keys = lonely.client(), Keys(prefix)
    client = Client.from_url(lonely.url, prefix=prefix)
    mail, news = client.queue("mail"), client.queue("news")
    mail.schedule("digest", "tests.handlers:double", {"x": 1}, every=60.0)
    mail.schedule("nightly", "tests.handlers:double", {"x": 2}, cron="30 2 * * *")
    news.schedule("hourly", "tests.handlers:double", {"x": 3}, every=3600.0)
    emptied = Emptied(r, keys, get_logger(), Tally())
    emptied.read()
    r.flushall()
    news.schedule("hourly", "tests.handlers:double", {"x": 3}, every=3600.0)  # made again
    with capture_logs() as logs:
        emptied.lost()
        emptied.lost()
    said = [(e["event"], e.get("schedules")) for e in logs]
    assert said == [
        ("redis_emptied", None),
        ("schedules_lost", ["mail/digest", "mail/nightly"]),
        ("redis_emptied", None),
    ], logs
    client.close()
