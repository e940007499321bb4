"""The seam between a task run and its mode: ``Run`` is what a mode loop may use of the run
(its collaborators and three calls), ``ModeLoop`` what the run asks of a loop. A mode is a
loop registered by name (``workers.modes.MODES``, keyed by ``TaskSpec.mode``); a new mode
is a new loop, not a new branch in the runtime.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

from queueworks.protocol.keys import Keys, TaskKeys
from queueworks.protocol.models import StoredSpec
from queueworks.scripts.bound import Scripts
from queueworks.transport.connection import Connection

from .handlers import Handler, HandlerRefused
from .heartbeat import Seat
from .inflight import EventLoop
from .ledger import Attempts
from .member import Membership
from .reclaim import Reclaim
from .stopping import Running
from .watchdog import Watchdog
from .work import Work


class Run(Protocol):
    """One worker's membership in one task, as its mode loop sees it."""

    r: Connection
    scripts: Scripts
    tk: TaskKeys
    keys: Keys
    me: str
    log: Any
    state: Seat  # this membership's (the worker-wide fields read through)
    watchdog: Watchdog
    spec: StoredSpec
    handler: Handler | None  # the task's handler (None for a queue: each job names its own)
    allow: list[str]  # the worker's --allow prefixes
    concurrency: int  # items of the task in flight at once (--concurrency)
    aio: EventLoop  # the process's event loop for async def handlers
    running: Running  # the queues' jobs running on this worker, and the way to stop one
    batch_size: int
    streams: list[str]  # every subtask stream of the task
    owned: list[str]  # the streams this member reads in its role
    held: deque[Work]  # entries in hand, to run before anything new (reclaimed, retried)
    membership: Membership
    ledger: Attempts  # the mode loop's own ledger (it made it)
    reclaim: Reclaim

    def check(self) -> None:
        """The safe point: raise ``Leave`` (stopping, revoked, finished), rejoin when
        fenced, re-rank on a new epoch."""

    def gone(self) -> None:
        """The task's stream or its group is gone (Redis lost its keys): our membership
        went with it; the next ``check`` rejoins, or leaves if the task is gone too."""

    def idle(self) -> None:
        """Nothing to do now: ``look_around``, then wait for a wake-up or a heartbeat."""

    def look_around(self) -> None:
        """Settle, leave if the task finished, run the backstops (a wedged member's work;
        for the leader, indices whose entries were deleted)."""

    def refuse(self, exc: HandlerRefused) -> None:
        """Record that this worker cannot run the task's handler; the controller does not
        give it the task again. The loop then raises ``Leave``. (A queue never refuses: a
        job it cannot run is set aside or dead, ``workers.queue_loop``.)"""

    def hand_back(self, streams: Sequence[str]) -> None:
        """Park what we hold in ``streams``; it leaves ``held``."""


@runtime_checkable
class ReadsAtJoin(Protocol):
    """A loop whose first entries come with the join (``join.lua`` reads them as the new
    member's last step: no round trip of their own); the run holds them (``Run.held``)."""

    def join_read(self) -> int:
        """How many new entries of the task's stream to read at the join (0: none)."""


class ModeLoop(Protocol):
    @property
    def ledger(self) -> Attempts:
        """What the loop settles with (it made it); the run settles through it too."""

    def serve(self) -> None:
        """Work until told to stop; ends only by raising ``Leave``."""

    def close(self, reason: str) -> None:
        """The run ends (``reason``: finished, stopping, revoked, ...): clean up."""
