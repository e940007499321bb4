"""Forming one generation's process group, through Redis.

The leader (rank 0) opens a fresh ``TCPStore`` on a free port and publishes ``host:port``
with the generation under the task's ``rdzv`` key; the others wait for exactly that
generation, connect, and all meet at an arrival count before ``init_process_group`` (gloo on
CPU, NCCL with CUDA), so no C++ call waits on a member that is not coming. Waiting gives up
as soon as the node set changes, unless every member came first (``_arrive``: one fate per
generation, compare-and-set on its store). Every collective runs through ``collective``: a
failure drops the group at once, so peers blocked with us fail too.
"""

from __future__ import annotations

import datetime
import json
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import PrefixStore, TCPStore

from queueworks.errors import StepAborted
from queueworks.task.steps import Generation, StepContext
from queueworks.torch.options import TorchOptions, short

RDZV_TTL = 7 * 24 * 3600  # the rendezvous key outlives any generation; deleted at the end
POLL_MIN, POLL_MAX = 0.002, 0.05
STORE_CONNECT_TIMEOUT = 5.0  # the leader's store was just published: it answers in ms
CONNECT_ATTEMPT = 0.25  # s per attempt to connect to it
FATE = "fate"  # a generation's fate in its store: formed or aborted, decided once
FORMED, ABORTED, UNDECIDED = "formed", "aborted", "?"


class Group:
    """The process group of the current generation, if any."""

    def __init__(
        self, ctx: StepContext, opts: TorchOptions, device: torch.device, host: str
    ) -> None:
        self.ctx, self.opts, self.device, self.host = ctx, opts, device, host
        self.backend = opts.backend or ("nccl" if device.type == "cuda" else "gloo")
        self.gen: Generation | None = None  # the group we are in
        self._store: TCPStore | None = None  # this generation's store
        self._served: TCPStore | None = None  # the store the leader serves (until replaced)

    def form(self, gen: Generation) -> None:
        """Drop the old group and form ``gen``'s; ``StepAborted`` if it cannot be formed."""
        self.drop()
        store = self._rendezvous(gen)
        self._arrive(store, gen)
        _reset_group_names()
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
            self.drop()
            raise StepAborted(f"init_process_group: {short(exc)}") from None
        self.gen = gen

    def collective(self, fn: Callable[[], Any]) -> None:
        if self.gen is None:
            raise StepAborted("no process group")
        try:
            fn()
        except RuntimeError as exc:  # DistBackendError, timeouts, reset connections
            self.drop()
            raise StepAborted(f"collective failed: {short(exc)}") from None

    def drop(self) -> None:
        """Leave the group at once: peers blocked in a collective with us fail now."""
        self.gen = None
        if dist.is_initialized():
            try:
                if self.backend == "nccl":
                    from torch.distributed.distributed_c10d import _abort_process_group

                    _abort_process_group()
                else:
                    dist.destroy_process_group()
            except Exception as exc:
                self.ctx.log.warning("destroy_process_group_failed", error=short(exc))
        self._store = None

    def close(self, *, forget: bool) -> None:
        """The run ends: drop the group and the served store; ``forget``: also delete the
        published rendezvous (the leader, when the task finished)."""
        self.drop()
        self._served = None
        if forget:
            self.ctx.redis.delete(self.ctx.keys.rendezvous)

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
                raise StepAborted(f"cannot serve a TCPStore: {short(exc)}") from None
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
        store = self._connect(gen, str(doc["host"]), int(doc["port"]))
        self._store = store
        return store

    def _connect(self, gen: Generation, host: str, port: int) -> TCPStore:
        """The leader's store, in short attempts: between two, give up at once if the node
        set changed or the leader moved on to a later generation (its store for ``gen`` is
        closed then, and a long connect would wait for nothing)."""
        timeout = min(STORE_CONNECT_TIMEOUT, self.opts.collective_timeout)
        deadline = time.monotonic() + timeout
        while True:
            try:
                store = TCPStore(
                    host,
                    port,
                    is_master=False,
                    timeout=datetime.timedelta(seconds=CONNECT_ATTEMPT),
                )
            except RuntimeError as exc:
                if time.monotonic() > deadline:
                    raise StepAborted(f"cannot reach the leader's store: {short(exc)}") from None
                if self.ctx.wait(POLL_MIN):
                    raise StepAborted("node set changed during rendezvous") from None
                self._published(gen)  # raises if the leader is at a later generation
                continue
            store.set_timeout(datetime.timedelta(seconds=timeout))
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
        """Wait until the generation's fate is decided: ``formed`` (every member came) or
        ``aborted`` (a member gave up first). Interruptible; a follower also gives up when
        the leader has moved on.

        The fate is one compare-and-set on the store, so every member reads the same one:
        the last member to come sets ``formed``; a member that gives up (the node set
        changed, the leader moved on, the wait timed out) sets ``aborted``, unless the
        generation has formed already, and then goes into ``init_process_group`` with the
        others (the change is handled at the next step). Without it, a member could give
        up just as the last one came and went into ``init_process_group``, which would then
        wait its whole timeout for a peer that is not coming."""
        deadline = time.monotonic() + self.opts.rendezvous_timeout
        pause = POLL_MIN
        try:
            if int(store.add("arrived", 1)) >= gen.role.world_size:
                _fate(store, "", FORMED)
            while (fate := _fate(store, UNDECIDED, UNDECIDED)) != FORMED:
                if fate == ABORTED:
                    raise StepAborted("a member gave up the rendezvous")
                if (why := self._why_give_up(gen, pause, deadline)) is not None:
                    if _fate(store, "", ABORTED) == FORMED:
                        return  # every member came first: the group forms all the same
                    raise StepAborted(why)
                pause = min(POLL_MAX, pause * 1.5)
        except RuntimeError as exc:
            self.drop()
            raise StepAborted(f"rendezvous store: {short(exc)}") from None
        except StepAborted:
            self.drop()
            raise

    def _why_give_up(self, gen: Generation, pause: float, deadline: float) -> str | None:
        """Why a member waiting for the others gives up now (after waiting ``pause``), if it
        does: the node set changed, the leader moved on, or the wait timed out."""
        if self.ctx.wait(pause):
            return "node set changed during rendezvous"
        if not gen.role.leader and pause >= POLL_MAX:
            try:
                self._published(gen)
            except StepAborted as exc:  # the leader is at a later generation
                return str(exc)
        if time.monotonic() > deadline:
            return "not every member came to the rendezvous"
        return None


def _fate(store: TCPStore, expected: str, desired: str) -> str:
    """Compare-and-set the generation's fate; its value after ("?": none yet, when both
    are "?", which reads it)."""
    return bytes(store.compare_set(FATE, expected, desired)).decode()


def _reset_group_names() -> None:
    """Name the next default group as every member does: "0". torch names a process group
    by a process-wide counter that ``init_process_group`` advances before it connects and
    only ``destroy_process_group`` resets, so a member whose last init failed (the node set
    changed in the middle of it) would look for its peers under "1" while they wait under
    "0": a generation that never forms, each member timing out in turn. No group is live
    here (``drop`` came first)."""
    if not dist.is_initialized():
        from torch.distributed.distributed_c10d import _world

        _world.group_count = 0
