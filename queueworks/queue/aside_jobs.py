"""A queue's jobs set aside, as its readers count them: a job whose handler the member that
read it may not run waits alone on its handler's aside stream (``workers.aside``), read
only by members that may run it. Those jobs are the queue's backlog like any other: its
status, ``queueworks info``, the dashboard and ``/metrics`` count them, its job lists list
them, ``empty`` cancels them. What they read: the aside set (``qw:task:{Q}:aside``, the
handlers with jobs set aside), then each handler's stream's length and pending summary.
A queue with nothing set aside costs its readers one ``SMEMBERS`` more, in a trip they
make anyway."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, NamedTuple

from queueworks.protocol.keys import TaskKeys
from queueworks.protocol.messages import text
from queueworks.protocol.models import parse_handler_path
from queueworks.transport.plans import Plan, Trip

READS = 2  # replies per handler of ``aside_reads``


class Aside(NamedTuple):
    """A queue's set-aside jobs: those no member has read yet, by handler (only handlers
    with some), and those members hold (they run)."""

    waiting: dict[str, int]
    running: int


NONE = Aside({}, 0)


def aside_handlers(reply: Any) -> list[str]:
    """The handlers of an aside set (its ``SMEMBERS`` reply), sorted; an error, or a
    member that is no handler path (no stream of it is ever read), counts none."""
    if not isinstance(reply, Iterable) or isinstance(reply, Exception | bytes | str):
        return []
    out = []
    for raw in reply:
        handler = text(raw)
        try:
            parse_handler_path(handler)
        except ValueError:
            continue
        out.append(handler)
    return sorted(out)


def aside_reads(pipe: Any, qk: TaskKeys, handlers: Sequence[str]) -> None:
    """Queue on ``pipe`` what ``aside_counts`` reads: ``READS`` commands per handler."""
    for handler in handlers:
        stream = qk.aside_stream(handler)
        pipe.xlen(stream)
        pipe.xpending(stream, qk.group)


def aside_counts(handlers: Sequence[str], replies: Sequence[Any]) -> Aside:
    """From the replies of ``aside_reads`` (errors as values: a stream deleted meanwhile,
    its last job settled or cancelled, counts nothing)."""
    waiting, running = {}, 0
    for i, handler in enumerate(handlers):
        length, pending = replies[READS * i : READS * (i + 1)]
        held = int(pending["pending"]) if isinstance(pending, dict) else 0
        left = int(length) - held if isinstance(length, int) else 0
        running += held
        if left > 0:
            waiting[handler] = left
    return Aside(waiting, running)


def aside_reason(waiting: dict[str, int]) -> str | None:
    """What a queue with jobs set aside says of them (None: none waits)."""
    if not waiting:
        return None
    said = ", ".join(f"{n} job(s) of {handler!r}" for handler, n in sorted(waiting.items()))
    return f"{said} set aside, waiting for a member that may run their handler"


def with_aside(reason: str | None, waiting: dict[str, int]) -> str | None:
    """A queue's reason (the controller's, if any) with what its jobs set aside say."""
    said = aside_reason(waiting)
    return "; ".join(r for r in (reason, said) if r) or None


def plan_aside_counts(qk: TaskKeys, handlers_reply: Any) -> Plan[Aside]:
    """The queue's set-aside jobs, from its aside set as read (``SMEMBERS``): one round
    trip if it names a handler, none otherwise."""
    handlers = aside_handlers(handlers_reply)
    if not handlers:
        return NONE
    trip = Trip(errors=True)
    aside_reads(trip, qk, handlers)
    return aside_counts(handlers, (yield trip))
