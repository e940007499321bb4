"""The one codec of each Redis hash the parts share: the task record (``qw:task:{T}``) and
the worker hash (``qw:worker:<W>``). Every reader and writer goes through it — the client,
the dashboard, the controller, the workers, and the Lua scripts' callers (the states those
scripts need come from ``models.ACTIVE_STATES`` through ``queueworks.scripts.bound``). A queue
job's formats (its stream entry, its record, its dead letter) have their codecs in
``queueworks.protocol.jobrecords``.

Task record fields (all strings in Redis):

=================  ===========================================================================
``name``           the spec's name
``spec``           the spec as JSON (``StoredSpec``; no subtasks)
``state``          ``TaskState``
``total``          number of subtasks (indices ``0 .. total-1``)
``done``           indices settled with a result
``dead``           indices settled with a dead letter
``rejected``       stream entries that were no subtask of the task (never in done/dead)
``epoch``          the node set's generation (mirrors ``qw:task:{T}:epoch``)
``priority``       higher is more important; ``min_nodes``, ``max_nodes`` ("" = no bound)
``max_dead``       ``-1`` = no bound; past it the task fails
``partitions``     0, or the number of partition streams
``created_at``     ``started_at``, ``finished_at``: Unix seconds ("" or absent = not yet)
``error``          why it failed ("" or absent = none)
``reason``         why it waits without (enough) nodes, written by the controller (read back
                   as ``error`` once it failed: ``TaskStatus.reason`` says why, either way)
``rq_job``         the RQ job that submitted it (``queueworks.rq``), if any
``trace``          while tracing, the submit's trace context: as a job's options carry it
                   (``queueworks.tracing``); absent otherwise
=================  ===========================================================================

Worker hash fields: ``record`` (the ``WorkerRecord`` as JSON: what the worker was started
with, ``labels``, ``allow`` and ``queues`` among it), ``member_of`` (a JSON list: the queues
it is a member of now; absent in older hashes: none), and what it is doing now: ``state``,
``task``, ``rank``, ``epoch``, ``current``, ``jobs`` (the queues' jobs it runs now, as
``QUEUE/JOB``, space-separated: every one of them with ``--concurrency``), ``processed``,
``last_heartbeat``, ``drain``.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from pydantic import TypeAdapter
from redis.typing import EncodableT

from queueworks.protocol.models import (
    TaskSpec,
    TaskState,
    WorkerRecord,
    WorkerState,
    describe_error,
)
from queueworks.tracing import hooks

Hash = dict[EncodableT, EncodableT]  # fields to write with HSET
TASK_TRACE = "trace"

TASK_FIELDS = (
    "name",
    "state",
    "total",
    "done",
    "dead",
    "rejected",
    "epoch",
    "priority",
    "min_nodes",
    "max_nodes",
    "partitions",
    "created_at",
    "started_at",
    "finished_at",
    "error",
    "reason",
    "rq_job",
)


QUEUE_PAUSED = "paused"  # a queue record's flag: its members read no new job while it is "1"
QUEUE_SETTINGS = "settings"  # a queue record's settings version: bumped by each configure
QUEUE_BANDS = "bands"  # a queue record's bands version: bumped by each band its jobs first use

# Fields of the task record and of a task's history entries that a Lua script writes and
# that are spelled like a job format's (``queueworks.protocol.jobrecords``): the scripts get these
# from here too (``queueworks.scripts.bound``), so none retypes a name a codec owns.
LUA_NAMES = {
    "TASK_FIELD_ERROR": "error",
    "TASK_FIELD_REASON": "reason",
    "HISTORY_WORKER": "worker",
    "HISTORY_TS": "ts",
    "QUEUE_BANDS": QUEUE_BANDS,
}


MEMBER_OF = "member_of"  # the worker hash field of the queues a worker is a member of
_NAMES = TypeAdapter(list[str])


class BadRecord(ValueError):
    """A record in Redis that does not decode (another writer broke it); says why."""


def new_task(spec: TaskSpec, total: int, now: float) -> Hash:
    """The record ``submit`` writes for a new task (with the current trace context while
    tracing)."""
    record: Hash = {
        "name": spec.name,
        "spec": spec.spec_json(),
        "state": TaskState.QUEUED.value,
        "total": total,
        "done": 0,
        "dead": 0,
        "rejected": 0,
        "epoch": 0,
        "priority": spec.priority,
        "min_nodes": spec.min_nodes,
        "max_nodes": "" if spec.max_nodes is None else spec.max_nodes,
        "max_dead": -1 if spec.max_dead is None else spec.max_dead,
        "partitions": spec.partitions,
        "created_at": repr(now),
    }
    producer = hooks.producer
    if producer is not None:
        carried = producer.carry("")
        if carried:
            record[TASK_TRACE] = carried
    return record


def _str(raw: Any) -> str | None:
    if raw is None:
        return None
    return raw.decode() if isinstance(raw, bytes) else str(raw)


def _int(raw: Any, default: int = 0) -> int:
    value = _str(raw)
    return int(value) if value else default


def _float(raw: Any) -> float | None:
    value = _str(raw)
    return float(value) if value else None


def task_fields(task_id: str, raw: Mapping[Any, Any] | Sequence[Any]) -> dict[str, Any]:
    """The fields of ``TaskRecord`` (and so of ``TaskStatus``) from a task hash: an HGETALL
    reply (bytes keys) or an HMGET of ``TASK_FIELDS``. ``ValueError`` if one does not decode."""
    if isinstance(raw, Mapping):
        f = {name: raw.get(name.encode(), raw.get(name)) for name in TASK_FIELDS}
    else:
        f = dict(zip(TASK_FIELDS, raw, strict=True))
    max_nodes = _str(f["max_nodes"])
    state = TaskState(_str(f["state"]) or "queued")
    error = _str(f["error"]) or None
    failed = state == TaskState.FAILED and error
    return {
        "id": task_id,
        "name": _str(f["name"]) or "",
        "state": state,
        "total": _int(f["total"]),
        "done": _int(f["done"]),
        "dead": _int(f["dead"]),
        "rejected": _int(f["rejected"]),
        "epoch": _int(f["epoch"]),
        "priority": _int(f["priority"]),
        "min_nodes": _int(f["min_nodes"], 1),
        "max_nodes": int(max_nodes) if max_nodes else None,
        "partitions": _int(f["partitions"]),
        "created_at": _float(f["created_at"]) or 0.0,
        "started_at": _float(f["started_at"]),
        "finished_at": _float(f["finished_at"]),
        "error": error,
        "reason": error if failed else _str(f["reason"]) or None,
        "rq_job": _str(f["rq_job"]) or None,
    }


def worker_record(raw: Mapping[bytes, bytes]) -> WorkerRecord:
    """A worker's hash as a record; ``BadRecord`` if any field does not decode."""
    try:
        data = {k.decode(): v.decode() for k, v in raw.items()}
        if "record" not in data:
            raise ValueError("no 'record' field")
        beat = data.get("last_heartbeat")
        record = WorkerRecord.model_validate_json(data["record"])
        member_of = data.get(MEMBER_OF)
        return record.model_copy(
            update={
                "member_of": _NAMES.validate_json(member_of) if member_of else record.member_of,
                "state": WorkerState(data.get("state", "idle")),
                "task": data.get("task") or None,
                "rank": int(data["rank"]) if data.get("rank") else None,
                "epoch": int(data["epoch"]) if data.get("epoch") else None,
                "current": data.get("current") or None,
                "jobs": data.get("jobs", "").split(),
                "processed": int(data.get("processed", 0)),
                "last_heartbeat": float(beat) if beat else None,
            }
        )
    except ValueError as exc:
        raise BadRecord(f"worker record: {describe_error(exc)}") from None


def registered_worker(record: WorkerRecord, now: float) -> Hash:
    """The worker hash a worker writes when it (re)registers in the pool."""
    return {
        "record": record.model_dump_json(exclude={"member_of"}),
        **queue_memberships(record.member_of),
        "state": WorkerState.IDLE.value,
        "task": "",
        "processed": 0,
        "last_heartbeat": repr(now),
    }


def queue_memberships(queues: Iterable[str]) -> Hash:
    """The worker hash fields that say which queues a worker is a member of now (its
    state: serving them, or idle)."""
    names = sorted(set(queues))
    state = WorkerState.SERVING if names else WorkerState.IDLE
    return {MEMBER_OF: json.dumps(names), "state": state.value}


def member_of(task_id: str, rank: int, epoch: int) -> Hash:
    """The worker hash fields of a member of a task's node set, in its latest role."""
    return {"state": WorkerState.ASSIGNED.value, "task": task_id, "rank": rank, "epoch": epoch}


def idle_worker() -> Hash:
    """The worker hash fields of a worker that left its node set."""
    return {
        "state": WorkerState.IDLE.value,
        "task": "",
        "rank": "",
        "epoch": "",
        "current": "",
        "jobs": "",
    }


def queue_counts(length: Any, running: int, rate: Any, now: float) -> tuple[int, dict[str, float]]:
    """A queue's backlog (entries on its stream no member holds: settled ones leave it) and
    its rates (jobs finished per second over the last 1, 10 and 60 s) from its rate hash."""
    backlog = max(0, int(length or 0) - running) if not isinstance(length, Exception) else 0
    per_second = {}
    if isinstance(rate, dict):
        per_second = {int(k): int(v) for k, v in rate.items()}
    last = int(now) - 1  # the last full second
    rates = {
        f"{span}s": round(sum(per_second.get(last - i, 0) for i in range(span)) / span, 2)
        for span in (1, 10, 60)
    }
    return backlog, rates


# -- a queue's enqueue -> start histogram (qw:task:{Q}:latency) --------------------------------
#
# Written by the members (settle_jobs.lua, HINCRBYFLOAT): one field per bucket, named by its
# upper bound in seconds (``repr(float)``, or ``+Inf``), holding the jobs that started within
# it and above the bound below: counts per bucket, NOT cumulative; ``sum`` (s) and ``count``.
# A job is counted at its first start (a requeued job once more: it is enqueued again).

LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0)


def latency_histogram(raw: Mapping[Any, Any] | None) -> tuple[list[tuple[float, int]], float]:
    """A latency hash as ``([(upper bound, cumulative count), ...], sum)``: ascending, with
    every bound of ``LATENCY_BUCKETS`` (and any other a writer used), ``inf`` last, whose
    count is the total. A field that does not decode is left out, never an error."""
    counts: dict[float, int] = dict.fromkeys((*LATENCY_BUCKETS, float("inf")), 0)
    total_seconds = 0.0
    for k, v in (raw or {}).items():
        name, value = _str(k) or "", _str(v) or ""
        try:
            amount = float(value)
            bound = float(name) if name not in ("sum", "count") else None
        except ValueError:
            continue
        if not 0 <= amount < float("inf"):
            continue
        if name == "sum":
            total_seconds = amount
        elif bound is not None and bound > 0:
            counts[bound] = counts.get(bound, 0) + round(amount)
    cumulative, running = [], 0
    for bound in sorted(counts):
        running += counts[bound]
        cumulative.append((bound, running))
    return cumulative, total_seconds
