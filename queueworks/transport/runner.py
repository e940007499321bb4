"""``run``: a plan (``queueworks.transport.plans``) done on a sync Redis client, step by step.

A trip of one plain command goes out alone (``one_command`` when redis-py would not parse
its reply: the enqueue hot path's ``XADD``), of one script call at once (EVALSHA, loading
the script if Redis lost it); any other trip is one pipeline. Script calls keep their
pipeline semantics (``queueworks.scripts.calls.Call``): redis-py's SCRIPT EXISTS before a
pipeline that holds one, a ``bare`` call as a plain EVALSHA healed after a NOSCRIPT reply,
and on a cluster every call at once, before the pipeline (a cluster pipeline refuses
EVALSHA). The asyncio twin is ``queueworks.transport.aio_runner``.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterator
from typing import Any, TypeVar

from redis.cluster import RedisCluster
from redis.exceptions import NoScriptError

from queueworks.scripts.bound import Scripts
from queueworks.scripts.calls import Call
from queueworks.transport.connection import Connection, one_command
from queueworks.transport.plans import Chunk, Command, Plan, ReplicaWait, Sleep, Trip
from queueworks.transport.topology import queue_replication_wait

T = TypeVar("T")


class Now:
    """A slot's value known before the pipeline runs (a script call run at once)."""

    __slots__ = ("value",)

    def __init__(self, value: Any) -> None:
        self.value = value


def run(r: Connection, scripts: Scripts, plan: Plan[T]) -> T:
    """Do ``plan``'s steps on ``r`` (``scripts``: its scripts); the plan's result."""
    try:
        step = next(plan)
        while True:
            try:
                if type(step) is Trip:
                    value: Any = send_trip(r, scripts, step)
                elif type(step) is Sleep:
                    time.sleep(step.seconds)
                    value = None
                else:
                    value = next_chunk(step)  # type: ignore[arg-type]
            except BaseException as exc:
                step = plan.throw(exc)
                continue
            step = plan.send(value)
    except StopIteration as stop:
        result: T = stop.value
        return result


def next_chunk(step: Chunk) -> list[Any]:
    if not isinstance(step.source, Iterator):
        raise TypeError("an async iterable needs the asyncio client")
    return list(itertools.islice(step.source, step.size))


def send_trip(r: Connection, scripts: Scripts, trip: Trip) -> list[Any]:
    """One round trip: the replies of ``trip``'s ops, in order."""
    ops = trip.ops
    if len(ops) == 1 and not trip.errors:
        op = ops[0]
        if type(op) is Command:
            if isinstance(r, RedisCluster):
                cluster: Any = r
                return [cluster.execute_command(*op.args, **op.options)]
            if not op.options and op.args[0] not in r.response_callbacks:
                return [one_command(r, *op.args)]  # raw: the same reply, less machinery
            return [r.execute_command(*op.args, **op.options)]  # type: ignore[no-untyped-call]
        if type(op) is Call:
            return [scripts.run(op)]
    cluster = isinstance(r, RedisCluster)
    pipe: Any = r.pipeline(transaction=False)
    slots: list[Any] = []  # per op: its reply's position, a range of them (WAITs), or Now
    for op in ops:
        if type(op) is Command:
            slots.append(len(pipe))
            pipe.execute_command(*op.args, **op.options)
        elif type(op) is ReplicaWait:
            start = len(pipe)
            waits = queue_replication_wait(pipe, r, op.keys, op.replicas, op.timeout_ms)
            slots.append(range(start, start + waits))
        else:
            slots.append(queue_call(scripts, op, None if cluster else pipe))  # type: ignore[arg-type]
    replies = pipe.execute(raise_on_error=False) if len(pipe) else []
    return read_replies(trip, slots, replies, lambda call: scripts.run(call))


def queue_call(scripts: Scripts, call: Call[Any], pipe: Any) -> Any:
    """Put ``call`` on ``pipe`` (None: run it at once); its slot."""
    if pipe is None:
        call.client = None
        return Now(scripts.run(call))
    start = len(pipe)
    scripts.run(piped(call, pipe))
    return start


def piped(call: Call[Any], pipe: Any) -> Call[Any]:
    """``call`` to queue on ``pipe``: its reply is read once the pipeline has run."""
    return Call(call.name, call.keys, call.args, _same, pipe, call.unpiped_on_cluster, call.bare)


def _same(reply: Any) -> Any:
    return reply


def read_replies(trip: Trip, slots: list[Any], replies: list[Any], again: Any) -> list[Any]:
    """Each op's value from the pipeline's ``replies``: a call's read by the call (a
    ``bare`` one that met NOSCRIPT run ``again`` at once), a WAIT's the fewest replicas;
    the first error reply raised unless the trip takes errors as values."""
    out: list[Any] = []
    for op, slot in zip(trip.ops, slots, strict=True):
        if type(slot) is Now:
            out.append(slot.value)
            continue
        if type(slot) is range:
            acks = [replies[i] for i in slot]
            errors = [a for a in acks if isinstance(a, Exception)]
            out.append(errors[0] if errors else min(int(a) for a in acks))
            continue
        reply = replies[slot]
        if type(op) is Call:
            if isinstance(reply, NoScriptError) and op.bare:
                op.client = None
                reply = again(op)
            elif not isinstance(reply, Exception):
                reply = op.read(reply)
        out.append(reply)
    if not trip.errors:
        for value in out:
            if isinstance(value, Exception):
                raise value
    return out
