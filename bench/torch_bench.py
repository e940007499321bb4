"""Elastic training benchmarks (issue 7), with real processes on a private Redis:

* steps/s of the example model on 1 and 2 workers (and the same loop as bare gloo
  processes, without queueworks, for the cost of the queue and the commit protocol);
* time from a SIGKILL to the first completed step at the new world size (leader and
  non-leader victims);
* time from a join to the first step that includes the new member (from the join itself,
  and from starting the worker process, which includes importing torch).

    python -m bench.torch_bench                        # defaults, ~3 minutes here
    python -m bench.torch_bench --repeat 6 --shards 3000
    python -m bench.torch_bench --heartbeat 0.25,1.0   # faster failure detection
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import tempfile
import time
import uuid
from functools import partial
from pathlib import Path
from typing import Any

import redis

from bench.common import pct, private_redis, wait_for, wait_workers
from examples.elastic_training import Config, Local, task_spec
from queueworks import Client
from queueworks.protocol.keys import Keys


def rows(r: redis.Redis, key: str) -> list[dict[str, Any]]:
    return [json.loads(x) for x in r.lrange(key, 0, -1)]


class Tail:
    """The step log read incrementally (it grows by hundreds of records a second)."""

    def __init__(self, r: redis.Redis, key: str) -> None:
        self.r, self.key, self.all = r, key, []  # type: list[dict[str, Any]]

    def __call__(self) -> list[dict[str, Any]]:
        more = self.r.lrange(self.key, len(self.all), -1)
        self.all.extend(json.loads(x) for x in more)
        return self.all


def aborted(log: list[dict[str, Any]]) -> int:
    return len({(x["generation"], x["seq"]) for x in log if not x["committed"]})


def first_step(
    log: Tail, *, world: int | None = None, after_epoch: int = -1, worker: str | None = None
) -> dict[str, Any] | None:
    """The earliest committed step with a shard matching the filters, if any yet."""
    got = [
        x
        for x in log()
        if x["committed"]
        and x["shards"]
        and x["epoch"] > after_epoch
        and world in (None, x["world_size"])
        and worker in (None, x["worker"])
    ]
    return min(got, key=lambda x: x["t"]) if got else None


def worker(procs: Local, hb: list[str]) -> str:
    name = f"w-{uuid.uuid4().hex[:6]}"
    p = procs.spawn(
        "worker", "--name", name, "--allow", "examples.elastic_training", *hb, name=name
    )
    procs.workers.append(p)
    return name


def throughput(url: str, logs: Path, workers: int, shards: int) -> dict[str, float]:
    """Steps/s and samples/s over the middle 90% of a run without pacing."""
    prefix = f"tb{uuid.uuid4().hex[:6]}"
    procs = Local(url, prefix, logs)
    r = redis.Redis.from_url(url)
    log = f"{prefix}:steps"
    try:
        procs.controller()
        for _ in range(workers):
            worker(procs, [])
        wait_workers(r, prefix, workers)
        client = Client.from_url(url, prefix=prefix)
        cfg = Config(shards=shards, step_log=log)
        spec = task_spec(cfg).model_copy(update={"min_nodes": workers, "max_nodes": workers})
        task = client.submit(spec)
        task.wait(timeout=900)
        lead = sorted(
            (x for x in rows(r, log) if x["rank"] == 0 and x["committed"] and x["shards"]),
            key=lambda x: x["t"],
        )
        lead = [x for x in lead if x["world_size"] == workers]
        cut = len(lead) // 20
        mid = lead[cut : len(lead) - cut]
        seconds = mid[-1]["t"] - mid[0]["t"]
        samples = sum(len(x["shards"]) for x in mid[1:]) * cfg.shard_size
        return {"steps_s": (len(mid) - 1) / seconds, "samples_s": samples / seconds}
    finally:
        procs.stop()


def _bare(rank: int, world: int, port: int, steps: int, out: Any) -> None:
    """The same model and step (forward, backward, one weighted all-reduce, Adam) in plain
    torch.distributed processes: no Redis, no queue, no commit protocol."""
    import datetime

    import torch
    import torch.distributed as dist

    from examples.elastic_training import build_model, shard_data

    torch.set_num_threads(1)
    cfg = Config()
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=world,
        timeout=datetime.timedelta(seconds=30),
    )
    model = build_model(cfg)
    opt = torch.optim.Adam(model.parameters(), lr=cfg.lr)
    params = list(model.parameters())
    t0 = time.perf_counter()
    for i in range(steps):
        opt.zero_grad()
        x, y = shard_data(cfg, i * world + rank)
        torch.nn.functional.mse_loss(model(x), y).backward()
        buf = torch.cat([p.grad.reshape(-1) * len(x) for p in params] + [torch.tensor([32.0, 0])])
        dist.all_reduce(buf)
        off = 0
        for p in params:
            p.grad = buf[off : off + p.numel()].view_as(p) / buf[-2]
            off += p.numel()
        opt.step()
    if rank == 0:
        out.put(steps / (time.perf_counter() - t0))
    dist.destroy_process_group()


def bare_gloo(world: int, steps: int) -> float:
    from queueworks.contrib.redis_server import free_port

    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    port = free_port()
    ps = [ctx.Process(target=_bare, args=(k, world, port, steps, out)) for k in range(world)]
    for p in ps:
        p.start()
    rate = float(out.get(timeout=300))
    for p in ps:
        p.join(60)
    return rate


def churn(url: str, logs: Path, repeat: int, hb: list[str]) -> dict[str, list[float]]:
    """3 workers train; then, ``repeat`` times: SIGKILL one (alternately the leader and
    not), time the first step at world size 2; start a new worker, time its first step."""
    prefix = f"tc{uuid.uuid4().hex[:6]}"
    procs = Local(url, prefix, logs)
    r = redis.Redis.from_url(url)
    keys = Keys(prefix)
    log = f"{prefix}:steps"
    out: dict[str, list[float]] = {
        "kill_leader": [],
        "kill_other": [],
        "join": [],
        "spawn": [],
        "aborted": [],
    }
    names: dict[str, Any] = {}
    log_rows = Tail(r, log)
    try:
        procs.controller()
        for _ in range(3):
            name = worker(procs, hb)
            names[name] = procs.workers[-1]
        wait_workers(r, prefix, 3)
        client = Client.from_url(url, prefix=prefix)
        task = client.submit(task_spec(Config(shards=100_000, pace=0.01, step_log=log)))
        tk = keys.task(task.id)

        wait_for(partial(first_step, log_rows, world=3), 120, 0.05)
        for i in range(repeat):
            latest = max(log_rows(), key=lambda x: x["t"])
            epoch = latest["epoch"]
            ranks = {x["worker"]: x["rank"] for x in log_rows() if x["epoch"] == epoch}
            leader = i % 2 == 0
            victim = next(w for w, k in ranks.items() if (k == 0) == leader)
            aborted_before = aborted(log_rows())
            killed_at = time.time()
            names.pop(victim).kill()
            step = wait_for(partial(first_step, log_rows, world=2, after_epoch=epoch), 60, 0.02)
            out["kill_leader" if leader else "kill_other"].append(step["t"] - killed_at)
            out["aborted"].append(aborted(log_rows()) - aborted_before)
            spawned_at = time.time()
            name = worker(procs, hb)
            names[name] = procs.workers[-1]
            step = wait_for(partial(first_step, log_rows, worker=name), 120, 0.02)
            joins = [
                f
                for _, f in r.xrange(tk.history)
                if f.get(b"cause") == b"join" and f.get(b"worker") == name.encode()
            ]
            out["join"].append(step["t"] - float(joins[0][b"ts"]))
            out["spawn"].append(step["t"] - spawned_at)
            time.sleep(1.0)  # a few steps at 3 before the next kill
        task.cancel()
    finally:
        procs.stop()
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shards", type=int, default=2000, help="shards per throughput run")
    ap.add_argument("--repeat", type=int, default=4, help="kill/join rounds")
    ap.add_argument("--heartbeat", help="interval,ttl for the churn workers (default 1,3)")
    args = ap.parse_args()
    hb: list[str] = []
    if args.heartbeat:
        interval, ttl = args.heartbeat.split(",")
        hb = ["--heartbeat-interval", interval, "--heartbeat-ttl", ttl]
    logs = Path(tempfile.mkdtemp(prefix="qw-torch-bench-"))  # every process's log
    print(f"cpus: {os.cpu_count()}; shard: 32 samples; model: 8-16-1 MLP, Adam; logs: {logs}")
    with private_redis() as server:
        for n in (1, 2):
            got = throughput(server.url, logs, n, args.shards)
            bare = bare_gloo(n, 1000)
            print(
                f"{n} worker(s): {got['steps_s']:.0f} steps/s, {got['samples_s']:.0f} samples/s"
                f" (bare gloo loop, no queue: {bare:.0f} steps/s)"
            )
        res = churn(server.url, logs, args.repeat, hb)
    for what, label in (
        ("kill_leader", "SIGKILL leader -> first step at new size"),
        ("kill_other", "SIGKILL non-leader -> first step at new size"),
        ("join", "join -> first step with the new member"),
        ("spawn", "worker start -> its first step (incl. imports)"),
    ):
        v = res[what]
        print(f"{label}: p50 {pct(v, 50):.2f} s, max {max(v):.2f} s (n={len(v)})")
    print(f"aborted steps per kill: {res['aborted']}")


if __name__ == "__main__":
    main()
