"""The mode loops, by ``TaskSpec.mode``: a new mode is a new loop registered here."""

from __future__ import annotations

from collections.abc import Callable

from workers.loop import ModeLoop, Run
from workers.steps import StepLoop
from workers.subtasks import SubtaskLoop

MODES: dict[str, Callable[[Run], ModeLoop]] = {
    "subtask": SubtaskLoop,
    "step": StepLoop,
}
