"""Typed wrappers around the Lua scripts in ``queueworks/lua/``: one function per script.

Each script's contract (KEYS, ARGV, reply) is written at the top of its file. Scripts are
loaded once per client with ``register_script`` (EVALSHA, falling back to EVAL after a
server restart flushed the script cache).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from importlib import resources
from string import Template
from typing import Any, NamedTuple

from redis.cluster import ClusterPipeline
from redis.commands.core import Script
from redis.exceptions import NoScriptError

from queueworks.connection import Connection
from queueworks.keys import TaskKeys
from queueworks.models import ACTIVE_STATES, JobState

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
    "enqueue_jobs",
    "settle_jobs",
    "promote_due",
    "cancel_job",
    "requeue_job",
)
# The states in which a task still takes work, as the scripts that need them receive them.
ACTIVE = ",".join(state.value for state in ACTIVE_STATES)


# Constants a script writes, given to it from Python when it is loaded (``${NAME}`` in
# its source), never retyped there.
_CONSTANTS = {state.name: state.value for state in JobState}


def _evalsha(script: Script, keys: list[Any], args: list[Any]) -> Any:
    """``script(keys, args)`` on its own client, without ``Script.__call__``'s pipeline
    checks (one job's enqueue is a hot path): EVALSHA, loading the script if Redis lost it."""
    try:
        return script.registered_client.evalsha(script.sha, len(keys), *keys, *args)
    except NoScriptError:
        return script(keys=keys, args=args)


def _source(name: str) -> str:
    text = resources.files("queueworks").joinpath("lua", f"{name}.lua").read_text()
    return Template(text).substitute(_CONSTANTS) if "${" in text else text


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


class EnqueueBatch:
    """The keys and arguments of one ``enqueue_jobs`` call, added job by job, with no object
    per job (``enqueue_many``'s loop); jobs to run now."""

    def __init__(self, tk: TaskKeys) -> None:
        self.keys: list[str] = [tk.stream, tk.scheduled]
        self.args: list[Any] = [""]  # ARGV[1] (now) is set when it is sent
        self._prefix = tk.job_prefix

    def add(self, job_id: str, handler: str, payload: str) -> None:
        self.keys.append(self._prefix + job_id)
        self.args += (job_id, handler, payload, "")

    def __len__(self) -> int:
        return len(self.keys) - 2


class NewJob(NamedTuple):  # a tuple: enqueue_many makes one per job
    id: str
    handler: str
    payload: str  # JSON
    at: float | None = None  # when a delayed job runs (None: now)


@dataclass
class JobBatch:
    """What one member settles of a queue at once (``settle_jobs``)."""

    ok: list[tuple[str, str, float, int, str]] = field(default_factory=list)
    # (entry id, job id, started at, attempts, result JSON)
    dead: list[tuple[str, str, float, int, str, str, str]] = field(default_factory=list)
    # (entry id, job id, started at, attempts, reason, error, payload)
    rejected: list[tuple[str, str, str]] = field(default_factory=list)  # (entry, why, payload)
    buckets: dict[str, float] = field(default_factory=dict)  # latency histogram additions

    def __len__(self) -> int:
        return len(self.ok) + len(self.dead) + len(self.rejected)


READ_FENCED = -1
READ_EPOCH_MOVED = -2


class Scripts:
    """The project's Lua scripts bound to one Redis client."""

    def __init__(self, client: Connection) -> None:
        self._s: dict[str, Script] = {n: client.register_script(_source(n)) for n in _NAMES}

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

    # -- queues ---------------------------------------------------------------------------

    def enqueue_jobs(
        self, tk: TaskKeys, jobs: Sequence[NewJob], now: float, client: Any = None
    ) -> None:
        """Put ``jobs`` on a queue (or in its scheduled zset), each with its record; may be
        pipelined (not on a cluster pipeline, as for ``enqueue``)."""
        argv: list[Any] = [repr(now)]
        for job in jobs:
            argv += (job.id, job.handler, job.payload, "" if job.at is None else repr(job.at))
        keys = [tk.stream, tk.scheduled, *(tk.job(job.id) for job in jobs)]
        script = self._s["enqueue_jobs"]
        if client is None or isinstance(client, ClusterPipeline):
            _evalsha(script, keys, argv)
        else:
            script(keys=keys, args=argv, client=client)

    def enqueue_batch(self, batch: EnqueueBatch, now: float, client: Any) -> None:
        """``enqueue_jobs`` of a built batch, on ``client`` (a pipeline; on a cluster
        pipeline it runs at once, as for ``enqueue``)."""
        batch.args[0] = repr(now)
        script = self._s["enqueue_jobs"]
        if isinstance(client, ClusterPipeline):
            _evalsha(script, batch.keys, batch.args)
        else:
            script(keys=batch.keys, args=batch.args, client=client)

    def settle_jobs(
        self, tk: TaskKeys, batch: JobBatch, worker_id: str, now: float, ttl: int, client: Any
    ) -> Any:
        """Settle a batch of jobs (see settle_jobs.lua); with a pipeline, the reply comes
        with it: ``(ok, dead, rejected)``, or a ``NoScriptError`` (Redis lost its script
        cache: a restart, a failover) that the caller heals by settling again without the
        pipeline. On a pipeline this is a bare EVALSHA: redis-py would otherwise ask SCRIPT
        EXISTS, one more round trip, before every execute of the queue's read."""
        argv: list[Any] = [tk.group, repr(now), worker_id, ttl]
        argv += (len(batch.ok), len(batch.dead), len(batch.rejected), len(batch.buckets))
        keys = [tk.stream, tk.record, tk.dead, tk.latency, tk.rate]
        for entry_id, job_id, started, attempts, result in batch.ok:
            keys.append(tk.job(job_id))
            argv += (entry_id, repr(started), attempts, result)
        for entry_id, job_id, started, attempts, reason, error, payload in batch.dead:
            keys.append(tk.job(job_id))
            argv += (entry_id, repr(started), attempts, reason, error, job_id, payload)
        for entry_id, why, payload in batch.rejected:
            argv += (entry_id, why, payload)
        for bucket, amount in batch.buckets.items():
            argv += (bucket, repr(amount))
        script = self._s["settle_jobs"]
        if client is None:
            return script(keys=keys, args=argv)
        return client.evalsha(script.sha, len(keys), *keys, *argv)

    def promote_due(self, tk: TaskKeys, job_ids: Sequence[str]) -> int:
        keys = [tk.stream, tk.scheduled, *(tk.job(j) for j in job_ids)]
        return int(self._s["promote_due"](keys=keys, args=list(job_ids)))

    def cancel_job(self, tk: TaskKeys, job_id: str, now: float, ttl: int) -> int:
        keys = [tk.stream, tk.scheduled, tk.job(job_id)]
        return int(self._s["cancel_job"](keys=keys, args=[tk.group, job_id, repr(now), ttl]))

    def requeue_job(self, tk: TaskKeys, dead_entry: str, job_id: str, now: float) -> Any:
        keys = [tk.stream, tk.record, tk.dead, tk.job(job_id)]
        return self._s["requeue_job"](keys=keys, args=[dead_entry, repr(now)])

    def set_state(self, tk: TaskKeys, state: str, now: float, error: str = "") -> bool:
        args = [state, repr(now), error, ACTIVE]
        return bool(self._s["set_state"](keys=[tk.record], args=args))

    def expire_finished(self, keys: Sequence[str], ttl_ms: int) -> bool:
        """Start the expiry of a finished task's keys (``keys[0]`` is its record)."""
        return bool(self._s["expire_finished"](keys=list(keys), args=[ttl_ms, ACTIVE]))

    def lease(self, key: str, holder: str, action: str, ttl_ms: int = 0) -> bool:
        """Renew (``action="renew"``) or release the lease if ``holder`` still has it."""
        return bool(self._s["lease"](keys=[key], args=[holder, action, ttl_ms]))


def _s(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def fields_of(flat: Sequence[bytes]) -> dict[bytes, bytes]:
    """A stream entry's flat field list, as read inside Lua, as the dict redis-py gives."""
    return {flat[i]: flat[i + 1] for i in range(0, len(flat), 2)}
