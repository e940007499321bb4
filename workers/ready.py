"""Which of a worker's queues to read and look at this round: those that may have jobs, not
every queue it serves.

A worker serving a few queues (at most ``FEW``) reads them all with one blocking
``XREADGROUP``: the cheapest way to wait, and a job starts one round trip after its
``XADD``. A worker serving more learns which queues have jobs from the enqueue itself: the
keyspace notification of each queue stream's ``XADD`` (the flag ``t``; every path that puts
a job on a stream is an ``XADD``: enqueue, a delayed job come due, a retry, a hand-back), told
from the watcher's thread (``told``). A round reads only

* the queues told of since the last read, and those whose last read brought jobs (there
  may be more than its ``COUNT``) -- the *hot* ones;
* the queues that hold work of their own here (``busy``: jobs held or in flight, a settle
  pending, a rate gate, aside streams, a group limit, a delayed job due soon);
* the queues something else asked to look at (``poke``: a new epoch, a delayed job added,
  a pause or a new setting, the queue's seat flagged), oldest first, at most
  ``POKES_PER_ROUND`` a round;
* and, in turn, every other queue at ``VISITS_PER_SECOND`` over all of them (each queue at
  least every ``VISIT_SECONDS``): its safe point, its checks when due, and one read of its
  stream -- the backstop should a notification be lost.

Such a read never blocks on the streams: with nothing hot the worker waits on its wake
event, which a notification sets. Where notifications cannot be had (``CONFIG`` refused, a
Redis Cluster, whose patterns have no slot), every queue is read each round, as with few.

``streams_of`` is the one place that turns a queue with work into the stream keys read.
"""

from __future__ import annotations

import itertools
import math
import threading
from collections.abc import Callable, Iterable
from typing import Any, Literal

from queueworks.protocol.keys import Keys

FEW = 16  # a worker serving at most this many queues reads them all, blocking
VISITS_PER_SECOND = 50.0  # queues looked at in turn, a second, over all of them
VISIT_SECONDS = 1.0  # ... each at least this often when there are few enough
POKES_PER_ROUND = 256  # queues asked for, looked at per round at most (the rest wait)
SHRINK_PAST = 64  # a set of queues that held more is made anew once it holds an eighth


def streams_of(loop: Any) -> dict[Any, Any]:
    """The streams a queue's read names (stream -> id): its own, and the aside streams of
    the handlers it may run (``workers.aside``)."""
    read: dict[Any, Any] = loop.aside.read
    return read


class Ready:
    """The hot, poked and visited queues of a worker (by name), and whether it reads only
    those (``selective``)."""

    def __init__(self, wake: threading.Event) -> None:
        self.wake = wake
        self._lock = threading.Lock()
        self._told: set[str] = set()  # stream notifications since the last take (any thread)
        self._all = False  # every queue told (a reconnect: anything may have been missed)
        self._flagged: list[str] = []  # queues to look at, from any thread
        self.hot: set[str] = set()  # read next round
        self.poked: dict[str, None] = {}  # to look at, oldest first (main thread)
        self.busy: set[str] = set()  # looked at every round
        self.listening = False  # stream notifications come (the worker subscribed)
        self.recheck = False  # the watcher reconnected: ask again whether they come
        self.names: list[str] = []  # every queue served, in turn order
        self.cursor = 0
        self.visited_at = 0.0
        self.peaks: dict[str, int] = {}  # the most ``hot``, ``busy``, ``poked`` held

    # -- from the watcher's thread --------------------------------------------------------

    def told(self, name: str | None) -> None:
        """A job was added to queue ``name``'s stream (None: maybe to any)."""
        with self._lock:
            if name is None:
                self._all = True
            else:
                self._told.add(name)
        self.wake.set()

    def flag(self, name: str) -> None:
        """Look at queue ``name`` soon: a new epoch, its seat flagged (any thread)."""
        with self._lock:
            self._flagged.append(name)
        self.wake.set()

    # -- the loop's -----------------------------------------------------------------------

    def selective(self, served: int) -> bool:
        return self.listening and served > FEW

    def serve(self, names: Iterable[str]) -> None:
        """The queues served now (after a join or a leave)."""
        self.names = sorted(names)
        self.cursor %= max(1, len(self.names))
        kept = set(self.names)
        self.hot &= kept
        self.busy &= kept
        self.poked = {n: None for n in self.poked if n in kept}

    def poke(self, name: str) -> None:
        """Look at queue ``name`` soon (main thread)."""
        self.poked[name] = None

    def flagged(self, *, poke: bool) -> list[str]:
        """The queues flagged since the last call (their loops check them at once); looked
        at soon too (``poke``: reading some of many)."""
        with self._lock:
            flagged, self._flagged = self._flagged, []
        if poke:
            for name in flagged:
                self.poked[name] = None
        return flagged

    def take(self, now: float) -> list[str]:
        """This round's queues: hot and told ones first, then busy, poked, and those whose
        turn it is (see the module docstring); each once."""
        with self._lock:
            told, self._told = self._told, set()
            every, self._all = self._all, False
        if every:
            told = set(self.names)
        self.hot |= told
        out: dict[str, None] = dict.fromkeys(sorted(self.hot))
        out.update(dict.fromkeys(sorted(self.busy)))
        for name in list(itertools.islice(self.poked, POKES_PER_ROUND)):
            del self.poked[name]
            out[name] = None
        out.update(dict.fromkeys(self._turn(now)))
        self._shrink()
        return list(out)

    def _shrink(self) -> None:
        """A set or dict keeps its table when its entries go, and going through it walks
        every slot: ``hot``, ``busy`` and ``poked`` held thousands once (every queue told
        after a reconnect, busy while joining) and hold a few now, so each round walked
        thousands of empty slots (0.15 ms at 10,000 queues). Once one holds under an
        eighth of the most it held (or none), it is made anew, at its size."""
        if self._shrinks("hot", len(self.hot)):
            self.hot = set(self.hot)
        if self._shrinks("busy", len(self.busy)):
            self.busy = set(self.busy)
        if self._shrinks("poked", len(self.poked)):
            self.poked = dict(self.poked)

    def _shrinks(self, name: str, now: int) -> bool:
        """Whether the set ``name``, holding ``now``, is to be made anew (its peak noted)."""
        peak = max(self.peaks.get(name, 0), now)
        shrinks = not now or (peak > SHRINK_PAST and now * 8 < peak)  # (an empty one: cheap)
        self.peaks[name] = now if shrinks else peak
        return shrinks

    def _turn(self, now: float) -> list[str]:
        n = len(self.names)
        if not n:
            return []
        period = max(VISIT_SECONDS, n / VISITS_PER_SECOND)
        k = min(n, math.floor((now - self.visited_at) * n / period))
        if k <= 0:
            return []
        self.visited_at = now if k == n else self.visited_at + k * period / n
        at = self.cursor
        self.cursor = (at + k) % n
        return [self.names[(at + i) % n] for i in range(k)]

    def after(self, name: str, *, read: bool, brought: bool, busy: bool) -> None:
        """What a round found of queue ``name``: read (``read``), it brought jobs
        (``brought``: read it again next round); it holds work here (``busy``)."""
        if read and not brought:
            self.hot.discard(name)
        elif brought:
            self.hot.add(name)
        if busy:
            self.busy.add(name)
        else:
            self.busy.discard(name)


def name_in(key: str, key_of: Callable[[str], str]) -> str | None:
    """The queue whose key ``key`` is, ``key_of`` making a queue's key of that kind; None
    if it is no such key."""
    head, tail = key_of("\n").split("\n")
    if key.startswith(head) and key.endswith(tail) and len(key) > len(head) + len(tail):
        return key[len(head) : len(key) - len(tail)]
    return None


def queue_of(keys: Keys, key: str) -> tuple[str, Literal["stream", "band", "scheduled"]] | None:
    """The queue whose stream, priority band's stream (``queueworks.protocol.priorities``)
    or delayed jobs' zset ``key`` is, and which of them; None if it is none of those."""
    name = name_in(key, lambda q: keys.task(q).stream)
    if name is not None:
        return name, "stream"
    name = name_in(key.rpartition(":")[0] + ":*", lambda q: keys.task(q).band_pattern)
    if name is not None:
        return name, "band"
    name = name_in(key, lambda q: keys.task(q).scheduled)
    if name is not None:
        return name, "scheduled"
    return None
