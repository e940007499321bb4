"""Periodic jobs: a queue's schedules, as data and as times (no I/O).

A schedule is a handler and payload that the controller holding the lease enqueues as a
job of its queue at each *due time*: every ``every`` seconds, or at each time a cron
expression names (UTC). What is stored of it, and where (``keys.py``):

- its **definition** (``qw:task:{Q}:schedules``, name -> JSON: handler, payload JSON,
  every or cron), written by ``Queue.schedule``;
- its **next due time** in integer milliseconds, twice: in the queue's own zset
  (``qw:task:{Q}:schedules:due``, the truth, beside the queue's keys) and in the global
  index (``qw:schedules``, member ``<queue>/<name>``), the one zset a controller pass reads;
- its **last run** (``qw:task:{Q}:schedules:last``, name -> ``<due s> <job id>``).

A due time fires one job whose id is derived from (queue, name, due time): ``job_id``.
The fire script (``lua/fire_schedule.lua``, run fenced) writes it only if the queue's own
copy still says that due time, and advances it, in one atomic step: a replayed or stale
tick is a no-op.

Due times that pass while a leader watches fire each, late if the leader was (``fire_times``).
Missed ticks (no controller ran): one catch-up run, for the latest due time missed, then
the next due time after now (``due_times``).
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any, NamedTuple

from croniter import CroniterError, croniter

from queueworks.protocol.models import Schedule, parse_handler_path
from queueworks.protocol.validate import MAX_TTL, check_name, check_number
from queueworks.queue.queues import payload_json

MIN_EVERY = 0.001  # s: due times are whole milliseconds
SEP = "/"  # between the queue and the name in an index member (neither holds one)


class Definition(NamedTuple):
    """What a schedule does and when: ``every`` (s) or ``cron``, the other None."""

    handler: str
    payload: str  # JSON
    every: float | None
    cron: str | None
    options: str = ""  # its jobs' own options JSON ('' = none): the trace context they link to


_RANDOM = re.compile(r"R(\(\d+-\d+\))?(/\d+)?\Z", re.IGNORECASE)  # croniter's random field


def check_cron(expr: Any) -> str:
    """A standard 5-field cron expression (minute hour day month weekday, or ``@hourly``
    and the like), as croniter reads it; ``ValueError`` naming it otherwise. Fields are
    separated by spaces, with none before or after, and none may draw its value at random
    (croniter's ``R``: drawn again at every computation, so no due time would hold)."""
    if not isinstance(expr, str) or not expr.strip():
        raise ValueError(f"cron {expr!r} must be a cron expression such as '*/5 * * * *'")
    if expr != expr.strip(" ") or not expr.isprintable():
        raise ValueError(
            f"cron {expr!r} must be fields separated by spaces, without control characters "
            "or spaces around them"
        )
    if any(_RANDOM.match(part) for part in re.split(r"[ ,]+", expr)):
        raise ValueError(f"cron {expr!r} must not draw a field at random (R)")
    fields = expr.split()
    if not expr.startswith("@") and len(fields) != 5:
        raise ValueError(
            f"cron {expr!r} must have 5 fields (minute hour day month weekday), not {len(fields)}"
        )
    try:
        croniter(expr, 0.0).get_next(float)
    except (CroniterError, ValueError, KeyError) as exc:
        raise ValueError(f"cron {expr!r} is not a valid cron expression: {exc}") from None
    return expr


def definition(handler: str, payload: Any, every: Any, cron: Any) -> Definition:
    """A schedule's definition, checked: ``ValueError`` naming what is wrong."""
    parse_handler_path(handler)
    body = payload_json(payload)
    if (every is None) == (cron is None):
        raise ValueError("schedule: give every=seconds or cron='expression', exactly one")
    if cron is not None:
        return Definition(handler, body, None, check_cron(cron))
    if isinstance(every, bool):
        raise ValueError(f"every must be a number of seconds, got {every!r}")
    seconds = check_number("every", every, MIN_EVERY, MAX_TTL)
    return Definition(handler, body, seconds, None)


def check_schedule_name(name: Any) -> str:
    return check_name(name, "schedule name")


def encode(d: Definition) -> str:
    fields = {"h": d.handler, "p": d.payload, "every": d.every, "cron": d.cron}
    if d.options:
        fields["o"] = d.options
    return json.dumps(fields)


def decode(raw: bytes | str) -> Definition:
    """A stored definition; ``ValueError`` if it is not one (written by hand)."""
    try:
        f = json.loads(raw)
        d = Definition(
            str(f["h"]), str(f["p"]), f.get("every"), f.get("cron"), str(f.get("o") or "")
        )
    except (ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"not a schedule definition: {exc}") from None
    parse_handler_path(d.handler)
    if d.cron is not None:
        check_cron(d.cron)
    elif not isinstance(d.every, int | float) or not MIN_EVERY <= d.every <= MAX_TTL:
        raise ValueError(f"not a schedule definition: every {d.every!r}")
    return d


def member(queue: str, name: str) -> str:
    """The schedule's member in the global index."""
    return f"{queue}{SEP}{name}"


def split_member(raw: bytes | str) -> tuple[str, str] | None:
    """(queue, name) of an index member; None if it is none."""
    text = raw.decode(errors="replace") if isinstance(raw, bytes) else raw
    queue, sep, name = text.partition(SEP)
    try:
        check_name(queue, "queue")
        check_schedule_name(name)
    except ValueError:
        return None
    return (queue, name) if sep else None


def job_id(queue: str, name: str, due_ms: int) -> str:
    """The id of the job that the due time ``due_ms`` of a schedule fires: the same for
    every controller that fires it (``jobrecords.JOB_ID`` accepts it)."""
    return hashlib.sha1(f"{queue}\n{name}\n{due_ms}".encode()).hexdigest()


def _cron_next(expr: str, after_ms: int) -> int:
    """The first time the cron expression names strictly after ``after_ms``."""
    return round(float(croniter(expr, after_ms / 1000).get_next(float)) * 1000)


def _cron_latest(expr: str, now_ms: int) -> int:
    """The last time the cron expression names at or before ``now_ms``."""
    return round(float(croniter(expr, (now_ms + 1) / 1000).get_prev(float)) * 1000)


def first_due(d: Definition, now_ms: int) -> int:
    """A new (or replaced) schedule's first due time: ``every`` from now, or the cron's next."""
    if d.cron is not None:
        return _cron_next(d.cron, now_ms)
    assert d.every is not None
    return now_ms + max(1, round(d.every * 1000))


def due_times(d: Definition, due_ms: int, now_ms: int) -> tuple[int, int]:
    """For a schedule due at ``due_ms`` (<= ``now_ms``): the due time to fire now and the
    next one. On time: ``due_ms`` itself. Ticks missed (nobody fired them): only the latest
    one missed fires (one catch-up run, not a burst), and the next is the first due time
    after now."""
    if d.cron is not None:
        fire = due_ms if _cron_next(d.cron, due_ms) > now_ms else _cron_latest(d.cron, now_ms)
        return fire, _cron_next(d.cron, max(fire, now_ms))
    assert d.every is not None
    step = max(1, round(d.every * 1000))
    fire = due_ms + (now_ms - due_ms) // step * step
    return fire, fire + step


def _after(d: Definition, due_ms: int) -> int:
    """The due time that follows ``due_ms``."""
    if d.cron is not None:
        return _cron_next(d.cron, due_ms)
    assert d.every is not None
    return due_ms + max(1, round(d.every * 1000))


def fire_times(
    d: Definition, due_ms: int, now_ms: int, since_ms: int, limit: int
) -> tuple[list[int], int]:
    """For a schedule due at ``due_ms`` (<= ``now_ms``): the due times to fire now, in order,
    and the next due time after them. ``since_ms``: since when the leader has watched the
    schedules without a break. A due time from then on passed while it watched: each fires,
    however late the leader is (at most ``limit`` now, the rest at the next pass). One before
    it passed while no controller ran: ``due_times``' one catch-up run."""
    if due_ms < since_ms:
        fire, after = due_times(d, due_ms, now_ms)
        return [fire], after
    fires, after = [due_ms], _after(d, due_ms)
    while after <= now_ms and len(fires) < limit:
        fires.append(after)
        after = _after(d, after)
    return fires, after


def as_schedule(
    queue: str, name: str, raw: bytes | str, due: float | None, last: bytes | str | None
) -> Schedule:
    """The ``Schedule`` model of a stored schedule."""
    d = decode(raw)
    last_run = last_job = None
    if last:
        at, _, job = (last.decode() if isinstance(last, bytes) else last).partition(" ")
        last_run, last_job = float(at), job or None
    return Schedule(
        name=name,
        queue=queue,
        handler=d.handler,
        payload=json.loads(d.payload),
        every=d.every,
        cron=d.cron,
        next_run=None if due is None else due / 1000,
        last_run=last_run,
        last_job=last_job,
    )
