"""Elastic data-parallel training with torch on a node set: ``ElasticTrainer``.

Install the extra: ``pip install 'queueworks[torch]'``. ``import queueworks`` never imports
torch; only this module does. A task in step mode (``TaskSpec(mode="step")``) names a
factory that builds the trainer on every member::

    def make_trainer(ctx: StepContext) -> ElasticTrainer:
        model = torch.nn.Linear(8, 1)
        opt = torch.optim.Adam(model.parameters(), lr=1e-2)
        return ElasticTrainer(ctx, model, opt, loss_fn)   # loss_fn(model, payload) -> (loss, n)

What it does for every generation of the node set (see ``queueworks.steps``):

* **Rendezvous through Redis.** The leader (rank 0) opens a fresh ``TCPStore`` on a free
  port and publishes ``host:port`` with the generation under the task's ``rdzv`` key; the
  others wait for exactly that generation, connect, and all meet at an arrival count before
  ``init_process_group`` (gloo on CPU, NCCL with CUDA), so no C++ call waits on a member
  that is not coming. Waiting gives up as soon as the node set changes.
* **Identical state.** Members all-reduce their applied-step counts; the member with the
  most (the leader on ties, i.e. always unless the leader missed a commit) broadcasts model,
  optimizer state and progress, serialized by ``torch.save`` and loaded with
  ``weights_only=True``.
* **Steps.** ``prepare`` runs forward and backward on this member's shard; ``reduce`` is one
  all-reduce of ``grad * n`` plus ``n`` and ``loss * n`` (zero for a member with no shard),
  so the update equals one step on all the step's samples together; ``commit`` applies it.
  Every collective has a short timeout (``collective_timeout``, 10 s), and a member whose
  collective fails destroys its group at once, so peers never wait for a vanished one.
* **Checkpoints.** The leader saves model, optimizer and progress every
  ``checkpoint_steps`` steps or ``checkpoint_seconds`` seconds, and when it leaves, to
  ``checkpoint_path`` (written atomically) or to Redis (``checkpoint_redis``). Every member
  loads the checkpoint when it starts, so losing every member resumes from it.

Options live in ``TaskSpec.options["torch"]`` (``TorchOptions``); the rest of ``options``
belongs to the application.
"""

from __future__ import annotations

import datetime
import io
import json
import os
import socket
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch
import torch._dynamo  # the first optimizer imports it (~1 s): pay before joining, not after
import torch.distributed as dist
from pydantic import BaseModel, ConfigDict, Field
from torch._C._distributed_c10d import PrefixStore, TCPStore

from queueworks.client import Task
from queueworks.models import TaskStatus
from queueworks.steps import Generation, StepAborted, StepContext, StepInfo

__all__ = [
    "ElasticTrainer",
    "Generation",
    "LossFn",
    "StepAborted",
    "StepContext",
    "StepInfo",
    "StepRecord",
    "TorchOptions",
    "load_checkpoint",
    "wait_released",
]

LossFn = Callable[[torch.nn.Module, Any], tuple[torch.Tensor, int]]
ENV_HOST = "QUEUEWORKS_TORCH_HOST"  # the address peers reach this worker at
RDZV_TTL = 7 * 24 * 3600  # the rendezvous key outlives any generation; deleted at the end
POLL_MIN, POLL_MAX = 0.002, 0.05
STORE_CONNECT_TIMEOUT = 5.0  # the leader's store was just published: it answers in ms


class TorchOptions(BaseModel):
    """``TaskSpec.options["torch"]``; every field optional."""

    model_config = ConfigDict(extra="forbid")

    backend: Literal["gloo", "nccl"] | None = None  # default: nccl on CUDA, else gloo
    device: str | None = None  # default: "cuda" when available, else "cpu"
    host: str | None = None  # address to publish; default $QUEUEWORKS_TORCH_HOST, hostname
    collective_timeout: float = Field(default=10.0, gt=0)
    rendezvous_timeout: float = Field(default=60.0, gt=0)
    checkpoint_path: str | None = None
    checkpoint_redis: bool = False
    checkpoint_seconds: float | None = Field(default=30.0, gt=0)
    checkpoint_steps: int | None = Field(default=None, ge=1)


@dataclass(frozen=True)
class StepRecord:
    """One step as one member saw it; what an ``on_step`` hook receives."""

    worker: str
    generation: str
    seq: int
    epoch: int
    rank: int  # ctx.role.rank
    world_size: int  # ctx.role.world_size
    torch_rank: int  # dist.get_rank() in the step's collective (-1: it failed)
    torch_world_size: int
    shards: tuple[int, ...]  # every shard in the step
    own: int | None  # this member's
    committed: bool
    applied: bool  # this member applied the update
    steps: int  # updates applied so far (the global step count)
    loss: float | None  # mean loss over all samples of the step


class ElasticTrainer:
    """A ``queueworks.steps.StepTrainer`` for a torch model, optimizer and loss function.

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
        self.backend = self.opts.backend or ("nccl" if self.device.type == "cuda" else "gloo")
        self.host = self.opts.host or os.environ.get(ENV_HOST) or _default_host()
        self.model = model.to(self.device)
        self.optimizer = optimizer
        self.loss_fn = loss_fn
        self.on_step = on_step
        self.steps = 0
        self.samples = 0
        self._params = [p for p in self.model.parameters() if p.requires_grad]
        self._dtype = _common_dtype(self._params)
        self._gen: Generation | None = None  # the group we are in
        self._last_gen: Generation | None = None
        self._store: TCPStore | None = None  # this generation's store
        self._served: TCPStore | None = None  # the store the leader serves (kept until replaced)
        self._local = (0.0, 0.0)  # this step: samples, loss * samples
        self._reduced: torch.Tensor | None = None  # averaged gradient, awaiting commit
        self._total = 0.0
        self._loss: float | None = None
        self._torch_role = (-1, -1)
        self._stale = False  # a step committed without us: behind until the next sync
        self._checkpoints = _Checkpoints(self.opts, ctx)
        self._saved_steps = 0
        self._saved_at = time.monotonic()
        self._saver: threading.Thread | None = None
        self._resume()

    # -- the StepTrainer protocol ---------------------------------------------------------

    def on_role(self, gen: Generation) -> None:
        self._drop_group()
        store = self._rendezvous(gen)
        self._arrive(store, gen)
        try:
            dist.init_process_group(
                self.backend,
                store=PrefixStore("qw", store),
                rank=gen.role.rank,
                world_size=gen.role.world_size,
                timeout=datetime.timedelta(seconds=self.opts.collective_timeout),
                device_id=self.device if self.backend == "nccl" else None,
            )
        except RuntimeError as exc:
            self._drop_group()
            raise StepAborted(f"init_process_group: {_short(exc)}") from None
        self._gen = self._last_gen = gen
        self._sync(gen)

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
        self._collective(lambda: dist.all_reduce(buf))
        self._torch_role = (dist.get_rank(), dist.get_world_size())
        total = float(buf[-2])
        self._total = total
        if total > 0:
            self._reduced = buf[:-2] / total
            self._loss = float(buf[-1]) / total
        assert self._gen is not None
        return {
            "loss": self._loss,
            "samples": int(n),
            "step_samples": int(total),
            "world_size": self._gen.role.world_size,
            "generation": self._gen.id,
        }

    def commit(self, info: StepInfo) -> None:
        applied = self._reduced is not None
        if self._reduced is not None:
            offset = 0
            for p in self._params:
                k = p.numel()
                p.grad = self._reduced[offset : offset + k].view_as(p).to(p.dtype)
                offset += k
            self.optimizer.step()
            self.steps += 1
            self.samples += int(self._total)
            self._maybe_checkpoint()
        self._emit(info, applied)
        self._reduced = None

    def abort(self, info: StepInfo) -> None:
        if info.committed:
            self._stale = True  # the others applied it; the next on_role brings us level
        self._emit(info, False)
        self._reduced = None

    def close(self, reason: str) -> None:
        gen = self._last_gen
        leader = gen is not None and gen.role.leader
        if leader and reason in ("finished", "stopping", "revoked"):
            self._checkpoint(wait=True)
        self._join_saver()
        self._drop_group()
        self._served = None
        if leader and reason == "finished":
            self.ctx.redis.delete(self.ctx.keys.rendezvous)

    # -- rendezvous and sync --------------------------------------------------------------

    def _rendezvous(self, gen: Generation) -> TCPStore:
        """The leader serves a fresh TCPStore and publishes it; the others find it."""
        timeout = datetime.timedelta(seconds=self.opts.rendezvous_timeout)
        mine = (gen.role.epoch, gen.round)
        if gen.role.leader:
            try:
                store = TCPStore(
                    self.host, 0, is_master=True, wait_for_workers=False, timeout=timeout
                )
            except RuntimeError as exc:
                raise StepAborted(f"cannot serve a TCPStore: {_short(exc)}") from None
            self._store = self._served = store  # the previous generation's store closes now
            ours = {"epoch": mine[0], "round": mine[1], "host": self.host, "port": store.port}
            self.ctx.redis.set(self.ctx.keys.rendezvous, json.dumps(ours), ex=RDZV_TTL)
            return store
        self._served = None
        deadline = time.monotonic() + self.opts.rendezvous_timeout
        pause = POLL_MIN
        while (doc := self._published(gen)) is None:
            if self.ctx.wait(pause):
                raise StepAborted("node set changed during rendezvous")
            if time.monotonic() > deadline:
                raise StepAborted("no rendezvous from the leader")
            pause = min(POLL_MAX, pause * 1.5)
        try:
            store = TCPStore(
                str(doc["host"]),
                int(doc["port"]),
                is_master=False,
                timeout=datetime.timedelta(
                    seconds=min(STORE_CONNECT_TIMEOUT, self.opts.collective_timeout)
                ),
            )
        except RuntimeError as exc:
            raise StepAborted(f"cannot reach the leader's store: {_short(exc)}") from None
        self._store = store
        return store

    def _published(self, gen: Generation) -> dict[str, Any] | None:
        """The leader's published store if it is for ``gen``; None if not yet there;
        StepAborted if the leader has moved on to a later generation."""
        raw = self.ctx.redis.get(self.ctx.keys.rendezvous)
        if raw is None:
            return None
        doc: dict[str, Any] = json.loads(raw)
        theirs, mine = (int(doc["epoch"]), int(doc["round"])), (gen.role.epoch, gen.round)
        if theirs > mine:
            raise StepAborted(f"the leader is at generation {theirs[0]}.{theirs[1]}")
        return doc if theirs == mine else None

    def _arrive(self, store: TCPStore, gen: Generation) -> None:
        """Wait until every member of the generation has come (interruptible; a follower
        also gives up when the leader has moved on)."""
        deadline = time.monotonic() + self.opts.rendezvous_timeout
        pause = POLL_MIN
        try:
            store.add("arrived", 1)
            while int(store.add("arrived", 0)) < gen.role.world_size:
                if self.ctx.wait(pause):
                    raise StepAborted("node set changed during rendezvous")
                if not gen.role.leader and pause >= POLL_MAX:
                    self._published(gen)  # raises if the leader is at a later generation
                if time.monotonic() > deadline:
                    raise StepAborted("not every member came to the rendezvous")
                pause = min(POLL_MAX, pause * 1.5)
        except RuntimeError as exc:
            self._drop_group()
            raise StepAborted(f"rendezvous store: {_short(exc)}") from None
        except StepAborted:
            self._drop_group()
            raise

    def _sync(self, gen: Generation) -> None:
        """Make every member identical: the member with the most applied steps (the
        leader on ties) broadcasts model, optimizer state and progress."""
        world, rank = gen.role.world_size, gen.role.rank
        counts = torch.zeros(world, dtype=torch.int64, device=self.device)
        counts[rank] = self.steps
        self._collective(lambda: dist.all_reduce(counts))
        src = int(torch.argmax(counts).item())  # the first maximum: lowest rank
        blob = self._state_bytes() if rank == src else b""
        size = torch.tensor([len(blob)], dtype=torch.int64, device=self.device)
        self._collective(lambda: dist.broadcast(size, src))
        if rank == src:
            data = torch.frombuffer(bytearray(blob), dtype=torch.uint8).to(self.device)
        else:
            data = torch.empty(int(size.item()), dtype=torch.uint8, device=self.device)
        self._collective(lambda: dist.broadcast(data, src))
        if rank != src:
            self._load_state_bytes(data.cpu().numpy().tobytes())
        self._stale = False
        self.ctx.log.info("state_synced", source_rank=src, steps=self.steps, bytes=int(size))

    def _collective(self, fn: Callable[[], Any]) -> None:
        if self._gen is None:
            raise StepAborted("no process group")
        try:
            fn()
        except RuntimeError as exc:  # DistBackendError, timeouts, reset connections
            self._drop_group()
            raise StepAborted(f"collective failed: {_short(exc)}") from None

    def _drop_group(self) -> None:
        """Leave the group at once: peers blocked in a collective with us fail now."""
        self._gen = None
        if dist.is_initialized():
            try:
                if self.backend == "nccl":
                    from torch.distributed.distributed_c10d import _abort_process_group

                    _abort_process_group()
                else:
                    dist.destroy_process_group()
            except Exception as exc:
                self.ctx.log.warning("destroy_process_group_failed", error=_short(exc))
        self._store = None

    # -- state and checkpoints ------------------------------------------------------------

    def _state_bytes(self) -> bytes:
        buf = io.BytesIO()
        torch.save(
            {
                "model": self.model.state_dict(),
                "optimizer": self.optimizer.state_dict(),
                "progress": {"steps": self.steps, "samples": self.samples},
            },
            buf,
        )
        return buf.getvalue()

    def _load_state_bytes(self, blob: bytes) -> None:
        state = torch.load(io.BytesIO(blob), map_location=self.device, weights_only=True)
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.steps = int(state["progress"]["steps"])
        self.samples = int(state["progress"]["samples"])

    def _resume(self) -> None:
        blob = self._checkpoints.load()
        if blob is None:
            return
        self._load_state_bytes(blob)
        self._saved_steps = self.steps
        self.ctx.log.info("resumed_from_checkpoint", steps=self.steps, samples=self.samples)

    def _maybe_checkpoint(self) -> None:
        gen = self._gen
        if gen is None or not gen.role.leader or not self._checkpoints.enabled:
            return
        every, seconds = self.opts.checkpoint_steps, self.opts.checkpoint_seconds
        due = (every is not None and self.steps - self._saved_steps >= every) or (
            seconds is not None and time.monotonic() - self._saved_at >= seconds
        )
        if due:
            self._checkpoint(wait=False)

    def _checkpoint(self, *, wait: bool) -> None:
        """Serialize now (between steps: consistent), write in the background."""
        if self._stale or self.steps <= self._saved_steps or not self._checkpoints.enabled:
            return
        self._join_saver()
        blob, steps = self._state_bytes(), self.steps
        self._saved_steps, self._saved_at = steps, time.monotonic()

        def save() -> None:
            try:
                self._checkpoints.save(blob)
                self.ctx.log.info("checkpoint_saved", steps=steps, bytes=len(blob))
            except Exception as exc:
                self.ctx.log.warning("checkpoint_failed", steps=steps, error=_short(exc))

        self._saver = threading.Thread(target=save, name="qw-checkpoint", daemon=True)
        self._saver.start()
        if wait:
            self._join_saver()

    def _join_saver(self) -> None:
        if self._saver is not None:
            self._saver.join()
            self._saver = None

    def _emit(self, info: StepInfo, applied: bool) -> None:
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
                torch_rank=self._torch_role[0],
                torch_world_size=self._torch_role[1],
                shards=info.shards,
                own=info.own,
                committed=info.committed,
                applied=applied,
                steps=self.steps,
                loss=self._loss,
            )
        )


class _Checkpoints:
    """Where the leader's checkpoints go: a file (replaced atomically) or a Redis key."""

    def __init__(self, opts: TorchOptions, ctx: StepContext) -> None:
        self.path = Path(opts.checkpoint_path) if opts.checkpoint_path else None
        self.ctx = ctx
        self.key = ctx.keys.checkpoint if opts.checkpoint_redis else None

    @property
    def enabled(self) -> bool:
        return self.path is not None or self.key is not None

    def save(self, blob: bytes) -> None:
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
            with tmp.open("wb") as f:
                f.write(blob)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.path)
        if self.key is not None:  # kept as long as the task's results
            self.ctx.redis.set(self.key, blob, ex=int(self.ctx.spec.result_ttl))

    def load(self) -> bytes | None:
        if self.path is not None and self.path.exists():
            return self.path.read_bytes()
        if self.key is not None:
            raw = self.ctx.redis.get(self.key)
            return raw.encode() if isinstance(raw, str) else raw
        return None


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


def _short(exc: BaseException) -> str:
    return str(exc).splitlines()[0][:300] if str(exc) else type(exc).__name__
