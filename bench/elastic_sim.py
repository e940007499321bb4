"""Elastic vs static, measured: a discrete-event simulation that drives the real allocator.

    python -m bench.elastic_sim                      # 200 tasks, seeds 1..5, pause 0.2 s
    python -m bench.elastic_sim --seed 7 --seeds 1 --tasks 500 --pause 1.0

A seeded trace of task arrivals (priority, work, min/max nodes) and worker joins/leaves is
replayed, with no Redis and no processes, against three policies:

- ``elastic``: ``controller.allocator.allocate`` (the controller's own pure function) re-run at
  every event (arrival, completion, join, leave); its plan is applied at once.
- ``static``: every task gets a fixed node count = its ``min_nodes``; strict FIFO by priority
  then age (the head of the queue blocks the rest); no preemption, no growth. A task that loses
  a node keeps the rest and waits for a replacement (free nodes go to it first, in queue order).
- ``static-backfill``: the same, but a task that does not fit is skipped, so later tasks that
  fit start (kinder to utilization, harsher to big high-priority tasks).

Model (docs/elastic_sim.md): a task needs ``work`` node-seconds; holding n nodes with
min_nodes <= n it progresses at rate n (perfectly parallel up to max_nodes); each change of its
node set after which it runs costs it ``pause`` seconds of no progress (both policies pay it:
start, growth, shrink, replacement); progress survives preemption (done subtasks stay done).
Deterministic for a seed: everything is sorted, both random streams are seeded by name.
"""

from __future__ import annotations

import argparse
import math
import random
import statistics
import sys
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, fields, replace

from queueworks.controller.allocator import Snapshot, TaskView, WorkerView, allocate

POLICIES = ("elastic", "static", "static-backfill")
HIGH_PRIORITY = 10
EPS = 1e-9  # relative: a task whose remaining work is below EPS * work is done


# --- the trace ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class TraceTask:
    id: str
    arrival: float  # seconds from the start
    work: float  # node-seconds
    min_nodes: int
    max_nodes: int
    priority: int


@dataclass(frozen=True)
class PoolEvent:
    time: float
    worker: str
    joins: bool  # False: the worker leaves (its task loses that node)


@dataclass(frozen=True)
class TraceParams:
    seed: int = 1
    tasks: int = 200
    workers: int = 8  # initial pool; also the capacity the load is computed against
    min_pool: int = 4  # the pool random walk stays in [min_pool, max_pool]
    max_pool: int = 12
    churn_every: float = 30.0  # mean seconds between pool changes (Poisson)
    load: float = 0.8  # offered node-seconds per second / workers (Poisson arrivals)
    high_share: float = 0.2  # share of tasks with priority HIGH_PRIORITY (others 0)
    mean_duration: float = 60.0  # mean seconds at min_nodes (lognormal)
    duration_sigma: float = 1.0  # sigma of the underlying normal
    min_nodes: tuple[tuple[int, float], ...] = ((1, 0.5), (2, 0.3), (4, 0.2))  # (value, weight)
    max_factor: tuple[int, ...] = (1, 2, 4)  # max_nodes = min_nodes * one of these (uniform) ...
    max_cap: int = 8  # ... capped here

    def mean_work(self) -> float:
        total = sum(w for _, w in self.min_nodes)
        return self.mean_duration * sum(n * w for n, w in self.min_nodes) / total

    def arrival_rate(self) -> float:
        return self.load * self.workers / self.mean_work()


@dataclass(frozen=True)
class Trace:
    params: TraceParams
    tasks: tuple[TraceTask, ...]  # by arrival
    workers: tuple[str, ...]  # the pool at t = 0
    pool: tuple[PoolEvent, ...]  # by time; after the last one the pool stays as it is


def make_trace(params: TraceParams) -> Trace:
    """Poisson arrivals of lognormal work; a reflecting random walk of the pool size."""
    if max(n for n, _ in params.min_nodes) > params.min_pool:
        raise ValueError("min_nodes above min_pool could wait forever")
    rng = random.Random(f"tasks:{params.seed}")
    mu = math.log(params.mean_duration) - params.duration_sigma**2 / 2
    sizes, weights = zip(*params.min_nodes, strict=True)
    tasks, t = [], 0.0
    for i in range(params.tasks):
        t += rng.expovariate(params.arrival_rate())
        lo = rng.choices(sizes, weights)[0]
        hi = min(params.max_cap, lo * rng.choice(params.max_factor))
        prio = HIGH_PRIORITY if rng.random() < params.high_share else 0
        work = lo * rng.lognormvariate(mu, params.duration_sigma)
        tasks.append(TraceTask(f"t{i:04d}", t, work, lo, max(lo, hi), prio))
    rng = random.Random(f"pool:{params.seed}")
    live = [f"w{i:04d}" for i in range(params.workers)]
    nxt, events, t = params.workers, [], 0.0
    horizon = 2 * tasks[-1].arrival if tasks else 0.0
    while (t := t + rng.expovariate(1 / params.churn_every)) < horizon:
        if len(live) <= params.min_pool or (len(live) < params.max_pool and rng.random() < 0.5):
            worker, nxt = f"w{nxt:04d}", nxt + 1
            live.append(worker)
            events.append(PoolEvent(t, worker, True))
        else:
            worker = rng.choice(sorted(live))
            live.remove(worker)
            events.append(PoolEvent(t, worker, False))
    return Trace(
        params, tuple(tasks), tuple(f"w{i:04d}" for i in range(params.workers)), tuple(events)
    )


# --- policies ----------------------------------------------------------------------------------


@dataclass
class TaskState:
    """A task in the simulation (mutable; the policies only read it)."""

    spec: TraceTask
    remaining: float
    nodes: frozenset[str] = frozenset()
    paused_until: float = 0.0
    started: float | None = None  # first time it held >= min_nodes
    done: float | None = None

    @property
    def running(self) -> bool:
        return len(self.nodes) >= self.spec.min_nodes

    def finish_time(self, now: float) -> float:
        if not self.running:
            return math.inf
        return max(now, self.paused_until) + self.remaining / len(self.nodes)


Policy = Callable[[Sequence[TaskState], frozenset[str]], dict[str, frozenset[str]]]


def elastic(tasks: Sequence[TaskState], live: frozenset[str]) -> dict[str, frozenset[str]]:
    """The controller's allocator, fed the snapshot the reconciler would build."""
    snapshot = Snapshot(
        tuple(
            TaskView(
                id=t.spec.id,
                priority=t.spec.priority,
                min_nodes=t.spec.min_nodes,
                max_nodes=t.spec.max_nodes,
                seq=t.spec.arrival,
                nodes=t.nodes,
                running=t.running,
            )
            for t in tasks
        ),
        tuple(WorkerView(w) for w in sorted(live)),
    )
    plan = allocate(snapshot)
    return {t.spec.id: plan.nodes_of(t.spec.id) for t in tasks}


def static(backfill: bool) -> Policy:
    """Fixed count = min_nodes, by priority then age, no preemption, no growth."""

    def plan(tasks: Sequence[TaskState], live: frozenset[str]) -> dict[str, frozenset[str]]:
        held = {t.spec.id: t.nodes for t in tasks}
        free = sorted(live.difference(*held.values()))
        for t in sorted(tasks, key=lambda t: (-t.spec.priority, t.spec.arrival, t.spec.id)):
            need = t.spec.min_nodes - len(t.nodes)
            if need <= 0:
                continue
            if t.started is None and len(free) < need:  # a gang start needs all its nodes
                if backfill:
                    continue
                break
            take, free = free[:need], free[need:]  # a started task takes replacements as they come
            held[t.spec.id] = t.nodes | frozenset(take)
        return held

    return plan


def policy(name: str) -> Policy:
    if name == "elastic":
        return elastic
    if name in ("static", "static-backfill"):
        return static(backfill=name == "static-backfill")
    raise ValueError(f"unknown policy {name!r}; one of {POLICIES}")


# --- the simulation ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Segment:
    """Task `task` held `nodes` over [start, end) and progressed during `productive` seconds."""

    task: str
    start: float
    end: float
    nodes: frozenset[str]
    productive: float


@dataclass
class Run:
    policy: str
    trace: Trace
    pause: float
    tasks: dict[str, TaskState] = field(default_factory=dict)
    segments: list[Segment] = field(default_factory=list)
    pool_log: list[tuple[float, float, frozenset[str]]] = field(default_factory=list)
    available: float = 0.0  # node-seconds of live workers over [0, makespan]
    work_done: float = 0.0  # node-seconds of progress
    held: float = 0.0  # node-seconds held by tasks (progressing or not)
    backlog_available: float = 0.0  # live node-seconds while active tasks could use every node
    backlog_work: float = 0.0  # node-seconds of progress over those times
    changes: int = 0  # node-set changes after which the task ran (each cost `pause`)
    preemptions: int = 0  # times the plan took nodes away from a task (not a leave)
    makespan: float = 0.0


def simulate(trace: Trace, name: str, pause: float = 0.2) -> Run:
    """Replay `trace` under policy `name` until every task completes."""
    plan_for = policy(name)
    run = Run(name, trace, pause)
    arrivals = deque(trace.tasks)
    pool = deque(trace.pool)
    live = set(trace.workers)
    active: dict[str, TaskState] = {}
    now = 0.0
    while arrivals or active:
        nxt = min(
            arrivals[0].arrival if arrivals else math.inf,
            pool[0].time if pool else math.inf,
            min((t.finish_time(now) for t in active.values()), default=math.inf),
        )
        if nxt == math.inf:
            raise RuntimeError(f"{name}: tasks wait forever at t={now}: {sorted(active)}")
        _advance(run, active.values(), frozenset(live), now, nxt)
        now = nxt
        before = {tid: t.nodes for tid, t in active.items()}
        for tid, t in list(active.items()):
            if t.running and t.remaining <= EPS * t.spec.work:
                t.done, t.nodes = now, frozenset()
                del active[tid]
        while arrivals and arrivals[0].arrival <= now:
            spec = arrivals.popleft()
            active[spec.id] = run.tasks[spec.id] = TaskState(spec, spec.work)
        while pool and pool[0].time <= now:
            ev = pool.popleft()
            if ev.joins:
                live.add(ev.worker)
            else:
                live.discard(ev.worker)
                for t in active.values():
                    t.nodes = t.nodes - {ev.worker}
        ordered = sorted(active.values(), key=lambda t: (t.spec.arrival, t.spec.id))
        plan = plan_for(ordered, frozenset(live))
        for t in ordered:
            new = plan[t.spec.id]
            if new < t.nodes:
                run.preemptions += 1
            t.nodes = new
            if new != before.get(t.spec.id, frozenset()) and t.running:
                t.paused_until = now + pause
                run.changes += 1
            if t.running and t.started is None:
                t.started = now
    run.makespan = now
    return run


def _advance(
    run: Run, tasks: Iterable[TaskState], live: frozenset[str], now: float, until: float
) -> None:
    dt = until - now
    if dt <= 0:
        return
    run.available += len(live) * dt
    run.pool_log.append((now, until, live))
    tasks = list(tasks)
    backlogged = sum(t.spec.max_nodes for t in tasks) >= len(live)
    if backlogged:
        run.backlog_available += len(live) * dt
    for t in tasks:
        if not t.nodes:
            continue
        n = len(t.nodes)
        productive = max(0.0, until - max(now, t.paused_until)) if t.running else 0.0
        t.remaining -= n * productive
        run.work_done += n * productive
        if backlogged:
            run.backlog_work += n * productive
        run.held += n * dt
        run.segments.append(Segment(t.spec.id, now, until, t.nodes, productive))


# --- metrics and report ------------------------------------------------------------------------


@dataclass(frozen=True)
class Metrics:
    mean_completion: float  # s, completion - arrival, every task
    high_wait: float  # s, arrival -> first holding >= min_nodes, high-priority tasks
    utilization: float  # node-seconds of progress / live node-seconds over [0, makespan]
    backlog_utilization: float  # the same over the times active tasks' max_nodes >= live nodes
    high_completion: float  # s, high-priority tasks
    low_completion: float  # s, priority-0 tasks
    p95_completion: float  # s
    makespan: float  # s
    changes: float  # node-set changes that cost a pause
    preemptions: float  # node sets shrunk by the plan


HEADLINE = ("mean_completion", "high_wait", "utilization")
COLUMNS = (  # field, header, format
    ("mean_completion", "mean completion (s)", "{:.1f}"),
    ("high_wait", "high-prio wait (s)", "{:.1f}"),
    ("utilization", "utilization (%)", "{:.1%}"),
    ("backlog_utilization", "utilization when backlogged (%)", "{:.1%}"),
    ("high_completion", "high-prio completion (s)", "{:.1f}"),
    ("low_completion", "low-prio completion (s)", "{:.1f}"),
    ("p95_completion", "p95 completion (s)", "{:.0f}"),
    ("makespan", "makespan (s)", "{:.0f}"),
    ("changes", "node-set changes", "{:.0f}"),
    ("preemptions", "preemptions", "{:.0f}"),
)


def metrics(run: Run) -> Metrics:
    tasks = list(run.tasks.values())
    if any(t.done is None or t.started is None for t in tasks):
        raise ValueError("metrics of an unfinished run")
    took = {t.spec.id: t.done - t.spec.arrival for t in tasks if t.done is not None}
    high = [t for t in tasks if t.spec.priority >= HIGH_PRIORITY]
    low = [t for t in tasks if t.spec.priority < HIGH_PRIORITY]
    ordered = sorted(took.values())
    return Metrics(
        mean_completion=statistics.fmean(ordered),
        high_wait=_mean(t.started - t.spec.arrival for t in high if t.started is not None),
        utilization=run.work_done / run.available if run.available else 0.0,
        backlog_utilization=(
            run.backlog_work / run.backlog_available if run.backlog_available else 0.0
        ),
        high_completion=_mean(took[t.spec.id] for t in high),
        low_completion=_mean(took[t.spec.id] for t in low),
        p95_completion=ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))],
        makespan=run.makespan,
        changes=run.changes,
        preemptions=run.preemptions,
    )


def _mean(values: Iterable[float]) -> float:
    values = list(values)
    return statistics.fmean(values) if values else 0.0


def compare(params: TraceParams, pause: float = 0.2) -> dict[str, Metrics]:
    """Every policy on the trace of `params` (one seed)."""
    trace = make_trace(params)
    return {name: metrics(simulate(trace, name, pause)) for name in POLICIES}


def wins(a: Metrics, b: Metrics) -> dict[str, bool]:
    """Headline metric -> a is strictly better than b on it (lower times, higher utilization)."""
    return {
        "mean_completion": a.mean_completion < b.mean_completion,
        "high_wait": a.high_wait < b.high_wait,
        "utilization": a.utilization > b.utilization,
    }


def beats(a: Metrics, b: Metrics) -> bool:
    """a is strictly better than b on all three headline metrics."""
    return all(wins(a, b).values())


def table(results: Sequence[dict[str, Metrics]]) -> str:
    """Markdown: one row per policy, mean ± sample standard deviation over the seeds."""
    head = "| policy | " + " | ".join(h for _, h, _ in COLUMNS) + " |"
    lines = [head, "|" + " --- |" * (len(COLUMNS) + 1)]
    for name in POLICIES:
        cells = []
        for key, _, fmt in COLUMNS:
            values = [getattr(r[name], key) for r in results]
            spread = statistics.stdev(values) if len(values) > 1 else 0.0
            cells.append(f"{fmt.format(statistics.fmean(values))} ± {fmt.format(spread)}")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def per_seed(seeds: Sequence[int], results: Sequence[dict[str, Metrics]]) -> str:
    """Markdown: the three headline metrics of every policy, one row per seed."""
    heads = [h for k, h, _ in COLUMNS if k in HEADLINE]
    lines = [
        "| seed | " + " | ".join(f"{p}: {h}" for p in POLICIES for h in heads) + " |",
        "|" + " --- |" * (1 + len(POLICIES) * len(heads)),
    ]
    for seed, r in zip(seeds, results, strict=True):
        cells = [
            fmt.format(getattr(r[p], k)) for p in POLICIES for k, _, fmt in COLUMNS if k in HEADLINE
        ]
        lines.append(f"| {seed} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def describe(params: TraceParams, pause: float, seeds: Sequence[int]) -> str:
    values = {f.name: getattr(params, f.name) for f in fields(params) if f.name != "seed"}
    lines = [f"trace: seeds {', '.join(map(str, seeds))}; pause per node-set change {pause} s"]
    lines += [f"  {k} = {v}" for k, v in values.items()]
    lines.append(
        f"  => mean work {params.mean_work():.1f} node-s, "
        f"arrival rate {params.arrival_rate():.4f}/s, high priority = {HIGH_PRIORITY}"
    )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    d = TraceParams()
    ap = argparse.ArgumentParser(
        prog="python -m bench.elastic_sim", description=__doc__.split("\n")[0]
    )
    ap.add_argument("--seed", type=int, default=d.seed, help="first seed")
    ap.add_argument("--seeds", type=int, default=5, help="how many seeds (seed, seed+1, ...)")
    ap.add_argument("--tasks", type=int, default=d.tasks)
    ap.add_argument("--workers", type=int, default=d.workers, help="initial pool")
    ap.add_argument("--load", type=float, default=d.load)
    ap.add_argument("--high-share", type=float, default=d.high_share)
    ap.add_argument("--churn-every", type=float, default=d.churn_every)
    ap.add_argument("--pause", type=float, default=0.2, help="seconds per node-set change")
    ap.add_argument("--per-seed", action="store_true", help="also one headline row per seed")
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    seeds = list(range(args.seed, args.seed + args.seeds))
    base = TraceParams(
        tasks=args.tasks,
        workers=args.workers,
        load=args.load,
        high_share=args.high_share,
        churn_every=args.churn_every,
    )
    results = [compare(replace(base, seed=s), args.pause) for s in seeds]
    print(describe(base, args.pause, seeds))
    print()
    print(table(results))
    print()
    if args.per_seed:
        print(per_seed(seeds, results))
        print()
    for rival in POLICIES[1:]:
        per = [wins(r["elastic"], r[rival]) for r in results]
        counts = ", ".join(f"{k} {sum(w[k] for w in per)}/{len(per)}" for k in HEADLINE)
        print(f"elastic better than {rival}, seeds won: {counts}; all three: ", end="")
        print(f"{sum(all(w.values()) for w in per)}/{len(per)}")
    print(f"(simulated in {time.perf_counter() - t0:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
