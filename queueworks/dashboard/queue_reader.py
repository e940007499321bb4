"""The dashboard's reads of queues: the list, one queue's page, and what ``/metrics`` needs.

A queue is a task (its record is a task record, spec mode ``"queue"``, total 0) whose name is
in ``qw:queues``. The list costs three round trips whatever the number of queues: SMEMBERS of
``qw:queues``, one pipeline of their specs (only real queues are kept: a task that took the
name of an expired queue is a task), one pipeline of six reads per queue (record, members,
stream length, pending summary, scheduled count, rate). A stored value that does not decode
is shown as its default and named in ``problems``, never an error.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from typing import Any

from queueworks.client.sync import Client
from queueworks.dashboard.health import queue_warnings
from queueworks.dashboard.reader import (
    HISTORY_SHOWN,
    _loads,
    _ok,
    dead_page,
    history_entry,
    read_dead_page,
    rebalances,
)
from queueworks.dashboard.views import (
    HistoryEntry,
    JobDeadLetter,
    LatencyBucket,
    QueueDetail,
    QueueSummary,
)
from queueworks.errors import TaskNotFound
from queueworks.protocol.jobrecords import (
    DEAD_ATTEMPTS,
    DEAD_ERROR,
    DEAD_HANDLER,
    DEAD_JOB,
    DEAD_PAYLOAD,
    DEAD_REASON,
    DEAD_TS,
    DEAD_WORKER,
    JOB_ID,
    decode_dead_letter,
)
from queueworks.protocol.keys import check_task_id
from queueworks.protocol.messages import text
from queueworks.protocol.models import JobDetail, JobPage, Schedule
from queueworks.protocol.priorities import bands_of
from queueworks.protocol.records import (
    QUEUE_PAUSED,
    TASK_FIELDS,
    latency_histogram,
    queue_counts,
    task_fields,
)
from queueworks.queue.aside_jobs import NONE as NO_ASIDE
from queueworks.queue.aside_jobs import (
    READS,
    Aside,
    aside_counts,
    aside_handlers,
    aside_reads,
    with_aside,
)
from queueworks.queue.flow import flow_reads, flow_status
from queueworks.queue.job_lists import plan_find_jobs, plan_job_counts, plan_job_detail, plan_jobs
from queueworks.queue.queue_settings import SETTINGS, Setting
from queueworks.queue.queues import ENTRY_ID, band_counts, band_reads
from queueworks.queue.schedule_plans import plan_schedules
from queueworks.transport.connection import Connection, redact_url
from queueworks.transport.runner import run

INF = float("inf")
SUMMARY_READS = (
    15  # replies per queue of a summaries pipeline (4 of flow_reads, the bands, the aside set)
)
RECORD_SETTINGS = ("min_nodes", "max_nodes", "priority")  # shown from the record: they change
_EMPTY = [None] * len(TASK_FIELDS)
PAYLOAD_SHOWN = 2000  # characters of a dead letter's payload in a queue's summary and page


def record_fields(name: str, raw: Sequence[Any]) -> tuple[dict[str, Any], list[str]]:
    """The task-record fields of a queue (an HMGET of ``TASK_FIELDS``) and the names of those
    that did not decode (they keep their default)."""
    try:
        return task_fields(name, raw), []
    except ValueError:
        pass
    fields, problems = task_fields(name, _EMPTY), []
    for i, field in enumerate(TASK_FIELDS):
        one = list(_EMPTY)
        one[i] = raw[i]
        try:
            fields[field] = task_fields(name, one)[field]
        except ValueError:
            problems.append(field)
    return fields, problems


def _rate_hash(raw: Any) -> dict[bytes, bytes]:
    """The rate hash with only the fields ``queue_counts`` can read (second -> jobs)."""
    if not isinstance(raw, dict):
        return {}
    return {k: v for k, v in raw.items() if k.isdigit() and v.isdigit()}


def _int(raw: Any) -> int:
    return int(raw) if isinstance(raw, int) else 0


def _pending_count(reply: Any) -> int:
    return int(reply.get("pending") or 0) if isinstance(reply, dict) else 0


def dead_letter(entry_id: bytes, raw: dict[bytes, bytes]) -> JobDeadLetter:
    """A dead letter as a queue's page and summary show it: its payload cut to its first
    ``PAYLOAD_SHOWN`` characters (50 letters of 1 MB payloads would be 50 MB), its size
    given."""
    f = {k: v or None for k, v in decode_dead_letter(raw, errors="replace").items()}
    attempts = f[DEAD_ATTEMPTS]
    payload = f[DEAD_PAYLOAD]
    return JobDeadLetter(
        id=entry_id.decode(errors="replace"),
        job=f[DEAD_JOB],
        handler=f[DEAD_HANDLER],
        reason=f[DEAD_REASON] or "",
        error=redact_url(f[DEAD_ERROR] or ""),
        attempts=int(attempts) if attempts and attempts.isdigit() else None,
        payload=payload and payload[:PAYLOAD_SHOWN],
        payload_bytes=len(raw.get(DEAD_PAYLOAD.encode()) or b"") if payload else None,
        payload_cut=payload is not None and len(payload) > PAYLOAD_SHOWN,
        worker=f[DEAD_WORKER],
        ts=_number(f[DEAD_TS]),
    )


def _number(raw: str | None) -> float | None:
    try:
        value = float(raw) if raw else None
    except ValueError:
        return None
    return value if value is not None and abs(value) < INF else None


class QueueReader:
    """Every read of queues the dashboard does, against one client."""

    def __init__(self, client: Client) -> None:
        self.client = client
        self.r: Connection = client.redis
        self.keys = client.keys

    def names(self) -> list[str]:
        """The queues that exist, by name."""
        listed = sorted(text(n) for n in self.r.smembers(self.keys.queues))
        pipe = self.r.pipeline(transaction=False)
        for name in listed:
            pipe.hget(self.keys.task(name).record, "spec")
        return [n for n, spec in zip(listed, pipe.execute(), strict=True) if _is_queue(spec)]

    def is_queue(self, name: str) -> bool:
        if not self.r.sismember(self.keys.queues, name):
            return False
        return _is_queue(self.r.hget(self.keys.task(name).record, "spec"))

    def summaries(self, names: Iterable[str]) -> list[QueueSummary]:
        """The rows of ``names`` (one pipeline), in that order; those whose record is gone
        are left out."""
        names = list(names)
        pipe = self.r.pipeline(transaction=False)
        for name in names:
            tk = self.keys.task(name)
            pipe.hmget(tk.record, TASK_FIELDS)
            pipe.zrange(tk.members, 0, -1)
            pipe.xlen(tk.stream)
            pipe.xpending(tk.stream, tk.group)
            pipe.zcard(tk.scheduled)
            pipe.hgetall(tk.rate)
            pipe.zcard(tk.deferred)
            pipe.hget(tk.record, QUEUE_PAUSED)
            pipe.llen(tk.cancelled)
            flow_reads(pipe, tk, "spec")
            pipe.smembers(tk.bands)
            pipe.smembers(tk.aside)
        replies = pipe.execute(raise_on_error=False)
        now = time.time()
        n = SUMMARY_READS
        asides = self._asides(names, [replies[n * (i + 1) - 1] for i in range(len(names))])
        bands = self._bands(names, [replies[n * (i + 1) - 2] for i in range(len(names))])
        members_of = [_ids(replies[n * i + 1]) for i in range(len(names))]
        lost = self._lost({w for ids in members_of for w in ids})
        out = []
        for i, name in enumerate(names):
            record, _, length, pending, scheduled, rate = replies[n * i : n * i + 6]
            members = len(members_of[i])
            deferred, paused, cancelled = replies[n * i + 6 : n * i + 9]
            if isinstance(record, Exception) or record[1] is None:
                continue
            row = self._summary(name, record, members, length, pending, scheduled, rate, now)
            more = {"deferred": 0 if row.finished else _int(deferred), "paused": paused == b"1"}
            more["cancelled"] = _int(cancelled)
            flow = flow_status(replies[n * i + 9 : n * (i + 1) - 2], now)
            more |= flow
            aside = asides[i]
            # off the stream: backlog too (waiting for a group slot, set aside, or on a
            # priority band's stream)
            waiting = sum(flow["groups_waiting"].values()) + sum(aside.waiting.values())
            waiting += bands[i][0]
            if row.finished:
                more["left"] = row.left + waiting
            else:
                more["backlog"] = row.backlog + waiting
                more["running"] = row.running + aside.running + bands[i][1]
                more["set_aside"] = aside.waiting
                more["reason"] = with_aside(row.reason, aside.waiting)
            row = row.model_copy(update=more)
            gone = [w for w in members_of[i] if w in lost]
            out.append(row.model_copy(update={"warnings": queue_warnings(row, gone)}))
        return out

    def _lost(self, workers: set[str]) -> set[str]:
        """Those of ``workers`` whose pool heartbeat is gone (lost: their jobs wait for a
        reclaim), one pipeline; none read when there are none."""
        if not workers:
            return set()
        ids = sorted(workers)
        pipe = self.r.pipeline(transaction=False)
        for wid in ids:
            pipe.exists(self.keys.worker_heartbeat(wid))
        replies = pipe.execute(raise_on_error=False)
        return {w for w, alive in zip(ids, replies, strict=True) if alive == 0}

    def worker_lost(self, worker: str | None) -> bool:
        """Whether ``worker`` (a running job's) is lost: its pool heartbeat is gone."""
        return worker is not None and worker in self._lost({worker})

    def _bands(self, names: Sequence[str], sets: Sequence[Any]) -> list[tuple[int, int]]:
        """Each queue's jobs waiting and running on its priority bands, from its bands set
        as read: one pipeline for the queues that use bands, none if no queue does."""
        used = [bands_of(reply) if not isinstance(reply, Exception) else [] for reply in sets]
        if not any(used):
            return [(0, 0)] * len(names)
        pipe = self.r.pipeline(transaction=False)
        for name, some in zip(names, used, strict=True):
            band_reads(pipe, self.keys.task(name), some)
        replies = pipe.execute(raise_on_error=False)
        out, at = [], 0
        for some in used:
            out.append(band_counts(replies[at : at + 2 * len(some)]))
            at += 2 * len(some)
        return out

    def _asides(self, names: Sequence[str], sets: Sequence[Any]) -> list[Aside]:
        """Each queue's jobs set aside, from its aside set as read: one pipeline for the
        queues that name a handler there, none if no queue does."""
        handlers = [aside_handlers(reply) for reply in sets]
        if not any(handlers):
            return [NO_ASIDE] * len(names)
        pipe = self.r.pipeline(transaction=False)
        for name, some in zip(names, handlers, strict=True):
            aside_reads(pipe, self.keys.task(name), some)
        replies = pipe.execute(raise_on_error=False)
        out, at = [], 0
        for some in handlers:
            out.append(aside_counts(some, replies[at : at + READS * len(some)]))
            at += READS * len(some)
        return out

    def _summary(
        self,
        name: str,
        record: Sequence[Any],
        members: int,
        length: Any,
        pending: Any,
        scheduled: Any,
        rate: Any,
        now: float,
    ) -> QueueSummary:
        fields, problems = record_fields(name, record)
        running = _pending_count(pending)
        backlog, rates = queue_counts(_int(length), running, _rate_hash(rate), now)
        waiting = [backlog, _int(scheduled), running]
        finished = fields["state"].finished  # nothing of it runs again: no live counts
        shown = [0, 0, 0] if finished else waiting
        return QueueSummary(
            name=name,
            state=fields["state"],
            backlog=shown[0],
            scheduled=shown[1],
            running=shown[2],
            left=sum(waiting) if finished else 0,
            done=fields["done"],
            dead=fields["dead"],
            rejected=fields["rejected"],
            nodes=members,
            epoch=fields["epoch"],
            min_nodes=fields["min_nodes"],
            max_nodes=fields["max_nodes"],
            priority=fields["priority"],
            rates=rates,
            reason=None if finished else fields["reason"],
            created_at=fields["created_at"],
            problems=problems,
        )

    def queues(self) -> list[QueueSummary]:
        return self.summaries(self.names())

    def summary(self, name: str) -> QueueSummary:
        check_task_id(name)
        rows = self.summaries([name]) if self.is_queue(name) else []
        if not rows:
            raise TaskNotFound(f"queue {name}")
        return rows[0]

    def dead_without_letter(self, name: str) -> int:
        """How many of the queue's jobs counted dead have no dead letter kept (at least:
        ``QueueDetail.dead_without_letter``)."""
        dead = self.summary(name).dead
        return max(0, dead - _int(self.r.xlen(self.keys.task(name).dead)))

    def latency(self, names: Sequence[str]) -> dict[str, tuple[list[tuple[float, int]], float]]:
        """Each queue's enqueue -> start histogram (cumulative buckets, sum), one pipeline."""
        pipe = self.r.pipeline(transaction=False)
        for name in names:
            pipe.hgetall(self.keys.task(name).latency)
        replies = pipe.execute(raise_on_error=False)
        return {n: latency_histogram(_ok(raw)) for n, raw in zip(names, replies, strict=True)}

    def detail(self, name: str, before: str | None = None) -> QueueDetail:
        """Everything the queue page shows, in a few pipelined round trips; the dead letters
        older than entry ``before`` (None: the newest)."""
        queue = self.summary(name)
        tk = self.keys.task(name)
        pipe = self.r.pipeline(transaction=False)
        pipe.hget(tk.record, "spec")
        pipe.smembers(tk.handlers)
        pipe.hgetall(tk.latency)
        read_dead_page(pipe, tk.dead, before)
        pipe.xlen(tk.dead)
        pipe.xrevrange(tk.history, count=HISTORY_SHOWN * 2)
        spec_raw, handlers, latency, dead, dead_total, hist = (
            _ok(x) for x in pipe.execute(raise_on_error=False)
        )
        spec = _loads(spec_raw) if spec_raw else {}
        spec = spec if isinstance(spec, dict) else {}
        buckets, seconds = latency_histogram(latency)
        dead_shown, dead_next = dead_page(dead)
        return QueueDetail(
            queue=queue,
            **shown_settings(spec),
            handlers=sorted(text(h) for h in handlers or ()),
            nodes=self.client.task(name).nodes(),
            rebalances=rebalances(_history(hist)),
            latency=[LatencyBucket(le=None if le == INF else le, count=n) for le, n in buckets],
            latency_sum=round(seconds, 6),
            latency_count=buckets[-1][1],
            dead_letters=[dead_letter(i, raw) for i, raw in dead_shown],
            dead_letters_total=_int(dead_total),
            dead_letters_next=dead_next,
            dead_without_letter=max(0, queue.dead - _int(dead_total)),
            schedules=self.schedules(name),
            running_jobs=self.client.running_jobs(name) if queue.running else [],
            jobs_by_state=self.job_counts(name),
        )

    def job_counts(self, name: str) -> dict[str, int]:
        """How many jobs each state's list has (``plan_job_counts``): the tabs' counts."""
        return run(self.r, self.client.scripts, plan_job_counts(self.keys, name))

    def jobs(self, name: str, state: str, limit: int, offset: int) -> JobPage:
        """A page of the queue's jobs in ``state`` (``queueworks.queue.job_lists``)."""
        if not self.is_queue(check_task_id(name)):
            raise TaskNotFound(f"queue {name}")
        return run(self.r, self.client.scripts, plan_jobs(self.keys, name, state, limit, offset))

    def find_jobs(
        self, name: str, state: str, wanted: str, limit: int, offset: int
    ) -> tuple[JobPage, int, bool]:
        """A page of the queue's jobs in ``state`` that match ``wanted`` (``plan_find_jobs``),
        with how many were looked through and whether that was all."""
        if not self.is_queue(check_task_id(name)):
            raise TaskNotFound(f"queue {name}")
        plan = plan_find_jobs(self.keys, name, state, wanted, limit, offset)
        return run(self.r, self.client.scripts, plan)

    def job(self, name: str, job_id: str) -> JobDetail:
        """One job in full; ``TaskNotFound`` for no such queue or job."""
        if not self.is_queue(check_task_id(name)):
            raise TaskNotFound(f"queue {name}")
        try:
            found = run(self.r, self.client.scripts, plan_job_detail(self.keys, name, job_id))
        except LookupError as exc:
            raise TaskNotFound(str(exc)) from None
        return found.model_copy(
            update={"traceback": found.traceback and redact_url(found.traceback)}
        )

    def find(self, job_id: str) -> str | None:
        """The queue that has a job ``job_id`` (its record, or its entry on the stream):
        one pipeline over the queues, none scanned."""
        if not JOB_ID.match(job_id.encode()):
            return None
        names = self.names()
        entry = ENTRY_ID.match(job_id) is not None  # a job to run now: its entry is it
        pipe = self.r.pipeline(transaction=False)
        for name in names:
            tk = self.keys.task(name)
            pipe.exists(tk.job(job_id))
            if entry:
                pipe.xrange(tk.stream, job_id, job_id, count=1)
        replies = pipe.execute(raise_on_error=False)
        step = 2 if entry else 1
        for i, name in enumerate(names):
            found = replies[step * i : step * i + step]
            if found[0] == 1 or (entry and found[1] and not isinstance(found[1], Exception)):
                return name
        return None

    def schedules(self, name: str) -> list[Schedule]:
        """The queue's schedules (``Queue.schedules``); ``TaskNotFound`` for no queue."""
        if not self.is_queue(check_task_id(name)):
            raise TaskNotFound(f"queue {name}")
        return run(self.client.redis, self.client.scripts, plan_schedules(self.keys, name))


def _history(entries: Any) -> list[HistoryEntry]:
    out = []
    for entry_id, raw in entries or ():
        try:
            out.append(history_entry(entry_id, raw))
        except ValueError:  # a member wrote something else: leave that one out
            continue
    return out


def _ids(reply: Any) -> list[str]:
    return [text(m) for m in reply] if isinstance(reply, list) else []


def _is_queue(spec: Any) -> bool:
    value = _loads(spec) if spec else None
    return isinstance(value, dict) and value.get("mode") == "queue"


def shown_settings(spec: dict[str, Any]) -> dict[str, Any]:
    """The settings a queue page shows from its stored spec (``QueueSettings``'s, but the
    ones the queue's record holds: ``RECORD_SETTINGS``), as well as they can be read: a
    missing or wrong number is 0."""
    return {
        s.name: _shown(s, s.stored_in(spec, missing=s.default if s.sparse else None))
        for s in SETTINGS.values()
        if s.name not in RECORD_SETTINGS
    }


def _shown(setting: Setting, value: Any) -> Any:
    if setting.kind is dict:
        return {str(k): str(v) for k, v in value.items()} if isinstance(value, dict) else {}
    if isinstance(value, int | float) and not isinstance(value, bool):
        return setting.kind(value)
    return None if setting.optional else setting.kind(0)  # an optional one unset: none
