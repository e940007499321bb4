"""When a queue member settles the jobs it ran (``queue_loop.settle_wait``): a job on its
own at once, jobs close together a few per settle, more under load, never more than
``SETTLE_JOBS`` waiting."""

from __future__ import annotations

import pytest

from queueworks.workers.queue_loop import (
    BUSY_RATE,
    BUSY_SETTLE_SECONDS,
    SETTLE_JOBS,
    SETTLE_SECONDS,
    settle_wait,
)

NOW = 1000.0


@pytest.mark.unit
def test_a_job_after_a_quiet_spell_is_settled_at_once() -> None:
    assert settle_wait(NOW, NOW - 1.0, 0.0, 1) <= 0
    assert settle_wait(NOW, NOW - 1.0, BUSY_RATE * 10, 1) <= 0  # whatever the rate was


@pytest.mark.unit
def test_jobs_close_together_wait_for_the_settle_window() -> None:
    wait = settle_wait(NOW, NOW - SETTLE_SECONDS / 2, BUSY_RATE / 2, 3)
    assert wait == pytest.approx(SETTLE_SECONDS / 2)


@pytest.mark.unit
def test_under_load_the_window_is_longer() -> None:
    quiet = settle_wait(NOW, NOW - SETTLE_SECONDS, BUSY_RATE / 2, 3)
    busy = settle_wait(NOW, NOW - SETTLE_SECONDS, BUSY_RATE, 3)
    assert quiet <= 0 < busy == pytest.approx(BUSY_SETTLE_SECONDS - SETTLE_SECONDS)


@pytest.mark.unit
def test_enough_jobs_waiting_are_settled_at_once_under_load() -> None:
    assert settle_wait(NOW, NOW, BUSY_RATE, SETTLE_JOBS - 1) > 0
    assert settle_wait(NOW, NOW, BUSY_RATE, SETTLE_JOBS) <= 0
