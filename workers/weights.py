"""How a worker weighs the queues it serves (``worker --queues high:3,default:1``).

A queue of weight w is read in w of every W rounds (W: the highest weight it serves), as
long as the worker's reads bring jobs: of the jobs a worker starts while all its queues
have a backlog, a queue of weight 3 gets about three for each one of a queue of weight 1
(each read takes as many of every queue read). A queue skipped in a round is only resting:
its settles and checks go on, and once a read brings no job at all every queue is read
again (and waited on) the next round, so a lighter queue never waits on a heavier one that
is empty. Without weights (``--queues a,b``, or none) every queue is read every round.

Weights order the queues a worker serves against each other; a job's priority orders the
jobs inside one queue (``queueworks.protocol.priorities``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

MAX_WEIGHT = 100


def parse_queues(value: str) -> dict[str, int]:
    """``a:3,b`` as ``{"a": 3, "b": 1}`` (names not checked here); ``ValueError`` naming a
    bad weight."""
    out: dict[str, int] = {}
    for item in value.split(","):
        name, sep, raw = item.strip().partition(":")
        name = name.strip()
        weight = 1
        if sep:
            raw = raw.strip()
            if not raw.isdigit() or not 1 <= int(raw) <= MAX_WEIGHT:
                raise ValueError(
                    f"weight of queue {name!r} must be a whole number from 1 to "
                    f"{MAX_WEIGHT}, got {raw!r}"
                )
            weight = int(raw)
        out[name] = weight
    return out


class Weights:
    """Which queues rest this round (``resting``), from their weights and whether the
    last read brought any job."""

    def __init__(self, weights: Mapping[str, int] | None = None) -> None:
        given = {name: w for name, w in (weights or {}).items() if w > 0}
        self.weights = given if len(set(given.values())) > 1 else {}  # all equal: none
        self.top = max(self.weights.values(), default=1)
        self.credit: dict[str, float] = {}

    def resting(self, names: Iterable[str], busy: bool) -> set[str]:
        """The queues of ``names`` not read this round: none unless the last read brought
        jobs (``busy``) and the queues have weights. A queue earns its weight / the top
        weight each round, and is read when it has a whole round's worth."""
        if not self.weights:
            return set()
        out: set[str] = set()
        for name in names:
            credit = self.credit.get(name, self.weights.get(name, 1) / self.top)
            if not busy:
                credit = 1.0  # nothing came: everyone is read (and waited on) again
            if credit >= 1.0:
                credit -= 1.0
            else:
                out.add(name)
            self.credit[name] = credit + self.weights.get(name, 1) / self.top
        return out
