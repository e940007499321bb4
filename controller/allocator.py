"""Allocator: a pure function from a `Snapshot` of tasks and live workers to a `Plan`.

Tasks are ranked by (-priority, seq, id). One pass:

1. Keep: each task keeps its live nodes that still match its selector, up to max_nodes
   (highest worker ids dropped first). A worker listed by two tasks stays with the higher-ranked.
2. Reach min (gang), in rank order: a task below min_nodes takes free matching workers (by id);
   if they are not enough it preempts strictly lower-priority tasks: their surplus above
   min_nodes first, then whole tasks, lowest priority and youngest first. It preempts only if it
   then reaches min_nodes; otherwise it gets nothing and releases what it kept. If a task that
   kept nodes fails, its priority level is decided again with those nodes free from the start.
3. Fairness: step 2 runs for every task before any task grows past min_nodes.
4. Grow: in rank order, each task holding >= min_nodes grows toward max_nodes from free workers.

A worker *fits* a task when it has every label of the task's selector, its `--allow`
prefixes cover the task's handler, and it has not refused the task.

Deterministic (everything is sorted) and stable: allocating again on the applied plan moves
nothing. `TaskView.running` is informational; the state is derived from `nodes`.
"""

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from queueworks.allow import covers
from queueworks.models import UNUSABLE, Refusal


@dataclass(frozen=True)
class TaskView:
    """An active task as the allocator sees it."""

    id: str
    priority: int  # higher number = more important
    min_nodes: int  # >= 1
    max_nodes: int | None  # None = no upper bound
    seq: float  # submission order (smaller = older); ties broken by id
    selector: Mapping[str, str] = field(default_factory=dict)
    nodes: frozenset[str] = frozenset()
    running: bool = False
    handler: str = ""  # "module:function"; "" = any worker may run it
    refused: frozenset[str] = frozenset()  # workers that said they cannot run its handler
    handlers: tuple[str, ...] = ()  # a queue's: the handlers its jobs name (all must fit)
    want: int | None = None  # a queue's demand now: grow no further (None: max_nodes)


@dataclass(frozen=True)
class WorkerView:
    """A live worker and its labels."""

    id: str
    labels: Mapping[str, str] = field(default_factory=dict)
    allow: tuple[str, ...] | None = None  # its --allow prefixes; None = not known (any)


@dataclass(frozen=True)
class Snapshot:
    """Active tasks (queued / running / waiting) and live workers."""

    tasks: tuple[TaskView, ...]
    workers: tuple[WorkerView, ...]


@dataclass(frozen=True)
class Plan:
    """Every live worker id mapped to its task id, or None when idle."""

    assignment: Mapping[str, str | None]
    _nodes: Mapping[str, frozenset[str]] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        by_task: dict[str, set[str]] = {}
        for worker, task in self.assignment.items():
            if task is not None:
                by_task.setdefault(task, set()).add(worker)
        object.__setattr__(self, "_nodes", {t: frozenset(ws) for t, ws in by_task.items()})

    def nodes_of(self, task_id: str) -> frozenset[str]:
        """The node set the plan gives `task_id` (empty if none)."""
        return self._nodes.get(task_id, frozenset())

    def moves(self, snapshot: Snapshot) -> dict[str, str | None]:
        """Only the workers whose task differs from the snapshot (worker -> new task or None)."""
        current = _current_tasks(snapshot.tasks)
        return {w: t for w, t in sorted(self.assignment.items()) if current.get(w) != t}


def labelled(worker: WorkerView, task: TaskView) -> bool:
    """True if the worker has every label of the task's selector."""
    return all(worker.labels.get(key) == value for key, value in task.selector.items())


def handlers_of(task: TaskView) -> tuple[str, ...]:
    return (task.handler, *task.handlers) if task.handler else task.handlers


def may_run(worker: WorkerView, task: TaskView) -> bool:
    """True if the worker's --allow prefixes cover the task's handler(s)."""
    allow = worker.allow
    return allow is None or all(covers(allow, h) for h in handlers_of(task))


def matches(worker: WorkerView, task: TaskView) -> bool:
    """True if the worker fits the task (see the module docstring)."""
    return labelled(worker, task) and may_run(worker, task) and worker.id not in task.refused


def allocate(snapshot: Snapshot) -> Plan:
    """Decide which live worker serves which task (see the module docstring)."""
    run = _Pass(snapshot)
    run.reach_mins()
    run.grow()
    assignment: dict[str, str | None] = dict.fromkeys(run.ids)
    for task, held in zip(run.order, run.held, strict=True):
        assignment.update(dict.fromkeys(held, task.id))
    return Plan(MappingProxyType(assignment))


def _rank(task: TaskView) -> tuple[int, float, str]:
    return (-task.priority, task.seq, task.id)


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
        self.order = sorted(snapshot.tasks, key=_rank)
        if len({t.id for t in self.order}) != len(self.order):
            raise ValueError("duplicate task id in snapshot")
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
        self.short: dict[
            tuple[frozenset[tuple[str, str]], int, tuple[str, ...], frozenset[str]], int
        ] = {}

    def _fits(self, worker: str, task: TaskView) -> bool:
        return matches(self.workers[worker], task)

    def _min(self, i: int) -> int:
        return max(1, self.order[i].min_nodes)

    def _max(self, task: TaskView) -> int:
        most = len(self.workers) if task.max_nodes is None else task.max_nodes
        if task.want is not None:  # a queue that asks for fewer now (never below min_nodes)
            most = min(most, max(task.want, task.min_nodes))
        return most

    def _free_fits(self, task: TaskView, limit: int) -> list[str]:
        """Up to `limit` free workers matching `task`, by id."""
        found: list[str] = []
        if not self.free or limit <= 0:
            return found
        small = 4 * len(self.free) <= len(self.ids)  # then sorting beats scanning every id
        for w in sorted(self.free) if small else self.ids:
            if w in self.free and self._fits(w, task):
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
        key = (frozenset(task.selector.items()), task.priority, handlers_of(task), task.refused)
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
                    if w not in taken and self._fits(w, task):
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


def why_waiting(
    task: TaskView, workers: Iterable[WorkerView], refusals: Mapping[str, Refusal]
) -> tuple[str, bool]:
    """Why ``task`` could not get its ``min_nodes``, in words for people, and whether it can
    never run here: every live worker that may run it refused it as unusable (its handler
    failed to import there). ``refusals``: worker -> its refusal of this task."""
    live = list(workers)
    if not live:
        return "no live worker", False
    fitting = [w for w in live if labelled(w, task)]
    if not fitting:
        wanted = ",".join(f"{k}={v}" for k, v in sorted(task.selector.items()))
        return f"no live worker has the labels {wanted}", False
    allowing = [w for w in fitting if may_run(w, task)]
    if not allowing:
        prefixes = sorted({p for w in fitting for p in (w.allow or ())})
        wanted = " and ".join(repr(h) for h in handlers_of(task))
        return (
            f"no live worker may run {wanted}: their --allow prefixes are "
            f"{', '.join(prefixes) or 'none'}"
        ), False
    eligible = [w for w in allowing if w.id not in refusals]
    need = max(1, task.min_nodes)
    if len(eligible) >= need:
        return f"waiting for {need} free worker(s) of the {len(eligible)} that may run it", False
    if eligible:
        return f"needs {need} workers at once (min_nodes); {len(eligible)} may run it", False
    told = "; ".join(f"{w.id}: {refusals[w.id].reason}" for w in allowing[:3])
    unusable = all(refusals[w.id].kind == UNUSABLE for w in allowing)
    return f"every worker that may run it refused it ({told})", unusable
