"""Wanted workers: a pure function from the demand of every active task and queue to the
workers each node selector needs (``queueworks.protocol.wanted`` is the published value).

One task or queue with work wants:

- at least ``max(1, min_nodes)`` (a task's gang; a queue's members);
- as many more as its work needs to drain within ``target_s`` at the rate one of its
  workers was measured to finish it (unknown until it ran: the floor alone), never more
  workers than items of work, nor more than ``max_nodes`` (a partitioned task: more than
  its partitions);
- nothing when it has no work (a queue with an empty stream, nothing running and nothing
  due; a task with every subtask settled): an idle deployment wants zero workers. An idle
  queue still counts its ``min_nodes`` beside a task it guards members from (a task of
  its priority or lower, of the same selector), since those workers are not the task's.

Tasks take workers whole, so a selector's tasks add up. Queues share their workers (a
worker serves every queue it may at once), so a selector's queues want the largest of
their floors or the sum of what their work needs to drain (fractions of workers), whichever
is more.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

EPSILON = 1e-9  # a sum of fractions that is a whole number by a rounding error


@dataclass(frozen=True)
class Need:
    """What one active task or queue asks of the pool."""

    id: str
    selector: str  # its selector's name (``queueworks.protocol.wanted.selector_name``)
    queue: bool
    min_nodes: int
    max_nodes: int | None
    work: int | None  # items not done: subtasks unsettled; a queue's entries, running and due
    per_worker: float | None = None  # items one worker finishes per second (None: unknown)
    partitions: int = 0
    priority: int = 0


def floor_of(need: Need) -> int:
    """The workers it wants whatever its rate: its gang, or a queue's members (0: no work)."""
    return 0 if need.work == 0 else max(1, need.min_nodes)


def drain_of(need: Need, target_s: float) -> float:
    """The workers its work needs to drain within ``target_s`` at the measured rate (0 when
    the rate is not known), never more than its items nor than ``max_nodes``."""
    if not need.work or not need.per_worker:
        return 0.0
    drain = min(need.work / (need.per_worker * target_s), float(need.work))
    cap = math.inf if need.max_nodes is None else float(max(need.max_nodes, 1))
    if need.partitions:
        cap = min(cap, float(need.partitions))
    return min(drain, max(cap, float(need.min_nodes)))


def workers_for(need: Need, target_s: float) -> int:
    """The workers one task or queue wants, alone."""
    return max(floor_of(need), math.ceil(drain_of(need, target_s) - EPSILON))


def wanted(needs: Iterable[Need], target_s: float) -> dict[str, int]:
    """Selector name -> workers wanted (every selector some task or queue names)."""
    needs = list(needs)
    tasks: dict[str, int] = {}
    lowest: dict[str, int] = {}  # the lowest priority of a selector's tasks with work
    for need in needs:
        if not need.queue:
            tasks[need.selector] = tasks.get(need.selector, 0) + workers_for(need, target_s)
            if need.work != 0:
                lowest[need.selector] = min(lowest.get(need.selector, need.priority), need.priority)
    queue_sum: dict[str, float] = {}
    queue_floor: dict[str, int] = {}
    for need in (n for n in needs if n.queue):
        name = need.selector
        floor = floor_of(need)
        if not floor and name in lowest and lowest[name] <= need.priority:
            floor = need.min_nodes  # idle, but it guards members from those tasks
        queue_sum[name] = queue_sum.get(name, 0.0) + drain_of(need, target_s)
        queue_floor[name] = max(queue_floor.get(name, 0), floor)
    out = dict.fromkeys({*tasks, *queue_sum}, 0)
    for name in out:
        shared = max(queue_floor.get(name, 0), math.ceil(queue_sum.get(name, 0.0) - EPSILON))
        out[name] = tasks.get(name, 0) + shared
    return out
