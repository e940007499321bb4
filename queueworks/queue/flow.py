"""A queue's flow control: ``rate_limit`` (jobs started per second, across every member) and
``group_limit`` (jobs of one group running at once, across every member).

**Rate.** A token bucket in Redis (``qw:task:{Q}:bucket``), refilled by the server's clock
at ``rate_limit`` tokens per second and holding at most ``burst_of(rate_limit)`` (a tenth of
a second's worth, at least 1): a queue idle for a while starts that many jobs at once, then
``rate_limit`` per second. A member reads a rate-limited queue with ``rate_read.lua``, which
reads no more entries than there are tokens and takes one per entry read, in one atomic
step: no two members can read past the limit between them. Its other queues are read as
before, on the same pipeline; a queue out of tokens is simply not read until the next one.

**Groups.** A job enqueued with ``group="tenant-7"`` on a queue with a ``group_limit`` takes
a slot of its group before it runs (``group_take.lua``); at the limit it leaves the stream
for its group's wait list, and the member goes on with the next job (of any other group:
no head-of-line blocking). A slot is held by the job, not by the member: a job retried,
or reclaimed from a member that died, keeps its slot; its settle gives it back
(``settle_jobs.lua``), and ``group_pump.lua`` hands it to the oldest job waiting in that
group, which goes back onto the stream. The pump writes the records of the jobs it hands
on, so the caller reads the heads of the wait lists first (on the settle's pipeline) and
passes their records; a pump is called only when a head was read.

This module holds what both sides share: the limits read from a queue's spec, the calls
of the three scripts, and the status read of both.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from queueworks.protocol.keys import TaskKeys
from queueworks.protocol.messages import text
from queueworks.protocol.models import TaskSpec
from queueworks.queue.queue_settings import SETTINGS, stored_setting
from queueworks.scripts.flow_calls import group_pump
from queueworks.transport.plans import Plan, Trip, alone

LIMITED_SECONDS = 1.0  # a queue is "limited" this long after a read found no token
BUCKET_EMPTY = "empty"  # the bucket's field: when a read last wanted more than its tokens


@dataclass(frozen=True)
class Limits:
    """A queue's ``rate_limit`` and ``group_limit`` (None: none)."""

    rate: float | None = None
    group: int | None = None

    @classmethod
    def of(cls, spec: TaskSpec | Mapping[str, Any]) -> Limits:
        return cls(
            stored_setting(SETTINGS["rate_limit"], spec),
            stored_setting(SETTINGS["group_limit"], spec),
        )


NONE = Limits()

HEADS_SPARE = 4  # heads read past the slots that may free (some may have been cancelled)
HEADS_MAX = 100  # heads of one list a pump is given at most (a later pump goes on)


def heads_reads(pipe: Any, tk: TaskKeys, wanted: Mapping[str, int]) -> list[str]:
    """Queue on ``pipe`` the reads of the heads of each group's wait list that a pump may
    hand a slot to: as many as slots may free (``wanted``), and ``HEADS_SPARE`` more. The
    groups, in the order of the reads (``heads_of`` reads their replies)."""
    groups = sorted(wanted)
    for group in groups:
        count = min(HEADS_MAX, max(1, wanted[group]) + HEADS_SPARE)
        pipe.lrange(tk.group_wait(group), 0, count - 1)
    return groups


def heads_of(groups: Sequence[str], replies: Sequence[Any]) -> dict[str, list[str]]:
    """Each group's heads read (``heads_reads``' replies): the ids of its oldest waiting
    jobs (a read that failed reads none)."""
    out: dict[str, list[str]] = {}
    for group, reply in zip(groups, replies, strict=True):
        items = reply if isinstance(reply, list) else []
        out[group] = [w[0] for raw in items if (w := wait_item(raw)) is not None]
    return out


def plan_pump(
    tk: TaskKeys, limit: int, wanted: Mapping[str, int], back: Sequence[str] = ()
) -> Plan[int]:
    """Read the heads of the groups' wait lists (``wanted``: group -> slots that may free),
    then pump (two round trips; none if there is nothing to give back or hand on)."""
    trip = Trip(errors=True)
    groups = heads_reads(trip, tk, wanted)
    heads = heads_of(groups, (yield trip)) if groups else {}
    if not back and not any(heads.values()):
        return 0
    return int((yield alone(group_pump(tk, limit, heads, back)))[0])


def wait_item(raw: Any) -> tuple[str, dict[bytes, bytes]] | None:
    """A wait list's item (``group_take.lua``: ``{"k": record key, "j": job id, "f": the
    entry's fields, flat}``) as its job's id and the fields of the entry it will be again;
    None if it is not one."""
    try:
        item = json.loads(raw)
        job_id, flat = item["j"], item["f"]
    except (ValueError, TypeError, KeyError):
        return None
    if not isinstance(job_id, str) or not isinstance(flat, list) or len(flat) % 2:
        return None
    if not all(isinstance(v, str) for v in flat):
        return None
    pairs = zip(flat[::2], flat[1::2], strict=True)
    return job_id, {k.encode(): v.encode() for k, v in pairs}


# -- status ---------------------------------------------------------------------------------


def flow_reads(pipe: Any, tk: TaskKeys, spec_field: str) -> None:
    """Queue on ``pipe`` what ``flow_status`` reads."""
    pipe.hget(tk.record, spec_field)
    pipe.hget(tk.bucket, BUCKET_EMPTY)
    pipe.hgetall(tk.groups)
    pipe.hgetall(tk.groups_waiting)


def flow_status(replies: Sequence[Any], now: float) -> dict[str, Any]:
    """``QueueStatus``' flow fields from the replies of ``flow_reads`` (an error counts
    nothing)."""
    spec, empty, running, waiting = (None if isinstance(r, Exception) else r for r in replies)
    try:
        limits = Limits.of(json.loads(spec)) if spec else NONE
    except (ValueError, TypeError):
        limits = NONE
    try:
        limited = empty is not None and now - float(empty) / 1000 < LIMITED_SECONDS
    except ValueError:
        limited = False
    return {
        "rate_limit": limits.rate,
        "group_limit": limits.group,
        "limited": limited and limits.rate is not None,
        "groups_running": group_counts(running),
        "groups_waiting": group_counts(waiting),
    }


def group_counts(raw: Any) -> dict[str, int]:
    """A groups hash read (``HGETALL``) as group -> count, the counts above 0 only."""
    out: dict[str, int] = {}
    for k, v in (raw or {}).items():
        try:
            n = int(v)
        except ValueError:
            continue
        if n > 0:
            out[text(k)] = n
    return dict(sorted(out.items()))
