"""The processes' own stop signals, installed by the CLI (and only there).

The first SIGTERM/SIGINT is a warm stop: ``warm()`` sets a flag; the process finishes or
aborts its step at a safe point, leaves, and exits. A second signal, or the grace period
running out, is a cold stop: ``ColdStop`` is raised in the main thread, wherever it is —
inside a running handler too. It is the one exception a worker lets out of a handler: a
handler's own ``SystemExit``, ``KeyboardInterrupt`` or ``GeneratorExit`` is a failed attempt
of that handler, never a reason for the worker to stop.
"""

from __future__ import annotations

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
