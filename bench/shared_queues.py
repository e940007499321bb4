"""Workers shared by queues: the three figures that model must meet, each printed with its
target and PASS or FAIL.

    python -m bench.shared_queues                  # full sizes
    python -m bench.shared_queues --quick          # small sizes: a smoke test
    python -m bench.shared_queues --json out.json  # the figures as JSON too

Each scenario runs on a key prefix of its own on one private redis-server, with its own
controller and worker processes (``bench.common.Procs``; the workers also
``--allow bench.shared_jobs``, the handlers it runs). Its queues are created (default
settings) once the workers have registered; then, before any clock starts, the workers get
up to ``--ready`` s (10; not timed) to become members of every queue, and how many members
each queue had when the clock started is reported. The timed part of each scenario has
``--limit`` s (60): one that is not over by then reports how far it got and fails.

(a) **Three queues, one worker.** 1 worker, queues A, B, C. The clock starts at the first
    enqueue; A's 100 no-op jobs are enqueued (one ``enqueue_many``), then B's, then C's,
    and it stops when all 300 are settled. Target: <= 2 s.
(b) **A batch task beside busy queues.** 2 workers, 2 queues kept busy by a producer thread
    (each queue topped up to 10 unsettled jobs that sleep 5 to 20 ms) for 1 s, then a task
    of 200 subtasks of 10 ms each (``client.submit(TaskSpec(...))``, default priority) is
    submitted. Measured: submit to its first subtask's start (a mark the subtask writes;
    the time the task's state turned ``running`` is shown beside it), target <= 1 s; and
    the jobs each queue finished while the task ran (its first subtask's start to the task
    finished, or to the limit), target > 0 for each queue.
(c) **Many queues cost nothing.** 2 workers; 4,000 no-op jobs, enqueued round robin over
    10 queues (``enqueue_many`` of 100 jobs to each queue in turn) vs the same calls to 1
    queue, each on fresh processes; jobs/s from the first enqueue to the last job settled.
    Target: 10 queues >= 0.8x 1 queue. One queue takes about 0.1 s for 4,000 jobs (the
    jobs run while they are enqueued), so one run's ratio is noisy: ``--c-jobs 20000``
    gives it a longer window.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import random
import shlex
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import redis

from bench.common import Procs, private_redis, wait_workers
from queueworks import Client, TaskSpec
from queueworks.client.queue_handle import Queue
from queueworks.protocol.models import TaskState

NOOP = "bench.shared_jobs:noop"
NAP = "bench.shared_jobs:nap"
SUBTASK = "bench.shared_jobs:subtask"

FULL = {
    "a_jobs": 100,  # per queue, 3 queues
    "b_subtasks": 200,
    "b_subtask_s": 0.01,
    "b_busy_s": 1.0,  # the queues are busy this long before the task is submitted
    "b_backlog": 10,  # unsettled jobs the producer keeps on each busy queue
    "c_jobs": 4000,
    "c_queues": 10,
    "c_batch": 100,  # jobs per enqueue_many call
    "limit_s": 60.0,
    "ready_s": 10.0,
}
QUICK = {
    **FULL,
    "a_jobs": 20,
    "b_subtasks": 40,
    "b_busy_s": 0.5,
    "c_jobs": 400,
    "c_batch": 20,
    "limit_s": 10.0,
    "ready_s": 5.0,
}

TARGETS = {"a_s": 2.0, "b_start_s": 1.0, "c_ratio": 0.8}


@dataclass
class Rig:
    """One scenario's processes, key prefix and connections."""

    url: str
    prefix: str
    workers: int
    r: redis.Redis
    client: Client

    def settled(self, q: Queue) -> int:
        done, dead = self.r.hmget(q.keys.record, ["done", "dead"])
        return int(done or 0) + int(dead or 0)

    def members(self, q: Queue) -> int:
        return int(self.r.zcard(q.keys.members))

    def ready(self, queues: list[Queue], within: float) -> dict[str, Any]:
        """Wait (up to ``within`` s, not timed) until every worker is a member of every
        queue; say how long that took and how many members each queue had."""
        t0 = time.perf_counter()
        ok = until(lambda: all(self.members(q) >= self.workers for q in queues), within)
        return {
            "ready": ok is not None,
            "ready_wait_s": round(time.perf_counter() - t0, 2),
            "members_at_start": {q.name: self.members(q) for q in queues},
        }


@contextmanager
def rig(url: str, workers: int) -> Iterator[Rig]:
    prefix = f"s{uuid.uuid4().hex[:6]}"
    procs = Procs(url, prefix)
    r = redis.Redis.from_url(url)
    client = Client.from_url(url, prefix=prefix)
    try:
        procs.spawn("controller")
        for i in range(workers):
            procs.worker(f"w{i}", "--allow", "bench.shared_jobs")
        wait_workers(r, prefix, workers)
        yield Rig(url, prefix, workers, r, client)
    finally:
        procs.stop_all()
        client.close()
        r.close()


def until(pred: Callable[[], Any], limit: float, interval: float = 0.005) -> float | None:
    """Seconds until ``pred()`` held, or None if it did not within ``limit`` s."""
    t0 = time.perf_counter()
    while not pred():
        if time.perf_counter() - t0 > limit:
            return None
        time.sleep(interval)
    return time.perf_counter() - t0


# -- (a) three queues, one worker ----------------------------------------------------------


def three_queues(url: str, p: dict[str, Any]) -> dict[str, Any]:
    n = p["a_jobs"]
    with rig(url, 1) as s:
        queues = [s.client.queue(name) for name in ("A", "B", "C")]
        out = s.ready(queues, p["ready_s"])
        t0 = time.perf_counter()
        for q in queues:
            q.enqueue_many((NOOP, {"i": i}) for i in range(n))
        took = until(lambda: all(s.settled(q) >= n for q in queues), p["limit_s"] - elapsed(t0))
        seconds = None if took is None else round(elapsed(t0), 3)
        done = {q.name: s.settled(q) for q in queues}
    return {
        **out,
        "jobs": 3 * n,
        "done": done,
        "seconds": seconds,
        "pass": seconds is not None and seconds <= TARGETS["a_s"],
    }


def elapsed(t0: float) -> float:
    return time.perf_counter() - t0


# -- (b) a batch task beside busy queues ---------------------------------------------------


class Producer(threading.Thread):
    """Keeps each queue topped up to ``backlog`` unsettled jobs of 5 to 20 ms, on a client
    of its own, until ``stop()``."""

    def __init__(self, url: str, prefix: str, names: list[str], backlog: int) -> None:
        super().__init__(daemon=True)
        self.client = Client.from_url(url, prefix=prefix)
        self.queues = [self.client.queue(name) for name in names]
        self.backlog = backlog
        self.sent = dict.fromkeys(names, 0)
        self.halt = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        rng = random.Random(7)
        r = self.client.redis
        try:
            while not self.halt.is_set():
                for q in self.queues:
                    done, dead = r.hmget(q.keys.record, ["done", "dead"])
                    short = self.backlog - (self.sent[q.name] - int(done or 0) - int(dead or 0))
                    if short > 0:
                        q.enqueue_many(
                            (NAP, {"seconds": rng.uniform(0.005, 0.02)}) for _ in range(short)
                        )
                        self.sent[q.name] += short
                self.halt.wait(0.005)
        except BaseException as exc:  # reported by stop(), in the bench's thread
            self.error = exc

    def stop(self) -> None:
        self.halt.set()
        self.join(10)
        self.client.close()
        if self.error is not None:
            raise RuntimeError("the producer failed") from self.error


def task_beside_queues(url: str, p: dict[str, Any]) -> dict[str, Any]:
    with rig(url, 2) as s:
        queues = [s.client.queue(name) for name in ("busy0", "busy1")]
        out = s.ready(queues, p["ready_s"])
        producer = Producer(url, s.prefix, [q.name for q in queues], p["b_backlog"])
        producer.start()
        try:
            before = {q.name: s.settled(q) for q in queues}
            time.sleep(p["b_busy_s"])
            out["busy_jobs_per_s"] = {
                q.name: round((s.settled(q) - before[q.name]) / p["b_busy_s"], 1) for q in queues
            }
            out.update(run_task(s, queues, p))
        finally:
            producer.stop()
    start, during = out["first_subtask_s"], out["jobs_during_task"]
    out["start_pass"] = start is not None and start <= TARGETS["b_start_s"]
    out["queues_pass"] = during is not None and all(v > 0 for v in during.values())
    out["pass"] = out["start_pass"] and out["queues_pass"]
    return out


def run_task(s: Rig, queues: list[Queue], p: dict[str, Any]) -> dict[str, Any]:
    """Submit the task; time its start; count the queues' jobs settled while it runs."""
    mark = f"{s.prefix}:bench:first-subtask"
    each = {"mark": mark, "seconds": p["b_subtask_s"]}
    spec = TaskSpec(
        name="batch", handler=SUBTASK, subtasks=({**each, "i": i} for i in range(p["b_subtasks"]))
    )
    wall0, t0 = time.time(), time.perf_counter()
    task = s.client.submit(spec)
    running: list[float] = []

    def started() -> bool:
        if not running and task.status(with_nodes=False).state == TaskState.RUNNING:
            running.append(elapsed(t0))
        return bool(s.r.exists(mark))

    out: dict[str, Any] = {"subtasks": p["b_subtasks"], "first_subtask_s": None}
    out["jobs_during_task"] = out["task_seconds"] = None
    if until(started, p["limit_s"]) is None:
        out["running_s"] = running[0] if running else None
        task.cancel()
        return out
    first = float(s.r.get(mark) or 0)
    at_start = {q.name: s.settled(q) for q in queues}
    t_run = time.perf_counter()
    finished = until(lambda: task.status(with_nodes=False).finished, p["limit_s"] - elapsed(t0))
    out["jobs_during_task"] = {q.name: s.settled(q) - at_start[q.name] for q in queues}
    out["task_seconds"] = round(elapsed(t_run), 2)
    out["task_finished"] = finished is not None
    out["task_done"] = task.status(with_nodes=False).done
    out["first_subtask_s"] = round(first - wall0, 3)
    out["running_s"] = round(running[0], 3) if running else None
    if finished is None:
        task.cancel()
    return out


# -- (c) jobs/s, many queues vs one --------------------------------------------------------


def throughput(url: str, p: dict[str, Any], n_queues: int) -> dict[str, Any]:
    n, batch = p["c_jobs"], p["c_batch"]
    with rig(url, 2) as s:
        queues = [s.client.queue(f"q{i}") for i in range(n_queues)]
        out = s.ready(queues, p["ready_s"])
        calls = [(queues[k % n_queues], k * batch) for k in range(-(-n // batch))]
        t0 = time.perf_counter()
        for q, first in calls:
            q.enqueue_many((NOOP, {"i": i}) for i in range(first, min(n, first + batch)))
        took = until(lambda: sum(s.settled(q) for q in queues) >= n, p["limit_s"] - elapsed(t0))
        seconds = elapsed(t0)
        done = sum(s.settled(q) for q in queues)
    return {
        **out,
        "queues": n_queues,
        "jobs": n,
        "done": done,
        "finished": took is not None,
        "seconds": round(seconds, 3),
        "jobs_per_s": round(done / seconds, 1),
    }


def many_queues(url: str, p: dict[str, Any]) -> dict[str, Any]:
    one = throughput(url, p, 1)
    many = throughput(url, p, p["c_queues"])
    ratio = None
    if one["finished"] and many["finished"]:
        ratio = round(many["jobs_per_s"] / one["jobs_per_s"], 3)
    return {
        "one": one,
        "many": many,
        "ratio": ratio,
        "pass": ratio is not None and ratio >= TARGETS["c_ratio"],
    }


# -- the report ----------------------------------------------------------------------------


def verdict(ok: bool) -> str:
    return "PASS" if ok else "FAIL"


def not_finished(p: dict[str, Any]) -> str:
    return f"did not finish in {p['limit_s']:.0f} s"


def report(doc: dict[str, Any]) -> list[str]:
    p, res = doc["params"], doc["results"]
    a, b, c = res["a"], res["b"], res["c"]
    lines = []
    n = a["jobs"]
    got = f"{a['seconds']:.2f} s" if a["seconds"] is not None else not_finished(p)
    lines.append(
        f"(a) 1 worker, 3 queues, {n // 3} no-op jobs each, A then B then C: all {n} done:"
        f" {got}  [target <= {TARGETS['a_s']:g} s]  {verdict(a['pass'])}"
    )
    lines.append(f"    settled: {fmt(a['done'])}; {members(a)}")
    start = b["first_subtask_s"]
    running = "" if b.get("running_s") is None else f" (state running at {b['running_s']:.2f} s)"
    got = f"{start:.2f} s{running}" if start is not None else f"did not start in {p['limit_s']:g} s"
    lines.append(
        f"(b) 2 workers, 2 busy queues, a task of {b['subtasks']} subtasks: submit to first"
        f" subtask: {got}  [target <= {TARGETS['b_start_s']:g} s]  {verdict(b['start_pass'])}"
    )
    during = b["jobs_during_task"]
    if during is None:
        ran = "- (the task never ran)"
    else:
        over = "" if b["task_finished"] else f", not finished: {b['task_done']} subtasks done"
        ran = f"{fmt(during)} (in {b['task_seconds']:.2f} s{over})"
    lines.append(
        f"    jobs each queue finished while the task ran: {ran}  [target > 0 each]"
        f"  {verdict(b['queues_pass'])}"
    )
    lines.append(f"    before the task (jobs/s): {fmt(b['busy_jobs_per_s'])}; {members(b)}")
    one, many = c["one"], c["many"]
    ratio = "-" if c["ratio"] is None else f"{c['ratio']:.2f}x"
    lines.append(
        f"(c) {one['jobs']} no-op jobs on 2 workers, {many['queues']} queues vs 1 queue:"
        f" {ratio}  [target >= {TARGETS['c_ratio']:g}x]  {verdict(c['pass'])}"
    )
    for run in (one, many):
        speed = f"{run['jobs_per_s']:,.0f} jobs/s in {run['seconds']:.2f} s"
        if not run["finished"]:
            speed = f"{not_finished(p)} ({run['done']} of {run['jobs']} done, {speed})"
        name = "1 queue" if run["queues"] == 1 else f"{run['queues']} queues"
        lines.append(f"    {name}: {speed}; {members(run)}")
    passed = sum(bool(x["pass"]) for x in (a, b, c))
    lines.append(f"{passed} of 3 figures PASS")
    return lines


def fmt(counts: dict[str, Any]) -> str:
    return ", ".join(f"{k} {v}" for k, v in counts.items())


def members(run: dict[str, Any]) -> str:
    waited = "" if run["ready"] else f", not all after {run['ready_wait_s']:g} s"
    return f"members when the clock started: {fmt(run['members_at_start'])}{waited}"


SCENARIOS: dict[str, Callable[[str, dict[str, Any]], dict[str, Any]]] = {
    "a": three_queues,
    "b": task_beside_queues,
    "c": many_queues,
}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="small sizes, 10 s limits (smoke test)")
    ap.add_argument("--limit", type=float, default=None, help="s per scenario (60; quick 10)")
    ap.add_argument("--ready", type=float, default=None, help="s to wait for members (10; 5)")
    ap.add_argument("--c-jobs", type=int, default=None, help="jobs in (c) (4000; quick 400)")
    ap.add_argument("--json", type=Path, default=None, help="also write the figures here")
    args = ap.parse_args(argv)
    params = dict(QUICK if args.quick else FULL)
    if args.limit is not None:
        params["limit_s"] = args.limit
    if args.ready is not None:
        params["ready_s"] = args.ready
    if args.c_jobs is not None:
        params["c_jobs"] = max(1, args.c_jobs)
    started = time.monotonic()
    doc: dict[str, Any] = {
        "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "command": "python -m bench.shared_queues"
        + "".join(f" {shlex.quote(a)}" for a in (sys.argv[1:] if argv is None else argv)),
        "params": params,
        "targets": TARGETS,
        "load_start": [round(x, 2) for x in os.getloadavg()],
        "results": {},
    }
    with private_redis() as server:
        for key, scenario in SCENARIOS.items():
            print(f"... ({key}) {scenario.__name__}", flush=True)
            doc["results"][key] = scenario(server.url, params)
    doc["load_end"] = [round(x, 2) for x in os.getloadavg()]
    doc["duration_s"] = round(time.monotonic() - started, 1)
    print("\n".join(report(doc)), flush=True)
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(doc, indent=2) + "\n")
    return doc


if __name__ == "__main__":
    main()
