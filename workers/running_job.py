"""A queue's job on a member, from its read to its settle: one object (``RunningJob``).

It is the entry in hand (``Work``) decoded (``queueworks.protocol.jobrecords.JobEntry``), the call
that runs its handler (an ``eventloop.Call``: on the member's thread, or in flight with
``--concurrency``), and, once it ran, its outcome, which the ledger settles as it is
(``settle_jobs``). Not ``Job``: that is the client's handle (``queueworks.queue.queues.Job``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from queueworks.context import JobContext
from queueworks.protocol.jobrecords import JobEntry

from .eventloop import Call
from .work import Work


def _not_run(*args: Any) -> None:
    """The function of a job that is settled without running (refused, out of attempts)."""


class RunningJob(Call):
    """``entry``: which job, as its entry says; ``started_at``: when it started (s since
    the epoch; its record's ``st``); ``outcome``: its result JSON (done) or its error
    (dead); ``reason``: why it died; ``ctx``: the context its handler was given (None if
    it takes none); ``span``: its ``process`` span while tracing (``queueworks.tracing``)."""

    __slots__ = ("ctx", "entry", "outcome", "reason", "span", "started_at")

    def __init__(
        self,
        work: Work,
        entry: JobEntry,
        fn: Callable[..., Any],
        args: tuple[Any, ...],
        started_at: float,
    ) -> None:
        Call.__init__(self, work, entry.job_id, fn, args)
        self.entry, self.started_at = entry, started_at
        self.outcome = self.reason = ""
        self.ctx: JobContext | None = None
        self.span: Any = None

    @classmethod
    def unrun(cls, work: Work, entry: JobEntry, started_at: float) -> RunningJob:
        """A job settled without a call of its handler."""
        return cls(work, entry, _not_run, (), started_at)

    @property
    def work(self) -> Work:
        """The entry in hand: its stream, its id, its attempt."""
        item: Work = self.item
        return item

    @property
    def attempt(self) -> int:
        item: Work = self.item
        return item.attempt
