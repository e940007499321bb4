"""Waiting for replicas: what ``submit(wait_replicas=n)`` and a queue's ``wait_replicas``
ask of Redis, and ``NotReplicated``, raised when fewer replicas acknowledged in time.

A write is acknowledged by the primary before its replicas have it: a failover in that
window loses it. ``WAIT n timeout`` after the write, in the same round trip
(``queueworks.transport.plans.Trip.wait_replicas``), says how many replicas hold it; with ``n`` of
them the write survives the loss of the primary.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple, TypeVar

from queueworks.errors import NotReplicated
from queueworks.protocol.keys import TaskKeys
from queueworks.transport.plans import Trip

J = TypeVar("J")


class Replicas(NamedTuple):
    """``wait_replicas`` and ``wait_timeout`` (s) of one write: no WAIT for 0 replicas."""

    replicas: int
    timeout: float

    @property
    def timeout_ms(self) -> int:
        return max(1, int(self.timeout * 1000))

    def add(self, trip: Trip, keys: Sequence[str]) -> int | None:
        """The WAIT after ``trip``'s writes (on every primary holding one of ``keys``);
        its reply's position, None for 0 replicas."""
        if not self.replicas:
            return None
        return trip.wait_replicas(self.replicas, self.timeout_ms, keys)


def acknowledged(replies: Sequence[Any], waited: int | None) -> int | None:
    """How many replicas a trip's WAIT saw (``waited``: its reply's position, as
    ``Replicas.add`` gave it); None where the trip had none."""
    return None if waited is None else int(replies[waited])


NO_WAIT = Replicas(0, 1.0)
SYNCED_MS = 1000  # how long a result-waiter's barrier key lives


def barrier(pipe: Any, qk: TaskKeys) -> None:
    """Queue on ``pipe`` a result-waiter's write of its own in the queue's slot (its key
    expires within a second): a WAIT after it covers every write replicated before it."""
    pipe.set(qk.synced, "1", px=SYNCED_MS)


def check_wait(replicas: int, timeout: float, what: str) -> Replicas:
    """``wait_replicas`` and ``wait_timeout`` given to ``what``, checked."""
    if isinstance(replicas, bool) or not isinstance(replicas, int) or replicas < 0:
        raise ValueError(f"{what}: need wait_replicas >= 0, got {replicas!r}")
    if not isinstance(timeout, int | float) or not timeout > 0:
        raise ValueError(f"{what}: need wait_timeout > 0, got {timeout!r}")
    return Replicas(replicas, float(timeout))


def jobs_not_replicated(
    queue: str, jobs: Sequence[Any], acked: int | None, wait: Replicas
) -> NotReplicated | None:
    """The error for ``jobs`` of ``queue`` if fewer than ``wait.replicas`` acknowledged."""
    if acked is None or acked >= wait.replicas:
        return None
    return NotReplicated(None, acked, wait.replicas, wait.timeout, jobs=jobs, queue=queue)


def replicated(queue: str, jobs: list[J], acked: int | None, wait: Replicas) -> list[J]:
    """``jobs`` of ``queue``, written; ``NotReplicated`` naming them if fewer than
    ``wait.replicas`` acknowledged (``acked``; None: not asked)."""
    error = jobs_not_replicated(queue, jobs, acked, wait)
    if error is not None:
        raise error
    return jobs
