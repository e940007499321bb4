"""What the allocator sees: an active task, a live worker, a snapshot of both, and the rule
of which worker fits which task (``controller.allocator`` says how they are used).

A queue's view lists its members as ``nodes``: workers join queues on their own, the
allocator only reads them (they guard workers against lower-priority tasks)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from queueworks.protocol.allow import covers

FitKey = tuple[tuple[tuple[str, str], ...], tuple[str, ...], frozenset[str]]


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
    handlers: tuple[str, ...] = ()  # a queue's: the handlers its jobs name (one must fit)
    queue: bool = False  # a queue: its nodes are its members, never given by the allocator
    _fit: FitKey = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        fit = (tuple(sorted(self.selector.items())), handlers_of(self), self.refused)
        object.__setattr__(self, "_fit", fit)

    def fit_key(self) -> FitKey:
        """Everything about the task that decides which workers fit it."""
        return self._fit


@dataclass(frozen=True)
class WorkerView:
    """A live worker and its labels."""

    id: str
    labels: Mapping[str, str] = field(default_factory=dict)
    allow: tuple[str, ...] | None = None  # its --allow prefixes; None = not known (any)
    queues: tuple[str, ...] | None = None  # its --queues filter; None = every queue


@dataclass(frozen=True)
class Snapshot:
    """Active tasks (queued / running / waiting) and live workers."""

    tasks: tuple[TaskView, ...]
    workers: tuple[WorkerView, ...]


def rank(task: TaskView) -> tuple[int, float, str]:
    return (-task.priority, task.seq, task.id)


def labelled(worker: WorkerView, task: TaskView) -> bool:
    """True if the worker has every label of the task's selector."""
    return all(worker.labels.get(key) == value for key, value in task.selector.items())


def handlers_of(task: TaskView) -> tuple[str, ...]:
    """Every handler the task's work names: its own, and a queue's jobs' ones."""
    return (task.handler, *task.handlers) if task.handler else task.handlers


def may_run(worker: WorkerView, task: TaskView) -> bool:
    """True if the worker's --allow prefixes cover the task's handler; for a queue (each
    job names its own), one of the handlers its jobs name, or any if they name none yet:
    a job no member may run waits alone, it does not keep the queue from its nodes."""
    allow = worker.allow
    if allow is None:
        return True
    if task.handler:
        return covers(allow, task.handler) and all(covers(allow, h) for h in task.handlers)
    return not task.handlers or any(covers(allow, h) for h in task.handlers)


def matches(worker: WorkerView, task: TaskView) -> bool:
    """True if the worker fits the task (see the module docstring)."""
    return labelled(worker, task) and may_run(worker, task) and worker.id not in task.refused
