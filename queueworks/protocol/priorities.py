"""A job's priority inside its queue: ``enqueue(..., priority=N)``, an integer from
``LOWEST`` to ``HIGHEST`` (default ``DEFAULT``, 0); a higher number runs first, jobs of one
priority in the order they were enqueued.

Each priority in use is a band: a stream of its own (``TaskKeys.band``; priority 0 is the
queue's own stream, so a queue that never uses another costs nothing more), and the queue's
``bands`` set names the others in use. A member reads its queue's bands highest first
(``read_order``), filling a read from the highest band that has jobs before it looks at a
lower one. A prioritised job has an id of its own that ends with its band (``.p<N>``), so
whoever holds the id knows its stream (``TaskKeys.stream_of``): a retry, a delayed or a
deferred job goes back onto its own band when it is due, and a requeued dead one too.

The range is small on purpose: every band in use is one more stream a member reads, and
eleven levels (-5 .. 5) leave room both above and below the default, which most jobs keep.
"""

from __future__ import annotations

import os
from typing import Any

LOWEST = -5
HIGHEST = 5
DEFAULT = 0
_MARK = ".p"  # what ends a prioritised job's id, before its band


def check_priority(value: Any) -> int:
    """A priority as given: an integer from ``LOWEST`` to ``HIGHEST``; ``ValueError``
    naming ``priority`` and the value otherwise."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"priority must be an integer from {LOWEST} to {HIGHEST}, got {value!r}")
    if not LOWEST <= value <= HIGHEST:
        raise ValueError(f"priority must be from {LOWEST} to {HIGHEST}, got {value}")
    return value


def prioritised_id(priority: int) -> str:
    """A new id for a job of ``priority`` (not ``DEFAULT``): random, ending with its band."""
    return f"{os.urandom(10).hex()}{_MARK}{priority}"


def priority_of_id(job_id: str) -> int:
    """The priority a job's id says (``DEFAULT`` for any id that says none)."""
    head, mark, band = job_id.rpartition(_MARK)
    if not mark or not head:
        return DEFAULT
    try:
        value = int(band)
    except ValueError:
        return DEFAULT
    return value if LOWEST <= value <= HIGHEST and value != DEFAULT else DEFAULT


def bands_of(raw: Any) -> list[int]:
    """The bands a queue's ``bands`` set names (an SMEMBERS reply), highest first; one that
    is no band is left out."""
    out: set[int] = set()
    for item in raw or ():
        try:
            value = int(item)
        except (TypeError, ValueError):
            continue
        if LOWEST <= value <= HIGHEST and value != DEFAULT:
            out.add(value)
    return sorted(out, reverse=True)
