"""A long-lived queueworks process (worker, controller): its own stop signals, installed by
the CLI (and only there), and its heap frozen once it is set up (``freeze_heap``).

The first SIGTERM/SIGINT is a warm stop: ``warm()`` sets a flag; the process finishes or
aborts its step at a safe point, leaves, and exits. A second signal, or the grace period
running out, is a cold stop: ``ColdStop`` is raised in the main thread, wherever it is —
inside a running handler too. It is the one exception a worker lets out of a handler: a
handler's own ``SystemExit``, ``KeyboardInterrupt`` or ``GeneratorExit`` is a failed attempt
of that handler, never a reason for the worker to stop.
"""

from __future__ import annotations

import gc
import signal
import threading
from collections.abc import Callable
from typing import Any


class ColdStop(BaseException):
    """The process was told to stop now (a second signal, or the grace period ran out)."""


def install_stop_signals(warm: Callable[[], None], grace: float) -> None:
    """First signal: ``warm()``, and a cold stop after ``grace`` s (0: none); second: cold."""
    warned = threading.Event()

    def handler(signum: int, frame: Any) -> None:
        if warned.is_set():
            raise ColdStop(f"stopped by signal {signal.Signals(signum).name}")
        warned.set()
        warm()
        if grace > 0:
            # The timer's thread cannot raise in the main thread: it sends the main thread a
            # second signal, which also interrupts a blocking call there (a sleep, a read).
            main = threading.main_thread().ident
            assert main is not None
            timer = threading.Timer(grace, signal.pthread_kill, args=(main, signal.SIGTERM))
            timer.daemon = True
            timer.start()

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)


def install_pass_on_signals(stop: Callable[[bool], None]) -> None:
    """A supervisor's: the first SIGTERM/SIGINT is ``stop(False)`` (warm), any later one
    ``stop(True)`` (cold); nothing is raised: it waits for its children either way."""
    signals = 0

    def handler(signum: int, frame: Any) -> None:
        nonlocal signals
        signals += 1
        stop(signals > 1)

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)


def freeze_heap() -> None:
    """Move every object alive now (modules, classes, settings, clients: what the process
    keeps until it exits) out of the cyclic garbage collector's sight (``gc.freeze``).

    A worker allocates a few dozen objects per job, and every so often the collector's
    oldest generation walks the whole heap: a burst of milliseconds in a process that
    otherwise runs for microseconds between waits on Redis. Frozen, the collector walks
    only what came since. Measured (2 workers and one producer on 2 cores, one call per
    job, side by side): with the workers' heaps frozen the rate was higher in 7 rounds of
    8 (median 14,000 against 9,700 jobs/s); the same with the processes pinned so that
    redis-server and the producer share a core (about 20,000 both), so what it changes is
    likely where the scheduler puts redis-server after such a burst: a job costs a
    cross-core wake-up each way when it is not beside the producer."""
    gc.collect()
    gc.freeze()
