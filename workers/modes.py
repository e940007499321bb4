"""The mode loops, by ``TaskSpec.mode``: a new mode is a new loop registered here."""

from __future__ import annotations

from collections.abc import Callable

from workers.loop import ModeLoop, Run
from workers.queues import QueueLoop
from workers.steps import StepLoop
from workers.subtasks import SubtaskLoop

Mode = Callable[[Run], ModeLoop]

MODES: dict[str, Mode] = {
    "subtask": SubtaskLoop,
    "step": StepLoop,
    "queue": QueueLoop,
}
