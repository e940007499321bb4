"""Issue 9: poison subtasks. A subtask whose handler kills its own process, and one whose
handler never returns, are dead-lettered after ``max_attempts`` (charged per start) and
the task completes; nothing else is lost or dead-lettered with them.

No supervisor ships with queueworks (docker/systemd restart workers in production): the
test plays it and starts a new worker whenever one exits. Budget: ~20 s for the file.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import redis

from queueworks import Client, TaskSpec, TaskState
from tests.conftest import Cluster, Proc, wait_for

pytestmark = pytest.mark.system

ALLOW = ("tests.handlers_poison",)
FAST = ["--heartbeat-interval", "0.2", "--heartbeat-ttl", "0.8"]  # detect a death in ~1 s
N = 60
POISON = 17


class Supervisor:
    """Keeps ``n`` workers running: whenever one exits, start another (at most ``limit``)."""

    def __init__(self, cluster: Cluster, n: int, limit: int, extra: list[str]) -> None:
        self.cluster, self.limit, self.extra = cluster, limit, extra
        self.workers: list[Proc] = [self._start() for _ in range(n)]
        self.exits: list[int | None] = []
        self._halt = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def _start(self) -> Proc:
        return self.cluster.worker(allow=ALLOW, extra=self.extra)

    def _watch(self) -> None:
        while not self._halt.wait(0.05):
            for i, w in enumerate(self.workers):
                if not w.alive() and len(self.exits) < self.limit:
                    self.exits.append(w.p.returncode)
                    self.workers[i] = self._start()

    @property
    def restarts(self) -> int:
        return len(self.exits)

    @contextmanager
    def running(self) -> Iterator[Supervisor]:
        self._thread.start()
        try:
            yield self
        finally:
            self._halt.set()
            self._thread.join(5)


def mixed_task(client: Client, poison: dict[str, Any], **kw: Any) -> Any:
    subtasks = [poison if i == POISON else {"x": i} for i in range(N)]
    return client.submit(
        TaskSpec(name="poison", handler="tests.handlers_poison:mixed", subtasks=subtasks, **kw)
    )


def assert_only_poison_dead(task: Any, reason_part: str, error_part: str, attempts: int) -> None:
    status = task.wait(timeout=60)
    assert status.state == TaskState.COMPLETED, status
    assert (status.done, status.dead) == (N - 1, 1), status
    (letter,) = task.dead_letters()
    assert letter.index == POISON, letter
    assert reason_part in letter.reason, letter
    assert error_part in letter.error, letter
    assert letter.attempts == attempts, letter
    results = dict(task.results())
    assert {i: v["y"] for i, v in results.items()} == {i: 2 * i for i in range(N) if i != POISON}


def test_handler_that_kills_its_process_is_dead_lettered(
    cluster: Cluster, client: Client, r: redis.Redis
) -> None:
    """Each start of the poison kills a worker and is one attempt, however many batch-mates
    the dead worker held; after max_attempts starts it is dead-lettered without a third."""
    cluster.controller()
    sup = Supervisor(cluster, 2, limit=6, extra=FAST)
    cluster.wait_workers(r, 2)
    with sup.running():
        task = mixed_task(client, {"exit": True}, max_attempts=2)
        assert_only_poison_dead(task, "exceeded max_attempts", "started 2 times", attempts=2)
    assert sup.exits == [3, 3], sup.exits  # exactly max_attempts deaths
    # batch-mates held by a dead worker were never charged for its death
    attempts = {i: v["attempt"] for i, v in task.results()}
    assert max(attempts.values()) <= 2, attempts


def test_handler_that_hangs_is_abandoned_and_dead_lettered(
    cluster: Cluster, client: Client, r: redis.Redis
) -> None:
    """A handler past subtask_timeout is abandoned by its worker's watchdog: a failed
    attempt; the worker stays alive (never pruned, never restarted)."""
    cluster.controller()
    sup = Supervisor(cluster, 2, limit=4, extra=FAST)
    cluster.wait_workers(r, 2)
    with sup.running():
        task = mixed_task(client, {"hang": True}, max_attempts=2, subtask_timeout=1.0)
        assert_only_poison_dead(task, "failed 2 times", "timed out", attempts=2)
    assert sup.exits == [], sup.exits


def test_handler_stuck_in_c_exits_its_worker_and_is_dead_lettered(
    cluster: Cluster, client: Client, r: redis.Redis
) -> None:
    """A handler that never reaches a bytecode again (blocked in C) ignores the timeout:
    past the grace period its worker exits (70) for the supervisor to restart, and the
    subtask is dead-lettered after max_attempts starts."""
    cluster.controller()
    sup = Supervisor(cluster, 2, limit=6, extra=FAST)
    cluster.wait_workers(r, 2)
    with sup.running():
        task = mixed_task(client, {"hang_in_c": True}, max_attempts=2, subtask_timeout=1.0)
        assert_only_poison_dead(task, "exceeded max_attempts", "started 2 times", attempts=2)
        # both starts end in a process exit (the second may come after the burial)
        wait_for(lambda: len(sup.exits) >= 2, 15, "the second stuck worker to exit")
    assert sup.exits == [70, 70], sup.exits
