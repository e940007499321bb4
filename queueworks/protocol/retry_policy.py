"""When a failed job (or subtask) runs again: its retry schedule.

A queue's (or task's) ``retry_delay``, ``retry_backoff`` and ``retry_max_delay``, each
overridden by the job's own option of the same name (``queueworks.protocol.job_options``), give the
wait before the attempt that follows attempt ``n`` (``n >= 1``)::

    min(retry_max_delay, retry_delay * retry_backoff ** (n - 1)) * jitter

with ``jitter`` drawn uniformly from ``[JITTER_LOW, 1.0]``, so retries of many jobs that
failed together spread out instead of coming back at once. A delay of 0 (the default
``retry_delay``) is an immediate retry, as without a schedule. Pure: no I/O.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

from queueworks.protocol.job_options import JobOptions

DEFAULT_RETRY_DELAY = 0.0  # s before the 2nd attempt: retried at once
DEFAULT_RETRY_BACKOFF = 2.0  # each wait is this many times the one before
DEFAULT_RETRY_MAX_DELAY = 600.0  # s: no wait is longer (as celery's retry_backoff_max)
JITTER_LOW = 0.5  # a wait is its computed value times a uniform draw in [JITTER_LOW, 1]


@dataclass(frozen=True)
class RetryPolicy:
    """A retry schedule: ``delay`` (s before the 2nd attempt), ``backoff`` (factor),
    ``max_delay`` (cap, s)."""

    delay: float = DEFAULT_RETRY_DELAY
    backoff: float = DEFAULT_RETRY_BACKOFF
    max_delay: float = DEFAULT_RETRY_MAX_DELAY

    def for_job(self, options: JobOptions) -> RetryPolicy:
        """This schedule with the job's own options in place of the settings they name."""
        given = (options.retry_delay, options.retry_backoff, options.retry_max_delay)
        if given == (None, None, None):
            return self
        return RetryPolicy(
            self.delay if options.retry_delay is None else options.retry_delay,
            self.backoff if options.retry_backoff is None else options.retry_backoff,
            self.max_delay if options.retry_max_delay is None else options.retry_max_delay,
        )

    def base_delay(self, attempt: int) -> float:
        """The wait (s) before the attempt after ``attempt``, before jitter."""
        if self.delay <= 0:
            return 0.0
        exponent = max(0, attempt - 1)
        try:
            grown = self.delay * self.backoff**exponent
        except OverflowError:
            grown = self.max_delay
        return min(self.max_delay, grown)

    def wait(self, attempt: int, draw: Callable[[], float] = random.random) -> float:
        """The wait (s) before the attempt after ``attempt``, jittered (``draw``: a number
        in ``[0, 1)``); 0: at once."""
        base = self.base_delay(attempt)
        if base <= 0:
            return 0.0
        return base * (JITTER_LOW + (1.0 - JITTER_LOW) * draw())
