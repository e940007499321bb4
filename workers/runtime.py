"""One worker's run in one task's node set: join, take a role, hand the work to the task's
mode loop (``workers.modes``), and on every membership change suspend at a safe point,
re-rank, reclaim and resume; leave when the assignment is revoked, the task finishes, or
the worker stops.

The run assembles its collaborators — ``Membership`` (join, role, barrier, fence, leave),
``Ledger`` (attempts, dead letters, settling), ``Reclaim`` (departed, adopt-own, backstop,
hand-back) — and offers the mode loop three calls (``check``, ``idle``, ``hand_back``; see
``workers.loop.Run``).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError
from redis.exceptions import ResponseError

from queueworks.protocol import events
from queueworks.protocol.keys import Keys
from queueworks.protocol.membership import Roster
from queueworks.protocol.messages import text
from queueworks.protocol.models import Refusal, Role, StoredSpec, TaskState, describe_error
from queueworks.queue.vanished import stream_gone
from queueworks.scripts.bound import Scripts
from queueworks.scripts.calls import NodeSetFull
from queueworks.transport.connection import UNAVAILABLE, Connection

from .handlers import Handler, HandlerRefused, resolve
from .heartbeat import Heartbeat, NodeState, Seat
from .inflight import EventLoop
from .ledger import Attempts
from .loop import ModeLoop, ReadsAtJoin
from .member import Membership
from .modes import MODES
from .reclaim import Consumers, Reclaim
from .stopping import Running
from .watchdog import Watchdog
from .work import Leave, Work, in_stream_order


@dataclass(frozen=True)
class WorkerParts:
    """What a task run borrows from its worker process."""

    r: Connection
    scripts: Scripts
    keys: Keys
    state: NodeState
    heartbeat: Heartbeat
    watchdog: Watchdog
    allow: list[str]
    batch_size: int
    ttl: float
    log: Any
    concurrency: int = 1  # items of the current task in flight at once
    # keyspace notifications of the task we are a member of (None: of none): its epoch,
    # its members' heartbeats, each if asked (the worker's watcher)
    watch: Callable[[str | None, bool, bool], None] = lambda task_id, epoch, heartbeats: None
    aio: EventLoop = field(default_factory=EventLoop)  # the process's loop for async handlers
    running: Running = field(init=False)  # the queues' jobs running here, and their stop

    def __post_init__(self) -> None:
        running = Running(self.r, self.state.worker_id, self.aio, self.watchdog, self.log)
        object.__setattr__(self, "running", running)


class TaskRun:
    """The life of one worker in one task's node set."""

    def __init__(self, parts: WorkerParts, task_id: str, *, queue: bool = False) -> None:
        self.parts = parts
        self.r, self.scripts, self.keys = parts.r, parts.scripts, parts.keys
        self.state: Seat = parts.state.seat(task_id, queue=queue)
        self.watchdog, self.batch_size = parts.watchdog, parts.batch_size
        self.allow, self.concurrency, self.aio = parts.allow, parts.concurrency, parts.aio
        self.running = parts.running
        self.tk = parts.keys.task(task_id)
        self.me = parts.state.worker_id
        self.log = parts.log.bind(task_id=task_id)
        self.held: deque[Work] = deque()
        self.ledger: Attempts  # the mode loop's
        self.owned: list[str] = []
        self.fresh: set[str] = set()  # entry ids the join read (first delivery)
        self.last_backstop = time.monotonic()
        self.swept_at = 0.0  # monotonic time of the last look for lost indices

    # -- entry ----------------------------------------------------------------------------

    def run(self) -> str:
        """Work on the task until the run ends; returns why ("finished", "revoked",
        "stopping", "missing", "refused"). A task whose stream went while it ran (Redis
        lost its keys) is "missing": the run leaves what is left of its membership."""
        try:
            opened = self.open()
            if isinstance(opened, str):
                return opened
            reason = "error"  # unless the loop says why it ends (anything else propagates)
            try:
                opened.serve()
            except Leave as why:
                reason = str(why)
            except ResponseError as exc:
                if not stream_gone(exc):
                    raise
                self.gone()
                reason = "missing"
            finally:
                self.close(opened, reason)
            return reason
        finally:
            self.end()

    def open(self) -> ModeLoop | str:
        """Read the spec, make the mode loop, join: the loop to serve, or why the run ends
        before it starts ("missing", "finished", "refused")."""
        raw_spec = self.r.hget(self.tk.record, "spec")
        if raw_spec is None:
            return "missing"
        try:
            self.spec = StoredSpec.model_validate_json(raw_spec)
        except ValidationError as exc:
            _spec_invalid(self, exc)
            return "finished"
        self.streams = self.tk.streams(self.spec.partitions)
        self.use()
        r, scripts, tk, keys, state = self.r, self.scripts, self.tk, self.keys, self.state
        self.membership = Membership(r, scripts, tk, keys, state, ttl=self.parts.ttl, log=self.log)
        self.reclaim = Reclaim(r, scripts, tk, self.me)
        try:
            self.handler: Handler | None = None
            if self.spec.handler:
                self.handler = resolve(self.spec.handler, self.allow)
            loop = MODES[self.spec.mode](self)  # a queue's resolves its known handlers
        except HandlerRefused as exc:
            self.refuse(exc)
            return "refused"
        self.ledger = loop.ledger
        self.reads_at_join = loop if isinstance(loop, ReadsAtJoin) else None
        try:
            if not self._join():
                return "finished"
        except NodeSetFull:
            return "full"
        except ResponseError as exc:  # its record is there, its stream gone: no task to run
            if not stream_gone(exc):
                raise
            return "missing"
        return loop

    def use(self) -> None:
        """The process-wide parts follow this run from now on: the watchdog's limits and
        the event loop's logger (a worker serving many queues switches between runs)."""
        self.watchdog.use(self.spec.subtask_timeout, self.log)
        self.aio.use(self.log)

    def close(self, loop: ModeLoop, reason: str) -> None:
        """The loop ended (``reason``): it cleans up, we leave the node set."""
        try:
            loop.close(reason)
        finally:
            self._leave()

    def end(self) -> None:
        """The run is over: its seat goes."""
        self.parts.state.drop(self.state)

    def refuse(self, exc: HandlerRefused) -> None:
        """This worker cannot run the task's handler: say so instead of joining (and
        dead-lettering everything it would read); the controller gives the task to others."""
        refusal = Refusal(reason=str(exc), kind=exc.kind, since=self.state.started_at)
        pipe = self.r.pipeline(transaction=False)
        pipe.hset(self.tk.refused, self.me, refusal.model_dump_json())
        events.emit(pipe, self.keys, "refused", task=self.tk.task_id, worker=self.me)
        pipe.execute()
        self.log.warning("handler_refused", reason=refusal.reason, kind=refusal.kind)

    def _join(self) -> bool:
        """Join, take the first role, and (a loop that asks, ``ReadsAtJoin``) hold the
        first entries, all in about two round trips: the join's reply is the roster at its
        epoch (the role needs no read), the entries read right after it (as a member), and
        the streams' consumers read just before it (a dynamic task's: every member reads
        every stream), for the first take-over. Members assigned together that join after
        us bump the epoch again; we re-rank then."""
        self.state.leaving = False
        looked: dict[str, Consumers] = {}
        before = None
        if not self.spec.partitions:

            def before(pipe: Any) -> Callable[[list[Any]], None]:
                return self.reclaim.consumers_on(pipe, self.streams, looked)

        count = self.reads_at_join.join_read() if self.reads_at_join is not None else 0
        read = (self.tk.stream, count) if count > 0 and not self.spec.partitions else None
        most = self.spec.max_nodes if self.state.queue else None  # (a task's: the controller's)
        joined = self.membership.join(before, read, self.streams, most)
        if joined is None:
            return False
        fresh = [Work(self.tk.stream, eid.decode(), fields, 1) for eid, fields in joined.entries]
        self.held.extend(fresh)
        self.fresh = {w.entry_id for w in fresh}
        self.rerank(joined.roster, looked)  # it watches the membership from now on
        self.fresh = set()
        # The heartbeat checks our successor from now on; with one, at once (it may be dead).
        # (A queue's members have no successor: the pool heartbeat is their liveness.)
        if not self.state.queue and self.parts.heartbeat.follow(self.state, joined.roster):
            self.parts.heartbeat.poke()
        return True

    def _leave(self) -> None:
        """Settle what is done, hand back what is not, leave: the others rebalance at once."""
        self.state.suspend.set()
        self.state.leaving = True  # a new assignment now is no news for the heartbeat
        try:
            self.ledger.flush()
            if not self.ledger.ended:  # (a finished task's leftovers are nobody's work)
                self.hand_back(self.streams)
                self.ledger.flush()  # dead letters for entries found gone
            self.parts.watch(self.tk.task_id, False, False)  # our own leave is no news either
            self.membership.leave(self.ledger.announce)  # (the task's end, if held back)
        except UNAVAILABLE as exc:
            self.state.task_id = None
            self.log.warning("leave_failed", error=str(exc))

    # -- what a mode loop calls -----------------------------------------------------------

    def check(self) -> None:
        s = self.state
        if s.stopping:
            raise Leave("stopping")
        if s.assign != self.tk.task_id:
            raise Leave("revoked")
        if self.ledger.ended:
            raise Leave("finished")
        if s.fenced:
            self.ledger.flush()
            self.log.warning("fenced", reason="heartbeat gone: pruned while away; rejoining")
            self.hand_back(self.streams)  # what the others have not reclaimed yet
            if not self._join():
                raise Leave("finished")
        if s.suspend.is_set():
            self.rerank()

    def gone(self) -> None:
        """The task's stream or its group is gone (Redis lost its keys: a restart without
        persistence, a ``FLUSHALL``, a failover to an empty replica): our membership went
        with it. Fenced: the next safe point rejoins, if the task is there again (a queue a
        client's handle made again), else the run ends."""
        if not self.state.fenced:
            self.log.warning("membership_gone", reason="the task's stream or group is gone")
        self.state.fenced = True
        self.state.suspend.set()

    def idle(self) -> None:
        self.look_around()
        if self.held:
            return
        self.state.wake.wait(self.parts.heartbeat.interval)
        self.state.wake.clear()

    def look_around(self) -> None:
        self.ledger.flush()
        state = self.r.hget(self.tk.record, "state")
        if state is None or TaskState(text(state)).finished:
            raise Leave("finished")
        if time.monotonic() - self.last_backstop > min(self.spec.subtask_timeout / 2, 5.0):
            self.last_backstop = time.monotonic()
            self._backstop()
            if self.held:
                return
        role = self.membership.role
        sweep_due = time.monotonic() - self.swept_at > self.parts.heartbeat.interval
        if role is not None and role.leader and sweep_due:
            self.swept_at = time.monotonic()
            self.ledger.sweep_lost(self.streams)

    def hand_back(self, streams: Sequence[str]) -> None:
        for stream in streams:
            self.ledger.bury_gone(stream, self.reclaim.hand_back(stream, self.ledger.interrupted))
        self.held = deque(w for w in self.held if w.stream not in streams)

    # -- membership changes ---------------------------------------------------------------

    def rerank(
        self,
        joined: Roster | None = None,
        looked: dict[str, Consumers] | None = None,
        read: tuple[Roster, float] | None = None,
    ) -> None:
        """Suspend (settle), take the new role, hand back/reclaim as the role says.
        ``joined``: the roster our join returned (the first role needs no read), or
        ``read``: one read just now with others' (a worker re-ranking many queues at once,
        and when it was sent); ``looked`` the consumers of streams read with it (used if
        that roster is the one we take)."""
        m = self.membership
        self.ledger.flush()
        paused = time.monotonic()
        old = m.role
        first = joined if joined is not None else (read[0] if read is not None else None)
        while True:
            roster = m.take_role(joined, read)
            if roster is None or roster is not first:
                looked = None  # read at the join: stale now
            joined = read = None
            if roster is None:
                return  # fenced: the next check rejoins
            if self.spec.partitions:
                self.owned = m.owned(self.streams)
                self.hand_back([s for s in self.streams if s not in self.owned])
                if not m.barrier(roster):
                    continue  # the set changed again while we waited: start over
            else:
                self.owned = self.streams
            if m.current(roster):
                break
        m.settle_wakeup()
        role = m.role
        assert role is not None
        reclaimed = 0
        if self.spec.partitions or role.leader or old is None:
            departed = bool(self.spec.partitions) or role.leader
            reclaimed = self._take_over(
                roster.members, departed=departed, adopt=old is None, looked=looked or {}
            )
        pause_ms = round((time.monotonic() - paused) * 1000, 1)
        self.log.info(
            "rebalanced",
            rank=role.rank,
            world_size=role.world_size,
            epoch=role.epoch,
            old_rank=old.rank if old else None,
            pause_ms=pause_ms,
        )
        m.publish(pause_ms, reclaimed)  # the role, and (the leader) this rebalance
        self._watch(role)
        if self.handler is not None and self.handler.on_rebalance is not None and old != role:
            self.handler.on_rebalance(old, role)

    def _watch(self, role: Role) -> None:
        """Watch the membership from the first role on (our own join's epoch bump is no
        news; a change before the watch is seen by the next read's check, or tick): the
        epoch, unless we are alone in a one-node task (nobody else can join); the others'
        heartbeats while there are others. Each re-rank says again."""
        alone = role.world_size == 1
        heartbeats = not alone and not self.state.queue  # (a queue's members keep none)
        self.parts.watch(self.tk.task_id, not (alone and self.spec.max_nodes == 1), heartbeats)

    def _take_over(
        self,
        members: Collection[str],
        *,
        departed: bool,
        adopt: bool,
        looked: dict[str, Consumers],
    ) -> int:
        """Claim, in the streams we own, what departed members left and what was parked
        (``departed``), and our own entries from an earlier life (``adopt``): one look at
        each stream's consumers (``looked``: already read, with the join) says whose
        entries to claim, ours too."""
        taken = 0
        for stream in self.owned:
            consumers = looked.get(stream)
            if consumers is None:
                consumers = self.reclaim.consumers(stream)
            works: list[Work] = []
            if adopt and consumers.get(self.me):  # not what the join just read: it is fresh
                works += [w for w in self.reclaim.adopt_own(stream) if w.entry_id not in self.fresh]
            if departed:
                claimed, gone = self.reclaim.departed(stream, consumers, members)
                works += claimed
                self.ledger.bury_gone(stream, gone)
            taken += self._hold(works)
        if taken:
            self.log.info("reclaimed", entries=taken, backstop=False)
        self.ledger.flush()
        return taken

    def _backstop(self) -> None:
        """Idle: claim what a wedged member holds past the watchdog's hard limit and a TTL
        (its holder should have exited and been pruned by now, yet it is still a member)."""
        wd = self.watchdog
        idle_ms = int((wd.timeout + wd.grace + self.parts.ttl) * 1000)
        taken = 0
        for stream in self.owned:
            claimed, gone = self.reclaim.backstop(stream, idle_ms)
            self.ledger.bury_gone(stream, gone)
            taken += self._hold(claimed)
        if taken:
            self.log.info("reclaimed", entries=taken, backstop=True)
        self.ledger.flush()

    def _hold(self, works: list[Work]) -> int:
        """Take ``works`` in hand, in stream order, before anything held already."""
        ordered = in_stream_order(works)
        self.held.extendleft(reversed(ordered))
        return len(ordered)


def _spec_invalid(run: TaskRun, exc: ValidationError) -> None:
    """A task record nobody can run (another writer broke it): fail the task, so the
    controller releases its nodes; this worker goes on with the next one."""
    error = f"stored spec is invalid: {describe_error(exc)}"
    if run.scripts.set_state(run.tk, TaskState.FAILED, time.time(), error):
        events.emit(run.r, run.keys, "failed", task=run.tk.task_id, error=error)
    run.log.error("spec_invalid", error=error)
