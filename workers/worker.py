"""The worker process: registers in the pool, waits for an assignment, runs its task's
node-set membership (``TaskRun``), and leaves gracefully when asked to stop.

Signals are installed by the CLI, not here: ``stop()`` is the warm stop (finish or abort the
step, leave, deregister), ``stop(cold=True)`` interrupts a running handler.
"""

from __future__ import annotations

import json
import os
import socket
import time
import uuid
from collections.abc import Mapping
from typing import Any

from queueworks.logs import get_logger
from queueworks.process import freeze_heap
from queueworks.protocol import events
from queueworks.protocol.keys import Keys, check_worker_id
from queueworks.protocol.messages import text
from queueworks.protocol.models import ACTIVE_STATES, WorkerRecord
from queueworks.protocol.records import registered_worker
from queueworks.protocol.validate import check_names
from queueworks.scripts.bound import Scripts
from queueworks.settings import Settings
from queueworks.transport.connection import UNAVAILABLE, connect_settings, redact_url
from queueworks.transport.eviction import PolicyWatch, refuse_evicting

from .heartbeat import Heartbeat, NodeState
from .queue_scout import Scout
from .queue_set import QueueSet
from .runtime import TaskRun, WorkerParts
from .watchdog import EXIT_HUNG, Watchdog
from .watcher import Watcher, enable_stream_notifications
from .weights import Weights

REFUSE_AGAIN = 5.0  # s between two refusals of a task the controller keeps giving us


def default_worker_id() -> str:
    """Unique per process (host + pid + random), so scaled containers never collide."""
    host = socket.gethostname().split(".")[0][:40] or "host"
    return f"{host}-{os.getpid()}-{uuid.uuid4().hex[:6]}"


class Worker:
    def __init__(
        self,
        settings: Settings,
        *,
        worker_id: str | None = None,
        allow: list[str] | None = None,
        labels: dict[str, str] | None = None,
        queues: list[str] | None = None,
        weights: Mapping[str, int] | None = None,
    ) -> None:
        self.settings = settings
        self.id = check_worker_id(worker_id or default_worker_id())
        self.allow = list(allow or [])
        self.labels = dict(labels or {})
        # the only queues it may serve (its --queues); None: any
        self.queues = None if queues is None else check_names(queues, "queue name")
        self.keys = Keys(settings.prefix)
        self.log = get_logger(worker_id=self.id)
        self.r = connect_settings(settings)
        self.scripts = Scripts(self.r)
        self.state = NodeState(self.id, started_at=time.time())
        self.watchdog = Watchdog(self.log)
        self.heartbeat = Heartbeat(
            self.r,
            self.keys,
            self.scripts,
            self.state,
            interval=settings.heartbeat_interval,
            ttl=settings.heartbeat_ttl,
            log=self.log,
            on_forgotten=self._register,
            current=self.watchdog.current,
        )
        self.watcher = Watcher(self.r, self.log)
        self.parts = WorkerParts(
            self.r,
            self.scripts,
            self.keys,
            self.state,
            self.heartbeat,
            self.watchdog,
            allow=self.allow,
            batch_size=settings.batch_size,
            ttl=settings.heartbeat_ttl,
            log=self.log,
            concurrency=settings.concurrency,
            watch=self._watch_task,
        )
        self.parts.aio.on_hung = self._loop_hung
        self.heartbeat.jobs = self.parts.running.now  # for the dashboard's workers page
        self.state.on_fenced = self.parts.running.fenced
        self.state.on_cancelled = self.parts.running.cancelled
        scout = Scout(self.r, self.keys, labels=self.labels, allow=self.allow, only=self.queues)
        self.queue_set = QueueSet(self.parts, scout, Weights(weights))
        self.queue_set.listen = self._listen
        self.exit_code = 0  # EXIT_HUNG once the event loop is hung: the CLI exits with it
        self._watched: set[tuple[str, bool]] = set()  # (key, is a pattern) watched now
        self._wanted: dict[str, set[tuple[str, bool]]] = {}  # task -> what its seat wants
        self._done_tasks: set[str] = set()
        self._refused: dict[str, float] = {}  # task -> when we last refused it (monotonic)

    # -- lifecycle ------------------------------------------------------------------------

    def stop(self) -> None:
        """Warm stop: finish or abort the current step at a safe point, leave, exit."""
        self.state.stopping = True
        self.state.suspend_all()

    def retire(self) -> None:
        """Leave after what runs now (a pool member's limit, ``workers.retire``): unlike
        ``stop`` nothing is cut short at a safe point; what was read and not started is
        handed back, then the worker leaves and exits 0."""
        self.state.stopping = True
        self.state.wake.set()

    def _loop_hung(self) -> None:
        """The event loop stayed blocked past the hard limit (``workers.eventloop``): leave
        as on a warm stop (what waited on the loop is handed back), then exit hung, for
        the supervisor to start a fresh process."""
        self.exit_code = EXIT_HUNG
        self.stop()

    def run(self) -> None:
        self.log.info(
            "worker_starting",
            redis=redact_url(self.settings.redis_url),
            allow=self.allow,
            labels=self.labels,
        )
        self._register()
        self.watcher.watch(self.keys.assign(self.id), self._on_assign)
        self.watcher.start()
        self.heartbeat.start()
        self.watchdog.start()
        freeze_heap()  # everything above lives as long as the process
        try:
            self._serve()
        finally:
            self.watchdog.stop()
            self.parts.aio.stop()
            # Heartbeat first: a tick after deregistering would register us again.
            self.heartbeat.stop()
            if self.heartbeat.is_alive():
                self.heartbeat.join(timeout=self.settings.heartbeat_interval + 5.0)
            self.watcher.stop()
            self._deregister()
            self.r.close()

    def _register(self) -> None:
        now = time.time()
        record = WorkerRecord(
            id=self.id,
            host=socket.gethostname(),
            pid=os.getpid(),
            labels=self.labels,
            allow=self.allow,
            queues=self.queues,
            started_at=self.state.started_at,
        )
        while True:
            try:
                if self.heartbeat.policy is None:  # first: refuse an evicting Redis
                    self.heartbeat.policy = self._policy()
                pipe = self.r.pipeline(transaction=False)
                pipe.hdel(self.keys.worker(self.id), "drain")
                pipe.hset(self.keys.worker(self.id), mapping=registered_worker(record, now))
                pipe.set(
                    self.keys.worker_heartbeat(self.id),
                    repr(now),
                    px=int(self.settings.heartbeat_ttl * 1000),
                )
                pipe.set(self.keys.assign(self.id), "", nx=True)
                pipe.zadd(self.keys.workers, {self.id: now})
                events.emit(
                    pipe, self.keys, "worker_joined", worker=self.id, labels=json.dumps(self.labels)
                )
                pipe.execute()
                self.queue_set.published = None  # the record says none: say them again
                return
            except UNAVAILABLE as exc:
                if self.state.stopping:
                    raise
                self.log.warning("register_failed", error=str(exc), retry_in=1.0)
                time.sleep(1.0)

    def _policy(self) -> PolicyWatch:
        """Redis's maxmemory-policy, refused if it evicts (``queueworks.transport.eviction``), and
        read again now and then by the heartbeat."""
        allow, interval = self.settings.allow_eviction, self.settings.policy_check_interval
        return PolicyWatch(refuse_evicting(self.r, allow=allow, log=self.log), interval, self.log)

    def _deregister(self) -> None:
        try:
            pipe = self.r.pipeline(transaction=False)
            # one key per DEL: the keys may live on different cluster nodes
            for key in (self.keys.worker_heartbeat(self.id), self.keys.assign(self.id)):
                pipe.delete(key)
            pipe.delete(self.keys.worker(self.id))
            pipe.zrem(self.keys.workers, self.id)
            events.emit(pipe, self.keys, "worker_left", worker=self.id)
            pipe.execute()
            self.log.info("worker_stopped")
        except UNAVAILABLE as exc:
            self.log.warning("deregister_failed", error=str(exc))

    # -- notifications --------------------------------------------------------------------

    def _on_assign(self, key: str, event: str) -> None:
        # The heartbeat reads it now: a member of a task or of queues acts on what it says
        # (``NodeState.observe_assign``); an idle worker also reads it itself on waking.
        self.heartbeat.poke()
        self.state.wake.set()

    def _on_epoch(self, key: str, event: str) -> None:
        self.heartbeat.poke()
        self.queue_set.on_epoch(key)

    def _listen(self, on: bool) -> bool:
        """Subscribe to (``on``) or drop the notifications of every queue's stream (a worker
        serving many queues reads only those told of: ``workers.ready``); True if they
        come: the watcher listens and the server sends stream events (flag ``t``)."""
        patterns = self.queue_set.stream_patterns()
        if not on:
            for pattern in patterns:
                self.watcher.unwatch(pattern, pattern=True)
            return False
        if not self.watcher.enabled or not enable_stream_notifications(self.r):
            return False
        for pattern in patterns:
            self.watcher.watch(pattern, self.queue_set.on_stream, pattern=True)
        return True

    def _on_member_heartbeat(self, key: str, event: str) -> None:
        if event in ("expired", "del", "resubscribed"):
            self.heartbeat.poke()

    def _watch_task(self, task_id: str | None, epoch: bool = True, heartbeats: bool = True) -> None:
        """Notifications of a task we are a member of (None: of none at all): its ``epoch``
        (a member joins or leaves), and its members' heartbeats (one ran out: prune it)."""
        if task_id is None:
            self._wanted.clear()
            self._rewatch(self._watched, set())
            return
        tk = self.keys.task(task_id)
        mine: set[tuple[str, bool]] = set()
        if epoch:
            mine.add((tk.epoch, False))
        if heartbeats:
            mine.add((tk.heartbeat_prefix + "*", True))
        # (each task's keys are its own: only this one's change, whatever else is watched;
        # a worker serving many queues re-ranks them one at a time)
        old = self._wanted.pop(task_id, set())
        if mine:
            self._wanted[task_id] = mine
        self._rewatch(old, mine)

    def _rewatch(self, old: set[tuple[str, bool]], new: set[tuple[str, bool]]) -> None:
        for key, pattern in old - new:
            self.watcher.unwatch(key, pattern=pattern)
        for key, pattern in new - old:
            callback = self._on_member_heartbeat if pattern else self._on_epoch
            self.watcher.watch(key, callback, pattern=pattern)
        self._watched = (self._watched - old) | new

    # -- the loop -------------------------------------------------------------------------

    def _serve(self) -> None:
        backoff = 0.05
        ended = False  # a run just ended: the controller moves us on; wait for the word
        if not self.queue_set.cluster:  # (a pattern has no slot: a cluster's leaders poll)
            pattern = self.queue_set.scheduled_pattern()
            self.watcher.watch(pattern, self.queue_set.on_scheduled, pattern=True)
        while not self.state.stopping:
            try:
                if ended:  # (often already here: it came while we were leaving)
                    self.state.wake.wait(self.settings.heartbeat_interval)
                    self.state.wake.clear()
                    ended = False
                    if self.state.stopping:
                        break
                assign = self.r.get(self.keys.assign(self.id))
                task_id = text(assign)
                self.state.assign = task_id
                if task_id in self._done_tasks and self._reopened(task_id):
                    self._done_tasks.discard(task_id)  # a requeued dead letter reopened it
                if not task_id:  # no task: serve every queue we may, until one comes
                    self.queue_set.serve()
                    self._watch_task(None)
                    backoff = 0.05
                    continue
                if task_id in self._done_tasks or self._refusing(task_id):
                    self.state.wake.wait(self.settings.heartbeat_interval)
                    self.state.wake.clear()
                    continue
                outcome = TaskRun(self.parts, task_id).run()  # it watches its membership
                self.log.info("task_run_ended", task_id=task_id, outcome=outcome)
                if outcome in ("finished", "missing", "queue"):
                    self._done_tasks.add(task_id)
                    ended = True
                elif outcome == "refused":
                    self._refused[task_id] = time.monotonic()
                self._watch_task(None)
                backoff = 0.05
            except UNAVAILABLE as exc:
                self.state.forget()
                self.log.warning("redis_unavailable", error=str(exc), retry_in=backoff)
                time.sleep(backoff)
                backoff = min(backoff * 2, 2.0)

    def _refusing(self, task_id: str) -> bool:
        """A task we refused stays refused; while the controller still gives it to us, say
        so again now and then (the record of it may have been lost with a Redis restart)."""
        refused = self._refused.get(task_id)
        return refused is not None and time.monotonic() - refused < REFUSE_AGAIN

    def _reopened(self, task_id: str) -> bool:
        state = text(self.r.hget(self.keys.task(task_id).record, "state"))
        return state in ACTIVE_STATES

    def info(self) -> dict[str, Any]:
        return {"id": self.id, "allow": self.allow, "labels": self.labels}
