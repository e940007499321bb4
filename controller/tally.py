"""What the controller counts, for people and benchmarks: passes, events read, Redis
commands sent (every command of every pipeline, every script call, the lease's too), the
ops its fenced writes carried, and the process's CPU time. ``Controller`` logs it as
``controller_stats`` every ``stats_interval`` seconds; the totals only ever grow."""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from typing import Any


@dataclass
class Tally:
    passes: int = 0
    full_passes: int = 0
    events: int = 0
    commands: int = 0
    moves: int = 0
    ops: int = 0
    tasks_read: int = 0
    workers_read: int = 0
    swept: int = 0
    fired: int = 0  # jobs the schedules enqueued

    def run(self, pipe: Any) -> list[Any]:
        """Execute a pipeline, counting its commands."""
        self.commands += len(pipe)
        return list(pipe.execute())

    def snapshot(self) -> dict[str, Any]:
        return {**asdict(self), "cpu_s": round(time.process_time(), 3)}
