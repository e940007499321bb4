"""The mode loops, by ``TaskSpec.mode``: a new mode is a new loop registered here."""

from __future__ import annotations

from collections.abc import Callable

from .lockstep import StepLoop
from .loop import ModeLoop, Run
from .queue_loop import QueueLoop
from .subtasks import SubtaskLoop

Mode = Callable[[Run], ModeLoop]

MODES: dict[str, Mode] = {
    "subtask": SubtaskLoop,
    "step": StepLoop,
    "queue": QueueLoop,
}
