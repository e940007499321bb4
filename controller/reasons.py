"""Why a task waits, kept true in its record's ``reason`` at a bounded cost per pass.

A reason depends on the task's selector, handler(s), min_nodes and live refusals, and on the
live workers; so it is computed once per such *kind* of task while the pool is unchanged
(``why_waiting`` is O(workers)), and compared with what the record says. A task is checked
when a pass touches it (read again, or its node set changes); when the pool changes, every
other task is checked again too, ``PER_PASS`` of them a pass, in rounds.

A queue without a member says why (``why_queue_waits``): that also depends on which workers
the plan gives a task, so it is computed each time (O(workers); there are few queues).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Collection
from typing import Any

from .allocator import TaskView, WorkerView, why_queue_waits, why_waiting
from .mirror import Mirror

PER_PASS = 500  # tasks whose reason a pass checks because the pool changed


class Reasons:
    def __init__(self) -> None:
        self._cache: dict[Any, tuple[str, bool]] = {}
        self._cache_pool = -1
        self._workers: list[WorkerView] = []
        self._checked: dict[str, int] = {}  # task -> pool version its reason was checked at
        self._round: deque[str] = deque()
        self._round_pool = -1

    def explain(self, mirror: Mirror, view: TaskView) -> tuple[str, bool]:
        """``why_waiting`` for this task, as of the current pool."""
        if self._cache_pool != mirror.pool:
            self._cache.clear()
            self._cache_pool = mirror.pool
            self._workers = list(mirror.board.workers.values())
        refusals = mirror.refusals_of(view.id)
        key = (
            tuple(sorted(view.selector.items())),
            view.handler,
            view.handlers,
            view.min_nodes,
            frozenset((w, r.kind, r.reason) for w, r in refusals.items()),
        )
        found = self._cache.get(key)
        if found is None:
            found = self._cache[key] = why_waiting(view, self._workers, refusals)
        self._checked[view.id] = mirror.pool
        return found

    def explain_queue(self, mirror: Mirror, view: TaskView, busy: Collection[str]) -> str:
        """``why_queue_waits`` for this queue; ``busy``: the workers the plan gives a task."""
        self._checked[view.id] = mirror.pool
        return why_queue_waits(view, mirror.board.workers.values(), busy)

    def forget(self, task_id: str) -> None:
        self._checked.pop(task_id, None)

    def due(self, mirror: Mirror) -> list[str]:
        """Up to ``PER_PASS`` tasks not checked since the pool last changed."""
        if not self._round and self._round_pool != mirror.pool:
            self._round = deque(mirror.tasks)
            self._round_pool = mirror.pool
        out: list[str] = []
        while self._round and len(out) < PER_PASS:
            tid = self._round.popleft()
            if tid in mirror.tasks and self._checked.get(tid, -1) != mirror.pool:
                out.append(tid)
        return out

    def pending(self) -> bool:
        return bool(self._round)
