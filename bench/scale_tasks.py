"""``python -m bench.scale tasks``: 1,000 one-subtask tasks, each its own ``submit()``, on
2 real workers, against RQ SimpleWorker with 1,000 jobs on 2 workers, rounds alternating.

Both sides run through ``bench.peers`` (the same ``throughput`` method: workers booted and
warm, the clock from the first enqueue to the last job done): queueworks in this process
(``peer_queueworks``, variant ``tasks``: ``max_nodes=1``, one submit per task), RQ in its own
venv (``bench/peers/venvs.py``, built from PyPI on first use) through ``bench.peers.driver``.

For queueworks it also says where the time goes, from the events stream and each task's
history after the run: the median of each phase of a task, of a worker's cycle from one
assignment to the next, and the CPU each process spent per task.
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import time
from typing import Any

import redis

from bench.peers.harness import boot, used_memory
from bench.peers.peer_queueworks import Driver
from bench.peers.run import DriverRun, System
from bench.peers.venvs import VENVS, ensure
from bench.scale import OUT, cpu_seconds, redis_cpu, say, server


def run_tasks(args: argparse.Namespace) -> dict[str, Any]:
    rq = ensure(VENVS["rq"])
    if rq.python is None:
        raise RuntimeError(f"the rq venv could not be built: {rq.error}")
    rounds: list[dict[str, Any]] = []
    for n in range(args.rounds):
        qw = queueworks_round(args.n, args.budget)
        say(f"round {n + 1}: queueworks {qw['jobs_per_s']:.0f} tasks/s")
        system = System("rq-simple", "RQ (SimpleWorker)", "rq")
        params = {"n": args.n, "workers": 2, "budget": args.budget}
        result = DriverRun(str(rq.python), system, "throughput", params, f"scale{n}").finish(
            args.budget + 300
        )
        if "error" in result:
            raise RuntimeError(f"rq: {result['error']}: {result.get('detail')}")
        say(f"round {n + 1}: RQ SimpleWorker {result['jobs_per_s']:.0f} jobs/s")
        rounds.append({"queueworks": qw, "rq_simple": result})
    ours = [r["queueworks"]["jobs_per_s"] for r in rounds]
    theirs = [r["rq_simple"]["jobs_per_s"] for r in rounds]
    return {
        "n": args.n,
        "workers": 2,
        "rq_version": rq.versions.get("rq"),
        "queueworks_tasks_per_s": [round(x, 1) for x in ours],
        "rq_simple_jobs_per_s": [round(x, 1) for x in theirs],
        "median_ratio": round(statistics.median(ours) / statistics.median(theirs), 2),
        "ratios_by_round": [round(a / b, 2) for a, b in zip(ours, theirs, strict=True)],
        "breakdown": [r["queueworks"]["breakdown"] for r in rounds],
    }


def queueworks_round(n: int, budget: float) -> dict[str, Any]:
    with server() as srv:
        peer = Driver(srv.url, OUT / "tasks", "tasks")
        try:
            boot(peer, 2, separate=False, warm_jobs=8)
            cpu0 = _cpu(peer, srv.client())
            t0 = time.perf_counter()
            peer.enqueue_noop(n)
            enqueued = time.perf_counter() - t0
            while (left := peer.remaining()) > 0 and time.perf_counter() - t0 < budget:
                time.sleep(0.005)
            seconds = time.perf_counter() - t0
            cpu1 = _cpu(peer, srv.client())
            breakdown = phases(srv.client(), "qw")
            breakdown["cpu_ms_per_task"] = {
                k: round((cpu1[k] - cpu0[k]) / n * 1000, 3) for k in cpu0
            }
            breakdown["submit_ms_per_task"] = round(enqueued / n * 1000, 3)
            breakdown["redis_mb"] = round(used_memory(srv.client()) / 1e6, 1)
        finally:
            peer.stop_workers()
            peer.close()
    return {"jobs_per_s": (n - max(0, left)) / seconds, "seconds": seconds, "breakdown": breakdown}


def _cpu(peer: Driver, r: redis.Redis) -> dict[str, float]:
    """CPU seconds so far: the controller, the workers, Redis, this (submitting) process."""
    procs = peer.procs
    out = {"controller": cpu_seconds(procs[0].pid)}
    for i, p in enumerate(procs[1:]):
        out[f"worker{i}"] = cpu_seconds(p.pid)
    out["redis"] = redis_cpu(r)
    out["client"] = time.process_time()
    return out


def phases(r: redis.Redis, prefix: str) -> dict[str, Any]:
    """Median milliseconds of each phase of a task, from the events and its history."""
    seen: dict[str, dict[str, float]] = {}
    assigned: dict[str, list[tuple[float, str]]] = {}
    for _, raw in r.xrange(f"{prefix}:events"):
        f = {k.decode(): v.decode() for k, v in raw.items()}
        ts, task = float(f["ts"]), f.get("task")
        if task:
            seen.setdefault(task, {}).setdefault(f["kind"], ts)
        if f["kind"] == "assigned":
            assigned.setdefault(f["worker"], []).append((ts, f["task"]))
    joins: dict[str, dict[str, float]] = {}
    pipe = r.pipeline(transaction=False)
    tids = [t for t, e in seen.items() if {"assigned", "completed", "released"} <= set(e)]
    for tid in tids:
        pipe.xrange(f"{prefix}:task:{{{tid}}}:history")
    for tid, hist in zip(tids, pipe.execute(), strict=True):
        joins[tid] = {}
        for _, h in hist:
            joins[tid].setdefault(h[b"cause"].decode(), float(h[b"ts"]))
    spans = {
        "controller: submitted -> assigned (queue wait included)": ("submitted", "assigned"),
        "worker: assigned -> joined": ("assigned", "join"),
        "worker: joined -> completed (run + settle)": ("join", "completed"),
        "worker: completed -> left": ("completed", "leave"),
        "controller: completed -> released": ("completed", "released"),
    }
    out: dict[str, Any] = {"tasks": len(tids)}
    for name, (a, b) in spans.items():
        values = []
        for tid in tids:
            both = {**seen[tid], **joins[tid]}
            if a in both and b in both:
                values.append(both[b] - both[a])
        out[name] = round(statistics.median(values) * 1000, 2) if values else None
    gaps, cycles = [], []
    for lst in assigned.values():
        lst.sort()
        for (t0, first), (t1, _) in itertools.pairwise(lst):
            cycles.append(t1 - t0)
            if "completed" in seen.get(first, {}):
                gaps.append(t1 - seen[first]["completed"])
    out["controller: completed -> the worker's next assignment"] = _ms(gaps)
    out["a worker's cycle: assignment -> next assignment"] = _ms(cycles)
    return out


def _ms(values: list[float]) -> float | None:
    return round(statistics.median(values) * 1000, 2) if values else None
