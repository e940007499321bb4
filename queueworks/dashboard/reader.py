"""Pipelined reads for the dashboard: a page costs a handful of round trips, whatever its size.

Tasks are found in the index ``qw:tasks`` (every task not yet expired, by creation time),
never by scanning the keyspace. A list page reads two fields of every indexed task (to
count, filter and order them: active first, then newest) and full rows only for the page
it shows; records (HMGET of the fields shown) and member counts (ZCARD) in one pipeline.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import redis

from queueworks.client.sync import Client
from queueworks.dashboard.views import (
    EventView,
    HistoryEntry,
    PendingEntry,
    Rebalance,
    ResultSample,
    RqJob,
    StreamBacklog,
    TaskDetail,
    TaskSummary,
    WorkerView,
)
from queueworks.errors import NotJSON, TaskNotFound
from queueworks.protocol.keys import GROUP, check_task_id
from queueworks.protocol.messages import from_json, text
from queueworks.protocol.models import ACTIVE_STATES, TaskState, WorkerState
from queueworks.protocol.records import TASK_FIELDS, BadRecord, task_fields, worker_record
from queueworks.protocol.validate import NAME_PATTERN
from queueworks.task.tasks import dead_letter
from queueworks.transport.connection import Connection, redact_url
from queueworks.transport.lost_workers import LostWorker
from queueworks.transport.pools import PoolRecord, read_pools

INDEX_FIELDS = ("state", "created_at")
_ACTIVE = {s.value.encode() for s in ACTIVE_STATES}
HISTORY_SHOWN = 40
PENDING_SHOWN = 50
DEAD_SHOWN = 50  # dead letters a page shows, newest first; older ones on the next page
RESULTS_SHOWN = 10
ENTRY_ID = re.compile(r"^\d{1,20}-\d{1,20}$")
_TASK_ID = re.compile(NAME_PATTERN + r"\Z")


class BadQuery(ValueError):
    """A query parameter the dashboard cannot use (400, naming it)."""


def dead_before(raw: str | None) -> str | None:
    """The ``dead_before`` parameter of a task or queue page: show the dead letters older
    than that entry (None: the newest)."""
    if not raw:
        return None
    if not ENTRY_ID.match(raw):
        raise BadQuery(
            f"dead_before must be a dead-letter entry id like 1712345678901-0, got {raw!r}"
        )
    return raw


def read_dead_page(pipe: Any, stream: str, before: str | None) -> None:
    """Queue on ``pipe`` the read of one page of a dead-letter stream (newest first, one
    more than shown: it says whether an older page exists)."""
    pipe.xrevrange(stream, max=f"({before}" if before else "+", min="-", count=DEAD_SHOWN + 1)


def dead_page(reply: Any) -> tuple[list[tuple[bytes, dict[bytes, bytes]]], str | None]:
    """The entries of a page read by ``read_dead_page`` and the cursor of the next one."""
    entries = list(reply or ())
    if len(entries) <= DEAD_SHOWN:
        return entries, None
    entries = entries[:DEAD_SHOWN]
    return entries, text(entries[-1][0])


@dataclass(frozen=True, slots=True)
class TaskRef:
    """A task in the index: enough to count, filter, sort and page."""

    id: str
    state: TaskState
    created_at: float

    @property
    def finished(self) -> bool:
        return self.state.finished


def _int(raw: Any, default: int = 0) -> int:
    return int(raw) if raw not in (None, b"") else default


def _float(raw: Any) -> float | None:
    return float(raw) if raw not in (None, b"") else None


def _str(raw: Any) -> str | None:
    return raw.decode(errors="replace") if raw not in (None, b"") else None


def _finite(raw: str) -> float:
    """An event's time: 0 where it is no finite number (another writer's)."""
    try:
        value = float(raw or 0)
    except ValueError:
        return 0.0
    return value if math.isfinite(value) else 0.0


def summary(task_id: str, raw: Sequence[Any], members: int) -> TaskSummary:
    """A task row from an HMGET of ``TASK_FIELDS``."""
    fields = task_fields(task_id, raw)
    fields["error"] = redact_url(fields["error"] or "") or None
    return TaskSummary(**fields, nodes=members)


def history_entry(entry_id: bytes, raw: dict[bytes, bytes]) -> HistoryEntry:
    return HistoryEntry(
        id=entry_id.decode(),
        epoch=_int(raw.get(b"epoch")),
        cause=_str(raw.get(b"cause")) or "",
        ts=_float(raw.get(b"ts")) or 0.0,
        size=_int(raw[b"size"]) if raw.get(b"size") else None,
        worker=_str(raw.get(b"worker")),
        pause_ms=_float(raw.get(b"pause_ms")),
        reclaimed=_int(raw[b"reclaimed"]) if raw.get(b"reclaimed") else None,
        since_change_ms=_float(raw.get(b"since_change_ms")),
    )


def rebalances(entries: Iterable[HistoryEntry]) -> list[Rebalance]:
    """Each membership change (join / leave / dead) with the pause of the rebalance that
    followed it (the ``rebalanced`` record of the same epoch), newest first."""
    done: dict[int, HistoryEntry] = {}
    changes: list[HistoryEntry] = []
    for e in entries:
        if e.cause == "rebalanced":
            done.setdefault(e.epoch, e)
        else:
            changes.append(e)
    out = []
    for c in changes:
        r = done.get(c.epoch)
        out.append(
            Rebalance(
                epoch=c.epoch,
                cause=c.cause,
                worker=c.worker,
                size=c.size,
                ts=c.ts,
                pause_ms=r.pause_ms if r else None,
                reclaimed=r.reclaimed if r else None,
                since_change_ms=r.since_change_ms if r else None,
            )
        )
    return sorted(out, key=lambda x: (x.epoch, x.ts), reverse=True)


def group_backlog(stream: str, groups: Any) -> StreamBacklog:
    """Unread (``lag``) and pending entries of the task's group on one stream."""
    for g in groups or ():
        if text(g.get("name")) == GROUP:
            lag = g.get("lag")
            return StreamBacklog(
                stream=stream,
                unread=int(lag) if lag is not None else -1,
                pending=int(g.get("pending") or 0),
            )
    return StreamBacklog(stream=stream, unread=0, pending=0)


class Reader:
    """Every read the dashboard does, against one client."""

    def __init__(self, client: Client) -> None:
        self.client = client
        self.r: Connection = client.redis
        self.keys = client.keys

    # -- tasks ----------------------------------------------------------------------------

    def task_ids(self) -> list[str]:
        """Every task the index lists, newest first."""
        rows: Any = self.r.zrange(self.keys.tasks, 0, -1, desc=True)
        return [text(t) for t in rows]

    def index(self) -> list[TaskRef]:
        """Every task known to Redis with only its state and age (3 arguments a command:
        a page filters, counts and pages on this, then reads full rows for what it shows).
        Active tasks first, then newest first."""
        ids = self.task_ids()
        pipe = self.r.pipeline(transaction=False)
        for tid in ids:
            pipe.hmget(self.keys.task(tid).record, INDEX_FIELDS)
        out = []
        for tid, (state, created) in zip(ids, pipe.execute(), strict=True):
            if state is not None:  # else it expired between SCAN and HMGET
                out.append(TaskRef(tid, TaskState(state.decode()), float(created or 0)))
        out.sort(key=lambda t: (t.finished, -t.created_at))
        return out

    def summaries(self, ids: Sequence[str]) -> list[TaskSummary]:
        """Full rows of ``ids``, in that order; member counts only for active tasks (a
        finished task has released its node set)."""
        pipe = self.r.pipeline(transaction=False)
        for tid in ids:
            pipe.hmget(self.keys.task(tid).record, TASK_FIELDS)
        rows = [(tid, raw) for tid, raw in zip(ids, pipe.execute(), strict=True) if raw[1]]
        active = [tid for tid, raw in rows if raw[1] in _ACTIVE]
        pipe = self.r.pipeline(transaction=False)
        for tid in active:
            pipe.zcard(self.keys.task(tid).members)
        members = dict(zip(active, pipe.execute(), strict=True)) if active else {}
        out = []
        for tid, raw in rows:
            try:
                out.append(summary(tid, raw, int(members.get(tid, 0))))
            except ValueError:  # one broken record must not hide every other task
                continue
        return out

    def tasks(self) -> list[TaskSummary]:
        """Every task known to Redis, full rows: active ones first, then newest first."""
        out = self.summaries(self.task_ids())
        out.sort(key=lambda t: (t.finished, -t.created_at))
        return out

    def task_summary(self, task_id: str) -> TaskSummary:
        tk = self.keys.task(check_task_id(task_id))
        pipe = self.r.pipeline(transaction=False)
        pipe.hmget(tk.record, TASK_FIELDS)
        pipe.zcard(tk.members)
        raw, members = pipe.execute()
        if raw[1] is None:
            raise TaskNotFound(task_id)
        return summary(task_id, raw, int(members))

    def backlog(self, tasks: Sequence[TaskSummary]) -> dict[str, int]:
        """Unread + pending subtasks per task, from XINFO GROUPS (one pipeline)."""
        pipe = self.r.pipeline(transaction=False)
        plan: list[tuple[TaskSummary, list[str]]] = []
        for t in tasks:
            streams = self.keys.task(t.id).streams(t.partitions)
            plan.append((t, streams))
            for s in streams:
                pipe.xinfo_groups(s)
        replies = iter(pipe.execute(raise_on_error=False))
        out = {}
        for t, streams in plan:
            rows = [group_backlog(s, _ok(next(replies))) for s in streams]
            out[t.id] = _backlog_total(t, rows)
        return out

    def detail(self, task_id: str, before: str | None = None) -> TaskDetail:
        """Everything the task page shows, in a few pipelined round trips; the dead letters
        older than entry ``before`` (None: the newest)."""
        task = self.task_summary(task_id)
        tk = self.keys.task(task_id)
        streams = tk.streams(task.partitions)
        pipe = self.r.pipeline(transaction=False)
        pipe.hget(tk.record, "spec")
        pipe.xrevrange(tk.history, count=HISTORY_SHOWN * 2)
        pipe.xlen(tk.dead)
        pipe.hlen(tk.results)
        pipe.hscan(tk.results, 0, count=RESULTS_SHOWN)
        read_dead_page(pipe, tk.dead, before)
        for s in streams:
            pipe.xinfo_groups(s)
        per_stream = max(1, PENDING_SHOWN // len(streams))
        for s in streams:
            pipe.xpending_range(s, tk.group, "-", "+", per_stream)
        for s in streams:
            pipe.xpending(s, tk.group)
        replies = pipe.execute(raise_on_error=False)
        spec_raw, hist, dead_total, results_total, scan, dead = (_ok(x) for x in replies[:6])
        n = len(streams)
        backlog = [
            group_backlog(s, _ok(g)) for s, g in zip(streams, replies[6 : 6 + n], strict=True)
        ]
        pending = _pending_entries(streams, replies[6 + n : 6 + 2 * n])
        by_consumer = _pending_by_consumer(replies[6 + 2 * n :])
        dead_shown, dead_next = dead_page(dead)
        spec = _loads(spec_raw) if spec_raw else {}
        if not isinstance(spec, dict):
            spec = {}
        results = [
            ResultSample(index=int(text(k)), result=_loads(v))
            for k, v in list((scan or (0, {}))[1].items())[:RESULTS_SHOWN]
        ]
        return TaskDetail(
            task=task,
            handler=str(spec.get("handler", "")),
            max_attempts=int(spec.get("max_attempts", 0)),
            subtask_timeout=float(spec.get("subtask_timeout", 0)),
            node_selector=dict(spec.get("node_selector", {})),
            nodes=self.client.task(task_id).status().nodes,
            rebalances=rebalances(history_entry(i, raw) for i, raw in hist or ()),
            backlog=_fill_unread(task, backlog),
            pending=pending[:PENDING_SHOWN],
            pending_total=sum(b.pending for b in backlog),
            pending_by_consumer=by_consumer,
            dead_letters=[
                x.model_copy(update={"error": redact_url(x.error)})
                for x in (dead_letter(i, raw) for i, raw in dead_shown)
            ],
            dead_letters_total=int(dead_total or 0),
            dead_letters_next=dead_next,
            results=sorted(results, key=lambda x: x.index),
            results_total=int(results_total or 0),
            rq_job=self._rq_job(task.rq_job),
        )

    def history(self, task_id: str, after: str = "-", count: int = 1000) -> list[HistoryEntry]:
        raw: Any = self.r.xrange(self.keys.task(task_id).history, min=after, count=count)
        return [history_entry(i, f) for i, f in raw]

    def _rq_job(self, job_id: str | None) -> RqJob | None:
        if not job_id:
            return None
        if not isinstance(self.r, redis.Redis):  # rq runs on one server, not on a cluster
            return RqJob(id=job_id)
        try:
            from rq.job import Job

            status = Job.fetch(job_id, connection=self.r).get_status(refresh=False)
            return RqJob(id=job_id, status=str(getattr(status, "value", status)))
        except Exception:  # the job expired, or rq cannot read it: show the id alone
            return RqJob(id=job_id)

    # -- workers and events ---------------------------------------------------------------

    def workers(self) -> list[WorkerView]:
        rows: Any = self.r.zrange(self.keys.workers, 0, -1)
        ids = [text(w) for w in rows]
        pipe = self.r.pipeline(transaction=False)
        for wid in ids:
            pipe.hgetall(self.keys.worker(wid))
            pipe.exists(self.keys.worker_heartbeat(wid))
        replies = pipe.execute()
        out = []
        for i in range(len(ids)):
            raw, alive = replies[2 * i], replies[2 * i + 1]
            if not raw or b"record" not in raw:
                continue
            try:
                rec = worker_record(raw)
            except BadRecord:
                continue  # one broken hash must not hide every other worker
            draining = raw.get(b"drain") == b"1"
            out.append(WorkerView(**dict(rec), alive=bool(alive), draining=draining))
        return out

    def events(self, count: int = 50, task: str | None = None) -> list[EventView]:
        """The newest events (at most ``count``), newest first; optionally of one task."""
        raw: Any = self.r.xrevrange(self.keys.events, count=1000 if task else count)
        out = []
        for entry_id, f in raw:
            fields = {k.decode(): v.decode(errors="replace") for k, v in f.items()}
            if task and fields.get("task") != task:
                continue
            out.append(
                EventView(
                    id=entry_id.decode(),
                    kind=fields.pop("kind", ""),
                    ts=_finite(fields.pop("ts", "")),
                    task=fields.pop("task", None),
                    worker=fields.pop("worker", None),
                    fields=fields,
                )
            )
            if len(out) >= count:
                break
        return self._named(out)

    def _named(self, events: list[EventView]) -> list[EventView]:
        """``events`` with their tasks' names: one HMGET per distinct task, pipelined."""
        ids = list(dict.fromkeys(e.task for e in events if e.task and _TASK_ID.match(e.task)))
        if not ids:
            return events
        pipe = self.r.pipeline(transaction=False)
        for tid in ids:
            pipe.hget(self.keys.task(tid).record, "name")
        replies = pipe.execute(raise_on_error=False)
        names = {t: _str(_ok(n)) for t, n in zip(ids, replies, strict=True)}
        return [
            e.model_copy(update={"task_name": names.get(e.task)}) if e.task in names else e
            for e in events
        ]

    def pools(self) -> list[PoolRecord]:
        """The worker pools (``worker --processes``); their members are among ``workers``."""
        return read_pools(self.r, self.keys)

    def lost_workers(self) -> list[LostWorker]:
        """Workers found dead in the last 10 minutes (``Client.lost_workers``)."""
        return self.client.lost_workers()

    def leader(self) -> str | None:
        """The leader's controller id (the lease holds ``<id>#<term>``), or None."""
        token = _str(self.r.get(self.keys.leader))
        return token.partition("#")[0] if token else None

    def worker_counts(
        self, workers: Sequence[WorkerView], lost: Sequence[LostWorker] = ()
    ) -> dict[str, int]:
        """Workers by status; ``lost`` adds those found dead and dropped since (each once,
        and not one that is listed again: it came back under its name)."""
        counts = {s.value: 0 for s in WorkerState} | {"draining": 0, "lost": 0}
        for w in workers:
            counts[w.status] = counts.get(w.status, 0) + 1
        listed = {w.id for w in workers}
        counts["lost"] += len({w.id for w in lost} - listed)
        return counts


def _pending_entries(streams: Sequence[str], replies: Sequence[Any]) -> list[PendingEntry]:
    """XPENDING ranges (one reply per stream) as rows for the page."""
    pending: list[PendingEntry] = []
    for s, rows in zip(streams, replies, strict=True):
        for p in _ok(rows) or ():
            pending.append(
                PendingEntry(
                    id=text(p["message_id"]),
                    stream=s,
                    consumer=text(p["consumer"]),
                    idle_ms=int(p["time_since_delivered"]),
                    deliveries=int(p["times_delivered"]),
                )
            )
    return pending


def _pending_by_consumer(summaries: Sequence[Any]) -> dict[str, int]:
    """XPENDING summaries (one per stream): entries pending per consumer, over all streams."""
    by_consumer: dict[str, int] = {}
    for summary_reply in summaries:
        for c in (_ok(summary_reply) or {}).get("consumers") or ():
            name = text(c["name"])
            by_consumer[name] = by_consumer.get(name, 0) + int(c["pending"])
    return dict(sorted(by_consumer.items()))


def task_counts(tasks: Sequence[TaskSummary | TaskRef]) -> dict[str, int]:
    counts = {s.value: 0 for s in TaskState}
    for t in tasks:
        counts[t.state.value] += 1
    return counts


def _ok(reply: Any) -> Any:
    """A pipelined reply, or None where that command failed (e.g. a stream that expired)."""
    return None if isinstance(reply, Exception) else reply


MAX_SHOWN_DEPTH = 50  # deeper stored JSON is shown as its text: rendering it would recurse


def _loads(raw: Any) -> Any:
    """A stored JSON value to show: decoded if it is JSON and not too deep, else its text."""
    try:
        value = from_json(text(raw), "stored value")
    except NotJSON:
        return text(raw)[:4000]
    return value if _depth(value, MAX_SHOWN_DEPTH) <= MAX_SHOWN_DEPTH else text(raw)[:4000]


def _depth(value: Any, limit: int) -> int:
    """Nesting depth of a decoded JSON value (stops counting past ``limit``), iteratively."""
    deepest, todo = 0, [(value, 1)]
    while todo:
        item, depth = todo.pop()
        if isinstance(item, dict | list):
            deepest = max(deepest, depth)
            if depth > limit:
                return depth
            todo.extend((v, depth + 1) for v in (item.values() if isinstance(item, dict) else item))
    return deepest


def _fill_unread(task: TaskSummary, rows: list[StreamBacklog]) -> list[StreamBacklog]:
    """XINFO GROUPS gives no ``lag`` once entries were deleted; estimate it from the counts."""
    if all(b.unread >= 0 for b in rows):
        return rows
    known = sum(b.unread for b in rows if b.unread >= 0) + sum(b.pending for b in rows)
    rest = max(0, task.total - task.settled - known)
    unknown = [b for b in rows if b.unread < 0]
    return [
        b if b.unread >= 0 else b.model_copy(update={"unread": rest if b is unknown[0] else 0})
        for b in rows
    ]


def _backlog_total(task: TaskSummary, rows: list[StreamBacklog]) -> int:
    return sum(b.unread + b.pending for b in _fill_unread(task, rows))
