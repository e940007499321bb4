"""Issue 20, the client side: ``AsyncClient`` on ``redis.asyncio`` against ``Client`` on the
same data (written by one, read by the other), jobs and subtasks run by real worker
processes, the errors, and gathered enqueues that each land once. Real Redis throughout;
each test runs its coroutine with ``asyncio.run``.

Budget: ~60 s for the file (sentinel and cluster setups included).
"""

from __future__ import annotations

import asyncio
import gc
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable, Coroutine
from datetime import datetime, timedelta
from typing import Any, TypeVar

import pytest
import redis

from queueworks import (
    AsyncClient,
    AsyncTask,
    Client,
    JobFailed,
    JobState,
    SubmitError,
    TaskNotFound,
    TaskSpec,
    TaskState,
)
from queueworks.errors import NotReplicated
from queueworks.protocol.keys import Keys
from queueworks.scripts.bound import DeadEntry
from tests import handlers
from tests.conftest import Cluster

T = TypeVar("T")


def run(main: Callable[[], Coroutine[Any, Any, T]]) -> T:
    """``asyncio.run(main())``, then collect its garbage: redis.asyncio's pools and clients
    have finalizers, and one run by a later, random collection inside an ``ast.parse``
    (pytest rewriting a module it imports late) trips CPython 3.11's "AST constructor
    recursion depth mismatch" SystemError."""
    try:
        return asyncio.run(main())
    finally:
        gc.collect()


def payload(i: int) -> dict[str, Any]:
    return {"x": i, "key": f"k{i % 7}"}


async def payloads(n: int, bad_at: int | None = None) -> AsyncIterator[Any]:
    """``payload(i)`` for i < n (an object that is no JSON at ``bad_at``), as an async
    generator that really awaits now and then."""
    for i in range(n):
        if i % 500 == 0:
            await asyncio.sleep(0)
        yield object() if i == bad_at else payload(i)


def stream_entries(r: redis.Redis, stream: str) -> list[dict[bytes, bytes]]:
    entries: Any = r.xrange(stream)
    return [fields for _, fields in entries]


def keys_of(r: redis.Redis, prefix: str, task_id: str) -> list[bytes]:
    return list(r.scan_iter(match=f"{prefix}:task:{{{task_id}}}*"))


# -- no worker needed ----------------------------------------------------------------------


@pytest.mark.integration
def test_submit_writes_what_the_sync_client_writes_and_each_reads_the_other(
    redis_url: str, prefix: str, client: Client, r: redis.Redis, keys: Keys
) -> None:
    async def main() -> None:
        async with AsyncClient.from_url(redis_url, prefix=prefix) as ac:
            # 2,500 subtasks from an async generator: three batches, one pipelined round trip
            spec = TaskSpec(name="plain", handler="m:f", subtasks=payloads(2500), priority=3)
            task = await ac.submit(spec, task_id="from-async")
            assert isinstance(task, AsyncTask) and task.id == "from-async"
            same = spec.model_copy(update={"subtasks": [payload(i) for i in range(2500)]})
            client.submit(same, task_id="from-sync")
            a, s = keys.task("from-async"), keys.task("from-sync")
            assert stream_entries(r, a.stream) == stream_entries(r, s.stream)
            assert len(stream_entries(r, a.stream)) == 2500
            rec_a: Any = r.hgetall(a.record)
            rec_s: Any = r.hgetall(s.record)
            del rec_a[b"created_at"], rec_s[b"created_at"]
            assert rec_a == rec_s
            assert r.ttl(a.stream) == -1  # the record made the stream permanent
            # each reads the other's task, and sees what the other sees
            assert await task.status() == client.task("from-async").status()
            assert await ac.task("from-sync").status() == client.task("from-sync").status()
            # a partitioned task: each key's subtasks on its partition's stream, as sync
            parts = TaskSpec(name="p", handler="m:f", partitions=3, subtasks=payloads(300))
            await ac.submit(parts, task_id="parts-async")
            same = parts.model_copy(update={"subtasks": [payload(i) for i in range(300)]})
            client.submit(same, task_id="parts-sync")
            pa, ps = keys.task("parts-async"), keys.task("parts-sync")
            for k in range(3):
                assert stream_entries(r, pa.partition(k)) == stream_entries(r, ps.partition(k))
            # nothing to do: completed at once, through the same path as sync
            empty = await ac.submit(TaskSpec(name="e", handler="m:f", subtasks=[]))
            assert (await empty.wait(timeout=5)).state == TaskState.COMPLETED
            assert client.task(empty.id).status().state == TaskState.COMPLETED
            assert await ac.tasks() == client.tasks()
            assert [t.id for t in await ac.tasks()] == [
                "from-async",
                "from-sync",
                "parts-async",
                "parts-sync",
                empty.id,
            ]

    run(main)


@pytest.mark.integration
def test_submit_errors_name_the_subtask_and_leave_nothing_behind(
    redis_url: str, prefix: str, client: Client, r: redis.Redis
) -> None:
    async def main() -> None:
        async with AsyncClient.from_url(redis_url, prefix=prefix) as ac:
            bad = TaskSpec(name="bad", handler="m:f", subtasks=payloads(2500, bad_at=1700))
            with pytest.raises(SubmitError, match=r"subtasks\[1700\] is not JSON-serializable"):
                await ac.submit(bad, task_id="bad")  # after two batches were written
            assert keys_of(r, prefix, "bad") == []
            with pytest.raises(TaskNotFound):
                await ac.task("bad").status()
            nokey = TaskSpec(name="nk", handler="m:f", partitions=2, subtasks=[{"x": 1}])
            with pytest.raises(SubmitError, match=r"subtasks\[0\]: a partitioned task needs"):
                await ac.submit(nokey, task_id="nokey")
            assert keys_of(r, prefix, "nokey") == []
            await ac.submit(TaskSpec(name="t", handler="m:f", subtasks=[1]), task_id="taken")
            with pytest.raises(SubmitError, match="task_id: a task 'taken' exists already"):
                await ac.submit(TaskSpec(name="t", handler="m:f", subtasks=[2]), task_id="taken")
            with pytest.raises(ValueError, match="task id 'a b' must match"):
                await ac.submit(TaskSpec(name="t", handler="m:f"), task_id="a b")
            with pytest.raises(ValueError, match="wait_replicas >= 0"):
                await ac.submit(TaskSpec(name="t", handler="m:f"), wait_replicas=-1)
            with pytest.raises(TypeError, match="spec must be a TaskSpec"):
                await ac.submit({"name": "t"})  # type: ignore[arg-type]
            # no replica here: the task is written, and the error carries its handle
            with pytest.raises(NotReplicated) as lonely:
                await ac.submit(
                    TaskSpec(name="t", handler="m:f", subtasks=[1]),
                    wait_replicas=1,
                    wait_timeout=0.1,
                )
            assert isinstance(lonely.value.task, AsyncTask)
            assert (await lonely.value.task.status()).total == 1
            for missing in (ac.task("nope").status(), ac.task("nope").wait(1)):
                with pytest.raises(TaskNotFound):
                    await missing
        # an async iterable is for the async client; the sync one says so and writes nothing
        with pytest.raises(SubmitError, match=r"async iterable needs AsyncClient\.submit"):
            client.submit(TaskSpec(name="t", handler="m:f", subtasks=payloads(3)), task_id="s")
        assert keys_of(r, prefix, "s") == []

    run(main)


@pytest.mark.integration
def test_task_controls_match_the_sync_client(
    redis_url: str, prefix: str, client: Client, r: redis.Redis, keys: Keys
) -> None:
    async def main() -> None:
        async with AsyncClient.from_url(redis_url, prefix=prefix) as ac:
            task = await ac.submit(TaskSpec(name="c", handler="m:f", subtasks=[1, 2, 3]))
            sync = client.task(task.id)
            await task.set_priority(7)
            await task.resize(2, 4)
            st = sync.status()
            assert (st.priority, st.min_nodes, st.max_nodes) == (7, 2, 4)
            await task.resize(3, None)
            assert sync.status().max_nodes is None and sync.status().min_nodes == 3
            with pytest.raises(ValueError, match="min_nodes must be between 1 and 1000000, got 0"):
                await task.resize(0, 1)
            with pytest.raises(TimeoutError, match=f"task {task.id} still queued after 0.2 s"):
                await task.wait(timeout=0.2, poll=0.05)
            assert await task.cancel() is True
            assert sync.status().state == TaskState.CANCELLED
            assert await task.cancel() is False  # finished already
            with pytest.raises(ValueError, match="has finished; it cannot change"):
                await task.set_priority(1)
            events = [f[b"kind"] for f in stream_entries(r, keys.events)]
            assert events == [b"submitted", b"changed", b"changed", b"changed", b"cancelled"]
            other = client.submit(TaskSpec(name="d", handler="m:f", subtasks=[1]))
            other.cancel()
            assert (await ac.task(other.id).wait(timeout=1)).state == TaskState.CANCELLED
            assert await ac.task(other.id).dead_letters() == other.dead_letters() == []

    run(main)


@pytest.mark.integration
def test_every_script_runs_alike_through_both_executors(
    redis_url: str, prefix: str, client: Client, r: redis.Redis, keys: Keys
) -> None:
    """The async executor runs the same calls as the sync one: a member's whole path
    (join, fenced read, settle with a dead letter, reclaim, depart) through each, on two
    identical tasks, gives the same replies and the same records."""
    from queueworks.scripts.bound import AsyncScripts, Scripts

    assert {n for n in dir(Scripts) if not n.startswith("_")} == {
        n for n in dir(AsyncScripts) if not n.startswith("_")
    }
    spec = TaskSpec(name="s", handler="m:f", subtasks=[{"x": i} for i in range(4)])
    for tid in ("via-sync", "via-async"):
        client.submit(spec.model_copy(), task_id=tid)

    def path_sync(tid: str) -> list[Any]:
        s, tk, now = Scripts(client.redis), keys.task(tid), 1000.0
        out: list[Any] = [s.join(tk, "a", 3000, now), s.join(tk, "b", 3000, now)]
        status, reply = s.fenced_read(tk, [tk.stream], "a", 3, 2)
        ids = [e.decode() for e, _ in reply[0][1]]
        dead = DeadEntry(ids[2], 2, "failed", "boom", 3, "{}")
        out += [status, s.settle(tk, tk.stream, "a", now, [(ids[0], 0, "1")], [dead])]
        claimed, gone = s.reclaim(tk, tk.stream, "b", from_consumer="a", only_departed=False)
        out += [
            [c.fields for c in claimed],
            gone,
            s.depart(tk, "a", now, "leave", only_if_dead=False),
        ]
        return out

    async def path_async(tid: str) -> list[Any]:
        async with AsyncClient.from_url(redis_url, prefix=prefix) as ac:
            s, tk, now = ac.scripts, keys.task(tid), 1000.0
            out: list[Any] = [await s.join(tk, "a", 3000, now), await s.join(tk, "b", 3000, now)]
            status, reply = await s.fenced_read(tk, [tk.stream], "a", 3, 2)
            ids = [e.decode() for e, _ in reply[0][1]]
            dead = DeadEntry(ids[2], 2, "failed", "boom", 3, "{}")
            out += [status, await s.settle(tk, tk.stream, "a", now, [(ids[0], 0, "1")], [dead])]
            claimed, gone = await s.reclaim(
                tk, tk.stream, "b", from_consumer="a", only_departed=False
            )
            out += [[c.fields for c in claimed], gone]
            out.append(await s.depart(tk, "a", now, "leave", only_if_dead=False))
            return out

    got_sync = path_sync("via-sync")
    got_async = run(lambda: path_async("via-async"))
    assert got_async == got_sync
    assert got_sync[3].ok == 1 and got_sync[3].dead == 1 and len(got_sync[4]) == 1
    a, s = client.task("via-async").status(), client.task("via-sync").status()
    assert (a.done, a.dead, a.epoch) == (s.done, s.dead, s.epoch) == (1, 1, 3)
    assert client.task("via-async").dead_letters()[0].reason == "failed"


# -- with real worker processes ------------------------------------------------------------


@pytest.mark.system
def test_results_dead_letters_and_workers_through_real_processes(
    cluster: Cluster, redis_url: str, prefix: str, client: Client, r: redis.Redis
) -> None:
    cluster.controller()
    worker = cluster.worker()
    cluster.wait_workers(r, 1)

    async def main() -> None:
        async with AsyncClient.from_url(redis_url, prefix=prefix) as ac:
            spec = TaskSpec(
                name="odd",
                handler="tests.handlers:fail_odd",
                max_attempts=1,
                subtasks=[{"x": i} for i in range(40)],
            )
            task = await ac.submit(spec)
            status = await task.wait(timeout=60)
            assert (status.state, status.done, status.dead) == (TaskState.COMPLETED, 20, 20)
            got = {i: v async for i, v in task.results()}
            assert got == dict(client.task(task.id).results()) == {i: i for i in range(0, 40, 2)}
            dead = await task.dead_letters()
            assert dead == client.task(task.id).dead_letters()
            assert sorted(d.index for d in dead if d.index is not None) == list(range(1, 40, 2))
            assert all(d.reason and "odd" in d.error for d in dead)
            workers = await ac.workers()
            assert [w.id for w in workers] == [w.id for w in client.workers()] == [worker.name]
            await ac.drain_worker(worker.name)

    run(main)
    assert worker.p.wait(20) == 0  # drained: it left and exited


@pytest.mark.system
def test_queue_jobs_through_real_workers(
    cluster: Cluster, redis_url: str, prefix: str, client: Client, r: redis.Redis
) -> None:
    cluster.controller()
    cluster.worker()
    cluster.wait_workers(r, 1)

    async def main() -> None:
        async with AsyncClient.from_url(redis_url, prefix=prefix) as ac:
            q = await ac.queue("aq", max_attempts=2, job_timeout=5.0)
            assert client.queue("aq").settings == q.settings  # the sync client opens it
            assert (await ac.queue("aq")).settings == q.settings
            with pytest.raises(ValueError, match="queue 'aq' exists with max_attempts=2"):
                await ac.queue("aq", max_attempts=3)
            job = await q.enqueue("tests.handlers:double", {"x": 21})
            assert await job.result(timeout=30) == 42
            assert client.queue("aq").job(job.id).result(timeout=1) == 42
            assert await job.status() == client.queue("aq").job(job.id).status()
            echo = await q.enqueue(handlers.job_echo, {"x": 1})  # the function itself
            assert (await echo.result(timeout=30))["job"] == echo.id
            # enqueued by the sync client, awaited by the async one
            sync_job = client.queue("aq").enqueue("tests.handlers:square", {"x": 9})
            assert await q.job(sync_job.id).result(timeout=30) == 81
            # delayed: scheduled, then run at its time
            t0 = time.time()
            later = await q.enqueue("tests.handlers:double", {"x": 2}, delay=1.0)
            at = await q.enqueue(
                "tests.handlers:double", {"x": 3}, at=datetime.now() + timedelta(seconds=1)
            )
            assert (await later.status()).state == JobState.SCHEDULED
            assert (await later.result(timeout=30), await at.result(timeout=30)) == (4, 6)
            started = (await later.status()).started_at
            assert started is not None and started >= t0 + 1.0

            # many, from an async generator and from a list
            async def many() -> AsyncIterator[tuple[str, Any]]:
                for i in range(1200):
                    yield "tests.handlers:double", {"x": i}

            batch = await q.enqueue_many(many())
            more = await q.enqueue_many([("tests.handlers:square", {"x": i}) for i in range(10)])
            got = await asyncio.gather(*(j.result(timeout=60) for j in batch + more))
            assert got == [2 * i for i in range(1200)] + [i * i for i in range(10)]
            status, sync_status = await q.status(), client.queue("aq").status()
            assert status.done == sync_status.done == 5 + 1200 + 10
            steady = {"name", "state", "backlog", "scheduled", "running", "done", "dead"}
            steady |= {"rejected", "epoch", "min_nodes", "max_nodes", "priority"}
            assert status.model_dump(include=steady) == sync_status.model_dump(include=steady)
            assert [s.name for s in await ac.queues()] == [s.name for s in client.queues()]

    run(main)


@pytest.mark.system
def test_job_errors_timeouts_and_cancel(
    cluster: Cluster, redis_url: str, prefix: str, client: Client, r: redis.Redis
) -> None:
    cluster.controller()

    async def main() -> None:
        async with AsyncClient.from_url(redis_url, prefix=prefix) as ac:
            q = await ac.queue("strict", job_timeout=0.5, max_attempts=2)
            hung = await q.enqueue("tests.handlers:sleep_for", {"seconds": 5})
            waiting = await q.enqueue("tests.handlers:double", {"x": 3})
            delayed = await q.enqueue("tests.handlers:double", {"x": 4}, delay=30)
            assert await waiting.cancel() and await delayed.cancel()  # nobody read them yet
            assert not await delayed.cancel()
            assert (await waiting.status()).state == JobState.CANCELLED
            with pytest.raises(TimeoutError, match=f"job {hung.id} not finished after 0.2 s"):
                await hung.result(timeout=0.2)  # no worker yet
            with pytest.raises(TimeoutError):  # the call is cancelled: its polling stops
                await asyncio.wait_for(hung.result(), 0.2)
            await asyncio.sleep(0.1)
            assert asyncio.all_tasks() == {asyncio.current_task()}  # no poller left behind
            cluster.worker()
            failing = await q.enqueue("tests.handlers:always_fails", {"x": 1})
            with pytest.raises(JobFailed) as failed:
                await hung.result(timeout=30)
            assert failed.value.reason == "failed 2 times"
            assert "timed out: it ran past job_timeout (0.5 s)" in failed.value.traceback
            with pytest.raises(JobFailed) as also:
                await failing.result(timeout=30)
            with pytest.raises(JobFailed) as sync_also:
                client.queue("strict").job(failing.id).result(timeout=1)
            assert (also.value.reason, also.value.traceback) == (
                sync_also.value.reason,
                sync_also.value.traceback,
            )
            assert "ValueError: cannot handle" in also.value.traceback
            with pytest.raises(JobFailed, match="cancelled"):
                await waiting.result(timeout=1)
            assert not await hung.cancel()  # finished: nothing to cancel
            for call in (q.job("nope").result(1), q.job("nope").status(), q.job("nope").cancel()):
                with pytest.raises(LookupError, match="queue 'strict' has no job 'nope'"):
                    await call
            with pytest.raises(ValueError, match=r"must look like 'package\.module:function'"):
                await q.enqueue("not a path", {})
            with pytest.raises(ValueError, match="payload is not JSON"):
                await q.enqueue("tests.handlers:double", {"x": {1, 2}})
            with pytest.raises(ValueError, match="give delay or at, not both"):
                await q.enqueue("tests.handlers:double", {}, delay=1, at=time.time())
            await ac.submit(TaskSpec(name="t", handler="m:f", subtasks=[]), task_id="plain")
            with pytest.raises(ValueError, match="not a queue"):
                await ac.queue("plain")
            await q.task.cancel()
            with pytest.raises(ValueError, match="queue 'strict' was cancelled; it takes no jobs"):
                await ac.queue("strict")
            status = await q.status()
            assert (status.dead, status.done, status.state) == (2, 0, TaskState.CANCELLED)

    run(main)


@pytest.mark.system
def test_gathered_enqueues_each_land_once_through_a_small_pool(
    cluster: Cluster, redis_url: str, prefix: str, client: Client, r: redis.Redis, keys: Keys
) -> None:
    """3,000 ``await q.enqueue()`` at once, and then 3,000 ``await job.result()``, on a
    client of 4 connections: each job is written once (the enqueues share a few round
    trips), run once by the workers, and every call gets its own answer."""
    n, log = 3000, f"{prefix}:log"

    def evalsha_calls() -> int:
        stats: Any = r.info("commandstats")
        return int(stats.get("cmdstat_evalsha", {}).get("calls", 0))

    async def enqueue_all(ac: AsyncClient) -> list[Any]:
        q = await ac.queue("gathered")
        before = evalsha_calls()
        jobs = await asyncio.gather(
            *(q.enqueue(handlers.job_logged, {"x": i, "log": log}) for i in range(n))
        )
        round_trips = evalsha_calls() - before
        assert round_trips <= 4 * n // 500, f"{round_trips} Lua calls for {n} enqueues"
        return list(jobs)

    async def main() -> None:
        async with AsyncClient.from_url(redis_url, prefix=prefix, max_connections=4) as ac:
            jobs = await enqueue_all(ac)  # before any worker: only this client calls Lua
            assert len({j.id for j in jobs}) == n
            assert r.xlen(keys.task("gathered").stream) == n
            cluster.controller()
            cluster.worker()
            cluster.worker()
            got = await asyncio.gather(*(j.result(timeout=90) for j in jobs))
            assert got == [2 * i for i in range(n)]
            status = await (await ac.queue("gathered")).status()
            assert (status.done, status.dead, status.backlog, status.running) == (n, 0, 0, 0)

    run(main)
    runs = Counter(line.decode().split("|")[0] for line in r.lrange(log, 0, -1))
    assert len(runs) == n and set(runs.values()) == {1}  # each job ran once


@pytest.mark.integration
def test_an_enqueue_cancelled_before_its_round_trip_is_not_written(
    redis_url: str, prefix: str, r: redis.Redis, keys: Keys
) -> None:
    async def main() -> None:
        async with AsyncClient.from_url(redis_url, prefix=prefix) as ac:
            q = await ac.queue("c")
            calls = [
                asyncio.ensure_future(q.enqueue("tests.handlers:double", {"x": i}))
                for i in range(10)
            ]
            await asyncio.sleep(0)  # call 0 is sending its job; the others wait for it
            for call in calls[1::2]:
                call.cancel()
            done = await asyncio.gather(*calls, return_exceptions=True)
            assert all(isinstance(c, asyncio.CancelledError) for c in done[1::2])
            kept = [j for j in done[::2] if not isinstance(j, BaseException)]
            assert len(kept) == 5
            entries: Any = r.xrange(keys.task("c").stream)
            assert sorted(e.decode() for e, _ in entries) == sorted(j.id for j in kept)

    run(main)


@pytest.mark.integration
def test_bad_urls_and_unreachable_servers_are_one_clear_error(prefix: str) -> None:
    with pytest.raises(ValueError, match="invalid Redis URL") as bad:
        AsyncClient.from_url("http://user:s3cret@host/0")
    assert "s3cret" not in str(bad.value)

    async def main() -> None:
        ac = AsyncClient.from_url("redis://:s3cret@127.0.0.1:1/0", prefix=prefix)
        with pytest.raises(redis.ConnectionError) as down:
            await ac.tasks()
        assert "s3cret" not in str(down.value)
        await ac.close()

    run(main)


# -- sentinel and cluster ------------------------------------------------------------------


@pytest.mark.integration
def test_through_a_sentinel(prefix: str) -> None:
    from tests.cluster_fixtures import LocalSentinel

    with LocalSentinel(replicas=1, sentinels=3) as sentinel:

        async def main() -> None:
            async with AsyncClient.from_url(sentinel.url, prefix=prefix, max_connections=3) as ac:
                spec = TaskSpec(name="s", handler="m:f", subtasks=payloads(1500))
                task = await ac.submit(spec, wait_replicas=1, wait_timeout=5.0)
                assert (await task.status()).total == 1500
                q = await ac.queue("sq")
                jobs = await asyncio.gather(*(q.enqueue("m:f", {"i": i}) for i in range(300)))
                states = await asyncio.gather(*(j.status() for j in jobs))  # 300 on 3 conns
                assert Counter(s.state for s in states) == {JobState.QUEUED: 300}
            with Client.from_url(sentinel.url, prefix=prefix) as sync:
                assert sync.task(task.id).status().total == 1500
                assert sync.queue("sq").status().backlog == 300

        run(main)


@pytest.mark.integration
def test_on_a_redis_cluster(prefix: str) -> None:
    from tests.cluster_fixtures import LocalCluster
    from tests.conftest import REDIS_INSTALL, need_program

    need_program("redis-cli", REDIS_INSTALL)  # `redis-cli --cluster create` joins the nodes
    with LocalCluster(3) as lc:

        async def main() -> None:
            async with AsyncClient.from_url(lc.url, prefix=prefix, max_connections=3) as ac:
                tasks = [
                    await ac.submit(
                        TaskSpec(
                            name=f"t{i}",
                            handler="m:f",
                            subtasks=payloads(1200),
                            partitions=i % 2 * 3,
                        )
                    )
                    for i in range(4)
                ]  # ids spread over the shards
                q = await ac.queue("cq")
                jobs = await asyncio.gather(*(q.enqueue("m:f", {"i": i}) for i in range(300)))
                states = await asyncio.gather(*(j.status() for j in jobs))  # waits, no error
                assert len(states) == 300
                with Client.from_url(lc.url, prefix=prefix) as sync:
                    assert await ac.tasks() == sync.tasks()
                    assert [(await t.status()).total for t in tasks] == [1200] * 4
                    assert sync.queue("cq").status().backlog == 300
                    assert await q.status() == sync.queue("cq").status()
            down = AsyncClient.from_url("redis+cluster://127.0.0.1:1", prefix=prefix)
            with pytest.raises(redis.ConnectionError, match="no seed node of the cluster"):
                await down.tasks()
            await down.close()

        run(main)
