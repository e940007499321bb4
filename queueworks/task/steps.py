"""The step contract (``TaskSpec(mode="step")``): what a *step trainer* is and what it gets.

In step mode every member of the node set runs each step together, for data-parallel
training that keeps going while the node set changes (the loop is ``workers.steps``). The
framework side is a step trainer, built per task run by the factory that ``spec.handler``
names (``queueworks.torch.ElasticTrainer`` is the torch one)::

    def make_trainer(ctx: StepContext) -> StepTrainer: ...

A ``StepTrainer`` has six methods, and may have a seventh (``apply``); the loop calls them
in this order:

``on_role(gen)``
    Form the group of generation ``gen`` (``gen.role``: rank, world size, epoch; ``gen.round``)
    from scratch: drop the old group, rendezvous, and make every member's state identical
    (broadcast from the member with the most applied steps, the leader on ties). Raise
    ``StepAborted`` if it cannot (a peer did not come, the node set changed: poll
    ``ctx.suspended``); the loop then tries the next round, or re-ranks first.
``prepare(payload)``
    Local work on this member's shard, no collective (forward and backward). ``None``: no
    shard this step; take part with zero weight. Any exception from ``prepare(payload)``
    counts as a failed attempt of that shard (retried, dead-lettered after
    ``max_attempts``); the loop then calls ``prepare(None)`` so the step still has all members.
    It runs under the handler watchdog: past ``subtask_timeout`` it is abandoned like a
    handler (a failed attempt; the process exits if it is stuck in C).
``reduce()``
    The collective(s) of the step, e.g. the all-reduce of gradients weighted by sample count.
    Returns the shard's result (JSON). Raises ``StepAborted`` when a collective fails or
    times out, after dropping its group, so that blocked peers fail at once too. It may
    call ``ctx.meanwhile()`` while its all-reduce is in flight: the loop then reads the
    last step's end beside the all-reduce instead of before it (and calls that step's
    ``commit`` or ``abort`` from there).
``apply()`` (optional)
    Apply the update of a step whose ``reduce`` returned, before the step's end is read: a
    completed collective commits the step, unless this member was pruned from the node set
    meanwhile. The loop then reads the step's end during the next step and calls
    ``commit(info)`` (or ``abort(info)`` with ``info.committed`` False, if it was pruned: the
    trainer applied a step the node set did not commit, and must not be the source of the
    next ``on_role``'s state). Without it, the loop waits for the step's end before the next
    ``prepare``.
``commit(info)`` / ``abort(info)``
    Exactly one of them per step: apply the update (the step committed on the node set) or
    discard it. ``info`` says which shards were in the step. ``abort`` is also called when
    the step committed but this member's ``reduce`` failed: it is behind, and the next
    ``on_role`` makes it identical again. A step whose ``prepare`` ran but whose collective
    did not (the step before it broke the group) gets ``abort`` too.
``close(reason)``
    The run ends ("finished", "stopping", "revoked", ...): last checkpoint, drop the group.

Any other exception from a trainer method (a bug, a bad option) fails the whole task with
its traceback, as a failing worker fails a TorchElastic job.

**Generations.** ``Generation(role, round)``: ``round`` is 0 after every re-rank and grows
by one after each failed collective in the same epoch, so that the survivors of a killed
peer form a new group at once, and again after the peer is pruned (new epoch).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from queueworks.protocol.keys import TaskKeys
from queueworks.protocol.models import Role, StoredSpec
from queueworks.transport.connection import Connection


@dataclass(frozen=True)
class Generation:
    """One group of the node set: a role (rank, world size, epoch) and a round within it."""

    role: Role
    round: int = 0

    @property
    def id(self) -> str:
        return f"{self.role.epoch}.{self.round}"


@dataclass(frozen=True)
class StepInfo:
    """What ``commit``/``abort`` learn about the step that was run."""

    generation: Generation
    seq: int  # the step's number within its generation
    shards: tuple[int, ...]  # subtask indices of every shard in the step, in rank order
    own: int | None  # this member's shard
    committed: bool  # the node set committed the step (``abort`` may still see True)


class LiveRole(Protocol):
    """The member's side of a running task, as a trainer may see it."""

    def role(self) -> Role:
        """The member's current role."""

    def suspended(self) -> bool:
        """True once the node set changed or the worker is stopping."""

    def wait(self, seconds: float) -> bool:
        """Sleep up to ``seconds``; True (at once) if the run is suspended."""


@dataclass
class StepContext:
    """What the trainer factory gets: the task, its options, Redis, and the live role."""

    task_id: str
    worker_id: str
    spec: StoredSpec
    redis: Connection
    keys: TaskKeys
    log: Any
    live: LiveRole = field(repr=False)
    meanwhile: Callable[[], None] = field(default=lambda: None, repr=False)
    """The loop's own work for the time a collective is in flight: ``reduce`` calls it once
    its all-reduce has started, before waiting for it (it raises ``StepAborted`` if the
    step cannot go on: drop the group, as for a failed collective)."""

    @property
    def options(self) -> dict[str, Any]:
        """``TaskSpec.options``: free-form JSON for the trainer (checkpoint path, ...)."""
        return self.spec.options

    @property
    def role(self) -> Role:
        return self.live.role()

    @property
    def suspended(self) -> bool:
        """True once the node set changed or the worker is stopping: give up waiting."""
        return self.live.suspended()

    def wait(self, seconds: float) -> bool:
        """Sleep up to ``seconds``; returns True (at once) if the run is suspended."""
        return self.live.wait(seconds)


class StepTrainer(Protocol):
    """The six methods every step trainer has (``apply`` is optional: see above)."""

    def on_role(self, gen: Generation) -> None: ...

    def prepare(self, payload: Any | None) -> None: ...

    def reduce(self) -> Any: ...

    def commit(self, info: StepInfo) -> None: ...

    def abort(self, info: StepInfo) -> None: ...

    def close(self, reason: str) -> None: ...
