"""Lockstep mode (``TaskSpec(mode="step")``): every member runs each step together."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from workers.runtime import TaskRun


def run_steps(run: TaskRun) -> None:
    raise NotImplementedError("step mode arrives with queueworks.torch")
