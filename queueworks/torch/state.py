"""The training state every member must hold identically — model, optimizer, progress — and
its sync at the start of every generation: members all-reduce their applied-step counts;
the member with the most (the leader on ties, i.e. always unless the leader missed a
commit; a member that applied a step the node set did not commit counts one fewer, and
loses a tie) broadcasts its state, serialized by ``torch.save`` and loaded with
``weights_only=True``."""

from __future__ import annotations

import io

import torch
import torch.distributed as dist

from queueworks.task.steps import Generation
from queueworks.torch.rendezvous import Group


class TrainState:
    """Model, optimizer, and how many updates and samples they have applied."""

    def __init__(
        self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, device: torch.device
    ) -> None:
        self.model, self.optimizer, self.device = model, optimizer, device
        self.steps = 0
        self.samples = 0

    def to_bytes(self) -> bytes:
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

    def load_bytes(self, blob: bytes) -> None:
        state = torch.load(io.BytesIO(blob), map_location=self.device, weights_only=True)
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.steps = int(state["progress"]["steps"])
        self.samples = int(state["progress"]["samples"])

    def sync(self, group: Group, gen: Generation, ahead: bool = False) -> tuple[int, int]:
        """Make every member of ``gen`` identical; returns (source rank, bytes sent).
        ``ahead``: this member applied a step the node set did not commit (it was pruned
        in the middle of it): it is the source only if no peer has applied as many steps
        (its extra step is then kept, and trained again)."""
        world, rank = gen.role.world_size, gen.role.rank
        counts = torch.zeros(world, dtype=torch.int64, device=self.device)
        counts[rank] = 2 * (self.steps - 1) if ahead else 2 * self.steps + 1
        group.collective(lambda: dist.all_reduce(counts))
        src = int(torch.argmax(counts).item())  # the first maximum: lowest rank
        blob = self.to_bytes() if rank == src else b""
        size = torch.tensor([len(blob)], dtype=torch.int64, device=self.device)
        group.collective(lambda: dist.broadcast(size, src))
        if rank == src:
            data = torch.frombuffer(bytearray(blob), dtype=torch.uint8).to(self.device)
        else:
            data = torch.empty(int(size.item()), dtype=torch.uint8, device=self.device)
        group.collective(lambda: dist.broadcast(data, src))
        if rank != src:
            self.load_bytes(data.cpu().numpy().tobytes())
        return src, int(size.item())
