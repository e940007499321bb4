"""The reads of a pass: the tasks and workers it names, pipelined and paged.

Per task: its record's fields (``HMGET``), plus its spec when the task is new to the reader
(a spec never changes), plus its refusals, the handlers a queue's jobs name (and those of
its jobs set aside, whose streams expire with it, and the groups whose wait lists do) and
whether
``qw:queue`` lists it when asked (``deep``: new tasks, ``refused`` and ``handlers`` events,
the backstop sweep). Per worker: whether its pool
heartbeat key exists, whether ``qw:workers`` lists it, its assignment and its record.
A full read is the same, for every id ``qw:queue`` and ``qw:workers`` hold, ``PAGE`` ids a
pipeline.
"""

from __future__ import annotations

from collections.abc import Collection, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from queueworks.protocol.keys import Keys
from queueworks.protocol.messages import text
from queueworks.protocol.records import MEMBER_OF, TASK_FIELDS
from queueworks.transport.connection import Connection

from .tally import Tally

PAGE = 500  # ids per pipeline


@dataclass(frozen=True)
class TaskRead:
    id: str
    fields: Sequence[Any]  # HMGET of TASK_FIELDS
    spec: bytes | None = None  # when asked
    refused: dict[bytes, bytes] | None = None  # when asked (deep)
    queued: bool | None = None  # listed by qw:queue, when asked (deep)
    handlers: tuple[str, ...] | None = None  # a queue's jobs' handlers, when asked (deep)
    aside: tuple[str, ...] | None = None  # the handlers of a queue's jobs set aside (deep)
    waits: tuple[str, ...] | None = None  # the groups with a wait list of a queue's (deep)


@dataclass(frozen=True)
class WorkerRead:
    id: str
    alive: bool  # its pool heartbeat key exists
    listed: bool  # qw:workers lists it
    assign: str
    record: bytes | None
    member_of: bytes | None = None  # the queues it is a member of (JSON list), as it says
    beat: float | None = None  # its score in qw:workers: its last heartbeat (its clock)


def pages(ids: Sequence[str]) -> Iterator[Sequence[str]]:
    for start in range(0, len(ids), PAGE):
        yield ids[start : start + PAGE]


def read_tasks(
    r: Connection,
    keys: Keys,
    ids: Sequence[str],
    *,
    spec: Collection[str] = (),
    deep: Collection[str] = (),
    tally: Tally,
) -> list[TaskRead]:
    out = []
    spec, deep = set(spec), set(deep)
    for page in pages(ids):
        pipe = r.pipeline(transaction=False)
        queue_tasks(pipe, keys, page, spec, deep)
        out += parse_tasks(page, iter(tally.run(pipe)), spec, deep)
    return out


def unindexed(r: Connection, keys: Keys, ids: Sequence[str], *, tally: Tally) -> list[str]:
    """The ids the task index does not list (tasks submitted before there was one)."""
    out = []
    for page in pages(ids):
        if page:
            tally.commands += 1
            scores: Any = r.zmscore(keys.tasks, list(page))
            out += [tid for tid, score in zip(page, scores, strict=True) if score is None]
    return out


def queue_tasks(
    pipe: Any, keys: Keys, ids: Sequence[str], spec: Collection[str], deep: Collection[str]
) -> None:
    """Put the reads of ``ids`` on ``pipe`` (``parse_tasks`` reads their replies)."""
    for tid in ids:
        tk = keys.task(tid)
        pipe.hmget(tk.record, [*TASK_FIELDS, "spec"] if tid in spec else list(TASK_FIELDS))
        if tid in deep:
            pipe.hgetall(tk.refused)
            pipe.zscore(keys.queue, tid)
            pipe.smembers(tk.handlers)
            pipe.smembers(tk.aside)
            pipe.hkeys(tk.groups_waiting)


def parse_tasks(
    ids: Sequence[str], replies: Iterator[Any], spec: Collection[str], deep: Collection[str]
) -> list[TaskRead]:
    out = []
    for tid in ids:
        raw = next(replies)
        fields, spec_raw = (raw[:-1], raw[-1]) if tid in spec else (raw, None)
        refused = queued = handlers = aside = waits = None
        if tid in deep:
            refused, queued = next(replies), next(replies) is not None
            handlers = tuple(sorted(text(h) for h in next(replies)))
            aside = tuple(sorted(text(h) for h in next(replies)))
            waits = tuple(sorted(text(g) for g in next(replies)))
        read = TaskRead(tid, fields, spec_raw, refused, queued, handlers, aside, waits)
        out.append(read)
    return out


def read_workers(
    r: Connection, keys: Keys, ids: Sequence[str], *, tally: Tally
) -> list[WorkerRead]:
    out = []
    for page in pages(ids):
        pipe = r.pipeline(transaction=False)
        queue_workers(pipe, keys, page)
        out += parse_workers(page, iter(tally.run(pipe)))
    return out


def queue_workers(pipe: Any, keys: Keys, ids: Sequence[str]) -> None:
    for wid in ids:
        pipe.exists(keys.worker_heartbeat(wid))
        pipe.zscore(keys.workers, wid)
        pipe.get(keys.assign(wid))
        pipe.hmget(keys.worker(wid), ["record", MEMBER_OF])


def parse_workers(ids: Sequence[str], replies: Iterator[Any]) -> list[WorkerRead]:
    out = []
    for wid in ids:
        alive, score, assign, (record, member_of) = (next(replies) for _ in range(4))
        beat = float(score) if score is not None else None
        read = WorkerRead(wid, bool(alive), beat is not None, text(assign), record, member_of, beat)
        out.append(read)
    return out


def all_ids(r: Connection, keys: Keys, *, tally: Tally) -> tuple[list[str], list[str]]:
    """Every task id ``qw:queue`` lists and every worker id ``qw:workers`` lists."""
    pipe = r.pipeline(transaction=False)
    pipe.zrange(keys.queue, 0, -1)
    pipe.zrange(keys.workers, 0, -1)
    tasks, workers = tally.run(pipe)
    return [text(t) for t in tasks], [text(w) for w in workers]
