"""The allocator as it was before the board, kept as the oracle: the incremental allocator
must give the very plan this straightforward one gives, on any snapshot.

Changed since: queues are set apart and given nothing; their members guard workers
(``guards``, the rule as the allocator states it), and a task takes (``_may_take``) only
workers guarded below its priority."""

from collections.abc import Iterable
from types import MappingProxyType

from queueworks.controller.allocator import Plan, Snapshot, TaskView, matches


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


def guards(snapshot: Snapshot) -> dict[str, int]:
    """Worker -> the highest priority of the queues guarding it: each queue in rank order
    guards min_nodes of its live members that fit it, those already guarded first, then by
    worker id."""
    live = {w.id: w for w in snapshot.workers}
    out: dict[str, int] = {}
    for queue in sorted((t for t in snapshot.tasks if t.queue), key=_rank):
        members = sorted(w for w in queue.nodes if w in live and matches(live[w], queue))
        first = [w for w in members if w in out] + [w for w in members if w not in out]
        for w in first[: queue.min_nodes]:
            out[w] = max(out.get(w, queue.priority), queue.priority)
    return out


def _current_tasks(tasks: Iterable[TaskView]) -> dict[str, str]:
    """Worker -> task listing it in `nodes`; the higher-ranked task wins a double listing."""
    current: dict[str, str] = {}
    for task in sorted(tasks, key=_rank):
        for worker in task.nodes:
            current.setdefault(worker, task.id)
    return current


class _Pass:
    """Mutable state of one allocation: node sets in rank order and the free pool."""

    def __init__(self, snapshot: Snapshot) -> None:
        if len({t.id for t in snapshot.tasks}) != len(snapshot.tasks):
            raise ValueError("duplicate task id in snapshot")
        self.order = sorted((t for t in snapshot.tasks if not t.queue), key=_rank)
        self.guards = guards(snapshot)
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
        self.holders = [i for i, held in enumerate(self.held) if held]
        self.short: dict[tuple[frozenset[tuple[str, str]], int, str, frozenset[str]], int] = {}

    def _fits(self, worker: str, task: TaskView) -> bool:
        return matches(self.workers[worker], task)

    def _may_take(self, worker: str, task: TaskView) -> bool:
        guard = self.guards.get(worker)
        return self._fits(worker, task) and (guard is None or task.priority > guard)

    def _min(self, i: int) -> int:
        return max(1, self.order[i].min_nodes)

    def _max(self, task: TaskView) -> int:
        return len(self.workers) if task.max_nodes is None else task.max_nodes

    def _free_fits(self, task: TaskView, limit: int) -> list[str]:
        """Up to `limit` free workers `task` may take, by id."""
        found: list[str] = []
        if not self.free or limit <= 0:
            return found
        small = 4 * len(self.free) <= len(self.ids)  # then sorting beats scanning every id
        for w in sorted(self.free) if small else self.ids:
            if w in self.free and self._may_take(w, task):
                found.append(w)
                if len(found) == limit:
                    break
        return found

    def reach_mins(self) -> None:
        """Step 2, one priority level at a time."""
        start = 0
        while start < len(self.order):
            end = start
            while end < len(self.order) and self.order[end].priority == self.order[start].priority:
                end += 1
            self._settle_level(start, end)
            start = end

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
                extra = self._free_fits(task, self._max(task) - len(mine))
                self.free.difference_update(extra)
                self.held[i] = sorted(mine + extra)
