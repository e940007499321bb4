"""``/metrics`` in the Prometheus text format (0.0.4), written without a client library.

Gauges are read from Redis on every scrape (tasks by state, subtasks done / dead per task,
backlog = unread + pending per active task, workers by state, the queues each live worker is
a member of). Rebalances and the two histograms come from the tasks' history streams: each
scrape reads only the entries written since the previous one (per task, by stream id), so
they are counters of what this dashboard process has seen, as Prometheus expects of
counters (they restart with the process).

``queueworks_workers_wanted{selector=...}`` is what the leading controller publishes
(``queueworks.protocol.wanted``): what an autoscaler (``queueworks autoscale``, KEDA) scales to.

Queues are not counted as tasks: they have families of their own (``queueworks_queue_*``:
backlog, scheduled, running, jobs by outcome, nodes, and the enqueue -> start histogram that
the members keep in Redis, so it does not restart with this process).
"""

from __future__ import annotations

import bisect
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from queueworks.dashboard.queue_reader import QueueReader
from queueworks.dashboard.reader import Reader, history_entry, task_counts
from queueworks.dashboard.views import QueueSummary, TaskSummary, WorkerView
from queueworks.protocol.wanted import Wanted
from queueworks.protocol.wanted import read as read_wanted
from queueworks.transport.pools import PoolRecord

PAUSE_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
RECLAIM_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
HISTORY_BATCH = 1000


@dataclass
class Histogram:
    buckets: tuple[float, ...]
    counts: list[int] = field(default_factory=list)
    total: float = 0.0
    n: int = 0

    def __post_init__(self) -> None:
        self.counts = [0] * len(self.buckets)

    def observe(self, value: float) -> None:
        i = bisect.bisect_left(self.buckets, value)
        if i < len(self.counts):
            self.counts[i] += 1
        self.total += value
        self.n += 1

    def lines(self, name: str) -> list[str]:
        out, running = [], 0
        for le, c in zip(self.buckets, self.counts, strict=True):
            running += c
            out.append(f'{name}_bucket{{le="{_num(le)}"}} {running}')
        out.append(f'{name}_bucket{{le="+Inf"}} {self.n}')
        out.append(f"{name}_sum {_num(self.total)}")
        out.append(f"{name}_count {self.n}")
        return out


class Metrics:
    """What one dashboard process exposes; ``render`` is called once per scrape."""

    def __init__(self, reader: Reader, queues: QueueReader) -> None:
        self.reader = reader
        self.queues = queues
        self.pause = Histogram(PAUSE_BUCKETS)
        self.reclaim = Histogram(RECLAIM_BUCKETS)
        self.rebalances = 0
        self.reclaimed = 0
        self._seen: dict[str, str] = {}  # task -> last history id read
        self._lock = threading.Lock()

    def render(self) -> str:
        tasks = self.reader.tasks()
        names = self.queues.names()
        queues = self.queues.summaries(names)
        latency = self.queues.latency(names)
        hidden = set(names)
        plain = [t for t in tasks if t.id not in hidden]
        backlog = self.reader.backlog([t for t in plain if not t.finished])
        workers = self.reader.workers()
        wanted = read_wanted(self.reader.r, self.reader.keys)
        with self._lock:
            self._read_history(tasks)  # a queue's rebalances count with the tasks'
            lines = self._lines(plain, backlog, workers) + queue_lines(queues, latency)
            lines += wanted_lines(wanted)
            return "\n".join(lines) + "\n"

    def _read_history(self, tasks: Sequence[TaskSummary]) -> None:
        r = self.reader.r
        pipe = r.pipeline(transaction=False)
        for t in tasks:
            last = self._seen.get(t.id)
            pipe.xrange(
                self.reader.keys.task(t.id).history,
                min=f"({last}" if last else "-",
                count=HISTORY_BATCH,
            )
        replies = pipe.execute(raise_on_error=False)
        seen = {}
        for t, entries in zip(tasks, replies, strict=True):
            seen[t.id] = self._seen.get(t.id, "")
            if isinstance(entries, Exception):
                continue
            for entry_id, raw in entries:
                e = history_entry(entry_id, raw)
                seen[t.id] = e.id
                if e.cause != "rebalanced":
                    continue
                self.rebalances += 1
                self.reclaimed += e.reclaimed or 0
                if e.pause_ms is not None:
                    self.pause.observe(e.pause_ms / 1000)
                if e.since_change_ms is not None:
                    self.reclaim.observe(e.since_change_ms / 1000)
        self._seen = {k: v for k, v in seen.items() if v}  # forget expired tasks

    def _lines(
        self,
        tasks: Sequence[TaskSummary],
        backlog: dict[str, int],
        workers: Sequence[WorkerView],
    ) -> list[str]:
        out: list[str] = []
        fam = _Family(out)
        fam("queueworks_tasks", "gauge", "Tasks known to Redis, by state.")
        for state, n in task_counts(tasks).items():
            out.append(f'queueworks_tasks{{state="{state}"}} {n}')
        fam("queueworks_subtasks", "gauge", "Subtasks of the tasks known to Redis, by outcome.")
        for what in ("total", "done", "dead"):
            n = sum(getattr(t, what) for t in tasks)
            out.append(f'queueworks_subtasks{{state="{what}"}} {n}')
        fam("queueworks_task_subtasks", "gauge", "Subtasks of one task, by outcome.")
        for t in tasks:
            for what in ("total", "done", "dead"):
                out.append(
                    f'queueworks_task_subtasks{{task="{_label(t.id)}",state="{what}"}} '
                    f"{getattr(t, what)}"
                )
        fam("queueworks_task_backlog", "gauge", "Unread + pending subtasks of an active task.")
        for t in tasks:
            if t.id in backlog:
                out.append(f'queueworks_task_backlog{{task="{_label(t.id)}"}} {backlog[t.id]}')
        fam("queueworks_task_nodes", "gauge", "Members in the node set of an active task.")
        for t in tasks:
            if not t.finished:
                out.append(f'queueworks_task_nodes{{task="{_label(t.id)}"}} {t.nodes}')
        fam("queueworks_task_epoch", "gauge", "Membership epoch of a task.")
        for t in tasks:
            out.append(f'queueworks_task_epoch{{task="{_label(t.id)}"}} {t.epoch}')
        out += worker_lines(workers, self.reader.worker_counts(workers, self.reader.lost_workers()))
        out += pool_lines(self.reader.pools())
        fam("queueworks_controller_leader", "gauge", "1 when a controller holds the lease.")
        out.append(f"queueworks_controller_leader {1 if self.reader.leader() else 0}")
        fam("queueworks_rebalances_total", "counter", "Rebalances recorded by rank-0 members.")
        out.append(f"queueworks_rebalances_total {self.rebalances}")
        fam("queueworks_reclaimed_subtasks_total", "counter", "Entries reclaimed on rebalance.")
        out.append(f"queueworks_reclaimed_subtasks_total {self.reclaimed}")
        fam(
            "queueworks_rebalance_pause_seconds",
            "histogram",
            "How long members paused to rebalance (rank 0's pause_ms).",
        )
        out += self.pause.lines("queueworks_rebalance_pause_seconds")
        fam(
            "queueworks_reclaim_latency_seconds",
            "histogram",
            "From a membership change to the end of its rebalance and reclaim.",
        )
        out += self.reclaim.lines("queueworks_reclaim_latency_seconds")
        return out


def worker_lines(workers: Sequence[WorkerView], counts: dict[str, int]) -> list[str]:
    """Workers by state, and the queues each live worker is a member of."""
    out: list[str] = []
    fam = _Family(out)
    fam("queueworks_workers", "gauge", "Workers in the pool, by state.")
    for state, n in counts.items():
        out.append(f'queueworks_workers{{state="{state}"}} {n}')
    fam("queueworks_worker_member", "gauge", "1 for each queue a live worker is a member of.")
    for w in workers:
        if w.alive:
            for q in w.member_of:
                out.append(
                    f'queueworks_worker_member{{worker="{_label(w.id)}",queue="{_label(q)}"}} 1'
                )
    return out


def pool_lines(pools: Sequence[PoolRecord]) -> list[str]:
    """Each worker pool (``worker --processes``): members running and wanted, restarts."""
    out: list[str] = []
    fam = _Family(out)
    fam("queueworks_pool_members", "gauge", "Members a worker pool runs now.")
    for p in pools:
        out.append(f'queueworks_pool_members{{pool="{_label(p.id)}"}} {len(p.members)}')
    fam("queueworks_pool_processes", "gauge", "Members a worker pool keeps running (--processes).")
    for p in pools:
        out.append(f'queueworks_pool_processes{{pool="{_label(p.id)}"}} {p.processes}')
    fam(
        "queueworks_pool_restarts_total",
        "counter",
        "Members a worker pool started again, by why the one before ended (retired: a "
        "per-child limit; failed: it crashed, hung or was killed).",
    )
    for p in pools:
        for why, n in (("retired", p.retired), ("failed", p.failed)):
            out.append(f'queueworks_pool_restarts_total{{pool="{_label(p.id)}",why="{why}"}} {n}')
    return out


def wanted_lines(wanted: Wanted | None) -> list[str]:
    """The workers the controller wants per node selector (none while none is published)."""
    out: list[str] = []
    _Family(out)(
        "queueworks_workers_wanted",
        "gauge",
        "Workers the controller wants, per node selector (k=v,...; empty: no selector).",
    )
    for name, n in sorted((wanted.selectors if wanted else {}).items()):
        out.append(f'queueworks_workers_wanted{{selector="{_label(name)}"}} {n}')
    return out


Latency = dict[str, tuple[list[tuple[float, int]], float]]


def queue_lines(queues: Sequence[QueueSummary], latency: Latency) -> list[str]:
    """The ``queueworks_queue_*`` families."""
    out: list[str] = []
    fam = _Family(out)
    gauges = (
        (
            "backlog",
            "Jobs of a queue not started (on its stream, set aside or waiting for a group slot).",
        ),
        ("scheduled", "Delayed jobs of a queue, not due yet."),
        ("running", "Jobs of a queue that a member holds now."),
        ("nodes", "Members in the node set of a queue."),
    )
    for what, help_text in gauges:
        fam(f"queueworks_queue_{what}", "gauge", help_text)
        for q in queues:
            out.append(f'queueworks_queue_{what}{{queue="{_label(q.name)}"}} {getattr(q, what)}')
    fam("queueworks_queue_limited", "gauge", "1 while a queue's rate_limit holds it back.")
    for q in queues:
        out.append(f'queueworks_queue_limited{{queue="{_label(q.name)}"}} {int(q.limited)}')
    for what, help_text in (
        ("running", "Jobs of a group holding a slot of the queue's group_limit."),
        ("waiting", "Jobs of a group waiting for a slot of the queue's group_limit."),
    ):
        fam(f"queueworks_queue_group_{what}", "gauge", help_text)
        for q in queues:
            for group, n in getattr(q, f"groups_{what}").items():
                label = f'queue="{_label(q.name)}",group="{_label(group)}"'
                out.append(f"queueworks_queue_group_{what}{{{label}}} {n}")
    fam(
        "queueworks_queue_set_aside",
        "gauge",
        "Jobs of a queue set aside, by handler: no member that read them may run it.",
    )
    for q in queues:
        for handler, n in q.set_aside.items():
            label = f'queue="{_label(q.name)}",handler="{_label(handler)}"'
            out.append(f"queueworks_queue_set_aside{{{label}}} {n}")
    fam(
        "queueworks_queue_jobs_total",
        "counter",
        "Jobs of a queue settled, by outcome (a requeue takes a job back out of dead).",
    )
    for q in queues:
        for outcome in ("done", "dead", "rejected"):
            out.append(
                f'queueworks_queue_jobs_total{{queue="{_label(q.name)}",outcome="{outcome}"}} '
                f"{getattr(q, outcome)}"
            )
    name = "queueworks_queue_enqueue_to_start_seconds"
    fam(name, "histogram", "From a job's enqueue (or due time) to its handler's first start.")
    for q in queues:
        buckets, seconds = latency.get(q.name, ([(float("inf"), 0)], 0.0))
        label = f'queue="{_label(q.name)}"'
        for le, n in buckets:
            bound = "+Inf" if le == float("inf") else _num(le)
            out.append(f'{name}_bucket{{{label},le="{bound}"}} {n}')
        out.append(f"{name}_sum{{{label}}} {_num(seconds)}")
        out.append(f"{name}_count{{{label}}} {buckets[-1][1]}")
    return out


class _Family:
    def __init__(self, out: list[str]) -> None:
        self.out = out

    def __call__(self, name: str, kind: str, help_text: str) -> None:
        self.out.append(f"# HELP {name} {help_text}")
        self.out.append(f"# TYPE {name} {kind}")


def _label(value: Any) -> str:
    return str(value).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _num(value: float) -> str:
    return repr(float(value))
