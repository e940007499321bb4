"""Checkpoints: the leader saves model, optimizer and progress every ``checkpoint_steps``
steps or ``checkpoint_seconds`` seconds, and when it leaves, to ``checkpoint_path``
(written atomically) or to Redis (``checkpoint_redis``); serialized between steps (so it is
consistent), written by a background thread. Every member loads the checkpoint when it
starts, so losing every member resumes from it."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

from queueworks.task.steps import StepContext
from queueworks.torch.options import TorchOptions, short
from queueworks.torch.state import TrainState


class CheckpointStore:
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


class Checkpoints:
    """When to save ``state``, and saving it without holding up the next step."""

    def __init__(self, opts: TorchOptions, ctx: StepContext, state: TrainState) -> None:
        self.opts, self.ctx, self.state = opts, ctx, state
        self.store = CheckpointStore(opts, ctx)
        self.saved_steps = 0
        self.saved_at = time.monotonic()
        self._saver: threading.Thread | None = None

    def resume(self) -> None:
        """Load the last checkpoint into ``state``, if there is one."""
        blob = self.store.load()
        if blob is None:
            return
        self.state.load_bytes(blob)
        self.saved_steps = self.state.steps
        self.ctx.log.info(
            "resumed_from_checkpoint", steps=self.state.steps, samples=self.state.samples
        )

    def maybe(self, *, stale: bool) -> None:
        """After an applied step (on the leader): save if a checkpoint is due."""
        if not self.store.enabled:
            return
        every, seconds = self.opts.checkpoint_steps, self.opts.checkpoint_seconds
        due = (every is not None and self.state.steps - self.saved_steps >= every) or (
            seconds is not None and time.monotonic() - self.saved_at >= seconds
        )
        if due:
            self.save(wait=False, stale=stale)

    def save(self, *, wait: bool, stale: bool) -> None:
        """Serialize now (between steps: consistent), write in the background. A member
        that is behind (``stale``) saves nothing."""
        if stale or self.state.steps <= self.saved_steps or not self.store.enabled:
            return
        self.join()
        blob, steps = self.state.to_bytes(), self.state.steps
        self.saved_steps, self.saved_at = steps, time.monotonic()

        def save() -> None:
            try:
                self.store.save(blob)
                self.ctx.log.info("checkpoint_saved", steps=steps, bytes=len(blob))
            except Exception as exc:
                self.ctx.log.warning("checkpoint_failed", steps=steps, error=short(exc))

        self._saver = threading.Thread(target=save, name="qw-checkpoint", daemon=True)
        self._saver.start()
        if wait:
            self.join()

    def join(self) -> None:
        if self._saver is not None:
            self._saver.join()
            self._saver = None
