"""Elastic data-parallel training on a queueworks node set (``queueworks[torch]``).

A small MLP learns a noisy function of 8 inputs (a fixed random "teacher" network). The
data is generated here, deterministically from a seed: shard ``i`` is always the same 32
samples, so every worker rebuilds any shard from its index and nothing is downloaded. The
task has one subtask per shard; the node set runs one shard per member and step.

Run everything locally (a private Redis if none is given), scaling 2 -> 4 -> 1 workers::

    python examples/elastic_training.py --scale 2,4,1

or against your Redis, starting N workers and a controller (``--workers 0``: only submit,
for workers you run yourself with ``queueworks worker --allow examples.elastic_training``)::

    python examples/elastic_training.py --redis redis://localhost:6379/0 --workers 2

At the end it prints the final loss next to a single-process run over the same shards.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from dataclasses import asdict
from pathlib import Path
from typing import Any

import redis
import torch
from pydantic import BaseModel, ConfigDict, Field

from queueworks import Client, TaskSpec
from queueworks.torch import ElasticTrainer, StepContext, StepRecord, wait_released

ROOT = Path(__file__).resolve().parent.parent  # workers import this module from here

HANDLER = "examples.elastic_training:make_trainer"
PRINT_EVERY = 4.0  # seconds between progress lines


class Config(BaseModel):
    """The experiment; travels in ``TaskSpec.options["example"]`` to every worker."""

    model_config = ConfigDict(extra="forbid")

    seed: int = 7
    shards: int = Field(default=600, ge=1)
    shard_size: int = Field(default=32, ge=1)
    features: int = 8
    hidden: int = 16
    noise: float = 0.3
    lr: float = 0.01
    eval_size: int = 4096
    pace: float = Field(default=0.0, ge=0)  # extra seconds per shard (to watch it scale)
    step_log: str | None = None  # a Redis list to append every member's StepRecord to


# -- data and model (deterministic from the seed) -------------------------------------------


def _teacher(cfg: Config) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(cfg.seed)
    w1 = torch.randn(cfg.features, cfg.hidden, generator=g) / cfg.features**0.5
    w2 = torch.randn(cfg.hidden, 1, generator=g) / cfg.hidden**0.5
    return w1, w2


def shard_data(cfg: Config, shard: int, size: int | None = None) -> tuple[torch.Tensor, ...]:
    """Shard ``i`` (``-1``: the evaluation set): inputs and noisy targets."""
    w1, w2 = _teacher(cfg)
    g = torch.Generator().manual_seed(cfg.seed * 1_000_003 + shard + 2)
    x = torch.randn(size or cfg.shard_size, cfg.features, generator=g)
    y = torch.tanh(x @ w1) @ w2 + cfg.noise * torch.randn(x.shape[0], 1, generator=g)
    return x, y


def build_model(cfg: Config) -> torch.nn.Module:
    torch.manual_seed(cfg.seed)
    return torch.nn.Sequential(
        torch.nn.Linear(cfg.features, cfg.hidden),
        torch.nn.Tanh(),
        torch.nn.Linear(cfg.hidden, 1),
    )


def eval_loss(cfg: Config, model: torch.nn.Module) -> float:
    x, y = shard_data(cfg, -1, cfg.eval_size)
    with torch.no_grad():
        return float(torch.nn.functional.mse_loss(model(x), y))


def single_process(cfg: Config) -> float:
    """The reference: one process, one shard per step, every shard once, in order."""
    model = build_model(cfg)
    opt = torch.optim.Adam(model.parameters(), lr=cfg.lr)
    for i in range(cfg.shards):
        opt.zero_grad()
        x, y = shard_data(cfg, i)
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
    return eval_loss(cfg, model)


# -- the trainer factory the workers call ----------------------------------------------------


def make_trainer(ctx: StepContext) -> ElasticTrainer:
    cfg = Config.model_validate(ctx.options.get("example", {}))
    torch.set_num_threads(1)  # one core per worker process
    model = build_model(cfg)
    opt = torch.optim.Adam(model.parameters(), lr=cfg.lr)

    def loss_fn(model: torch.nn.Module, payload: Any) -> tuple[torch.Tensor, int]:
        x, y = shard_data(cfg, int(payload["shard"]))
        if cfg.pace:
            time.sleep(cfg.pace)
        return torch.nn.functional.mse_loss(model(x), y), x.shape[0]

    def on_step(record: StepRecord) -> None:
        if cfg.step_log:
            ctx.redis.rpush(cfg.step_log, json.dumps({**asdict(record), "t": time.time()}))

    return ElasticTrainer(ctx, model, opt, loss_fn, on_step=on_step)


def task_spec(cfg: Config, *, checkpoint: str | None = None, **torch_options: Any) -> TaskSpec:
    """One subtask per shard; ``checkpoint``: a path the leader saves to (and resumes from)."""
    if checkpoint:
        torch_options["checkpoint_path"] = checkpoint
    return TaskSpec(
        name="elastic-training",
        handler=HANDLER,
        mode="step",
        subtasks=({"shard": i} for i in range(cfg.shards)),
        options={"example": cfg.model_dump(), "torch": torch_options},
        max_attempts=5,
    )


# -- running it as a script ------------------------------------------------------------------


class Local:
    """Worker and controller processes of this demo (and a private Redis if needed)."""

    def __init__(self, url: str, prefix: str, logs: Path) -> None:
        self.url, self.prefix, self.logs = url, prefix, logs
        self.env = {
            **os.environ,
            "QUEUEWORKS_REDIS_URL": url,
            "QUEUEWORKS_PREFIX": prefix,
            "QUEUEWORKS_TORCH_HOST": "127.0.0.1",
            "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
        }
        self.workers: list[subprocess.Popen[bytes]] = []
        self.others: list[subprocess.Popen[bytes]] = []

    def spawn(self, *args: str, name: str) -> subprocess.Popen[bytes]:
        out = (self.logs / f"{name}.log").open("ab")
        return subprocess.Popen(
            [sys.executable, "-m", "queueworks", *args],
            env=self.env,
            cwd=ROOT,
            stdout=out,
            stderr=out,
        )

    def controller(self) -> None:
        self.others.append(self.spawn("controller", name="controller"))

    def scale(self, n: int) -> None:
        while len(self.workers) < n:
            name = f"worker-{len(self.workers) + 1}-{uuid.uuid4().hex[:4]}"
            args = ("worker", "--name", name, "--allow", "examples.elastic_training")
            self.workers.append(self.spawn(*args, name=name))
        while len(self.workers) > n:  # the newest leave gracefully (SIGTERM)
            p = self.workers.pop()
            p.send_signal(signal.SIGTERM)
            self.others.append(p)

    def stop(self) -> None:
        """Warm stop of everything, SIGKILL after 15 s."""
        for p in [*self.workers, *self.others]:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in [*self.workers, *self.others]:
            try:
                p.wait(15)
            except subprocess.TimeoutExpired:
                p.kill()


def _summary(r: redis.Redis, log_key: str, shard_size: int) -> list[str]:
    """Steps and samples per node-set size, from the leader's records."""
    rows = [json.loads(x) for x in r.lrange(log_key, 0, -1)]
    lead = [x for x in rows if x["rank"] == 0 and x["committed"] and x["shards"]]
    steps = Counter(x["world_size"] for x in lead)
    samples = Counter({n: 0 for n in steps})
    for x in lead:
        samples[x["world_size"]] += len(x["shards"]) * shard_size
    aborted = len({(x["generation"], x["seq"]) for x in rows if not x["committed"]})
    out = [f"  {n} worker(s): {steps[n]} steps, {samples[n]} samples" for n in sorted(steps)]
    return [*out, f"  aborted steps: {aborted} (their shards ran again in a later step)"]


def _run(task: Any, local: Local, plan: list[int], every: float, workdir: Path) -> Any:
    """Scale on schedule and print progress until the task is finished."""
    t0 = time.monotonic()
    next_scale, next_print, last = t0 + every, t0 + PRINT_EVERY, (t0, 0)
    pending = plan[1:]
    while not (status := task.status()).finished:
        now = time.monotonic()
        if pending and now >= next_scale:
            print(f"{now - t0:5.1f} s  scaling to {pending[0]} worker(s)")
            local.scale(pending.pop(0))
            next_scale = now + every
        if now >= next_print:
            rate = (status.done - last[1]) / (now - last[0])
            print(
                f"{now - t0:5.1f} s  node set of {len(status.nodes)}:"
                f" {status.done}/{status.total} shards, {rate:.0f} shards/s"
            )
            next_print, last = now + PRINT_EVERY, (now, status.done)
        if local.workers and all(p.poll() is not None for p in local.workers):
            raise SystemExit(f"every worker exited; see the logs in {workdir}")
        time.sleep(0.2)
    return status


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--redis", help="Redis URL (default: start a private redis-server)")
    ap.add_argument("--prefix", default=f"ex{uuid.uuid4().hex[:6]}", help="key prefix")
    ap.add_argument("--workers", type=int, default=2, help="workers to start (0: only submit)")
    ap.add_argument("--scale", help="worker counts over time, e.g. 2,4,1 (overrides --workers)")
    ap.add_argument("--every", type=float, default=12.0, help="seconds between --scale changes")
    ap.add_argument("--no-controller", action="store_true", help="one runs already")
    ap.add_argument("--shards", type=int, help="shards [600; 1800 with --scale]")
    ap.add_argument("--pace", type=float, help="extra seconds per shard [0; 0.03 with --scale]")
    ap.add_argument("--checkpoint", help="checkpoint file (default: a temporary one)")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)  # the reference run at the end is tiny, as the workers' steps

    from queueworks.contrib.redis_server import RedisServer

    server = None
    if args.redis is None:
        server = RedisServer()
        server.start()
    url = args.redis or server.url  # type: ignore[union-attr]
    workdir = Path(tempfile.mkdtemp(prefix="qw-elastic-"))
    checkpoint = args.checkpoint or str(workdir / "model.pt")
    plan = [int(n) for n in args.scale.split(",")] if args.scale else [args.workers]
    shards = args.shards or (1800 if args.scale else 600)
    pace = args.pace if args.pace is not None else (0.03 if args.scale else 0.0)
    log_key = f"{args.prefix}:example:steps"
    cfg = Config(shards=shards, pace=pace, step_log=log_key)
    local = Local(url, args.prefix, workdir)
    client = Client.from_url(url, prefix=args.prefix)
    try:
        if plan[0] > 0 and not args.no_controller:
            local.controller()
        local.scale(plan[0])
        task = client.submit(task_spec(cfg, checkpoint=checkpoint))
        print(f"task {task.id}: {cfg.shards} shards of {cfg.shard_size} samples; logs: {workdir}")
        _run(task, local, plan, args.every, workdir)
        status = wait_released(task)  # the leader's last checkpoint is written as it leaves
        print(f"{status.state}: {status.done}/{status.total} shards, {status.dead} dead")
        for line in _summary(client.redis, log_key, cfg.shard_size):
            print(line)
        model = build_model(cfg)
        state = torch.load(checkpoint, map_location="cpu", weights_only=True)
        model.load_state_dict(state["model"])
        print(f"final loss {eval_loss(cfg, model):.4f} after {state['progress']['steps']} steps")
        print(f"single-process loss {single_process(cfg):.4f} over the same {cfg.shards} shards")
    finally:
        local.stop()
        client.close()
        if server is not None:
            server.stop()


if __name__ == "__main__":
    main()
