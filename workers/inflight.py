"""Up to N handler calls in flight at once (``InFlight``), beside the member's own thread.

``--concurrency N`` (default 1): up to N subtasks or jobs of the current task run at once —
coroutines on the process's event loop (``workers.eventloop.EventLoop``), plain functions
on a pool of N threads (each watched by the watchdog in a slot of its own). Outcomes come
back to the member's thread, which records them in its ledger: the runtime itself stays
single-threaded. A coroutine past its timeout is settled at its deadline, charged, whatever
it does (the event loop's watcher); a thread is interrupted by the watchdog as on the
member's own thread.
"""

from __future__ import annotations

import functools
import inspect
import queue
import threading
from collections.abc import Callable
from typing import Any

from .eventloop import Call, EventLoop
from .watchdog import Slot, Watchdog

__all__ = ["Call", "EventLoop", "InFlight", "is_async"]


def is_async(fn: Callable[..., Any]) -> bool:
    """Whether ``fn`` is a coroutine function (asked once per job: remembered for the
    handlers a worker runs)."""
    try:
        return _is_async(fn)
    except TypeError:  # unhashable
        return inspect.iscoroutinefunction(fn)


@functools.lru_cache(maxsize=1024)
def _is_async(fn: Callable[..., Any]) -> bool:
    return inspect.iscoroutinefunction(fn)


class Ended(queue.SimpleQueue[Call]):
    """The calls that ended, for the member's thread; ``told`` is called after each is
    handed back (``queueworks.transport.unblock``: it ends the member thread's wait)."""

    told: Callable[[], None] | None = None

    def put(self, item: Call, block: bool = True, timeout: float | None = None) -> None:
        super().put(item, block, timeout)
        if self.told is not None:
            self.told()


class InFlight:
    """Up to ``n`` calls at once; ``collect`` gives back the finished ones, in the order
    they finished.

    Coroutines started in one turn go to the event loop together (``launch``: one wake-up
    of its thread for the lot, not one per call); ``collect`` launches what waits first,
    so a started call is never left unlaunched."""

    def __init__(self, n: int, loop: EventLoop, watchdog: Watchdog) -> None:
        self.n, self._loop, self._watchdog = n, loop, watchdog
        self._finished = Ended()
        self._work: queue.SimpleQueue[Call | None] = queue.SimpleQueue()
        self._threads: list[threading.Thread] = []
        self._unlaunched: list[Call] = []  # coroutines for the loop's next turn
        self.running: dict[int, Call] = {}  # id(call) -> call
        self.keys: dict[str, int] = {}  # ordering key -> calls in flight with it

    @classmethod
    def of(cls, run: Any) -> InFlight | None:
        """The run's (``--concurrency`` > 1), else None: one at a time on its own thread."""
        return cls(run.concurrency, run.aio, run.watchdog) if run.concurrency > 1 else None

    def on_end(self, told: Callable[[], None]) -> None:
        """Call ``told`` (from the call's thread) whenever a call ends."""
        self._finished.told = told

    def ended(self) -> bool:
        """Whether a call ended that ``collect`` has not given back yet."""
        return not self._finished.empty()

    @property
    def free(self) -> int:
        return self.n - len(self.running)

    def busy(self, key: str | None) -> bool:
        return key is not None and key in self.keys

    def start(self, call: Call, timeout: float) -> None:
        """Start ``call``: a coroutine's deadline runs from now (settled by the event loop's
        watcher at the latest then); a plain function's on its pool thread."""
        self.running[id(call)] = call
        if call.key is not None:
            self.keys[call.key] = self.keys.get(call.key, 0) + 1
        if is_async(call.fn):
            self._loop.begin(call, timeout, self._finished)
            self._unlaunched.append(call)
        else:
            call.timeout = timeout  # its own queue's: the watchdog's is the last task's used
            self._ensure_threads()
            self._work.put(call)

    def launch(self) -> None:
        """Hand the coroutines started since the last launch to the event loop, at once."""
        if self._unlaunched:
            batch, self._unlaunched = self._unlaunched, []
            self._loop.launch(batch)

    def collect(self, wait: float) -> list[Call]:
        """Finished calls; waits up to ``wait`` s for the first one if none has finished."""
        self.launch()
        out: list[Call] = []
        try:
            out.append(
                self._finished.get(timeout=wait) if wait > 0 else self._finished.get_nowait()
            )
            while True:
                out.append(self._finished.get_nowait())
        except queue.Empty:
            pass
        for call in out:
            self.running.pop(id(call), None)
            if call.key is not None:
                left = self.keys[call.key] - 1
                if left:
                    self.keys[call.key] = left
                else:
                    del self.keys[call.key]
        return out

    def close(self) -> None:
        for _ in self._threads:
            self._work.put(None)
        self._threads = []

    def _ensure_threads(self) -> None:
        while len(self._threads) < self.n:
            t = threading.Thread(target=self._thread, name="qw-handler", daemon=True)
            t.start()
            self._threads.append(t)

    def _thread(self) -> None:
        slot: Slot = self._watchdog.slot()
        while (call := self._work.get()) is not None:
            if call.stop is not None:  # stopped before it started: it does not
                call.error = call.stop
                self._finished.put(call)
                continue
            try:
                call.value = self._watchdog.call_in(
                    slot, call.label, call.fn, *call.args, timeout=call.timeout or None
                )
            except BaseException as exc:  # the handler's, for the member to record
                call.error = exc
            self._finished.put(call)
