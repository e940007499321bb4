"""A queue whose keys are gone under a kept handle (Redis restarted empty, a FLUSHALL): how
a handle notices, without a round trip more on its hot path, and what it does.

A handle notices when a write finds no stream (the one ``XADD`` of a job to run now carries
``NOMKSTREAM``; ``enqueue_jobs.lua`` writes nothing and replies nil), when a read meets
``NOGROUP``, when its queue's record is gone under ``status()``, and when a job's result
wait (which looks at the queue's record once a second) finds the job on a stream of no
queue. It then creates the queue again with its own settings (its record, its stream and
group — from the stream's start, so entries written meanwhile run — and the handlers it
knows), and does what it was asked. A queue that was cancelled is never created again by a
handle: ``QueueNotFound`` says so. No I/O here: ``Queue`` and ``AsyncQueue`` run it.
"""

from __future__ import annotations

import re
from typing import Any

import redis

from queueworks.errors import QueueNotFound
from queueworks.protocol.messages import text
from queueworks.protocol.models import TaskState

QUEUE_CHECK_SECONDS = 1.0  # a job's result wait looks at its queue's record this often


class QueueGone(Exception):
    """A job waits on the stream of a queue whose record is gone: its handle creates the
    queue again (an internal signal, never raised to a caller)."""


def no_group(reply: Any) -> bool:
    """Whether a reply (or an exception) is Redis saying the stream or its group is gone."""
    return isinstance(reply, redis.ResponseError) and "NOGROUP" in str(reply)


def stream_gone(error: Exception) -> bool:
    """Whether ``error`` is Redis saying a stream, or its consumer group, is gone: Redis lost
    the keys, or they expired. ``NOGROUP`` (a read, a claim), "no such key" (``XINFO
    CONSUMERS``), ``UNBLOCKED`` (a read that waited on it when it went). Nothing is pending
    there; a member of it is a member no more."""
    if not isinstance(error, redis.ResponseError):
        return False
    said = _said(error)
    return said.startswith(("NOGROUP", "UNBLOCKED")) or said == "no such key"


_GONE_KEY = re.compile(r"^NOGROUP No such key '([^']*)'")


def gone_stream(error: Exception) -> str | None:
    """The stream a ``NOGROUP`` error of a read or a claim names (it or its group is gone);
    None for any other error."""
    found = _GONE_KEY.match(_said(error)) if isinstance(error, redis.ResponseError) else None
    return found.group(1) if found else None


_PIPELINE = "of pipeline caused error: "


def _said(error: Exception) -> str:
    """What Redis said, without the words redis-py puts before an error a pipeline raised
    ("Command # 3 (XREADGROUP ...) of pipeline caused error: ")."""
    said = str(error)
    at = said.find(_PIPELINE) if said.startswith("Command # ") else -1
    return said[at + len(_PIPELINE) :] if at >= 0 else said


def lost(name: str) -> QueueNotFound:
    return QueueNotFound(f"queue {name!r} is gone from Redis (its keys were lost)")


def record_gone(name: str, state: Any, revives: bool) -> bool:
    """From the queue record's ``state`` (an HGET): True if the record is gone too (the
    queue is to be created again whole), False if it is there (only its stream and group
    are to be made again); ``QueueNotFound`` if it finished or the handle may not."""
    if not revives:
        raise lost(name)
    if state is None:
        return True
    if TaskState(text(state)).finished:
        raise QueueNotFound(
            f"queue {name!r} was {text(state)}: it takes no jobs, and a handle does not "
            "create it again"
        )
    return False
