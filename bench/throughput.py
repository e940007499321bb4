"""Core benchmarks: end-to-end throughput (no-op handler) and submit rate.

    python -m bench.throughput        # 20,000 subtasks on 1 and 2 workers; 100,000 submitted
    python -m bench.throughput --n 20000 --submit-n 100000 --repeat 3

Also runs a *baseline* consumer — XREADGROUP COUNT 100 + the same settle Lua, with no
heartbeat, watcher, fencing or roles — in the same process layout, so the ratio
worker/baseline is the cost of the membership machinery. Each worker run and its baseline
run go back to back (order alternating), and the ratio reported first is the median of
those pairs, which a shared machine's drifting load affects least.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import time
import uuid

import redis

from bench.common import Procs, private_redis, wait_for, wait_workers
from queueworks import Client, Task, TaskSpec
from queueworks.examples import noop
from queueworks.protocol.keys import Keys
from queueworks.protocol.messages import decode_subtask, to_json
from queueworks.scripts.bound import Scripts


def run_workers(url: str, n: int, workers: int) -> float:
    """subtasks/s from the end of submit to completion, with real worker processes
    (registered, warm and idle beforehand, as in a running pool: each has run a small
    task first), so it includes assignment and joining."""
    prefix = f"b{uuid.uuid4().hex[:6]}"
    procs = Procs(url, prefix)
    r = redis.Redis.from_url(url)
    try:
        procs.spawn("controller")
        for i in range(workers):
            procs.worker(f"w{i}")
        wait_workers(r, prefix, workers)
        client = Client.from_url(url, prefix=prefix)

        def noop_task(count: int) -> Task:
            return client.submit(
                TaskSpec(
                    name="noop",
                    handler="queueworks.examples:noop",
                    subtasks=({"x": i} for i in range(count)),
                    min_nodes=workers,
                    max_nodes=workers,
                )
            )

        noop_task(20 * workers).wait(timeout=60, poll=0.005)
        wait_for(lambda: all(w.task is None for w in client.workers()), 30)
        task = noop_task(n)
        t0 = time.time()
        status = task.wait(timeout=600, poll=0.005)
        assert status.done == n, status
        assert status.finished_at
        return n / (status.finished_at - t0)
    finally:
        procs.stop_all()


def _baseline_consumer(url: str, prefix: str, task_id: str, name: str) -> None:
    r = redis.Redis.from_url(url)
    tk = Keys(prefix).task(task_id)
    scripts = Scripts(r)
    r.blpop([f"{prefix}:go:{name}"], timeout=60)
    while True:
        reply = r.xreadgroup(tk.group, name, {tk.stream: ">"}, count=100)
        if not reply:
            return
        ok = []
        for entry_id, fields in reply[0][1]:
            # the same per-subtask work as the worker: decode, run the handler, encode
            sub = decode_subtask(entry_id.decode(), fields)
            ok.append((sub.entry_id, sub.index, to_json(noop(sub.payload), "result")))
        scripts.settle(tk, tk.stream, name, time.time(), ok)


def run_baseline(url: str, n: int, workers: int) -> float:
    """The same read + settle path with no membership machinery at all."""
    prefix = f"b{uuid.uuid4().hex[:6]}"
    r = redis.Redis.from_url(url)
    client = Client.from_url(url, prefix=prefix)
    task = client.submit(
        TaskSpec(
            name="noop", handler="queueworks.examples:noop", subtasks=({"x": i} for i in range(n))
        )
    )
    ctx = mp.get_context("spawn")
    procs = [
        ctx.Process(target=_baseline_consumer, args=(url, prefix, task.id, f"c{i}"))
        for i in range(workers)
    ]
    for p in procs:
        p.start()
    wait_for(lambda: r.execute_command("CLIENT", "LIST").count(b"cmd=blpop") >= workers, 60)
    t0 = time.time()
    for i in range(workers):
        r.rpush(f"{prefix}:go:c{i}", 1)
    status = task.wait(timeout=600, poll=0.005)
    for p in procs:
        p.join()
    assert status.done == n and status.finished_at
    return n / (status.finished_at - t0)


def run_submit(url: str, n: int) -> float:
    prefix = f"b{uuid.uuid4().hex[:6]}"
    client = Client.from_url(url, prefix=prefix)
    payloads = [{"x": i} for i in range(n)]
    t0 = time.perf_counter()
    client.submit(TaskSpec(name="submit", handler="queueworks.examples:noop", subtasks=payloads))
    return n / (time.perf_counter() - t0)


def fsync_compare(n: int, repeat: int) -> None:
    """The price of durability: the same 2-worker run against AOF off, everysec, always."""
    from queueworks.contrib.redis_server import RedisServer

    rows: dict[str, list[float]] = {"aof off": [], "everysec": [], "always": []}
    servers = {
        "aof off": RedisServer(),
        "everysec": RedisServer(appendonly=True, appendfsync="everysec"),
        "always": RedisServer(appendonly=True, appendfsync="always"),
    }
    try:
        for srv in servers.values():
            srv.start()
        for _ in range(repeat):
            for name, srv in servers.items():
                rows[name].append(run_workers(srv.url, n, 2))
    finally:
        for srv in servers.values():
            srv.close()
    print(f"n={n} repeat={repeat}, 2 workers, subtasks/s (median)")
    base = sorted(rows["aof off"])[repeat // 2]
    for name, vals in rows.items():
        med = sorted(vals)[repeat // 2]
        print(f"{name:<10} {med:>9,.0f}   x{med / base:.2f}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=20_000)
    ap.add_argument("--submit-n", type=int, default=100_000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--workers", type=int, nargs="+", default=[1, 2], help="process counts")
    ap.add_argument(
        "--fsync",
        action="store_true",
        help="compare AOF off / appendfsync everysec / always (2 workers)",
    )
    args = ap.parse_args()
    if args.fsync:
        fsync_compare(args.n, args.repeat)
        return
    with private_redis() as server:
        rows: dict[str, list[float]] = {}
        for rep in range(args.repeat):
            for w in args.workers:
                # back to back, in alternating order: each pair sees the same machine
                runs = [("worker", run_workers), ("baseline", run_baseline)]
                for name, run in runs if rep % 2 == 0 else runs[::-1]:
                    rows.setdefault(f"{name} x{w}", []).append(run(server.url, args.n, w))
            rows.setdefault("submit", []).append(run_submit(server.url, args.submit_n))
            server.client().flushall()
    print(f"n={args.n} submit_n={args.submit_n} repeat={args.repeat} (best / median, per s)")
    for name, vals in rows.items():
        print(f"{name:<14} best {max(vals):>9,.0f}   median {_median(vals):>9,.0f}")
    for w in args.workers:
        pairs = zip(rows[f"worker x{w}"], rows[f"baseline x{w}"], strict=True)
        print(
            f"worker/baseline x{w}: {_median([a / b for a, b in pairs]):.2f} median of pairs, "
            f"{_median(rows[f'worker x{w}']) / _median(rows[f'baseline x{w}']):.2f} of medians"
        )


def _median(values: list[float]) -> float:
    return sorted(values)[len(values) // 2]


if __name__ == "__main__":
    main()
