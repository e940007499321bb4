"""The switch between queueworks and its OpenTelemetry instrumentation (``queueworks.otel``).

Nothing of OpenTelemetry is imported here. ``hooks`` holds what the instrumentor installs
(``QueueworksInstrumentor.instrument``) and nothing else sets: the enqueue asks
``hooks.producer`` for the trace context a new job carries, a worker asks ``hooks.consumer``
to trace the jobs it runs, and the log setup adds ``hooks.log_fields`` to its processors.
With tracing off all three are None: an enqueue and a job's run each look at one attribute,
and a job's entry carries no trace context at all.

A traced job carries its producer's context in its own options (the ``o`` field of its
entry, and of its record while it waits off the stream: delayed, deferred, retried), under
``TRACE_FIELDS``: the W3C ``traceparent``, ``tracestate`` and ``baggage`` headers, and
``"tl": 1`` where its consumer links to that context instead of being its child (a job that
waited for dependencies). Every path that moves a job keeps its ``o``, so the context rides
along; ``JobOptions.parse`` ignores these names.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any, Protocol

# a job's options (``o``) JSON names -> the W3C header each carries
TRACE_FIELDS = {"tp": "traceparent", "ts": "tracestate", "bg": "baggage"}
LINK_FIELD = "tl"  # 1: the consumer links to the producer's span, not its child


class Producer(Protocol):
    def carry(self, options: str) -> str:
        """A new job's options JSON (``o``; '' for none) with the current trace context in
        it; ``options`` as it is where there is no current span."""
        ...

    def as_link(self, options: str) -> str:
        """``options`` of a job whose consumer links to its producer (it waits first)."""
        ...


class Consumer(Protocol):
    def start(self, job: Any, queue: str, worker_id: str) -> None:
        """A job (``workers.running_job.RunningJob``) is about to run: its span starts, and
        its call is made to run with that span current."""
        ...

    def attached(self, job: Any) -> AbstractContextManager[Any]:
        """The job's span current while the worker writes about it (its log lines)."""
        ...

    def batch(
        self, task: str, carried: str | None, count: int, worker_id: str
    ) -> AbstractContextManager[Any]:
        """A ``process`` span, current while a worker runs ``count`` subtasks of ``task`` in
        a row; ``carried``: the task's trace context (its record's)."""
        ...

    def subtask_fn(self, fn: Callable[..., Any], task: str) -> Callable[..., Any] | None:
        """``fn`` run in a span of its own per subtask, if asked for (None: not asked)."""
        ...

    def trace_id(self, job: Any) -> str:
        """The job's trace id (hex), kept on its record for the dashboard."""
        ...

    def end(self, job: Any, error: BaseException | None, fate: str) -> None:
        """The job's call ended (``error``: what it raised); ``fate``: "" (done), "retry",
        "dead", "suspended", or "cancelled" or "stopped" (stopped while it ran: cancelled,
        or its worker fenced; nothing of it recorded). Its span ends."""
        ...


class Hooks:
    """What the instrumentor installs; None: tracing is off."""

    def __init__(self) -> None:
        self.producer: Producer | None = None
        self.consumer: Consumer | None = None
        # a structlog processor adding trace_id and span_id to a line written under a span
        self.log_fields: Callable[[Any, str, Any], Any] | None = None


hooks = Hooks()  # the one process-wide switch: set only by QueueworksInstrumentor
