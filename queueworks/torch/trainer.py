"""``ElasticTrainer``: the step trainer (``queueworks.task.steps.StepTrainer``) for a torch
model, optimizer and loss function; it forms each generation's group (``rendezvous``),
keeps every member's state identical (``state``) and checkpoints (``checkpoints``).

Steps: ``prepare`` runs forward and backward on this member's shard; ``reduce`` is one
all-reduce of ``grad * n`` plus ``n`` and ``loss * n`` (zero for a member with no shard), so
the update equals one step on all the step's samples together; ``apply`` applies it as soon
as the all-reduce completed (a completed collective commits the step), and ``commit`` then
records it (checkpoint, ``on_step``) once the loop has read the step's end. Every
collective has a short timeout (``collective_timeout``, 10 s), and a member whose
collective fails destroys its group at once, so peers never wait for a vanished one.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch._dynamo  # the first optimizer imports it (~1 s): pay before joining, not after
import torch.distributed as dist

from queueworks.protocol.models import TaskStatus
from queueworks.task.steps import Generation, StepContext, StepInfo
from queueworks.task.tasks import Task
from queueworks.torch.checkpoints import Checkpoints
from queueworks.torch.options import LossFn, StepRecord, TorchOptions
from queueworks.torch.rendezvous import Group
from queueworks.torch.state import TrainState

ENV_HOST = "QUEUEWORKS_TORCH_HOST"  # the address peers reach this worker at


class ElasticTrainer:
    """A ``queueworks.task.steps.StepTrainer`` for a torch model, optimizer and loss function.

    ``loss_fn(model, payload) -> (mean loss, sample count)`` computes the loss of one shard.
    ``on_step(record)`` is called after every step on every member (for logs, metrics).
    ``steps`` and ``samples`` count the updates and samples applied so far.
    """

    def __init__(
        self,
        ctx: StepContext,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        loss_fn: LossFn,
        *,
        on_step: Callable[[StepRecord], None] | None = None,
    ) -> None:
        self.ctx = ctx
        self.opts = TorchOptions.model_validate(ctx.options.get("torch", {}))
        self.device = _device(self.opts.device)
        host = self.opts.host or os.environ.get(ENV_HOST) or _default_host()
        self.model = model.to(self.device)
        self.optimizer = optimizer
        self.loss_fn = loss_fn
        self.on_step = on_step
        self.group = Group(ctx, self.opts, self.device, host)
        self.state = TrainState(self.model, optimizer, self.device)
        self.checkpoints = Checkpoints(self.opts, ctx, self.state)
        self._params = [p for p in self.model.parameters() if p.requires_grad]
        self._dtype = _common_dtype(self._params)
        self._last_gen: Generation | None = None
        self._local = (0.0, 0.0)  # this step: samples, loss * samples
        self._reduced: torch.Tensor | None = None  # averaged gradient, awaiting commit
        self._total = 0.0
        self._loss: float | None = None
        self._torch_role = (-1, -1)
        self._early: _Applied | None = None  # applied by ``apply``, its end not read yet
        self._stale = False  # a step committed without us: behind until the next sync
        self._ahead = False  # applied a step the node set did not commit (we were pruned)
        self.checkpoints.resume()

    @property
    def steps(self) -> int:
        return self.state.steps

    @property
    def samples(self) -> int:
        return self.state.samples

    # -- the StepTrainer protocol ---------------------------------------------------------

    def on_role(self, gen: Generation) -> None:
        self.group.form(gen)
        self._last_gen = gen
        src, size = self.state.sync(self.group, gen, ahead=self._ahead)
        if self._ahead and src == gen.role.rank:  # nobody else to take the state from
            self.ctx.log.warning("state_kept_ahead", steps=self.steps)
        self._stale = self._ahead = False
        self.ctx.log.info("state_synced", source_rank=src, steps=self.steps, bytes=size)

    def prepare(self, payload: Any | None) -> None:
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        self._reduced, self._total, self._loss = None, 0.0, None
        self._torch_role = (-1, -1)
        self._local = (0.0, 0.0)
        if payload is None:
            return
        loss, n = self.loss_fn(self.model, payload)
        torch.autograd.backward(loss)
        self._local = (float(n), float(loss.detach()) * float(n))

    def reduce(self) -> dict[str, Any]:
        n, loss_sum = self._local
        parts = [
            (p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1).to(self._dtype)
            for p in self._params
        ]
        meta = torch.tensor([n, loss_sum], dtype=self._dtype, device=self.device)
        buf = torch.cat([*parts, meta]) if parts else meta
        if parts:
            buf[:-2].mul_(n)
        self.group.collective(lambda: self._all_reduce(buf))
        self._torch_role = (dist.get_rank(), dist.get_world_size())
        total = float(buf[-2])
        self._total = total
        if total > 0:
            self._reduced = buf[:-2] / total
            self._loss = float(buf[-1]) / total
        gen = self.group.gen
        assert gen is not None
        return {
            "loss": self._loss,
            "samples": int(n),
            "step_samples": int(total),
            "world_size": gen.role.world_size,
            "generation": gen.id,
        }

    def _all_reduce(self, buf: torch.Tensor) -> None:
        """The all-reduce, with the loop's own work (``ctx.meanwhile``) done while it runs."""
        work = dist.all_reduce(buf, async_op=True)
        assert work is not None
        try:
            self.ctx.meanwhile()
        except BaseException:
            self.group.drop()  # the step cannot go on: peers blocked with us fail now
            raise
        work.wait()

    def apply(self) -> None:
        """Apply the update now: the all-reduce completed, so the step commits unless this
        member was pruned meanwhile (``abort`` then says so)."""
        self._early = self._apply()

    def _apply(self) -> _Applied:
        done = _Applied(self._reduced is not None, self._loss, self._torch_role)
        if self._reduced is not None:
            offset = 0
            for p in self._params:
                k = p.numel()
                p.grad = self._reduced[offset : offset + k].view_as(p).to(p.dtype)
                offset += k
            self.optimizer.step()
            self.state.steps += 1
            self.state.samples += int(self._total)
        self._reduced = None
        return done

    def commit(self, info: StepInfo) -> None:
        done, self._early = self._early or self._apply(), None
        if done.applied:
            gen = self.group.gen
            if gen is not None and gen.role.leader:
                self.checkpoints.maybe(stale=self._stale)
        self._emit(info, done)

    def abort(self, info: StepInfo) -> None:
        done = self._early or _Applied(False, self._loss, self._torch_role)
        self._early = None
        if done.applied and not info.committed:
            self._ahead = True  # the next on_role takes the state from a peer
        elif info.committed and not done.applied:
            self._stale = True  # the others applied it; the next on_role brings us level
        self._emit(info, done)
        self._reduced = None

    def close(self, reason: str) -> None:
        gen = self._last_gen
        leader = gen is not None and gen.role.leader
        if leader and reason in ("finished", "stopping", "revoked"):
            self.checkpoints.save(wait=True, stale=self._stale)
        self.checkpoints.join()
        self.group.close(forget=leader and reason == "finished")

    def _emit(self, info: StepInfo, done: _Applied) -> None:
        if self.on_step is None:
            return
        role = self.ctx.role
        self.on_step(
            StepRecord(
                worker=self.ctx.worker_id,
                generation=info.generation.id,
                seq=info.seq,
                epoch=role.epoch,
                rank=role.rank,
                world_size=role.world_size,
                torch_rank=done.torch_role[0],
                torch_world_size=done.torch_role[1],
                shards=info.shards,
                own=info.own,
                committed=info.committed,
                applied=done.applied,
                steps=self.steps,
                loss=done.loss,
            )
        )


@dataclass(frozen=True)
class _Applied:
    """What a step did to this member: whether it applied an update, and for the record
    (``on_step``) its loss and torch rank and world size (``prepare`` resets them)."""

    applied: bool
    loss: float | None
    torch_role: tuple[int, int]


def wait_released(task: Task, timeout: float = 60.0, poll: float = 0.1) -> TaskStatus:
    """Wait until ``task`` has finished and every member has left its node set.

    ``task.wait()`` returns when the last shard is acked; the leader writes its last
    checkpoint just after, as it leaves: read the checkpoint after this returns.
    """
    deadline = time.monotonic() + timeout
    while True:
        status = task.status()
        if status.finished and not status.nodes:
            return status
        if time.monotonic() > deadline:
            raise TimeoutError(f"task {task.id} still has members after {timeout} s")
        time.sleep(poll)


def load_checkpoint(path: str | Path, model: torch.nn.Module) -> dict[str, Any]:
    """Load a checkpoint file into ``model``; returns its progress (steps, samples)."""
    state = torch.load(Path(path), map_location="cpu", weights_only=True)
    model.load_state_dict(state["model"])
    return dict(state["progress"])


def _common_dtype(params: Sequence[torch.Tensor]) -> torch.dtype:
    dtypes = {p.dtype for p in params}
    if len(dtypes) == 1 and torch.float64 in dtypes:
        return torch.float64
    return torch.float32


def _device(name: str | None) -> torch.device:
    """The option, else CUDA (this process's current device: one GPU per worker, picked with
    CUDA_VISIBLE_DEVICES), else the CPU."""
    if name:
        return torch.device(name)
    if torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _default_host() -> str:
    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError:
        return "127.0.0.1"
