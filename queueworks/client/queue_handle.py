"""``Queue`` and ``Job``: the sync handles of a queue and of one of its jobs
(``queueworks.queue.queues`` says what a queue is). Each method runs a plan of
``queueworks.queue.queue_plans`` (the ones ``AsyncQueue`` and ``AsyncJob`` run; an enqueue's:
``queueworks.queue.enqueue``) with ``queueworks.transport.runner.run``; two strategies are this
client's own: ``enqueue`` of a job to run now sends its ``XADD`` (``xadd_now``) itself, the
hottest call of the client, and ``enqueue_many`` builds the next pipeline while a thread sends
the one before (``_Sender``).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from datetime import datetime
from functools import partial
from typing import Any, Generic, Unpack

from typing_extensions import TypeVar

from queueworks.job_functions import Call
from queueworks.protocol.job_options import JobOptions
from queueworks.protocol.messages import text
from queueworks.protocol.models import JobDetail, JobPage, JobStatus, QueueStatus, Schedule
from queueworks.protocol.priorities import DEFAULT, check_priority, prioritised_id
from queueworks.queue.configure import plan_configure
from queueworks.queue.enqueue import enqueue_of, many_of, plan_enqueue
from queueworks.queue.job_lists import plan_job_detail, plan_jobs
from queueworks.queue.queue_admin import (
    plan_delete_dead,
    plan_empty,
    plan_pause,
    plan_requeue_dead,
    plan_run_now,
)
from queueworks.queue.queue_plans import (
    QueueRef,
    plan_job_cancel,
    plan_job_result,
    plan_job_status,
    plan_open,
    plan_queue_status,
    plan_resend,
    plan_revive,
    plan_running,
    plan_send,
)
from queueworks.queue.queue_settings import LiveOptions, QueueSettings
from queueworks.queue.queues import (
    ENQUEUE_BATCH,
    ENQUEUE_PIPELINE,
    RUNNING_SHOWN,
    HandlerPaths,
    checked_call,
    enqueued,
    payload_json,
    tell_handlers,
    xadd_now,
)
from queueworks.queue.schedule_plans import plan_schedule, plan_schedules, plan_unschedule
from queueworks.scripts import calls
from queueworks.scripts.calls import EnqueueBatch, NewJob
from queueworks.task.tasks import Backend, Task
from queueworks.tracing import hooks
from queueworks.transport.connection import one_command
from queueworks.transport.plans import Plan, Trip
from queueworks.transport.replication import replicated
from queueworks.transport.runner import run, send_trip
from queueworks.transport.wire import XaddBytes

T = TypeVar("T")
R = TypeVar("R", default=Any)


class Queue:
    """A handle to one queue: ``client.queue("emails")``. It carries the queue's settings:
    if the queue is gone from Redis it creates it again with them (``queueworks.queue.vanished``)
    — unless ``revives`` is false (a listing's handle, which does not know them)."""

    def __init__(
        self,
        client: Backend,
        name: str,
        settings: QueueSettings,
        *,
        revives: bool = True,
        known: Iterable[str] = (),
    ) -> None:
        self.client, self.name, self.settings = client, name, settings
        self.revives = revives
        self.ref = QueueRef(client.keys, name, settings, revives)
        self.ref.known.update(known)  # (the handlers the queue was told about, when opened)
        self.keys = self.ref.qk
        self._path = HandlerPaths()
        self._xadd_bytes = XaddBytes(self.keys)

    def __repr__(self) -> str:
        return f"Queue({self.name!r})"

    def _run(self, plan: Plan[T]) -> T:
        return run(self.client.redis, self.client.scripts, plan)

    @property
    def task(self) -> Task:
        """The queue as a task (``resize``, ``set_priority``, ``cancel`` stop it taking
        nodes for good)."""
        return Task(self.client, self.name)

    def job(self, job_id: str) -> Job:
        return Job(self, job_id)

    # -- enqueueing -----------------------------------------------------------------------

    def enqueue(
        self,
        handler: str | Callable[..., Any] | Call[R],
        payload: Any = None,
        *,
        delay: float | None = None,
        at: datetime | float | None = None,
        wait_replicas: int | None = None,
        wait_timeout: float | None = None,
        retry_delay: float | None = None,
        retry_backoff: float | None = None,
        retry_max_delay: float | None = None,
        key: str | None = None,
        unique_for: float | None = None,
        group: str | None = None,
        depends_on: Iterable[Any] | None = None,
        priority: int | None = None,
    ) -> Job[R]:
        """Add one job: ``handler`` (``"module:function"`` or the function) runs on
        ``payload`` (JSON); or a typed job function's call (``fn.call(...)``), no payload:
        its ``Job[R]``'s ``result()`` is of the function's return type.
        ``delay`` (s) or ``at`` (a datetime or Unix time): not before.
        ``retry_delay``, ``retry_backoff``, ``retry_max_delay``: this job's own retry
        schedule, instead of the queue's settings of the same names. ``key``: a unique
        key; while a job holding it is live (or finished less than ``unique_for`` s ago),
        this returns that job (``created`` False: this call's handler and payload are not
        used) instead of making one. ``group``: the job's group; with the queue's
        ``group_limit``, at most that many jobs of one group run at once.
        ``depends_on``: jobs (``Job``, or ``"QUEUE/JOB_ID"``) and tasks (``Task``, or
        ``"task:TASK_ID"``) of any queue: the job waits, deferred, until every one is done
        (a task: completed), and dies, never run, if one dies, fails or is cancelled.
        ``priority``: from -5 to 5 (default 0), higher first, in order of enqueue within
        one priority (``queueworks.protocol.priorities``). One round
        trip. ``wait_replicas=n`` (default: the queue's setting): return only
        once ``n`` replicas hold the job (``WAIT``, up to ``wait_timeout`` s, in the same
        round trip); else ``NotReplicated`` (the job is queued on the primary)."""
        options = JobOptions.given(
            retry_delay=retry_delay,
            retry_backoff=retry_backoff,
            retry_max_delay=retry_max_delay,
            key=key,
            unique_for=unique_for,
            group=group,
        )
        if isinstance(handler, Call):
            path, body, typed = handler.path, checked_call(handler, payload), handler
        else:
            path, body, typed = self._path(handler), None, None
        band = DEFAULT if priority is None else check_priority(priority)
        plain = options is None and delay is None and at is None and depends_on is None
        if plain and wait_replicas is None and wait_timeout is None and not band:
            producer = hooks.producer  # tracing: the job carries the current span's context
            carried = "" if producer is None else producer.carry("")
            now_job = self._enqueue_now(path, payload, body, typed, carried)
            if now_job is not None:
                return now_job
        job, deps, key, wait = enqueue_of(
            self.settings,
            path,
            payload,
            body,
            options,
            band,
            delay=delay,
            at=at,
            depends_on=depends_on,
            wait_replicas=wait_replicas,
            wait_timeout=wait_timeout,
        )
        if key is None and not deps and not wait.replicas and self.ref.bare(job):
            reply = self._xadd(job)
            if reply is not None:  # nil: the queue's stream is gone (the plan revives it)
                return Job(self, text(reply), typed=typed)
        job_id, made, acked = self._run(plan_enqueue(self.ref, job, deps, key, wait))
        return replicated(self.name, [Job(self, job_id, made, typed)], acked, wait)[0]

    def _enqueue_now(
        self,
        path: str,
        payload: Any,
        body: str | None,
        typed: Call[R] | None,
        carried: str = "",
    ) -> Job[R] | None:
        """A job of no options to run now on the client's line, the shortest path of the
        commonest enqueue (``enqueue``'s own, as ``_xadd``); None where that path does not
        apply (no line, replicas to wait for, a handler the queue does not know yet).
        ``body``: the payload's JSON if made already (a typed call's); ``carried``: its
        options while tracing (the trace context alone)."""
        line = self.client.line
        if line is None or self.settings.wait_replicas or path not in self.ref.known:
            return None
        if body is None:
            body = payload_json(payload)
        reply = line.call(self._xadd_bytes.now(path, body, time.time(), carried))
        if reply is None:  # the stream is gone (nothing written): made again by the script
            job = NewJob("", path, body, None, carried)
            reply = self._run(plan_send(self.ref, [[job]]))[0]
        return Job(self, text(reply), typed=typed)

    def _xadd(self, job: NewJob) -> Any:
        """``xadd_now``'s XADD of ``job``: on the client's line (``queueworks.transport.wire``), its
        bytes the handler's, made once, and the payload's; or through redis-py."""
        line = self.client.line
        if line is None:
            return one_command(self.client.redis, *xadd_now(self.keys, job, time.time()))
        return line.call(self._xadd_bytes(job, time.time()))

    def enqueue_many(
        self,
        jobs: Iterable[tuple[str | Callable[..., Any], Any]] | Iterable[Call[R]],
        *,
        group: str | None = None,
        priority: int | None = None,
        wait_replicas: int | None = None,
        wait_timeout: float | None = None,
    ) -> list[Job[R]]:
        """Add many ``(handler, payload)`` jobs, or typed calls (``fn.call(...)``; their
        handles typed), in batches, pipelined; the next batch is
        built while Redis runs the one before. A bad job raises ``ValueError`` there: the
        batches sent before it are enqueued, the rest are not. ``group``: every job's, as
        for ``enqueue`` (checked before any is sent); ``priority`` too. ``wait_replicas`` as for
        ``enqueue``: one WAIT, after the last batch (it covers the ones before it);
        ``NotReplicated`` names every job written."""
        r, scripts, ref = self.client.redis, self.client.scripts, self.ref
        options, band, wait = many_of(self.settings, group, priority, wait_replicas, wait_timeout)
        sender, trip = _Sender(), Trip()
        batch, queued = EnqueueBatch(self.keys), 0
        told: set[str] = set()  # handlers the trips tell the queue about
        ids = Replies(self.name, lambda gone: self._run(plan_resend(ref, gone, told, wait)))
        typed: list[Call[R] | None] = []  # each job's call, if typed (decodes its result)
        try:
            for one in jobs:
                if queued >= ENQUEUE_PIPELINE:  # sent once more follows: the last trip waits
                    ids.read(sender.wait())
                    sender.send(partial(send_trip, r, scripts, trip))
                    ids.sent()
                    trip, queued = Trip(), 0
                if isinstance(one, Call):
                    path, body = one.path, one.body
                    typed.append(one)
                else:
                    handler, payload = one
                    path, body = self._path(handler), payload_json(payload)
                    typed.append(None)
                if path not in ref.known and path not in told:
                    tell_handlers(trip, ref.keys, self.keys, [path])
                    told.add(path)
                if band:
                    batch.add_prioritised(prioritised_id(band), path, body, options)
                else:
                    batch.add(path, body, options)
                if len(batch) >= ENQUEUE_BATCH:
                    ids.add(trip.call(calls.enqueue_batch(batch, time.time())), batch)
                    batch, queued = EnqueueBatch(self.keys), queued + 1
            if len(batch):
                ids.add(trip.call(calls.enqueue_batch(batch, time.time())), batch)
            ids.read(sender.wait())
            ids.sent()
            waited = wait.add(trip, [self.keys.stream]) if len(trip) else None
            ids.read(send_trip(r, scripts, trip) if len(trip) else [], waited)
            ref.known |= told
        finally:
            sender.close()
        made = zip(ids.ids, typed, strict=True)
        handles = [Job(self, job_id, typed=call) for job_id, call in made]
        return replicated(self.name, handles, ids.acked, wait)

    def _revive(self) -> None:
        """The queue is gone (or its stream): made again with this handle's settings."""
        self._run(plan_revive(self.ref))

    # -- reading --------------------------------------------------------------------------

    def status(self) -> QueueStatus:
        return self._run(plan_queue_status(self.ref))

    # -- periodic jobs ----------------------------------------------------------------------

    def schedule(
        self,
        name: str,
        handler: str | Callable[..., Any] | Call[Any],
        payload: Any = None,
        *,
        every: float | None = None,
        cron: str | None = None,
    ) -> Schedule:
        """Enqueue ``handler(payload)`` on this queue every ``every`` s (the first run
        ``every`` s from now) or at each time of the cron expression ``cron`` (5 fields,
        UTC): one job per due time, enqueued by the controller that leads. A schedule of
        the same name is replaced. ``ValueError`` naming what is wrong. ``handler`` may be a
        typed call (``fn.call(...)``, no payload): each job is that call."""
        if isinstance(handler, Call):
            path, payload = handler.path, json.loads(checked_call(handler, payload))
        else:
            path = self._path(handler)
        plan = plan_schedule(self.ref, name, path, payload, every, cron)
        return self._run(plan)

    def schedules(self) -> list[Schedule]:
        """This queue's schedules, by name, with their next and last runs."""
        return self._run(plan_schedules(self.client.keys, self.name))

    def unschedule(self, name: str) -> bool:
        """Remove the schedule ``name``: True if it existed. Jobs it enqueued stay."""
        return self._run(plan_unschedule(self.ref, name))

    def running(self, limit: int = RUNNING_SHOWN) -> list[JobStatus]:
        """The status of up to ``limit`` jobs its members run now (with their progress)."""
        return self._run(plan_running(self.ref, limit))

    # -- jobs by state, and the whole queue's actions ---------------------------------------

    def jobs(self, state: str = "queued", limit: int = 20, offset: int = 0) -> JobPage:
        """A page of its jobs in ``state`` (queued, scheduled, deferred, running, done or
        dead): ``limit`` (at most 1,000) after ``offset``, and how many there are
        (``queueworks.queue.job_lists``). ``ValueError`` naming a bad state, limit or offset."""
        return self._run(plan_jobs(self.client.keys, self.name, state, limit, offset))

    def configure(self, **settings: Unpack[LiveOptions]) -> QueueSettings:
        """Change the queue's live settings (any of ``job_timeout``, ``max_attempts``,
        ``result_ttl``, ``retry_delay``, ``retry_backoff``, ``retry_max_delay``,
        ``rate_limit``, ``group_limit``, ``wait_replicas``, ``wait_timeout``), checked as
        ``Client.queue`` checks them (``ValueError`` naming a bad one): every member starts
        its next jobs with them within a second; a running job keeps the ones it started
        with. The queue's settings now."""
        self.settings = self._run(plan_configure(self.client.keys, self.name, settings))
        self.ref.settings = self.settings
        return self.settings

    def pause(self) -> bool:
        """Its members stop reading new jobs (jobs keep arriving); False if it was paused."""
        return self._run(plan_pause(self.client.keys, self.name, True))

    def resume(self) -> bool:
        """Its members read again; False if it was not paused."""
        return self._run(plan_pause(self.client.keys, self.name, False))

    def empty(self) -> int:
        """Cancel every job of its backlog (not started: on its stream, set aside, or
        waiting for a group slot): how many."""
        return self._run(plan_empty(self.client.keys, self.name))

    def requeue_dead(self) -> int:
        """Run every dead job of its dead letters again: how many."""
        return self._run(plan_requeue_dead(self.client.keys, self.name))

    def delete_dead(self) -> int:
        """Drop every dead letter (the jobs stay counted as dead): how many."""
        return self._run(plan_delete_dead(self.client.keys, self.name))

    def run_now(self, job_id: str) -> bool:
        """Run scheduled job ``job_id`` now; False if it is not scheduled."""
        return self._run(plan_run_now(self.client.keys, self.name, job_id))


class _Sender:
    """``enqueue_many``'s round trips, sent one at a time on a thread of its own (started
    at the first of them, so a call of one round trip starts none): Redis runs one batch
    while the caller builds the next. ``wait`` returns the replies of the one sent (None if
    none was), or raises what it raised."""

    def __init__(self) -> None:
        self.pool: ThreadPoolExecutor | None = None
        self.inflight: Future[Any] | None = None

    def send(self, trip: Callable[[], list[Any]]) -> None:
        """Send a round trip (after a ``wait`` for the one before it)."""
        assert self.inflight is None
        if self.pool is None:
            self.pool = ThreadPoolExecutor(1, thread_name_prefix="qw-enqueue-many")
        self.inflight = self.pool.submit(trip)

    def wait(self) -> list[Any] | None:
        inflight, self.inflight = self.inflight, None
        return None if inflight is None else list(inflight.result())

    def close(self) -> None:
        """Let the round trip in flight finish (a job sent is enqueued), stop the thread,
        and raise what that round trip raised, if nobody waited for it."""
        if self.pool is not None:
            self.pool.shutdown(wait=True)
        self.wait()


class Replies:
    """The job ids of ``enqueue_many``'s Lua calls, in order. A call is read once its
    round trip ran (its batch kept until then: two trips' worth at most); a call that
    found the queue gone (nil) is sent again by ``resend``, which makes the queue again
    first, before the next trip goes."""

    def __init__(self, queue: str, resend: Callable[[EnqueueBatch], Any]) -> None:
        self.queue, self.resend = queue, resend
        self.ids: list[str] = []
        self.acked: int | None = None  # the fewest replicas a WAIT saw (None: none asked)
        self.building: list[tuple[int, EnqueueBatch]] = []  # on the trip being built
        self.sending: list[tuple[int, EnqueueBatch]] = []  # on the trip sent

    def add(self, position: int, batch: EnqueueBatch) -> None:
        self.building.append((position, batch))

    def sent(self) -> None:
        self.sending, self.building = self.building, []

    def read(self, replies: Sequence[Any] | None, waited: int | None = None) -> None:
        """The replies of the trip sent (None: there was none); ``waited``: the position
        of its WAIT's reply, if it had one."""
        if replies is not None:
            if waited is not None:
                self.saw(int(replies[waited]))
            for position, batch in self.sending:
                self.take(replies[position], batch)
            self.sending = []

    def take(self, reply: Any, batch: EnqueueBatch) -> None:
        if reply is None:
            reply, acked = self.resend(batch)
            if acked is not None:
                self.saw(acked)
        self.ids += enqueued(self.queue, reply)

    def saw(self, acked: int) -> None:
        self.acked = acked if self.acked is None else min(self.acked, acked)


class Job(Generic[R]):
    """A handle to one job of a queue. ``created``: whether the enqueue that returned it made
    it (False: it found it holding its unique key). ``Job[R]``: a typed job function's
    (``typed``: its call), whose ``result()`` is an ``R``."""

    def __init__(
        self, queue: Queue, job_id: str, created: bool = True, typed: Call[R] | None = None
    ) -> None:
        self.queue, self.id, self.created = queue, job_id, created
        self.typed = typed

    @property
    def key(self) -> str:
        return self.queue.keys.job(self.id)

    def __repr__(self) -> str:
        return f"Job({self.queue.name!r}, {self.id!r})"

    def _run(self, plan: Plan[T]) -> T:
        return run(self.queue.client.redis, self.queue.client.scripts, plan)

    def status(self) -> JobStatus:
        return self._run(plan_job_status(self.queue.ref, self.id))

    def detail(self) -> JobDetail:
        """Its status with its payload (while kept), result and traceback."""
        return self._run(plan_job_detail(self.queue.client.keys, self.queue.name, self.id))

    def result(self, timeout: float | None = None) -> R:
        """The job's result once it is done (a typed job's as its function's return
        annotation says); ``JobFailed`` if it is dead or cancelled; ``TimeoutError`` after
        ``timeout`` s."""
        value = self._run(plan_job_result(self.queue.ref, self.id, timeout))
        return value if self.typed is None else self.typed.decode(value)

    def cancel(self) -> bool:
        """Cancel the job: one not started never runs; a running one is stopped (an ``async
        def`` handler at once, a plain one at its next ``ctx.checkpoint()``; one that never
        checks finishes, its outcome dropped) and never run again. Whether the job will not
        run (again): False if it had finished."""
        return self._run(plan_job_cancel(self.queue.ref, self.id))


def open_queue(client: Backend, name: str, given: dict[str, Any], reopen: bool = False) -> Queue:
    """Create the queue ``name`` with ``given`` settings (the rest default), or open it
    (``queue_plans.plan_open``)."""
    opened = run(client.redis, client.scripts, plan_open(client.keys, name, given, reopen))
    return Queue(client, name, opened.settings, known=opened.handlers)
