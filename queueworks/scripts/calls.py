"""What each Lua script in ``queueworks/lua/`` is called with and what its reply means, once.

One pure function per script builds a ``Call``: its KEYS, its ARGV and how to read its
reply. No I/O here: ``queueworks.scripts.bound`` runs a call, at once or on a pipeline, through a
sync client (``Scripts``: the workers, the controller, ``Client``) or an asyncio one
(``AsyncScripts``: ``AsyncClient``). Each script's contract (KEYS, ARGV, reply) is written
at the top of its file.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from importlib import resources
from typing import Any, Generic, NamedTuple, Protocol, TypeVar

from queueworks.protocol.events import EVENTS_MAXLEN
from queueworks.protocol.job_options import JobOptions
from queueworks.protocol.jobrecords import DONE_PAYLOAD_KEPT, JobEntry
from queueworks.protocol.keys import PARKED, TaskKeys
from queueworks.protocol.membership import Roster, roster_of
from queueworks.protocol.messages import text
from queueworks.protocol.models import ACTIVE_STATES, JobState
from queueworks.protocol.records import QUEUE_PAUSED, QUEUE_SETTINGS

DRAIN_BATCH = 100  # outbox items one look of bury_waiters.lua drains

T = TypeVar("T")

# The states in which a task still takes work, as the scripts that need them receive them.
ACTIVE = ",".join(state.value for state in ACTIVE_STATES)

# The states in which a job's record says it waits (or runs): it holds its unique key.
WAITING = ",".join(state.value for state in JobState if not state.finished)

READ_FENCED = -1
READ_EPOCH_MOVED = -2


class Call(Generic[T]):
    """One run of a script: ``name``, ``keys``, ``args``, and ``read`` for its reply.

    ``client``: a pipeline to queue it on (None: run it at once); the reply then comes with
    the pipeline's, and what the call returns is ``read`` of the pipeline object. With
    ``unpiped_on_cluster`` a cluster pipeline runs it at once instead: redis-py refuses
    EVALSHA in a cluster pipeline, and re-sends a pipelined command that met a connection
    error (a duplicate XADD); one round trip per batch is nothing next to the batch itself.
    ``bare`` (sync pipelines): a plain EVALSHA on the pipeline, without the SCRIPT EXISTS
    round trip redis-py sends before executing a pipeline that holds a script; the caller
    executes with ``raise_on_error=False`` and runs the call again at once on a
    ``NoScriptError`` reply (Redis lost its script cache: a restart, a failover).
    """

    __slots__ = ("args", "bare", "client", "keys", "name", "read", "unpiped_on_cluster")

    def __init__(
        self,
        name: str,
        keys: list[Any],
        args: list[Any],
        read: Callable[[Any], T],
        client: Any = None,
        unpiped_on_cluster: bool = False,
        bare: bool = False,
    ) -> None:
        self.name, self.keys, self.args, self.read = name, keys, args, read
        self.client, self.unpiped_on_cluster, self.bare = client, unpiped_on_cluster, bare


def _none(_: Any) -> None:
    return None


def _same(reply: Any) -> Any:
    return reply


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
    state: str = ""  # the state this call finished the task in ("" if it did not finish it)


class NewJob(NamedTuple):  # a tuple: cheap to make, one per job enqueued
    id: str  # a delayed job's (a job to run now gets its stream entry's id)
    handler: str
    payload: str  # JSON
    at: float | None = None  # when a delayed job runs (None: now)
    options: str = ""  # its own options, JSON ('' = none: ``queueworks.protocol.job_options``)


class EnqueueBatch:
    """The arguments of one ``enqueue_jobs`` call of jobs to run now, added job by job with
    no object per job (``enqueue_many``'s loop)."""

    def __init__(self, tk: TaskKeys) -> None:
        self.tk = tk
        self.keys: list[str] = [tk.stream, tk.scheduled, tk.bands, tk.record]
        self.args: list[Any] = [""]  # ARGV[1] (now) is set when it is sent

    def add(self, handler: str, payload: str, options: str = "") -> None:
        self.args += ("", handler, payload, "", options)

    def add_prioritised(self, job_id: str, handler: str, payload: str, options: str = "") -> None:
        """A job of a priority other than 0 (``queueworks.protocol.priorities``): ``job_id`` says
        it."""
        self.args += (job_id, handler, payload, "", options)
        self.keys += (self.tk.job(job_id), self.tk.stream_of(job_id))

    def __len__(self) -> int:
        return (len(self.args) - 1) // 5


class SettledJob(Protocol):
    """What a settle writes of a job (the member's running job is one)."""

    @property
    def entry(self) -> JobEntry: ...  # which job, and what its record keeps of its entry
    @property
    def started_at(self) -> float: ...
    @property
    def attempt(self) -> int: ...
    @property
    def outcome(self) -> str: ...  # its result JSON (done), or its error (dead)
    @property
    def reason(self) -> str: ...  # why it died (dead)


@dataclass
class JobBatch:
    """What one member settles of a queue at once (``settle_jobs``): its jobs as they are."""

    ok: list[SettledJob] = field(default_factory=list)
    dead: list[SettledJob] = field(default_factory=list)
    rejected: list[tuple[str, str, str]] = field(default_factory=list)  # (entry, why, payload)
    buckets: dict[str, float] = field(default_factory=dict)  # latency histogram additions
    # failed attempts to run again later (``retry_later``): (job, when, its traceback)
    later: list[tuple[SettledJob, float, str]] = field(default_factory=list)
    # while tracing: a settled job's trace id by its job id, kept on its record
    traces: dict[str, str] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.ok) + len(self.dead) + len(self.rejected) + len(self.later)


# -- tasks ----------------------------------------------------------------------------------


def enqueue(
    streams: Sequence[str], batch: Sequence[tuple[int, int, str, str]], client: Any = None
) -> Call[None]:
    """Append ``(stream number, index, payload JSON, key)`` messages; may be pipelined
    (a cluster pipeline runs it at once instead)."""
    argv: list[Any] = [len(batch)]
    for stream_no, index, payload, key in batch:
        argv += (stream_no + 1, index, payload, key)
    return Call("enqueue", list(streams), argv, _none, client, unpiped_on_cluster=True)


def record_task(
    tk: TaskKeys, streams: Sequence[str], record: Mapping[Any, Any], client: Any = None
) -> Call[None]:
    """Write a submitted task's record and PERSIST its streams, atomically; may be
    pipelined (not on a cluster pipeline, as for ``enqueue``)."""
    args: list[Any] = []
    for name, value in record.items():
        args += (name, value)
    keys = [tk.record, tk.epoch, *streams]
    return Call("record_task", keys, args, _none, client, unpiped_on_cluster=True)


def _settled(reply: Any) -> Settled:
    n_ok, n_dead, finished, rejected, active, state = reply
    return Settled(int(n_ok), int(n_dead), bool(finished), int(rejected), bool(active), text(state))


def settle(
    tk: TaskKeys,
    stream: str,
    worker_id: str,
    now: float,
    ok: Sequence[tuple[str, int, str]],
    dead: Sequence[DeadEntry] = (),
    *,
    only_if: tuple[str, str] | None = None,
) -> Call[Settled]:
    """``only_if`` (a lockstep step's field, value): settle only if the task's steps hash
    holds that value there (the step committed), in the same atomic step."""
    argv: list[Any] = [tk.group, repr(now), worker_id, ACTIVE, len(ok), len(dead)]
    for entry_id, index, result in ok:
        argv += (entry_id, index, result)
    for d in dead:
        where = "" if d.index is None else d.index
        argv += (d.entry_id, where, d.reason, d.error, d.attempts, d.payload)
    keys = [stream, tk.record, tk.results, tk.dead, tk.settled, tk.waiters, tk.released]
    if only_if is not None:
        keys.append(tk.steps)
        argv += only_if
    return Call("settle", keys, argv, _settled)


@dataclass(frozen=True)
class StepEnd:
    """``step.lua``'s reply: the step's decision ("" if none), whether we were ``fenced``
    (then it is the others', if any), each rank's record (None: none), and the shards of the
    steps ahead: those taken (``entries``: id, fields, and whether it was recorded for its
    step), or ``moved_to`` the epoch that moved on (0: no)."""

    decision: str
    recorded: list[bytes | None]
    fenced: bool = False
    entries: tuple[tuple[str, dict[bytes, bytes], bool], ...] = ()
    moved_to: int = 0


def _step_end(reply: Any) -> StepEnd:
    if reply[0] == -1:
        return StepEnd(text(reply[1] or b""), [], fenced=True)
    decision, recorded, taken = text(reply[0]), list(reply[1]), reply[2]
    recorded = [x or None for x in recorded]
    if taken and int(taken[0]) == -2:
        return StepEnd(decision, recorded, moved_to=int(taken[1]))
    if taken and int(taken[0]) == 1:
        entries = tuple((_s(x[0]), fields_of(x[1]), bool(int(x[2]))) for x in taken[1:])
        return StepEnd(decision, recorded, entries=entries)
    return StepEnd(decision, recorded)


def step(
    tk: TaskKeys,
    worker_id: str,
    name: str,
    proposal: str,
    world_size: int,
    *,
    drop: str = "",
    take: Sequence[str] = (),
    epoch: int = 0,
) -> Call[StepEnd]:
    """End a lockstep step (``step.lua``): propose ``proposal`` for step ``name`` (a commit
    overrides an abort), read the ranks' records, drop step ``drop``'s fields; with
    ``take`` (our rank's fields of the steps ahead), take and record a shard for each if the
    step committed."""
    keys = [tk.steps, tk.members, tk.epoch, tk.stream]
    args = [worker_id, name, proposal, world_size, drop, " ".join(take), tk.group, epoch, PARKED]
    return Call("step", keys, args, _step_end)


def sweep_lost(
    tk: TaskKeys, streams: Sequence[str], worker_id: str, now: float, limit: int = 1000
) -> Call[int]:
    """Dead-letter (reason ``lost``) up to ``limit`` unsettled indices of a task that has
    nothing in flight: their entries were deleted. Settle an empty batch afterwards to
    complete the task."""
    keys = [tk.record, tk.settled, tk.dead, *streams]
    return Call("sweep_lost", keys, [tk.group, repr(now), worker_id, ACTIVE, limit], int)


def set_state(tk: TaskKeys, state: str, now: float, error: str = "") -> Call[bool]:
    """Move an active task to ``state``; one that finishes hands the jobs waiting for it to
    its outbox (``queueworks.task.dependencies`` drains it)."""
    keys = [tk.record, tk.waiters, tk.released]
    return Call("set_state", keys, [state, repr(now), error, ACTIVE], bool)


def bury_waiters(tk: TaskKeys, cursor: str = "0") -> Call[tuple[str, int]]:
    """One step (from ``cursor``) of moving the waiters in other queues of a finished
    queue's jobs that have no outcome to its outbox, dead: (the cursor to go on from,
    ``"0"`` once the whole hash was looked at; how many dependents it moved)."""
    keys = [tk.record, tk.waiters, tk.released]
    return Call("bury_waiters", keys, [ACTIVE, cursor, tk.task_id], _buried)


def _buried(reply: Any) -> tuple[str, int]:
    return text(reply[0]), int(reply[1])


def expire_finished(keys: Sequence[str], ttl_ms: int) -> Call[bool]:
    """Start the expiry of a finished task's keys (``keys[0]`` is its record)."""
    return Call("expire_finished", list(keys), [ttl_ms, ACTIVE], bool)


def expire_jobs(tk: TaskKeys, job_keys: Sequence[str]) -> Call[int]:
    """Give ``job_keys`` (of unfinished jobs of the finished queue ``tk``) the expiry of its
    record (``expire_jobs.lua``): the time to live given (ms), 0 if none (the queue is
    active again, or its record has no expiry)."""
    return Call("expire_jobs", [tk.record, *job_keys], [ACTIVE], int)


def keep_jobs(tk: TaskKeys, jobs: Sequence[tuple[str, str | None]]) -> Call[bool]:
    """Keep again the keys of ``jobs`` (``(job id, its unique key or None)``) of the
    reopened queue ``tk`` (``keep_jobs.lua``): False if its record expires (finished again)."""
    keys, args = [tk.record], []
    for job_id, unique in jobs:
        keys += [tk.job(job_id), tk.deps(job_id)]
        if unique is not None:
            keys.append(tk.unique(unique))
        args += [job_id, "1" if unique is not None else "0"]
    return Call("keep_jobs", keys, args, bool)


def lease(key: str, holder: str, action: str, ttl_ms: int = 0) -> Call[bool]:
    """Renew (``action="renew"``) or release the lease if ``holder`` still has it."""
    return Call("lease", [key], [holder, action, ttl_ms], bool)


# -- membership and reading -----------------------------------------------------------------


@dataclass(frozen=True)
class Joined:
    """What a join found: the roster at its epoch, and the entries it read (if asked)."""

    roster: Roster
    entries: list[tuple[bytes, dict[bytes, bytes]]] = field(default_factory=list)


class NodeSetFull(Exception):
    """A join found the node set at its bound (a queue's ``max_nodes``)."""


def _joined(reply: Any) -> Joined | None:
    if int(reply[0]) == -2:
        raise NodeSetFull
    if int(reply[0]) < 0:
        return None
    epoch, flat, entries = reply
    roster = roster_of(epoch, list(zip(flat[::2], flat[1::2], strict=True)))
    return Joined(roster, [(eid, fields_of(fields)) for eid, fields in entries])


def join(
    tk: TaskKeys,
    worker_id: str,
    ttl_ms: int,
    now: float,
    *,
    stream: str | None = None,
    count: int = 0,
    most: int | None = None,
) -> Call[Joined | None]:
    """Join the node set: the roster at the new epoch (the joiner in it) and, with
    ``stream`` and ``count``, up to ``count`` new entries of it read as the new member;
    None when the task is missing or finished."""
    keys = [tk.record, tk.members, tk.epoch, tk.heartbeat(worker_id), tk.history]
    args: list[Any] = [worker_id, ttl_ms, repr(now), ACTIVE]
    if stream is not None and count > 0:
        keys.append(stream)
        args += (tk.group, count)
    elif most:
        args += (tk.group, 0)
    if most:
        args.append(most)
    return Call("join", keys, args, _joined)


def depart(
    tk: TaskKeys, worker_id: str, now: float, cause: str, *, only_if_dead: bool
) -> Call[int]:
    """Remove a member (leave, or prune when its heartbeat is gone): new epoch or 0."""
    keys = [tk.record, tk.members, tk.epoch, tk.heartbeat(worker_id), tk.history]
    args = [worker_id, repr(now), cause, "1" if only_if_dead else "0"]
    return Call("depart", keys, args, int)


def _read(reply: Any) -> tuple[int, Any]:
    return int(reply[0]), (reply[1] if len(reply) > 1 else None)


def fenced_read(
    tk: TaskKeys, streams: Sequence[str], worker_id: str, count: int, epoch: int
) -> Call[tuple[int, Any]]:
    """Returns (status, payload): status 1 with the XREADGROUP reply, 0 nothing new,
    READ_FENCED, or READ_EPOCH_MOVED with the current epoch."""
    keys = [tk.members, tk.epoch, *streams]
    return Call("fenced_read", keys, [tk.group, worker_id, count, epoch], _read)


def _reclaimed(reply: Any) -> tuple[list[Claimed], list[tuple[str, int]]]:
    claimed_raw, gone_raw = reply
    claimed = [
        Claimed(_s(eid), fields_of(fields), int(deliveries))
        for eid, fields, deliveries in claimed_raw
    ]
    gone = [(_s(eid), int(deliveries)) for eid, deliveries in gone_raw]
    return claimed, gone


def reclaim(
    tk: TaskKeys,
    stream: str,
    to: str,
    *,
    from_consumer: str = "",
    count: int = 500,
    hand_back: bool = False,
    min_idle_ms: int = 0,
    only_departed: bool = True,
    keep: Collection[str] = (),
) -> Call[tuple[list[Claimed], list[tuple[str, int]]]]:
    """``keep``: entry ids to leave where they are (the ones a cold stop interrupted: they
    started, so whoever reclaims them from us charges them)."""
    args: list[Any] = [
        tk.group,
        to,
        from_consumer,
        count,
        "1" if hand_back else "0",
        min_idle_ms,
        "1" if only_departed else "0",
        " ".join(keep),
    ]
    return Call("reclaim", [stream, tk.members], args, _reclaimed)


# -- queues ---------------------------------------------------------------------------------


def enqueue_jobs(tk: TaskKeys, jobs: Sequence[NewJob], now: float, client: Any = None) -> Call[Any]:
    """Put ``jobs`` on a queue (or, delayed, in its scheduled zset with a record); may be
    pipelined (not on a cluster pipeline, as for ``enqueue``). Replies the jobs' ids
    (``job_ids``), or None if the queue's stream is gone (nothing written)."""
    argv: list[Any] = [repr(now)]
    keys = [tk.stream, tk.scheduled, tk.bands, tk.record]
    for job in jobs:
        at = "" if job.at is None else repr(job.at)
        argv += (job.id, job.handler, job.payload, at, job.options)
        if job.id:
            keys.append(tk.job(job.id))
            stream = tk.stream_of(job.id)
            if stream != tk.stream:
                keys.append(stream)
    return Call("enqueue_jobs", keys, argv, _same, client, unpiped_on_cluster=True)


def enqueue_batch(batch: EnqueueBatch, now: float, client: Any = None) -> Call[Any]:
    """``enqueue_jobs`` of a built batch (as ``enqueue_jobs``: not on a cluster pipeline)."""
    batch.args[0] = repr(now)
    return Call("enqueue_jobs", batch.keys, batch.args, _same, client, unpiped_on_cluster=True)


def job_ids(reply: Sequence[Any]) -> list[str]:
    """The ids ``enqueue_jobs`` replied."""
    return [text(x) for x in reply]


@lru_cache(maxsize=1024)
def _settle_keys(tk: TaskKeys, aside: str, stream: str) -> tuple[str, ...]:
    """``settle_jobs``' first keys, built once per queue and stream (a settle per read)."""
    stream = stream or (tk.aside_stream(aside) if aside else tk.stream)
    return (stream, tk.record, tk.dead, tk.latency, tk.rate, tk.aside, tk.done)


def settle_jobs(
    tk: TaskKeys,
    batch: JobBatch,
    worker_id: str,
    now: float,
    ttl: int,
    client: Any,
    aside: str = "",
    fence: str = "",
    stream: str = "",
) -> Call[Any]:
    """Settle a batch of jobs (see settle_jobs.lua) read from the queue's stream, or from
    the aside stream of handler ``aside``, or from ``stream`` (a band's); with a pipeline,
    the reply comes with it: ``(ok, dead, rejected, moved)`` (and a fifth element when
    fenced: nothing settled), or a ``NoScriptError`` to heal (a ``bare`` call: the queue's
    read carries it, and it must not cost a SCRIPT EXISTS round trip each time).
    ``fence``: the queue's members (``tk.members``), which must hold ``worker_id`` for
    anything to be settled ('': no such check)."""
    argv: list[Any] = [tk.group, repr(now), worker_id, ttl]
    argv += (len(batch.ok), len(batch.dead), len(batch.rejected), len(batch.buckets), aside)
    keys = [*_settle_keys(tk, aside, stream)]
    keys.append(fence or keys[0])
    prefix = tk.job_prefix
    held: list[JobEntry] = []  # jobs with options of their own: a unique key, maybe
    for job in batch.ok:
        e = job.entry
        keys.append(prefix + e.job_id)
        argv += (e.entry_id, repr(job.started_at), job.attempt, job.outcome, e.handler)
        argv += (e.enqueued, "1" if e.named else "")
        argv.append(e.payload if len(e.payload) <= DONE_PAYLOAD_KEPT else "")
        if e.options:
            held.append(e)
    for job in batch.dead:
        e = job.entry
        keys.append(prefix + e.job_id)
        argv += (e.entry_id, repr(job.started_at), job.attempt, job.reason, job.outcome)
        argv += (e.job_id, e.payload, e.handler, e.enqueued, "1" if e.named else "")
        argv.append(e.options or "")  # kept on its dead letter, for a requeue
        if e.options:
            held.append(e)
    for entry_id, why, payload in batch.rejected:
        argv += (entry_id, why, payload)
    for bucket, amount in batch.buckets.items():
        argv += (bucket, repr(amount))
    if not (held and release_keys(tk, held, keys, argv)):
        argv.append(0)  # no unique key to free
    argv.append("1")  # the dependents block: the waiters hash and outbox, last
    grouped = [(e.entry_id, e.job_id) for e in held if e.job_options.group]
    if grouped:  # the group block: the slots these jobs hold go back
        argv.append(len(grouped))
        argv += [x for pair in grouped for x in pair]
        keys += (tk.groups, tk.groups_held)
    if batch.traces:  # the trace block: each job's trace id ('' none), after the group block
        if not grouped:
            argv.append(0)
        argv += [batch.traces.get(job.entry.job_id, "") for job in (*batch.ok, *batch.dead)]
    keys += (tk.waiters, tk.released)
    return Call("settle_jobs", keys, argv, _same, client, unpiped_on_cluster=True, bare=True)


def retry_later(
    tk: TaskKeys,
    later: Sequence[tuple[SettledJob, float, str]],
    worker_id: str,
    now: float,
    client: Any,
    aside: str = "",
    fence: str = "",
    stream: str = "",
) -> Call[Any]:
    """Settle failed attempts as retries that wait (retry_later.lua): each ``(job, retry
    at, traceback)`` leaves the stream (the queue's, or the aside stream of handler
    ``aside``) for the scheduled zset. Replies ``(moved, rejected)`` (and a third element
    when fenced: nothing moved); on a pipeline as ``settle_jobs`` (``bare``: the caller
    heals a ``NoScriptError`` reply); ``fence`` as for ``settle_jobs``."""
    stream = stream or (tk.aside_stream(aside) if aside else tk.stream)
    keys = [stream, tk.scheduled, tk.record, tk.dead, tk.aside, fence or stream]
    argv: list[Any] = [tk.group, repr(now), worker_id, aside]
    for job, run_at, error in later:
        e = job.entry
        keys.append(tk.job_prefix + e.job_id)
        argv += (e.entry_id, e.job_id, "1" if e.named else "", e.handler, e.payload)
        argv += (e.enqueued, repr(job.started_at), job.attempt, repr(run_at), error, e.options)
    return Call("retry_later", keys, argv, _same, client, unpiped_on_cluster=True, bare=True)


def release_keys(tk: TaskKeys, held: Sequence[JobEntry], keys: list[str], argv: list[Any]) -> bool:
    """``settle_jobs``' optional section: the unique keys the settled jobs ``held`` (those
    with options of their own) free, as they finished (added to ``keys`` and ``argv``);
    nothing, and False, if none holds one."""
    released = [e for e in held if e.job_options.key]
    if not released:
        return False
    argv.append(len(released))
    for e in released:
        key, unique_for = e.job_options.key, e.job_options.unique_for
        assert key is not None
        keys.append(tk.unique(key))
        argv += (e.entry_id, e.job_id, unique_ms(unique_for))
    return True


def unique_ms(unique_for: float | None) -> str:
    """How long a finished job's unique key stays held, as its index's ``PX`` ('' = not)."""
    return "" if unique_for is None else str(max(1, round(unique_for * 1000)))


class Unique(NamedTuple):
    """What ``enqueue_unique`` replied: the job holding the key, and whether this call made
    it (else it found it); ``look``: the holder may have ended, call again with its record."""

    job_id: str
    made: bool
    look: bool = False


def _unique(reply: Any) -> Unique | None:
    if reply is None:
        return None
    made, job_id = int(reply[0]), text(reply[1])
    return Unique(job_id, made == 1, made == 2)


def enqueue_unique(
    tk: TaskKeys,
    job: NewJob,
    key: str,
    now: float,
    holder: str = "",
    deps: Sequence[str] = (),
) -> Call[Unique | None]:
    """Enqueue ``job`` unless a job holding unique ``key`` is live (``enqueue_unique.lua``),
    looking at the record of ``holder`` (the one a reply said to look at) if it names it;
    with ``deps`` (refs), deferred until they are done (as ``defer_job``); None if the
    queue's stream is gone (nothing written)."""
    keys = [tk.stream, tk.scheduled, tk.unique(key)]
    if holder:
        keys.append(tk.job(holder))
    at = ""
    if deps:
        keys += (tk.job(job.id), tk.deps(job.id), tk.deferred)
    elif job.at is not None:
        keys.append(tk.job(job.id))
        at = repr(job.at)
    elif job.id:  # prioritised, to run now: its record, then its band's stream
        keys += (tk.job(job.id), tk.stream_of(job.id))
    named = job.id
    args: list[Any] = [repr(now), WAITING, holder, named, job.handler, job.payload, at, job.options]
    if deps:
        args += (len(deps), *deps)
    return Call("enqueue_unique", keys, args, _unique)


def release_unique(tk: TaskKeys, key: str, job_id: str, unique_for: float | None) -> Call[bool]:
    """Free unique ``key`` of job ``job_id``, finished (kept ``unique_for`` s more, if
    given), if its index still names that job (``release_unique.lua``)."""
    return Call("release_unique", [tk.unique(key)], [job_id, unique_ms(unique_for)], bool)


def promote_due(tk: TaskKeys, job_ids: Sequence[str]) -> Call[int]:
    """Move the due ``job_ids`` onto their stream: all of one band (``TaskKeys.stream_of``:
    the caller splits them by band)."""
    stream = tk.stream_of(job_ids[0]) if job_ids else tk.stream
    keys = [stream, tk.scheduled, *(tk.job(j) for j in job_ids)]
    return Call("promote_due", keys, list(job_ids), int)


def defer_job(tk: TaskKeys, job: NewJob, now: float, deps: Sequence[str]) -> Call[bool]:
    """Write a deferred job (defer_job.lua): its record and the ``deps`` (refs) it waits
    for; False, and nothing written, if the queue's stream is gone."""
    keys = [tk.stream, tk.job(job.id), tk.deps(job.id), tk.deferred]
    args = [job.id, job.handler, job.payload, repr(now), job.options, *deps]
    return Call("defer_job", keys, args, lambda reply: bool(reply))


def _depended(reply: Any) -> tuple[str, str]:
    return text(reply[0]), text(reply[1]) if len(reply) > 1 else ""


def depend(tk: TaskKeys, job_id: str, dependent: str, own: str) -> Call[tuple[str, str]]:
    """Register ``dependent`` (``Q/J``) as a waiter of job ``job_id`` of the queue ``tk``
    (``''``: of the task ``tk`` itself) (depend.lua): ``(what, why)``: ``wait``, ``done``,
    ``dead`` (why), ``unknown``, ``cycle``, or ``entry`` (why: the id of the job whose
    entry ``job_id`` is). ``own``: the dependency's ref."""
    job = (tk.job(job_id), tk.deps(job_id)) if job_id else (tk.record, tk.record)
    keys = [tk.record, job[0], tk.stream, tk.waiters, job[1]]
    return Call("depend", keys, [job_id, dependent, ACTIVE, own], _depended)


class Released(NamedTuple):
    """What ``release_job`` replied: 0 nothing, 1 still waits, 2 on the stream, 3 dead;
    the entry id (2), or how many of its own waiters went to the outbox (3); a dead job's
    own options (its unique key, to free)."""

    what: int
    detail: str = ""
    options: JobOptions | None = None


def _released(reply: Any) -> Released:
    options = JobOptions.parse(reply[2]) if len(reply) > 2 and reply[2] else None
    return Released(int(reply[0]), text(reply[1]) if len(reply) > 1 else "", options)


def release_job(
    tk: TaskKeys, job_id: str, dependency: str, outcome: str, reason: str, now: float
) -> Call[Released]:
    """Release the deferred job ``job_id`` of queue ``tk`` from ``dependency`` (its ref),
    ``done`` or ``dead`` (release_job.lua): ``Released``."""
    keys = [tk.deps(job_id), tk.job(job_id), tk.stream_of(job_id), tk.dead, tk.record]
    keys.append(tk.deferred)
    keys += (tk.waiters, tk.released)
    args = [job_id, dependency, outcome, reason, repr(now)]
    return Call("release_job", keys, args, _released)


STOPPED_RUNNING = 3  # cancel_job: a running job cancelled; its member is told to stop it


class CancelReply(NamedTuple):
    """What ``cancel_job`` replied: ``found`` (its code, or an aside handler), the job's own
    options, and the member running it when it was stopped (``STOPPED_RUNNING``)."""

    found: int | str
    options: JobOptions | None
    member: str | None = None


def _cancel_reply(reply: Any) -> CancelReply:
    if isinstance(reply, list):
        member = text(reply[2]) if len(reply) > 2 else None
        options = JobOptions.parse(reply[1]) if reply[1] else None
        return CancelReply(int(reply[0]), options, member)
    return CancelReply(text(reply) if isinstance(reply, bytes | str) else int(reply), None)


def cancel_job(
    tk: TaskKeys, job_id: str, now: float, ttl: int, aside: str = "", running: bool = False
) -> Call[CancelReply]:
    """1 cancelled, 2 cancelled and its handler left the queue's handler set, 0 it had
    started or finished, -1 no such job; a string: the handler whose aside stream the job
    waits on ('' the queue's own), to call again with (``aside``). With it, the cancelled
    job's own options (None: it has none), whose unique key is to release. With
    ``running``, a job a member runs is cancelled too (``STOPPED_RUNNING``, naming it)."""
    stream = tk.aside_stream(aside) if aside else tk.stream_of(job_id)
    keys = [stream, tk.scheduled, tk.job(job_id), tk.aside, tk.handlers]
    keys += (tk.deps(job_id), tk.deferred, tk.waiters, tk.released, tk.groups_waiting)
    keys.append(tk.cancelled)
    args = [tk.group, job_id, repr(now), ttl, aside, "1" if running else ""]
    return Call("cancel_job", keys, args, _cancel_reply)


def _set_aside_reply(reply: Any) -> str | int:
    return text(reply[1]) if int(reply[0]) == 1 else int(reply[0])


def set_aside(
    tk: TaskKeys,
    entry_id: str,
    job_id: str,
    worker_id: str,
    handler: str,
    why: str,
    starts: int,
    stream: str = "",
) -> Call[str | int]:
    """Move a job this member may not run from ``stream`` (default: the queue's; a band's)
    to its handler's aside stream (set_aside.lua): the new entry's id; 0 if the entry is no
    longer ours, -1 if it names no waiting job."""
    stream = stream or tk.stream
    keys = [stream, tk.aside_stream(handler), tk.aside, tk.job(job_id), tk.handlers]
    args = [tk.group, entry_id, worker_id, handler, why, starts]
    return Call("set_aside", keys, args, _set_aside_reply)


def reopen_queue(tk: TaskKeys, others: Sequence[str]) -> Call[float | None]:
    """Reopen a finished queue (reopen_queue.lua): its ``created_at``, or None if it was
    active (or missing). ``others``: its keys besides the record and refusals."""
    keys = [tk.record, tk.refused, *others]
    return Call("reopen_queue", keys, [ACTIVE], lambda r: None if r is None else float(r))


def pause_queue(tk: TaskKeys, paused: bool) -> Call[int]:
    """Set (``paused``) or clear the queue's paused flag (pause_queue.lua): 1 changed, 0 it
    was so already, -1 no such queue record."""
    return Call("pause_queue", [tk.record], ["1" if paused else "", QUEUE_PAUSED], int)


def configure_queue(tk: TaskKeys, read: bytes, spec: str) -> Call[int]:
    """Write a queue's new ``spec`` if it is still the one ``read`` (configure_queue.lua):
    the new settings version; 0 the spec changed meanwhile, -1 no such queue record."""
    return Call("configure_queue", [tk.record], [read, spec, QUEUE_SETTINGS], int)


def requeue_job(tk: TaskKeys, dead_entry: str, job_id: str, now: float) -> Call[Any]:
    keys = [tk.stream_of(job_id), tk.record, tk.dead, tk.job(job_id)]
    return Call("requeue_job", keys, [dead_entry, repr(now)], _same)


def job_progress(
    tk: TaskKeys, job_id: str, named: bool, report: tuple[float, str | None], ttl: int
) -> Call[bool]:
    """Write a running job's last progress ``report`` (fraction, message) into its record
    (job_progress.lua): False if it was not written (the job had settled, or is none)."""
    fraction, message = report
    given = "" if message is None else "1"
    args = [repr(fraction), given, message or "", ttl, "1" if named else ""]
    return Call("job_progress", [tk.job(job_id)], args, lambda reply: int(reply) == 1)


# The scripts a ``Scripts`` / ``AsyncScripts`` loads, each built by the function of its name.
def submit_small(
    tk: TaskKeys,
    streams: Sequence[str],
    record: Mapping[Any, Any],
    batch: Sequence[tuple[int, int, str, str]],
    score: float,
    publish: tuple[str, str, str, Mapping[str, str]] | None,
    client: Any = None,
) -> Call[Any]:
    """A small task in one atomic step (``submit_small.lua``): 1 if written, 0 if its id
    exists. ``publish`` = (queue, index, events, event fields) on one server, where the
    script also queues, indexes and announces it; None on a cluster."""
    args: list[Any] = [len(streams), tk.group, repr(score), tk.task_id, len(record)]
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
    return Call("submit_small", keys, args, _same, client)


def _leased(reply: Any) -> tuple[int, str]:
    if int(reply[0]) == 0:
        return 0, ""
    return int(reply[0]), _s(reply[1])


def lease_acquire(key: str, term_key: str, holder: str, ttl_ms: int) -> Call[tuple[int, str]]:
    """Take the lease if it is free: (term, token), or (0, "") if it is held."""
    return Call("lease_acquire", [key, term_key], [holder, ttl_ms], _leased)


def fenced(keys: Sequence[str], args: Sequence[Any]) -> Call[list[int]]:
    """One call of ``fenced.lua`` (see ``controller.fence``): [1, replies...] or [0]."""
    return Call("fenced", list(keys), list(args), lambda reply: [int(x) for x in reply])


# one script per file of ``queueworks/lua/``: the folder is the list. A helper is composed
# into another script as it is loaded (``bound._source``), never run alone.
HELPERS = frozenset({"fire_schedule"})
NAMES = tuple(
    sorted(
        name
        for entry in resources.files("queueworks").joinpath("lua").iterdir()
        if (name := entry.name.removesuffix(".lua")) != entry.name and name not in HELPERS
    )
)


def _s(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def fields_of(flat: Sequence[bytes]) -> dict[bytes, bytes]:
    """A stream entry's flat field list, as read inside Lua, as the dict redis-py gives."""
    return {flat[i]: flat[i + 1] for i in range(0, len(flat), 2)}
