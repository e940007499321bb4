"""Reads made into mirror rows, through the records' codecs (``queueworks.protocol.records``)."""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass, replace
from typing import Any

from queueworks.protocol.messages import text
from queueworks.protocol.models import Refusal, StoredSpec, TaskState, WorkerRecord
from queueworks.protocol.records import TASK_FIELDS, task_fields

from .mirror import TaskRow, WorkerRow
from .reads import TaskRead, WorkerRead

DEFAULT_TTL = 86400.0  # a finished task whose spec cannot be read expires after a day
_CREATED = TASK_FIELDS.index("created_at")


@dataclass(frozen=True)
class Finished:
    row: TaskRow
    state: TaskState


@dataclass(frozen=True)
class Broken:
    error: str  # why the record does not decode (the task is failed)


def task_state(read: TaskRead) -> TaskState | None:
    """The state the record says, or None if it has none (expired, never written, broken)."""
    try:
        return TaskState(text(read.fields[1]))
    except ValueError:
        return None


def task_row(read: TaskRead, known: TaskRow | None, state: TaskState) -> TaskRow | Finished:
    """The task as its record says; ``ValueError`` if the record does not decode. The spec
    is read only for a task not ``known`` (a spec never changes); so are the refusals, unless
    the read asked for them."""
    record = task_fields(read.id, read.fields)  # typed by the codec; ValueError if broken
    if read.spec is not None:
        spec: StoredSpec | None = StoredSpec.model_validate_json(read.spec)
        selector = dict(spec.node_selector) if spec else {}
        handler, ttl = (spec.handler, spec.result_ttl) if spec else ("", DEFAULT_TTL)
        queue = spec is not None and spec.mode == "queue"
    elif known is not None:
        selector, handler, ttl = known.selector, known.handler, known.result_ttl
        queue = known.queue
    else:
        selector, handler, ttl, queue = {}, "", DEFAULT_TTL, False
    refusals = known.refusals if known is not None else {}
    if read.refused is not None:
        refusals = refusals_of(read.refused)
    handlers = known.handlers if known is not None else ()
    if read.handlers is not None:
        handlers = read.handlers
    aside = known.aside if known is not None else ()
    if read.aside is not None:
        aside = read.aside
    waits = known.waits if known is not None else ()
    if read.waits is not None:
        waits = read.waits
    row = TaskRow(
        id=read.id,
        state=state,
        priority=record["priority"],
        min_nodes=record["min_nodes"],
        max_nodes=record["max_nodes"],
        created_at=record["created_at"],
        selector=selector,
        handler=handler,
        result_ttl=ttl,
        partitions=record["partitions"],
        reason=record["reason"] or "",
        refusals=refusals,
        handlers=handlers,
        aside=aside,
        waits=waits,
        queue=queue,
    )
    return Finished(row, state) if state.finished else row


def finished_row(read: TaskRead, known: TaskRow | None, state: TaskState) -> Finished:
    """A finished task whose record does not decode: enough to release it."""
    if known is not None:
        return Finished(known, state)
    created = 0.0
    with contextlib.suppress(ValueError):
        created = float(text(read.fields[_CREATED]) or 0)
    row = TaskRow(read.id, state, 0, 1, None, created, {}, "", DEFAULT_TTL, 0)
    return Finished(row, state)


def refusals_of(raw: dict[bytes, bytes]) -> dict[str, Refusal]:
    """Every refusal in a task's refused hash that decodes (a broken one counts as none)."""
    out = {}
    for wid, body in raw.items():
        try:
            out[text(wid)] = Refusal.model_validate_json(body)
        except ValueError:
            continue
    return out


def worker_row(read: WorkerRead, known: WorkerRow | None) -> WorkerRow:
    """A live worker as its record says; ``ValueError`` if the record does not decode."""
    member_of = memberships(read.member_of)
    if known is not None and known.record == read.record:
        return replace(known, assign=read.assign, member_of=member_of)
    if read.record is None:
        return WorkerRow(read.id, {}, None, None, read.assign, None)
    rec = WorkerRecord.model_validate_json(read.record)
    return WorkerRow(
        read.id,
        rec.labels,
        tuple(rec.allow),
        rec.started_at,
        read.assign,
        read.record,
        queues=None if rec.queues is None else tuple(rec.queues),
        member_of=member_of,
    )


def memberships(raw: bytes | None) -> frozenset[str]:
    """The queues a worker's hash says it is a member of (none, if that does not decode:
    the controller then sees no member there, and the worker says it again)."""
    if not raw:
        return frozenset()
    try:
        names = json.loads(raw)
    except ValueError:
        return frozenset()
    if not isinstance(names, list):
        return frozenset()
    return frozenset(n for n in names if isinstance(n, str))


def differs(a: Any, b: Any) -> bool:
    """True if two rows differ in what the allocator or the record says (not the reason)."""
    if isinstance(a, TaskRow) and isinstance(b, TaskRow):
        fields = ("state", "priority", "min_nodes", "max_nodes", "refusals", "handlers")
        return any(getattr(a, f) != getattr(b, f) for f in fields)
    return bool(a != b)
