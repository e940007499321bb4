"""Typed functions for the Lua scripts in ``queueworks/lua/``, one per script, for a sync
client (``Scripts``) and an asyncio one (``AsyncScripts``).

What a script is called with and what its reply means is written once, in
``queueworks.scripts.calls`` (a pure function per script that builds a ``Call``); here two
executors run those calls: ``Scripts(r).settle(...)`` returns the ``Settled``,
``await AsyncScripts(ar).settle(...)`` too. Each script's contract (KEYS, ARGV, reply) is
written at the top of its file. Scripts are loaded once per client with
``register_script`` (EVALSHA, falling back to EVAL after a server restart flushed the
script cache).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from functools import cache
from importlib import resources
from string import Template
from typing import TYPE_CHECKING, Any, Generic, ParamSpec, TypeVar, overload

from redis.asyncio.cluster import ClusterPipeline as AsyncClusterPipeline
from redis.cluster import ClusterPipeline
from redis.commands.core import AsyncScript, Script
from redis.exceptions import NoScriptError

from queueworks.protocol import job_options, jobrecords, messages, records
from queueworks.protocol.keys import GROUP
from queueworks.protocol.models import JobState, TaskState
from queueworks.scripts import calls, flow_calls
from queueworks.scripts.calls import (  # re-exported: the workers' and tests' names
    ACTIVE,
    DRAIN_BATCH,
    NAMES,
    READ_EPOCH_MOVED,
    READ_FENCED,
    Call,
    Claimed,
    DeadEntry,
    EnqueueBatch,
    JobBatch,
    Joined,
    NewJob,
    Settled,
    SettledJob,
    fields_of,
    job_ids,
)

if TYPE_CHECKING:
    from queueworks.transport.aio_connection import AsyncConnection
    from queueworks.transport.connection import Connection

__all__ = [
    "ACTIVE",
    "READ_EPOCH_MOVED",
    "READ_FENCED",
    "AsyncScripts",
    "Call",
    "Claimed",
    "DeadEntry",
    "EnqueueBatch",
    "JobBatch",
    "Joined",
    "NewJob",
    "Queued",
    "Scripts",
    "Settled",
    "SettledJob",
    "fields_of",
    "job_ids",
]

P = ParamSpec("P")
T = TypeVar("T")

# Constants a script writes, given to it from Python when it is loaded (``${NAME}`` in
# its source), never retyped there: the states, and the field names of the formats the
# scripts read and write, from the codec that owns each.
_CONSTANTS = {state.name: state.value for state in JobState}
_CONSTANTS |= {f"TASK_{state.name}": state.value for state in TaskState}
_CONSTANTS |= jobrecords.LUA_NAMES | messages.LUA_NAMES | records.LUA_NAMES
_CONSTANTS["OPTION_GROUP"] = job_options.GROUP_FIELD
_CONSTANTS["DRAIN_BATCH"] = str(DRAIN_BATCH)
_CONSTANTS["GROUP"] = GROUP


@cache
def _source(name: str) -> str:
    if name == "fenced":
        return fenced_source()
    text = resources.files("queueworks").joinpath("lua", f"{name}.lua").read_text()
    if name == "set_state":  # one rule for a finished queue's waiters, two callers
        text = f"local function bury_waiters(KEYS, ARGV)\n{_source('bury_waiters')}\nend\n" + text
    return Template(text).substitute(_CONSTANTS) if "${" in text else text


def fenced_source() -> str:
    """``fenced.lua`` with the rules it applies put before it as functions (its header)."""
    parts = [
        f"local function {name}(KEYS, ARGV)\n{_source(name)}\nend\n"
        for name in ("set_state", "expire_finished", "fire_schedule")
    ]
    return "".join(parts) + resources.files("queueworks").joinpath("lua", "fenced.lua").read_text()


class _Bound(Generic[P, T]):
    """A script's function on an executor: ``Scripts.settle`` is ``calls.settle`` run by
    ``Scripts.run`` (returns the reply read), ``AsyncScripts.settle`` the same run by
    ``AsyncScripts.run`` (returns an awaitable of it). One signature, the builder's."""

    def __init__(self, build: Callable[P, Call[T]]) -> None:
        self.build = build
        self.name = build.__name__
        self.__doc__ = build.__doc__

    def __set_name__(self, owner: type[Any], name: str) -> None:
        self.name = name

    @overload
    def __get__(self, obj: None, owner: type[Any]) -> _Bound[P, T]: ...
    @overload
    def __get__(self, obj: Scripts, owner: type[Any]) -> Callable[P, T]: ...
    @overload
    def __get__(self, obj: AsyncScripts, owner: type[Any]) -> Callable[P, Awaitable[T]]: ...
    def __get__(self, obj: Any, owner: type[Any]) -> Any:
        if obj is None:
            return self
        build, run = self.build, obj.run

        def bound(*args: P.args, **kwargs: P.kwargs) -> Any:
            return run(build(*args, **kwargs))

        bound.__name__, bound.__doc__ = self.name, self.__doc__
        obj.__dict__[self.name] = bound  # bound once per executor: the next look-up finds it
        return bound


class _Functions:
    """The scripts' functions, shared by both executors (see ``queueworks.scripts.calls``)."""

    enqueue = _Bound(calls.enqueue)
    record_task = _Bound(calls.record_task)
    settle = _Bound(calls.settle)
    sweep_lost = _Bound(calls.sweep_lost)
    set_state = _Bound(calls.set_state)
    bury_waiters = _Bound(calls.bury_waiters)
    expire_finished = _Bound(calls.expire_finished)
    expire_jobs = _Bound(calls.expire_jobs)
    keep_jobs = _Bound(calls.keep_jobs)
    lease = _Bound(calls.lease)
    join = _Bound(calls.join)
    depart = _Bound(calls.depart)
    fenced_read = _Bound(calls.fenced_read)
    step = _Bound(calls.step)
    reclaim = _Bound(calls.reclaim)
    enqueue_jobs = _Bound(calls.enqueue_jobs)
    enqueue_batch = _Bound(calls.enqueue_batch)
    enqueue_unique = _Bound(calls.enqueue_unique)
    release_unique = _Bound(calls.release_unique)
    settle_jobs = _Bound(calls.settle_jobs)
    retry_later = _Bound(calls.retry_later)
    promote_due = _Bound(calls.promote_due)
    cancel_job = _Bound(calls.cancel_job)
    set_aside = _Bound(calls.set_aside)
    reopen_queue = _Bound(calls.reopen_queue)
    requeue_job = _Bound(calls.requeue_job)
    job_progress = _Bound(calls.job_progress)
    defer_job = _Bound(calls.defer_job)
    depend = _Bound(calls.depend)
    release_job = _Bound(calls.release_job)
    pause_queue = _Bound(calls.pause_queue)
    configure_queue = _Bound(calls.configure_queue)
    submit_small = _Bound(calls.submit_small)
    lease_acquire = _Bound(calls.lease_acquire)
    fenced = _Bound(calls.fenced)
    rate_read = _Bound(flow_calls.rate_read)
    band_read = _Bound(flow_calls.band_read)
    group_take = _Bound(flow_calls.group_take)
    group_pump = _Bound(flow_calls.group_pump)

    _s: dict[str, Script] | dict[str, AsyncScript]

    def sha(self, name: str) -> str:
        """The SHA1 of a script (for EVALSHA where a ``Script`` object cannot go)."""
        return str(self._s[name].sha)

    def source(self, name: str) -> str:
        """A script's Lua source (to load it where a ``Script`` object cannot go)."""
        return str(self._s[name].script)


class Scripts(_Functions):
    """The project's Lua scripts bound to one (sync) Redis client."""

    def __init__(self, client: Connection) -> None:
        self._s: dict[str, Script] = {n: client.register_script(_source(n)) for n in NAMES}

    def run(self, call: Call[T]) -> T:
        target = call.client
        if call.unpiped_on_cluster and isinstance(target, ClusterPipeline):
            target = None
        script, keys = self._s[call.name], call.keys
        if target is None:  # at once: EVALSHA, loading the script if Redis lost it
            try:
                reply = script.registered_client.evalsha(script.sha, len(keys), *keys, *call.args)
            except NoScriptError:
                reply = script(keys=keys, args=call.args)
            return call.read(reply)
        if call.bare and not isinstance(target, ClusterPipeline):
            return call.read(target.evalsha(script.sha, len(keys), *keys, *call.args))
        return call.read(script(keys=keys, args=call.args, client=target))


class Queued(Generic[T]):
    """A script call put on a sync pipeline (executed with ``raise_on_error=False``) as a
    plain EVALSHA, so it costs no round trip of its own (nor redis-py's SCRIPT EXISTS);
    ``reply`` reads its reply. A cluster pipeline refuses EVALSHA: there the call runs at
    once, before the pipe."""

    def __init__(self, scripts: Scripts, call: Call[T], pipe: Any) -> None:
        self.scripts, self.call = scripts, call
        self.index: int | None = None
        if isinstance(pipe, ClusterPipeline):
            self.value = scripts.run(call)
            return
        self.index = len(pipe)
        pipe.evalsha(scripts.sha(call.name), len(call.keys), *call.keys, *call.args)

    def reply(self, replies: list[Any]) -> T:
        """The call's reply among the pipe's ``replies``. A NOSCRIPT reply (Redis lost its
        script cache: a restart, a failover) runs the call again at once, loading the
        script; any other error is raised."""
        if self.index is None:
            return self.value
        return read_reply(self.scripts, self.call, replies[self.index])


def read_replies(scripts: Scripts, batch: Sequence[Call[Any]], replies: Sequence[Any]) -> list[Any]:
    """The raw EVALSHA replies of ``batch``'s calls, sent together, read in order. From the
    first NOSCRIPT reply on (Redis lost its script cache, or never had the script), every
    call runs again at once, in order, loading its script: the calls after that one ran
    before it, out of the order they were sent in (a settle guarded by a step's decision
    found no decision yet, and did nothing). Each call of such a batch must be safe to run
    twice."""
    out: list[Any] = []
    for k, (call, reply) in enumerate(zip(batch, replies, strict=True)):
        if isinstance(reply, NoScriptError):
            return out + [scripts.run(c) for c in batch[k:]]
        out.append(read_reply(scripts, call, reply))
    return out


def read_reply(scripts: Scripts, call: Call[T], reply: Any) -> T:
    """A script call's raw EVALSHA reply, read: a NOSCRIPT reply (Redis lost its script
    cache: a restart, a failover) runs the call again at once, loading the script; any
    other error is raised."""
    if isinstance(reply, NoScriptError):
        return scripts.run(call)
    if isinstance(reply, Exception):
        raise reply
    return call.read(reply)


class AsyncScripts(_Functions):
    """The project's Lua scripts bound to one ``redis.asyncio`` client."""

    def __init__(self, client: AsyncConnection) -> None:
        self._s: dict[str, AsyncScript] = {n: client.register_script(_source(n)) for n in NAMES}

    async def run(self, call: Call[T]) -> T:
        target = call.client
        if call.unpiped_on_cluster and isinstance(target, AsyncClusterPipeline):
            target = None
        return call.read(await self._s[call.name](keys=call.keys, args=call.args, client=target))
