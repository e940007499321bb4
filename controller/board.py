"""The allocator's input kept between passes: the active tasks and live workers, indexed.

The controller puts and drops views as events name them; ``allocate(board)`` reads it. The
indexes make a pass cost what can change, not the backlog (see ``controller.allocator``):

- the tasks that list nodes, in rank order;
- the tasks that list none, by priority and class (selector, handler, refusals, min_nodes),
  each class in (seq, id) order;
- the live worker ids, sorted;
- for each task that lists nodes, those that are live and fit it (what it may keep), and
  whether any worker is listed by two tasks;
- a memo of which worker fits which task's fit (labels, allow prefixes, refusals): a cache
  of ``matches``, dropped for a worker when its view changes. It never changes a result;
- the queues, in rank order, apart from the tasks: they hold no nodes; their members guard
  workers (``guards``).

``Board.of(snapshot)`` builds one from a snapshot; a board updated view by view equals the
board built from the same views at once (``tests/test_allocator.py`` checks it).
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Collection
from typing import Any

from .views import FitKey, Snapshot, TaskView, WorkerView, matches, rank

ClassKey = tuple[FitKey, int]
Guarded = tuple[TaskView, list[str]]  # a queue and the workers it guards
MEMO_LIMIT = 200_000  # (worker, fit) pairs remembered before the memo starts over


def _seq_key(task: TaskView) -> tuple[float, str]:
    return (task.seq, task.id)


class Board:
    """Views by id plus the indexes the allocator reads (see the module docstring)."""

    def __init__(self) -> None:
        self.tasks: dict[str, TaskView] = {}
        self.workers: dict[str, WorkerView] = {}
        self._ids: list[str] | None = []
        self._holders: list[TaskView] = []  # tasks that list nodes, by rank
        self._waiting: dict[int, dict[ClassKey, list[TaskView]]] = {}  # priority -> class ->
        self._memo: dict[str, dict[FitKey, bool]] = {}
        self._memo_size = 0
        self._listing: dict[str, set[str]] = {}  # worker -> tasks that list it
        self._twice = 0  # workers listed by more than one task
        self._kept: dict[str, list[str]] = {}  # task -> its live, fitting nodes, sorted
        self._queues: list[TaskView] = []  # by rank
        self.version = 0  # bumped on every change

    @classmethod
    def of(cls, snapshot: Snapshot) -> Board:
        board = cls()
        for worker in snapshot.workers:
            board.put_worker(worker)
        for task in snapshot.tasks:
            if task.id in board.tasks:
                raise ValueError("duplicate task id in snapshot")
            board.put_task(task)
        return board

    # -- updates --------------------------------------------------------------------------

    def put_task(self, view: TaskView) -> None:
        """Add or replace a task's view."""
        old = self.tasks.get(view.id)
        if old == view:
            return
        self.version += 1
        if old is not None:
            self._unindex(old)
        self.tasks[view.id] = view
        if view.queue:
            bisect.insort(self._queues, view, key=rank)
        elif view.nodes:
            bisect.insort(self._holders, view, key=rank)
            for w in view.nodes:
                listing = self._listing.setdefault(w, set())
                listing.add(view.id)
                self._twice += len(listing) == 2
        else:
            level = self._waiting.setdefault(view.priority, {})
            bisect.insort(level.setdefault(_class_key(view), []), view, key=_seq_key)

    def drop_task(self, task_id: str) -> None:
        old = self.tasks.pop(task_id, None)
        if old is not None:
            self.version += 1
            self._unindex(old)

    def put_worker(self, view: WorkerView) -> None:
        old = self.workers.get(view.id)
        if old == view:
            return
        self.version += 1
        if old is None:
            self._ids = None
        self._forget(view.id)
        self.workers[view.id] = view

    def drop_worker(self, worker_id: str) -> None:
        if self.workers.pop(worker_id, None) is not None:
            self.version += 1
            self._ids = None
            self._forget(worker_id)

    def _unindex(self, view: TaskView) -> None:
        if view.queue:
            _remove(self._queues, view, rank)
            return
        if view.nodes:
            _remove(self._holders, view, rank)
            self._kept.pop(view.id, None)
            for w in view.nodes:
                listing = self._listing[w]
                self._twice -= len(listing) == 2
                listing.discard(view.id)
                if not listing:
                    del self._listing[w]
            return
        level = self._waiting[view.priority]
        key = _class_key(view)
        members = level[key]
        _remove(members, view, _seq_key)
        if not members:
            del level[key]
            if not level:
                del self._waiting[view.priority]

    def _forget(self, worker_id: str) -> None:
        self._memo_size -= len(self._memo.pop(worker_id, {}))
        for tid in self._listing.get(worker_id, ()):
            self._kept.pop(tid, None)

    # -- what the allocator reads ---------------------------------------------------------

    def worker_ids(self) -> list[str]:
        if self._ids is None:
            self._ids = sorted(self.workers)
        return self._ids

    def holders(self) -> list[TaskView]:
        """The tasks that list nodes, in rank order."""
        return self._holders

    def kept(self, task: TaskView) -> list[str]:
        """The task's listed nodes that are live and fit it, sorted (remembered)."""
        found = self._kept.get(task.id)
        if found is None:
            live = self.workers
            found = sorted(w for w in task.nodes if w in live and self.fit(w, task))
            self._kept[task.id] = found
        return found

    def listed_twice(self) -> bool:
        """True if some worker is listed by two tasks."""
        return self._twice > 0

    def levels(self) -> list[tuple[int, list[TaskView], list[list[TaskView]]]]:
        """(priority, its tasks that list nodes in rank order, its classes of tasks that list
        none), highest priority first."""
        holders: dict[int, list[TaskView]] = {}
        for task in self._holders:
            holders.setdefault(task.priority, []).append(task)
        priorities = sorted(set(holders) | set(self._waiting), reverse=True)
        return [
            (p, holders.get(p, []), list(self._waiting.get(p, {}).values())) for p in priorities
        ]

    def waiting(self) -> int:
        """How many tasks (not queues) list no nodes."""
        return len(self.tasks) - len(self._holders) - len(self._queues)

    def guards(self, held: Collection[str] = ()) -> tuple[dict[str, int], list[Guarded]]:
        """Worker -> the highest priority of the queues guarding it (workers no queue
        guards are not listed), and each queue (rank order) with the workers it guards:
        each queue in rank order guards ``min_nodes`` of its live members
        that fit it, those an earlier queue guards first, then by id; short of members,
        workers not ``held`` by a task that would serve it (they join it on their own), the
        same way."""
        guards: dict[str, int] = {}
        chosen_by: list[Guarded] = []
        for queue in self._queues:
            members = [w for w in queue.nodes if w in self.workers and self.fit(w, queue)]
            chosen = sorted(members, key=lambda w: (w not in guards, w))[: queue.min_nodes]
            if len(chosen) < queue.min_nodes:
                free = [
                    w
                    for w in self.worker_ids()
                    if w not in held and w not in queue.nodes and self.serves(w, queue)
                ]
                free.sort(key=lambda w: (w not in guards, w))
                chosen += free[: queue.min_nodes - len(chosen)]
            for w in chosen:
                guards.setdefault(w, queue.priority)  # rank order: the highest first
            chosen_by.append((queue, chosen))
        return guards, chosen_by

    def serves(self, worker_id: str, queue: TaskView) -> bool:
        """True if the worker fits the queue and its --queues (if any) name it."""
        only = self.workers[worker_id].queues
        return (only is None or queue.id in only) and self.fit(worker_id, queue)

    def fit(self, worker_id: str, task: TaskView) -> bool:
        """``matches(worker, task)``, remembered per (worker, fit of the task)."""
        mine = self._memo.get(worker_id)
        if mine is None:
            mine = self._memo[worker_id] = {}
        key = task.fit_key()
        found = mine.get(key)
        if found is None:
            if self._memo_size >= MEMO_LIMIT:
                self._memo.clear()
                self._memo_size = 0
                mine = self._memo[worker_id] = {}
            found = mine[key] = matches(self.workers[worker_id], task)
            self._memo_size += 1
        return found


def _class_key(task: TaskView) -> ClassKey:
    return (task.fit_key(), max(1, task.min_nodes))


def _remove(items: list[TaskView], view: TaskView, key: Callable[[TaskView], Any]) -> None:
    """Remove ``view`` (by id) from ``items``, sorted by ``key``."""
    at = bisect.bisect_left(items, key(view), key=key)
    while at < len(items) and items[at].id != view.id:
        at += 1
    if at == len(items):
        raise KeyError(view.id)
    del items[at]
