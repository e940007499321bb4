"""The training job of ``bench.torchrun_vs``, and its ``torchrun`` script.

Both systems train this job: the same data, model, optimizer and per-step work, and the
same step log. Nothing here imports queueworks, so the torchrun workers pay only for torch.

* **Data.** Shard ``i`` is always the same ``shard_size`` samples of a noisy function of 8
  inputs (generated from the seed, nothing downloaded); shard ``-1`` is the evaluation set.
* **A step.** Each rank takes one shard (or none, with zero weight, when the data runs
  out), computes forward and backward, sleeps ``pace`` seconds (the pacing that makes a
  step long enough for a change to land mid-run), then one all-reduce of
  ``[grad * n, n, loss * n]`` gives the gradient of one step over all the step's samples,
  and Adam applies it. So a step's global batch is ``world_size`` shards in both systems.
* **The step log.** Every rank appends one JSON line per step to its own file
  ``<log_dir>/<system>-<pid>.jsonl``: system, generation, step (updates applied so far),
  world size, rank, the step's shards, committed, time.

The torchrun script is the elastic pattern of torch's own docs: load the snapshot on start,
train, save a snapshot every ``checkpoint_steps`` steps (rank 0, atomically) and at the
end. Its position in the data is in the snapshot (``offset``: shards consumed so far); a
step at world size W trains shards ``offset .. offset + W - 1``, so a restart at any size
resumes where the snapshot was taken::

    torchrun --nnodes=1:4 --nproc-per-node=1 --rdzv-backend=c10d \\
        --rdzv-endpoint=127.0.0.1:29400 --rdzv-id=job --max-restarts=20 \\
        -m bench.torchrun_job --job '{"shards": 600}' --log-dir /tmp/logs \\
        --checkpoint /tmp/snap.pt
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import random
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, TextIO

import torch
import torch.distributed as dist

COLLECTIVE_TIMEOUT = 10.0  # seconds; queueworks' collective_timeout default


@dataclass(frozen=True)
class Job:
    """The experiment both systems run."""

    shards: int = 2400
    shard_size: int = 32
    pace: float = 0.03  # seconds of extra work per shard, on every rank that has one
    seed: int = 7
    features: int = 8
    hidden: int = 16
    noise: float = 0.3
    lr: float = 0.01
    eval_size: int = 4096
    checkpoint_steps: int = 20

    @classmethod
    def from_json(cls, text: str) -> Job:
        return cls(**json.loads(text))

    def to_json(self) -> str:
        return json.dumps(asdict(self))


# -- data, model, loss (deterministic from the seed) ----------------------------------------


def shard_data(job: Job, shard: int, size: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(job.seed)
    w1 = torch.randn(job.features, job.hidden, generator=g) / job.features**0.5
    w2 = torch.randn(job.hidden, 1, generator=g) / job.hidden**0.5
    g = torch.Generator().manual_seed(job.seed * 1_000_003 + shard + 2)
    x = torch.randn(size or job.shard_size, job.features, generator=g)
    y = torch.tanh(x @ w1) @ w2 + job.noise * torch.randn(x.shape[0], 1, generator=g)
    return x, y


def build_model(job: Job) -> torch.nn.Module:
    torch.manual_seed(job.seed)
    return torch.nn.Sequential(
        torch.nn.Linear(job.features, job.hidden),
        torch.nn.Tanh(),
        torch.nn.Linear(job.hidden, 1),
    )


def build_optimizer(job: Job, model: torch.nn.Module) -> torch.optim.Optimizer:
    return torch.optim.Adam(model.parameters(), lr=job.lr)


def shard_loss(job: Job, model: torch.nn.Module, shard: int) -> tuple[torch.Tensor, int]:
    """The per-shard work of both systems: the loss of one shard, then the pacing."""
    x, y = shard_data(job, shard)
    loss = torch.nn.functional.mse_loss(model(x), y)
    if job.pace:
        time.sleep(job.pace)
    return loss, x.shape[0]


def eval_loss(job: Job, model: torch.nn.Module) -> float:
    """The figure both systems' final models are judged by: MSE on the evaluation set."""
    x, y = shard_data(job, -1, job.eval_size)
    with torch.no_grad():
        return float(torch.nn.functional.mse_loss(model(x), y))


def checkpoint_loss(job: Job, path: str | Path) -> tuple[float, int]:
    """A snapshot's evaluation loss and its step count."""
    state = torch.load(path, map_location="cpu", weights_only=True)
    model = build_model(job)
    model.load_state_dict(state["model"])
    return eval_loss(job, model), int(state["progress"]["steps"])


def reference_loss(job: Job) -> float:
    """One process over the same shards: one shard per step, every shard once, in order."""
    model = build_model(job)
    opt = build_optimizer(job, model)
    for i in range(job.shards):
        opt.zero_grad()
        x, y = shard_data(job, i)
        torch.autograd.backward(torch.nn.functional.mse_loss(model(x), y))
        opt.step()
    return eval_loss(job, model)


# -- the step log ---------------------------------------------------------------------------


class StepLog:
    """One JSON line per step, appended to this process's own file and flushed."""

    def __init__(self, log_dir: str | Path, system: str) -> None:
        self.system = system
        path = Path(log_dir) / f"{system}-{os.getpid()}.jsonl"
        self._f: TextIO = path.open("a", buffering=1)

    def write(self, **fields: Any) -> None:
        self._f.write(json.dumps({"sys": self.system, **fields, "t": time.time()}) + "\n")


# -- the torchrun script ------------------------------------------------------------------


def process_start() -> float:
    """When this process was started (wall clock, from /proc): its start-up is measured."""
    fields = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
    started = int(fields[19]) / os.sysconf("SC_CLK_TCK")  # seconds after boot
    uptime = float(Path("/proc/uptime").read_text().split()[0])
    return time.time() - (uptime - started)


def _save(
    path: Path, model: torch.nn.Module, opt: torch.optim.Optimizer, progress: dict[str, int]
) -> None:
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    with tmp.open("wb") as f:
        torch.save(
            {"model": model.state_dict(), "optimizer": opt.state_dict(), "progress": progress}, f
        )
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _all_reduce_step(job: Job, model: torch.nn.Module, shard: int | None) -> float:
    """Forward/backward on this rank's shard (if any), then one weighted all-reduce."""
    params = [p for p in model.parameters()]
    n, loss_sum = 0.0, 0.0
    if shard is not None:
        loss, count = shard_loss(job, model, shard)
        torch.autograd.backward(loss)
        n, loss_sum = float(count), float(loss.detach()) * count
    parts = [
        (p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1) * n for p in params
    ]
    buf = torch.cat([*parts, torch.tensor([n, loss_sum])])
    dist.all_reduce(buf)
    total = float(buf[-2])
    off = 0
    for p in params:
        p.grad = (buf[off : off + p.numel()] / total).view_as(p).clone()
        off += p.numel()
    return float(buf[-1]) / total


def torchrun_main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description="the job as a torchrun elastic script")
    ap.add_argument("--job", required=True, help="Job as JSON")
    ap.add_argument("--log-dir", required=True)
    ap.add_argument("--checkpoint", required=True, help="snapshot file (loaded on start)")
    args = ap.parse_args(argv)
    job = Job.from_json(args.job)
    torch.set_num_threads(1)  # one core per worker process, as the queueworks workers
    log = StepLog(args.log_dir, "torchrun")
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=COLLECTIVE_TIMEOUT))
    rank, world = dist.get_rank(), dist.get_world_size()
    model = build_model(job)
    opt = build_optimizer(job, model)
    snap = Path(args.checkpoint)
    progress = {"steps": 0, "offset": 0}
    if snap.exists():  # every rank loads the snapshot: identical state without a broadcast
        state = torch.load(snap, map_location="cpu", weights_only=True)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        progress = {k: int(v) for k, v in state["progress"].items()}
    gen = torch.tensor([random.getrandbits(48) if rank == 0 else 0])
    dist.broadcast(gen, 0)  # names this run of the group in the step log
    generation = f"{int(gen):x}"
    log.write(
        event="start",
        gen=generation,
        world=world,
        rank=rank,
        launched=process_start(),
        restart=int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")),
        **progress,
    )
    while progress["offset"] < job.shards:
        model.train()
        opt.zero_grad(set_to_none=True)
        first = progress["offset"]
        shard = first + rank if first + rank < job.shards else None
        loss = _all_reduce_step(job, model, shard)
        opt.step()
        progress["steps"] += 1
        progress["offset"] = min(job.shards, first + world)
        log.write(
            gen=generation,
            step=progress["steps"],
            world=world,
            rank=rank,
            shards=list(range(first, progress["offset"])),
            committed=True,
            loss=loss,
        )
        if rank == 0 and progress["steps"] % job.checkpoint_steps == 0:
            _save(snap, model, opt, progress)
    if rank == 0:
        _save(snap, model, opt, progress)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    torchrun_main()
