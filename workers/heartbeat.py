"""The heartbeat: one pipelined round trip per tick that keeps the worker alive in the pool and
in its task's node set, reads the task's epoch and the assignment, checks one other member,
and looks for dead workers of the queues (``workers.lost``). A queue's seats cost the tick
nothing: liveness in a queue is the worker's pool heartbeat, one per process.

Every member checks only its successor in rank order (a ring), so finding a dead member
costs O(members) per tick per task. The check reads how long the successor's heartbeat
key has left (PTTL); when it runs out before the next tick, the member looks again the
moment it does. So a member whose heartbeat stopped is pruned within the TTL of its last
beat plus a round trip, whatever notifications do (and within TTL + one tick at worst,
when a tick is late). The member heartbeat is refreshed with
``SET ... XX``: a heartbeat never recreates a key that was deleted (rq #1450) — if ours is
gone we were pruned, and the runtime must rejoin before it takes work again.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from queueworks.protocol import events
from queueworks.protocol.keys import Keys
from queueworks.protocol.membership import Roster, read_roster
from queueworks.queue.job_stops import stops_of, take_stops
from queueworks.scripts.bound import Scripts
from queueworks.transport.connection import UNAVAILABLE, Connection
from queueworks.transport.eviction import PolicyWatch

from .lost import LOOK_COMMANDS, LostWorkers


@dataclass
class NodeState:
    """What the heartbeat, the watcher and the runs share, worker-wide (plain attributes, one
    writer each; the events are the handshakes). Each membership has its ``Seat``."""

    worker_id: str
    started_at: float = 0.0  # when this worker process started (its record says so too)
    assign: str = ""  # latest assignment seen (heartbeat writes)
    stopping: bool = False
    processed: int = 0  # subtasks settled by this process (runtime writes)
    reported: int = 0  # of ``processed``, what the worker record has been told
    wake: threading.Event = field(default_factory=threading.Event)
    seats: dict[str, Seat] = field(default_factory=dict)  # task id -> our seat in its set
    # of ``seats``, the tasks' (not queues'): what a tick looks at one by one (a worker may
    # hold thousands of queues' seats, and a tick looks at none of them)
    task_seats: dict[str, Seat] = field(default_factory=dict)
    # a seat found fenced (its key): what this worker runs there is stopped (the worker's)
    on_fenced: Callable[[str], None] = lambda key: None
    # jobs cancelled while they ran here, (queue, job id): stopped (``queueworks.queue.job_stops``)
    on_cancelled: Callable[[list[tuple[str, str]]], None] = lambda jobs: None
    # a queue's seat was flagged (its key: pruned, revoked, a new epoch): its loop looks at
    # it soon (``workers.ready``; any thread)
    on_flagged: Callable[[str], None] = lambda key: None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def seat(self, task_id: str, *, queue: bool = False) -> Seat:
        """Our seat in ``task_id``'s node set (made on first use; a run drops it at its end)."""
        found = self.seats.get(task_id)
        if found is None:
            found = self.seats[task_id] = Seat(self, task_id, queue=queue)
            if not queue:
                self.task_seats[task_id] = found
        return found

    def drop(self, seat: Seat) -> None:
        if self.seats.get(seat.key) is seat:
            del self.seats[seat.key]
        if self.task_seats.get(seat.key) is seat:
            del self.task_seats[seat.key]

    def in_queues(self) -> bool:
        """A member of some queue (stops at the first one found: no copy of the seats)."""
        try:
            return any(seat.queue and seat.task_id is not None for seat in self.seats.values())
        except RuntimeError:  # (a seat came or went meanwhile)
            seats = list(self.seats.values())
            return any(seat.queue and seat.task_id is not None for seat in seats)

    def members(self) -> list[Seat]:
        """The seats we hold now (joined, not left)."""
        return [seat for seat in list(self.seats.values()) if seat.task_id is not None]

    def member(self) -> bool:
        """A member of some node set, not leaving it."""
        return any(not seat.leaving for seat in self.members())

    def suspend_all(self) -> None:
        """The worker stops: every seat suspends, and every job it runs is asked to yield."""
        for seat in list(self.seats.values()):
            seat.suspend.set()
            seat.halt.set()
        self.wake.set()

    def forget(self) -> None:
        """Redis went away: no seat is known to be held any more."""
        for seat in list(self.seats.values()):
            seat.task_id = None

    def unreported(self) -> int:
        """Subtasks settled since the last report (a heartbeat tick's, or a leave's),
        counted as reported from now on; ``unreport`` gives them back if the write failed."""
        with self._lock:
            now = self.processed  # (read once: the runtime adds to it meanwhile)
            n, self.reported = now - self.reported, now
            return n

    def unreport(self, n: int) -> None:
        with self._lock:
            self.reported -= n

    def observe_assign(self, assign: str) -> None:
        """The controller's word: a task's seat whose task it is no longer is suspended (to
        leave); a queue's seats, when a task is given (the task takes the worker whole)."""
        self.assign = assign
        # (no task given: the queues' seats stay as they are, and only the tasks' are looked at)
        for seat in list((self.seats if assign else self.task_seats).values()):
            if seat.queue:
                if assign and seat.task_id is not None:
                    seat.revoke()
            elif seat.task_id is not None and assign != seat.key:
                seat.suspend.set()
        self.wake.set()


class Seat:
    """This worker's membership of one node set (a task's, or a queue's): what its run,
    the heartbeat and the watcher share about it. The worker-wide fields read through to
    the process's ``NodeState``, so a run calls its seat its ``state``."""

    def __init__(self, node: NodeState, key: str, *, queue: bool = False) -> None:
        self.node, self.key, self.queue = node, key, queue
        self.task_id: str | None = None  # ``key`` while a member (the membership writes)
        self.role_epoch = 0  # the epoch our current role is from (runtime writes)
        self.epoch_seen = 0  # latest epoch seen (heartbeat / watcher write)
        self.successor: str | None = None  # the member we check (heartbeat writes)
        self.roster_at: int | None = None  # the epoch of the roster ``successor`` is from
        self.fenced = False  # our member heartbeat was gone: we were pruned
        self.leaving = False  # the member is leaving its node set (runtime writes)
        self.revoked = False  # a queue's seat told to leave (the worker has other work)
        # a new epoch, a prune, a leave: act at the next safe point (a task's steps pause)
        self.suspend = threading.Event()
        # the jobs this seat runs must yield (``ctx.suspended``): the worker stops, is given
        # a task, or was pruned. A queue's jobs watch this one, never ``suspend``: a change
        # of a queue's members pauses none of them (docs/queues.md)
        self.halt = threading.Event()

    @property
    def worker_id(self) -> str:
        return self.node.worker_id

    @property
    def started_at(self) -> float:
        return self.node.started_at

    @property
    def wake(self) -> threading.Event:
        return self.node.wake

    @property
    def stopping(self) -> bool:
        return self.node.stopping

    @stopping.setter
    def stopping(self, value: bool) -> None:
        self.node.stopping = value

    @property
    def processed(self) -> int:
        return self.node.processed

    @processed.setter
    def processed(self, value: int) -> None:
        self.node.processed = value

    @property
    def assign(self) -> str:
        """The assignment as this seat reads it: a task's is the controller's word; a
        queue's seat is its own (its key until revoked)."""
        if self.queue:
            return "" if self.revoked else self.key
        return self.node.assign

    def revoke(self) -> None:
        """Leave at the next safe point (a queue's seat: the worker has other work)."""
        self.revoked = True
        self.suspend.set()
        self.halt.set()
        self._flagged()
        self.node.wake.set()

    def pruned(self) -> None:
        """We were declared dead in this node set (our member heartbeat is gone, or our
        seat): what we still run there is stopped first (``NodeState.on_fenced``), before
        the run gets to settle anything; it hands back and rejoins at the next safe point."""
        self.fenced = True
        try:
            self.node.on_fenced(self.key)
        finally:
            self.suspend.set()
            self.halt.set()
            self._flagged()
            self.node.wake.set()

    def observe_epoch(self, epoch: int) -> None:
        """A newer epoch than our role's means: suspend at the next safe point."""
        if epoch > self.epoch_seen:
            self.epoch_seen = epoch
        if self.task_id is not None and epoch > self.role_epoch:
            self.suspend.set()
            self._flagged()
            self.node.wake.set()

    def _flagged(self) -> None:
        if self.queue:
            self.node.on_flagged(self.key)


EXPIRY_SLACK = 0.005  # s after a heartbeat key runs out before we look for it


class Heartbeat(threading.Thread):
    def __init__(
        self,
        r: Connection,
        keys: Keys,
        scripts: Scripts,
        state: NodeState,
        *,
        interval: float,
        ttl: float,
        log: Any,
        on_forgotten: Callable[[], None] | None = None,
        current: Callable[[], int | str | None] = lambda: None,
    ) -> None:
        super().__init__(name="qw-heartbeat", daemon=True)
        self._on_forgotten = on_forgotten
        self._current = current  # the subtask running now, for the dashboard
        # the queues' jobs running now, "QUEUE/JOB" each (``stopping.Running.now``)
        self.jobs: Callable[[], Sequence[str]] = tuple
        self._r, self._keys, self._scripts, self.state = r, keys, scripts, state
        self.interval, self.ttl_ms = interval, int(ttl * 1000)
        self._log = log
        self._halt = threading.Event()
        self._poke = threading.Event()
        self._check_at: float | None = None  # an extra tick when the successor's beat ends
        self.pruned = 0
        self.policy: PolicyWatch | None = None  # Redis's maxmemory-policy, read now and then
        self.lost = LostWorkers(r, keys, scripts, state.worker_id, ttl=ttl, log=log)

    def stop(self) -> None:
        self._halt.set()
        self._poke.set()

    def poke(self) -> None:
        """Tick now (e.g. a notification said something changed)."""
        self._poke.set()

    def run(self) -> None:
        while not self._halt.is_set():
            started = time.monotonic()
            try:
                self.tick()
                if self.policy is not None:
                    self.policy.check(self._r)
            except UNAVAILABLE as exc:
                self._log.warning("heartbeat_failed", error=str(exc))
            except Exception:
                self._log.exception("heartbeat_error")
            wait = self.interval - (time.monotonic() - started)
            if self._check_at is not None:  # the successor's heartbeat runs out sooner
                wait = min(wait, self._check_at - time.monotonic())
                self._check_at = None
            self._poke.wait(max(0.0, wait))
            self._poke.clear()

    def tick(self) -> None:
        s, k = self.state, self._keys
        now = time.time()
        # a queue's seat has no heartbeat, epoch or successor of its own to tick
        seats = [
            (seat, seat.key, seat.successor)
            for seat in list(s.task_seats.values())
            if seat.task_id is not None
        ]
        queued = s.in_queues()
        pipe = self._r.pipeline(transaction=False)
        pipe.set(k.worker_heartbeat(s.worker_id), repr(now), px=self.ttl_ms)
        pipe.zadd(k.workers, {s.worker_id: now})
        pipe.hset(
            k.worker(s.worker_id),
            mapping={
                "last_heartbeat": repr(now),
                "current": _or_blank(self._current()),
                "jobs": " ".join(self.jobs()),
            },
        )
        delta = s.unreported()
        pipe.hincrby(k.worker(s.worker_id), "processed", delta)
        pipe.get(k.assign(s.worker_id))
        pipe.hget(k.worker(s.worker_id), "drain")
        take_stops(pipe, k, s.worker_id)
        if queued:  # gone: a finder took it, having found us dead (``workers.lost``)
            pipe.exists(k.worker_queues(s.worker_id))
        looked = self.lost.look_on(pipe, now, self.interval)
        for _, task_id, successor in seats:
            tk = k.task(task_id)
            pipe.set(tk.heartbeat(s.worker_id), repr(now), px=self.ttl_ms, xx=True)
            pipe.get(tk.epoch)
            if successor is not None:
                pipe.pttl(tk.heartbeat(successor))  # -2: gone (PTTL expires it on the spot)
        try:
            replies = pipe.execute()
        except BaseException:
            s.unreport(delta)
            raise
        if replies[1] and self._on_forgotten is not None:
            # We were dropped from the pool (declared lost while paused): register again
            # rather than let the heartbeat recreate half a record.
            self._on_forgotten()
        assign, drain, stops = replies[4], replies[5], stops_of(replies[6])
        if stops:
            s.on_cancelled(stops)
        s.observe_assign(assign.decode() if assign else "")
        if drain and not s.stopping:  # an operator asked for a graceful leave
            self._log.info("draining")
            s.stopping = True
            s.suspend_all()
        at = 7
        if queued:
            if not replies[at]:
                self._pruned_from_queues([seat for seat in s.members() if seat.queue])
            at += 1
        dead, soon = looked(replies)
        if soon is not None:  # look again the moment that worker's beat runs out
            self._check_soon(soon - time.time())
        self.lost.confirm(dead)
        at += LOOK_COMMANDS
        for seat, task_id, successor in seats:
            mine, epoch_reply = replies[at], replies[at + 1]
            left_ms = int(replies[at + 2]) if successor is not None else None
            at += 3 if successor is not None else 2
            if seat.task_id != task_id:
                continue  # it left meanwhile
            self._seat_tick(seat, task_id, bool(mine), int(epoch_reply or 0), successor, left_ms)

    def _seat_tick(
        self,
        seat: Seat,
        task_id: str,
        mine: bool,
        epoch: int,
        successor: str | None,
        left_ms: int | None,
    ) -> None:
        if not mine:
            seat.pruned()
        seat.observe_epoch(epoch)
        if successor is not None and left_ms is not None:
            if left_ms == -2 and self.prune(seat, successor):
                return
            if 0 <= left_ms < self.interval * 1000:  # look again the moment it runs out
                self._check_soon(left_ms / 1000)
        if seat.roster_at != epoch:
            self._follow(seat, task_id)

    def _pruned_from_queues(self, seats: list[Seat]) -> None:
        """Another worker found us dead (our heartbeat ran out: a pause, a partition) and
        pruned us from every queue we had joined: each seat hands back and rejoins."""
        pruned = [seat for seat in seats if seat.task_id is not None and not seat.leaving]
        if pruned:
            self._log.warning("pruned_from_queues", queues=len(pruned))
        for seat in pruned:
            seat.pruned()

    def _check_soon(self, seconds: float) -> None:
        """Tick again ``seconds`` from now (a heartbeat runs out then), if that is sooner."""
        check_at = time.monotonic() + max(0.0, seconds) + EXPIRY_SLACK
        self._check_at = check_at if self._check_at is None else min(self._check_at, check_at)

    def follow(self, seat: Seat, roster: Roster) -> bool:
        """The member's roster of its task (its join's): whom to check from now on,
        without reading it again. True if there is a successor to check."""
        seat.roster_at = roster.epoch
        seat.successor = roster.successor(seat.worker_id)
        return seat.successor is not None

    def _follow(self, seat: Seat, task_id: str) -> None:
        """Re-read the roster after a change, to know which member to check next."""
        roster = read_roster(self._r, self._keys.task(task_id))
        seat.roster_at = roster.epoch
        seat.successor = roster.successor(seat.worker_id)

    def prune(self, seat: Seat, member: str) -> bool:
        """Remove a member whose heartbeat is gone (idempotent: one epoch bump in total)."""
        task_id = seat.key
        tk = self._keys.task(task_id)
        epoch = self._scripts.depart(tk, member, time.time(), "dead", only_if_dead=True)
        if epoch:
            self.pruned += 1
            self._log.info("member_pruned", member=member, epoch=epoch, task_id=task_id)
            events.emit(
                self._r, self._keys, "member_lost", task=task_id, worker=member, epoch=epoch
            )
            seat.observe_epoch(epoch)
            self._follow(seat, task_id)
            self.poke()  # check the new successor at once: several may have died together
        return bool(epoch)


def _or_blank(value: int | str | None) -> int | str:
    return "" if value is None else value
