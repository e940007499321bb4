"""Typed wrappers around the Lua scripts in ``queueworks/lua/``: one function per script.

Each script's contract (KEYS, ARGV, reply) is written at the top of its file. Scripts are
loaded once per client with ``register_script`` (EVALSHA, falling back to EVAL after a
server restart flushed the script cache).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from importlib import resources
from typing import Any

from redis.cluster import ClusterPipeline
from redis.commands.core import Script

from queueworks.connection import Connection
from queueworks.events import EVENTS_MAXLEN
from queueworks.keys import TaskKeys
from queueworks.models import ACTIVE_STATES

_NAMES = (
    "enqueue",
    "join",
    "depart",
    "fenced_read",
    "settle",
    "reclaim",
    "set_state",
    "lease",
    "expire_finished",
    "sweep_lost",
    "record_task",
    "lease_acquire",
    "submit_small",
)
# The states in which a task still takes work, as the scripts that need them receive them.
ACTIVE = ",".join(state.value for state in ACTIVE_STATES)


def _source(name: str) -> str:
    return resources.files("queueworks").joinpath("lua", f"{name}.lua").read_text()


def fenced_source() -> str:
    """``fenced.lua`` with the rules it applies put before it as functions (its header)."""
    parts = [
        f"local function {name}(KEYS, ARGV)\n{_source(name)}\nend\n"
        for name in ("set_state", "expire_finished")
    ]
    return "".join(parts) + _source("fenced")


@dataclass(frozen=True)
class Claimed:
    """An entry claimed from another consumer: id, raw fields, delivery count (= attempt)."""

    entry_id: str
    fields: dict[bytes, bytes]
    deliveries: int


@dataclass(frozen=True)
class DeadEntry:
    entry_id: str
    index: int | None
    reason: str
    error: str
    attempts: int
    payload: str


@dataclass(frozen=True)
class Settled:
    ok: int
    dead: int
    finished: bool  # this call finished the task
    rejected: int = 0
    active: bool = True  # the task still takes work (False: it has finished, by any hand)


READ_FENCED = -1
READ_EPOCH_MOVED = -2


class Scripts:
    """The project's Lua scripts bound to one Redis client."""

    def __init__(self, client: Connection) -> None:
        self._s: dict[str, Script] = {n: client.register_script(_source(n)) for n in _NAMES}
        self._s["fenced"] = client.register_script(fenced_source())

    def sha(self, name: str) -> str:
        """The SHA1 of a script (for EVALSHA where a ``Script`` object cannot go)."""
        return str(self._s[name].sha)

    def source(self, name: str) -> str:
        return str(self._s[name].script)

    def enqueue(
        self,
        streams: Sequence[str],
        batch: Sequence[tuple[int, int, str, str]],
        client: Any = None,
    ) -> None:
        """Append ``(stream number, index, payload JSON, key)`` messages; may be pipelined
        (a cluster pipeline runs it at once instead)."""
        argv: list[Any] = [len(batch)]
        for stream_no, index, payload, key in batch:
            argv += (stream_no + 1, index, payload, key)
        if isinstance(client, ClusterPipeline):
            # Not pipelined on a cluster: redis-py refuses EVALSHA in a cluster pipeline, and
            # re-sends a pipelined command that met a connection error (a duplicate XADD).
            # One round trip per batch of 1000 is nothing next to the batch itself.
            client = None
        self._s["enqueue"](keys=list(streams), args=argv, client=client)

    def record_task(
        self, tk: TaskKeys, streams: Sequence[str], record: Mapping[Any, Any], client: Any = None
    ) -> None:
        """Write a submitted task's record and PERSIST its streams, atomically; may be
        pipelined (not on a cluster pipeline, as for ``enqueue``)."""
        args: list[Any] = []
        for name, value in record.items():
            args += (name, value)
        if isinstance(client, ClusterPipeline):
            client = None
        self._s["record_task"](keys=[tk.record, tk.epoch, *streams], args=args, client=client)

    def join(self, tk: TaskKeys, worker_id: str, ttl_ms: int, now: float) -> int:
        keys = [tk.record, tk.members, tk.epoch, tk.heartbeat(worker_id), tk.history]
        return int(self._s["join"](keys=keys, args=[worker_id, ttl_ms, repr(now), ACTIVE]))

    def depart(
        self, tk: TaskKeys, worker_id: str, now: float, cause: str, *, only_if_dead: bool
    ) -> int:
        """Remove a member (leave, or prune when its heartbeat is gone): new epoch or 0."""
        keys = [tk.record, tk.members, tk.epoch, tk.heartbeat(worker_id), tk.history]
        args = [worker_id, repr(now), cause, "1" if only_if_dead else "0"]
        return int(self._s["depart"](keys=keys, args=args))

    def fenced_read(
        self, tk: TaskKeys, streams: Sequence[str], worker_id: str, count: int, epoch: int
    ) -> tuple[int, Any]:
        """Returns (status, payload): status 1 with the XREADGROUP reply, 0 nothing new,
        READ_FENCED, or READ_EPOCH_MOVED with the current epoch."""
        keys = [tk.members, tk.epoch, *streams]
        reply = self._s["fenced_read"](keys=keys, args=[tk.group, worker_id, count, epoch])
        status = int(reply[0])
        return status, (reply[1] if len(reply) > 1 else None)

    def settle(
        self,
        tk: TaskKeys,
        stream: str,
        worker_id: str,
        now: float,
        ok: Sequence[tuple[str, int, str]],
        dead: Sequence[DeadEntry] = (),
    ) -> Settled:
        argv: list[Any] = [tk.group, repr(now), worker_id, ACTIVE, len(ok), len(dead)]
        for entry_id, index, result in ok:
            argv += (entry_id, index, result)
        for d in dead:
            where = "" if d.index is None else d.index
            argv += (d.entry_id, where, d.reason, d.error, d.attempts, d.payload)
        keys = [stream, tk.record, tk.results, tk.dead, tk.settled]
        n_ok, n_dead, finished, rejected, active = self._s["settle"](keys=keys, args=argv)
        return Settled(int(n_ok), int(n_dead), bool(finished), int(rejected), bool(active))

    def sweep_lost(
        self, tk: TaskKeys, streams: Sequence[str], worker_id: str, now: float, limit: int = 1000
    ) -> int:
        """Dead-letter (reason ``lost``) up to ``limit`` unsettled indices of a task that has
        nothing in flight: their entries were deleted. Settle an empty batch afterwards to
        complete the task."""
        keys = [tk.record, tk.settled, tk.dead, *streams]
        args: list[Any] = [tk.group, repr(now), worker_id, ACTIVE, limit]
        return int(self._s["sweep_lost"](keys=keys, args=args))

    def reclaim(
        self,
        tk: TaskKeys,
        stream: str,
        to: str,
        *,
        from_consumer: str = "",
        count: int = 500,
        hand_back: bool = False,
        min_idle_ms: int = 0,
        only_departed: bool = True,
        keep: str = "",
    ) -> tuple[list[Claimed], list[tuple[str, int]]]:
        """``keep``: an entry id to leave where it is (the one a cold stop interrupted: it
        started, so whoever reclaims it from us charges it)."""
        args: list[Any] = [
            tk.group,
            to,
            from_consumer,
            count,
            "1" if hand_back else "0",
            min_idle_ms,
            "1" if only_departed else "0",
            keep,
        ]
        claimed_raw, gone_raw = self._s["reclaim"](keys=[stream, tk.members], args=args)
        claimed = [
            Claimed(_s(eid), fields_of(fields), int(deliveries))
            for eid, fields, deliveries in claimed_raw
        ]
        gone = [(_s(eid), int(deliveries)) for eid, deliveries in gone_raw]
        return claimed, gone

    def set_state(self, tk: TaskKeys, state: str, now: float, error: str = "") -> bool:
        args = [state, repr(now), error, ACTIVE]
        return bool(self._s["set_state"](keys=[tk.record], args=args))

    def expire_finished(self, keys: Sequence[str], ttl_ms: int) -> bool:
        """Start the expiry of a finished task's keys (``keys[0]`` is its record)."""
        return bool(self._s["expire_finished"](keys=list(keys), args=[ttl_ms, ACTIVE]))

    def submit_small(
        self,
        tk: TaskKeys,
        streams: Sequence[str],
        record: Mapping[Any, Any],
        batch: Sequence[tuple[int, int, str, str]],
        score: float,
        publish: tuple[str, str, str, Mapping[str, str]] | None,
        client: Any = None,
    ) -> Any:
        """A small task in one atomic step (``submit_small.lua``): 1 if written, 0 if its id
        exists. ``publish`` = (queue, index, events, event fields) on one server, where the
        script also queues, indexes and announces it; None on a cluster."""
        args: list[Any] = [len(streams), tk.group, repr(score), len(record)]
        for name, value in record.items():
            args += (name, value)
        args.append(len(batch))
        for stream_no, index, payload, key in batch:
            args += (stream_no + 1, index, payload, key)
        keys = [tk.record, tk.epoch, *streams]
        if publish is not None:
            queue, index_key, events_key, event = publish
            keys += [queue, index_key, events_key]
            args += [EVENTS_MAXLEN, len(event)]
            for name, value in event.items():
                args += (name, value)
        return self._s["submit_small"](keys=keys, args=args, client=client)

    def lease_acquire(self, key: str, term_key: str, holder: str, ttl_ms: int) -> tuple[int, str]:
        """Take the lease if it is free: (term, token), or (0, "") if it is held."""
        reply = self._s["lease_acquire"](keys=[key, term_key], args=[holder, ttl_ms])
        if int(reply[0]) == 0:
            return 0, ""
        return int(reply[0]), _s(reply[1])

    def fenced(self, keys: Sequence[str], args: Sequence[Any]) -> list[int]:
        """One call of ``fenced.lua`` (see ``controller.fence``): [1, replies...] or [0]."""
        return [int(x) for x in self._s["fenced"](keys=list(keys), args=list(args))]

    def lease(self, key: str, holder: str, action: str, ttl_ms: int = 0) -> bool:
        """Renew (``action="renew"``) or release the lease if ``holder`` still has it."""
        return bool(self._s["lease"](keys=[key], args=[holder, action, ttl_ms]))


def _s(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def fields_of(flat: Sequence[bytes]) -> dict[bytes, bytes]:
    """A stream entry's flat field list, as read inside Lua, as the dict redis-py gives."""
    return {flat[i]: flat[i + 1] for i in range(0, len(flat), 2)}
