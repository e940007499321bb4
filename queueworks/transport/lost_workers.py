"""Lost workers: what is kept of a worker whose pool heartbeat ran out.

The controller drops such a worker from the worker index (``qw:workers``) in the fenced
step that writes its ``worker_lost`` event; the same step appends what it knew of the worker
to ``qw:workers:lost`` (a stream capped near ``KEPT`` entries, written only if the index
still listed it: one entry per loss). A worker that leaves gracefully takes itself out of
the index first, so it is never recorded here.

This module owns that entry (``lost_entry`` writes it, ``parse_lost`` reads it) and the read
that shows them (``plan_lost_workers``): the newest ``KEPT`` lost within ``WINDOW`` seconds,
each with what the history of its task and queues says of it: the epoch its node set
dropped it at (``dead``, its members' prune) and what the rebalance that followed reclaimed.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict

from queueworks.protocol.keys import Keys
from queueworks.protocol.messages import text
from queueworks.protocol.validate import NAME_PATTERN
from queueworks.transport.plans import Plan, Trip

KEPT = 50  # lost workers kept (the stream is trimmed near it) and shown
WINDOW = 600.0  # s: a lost worker is shown this long after it was found
HISTORY_READ = 80  # newest history entries read of each task a lost worker was in
TASKS_READ = 100  # distinct tasks whose history one read looks at
SKEW = 5.0  # s: a prune may be stamped this much before the worker's last heartbeat
_TEXT_MAX = 200  # a stored host (or other text) is shown cut to this
_NAME_RE = re.compile(NAME_PATTERN + r"\Z")


class Reclaim(BaseModel):
    """What one task or queue a lost worker was in recorded of it: the epoch whose change
    dropped it (``None``: not dropped yet, or the history no longer has it), when, and how
    many entries the rebalance after it reclaimed (``None``: not recorded)."""

    model_config = ConfigDict(extra="forbid")

    task: str
    epoch: int | None = None
    pruned_at: float | None = None
    reclaimed: int | None = None


class LostWorker(BaseModel):
    """A worker found dead: when (``lost_at``), its last heartbeat, where it ran, the task
    and queues it was in then, and what each of them reclaimed from it."""

    model_config = ConfigDict(extra="forbid")

    id: str
    lost_at: float
    last_heartbeat: float | None = None
    host: str | None = None
    pid: int | None = None
    task: str | None = None
    member_of: list[str] = []
    reclaims: list[Reclaim] = []


def lost_entry(
    worker_id: str,
    now: float,
    *,
    record: bytes | None,
    member_of: bytes | None,
    assign: str,
    last_heartbeat: float | None,
) -> dict[str, str]:
    """The ``qw:workers:lost`` entry of a worker found dead, from what the controller read
    of it (its record JSON and ``member_of`` JSON as stored; either may be missing)."""
    host, pid = "", ""
    try:
        rec = json.loads(record or b"{}")
        if isinstance(rec, dict):
            host, pid = str(rec.get("host", ""))[:_TEXT_MAX], str(rec.get("pid", ""))[:20]
    except ValueError:
        pass
    return {
        "worker": worker_id,
        "ts": repr(now),
        "last_heartbeat": "" if last_heartbeat is None else repr(last_heartbeat),
        "host": host,
        "pid": pid,
        "task": assign,
        "member_of": _text(member_of or b"[]"),
    }


def parse_lost(raw: Mapping[bytes, bytes]) -> LostWorker | None:
    """A ``qw:workers:lost`` entry, or None if it names no worker or no time. Its texts are
    kept as stored (cut to ``_TEXT_MAX``), to be shown as text; only well-formed task and
    queue names are looked up."""
    f = {_text(k): _text(v) for k, v in raw.items()}
    wid, lost_at = f.get("worker", "")[:_TEXT_MAX], _float(f.get("ts"))
    if not wid or lost_at is None:
        return None
    try:
        queues = json.loads(f.get("member_of") or "[]")
    except ValueError:
        queues = []
    pid = f.get("pid", "")
    return LostWorker(
        id=wid,
        lost_at=lost_at,
        last_heartbeat=_float(f.get("last_heartbeat")),
        host=f.get("host", "")[:_TEXT_MAX] or None,
        pid=int(pid) if pid.isdigit() and len(pid) < 12 else None,
        task=f.get("task", "")[:_TEXT_MAX] or None,
        member_of=[str(q)[:_TEXT_MAX] for q in queues[:TASKS_READ]]
        if isinstance(queues, list)
        else [],
    )


def plan_lost_workers(keys: Keys, now: float, within: float = WINDOW) -> Plan[list[LostWorker]]:
    """The workers lost in the last ``within`` seconds (the newest ``KEPT``), newest first,
    each with its ``reclaims``: two round trips (the stream, then one history read per
    distinct task, at most ``TASKS_READ``)."""
    trip = Trip()
    trip.xrevrange(keys.workers_lost, count=KEPT)
    lost = [w for w in _parsed((yield trip)[0]) if w.lost_at >= now - within]
    tasks = list(dict.fromkeys(t for w in lost for t in _tasks_of(w)))[:TASKS_READ]
    if not tasks:
        return lost
    trip = Trip(errors=True)
    for tid in tasks:
        trip.xrevrange(keys.task(tid).history, count=HISTORY_READ)
    histories = {
        tid: [] if isinstance(reply, Exception) else list(reply or ())
        for tid, reply in zip(tasks, (yield trip), strict=True)
    }
    for w in lost:
        w.reclaims = [_reclaim(w, t, histories[t]) for t in _tasks_of(w) if t in histories]
    return lost


def _parsed(entries: Iterable[Any]) -> list[LostWorker]:
    out = []
    for _id, raw in entries or ():
        found = parse_lost(raw)
        if found is not None:
            out.append(found)
    return out


def _tasks_of(w: LostWorker) -> list[str]:
    """The task and queues ``w`` was in, those whose names are well-formed (to look up)."""
    named = [*([w.task] if w.task else []), *w.member_of]
    return list(dict.fromkeys(n for n in named if _NAME_RE.match(n)))


def _reclaim(w: LostWorker, task_id: str, history: Sequence[Any]) -> Reclaim:
    """The newest prune of ``w`` in the task's history (newest first) since its last
    heartbeat, joined with the rebalance record of that epoch."""
    since = (w.last_heartbeat if w.last_heartbeat is not None else w.lost_at - WINDOW) - SKEW
    done: dict[int, int | None] = {}
    for _id, raw in history:
        f = {_text(k): _text(v) for k, v in raw.items()}
        epoch = _int(f.get("epoch"))
        if epoch is None:
            continue
        if f.get("cause") == "rebalanced":
            done.setdefault(epoch, _int(f.get("reclaimed")))
            continue
        ts = _float(f.get("ts"))
        if f.get("cause") == "dead" and f.get("worker") == w.id and ts is not None and ts >= since:
            return Reclaim(task=task_id, epoch=epoch, pruned_at=ts, reclaimed=done.get(epoch))
    return Reclaim(task=task_id)


def _text(raw: Any) -> str:
    """A stored value as text, whatever its bytes (another writer's)."""
    return raw.decode(errors="replace") if isinstance(raw, bytes) else text(raw)


def _float(raw: str | None) -> float | None:
    try:
        value = float(raw or "")
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def _int(raw: str | None) -> int | None:
    return int(raw) if raw and raw.isdigit() and len(raw) < 19 else None
