"""A member with ``--concurrency N > 1``: up to N subtasks or jobs in flight at once
(``workers.inflight.InFlight``), for any mode that says how to read, start and record its
items (``Items``).

The member's thread stays the only one that touches the ledger and Redis: it reads, starts
calls while there is room, records what finished, settles. Every guarantee holds per item:
an item is started (charged when it may have run before) by ``Ledger.start``; a failure is
retried first; a suspended item goes back, same attempt. Before any membership change is
acted on — a new epoch, a revoked assignment, a stop — the member stops starting items and
waits for those in flight (they stop at their safe points, or finish, or are settled at
their deadline: a coroutine that ignores its cancellation holds nobody past it), so a
re-rank never hands back or reclaims an item that is running here. A cold stop (the grace
period ran out) leaves what runs pending, to be reclaimed and charged. Items with an
ordering key (partitioned tasks) run one per key at a time, in stream order: concurrency
across keys only.
"""

from __future__ import annotations

import time
from collections import deque
from typing import Protocol

from queueworks.process import ColdStop

from .handlers import HandlerRefused
from .inflight import Call, InFlight
from .ledger import Attempts
from .loop import Run
from .work import Leave, Work

WAIT_SECONDS = 0.02  # how long a turn waits for a call to finish before looking around
FLUSH_SECONDS = 0.05  # settle at least this often while calls run


class Items(Protocol):
    """What a mode gives the concurrent member."""

    def read(self, count: int, block: bool) -> list[Work] | None:
        """Up to ``count`` new items ([] if something changed, None if nothing came);
        ``block``: may wait for some (nothing is in flight)."""

    def key_of(self, work: Work) -> str | None:
        """Its ordering key, if items with the same one must run one at a time, in order."""

    def call_for(self, work: Work) -> Call | None:
        """The call that runs it; None if it was settled without a call (malformed, ...);
        raises ``HandlerRefused`` if this worker may not run it (the member then refuses)."""

    def record(self, call: Call) -> None:
        """A call finished: record its outcome in the ledger."""

    def tick(self) -> None:
        """Once a turn: whatever the mode does beside running items."""

    def idle(self) -> None:
        """Nothing in flight and nothing read: wait a little."""


class Concurrently:
    def __init__(
        self, run: Run, ledger: Attempts, items: Items, flight: InFlight, timeout: float
    ) -> None:
        self.run, self.ledger, self.items, self.flight = run, ledger, items, flight
        self.timeout = timeout

    def serve(self) -> None:
        try:
            while True:
                self._turn()
        except ColdStop:  # what runs now has started: it stays ours, charged when reclaimed
            self.ledger.interrupted.update(c.item.entry_id for c in self.flight.running.values())
            raise
        finally:
            self.flight.close()

    def _turn(self) -> None:
        run, flight, s = self.run, self.flight, self.run.state
        if flight.running and (s.suspend.is_set() or s.stopping or s.fenced or self.ledger.ended):
            self._drain()
        run.check()
        self.items.tick()
        self._record(flight.collect(0))
        self._start_held()
        if flight.free and len(run.held) < flight.free:
            works = self.items.read(flight.free, not flight.running)
            if works is None and not flight.running and not run.held:
                self.items.idle()
                return
            if works:
                run.held.extend(works)
                self._start_held()
        if flight.running:
            self._record(flight.collect(WAIT_SECONDS))
        if time.monotonic() > self.ledger.last_flush + FLUSH_SECONDS:
            self.ledger.flush()

    def _start_held(self) -> None:
        """Start what is held, in order, while there is room; an item whose key is busy
        (and every later one with that key) waits."""
        run, flight, items = self.run, self.flight, self.items
        waiting: deque[Work] = deque()
        blocked: set[str] = set()
        while run.held and flight.free:
            work = run.held.popleft()
            key = items.key_of(work)
            if key is not None and (key in blocked or flight.busy(key)):
                blocked.add(key)
                waiting.append(work)
                continue
            started = self.ledger.start(work)
            if started is None:
                continue
            try:
                call = items.call_for(started)
            except HandlerRefused as exc:
                run.held.appendleft(started)  # handed back, uncharged, as the run leaves
                run.held.extendleft(reversed(waiting))
                self._drain()
                run.refuse(exc)
                raise Leave("refused") from None
            if call is not None:
                flight.start(call, self.timeout)
        flight.launch()
        run.held.extendleft(reversed(waiting))

    def _drain(self) -> None:
        """Start nothing more; wait for everything in flight and record it."""
        while self.flight.running:
            self._record(self.flight.collect(0.05))
        self.ledger.flush()

    def _record(self, calls: list[Call]) -> None:
        for call in calls:
            self.items.record(call)
