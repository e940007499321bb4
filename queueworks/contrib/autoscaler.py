"""``queueworks autoscale``: run a scale command with the wanted worker count.

The leading controller publishes the workers each node selector wants
(``queueworks.protocol.wanted``); this loop reads one selector's count every ``interval`` s and runs
the user's command (``docker compose up -d --no-recreate --scale worker={n} worker``,
``kubectl scale deployment/worker --replicas={n}``) with ``{n}`` replaced, whenever the
count to run changes. The decision is ``Hysteresis``, pure:

- the count is the wanted one clamped to ``[minimum, maximum]``;
- up at once: a backlog (or a task's ``min_nodes``) gets its workers without waiting;
- down only to the most any reading asked for over the last ``cooldown`` s (a
  stabilization window, as Kubernetes' HPA scales down): a dip shorter than that changes
  nothing, so it never flaps; scale to zero is the same rule with a wanted count of 0;
- nothing published (no controller leads, or none has counted yet): hold what runs.

The command scales down by stopping the surplus the way it stops anything (compose and
Kubernetes send SIGTERM): a worker's warm stop finishes or hands back what it holds and
leaves, so nothing busy is killed as long as the grace period covers it.

Failing safe: a command that exits non-zero, cannot start or runs past ``timeout`` is
logged (its exit code and program name, never its arguments or the Redis URL: they may
hold secrets) and tried again after a backoff that doubles up to ``MAX_BACKOFF`` s; a Redis
that does not answer is logged and read again after the same kind of backoff. The count
that runs is then taken as unknown until a command succeeds.

A stop (SIGTERM, SIGINT) does not wait for a command under way: the command gets SIGTERM
(``docker compose`` and ``kubectl`` end there; what they did stays done), ``STOP_WAIT`` s
to exit, then SIGKILL, so the loop exits well within a container's grace period.
"""

from __future__ import annotations

import contextlib
import shlex
import subprocess
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from queueworks.protocol import wanted as published
from queueworks.protocol.keys import Keys
from queueworks.transport.connection import UNAVAILABLE, Connection

MIN_BACKOFF, MAX_BACKOFF = 1.0, 60.0  # s: waits after a failure, doubling
STOP_WAIT = 3.0  # s a command under way has to exit after SIGTERM when the loop stops
STOP_LOOK = 0.1  # s between two looks for a stop while a command runs


@dataclass
class Hysteresis:
    """The count to run from the wanted counts read over time (see the module docstring)."""

    minimum: int
    maximum: int
    cooldown: float
    running: int | None = None  # the count the last successful command set (None: unknown)
    readings: deque[tuple[float, int]] = field(default_factory=deque)

    def __post_init__(self) -> None:
        if self.minimum < 0:
            raise ValueError(f"--min must be at least 0, not {self.minimum}")
        if self.maximum < max(self.minimum, 1):
            raise ValueError(
                f"--max must be at least 1 and at least --min ({self.minimum}), not {self.maximum}"
            )
        if not 0 <= self.cooldown <= 86400:
            raise ValueError(f"--cooldown must be 0 to 86400 s, not {self.cooldown}")

    def decide(self, wanted: int | None, now: float) -> int | None:
        """The count to run now, if it differs from what runs (None: leave it)."""
        if wanted is None:
            return None
        count = min(self.maximum, max(self.minimum, wanted))
        self.readings.append((now, count))
        while self.readings and now - self.readings[0][0] > self.cooldown:
            self.readings.popleft()
        if self.running is not None and count > self.running:
            return count
        down_to = max(n for _, n in self.readings)  # unknown: the most of the window
        return down_to if self.running is None or down_to < self.running else None


def command_for(template: str, *, shell: bool) -> Callable[[int], list[str] | str]:
    """The command to run for a count: ``template`` split like a shell would (no shell
    runs it), ``{n}`` replaced in each word; with ``shell``, the string for ``sh -c``.
    ``ValueError`` when it has no ``{n}`` or does not split."""
    if "{n}" not in template:
        raise ValueError("--scale-command must contain {n}, the worker count")
    if shell:
        return lambda n: template.replace("{n}", str(n))
    try:
        words = shlex.split(template)
    except ValueError as exc:
        raise ValueError(f"--scale-command does not split into words: {exc}") from None
    if not words:
        raise ValueError("--scale-command is empty")
    return lambda n: [w.replace("{n}", str(n)) for w in words]


def program_of(command: list[str] | str) -> str:
    """What a log may name of a command: its program, never its arguments."""
    first = command[0] if isinstance(command, list) else (command.split() or ["sh"])[0]
    return first.rsplit("/", 1)[-1]


class Autoscaler:
    def __init__(
        self,
        r: Connection,
        keys: Keys,
        hysteresis: Hysteresis,
        command: Callable[[int], list[str] | str],
        log: Any,
        *,
        selector: str = "",
        interval: float = 1.0,
        timeout: float = 300.0,
    ) -> None:
        self.r, self.keys, self.decide, self.command = r, keys, hysteresis, command
        self.log, self.selector = log.bind(selector=selector), selector
        self.interval, self.timeout = interval, timeout
        self.backoff = MIN_BACKOFF
        self.retry_at = 0.0  # monotonic s before which no command runs (after a failure)
        self.runs = 0  # commands run, successful or not
        self._stop = threading.Event()

    def stop(self) -> None:
        self._stop.set()

    def run(self) -> None:
        self.log.info("autoscale_starting", cooldown=self.decide.cooldown)
        while not self._stop.is_set():
            self._stop.wait(self.tick())
        self.log.info("autoscale_stopped", running=self.decide.running, commands=self.runs)

    def tick(self) -> float:
        """One look and, if the count changes, one command; seconds until the next look."""
        try:
            value = published.read(self.r, self.keys)
        except UNAVAILABLE as exc:
            self.log.warning("redis_unavailable", error=type(exc).__name__, retry_in=self.backoff)
            return self._failed()
        now = time.monotonic()
        wanted = None if value is None else value.of(self.selector)
        count = self.decide.decide(wanted, now)
        if count is None or now < self.retry_at:
            return self.interval
        return self.interval if self.scale(count, wanted) else self.retry_at - now

    def scale(self, count: int, wanted: int | None) -> bool:
        """Run the command for ``count``; True if it succeeded."""
        command = self.command(count)
        program = program_of(command)
        self.runs += 1
        self.log.info(
            "scaling", to=count, running=self.decide.running, wanted=wanted, program=program
        )
        started = time.monotonic()
        code = run_command(command, self.timeout, self._stop)
        took = round(time.monotonic() - started, 3)
        if code == "stopped":
            self.decide.running = None
            self.log.warning("scale_stopped", to=count, program=program, took_s=took)
            return False
        if code != 0:
            self.decide.running = None  # what runs now is not known: the next count runs
            self.log.error(
                "scale_failed",
                to=count,
                exit_code=code,
                program=program,
                took_s=took,
                retry_in=self.backoff,
            )
            self._failed()
            return False
        self.decide.running, self.backoff, self.retry_at = count, MIN_BACKOFF, 0.0
        self.log.info("scaled", to=count, took_s=took)
        return True

    def _failed(self) -> float:
        wait = self.backoff
        self.retry_at = time.monotonic() + wait
        self.backoff = min(self.backoff * 2, MAX_BACKOFF)
        return wait


def run_command(
    command: Sequence[str] | str, timeout: float, stop: threading.Event | None = None
) -> int | str:
    """Run it (its output goes where this process's does); its exit code, or why it did
    not run to its end: ``"timeout"`` (killed), ``"stopped"`` (``stop`` was set: SIGTERM,
    then SIGKILL after ``STOP_WAIT`` s) or ``"not_found"``/the error's name."""
    shell = isinstance(command, str)
    try:
        proc = subprocess.Popen(command, shell=shell)  # a shell only when asked (--shell)
    except OSError as exc:
        return "not_found" if isinstance(exc, FileNotFoundError) else type(exc).__name__
    deadline = time.monotonic() + timeout
    try:
        while True:
            left = deadline - time.monotonic()
            try:
                return proc.wait(max(0.0, min(left, STOP_LOOK)) if stop else left)
            except subprocess.TimeoutExpired:
                if stop is not None and stop.is_set():
                    proc.terminate()
                    with contextlib.suppress(subprocess.TimeoutExpired):
                        proc.wait(STOP_WAIT)
                    return "stopped"
                if time.monotonic() >= deadline:
                    return "timeout"
    finally:
        if proc.poll() is None:  # timed out, stopped past STOP_WAIT, or a cold stop
            proc.kill()
            proc.wait()
