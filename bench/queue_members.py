"""Queues are not gangs: what a change of a queue's members, and many idle queues, cost.

    python -m bench.queue_members                       # every figure, full sizes
    python -m bench.queue_members --queues 500 --only idle,latency,kill
    python -m bench.queue_members --json out.json

Each figure runs on one private redis-server with fresh worker (and controller) processes
(``bench.common.Procs``; handlers of ``tests.handlers``).

* ``gap``: workers w1 and w2 (``--concurrency 2``) each run a 30 s job without a safe point
  (w1 of queue ``slow-a``, w2 of ``slow-b``) and serve queue ``fast``, where a no-op job
  arrives every 25 ms. A third worker starts, joins every queue, and is SIGKILLed
  ``--w3-life`` s (2) after it joined; the window ends 2 s after it was pruned. Reported:
  the longest stretch of the window in which w1 (and w2) started no ``fast`` job.
* ``idle``: ``--queues`` queues created (no jobs), 2 workers and a controller; once every
  queue has both workers as members (or ``--ready`` s passed) and ``--settle`` s more,
  CPU of redis-server, each
  worker and the controller over ``--window`` s (10), as % of one core, and Redis commands/s.
* ``latency``: then, jobs enqueued one at a time (every 50 ms) to random queues among them:
  enqueue -> start (the job's ``started_at - enqueued_at``), p50 / p90 / max.
* ``kill``: then, a job of 30 s without a safe point on one of the queues; the worker
  running it is SIGKILLed once it runs: the time until the job runs again on the other
  worker (its attempt 2 started), beside the heartbeat TTL.

CPU figures are as measured: on a shared machine they are noisy.
"""

from __future__ import annotations

import argparse
import itertools
import json
import random
import signal
import threading
import time
import uuid
from typing import Any

import redis

from bench.common import Procs, pct, private_redis, wait_for
from queueworks import Client

FAST = "tests.handlers:job_logged"
LONG = "tests.handlers:sleep_for"
NOOP = "tests.handlers:double"
HB = ["--heartbeat-interval", "1", "--heartbeat-ttl", "3"]
TTL_S = 3.0
POLL_S = 0.2  # s between two looks at the members while the gap is measured


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / 100.0  # utime + stime, in ticks of 10 ms


def members(client: Client, name: str) -> list[str]:
    return sorted(n.worker for n in client.task(name).status().nodes)


def longest_gap(times: list[float], start: float, end: float) -> float:
    return gap_at(times, start, end)[0]


def gap_at(times: list[float], start: float, end: float) -> tuple[float, float]:
    """The longest stretch of [start, end] without one of ``times``, and when it began."""
    marks = [start, *sorted(t for t in times if start < t < end), end]
    return max((b - a, a) for a, b in itertools.pairwise(marks))


def gap(url: str, args: argparse.Namespace) -> dict[str, Any]:
    prefix = f"bm{uuid.uuid4().hex[:6]}"
    client = Client.from_url(url, prefix=prefix)
    r = redis.Redis.from_url(url)
    procs = Procs(url, prefix)
    try:
        fast, slow_a, slow_b = (client.queue(n) for n in ("fast", "slow-a", "slow-b"))
        conc = ["--concurrency", "2", *HB]
        procs.worker("w1", *conc, "--queues", "fast,slow-a")
        procs.worker("w2", *conc, "--queues", "fast,slow-b")
        wait_for(lambda: members(client, "fast") == ["w1", "w2"], 60)
        wait_for(lambda: members(client, "slow-a") == ["w1"], 60)
        wait_for(lambda: members(client, "slow-b") == ["w2"], 60)
        long_jobs = [q.enqueue(LONG, {"seconds": 30.0}) for q in (slow_a, slow_b)]
        wait_for(lambda: all(j.status().state == "running" for j in long_jobs), 30)
        log = f"{prefix}:starts"
        stop = threading.Event()

        def produce() -> None:
            while not stop.is_set():
                fast.enqueue(FAST, {"x": 1, "log": log})
                time.sleep(0.025)

        producer = threading.Thread(target=produce, daemon=True)
        producer.start()
        time.sleep(1.0)
        start = time.time()
        w3 = procs.worker("w3", *HB)
        # polled at 5 Hz: a status read every 10 ms would take the workers' CPU and show
        # as their gaps on a small machine
        wait_for(lambda: "w3" in members(client, "fast"), 60, interval=POLL_S)
        time.sleep(args.w3_life)
        w3.send_signal(signal.SIGKILL)
        w3.wait()
        killed = time.time()
        wait_for(lambda: "w3" not in members(client, "fast"), 60, interval=POLL_S)
        pruned = time.time()
        time.sleep(2.0)
        end = time.time()
        stop.set()
        producer.join()
        starts: dict[str, list[float]] = {}
        for raw in r.lrange(log, 0, -1):
            _, worker, _, at = raw.decode().split("|")
            starts.setdefault(worker, []).append(float(at))
        return {
            "window_s": round(end - start, 2),
            "w3_killed_at_s": round(killed - start, 2),
            "w3_pruned_at_s": round(pruned - start, 2),
            "longest_gap_s": {
                w: round(longest_gap(starts.get(w, []), start, end), 3) for w in ("w1", "w2")
            },
            "longest_gap_began_at_s": {
                w: round(gap_at(starts.get(w, []), start, end)[1] - start, 2) for w in ("w1", "w2")
            },
            "fast_starts": {w: len(v) for w, v in sorted(starts.items())},
        }
    finally:
        procs.stop_all()


def many(url: str, args: argparse.Namespace, only: set[str]) -> dict[str, Any]:
    prefix = f"bm{uuid.uuid4().hex[:6]}"
    client = Client.from_url(url, prefix=prefix)
    r = redis.Redis.from_url(url)
    procs = Procs(url, prefix)
    out: dict[str, Any] = {"queues": args.queues}
    try:
        names = [f"q{i:05d}" for i in range(args.queues)]
        pipe_n = 200
        for k in range(0, len(names), pipe_n):
            for n in names[k : k + pipe_n]:
                client.queue(n)
        controller = procs.spawn("controller")
        workers = [procs.worker(f"w{i}", *HB) for i in range(2)]
        wait_for(lambda: r.zcard(f"{prefix}:workers") >= 2, 60)
        t0 = time.monotonic()

        def joined() -> int:
            pipe = r.pipeline(transaction=False)
            for n in names:
                pipe.zcard(client.keys.task(n).members)
            return sum(1 for c in pipe.execute() if c >= 2)

        while time.monotonic() - t0 < args.ready and joined() < len(names):
            time.sleep(0.5)
        out["ready_s"] = round(time.monotonic() - t0, 1)
        out["queues_with_both_workers"] = joined()
        time.sleep(args.settle)  # (each join bumped every queue's epoch: the others re-rank)
        if "idle" in only:
            server_pid = int(r.info("server")["process_id"])
            pids = {"redis-server": server_pid, "controller": controller.pid}
            pids.update({f"worker{i}": w.pid for i, w in enumerate(workers)})
            before = {k: cpu_seconds(p) for k, p in pids.items()}
            cmds0 = int(r.info("stats")["total_commands_processed"])
            stats0 = r.info("commandstats")
            t = time.monotonic()
            time.sleep(args.window)
            spent = time.monotonic() - t
            out["idle_cpu_pct"] = {
                k: round(100 * (cpu_seconds(p) - before[k]) / spent, 1) for k, p in pids.items()
            }
            cmds = int(r.info("stats")["total_commands_processed"]) - cmds0
            out["idle_commands_per_s"] = round(cmds / spent)
            stats = r.info("commandstats")
            calls = {
                k.removeprefix("cmdstat_"): (v["calls"] - stats0.get(k, {}).get("calls", 0)) / spent
                for k, v in stats.items()
            }
            top = sorted(calls.items(), key=lambda kv: -kv[1])[:8]
            out["idle_top_commands_per_s"] = {k: round(v) for k, v in top if v >= 1}
            print(json.dumps({"so_far": out}), flush=True)
        if "latency" in only:
            rng = random.Random(7)
            jobs = []
            for _ in range(args.latency_jobs):
                jobs.append(client.queue(rng.choice(names)).enqueue(NOOP, {"x": 1}))
                time.sleep(0.05)
            waits = []
            deadline = time.monotonic() + args.latency_limit
            for j in jobs:
                try:
                    j.result(timeout=max(0.1, deadline - time.monotonic()))
                except TimeoutError:
                    continue  # (counted as not started)
                s = j.status()
                assert s.started_at is not None and s.enqueued_at is not None
                waits.append(1000 * (s.started_at - s.enqueued_at))
            out["enqueue_to_start_ms"] = {
                "p50": round(pct(waits, 50), 2),
                "p90": round(pct(waits, 90), 2),
                "max": round(max(waits, default=float("nan")), 2),
                "not_done_after_s": args.latency_limit,
                "not_done": len(jobs) - len(waits),
            }
            print(json.dumps({"so_far": out}), flush=True)
        if "kill" in only:
            q = client.queue(names[len(names) // 2])
            job = q.enqueue(LONG, {"seconds": 30.0})
            wait_for(lambda: job.status().state == "running", 60)
            victim = job.status().worker
            proc = workers[int(str(victim)[1:])]
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            killed = time.time()
            wait_for(lambda: (job.status().attempts or 0) >= 2, args.kill_limit, interval=0.01)
            again = job.status().started_at
            assert again is not None
            out["kill_to_rerun_s"] = round(again - killed, 2)
            out["heartbeat_ttl_s"] = TTL_S
        return out
    finally:
        procs.stop_all()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--queues", type=int, default=10_000)
    ap.add_argument("--only", default="gap,idle,latency,kill")
    ap.add_argument("--ready", type=float, default=120.0)
    ap.add_argument("--window", type=float, default=10.0)
    ap.add_argument("--settle", type=float, default=2.0, help="s after joining, before idle")
    ap.add_argument("--latency-jobs", type=int, default=100)
    ap.add_argument("--latency-limit", type=float, default=60.0, help="s for all of them")
    ap.add_argument("--w3-life", type=float, default=2.0)
    ap.add_argument("--kill-limit", type=float, default=120.0)
    ap.add_argument("--json")
    args = ap.parse_args()
    only = set(args.only.split(","))
    results: dict[str, Any] = {}
    with private_redis() as server:
        if "gap" in only:
            results["gap"] = gap(server.url, args)
            print(json.dumps({"gap": results["gap"]}), flush=True)
        if only & {"idle", "latency", "kill"}:
            results["many"] = many(server.url, args, only)
            print(json.dumps({"many": results["many"]}), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
