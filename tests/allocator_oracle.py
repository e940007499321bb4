"""The allocator as it was before the board, kept as the oracle: the incremental allocator
must give the very plan this straightforward one gives, on any snapshot.

Changed since: queues are set apart and given nothing; their members (short of them, free
workers that would join) guard workers (``guards``, the rule as the allocator states it); a
task takes (``_may_take``) only workers guarded below its priority, and never a guarded one
to grow; after each priority level, a queue still short claims workers from lower tasks
(``claim``)."""

from collections.abc import Iterable
from types import MappingProxyType

from queueworks.controller.allocator import Plan, Snapshot, TaskView, WorkerView, matches


def allocate(snapshot: Snapshot) -> Plan:
    run = _Pass(snapshot)
    run.reach_mins()
    run.grow()
    assignment: dict[str, str | None] = dict.fromkeys(run.ids)
    for task, held in zip(run.order, run.held, strict=True):
        assignment.update(dict.fromkeys(held, task.id))
    return Plan(MappingProxyType(assignment))


def _rank(task: TaskView) -> tuple[int, float, str]:
    return (-task.priority, task.seq, task.id)


def guards(
    snapshot: Snapshot, held: set[str] | None = None
) -> tuple[dict[str, int], list[tuple[TaskView, list[str]]]]:
    """Worker -> the highest priority of the queues guarding it: each queue in rank order
    guards min_nodes of its live members that fit it, those already guarded first, then by
    worker id; short of members, workers no task keeps that would serve it, the same way.
    Also each queue with the workers it guards. ``held``: the workers tasks keep (None: as
    a pass keeps them)."""
    live = {w.id: w for w in snapshot.workers}
    listed = _Pass(snapshot, held_only=True).kept() if held is None else held
    out: dict[str, int] = {}
    chosen_by: list[tuple[TaskView, list[str]]] = []
    for queue in sorted((t for t in snapshot.tasks if t.queue), key=_rank):
        members = sorted(w for w in queue.nodes if w in live and matches(live[w], queue))
        chosen = ([w for w in members if w in out] + [w for w in members if w not in out])[
            : queue.min_nodes
        ]
        free = sorted(
            w for w in live if w not in listed and w not in queue.nodes and _serves(live[w], queue)
        )
        free = [w for w in free if w in out] + [w for w in free if w not in out]
        chosen += free[: queue.min_nodes - len(chosen)]
        for w in chosen:
            out[w] = max(out.get(w, queue.priority), queue.priority)
        chosen_by.append((queue, chosen))
    return out, chosen_by


def _serves(worker: WorkerView, queue: TaskView) -> bool:
    return (worker.queues is None or queue.id in worker.queues) and matches(worker, queue)


def _current_tasks(tasks: Iterable[TaskView]) -> dict[str, str]:
    """Worker -> task listing it in `nodes`; the higher-ranked task wins a double listing."""
    current: dict[str, str] = {}
    for task in sorted(tasks, key=_rank):
        for worker in task.nodes:
            current.setdefault(worker, task.id)
    return current


class _Pass:
    """Mutable state of one allocation: node sets in rank order and the free pool."""

    def __init__(self, snapshot: Snapshot, held_only: bool = False) -> None:
        if len({t.id for t in snapshot.tasks}) != len(snapshot.tasks):
            raise ValueError("duplicate task id in snapshot")
        self.order = sorted((t for t in snapshot.tasks if not t.queue), key=_rank)
        self.workers = {w.id: w for w in snapshot.workers}
        self.ids = sorted(self.workers)
        current = _current_tasks(self.order)
        self.held: list[list[str]] = []
        for task in self.order:
            mine = sorted(
                w
                for w in task.nodes
                if current[w] == task.id and w in self.workers and self._fits(w, task)
            )
            self.held.append(mine[: self._max(task)])
        self.free = set(self.ids).difference(*self.held)
        self.claimed: set[str] = set()
        self.guards: dict[str, int] = {}
        self.guarded: list[tuple[TaskView, list[str]]] = []
        if held_only:
            return
        self.guards, self.guarded = guards(snapshot, self.kept())
        self.holders = [i for i, held in enumerate(self.held) if held]
        self.short: dict[tuple[frozenset[tuple[str, str]], int, str, frozenset[str]], int] = {}

    def claim(self, queue: TaskView, chosen: list[str]) -> None:
        """A queue whose guarded workers tasks took (or that had too few) guards free
        workers that would serve it, then takes what it still lacks from lower-priority
        tasks that kept nodes (lowest, youngest first): surplus above their min, then whole."""
        idle = self.free | self.claimed
        still = [w for w in chosen if w in idle]
        for w in sorted(self.guards):
            if len(still) >= queue.min_nodes:
                break
            if w in idle and w not in still and _serves(self.workers[w], queue):
                still.append(w)
        need = queue.min_nodes - len(still)
        if need <= 0:
            return
        picks = [w for w in sorted(self.free) if w not in chosen and self._may_take(w, queue)]
        picks = picks[:need]
        taken = set(picks)
        lower = [j for j in reversed(self.holders) if self.order[j].priority < queue.priority]
        victims: dict[int, bool] = {}
        for whole in (False, True):
            for j in lower:
                if not self.held[j] or len(picks) == need:
                    continue
                room = len(self.held[j]) if whole else len(self.held[j]) - self._min(j)
                for w in reversed(self.held[j]):
                    if len(picks) == need or room <= 0:
                        break
                    if w not in taken and self._may_take(w, queue):
                        picks.append(w)
                        taken.add(w)
                        victims[j] = whole or victims.get(j, False)
                        room -= 1
        for j, whole in victims.items():
            rest = [w for w in self.held[j] if w not in taken]
            if whole:
                self.free.update(rest)
            self.held[j] = [] if whole else rest
        self.free -= taken
        self.claimed |= taken
        for w in picks:
            self.guards[w] = max(self.guards.get(w, queue.priority), queue.priority)

    def kept(self) -> set[str]:
        """The workers the tasks keep at the start of the pass."""
        return set(self.ids) - self.free

    def _fits(self, worker: str, task: TaskView) -> bool:
        return matches(self.workers[worker], task)

    def _may_take(self, worker: str, task: TaskView) -> bool:
        guard = self.guards.get(worker)
        if guard is not None and task.priority <= guard:
            return False
        return _serves(self.workers[worker], task) if task.queue else self._fits(worker, task)

    def _min(self, i: int) -> int:
        return max(1, self.order[i].min_nodes)

    def _max(self, task: TaskView) -> int:
        return len(self.workers) if task.max_nodes is None else task.max_nodes

    def _free_fits(self, task: TaskView, limit: int, growing: bool = False) -> list[str]:
        """Up to `limit` free workers `task` may take, by id; to grow, none a queue guards
        (a guarded worker is a queue's, as a task's nodes are the task's: taken only to
        reach a min, by a higher priority)."""
        found: list[str] = []
        if not self.free or limit <= 0:
            return found
        small = 4 * len(self.free) <= len(self.ids)  # then sorting beats scanning every id
        for w in sorted(self.free) if small else self.ids:
            if w in self.free and self._may_take(w, task) and not (growing and w in self.guards):
                found.append(w)
                if len(found) == limit:
                    break
        return found

    def reach_mins(self) -> None:
        """Step 2, one priority level at a time; after each level's tasks, the queues of
        that priority short of guards claim what they lack."""
        levels = sorted(
            {t.priority for t in self.order} | {q.priority for q, _ in self.guarded},
            reverse=True,
        )
        for priority in levels:
            level = [i for i, t in enumerate(self.order) if t.priority == priority]
            if level:
                self._settle_level(level[0], level[-1] + 1)
            for queue, chosen in self.guarded:
                if queue.priority == priority:
                    self.claim(queue, chosen)

    def _settle_level(self, start: int, end: int) -> None:
        """Run step 2 on one level; a task that kept nodes but fails is stripped and the level
        rerun, so older tasks of the level can use those nodes (otherwise the next pass would)."""
        level = range(start, end)
        if not any(0 < len(self.held[i]) < self._min(i) for i in level):
            for i in level:
                self._reach_min(i)
            return
        saved = ([list(h) for h in self.held], set(self.free))
        while (failed := next((i for i in level if not self._reach_min(i)), None)) is not None:
            self.held, self.free = [list(h) for h in saved[0]], set(saved[1])
            self.short.clear()
            self.free.update(self.held[failed])
            self.held[failed] = []
            saved = ([list(h) for h in self.held], set(self.free))

    def _reach_min(self, i: int) -> bool:
        """Bring task i to min_nodes or to nothing; False if it failed while holding nodes."""
        task, mine = self.order[i], self.held[i]
        need = self._min(i) - len(mine)
        if need <= 0:
            return True
        if self._min(i) > self._max(task):  # can never be satisfied
            return self._release(i)
        # Within a level (until a rerun) the free and lower nodes a (selector, priority) can use
        # only shrink, so a known shortfall stays one: many alike queued tasks cost O(1) each.
        key = (frozenset(task.selector.items()), task.priority, task.handler, task.refused)
        if self.short.get(key, need) < need:
            return self._release(i)
        picks = self._free_fits(task, need)
        victims = self._preempt(i, picks, need) if len(picks) < need else {}
        if len(picks) < need:  # picks is then everything available
            self.short[key] = len(picks)
            return self._release(i)
        taken = set(picks)
        for j, whole in victims.items():
            rest = [w for w in self.held[j] if w not in taken]
            if whole:
                self.free.update(rest)
            self.held[j] = [] if whole else rest
        self.free -= taken
        self.held[i] = sorted(mine + picks)
        return True

    def _preempt(self, i: int, picks: list[str], need: int) -> dict[int, bool]:
        """Extend `picks` from strictly lower-priority tasks (lowest, youngest first): surplus
        above their min, then whole tasks. Returns victim -> preempted whole; commits nothing."""
        task, taken = self.order[i], set(picks)
        lower = []
        for j in reversed(self.holders):  # only tasks that kept nodes can hold any now
            if j <= i or self.order[j].priority >= task.priority:
                break
            if self.held[j]:
                lower.append(j)
        victims: dict[int, bool] = {}
        for whole in (False, True):
            for j in lower:
                room = len(self.held[j]) if whole else len(self.held[j]) - self._min(j)
                for w in reversed(self.held[j]):  # highest ids first
                    if len(picks) == need or room <= 0:
                        break
                    if w not in taken and self._may_take(w, task):
                        picks.append(w)
                        taken.add(w)
                        victims[j] = whole or victims.get(j, False)
                        room -= 1
        return victims

    def _release(self, i: int) -> bool:
        """Gang failure: task i gets nothing; False if it had kept nodes."""
        mine, self.held[i] = self.held[i], []
        self.free.update(mine)
        return not mine

    def grow(self) -> None:
        """Step 4: tasks at >= min_nodes grow toward max_nodes, in rank order."""
        for i, task in enumerate(self.order):
            mine = self.held[i]
            if len(mine) >= self._min(i):
                extra = self._free_fits(task, self._max(task) - len(mine), growing=True)
                self.free.difference_update(extra)
                self.held[i] = sorted(mine + extra)
