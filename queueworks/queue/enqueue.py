"""Enqueueing, written once for ``Queue`` and ``AsyncQueue``: the checks of what an
``enqueue`` or an ``enqueue_many`` is given, and ``plan_enqueue``, the one plan that routes
a job: one with a unique key by ``plan_unique`` (deferred as well, with dependencies), one
with dependencies alone by ``plan_defer``, any other by ``plan_write`` (a lone job to run
now: its ``XADD``; a wait for replicas: its ``WAIT`` in the same round trip).

Each client has its own way for the jobs ``plan_write`` would write, tried before the plan:
the sync ``Queue`` sends the ``XADD`` of a job to run now itself, on the client's line
(``queueworks.transport.wire``), and ``AsyncQueue`` gathers the enqueues in flight together
into one round trip (``JobWriter``).
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from typing import Any, NamedTuple, TypeAlias

from queueworks.protocol.job_options import JobOptions
from queueworks.protocol.priorities import DEFAULT, check_priority
from queueworks.queue.queue_plans import QueueRef, plan_defer, plan_unique, plan_write
from queueworks.queue.queue_settings import QueueSettings, queue_wait
from queueworks.queue.queues import batch_options, deferred_on, new_job
from queueworks.scripts.calls import NewJob
from queueworks.task.dependencies import Dependency
from queueworks.transport.plans import Plan
from queueworks.transport.replication import NO_WAIT, Replicas

# an enqueue's job, its dependencies, unique key and wait: a tuple, not a class (one is made
# for every enqueue but the sync client's plainest, and a tuple costs least)
Enqueue: TypeAlias = tuple[NewJob, list[Dependency], str | None, Replicas]


def enqueue_of(
    settings: QueueSettings,
    path: str,
    payload: Any,
    body: str | None,
    options: JobOptions | None,
    band: int,
    *,
    delay: float | None,
    at: datetime | float | None,
    depends_on: Iterable[Any] | None,
    wait_replicas: int | None,
    wait_timeout: float | None,
) -> Enqueue:
    """An ``enqueue``'s job (``new_job``: ``band`` its priority, ``body`` its payload's JSON
    if made already), checked, and what routes it: the dependencies it is deferred on
    (``deferred_on``; none: it is not), its unique key (``options.key``) and the replicas
    it waits for (``queue_wait``; ``NO_WAIT`` where neither the queue nor the call asks
    for any, or where it is deferred without a unique key); ``ValueError`` naming what is
    wrong. A job with neither dependencies nor a key is one ``plan_write`` writes: each
    client may write it its own way."""
    job = new_job(path, payload, delay, at, options, body, band)
    deps = [] if depends_on is None else deferred_on(depends_on, delay, at)
    key = None if options is None else options.key
    asked = settings.wait_replicas or wait_replicas is not None or wait_timeout is not None
    if not asked or (deps and key is None):
        return job, deps, key, NO_WAIT
    return job, deps, key, queue_wait(settings, wait_replicas, wait_timeout)


def plan_enqueue(
    ref: QueueRef, job: NewJob, deps: list[Dependency], key: str | None, wait: Replicas
) -> Plan[tuple[str, bool, int | None]]:
    """Enqueue ``job`` (``enqueue_of``'s) by its route (the module docstring): its id,
    whether this call made it (False: a job holding its unique key was live), and how many
    replicas acknowledged (None: not asked)."""
    if key is not None:
        return (yield from plan_unique(ref, job, key, wait, deps))
    if deps:
        return (yield from plan_defer(ref, job, deps)), True, None
    ids, acked = yield from plan_write(ref, [[job]], wait)
    return ids[0], True, acked


class Many(NamedTuple):
    """What every job of one ``enqueue_many`` shares, checked."""

    options: str  # every job's options JSON ('' none; while tracing, the trace context)
    band: int  # every job's priority
    wait: Replicas  # the replicas its last round trip waits for


def many_of(
    settings: QueueSettings,
    group: str | None,
    priority: int | None,
    wait_replicas: int | None,
    wait_timeout: float | None,
) -> Many:
    """An ``enqueue_many``'s ``group``, ``priority`` and wait, checked before any job is
    sent (``ValueError`` naming the bad one)."""
    options = batch_options(group)
    band = DEFAULT if priority is None else check_priority(priority)
    return Many(options, band, queue_wait(settings, wait_replicas, wait_timeout))
