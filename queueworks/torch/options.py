"""What a torch task is configured with (``TaskSpec.options["torch"]``) and what each step
reports (``StepRecord``)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import torch
from pydantic import BaseModel, ConfigDict, Field

LossFn = Callable[[torch.nn.Module, Any], tuple[torch.Tensor, int]]


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


def short(exc: BaseException) -> str:
    """An exception in one line (torch's messages run long)."""
    return str(exc).splitlines()[0][:300] if str(exc) else type(exc).__name__
