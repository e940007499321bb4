"""``Client`` and ``AsyncClient`` leave the same state in Redis.

The same scenarios run through each client, under a key prefix of its own on one private
Redis (no worker, no controller: nothing moves but what the clients write); then every key
under each prefix (its type, content and whether it expires) and the events are compared,
with what differs by nature (entry ids, timestamps, random job ids) normalised.
"""

from __future__ import annotations

import asyncio
import gc
import re
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest
import redis

from queueworks import AsyncClient, Client, TaskSpec
from queueworks.contrib.redis_server import RedisServer
from queueworks.scripts.bound import _source
from queueworks.scripts.calls import NAMES

pytestmark = pytest.mark.integration

HANDLER = "tests.handlers:double"
BIG = 1500  # past SUBMIT_BATCH: the streamed path


def specs() -> list[tuple[str, TaskSpec]]:
    return [
        ("none", TaskSpec(name="none", handler=HANDLER, subtasks=[])),
        ("three", TaskSpec(name="three", handler=HANDLER, subtasks=[{"x": i} for i in range(3)])),
        ("big", TaskSpec(name="big", handler=HANDLER, subtasks=({"x": i} for i in range(BIG)))),
        (
            "parts",
            TaskSpec(
                name="parts",
                handler=HANDLER,
                partitions=3,
                subtasks=[{"key": f"k{i % 5}", "x": i} for i in range(20)],
            ),
        ),
    ]


def run_sync(url: str, prefix: str) -> None:
    with Client.from_url(url, prefix=prefix) as client:
        for tid, spec in specs():
            client.submit(spec, task_id=tid)
        q = client.queue("mail", max_attempts=2)
        now = q.enqueue(HANDLER, {"x": 1})
        later = q.enqueue(HANDLER, {"x": 2}, delay=3600)
        q.enqueue_many([(HANDLER, {"x": i}) for i in range(5)])
        q.enqueue("tests.handlers:fail_odd", {"x": 3})
        assert now.status().state == "queued"
        assert later.status().state == "scheduled"
        assert later.cancel()
        assert now.cancel()
        assert q.status().backlog == 6
        assert client.queue("mail").settings.max_attempts == 2
        client.task("three").cancel()
        client.task("big").resize(1, 4)
        client.task("parts").set_priority(5)
        assert [t.id for t in client.tasks()] == ["none", "three", "big", "parts"]
        routes = client.queue("routes")
        routes.enqueue(HANDLER, {"x": 0})  # the queue knows the handler: the bare XADDs follow
        later = routes.enqueue(HANDLER, {"x": 1}, delay=3600)
        assert routes.enqueue(HANDLER, {"x": 2}, group="g", retry_delay=5).created
        held = routes.enqueue(HANDLER, {"x": 3}, key="k")
        again = routes.enqueue(HANDLER, {"x": 4}, key="k")
        assert (held.created, again.created, again.id) == (True, False, held.id)
        deferred = routes.enqueue(HANDLER, {"x": 5}, depends_on=[f"routes/{later.id}"])
        routes.enqueue(HANDLER, {"x": 6}, key="k2", depends_on=[f"routes/{later.id}"])
        routes.enqueue(HANDLER, {"x": 7}, priority=2)
        routes.enqueue(HANDLER, {"x": 8}, wait_replicas=0)
        routes.enqueue_many([(HANDLER, {"x": i}) for i in range(3)], group="g", priority=-1)
        assert deferred.status().state == "deferred"
        assert [s.name for s in client.queues()] == ["mail", "routes"]


async def run_async(url: str, prefix: str) -> None:
    async with AsyncClient.from_url(url, prefix=prefix) as client:
        for tid, spec in specs():
            await client.submit(spec, task_id=tid)
        q = await client.queue("mail", max_attempts=2)
        now = await q.enqueue(HANDLER, {"x": 1})
        later = await q.enqueue(HANDLER, {"x": 2}, delay=3600)
        await q.enqueue_many([(HANDLER, {"x": i}) for i in range(5)])
        await q.enqueue("tests.handlers:fail_odd", {"x": 3})
        assert (await now.status()).state == "queued"
        assert (await later.status()).state == "scheduled"
        assert await later.cancel()
        assert await now.cancel()
        assert (await q.status()).backlog == 6
        assert (await client.queue("mail")).settings.max_attempts == 2
        await client.task("three").cancel()
        await client.task("big").resize(1, 4)
        await client.task("parts").set_priority(5)
        assert [t.id for t in await client.tasks()] == ["none", "three", "big", "parts"]
        routes = await client.queue("routes")
        await routes.enqueue(HANDLER, {"x": 0})
        later = await routes.enqueue(HANDLER, {"x": 1}, delay=3600)
        assert (await routes.enqueue(HANDLER, {"x": 2}, group="g", retry_delay=5)).created
        held = await routes.enqueue(HANDLER, {"x": 3}, key="k")
        again = await routes.enqueue(HANDLER, {"x": 4}, key="k")
        assert (held.created, again.created, again.id) == (True, False, held.id)
        deferred = await routes.enqueue(HANDLER, {"x": 5}, depends_on=[f"routes/{later.id}"])
        await routes.enqueue(HANDLER, {"x": 6}, key="k2", depends_on=[f"routes/{later.id}"])
        await routes.enqueue(HANDLER, {"x": 7}, priority=2)
        await routes.enqueue(HANDLER, {"x": 8}, wait_replicas=0)
        await routes.enqueue_many([(HANDLER, {"x": i}) for i in range(3)], group="g", priority=-1)
        assert (await deferred.status()).state == "deferred"
        assert [s.name for s in await client.queues()] == ["mail", "routes"]


# -- what is compared ---------------------------------------------------------------------

_ENTRY = re.compile(r"\b\d{13}-\d+\b")  # a stream entry's id (a job to run now's id too)
_MS = re.compile(r"\b1[6-9]\d{11}\b")  # a time in ms
_TIME = re.compile(r"\b1[6-9]\d{8}(\.\d+)?\b")  # a time in s
_JOB = re.compile(r"\b[0-9a-f]{20}\b")  # a delayed job's id


def norm(value: Any) -> Any:
    if isinstance(value, bytes):
        value = value.decode()
    if isinstance(value, float | int) and not isinstance(value, bool):
        value = repr(value)
    if isinstance(value, str):
        value = _ENTRY.sub("<entry>", value)
        value = _MS.sub("<ms>", value)
        value = _TIME.sub("<time>", value)
        return _JOB.sub("<job>", value)
    if isinstance(value, dict):
        return sorted((norm(k), norm(v)) for k, v in value.items())
    if isinstance(value, list | tuple):
        return [norm(v) for v in value]
    return value


def state(r: redis.Redis, prefix: str) -> list[tuple[str, str, bool, Any]]:
    """(key, type, expires, content) of every key under ``prefix``, normalised."""
    out = []
    for raw in r.scan_iter(match=f"{prefix}:*", count=1000):
        key = raw.decode()
        kind = r.type(key).decode()
        if kind == "string":
            content: Any = r.get(key)
        elif kind == "hash":
            content = r.hgetall(key)
        elif kind == "set":
            content = sorted(norm(m) for m in r.smembers(key))
        elif kind == "zset":
            content = r.zrange(key, 0, -1, withscores=True)
        elif kind == "list":
            content = r.lrange(key, 0, -1)
        else:
            entries = r.xrange(key)
            groups = [
                (g["name"], g["consumers"], g["pending"], g["last-delivered-id"])
                for g in r.xinfo_groups(key)
            ]
            content = [[fields for _, fields in entries], groups]
        expires = r.pttl(key) > 0
        out.append((norm(key[len(prefix) :]), kind, expires, norm(content)))
    return sorted(out, key=repr)


def events(r: redis.Redis, prefix: str) -> list[Any]:
    return [norm(fields) for _, fields in r.xrange(f"{prefix}:events")]


# Commands of a connection's set-up or of loading scripts: not the operations' own.
_SETUP = ("client|", "hello", "select", "info", "config|", "ping", "script|", "eval")


def commands(r: redis.Redis) -> dict[str, int]:
    """How many times each command ran (but set-up ones), from ``INFO commandstats``."""
    stats: Any = r.info("commandstats")
    return {
        name.removeprefix("cmdstat_"): int(row["calls"])
        for name, row in stats.items()
        if not name.removeprefix("cmdstat_").startswith(_SETUP) or name == "cmdstat_evalsha"
    }


def test_both_clients_leave_the_same_state() -> None:
    """The same keys, contents and events, sent by the same commands (the small-task path
    of submit, one XADD for a job to run now, each route of an enqueue: options, a unique
    key, dependencies, a priority...), on a server of the test's own."""
    ps, pa = f"ps{uuid.uuid4().hex[:8]}", f"pa{uuid.uuid4().hex[:8]}"
    with RedisServer() as server:
        server.start()
        r = redis.Redis.from_url(server.url)
        try:
            for name in NAMES:  # loaded once, so that neither client meets NOSCRIPT
                r.script_load(_source(name))
            before = commands(r)
            run_sync(server.url, ps)
            middle = commands(r)
            try:
                asyncio.run(run_async(server.url, pa))
            finally:
                gc.collect()
            after = commands(r)
            sync_sent = {k: n - before.get(k, 0) for k, n in middle.items()}
            async_sent = {k: n - middle.get(k, 0) for k, n in after.items()}
            assert {k: n for k, n in sync_sent.items() if n} == {
                k: n for k, n in async_sent.items() if n
            }
            compare(r, ps, pa)
        finally:
            r.close()


def compare(r: redis.Redis, ps: str, pa: str) -> None:
    sync_events, async_events = events(r, ps), events(r, pa)
    kinds = [dict(e)["kind"] for e in sync_events]
    assert kinds.count("completed") == 1  # the task of no subtasks
    assert sync_events == async_events
    sync_state, async_state = state(r, ps), state(r, pa)
    assert len(sync_state) > 20
    assert [s[:3] for s in sync_state] == [s[:3] for s in async_state]
    assert sync_state == async_state


async def _subtasks(n: int) -> AsyncIterator[dict[str, int]]:
    for i in range(n):
        yield {"x": i}


def test_async_iterables_submit_as_lists_do(redis_url: str) -> None:
    """An async iterable of subtasks, small or streamed, writes what a list writes."""
    ps, pa = f"ps{uuid.uuid4().hex[:8]}", f"pa{uuid.uuid4().hex[:8]}"

    async def main() -> None:
        async with AsyncClient.from_url(redis_url, prefix=pa) as client:
            for n in (2, BIG):
                spec = TaskSpec(name=f"n{n}", handler=HANDLER, subtasks=_subtasks(n))
                await client.submit(spec, task_id=f"n{n}")

    with Client.from_url(redis_url, prefix=ps) as client:
        for n in (2, BIG):
            spec = TaskSpec(name=f"n{n}", handler=HANDLER, subtasks=[{"x": i} for i in range(n)])
            client.submit(spec, task_id=f"n{n}")
    try:
        asyncio.run(main())
    finally:
        gc.collect()
    r = redis.Redis.from_url(redis_url)
    try:
        assert state(r, ps) == state(r, pa)
    finally:
        r.close()
