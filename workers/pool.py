"""A worker pool: one supervisor process keeps N worker processes running
(``queueworks worker --processes N``).

Each member is a fresh ``python -m queueworks worker`` process with the pool's options and
an id of its own (``<pool>-<n>``, n counting every start), so each is a full worker: its
own heartbeat, memberships and watchdog. ``QUEUEWORKS_POOL_MEMBER`` in its environment
(the pool's id) makes it one worker process, whatever ``--processes`` says. The
supervisor runs no handler and imports none; it starts members, watches them exit, and
writes the pool's record (``queueworks.transport.pools``).

* A member that exits for any reason (its handler hung past the hard limit, a crash, an
  OOM kill, SIGKILL, a retirement after ``--max-jobs-per-child``) is replaced within a
  tick (``TICK``). What it held is reclaimed by the others as for any worker that died.
* A member that exits before it was ever up (its heartbeat seen in Redis; without Redis:
  ``STARTUP`` s alive) failed at start-up (a Redis it refuses, an option it rejects, a
  crash on import): its next start waits, twice as long each time (``BACKOFF_FIRST`` ..
  ``BACKOFF_MAX``), said in one log line per wait; a member that comes up resets it.
* ``stop()``: every member is sent SIGTERM (its warm stop); ``stop(cold=True)``: again
  (its cold stop). ``run`` returns once every member has exited: 0 if each left cleanly.

Members run in their own process group, so a terminal's Ctrl-C reaches the supervisor
only, which passes it on once; on Linux a member is sent SIGTERM if the supervisor dies.
Signal handlers are the CLI's: it calls ``stop``.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass

from queueworks.logs import get_logger
from queueworks.protocol.keys import Keys
from queueworks.transport.connection import UNAVAILABLE, Connection
from queueworks.transport.pools import PoolRecord, forget_pool, write_pool

from .watchdog import EXIT_HUNG

TICK = 0.1  # s between two looks at the members
STARTUP = 5.0  # s: without Redis, a member that exits sooner failed at start-up
LOOK_UP_EVERY = 0.25  # s between two looks for the heartbeats of members not yet up
BACKOFF_FIRST = 1.0  # s: the first wait after a failed start-up; doubles each time
BACKOFF_MAX = 60.0
RECORD_EVERY = 1.0  # s between two writes of the pool's record
RECORD_TTL = 10.0  # s the record outlives its last write
PR_SET_PDEATHSIG = 1
POOL_MEMBER = "QUEUEWORKS_POOL_MEMBER"  # in a member's environment: its pool's id


def cpus() -> int:
    """The CPUs this process may run on (its affinity), for ``--processes auto``."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def _die_with_parent() -> None:  # pragma: no cover - runs in the child, before exec
    """In the member, before it runs: SIGTERM when the supervisor dies (Linux only)."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    except (OSError, AttributeError):
        pass


@dataclass
class Slot:
    """One place in the pool: the member running in it, and its start-up failures."""

    number: int
    proc: subprocess.Popen[bytes] | None = None
    member: str = ""
    started: float = 0.0  # monotonic
    up: bool = False  # its heartbeat was seen: it started
    failures: int = 0  # start-up failures in a row
    next_start: float = 0.0  # monotonic: not before


class Pool:
    def __init__(
        self,
        pool_id: str,
        processes: int,
        command: Sequence[str],
        *,
        r: Connection | None,
        keys: Keys,
        python: str = sys.executable,
    ) -> None:
        if processes < 1:
            raise ValueError(f"processes must be at least 1, got {processes}")
        self.id = pool_id
        self.processes = processes
        self.command = list(command)  # after `python -m queueworks`: the member's command
        self.r, self.keys, self.python = r, keys, python
        self.log = get_logger(pool_id=pool_id)
        self.slots = [Slot(k) for k in range(processes)]
        self.stopping = False
        self.cold = False
        self._sent = 0  # signals sent to the members so far: 1 warm, 2 cold
        self.starts = 0
        self.restarts = self.retired = self.failed = 0
        self.unclean = 0  # members that exited non-zero after the stop began
        self.started_at = time.time()
        self._recorded = 0.0  # monotonic: last record write
        self._looked = 0.0  # monotonic: last look for members' heartbeats
        self._redis_ok = True

    # -- control (the CLI's signal handlers call these) -----------------------------------

    def stop(self, *, cold: bool = False) -> None:
        """Warm stop: every member leaves as on its own SIGTERM; cold: interrupt them."""
        self.stopping = True
        self.cold = self.cold or cold

    # -- the loop -------------------------------------------------------------------------

    def run(self) -> int:
        """Keep the members running until stopped; the exit status for the process."""
        self.log.info("pool_starting", processes=self.processes, pid=os.getpid())
        try:
            while True:
                now = time.monotonic()
                self._reap(now)
                if self.stopping:
                    self._pass_on_stop()
                    if not any(s.proc for s in self.slots):
                        break
                else:
                    for slot in self.slots:
                        if slot.proc is None and now >= slot.next_start:
                            self._start(slot)
                self._look_up(now)
                self._record(now)
                time.sleep(TICK)
        finally:
            for slot in self.slots:  # an error of ours: leave no member behind
                if slot.proc is not None and slot.proc.poll() is None:
                    slot.proc.send_signal(signal.SIGTERM)
            self._forget()
        self.log.info("pool_stopped", restarts=self.restarts, unclean=self.unclean)
        return 1 if self.unclean or self.cold else 0

    def _pass_on_stop(self) -> None:
        want = 2 if self.cold else 1
        while self._sent < want:
            self._sent += 1
            for slot in self.slots:
                if slot.proc is not None and slot.proc.poll() is None:
                    slot.proc.send_signal(signal.SIGTERM)

    def _start(self, slot: Slot) -> None:
        self.starts += 1
        member = f"{self.id}-{self.starts}"
        args = [self.python, "-m", "queueworks", *self.command]
        args += ["--name", member]
        slot.proc = subprocess.Popen(
            args,
            env={**os.environ, POOL_MEMBER: self.id},
            process_group=0,
            preexec_fn=_die_with_parent,
            stdin=subprocess.DEVNULL,
        )
        slot.member, slot.started, slot.up = member, time.monotonic(), False
        if self.starts > self.processes:
            self.restarts += 1
        self.log.info("pool_member_started", member=member, pid=slot.proc.pid, slot=slot.number)
        self._recorded = 0.0  # say who the members are now

    def _reap(self, now: float) -> None:
        for slot in self.slots:
            proc = slot.proc
            if proc is None or (code := proc.poll()) is None:
                continue
            slot.proc = None
            self._recorded = 0.0
            lived = now - slot.started
            if self.stopping:
                # a member stopped before it set its own handlers dies of the SIGTERM
                clean = code in (0, -signal.SIGTERM)
                self.unclean += not clean
                log = self.log.info if clean else self.log.warning
                log("pool_member_left", member=slot.member, exit_code=code)
                continue
            why = _exit_reason(code)
            if code == 0:
                self.retired += 1
            else:
                self.failed += 1
            up = slot.up or self._alive_lately(slot) or (self.r is None and lived >= STARTUP)
            if code != 0 and not up:
                slot.failures += 1
                wait = min(BACKOFF_FIRST * 2 ** (slot.failures - 1), BACKOFF_MAX)
                slot.next_start = now + wait
                self.log.warning(
                    "pool_member_failing_at_start",
                    member=slot.member,
                    exit_code=code,
                    lived=round(lived, 2),
                    failures=slot.failures,
                    next_start_in=wait,
                )
                continue
            slot.failures, slot.next_start = 0, now
            log = self.log.info if code == 0 else self.log.warning
            log("pool_member_exited", member=slot.member, exit_code=code, why=why)

    def _alive_lately(self, slot: Slot) -> bool:
        """A member that just ended: was it up after all (its heartbeat outlives it by up to
        a TTL: it came up between two looks)?"""
        if self.r is None:
            return False
        try:
            return bool(self.r.exists(self.keys.worker_heartbeat(slot.member)))
        except UNAVAILABLE:
            return False

    def _look_up(self, now: float) -> None:
        """Mark the members whose heartbeat is in Redis as up (looked for a few times a
        second, only while some member is not up yet)."""
        waiting = [s for s in self.slots if s.proc is not None and not s.up]
        if self.r is None or not waiting or now - self._looked < LOOK_UP_EVERY:
            return
        self._looked = now
        try:
            pipe = self.r.pipeline(transaction=False)
            for slot in waiting:
                pipe.exists(self.keys.worker_heartbeat(slot.member))
            for slot, seen in zip(waiting, pipe.execute(), strict=True):
                if seen:
                    slot.up, slot.failures = True, 0
        except UNAVAILABLE:
            pass  # not up, then: the members wait for Redis too

    # -- the record -----------------------------------------------------------------------

    def record(self) -> PoolRecord:
        now = time.monotonic()
        waits = [s.next_start - now for s in self.slots if s.proc is None and s.failures]
        return PoolRecord(
            id=self.id,
            host=socket.gethostname(),
            pid=os.getpid(),
            processes=self.processes,
            members=[s.member for s in self.slots if s.proc is not None],
            restarts=self.restarts,
            retired=self.retired,
            failed=self.failed,
            backoff=round(max([0.0, *waits]), 3),
            started_at=self.started_at,
            updated_at=time.time(),
        )

    def _record(self, now: float) -> None:
        if self.r is None or now - self._recorded < RECORD_EVERY:
            return
        self._recorded = now
        try:
            pipe = self.r.pipeline(transaction=False)
            write_pool(pipe, self.keys, self.record(), RECORD_TTL)
            pipe.execute()
            self._redis_ok = True
        except UNAVAILABLE as exc:  # the members wait for Redis themselves; so do we
            if self._redis_ok:
                self.log.warning("pool_record_failed", error=str(exc))
            self._redis_ok = False

    def _forget(self) -> None:
        if self.r is None:
            return
        try:
            pipe = self.r.pipeline(transaction=False)
            forget_pool(pipe, self.keys, self.id)
            pipe.execute()
        except UNAVAILABLE:
            pass


def _exit_reason(code: int) -> str:
    """Why a member ended, in words, from its exit status (negative: killed by a signal)."""
    if code == 0:
        return "left (a per-member limit)"
    if code == EXIT_HUNG:
        return "a handler overran its hard limit"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exited with status {code}"
