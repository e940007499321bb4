"""Jobs that wait for others: ``q.enqueue(h, p, depends_on=[job, task, ...])``.

A job with dependencies is *deferred*: it has an id of its own and a record (state
``deferred``, its handler, payload and options) and a set of the dependencies it still
awaits (``TaskKeys.deps``), and costs nothing while it waits: nobody polls it. Each
dependency knows its waiters (``TaskKeys.waiters``, in the dependency's slot), registered
atomically with a look at its state (``depend.lua``): a dependency that has an outcome
already says so, and the job is released at once.

The step that writes a dependency's final outcome (``settle_jobs.lua``: done or dead;
``cancel_job.lua``: cancelled; a task's ``settle.lua`` / ``set_state.lua``: completed,
failed, cancelled) moves its waiters to its **outbox** (``TaskKeys.released``, a list in
its own slot: on Redis Cluster the dependents' queues are in other slots). Whoever wrote
the outcome drains it right after (``plan_drain``): one ``release_job.lua`` call per item
in the dependent's slot, idempotent (the first release of a dependency counts), then the
item leaves the outbox. The last dependency done puts the job on its stream (a named
entry); a dead one buries it (dead, reason naming the dependency), and its own waiters
follow (the cascade). A drainer that died between the two is covered by the backstop: a
queue's leader looks at its queue's outbox (an ``LLEN`` on the read of its duty pass) and
drains it when it is not empty, and drains a few of those of the tasks and queues that
jobs wait for (``Keys.dep_tasks``) every ``TASKS_SECONDS`` (``DRAIN_BATCH`` items of each
at most a round).

A queue that finishes (cancelled, failed) before some of its jobs have an outcome leaves
them without one while it stays finished: every field of its waiters hash but ``*`` is
such a job. Their dependents in other queues die ("its queue was cancelled"): the step
that finishes the queue (``set_state.lua``) moves those of one HSCAN step (``COUNT
DRAIN_BATCH``) to its outbox, with its own ``*``; ``bury_waiters.lua`` takes the next
steps (``plan_bury``: the canceller at once, the backstop for a queue finished by
another writer, or whose canceller died); ``depend.lua`` answers dead for such a job.
Their dependents in the queue itself are unfinished jobs of it too: they stay, frozen
with it (they expire with its keys). A reopened queue is active again: its jobs run and
release those as usual; the dependents in other queues that died stay dead (requeued
from their dead letters).

A dependency is named by a ref: ``Q/J`` for job ``J`` of queue ``Q``, ``T`` for task ``T``.
The registration refuses (``ValueError``, the job taken back) a ref that names a job's stream
entry instead of its id (its releases come under the id), and a cycle: the job itself, or a
deferred job whose dependencies set holds the job (written with it, before any registration
of it: of two jobs enqueued waiting for each other, neither is left waiting).
"""

from __future__ import annotations

import random
import re
import time
from collections.abc import Iterable, Sequence
from typing import Any, NamedTuple

from queueworks.protocol.keys import Keys, TaskKeys, check_task_id
from queueworks.protocol.messages import text
from queueworks.protocol.models import ACTIVE_STATES
from queueworks.scripts import calls
from queueworks.scripts.calls import DRAIN_BATCH
from queueworks.transport.plans import Plan, Trip

MAX_DEPENDENCIES = 100  # per job
DRAIN_ROUNDS = 20  # looks one drain makes at most (a cascade is a look per queue it reaches)
TASKS_LOOKED = 8  # tasks and queues of ``Keys.dep_tasks`` one backstop pass looks at
# as jobrecords.JOB_ID (a prioritised job's ends with its band)
JOB_ID = re.compile(r"^(?:[0-9a-f]{1,64}(?:\.p-?\d)?|\d{1,19}-\d{1,19})$")
TASK_PREFIX = "task:"  # a task named by a string: "task:<id>"
TASKS_SECONDS = 2.0  # s between two looks of a queue's leader at tasks' outboxes
ACTIVE = {state.value for state in ACTIVE_STATES}


class Dependency(NamedTuple):
    """One dependency: job ``job_id`` of queue ``owner``, or (no ``job_id``) the task
    ``owner``."""

    owner: str
    job_id: str = ""

    @property
    def ref(self) -> str:
        return f"{self.owner}/{self.job_id}" if self.job_id else self.owner

    def __str__(self) -> str:
        return self.ref if self.job_id else f"{TASK_PREFIX}{self.owner}"


def parse_dependency(item: Any) -> Dependency:
    """A dependency from a ``Job``/``AsyncJob`` (its queue and id), a ``Task``/``AsyncTask``
    (its id), or a string: ``"QUEUE/JOB_ID"`` or ``"task:TASK_ID"``; ``ValueError`` naming
    what is wrong."""
    queue = getattr(item, "queue", None)
    if queue is not None and isinstance(getattr(queue, "name", None), str):
        return _job(queue.name, getattr(item, "id", None), item)
    if not isinstance(item, str) and isinstance(getattr(item, "keys", None), TaskKeys):
        return Dependency(check_task_id(item.id, "depends_on task id"))
    if not isinstance(item, str):
        raise ValueError(f"depends_on: {item!r} is no job, task, 'QUEUE/JOB_ID' nor 'task:TASK_ID'")
    if item.startswith(TASK_PREFIX):
        return Dependency(check_task_id(item[len(TASK_PREFIX) :], "depends_on task id"))
    name, slash, job_id = item.partition("/")
    if not slash:
        raise ValueError(f"depends_on: {item!r} is neither 'QUEUE/JOB_ID' nor 'task:TASK_ID'")
    return _job(name, job_id, item)


def _job(queue: str, job_id: Any, item: Any) -> Dependency:
    check_task_id(queue, "depends_on queue")
    if not isinstance(job_id, str) or not JOB_ID.match(job_id):
        raise ValueError(f"depends_on: {item!r} names no job id a queue gives (hex or entry id)")
    return Dependency(queue, job_id)


def dependencies(items: Iterable[Any]) -> list[Dependency]:
    """``depends_on`` checked: each item parsed (``parse_dependency``), duplicates once, at
    least one and at most ``MAX_DEPENDENCIES``; ``ValueError`` naming what is wrong."""
    if isinstance(items, str) or not isinstance(items, Iterable):
        items = [items]
    out = list(dict.fromkeys(parse_dependency(item) for item in items))
    if not out:
        raise ValueError("depends_on: empty; leave it out for a job that waits for nothing")
    if len(out) > MAX_DEPENDENCIES:
        raise ValueError(f"depends_on: {len(out)} dependencies, at most {MAX_DEPENDENCIES}")
    return out


def registered(me: str, deps: Sequence[Dependency], replies: Sequence[Any]) -> list[Any]:
    """What ``depend.lua`` replied for each of ``deps`` of the job ``me`` (``Q/J``): the
    ones with an outcome already, as ``(dependency, outcome, reason)``; ``ValueError`` for
    an unknown dependency, a stream entry named instead of its job, or a cycle."""
    outcomes = []
    for dep, (what, why) in zip(deps, replies, strict=True):
        if what == "unknown":
            raise ValueError(f"depends_on: no {describe(dep)} (never enqueued, or it expired)")
        if what == "entry_of":
            job = f"{dep.owner}/{why}"
            raise ValueError(
                f"depends_on: {dep.ref} is the stream entry of job {job}, not a job id;"
                f" name the job: {job!r}"
            )
        if what == "cycle":
            cycle = f"{me} -> {me}" if dep.ref == me else f"{me} -> {dep.ref} -> {me}"
            raise ValueError(f"depends_on: a dependency cycle: {cycle}")
        if what in ("done", "dead"):
            outcomes.append((dep, what, died(dep.ref, why) if what == "dead" else ""))
    return outcomes


def describe(dep: Dependency) -> str:
    return f"job {dep.job_id!r} in queue {dep.owner!r}" if dep.job_id else f"task {dep.owner!r}"


def died(ref: str, why: str) -> str:
    """A dependent's reason when its dependency ``ref`` did not end done."""
    return f"dependency {ref}: {why}"


def plan_register(keys: Keys, qk: TaskKeys, job_id: str, deps: Sequence[Dependency]) -> Plan[None]:
    """Register the deferred job ``job_id`` of queue ``qk`` (written: ``defer_job``) at each
    of ``deps``, and release it from those that have an outcome already; ``ValueError``
    (the job is taken back: nothing of it stays) for an unknown dependency or a cycle."""
    me = f"{qk.task_id}/{job_id}"
    trip = Trip()
    # before the registration: the backstop sees the task, or the queue, once it finishes
    if deps:
        trip.sadd(keys.dep_tasks, *dict.fromkeys(d.owner for d in deps))
    first = len(trip)
    for dep in deps:
        trip.call(calls.depend(keys.task(dep.owner), dep.job_id, me, dep.ref))
    try:
        outcomes = registered(me, deps, (yield trip)[first:])
    except ValueError:
        trip = Trip()
        trip.delete(qk.job(job_id), qk.deps(job_id))
        trip.zrem(qk.deferred, job_id)
        yield trip
        raise
    if outcomes:
        trip, now = Trip(), time.time()
        for dep, outcome, reason in outcomes:
            trip.call(calls.release_job(qk, job_id, dep.ref, outcome, reason, now))
        yield from plan_free_keys([(qk, job_id, r) for r in (yield trip)])


def plan_free_keys(released: Sequence[tuple[TaskKeys, str, calls.Released]]) -> Plan[None]:
    """Free the unique keys of the jobs ``release_job`` buried (``(queue, job id, reply)``):
    a job dead of a dependency holds its key no longer (as ``cancel``, a second step: an
    enqueue between the two finds the job dead and takes the key)."""
    trip = Trip()
    for qk, job_id, r in released:
        if r.what == 3 and r.options is not None and r.options.key is not None:
            trip.call(calls.release_unique(qk, r.options.key, job_id, r.options.unique_for))
    if len(trip):
        yield trip


class OutboxItem(NamedTuple):
    """One dependent to release, as an outbox holds it: ``Q/J<TAB>J'<TAB>outcome<TAB>why``
    (``J'``: the dependency's job id in the outbox's queue, ``*`` for its task itself)."""

    raw: bytes | str
    queue: str
    job_id: str
    dependency: str  # its ref
    outcome: str
    why: str


def outbox_item(owner: str, raw: bytes | str) -> OutboxItem | None:
    """An item of ``owner``'s outbox; None for one that cannot be (written by hand)."""
    parts = text(raw).split("\t", 3)
    if len(parts) != 4 or parts[2] not in ("done", "dead"):
        return None
    queue, _, job_id = parts[0].partition("/")
    if not JOB_ID.match(job_id) or not queue:
        return None
    dependency = owner if parts[1] == "*" else f"{owner}/{parts[1]}"
    return OutboxItem(raw, queue, job_id, dependency, parts[2], parts[3])


def plan_drain(keys: Keys, owners: Iterable[str]) -> Plan[int]:
    """Release the dependents in the outboxes of ``owners`` (queues or tasks), and of the
    queues their deaths cascade to: ``DRAIN_BATCH`` items of each outbox a round (three
    round trips: read, release, remove), ``DRAIN_ROUNDS`` rounds at most (the backstop
    does the rest). How many jobs it put on their streams or buried."""
    todo, released = list(dict.fromkeys(owners)), 0
    for _ in range(DRAIN_ROUNDS):
        if not todo:
            break
        trip = Trip()
        for owner in todo:
            trip.lrange(keys.task(owner).released, 0, DRAIN_BATCH - 1)
        found = [(owner, raws) for owner, raws in zip(todo, (yield trip), strict=True) if raws]
        if not found:
            break
        items = [(owner, raw, outbox_item(owner, raw)) for owner, raws in found for raw in raws]
        trip, now = Trip(), time.time()
        sent = []
        for _owner, _raw, item in items:
            if item is not None and _valid_queue(item.queue):
                reason = died(item.dependency, item.why) if item.outcome == "dead" else ""
                tk = keys.task(item.queue)
                trip.call(
                    calls.release_job(tk, item.job_id, item.dependency, item.outcome, reason, now)
                )
                sent.append(item)
        replies = (yield trip) if len(trip) else []
        trip = Trip()
        for owner, raw, _item in items:
            trip.lrem(keys.task(owner).released, 1, raw)
        yield trip
        todo = [owner for owner, raws in found if len(raws) >= DRAIN_BATCH]
        for item, r in zip(sent, replies, strict=True):
            released += r.what >= 2
            if r.what == 3 and r.detail != "0" and item.queue not in todo:
                todo.append(item.queue)
        buried = zip(sent, replies, strict=True)
        yield from plan_free_keys([(keys.task(i.queue), i.job_id, r) for i, r in buried])
    return released


def _valid_queue(name: str) -> bool:
    try:
        check_task_id(name)
    except ValueError:
        return False
    return True


def plan_bury(keys: Keys, queues: Iterable[str], start: str = "0") -> Plan[int]:
    """Kill the jobs of other queues waiting for the jobs of finished ``queues`` that have
    no outcome (and those waiting for the queues as tasks): drain their outboxes, then
    move such waiters there (``bury_waiters.lua``, one HSCAN step of ``DRAIN_BATCH`` a
    call, from ``start`` round to the start of the hash and on) and drain them,
    ``DRAIN_ROUNDS`` steps at most (the backstop does the rest). The writer that
    finished a queue runs it right after. How many jobs it buried."""
    todo = dict.fromkeys(queues, (start, start == "0"))  # queue -> (cursor, wrapped)
    released = yield from plan_drain(keys, todo)
    for _ in range(DRAIN_ROUNDS):
        if not todo:
            break
        trip = Trip()
        for queue, (cursor, _) in todo.items():
            trip.call(calls.bury_waiters(keys.task(queue), cursor))
        steps = dict(zip(todo, (yield trip), strict=True))
        moved = [queue for queue, (_, n) in steps.items() if n]
        if moved:
            released += yield from plan_drain(keys, moved)
        todo = {
            queue: (cursor, todo[queue][1] or cursor == "0")
            for queue, (cursor, _) in steps.items()
            if cursor != "0" or not todo[queue][1]  # at the end: once round from the start
        }
    return released


def plan_task_backstop(keys: Keys) -> Plan[int]:
    """The backstop of tasks' and queues' outboxes (a queue leader's duty, every
    ``TASKS_SECONDS``): drain those of a few tasks and queues that jobs wait for
    (``TASKS_LOOKED``, at random), and bury the waiters a finished queue has left
    (``plan_bury``); one that has finished with no waiter and nothing in its outbox
    leaves ``Keys.dep_tasks`` (no job can wait for it any more). How many jobs it
    released."""
    trip = Trip()
    trip.srandmember(keys.dep_tasks, TASKS_LOOKED)
    tasks = [text(t) for t in (yield trip)[0] or []]
    if not tasks:
        return 0
    released = yield from plan_drain(keys, tasks)
    trip = Trip()
    for task in tasks:
        tk = keys.task(task)
        trip.hget(tk.record, "state")  # first: a finished task takes no new waiter
        trip.hlen(tk.waiters)  # a finished one's: its jobs' that have no outcome
        trip.llen(tk.released)
    replies = yield trip
    finished = [(task, replies[3 * i + 1], replies[3 * i + 2]) for i, task in enumerate(tasks)]
    finished = [row for i, row in enumerate(finished) if _finished(replies[3 * i])]
    left = [task for task, waiters, _ in finished if waiters]
    if left:  # from anywhere: a pass that stops early leaves another part first to the next
        released += yield from plan_bury(keys, left, str(random.getrandbits(32)))
    gone = [task for task, waiters, outbox in finished if not waiters and not outbox]
    if gone:
        trip = Trip()
        trip.srem(keys.dep_tasks, *gone)
        yield trip
    return released


def _finished(state: Any) -> bool:
    return state is None or text(state) not in ACTIVE
