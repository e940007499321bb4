"""The calls of a queue's flow-control scripts (``rate_read.lua``, ``band_read.lua``,
``group_take.lua``, ``group_pump.lua``): their keys, arguments and replies, as every other
script's in ``queueworks.scripts.calls``. No I/O; ``queueworks.queue.flow`` plans with them."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from queueworks.protocol.keys import TaskKeys
from queueworks.scripts.calls import Call, fields_of

BURST_SECONDS = 0.1  # a full bucket holds this many seconds' worth of tokens (at least 1)


def burst_of(rate: float) -> int:
    """The tokens a full bucket holds: the jobs a queue idle for a while starts at once."""
    return max(1, math.ceil(rate * BURST_SECONDS))


Read = list[Any]  # as redis-py gives XREADGROUP's reply: [[stream, [(id, fields)]], ...]


def _rate_reply(reply: Any) -> tuple[Read, int]:
    read = [
        [stream, [(eid, fields_of(flat)) for eid, flat in entries]] for stream, entries in reply[0]
    ]
    return read, int(reply[1])


def rate_read(
    tk: TaskKeys, streams: Sequence[str], worker_id: str, rate: float, want: int
) -> Call[tuple[Read, int]]:
    """Read up to ``want`` entries of ``streams`` (the queue's, then its aside streams),
    no more than the queue's bucket has tokens, taking one each (``rate_read.lua``): what
    was read, and the ms until the next token (0: some are left)."""
    keys = [tk.bucket, *streams]
    args = [tk.group, worker_id, repr(rate), burst_of(rate), max(1, want)]
    return Call("rate_read", keys, args, _rate_reply)


def _band_reply(reply: Any) -> Read:
    return [
        [stream, [(eid, fields_of(flat)) for eid, flat in entries]] for stream, entries in reply
    ]


def band_read(tk: TaskKeys, streams: Sequence[str], worker_id: str, want: int) -> Call[Read]:
    """Read up to ``want`` entries of ``streams`` in their order (``band_read.lua``: a
    queue's bands, highest first, ``TaskKeys.read_order``), filling the read from the first
    that has entries before a later one."""
    return Call("band_read", list(streams), [tk.group, worker_id, max(1, want)], _band_reply)


def group_take(
    tk: TaskKeys,
    stream: str,
    entry_id: str,
    worker_id: str,
    job_id: str,
    group: str,
    limit: int,
    starts: int,
    named: bool,
) -> Call[int]:
    """Take a slot of ``group`` for a job about to run (``group_take.lua``): 1 run it, 0 it
    waits for a slot (moved off the stream), -1 the entry is not ours (leave it), -2 it
    names no waiting job (reject it)."""
    why = f"group {group!r} has {limit} job(s) running (group_limit)"
    keys = [stream, tk.groups, tk.groups_held, tk.groups_waiting, tk.group_wait(group)]
    keys += [tk.job(job_id), tk.record]
    args = [tk.group, entry_id, worker_id, job_id, group, limit, starts, why]
    args.append("1" if named else "")
    return Call("group_take", keys, args, int)


def group_pump(
    tk: TaskKeys, limit: int, heads: Mapping[str, Sequence[str]], back: Sequence[str] = ()
) -> Call[int]:
    """Give the free slots of the groups of ``heads`` to their waiting jobs, those read at
    the head of each group's wait list (``heads_of``; ``group_pump.lua``), after the jobs
    ``back`` gave theirs back: how many went back onto the stream."""
    keys = [tk.groups, tk.groups_held, tk.groups_waiting, tk.stream]
    args: list[Any] = [limit, len(back), *back]
    for group in sorted(heads):
        keys.append(tk.group_wait(group))
        for j in heads[group]:  # its record, and the stream of its band
            keys += (tk.job(j), tk.stream_of(j))
        args += [group, len(heads[group])]
    return Call("group_pump", keys, args, int)
