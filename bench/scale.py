"""The controller at scale (issue 19): the real controller process on a private Redis.

    python -m bench.scale grid      # 100 / 1,000 / 10,000 queued tasks x 100 / 1,000 workers
    python -m bench.scale backlog   # a fresh task behind 5,000 tasks nobody can run
    python -m bench.scale tasks     # 1,000 one-subtask tasks vs RQ SimpleWorker, same run
    python -m bench.scale allocator # the allocator alone, in this process, on a board

**grid**: simulated workers (``bench.scale_sim``: one process, real scripts) in two pools:
10 ``fresh`` workers and the rest ``busy``, held by running tasks of 10 nodes each (priority
5). The backlog: tasks that fit the busy pool but wait behind it (priorities 0-2, min_nodes
1-3: nine classes). Then 50 fresh tasks, one after the other, each of one subtask for the
fresh pool: the *assignment latency* is from the start of ``submit()`` to the moment the
simulated worker sees its assignment (keyspace notification). Around those 50 the
controller's own counters (``controller_stats``: passes, events read, commands sent, CPU
time) give CPU per event and commands per pass, and ``INFO commandstats`` the commands
every client sent. Then the slope from 100 to 10,000 queued tasks.

**backlog**: 5,000 queued tasks whose ``node_selector`` matches nobody, two real worker
processes; 20 times a runnable task of one subtask: from the start of ``submit()`` to the
start of its handler (``bench.peers.jobs:qw_stamp``).

**tasks**: 1,000 tasks of one subtask, each its own ``submit()`` (``max_nodes=1``), 2 real
workers, then RQ SimpleWorker with the same 1,000 jobs (``bench.peers``), rounds alternating;
and for queueworks, where the time goes: the median of each phase of a task (from the events
and each task's history) and the CPU each process spent per task.

``--controller-src DIR`` runs the controller from another source tree (``git archive
<commit> | tar -x -C DIR``): the same benchmark, the same run, another controller.

**allocator**: ``allocate(board)`` alone (the best of 7 calls), for 100 / 1,000 / 10,000 queued
tasks behind 100 / 1,000 workers each held by a one-node task, and behind 5,000 tasks whose
selector matches nobody; beside the allocator as it was before the board
(``tests/allocator_oracle.py``) on the same snapshots.

Bounded: a cell gives up after ``--budget`` seconds; loopback only; every Redis is private.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import redis

from bench.common import ROOT, pct
from queueworks import Client, TaskSpec
from queueworks.contrib.redis_server import RedisServer

OUT = ROOT / "bench" / "out" / "scale"
FRESH_WORKERS = 10
HANDLER = "bench.scale_sim:noop"


def say(*parts: object) -> None:
    print(f"[{time.strftime('%H:%M:%S')}]", *parts, file=sys.stderr, flush=True)


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def wait(pred: Any, timeout: float, what: str, interval: float = 0.01) -> Any:
    deadline = time.monotonic() + timeout
    while not (value := pred()):
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not within {timeout:.0f} s")
        time.sleep(interval)
    return value


def commandstats(r: redis.Redis) -> dict[str, int]:
    info: Any = r.info("commandstats")
    return {k.removeprefix("cmdstat_"): int(v["calls"]) for k, v in info.items()}


class Controller:
    """The real controller process, its stats lines read from its log."""

    def __init__(self, url: str, prefix: str, log: Path, src: Path = ROOT, **env: str) -> None:
        self.log = log
        full = {
            **os.environ,
            "QUEUEWORKS_REDIS_URL": url,
            "QUEUEWORKS_PREFIX": prefix,
            "QUEUEWORKS_LOG_LEVEL": "info",
            "QUEUEWORKS_STATS_INTERVAL": "0.2",
            "PYTHONPATH": str(src),
            **env,
        }
        self.counts = src == ROOT
        if not self.counts:  # an older controller knows neither the setting nor the stats
            full.pop("QUEUEWORKS_STATS_INTERVAL")
        self._out = log.open("wb")
        self.p = subprocess.Popen(
            [sys.executable, "-m", "queueworks", "controller"],
            env=full,
            cwd=src,
            stdout=self._out,
            stderr=subprocess.STDOUT,
        )

    def stats(self) -> dict[str, Any]:
        last = None
        for line in self.log.read_text(errors="replace").splitlines():
            if '"controller_stats"' in line:
                last = line
        return json.loads(last) if last else {}

    def fresh_stats(self) -> dict[str, Any]:
        """The next stats line (written after this call); zeros for a controller without
        them (``--controller-src``), and its CPU time from /proc."""
        if not self.counts:
            return dict.fromkeys(("passes", "events", "commands", "ops"), 0) | {
                "cpu_s": cpu_seconds(self.p.pid)
            }
        seen = self.stats().get("timestamp")
        return wait(lambda: (s := self.stats()) and s.get("timestamp") != seen and s, 5, "stats")

    def close(self) -> None:
        if self.p.poll() is None:
            self.p.terminate()
            try:
                self.p.wait(10)
            except subprocess.TimeoutExpired:
                self.p.kill()
                self.p.wait()
        self._out.close()


@contextmanager
def server() -> Iterator[RedisServer]:
    with RedisServer() as srv:
        srv.start()
        yield srv


def spec(name: str, **kw: Any) -> TaskSpec:
    return TaskSpec(name=name, handler=HANDLER, subtasks=[{"x": 1}], **kw)


def submit_all(client: Client, specs: Iterator[TaskSpec]) -> list[str]:
    return [client.submit(s).id for s in specs]


def settle_backlog(r: redis.Redis, client: Client, ids: list[str], timeout: float) -> float:
    """Wait until the controller has read every queued task (each has its reason)."""
    t0 = time.monotonic()
    tail = ids[-20:] + ids[:: max(1, len(ids) // 50)]
    wait(
        lambda: all(client.task(t).status(with_nodes=False).reason for t in tail),
        timeout,
        "the backlog's reasons",
        0.05,
    )
    return time.monotonic() - t0


# -- grid -------------------------------------------------------------------------------


def grid_cell(
    backlog: int, workers: int, fresh: int, budget: float, src: Path = ROOT
) -> dict[str, Any]:
    OUT.mkdir(parents=True, exist_ok=True)
    with server() as srv:
        r = srv.client()
        ctl = Controller(srv.url, "qw", OUT / f"controller-{backlog}x{workers}.log", src)
        sim = subprocess.Popen(
            [sys.executable, "-m", "bench.scale_sim", "--url", srv.url, "--workers", str(workers)],
            cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )
        client = Client.from_url(srv.url)
        try:
            return _grid_run(r, client, ctl, sim, backlog, workers, fresh, budget)
        finally:
            client.close()
            sim.terminate()
            sim.wait(20)
            ctl.close()


def _grid_run(
    r: redis.Redis,
    client: Client,
    ctl: Controller,
    sim: subprocess.Popen[bytes],
    backlog: int,
    workers: int,
    fresh: int,
    budget: float,
) -> dict[str, Any]:
    wait(lambda: r.zcard("qw:workers") >= workers, budget, "simulated workers")
    busy = (workers - FRESH_WORKERS) // 10
    held = submit_all(
        client,
        (
            spec(f"busy{k}", min_nodes=10, max_nodes=10, priority=5, node_selector={"pool": "busy"})
            for k in range(busy)
        ),
    )
    wait(
        lambda: all(client.task(t).status(with_nodes=False).state == "running" for t in held),
        budget,
        "the busy pool held",
        0.05,
    )
    t0 = time.monotonic()
    ids = submit_all(
        client,
        (
            spec(f"q{k}", priority=k % 3, min_nodes=1 + k % 3, node_selector={"pool": "busy"})
            for k in range(backlog)
        ),
    )
    submitted_s = time.monotonic() - t0
    caught_up_s = settle_backlog(r, client, ids, budget)
    for _ in range(5):  # warm the fresh path
        one_fresh(r, client)
    before, cmds0, redis_cpu0 = ctl.fresh_stats(), commandstats(r), redis_cpu(r)
    lat = [one_fresh(r, client) for _ in range(fresh)]
    after, cmds1, redis_cpu1 = ctl.fresh_stats(), commandstats(r), redis_cpu(r)
    rss_mb = rss(ctl.p.pid)
    takeover = take_over(r, ctl) if ctl.counts else {}
    d = {k: after[k] - before[k] for k in ("passes", "events", "commands", "cpu_s", "ops")}
    all_calls = sum(cmds1.values()) - sum(cmds0.values())
    return {
        "backlog": backlog,
        "workers": workers,
        "busy_tasks": busy,
        "submit_backlog_s": round(submitted_s, 2),
        "controller_caught_up_s": round(caught_up_s, 2),
        "fresh": fresh,
        "latency_ms_p50": round(pct(lat, 50) * 1000, 2),
        "latency_ms_p99": round(pct(lat, 99) * 1000, 2),
        "latency_ms_max": round(max(lat) * 1000, 2),
        "passes": d["passes"],
        "events": d["events"],
        "controller_cpu_us_per_event": per(d["cpu_s"] * 1e6, d["events"], 1),
        "controller_cpu_ms_per_fresh_task": round(d["cpu_s"] / fresh * 1000, 2),
        "controller_commands_per_pass": per(d["commands"], d["passes"], 2),
        "fenced_ops_per_pass": per(d["ops"], d["passes"], 2),
        "redis_calls_all_clients_per_pass": per(all_calls, d["passes"], 1),
        "redis_calls_all_clients_per_fresh_task": round(all_calls / fresh, 1),
        "redis_cpu_ms_per_fresh_task": round((redis_cpu1 - redis_cpu0) / fresh * 1000, 2),
        "controller_rss_mb": rss_mb,
        "takeover": takeover,
        "sim_alive": sim.poll() is None,
    }


def take_over(r: redis.Redis, ctl: Controller) -> dict[str, Any]:
    """Start a second controller and stop the first (it releases the lease): how long the
    new leader's full read and first pass take, and how much that pass moved."""
    url = r.connection_pool.connection_kwargs
    new = Controller(f"redis://127.0.0.1:{url['port']}/0", "qw", ctl.log.with_suffix(".2.log"))
    try:
        time.sleep(0.5)
        ctl.close()
        t0 = time.monotonic()
        line = wait(lambda: _rebuilt(new.log), 120, "the new leader's full read", 0.02)
        return {
            "seconds_to_rebuilt": round(time.monotonic() - t0, 2),
            "read_s": line["read_s"],
            "pass_s": line["pass_s"],
            "moves": line["moves"],
            "tasks": line["tasks"],
            "workers": line["workers"],
        }
    finally:
        new.close()


def _rebuilt(log: Path) -> dict[str, Any] | None:
    for line in log.read_text(errors="replace").splitlines():
        if '"rebuilt"' in line:
            return dict(json.loads(line))
    return None


def rss(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return round(int(line.split()[1]) / 1024, 1)
    return float("nan")


def run_allocator(args: argparse.Namespace) -> dict[str, Any]:
    from queueworks.controller.allocator import Snapshot, TaskView, WorkerView, allocate
    from queueworks.controller.board import Board
    from tests.allocator_oracle import allocate as allocate_at_once

    def best(fn: Any, arg: Any) -> float:
        times = []
        for _ in range(7):
            t0 = time.perf_counter()
            fn(arg)
            times.append(time.perf_counter() - t0)
        return round(min(times) * 1000, 3)

    def cell(snapshot: Snapshot, **what: int) -> dict[str, Any]:
        board = Board.of(snapshot)
        return {
            **what,
            "board_ms": best(allocate, board),
            "before_issue_19_ms": best(allocate_at_once, snapshot),
        }

    out = []
    for workers in (100, 1000):
        ws = tuple(WorkerView(f"w{i:05d}", {"pool": "busy"}, ("bench",)) for i in range(workers))
        held = [
            TaskView(f"r{i:05d}", 3, 1, 1, float(i), {"pool": "busy"}, frozenset([f"w{i:05d}"]))
            for i in range(workers)
        ]
        for queued in (100, 1000, 10_000):
            waiting = [
                TaskView(f"q{i:05d}", i % 3, 1 + i % 2, None, 1e4 + i, {"pool": "busy"})
                for i in range(queued)
            ]
            out.append(cell(Snapshot((*held, *waiting), ws), workers=workers, queued=queued))
    never = [TaskView(f"n{i:05d}", 0, 1, None, float(i), {"gpu": "none"}) for i in range(5000)]
    two = tuple(WorkerView(f"w{i}") for i in range(2))
    out.append(cell(Snapshot(tuple(never), two), workers=2, queued_unrunnable=5000))
    return {"cells": out}


def per(a: float, b: float, digits: int) -> float | None:
    """a / b, or None when b is 0 (a controller that does not count: --controller-src)."""
    return round(a / b, digits) if b else None


def ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 2) if a is not None and b else None


def redis_cpu(r: redis.Redis) -> float:
    info: Any = r.info("cpu")
    return float(info["used_cpu_sys"]) + float(info["used_cpu_user"])


def one_fresh(r: redis.Redis, client: Client) -> float:
    """Submit one fresh task; seconds until a simulated worker saw its assignment."""
    time.sleep(0.02)
    t0 = time.time()
    task = client.submit(spec("fresh", node_selector={"pool": "fresh"}, max_nodes=1))
    while True:
        item: Any = r.blpop(["bench:seen"], timeout=30)
        if item is None:
            raise TimeoutError(f"fresh task {task.id} never assigned")
        tid, seen = item[1].decode().split()
        if tid == task.id:
            break
    wait(lambda: task.status(with_nodes=False).finished, 30, "the fresh task done", 0.002)
    return float(seen) - t0


SLOPED = (
    "latency_ms_p50",
    "controller_cpu_ms_per_fresh_task",
    "controller_cpu_us_per_event",
    "controller_commands_per_pass",
)


def run_grid(args: argparse.Namespace) -> dict[str, Any]:
    """Every cell ``--repeat`` times, the backlogs of one worker count interleaved (the
    machine's load drifts: a ratio is taken within a repetition); each cell reports the
    median over its repetitions, and the slope is the median of the per-repetition ratios."""
    runs: dict[tuple[int, int], list[dict[str, Any]]] = {}
    for workers in args.workers:
        for rep in range(args.repeat):
            for backlog in args.backlog:
                say(f"grid: {backlog} queued x {workers} workers ({rep + 1}/{args.repeat})")
                cell = grid_cell(backlog, workers, args.fresh, args.budget, args.controller_src)
                say("   ->", json.dumps(cell))
                runs.setdefault((backlog, workers), []).append(cell)
    cells = [_median_cell(reps) for reps in runs.values()]
    slopes = {}
    for workers in args.workers:
        lo, hi = runs[(min(args.backlog), workers)], runs[(max(args.backlog), workers)]
        slopes[str(workers)] = {
            f"{name}_ratio": _median([ratio(b[name], a[name]) for a, b in zip(lo, hi, strict=True)])
            for name in SLOPED
        }
        slopes[str(workers)]["latency_ms_p50_ratio_by_repetition"] = [
            ratio(b["latency_ms_p50"], a["latency_ms_p50"]) for a, b in zip(lo, hi, strict=True)
        ]
    return {"repeat": args.repeat, "cells": cells, "slope_100_to_10000": slopes}


def _median(values: list[Any]) -> Any:
    known = [v for v in values if v is not None]
    return round(statistics.median(known), 2) if known else None


def _median_cell(reps: list[dict[str, Any]]) -> dict[str, Any]:
    """Medians over the repetitions; p99 and max: the worst of them."""
    out: dict[str, Any] = {}
    for key, value in reps[0].items():
        values = [r[key] for r in reps]
        if all(v == value for v in values):
            out[key] = value
        elif key in ("latency_ms_p99", "latency_ms_max"):
            out[key] = max(values)
        elif key == "takeover":
            out[key] = {k: _median([v[k] for v in values]) for k in value} if value else {}
        elif isinstance(value, bool) or not isinstance(value, int | float):
            out[key] = value if all(v == value for v in values) else values
        else:
            out[key] = _median(values)
    out["latency_ms_p50_by_repetition"] = [r["latency_ms_p50"] for r in reps]
    return out


# -- backlog ----------------------------------------------------------------------------


def run_backlog(args: argparse.Namespace) -> dict[str, Any]:
    OUT.mkdir(parents=True, exist_ok=True)
    with server() as srv:
        r = srv.client()
        ctl = Controller(srv.url, "qw", OUT / "controller-backlog.log", args.controller_src)
        env = {
            **os.environ,
            "QUEUEWORKS_REDIS_URL": srv.url,
            "QUEUEWORKS_PREFIX": "qw",
            "QUEUEWORKS_LOG_LEVEL": "warning",
            "BENCH_REDIS_URL": srv.url,
            "PYTHONPATH": str(ROOT),
        }
        allow = ["--allow", "bench.peers.jobs", "--allow", "bench.scale_sim"]
        procs = [
            subprocess.Popen(
                [sys.executable, "-m", "queueworks", "worker", "--name", f"w{i}", *allow],
                env=env,
                cwd=ROOT,
            )
            for i in range(2)
        ]
        client = Client.from_url(srv.url)
        try:
            wait(lambda: r.zcard("qw:workers") >= 2, 60, "workers")
            ids = submit_all(
                client, (spec(f"never{k}", node_selector={"gpu": "none"}) for k in range(args.n))
            )
            caught_up = settle_backlog(r, client, ids, args.budget)
            for _ in range(3):
                stamp_once(r, client)
            before = ctl.fresh_stats()
            starts = [stamp_once(r, client) for _ in range(args.tries)]
            after = ctl.fresh_stats()
        finally:
            client.close()
            for p in procs:
                p.terminate()
            for p in procs:
                p.wait(20)
            ctl.close()
    cpu = after["cpu_s"] - before["cpu_s"]
    return {
        "queued_unrunnable": args.n,
        "tries": args.tries,
        "controller_caught_up_s": round(caught_up, 2),
        "start_ms_p50": round(statistics.median(starts) * 1000, 2),
        "start_ms_max": round(max(starts) * 1000, 2),
        "start_ms_all": [round(s * 1000, 1) for s in starts],
        "controller_cpu_ms_per_try": round(cpu / args.tries * 1000, 2),
        "controller_passes_per_try": round((after["passes"] - before["passes"]) / args.tries, 1),
    }


def stamp_once(r: redis.Redis, client: Client) -> float:
    """Submit a task whose one subtask stamps its start: seconds from submit to start."""
    time.sleep(0.05)
    r.delete("bench:lat")
    sent = time.time()
    task = client.submit(
        TaskSpec(
            name="stamp",
            handler="bench.peers.jobs:qw_stamp",
            subtasks=[{"sent": sent}],
            max_nodes=1,
        )
    )
    item: Any = r.blpop(["bench:lat"], timeout=30)
    if item is None:
        raise TimeoutError(f"task {task.id} never started")
    task.wait(timeout=30, poll=0.005)
    return float(item[1])


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    sub = ap.add_subparsers(dest="mode", required=True)
    g = sub.add_parser("grid")
    g.add_argument("--backlog", type=int, nargs="+", default=[100, 1000, 10_000])
    g.add_argument("--workers", type=int, nargs="+", default=[100, 1000])
    g.add_argument("--fresh", type=int, default=50)
    g.add_argument("--repeat", type=int, default=3)
    g.add_argument("--budget", type=float, default=180.0)
    g.add_argument("--controller-src", type=Path, default=ROOT)
    b = sub.add_parser("backlog")
    b.add_argument("--n", type=int, default=5000)
    b.add_argument("--tries", type=int, default=20)
    b.add_argument("--budget", type=float, default=180.0)
    b.add_argument("--controller-src", type=Path, default=ROOT)
    t = sub.add_parser("tasks")
    t.add_argument("--n", type=int, default=1000)
    t.add_argument("--rounds", type=int, default=3)
    t.add_argument("--budget", type=float, default=120.0)
    sub.add_parser("allocator")
    args = ap.parse_args(argv)
    started = time.monotonic()
    if args.mode == "grid":
        result = run_grid(args)
    elif args.mode == "backlog":
        result = run_backlog(args)
    elif args.mode == "allocator":
        result = run_allocator(args)
    else:
        from bench.scale_tasks import run_tasks

        result = run_tasks(args)
    result["command"] = "python -m bench.scale " + " ".join(argv or sys.argv[1:])
    result["date"] = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    result["seconds"] = round(time.monotonic() - started, 1)
    result["load_1m_end"] = round(os.getloadavg()[0], 2)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
