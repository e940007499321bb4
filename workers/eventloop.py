"""The process's event loop for ``async def`` handlers (``EventLoop``), and the deadlines of
the calls on it, kept from outside the loop so that they hold whatever a coroutine does.

A call is settled at its deadline (``subtask_timeout`` / ``job_timeout`` from its start) by
the loop's watcher thread, not by the coroutine: a failed attempt (``TimedOut``), its slot
freed at once, and the coroutine cancelled; one that swallows its cancellation runs on,
abandoned, and whatever it returns is ignored.

A coroutine that blocks the loop (``time.sleep``, CPU-bound work) stops every other one on
it. The loop turns a timer of its own every ``TICK`` s; when it has not turned for
``BLOCKED_AFTER`` s the watcher logs ``event_loop_blocked`` once, naming the job running
then, and the time the loop stays blocked does not count against the other calls on it
(their deadlines move by it): only the blocking call's own time runs, and it is charged if
it passes its deadline. Blocked past that call's deadline plus the watchdog's grace
(``workers.watchdog.grace_for``), the loop is hung: the calls waiting on it are handed
back (``LoopHung``, a ``Suspended``: same attempt, uncharged), and the worker is told to
leave and exit with ``EXIT_HUNG`` (``on_hung``), as for a thread stuck in C code.
"""

from __future__ import annotations

import asyncio
import functools
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from queue import SimpleQueue
from typing import Any

import structlog

from queueworks.context import Suspended

from .watchdog import EXIT_HUNG, TimedOut, grace_for, timed_out

TICK = 0.1  # s between two turns of the loop's own timer
BLOCKED_AFTER = 0.5  # s without a turn: the loop is blocked
WATCH = 0.05  # s between two looks of the watcher while calls are on the loop
IDLE_WATCH = 0.25  # ... and while none is


class LoopHung(Suspended):
    """The event loop stayed blocked by another call past the hard limit: this one did not
    run to its end here. It goes back (same attempt) and the worker leaves and exits."""


@dataclass(slots=True, eq=False)
class Call:
    """One handler call to run: ``fn(*args)``; ``key`` orders calls (partitioned tasks: one
    call per key at a time); ``item`` is the caller's, given back with the outcome
    (``value`` or ``error``). The rest is the event loop's, for a coroutine. A queue's job
    is one (``workers.running_job.RunningJob``): the call is the job, no wrapper."""

    item: Any
    label: int | str
    fn: Callable[..., Any]
    args: tuple[Any, ...]
    key: str | None = None
    value: Any = None
    error: BaseException | None = None
    extra: Any = None  # the caller's, beside ``item`` (a subtask's decoded entry)
    started: float = 0.0
    timeout: float = 0.0
    deadline: float = 0.0  # moves on while the loop is blocked by another call
    task: asyncio.Task[Any] | None = None
    sink: SimpleQueue[Call] | None = None  # where its outcome goes
    # why whoever stopped it did (``workers.stopping``): it ends with this error, at once if
    # it is a coroutine, and does not start if it has not yet
    stop: BaseException | None = None


@dataclass
class Block:
    """The loop has not turned since ``since``; ``culprits``: the calls seen running then."""

    since: float
    culprits: dict[int, Call] = field(default_factory=dict)
    unknown_said: bool = False


class EventLoop:
    """The loop, in a daemon thread of its own, and its watcher (both started on first
    use). ``begin`` a call (its deadline runs from now), ``launch`` those begun (one wake-up
    of the loop for the lot); the outcome goes to the call's ``sink``."""

    def __init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        self._lock = threading.Lock()
        self._halt = threading.Event()
        self.live: dict[int, Call] = {}  # id(call) -> a call not settled yet
        self.abandoned: dict[int, Call] = {}  # settled at its deadline, still running
        self.turned = 0.0  # monotonic time of the loop's last turn of its timer
        self.block: Block | None = None
        self.hung = False
        self.on_hung: Callable[[], None] | None = None  # the worker: leave, exit EXIT_HUNG
        self.log: Any = structlog.get_logger()

    def use(self, log: Any) -> None:
        """The logger for what follows (one task run's)."""
        self.log = log

    def loop(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None:
                self._halt = threading.Event()  # (a stopped one's watcher has ended)
                loop = asyncio.new_event_loop()
                self.turned = time.monotonic()
                loop.call_soon(self._tick, loop)
                for target, args, name in (
                    (_serve, (loop,), "qw-asyncio"),
                    (self._watch, (self._halt,), "qw-asyncio-watch"),
                ):
                    threading.Thread(target=target, args=args, name=name, daemon=True).start()
                self._loop = loop
            return self._loop

    def stop(self) -> None:
        with self._lock:
            self._halt.set()
            if self._loop is not None:
                self._loop.call_soon_threadsafe(self._loop.stop)
                self._loop = None

    # -- the caller's side ------------------------------------------------------------------

    def begin(self, call: Call, timeout: float, sink: SimpleQueue[Call]) -> None:
        """``call`` is on its way to the loop: its deadline runs from now."""
        now = time.monotonic()
        call.started, call.timeout, call.deadline, call.sink = now, timeout, now + timeout, sink
        self.live[id(call)] = call
        if self.hung:  # (checked after: a hang settles only what it finds live)
            self._settle(call, None, LoopHung("the event loop is hung: handed back"))
        if call.stop is not None:  # (checked after: ``stop`` settles only what it finds live)
            self._settle(call, None, call.stop)

    def launch(self, calls: list[Call]) -> None:
        """Start the coroutines of ``calls`` (begun) on the loop."""
        self.loop().call_soon_threadsafe(self._on_loop, calls)

    def run(
        self,
        label: int | str,
        fn: Callable[..., Any],
        args: tuple[Any, ...],
        timeout: float,
    ) -> Any:
        """``fn(*args)`` on the loop, waited for here (concurrency 1): its value, or its
        error raised (``TimedOut`` at its deadline). Interrupted here, it is cancelled."""
        return self.run_call(Call(None, label, fn, args), timeout)

    def run_call(self, call: Call, timeout: float) -> Any:
        """``run`` for a call made already (a queue's job is its own call)."""
        sink: SimpleQueue[Call] = SimpleQueue()
        self.begin(call, timeout, sink)
        self.launch([call])
        try:
            done = sink.get()
        except BaseException:
            self._abandon(call)
            raise
        if done.error is not None:
            raise done.error
        return done.value

    def stop_call(self, call: Call, error: BaseException) -> None:
        """End ``call`` with ``error`` now (any thread): settled here, not by its coroutine,
        which is cancelled; one not begun yet ends so as it begins, without running."""
        call.stop = error
        if self._settle(call, None, error):
            self._abandon(call)

    # -- on the loop's thread ---------------------------------------------------------------

    def _tick(self, loop: asyncio.AbstractEventLoop) -> None:
        self.turned = time.monotonic()
        loop.call_later(TICK, self._tick, loop)

    def _on_loop(self, calls: list[Call]) -> None:
        loop = asyncio.get_running_loop()
        live = self.live
        for call in calls:
            if id(call) not in live:
                continue  # settled before it could start (its deadline, a hung loop)
            try:
                task = loop.create_task(call.fn(*call.args))
            except BaseException as exc:  # the call's outcome: never lost
                self._settle(call, None, exc)
                continue
            call.task = task
            task.add_done_callback(functools.partial(self._ended, call))
            if id(call) not in live:  # it timed out while its task was being made
                self.abandoned[id(call)] = call
                task.cancel()

    def _ended(self, call: Call, task: asyncio.Task[Any]) -> None:
        if id(call) not in self.live:  # settled already: what it did now is ignored
            if self.abandoned.pop(id(call), None) is not None:
                self.log.info("abandoned_call_ended", **_what(call))
            return
        if task.cancelled():
            self._settle(call, None, asyncio.CancelledError())
        elif (exc := task.exception()) is not None:
            self._settle(call, None, exc)
        else:
            self._settle(call, task.result(), None)

    def _settle(self, call: Call, value: Any, error: BaseException | None) -> bool:
        """Give ``call`` its outcome, once (whoever takes it from ``live`` first)."""
        if self.live.pop(id(call), None) is None:
            return False
        call.value, call.error = value, error
        assert call.sink is not None
        call.sink.put(call)
        return True

    def _abandon(self, call: Call) -> None:
        """Settled here, not by the coroutine: cancel it, and keep it in sight until it
        ends (it may go on, or block the loop)."""
        task, loop = call.task, self._loop
        if task is not None and not task.done():
            self.abandoned[id(call)] = call
            if loop is not None:
                loop.call_soon_threadsafe(task.cancel)
        self.live.pop(id(call), None)

    # -- the watcher's thread -----------------------------------------------------------------

    def _watch(self, halt: threading.Event) -> None:
        while not halt.wait(WATCH if self.live or self.abandoned else IDLE_WATCH):
            try:
                self.check(time.monotonic())
            except Exception:  # never let the watcher die: log and look again
                self.log.exception("event_loop_watch_error")

    def check(self, now: float) -> None:
        """One look: is the loop blocked (or back), and which calls are past deadline."""
        if self.hung:
            return
        if now - self.turned > BLOCKED_AFTER:
            self._blocked(now)
            if self.hung:
                return
        elif self.block is not None:
            self._unblocked()
        block = self.block
        for call in list(self.live.values()):
            if block is not None and id(call) not in block.culprits:
                continue  # waiting on the blocked loop: its time does not run
            if now >= call.deadline:
                how = "cancelled" if block is None else "abandoned: it blocked the event loop"
                self._expire(call, how)

    def _expire(self, call: Call, how: str) -> None:
        error = TimedOut(timed_out(call.label, call.timeout, how))
        if self._settle(call, None, error):
            self.log.warning("call_timed_out", timeout=call.timeout, how=how, **_what(call))
            self._abandon(call)

    def _blocked(self, now: float) -> None:
        block = self.block
        if block is None:
            block = self.block = Block(self.turned)
        running = self._running()
        if running is not None and id(running) not in block.culprits:
            block.culprits[id(running)] = running
            self.log.warning(
                "event_loop_blocked",
                blocked_s=round(now - block.since, 2),
                waiting=len(self.live) - (id(running) in self.live),
                **_what(running),
            )
        elif running is None and not block.culprits and not block.unknown_said:
            block.unknown_said = True
            self.log.warning("event_loop_blocked", blocked_s=round(now - block.since, 2), job=None)
        for culprit in block.culprits.values():
            if now > culprit.deadline + grace_for(culprit.timeout):
                self._hang(culprit, now - block.since)
                return
        if not block.culprits and self.live:  # blocked by no call of ours: the longest limit
            limit = max(c.timeout + grace_for(c.timeout) for c in list(self.live.values()))
            if now - block.since > limit:
                self._hang(None, now - block.since)

    def _unblocked(self) -> None:
        """The loop turned again: the calls that waited on it get the time back."""
        block, self.block = self.block, None
        assert block is not None
        resumed = self.turned
        for call in list(self.live.values()):
            if id(call) not in block.culprits:
                call.deadline += max(0.0, resumed - max(block.since, call.started))
        self.log.info("event_loop_unblocked", blocked_s=round(resumed - block.since, 2))

    def _running(self) -> Call | None:
        """The call whose coroutine runs on the loop now (read from outside it)."""
        loop = self._loop
        task = asyncio.current_task(loop) if loop is not None else None
        if task is None:
            return None
        for calls in (self.live, self.abandoned):
            for call in list(calls.values()):
                if call.task is task:
                    return call
        return None

    def _hang(self, culprit: Call | None, blocked: float) -> None:
        """Blocked past the hard limit: hand back every call waiting on the loop, charge
        the culprit, and tell the worker to leave and exit."""
        self.hung = True
        self.log.error(
            "event_loop_hung",
            blocked_s=round(blocked, 2),
            handed_back=len(self.live) - (culprit is not None and id(culprit) in self.live),
            exit_code=EXIT_HUNG,
            **(_what(culprit) if culprit is not None else {"job": None}),
        )
        for call in list(self.live.values()):
            if call is culprit:
                self._expire(call, "abandoned: it blocked the event loop")
            else:
                self._settle(call, None, LoopHung("the event loop is hung: handed back"))
        if self.on_hung is not None:
            self.on_hung()


def _serve(loop: asyncio.AbstractEventLoop) -> None:
    """The loop's thread: run it until ``stop``, then close it (an unclosed loop warns when
    it is collected, wherever that happens)."""
    try:
        loop.run_forever()
    finally:
        loop.close()


def _what(call: Call) -> dict[str, Any]:
    """A call for a log line: which subtask or job, and its handler."""
    fn = call.fn
    name = "index" if isinstance(call.label, int) else "job"
    return {name: call.label, "handler": f"{fn.__module__}:{fn.__qualname__}"}
