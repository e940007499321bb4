"""Handlers beside the member's own thread: ``async def`` handlers on one event loop per
process (``EventLoop``), and up to N handler calls in flight at once (``InFlight``).

``--concurrency N`` (default 1): up to N subtasks or jobs of the current task run at once —
coroutines on the event loop, plain functions on a pool of N threads (each watched by the
watchdog in a slot of its own). Outcomes come back to the member's thread, which records
them in its ledger: the runtime itself stays single-threaded. A coroutine past its
timeout is cancelled (a failed attempt, charged); a thread is interrupted by the watchdog
as on the member's own thread.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import queue
import threading
from collections.abc import Callable, Coroutine
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from .watchdog import Slot, TimedOut, Watchdog, timed_out


def is_async(fn: Callable[..., Any]) -> bool:
    return inspect.iscoroutinefunction(fn)


class EventLoop:
    """The process's event loop for ``async def`` handlers, in a daemon thread of its own
    (started on first use)."""

    def __init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        self._lock = threading.Lock()

    def loop(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None:
                loop = asyncio.new_event_loop()
                threading.Thread(target=loop.run_forever, name="qw-asyncio", daemon=True).start()
                self._loop = loop
            return self._loop

    def submit(
        self,
        label: int | str,
        fn: Callable[..., Coroutine[Any, Any, Any]],
        args: tuple[Any, ...],
        timeout: float,
    ) -> Future[Any]:
        """Run ``fn(*args)`` on the loop, cancelled after ``timeout`` s (``TimedOut``)."""
        return asyncio.run_coroutine_threadsafe(_bounded(label, fn, args, timeout), self.loop())

    def run(
        self,
        label: int | str,
        fn: Callable[..., Coroutine[Any, Any, Any]],
        args: tuple[Any, ...],
        timeout: float,
    ) -> Any:
        """``submit`` and wait for it here (concurrency 1); interrupted here, it is cancelled."""
        future = self.submit(label, fn, args, timeout)
        try:
            return future.result()
        except BaseException:
            future.cancel()
            raise

    def stop(self) -> None:
        with self._lock:
            if self._loop is not None:
                self._loop.call_soon_threadsafe(self._loop.stop)
                self._loop = None


async def _bounded(
    label: int | str,
    fn: Callable[..., Coroutine[Any, Any, Any]],
    args: tuple[Any, ...],
    timeout: float,
) -> Any:
    """``fn(*args)``, cancelled after ``timeout`` s (then ``TimedOut``). ``asyncio.timeout``,
    not ``wait_for``: no second task per call; and a ``TimeoutError`` the handler raises
    itself stays its own."""
    limit = asyncio.timeout(timeout)
    try:
        async with limit:
            return await fn(*args)
    except TimeoutError:
        if limit.expired():
            raise TimedOut(timed_out(label, timeout, "cancelled")) from None
        raise


@dataclass
class Call:
    """One handler call to run: ``fn(*args)``; ``key`` orders calls (partitioned tasks: one
    call per key at a time); ``item`` is the caller's, given back with the outcome."""

    item: Any
    label: int | str
    fn: Callable[..., Any]
    args: tuple[Any, ...]
    key: str | None = None
    done: bool = False
    value: Any = None
    error: BaseException | None = None
    extra: dict[str, Any] = field(default_factory=dict)


class InFlight:
    """Up to ``n`` calls at once; ``collect`` gives back the finished ones, in the order
    they finished.

    Coroutines started in one turn go to the event loop together (``launch``: one wake-up
    of its thread for the lot, not one per call); ``collect`` launches what waits first,
    so a started call is never left unlaunched."""

    def __init__(self, n: int, loop: EventLoop, watchdog: Watchdog) -> None:
        self.n, self._loop, self._watchdog = n, loop, watchdog
        self._finished: queue.SimpleQueue[Call] = queue.SimpleQueue()
        self._work: queue.SimpleQueue[tuple[Call, float] | None] = queue.SimpleQueue()
        self._threads: list[threading.Thread] = []
        self._unlaunched: list[tuple[Call, float]] = []  # coroutines for the loop's next turn
        self.running: dict[int, Call] = {}  # id(call) -> call
        self.keys: dict[str, int] = {}  # ordering key -> calls in flight with it

    @classmethod
    def of(cls, run: Any) -> InFlight | None:
        """The run's (``--concurrency`` > 1), else None: one at a time on its own thread."""
        return cls(run.concurrency, run.aio, run.watchdog) if run.concurrency > 1 else None

    @property
    def free(self) -> int:
        return self.n - len(self.running)

    def busy(self, key: str | None) -> bool:
        return key is not None and key in self.keys

    def start(self, call: Call, timeout: float) -> None:
        self.running[id(call)] = call
        if call.key is not None:
            self.keys[call.key] = self.keys.get(call.key, 0) + 1
        if is_async(call.fn):
            self._unlaunched.append((call, timeout))
        else:
            self._ensure_threads()
            self._work.put((call, timeout))

    def launch(self) -> None:
        """Hand the coroutines started since the last launch to the event loop, at once."""
        if self._unlaunched:
            batch, self._unlaunched = self._unlaunched, []
            self._loop.loop().call_soon_threadsafe(self._on_loop, batch)

    def _on_loop(self, batch: list[tuple[Call, float]]) -> None:
        """On the loop's thread: a task per call, its outcome put back when it ends."""
        loop = asyncio.get_running_loop()
        for call, timeout in batch:
            try:
                task = loop.create_task(_bounded(call.label, call.fn, call.args, timeout))
            except BaseException as exc:  # the call's outcome: never lost
                call.error, call.done = exc, True
                self._finished.put(call)
                continue
            task.add_done_callback(functools.partial(self._settle, call))

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

    def _settle(self, call: Call, future: Future[Any] | asyncio.Future[Any]) -> None:
        if future.cancelled():
            call.error = asyncio.CancelledError()
        elif (exc := future.exception()) is not None:
            call.error = exc
        else:
            call.value = future.result()
        call.done = True
        self._finished.put(call)

    def _ensure_threads(self) -> None:
        while len(self._threads) < self.n:
            t = threading.Thread(target=self._thread, name="qw-handler", daemon=True)
            t.start()
            self._threads.append(t)

    def _thread(self) -> None:
        slot: Slot = self._watchdog.slot()
        while (got := self._work.get()) is not None:
            call, _ = got
            try:
                call.value = self._watchdog.call_in(slot, call.label, call.fn, *call.args)
            except BaseException as exc:  # the handler's, for the member to record
                call.error = exc
            call.done = True
            self._finished.put(call)
