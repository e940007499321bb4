"""``arun``: a plan (``queueworks.transport.plans``) done on a ``redis.asyncio`` client, step by
step,
as ``queueworks.transport.runner.run`` does it on a sync one (the same trips, the same replies)."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator, Iterator
from typing import Any, TypeVar

from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster
from redis.exceptions import NoScriptError

from queueworks.scripts.bound import AsyncScripts
from queueworks.scripts.calls import Call
from queueworks.transport.aio_connection import AsyncConnection
from queueworks.transport.plans import Chunk, Command, Plan, ReplicaWait, Sleep, Trip
from queueworks.transport.runner import Now, piped, read_replies
from queueworks.transport.topology import queue_replication_wait

T = TypeVar("T")


async def arun(r: AsyncConnection, scripts: AsyncScripts, plan: Plan[T]) -> T:
    """Do ``plan``'s steps on ``r`` (``scripts``: its scripts); the plan's result."""
    try:
        step = next(plan)
        while True:
            try:
                if type(step) is Trip:
                    value: Any = await send_trip(r, scripts, step)
                elif type(step) is Sleep:
                    await asyncio.sleep(step.seconds)
                    value = None
                else:
                    value = await next_chunk(step)  # type: ignore[arg-type]
            except BaseException as exc:
                step = plan.throw(exc)
                continue
            step = plan.send(value)
    except StopIteration as stop:
        result: T = stop.value
        return result


async def next_chunk(step: Chunk) -> list[Any]:
    source = step.source
    if isinstance(source, Iterator):
        return list(itertools.islice(source, step.size))
    assert isinstance(source, AsyncIterator)
    out: list[Any] = []
    while len(out) < step.size:
        try:
            out.append(await anext(source))
        except StopAsyncIteration:
            break
    return out


async def send_trip(r: AsyncConnection, scripts: AsyncScripts, trip: Trip) -> list[Any]:
    """One round trip: the replies of ``trip``'s ops, in order."""
    ops = trip.ops
    if len(ops) == 1 and not trip.errors:
        op = ops[0]
        if type(op) is Command:
            return [await r.execute_command(*op.args, **op.options)]
        if type(op) is Call:
            op.client = None
            return [await scripts.run(op)]
    cluster = isinstance(r, AsyncRedisCluster)
    pipe: Any = r.pipeline(transaction=False)
    slots: list[Any] = []  # as in ``queueworks.transport.runner.send_trip``
    for op in ops:
        if type(op) is Command:
            slots.append(len(pipe))
            pipe.execute_command(*op.args, **op.options)
        elif type(op) is ReplicaWait:
            start = len(pipe)
            waits = queue_replication_wait(pipe, r, op.keys, op.replicas, op.timeout_ms)
            slots.append(range(start, start + waits))
        elif cluster:
            op.client = None  # type: ignore[union-attr]
            slots.append(Now(await scripts.run(op)))  # type: ignore[arg-type]
        else:
            slots.append(len(pipe))
            await scripts.run(piped(op, pipe))  # type: ignore[arg-type]
    replies = list(await pipe.execute(raise_on_error=False)) if len(pipe) else []
    healed: dict[int, Any] = {}
    for op, slot in zip(ops, slots, strict=True):
        if type(op) is not Call or not op.bare or type(slot) is not int:
            continue
        if isinstance(replies[slot], NoScriptError):  # Redis lost its scripts: run it again
            op.client = None
            healed[id(op)] = await scripts.run(op)
    return read_replies(trip, slots, replies, lambda call: healed[id(call)])
