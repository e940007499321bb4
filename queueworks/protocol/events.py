"""The events stream: what happened, for people (dashboard, ``info``) and for the controller,
which wakes on it (XREAD BLOCK) instead of polling."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from queueworks.protocol.keys import Keys

if TYPE_CHECKING:
    from queueworks.transport.connection import Connection

EVENTS_MAXLEN = 10_000


def event(kind: str, **fields: object) -> dict[str, str]:
    """An event's fields: its kind, when, and the given fields that are not None."""
    body: dict[str, str] = {"kind": kind, "ts": repr(time.time())}
    body.update({k: str(v) for k, v in fields.items() if v is not None})
    return body


def emit(r: Any, keys: Keys, kind: str, **fields: object) -> None:
    """Append an event; ``r`` may be a client or a pipeline (sync or asyncio: an asyncio
    pipeline queues the command without an ``await``)."""
    r.xadd(keys.events, event(kind, **fields), maxlen=EVENTS_MAXLEN, approximate=True)


REASON_KEPT = 200  # characters of a dead letter's reason an event carries


def dead_lettered(
    r: Any, keys: Keys, task_id: str, count: int, reason: str, **first: object
) -> None:
    """A ``dead_lettered`` event: how many were dead-lettered at once, and the first one's
    id (``job=``, ``index=`` or ``entry=``) and reason (cut to ``REASON_KEPT``)."""
    emit(r, keys, "dead_lettered", task=task_id, count=count, reason=reason[:REASON_KEPT], **first)


def latest_id(r: Connection, keys: Keys) -> str:
    """The id to read events after, so a reader sees only what comes next."""
    last: Any = r.xrevrange(keys.events, count=1)
    return last[0][0].decode() if last else "0-0"
