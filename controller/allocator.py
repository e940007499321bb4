"""Allocator: a pure function from the active tasks and live workers to a `Plan`.

Tasks are ranked by (-priority, seq, id). Queues are not allocated: workers join them on
their own, and a queue's view lists its members as its nodes. The plan gives every live
worker a task (never a queue) or nothing. One pass:

0. Guard: each queue, in rank order, guards ``min_nodes`` of its live members that fit it,
   preferring workers an earlier queue guards (so queues sharing workers guard the same
   ones), then by worker id; short of members, workers no task lists that would serve it
   (they join it on their own), the same way. ``guard(w)`` is the highest priority of the
   queues guarding w.
   A task may *take* a worker w (a free one, or by preemption, in steps 2 and 4) only if
   its priority is above ``guard(w)``; it keeps the nodes it holds whatever their guard.
1. Keep: each task keeps its live nodes that still match its selector, up to ``max_nodes``
   (highest worker ids dropped first). A worker listed by two tasks stays with the
   higher-ranked.
2. Reach min (gang), in rank order: a task below min_nodes takes free matching workers (by id);
   if they are not enough it preempts strictly lower-priority tasks: their surplus above
   min_nodes first, then whole tasks, lowest priority and youngest first. It preempts only if it
   then reaches min_nodes; otherwise it gets nothing and releases what it kept. If a task that
   kept nodes fails, its priority level is decided again with those nodes free from the start.
   After each level's tasks, each queue of that priority still short of guards takes
   what it lacks from strictly lower-priority tasks as a task preempts (no gang: whatever
   it gets helps); the workers it takes are left free of tasks, to join it.
3. Fairness: step 2 runs for every task before any task grows past min_nodes.
4. Grow: in rank order, each task holding >= min_nodes grows toward ``max_nodes`` (no bound:
   every live worker) from free workers.

A worker *fits* a task when it has every label of the task's selector, its `--allow` prefixes
cover the task's handler (a queue's: one of the handlers its jobs name), and it has not
refused the task.

Deterministic (everything is sorted) and stable: allocating again on the applied plan moves
nothing. `TaskView.running` is informational; the state is derived from `nodes`.

The input is a `Snapshot` (tuples of views) or a `Board` (``controller.board``: the same views
kept between passes, indexed); both give the same plan. On a board a pass costs
O(workers + tasks holding nodes + classes of waiting tasks + tasks that start), whatever the
backlog (plus the queues' members, when a queue or a worker changed): a task without nodes
belongs to a *class* (priority, selector, handler, refusals, min_nodes), and within a
priority level the workers a class can reach (free, or held by lower priorities, and
guarded below that priority) only shrink as the level is decided, so once one task of a
class fails to reach min_nodes every younger task of that class would fail too: the pass
stops reading the class there. A task without nodes that gets none changes nothing for the
others.
"""

from __future__ import annotations

import heapq
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType

from queueworks.protocol.models import UNUSABLE, Refusal

from .board import Board
from .views import (
    FitKey,
    Snapshot,
    TaskView,
    WorkerView,
    handlers_of,
    labelled,
    matches,
    may_run,
    rank,
)

__all__ = [
    "Board",
    "Plan",
    "Snapshot",
    "TaskView",
    "WorkerView",
    "allocate",
    "labelled",
    "matches",
    "may_run",
    "rank",
    "why_queue_waits",
    "why_waiting",
]


@dataclass(frozen=True)
class Plan:
    """Every live worker id mapped to its task id (never a queue's), or None when it has
    none (free, or serving the queues it is a member of)."""

    assignment: Mapping[str, str | None]
    _nodes: Mapping[str, frozenset[str]] | None = field(default=None, repr=False, compare=False)
    # the workers whose task differs from the input (None: not known, see `changed`)
    _changed: frozenset[str] | None = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self._nodes is not None:
            return
        by_task: dict[str, set[str]] = {}
        for worker, task in self.assignment.items():
            if task is not None:
                by_task.setdefault(task, set()).add(worker)
        object.__setattr__(self, "_nodes", {t: frozenset(ws) for t, ws in by_task.items()})

    def changed(self) -> frozenset[str]:
        """The live workers whose task the plan changes (all of them if not known)."""
        return frozenset(self.assignment) if self._changed is None else self._changed

    def nodes_of(self, task_id: str) -> frozenset[str]:
        """The node set the plan gives `task_id` (empty if none)."""
        assert self._nodes is not None
        return self._nodes.get(task_id, frozenset())

    def moves(self, source: Snapshot | Board) -> dict[str, str | None]:
        """Only the workers whose task differs from the input (worker -> new task or None)."""
        current = _current_tasks(_holders(source))
        return {w: t for w, t in sorted(self.assignment.items()) if current.get(w) != t}


def allocate(source: Snapshot | Board) -> Plan:
    """Decide which live worker serves which task (see the module docstring)."""
    board = source if isinstance(source, Board) else Board.of(source)
    run = _Pass(board)
    levels = {p: (h, c) for p, h, c in board.levels()}
    for priority in sorted({*levels, *(q.priority for q, _ in run.guarded)}, reverse=True):
        if priority in levels:
            run.settle_level(priority, *levels[priority])
        for queue, chosen in run.guarded:
            if queue.priority == priority:
                run.claim(queue, chosen)
    run.grow()
    assignment: dict[str, str | None] = dict.fromkeys(run.ids)
    nodes: dict[str, frozenset[str]] = {}
    changed: set[str] = set()
    for task_id, held in run.held.items():
        if held:
            assignment.update(dict.fromkeys(held, task_id))
            nodes[task_id] = frozenset(held)
    for task in [*run.listed, *run.started]:
        changed |= nodes.get(task.id, frozenset()) ^ (task.nodes & assignment.keys())
    return Plan(MappingProxyType(assignment), nodes, frozenset(changed))


def _holders(source: Snapshot | Board) -> Sequence[TaskView]:
    if isinstance(source, Snapshot):
        return sorted((t for t in source.tasks if t.nodes and not t.queue), key=rank)
    return source.holders()


def _current_tasks(holders: Iterable[TaskView]) -> dict[str, str]:
    """Worker -> task listing it in `nodes`; the higher-ranked task wins a double listing.
    ``holders`` are in rank order."""
    current: dict[str, str] = {}
    for task in holders:
        for worker in task.nodes:
            current.setdefault(worker, task.id)
    return current


class _Pass:
    """Mutable state of one allocation: node sets and the free pool."""

    def __init__(self, board: Board) -> None:
        self.workers = board.workers
        self.ids = board.worker_ids()
        self._fit = board.fit
        self._serves = board.serves
        holders = board.holders()
        self.held: dict[str, list[str]] = {}
        if board.listed_twice():
            current = _current_tasks(holders)
            for task in holders:
                mine = [w for w in board.kept(task) if current[w] == task.id]
                self.held[task.id] = mine[: self._max(task)]
        else:
            for task in holders:
                self.held[task.id] = board.kept(task)[: self._max(task)]
        self.free = set(self.ids).difference(*self.held.values())
        # what the queues guard, and the queues short of it (their claims, step 2)
        self.guards, self.guarded = board.guards(set(self.ids) - self.free)
        self.guards = dict(self.guards)  # (claims add to it)
        self.claimed: set[str] = set()  # workers taken from tasks for queues
        self.holders = [t for t in holders if self.held[t.id]]  # kept nodes: may be preempted
        self.listed = holders  # every task that listed nodes, rank order
        self.started: list[TaskView] = []  # tasks that listed none and got some, rank order
        self.short: dict[tuple[FitKey, int], int] = {}

    def _min(self, task: TaskView) -> int:
        return max(1, task.min_nodes)

    def _max(self, task: TaskView) -> int:
        return len(self.workers) if task.max_nodes is None else task.max_nodes

    def _takes(self, w: str, task: TaskView) -> bool:
        """True if `task` may take worker `w`: it fits (a queue: it would serve it), and no
        queue guards it at the task's priority or above."""
        guard = self.guards.get(w)
        if guard is not None and task.priority <= guard:
            return False
        return self._serves(w, task) if task.queue else self._fit(w, task)

    def claim(self, queue: TaskView, chosen: Sequence[str]) -> None:
        """After the tasks of its priority: a queue whose guarded workers tasks took (or that
        had too few) guards free workers that would serve it, then takes what it still
        lacks of ``min_nodes`` from strictly lower-priority tasks, as a task preempts
        (surplus first, then whole tasks); no gang: whatever it gets helps. The workers it
        takes are left free of tasks, to join it; no lower task takes them meanwhile."""
        idle = self.free | self.claimed
        still = [w for w in chosen if w in idle]
        if len(still) < queue.min_nodes:  # share what other queues guard, as at the start
            shared = [w for w in sorted(self.guards) if w in idle and w not in still]
            still += [w for w in shared if self._serves(w, queue)][: queue.min_nodes - len(still)]
        need = queue.min_nodes - len(still)
        if need <= 0:
            return
        picks = [w for w in sorted(self.free) if w not in chosen and self._takes(w, queue)]
        picks = picks[:need]
        victims = self._preempt(queue, picks, need) if len(picks) < need else {}
        taken = self._take(picks, victims)
        self.claimed |= taken
        for w in picks:
            self.guards[w] = max(self.guards.get(w, queue.priority), queue.priority)

    def _free_fits(self, task: TaskView, limit: int, growing: bool = False) -> list[str]:
        """Up to `limit` free workers `task` may take, by id; to grow, none a queue guards
        (a guarded worker is a queue's, as a task's nodes are the task's: taken only to
        reach a min, by a higher priority)."""
        found: list[str] = []
        if not self.free or limit <= 0:
            return found
        small = 4 * len(self.free) <= len(self.ids)  # then sorting beats scanning every id
        for w in sorted(self.free) if small else self.ids:
            if w in self.free and self._takes(w, task) and not (growing and w in self.guards):
                found.append(w)
                if len(found) == limit:
                    break
        return found

    def settle_level(
        self, priority: int, holders: Sequence[TaskView], classes: Sequence[Sequence[TaskView]]
    ) -> None:
        """Step 2 on one level; a task that kept nodes but fails is stripped and the level
        rerun, so older tasks of the level can use those nodes (otherwise the next pass would)."""
        if not any(0 < len(self.held[t.id]) < self._min(t) for t in holders):
            self._run_level(holders, classes)
            return
        saved = ({k: list(v) for k, v in self.held.items()}, set(self.free), len(self.started))
        while (failed := self._run_level(holders, classes)) is not None:
            held, free, started = saved
            self.held, self.free = {k: list(v) for k, v in held.items()}, set(free)
            del self.started[started:]
            self.short.clear()
            self.free.update(self.held[failed])
            self.held[failed] = []
            saved = ({k: list(v) for k, v in self.held.items()}, set(self.free), started)

    def _run_level(
        self, holders: Sequence[TaskView], classes: Sequence[Sequence[TaskView]]
    ) -> str | None:
        """Every task of the level in rank order (tasks that listed nodes, merged with the
        classes of those that did not), until one that kept nodes fails: its id, else None.
        A class is read only up to its first task that fails."""
        sources = [iter(holders), *(iter(c) for c in classes)]
        heap: list[tuple[tuple[float, str], int, TaskView]] = []
        for n, it in enumerate(sources):
            if (first := next(it, None)) is not None:
                heap.append(((first.seq, first.id), n, first))
        heapq.heapify(heap)
        while heap:
            _, n, task = heapq.heappop(heap)
            if not self._reach_min(task):
                return task.id
            if n > 0 and not self.held.get(task.id):
                continue  # the class is done for this level
            if (nxt := next(sources[n], None)) is not None:
                heapq.heappush(heap, ((nxt.seq, nxt.id), n, nxt))
        return None

    def _reach_min(self, task: TaskView) -> bool:
        """Bring the task to min_nodes or to nothing; False if it failed while holding nodes."""
        mine = self.held.get(task.id, [])
        need = self._min(task) - len(mine)
        if need <= 0:
            return True
        if self._min(task) > self._max(task):  # can never be satisfied
            return self._release(task)
        # Within a level (until a rerun) the free and lower nodes a (fit, priority) can use
        # only shrink, so a known shortfall stays one.
        key = (task.fit_key(), task.priority)
        if self.short.get(key, need) < need:
            return self._release(task)
        picks = self._free_fits(task, need)
        victims = self._preempt(task, picks, need) if len(picks) < need else {}
        if len(picks) < need:  # picks is then everything available
            self.short[key] = len(picks)
            return self._release(task)
        self._take(picks, victims)
        self.held[task.id] = sorted(mine + picks)
        if not task.nodes:
            self.started.append(task)
        return True

    def _take(self, picks: list[str], victims: dict[str, bool]) -> set[str]:
        """Commit ``picks``: out of the free pool and of their victims' nodes (a victim
        preempted whole frees the rest of its nodes). Returns them as a set."""
        taken = set(picks)
        for j, whole in victims.items():
            rest = [w for w in self.held[j] if w not in taken]
            if whole:
                self.free.update(rest)
            self.held[j] = [] if whole else rest
        self.free -= taken
        return taken

    def _preempt(self, task: TaskView, picks: list[str], need: int) -> dict[str, bool]:
        """Extend `picks` from strictly lower-priority tasks (lowest, youngest first): surplus
        above their min, then whole tasks. Returns victim -> preempted whole; commits nothing."""
        taken = set(picks)
        lower = []
        for j in reversed(self.holders):  # only tasks that kept nodes can hold lower ones now
            if j.priority >= task.priority:
                break
            if self.held[j.id]:
                lower.append(j)
        victims: dict[str, bool] = {}
        for whole in (False, True):
            for j in lower:
                held = self.held[j.id]
                room = len(held) if whole else len(held) - self._min(j)
                for w in reversed(held):  # highest ids first
                    if len(picks) == need or room <= 0:
                        break
                    if w not in taken and self._takes(w, task):
                        picks.append(w)
                        taken.add(w)
                        victims[j.id] = whole or victims.get(j.id, False)
                        room -= 1
        return victims

    def _release(self, task: TaskView) -> bool:
        """Gang failure: the task gets nothing; False if it had kept nodes."""
        mine = self.held.pop(task.id, [])
        if task.nodes:
            self.held[task.id] = []
        self.free.update(mine)
        return not mine

    def grow(self) -> None:
        """Step 4: tasks at >= min_nodes grow toward max_nodes, in rank order. Free workers
        only go in this step, and a later task has no higher priority (a guard lets it take
        no more), so a fit that finds none free stops looking."""
        none_free: set[FitKey] = set()
        for task in heapq.merge(self.listed, self.started, key=rank):
            mine = self.held.get(task.id)
            if not mine or len(mine) < self._min(task) or not self.free:
                continue
            limit = self._max(task) - len(mine)
            if limit <= 0:
                continue
            fit = task.fit_key()
            if fit in none_free:
                continue
            extra = self._free_fits(task, limit, growing=True)
            if not extra:
                none_free.add(fit)
                continue
            self.free.difference_update(extra)
            self.held[task.id] = sorted(mine + extra)


def why_waiting(
    task: TaskView, workers: Iterable[WorkerView], refusals: Mapping[str, Refusal]
) -> tuple[str, bool]:
    """Why ``task`` could not get its ``min_nodes``, in words for people, and whether it can
    never run here: every live worker that may run it refused it as unusable (its handler
    failed to import there). ``refusals``: worker -> its refusal of this task."""
    reason, allowing = _unfit(task, workers)
    if reason:
        return reason, False
    eligible = [w for w in allowing if w.id not in refusals]
    need = max(1, task.min_nodes)
    if len(eligible) >= need:
        return f"waiting for {need} free worker(s) of the {len(eligible)} that may run it", False
    if eligible:
        return f"needs {need} workers at once (min_nodes); {len(eligible)} may run it", False
    told = "; ".join(f"{w.id}: {refusals[w.id].reason}" for w in allowing[:3])
    # a task fails when its one handler is unusable everywhere; a queue never (its jobs'
    # handlers are their own: one that cannot be imported is that job's dead letter)
    unusable = bool(task.handler) and all(refusals[w.id].kind == UNUSABLE for w in allowing)
    return f"every worker that may run it refused it ({told})", unusable


def why_queue_waits(queue: TaskView, workers: Iterable[WorkerView], busy: Collection[str]) -> str:
    """Why ``queue`` has no live member, in words for people (a queue never fails for
    want of one). ``busy``: the workers running a task (they left their queues for it)."""
    reason, allowing = _unfit(queue, workers)
    if reason:
        return reason
    serving = [w for w in allowing if w.queues is None or queue.id in w.queues]
    if not serving:
        return "no live worker that may serve it lists it in its --queues"
    idle = [w for w in serving if w.id not in busy]
    if not idle:
        return "every worker that may serve it is running a task"
    return f"waiting for one of the {len(idle)} idle worker(s) that may serve it to join"


def _unfit(task: TaskView, workers: Iterable[WorkerView]) -> tuple[str, list[WorkerView]]:
    """Why no live worker fits ``task`` by its labels and ``--allow`` prefixes ("" if some
    do), and the live workers that do."""
    live = list(workers)
    if not live:
        return "no live worker", []
    fitting = [w for w in live if labelled(w, task)]
    if not fitting:
        wanted = ",".join(f"{k}={v}" for k, v in sorted(task.selector.items()))
        return f"no live worker has the labels {wanted}", []
    allowing = [w for w in fitting if may_run(w, task)]
    if not allowing:
        prefixes = sorted({p for w in fitting for p in (w.allow or ())})
        names = handlers_of(task)
        wanted = repr(names[0]) if len(names) == 1 else "any of " + ", ".join(map(repr, names))
        return (
            f"no live worker may run {wanted}: their --allow prefixes are "
            f"{', '.join(prefixes) or 'none'}"
        ), []
    return "", allowing
